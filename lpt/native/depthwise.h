// lpt's own depthwise convolution on AVX-512 VNNI (route u8s8): lpt/native/depthwise.cpp.
//
// oneDNN 3.2 runs an int8 depthwise layer with a source zero point on jit_int8 (its brdgmm_dw kernel takes none),
// which takes a channel's taps one at a time: PaddleOCR's detector's 7×7 layer of 96 channels over 160×160 took
// 1.04 ms in its plan there (Zen 4, 2 threads), OpenVINO's own kernel 0.96. Here vpdpbusd adds four taps of a
// kernel row per lane: each source row of a block of sixteen channels is rewritten once as "quads" (column x:
// each channel's bytes at columns x … x + 3, one 32-bit lane per channel), which every output row whose window
// holds that row reads; an output position's block is then kernel_h·⌈kernel_w / 4⌉ vpdpbusd, u8 × s8 with four
// products added in int32: exact. The same layer 0.71-0.73 ms. A 3×3 layer's quads cost as much as its products,
// and jit_int8 is as fast there (_engine.cpp: DEPTHWISE_TAPS).
#pragma once

#include <cstdint>

#include "s16.h"
#include "stem.h"

namespace lpt_dw {

// Whether this CPU runs the kernel: AVX-512 with VNNI, BW and VBMI (vpermb), where sixteen lanes are allowed
// (lpt_s16::sixteen_lanes).
bool supported();
// Whether it runs a depthwise convolution of this geometry (one input and one output channel per group, 1-D or
// 2-D): any kernel, stride and padding, no dilation.
bool fits(const lpt_s16::Geometry &g);

// out [images, out_h·out_w, C] (float32, uint8 or int8 as `e` says) = the output stage (lpt_s16::stage_columns)
// of the convolution of src (u8, or s8 with `signed_src`; channels-last [N, H, W, C]) less its zero point, by
// `weights` [C, 1, KH, KW] packed as the stem kernel's of one input channel (lpt_stem::pack: per kernel row, quad
// of taps and block of sixteen channels, each channel's four bytes). Needs supported() and fits(g).
void convolve_staged(const uint8_t *src, bool signed_src, int zero_point, const lpt_s16::Geometry &g, int64_t images,
                     int64_t h, int64_t w, const lpt_stem::Weights &weights, const lpt_s16::Epilogue &e, void *out,
                     int threads);

}  // namespace lpt_dw
