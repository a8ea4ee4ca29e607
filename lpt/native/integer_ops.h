// The integer steps between lpt's int8 layers, for lpt/native's programs: exactly lpt's NumPy/C
// kernels (lpt/kernels/quantize.py, pooling.py, elementwise.py and _elementwise.c), in the same
// float32 operations and order. They know nothing of graphs: arrays in, arrays out.
#pragma once

#include <cstdint>

namespace lpt_ops {

// The same as quantize() below on this thread alone, for a run of values another loop has just computed.
void quantize_run(const float *x, int64_t n, float scale, int zero_point, int qmin, int qmax, void *out,
                  bool signed_out);
// q = saturate(rint(x / scale) + zero_point) (ONNX QuantizeLinear, per tensor), into uint8 or int8.
void quantize(const float *x, int64_t n, float scale, int zero_point, int qmin, int qmax, void *out, bool signed_out,
              int threads);

// ONNX DynamicQuantizeLinear, as lpt.numerics.dynamic_quantize_linear: the range [min(x, 0), max(x, 0)]
// (NaN left out), scale = (high − low)/255 (1 where high = low), zp = rint(clip(−low/scale, 0, 255)),
// then x quantized to uint8 into out.
void dynamic_quantize(const float *x, int64_t n, uint8_t *out, float &scale, int &zero_point, int threads);

// onnxruntime's float32 stage after a ConvInteger or MatMulInteger of quantize_dynamic's graph, in its operations:
// y = f32(acc + bias_q[c])·scales[c] + bias[c] (the int32 add wraps; bias_q, bias null: none), then the SiLU
// `silu`: 0 none, 1 y·logistic(y), 2 y·min(1, logistic(y)), the logistic as MLAS's FMA3 kernel computes it
// (lpt.numerics.onnxruntime_logistic). In place: `values` holds int32 accumulators [rows, channels] and gets the
// float32 results.
enum Silu { NO_SILU = 0, SILU = 1, CLAMPED_SILU = 2 };
void dynamic_stage(void *values, int64_t rows, int64_t channels, const int32_t *bias_q, const float *scales,
                   const float *bias, Silu silu, int threads);
// bias_q[c] = int32(floor(bias[c] / scales[c])), as onnxruntime's Div, Floor and Cast compute it (x86's
// conversion: INT32_MIN where the value is NaN or beyond int32).
void dynamic_bias(const float *bias, int64_t channels, const float *scales, int32_t *bias_q);

// out[n, c, y, x] = src[n, c, y / kh, x / kw] (nearest-neighbour upsampling by whole factors) for values
// of `item` bytes, [N, C, H, W] or, with `channels_last`, [N, H, W, C] (and out in the same layout).
void upsample_nearest(const void *src, int item, int64_t images, int64_t channels, int64_t h, int64_t w, int64_t kh,
                      int64_t kw, bool channels_last, void *out, int threads);

// Where a result goes: float32 values (type 'f'), or quantized into uint8 ('B') or int8 ('b').
struct Destination {
    char type = 'f';
    float scale = 1.0f;
    int zero_point = 0, qmin = 0, qmax = 255;
};

// x = (q_a − a_shift)·a_scale + (or ·) (q_b − b_shift)·b_scale, then max(x, 0) with relu, then to `to`.
void join(const void *a, bool a_signed, const void *b, bool b_signed, int64_t n, bool multiply, float a_shift,
          float a_scale, float b_shift, float b_scale, bool relu, const Destination &to, void *out, int threads);

// out [rows, k] = high where v[r] (int64 if `wide`, else int32) equals table[j], else low: a quantized
// one-hot (lpt.kernels.one_hot_levels).
void one_hot(const void *v, bool wide, int64_t rows, const int64_t *table, int64_t k, uint8_t low, uint8_t high,
             uint8_t *out, int threads);

// ONNX GlobalAveragePool on float32 [images, channels, positions] (or channels-last [images,
// positions, channels]) → [images, channels]: each channel's values added in position order, in
// float32, then divided by the count (lpt.kernels.global_average_pool, which defines the order).
void mean_of_positions(const float *x, int64_t images, int64_t channels, int64_t positions, bool channels_last,
                       float *out, int threads);

// ONNX MaxPool (2-D, floor mode) on [images, channels, h, w] of uint8, int8 ('B', 'b') or float32 ('f'): the
// padding never wins; of floats a NaN does, the first in tap order (lpt.kernels.max_pool_q).
struct Pool {
    int64_t kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left, pad_bottom, pad_right;
    int64_t out_h(int64_t h) const { return (h + pad_top + pad_bottom - (kernel_h - 1) * dilation_h - 1) / stride_h + 1; }
    int64_t out_w(int64_t w) const { return (w + pad_left + pad_right - (kernel_w - 1) * dilation_w - 1) / stride_w + 1; }
};
void max_pool(const void *src, char type, int64_t planes, int64_t h, int64_t w, const Pool &pool, void *out,
              int threads);
// The same on channels-last [images, h, w, channels].
void max_pool_channels_last(const void *src, char type, int64_t images, int64_t channels, int64_t h, int64_t w,
                            const Pool &pool, void *out, int threads);

// out[i0, …, i(r−1)] = in[Σ i_k·step_k] over out's dims, row-major: a transpose of items of `item`
// bytes (1 or 4), step_k being the input's stride along the axis output axis k reads.
void permute(const unsigned char *in, int item, const int64_t *dims, const int64_t *step, int rank, unsigned char *out);

// [images, rows, columns] → [images, columns, rows], items of `item` bytes (1 or 4): between
// channels-first [N, C, positions] and channels-last [N, positions, C].
void transpose(const void *src, void *dst, int64_t images, int64_t rows, int64_t columns, int item, int threads);

}  // namespace lpt_ops
