// lpt/native/integer_ops.h. Built with -ffp-contract=off and without -ffast-math, as _engine.cpp,
// so each float32 operation rounds once, as numpy's do.

#include "integer_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <immintrin.h>
#include <limits>
#include <type_traits>
#include <vector>

#include "float_ops.h"
#include "parallel.h"
#include "s16.h"

namespace lpt_ops {
namespace {

constexpr int64_t PARALLEL_WORK = 1 << 16;  // values below which a loop runs on one thread
constexpr int64_t BLOCK = 4096;

// rint for |y| ≤ 2^22: the float32 add rounds half to even (lpt/kernels/_elementwise.c).
inline float round_half_even(float y) { return (y + 12582912.0f) - 12582912.0f; }

// x = saturate(rint(x / scale) + zp) in place: fmax, fmin (a NaN gives the bound), rint, + zp.
inline void quantize_block(float *x, int64_t n, float scale, int zero_point, int qmin, int qmax) {
    const float zp = (float)zero_point, low = (float)(qmin - zero_point), high = (float)(qmax - zero_point);
    for (int64_t i = 0; i < n; ++i) {
        float y = x[i] / scale;
        y = y >= low ? y : low;
        y = y <= high ? y : high;
        x[i] = round_half_even(y) + zp;
    }
}

inline void store_block(const float *levels, int64_t n, void *out, bool signed_out) {
    if (signed_out)
        for (int64_t i = 0; i < n; ++i) static_cast<int8_t *>(out)[i] = (int8_t)(int)levels[i];
    else
        for (int64_t i = 0; i < n; ++i) static_cast<uint8_t *>(out)[i] = (uint8_t)(int)levels[i];
}

inline void load_block(const void *q, bool is_signed, int64_t n, float *x) {
    if (is_signed)
        for (int64_t i = 0; i < n; ++i) x[i] = (float)static_cast<const int8_t *>(q)[i];
    else
        for (int64_t i = 0; i < n; ++i) x[i] = (float)static_cast<const uint8_t *>(q)[i];
}

// The larger of the running maximum and a value: of equal ones the running one; for floats a NaN wins
// and the first NaN stays (numpy's maximum, folded over the taps in order).
template <typename T>
inline T larger(T best, T v) {
    if constexpr (std::is_floating_point_v<T>) return best != best || !(v > best || v != v) ? best : v;
    else return std::max(best, v);
}

// The padding's value: it can tie, never win.
template <typename T>
constexpr T lowest() {
    return std::is_floating_point_v<T> ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::min();
}

template <typename T>
void max_pool_typed(const T *src, int64_t planes, int64_t h, int64_t w, const Pool &p, T *out, int threads) {
    const int64_t oh = p.out_h(h), ow = p.out_w(w);
    lpt_parallel::for_each(planes * oh * ow * p.kernel_h * p.kernel_w >= PARALLEL_WORK ? threads : 1,
                           planes, [=](int64_t plane) {
        const T *in = src + plane * h * w;
        T *o = out + plane * oh * ow;
        for (int64_t y = 0; y < oh; ++y)
            for (int64_t x = 0; x < ow; ++x) {
                T best = lowest<T>();
                for (int64_t ky = 0; ky < p.kernel_h; ++ky) {
                    const int64_t iy = y * p.stride_h + ky * p.dilation_h - p.pad_top;
                    if (iy < 0 || iy >= h) continue;
                    for (int64_t kx = 0; kx < p.kernel_w; ++kx) {
                        const int64_t ix = x * p.stride_w + kx * p.dilation_w - p.pad_left;
                        if (ix >= 0 && ix < w) best = larger(best, in[iy * w + ix]);
                    }
                }
                o[y * ow + x] = best;
            }
    });
}

// BYTES bytes of T as one GCC vector, whose operators take every lane at once: registers of 16 bytes in a
// plain build, 32 in an AVX2 one.
template <typename T, int BYTES>
struct Lanes {
    typedef T type __attribute__((vector_size(BYTES)));
};

// best = larger(best, v) lane by lane. By reference: a 32-byte vector passed by value outside an AVX
// build changes the ABI (GCC warns).
template <typename T, typename V>
__attribute__((always_inline)) inline void raise_lanes(V &best, const V &v) {
    if constexpr (std::is_floating_point_v<T>) best = (best == best) & ((v > best) | (v != v)) ? v : best;
    else best = v > best ? v : best;
}

// K vectors of channels from c on of one output position: the maximum over its taps (rows × columns
// of them from `in`, its first; COLUMNS across if not 0), each kept in a register across the taps and
// stored once. It starts from the first tap's values: larger() of the padding's value and a value is
// that value, bit for bit.
template <typename T, int BYTES, int COLUMNS, int K>
__attribute__((always_inline)) inline void pool_lanes(const T *in, int64_t rows, int64_t columns, int64_t row_step,
                                                      int64_t column_step, int64_t c, T *o) {
    using V = typename Lanes<T, BYTES>::type;
    constexpr int64_t L = BYTES / sizeof(T);
    V best[K];
    for (int k = 0; k < K; ++k) std::memcpy(&best[k], in + c + k * L, BYTES);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t q = 0; q < (COLUMNS ? COLUMNS : columns); ++q) {
            const T *at = in + r * row_step + q * column_step + c;
            for (int k = 0; k < K; ++k) {
                V v;
                std::memcpy(&v, at + k * L, BYTES);
                raise_lanes<T>(best[k], v);
            }
        }
    for (int k = 0; k < K; ++k) std::memcpy(o + c + k * L, &best[k], BYTES);
}

// All channels of one output position. A last part narrower than a vector takes the vector that ends at
// the last channel again (the same maxima written twice), so nothing is read or written past the
// position; fewer channels than a vector holds take vectors half as wide, down to 8 bytes, then one by one.
template <typename T, int BYTES, int COLUMNS>
__attribute__((always_inline)) inline void pool_position(const T *in, int64_t rows, int64_t columns, int64_t row_step,
                                                         int64_t column_step, int64_t channels, T *o) {
    constexpr int64_t L = BYTES / sizeof(T);
    if (channels < L) {
        if constexpr (BYTES > 8) {
            pool_position<T, BYTES / 2, COLUMNS>(in, rows, columns, row_step, column_step, channels, o);
        } else {
            for (int64_t c = 0; c < channels; ++c) {
                T best = in[c];
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t q = 0; q < (COLUMNS ? COLUMNS : columns); ++q)
                        best = larger(best, in[r * row_step + q * column_step + c]);
                o[c] = best;
            }
        }
        return;
    }
    int64_t c = 0;
    for (; c + 2 * L <= channels; c += 2 * L)
        pool_lanes<T, BYTES, COLUMNS, 2>(in, rows, columns, row_step, column_step, c, o);
    if (c + L <= channels) {
        pool_lanes<T, BYTES, COLUMNS, 1>(in, rows, columns, row_step, column_step, c, o);
        c += L;
    }
    if (c < channels) pool_lanes<T, BYTES, COLUMNS, 1>(in, rows, columns, row_step, column_step, channels - L, o);
}

// `count` output positions `step` apart in the source whose taps all fall inside the row.
template <typename T, int BYTES, int COLUMNS>
__attribute__((always_inline)) inline void pool_positions(const T *in, int64_t count, int64_t step, int64_t rows,
                                                          int64_t columns, int64_t row_step, int64_t column_step,
                                                          int64_t channels, T *o) {
    for (int64_t i = 0; i < count; ++i)
        pool_position<T, BYTES, COLUMNS>(in + i * step, rows, columns, row_step, column_step, channels, o + i * channels);
}

// One output row of a channels-last max pool (max_pool_channels_last_typed), inlined into a plain and an
// AVX2 build of itself (pool_row): the maxima of 32 bytes per instruction instead of 16. ResNet-18's 3×3
// pool of stride 2, 64 channels over 112×112: 0.069 → 0.049 ms (2 threads, a Xeon).
template <typename T, int BYTES>
__attribute__((always_inline)) inline void pool_row_body(const T *src, int64_t row, int64_t channels, int64_t h,
                                                         int64_t w, const Pool &p, T *out) {
    const int64_t oh = p.out_h(h), ow = p.out_w(w);
    const int64_t n = row / oh, y = row % oh;
    if (p.stride_w == 1) {
        // A tap's values for the whole output row are one run of the source row (the positions
        // where it falls inside), so the row is the maximum of runs of bytes, taken with vectors.
        // PaddleOCR's detector's 2×2 pool of 24 channels over 320×320: 2.2 ms position by position.
        T *o = out + (n * oh + y) * ow * channels;
        std::fill(o, o + ow * channels, lowest<T>());
        for (int64_t ky = 0; ky < p.kernel_h; ++ky) {
            const int64_t iy = y * p.stride_h + ky * p.dilation_h - p.pad_top;
            if (iy < 0 || iy >= h) continue;
            for (int64_t kx = 0; kx < p.kernel_w; ++kx) {
                const int64_t shift = kx * p.dilation_w - p.pad_left;  // ix = x + shift
                const int64_t first = std::max<int64_t>(0, -shift), end = std::min(ow, w - shift);
                if (first >= end) continue;
                const T *in = src + ((n * h + iy) * w + first + shift) * channels;
                T *to = o + first * channels;
                for (int64_t i = 0; i < (end - first) * channels; ++i) to[i] = larger(to[i], in[i]);
            }
        }
        return;
    }
    // Position by position, the taps inside the map a rectangle of them (its rows the same for the whole
    // output row), each position's maxima in registers, stored once; first the positions whose taps
    // across all fall inside, 2 or 3 of them unrolled. dnsmos_p808's 2×2 pool of stride 2, 32 channels
    // over 900×120 (u8), which filled each position, then took a loop over its channels per tap: 0.39 →
    // 0.12 ms, ResNet-18's 3×3 one 0.096 → 0.025 (2 threads, a Zen 3; 1 thread 0.43 → 0.12, 0.118 → 0.028).
    int64_t ky0 = 0, ky1 = p.kernel_h;
    const int64_t iy0 = y * p.stride_h - p.pad_top;
    while (ky0 < ky1 && iy0 + ky0 * p.dilation_h < 0) ++ky0;
    while (ky1 > ky0 && iy0 + (ky1 - 1) * p.dilation_h >= h) --ky1;
    T *o = out + (n * oh + y) * ow * channels;
    if (ky0 == ky1) {  // all padding
        std::fill(o, o + ow * channels, lowest<T>());
        return;
    }
    const int64_t rows = ky1 - ky0, row_step = p.dilation_h * w * channels, column_step = p.dilation_w * channels;
    const int64_t step = p.stride_w * channels;
    const T *in = src + ((n * h + iy0 + ky0 * p.dilation_h) * w) * channels;
    int64_t xa = 0, xb = ow;  // [xa, xb): all taps across inside
    while (xa < ow && xa * p.stride_w - p.pad_left < 0) ++xa;
    while (xb > xa && (xb - 1) * p.stride_w - p.pad_left + (p.kernel_w - 1) * p.dilation_w >= w) --xb;
    if (xa < xb) {
        const T *inside = in + (xa * p.stride_w - p.pad_left) * channels;
        T *to = o + xa * channels;
        if (p.kernel_w == 2)
            pool_positions<T, BYTES, 2>(inside, xb - xa, step, rows, 2, row_step, column_step, channels, to);
        else if (p.kernel_w == 3)
            pool_positions<T, BYTES, 3>(inside, xb - xa, step, rows, 3, row_step, column_step, channels, to);
        else
            pool_positions<T, BYTES, 0>(inside, xb - xa, step, rows, p.kernel_w, row_step, column_step, channels, to);
    }
    for (int64_t x = 0; x < ow; ++x) {  // those at the edges
        if (x == xa) x = xb;
        if (x == ow) break;
        int64_t kx0 = 0, kx1 = p.kernel_w;
        const int64_t ix0 = x * p.stride_w - p.pad_left;
        while (kx0 < kx1 && ix0 + kx0 * p.dilation_w < 0) ++kx0;
        while (kx1 > kx0 && ix0 + (kx1 - 1) * p.dilation_w >= w) --kx1;
        if (kx0 == kx1) std::fill(o + x * channels, o + (x + 1) * channels, lowest<T>());
        else
            pool_position<T, BYTES, 0>(in + (ix0 + kx0 * p.dilation_w) * channels, rows, kx1 - kx0, row_step,
                                       column_step, channels, o + x * channels);
    }
}

template <typename T>
void pool_row(const T *src, int64_t row, int64_t channels, int64_t h, int64_t w, const Pool &p, T *out) {
    pool_row_body<T, 16>(src, row, channels, h, w, p, out);
}

template <typename T>
__attribute__((target("avx2"))) void pool_row_avx2(const T *src, int64_t row, int64_t channels, int64_t h, int64_t w,
                                                   const Pool &p, T *out) {
    pool_row_body<T, 32>(src, row, channels, h, w, p, out);
}

template <typename T>
void max_pool_channels_last_typed(const T *src, int64_t images, int64_t channels, int64_t h, int64_t w, const Pool &p,
                                  T *out, int threads) {
    const int64_t oh = p.out_h(h), ow = p.out_w(w);
    const auto one_row = __builtin_cpu_supports("avx2") ? pool_row_avx2<T> : pool_row<T>;
    lpt_parallel::for_each(images * oh * ow * channels * p.kernel_h * p.kernel_w >= PARALLEL_WORK ? threads : 1,
                           images * oh, [=](int64_t row) { one_row(src, row, channels, h, w, p, out); });
}

// An 8×8 block of 4-byte values through AVX2 registers: rows of `in` become rows of `out`'s columns.
__attribute__((target("avx2"))) inline void transpose_8x8(const uint32_t *in, int64_t in_stride, uint32_t *out,
                                                         int64_t out_stride) {
    __m256i r[8], t[8], s[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(in + i * in_stride));
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i)
        for (int h = 0; h < 2; ++h) {
            s[4 * i + 2 * h] = _mm256_unpacklo_epi64(t[4 * i + h], t[4 * i + h + 2]);
            s[4 * i + 2 * h + 1] = _mm256_unpackhi_epi64(t[4 * i + h], t[4 * i + h + 2]);
        }
    for (int i = 0; i < 4; ++i) {
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i * out_stride),
                            _mm256_permute2x128_si256(s[i], s[i + 4], 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + (i + 4) * out_stride),
                            _mm256_permute2x128_si256(s[i], s[i + 4], 0x31));
    }
}

// A 16×16 block of bytes: four rounds of interleaving row i with row i + 8 (SSE2, every x86-64 has it).
inline void transpose_16x16(const uint8_t *in, int64_t in_stride, uint8_t *out, int64_t out_stride) {
    __m128i x[16], y[16];
    for (int i = 0; i < 16; ++i) x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i *>(in + i * in_stride));
    for (int round = 0; round < 4; ++round) {
        for (int i = 0; i < 8; ++i) {
            y[2 * i] = _mm_unpacklo_epi8(x[i], x[i + 8]);
            y[2 * i + 1] = _mm_unpackhi_epi8(x[i], x[i + 8]);
        }
        std::copy(y, y + 16, x);
    }
    for (int i = 0; i < 16; ++i) _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i * out_stride), x[i]);
}

// out[c][r] = in[r][c] for rows [r0, r1) of one image: for each block of B columns, the tile's rows in blocks
// of B×B through registers (`block`), so that each output row is written in runs of the tile's length. Written
// one value at a time along an input row, as before, each value went to another output row: a layer's 96
// channels over 160×160 into channels-first float32 took 14 ms on one thread (Zen 4), 0.6 ms so.
template <typename T, int B, typename Block>
void transpose_tile(const T *in, T *out, int64_t rows, int64_t columns, int64_t r0, int64_t r1, Block block) {
    const int64_t whole_rows = r0 + (r1 - r0) / B * B;
    int64_t c0 = 0;
    for (; c0 + B <= columns; c0 += B) {
        int64_t r = r0;
        for (; r < whole_rows; r += B) block(in + r * columns + c0, columns, out + c0 * rows + r, rows);
        for (int64_t c = c0; c < c0 + B; ++c)
            for (int64_t k = r; k < r1; ++k) out[c * rows + k] = in[k * columns + c];
    }
    for (int64_t c = c0; c < columns; ++c)
        for (int64_t k = r0; k < r1; ++k) out[c * rows + k] = in[k * columns + c];
}

template <typename T>
void transpose_typed(const T *src, T *dst, int64_t images, int64_t rows, int64_t columns, int threads) {
    constexpr int64_t ROW_TILE = 128;  // 512-byte runs of 4-byte values; 128 rows of 96 floats stay in L1/L2
    const int64_t row_tiles = (rows + ROW_TILE - 1) / ROW_TILE;
    const bool avx2 = eight_lanes();
    lpt_parallel::for_each(images * rows * columns >= PARALLEL_WORK ? threads : 1, images * row_tiles, [=](int64_t t) {
        const int64_t n = t / row_tiles, r0 = (t % row_tiles) * ROW_TILE, r1 = std::min(rows, r0 + ROW_TILE);
        const T *in = src + n * rows * columns;
        T *out = dst + n * rows * columns;
        if constexpr (sizeof(T) == 1) {
            transpose_tile<T, 16>(in, out, rows, columns, r0, r1, transpose_16x16);
        } else if (avx2) {
            transpose_tile<T, 8>(in, out, rows, columns, r0, r1, transpose_8x8);
        } else {
            transpose_tile<T, 8>(in, out, rows, columns, r0, r1, [](const T *i, int64_t is, T *o, int64_t os) {
                for (int c = 0; c < 8; ++c)
                    for (int r = 0; r < 8; ++r) o[c * os + r] = i[r * is + c];
            });
        }
    });
}

}  // namespace

void max_pool_channels_last(const void *src, char type, int64_t images, int64_t channels, int64_t h, int64_t w,
                            const Pool &pool, void *out, int threads) {
    if (type == 'b')
        max_pool_channels_last_typed(static_cast<const int8_t *>(src), images, channels, h, w, pool,
                                     static_cast<int8_t *>(out), threads);
    else if (type == 'B')
        max_pool_channels_last_typed(static_cast<const uint8_t *>(src), images, channels, h, w, pool,
                                     static_cast<uint8_t *>(out), threads);
    else
        max_pool_channels_last_typed(static_cast<const float *>(src), images, channels, h, w, pool,
                                     static_cast<float *>(out), threads);
}

void transpose(const void *src, void *dst, int64_t images, int64_t rows, int64_t columns, int item, int threads) {
    if (item == 1)
        transpose_typed(static_cast<const uint8_t *>(src), static_cast<uint8_t *>(dst), images, rows, columns, threads);
    else
        transpose_typed(static_cast<const uint32_t *>(src), static_cast<uint32_t *>(dst), images, rows, columns, threads);
}

// Sixteen values at a time where the CPU has AVX2 (the same levels as quantize_block's): 96 channels of
// 160×160 took 2.1 ms on one thread four at a time, 0.73 so.
void quantize_run(const float *x, int64_t n, float scale, int zero_point, int qmin, int qmax, void *out,
                  bool signed_out) {
    if (lpt_s16::supported()) return lpt_s16::quantize_values(x, n, scale, zero_point, qmin, qmax, signed_out, out);
    float levels[BLOCK];
    for (int64_t start = 0; start < n; start += BLOCK) {
        const int64_t count = std::min(BLOCK, n - start);
        std::copy(x + start, x + start + count, levels);
        quantize_block(levels, count, scale, zero_point, qmin, qmax);
        store_block(levels, count, static_cast<char *>(out) + start, signed_out);
    }
}

void quantize(const float *x, int64_t n, float scale, int zero_point, int qmin, int qmax, void *out, bool signed_out,
              int threads) {
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
    lpt_parallel::for_each(n >= PARALLEL_WORK ? threads : 1, blocks, [=](int64_t b) {
        const int64_t start = b * BLOCK;
        quantize_run(x + start, std::min(BLOCK, n - start), scale, zero_point, qmin, qmax,
                     static_cast<char *>(out) + start, signed_out);
    });
}

void dynamic_quantize(const float *x, int64_t n, uint8_t *out, float &scale, int &zero_point, int threads) {
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
    std::vector<float> lows(blocks, 0.0f), highs(blocks, 0.0f);
    lpt_parallel::for_each(n >= PARALLEL_WORK ? threads : 1, blocks, [&](int64_t b) {
        const int64_t start = b * BLOCK, end = std::min(n, start + BLOCK);
        float low = 0.0f, high = 0.0f;
        if (lpt_s16::supported()) {
            lpt_s16::extend_range(x + start, end - start, low, high);
        } else {
            for (int64_t i = start; i < end; ++i) {  // a NaN compares false: left out, as numpy's fmin/fmax
                low = x[i] < low ? x[i] : low;
                high = x[i] > high ? x[i] : high;
            }
        }
        lows[b] = low, highs[b] = high;
    });
    const float low = blocks ? *std::min_element(lows.begin(), lows.end()) : 0.0f,
                high = blocks ? *std::max_element(highs.begin(), highs.end()) : 0.0f;
    scale = low == high ? 1.0f : (high - low) / 255.0f;
    float level = -low / scale;
    level = level >= 0.0f ? level : 0.0f;
    level = level <= 255.0f ? level : 255.0f;
    zero_point = (int)round_half_even(level);
    quantize(x, n, scale, zero_point, 0, 255, out, false, threads);
}

namespace {

// MLAS's logistic constants (lpt.numerics.onnxruntime_logistic)
constexpr float LOGISTIC_LOW = -18.0f, LOGISTIC_HIGH = 18.0f;
constexpr float ALPHA_9 = 4.37031012579801e-11f, ALPHA_7 = 1.15627324459942e-07f, ALPHA_5 = 6.08574864600143e-05f,
                ALPHA_3 = 8.51377133304701e-03f, ALPHA_1 = 2.48287947061529e-01f;
constexpr float BETA_10 = 6.10247389755681e-13f, BETA_8 = 5.76102136993427e-09f, BETA_6 = 6.29106785017040e-06f,
                BETA_4 = 1.70198817374094e-03f, BETA_2 = 1.16817656904453e-01f, BETA_0 = 9.93151921023180e-01f;

inline float logistic(float x) {  // max/min in vmaxps' and vminps' order: a NaN passes through
    float v = LOGISTIC_LOW > x ? LOGISTIC_LOW : x;
    v = LOGISTIC_HIGH < v ? LOGISTIC_HIGH : v;
    const float x2 = v * v;
    float p = std::fmaf(x2, ALPHA_9, ALPHA_7);
    p = std::fmaf(p, x2, ALPHA_5);
    p = std::fmaf(p, x2, ALPHA_3);
    p = std::fmaf(p, x2, ALPHA_1);
    p = v * p;
    float q = std::fmaf(x2, BETA_10, BETA_8);
    q = std::fmaf(q, x2, BETA_6);
    q = std::fmaf(q, x2, BETA_4);
    q = std::fmaf(q, x2, BETA_2);
    q = std::fmaf(q, x2, BETA_0);
    const float y = p / q + 0.5f;
    return 0.0f > y ? 0.0f : y;
}

inline float dynamic_value(int32_t acc, int32_t bias_q, float scale, const float *bias, Silu silu) {
    float y = (float)(int32_t)((uint32_t)acc + (uint32_t)bias_q) * scale;
    if (bias) y = y + *bias;
    if (silu == NO_SILU) return y;
    const float l = logistic(y);
    return y * (silu == CLAMPED_SILU && !(l < 1.0f) ? 1.0f : l);  // as vminps(l, 1)
}

__attribute__((target("avx2,fma"))) inline __m256 logistic_lanes(__m256 x) {
    __m256 v = _mm256_max_ps(_mm256_set1_ps(LOGISTIC_LOW), x);  // x where NaN, as MLAS's operand order
    v = _mm256_min_ps(_mm256_set1_ps(LOGISTIC_HIGH), v);
    const __m256 x2 = _mm256_mul_ps(v, v);
    __m256 p = _mm256_fmadd_ps(x2, _mm256_set1_ps(ALPHA_9), _mm256_set1_ps(ALPHA_7));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(ALPHA_5));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(ALPHA_3));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(ALPHA_1));
    p = _mm256_mul_ps(v, p);
    __m256 q = _mm256_fmadd_ps(x2, _mm256_set1_ps(BETA_10), _mm256_set1_ps(BETA_8));
    q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(BETA_6));
    q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(BETA_4));
    q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(BETA_2));
    q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(BETA_0));
    const __m256 y = _mm256_add_ps(_mm256_div_ps(p, q), _mm256_set1_ps(0.5f));
    return _mm256_max_ps(_mm256_setzero_ps(), y);
}

__attribute__((target("avx2,fma"))) void dynamic_row_avx2(int32_t *acc, int64_t channels, const int32_t *bias_q,
                                                         const float *scales, const float *bias, Silu silu) {
    int64_t c = 0;
    for (; c + 8 <= channels; c += 8) {
        __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(acc + c));
        if (bias_q) a = _mm256_add_epi32(a, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(bias_q + c)));
        __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(a), _mm256_loadu_ps(scales + c));
        if (bias) y = _mm256_add_ps(y, _mm256_loadu_ps(bias + c));
        if (silu == SILU) y = _mm256_mul_ps(y, logistic_lanes(y));
        if (silu == CLAMPED_SILU)  // vminps(l, 1): l where l < 1, else 1 (a NaN l gives 1, and y is then NaN)
            y = _mm256_mul_ps(y, _mm256_min_ps(logistic_lanes(y), _mm256_set1_ps(1.0f)));
        _mm256_storeu_ps(reinterpret_cast<float *>(acc + c), y);
    }
    float *out = reinterpret_cast<float *>(acc);
    for (; c < channels; ++c)
        out[c] = dynamic_value(acc[c], bias_q ? bias_q[c] : 0, scales[c], bias ? bias + c : nullptr, silu);
}

}  // namespace

void dynamic_stage(void *values, int64_t rows, int64_t channels, const int32_t *bias_q, const float *scales,
                   const float *bias, Silu silu, int threads) {
    const bool avx2 = eight_lanes() && __builtin_cpu_supports("fma");
    int32_t *acc = static_cast<int32_t *>(values);
    constexpr int64_t ROWS = 64;  // per task
    lpt_parallel::for_each(rows * channels >= PARALLEL_WORK ? threads : 1, (rows + ROWS - 1) / ROWS, [=](int64_t t) {
        for (int64_t r = t * ROWS; r < std::min(rows, (t + 1) * ROWS); ++r) {
            int32_t *row = acc + r * channels;
            if (avx2) {
                dynamic_row_avx2(row, channels, bias_q, scales, bias, silu);
                continue;
            }
            float *out = reinterpret_cast<float *>(row);
            for (int64_t c = 0; c < channels; ++c)
                out[c] = dynamic_value(row[c], bias_q ? bias_q[c] : 0, scales[c], bias ? bias + c : nullptr, silu);
        }
    });
}

void dynamic_bias(const float *bias, int64_t channels, const float *scales, int32_t *bias_q) {
    for (int64_t c = 0; c < channels; ++c) {
        const float t = std::floor(bias[c] / scales[c]);
        bias_q[c] = t >= -2147483648.0f && t < 2147483648.0f ? (int32_t)t : INT32_MIN;
    }
}

void upsample_nearest(const void *src, int item, int64_t images, int64_t channels, int64_t h, int64_t w, int64_t kh,
                      int64_t kw, bool channels_last, void *out, int threads) {
    // One output row per task: built from its source row, then copied to the kh − 1 rows below it.
    const int64_t planes = channels_last ? images : images * channels, pixel = channels_last ? channels * item : item;
    const int64_t in_row = w * pixel, out_row = w * kw * pixel;
    lpt_parallel::for_each(planes * h * out_row * kh >= PARALLEL_WORK ? threads : 1, planes * h, [=](int64_t r) {
        const unsigned char *in = static_cast<const unsigned char *>(src) + r * in_row;
        unsigned char *o = static_cast<unsigned char *>(out) + r * kh * out_row;
        if (pixel == 1) {
            for (int64_t x = 0; x < w; ++x) std::memset(o + x * kw, in[x], kw);
        } else {
            for (int64_t x = 0; x < w; ++x)
                for (int64_t k = 0; k < kw; ++k) std::memcpy(o + (x * kw + k) * pixel, in + x * pixel, pixel);
        }
        for (int64_t k = 1; k < kh; ++k) std::memcpy(o + k * out_row, o, out_row);
    });
}

namespace {

// Eight 8-bit values as float32, exactly.
__attribute__((target("avx2"))) inline __m256 eight_levels(const char *q, bool is_signed) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(q));
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
}

// The join's values of one block (join, below) eight at a time, the same float32 operations; the rest one by one.
// The PaddleOCR detector's five joins took 0.85 ms in its program with the compiler's four lanes, 0.50 so
// (the largest, over 48 × 160 × 160, 0.39 → 0.22 ms; a Xeon with AMX, 2 threads).
__attribute__((target("avx2"))) int64_t join_block_avx2(const char *a, bool a_signed, const char *b, bool b_signed,
                                                        int64_t count, bool multiply, float a_shift, float a_scale,
                                                        float b_shift, float b_scale, bool relu, float *x) {
    const __m256 as = _mm256_set1_ps(a_shift), ac = _mm256_set1_ps(a_scale), bs = _mm256_set1_ps(b_shift),
                 bc = _mm256_set1_ps(b_scale), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= count; i += 8) {
        const __m256 u = _mm256_mul_ps(_mm256_sub_ps(eight_levels(a + i, a_signed), as), ac),
                     v = _mm256_mul_ps(_mm256_sub_ps(eight_levels(b + i, b_signed), bs), bc);
        __m256 y = multiply ? _mm256_mul_ps(u, v) : _mm256_add_ps(u, v);
        if (relu) y = _mm256_blendv_ps(y, zero, _mm256_cmp_ps(y, zero, _CMP_LE_OQ));  // −0 → +0, NaN stays
        _mm256_storeu_ps(x + i, y);
    }
    return i;
}

}  // namespace

void join(const void *a, bool a_signed, const void *b, bool b_signed, int64_t n, bool multiply, float a_shift,
          float a_scale, float b_shift, float b_scale, bool relu, const Destination &to, void *out, int threads) {
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
    const bool avx2 = eight_lanes();
    lpt_parallel::for_each(n >= PARALLEL_WORK ? threads : 1, blocks, [=](int64_t k) {
        float x[BLOCK], y[BLOCK];
        const int64_t start = k * BLOCK, count = std::min(BLOCK, n - start);
        const char *a_block = static_cast<const char *>(a) + start, *b_block = static_cast<const char *>(b) + start;
        const int64_t done = avx2 ? join_block_avx2(a_block, a_signed, b_block, b_signed, count, multiply, a_shift,
                                                    a_scale, b_shift, b_scale, relu, x)
                                  : 0;
        load_block(a_block + done, a_signed, count - done, x + done);
        load_block(b_block + done, b_signed, count - done, y + done);
        for (int64_t i = done; i < count; ++i) x[i] = (x[i] - a_shift) * a_scale;
        for (int64_t i = done; i < count; ++i) y[i] = (y[i] - b_shift) * b_scale;
        if (multiply)
            for (int64_t i = done; i < count; ++i) x[i] = x[i] * y[i];
        else
            for (int64_t i = done; i < count; ++i) x[i] = x[i] + y[i];
        if (relu)
            for (int64_t i = done; i < count; ++i) x[i] = x[i] <= 0.0f ? 0.0f : x[i];  // −0 → +0, NaN stays: np.maximum
        if (to.type == 'f') {
            std::copy(x, x + count, static_cast<float *>(out) + start);
            return;
        }
        quantize_run(x, count, to.scale, to.zero_point, to.qmin, to.qmax, static_cast<char *>(out) + start, to.type == 'b');
    });
}

void one_hot(const void *v, bool wide, int64_t rows, const int64_t *table, int64_t k, uint8_t low, uint8_t high,
             uint8_t *out, int threads) {
    // a table of consecutive integers (jax's arange): the one place a value can match, found by subtraction
    bool consecutive = true;
    for (int64_t j = 1; j < k && consecutive; ++j)
        consecutive = table[j - 1] < std::numeric_limits<int64_t>::max() && table[j] == table[j - 1] + 1;
    const int64_t first = table[0], last = table[k - 1];
    lpt_parallel::for_each(rows * k >= PARALLEL_WORK ? threads : 1, (rows + 255) / 256, [=](int64_t block) {
        for (int64_t r = block * 256; r < std::min(rows, block * 256 + 256); ++r) {
            const int64_t x = wide ? static_cast<const int64_t *>(v)[r] : static_cast<const int32_t *>(v)[r];
            uint8_t *row = out + r * k;
            std::memset(row, low, k);
            if (consecutive) {
                if (x >= first && x <= last) row[x - first] = high;
            } else {
                for (int64_t j = 0; j < k; ++j)
                    if (table[j] == x) row[j] = high;
            }
        }
    });
}

// sum[c] = rows[0][c] + rows[1][c] + … in row order, for c < width ≤ SUM_BLOCK, rows `stride` apart: a block of
// channels-last channels whose sums stay in registers through all the rows where the width is a multiple of
// 8 (sums in a std::vector waited for their own stores at every row: 96 channels of 160×160 took 0.63 ms on
// two threads so, 0.40 in a local array of any width, 0.37 with the width a constant).
constexpr int64_t SUM_BLOCK = 64;
template <int64_t W>  // W > 0: the width, a constant (the sums become registers); 0: `width`
__attribute__((always_inline)) inline void add_rows_of(const float *rows, int64_t stride, int64_t count, int64_t width,
                                                       float *sum) {
    const int64_t w = W > 0 ? W : width;
    float s[W > 0 ? W : SUM_BLOCK];
    std::copy(rows, rows + w, s);
    for (int64_t p = 1; p < count; ++p)
        for (int64_t c = 0; c < w; ++c) s[c] = s[c] + rows[p * stride + c];
    std::copy(s, s + w, sum);
}

__attribute__((target_clones("avx2", "default"))) void add_rows(const float *rows, int64_t stride, int64_t count,
                                                                int64_t width, float *sum) {
    switch (width % 8 == 0 ? width / 8 : 0) {
        case 1: return add_rows_of<8>(rows, stride, count, width, sum);
        case 2: return add_rows_of<16>(rows, stride, count, width, sum);
        case 3: return add_rows_of<24>(rows, stride, count, width, sum);
        case 4: return add_rows_of<32>(rows, stride, count, width, sum);
        case 5: return add_rows_of<40>(rows, stride, count, width, sum);
        case 6: return add_rows_of<48>(rows, stride, count, width, sum);
        case 7: return add_rows_of<56>(rows, stride, count, width, sum);
        case 8: return add_rows_of<64>(rows, stride, count, width, sum);
        default: return add_rows_of<0>(rows, stride, count, width, sum);
    }
}

void mean_of_positions(const float *x, int64_t images, int64_t channels, int64_t positions, bool channels_last,
                       float *out, int threads) {
    // Images and, for fewer images than threads, each image's channels in one part per thread, added in a
    // part's own array (parts of `out` side by side share a cache line): one image's 96 channels of
    // 160×160 took 1 ms on one thread. Each channel's values are still added in position order.
    const float count = (float)positions;
    const int parallel = images * channels * positions >= PARALLEL_WORK ? threads : 1;
    const int64_t parts = images >= parallel ? 1 : parallel,
                  part = ((channels + parts - 1) / parts + 7) / 8 * 8, blocks = (channels + part - 1) / part;
    lpt_parallel::for_each(parallel, images * blocks, [=](int64_t task) {
        const int64_t n = task / blocks, c0 = task % blocks * part, width = std::min(channels, c0 + part) - c0;
        std::vector<float> sum(width, 0.0f);  // 0 / 0 for an empty map: NaN, as numpy
        if (positions > 0 && channels_last) {  // position by position, each channel's sum in the same order as below
            const float *in = x + n * positions * channels + c0;
            for (int64_t c = 0; c < width; c += SUM_BLOCK)
                add_rows(in + c, channels, positions, std::min(SUM_BLOCK, width - c), sum.data() + c);
        } else if (positions > 0) {
            // eight channels at once: each sum waits for its last add, eight sums need not wait for each other
            // (96 channels of 160×160 on one thread: 1.18 ms a channel at a time)
            int64_t c = 0;
            for (; c + 8 <= width; c += 8) {
                const float *in = x + (n * channels + c0 + c) * positions;
                float s[8];
                for (int j = 0; j < 8; ++j) s[j] = in[j * positions];
                for (int64_t p = 1; p < positions; ++p)
                    for (int j = 0; j < 8; ++j) s[j] = s[j] + in[j * positions + p];
                std::copy(s, s + 8, sum.data() + c);
            }
            for (; c < width; ++c) {
                const float *in = x + (n * channels + c0 + c) * positions;
                float s = in[0];
                for (int64_t p = 1; p < positions; ++p) s = s + in[p];
                sum[c] = s;
            }
        }
        for (int64_t c = 0; c < width; ++c) out[n * channels + c0 + c] = sum[c] / count;
    });
}

namespace {
template <typename T>
void permute_typed(const T *in, const int64_t *dims, const int64_t *step, int rank, T *out) {
    std::vector<int64_t> index(rank, 0);
    const int64_t inner = dims[rank - 1], inner_step = step[rank - 1];
    int64_t offset = 0;  // of index[0 .. rank − 2] in the input
    for (;;) {
        const T *from = in + offset;
        for (int64_t i = 0; i < inner; ++i) out[i] = from[i * inner_step];
        out += inner;
        int axis = rank - 2;  // the odometer over the outer axes
        for (; axis >= 0; --axis) {
            offset += step[axis];
            if (++index[axis] < dims[axis]) break;
            offset -= step[axis] * dims[axis];
            index[axis] = 0;
        }
        if (axis < 0) return;
    }
}
}  // namespace

void permute(const unsigned char *in, int item, const int64_t *dims, const int64_t *step, int rank, unsigned char *out) {
    if (item == 4)
        permute_typed(reinterpret_cast<const uint32_t *>(in), dims, step, rank, reinterpret_cast<uint32_t *>(out));
    else
        permute_typed(in, dims, step, rank, out);
}

void max_pool(const void *src, char type, int64_t planes, int64_t h, int64_t w, const Pool &pool, void *out,
              int threads) {
    if (type == 'b')
        max_pool_typed(static_cast<const int8_t *>(src), planes, h, w, pool, static_cast<int8_t *>(out), threads);
    else if (type == 'B')
        max_pool_typed(static_cast<const uint8_t *>(src), planes, h, w, pool, static_cast<uint8_t *>(out), threads);
    else
        max_pool_typed(static_cast<const float *>(src), planes, h, w, pool, static_cast<float *>(out), threads);
}

}  // namespace lpt_ops
