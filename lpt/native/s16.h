// lpt's own exact int8 convolution for CPUs without VNNI (route "s16"): lpt/native/s16.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace lpt_s16 {

// A 2-D convolution with one group (a 1-D one has kernel_h = 1; a matmul [M, K] × [K, N] is a 1×1
// convolution of one image, 1 row high and M wide, with K input and N output channels).
struct Geometry {
    int64_t in_channels, out_channels, kernel_h, kernel_w;
    int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;  // dilation as ONNX: 1 = none
    int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
    // An odd channel count with dilation_w 1 (a stem's 3 colours, a spectrogram's 1 channel): no channel
    // of zeros per pixel; the kernel pairs each kernel row's run of kernel_w·in_channels values whole,
    // and the last pair's second value (the next pixel's) meets a zero weight. 7×7 on 3 channels: 11
    // pairs a row instead of 14.
    bool whole_runs = false;
    int64_t padded_channels() const { return whole_runs ? in_channels : in_channels + (in_channels & 1); }
    int64_t row_values() const { return (kernel_w * padded_channels() + 1) & ~int64_t(1); }  // weights per kernel row
    int64_t out_h(int64_t h) const { return (h + pad_top + pad_bottom - (kernel_h - 1) * dilation_h - 1) / stride_h + 1; }
    int64_t out_w(int64_t w) const { return (w + pad_left + pad_right - (kernel_w - 1) * dilation_w - 1) / stride_w + 1; }
};

bool supported();  // the CPU has AVX2
// Whether kernels may take sixteen float32 lanes per AVX-512 register (the GELU stage, quantize_values,
// lpt_ops::dense): an Intel CPU since Skylake-SP, an AMD one since Zen 4. LPT_AVX512=off keeps AVX2, as on
// a CPU without AVX-512, so that one machine tests both.
bool sixteen_lanes();
// Whether the CPU has AVX2 and FMA: the GELU stage's eight-lane approximation (gelu256.h) needs both.
bool fused_multiply_add();

// The GELU stage approximation's largest error against its bound, |fast(x) − reference(x)| /
// (GELU_FAST_ABS + GELU_FAST_PER_U·u), over the float32 values whose bits are in [first, last) (multiples
// of 16), on `threads` threads; where it is, in worst_x. The stage relies on it being below 1 for every
// finite x. The approximation this process's stage takes: gelu512.h's with sixteen_lanes(), else gelu256.h's
// (its GELU_FAST8_ constants), which needs fused_multiply_add().
double gelu_fast_worst_ratio(uint32_t first, uint32_t last, int threads, float *worst_x);

// Memory on 64-byte boundaries: each step of the kernel loads 64 bytes of weights, one cache line
// instead of parts of two.
template <typename T>
struct CacheLineAllocator {
    using value_type = T;
    CacheLineAllocator() = default;
    template <typename U>
    CacheLineAllocator(const CacheLineAllocator<U> &) {}
    T *allocate(std::size_t n) { return static_cast<T *>(::operator new(n * sizeof(T), std::align_val_t(64))); }
    void deallocate(T *p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
    bool operator==(const CacheLineAllocator &) const { return true; }
    bool operator!=(const CacheLineAllocator &) const { return false; }
};
using PackedWeights = std::vector<int16_t, CacheLineAllocator<int16_t>>;

// int8 weights [OC, IC, KH, KW] → int16, in the order the kernel reads them.
PackedWeights pack_weights(const int8_t *weights, const Geometry &g);
// The same, in int8 (the kernel sign-extends each sixteen as it reads them): half the bytes, for weights
// the caches do not hold (a classifier's [1024, 8210], 17 MB as int16), whose stream bounds the layer.
using NarrowWeights = std::vector<int8_t, CacheLineAllocator<int8_t>>;
NarrowWeights narrow_weights(const PackedWeights &packed);

// Where the one byte of `bytes` [n] other than `zero` lies: its index, −1 where all are `zero`, −2 where two
// or more are not.
int64_t single_other_byte(const uint8_t *bytes, int64_t n, uint8_t zero);
// acc [n] = v·weights [n]
void scaled_weights(int32_t v, const int8_t *weights, int64_t n, int32_t *acc);

// The source's int16 form the kernel reads: q − zero_point, channels-last, padded with zeros
// (spatially, and to an even channel count), [images, H + pads, W + pads, padded_channels].
int64_t widened_size(const Geometry &g, int64_t images, int64_t h, int64_t w);
void widen(const uint8_t *src, bool signed_src, bool channels_last, int zero_point, const Geometry &g,
           int64_t images, int64_t h, int64_t w, int16_t *wide, int threads);

// acc [images, out_h·out_w, OC] int32 = Σ wide · weights, exactly; the weights packed (int16_t) or narrow (int8_t).
template <typename W>
void convolve(const int16_t *wide, const W *packed, const Geometry &g, int64_t images, int64_t h, int64_t w,
              int32_t *acc, int threads);

// The direct kernel on bytes (convolve_bytes): vpmaddubsw multiplies the source's bytes by int8 weights and adds
// each pair of products in int16, with saturation, which r ≤ 127 rules out (127·128·2 < 2^15); then vpmaddwd
// by ones widens to int32. So the source is read through a window of 128 levels [t, t + 127] around its zero
// point (window_start): each value u (q, or q + 128 signed) as r = clamp(u − t, 0, 127), and u − t − r, zero
// inside the window, kept aside for the few values outside it (Outside) and added back after the pass, each
// times its weights. Σ (q − zp)·w = Σ r·w + Σ (u − t − r)·w − (zp − t)·Σ w, the last term per output channel,
// with spatial padding holding zp (inside the window, so it adds nothing). PaddleOCR's detector: at most 0.3%
// of a layer's source outside its window (most layers 0.01%); past 1/128 the int16 kernel runs instead.
// Measured on a Zen 3 (one core, a tile of 6 positions × 16 channels over 384 inputs in a program of its own):
// vpmaddwd on int16 35-44 GMAC/s, vpmaddubsw 58-80.
struct ByteWeights {
    std::vector<int8_t, CacheLineAllocator<int8_t>> packed;  // [block][kernel row][quad][2][8 channels][4 inputs]
    std::vector<int8_t> by_input;  // [kernel row][kernel column][input channel][output channel, padded to 16]
    std::vector<int32_t> sums;     // Σ w per output channel, padded to 16
};
// Whether convolve_bytes can run g: a direct convolution whose kernel rows are contiguous runs, of whole quads
// of channels (a stem's 3 channels would read a fourth of zeros, and the int16 kernel pairs its runs whole).
inline bool bytes_fit(const Geometry &g) { return g.dilation_w == 1 && g.in_channels % 4 == 0; }
ByteWeights pack_byte_weights(const int8_t *weights, const Geometry &g);
// The window's first level for a source whose zero point is u = zp (zp + 128 signed): 64 below it, within
// [0, 128], so that the window holds u (at 64 from its start, or nearer an end of [0, 255]).
inline int window_start(int zero_point, bool signed_src) {
    return std::clamp(zero_point + (signed_src ? 128 : 0) - 64, 0, 128);
}
// The source's values outside the window, row by row of the padded source: row i's are
// values[i·capacity, i·capacity + counts[i]), by column. A row with more than `capacity` makes pad_bytes give up.
struct OutsideValue {
    int32_t column;   // in the padded row
    int16_t channel;
    int16_t excess;   // u − t − r: in [−128, −1] below the window, [1, 128] above
};
struct Outside {
    int64_t capacity = 0;
    std::vector<int32_t> counts;
    std::vector<OutsideValue> values;
};
// The source as convolve_bytes reads it: r, channels-last, padded spatially with the zero point's r,
// [images, H + pads, W + pads, C]; the values outside the window into `outside`. False (and the padded source
// incomplete) where more than 1/128 of the values, or 1/64 of a row's, lie outside, the int16 kernel being then
// the faster; with `always`, true whatever lies outside (every value of a row may).
int64_t padded_bytes_size(const Geometry &g, int64_t images, int64_t h, int64_t w);
bool pad_bytes(const uint8_t *src, bool signed_src, bool channels_last, int zero_point, const Geometry &g,
               int64_t images, int64_t h, int64_t w, bool always, uint8_t *padded, Outside &outside, int threads);

// Depthwise convolutions (one input and one output channel per group) read the source, not widen()'s form: each
// band of output rows pairs the rows it reads, per block of 16 channels, each position's q − zero_point beside the
// one dilation_w positions to its right in int16 (channels 0-7's pairs, then 8-15's), which is how vpmaddwd takes
// two taps of a kernel row. The weights [C, 1, KH, KW] are packed the same way per block, kernel row and pair of
// taps (an odd row's last tap paired with a zero): [block][row][pair][2·16]. A product (q − zp)·w is at most
// 255·128 = 32 640 in magnitude, so vpmaddwd adds a channel's two products exactly in int32; the sum over the
// window too.
PackedWeights pack_depthwise_weights(const int8_t *weights, const Geometry &g);
// What widen() must leave readable past the widened source: a block of 16 channels read whole (by
// winograd()), or the value after a whole run.
constexpr int64_t READ_SLACK = 16;
// acc [images, out_h·out_w, C] from src [images, C, H, W] uint8 or int8 (channels-last: [images, H, W, C]).
void depthwise(const uint8_t *src, bool signed_src, bool channels_last, int zero_point, const int16_t *packed,
               const Geometry &g, int64_t images, int64_t h, int64_t w, int32_t *acc, int threads);

// The output stage of lpt/native/_engine.cpp (and lpt.kernels.output_stage), as numbers:
// x = f32(acc)·multiplier[c] + bias[c], each post-op in turn, then for an 8-bit destination
// saturate(rint(x / scale) + zero_point) in [qmin, qmax]. The arrays hold one value per output
// channel, padded with zeros to a multiple of 16.
constexpr int64_t MAX_POST_OPS = 8;  // a chain has one or two; the vector stage keeps them in registers
// A post-op is four floats (kind, slope, low, high). SLOPE_CLIP: x < 0 ? x·slope : x (a LeakyRelu,
// where the slope is not 1), then min(max(x, low), high) (Relu, Clip); SIGMOID: lpt's Sigmoid
// (exp.h), the other three unused; GELU: x·(erf(x / divisor) + one)·half with lpt's erf (exp.h),
// divisor, one and half in the places of slope, low and high; SILU: x·sigmoid(x), the other three unused;
// HARD_SWISH: x·min(max(x·alpha + beta, 0), 1), alpha and beta in the places of slope and low.
constexpr int64_t POST_OP_FIELDS = 4;
constexpr float SLOPE_CLIP = 0.0f, SIGMOID = 1.0f, GELU = 2.0f, SILU = 3.0f, HARD_SWISH = 4.0f;

struct Epilogue {
    enum Type { f32, u8, s8 } type = f32;
    const float *multiplier = nullptr, *bias = nullptr;  // bias may be null
    const float *post_ops = nullptr;                    // POST_OP_FIELDS floats each
    int64_t post_op_count = 0;                          // at most MAX_POST_OPS
    float scale = 1.0f;
    int zero_point = 0, qmin = 0, qmax = 255;
    // x below TINY in magnitude enters the post-ops as +0, where that gives the same levels (_engine.cpp:
    // tiny_values_quantize_as_zero says when): subnormal floats take a microcode assist per operation on
    // Intel CPUs, and a real detector's GELU layers (biases of 1e-41 in dead channels) ran ten times slower.
    bool flush_tiny = false;
    // A GELU stage's approximation (gelu512.h), where it applies: its margin per unit of u, and the distance
    // from a half within which a level is computed again; −1 where the reference computes every level.
    // Set by prepare_gelu_fast.
    float gelu_per_u = 0.0f, gelu_near_half = -1.0f;
    // A float32 tensor the stage adds after the post-ops, before the quantization (_engine.cpp: add_in_stage,
    // a residual Add after a layer that writes float32): x + addend, or addend + x with addend_first. It lies
    // as the output does ([images, positions, OC]); only where there is no post-op and flush_tiny is off, and
    // only in the staged kernels (convolve_staged, depthwise_staged, winograd_staged).
    const float *addend = nullptr;
    bool addend_first = false;
    // A stage with no post-op or one clip (Relu, Clip; no slope) as one product per value: its level is the
    // nearest integer n of Y = RN(f32(acc)·multiplier' + bias') (multiplier' = multiplier / scale, bias' =
    // bias / scale + zero_point), Y clamped to [low, high], wherever |Y − n| (plus |f32(acc)|·lane_bound[c]
    // where lane_bound is given) < near_half; elsewhere the reference's operations. Set by
    // prepare_clipped_levels (which says why the levels are the same) for the quantization recorded here;
    // near_half −1 where it does not apply.
    struct Levels {
        const float *multiplier = nullptr, *bias = nullptr, *lane_bound = nullptr;  // padded to a multiple of 16
        float low = 0.0f, high = 0.0f, near_half = -1.0f;
        float scale = 0.0f;
        int zero_point = 0, qmin = 0, qmax = 0;
    } levels;
};
constexpr float TINY = 0x1p-96f;

// Whether e.levels stands for e's stage: prepared, and for the quantization e has now (a copy of an Epilogue
// may quantize to another scale: _engine.cpp's stage of a layer and the Add after it).
inline bool levels_apply(const Epilogue &e) {
    const Epilogue::Levels &l = e.levels;
    return l.near_half > 0.0f && l.scale == e.scale && l.zero_point == e.zero_point && l.qmin == e.qmin &&
           l.qmax == e.qmax;
}

// e.levels for `channels` channels, where largest[c] bounds |acc| of channel c (Σ|w|·255): their multipliers,
// biases and bounds into `constants` (three runs of `channels` padded to a multiple of 16), which must outlive e.
void prepare_clipped_levels(Epilogue &e, const double *largest, int64_t channels, std::vector<float> &constants);

// e's gelu_per_u and gelu_near_half, for `channels` channels of multipliers and biases: where its one post-op
// is PaddleOCR's GELU, every channel's x is within the approximation's checked range, and the quantization
// leaves room for its margin.
void prepare_gelu_fast(Epilogue &e, int64_t channels);

// Whether e's level never decreases as an accumulator grows: an 8-bit stage with multipliers ≥ 0, a positive
// scale, and no post-op or one clip whose slope is ≥ 0 (each of its operations keeps the order). The largest
// accumulator of a max pool's window then has the window's largest level.
bool stage_keeps_order(const Epilogue &e, int64_t channels);
// convolve_staged's output max-pooled over windows of pool_h × pool_w positions, as far apart (no pads; a last
// partial window dropped), where stage_keeps_order(e): each window's largest accumulators are staged, a
// pool_h·pool_w-th of the stage's work, and the output before the pool is never written.
// out [images, rows·columns, OC], rows = out_h / pool_h, columns = out_w / pool_w.
void convolve_pooled_staged(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h,
                            int64_t w, int64_t pool_h, int64_t pool_w, const Epilogue &e, void *out, int threads);
// The same by Winograd (winograd_staged) for a 2×2 pool and no dilation: a 2×2 block of outputs is one window.
void winograd_pooled_staged(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h,
                            int64_t w, const Epilogue &e, void *out, int threads);

// out [images, out_h·out_w, OC] (float32, uint8 or int8 as `e` says) = the output stage of
// convolve's accumulators, applied to each tile while they are in registers: the int32 values
// never reach memory, and no pass over the output follows.
template <typename W>
void convolve_staged(const int16_t *wide, const W *packed, const Geometry &g, int64_t images, int64_t h,
                     int64_t w, const Epilogue &e, void *out, int threads);
void depthwise_staged(const uint8_t *src, bool signed_src, bool channels_last, int zero_point, const int16_t *packed,
                      const Geometry &g, int64_t images, int64_t h, int64_t w, const Epilogue &e, void *out,
                      int threads);
// convolve's and convolve_staged's results from pad_bytes's source and values outside the window (ByteWeights);
// zero_point and signed_src as pad_bytes took them.
void convolve_bytes(const uint8_t *padded, const Outside &outside, const ByteWeights &b, int zero_point,
                    bool signed_src, const Geometry &g, int64_t images, int64_t h, int64_t w, int32_t *acc, int threads);
void convolve_bytes_staged(const uint8_t *padded, const Outside &outside, const ByteWeights &b, int zero_point,
                           bool signed_src, const Geometry &g, int64_t images, int64_t h, int64_t w, const Epilogue &e,
                           void *out, int threads);

// The same output stage on `rows` rows of `channels` accumulators from elsewhere (oneDNN's: hi, or
// hi·64 + lo on the split route) into as many rows of out. Needs AVX2 (supported()).
void stage_rows(const Epilogue &e, const int32_t *hi, const int32_t *lo, int64_t rows, int64_t channels, void *out);
// The same on channels [first_channel, first_channel + channels) only: acc rows `acc_stride` apart holding
// those channels alone, into those columns of out's rows of `out_stride` values (a band of a layer's
// output channels).
void stage_columns(const Epilogue &e, const int32_t *hi, const int32_t *lo, int64_t rows, int64_t first_channel,
                   int64_t channels, int64_t acc_stride, void *out, int64_t out_stride);

// out[i] = saturate(rint(x[i] / scale) + zero_point) in [qmin, qmax], int8 or uint8: the output stage's last
// step, and lpt's QuantizeLinear (lpt.kernels.quantize), sixteen values at a time. Needs AVX2.
void quantize_values(const float *x, int64_t n, float scale, int zero_point, int qmin, int qmax, bool signed_out,
                     void *out);

// low = min(low, x[i]), high = max(high, x[i]) over x [n], a NaN left out (x < low and x > high are false
// for it): DynamicQuantizeLinear's range, eight values per compare instead of one. Needs AVX2.
void extend_range(const float *x, int64_t n, float &low, float &high);

// out[3p + c] = planes[c·plane_stride + p] ^ flip for p < count, c < 3: a three-channel image's planes
// into channels-last, sixteen positions per shuffle instead of a byte at a time. Needs AVX2.
void interleave_three_planes(const uint8_t *planes, int64_t plane_stride, int64_t count, uint8_t flip, uint8_t *out);

// Products of two activations (lpt.native.Product), a [M, K] × b [K, N] per batch: b − zb packed as int16
// pairs along K, [ceil(K/2)][N rounded up to 8][2], zeros past K and N; each row of a − za as ceil(K/2)
// int16 pairs. vpmaddwd adds each pair of products (at most 2·255·255) in int32: exact, as
// every sum is (K ≤ 2^31 / 255², which lpt.native.Product checks).
inline int64_t product_columns(int64_t n) { return (n + 7) / 8 * 8; }
void pack_product_operand(const uint8_t *b, bool b_signed, int zero_point, int64_t k, int64_t n, int16_t *packed);
// row [product_columns(n)] = Σ_k a[k]·b[k, c]
void product_row(const int16_t *a_pairs, const int16_t *packed, int64_t k, int64_t n, int32_t *row);

// 3×3 convolutions of stride 1 and at least 16 channels by Winograd's F(2×2, 3×3) in integers,
// exactly: each 2×2 block of outputs costs 16 products per channel pair instead of 36. A dilated one
// runs as one undilated convolution per phase (the outputs whose row and column are the same modulo
// the dilations read only source rows and columns of that phase): the same sums. Scaled by 2,
// the transforms have only integer coefficients: the source's transform B^T·d·B adds at most 4
// values of [−255, 255] (|v| ≤ 1020) and the weights' (2G)·g·(2G)^T at most 9 of [−128, 127]
// (|u| ≤ 1152), both int16, and each pair of products (≤ 2·1020·1152) fits int32. Sums wrap modulo
// 2^32, and the result, 4× the exact accumulator, is exact where 4·|acc| < 2^31, as it is for
// in_channels ≤ WINOGRAD_MAX_CHANNELS (4·C·9·255·128 < 2^31); the division by 4 is then exact too.
constexpr int64_t WINOGRAD_MAX_CHANNELS = 1824;
bool winograd_fits(const Geometry &g);
// Whether Winograd beats the direct kernel on this source: on maps smaller than 4×4 (a phase's map, when
// dilated) its transforms and its weights, 16/9 the direct kernel's, cost more than the products saved
// (measured on a Zen 3, 512 channels: 1.2× slower at 2×2, 1.05× at 3×3, 0.6–0.8× from 4×4 on).
constexpr int64_t WINOGRAD_MIN_SIDE = 4;
bool winograd_pays(const Geometry &g, int64_t h, int64_t w);
PackedWeights pack_winograd_weights(const int8_t *weights, const Geometry &g);
// The geometry widen() must use for winograd(): rows and columns of zeros past the source so that every
// 2×2 block of every phase reads a whole 4×4 window (undilated: one more where the output's side is odd).
Geometry winograd_widening(const Geometry &g, int64_t h, int64_t w);
void winograd(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h, int64_t w,
              int32_t *acc, int threads);
void winograd_staged(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h,
                     int64_t w, const Epilogue &e, void *out, int threads);

}  // namespace lpt_s16
