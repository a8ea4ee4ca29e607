// lpt's own exact int8 convolution for CPUs without VNNI (route "s16"): lpt/native/s16.cpp.
#pragma once

#include <cstdint>
#include <vector>

namespace lpt_s16 {

// A 2-D convolution with one group (a 1-D one has kernel_h = 1; a matmul [M, K] × [K, N] is a 1×1
// convolution of one image, 1 row high and M wide, with K input and N output channels).
struct Geometry {
    int64_t in_channels, out_channels, kernel_h, kernel_w;
    int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;  // dilation as ONNX: 1 = none
    int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
    int64_t padded_channels() const { return in_channels + (in_channels & 1); }
    int64_t out_h(int64_t h) const { return (h + pad_top + pad_bottom - (kernel_h - 1) * dilation_h - 1) / stride_h + 1; }
    int64_t out_w(int64_t w) const { return (w + pad_left + pad_right - (kernel_w - 1) * dilation_w - 1) / stride_w + 1; }
};

bool supported();  // the CPU has AVX2

// int8 weights [OC, IC, KH, KW] → int16, in the order the kernel reads them.
std::vector<int16_t> pack_weights(const int8_t *weights, const Geometry &g);

// The source's int16 form the kernel reads: q − zero_point, channels-last, padded with zeros
// (spatially, and to an even channel count), [images, H + pads, W + pads, padded_channels].
int64_t widened_size(const Geometry &g, int64_t images, int64_t h, int64_t w);
void widen(const uint8_t *src, bool signed_src, bool channels_last, int zero_point, const Geometry &g,
           int64_t images, int64_t h, int64_t w, int16_t *wide, int threads);

// acc [images, out_h·out_w, OC] int32 = Σ wide · weights, exactly.
void convolve(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h, int64_t w,
              int32_t *acc, int threads);

}  // namespace lpt_s16
