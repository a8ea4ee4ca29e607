// lpt's own exact int8 convolution for CPUs without VNNI (route "s16"; lpt/native/routes.py).
//
// On AVX2 the fast int8 kernels (oneDNN's, onnxruntime's, OpenVINO's) multiply u8 by s8 with
// vpmaddubsw, which adds each pair of products in int16 with saturation: 2·255·127 does not fit.
// This kernel widens the source to int16 first, as q − zero_point in [−255, 255], and multiplies
// with vpmaddwd: each pair of products (at most 2·255·128 = 65 280) is added in int32, so every
// accumulator is the exact Σ (q_src − zp)·q_wei. It knows nothing of graphs: a geometry, int16
// buffers and int32 accumulators.
//
// Layout: the widened source is channels-last and padded ([n, y, x, c], an even channel count), so
// for a kernel row the window of one output position is one contiguous run of kernel_w·channels
// values (when dilation_w = 1). The weights are packed per block of 16 output channels as
// [kernel_h][kernel_w][channel pair][16][2]: one pair of input channels for 16 outputs is 32 int16,
// two ymm registers. A tile of 6 output positions × 16 output channels keeps 12 accumulators in
// registers; each step broadcasts one int32 (a pair of source values) per position. When the
// caller gives the output stage (convolve_staged), each tile's accumulators go through it while
// they are in registers, so no int32 tensor is written. Depthwise convolutions have their own
// loop (each_depthwise_tile): no reduction over channels to pair, so it pairs a kernel row's taps instead.
// 3×3 convolutions of stride 1 may run by integer Winograd (each_winograd_tile, s16.h says why it
// is exact): the source and the weights transformed, 16 products per 2×2 block by the same tile
// kernel, the outputs transformed back before the output stage; dilated ones phase by phase.

#include "s16.h"
#include "levels512.h"
#include "gelu256.h"
#include "gelu512.h"
#include "exp.h"
#include "parallel.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace lpt_s16 {
namespace {

constexpr int64_t LANES = 16;  // output channels per block: two ymm of int32
constexpr int TILE = 6;        // output positions per tile: 12 accumulators + 2 weights + 1 source of 16 ymm
constexpr int64_t PARALLEL_WORK = 1 << 15;
constexpr int64_t FEW_GROUPS_BYTES = 128 << 10;       // Winograd: transformed source kept in L2 at a time
constexpr size_t KEEP_TRANSFORMED_BYTES = 32u << 20;  // a large batch's transformed source is not kept

struct Walk {  // how a tile walks the window of its positions, the same for every position
    int64_t rows, row_stride;   // kernel rows, and the int16 between them in the widened source
    int64_t runs, run_stride;   // contiguous runs per kernel row (1, or kernel_w when dilated)
    int64_t pairs;              // channel pairs per run
};

// A tile of T positions × 16 output channels (HALVES 2), or × the first 8 (HALVES 1: a layer's last block
// where at most eight are valid, 24 channels being a block of 16 and one of 8, so the products of the
// eight lanes no one reads are not computed, and lanes 8-15 of out are left as they were).
// Sixteen weights as int16: packed so (PackedWeights), or int8 sign-extended as they are read (NarrowWeights).
__attribute__((target("avx2"))) inline __m256i weight_vector(const int16_t *w) {
    return _mm256_load_si256(reinterpret_cast<const __m256i *>(w));
}
__attribute__((target("avx2"))) inline __m256i weight_vector(const int8_t *w) {
    return _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i *>(w)));
}

template <int T, int HALVES = 2, typename W = int16_t>
__attribute__((target("avx2"))) void tile(const int16_t *const *positions, const W *weights, const Walk &walk,
                                          int32_t *out) {  // out [T][LANES]
    __m256i acc[T][HALVES];
    for (int j = 0; j < T; ++j)
        for (int k = 0; k < HALVES; ++k) acc[j][k] = _mm256_setzero_si256();
    const W *w = weights;
    for (int64_t row = 0; row < walk.rows; ++row) {
        for (int64_t run = 0; run < walk.runs; ++run) {
            const int64_t offset = row * walk.row_stride + run * walk.run_stride;
            const int16_t *src[T];
            for (int j = 0; j < T; ++j) src[j] = positions[j] + offset;
            for (int64_t q = 0; q < walk.pairs; ++q, w += 2 * LANES) {
                __m256i wk[HALVES];
                for (int k = 0; k < HALVES; ++k) wk[k] = weight_vector(w + k * LANES);
                for (int j = 0; j < T; ++j) {
                    int32_t pair;
                    std::memcpy(&pair, src[j] + 2 * q, sizeof pair);
                    const __m256i s = _mm256_set1_epi32(pair);
                    for (int k = 0; k < HALVES; ++k) acc[j][k] = _mm256_add_epi32(acc[j][k], _mm256_madd_epi16(s, wk[k]));
                }
            }
        }
    }
    for (int j = 0; j < T; ++j)
        for (int k = 0; k < HALVES; ++k)
            _mm256_store_si256(reinterpret_cast<__m256i *>(out + j * LANES + 8 * k), acc[j][k]);
}

template <typename W>
using TileFunction = void (*)(const int16_t *const *, const W *, const Walk &, int32_t *);
template <typename W = int16_t>
constexpr TileFunction<W> TILES[TILE + 1] = {nullptr, tile<1, 2, W>, tile<2, 2, W>, tile<3, 2, W>, tile<4, 2, W>,
                                             tile<5, 2, W>, tile<6, 2, W>};

// One position × BLOCKS blocks of 16 channels, into out [BLOCKS][LANES]: a source of one position (a
// recurrence's step at batch 1, a matmul of one row) has no other position to share a tile's weights
// with, so each pair of it is broadcast once for BLOCKS · 2 vpmaddwd instead of two (a tile of one
// position). `block_size`: the weights from one block's packed weights to the next's. Measured (Zen 3,
// one thread, alternating): one row by [512, 2048], int16 weights, 64 → 58 µs; with the int8 copy
// (_engine.cpp: narrow_for_one_row) 39.
template <int BLOCKS, typename W = int16_t>
__attribute__((target("avx2"))) void row_tile(const int16_t *position, const W *weights, int64_t block_size,
                                              const Walk &walk, int32_t *out) {
    __m256i acc[BLOCKS][2];
    for (int b = 0; b < BLOCKS; ++b) acc[b][0] = acc[b][1] = _mm256_setzero_si256();
    int64_t at = 0;  // the pair's place in every block's weights
    for (int64_t row = 0; row < walk.rows; ++row) {
        for (int64_t run = 0; run < walk.runs; ++run) {
            const int16_t *src = position + row * walk.row_stride + run * walk.run_stride;
            for (int64_t q = 0; q < walk.pairs; ++q, at += 2 * LANES) {
                int32_t pair;
                std::memcpy(&pair, src + 2 * q, sizeof pair);
                const __m256i s = _mm256_set1_epi32(pair);
                for (int b = 0; b < BLOCKS; ++b)
                    for (int k = 0; k < 2; ++k) {
                        const __m256i wk = weight_vector(weights + b * block_size + at + k * LANES);
                        acc[b][k] = _mm256_add_epi32(acc[b][k], _mm256_madd_epi16(s, wk));
                    }
            }
        }
    }
    for (int b = 0; b < BLOCKS; ++b)
        for (int k = 0; k < 2; ++k) _mm256_store_si256(reinterpret_cast<__m256i *>(out + b * LANES + 8 * k), acc[b][k]);
}

constexpr int ROW_TILE_BLOCKS = 4;  // 8 accumulators
template <typename W>
using RowTileFunction = void (*)(const int16_t *, const W *, int64_t, const Walk &, int32_t *);
template <typename W = int16_t>
constexpr RowTileFunction<W> ROW_TILES[ROW_TILE_BLOCKS + 1] = {nullptr, row_tile<1, W>, row_tile<2, W>, row_tile<3, W>,
                                                               row_tile<4, W>};

// Half tiles take twice the positions: 12 accumulators + 1 weight + 1 source of 16 ymm. PaddleOCR's
// detector's 3×3 stride-2 48→24 layer over 320×320 computed a third of its products for nothing.
constexpr int HALF_TILE = 12;
template <typename W = int16_t>
constexpr TileFunction<W> HALF_TILES[HALF_TILE + 1] = {
    nullptr, tile<1, 1, W>, tile<2, 1, W>, tile<3, 1, W>, tile<4, 1, W>, tile<5, 1, W>, tile<6, 1, W>,
    tile<7, 1, W>, tile<8, 1, W>, tile<9, 1, W>, tile<10, 1, W>, tile<11, 1, W>, tile<12, 1, W>};

// A tile of T positions × 24 channels: a block of 16 (weights) and the first 8 of the next (next_weights,
// the layer's last block, where at most eight are valid), into out and next_out [T][LANES]. Each step
// broadcasts 4 sources for 12 vpmaddwd, where a half tile broadcasts 12: a 2×2 12→24 layer over 320×320
// on one thread took 1.8 ms for its last 8 channels in half tiles, 2.0 for its first 16; 1.3 so.
constexpr int WIDE_TILE = 4;
template <int T, typename W = int16_t>
__attribute__((target("avx2"))) void wide_tile(const int16_t *const *positions, const W *weights, const W *next_weights,
                                               const Walk &walk, int32_t *out, int32_t *next_out) {
    __m256i acc[T][3];
    for (int j = 0; j < T; ++j)
        for (int k = 0; k < 3; ++k) acc[j][k] = _mm256_setzero_si256();
    const W *w = weights, *v = next_weights;
    for (int64_t row = 0; row < walk.rows; ++row) {
        for (int64_t run = 0; run < walk.runs; ++run) {
            const int64_t offset = row * walk.row_stride + run * walk.run_stride;
            const int16_t *src[T];
            for (int j = 0; j < T; ++j) src[j] = positions[j] + offset;
            for (int64_t q = 0; q < walk.pairs; ++q, w += 2 * LANES, v += 2 * LANES) {
                const __m256i wk[3] = {weight_vector(w), weight_vector(w + LANES), weight_vector(v)};
                for (int j = 0; j < T; ++j) {
                    int32_t pair;
                    std::memcpy(&pair, src[j] + 2 * q, sizeof pair);
                    const __m256i s = _mm256_set1_epi32(pair);
                    for (int k = 0; k < 3; ++k) acc[j][k] = _mm256_add_epi32(acc[j][k], _mm256_madd_epi16(s, wk[k]));
                }
            }
        }
    }
    for (int j = 0; j < T; ++j) {
        _mm256_store_si256(reinterpret_cast<__m256i *>(out + j * LANES), acc[j][0]);
        _mm256_store_si256(reinterpret_cast<__m256i *>(out + j * LANES + 8), acc[j][1]);
        _mm256_store_si256(reinterpret_cast<__m256i *>(next_out + j * LANES), acc[j][2]);
    }
}

template <typename W>
using WideTileFunction = void (*)(const int16_t *const *, const W *, const W *, const Walk &, int32_t *, int32_t *);
template <typename W = int16_t>
constexpr WideTileFunction<W> WIDE_TILES[WIDE_TILE + 1] = {nullptr, wide_tile<1, W>, wide_tile<2, W>, wide_tile<3, W>,
                                                           wide_tile<4, W>};

// The post-ops of an Epilogue as vectors, set once per call of stage() rather than per position.
struct VectorPostOps {
    int64_t count = 0;
    bool sigmoid[MAX_POST_OPS], silu[MAX_POST_OPS], gelu[MAX_POST_OPS], hard_swish[MAX_POST_OPS], leaky[MAX_POST_OPS];
    __m256 slope[MAX_POST_OPS], low[MAX_POST_OPS], high[MAX_POST_OPS];
};

__attribute__((target("avx2"))) inline VectorPostOps vector_post_ops(const Epilogue &e) {
    VectorPostOps v;
    v.count = e.post_op_count;
    for (int64_t k = 0; k < v.count; ++k) {
        const float *op = e.post_ops + POST_OP_FIELDS * k;
        v.sigmoid[k] = op[0] == SIGMOID;
        v.silu[k] = op[0] == SILU;
        v.gelu[k] = op[0] == GELU;
        v.hard_swish[k] = op[0] == HARD_SWISH;
        v.leaky[k] = op[1] != 1.0f;
        v.slope[k] = _mm256_set1_ps(op[1]);
        v.low[k] = _mm256_set1_ps(op[2]);
        v.high[k] = _mm256_set1_ps(op[3]);
    }
    return v;
}

// x, or +0 where |x| < TINY (Epilogue::flush_tiny)
__attribute__((target("avx2"))) inline __m256 flushed(__m256 x) {
    const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    return _mm256_andnot_ps(_mm256_cmp_ps(magnitude, _mm256_set1_ps(TINY), _CMP_LT_OQ), x);
}

// x = f32(acc)·multiplier + bias, then each post-op: lpt's Sigmoid, a GELU (slope, low, high: divisor,
// one, half), or a LeakyRelu's x < 0 ? x·slope : x then its clip; on N vectors at once (HALVES of a
// tile's sixteen channels, both or the first, at N / HALVES positions), so that their chains of an exp
// or an erf interleave (lpt_exp::erf_lanes_n). A 1×1 48→96 convolution over 160×160 with a GELU took
// 9.8 ms one vector at a time, 5.5 ms four at a time, 2.6 ms without the GELU (2 threads, this stage fused).
template <int N, int HALVES>
__attribute__((target("avx2"))) inline void stage_values(const Epilogue &e, const VectorPostOps &ops, const int32_t *acc,
                                                        int64_t acc_stride, const __m256 *multiplier,
                                                        const __m256 *bias, __m256 *x) {
    for (int v = 0; v < N; ++v) {
        const int32_t *a = acc + (v / HALVES) * acc_stride + (v % HALVES) * 8;
        x[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(a))),
                             multiplier[v % HALVES]);
        if (e.bias) x[v] = _mm256_add_ps(x[v], bias[v % HALVES]);
        if (e.flush_tiny) x[v] = flushed(x[v]);
    }
    for (int64_t k = 0; k < ops.count; ++k) {
        if (ops.sigmoid[k]) {
            lpt_exp::sigmoid_lanes_n<N>(x);
            continue;
        }
        if (ops.silu[k]) {
            __m256 s[N];
            for (int v = 0; v < N; ++v) s[v] = x[v];
            lpt_exp::sigmoid_lanes_n<N>(s);
            for (int v = 0; v < N; ++v) x[v] = _mm256_mul_ps(x[v], s[v]);
            continue;
        }
        if (ops.hard_swish[k]) {  // slope, low: alpha, beta; h <= 0 ? 0 : h, then h >= 1 ? 1 : h, as below
            const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
            for (int v = 0; v < N; ++v) {
                __m256 h = _mm256_add_ps(_mm256_mul_ps(x[v], ops.slope[k]), ops.low[k]);
                h = _mm256_blendv_ps(h, zero, _mm256_cmp_ps(h, zero, _CMP_LE_OQ));
                h = _mm256_blendv_ps(h, one, _mm256_cmp_ps(h, one, _CMP_GE_OQ));
                x[v] = _mm256_mul_ps(x[v], h);
            }
            continue;
        }
        if (ops.gelu[k]) {
            gelu_reference_256_n<N>(x, ops.slope[k], ops.low[k], ops.high[k]);
            continue;
        }
        for (int v = 0; v < N; ++v) {
            if (ops.leaky[k])
                x[v] = _mm256_blendv_ps(x[v], _mm256_mul_ps(x[v], ops.slope[k]),
                                        _mm256_cmp_ps(x[v], _mm256_setzero_ps(), _CMP_LT_OQ));
            // x <= low ? low : x, then x >= high ? high : x: _engine.cpp's stage_row says why
            x[v] = _mm256_blendv_ps(x[v], ops.low[k], _mm256_cmp_ps(x[v], ops.low[k], _CMP_LE_OQ));
            x[v] = _mm256_blendv_ps(x[v], ops.high[k], _mm256_cmp_ps(x[v], ops.high[k], _CMP_GE_OQ));
        }
    }
}

// A layer's output stage with no post-op or one slope and clip (Relu, Clip, ReLU6, LeakyRelu and a clip
// after it: most layers), its constants in registers and a bound at ±inf (Relu's upper one), an identity
// for every x, left out: the same values as stage_values, in fewer operations. A stem of one input
// channel computes 9 products per output value, and its stage dominates: dnsmos_p808's (1→32, 3×3,
// 900×120, Relu) 3.23 → 2.64 ms on one thread.
struct OneClip {
    bool slope, low, high;  // whether there is a slope (not 1), whether each bound is finite
    __m256 slope_value, low_value, high_value;
};

__attribute__((target("avx2"))) inline OneClip one_clip(const Epilogue &e) {
    if (e.post_op_count == 0) return {false, false, false, _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const float slope = e.post_ops[1], low = e.post_ops[2], high = e.post_ops[3];
    return {slope != 1.0f, low != -INFINITY, high != INFINITY, _mm256_set1_ps(slope), _mm256_set1_ps(low),
            _mm256_set1_ps(high)};
}

__attribute__((target("avx2"))) inline bool takes_one_clip(const Epilogue &e) {
    return e.post_op_count == 0 || (e.post_op_count == 1 && e.post_ops[0] == SLOPE_CLIP);
}

// x < 0 ? x·slope : x (a LeakyRelu), as stage_values
__attribute__((target("avx2"))) inline __m256 sloped(__m256 x, __m256 slope) {
    return _mm256_blendv_ps(x, _mm256_mul_ps(x, slope), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}

__attribute__((target("avx2"))) inline __m256 clipped_value(const Epilogue &e, const OneClip &clip, const int32_t *acc,
                                                           __m256 multiplier, __m256 bias) {
    __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(acc))), multiplier);
    if (e.bias) x = _mm256_add_ps(x, bias);
    if (clip.slope) x = sloped(x, clip.slope_value);
    if (clip.low) x = _mm256_blendv_ps(x, clip.low_value, _mm256_cmp_ps(x, clip.low_value, _CMP_LE_OQ));
    if (clip.high) x = _mm256_blendv_ps(x, clip.high_value, _mm256_cmp_ps(x, clip.high_value, _CMP_GE_OQ));
    return x;
}

// min(max(v, low), high)
__attribute__((target("avx2"))) inline __m256 clamp(__m256 v, __m256 low, __m256 high) {
    return _mm256_min_ps(_mm256_max_ps(v, low), high);
}

// The quantization that ends an 8-bit output stage, its constants in registers.
struct Quantizer {
    __m256 scale, low, high, magic, magic_less_zero_point;
};

__attribute__((target("avx2"))) inline Quantizer quantizer(float scale, int zero_point, int qmin, int qmax) {
    const float magic = 12582912.0f;  // 1.5·2^23
    return {_mm256_set1_ps(scale), _mm256_set1_ps((float)(qmin - zero_point)), _mm256_set1_ps((float)(qmax - zero_point)),
            _mm256_set1_ps(magic), _mm256_set1_ps(magic - (float)zero_point)};
}

// rint(y) + zero_point, ties to even, for y clamped to [qmin − zero_point, qmax − zero_point]: the
// float32 sum y + 1.5·2^23 rounds y to an integer (|y| ≤ 2^22), and taking 1.5·2^23 − zero_point
// from it is exact, every value being an integer below 2^24.
__attribute__((target("avx2"))) inline __m256i level(__m256 y, const Quantizer &q) {
    return _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(clamp(y, q.low, q.high), q.magic), q.magic_less_zero_point));
}

// The first n < 16 bytes of v at o, by stores of 8, 4, 2 and 1 bytes. A partial block (a layer of 12 or 24
// channels) went through memcpy of a variable size: a call per position, with the vector registers saved
// around it. PaddleOCR's detector's 2×2 24→12 layer over 320×320 on one thread (a Zen 3, two processes
// each, alternating): 6.0-6.5 ms so, 5.4-5.5 by these stores; its 12→24 layer 5.6-5.8 → 5.1-5.2.
__attribute__((target("avx2"))) inline void store_first_bytes(__m128i v, int64_t n, void *o) {
    auto *p = static_cast<char *>(o);
    if (n & 8) {
        _mm_storel_epi64(reinterpret_cast<__m128i *>(p), v);
        v = _mm_srli_si128(v, 8), p += 8;
    }
    uint64_t rest = (uint64_t)_mm_cvtsi128_si64(v);
    if (n & 4) std::memcpy(p, &rest, 4), rest >>= 32, p += 4;
    if (n & 2) std::memcpy(p, &rest, 2), rest >>= 16, p += 2;
    if (n & 1) *p = (char)rest;
}

// The first n < 16 floats of x0 then x1 at o, as store_first_bytes.
__attribute__((target("avx2"))) inline void store_first_floats(__m256 x0, __m256 x1, int64_t n, float *o) {
    if (n & 8) _mm256_storeu_ps(o, x0), x0 = x1, o += 8;
    __m128 v = _mm256_castps256_ps128(x0);
    if (n & 4) _mm_storeu_ps(o, v), v = _mm256_extractf128_ps(x0, 1), o += 4;
    if (n & 2) _mm_storel_pi(reinterpret_cast<__m64 *>(o), v), v = _mm_movehl_ps(v, v), o += 2;
    if (n & 1) _mm_store_ss(o, v);
}

// Sixteen levels within [qmin, qmax] (level0 the first eight) into `valid` T at o.
template <typename T>
__attribute__((target("avx2"))) inline void store_levels(__m256i level0, __m256i level1, int64_t valid, T *o) {
    // 16 levels to 16 bytes: the packs saturate nothing
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(level0, level1), 0xD8);
    const __m128i low_words = _mm256_castsi256_si128(words), high_words = _mm256_extracti128_si256(words, 1);
    const __m128i bytes = std::is_same_v<T, uint8_t> ? _mm_packus_epi16(low_words, high_words)
                                                     : _mm_packs_epi16(low_words, high_words);
    if (valid == LANES)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(o), bytes);
    else
        store_first_bytes(bytes, valid, o);
}

// Sixteen values (x0 the first eight) as saturate(rint(x / scale) + zero_point) into `valid` T at o.
template <typename T>
__attribute__((target("avx2"))) inline void store_quantized(__m256 x0, __m256 x1, const Quantizer &q, int64_t valid,
                                                            T *o) {
    // y = x / scale, clamped (max(NaN, low) is low, as y >= low ? y : low), rounded half to even
    store_levels(level(_mm256_div_ps(x0, q.scale), q), level(_mm256_div_ps(x1, q.scale), q), valid, o);
}

// The 8-bit output stage of a layer with no post-op or one slope and clip (OneClip; SLOPE: a LeakyRelu's)
// on the first eight channels (HALVES 1) or all sixteen, in a loop with every constant in a register and
// nothing tested per position (a 3→24 stem and a 1→32 one: 3-5% faster on one thread). Two rewrites
// of stage_values' operations that change no level: the bias is added even when there is none (x + 0
// is x, but for −0, which quantizes as +0), and the clip is max(low, x) then min(high, x), an absent
// bound being ∓inf: each returns x when x is NaN, as the comparisons do, and differs from them only in
// the sign of a zero. Tiny values are not flushed (Epilogue::flush_tiny allows it, against the assists an Intel
// core takes per operation on a subnormal): three operations a vector fewer (dnsmos_p808's 1→32 stem over
// 900×120, two threads, alternating: 2.55-2.79 → 2.21-2.42 ms on a Zen 3, where PaddleOCR's detector, whose dead
// channels have biases of 1e-41, took no longer: 119-139 ms against 122-139, on a busy host).
template <typename T, int HALVES, bool SLOPE>
__attribute__((target("avx2"))) void clipped_stage(const Epilogue &e, const int32_t *acc, int64_t acc_stride,
                                                   int64_t count, int64_t c0, int64_t valid, T *out,
                                                   int64_t out_stride) {
    const Quantizer quantize = quantizer(e.scale, e.zero_point, e.qmin, e.qmax);
    const bool clip = e.post_op_count == 1;
    const __m256 low = _mm256_set1_ps(clip ? e.post_ops[2] : -INFINITY), high = _mm256_set1_ps(clip ? e.post_ops[3] : INFINITY);
    const __m256 slope = _mm256_set1_ps(clip ? e.post_ops[1] : 1.0f);
    __m256 multiplier[2], bias[2], x[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int k = 0; k < HALVES; ++k) {
        multiplier[k] = _mm256_loadu_ps(e.multiplier + c0 + 8 * k);
        bias[k] = e.bias ? _mm256_loadu_ps(e.bias + c0 + 8 * k) : _mm256_setzero_ps();
    }
    for (int64_t j = 0; j < count; ++j) {
        for (int k = 0; k < HALVES; ++k) {
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(acc + j * acc_stride + 8 * k));
            x[k] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a), multiplier[k]), bias[k]);
            if constexpr (SLOPE) x[k] = sloped(x[k], slope);
            x[k] = _mm256_min_ps(high, _mm256_max_ps(low, x[k]));
        }
        store_quantized(x[0], x[1], quantize, valid, out + j * out_stride);
    }
}

// clipped_stage without a slope, from Epilogue::Levels: per vector of eight values a conversion, one fused
// product, a clamp and the nearest integer (and with PER_LANE, the bound for the value's accumulator), where
// clipped_stage takes a product, a sum, the clip, a division (vdivps: one per 3.5-5 cycles on a Zen 3) and the
// clamp; a position with a lane next to a half takes clipped_stage's operations.
template <typename T, int HALVES, bool PER_LANE>
__attribute__((target("avx2,fma"))) void clipped_levels(const Epilogue &e, const int32_t *acc, int64_t acc_stride,
                                                        int64_t count, int64_t c0, int64_t valid, T *out,
                                                        int64_t out_stride) {
    const Epilogue::Levels &l = e.levels;
    const __m256 low = _mm256_set1_ps(l.low), high = _mm256_set1_ps(l.high), near_half = _mm256_set1_ps(l.near_half);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 multiplier[2], bias[2], lane_bound[2];
    for (int k = 0; k < HALVES; ++k) {
        multiplier[k] = _mm256_loadu_ps(l.multiplier + c0 + 8 * k);
        bias[k] = _mm256_loadu_ps(l.bias + c0 + 8 * k);
        if constexpr (PER_LANE) lane_bound[k] = _mm256_loadu_ps(l.lane_bound + c0 + 8 * k);
    }
    for (int64_t j = 0; j < count; ++j) {
        __m256i level[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        __m256 near = _mm256_setzero_ps();
        for (int k = 0; k < HALVES; ++k) {
            const int32_t *values = acc + j * acc_stride + 8 * k;
            const __m256 a = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(values)));
            const __m256 y = _mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(a, multiplier[k], bias[k]), low), high);
            const __m256 n = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m256 off = _mm256_andnot_ps(sign, _mm256_sub_ps(y, n));
            if constexpr (PER_LANE) off = _mm256_fmadd_ps(_mm256_andnot_ps(sign, a), lane_bound[k], off);
            near = _mm256_or_ps(near, _mm256_cmp_ps(off, near_half, _CMP_NLT_UQ));
            level[k] = _mm256_cvtps_epi32(n);  // an integer in [qmin, qmax]: exact
        }
        if (_mm256_movemask_ps(near))
            clipped_stage<T, HALVES, false>(e, acc + j * acc_stride, acc_stride, 1, c0, valid, out + j * out_stride,
                                            out_stride);
        else
            store_levels(level[0], level[1], valid, out + j * out_stride);
    }
}

// What the GELU stage keeps in registers across positions: its channels' multipliers and biases, the
// post-op's constants and the quantization's; with `fast`, the approximation's and its bound's too.
struct GeluStage512 {
    __m512 multiplier, bias, scale, level_high;
    __m512i level_low, zero_point;
    GeluReference512 reference;
    __mmask16 lanes;
    bool biased, flush_tiny, fast;
    GeluFast512 approximation;
    Quantizer512 quantize;  // its near_half the approximation's, for every lane
};

// x = f32(acc)·multiplier + bias of N positions (stage_values' operations), +0 where |x| < TINY if asked and
// `flush`.
template <int N, bool flush = true>
__attribute__((target("avx512f"), always_inline)) inline void gelu_arguments_512(const GeluStage512 &g, const int32_t *acc,
                                                                                 int64_t acc_stride, __m512 *x) {
    for (int v = 0; v < N; ++v) {
        const __m512i values = load_16(acc + v * acc_stride, g.lanes);
        x[v] = _mm512_mul_ps(_mm512_cvtepi32_ps(values), g.multiplier);
        if (g.biased) x[v] = _mm512_add_ps(x[v], g.bias);
        if (flush && g.flush_tiny)  // flushed(): +0 where |x| < TINY
            x[v] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(x[v]), _mm512_set1_ps(TINY), _CMP_NLT_UQ), x[v]);
    }
}

template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void store_levels_512(const GeluStage512 &g,
                                                                                                __m512i level, T *out) {
    const __m128i bytes = std::is_same_v<T, uint8_t> ? _mm512_cvtusepi32_epi8(level) : _mm512_cvtsepi32_epi8(level);
    store_bytes_16(out, g.lanes, bytes);
}

// N positions of the GELU stage: the operations of stage_values, gelu_reference_512_n and store_quantized in
// the same order, so each lane the same bits, the N positions' steps interleaved. N is a constant so that
// the N vectors of each step stay in registers: with N known only at run time (two positions, or one at
// the end) gcc kept them in arrays on the stack, each step stored and loaded again. The clamps and the
// rounding that need no float32 arithmetic are integer operations, which take the port the float32 ones
// leave. On a Xeon with AMX, one thread, 384 channels × 120 positions (three runs alternating): 0.71-0.72
// ns per value before, 0.63-0.65 so (four positions at a time: two gave 0.69-0.73, three 0.64).
template <typename T, int N>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void gelu_positions_512(
        const GeluStage512 &g, const int32_t *acc, int64_t acc_stride, T *out, int64_t out_stride) {
    __m512 x[N];
    gelu_arguments_512<N>(g, acc, acc_stride, x);
    gelu_reference_512_n<N>(x, g.reference);
    for (int v = 0; v < N; ++v) {
        // store_quantized: x / scale clamped, rounded half to even, + zero point. The division, not levels_512's
        // product and checks: the port-bound polynomial leaves the divider idle (a 1×1 96 → 192 over 12×80, 2
        // threads, alternating: 109-116 µs so, 117-120 with the checks). min(high, y) keeps a NaN y, which
        // converts to −2^31 as does y below −2^31: the integer max then gives the low level, as
        // store_quantized's max(NaN, low) does; the clamp commutes with rounding, its bounds being integers.
        const __m512 q = _mm512_min_ps(g.level_high, _mm512_div_ps(x[v], g.scale));
        const __m512i rounded = _mm512_cvt_roundps_epi32(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        store_levels_512<T>(g, _mm512_add_epi32(_mm512_max_epi32(rounded, g.level_low), g.zero_point), out + v * out_stride);
    }
}

// One position by the reference, out of line: inlined into gelu_fast_positions_512's loop, its constants and
// registers crowded the approximation's.
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"), noinline)) void gelu_position_512(const GeluStage512 &g, const int32_t *acc,
                                                                                     int64_t acc_stride, T *out, int64_t out_stride) {
    gelu_positions_512<T, 1>(g, acc, acc_stride, out, out_stride);
}

// N positions from the approximation (gelu_fast_512_n), each vector with a lane next to a half of a level
// again by gelu_positions_512. y' = RN(fast·r) (r = RN(1/scale)) lies within (GELU_FAST_ABS +
// GELU_FAST_PER_U·u)·r (the checked bound, widened for the roundings) + 3.02·2^-24·bound (levels_512's three
// roundings) of the reference's x / scale, so where |y' − rint(y')| plus the first term is below levels_512's
// near_half, both round to the same level (clamped or not: the clamp's bounds are integers). A 1×1
// 48 → 96 stage over 160×160 values near PaddleOCR's (scale 0.02): about one block of four in 80 takes the
// reference again; 384 channels × 480 positions on one thread, 0.70 ns per value by the reference, 0.43 so.
// Values below TINY are not flushed to 0 here: the bound holds for them too (gelu_fast_worst_ratio checks every
// float32 below GELU_FAST_CHECKED_BELOW), so the approximation's level is the reference's at x, which is its
// level at 0 (Epilogue::flush_tiny), and a lane next to a half goes to gelu_position_512, which flushes. vreduceps
// gives level − rint(level) in one operation, vcvtps2dq the rounding. A 1×1 48 → 96 layer with PaddleOCR's GELU
// over 160×160 (Zen 4, 2 threads, three runs each): 0.59-0.60 → 0.55-0.57 ms. One margin serves every lane
// (near_half less the bound's term at u's largest, GELU_FAST_LAST) instead of each lane's u: a product and sum
// fewer per vector, a few more vectors next to a half; such a layer in a program on random values (Zen 4, one
// thread, five runs) 1.10 → 1.00-1.05 ms; the detector's own 1.32 → 1.32-1.38 in eight runs (no change seen).
template <typename T, int N>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) inline void gelu_fast_positions_512(
        const GeluStage512 &g, const int32_t *acc, int64_t acc_stride, T *out, int64_t out_stride) {
    constexpr int NEAREST = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m512 x[N], y[N], u[N], level[N];
    __mmask16 near[N], any = 0;
    gelu_arguments_512<N, false>(g, acc, acc_stride, x);
    gelu_fast_512_n<N>(x, g.approximation, y, u);
    for (int v = 0; v < N; ++v) {
        const Quantizer512 &q = g.quantize;
        level[v] = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(y[v], q.reciprocal), q.low), q.high);
        const __m512 off = _mm512_abs_ps(_mm512_reduce_ps(level[v], NEAREST));
        near[v] = _mm512_cmp_ps_mask(off, q.near_half, _CMP_NLT_UQ);  // a NaN too
        any |= near[v];
    }
    for (int v = 0; v < N; ++v) {
        if (any && near[v])
            gelu_position_512<T>(g, acc + v * acc_stride, acc_stride, out + v * out_stride, out_stride);
        else
            store_levels_512<T>(g, _mm512_add_epi32(_mm512_cvt_roundps_epi32(level[v], NEAREST), g.zero_point),
                                out + v * out_stride);
    }
}

// The 8-bit output stage of a layer whose one post-op is a GELU, sixteen channels per register and four
// positions at a time. Lanes past `valid` are neither read nor written.
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void gelu_stage_512(const Epilogue &e, const int32_t *acc,
                                                                          int64_t acc_stride, int64_t count, int64_t c0,
                                                                          int64_t valid, T *out, int64_t out_stride) {
    GeluStage512 g;
    g.lanes = valid >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << valid) - 1);
    g.multiplier = _mm512_maskz_loadu_ps(g.lanes, e.multiplier + c0);
    g.biased = e.bias != nullptr, g.flush_tiny = e.flush_tiny;
    g.bias = g.biased ? _mm512_maskz_loadu_ps(g.lanes, e.bias + c0) : _mm512_setzero_ps();
    g.reference = gelu_reference_512(e.post_ops[1], e.post_ops[2], e.post_ops[3]);
    g.scale = _mm512_set1_ps(e.scale), g.level_high = _mm512_set1_ps((float)(e.qmax - e.zero_point));
    g.level_low = _mm512_set1_epi32(e.qmin - e.zero_point), g.zero_point = _mm512_set1_epi32(e.zero_point);
    // gelu_near_half less the bound's term per unit of u at u's largest, rounded down
    const float near_half = std::nextafter(
            (float)((double)e.gelu_near_half - (double)GELU_FAST_LAST * (double)e.gelu_per_u), 0.0f);
    g.fast = e.gelu_near_half > 0.0f && near_half > 0.0f;
    int64_t j = 0;
    if (g.fast) {
        g.approximation = gelu_fast_512();
        g.quantize = quantizer_512(e.scale, e.zero_point, e.qmin, e.qmax);
        g.quantize.near_half = _mm512_set1_ps(near_half);
        for (; j + 4 <= count; j += 4)
            gelu_fast_positions_512<T, 4>(g, acc + j * acc_stride, acc_stride, out + j * out_stride, out_stride);
    }
    for (; j + 4 <= count; j += 4) gelu_positions_512<T, 4>(g, acc + j * acc_stride, acc_stride, out + j * out_stride, out_stride);
    for (; j < count; ++j) gelu_positions_512<T, 1>(g, acc + j * acc_stride, acc_stride, out + j * out_stride, out_stride);
}

// The same stage with eight lanes (AVX2 and FMA): HALVES of a tile's sixteen channels (both, or the first where
// at most eight are valid), two positions at a time from the approximation (gelu_fast_256_n), the levels as
// gelu_fast_positions_512 finds them (y' = RN(fast·r), the same argument with GELU_FAST8_ABS and _PER_U in
// prepare_gelu_fast's margins); where a lane of the two positions lies next to a half, both positions again by
// stage_values and store_quantized, the reference's operations, as is a last odd position. A 1×1 48 → 96
// convolution with PaddleOCR's GELU over 160×160 (a Zen 3, 2 threads, alternating): 3.89 ms by the reference's
// operations, 3.01 so, 2.18 without the GELU.
template <typename T, int HALVES>
__attribute__((target("avx2,fma"))) void gelu_stage_256(const Epilogue &e, const int32_t *acc, int64_t acc_stride,
                                                        int64_t count, int64_t c0, int64_t valid, T *out,
                                                        int64_t out_stride) {
    constexpr int N = 2 * HALVES;  // vectors of two positions
    const VectorPostOps ops = vector_post_ops(e);
    const Quantizer quantize = quantizer(e.scale, e.zero_point, e.qmin, e.qmax);
    const GeluFast256 g = gelu_fast_256();
    const Reciprocal r = reciprocal(e.scale, e.zero_point, e.qmin, e.qmax);
    const __m256 reciprocal_value = _mm256_set1_ps(r.value), near_half = _mm256_set1_ps(e.gelu_near_half);
    const __m256 per_u = _mm256_set1_ps(e.gelu_per_u), sign = _mm256_set1_ps(-0.0f);
    const __m256 zero_point = _mm256_set1_ps((float)e.zero_point);
    const __m256 multiplier[2] = {_mm256_loadu_ps(e.multiplier + c0), _mm256_loadu_ps(e.multiplier + c0 + 8)};
    const __m256 bias[2] = {e.bias ? _mm256_loadu_ps(e.bias + c0) : _mm256_setzero_ps(),
                            e.bias ? _mm256_loadu_ps(e.bias + c0 + 8) : _mm256_setzero_ps()};
    int64_t j = 0;
    for (; j + 2 <= count; j += 2) {
        const int32_t *a = acc + j * acc_stride;
        T *o = out + j * out_stride;
        __m256 x[N], y[N], u[N], n[N];
        for (int v = 0; v < N; ++v) {  // stage_values' arguments
            const int32_t *values = a + (v / HALVES) * acc_stride + (v % HALVES) * 8;
            x[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(values))),
                                 multiplier[v % HALVES]);
            if (e.bias) x[v] = _mm256_add_ps(x[v], bias[v % HALVES]);
            if (e.flush_tiny) x[v] = flushed(x[v]);
        }
        gelu_fast_256_n<N>(x, g, y, u);
        int near = 0;
        for (int v = 0; v < N; ++v) {
            const __m256 level = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(y[v], reciprocal_value), quantize.low), quantize.high);
            n[v] = _mm256_round_ps(level, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256 off = _mm256_fmadd_ps(u[v], per_u, _mm256_andnot_ps(sign, _mm256_sub_ps(level, n[v])));
            near |= _mm256_movemask_ps(_mm256_cmp_ps(off, near_half, _CMP_NLT_UQ));  // a NaN too
        }
        if (near) {
            __m256 exact[N];  // the two positions' HALVES vectors each
            stage_values<N, HALVES>(e, ops, a, acc_stride, multiplier, bias, exact);
            for (int p = 0; p < 2; ++p)
                store_quantized(exact[p * HALVES], HALVES == 2 ? exact[2 * p + 1] : _mm256_setzero_ps(), quantize, valid,
                                o + p * out_stride);
            continue;
        }
        for (int p = 0; p < 2; ++p) {
            const __m256i first = _mm256_cvtps_epi32(_mm256_add_ps(n[p * HALVES], zero_point));
            __m256i second = _mm256_setzero_si256();
            if constexpr (HALVES == 2) second = _mm256_cvtps_epi32(_mm256_add_ps(n[2 * p + 1], zero_point));
            store_levels(first, second, valid, o + p * out_stride);
        }
    }
    for (; j < count; ++j) {
        __m256 last[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        stage_values<HALVES, HALVES>(e, ops, acc + j * acc_stride, acc_stride, multiplier, bias, last);
        store_quantized(last[0], last[1], quantize, valid, out + j * out_stride);
    }
}

// The largest of `lanes` ratios and its lane's x (0 and 0 where none is above 0).
inline void largest_of_lanes(const float *ratios, const float *xs, int lanes, float &worst, float &at) {
    worst = 0.0f, at = 0.0f;
    for (int i = 0; i < lanes; ++i)
        if (ratios[i] > worst) worst = ratios[i], at = xs[i];
}

// gelu_fast_worst_ratio over [first, end): the largest ratio (a NaN's infinite) and its x.
__attribute__((target("avx512f,avx512dq"))) void gelu_fast_worst_in(int64_t first, int64_t end, float &worst,
                                                                     float &at) {
    const GeluReference512 reference = gelu_reference_512(GELU_FAST_DIVISOR, GELU_FAST_ONE, GELU_FAST_HALF);
    const GeluFast512 fast = gelu_fast_512();
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 most = _mm512_setzero_ps(), where = _mm512_setzero_ps();
    for (int64_t bits = first; bits < end; bits += 16) {
        const __m512 x = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_set1_epi32((int32_t)(uint32_t)bits), lanes));
        __m512 y, u, r = x;
        gelu_fast_512_n<1>(&x, fast, &y, &u);
        gelu_reference_512_n<1>(&r, reference);
        const __m512 allowed = _mm512_fmadd_ps(u, _mm512_set1_ps(GELU_FAST_PER_U), _mm512_set1_ps(GELU_FAST_ABS));
        __m512 ratio = _mm512_div_ps(_mm512_abs_ps(_mm512_sub_ps(y, r)), allowed);
        ratio = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ratio, ratio, _CMP_ORD_Q), _mm512_set1_ps(INFINITY), ratio);
        const __mmask16 larger = _mm512_cmp_ps_mask(ratio, most, _CMP_GT_OQ);
        most = _mm512_mask_mov_ps(most, larger, ratio);
        where = _mm512_mask_mov_ps(where, larger, x);
    }
    alignas(64) float m[16], w[16];
    _mm512_store_ps(m, most), _mm512_store_ps(w, where);
    largest_of_lanes(m, w, 16, worst, at);
}

// The same with eight lanes (gelu256.h).
__attribute__((target("avx2,fma"))) void gelu_fast_worst_in_256(int64_t first, int64_t end, float &worst, float &at) {
    const GeluFast256 fast = gelu_fast_256();
    const __m256 divisor = _mm256_set1_ps(GELU_FAST_DIVISOR), one = _mm256_set1_ps(GELU_FAST_ONE);
    const __m256 half = _mm256_set1_ps(GELU_FAST_HALF), sign = _mm256_set1_ps(-0.0f);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 most = _mm256_setzero_ps(), where = _mm256_setzero_ps();
    for (int64_t bits = first; bits < end; bits += 8) {
        const __m256 x = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_set1_epi32((int32_t)(uint32_t)bits), lanes));
        __m256 y, u, r = x;
        gelu_fast_256_n<1>(&x, fast, &y, &u);
        gelu_reference_256_n<1>(&r, divisor, one, half);
        const __m256 allowed = _mm256_fmadd_ps(u, _mm256_set1_ps(GELU_FAST8_PER_U), _mm256_set1_ps(GELU_FAST8_ABS));
        __m256 ratio = _mm256_div_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(y, r)), allowed);
        ratio = _mm256_blendv_ps(_mm256_set1_ps(INFINITY), ratio, _mm256_cmp_ps(ratio, ratio, _CMP_ORD_Q));
        const __m256 larger = _mm256_cmp_ps(ratio, most, _CMP_GT_OQ);
        most = _mm256_blendv_ps(most, ratio, larger);
        where = _mm256_blendv_ps(where, x, larger);
    }
    alignas(32) float m[8], w[8];
    _mm256_store_ps(m, most), _mm256_store_ps(w, where);
    largest_of_lanes(m, w, 8, worst, at);
}

// Epilogue on one tile's accumulators acc [count][LANES]: the output stage of channels c0 … c0 + valid
// into out (one row of out_stride values per position). The same operations in the same order as
// _engine.cpp's stage_row, eight channels at a time; the comparisons are ordered so that a NaN
// goes where the scalar form sends it. What does not change from one position to the next (the
// channels' multipliers and biases, the post-ops' constants) is set once.
// The output stage of a layer with no post-op and an addend (Epilogue::addend): x = f32(acc)·multiplier + bias,
// then x + addend (addend + x), stored as float32 or quantized: the operations of the layer's float32 stage and
// of the Add after it, in their order, without the layer's float32 output in between. `addend` lies as out.
template <typename T>
__attribute__((target("avx2"))) void added_stage(const Epilogue &e, const int32_t *acc, int64_t acc_stride,
                                                 int64_t count, int64_t c0, int64_t valid, const float *addend, T *out,
                                                 int64_t out_stride) {
    const Quantizer quantize = quantizer(e.scale, e.zero_point, e.qmin, e.qmax);
    const __m256 multiplier[2] = {_mm256_loadu_ps(e.multiplier + c0), _mm256_loadu_ps(e.multiplier + c0 + 8)};
    const __m256 bias[2] = {e.bias ? _mm256_loadu_ps(e.bias + c0) : _mm256_setzero_ps(),
                            e.bias ? _mm256_loadu_ps(e.bias + c0 + 8) : _mm256_setzero_ps()};
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);  // a partial block's addends: only its valid ones are read
    const __m256i read[2] = {_mm256_cmpgt_epi32(_mm256_set1_epi32((int)valid), lane),
                             _mm256_cmpgt_epi32(_mm256_set1_epi32((int)valid - 8), lane)};
    for (int64_t j = 0; j < count; ++j) {
        const float *other = addend + j * out_stride;
        __m256 x[2];
        for (int k = 0; k < 2; ++k) {
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(acc + j * acc_stride + 8 * k));
            x[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(a), multiplier[k]);
            if (e.bias) x[k] = _mm256_add_ps(x[k], bias[k]);
            const __m256 y = valid == LANES ? _mm256_loadu_ps(other + 8 * k) : _mm256_maskload_ps(other + 8 * k, read[k]);
            x[k] = e.addend_first ? _mm256_add_ps(y, x[k]) : _mm256_add_ps(x[k], y);
        }
        T *o = out + j * out_stride;
        if constexpr (std::is_same_v<T, float>) {
            if (valid == LANES)
                _mm256_storeu_ps(o, x[0]), _mm256_storeu_ps(o + 8, x[1]);
            else
                store_first_floats(x[0], x[1], valid, o);
        } else {
            store_quantized(x[0], x[1], quantize, valid, o);
        }
    }
}

template <typename T>
__attribute__((target("avx2"))) void stage(const Epilogue &e, const int32_t *acc, int64_t acc_stride, int64_t count,
                                           int64_t c0, int64_t valid, T *out, int64_t out_stride,
                                           const float *addend = nullptr) {
    if (addend) {
        added_stage(e, acc, acc_stride, count, c0, valid, addend, out, out_stride);
        return;
    }
    if constexpr (!std::is_same_v<T, float>) {
        if (takes_one_clip(e)) {
            const bool slope = e.post_op_count == 1 && e.post_ops[1] != 1.0f;
            if (!slope && levels_apply(e)) {
                const auto levels = e.levels.lane_bound
                                        ? (valid <= 8 ? clipped_levels<T, 1, true> : clipped_levels<T, 2, true>)
                                        : (valid <= 8 ? clipped_levels<T, 1, false> : clipped_levels<T, 2, false>);
                levels(e, acc, acc_stride, count, c0, valid, out, out_stride);
                return;
            }
            const auto clipped = slope ? (valid <= 8 ? clipped_stage<T, 1, true> : clipped_stage<T, 2, true>)
                                       : (valid <= 8 ? clipped_stage<T, 1, false> : clipped_stage<T, 2, false>);
            clipped(e, acc, acc_stride, count, c0, valid, out, out_stride);
            return;
        }
        if (e.post_op_count == 1 && e.post_ops[0] == GELU && sixteen_lanes()) {
            gelu_stage_512<T>(e, acc, acc_stride, count, c0, valid, out, out_stride);
            return;
        }
        if (e.post_op_count == 1 && e.post_ops[0] == GELU && e.gelu_near_half > 0.0f) {  // eight lanes, FMA
            (valid <= 8 ? gelu_stage_256<T, 1> : gelu_stage_256<T, 2>)(e, acc, acc_stride, count, c0, valid, out, out_stride);
            return;
        }
    }
    const Quantizer quantize = quantizer(e.scale, e.zero_point, e.qmin, e.qmax);
    const VectorPostOps ops = vector_post_ops(e);
    const __m256 multiplier[2] = {_mm256_loadu_ps(e.multiplier + c0), _mm256_loadu_ps(e.multiplier + c0 + 8)};
    const __m256 bias[2] = {e.bias ? _mm256_loadu_ps(e.bias + c0) : _mm256_setzero_ps(),
                            e.bias ? _mm256_loadu_ps(e.bias + c0 + 8) : _mm256_setzero_ps()};
    // Eight channels or fewer (a block's last, a head's one to eight): their half alone. A head of four
    // values per position with a Sigmoid (PaddleOCR's detector) otherwise computed four times its lanes.
    const bool one_half = valid <= 8, simple = takes_one_clip(e);
    const OneClip clip = one_clip(e);
    __m256 two_positions[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t j = 0; j < count; ++j) {
        __m256 x0, x1 = _mm256_setzero_ps();
        if (simple) {
            x0 = clipped_value(e, clip, acc + j * acc_stride, multiplier[0], bias[0]);
            if (!one_half) x1 = clipped_value(e, clip, acc + j * acc_stride + 8, multiplier[1], bias[1]);
        } else if (j % 2 == 0 && j + 1 < count) {  // this position's values and the next one's
            if (one_half) {
                __m256 firsts[2];
                stage_values<2, 1>(e, ops, acc + j * acc_stride, acc_stride, multiplier, bias, firsts);
                two_positions[0] = firsts[0], two_positions[2] = firsts[1];
            } else {
                stage_values<4, 2>(e, ops, acc + j * acc_stride, acc_stride, multiplier, bias, two_positions);
            }
            x0 = two_positions[0], x1 = two_positions[1];
        } else if (j % 2) {
            x0 = two_positions[2], x1 = two_positions[3];
        } else {
            __m256 last[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            if (one_half)
                stage_values<1, 1>(e, ops, acc + j * acc_stride, acc_stride, multiplier, bias, last);
            else
                stage_values<2, 2>(e, ops, acc + j * acc_stride, acc_stride, multiplier, bias, last);
            x0 = last[0], x1 = last[1];
        }
        T *o = out + j * out_stride;
        if constexpr (std::is_same_v<T, float>) {
            if (valid == LANES) {
                _mm256_storeu_ps(o, x0);
                _mm256_storeu_ps(o + 8, x1);
            } else {
                store_first_floats(x0, x1, valid, o);
            }
        } else {
            store_quantized(x0, x1, quantize, valid, o);
        }
    }
}

}  // namespace

bool supported() { return __builtin_cpu_supports("avx2"); }

void prepare_gelu_fast(Epilogue &e, int64_t channels) {
    e.gelu_per_u = 0.0f, e.gelu_near_half = -1.0f;
    if (e.type == Epilogue::f32 || e.post_op_count != 1 || e.post_ops[0] != GELU ||
        !gelu_fast_applies(e.post_ops[1], e.post_ops[2], e.post_ops[3]))
        return;
    // The bound is checked for |x| < 2^126, and every channel's x stays there (|acc| ≤ 2^31); an infinite
    // or NaN x, which the reference sends to a level of its own, never enters the approximation.
    for (int64_t c = 0; c < channels; ++c)
        if (!(std::fabs((double)e.multiplier[c]) * 0x1p31 + (e.bias ? std::fabs((double)e.bias[c]) : 0.0) <
              GELU_FAST_CHECKED_BELOW))
            return;
    // The approximation this CPU's stage takes: sixteen lanes (gelu512.h), or eight with FMA (gelu256.h).
    const bool sixteen = sixteen_lanes();
    if (!sixteen && !fused_multiply_add()) return;
    const double fast_abs = sixteen ? GELU_FAST_ABS : GELU_FAST8_ABS, fast_per_u = sixteen ? GELU_FAST_PER_U : GELU_FAST8_PER_U;
    // levels_512's near_half less the approximation's constant term, and its term per unit of u, both widened
    // for their roundings
    const Reciprocal r = reciprocal(e.scale, e.zero_point, e.qmin, e.qmax);
    const double per_r = (double)r.value * (1.0 + 0x1p-19);
    const float near_half = std::nextafter((float)((double)r.near_half - fast_abs * per_r - 0x1p-22), -INFINITY);
    if (!(r.near_half > 0.0f && near_half > 0.0f)) return;
    e.gelu_per_u = std::nextafter((float)(fast_per_u * per_r), INFINITY);
    e.gelu_near_half = near_half;
}

// Why the levels are the reference's: with u = 2^-24, x = RN(RN(a·m) + b) and y = RN(x / s) (the
// reference: s the scale, a the accumulator as float32), m' = RN(m / s) and b' = RN(b / s + zp) (from
// double), Y = RN(a·m' + b') (one fused rounding), each rounding a factor (1 + e), |e| ≤ u:
//   |y + zp − Y| ≤ 5.01u·|a·m / s| + 4.01u·|b / s| + 2.01u·|zp|  (the products of the factors written out),
// below δ = 6u·|a|·|m'| + δ0, δ0 = 6u·(|b / s| + |zp|) + 2^-60 (a subnormal's absolute error, s ≥ 2^-40).
// The reference's level is clamp(rint(y + zp), L, H) for y clamped as it clamps it, and a clip [lo, hi]
// before the division moves only the bounds: the level is a non-decreasing function g of x, so g(clip(x)) =
// clamp(g(x), g(lo), g(hi)), L = g(lo) and H = g(hi) (qmin and qmax where there is no bound). Clamping
// moves no value further than δ, so where Y clamped to [L, H] lies at less than 1/2 − δ from its nearest
// integer n, y + zp clamped lies strictly within n ± 1/2 and the level is n. Where δ with |a| at its largest
// is at most 2^-10 (a stem of few products) one margin serves every value; otherwise each value's own
// (lane_bound = 6u·|m'| rounded up, near_half 1/2 − δ0 less a float32 sum's rounding), two operations more.
void prepare_clipped_levels(Epilogue &e, const double *largest, int64_t channels, std::vector<float> &constants) {
    e.levels = {};
    const bool clip = e.post_op_count == 1 && e.post_ops[0] == SLOPE_CLIP && e.post_ops[1] == 1.0f;
    if (e.type == Epilogue::f32 || !(e.post_op_count == 0 || clip) || !fused_multiply_add()) return;
    if (!(e.scale >= 0x1p-40f && e.scale <= 0x1p40f)) return;
    const float low = clip ? e.post_ops[2] : -INFINITY, high = clip ? e.post_ops[3] : INFINITY;
    if (!(low <= high)) return;
    const auto level = [&](float x) {  // the reference's level of x (store_quantized)
        const float y = std::min(std::max(x / e.scale, (float)(e.qmin - e.zero_point)), (float)(e.qmax - e.zero_point));
        return std::nearbyint(y) + (float)e.zero_point;
    };
    const int64_t padded = (channels + LANES - 1) / LANES * LANES;
    constants.assign(3 * padded, 0.0f);
    float *multiplier = constants.data(), *bias = multiplier + padded, *lane_bound = bias + padded;
    double common = 0.0, worst = 0.0;  // δ0, and δ with each channel's largest |a|
    for (int64_t c = 0; c < channels; ++c) {
        const double b = e.bias ? (double)e.bias[c] / e.scale : 0.0;
        multiplier[c] = (float)((double)e.multiplier[c] / e.scale);
        bias[c] = (float)(b + e.zero_point);
        if (!(std::isfinite(multiplier[c]) && std::isfinite(bias[c]) && std::isfinite(largest[c]))) return;
        lane_bound[c] = std::nextafter((float)(0x1p-24 * 6.0 * std::fabs((double)multiplier[c])), INFINITY);
        common = std::max(common, 0x1p-24 * 6.0 * (std::fabs(b) + std::abs(e.zero_point)));
        worst = std::max(worst, 0x1p-24 * 6.0 * (largest[c] * std::fabs((double)multiplier[c]) + std::fabs(b) +
                                                 std::abs(e.zero_point)));
    }
    common += 0x1p-60, worst += 0x1p-60;
    const bool per_lane = !(worst <= 0x1p-10);
    if (per_lane && !(common <= 0x1p-10)) return;
    const double margin = per_lane ? (0.5 - common) * (1.0 - 0x1p-22) : 0.5 - worst;
    e.levels = {multiplier, bias, per_lane ? lane_bound : nullptr, level(low), level(high),
                std::nextafter((float)margin, 0.0f), e.scale, e.zero_point, e.qmin, e.qmax};
}

bool fused_multiply_add() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

bool sixteen_lanes() {
    static const bool on = [] {
        const char *forced = std::getenv("LPT_AVX512");
        return !(forced && std::strcmp(forced, "off") == 0) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    }();
    return on;
}

double gelu_fast_worst_ratio(uint32_t first, uint32_t last, int threads, float *worst_x) {
    constexpr int64_t BLOCK = 1 << 20;
    const int64_t blocks = ((int64_t)last - first + BLOCK - 1) / BLOCK;
    std::vector<float> worst(blocks, 0.0f), at(blocks, 0.0f);
    const bool sixteen = sixteen_lanes();
    lpt_parallel::run(threads, blocks, 1, [&](lpt_parallel::Chunks &chunks) {
        for (int64_t b; chunks.next(b);)
            (sixteen ? gelu_fast_worst_in : gelu_fast_worst_in_256)(
                    first + b * BLOCK, std::min<int64_t>(last, first + (b + 1) * BLOCK), worst[b], at[b]);
    });
    int64_t top = 0;
    for (int64_t b = 1; b < blocks; ++b)
        if (worst[b] > worst[top]) top = b;
    if (worst_x) *worst_x = blocks ? at[top] : 0.0f;
    return blocks ? worst[top] : 0.0;
}

PackedWeights pack_weights(const int8_t *weights, const Geometry &g) {
    // value v of a kernel row's run is channel v % c2 of kernel column v / c2
    const int64_t c2 = g.padded_channels(), row = g.row_values(), blocks = (g.out_channels + LANES - 1) / LANES;
    PackedWeights packed(blocks * g.kernel_h * row * LANES, 0);
    int16_t *p = packed.data();
    for (int64_t b = 0; b < blocks; ++b)
        for (int64_t ky = 0; ky < g.kernel_h; ++ky)
            for (int64_t v = 0; v < row; v += 2, p += 2 * LANES)
                for (int64_t lane = 0; lane < LANES; ++lane) {
                    const int64_t oc = b * LANES + lane;
                    for (int64_t k = 0; k < 2 && oc < g.out_channels; ++k) {
                        const int64_t kx = (v + k) / c2, c = (v + k) % c2;
                        if (kx < g.kernel_w && c < g.in_channels)
                            p[2 * lane + k] = weights[((oc * g.in_channels + c) * g.kernel_h + ky) * g.kernel_w + kx];
                    }
                }
    return packed;
}

int64_t widened_size(const Geometry &g, int64_t images, int64_t h, int64_t w) {
    return images * (h + g.pad_top + g.pad_bottom) * (w + g.pad_left + g.pad_right) * g.padded_channels();
}

namespace {
// out[i] = q[i] − zero_point in int16 (in [−255, 255]), sixteen at a time. Written out because the
// compiler does not vectorize the loop itself: a store through int16_t* might change the uint8_t
// source for all it knows. PaddleOCR's detector on one thread spent 3.6% of its time widening
// with the loop, 2.8% with this (perf, Zen 3).
__attribute__((target("avx2"))) void widen_values(const uint8_t *q, int64_t n, bool signed_src, int zero_point,
                                                  int16_t *out) {
    const __m256i zp = _mm256_set1_epi16((int16_t)zero_point);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i *>(q + i));
        const __m256i words = signed_src ? _mm256_cvtepi8_epi16(bytes) : _mm256_cvtepu8_epi16(bytes);
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i), _mm256_sub_epi16(words, zp));
    }
    for (; i < n; ++i) out[i] = (int16_t)((signed_src ? (int)(int8_t)q[i] : (int)q[i]) - zero_point);
}
}  // namespace

__attribute__((target("avx2,popcnt"))) int64_t single_other_byte(const uint8_t *bytes, int64_t n, uint8_t zero) {
    const __m256i zeros = _mm256_set1_epi8((char)zero);
    int64_t found = -1, i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(bytes + i));
        const uint32_t other = ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, zeros));
        if (!other) continue;
        if (found >= 0 || _mm_popcnt_u32(other) > 1) return -2;
        found = i + __builtin_ctz(other);
    }
    for (; i < n; ++i)
        if (bytes[i] != zero) {
            if (found >= 0) return -2;
            found = i;
        }
    return found;
}

__attribute__((target("avx2"))) void scaled_weights(int32_t v, const int8_t *weights, int64_t n, int32_t *acc) {
    const __m256i factor = _mm256_set1_epi32(v);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(weights + c)));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(acc + c), _mm256_mullo_epi32(w, factor));
    }
    for (; c < n; ++c) acc[c] = v * weights[c];
}

// Positions widened together from a channels-first source: a channel's run of them is one read, and their
// c2 values each (16 kB for 512 channels) stay in L1 while every channel writes its one. Row by row
// before, a 512-channel 1-D source of 194 positions (plcmos_v2) took 0.3 ms, on one thread.
constexpr int64_t CHANNELS_FIRST_CHUNK = 16;

void widen(const uint8_t *src, bool signed_src, bool channels_last, int zero_point, const Geometry &g,
           int64_t images, int64_t h, int64_t w, int16_t *wide, int threads) {
    const int64_t c = g.in_channels, c2 = g.padded_channels();
    const int64_t hp = h + g.pad_top + g.pad_bottom, wp = w + g.pad_left + g.pad_right, row = wp * c2;
    const int64_t chunk = channels_last ? w : CHANNELS_FIRST_CHUNK, chunks = (w + chunk - 1) / chunk;
    lpt_parallel::for_each(images * hp * row >= PARALLEL_WORK ? threads : 1, images * hp * chunks, [=](int64_t task) {
        const int64_t t = task / chunks, part = task % chunks, n = t / hp, y = t % hp - g.pad_top;
        int16_t *out = wide + t * row;
        if (y < 0 || y >= h) {
            if (part == 0) std::memset(out, 0, row * sizeof(int16_t));
            return;
        }
        if (part == 0) {
            std::memset(out, 0, g.pad_left * c2 * sizeof(int16_t));
            std::memset(out + (g.pad_left + w) * c2, 0, g.pad_right * c2 * sizeof(int16_t));
        }
        int16_t *interior = out + g.pad_left * c2;
        const int64_t x0 = part * chunk, x1 = std::min(w, x0 + chunk);
        if (c2 != c)
            for (int64_t x = x0; x < x1; ++x) interior[x * c2 + c] = 0;
        if (channels_last) {
            const uint8_t *in = src + (n * h + y) * w * c;
            if (c2 == c)
                widen_values(in, w * c, signed_src, zero_point, interior);
            else
                for (int64_t x = 0; x < w; ++x) widen_values(in + x * c, c, signed_src, zero_point, interior + x * c2);
        } else if (c == 3 && c2 == 3) {  // an RGB image (a stem): its planes interleaved, then widened, by vectors
            uint8_t interleaved[3 * CHANNELS_FIRST_CHUNK];
            interleave_three_planes(src + (n * 3 * h + y) * w + x0, h * w, x1 - x0, 0, interleaved);
            widen_values(interleaved, 3 * (x1 - x0), signed_src, zero_point, interior + x0 * 3);
        } else {
            for (int64_t k = 0; k < c; ++k) {
                const uint8_t *in = src + ((n * c + k) * h + y) * w;
                for (int64_t x = x0; x < x1; ++x)
                    interior[x * c2 + k] = (int16_t)((signed_src ? (int)(int8_t)in[x] : (int)in[x]) - zero_point);
            }
        }
    });
}

namespace {

// Tiles per hand-over to the sink: the output stage's set-up (its constants, the post-ops) then serves
// 48 positions instead of 6: a 1→32-channel 3×3 convolution on 900×120, where the stage's share is
// the largest, went from 3.1 to 2.5 ms (Zen 3, one thread). 48·16 accumulators are 3 kB, in L1.
constexpr int64_t RUN_TILES = 8;

// How a tile walks the window of g's positions in a widened source wp positions wide.
inline Walk walk_of(const Geometry &g, int64_t wp) {
    const int64_t c2 = g.padded_channels();
    if (g.dilation_w != 1) return {g.kernel_h, g.dilation_h * wp * c2, g.kernel_w, g.dilation_w * c2, c2 / 2};
    return {g.kernel_h, g.dilation_h * wp * c2, 1, 0, g.row_values() / 2};
}

// Every run of RUN_TILES tiles of the convolution, each handed to sink(acc [count][LANES], first
// position, count, step from one position to the next, first channel, valid channels) as soon as it
// is done.
template <typename W, typename Sink>
void each_tile(const int16_t *wide, const W *packed, const Geometry &g, int64_t images, int64_t h, int64_t w,
               int threads, const Sink &sink) {
    const int64_t c2 = g.padded_channels(), wp = w + g.pad_left + g.pad_right, hp = h + g.pad_top + g.pad_bottom;
    const int64_t out_w = g.out_w(w), positions = g.out_h(h) * out_w;
    constexpr int64_t RUN = RUN_TILES * TILE;
    const int64_t blocks = (g.out_channels + LANES - 1) / LANES, runs = (positions + RUN - 1) / RUN;
    const int64_t block_size = g.kernel_h * g.row_values() * LANES;
    const Walk walk = walk_of(g, wp);
    const int64_t work = images * positions * g.out_channels * g.kernel_h * g.kernel_w * c2;
    static_assert(RUN % HALF_TILE == 0 && RUN % WIDE_TILE == 0, "a run is whole tiles of any kind");
    // a last block of at most 8 channels after another: the two are one group, walked by wide tiles
    const bool wide_last = blocks >= 2 && g.out_channels - (blocks - 1) * LANES <= LANES / 2;
    const int64_t groups = blocks - wide_last;
    if (positions == 1) {  // one position per image: its blocks ROW_TILE_BLOCKS at a time (row_tile)
        const int64_t groups_of_blocks = (blocks + ROW_TILE_BLOCKS - 1) / ROW_TILE_BLOCKS;
        lpt_parallel::for_each(work >= 16 * PARALLEL_WORK ? threads : 1, images * groups_of_blocks, [=](int64_t task) {
            const int64_t n = task / groups_of_blocks, b0 = task % groups_of_blocks * ROW_TILE_BLOCKS;
            const int64_t count = std::min<int64_t>(ROW_TILE_BLOCKS, blocks - b0);
            alignas(32) int32_t acc[ROW_TILE_BLOCKS * LANES];
            const int16_t *start = wide + ((n * hp) * wp) * c2;
            ROW_TILES<W>[count](start, packed + b0 * block_size, block_size, walk, acc);
            for (int64_t b = b0; b < b0 + count; ++b)
                sink(acc + (b - b0) * LANES, n, 1, 1, b * LANES, std::min(LANES, g.out_channels - b * LANES));
        });
        return;
    }
    // a run's blocks one after the other, each reading the run's source while it is in L1 (block by
    // block over all runs before: the PaddleOCR detector 1.4 % slower, alternating in one process)
    lpt_parallel::for_each(work >= 16 * PARALLEL_WORK ? threads : 1, images * groups * runs, [=](int64_t task) {
        const int64_t n = task / (groups * runs), first = task / groups % runs * RUN, b = task % groups;
        const int64_t count = std::min(RUN, positions - first), valid = std::min(LANES, g.out_channels - b * LANES);
        const bool paired = wide_last && b == groups - 1, half = valid <= LANES / 2;
        const int64_t size = paired ? WIDE_TILE : half ? HALF_TILE : TILE;
        alignas(32) int32_t acc[RUN * LANES], next_acc[RUN * LANES];
        int64_t oy = first / out_w, ox = first % out_w;  // of the position j below, kept as j advances
        for (int64_t t = 0; t < count; t += size) {
            const int64_t in_tile = std::min(size, count - t);
            const int16_t *starts[HALF_TILE];
            for (int64_t j = 0; j < in_tile; ++j) {
                starts[j] = wide + ((n * hp + oy * g.stride_h) * wp + ox * g.stride_w) * c2;
                if (++ox == out_w) ox = 0, ++oy;
            }
            const W *weights = packed + b * block_size;
            if (paired)
                WIDE_TILES<W>[in_tile](starts, weights, weights + block_size, walk, acc + t * LANES, next_acc + t * LANES);
            else
                (half ? HALF_TILES<W> : TILES<W>)[in_tile](starts, weights, walk, acc + t * LANES);
        }
        sink(acc, n * positions + first, count, 1, b * LANES, valid);
        if (paired) sink(next_acc, n * positions + first, count, 1, (b + 1) * LANES, g.out_channels - (b + 1) * LANES);
    });
}

// One task of each_pooled_tile: the pool_h output rows of a window's row (the first at `row`, the next
// `row_stride` int16 further), `span` positions each (`step` int16 apart), tile by tile into `acc`, each tile's
// positions folded into the largest values of their window's column (`largest` [span / pool_w][LANES]).
__attribute__((target("avx2"))) void pooled_row(const int16_t *row, int64_t row_stride, int64_t step, int64_t span,
                                                int64_t pool_h, int64_t pool_w, const int16_t *weights,
                                                const Walk &walk, bool half, int32_t *acc, int32_t *largest) {
    const int64_t size = half ? HALF_TILE : TILE;
    const TileFunction<int16_t> *tiles = half ? HALF_TILES<int16_t> : TILES<int16_t>;
    for (int64_t r = 0; r < pool_h; ++r, row += row_stride)
        for (int64_t x = 0; x < span; x += size) {
            const int64_t in_tile = std::min(size, span - x);
            const int16_t *starts[HALF_TILE];
            for (int64_t j = 0; j < in_tile; ++j) starts[j] = row + (x + j) * step;
            tiles[in_tile](starts, weights, walk, acc);
            for (int64_t j = 0; j < in_tile; ++j) {
                int32_t *into = largest + (x + j) / pool_w * LANES;
                const bool first = r == 0 && (x + j) % pool_w == 0;
                for (int k = 0; k < (half ? 1 : 2); ++k) {
                    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i *>(acc + j * LANES + 8 * k));
                    __m256i *to = reinterpret_cast<__m256i *>(into + 8 * k);
                    _mm256_store_si256(to, first ? v : _mm256_max_epi32(v, _mm256_load_si256(to)));
                }
            }
        }
}

// each_tile's accumulators max-pooled over windows of pool_h × pool_w output positions (as many apart, a last
// partial window dropped), handed to sink a pooled row and a block of 16 channels at a time: a task computes
// the window's pool_h output rows, tile by tile, each folded into the row's largest values as it is done.
template <typename Sink>
void each_pooled_tile(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h,
                      int64_t w, int64_t pool_h, int64_t pool_w, int threads, const Sink &sink) {
    const int64_t c2 = g.padded_channels(), wp = w + g.pad_left + g.pad_right, hp = h + g.pad_top + g.pad_bottom;
    const int64_t rows = g.out_h(h) / pool_h, columns = g.out_w(w) / pool_w, span = columns * pool_w;
    const int64_t blocks = (g.out_channels + LANES - 1) / LANES, block_size = g.kernel_h * g.row_values() * LANES;
    const Walk walk = walk_of(g, wp);
    const int64_t work = images * rows * pool_h * span * g.out_channels * g.kernel_h * g.kernel_w * c2;
    lpt_parallel::for_each(work >= 16 * PARALLEL_WORK ? threads : 1, images * rows * blocks, [=](int64_t task) {
        const int64_t n = task / (rows * blocks), py = task / blocks % rows, b = task % blocks;
        const int64_t valid = std::min(LANES, g.out_channels - b * LANES);
        thread_local std::vector<int32_t, CacheLineAllocator<int32_t>> acc, largest;
        acc.resize((size_t)(HALF_TILE * LANES));
        largest.resize((size_t)(columns * LANES));
        pooled_row(wide + (n * hp + py * pool_h * g.stride_h) * wp * c2, g.stride_h * wp * c2, g.stride_w * c2, span,
                   pool_h, pool_w, packed + b * block_size, walk, valid <= LANES / 2, acc.data(), largest.data());
        sink(largest.data(), (n * rows + py) * columns, columns, 1, b * LANES, valid);
    });
}

}  // namespace

ByteWeights pack_byte_weights(const int8_t *weights, const Geometry &g) {
    // value v of a kernel row's run is channel v % C of kernel column v / C
    const int64_t c = g.in_channels, quads = g.kernel_w * c / 4, blocks = (g.out_channels + LANES - 1) / LANES;
    const int64_t padded_out = blocks * LANES;
    auto weight = [&](int64_t oc, int64_t ky, int64_t v) -> int8_t {
        return oc < g.out_channels ? weights[((oc * c + v % c) * g.kernel_h + ky) * g.kernel_w + v / c] : 0;
    };
    ByteWeights b;
    b.packed.assign(blocks * g.kernel_h * quads * 4 * LANES, 0);
    b.by_input.assign(g.kernel_h * g.kernel_w * c * padded_out, 0);
    b.sums.assign(padded_out, 0);
    int8_t *packed = b.packed.data();
    for (int64_t block = 0; block < blocks; ++block)
        for (int64_t ky = 0; ky < g.kernel_h; ++ky)
            for (int64_t q = 0; q < quads; ++q, packed += 4 * LANES)
                for (int64_t lane = 0; lane < LANES; ++lane) {
                    const int64_t oc = block * LANES + lane, at = (lane / 8) * 32 + (lane % 8) * 4;  // two vectors of 8 lanes
                    for (int64_t v = 0; v < 4; ++v) {
                        const int8_t value = weight(oc, ky, 4 * q + v);
                        packed[at + v] = value;
                        b.sums[oc] += value;
                        b.by_input[(ky * quads * 4 + 4 * q + v) * padded_out + oc] = value;
                    }
                }
    return b;
}

int64_t padded_bytes_size(const Geometry &g, int64_t images, int64_t h, int64_t w) {
    return images * (h + g.pad_top + g.pad_bottom) * (w + g.pad_left + g.pad_right) * g.in_channels;
}

namespace {

// r = clamp(u − t, 0, 127) of n values u (src ^ flip) into out; those outside the window onto `outside` (by
// index, channel and excess). The number outside, or past `room` as soon as it is (the rest not written).
__attribute__((target("avx2"))) int64_t window_values(const uint8_t *src, int64_t n, uint8_t flip, uint8_t t, int64_t c,
                                                      int64_t first_index, uint8_t *out, OutsideValue *outside,
                                                      int64_t room) {
    const __m256i flips = _mm256_set1_epi8((char)flip), starts = _mm256_set1_epi8((char)t);
    const __m256i widest = _mm256_set1_epi8(127);
    int64_t found = 0;
    auto note = [&](int64_t i, int u) {
        const int r = std::clamp(u - t, 0, 127);
        out[i] = (uint8_t)r;
        if (r == u - t) return;
        if (found < room) {
            const int64_t index = first_index + i;
            outside[found] = {(int32_t)(index / c), (int16_t)(index % c), (int16_t)(u - t - r)};
        }
        ++found;
    };
    int64_t i = 0;
    for (; i + 32 <= n && found <= room; i += 32) {
        const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(src + i)), flips);
        const __m256i r = _mm256_min_epu8(_mm256_subs_epu8(u, starts), widest);
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i), r);
        const unsigned inside = (unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_add_epi8(r, starts), u));
        if (inside != 0xFFFFFFFFu)
            for (int k = 0; k < 32; ++k)
                if (!(inside >> k & 1)) note(i + k, src[i + k] ^ flip);
    }
    for (; i < n && found <= room; ++i) note(i, src[i] ^ flip);
    return found;
}

}  // namespace

bool pad_bytes(const uint8_t *src, bool signed_src, bool channels_last, int zero_point, const Geometry &g,
               int64_t images, int64_t h, int64_t w, bool always, uint8_t *padded, Outside &outside, int threads) {
    const int64_t c = g.in_channels, hp = h + g.pad_top + g.pad_bottom, wp = w + g.pad_left + g.pad_right, row = wp * c;
    const int start = window_start(zero_point, signed_src);
    const uint8_t flip = signed_src ? 0x80 : 0, t = (uint8_t)start;
    const uint8_t pad = (uint8_t)(zero_point + (signed_src ? 128 : 0) - start);  // the zero point's r
    const int64_t values_in = images * h * w * c;
    if (!always) {  // a sample first (the values' layout aside): a source far outside costs no pass
        const int64_t samples = std::min<int64_t>(values_in, 1024), step = values_in / samples;
        int64_t out_of_window = 0;
        for (int64_t i = 0; i < samples; ++i) {
            const int u = src[i * step] ^ flip;
            out_of_window += u < start || u > start + 127;
        }
        if (64 * out_of_window > samples) return false;
    }
    outside.capacity = always ? w * c : std::max<int64_t>(16, w * c / 64);
    outside.counts.assign(images * hp, 0);
    if ((int64_t)outside.values.size() < images * hp * outside.capacity) outside.values.resize(images * hp * outside.capacity);
    int32_t *counts = outside.counts.data();
    OutsideValue *values = outside.values.data();
    const int64_t capacity = outside.capacity;
    lpt_parallel::for_each(images * hp * row >= PARALLEL_WORK ? threads : 1, images * hp, [=](int64_t t_row) {
        const int64_t n = t_row / hp, y = t_row % hp - g.pad_top;
        uint8_t *out = padded + t_row * row;
        if (y < 0 || y >= h) {  // a row of padding
            std::memset(out, pad, row);
            return;
        }
        std::memset(out, pad, g.pad_left * c);
        std::memset(out + (g.pad_left + w) * c, pad, g.pad_right * c);
        uint8_t *interior = out + g.pad_left * c;
        OutsideValue *row_outside = values + t_row * capacity;
        int64_t found;
        if (channels_last) {
            found = window_values(src + (n * h + y) * w * c, w * c, flip, t, c, g.pad_left * c, interior, row_outside,
                                  capacity);
        } else {
            thread_local std::vector<uint8_t> row_values;  // the row channels-last, then windowed as above
            row_values.resize(w * c);
            uint8_t *gathered = row_values.data();  // (a thread_local read in the loop is a call per value)
            for (int64_t k = 0; k < c; ++k) {
                const uint8_t *in = src + ((n * c + k) * h + y) * w;
                for (int64_t x = 0; x < w; ++x) gathered[x * c + k] = in[x];
            }
            found = window_values(gathered, w * c, flip, t, c, g.pad_left * c, interior, row_outside, capacity);
        }
        counts[t_row] = (int32_t)std::min<int64_t>(found, INT32_MAX);
    });
    int64_t total = 0;
    for (int64_t i = 0; i < images * hp; ++i) {
        if (counts[i] > capacity) return false;
        total += counts[i];
    }
    return always || 128 * total <= values_in;
}

namespace {

// A tile of T positions × 16 output channels from the bytes (ByteWeights says why each step is exact), into
// out [T][LANES]: Σ r·w over the window's quads, less (zp − t)·Σ w (`compensation`). With HALVES 1, the first 8
// channels only (a last block of at most 8 valid, as the int16 kernel's half tiles), lanes 8-15 of out left as
// they were.
template <int T, int HALVES>
__attribute__((target("avx2"))) void byte_tile(const uint8_t *const *positions, const int8_t *weights, int64_t rows,
                                               int64_t row_stride, int64_t quads, const int32_t *compensation,
                                               int32_t *out) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[T][HALVES];
    for (int j = 0; j < T; ++j)
        for (int k = 0; k < HALVES; ++k) acc[j][k] = _mm256_setzero_si256();
    const int8_t *w = weights;
    for (int64_t row = 0; row < rows; ++row) {
        const uint8_t *src[T];
        for (int j = 0; j < T; ++j) src[j] = positions[j] + row * row_stride;
        for (int64_t q = 0; q < quads; ++q, w += 4 * LANES) {
            __m256i wk[HALVES];
            for (int k = 0; k < HALVES; ++k) wk[k] = _mm256_load_si256(reinterpret_cast<const __m256i *>(w + 32 * k));
            for (int j = 0; j < T; ++j) {
                int32_t quad;
                std::memcpy(&quad, src[j] + 4 * q, sizeof quad);
                const __m256i s = _mm256_set1_epi32(quad);
                for (int k = 0; k < HALVES; ++k)
                    acc[j][k] = _mm256_add_epi32(acc[j][k], _mm256_madd_epi16(_mm256_maddubs_epi16(s, wk[k]), ones));
            }
        }
    }
    for (int j = 0; j < T; ++j)
        for (int k = 0; k < HALVES; ++k)
            _mm256_store_si256(reinterpret_cast<__m256i *>(out + j * LANES + 8 * k),
                               _mm256_sub_epi32(acc[j][k], _mm256_load_si256(reinterpret_cast<const __m256i *>(compensation + 8 * k))));
}

// Five positions, not TILE: with six, the twelve accumulators, the two weights, the vector of ones, a source and
// a product need 17 registers, and gcc kept an accumulator on the stack. Half tiles take twice the positions
// (10 accumulators of 16 ymm), so that a layer of 24 channels computes no products for its 8 lanes no one reads.
constexpr int BYTE_TILE = 5, BYTE_HALF_TILE = 10;
using ByteTileFunction = void (*)(const uint8_t *const *, const int8_t *, int64_t, int64_t, int64_t, const int32_t *,
                                  int32_t *);
constexpr ByteTileFunction BYTE_TILES[BYTE_TILE + 1] = {nullptr, byte_tile<1, 2>, byte_tile<2, 2>, byte_tile<3, 2>,
                                                        byte_tile<4, 2>, byte_tile<5, 2>};
constexpr ByteTileFunction BYTE_HALF_TILES[BYTE_HALF_TILE + 1] = {
    nullptr, byte_tile<1, 1>, byte_tile<2, 1>, byte_tile<3, 1>, byte_tile<4, 1>, byte_tile<5, 1>,
    byte_tile<6, 1>, byte_tile<7, 1>, byte_tile<8, 1>, byte_tile<9, 1>, byte_tile<10, 1>};

// Each value outside the window times its weights, added to the accumulators acc [count][LANES] of the output
// positions [first, first + count) of image n (one output row's, or whole rows') in block `block`: the values
// of the padded rows those positions read, those of a row within the columns they read.
void add_outside(const Outside &outside, const ByteWeights &b, const Geometry &g, int64_t n, int64_t hp, int64_t out_w,
                 int64_t first, int64_t count, int64_t block, int32_t *acc) {
    const int64_t padded_out = (int64_t)b.sums.size(), c = g.in_channels;
    const int64_t first_oy = first / out_w, last_oy = (first + count - 1) / out_w;
    const bool one_row = first_oy == last_oy;
    const int32_t low_column = one_row ? (int32_t)(first % out_w * g.stride_w) : 0;
    const int32_t high_column = one_row ? (int32_t)((first + count - 1) % out_w * g.stride_w + g.kernel_w - 1) : INT32_MAX;
    for (int64_t py = first_oy * g.stride_h; py <= last_oy * g.stride_h + (g.kernel_h - 1) * g.dilation_h; ++py) {
        const OutsideValue *values = outside.values.data() + (n * hp + py) * outside.capacity;
        const OutsideValue *end = values + outside.counts[n * hp + py];
        values = std::lower_bound(values, end, low_column, [](const OutsideValue &v, int32_t x) { return v.column < x; });
        for (; values != end && values->column <= high_column; ++values)
            for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
                const int64_t dy = py - ky * g.dilation_h;
                if (dy < 0 || dy % g.stride_h) continue;
                for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
                    const int64_t dx = values->column - kx;
                    if (dx < 0 || dx % g.stride_w) continue;
                    const int64_t j = dy / g.stride_h * out_w + dx / g.stride_w - first;
                    if (dx / g.stride_w >= out_w || j < 0 || j >= count) continue;
                    const int8_t *w = b.by_input.data() + ((ky * g.kernel_w + kx) * c + values->channel) * padded_out +
                                      block * LANES;
                    for (int64_t l = 0; l < LANES; ++l) acc[j * LANES + l] += values->excess * w[l];
                }
            }
    }
}

// each_tile's walk over runs of positions and blocks of 16 channels, on the bytes.
template <typename Sink>
void each_byte_tile(const uint8_t *padded, const Outside &outside, const ByteWeights &b, int zero_point,
                    bool signed_src, const Geometry &g, int64_t images, int64_t h, int64_t w, int threads,
                    const Sink &sink) {
    const int64_t c = g.in_channels, wp = w + g.pad_left + g.pad_right, hp = h + g.pad_top + g.pad_bottom;
    const int64_t out_w = g.out_w(w), positions = g.out_h(h) * out_w;
    constexpr int64_t RUN = 10 * BYTE_TILE;
    static_assert(RUN % BYTE_HALF_TILE == 0, "a run is whole tiles of either kind");
    const int64_t blocks = (g.out_channels + LANES - 1) / LANES, runs = (positions + RUN - 1) / RUN;
    const int64_t quads = g.kernel_w * c / 4, block_size = g.kernel_h * quads * 4 * LANES;
    const int64_t row_stride = g.dilation_h * wp * c;
    const int64_t work = images * positions * g.out_channels * g.kernel_h * g.kernel_w * c;
    const int32_t zp_in_window = zero_point + (signed_src ? 128 : 0) - window_start(zero_point, signed_src);
    lpt_parallel::for_each(work >= 16 * PARALLEL_WORK ? threads : 1, images * blocks * runs, [=, &b, &outside](int64_t task) {
        const int64_t n = task / (blocks * runs), first = task / blocks % runs * RUN, block = task % blocks;
        const int64_t count = std::min(RUN, positions - first), valid = std::min(LANES, g.out_channels - block * LANES);
        alignas(32) int32_t compensation[LANES];  // (zp − t)·Σ w of each channel
        for (int64_t k = 0; k < LANES; ++k) compensation[k] = zp_in_window * b.sums[block * LANES + k];
        alignas(32) int32_t acc[RUN * LANES];
        int64_t oy = first / out_w, ox = first % out_w;
        const bool half = valid <= LANES / 2;
        const int64_t size = half ? BYTE_HALF_TILE : BYTE_TILE;
        for (int64_t t = 0; t < count; t += size) {
            const int64_t in_tile = std::min<int64_t>(size, count - t);
            const uint8_t *starts[BYTE_HALF_TILE];
            for (int64_t j = 0; j < in_tile; ++j) {
                starts[j] = padded + ((n * hp + oy * g.stride_h) * wp + ox * g.stride_w) * c;
                if (++ox == out_w) ox = 0, ++oy;
            }
            (half ? BYTE_HALF_TILES : BYTE_TILES)[in_tile](starts, b.packed.data() + block * block_size, g.kernel_h,
                                                            row_stride, quads, compensation, acc + t * LANES);
        }
        add_outside(outside, b, g, n, hp, out_w, first, count, block, acc);
        sink(acc, n * positions + first, count, 1, block * LANES, valid);
    });
}

}  // namespace

namespace {

// A run of P positions `step` int16 apart along a row of one block's pairs (pair_block_row) against its weights
// (pack_depthwise_weights): per kernel row and pair of taps, two vpmaddwd per position (channels 0-7, 8-15), each
// adding a channel's two products in int32. The pairs are laid out as vpmaddwd takes them: no shuffle.
template <int P>
__attribute__((target("avx2"))) void paired_blocks(const int16_t *window, int64_t step, int64_t row_step,
                                                   int64_t pair_step, const int16_t *weights, int64_t rows,
                                                   int64_t pairs, int32_t *acc) {
    __m256i low[P], high[P];
    for (int j = 0; j < P; ++j) low[j] = high[j] = _mm256_setzero_si256();
    for (int64_t ky = 0; ky < rows; ++ky, window += row_step)
        for (int64_t q = 0; q < pairs; ++q, weights += 2 * LANES) {
            const __m256i w_low = _mm256_load_si256(reinterpret_cast<const __m256i *>(weights));
            const __m256i w_high = _mm256_load_si256(reinterpret_cast<const __m256i *>(weights + LANES));
            const int16_t *at = window + q * pair_step;
            for (int j = 0; j < P; ++j) {
                const __m256i *v = reinterpret_cast<const __m256i *>(at + j * step);
                low[j] = _mm256_add_epi32(low[j], _mm256_madd_epi16(_mm256_load_si256(v), w_low));
                high[j] = _mm256_add_epi32(high[j], _mm256_madd_epi16(_mm256_load_si256(v + 1), w_high));
            }
        }
    for (int j = 0; j < P; ++j) {
        _mm256_store_si256(reinterpret_cast<__m256i *>(acc + j * LANES), low[j]);
        _mm256_store_si256(reinterpret_cast<__m256i *>(acc + j * LANES + 8), high[j]);
    }
}
constexpr int DEPTHWISE_POSITIONS = 4;

// Block b's values of the padded source row yp, columns [first, end) (q − zero_point in int16; zeros in the pads
// and past the channels), each beside the value dilation_w columns to its right, as vpmaddwd takes two taps of a
// kernel row: out [end − first][channels 0-7's pairs, then 8-15's] (vpunpck*wd interleave two columns' values per
// 128-bit lane, channels 0-3 | 8-11 and 4-7 | 12-15, and the lanes are regrouped). line: scratch of
// (end − first + dilation_w)·16 int16.
__attribute__((target("avx2"))) void pair_block_row(const uint8_t *src, bool signed_src, bool channels_last,
                                                    int zero_point, const Geometry &g, int64_t n, int64_t h,
                                                    int64_t w, int64_t b, int64_t yp, int64_t first, int64_t end,
                                                    int16_t *line, int16_t *out) {
    const int64_t d = g.dilation_w, y = yp - g.pad_top, c = g.in_channels, width = end - first;
    if (y < 0 || y >= h) {
        std::memset(out, 0, width * 2 * LANES * sizeof(int16_t));
        return;
    }
    std::memset(line, 0, (width + d) * LANES * sizeof(int16_t));
    const int64_t channel = b * LANES, valid = std::min(LANES, c - channel);
    const int64_t x0 = std::max<int64_t>(0, first - g.pad_left), x1 = std::min(w, end + d - g.pad_left);
    int16_t *at = line + (g.pad_left - first) * LANES;  // column x of the source at at + x·16
    if (channels_last && valid == LANES) {
        const uint8_t *in = src + (n * h + y) * w * c + channel;
        for (int64_t x = x0; x < x1; ++x) widen_values(in + x * c, LANES, signed_src, zero_point, at + x * LANES);
    } else {
        for (int64_t k = 0; k < valid; ++k)
            for (int64_t x = x0; x < x1; ++x) {
                const uint8_t q = channels_last ? src[((n * h + y) * w + x) * c + channel + k]
                                                : src[((n * c + channel + k) * h + y) * w + x];
                at[x * LANES + k] = (int16_t)((signed_src ? (int)(int8_t)q : (int)q) - zero_point);
            }
    }
    for (int64_t x = 0; x < width; ++x) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(line + x * LANES));
        const __m256i next = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(line + (x + d) * LANES));
        const __m256i low = _mm256_unpacklo_epi16(a, next), high = _mm256_unpackhi_epi16(a, next);
        __m256i *to = reinterpret_cast<__m256i *>(out + x * 2 * LANES);
        _mm256_store_si256(to, _mm256_permute2x128_si256(low, high, 0x20));
        _mm256_store_si256(to + 1, _mm256_permute2x128_si256(low, high, 0x31));
    }
}

// A task's rows of pairs (pair_block_row) at most this many bytes, to be read from L2 by the kernel rows that
// need them, and at least this many output rows, so that the rows two bands both read are paired twice less often.
constexpr int64_t PAIRED_BAND_BYTES = 192 << 10;
constexpr int64_t MIN_PAIRED_BAND = 4;
// Tasks per thread a depthwise layer is cut into at least where its blocks and bands are fewer: its rows then
// in strips of columns (a 1-D layer of 16 channels is one row of one block).
constexpr int64_t DEPTHWISE_TASKS_PER_THREAD = 4;
// Pairs a thread keeps between layers (a strip of a long 1-D row may be larger).
constexpr size_t KEEP_PAIRED_BYTES = 8u << 20;

// Every row of positions of one block of 16 channels of a depthwise convolution, RUN_TILES·TILE at a time,
// handed to sink as each_tile hands a convolution's. A task is a block's band of output rows (or a strip of it):
// it pairs the source rows they read (pair_block_row), then runs the kernel over them while they are in L2.
// Before, the kernel read widen()'s channels-last int16 and interleaved two taps' sources by vpunpck*wd at every
// pair: a 7×7 layer of 96 channels over 160×160 with its output stage (Zen 3, one thread, the fastest of 120 runs
// in each of three processes per build, alternating) 7.7-8.0 → 4.1-5.5 ms, a 3×3 of 48 channels 1.00-1.85 →
// 0.93-1.49 ms.
template <typename Sink>
void each_depthwise_tile(const uint8_t *src, bool signed_src, bool channels_last, int zero_point,
                         const int16_t *packed, const Geometry &g, int64_t images, int64_t h, int64_t w, int threads,
                         const Sink &sink) {
    const int64_t wp = w + g.pad_left + g.pad_right, out_h = g.out_h(h), out_w = g.out_w(w);
    const int64_t positions = out_h * out_w;
    constexpr int64_t RUN = RUN_TILES * TILE;
    const int64_t blocks = (g.out_channels + LANES - 1) / LANES, kp = (g.kernel_w + 1) / 2;
    const int64_t block_size = g.kernel_h * kp * 2 * LANES, reach = (g.kernel_h - 1) * g.dilation_h + 1;
    const int64_t row_bytes = wp * 2 * LANES * (int64_t)sizeof(int16_t);
    const int64_t fitting = (PAIRED_BAND_BYTES / row_bytes - reach) / g.stride_h + 1;
    const int64_t band = std::min(out_h, std::max(fitting, MIN_PAIRED_BAND)), bands = (out_h + band - 1) / band;
    const int64_t work = images * positions * g.out_channels * g.kernel_h * g.kernel_w;
    const int workers = work >= 16 * PARALLEL_WORK ? threads : 1;
    const int64_t tasks = images * blocks * bands, wanted = (DEPTHWISE_TASKS_PER_THREAD * workers + tasks - 1) / tasks;
    const int64_t strips = std::min((out_w + RUN - 1) / RUN, wanted), strip = (out_w + strips - 1) / strips;
    const int64_t step = g.stride_w * 2 * LANES, pair_step = 2 * g.dilation_w * 2 * LANES;
    lpt_parallel::for_each(workers, tasks * strips, [=](int64_t task) {
        const int64_t n = task / (blocks * bands * strips), b = task / (bands * strips) % blocks;
        const int64_t oy0 = task / strips % bands * band, ox0 = task % strips * strip;
        const int64_t oy1 = std::min(out_h, oy0 + band), ox1 = std::min(out_w, ox0 + strip);
        if (ox0 >= ox1) return;
        // the source rows and columns the band's strip reads: a pair's first column at most that of the last
        // position's last pair
        const int64_t rows = (oy1 - 1 - oy0) * g.stride_h + reach, first = ox0 * g.stride_w;
        const int64_t end = (ox1 - 1) * g.stride_w + 2 * (kp - 1) * g.dilation_w + 1;
        const int64_t row_size = (end - first) * 2 * LANES, row_step = g.dilation_h * row_size;
        thread_local std::vector<int16_t, CacheLineAllocator<int16_t>> pairs, line;
        pairs.resize(rows * row_size);
        line.resize((end - first + g.dilation_w) * LANES);
        for (int64_t r = 0; r < rows; ++r)
            pair_block_row(src, signed_src, channels_last, zero_point, g, n, h, w, b, oy0 * g.stride_h + r, first, end,
                           line.data(), pairs.data() + r * row_size);
        const int16_t *weights = packed + b * block_size;
        alignas(32) int32_t acc[RUN * LANES];
        for (int64_t oy = oy0; oy < oy1; ++oy)
            for (int64_t x0 = ox0; x0 < ox1; x0 += RUN) {
                const int64_t count = std::min(RUN, ox1 - x0);
                const int16_t *window = pairs.data() + (oy - oy0) * g.stride_h * row_size + (x0 - ox0) * step;
                int64_t j = 0;
                for (; j + DEPTHWISE_POSITIONS <= count; j += DEPTHWISE_POSITIONS)
                    paired_blocks<DEPTHWISE_POSITIONS>(window + j * step, step, row_step, pair_step, weights,
                                                       g.kernel_h, kp, acc + j * LANES);
                for (; j < count; ++j)
                    paired_blocks<1>(window + j * step, step, row_step, pair_step, weights, g.kernel_h, kp,
                                     acc + j * LANES);
                sink(acc, n * positions + oy * out_w + x0, count, 1, b * LANES,
                     std::min(LANES, g.out_channels - b * LANES));
            }
        if (pairs.capacity() * sizeof(int16_t) > KEEP_PAIRED_BYTES) decltype(pairs)().swap(pairs);
    });
}

}  // namespace

bool winograd_fits(const Geometry &g) {
    // below 16 channels the transforms, 16 channels at a time, cost more than the products they save
    return g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 && g.stride_w == 1 && g.in_channels >= 16 &&
           g.in_channels <= WINOGRAD_MAX_CHANNELS;
}

namespace {
// A dilated convolution is dilation_h·dilation_w undilated ones: the outputs whose row is ph modulo
// dilation_h and whose column is pw modulo dilation_w read only the source's rows and columns of the
// same phases. Each phase's outputs are a map of this many rows (or columns), some phases one fewer.
int64_t phase_side(int64_t out_side, int64_t dilation) { return (out_side + dilation - 1) / dilation; }
}  // namespace

bool winograd_pays(const Geometry &g, int64_t h, int64_t w) {
    return g.out_h(h) / g.dilation_h >= WINOGRAD_MIN_SIDE && g.out_w(w) / g.dilation_w >= WINOGRAD_MIN_SIDE;
}

Geometry winograd_widening(const Geometry &g, int64_t h, int64_t w) {
    // The last phase's last 2×2 block reads up to row dilation_h·(2·blocks + 2) − 1 (and so for columns).
    const int64_t blocks_h = (phase_side(g.out_h(h), g.dilation_h) + 1) / 2,
                  blocks_w = (phase_side(g.out_w(w), g.dilation_w) + 1) / 2;
    Geometry wider = g;
    wider.pad_bottom += std::max<int64_t>(0, g.dilation_h * (2 * blocks_h + 2) - (h + g.pad_top + g.pad_bottom));
    wider.pad_right += std::max<int64_t>(0, g.dilation_w * (2 * blocks_w + 2) - (w + g.pad_left + g.pad_right));
    return wider;
}

PackedWeights pack_winograd_weights(const int8_t *weights, const Geometry &g) {
    // component 4i + j of (2G)·g·(2G)^T, each packed as the weights of a 1×1 convolution (pack_weights)
    const int64_t c2 = g.padded_channels(), blocks = (g.out_channels + LANES - 1) / LANES;
    const int64_t component_size = blocks * c2 * LANES;
    PackedWeights packed(16 * component_size, 0);
    for (int64_t oc = 0; oc < g.out_channels; ++oc)
        for (int64_t ic = 0; ic < g.in_channels; ++ic) {
            const int8_t *k = weights + (oc * g.in_channels + ic) * 9;
            int t[4][3], u[4][4];
            for (int col = 0; col < 3; ++col) {
                t[0][col] = 2 * k[col];
                t[1][col] = k[col] + k[3 + col] + k[6 + col];
                t[2][col] = k[col] - k[3 + col] + k[6 + col];
                t[3][col] = 2 * k[6 + col];
            }
            for (int i = 0; i < 4; ++i) {
                u[i][0] = 2 * t[i][0];
                u[i][1] = t[i][0] + t[i][1] + t[i][2];
                u[i][2] = t[i][0] - t[i][1] + t[i][2];
                u[i][3] = 2 * t[i][2];
            }
            const int64_t at = (oc / LANES) * c2 * LANES + (ic & ~int64_t(1)) * LANES + 2 * (oc % LANES) + (ic & 1);
            for (int component = 0; component < 16; ++component)
                packed[component * component_size + at] = (int16_t)u[component / 4][component % 4];
        }
    return packed;
}

namespace {

// B^T·d·B of the 4×4 window d of 2×2 block `tile` (row-major over images and their phases, rows of
// blocks, blocks; phase_side says what a phase is) of the widened source, per channel, into
// out[component·component_stride + c]: 16 channels at a time (stride = c2 rounded up to 16; the lanes
// past c2 are computed from whatever follows, the next pixel or widen()'s slack, and never read).
__attribute__((target("avx2"))) void transform_tile(const int16_t *wide, int64_t c2, int64_t stride, int64_t hp,
                                                    int64_t wp, int64_t dh, int64_t dw, int64_t tiles_h,
                                                    int64_t tiles_w, int64_t tile, int16_t *out,
                                                    int64_t component_stride) {
    const int64_t phase = tile / (tiles_h * tiles_w), n = phase / (dh * dw), ph = phase / dw % dh, pw = phase % dw;
    const int64_t ty = tile / tiles_w % tiles_h, tx = tile % tiles_w;
    const int16_t *origin = wide + ((n * hp + ph + 2 * ty * dh) * wp + pw + 2 * tx * dw) * c2;
    for (int64_t c = 0; c < stride; c += LANES) {
        __m256i d[4][4], r[4][4];
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j)
                d[i][j] = _mm256_loadu_si256(
                    reinterpret_cast<const __m256i *>(origin + (i * dh * wp + j * dw) * c2 + c));
        for (int j = 0; j < 4; ++j) {
            r[0][j] = _mm256_sub_epi16(d[0][j], d[2][j]);
            r[1][j] = _mm256_add_epi16(d[1][j], d[2][j]);
            r[2][j] = _mm256_sub_epi16(d[2][j], d[1][j]);
            r[3][j] = _mm256_sub_epi16(d[1][j], d[3][j]);
        }
        for (int i = 0; i < 4; ++i) {
            const __m256i row[4] = {_mm256_sub_epi16(r[i][0], r[i][2]), _mm256_add_epi16(r[i][1], r[i][2]),
                                    _mm256_sub_epi16(r[i][2], r[i][1]), _mm256_sub_epi16(r[i][1], r[i][3])};
            for (int j = 0; j < 4; ++j)
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + (4 * i + j) * component_stride + c), row[j]);
        }
    }
}

// A^T·m·A of each tile's 16 components m [16][count][LANES], divided by 4: y [2 rows][2·count
// positions][LANES], its first `lanes` (8 or 16) of each. The sums wrap modulo 2^32 (vpaddd), the
// result, 4× an int32 accumulator, does not.
__attribute__((target("avx2"))) void transform_output(const int32_t (*m)[TILE * LANES], int64_t count, int64_t lanes,
                                                      int32_t (*y)[2 * TILE * LANES]) {
    for (int64_t j = 0; j < count; ++j)
        for (int64_t half = 0; half < lanes; half += 8) {
            const int64_t at = j * LANES + half;
            __m256i r[2][4];
            for (int col = 0; col < 4; ++col) {
                const __m256i m0 = _mm256_load_si256(reinterpret_cast<const __m256i *>(m[col] + at)),
                              m1 = _mm256_load_si256(reinterpret_cast<const __m256i *>(m[4 + col] + at)),
                              m2 = _mm256_load_si256(reinterpret_cast<const __m256i *>(m[8 + col] + at)),
                              m3 = _mm256_load_si256(reinterpret_cast<const __m256i *>(m[12 + col] + at));
                r[0][col] = _mm256_add_epi32(_mm256_add_epi32(m0, m1), m2);
                r[1][col] = _mm256_sub_epi32(_mm256_sub_epi32(m1, m2), m3);
            }
            for (int row = 0; row < 2; ++row) {
                const __m256i left = _mm256_add_epi32(_mm256_add_epi32(r[row][0], r[row][1]), r[row][2]);
                const __m256i right = _mm256_sub_epi32(_mm256_sub_epi32(r[row][1], r[row][2]), r[row][3]);
                _mm256_store_si256(reinterpret_cast<__m256i *>(y[row] + 2 * j * LANES + half), _mm256_srai_epi32(left, 2));
                _mm256_store_si256(reinterpret_cast<__m256i *>(y[row] + (2 * j + 1) * LANES + half),
                                   _mm256_srai_epi32(right, 2));
            }
        }
}

// The largest of each of `count` 2×2 blocks of transform_output's y, its first `lanes`: out [count][LANES], a 2×2
// max pool's windows.
__attribute__((target("avx2"))) void largest_of_blocks(const int32_t (*y)[2 * TILE * LANES], int64_t count,
                                                       int64_t lanes, int32_t *out) {
    for (int64_t j = 0; j < count; ++j)
        for (int64_t half = 0; half < lanes; half += 8) {
            __m256i largest = _mm256_load_si256(reinterpret_cast<const __m256i *>(y[0] + 2 * j * LANES + half));
            for (int k = 1; k < 4; ++k)
                largest = _mm256_max_epi32(largest, _mm256_load_si256(reinterpret_cast<const __m256i *>(
                                                        y[k / 2] + (2 * j + k % 2) * LANES + half)));
            _mm256_store_si256(reinterpret_cast<__m256i *>(out + j * LANES + half), largest);
        }
}

// Every run of outputs of one row and 16 channels (the 2×2 blocks of a group of up to TILE blocks
// that lie side by side), handed to sink as each_tile hands a convolution's tiles. The 16 products of
// a block are 16 1×1 convolutions of the transformed source, each by the tile kernel; a group takes
// TILE consecutive blocks in row-major order, across rows, so a narrow map fills the kernel's tile. With
// `pooled` (no dilation), each block's largest values instead: a 2×2 max pool's output, [out_h / 2, out_w / 2].
template <typename Sink>
void each_winograd_tile(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h,
                        int64_t w, int threads, const Sink &sink, bool pooled = false) {
    const Geometry wg = winograd_widening(g, h, w);
    const int64_t c2 = g.padded_channels(), hp = h + wg.pad_top + wg.pad_bottom, wp = w + wg.pad_left + wg.pad_right;
    const int64_t dh = g.dilation_h, dw = g.dilation_w, out_h = g.out_h(h), out_w = g.out_w(w);
    const int64_t tiles_h = (phase_side(out_h, dh) + 1) / 2, tiles_w = (phase_side(out_w, dw) + 1) / 2;
    const int64_t tiles = images * dh * dw * tiles_h * tiles_w, stride = (c2 + LANES - 1) / LANES * LANES;
    const int64_t blocks = (g.out_channels + LANES - 1) / LANES, component_size = blocks * c2 * LANES;
    const int64_t groups = (tiles + TILE - 1) / TILE;
    const Walk walk{1, 0, 1, 0, c2 / 2};
    const int64_t work = 16 * tiles * g.out_channels * c2;
    // One group of blocks against one block of 16 channels, from the group's transformed source v
    // [16][TILE][stride] (or [16][tiles][stride] from `first` on, its component_stride says which).
    auto multiply = [&](const int16_t *v, int64_t component_stride, int64_t group, int64_t b) {
        const int64_t first = group * TILE, count = std::min<int64_t>(TILE, tiles - first);
        // a last block of at most 8 channels (24 = 16 + 8) takes half tiles: a quarter fewer products there
        const int64_t valid = std::min(LANES, g.out_channels - b * LANES), lanes = valid <= LANES / 2 ? LANES / 2 : LANES;
        alignas(32) int32_t m[16][TILE * LANES];
        for (int64_t component = 0; component < 16; ++component) {
            const int16_t *starts[TILE];
            for (int64_t j = 0; j < count; ++j) starts[j] = v + component * component_stride + j * stride;
            (lanes == LANES ? TILES<> : HALF_TILES<>)[count](starts, packed + component * component_size + b * c2 * LANES,
                                                            walk, m[component]);
        }
        alignas(32) int32_t y[2][2 * TILE * LANES];
        transform_output(m, count, lanes, y);
        if (pooled) {
            alignas(32) int32_t largest[TILE * LANES];
            largest_of_blocks(y, count, lanes, largest);
            // a last row or column of blocks half outside the output: dropped, as the pool drops it
            const int64_t rows = out_h / 2, columns = out_w / 2;
            for (int64_t j = 0, run; j < count; j += run) {
                const int64_t tile = first + j, tx = tile % tiles_w, row_of_tiles = tile / tiles_w;
                run = std::min(count - j, tiles_w - tx);
                const int64_t n = row_of_tiles / tiles_h, ty = row_of_tiles % tiles_h;
                if (ty < rows && tx < columns)
                    sink(largest + j * LANES, (n * rows + ty) * columns + tx, std::min(run, columns - tx), 1, b * LANES,
                         valid);
            }
            return;
        }
        for (int64_t j = 0, run; j < count; j += run) {  // the blocks of one row of blocks, side by side
            const int64_t tile = first + j, tx = tile % tiles_w, row_of_tiles = tile / tiles_w;
            run = std::min(count - j, tiles_w - tx);
            const int64_t phase = row_of_tiles / tiles_h, ty = row_of_tiles % tiles_h;
            const int64_t n = phase / (dh * dw), ph = phase / dw % dh, pw = phase % dw;
            // the phase's columns x0, x0 + 1, … are the output's pw + dw·x0, pw + dw·(x0 + 1), …
            const int64_t x0 = 2 * tx, valid_x = std::min(2 * run, phase_side(out_w - pw, dw) - x0);
            for (int64_t row = 0; row < 2 && ph + dh * (2 * ty + row) < out_h && valid_x > 0; ++row)
                sink(y[row] + 2 * j * LANES, (n * out_h + ph + dh * (2 * ty + row)) * out_w + pw + dw * x0, valid_x,
                     dw, b * LANES, valid);
        }
    };
    if (blocks * LANES < tiles) {
        // Many positions, few channels: the source is transformed where it is used, a few groups at a
        // time into a buffer that stays in cache while every block of channels reads it (the whole
        // transformed source of a 56×56 map is 16× the map's, past L2); a block's weights then serve
        // each group of the few.
        const int64_t group_bytes = 16 * TILE * stride * sizeof(int16_t);
        const int64_t few = std::max<int64_t>(1, std::min<int64_t>(FEW_GROUPS_BYTES / group_bytes, groups / (4 * threads)));
        const int64_t runs = (groups + few - 1) / few;
        lpt_parallel::run(work >= 16 * PARALLEL_WORK ? threads : 1, runs, 1, [&](lpt_parallel::Chunks &chunks) {
            for (int64_t r; chunks.next(r);) {
                thread_local PackedWeights source;  // each thread's own (a PackedWeights for its 64-byte lines)
                source.resize(few * 16 * TILE * stride);
                const int64_t first_group = r * few, last_group = std::min(groups, first_group + few);
                for (int64_t tile = first_group * TILE; tile < std::min(tiles, last_group * TILE); ++tile) {
                    const int64_t group = tile / TILE - first_group, j = tile % TILE;
                    transform_tile(wide, c2, stride, hp, wp, dh, dw, tiles_h, tiles_w, tile,
                                   source.data() + (group * 16 * TILE + j) * stride, TILE * stride);
                }
                for (int64_t b = 0; b < blocks; ++b)
                    for (int64_t group = first_group; group < last_group; ++group)
                        multiply(source.data() + (group - first_group) * 16 * TILE * stride, TILE * stride, group, b);
            }
        });
        return;
    }
    // Many channels, few positions: the transformed source is small; each thread takes blocks of
    // channels and reads each block's weights once, across every group.
    thread_local std::vector<int16_t> transformed;  // the calling thread's, reused by every layer it runs
    transformed.resize(16 * tiles * stride);
    int16_t *v = transformed.data();  // read by the loop's threads, each of which has its own thread_local
    lpt_parallel::for_each(16 * tiles * stride >= PARALLEL_WORK ? threads : 1, tiles, [=](int64_t tile) {
        transform_tile(wide, c2, stride, hp, wp, dh, dw, tiles_h, tiles_w, tile, v + tile * stride, tiles * stride);
    });
    lpt_parallel::for_each(work >= 16 * PARALLEL_WORK ? threads : 1, blocks * groups, [=](int64_t task) {
        const int64_t b = task / groups, group = task % groups;
        multiply(v + group * TILE * stride, tiles * stride, group, b);
    });
    if (transformed.size() * sizeof(int16_t) > KEEP_TRANSFORMED_BYTES) std::vector<int16_t>().swap(transformed);
}

}  // namespace

PackedWeights pack_depthwise_weights(const int8_t *weights, const Geometry &g) {
    const int64_t blocks = (g.out_channels + LANES - 1) / LANES, kp = (g.kernel_w + 1) / 2;
    PackedWeights packed(blocks * g.kernel_h * kp * 2 * LANES, 0);
    for (int64_t c = 0; c < g.out_channels; ++c)
        for (int64_t ky = 0; ky < g.kernel_h; ++ky)
            for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
                // as pair_block_row lays out a channel's pairs: channels 0-7 then 8-15 of the block, two taps each
                const int64_t lane = c % LANES, slot = lane / 8 * LANES + lane % 8 * 2 + kx % 2;
                packed[(((c / LANES) * g.kernel_h + ky) * kp + kx / 2) * 2 * LANES + slot] =
                    weights[(c * g.kernel_h + ky) * g.kernel_w + kx];
            }
    return packed;
}

namespace {

// Rows of fewer channels than a register's sixteen lanes, one right after the other, as rows of sixteen values,
// each lane's per-channel constants its channel's; returns how many of the rows it staged (0 where they do not
// fit). A head of few outputs took a register a row: PaddleOCR's detector's last upsampling gives four values a
// pixel, whose Sigmoid stage used a fourth of each register (then half: an eight-lane half). Each value goes
// through the same operations with the same constants, so its bits are the same.
template <typename T>
int64_t stage_packed_rows(const Epilogue &e, const int32_t *acc, int64_t rows, int64_t channels, T *out) {
    if (channels >= LANES || LANES % channels || rows * channels < LANES || e.addend) return 0;
    alignas(64) float constants[5][LANES];
    const auto tiled = [&](const float *values, float *into) -> const float * {
        if (!values) return nullptr;
        for (int64_t i = 0; i < LANES; ++i) into[i] = values[i % channels];
        return into;
    };
    Epilogue packed = e;
    packed.multiplier = tiled(e.multiplier, constants[0]);
    packed.bias = tiled(e.bias, constants[1]);
    packed.levels.multiplier = tiled(e.levels.multiplier, constants[2]);
    packed.levels.bias = tiled(e.levels.bias, constants[3]);
    packed.levels.lane_bound = tiled(e.levels.lane_bound, constants[4]);
    const int64_t registers = rows * channels / LANES;
    stage(packed, acc, LANES, registers, 0, LANES, out, LANES);
    return registers * LANES / channels;
}

template <typename T>
void stage_rows_typed(const Epilogue &e, const int32_t *hi, const int32_t *lo, int64_t rows, int64_t first_channel,
                      int64_t channels, int64_t acc_stride, T *out, int64_t out_stride) {
    if (!lo && first_channel == 0 && acc_stride == channels && out_stride == channels) {
        const int64_t staged = stage_packed_rows(e, hi, rows, channels, out);
        hi += staged * channels, out += staged * channels, rows -= staged;
    }
    alignas(32) int32_t acc[LANES];
    for (int64_t c0 = 0; c0 < channels; c0 += LANES) {
        const int64_t valid = std::min(LANES, channels - c0);
        // Straight from the accumulators, a block of channels down all rows at once; a block narrower
        // than a tile reads past its row into the next, computed and never stored, except in the last row
        // (past the buffer's end), which goes through `acc` as the split route's rows do.
        const int64_t direct = lo ? 0 : valid == LANES ? rows : rows - 1;
        if (direct > 0) stage(e, hi + c0, acc_stride, direct, first_channel + c0, valid, out + c0, out_stride);
        for (int64_t r = direct; r < rows; ++r) {
            const int32_t *h = hi + r * acc_stride + c0;
            if (lo)
                for (int64_t c = 0; c < valid; ++c) acc[c] = (int32_t)((uint32_t)h[c] * 64u + (uint32_t)lo[r * acc_stride + c0 + c]);
            else
                std::memcpy(acc, h, valid * sizeof(int32_t));
            std::fill(acc + valid, acc + LANES, 0);  // lanes past the row: computed, never stored
            stage(e, acc, LANES, 1, first_channel + c0, valid, out + r * out_stride + c0, 0);
        }
    }
}

template <typename T>
void stage_columns_as(const Epilogue &e, const int32_t *hi, const int32_t *lo, int64_t rows, int64_t first_channel,
                      int64_t channels, int64_t acc_stride, void *out, int64_t out_stride) {
    stage_rows_typed(e, hi, lo, rows, first_channel, channels, acc_stride, static_cast<T *>(out) + first_channel,
                     out_stride);
}

}  // namespace

void stage_rows(const Epilogue &e, const int32_t *hi, const int32_t *lo, int64_t rows, int64_t channels, void *out) {
    stage_columns(e, hi, lo, rows, 0, channels, channels, out, channels);
}

void stage_columns(const Epilogue &e, const int32_t *hi, const int32_t *lo, int64_t rows, int64_t first_channel,
                   int64_t channels, int64_t acc_stride, void *out, int64_t out_stride) {
    switch (e.type) {
        case Epilogue::f32: stage_columns_as<float>(e, hi, lo, rows, first_channel, channels, acc_stride, out, out_stride); break;
        case Epilogue::u8: stage_columns_as<uint8_t>(e, hi, lo, rows, first_channel, channels, acc_stride, out, out_stride); break;
        case Epilogue::s8: stage_columns_as<int8_t>(e, hi, lo, rows, first_channel, channels, acc_stride, out, out_stride); break;
    }
}

namespace {
template <typename T>
__attribute__((target("avx2"))) void quantize_values_typed(const float *x, int64_t n, const Quantizer &q, T *out) {
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) store_quantized(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i + 8), q, LANES, out + i);
    if (i < n) {
        alignas(32) float rest[LANES] = {};
        std::memcpy(rest, x + i, (n - i) * sizeof(float));
        store_quantized(_mm256_load_ps(rest), _mm256_load_ps(rest + 8), q, n - i, out + i);
    }
}

// quantize_values_typed's levels, sixteen lanes per register.
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void quantize_values_512(const float *x, int64_t n,
                                                                               const Quantizer512 &given, T *out) {
    const Quantizer512 q = given;  // in registers: a store through `out` could alias `given`
    for (int64_t i = 0; i < n; i += LANES) {
        const __mmask16 lanes = n - i >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512i levels = levels_512(load_16(x + i, lanes), q);
        const __m128i bytes = std::is_same_v<T, uint8_t> ? _mm512_cvtusepi32_epi8(levels) : _mm512_cvtsepi32_epi8(levels);
        store_bytes_16(out + i, lanes, bytes);
    }
}
}  // namespace

__attribute__((target("avx2"))) void quantize_values(const float *x, int64_t n, float scale, int zero_point, int qmin,
                                                     int qmax, bool signed_out, void *out) {
    if (sixteen_lanes()) {
        const Quantizer512 q = quantizer_512(scale, zero_point, qmin, qmax);
        if (signed_out)
            quantize_values_512(x, n, q, static_cast<int8_t *>(out));
        else
            quantize_values_512(x, n, q, static_cast<uint8_t *>(out));
        return;
    }
    const Quantizer q = quantizer(scale, zero_point, qmin, qmax);
    if (signed_out)
        quantize_values_typed(x, n, q, static_cast<int8_t *>(out));
    else
        quantize_values_typed(x, n, q, static_cast<uint8_t *>(out));
}

__attribute__((target("avx2"))) void extend_range(const float *x, int64_t n, float &low, float &high) {
    // vminps(a, b) is a < b ? a : b, and vmaxps(a, b) a > b ? a : b: b where a is NaN, as the scalar
    // compare keeps the range where x is NaN; four registers each, so that the compares overlap
    __m256 lows[4], highs[4];
    for (int k = 0; k < 4; ++k) lows[k] = _mm256_set1_ps(low), highs[k] = _mm256_set1_ps(high);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k) {
            const __m256 v = _mm256_loadu_ps(x + i + 8 * k);
            lows[k] = _mm256_min_ps(v, lows[k]);
            highs[k] = _mm256_max_ps(v, highs[k]);
        }
    alignas(32) float values[8];
    for (int k = 0; k < 4; ++k) {
        _mm256_store_ps(values, lows[k]);
        for (float v : values) low = v < low ? v : low;
        _mm256_store_ps(values, highs[k]);
        for (float v : values) high = v > high ? v : high;
    }
    for (; i < n; ++i) {
        low = x[i] < low ? x[i] : low;
        high = x[i] > high ? x[i] : high;
    }
}

__attribute__((target("avx2"))) void interleave_three_planes(const uint8_t *planes, int64_t plane_stride,
                                                              int64_t count, uint8_t flip, uint8_t *out) {
    // select[k][c]: for output byte j of the k-th sixteen, the position 16k + j holds channel (16k + j) % 3
    // of position (16k + j) / 3: that byte of plane c, or zero (0x80) where it is another plane's
    static const auto select = [] {
        std::array<std::array<std::array<int8_t, 16>, 3>, 3> table{};
        for (int k = 0; k < 3; ++k)
            for (int j = 0; j < 16; ++j)
                for (int c = 0; c < 3; ++c)
                    table[k][c][j] = (16 * k + j) % 3 == c ? (int8_t)((16 * k + j) / 3) : (int8_t)0x80;
        return table;
    }();
    const __m128i flips = _mm_set1_epi8((char)flip);
    int64_t p = 0;
    for (; p + 16 <= count; p += 16) {
        __m128i plane[3];
        for (int c = 0; c < 3; ++c)
            plane[c] = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i *>(planes + c * plane_stride + p)), flips);
        for (int k = 0; k < 3; ++k) {
            __m128i bytes = _mm_setzero_si128();
            for (int c = 0; c < 3; ++c)
                bytes = _mm_or_si128(bytes, _mm_shuffle_epi8(plane[c], _mm_loadu_si128(reinterpret_cast<const __m128i *>(select[k][c].data()))));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(out + 3 * p + 16 * k), bytes);
        }
    }
    for (; p < count; ++p)
        for (int c = 0; c < 3; ++c) out[3 * p + c] = planes[c * plane_stride + p] ^ flip;
}

__attribute__((target("avx2"))) void pack_product_operand(const uint8_t *b, bool b_signed, int zero_point, int64_t k,
                                                           int64_t n, int16_t *packed) {
    const int64_t columns = product_columns(n), pairs = (k + 1) / 2;
    std::fill(packed, packed + pairs * columns * 2, (int16_t)0);
    for (int64_t j = 0; j < k; ++j)
        for (int64_t c = 0; c < n; ++c) {
            const int value = b_signed ? (int)(int8_t)b[j * n + c] : (int)b[j * n + c];
            packed[((j / 2) * columns + c) * 2 + (j & 1)] = (int16_t)(value - zero_point);
        }
}

__attribute__((target("avx2"))) void product_row(const int16_t *a_pairs, const int16_t *packed, int64_t k, int64_t n,
                                                  int32_t *row) {
    const int64_t columns = product_columns(n), pairs = (k + 1) / 2;
    int64_t c0 = 0;
    for (; c0 + 32 <= columns; c0 += 32) {  // four vectors of eight columns in registers
        __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int64_t p = 0; p < pairs; ++p) {
            int32_t pair;
            std::memcpy(&pair, a_pairs + 2 * p, sizeof pair);
            const __m256i a = _mm256_set1_epi32(pair);
            const __m256i *b = reinterpret_cast<const __m256i *>(packed + (p * columns + c0) * 2);
            acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(a, _mm256_loadu_si256(b)));
            acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(a, _mm256_loadu_si256(b + 1)));
            acc2 = _mm256_add_epi32(acc2, _mm256_madd_epi16(a, _mm256_loadu_si256(b + 2)));
            acc3 = _mm256_add_epi32(acc3, _mm256_madd_epi16(a, _mm256_loadu_si256(b + 3)));
        }
        __m256i *out = reinterpret_cast<__m256i *>(row + c0);
        _mm256_storeu_si256(out, acc0);
        _mm256_storeu_si256(out + 1, acc1);
        _mm256_storeu_si256(out + 2, acc2);
        _mm256_storeu_si256(out + 3, acc3);
    }
    for (; c0 < columns; c0 += 8) {
        __m256i acc = _mm256_setzero_si256();
        for (int64_t p = 0; p < pairs; ++p) {
            int32_t pair;
            std::memcpy(&pair, a_pairs + 2 * p, sizeof pair);
            const __m256i *b = reinterpret_cast<const __m256i *>(packed + (p * columns + c0) * 2);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_set1_epi32(pair), _mm256_loadu_si256(b)));
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(row + c0), acc);
    }
}

namespace {

// Accumulators [images, positions, OC] from a walk over tiles (each_tile, each_depthwise_tile).
template <typename Walk>
void write_accumulators(const Walk &walk, const Geometry &g, int32_t *acc) {
    const int64_t oc = g.out_channels;
    walk([&](const int32_t *tile_acc, int64_t position, int64_t count, int64_t step, int64_t c0, int64_t valid) {
        for (int64_t j = 0; j < count; ++j)
            std::memcpy(acc + (position + j * step) * oc + c0, tile_acc + j * LANES, valid * sizeof(int32_t));
    });
}

// The output stage of each tile of the walk, into out [images, positions, OC] of the epilogue's type.
template <typename Walk>
void write_staged(const Walk &walk, const Geometry &g, const Epilogue &e, void *out) {
    const int64_t oc = g.out_channels;
    auto staged = [&](auto *typed) {
        walk([&](const int32_t *tile_acc, int64_t position, int64_t count, int64_t step, int64_t c0, int64_t valid) {
            stage(e, tile_acc, LANES, count, c0, valid, typed + position * oc + c0, step * oc,
                  e.addend ? e.addend + position * oc + c0 : nullptr);
        });
    };
    switch (e.type) {
        case Epilogue::f32: staged(static_cast<float *>(out)); break;
        case Epilogue::u8: staged(static_cast<uint8_t *>(out)); break;
        case Epilogue::s8: staged(static_cast<int8_t *>(out)); break;
    }
}

}  // namespace

template <typename W>
void convolve(const int16_t *wide, const W *packed, const Geometry &g, int64_t images, int64_t h, int64_t w,
              int32_t *acc, int threads) {
    write_accumulators([&](const auto &sink) { each_tile(wide, packed, g, images, h, w, threads, sink); }, g, acc);
}

template <typename W>
void convolve_staged(const int16_t *wide, const W *packed, const Geometry &g, int64_t images, int64_t h,
                     int64_t w, const Epilogue &e, void *out, int threads) {
    write_staged([&](const auto &sink) { each_tile(wide, packed, g, images, h, w, threads, sink); }, g, e, out);
}

void convolve_pooled_staged(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h,
                            int64_t w, int64_t pool_h, int64_t pool_w, const Epilogue &e, void *out, int threads) {
    write_staged([&](const auto &sink) {
        each_pooled_tile(wide, packed, g, images, h, w, pool_h, pool_w, threads, sink);
    }, g, e, out);
}

void winograd_pooled_staged(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h,
                            int64_t w, const Epilogue &e, void *out, int threads) {
    write_staged([&](const auto &sink) { each_winograd_tile(wide, packed, g, images, h, w, threads, sink, true); }, g,
                 e, out);
}

bool stage_keeps_order(const Epilogue &e, int64_t channels) {
    if (e.type == Epilogue::f32 || !(e.scale > 0.0f) || e.addend) return false;
    if (!(e.post_op_count == 0 || (e.post_op_count == 1 && e.post_ops[0] == SLOPE_CLIP && e.post_ops[1] >= 0.0f)))
        return false;
    return std::all_of(e.multiplier, e.multiplier + channels, [](float m) { return m >= 0.0f; });
}

template void convolve(const int16_t *, const int16_t *, const Geometry &, int64_t, int64_t, int64_t, int32_t *, int);
template void convolve(const int16_t *, const int8_t *, const Geometry &, int64_t, int64_t, int64_t, int32_t *, int);
template void convolve_staged(const int16_t *, const int16_t *, const Geometry &, int64_t, int64_t, int64_t,
                              const Epilogue &, void *, int);
template void convolve_staged(const int16_t *, const int8_t *, const Geometry &, int64_t, int64_t, int64_t,
                              const Epilogue &, void *, int);

void convolve_bytes(const uint8_t *padded, const Outside &outside, const ByteWeights &b, int zero_point,
                    bool signed_src, const Geometry &g, int64_t images, int64_t h, int64_t w, int32_t *acc, int threads) {
    write_accumulators([&](const auto &sink) {
        each_byte_tile(padded, outside, b, zero_point, signed_src, g, images, h, w, threads, sink);
    }, g, acc);
}

void convolve_bytes_staged(const uint8_t *padded, const Outside &outside, const ByteWeights &b, int zero_point,
                           bool signed_src, const Geometry &g, int64_t images, int64_t h, int64_t w, const Epilogue &e,
                           void *out, int threads) {
    write_staged([&](const auto &sink) {
        each_byte_tile(padded, outside, b, zero_point, signed_src, g, images, h, w, threads, sink);
    }, g, e, out);
}

NarrowWeights narrow_weights(const PackedWeights &packed) {
    return NarrowWeights(packed.begin(), packed.end());  // int8 weights, packed as int16: every value fits
}

void depthwise(const uint8_t *src, bool signed_src, bool channels_last, int zero_point, const int16_t *packed,
               const Geometry &g, int64_t images, int64_t h, int64_t w, int32_t *acc, int threads) {
    write_accumulators([&](const auto &sink) {
        each_depthwise_tile(src, signed_src, channels_last, zero_point, packed, g, images, h, w, threads, sink);
    }, g, acc);
}

void winograd(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h, int64_t w,
              int32_t *acc, int threads) {
    write_accumulators([&](const auto &sink) { each_winograd_tile(wide, packed, g, images, h, w, threads, sink); },
                       g, acc);
}

void winograd_staged(const int16_t *wide, const int16_t *packed, const Geometry &g, int64_t images, int64_t h,
                     int64_t w, const Epilogue &e, void *out, int threads) {
    write_staged([&](const auto &sink) { each_winograd_tile(wide, packed, g, images, h, w, threads, sink); }, g, e,
                 out);
}

void depthwise_staged(const uint8_t *src, bool signed_src, bool channels_last, int zero_point, const int16_t *packed,
                      const Geometry &g, int64_t images, int64_t h, int64_t w, const Epilogue &e, void *out,
                      int threads) {
    write_staged([&](const auto &sink) {
        each_depthwise_tile(src, signed_src, channels_last, zero_point, packed, g, images, h, w, threads, sink);
    }, g, e, out);
}

}  // namespace lpt_s16
