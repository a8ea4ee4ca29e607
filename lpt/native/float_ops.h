// The float32 ops between int8 layers (lpt/native/float_ops.cpp), in lpt.kernels.float_ops' order of
// operations, which defines them: a native program computes each with the bits of lpt's NumPy kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "integer_ops.h"

namespace lpt_ops {

// Whether the ops below take eight lanes at a time (AVX2) or one; the same bits either way. A CPU without
// AVX2 takes one; allow_eight_lanes(false) makes any CPU take one, so that tests run both forms
// (it returns the previous setting).
bool eight_lanes();
bool allow_eight_lanes(bool allowed);

// ONNX AveragePool (2-D, floor mode, no dilation; `pool`'s dilations are 1) on float32 [planes, h, w]:
// each window column added down its rows, then the columns left to right, the padding as 0.0, then
// divided by the window's area (count_include_pad) or by the elements inside.
void average_pool(const float *src, int64_t planes, int64_t h, int64_t w, const Pool &pool, bool count_include_pad,
                  float *out, int threads);
// The same on [images, h, w, channels] into [images, out_h, out_w, channels]: each channel's operations as above.
void average_pool_channels_last(const float *src, int64_t images, int64_t channels, int64_t h, int64_t w,
                                const Pool &pool, bool count_include_pad, float *out, int threads);
// x·min(max(x·f32(1/6) + 0.5, 0), 1), a NaN staying NaN as with numpy's maximum and minimum.
void hard_swish(const float *x, int64_t n, float *out, int threads);
// out = big ∘ small, or small ∘ big with `small_first` (∘: op '*', '+', '-' or '/'), over big's values:
// small elementwise (channels 0, big's layout), one value (channels < 0), or one value per image and
// channel (channels > 0) over big [images, channels, positions] (or [images, positions, channels] with
// `channels_last`), small [images, channels].
void binary(char op, const float *big, const float *small, bool small_first, int64_t images, int64_t channels,
            int64_t positions, bool channels_last, float *out, int threads);
// The same values quantized as lpt.kernels.quantize does, into 8-bit `out`: a binary op whose result only a
// quantize reads, in one pass (the float32 tensor between them is never written).
struct QuantizeTo {
    float scale = 1.0f;
    int zero_point = 0, qmin = 0, qmax = 255;
    bool is_signed = false;
};
void binary_quantized(char op, const float *big, const float *small, bool small_first, int64_t images,
                      int64_t channels, int64_t positions, bool channels_last, const QuantizeTo &to, void *out,
                      int threads);
// A binary op after the first of a chain (chain): value = value ∘ operand, or operand ∘ value with
// `operand_first`, the operand's values lying as big's do; or, with `upsampled`, the operand is the source of
// a nearest upsampling by (up_h, up_w) to big's [N, C, height, width] (channels-last or not), its values read
// where the upsampled tensor's would lie, `offset` its first value's index there.
struct ChainStep {
    char op;
    bool operand_first;
    const float *operand;
    bool upsampled = false, channels_last = false;
    int64_t up_h = 1, up_w = 1, channels = 0, height = 0, width = 0, offset = 0;
};
// binary's value of each element, then each step's in order, in one pass: each operation rounds as it does
// alone, so the values are those of the binary ops one after the other, without their tensors between them.
// Into float32 `out`, or with `to` quantized into 8-bit `out` (binary_quantized).
void chain(char op, const float *big, const float *small, bool small_first, int64_t images, int64_t channels,
           int64_t positions, bool channels_last, const std::vector<ChainStep> &steps, const QuantizeTo *to, void *out,
           int threads);
// x > 0 or NaN ? x : 0 (lpt.kernels.float_ops.relu: −0 becomes 0).
void relu(const float *x, int64_t n, float *out, int threads);
// min(max(x·α + β, 0), 1) as numpy's minimum and maximum compute it (a NaN stays).
void hard_sigmoid(const float *x, int64_t n, float alpha, float beta, float *out, int threads);
// lpt's log (exp.h) of each value.
void log(const float *x, int64_t n, float *out, int threads);
// lpt's sigmoid (exp.h) of each value.
void sigmoid(const float *x, int64_t n, float *out, int threads);
// x·a[c] + b[c] over [images, channels, positions] (or [images, positions, channels] with `channels_last`).
void affine(const float *x, const float *a, const float *b, int64_t images, int64_t channels, int64_t positions,
            bool channels_last, float *out, int threads);
// x < 0 ? x·slope : x (where the slope is not 1), then x < low ? low : x, then x > high ? high : x: the
// output stage's post-op (lpt.kernels.float_ops.slope_and_clip).
void slope_and_clip(const float *x, int64_t n, float slope, float low, float high, float *out, int threads);
// lpt's erf (exp.h) of each value.
void erf(const float *x, int64_t n, float *out, int threads);
// lpt's tanh (exp.h) of each value.
void tanh(const float *x, int64_t n, float *out, int threads);
// x·(erf(x / divisor) + one)·half of each value, in that order (lpt.kernels.gelu): GELU's five ops in one pass.
void gelu(const float *x, int64_t n, float divisor, float one, float half, float *out, int threads);
// x·((one + tanh((x + x·(x·(cube·x)))·root))·half of each value, in that order (lpt.kernels.tanh_gelu):
// jax2tf's nine ops of GELU's tanh approximation in one pass.
void tanh_gelu(const float *x, int64_t n, float cube, float root, float one, float half, float *out, int threads);
// ONNX Softmax along the last axis of [rows, n]: m = the row's maximum (a NaN wins), e = lpt's exp(x − m)
// (exp.h), s = the e added in order, y = e / s.
void softmax(const float *x, int64_t rows, int64_t n, float *out, int threads);
// ReduceMean over the last axis of [rows, n]: each row added in lanes, / n.
void mean_of_rows(const float *x, int64_t rows, int64_t n, float *out, int threads);
// ReduceMax (ReduceMin with `smallest`) of [images, positions, channels] over the positions, into
// [images, channels]: each channel's fold in which a value replaces the running one where it is greater
// (smaller), or NaN while the running one is not (kernels.extreme_over_middle_axes); no position: ∓inf.
void extreme_of_positions(const float *x, int64_t images, int64_t positions, int64_t channels, bool smallest,
                          float *out, int threads);
// The same over one channel of n values into *out, on one thread: extreme_of_positions(x, 1, n, 1, ...)'s bits.
void extreme_of_all(const float *x, int64_t n, bool smallest, float *out);
// sqrt of each value (rounded once, as numpy's).
void square_root(const float *x, int64_t n, float *out, int threads);
// ONNX LayerNormalization along the last axis of [rows, n]: the mean (the row added in order, / n), d = x − mean,
// the variance (d·d added in order, / n), y = d / sqrt(variance + epsilon) · scale[i] + bias[i] (bias may be null).
void layer_norm(const float *x, int64_t rows, int64_t n, const float *scale, const float *bias, float epsilon,
                float *out, int threads);

// jax2tf's LayerNorm over axis 1 of [images, channels, positions] (kernels.moment_layer_norm): per position,
// s1 = Σ x and s2 = Σ x·x over the channels in order, mean = s1·factor, variance = max(0, s2·factor − mean²)
// (NaN kept, +0 for −0), y = (x − mean)·(1 / sqrt(variance + epsilon)·scale[c]) + bias[c].
void moment_layer_norm(const float *x, int64_t images, int64_t channels, int64_t positions, float factor,
                       float epsilon, const float *scale, const float *bias, float *out, int threads);

// A float32 product with constant weights w [k, n], as lpt.kernels.dense computes it: for each row r and
// column c, s = 0, then s = s + a_r[i]·w[i, c] for i = 0, 1, …, k − 1 (the product rounded, then the sum),
// then s + bias[c] (bias may be null). a_r = a + g·group_step + r·row_step: rows may overlap (the frames of
// an STFT's convolution, row_step its stride). out[g] is [rows, n], or [n, rows] with `columns_first` (a
// Conv's channels-first output). The weights as pack_dense_weights lays them out.
constexpr int64_t DENSE_COLUMNS = 16;  // the columns of a packed block
// Products (rows · k · n) below which a dense product runs on one thread: below about a million the second
// core cost more than it gained (likely: its units of columns go to whichever thread asks first, so each run
// fetches weights the other core held at the last run; no counters here to tell). oww_melspectrogram's two
// STFT products (5 frames by 257 × 257 folded weights each, about 5 µs), in turns in one process (2 threads,
// a Zen 4): its run 18.4-19.5 µs parallel, 16.7-17.5 on one thread.
constexpr int64_t DENSE_PARALLEL_WORK = 1 << 20;
// w [k, n] (n contiguous) as blocks of 16 columns, each [k, 16], the last padded with zeros.
std::vector<float> pack_dense_weights(const float *w, int64_t k, int64_t n);
void dense(const float *a, int64_t groups, int64_t group_step, int64_t rows, int64_t row_step, int64_t k,
           const float *packed, int64_t n, const float *bias, bool columns_first, float *out, int threads);

}  // namespace lpt_ops
