// lpt's own kernel for convolutions with few products per output (a stem on a spectrogram's one channel,
// an image's three): lpt/native/stem.cpp.
//
// oneDNN 3.2 runs a layer whose input has fewer than four channels on jit_int8, far below its peak: a
// 3×3 from 1 channel to 128 over 900×161 (dnsmos_sig_bak_ovr's first layer) took 3.5 ms on a Xeon with
// AMX, 2 threads. Here each kernel row's kw·C source bytes (channels-last, consecutive) are read as at
// most MAX_WORDS words of four bytes, each broadcast to sixteen lanes and multiplied by sixteen output
// channels' four weights with one vpdpbusd (u8 × s8, four products added in int32: exact), and the output
// stage follows in registers: the same layer in 2.5-2.6 ms (3.7 on jit_int8 in the same runs).
#pragma once

#include <cstdint>
#include <vector>

#include "s16.h"

namespace lpt_stem {

constexpr int64_t MAX_WORDS = 4;  // words of four bytes per kernel row: kw·C ≤ 16

// Whether this CPU runs the kernel: AVX-512 with VNNI, where sixteen lanes are allowed (lpt_s16::sixteen_lanes).
bool supported();
// Whether the kernel runs a convolution of one group of this geometry and output stage: its kernel rows
// are runs of at most 4·MAX_WORDS bytes (dilation_w 1), it has fewer than lpt's FEW_PRODUCTS (32) products
// per output, and its stage has an 8-bit destination after no post-op or one SLOPE_CLIP (Relu, Clip,
// LeakyRelu), which the kernel applies as lpt_s16's clipped stage does. Other stages cost more than the
// products here: with its accumulators staged by lpt_s16::stage_rows after it, openWakeWord's 1 → 24 stem
// to float32 took 0.025-0.029 ms in its plan against 0.021-0.022 on the route it had.
bool fits(const lpt_s16::Geometry &g, const lpt_s16::Epilogue &e);

// The weights [OC, C, KH, KW] as the kernel reads them: per kernel row, word and block of sixteen output
// channels, each channel's four bytes (zeros past the row's kw·C and past OC); and each channel's sum of
// weights, which the source's zero point times gives the accumulators' correction. lpt_dw's depthwise kernel reads
// its [C, 1, KH, KW] packed so too, as the weights of one input channel.
struct Weights {
    std::vector<int32_t, lpt_s16::CacheLineAllocator<int32_t>> words;  // [KH][words][blocks][16]
    std::vector<int32_t> sums;                                         // [blocks · 16]
    int64_t words_per_row = 0, blocks = 0;
};
Weights pack(const int8_t *weights, const lpt_s16::Geometry &g);

// out [images, out_h·out_w, OC] (uint8 or int8 as `e` says) = the output stage of the
// convolution of src (u8, or s8 with `signed_src`; channels-last [N, H, W, C], which for one channel is
// also channels-first) less its zero point. Needs supported().
void convolve_staged(const uint8_t *src, bool signed_src, int zero_point, const lpt_s16::Geometry &g, int64_t images,
                     int64_t h, int64_t w, const Weights &weights, const lpt_s16::Epilogue &e, void *out, int threads);

}  // namespace lpt_stem
