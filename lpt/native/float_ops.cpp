// lpt/native/float_ops.h. Built with -ffp-contract=off and without -ffast-math, as _engine.cpp, so each
// float32 operation rounds once, as numpy's do. The loops that call exp take eight lanes at a time
// where the CPU has AVX2 (exp.h's exp_lanes, the same operations as its scalar exp).

#include "float_ops.h"


#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "exp.h"
#include "integer_ops.h"
#include "parallel.h"
#include "s16.h"

namespace lpt_ops {

namespace {
std::atomic<bool> lanes_allowed{true};
}  // namespace

bool allow_eight_lanes(bool allowed) { return lanes_allowed.exchange(allowed); }

bool eight_lanes() { return lanes_allowed.load() && lpt_s16::supported(); }

namespace {

constexpr int64_t PARALLEL_WORK = 1 << 16;  // values below which a loop runs on one thread

// Σ v[0 .. n) in eight lanes, as lpt.kernels.float_ops.sum_in_lanes: lane j adds v[j], v[j + 8], … (zeros
// past the end), then ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)).
inline float add_lanes(const float *lanes) {
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

float sum_in_lanes(const float *v, int64_t n) {
    float lanes[8];
    for (int64_t j = 0; j < 8; ++j) lanes[j] = j < n ? v[j] : 0.0f;
    for (int64_t i = 8; i < n; i += 8)
        for (int64_t j = 0; j < 8; ++j) lanes[j] = lanes[j] + (i + j < n ? v[i + j] : 0.0f);
    return add_lanes(lanes);
}

// The lanes' sums `acc` of v[0, from) (from a multiple of 8) continued over v[from, n), then added in order.
__attribute__((target("avx2"))) float finish_sum_in_lanes_avx2(__m256 acc, const float *v, int64_t from, int64_t n) {
    const int64_t whole = n / 8 * 8;
    for (int64_t i = from; i < whole; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(v + i));
    if (whole < n) {
        alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        std::copy(v + whole, v + n, tail);
        acc = _mm256_add_ps(acc, _mm256_load_ps(tail));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    return add_lanes(lanes);
}

__attribute__((target("avx2"))) float sum_in_lanes_avx2(const float *v, int64_t n) {
    if (n >= 8) return finish_sum_in_lanes_avx2(_mm256_loadu_ps(v), v, 8, n);
    alignas(32) float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // fewer than eight: each lane its value or 0
    std::copy(v, v + n, lanes);
    return add_lanes(lanes);
}

// A row's maximum, as numpy's max: the first NaN if there is one (the greatest value does not depend on
// the order of comparisons, but for the sign of a zero, which x − m does not feel).
float row_max(const float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; ++i) m = (x[i] > m || x[i] != x[i]) ? x[i] : m;  // a NaN stays
    return m;
}

__attribute__((target("avx2"))) float row_max_avx2(const float *x, int64_t n) {
    if (n < 8) return row_max(x, n);
    __m256 m = _mm256_loadu_ps(x), nan = _mm256_cmp_ps(m, m, _CMP_UNORD_Q);
    for (int64_t i = 8; i < n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + std::min(i, n - 8));  // the last eight again: a max repeats harmlessly
        m = _mm256_max_ps(m, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan)) return row_max(x, n);  // the first NaN, as row_max finds it
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    return *std::max_element(lanes, lanes + 8);
}

// A softmax row: e[i] = exp(x[i] − m), their sum in lanes, then e[i] / sum; eight lanes at a time on AVX2.
__attribute__((target("avx2"))) void softmax_row_avx2(const float *x, int64_t n, float *e) {
    const float m = row_max_avx2(x, n);
    const __m256 shift = _mm256_set1_ps(m);
    int64_t i = 0;
    // four vectors at a time, their exps' chains interleaved (exp_lanes_n): PaddleOCR's recognizer's last
    // Softmax, 40 rows of 18 710 classes, took 1.13 ms one vector at a time, 0.77 so (one thread)
    for (; i + 32 <= n; i += 32) {
        __m256 v[4];
        for (int k = 0; k < 4; ++k) v[k] = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * k), shift);
        lpt_exp::exp_lanes_n<4>(v);
        for (int k = 0; k < 4; ++k) _mm256_storeu_ps(e + i + 8 * k, v[k]);
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(e + i, lpt_exp::exp_lanes(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift)));
    for (; i < n; ++i) e[i] = lpt_exp::exp(x[i] - m);
    const float sum = sum_in_lanes_avx2(e, n);
    const __m256 total = _mm256_set1_ps(sum);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(e + i, _mm256_div_ps(_mm256_loadu_ps(e + i), total));
    for (; i < n; ++i) e[i] = e[i] / sum;
}

// softmax_row_avx2 with sixteen lanes, for rows of 64 values at least: the maximum in four registers (a
// maximum does not depend on the order but for a zero's sign, which x − m does not feel; a NaN is found as
// row_max finds it), the exps of 64 values at a time with their sum in eight lanes in the same loop, each
// add in sum_in_lanes' order (its chain of adds waits on no exp: the exps' work hides it), then each e / sum.
// PaddleOCR's recognizer's last Softmax, 40 rows of 18 710 classes, in its program (a Xeon with AMX, 2
// threads): 0.38-0.40 ms with eight lanes, 0.27-0.29 so; its division pass takes 0.065 of that, and for rows
// below 64 values the eight-lane form is as fast.
__attribute__((target("avx512f"))) float row_max_512(const float *x, int64_t n) {
    __m512 m[4];
    __mmask16 unordered = 0;
    for (int k = 0; k < 4; ++k) m[k] = _mm512_loadu_ps(x + 16 * k);
    for (int64_t i = 64; i < n; i += 64) {
        const int64_t at = std::min(i, n - 64);  // the last 64 again: a maximum repeats harmlessly
        for (int k = 0; k < 4; ++k) {
            const __m512 v = _mm512_loadu_ps(x + at + 16 * k);
            m[k] = _mm512_max_ps(m[k], v);
            unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        }
    }
    for (int k = 0; k < 4; ++k) unordered |= _mm512_cmp_ps_mask(m[k], m[k], _CMP_UNORD_Q);
    if (unordered) return row_max(x, n);  // the first NaN, as row_max finds it
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3])));
}

__attribute__((target("avx512f"))) void softmax_row_512(const float *x, int64_t n, float *e) {
    const float m = row_max_512(x, n);
    const __m512 shift = _mm512_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 v[4];
        for (int k = 0; k < 4; ++k) v[k] = _mm512_sub_ps(_mm512_loadu_ps(x + i + 16 * k), shift);
        lpt_exp::exp_lanes_512_n<4>(v);
        for (int k = 0; k < 4; ++k) {
            _mm512_storeu_ps(e + i + 16 * k, v[k]);
            const __m256 low = _mm512_castps512_ps256(v[k]),
                         high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[k]), 1));
            sum = i + k == 0 ? low : _mm256_add_ps(sum, low);  // sum_in_lanes starts from the first eight
            sum = _mm256_add_ps(sum, high);
        }
    }
    // the rest eight lanes at a time, then one by one, their sum continued as sum_in_lanes_avx2's
    const int64_t done = i;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(e + i, lpt_exp::exp_lanes(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm512_castps512_ps256(shift))));
    for (; i < n; ++i) e[i] = lpt_exp::exp(x[i] - m);
    const float total = finish_sum_in_lanes_avx2(sum, e, done, n);
    const __m512 divisor = _mm512_set1_ps(total);
    for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(e + i, _mm512_div_ps(_mm512_loadu_ps(e + i), divisor));
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(e + i, _mm256_div_ps(_mm256_loadu_ps(e + i), _mm512_castps512_ps256(divisor)));
    for (; i < n; ++i) e[i] = e[i] / total;
}

void softmax_row(const float *x, int64_t n, float *e, bool avx2) {
    if (avx2 && n >= 64 && lpt_s16::sixteen_lanes()) return softmax_row_512(x, n, e);
    if (avx2) return softmax_row_avx2(x, n, e);
    const float m = row_max(x, n);
    for (int64_t i = 0; i < n; ++i) e[i] = lpt_exp::exp(x[i] - m);
    const float sum = sum_in_lanes(e, n);
    for (int64_t i = 0; i < n; ++i) e[i] = e[i] / sum;
}

}  // namespace

void average_pool(const float *src, int64_t planes, int64_t h, int64_t w, const Pool &p, bool count_include_pad,
                  float *out, int threads) {
    const int64_t oh = p.out_h(h), ow = p.out_w(w);
    const float area = (float)(p.kernel_h * p.kernel_w);
    lpt_parallel::for_each(planes * oh * ow * p.kernel_h * p.kernel_w >= PARALLEL_WORK ? threads : 1,
                           planes, [=](int64_t plane) {
        const float *in = src + plane * h * w;
        float *o = out + plane * oh * ow;
        for (int64_t y = 0; y < oh; ++y)
            for (int64_t x = 0; x < ow; ++x) {
                float total = 0.0f, count = 0.0f;
                for (int64_t kx = 0; kx < p.kernel_w; ++kx) {
                    const int64_t ix = x * p.stride_w + kx - p.pad_left;
                    float column = 0.0f, column_count = 0.0f;
                    for (int64_t ky = 0; ky < p.kernel_h; ++ky) {
                        const int64_t iy = y * p.stride_h + ky - p.pad_top;
                        const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
                        const float value = inside ? in[iy * w + ix] : 0.0f;
                        column = ky == 0 ? value : column + value;
                        column_count = column_count + (inside ? 1.0f : 0.0f);
                    }
                    total = kx == 0 ? column : total + column;
                    count = count + column_count;
                }
                o[y * ow + x] = total / (count_include_pad ? area : count);
            }
    });
}

void average_pool_channels_last(const float *src, int64_t images, int64_t channels, int64_t h, int64_t w,
                                const Pool &p, bool count_include_pad, float *out, int threads) {
    const int64_t oh = p.out_h(h), ow = p.out_w(w);
    const float area = (float)(p.kernel_h * p.kernel_w);
    const int loop_threads = images * oh * ow * channels * p.kernel_h * p.kernel_w >= PARALLEL_WORK ? threads : 1;
    lpt_parallel::run(loop_threads, images * oh, 0, [&](lpt_parallel::Chunks &chunks) {
        std::vector<float> column(channels);
        for (int64_t row; chunks.next(row);) {
            const int64_t n = row / oh, y = row % oh;
            for (int64_t x = 0; x < ow; ++x) {
                float *total = out + (row * ow + x) * channels;
                float count = 0.0f;
                for (int64_t kx = 0; kx < p.kernel_w; ++kx) {
                    const int64_t ix = x * p.stride_w + kx - p.pad_left;
                    float column_count = 0.0f;
                    for (int64_t ky = 0; ky < p.kernel_h; ++ky) {
                        const int64_t iy = y * p.stride_h + ky - p.pad_top;
                        const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
                        const float *in = src + ((n * h + iy) * w + ix) * channels;
                        if (ky == 0 && inside) std::copy(in, in + channels, column.data());
                        else if (ky == 0) std::fill(column.begin(), column.end(), 0.0f);
                        else if (inside) for (int64_t c = 0; c < channels; ++c) column[c] = column[c] + in[c];
                        else for (int64_t c = 0; c < channels; ++c) column[c] = column[c] + 0.0f;
                        column_count = column_count + (inside ? 1.0f : 0.0f);
                    }
                    if (kx == 0) std::copy(column.begin(), column.end(), total);
                    else for (int64_t c = 0; c < channels; ++c) total[c] = total[c] + column[c];
                    count = count + column_count;
                }
                const float divisor = count_include_pad ? area : count;
                for (int64_t c = 0; c < channels; ++c) total[c] = total[c] / divisor;
            }
        }
    });
}

namespace {
constexpr int64_t BLOCK = 4096;  // values per task of the elementwise loops

// f on [start, start + count) of each block, the blocks shared among the threads
template <typename F>
void each_block(int64_t n, int threads, F f) {
    lpt_parallel::for_each(n >= PARALLEL_WORK ? threads : 1, (n + BLOCK - 1) / BLOCK,
                           [=](int64_t b) { f(b * BLOCK, std::min(BLOCK, n - b * BLOCK)); });
}

constexpr float HARD_SWISH_ALPHA = 1.0f / 6.0f, HARD_SWISH_BETA = 0.5f;

inline float hard_swish_value(float x) {
    float h = x * HARD_SWISH_ALPHA + HARD_SWISH_BETA;
    h = h < 0.0f ? 0.0f : h;  // a NaN stays NaN, as numpy's maximum and minimum keep it
    h = h > 1.0f ? 1.0f : h;
    return x * h;
}

// max_ps(0, h) is 0 > h ? 0 : h and min_ps(1, h) is 1 < h ? 1 : h: the comparisons above, without branches
__attribute__((target("avx2"))) void hard_swish_avx2(const float *x, int64_t n, float *out) {
    const __m256 alpha = _mm256_set1_ps(HARD_SWISH_ALPHA), beta = _mm256_set1_ps(HARD_SWISH_BETA),
                 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 h = _mm256_min_ps(one, _mm256_max_ps(zero, _mm256_add_ps(_mm256_mul_ps(v, alpha), beta)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(v, h));
    }
    for (; i < n; ++i) out[i] = hard_swish_value(x[i]);
}

// numpy's minimum(maximum(x·α + β, 0), 1): maximum(h, 0) is h where h > 0 or h is NaN, else 0
inline float hard_sigmoid_value(float x, float alpha, float beta) {
    float h = x * alpha + beta;
    h = h > 0.0f || h != h ? h : 0.0f;
    return h < 1.0f || h != h ? h : 1.0f;
}

__attribute__((target("avx2"))) void hard_sigmoid_avx2(const float *x, int64_t n, float alpha, float beta, float *out) {
    const __m256 a = _mm256_set1_ps(alpha), b = _mm256_set1_ps(beta), zero = _mm256_setzero_ps(),
                 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 h = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), a), b);
        const __m256 nan = _mm256_cmp_ps(h, h, _CMP_UNORD_Q);
        h = _mm256_blendv_ps(zero, h, _mm256_or_ps(_mm256_cmp_ps(h, zero, _CMP_GT_OQ), nan));
        h = _mm256_blendv_ps(one, h, _mm256_or_ps(_mm256_cmp_ps(h, one, _CMP_LT_OQ), nan));
        _mm256_storeu_ps(out + i, h);
    }
    for (; i < n; ++i) out[i] = hard_sigmoid_value(x[i], alpha, beta);
}

// f on four vectors at a time, in place, so that their chains of dependent operations interleave, as the
// Softmax's exps above; the values past the last 32 are the caller's. f is a lambda whose target is AVX2
// too (a lambda does not take its caller's), so that it inlines.
template <typename F>
__attribute__((target("avx2"))) inline int64_t four_vectors_at_a_time(const float *x, int64_t n, float *out, F f) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 v[4];
        for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + i + 8 * k);
        f(v);
        for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + i + 8 * k, v[k]);
    }
    return i;
}

__attribute__((target("avx2"))) void sigmoid_avx2(const float *x, int64_t n, float *out) {
    int64_t i = four_vectors_at_a_time(x, n, out,
                                       [](__m256 *v) __attribute__((target("avx2"))) { lpt_exp::sigmoid_lanes_n<4>(v); });
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, lpt_exp::sigmoid_lanes(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i) out[i] = lpt_exp::sigmoid(x[i]);
}

__attribute__((target("avx2"))) void log_avx2(const float *x, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, lpt_exp::log_lanes(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i) out[i] = lpt_exp::log(x[i]);
}

inline float slope_and_clip_value(float v, float slope, float low, float high) {
    if (slope != 1.0f) v = v < 0.0f ? v * slope : v;
    v = v < low ? low : v;  // a NaN stays NaN
    return v > high ? high : v;
}

// max_ps(low, v) is low > v ? low : v, min_ps(high, v) high < v ? high : v: the comparisons above (as
// s16.cpp's output stage makes them)
__attribute__((target("avx2"))) void slope_and_clip_avx2(const float *x, int64_t n, float slope, float low, float high,
                                                         float *out) {
    const __m256 s = _mm256_set1_ps(slope), lo = _mm256_set1_ps(low), hi = _mm256_set1_ps(high),
                 zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (slope != 1.0f) v = _mm256_blendv_ps(v, _mm256_mul_ps(v, s), _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
        _mm256_storeu_ps(out + i, _mm256_min_ps(hi, _mm256_max_ps(lo, v)));
    }
    for (; i < n; ++i) out[i] = slope_and_clip_value(x[i], slope, low, high);
}

__attribute__((target("avx2"))) void tanh_avx2(const float *x, int64_t n, float *out) {
    int64_t i = four_vectors_at_a_time(x, n, out,
                                       [](__m256 *v) __attribute__((target("avx2"))) { lpt_exp::tanh_lanes_n<4>(v); });
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, lpt_exp::tanh_lanes(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i) out[i] = lpt_exp::tanh(x[i]);
}

__attribute__((target("avx2"))) void erf_avx2(const float *x, int64_t n, float *out) {
    int64_t i = four_vectors_at_a_time(x, n, out,
                                       [](__m256 *v) __attribute__((target("avx2"))) { lpt_exp::erf_lanes_n<4>(v); });
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, lpt_exp::erf_lanes(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i) out[i] = lpt_exp::erf(x[i]);
}
}  // namespace

void hard_swish(const float *x, int64_t n, float *out, int threads) {
    const bool avx2 = eight_lanes();
    each_block(n, threads, [&](int64_t start, int64_t count) {
        if (avx2) hard_swish_avx2(x + start, count, out + start);
        else for (int64_t i = start; i < start + count; ++i) out[i] = hard_swish_value(x[i]);
    });
}

void relu(const float *x, int64_t n, float *out, int threads) {
    each_block(n, threads, [&](int64_t start, int64_t count) {
        for (int64_t i = start; i < start + count; ++i) out[i] = x[i] > 0.0f || x[i] != x[i] ? x[i] : 0.0f;
    });
}

void hard_sigmoid(const float *x, int64_t n, float alpha, float beta, float *out, int threads) {
    const bool avx2 = eight_lanes();
    each_block(n, threads, [&](int64_t start, int64_t count) {
        if (avx2) hard_sigmoid_avx2(x + start, count, alpha, beta, out + start);
        else for (int64_t i = start; i < start + count; ++i) out[i] = hard_sigmoid_value(x[i], alpha, beta);
    });
}

void log(const float *x, int64_t n, float *out, int threads) {
    const bool avx2 = eight_lanes();
    each_block(n, threads, [&](int64_t start, int64_t count) {
        if (avx2) log_avx2(x + start, count, out + start);
        else for (int64_t i = start; i < start + count; ++i) out[i] = lpt_exp::log(x[i]);
    });
}

void sigmoid(const float *x, int64_t n, float *out, int threads) {
    const bool avx2 = eight_lanes();
    each_block(n, threads, [&](int64_t start, int64_t count) {
        if (avx2) sigmoid_avx2(x + start, count, out + start);
        else for (int64_t i = start; i < start + count; ++i) out[i] = lpt_exp::sigmoid(x[i]);
    });
}

void affine(const float *x, const float *a, const float *b, int64_t images, int64_t channels, int64_t positions,
            bool channels_last, float *out, int threads) {
    const int64_t rows = images * (channels_last ? positions : channels), width = channels_last ? channels : positions;
    lpt_parallel::for_each(rows * width >= PARALLEL_WORK ? threads : 1, rows, [=](int64_t r) {
        const float *in = x + r * width;
        float *o = out + r * width;
        if (channels_last) {
            for (int64_t c = 0; c < width; ++c) o[c] = in[c] * a[c] + b[c];
        } else {
            const int64_t c = r % channels;
            for (int64_t p = 0; p < width; ++p) o[p] = in[p] * a[c] + b[c];
        }
    });
}

void slope_and_clip(const float *x, int64_t n, float slope, float low, float high, float *out, int threads) {
    const bool avx2 = eight_lanes();
    each_block(n, threads, [&](int64_t start, int64_t count) {
        if (avx2) return slope_and_clip_avx2(x + start, count, slope, low, high, out + start);
        for (int64_t i = start; i < start + count; ++i) out[i] = slope_and_clip_value(x[i], slope, low, high);
    });
}

namespace {
inline float gelu_value(float x, float divisor, float one, float half) {
    return (x * (lpt_exp::erf(x / divisor) + one)) * half;
}

__attribute__((target("avx2"))) void gelu_avx2(const float *x, int64_t n, float divisor, float one, float half,
                                               float *out) {
    const __m256 d = _mm256_set1_ps(divisor), o = _mm256_set1_ps(one), h = _mm256_set1_ps(half);
    int64_t i = four_vectors_at_a_time(x, n, out, [=](__m256 *v) __attribute__((target("avx2"))) {
        __m256 e[4];
        for (int k = 0; k < 4; ++k) e[k] = _mm256_div_ps(v[k], d);
        lpt_exp::erf_lanes_n<4>(e);
        for (int k = 0; k < 4; ++k) v[k] = _mm256_mul_ps(_mm256_mul_ps(v[k], _mm256_add_ps(e[k], o)), h);
    });
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 e = lpt_exp::erf_lanes(_mm256_div_ps(v, d));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(v, _mm256_add_ps(e, o)), h));
    }
    for (; i < n; ++i) out[i] = gelu_value(x[i], divisor, one, half);
}
}  // namespace

void gelu(const float *x, int64_t n, float divisor, float one, float half, float *out, int threads) {
    const bool avx2 = eight_lanes();
    each_block(n, threads, [=](int64_t start, int64_t count) {
        if (avx2) gelu_avx2(x + start, count, divisor, one, half, out + start);
        else for (int64_t i = start; i < start + count; ++i) out[i] = gelu_value(x[i], divisor, one, half);
    });
}

namespace {
inline float tanh_gelu_value(float x, float cube, float root, float one, float half) {
    return x * ((one + lpt_exp::tanh((x + x * (x * (cube * x))) * root)) * half);
}

__attribute__((target("avx2"))) void tanh_gelu_avx2(const float *x, int64_t n, float cube, float root, float one,
                                                    float half, float *out) {
    const __m256 c = _mm256_set1_ps(cube), r = _mm256_set1_ps(root), o = _mm256_set1_ps(one), h = _mm256_set1_ps(half);
    auto inner = [=](__m256 v) __attribute__((target("avx2"))) {
        return _mm256_mul_ps(_mm256_add_ps(v, _mm256_mul_ps(v, _mm256_mul_ps(v, _mm256_mul_ps(c, v)))), r);
    };
    auto outer = [=](__m256 v, __m256 t) __attribute__((target("avx2"))) {
        return _mm256_mul_ps(v, _mm256_mul_ps(_mm256_add_ps(o, t), h));
    };
    int64_t i = four_vectors_at_a_time(x, n, out, [=](__m256 *v) __attribute__((target("avx2"))) {
        __m256 t[4];
        for (int k = 0; k < 4; ++k) t[k] = inner(v[k]);
        lpt_exp::tanh_lanes_n<4>(t);
        for (int k = 0; k < 4; ++k) v[k] = outer(v[k], t[k]);
    });
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(out + i, outer(v, lpt_exp::tanh_lanes(inner(v))));
    }
    for (; i < n; ++i) out[i] = tanh_gelu_value(x[i], cube, root, one, half);
}
}  // namespace

void tanh_gelu(const float *x, int64_t n, float cube, float root, float one, float half, float *out, int threads) {
    const bool avx2 = eight_lanes();
    each_block(n, threads, [=](int64_t start, int64_t count) {
        if (avx2) tanh_gelu_avx2(x + start, count, cube, root, one, half, out + start);
        else for (int64_t i = start; i < start + count; ++i) out[i] = tanh_gelu_value(x[i], cube, root, one, half);
    });
}

void tanh(const float *x, int64_t n, float *out, int threads) {
    const bool avx2 = eight_lanes();
    each_block(n, threads, [&](int64_t start, int64_t count) {
        if (avx2) tanh_avx2(x + start, count, out + start);
        else for (int64_t i = start; i < start + count; ++i) out[i] = lpt_exp::tanh(x[i]);
    });
}

void erf(const float *x, int64_t n, float *out, int threads) {
    const bool avx2 = eight_lanes();
    each_block(n, threads, [&](int64_t start, int64_t count) {
        if (avx2) erf_avx2(x + start, count, out + start);
        else for (int64_t i = start; i < start + count; ++i) out[i] = lpt_exp::erf(x[i]);
    });
}

namespace {
template <char OP>
inline float apply(float x, float y) {
    return OP == '*' ? x * y : OP == '+' ? x + y : OP == '-' ? x - y : x / y;
}

// Where binary_op's values go: float32 `out` itself, or a thread's buffer quantized into 8-bit `out` as each
// run of values is done (a quantize alone reads the op's result: its float32 tensor is never written).
struct FloatValues {
    float *out;
    float *values(int64_t start, int64_t) const { return out + start; }
    void done(const float *, int64_t, int64_t) const {}
};

struct QuantizedValues {
    QuantizeTo to;
    void *out;
    float *values(int64_t, int64_t count) const {
        thread_local std::vector<float> buffer;
        if ((int64_t)buffer.size() < count) buffer.resize(count);
        return buffer.data();
    }
    void done(const float *values, int64_t start, int64_t count) const {
        quantize_run(values, count, to.scale, to.zero_point, to.qmin, to.qmax,
                     static_cast<char *>(out) + start, to.is_signed);
    }
};

// o[i] = b[i] ∘ s[i] (or s[0] for each i with `one_value`; s ∘ b with `small_first`) for i < n, eight at a time
// with AVX2, the same operation on each value. The compiler's own loops took four: the PaddleOCR recognizer's
// Adds, Muls and Subs in its program 0.32 → 0.29 ms, the detector's 3.68 → 3.35-3.48, and 3.19-3.27 with a
// chain's later steps so too (a Xeon with AMX, 2 threads).
template <char OP>
__attribute__((target("avx2"))) void combine_avx2(const float *b, const float *s, bool one_value, bool small_first,
                                                   int64_t n, float *o) {
    const auto op = [](__m256 x, __m256 y) __attribute__((target("avx2"))) {
        return OP == '*' ? _mm256_mul_ps(x, y) : OP == '+' ? _mm256_add_ps(x, y) : OP == '-' ? _mm256_sub_ps(x, y)
                                                                                          : _mm256_div_ps(x, y);
    };
    const __m256 value = _mm256_set1_ps(s[0]);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(b + i), y = one_value ? value : _mm256_loadu_ps(s + i);
        _mm256_storeu_ps(o + i, small_first ? op(y, x) : op(x, y));
    }
    for (; i < n; ++i) o[i] = small_first ? apply<OP>(one_value ? s[0] : s[i], b[i]) : apply<OP>(b[i], one_value ? s[0] : s[i]);
}

// The values [start, start + count) of a chain's later steps, on o in place.
template <char OP>
void step_values(float *o, const float *operand, bool operand_first, int64_t count) {
    if (eight_lanes()) return combine_avx2<OP>(o, operand, false, operand_first, count, o);
    if (operand_first)
        for (int64_t i = 0; i < count; ++i) o[i] = apply<OP>(operand[i], o[i]);
    else
        for (int64_t i = 0; i < count; ++i) o[i] = apply<OP>(o[i], operand[i]);
}

void step_run(char op, float *o, const float *operand, bool operand_first, int64_t count) {
    switch (op) {
        case '*': step_values<'*'>(o, operand, operand_first, count); break;
        case '+': step_values<'+'>(o, operand, operand_first, count); break;
        case '-': step_values<'-'>(o, operand, operand_first, count); break;
        default: step_values<'/'>(o, operand, operand_first, count); break;
    }
}

// An upsampled step (ChainStep) on the values [start, start + count) of big: channels-last, each position's
// run of channels is its source position's; channels-first, each row's values are its source row's, each
// repeated up_w times (gathered into a buffer first).
void upsampled_step(float *o, const ChainStep &s, int64_t start, int64_t count) {
    const int64_t source_h = s.height / s.up_h, source_w = s.width / s.up_w;
    int64_t e = s.offset + start;
    const int64_t end = e + count;
    // Where e lies, divided out once; then each run's place follows from the last one's, where it was divided
    // out per position (channels-last) or per value (channels-first): x + y + up(r) of 96 channels over
    // 160×160, r 8× upsampled, channels-first, 2 threads, 4.7-5.8 → 4.1 ms (Zen 3, two runs each).
    if (s.channels_last) {
        int64_t c = e % s.channels, position = e / s.channels;
        int64_t x = position % s.width, y = position / s.width % s.height, n = position / (s.width * s.height);
        // the source position of (y, x): its row, and x's column and place among that column's up_w repeats
        const float *row = s.operand + (n * source_h + y / s.up_h) * source_w * s.channels;
        int64_t column = x / s.up_w, phase = x % s.up_w;
        while (e < end) {
            const int64_t run = std::min(end - e, s.channels - c);
            step_run(s.op, o, row + column * s.channels + c, s.operand_first, run);
            o += run, e += run, c = 0;
            if (++phase == s.up_w) phase = 0, ++column;
            if (++x < s.width) continue;
            x = column = phase = 0;
            if (++y == s.height) y = 0, ++n;
            row = s.operand + (n * source_h + y / s.up_h) * source_w * s.channels;
        }
        return;
    }
    thread_local std::vector<float> row;
    while (e < end) {
        const int64_t x = e % s.width, y = e / s.width % s.height, plane = e / (s.width * s.height);
        const int64_t run = std::min(end - e, s.width - x);
        const float *from = s.operand + (plane * source_h + y / s.up_h) * source_w;
        if ((int64_t)row.size() < run) row.resize(run);
        // value i of the run is from[(x + i) / up_w]: whole repeats of each source value
        for (int64_t i = 0, sx = x / s.up_w, phase = x % s.up_w; i < run; ++i) {
            row[i] = from[sx];
            if (++phase == s.up_w) phase = 0, ++sx;
        }
        step_run(s.op, o, row.data(), s.operand_first, run);
        o += run, e += run;
    }
}

void chain_steps(float *o, const std::vector<ChainStep> &steps, int64_t start, int64_t count) {
    for (const ChainStep &s : steps) {
        if (s.upsampled) upsampled_step(o, s, start, count);
        else step_run(s.op, o, s.operand + start, s.operand_first, count);
    }
}

// big ∘ small over its rows (lpt_ops::binary's arguments), then `steps` on each run of values while it is in
// the core's cache, then the sink.
template <char OP, typename Sink>
void binary_op(const float *big, const float *small, bool small_first, int64_t images, int64_t channels,
               int64_t positions, bool channels_last, int threads, const Sink &sink,
               const std::vector<ChainStep> *steps = nullptr) {
    auto combine = [small_first](float b, float s) { return small_first ? apply<OP>(s, b) : apply<OP>(b, s); };
    const bool avx2 = eight_lanes();
    if (channels <= 0) {  // elementwise, or one value
        each_block(images * positions, threads, [=](int64_t start, int64_t count) {
            float *o = sink.values(start, count);
            if (avx2)
                combine_avx2<OP>(big + start, channels == 0 ? small + start : small, channels != 0, small_first, count, o);
            else
                for (int64_t i = 0; i < count; ++i) o[i] = combine(big[start + i], channels == 0 ? small[start + i] : small[0]);
            if (steps) chain_steps(o, *steps, start, count);
            sink.done(o, start, count);
        });
        return;
    }
    // Rows of one small value per channel, as many to a task as make about BLOCK values: a row at a time,
    // the sink's and the steps' work per call (a quantize's constants, a thread's buffer) came at every
    // 96 values of the detector's channels-last rows.
    const int64_t rows = images * (channels_last ? positions : channels), width = channels_last ? channels : positions;
    const int64_t per_task = std::max<int64_t>(1, BLOCK / std::max<int64_t>(width, 1));
    lpt_parallel::for_each(rows * width >= PARALLEL_WORK ? threads : 1, (rows + per_task - 1) / per_task, [=](int64_t t) {
        const int64_t first = t * per_task, count = std::min(per_task, rows - first);
        float *o = sink.values(first * width, count * width);
        for (int64_t r = first; r < first + count; ++r) {
            const float *b = big + r * width;
            float *row = o + (r - first) * width;
            if (channels_last) {  // a row of channels: small's row for the image
                const float *s = small + r / positions * channels;
                if (avx2) combine_avx2<OP>(b, s, false, small_first, width, row);
                else for (int64_t c = 0; c < width; ++c) row[c] = combine(b[c], s[c]);
            } else {  // a row of positions: one channel's value
                if (avx2) combine_avx2<OP>(b, small + r, true, small_first, width, row);
                else for (int64_t p = 0; p < width; ++p) row[p] = combine(b[p], small[r]);
            }
        }
        if (steps) chain_steps(o, *steps, first * width, count * width);
        sink.done(o, first * width, count * width);
    });
}

template <typename Sink>
void binary_to(char op, const float *big, const float *small, bool small_first, int64_t images, int64_t channels,
               int64_t positions, bool channels_last, int threads, const Sink &sink,
               const std::vector<ChainStep> *steps = nullptr) {
    switch (op) {
        case '*': return binary_op<'*'>(big, small, small_first, images, channels, positions, channels_last, threads, sink, steps);
        case '+': return binary_op<'+'>(big, small, small_first, images, channels, positions, channels_last, threads, sink, steps);
        case '-': return binary_op<'-'>(big, small, small_first, images, channels, positions, channels_last, threads, sink, steps);
        default: return binary_op<'/'>(big, small, small_first, images, channels, positions, channels_last, threads, sink, steps);
    }
}
}  // namespace

void chain(char op, const float *big, const float *small, bool small_first, int64_t images, int64_t channels,
           int64_t positions, bool channels_last, const std::vector<ChainStep> &steps, const QuantizeTo *to, void *out,
           int threads) {
    if (to)
        binary_to(op, big, small, small_first, images, channels, positions, channels_last, threads,
                  QuantizedValues{*to, out}, &steps);
    else
        binary_to(op, big, small, small_first, images, channels, positions, channels_last, threads,
                  FloatValues{static_cast<float *>(out)}, &steps);
}

void binary(char op, const float *big, const float *small, bool small_first, int64_t images, int64_t channels,
            int64_t positions, bool channels_last, float *out, int threads) {
    binary_to(op, big, small, small_first, images, channels, positions, channels_last, threads, FloatValues{out});
}

void binary_quantized(char op, const float *big, const float *small, bool small_first, int64_t images,
                      int64_t channels, int64_t positions, bool channels_last, const QuantizeTo &to, void *out,
                      int threads) {
    binary_to(op, big, small, small_first, images, channels, positions, channels_last, threads,
              QuantizedValues{to, out});
}

void softmax(const float *x, int64_t rows, int64_t n, float *out, int threads) {
    const bool avx2 = eight_lanes();
    lpt_parallel::for_each(rows * n >= PARALLEL_WORK ? threads : 1, rows, [=](int64_t r) {
        const float *row = x + r * n;
        float *e = out + r * n;
        if (n > 0) softmax_row(row, n, e, avx2);
    });
}

void mean_of_rows(const float *x, int64_t rows, int64_t n, float *out, int threads) {
    auto sum = eight_lanes() ? sum_in_lanes_avx2 : sum_in_lanes;
    lpt_parallel::for_each(rows * n >= PARALLEL_WORK ? threads : 1,
                           rows, [=](int64_t r) { out[r] = sum(x + r * n, n) / (float)n; });
}

void extreme_of_positions(const float *x, int64_t images, int64_t positions, int64_t channels, bool smallest,
                          float *out, int threads) {
    constexpr int64_t BLOCK = 64;  // channels a task folds: a cache line of each position's values and more
    const int64_t blocks = (channels + BLOCK - 1) / BLOCK;
    lpt_parallel::for_each(images * positions * channels >= PARALLEL_WORK ? threads : 1, images * blocks, [=](int64_t task) {
        const int64_t n = task / blocks, c0 = task % blocks * BLOCK, c1 = std::min(channels, c0 + BLOCK);
        float *o = out + n * channels;
        const float *v = x + n * positions * channels;
        if (positions == 0) {
            std::fill(o + c0, o + c1, smallest ? INFINITY : -INFINITY);
            return;
        }
        std::copy(v + c0, v + c1, o + c0);
        for (int64_t t = 1; t < positions; ++t) {
            const float *row = v + t * channels;
            for (int64_t c = c0; c < c1; ++c) {
                const float m = o[c], y = row[c];
                o[c] = m == m && (y != y || (smallest ? y < m : y > m)) ? y : m;
            }
        }
    });
}

namespace {

// The extreme of n ≥ 8 values in lanes, and false where a value is NaN (the fold keeps the first) or the extreme
// is a zero (the fold keeps the first of −0 and +0, which compare equal): otherwise every value equal to the
// extreme has its bits, whichever the fold keeps. oww_melspectrogram's maximum of 160 values took 0.5 µs in
// the fold, each value's choice waiting for the last.
__attribute__((target("avx2"))) bool extreme_in_lanes_avx2(const float *x, int64_t n, bool smallest, float &extreme) {
    __m256 e = _mm256_loadu_ps(x), nan = _mm256_cmp_ps(e, e, _CMP_UNORD_Q);
    int64_t i = 8;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        e = smallest ? _mm256_min_ps(e, v) : _mm256_max_ps(e, v);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, e);
    float found = lanes[0];
    for (int k = 1; k < 8; ++k) found = smallest ? std::min(found, lanes[k]) : std::max(found, lanes[k]);
    for (; i < n; ++i) {
        if (x[i] != x[i]) return false;
        found = smallest ? std::min(found, x[i]) : std::max(found, x[i]);
    }
    if (_mm256_movemask_ps(nan) || found == 0.0f) return false;
    extreme = found;
    return true;
}

}  // namespace

void extreme_of_all(const float *x, int64_t n, bool smallest, float *out) {
    if (!(n >= 8 && eight_lanes() && extreme_in_lanes_avx2(x, n, smallest, *out)))
        extreme_of_positions(x, 1, n, 1, smallest, out, 1);
}

namespace {

// vsqrtps rounds as sqrtf does (IEEE's square root), a negative value's NaN the same default NaN. std::sqrt
// in a loop stays scalar here (without -fno-math-errno a negative value may call sqrtf to set errno):
// dnsmos_sig_bak_ovr's magnitudes, 900 × 161 values, took 59 µs so on two threads, 24 µs in eight lanes.
__attribute__((target("avx2"))) void square_root_avx2(const float *x, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i) out[i] = std::sqrt(x[i]);
}

}  // namespace

void square_root(const float *x, int64_t n, float *out, int threads) {
    const bool avx2 = eight_lanes();
    each_block(n, threads, [&](int64_t start, int64_t count) {
        if (avx2) square_root_avx2(x + start, count, out + start);
        else for (int64_t i = start; i < start + count; ++i) out[i] = std::sqrt(x[i]);
    });
}

void layer_norm(const float *x, int64_t rows, int64_t n, const float *scale, const float *bias, float epsilon,
                float *out, int threads) {
    const float count = (float)n;
    auto sum = eight_lanes() ? sum_in_lanes_avx2 : sum_in_lanes;
    if (n == 0) return;
    lpt_parallel::run(rows * n >= PARALLEL_WORK ? threads : 1, rows, 0, [&](lpt_parallel::Chunks &chunks) {
        std::vector<float> squares(n);
        for (int64_t r; chunks.next(r);) {
            const float *row = x + r * n;
            float *y = out + r * n;
            const float mean = sum(row, n) / count;
            for (int64_t i = 0; i < n; ++i) y[i] = row[i] - mean;  // d, in place of y
            for (int64_t i = 0; i < n; ++i) squares[i] = y[i] * y[i];
            const float deviation = std::sqrt(sum(squares.data(), n) / count + epsilon);
            for (int64_t i = 0; i < n; ++i) {
                const float v = y[i] / deviation * scale[i];
                y[i] = bias ? v + bias[i] : v;
            }
        }
    });
}

void moment_layer_norm(const float *x, int64_t images, int64_t channels, int64_t positions, float factor,
                       float epsilon, const float *scale, const float *bias, float *out, int threads) {
    constexpr int64_t BLOCK = 64;  // positions at a time: their sums stay in registers while the channels pass
    const int64_t blocks = (positions + BLOCK - 1) / BLOCK;
    const int loop_threads = images * channels * positions >= PARALLEL_WORK ? threads : 1;
    lpt_parallel::for_each(loop_threads, images * blocks, [=](int64_t task) {
        const int64_t n = task / blocks, first = task % blocks * BLOCK, count = std::min(BLOCK, positions - first);
        const float *image = x + n * channels * positions + first;
        float *y = out + n * channels * positions + first;
        float s1[BLOCK] = {}, s2[BLOCK] = {}, mean[BLOCK], inverse[BLOCK];
        for (int64_t c = 0; c < channels; ++c)
            for (int64_t t = 0; t < count; ++t) {
                const float v = image[c * positions + t];
                s1[t] += v;
                s2[t] += v * v;
            }
        for (int64_t t = 0; t < count; ++t) {
            mean[t] = s1[t] * factor;
            const float difference = s2[t] * factor - mean[t] * mean[t];
            const float variance = 0.0f >= difference ? 0.0f : difference;  // a NaN fails the test: kept
            inverse[t] = 1.0f / std::sqrt(variance + epsilon);
        }
        for (int64_t c = 0; c < channels; ++c)
            for (int64_t t = 0; t < count; ++t)
                y[c * positions + t] = (image[c * positions + t] - mean[t]) * (inverse[t] * scale[c]) + bias[c];
    });
}

namespace {

constexpr int DENSE_ROWS = 6;  // a tile's rows: 12 accumulators, 2 weight vectors and a broadcast in 16 registers

// One tile: rows r < R of columns [16·b, 16·b + 16), the sums before the bias into s[r][0 .. 16).
template <int R>
__attribute__((target("avx2"))) void dense_tile_avx2(const float *const *row, int64_t k, const float *block,
                                                     float (*s)[DENSE_COLUMNS]) {
    // Named registers, not an array: gcc kept an array of accumulators in registers but also stored it to
    // the stack at every step (ten stores a step for five rows: the loop ran at a third of its pace).
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0, a4 = a0,
           b4 = a0, a5 = a0, b5 = a0;
    for (int64_t i = 0; i < k; ++i) {
        const __m256 w0 = _mm256_loadu_ps(block + i * DENSE_COLUMNS), w1 = _mm256_loadu_ps(block + i * DENSE_COLUMNS + 8);
        const auto step = [&](__m256 &low, __m256 &high, const float *x) __attribute__((always_inline, target("avx2"))) {
            const __m256 v = _mm256_broadcast_ss(x + i);
            low = _mm256_add_ps(low, _mm256_mul_ps(v, w0));
            high = _mm256_add_ps(high, _mm256_mul_ps(v, w1));
        };
        step(a0, b0, row[0]);
        if (R > 1) step(a1, b1, row[1]);
        if (R > 2) step(a2, b2, row[2]);
        if (R > 3) step(a3, b3, row[3]);
        if (R > 4) step(a4, b4, row[4]);
        if (R > 5) step(a5, b5, row[5]);
    }
    const __m256 sums[DENSE_ROWS][2] = {{a0, b0}, {a1, b1}, {a2, b2}, {a3, b3}, {a4, b4}, {a5, b5}};
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(s[r] + 8 * h, sums[r][h]);
}

// Two blocks of columns (the second's weights `second` and sums t, or none: a last odd block) with sixteen
// columns per AVX-512 register, the same operations in the same order: twelve sums in flight, each add
// waiting for the one before. Products and adds apart (no FMA: lpt's order of roundings) keep it at about
// 16 products a cycle. oww_melspectrogram's STFT shape, 5 frames × 512 → 257 columns, on a Xeon with
// AMX: 14.1 µs on one thread against 17.0 with AVX2, 8.2 against 11.0 on two.
template <int R>
__attribute__((target("avx512f"))) void dense_tiles_512(const float *const *row, int64_t k, const float *first,
                                                        const float *second, float (*s)[DENSE_COLUMNS],
                                                        float (*t)[DENSE_COLUMNS]) {
    // named, not arrays: see dense_tile_avx2
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0;
    const bool two = second != nullptr;
    for (int64_t i = 0; i < k; ++i) {
        const __m512 v = _mm512_loadu_ps(first + i * DENSE_COLUMNS),
                     w = two ? _mm512_loadu_ps(second + i * DENSE_COLUMNS) : v;
        const auto step = [&](__m512 &low, __m512 &high, const float *x) __attribute__((always_inline, target("avx512f"))) {
            const __m512 value = _mm512_set1_ps(x[i]);
            low = _mm512_add_ps(low, _mm512_mul_ps(value, v));
            if (two) high = _mm512_add_ps(high, _mm512_mul_ps(value, w));
        };
        step(a0, b0, row[0]);
        if (R > 1) step(a1, b1, row[1]);
        if (R > 2) step(a2, b2, row[2]);
        if (R > 3) step(a3, b3, row[3]);
        if (R > 4) step(a4, b4, row[4]);
        if (R > 5) step(a5, b5, row[5]);
    }
    const __m512 sums[DENSE_ROWS][2] = {{a0, b0}, {a1, b1}, {a2, b2}, {a3, b3}, {a4, b4}, {a5, b5}};
    for (int r = 0; r < R; ++r) {
        _mm512_storeu_ps(s[r], sums[r][0]);
        if (two) _mm512_storeu_ps(t[r], sums[r][1]);
    }
}

void dense_tiles_wide(const float *const *row, int rows, int64_t k, const float *first, const float *second,
                      float (*s)[DENSE_COLUMNS], float (*t)[DENSE_COLUMNS]) {
    switch (rows) {
        case 1: return dense_tiles_512<1>(row, k, first, second, s, t);
        case 2: return dense_tiles_512<2>(row, k, first, second, s, t);
        case 3: return dense_tiles_512<3>(row, k, first, second, s, t);
        case 4: return dense_tiles_512<4>(row, k, first, second, s, t);
        case 5: return dense_tiles_512<5>(row, k, first, second, s, t);
        default: return dense_tiles_512<DENSE_ROWS>(row, k, first, second, s, t);
    }
}

void dense_tile(const float *const *row, int rows, int64_t k, const float *block, float (*s)[DENSE_COLUMNS], bool avx2) {
    if (avx2) {
        switch (rows) {
            case 1: return dense_tile_avx2<1>(row, k, block, s);
            case 2: return dense_tile_avx2<2>(row, k, block, s);
            case 3: return dense_tile_avx2<3>(row, k, block, s);
            case 4: return dense_tile_avx2<4>(row, k, block, s);
            case 5: return dense_tile_avx2<5>(row, k, block, s);
            default: return dense_tile_avx2<DENSE_ROWS>(row, k, block, s);
        }
    }
    for (int r = 0; r < rows; ++r)
        for (int64_t c = 0; c < DENSE_COLUMNS; ++c) {
            float sum = 0.0f;
            for (int64_t i = 0; i < k; ++i) sum = sum + row[r][i] * block[i * DENSE_COLUMNS + c];
            s[r][c] = sum;
        }
}

}  // namespace

std::vector<float> pack_dense_weights(const float *w, int64_t k, int64_t n) {
    const int64_t blocks = (n + DENSE_COLUMNS - 1) / DENSE_COLUMNS;
    std::vector<float> packed(blocks * k * DENSE_COLUMNS, 0.0f);
    for (int64_t i = 0; i < k; ++i)
        for (int64_t c = 0; c < n; ++c) packed[(c / DENSE_COLUMNS * k + i) * DENSE_COLUMNS + c % DENSE_COLUMNS] = w[i * n + c];
    return packed;
}

void dense(const float *a, int64_t groups, int64_t group_step, int64_t rows, int64_t row_step, int64_t k,
           const float *packed, int64_t n, const float *bias, bool columns_first, float *out, int threads) {
    const bool avx2 = eight_lanes(), wide = avx2 && lpt_s16::sixteen_lanes();
    const int64_t tiles = (rows + DENSE_ROWS - 1) / DENSE_ROWS, blocks = (n + DENSE_COLUMNS - 1) / DENSE_COLUMNS;
    const int64_t per_unit = wide ? 2 : 1, units = (blocks + per_unit - 1) / per_unit;  // blocks of columns a unit takes
    const int64_t work = groups * rows * k * n;
    lpt_parallel::for_each(work >= DENSE_PARALLEL_WORK ? threads : 1, groups * tiles * units, [=](int64_t unit) {
        // a unit's blocks of weights, then each tile of rows by them: they stay in the core's caches
        const int64_t b = unit / (groups * tiles) * per_unit, g = unit / tiles % groups, tile = unit % tiles;
        const int64_t first = tile * DENSE_ROWS, count = std::min<int64_t>(DENSE_ROWS, rows - first);
        const float *row[DENSE_ROWS];
        for (int64_t r = 0; r < count; ++r) row[r] = a + g * group_step + (first + r) * row_step;
        float s[2][DENSE_ROWS][DENSE_COLUMNS];
        const int64_t done = std::min(per_unit, blocks - b);
        if (wide)
            dense_tiles_wide(row, (int)count, k, packed + b * k * DENSE_COLUMNS,
                             done == 2 ? packed + (b + 1) * k * DENSE_COLUMNS : nullptr, s[0], s[1]);
        else
            dense_tile(row, (int)count, k, packed + b * k * DENSE_COLUMNS, s[0], avx2);
        float *o = out + g * rows * n;
        for (int64_t j = 0, c = b * DENSE_COLUMNS; j < done * DENSE_COLUMNS && c < n; ++j, ++c)
            for (int64_t r = 0; r < count; ++r) {
                const float sum = s[j / DENSE_COLUMNS][r][j % DENSE_COLUMNS];
                const float value = bias ? sum + bias[c] : sum;
                o[columns_first ? c * rows + first + r : (first + r) * n + c] = value;
            }
    });
}

}  // namespace lpt_ops
