// lpt's float32 exp, Sigmoid, tanh, erf and log, the sequences of float32 operations lpt/numerics/exp.py spells out and
// explains (they are lpt's NumPy kernels'). Built with -ffp-contract=off, each line below is the same
// rounded operation as there; s16.cpp has the eight-lane forms, built from these constants.
#pragma once

#include <immintrin.h>

#include <initializer_list>

namespace lpt_exp {

constexpr float LOW = -86.0f, HIGH = 87.0f;
constexpr float LOG2E = 1.44269504088896341f;
constexpr float ROUND = 12582912.0f;  // 1.5·2^23
constexpr float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
constexpr float P0 = 1.9875691500e-4f, P1 = 1.3981999507e-3f, P2 = 8.3334519073e-3f, P3 = 4.1665795894e-2f,
                P4 = 1.6666665459e-1f, P5 = 5.0000001201e-1f;

constexpr float TANH_NEAR[] = {-5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f,
                                -3.33332819422e-1f};
constexpr float TANH_SPLIT = 0.625f;

// ERF_TERMS[j][k]: the coefficient of t^(6 − j) on the half unit k of [0, 4) (exp.py says how they were fitted)
constexpr int ERF_DEGREE = 6;
alignas(32) constexpr float ERF_TERMS[ERF_DEGREE + 1][8] = {
    {-1.797866449e-02f, 1.421151496e-02f, -2.059773728e-02f, -9.049494751e-03f, 2.779565286e-03f, 1.667850534e-03f,
     2.737584582e-04f, 2.069242328e-05f},
    {-3.496961668e-02f, -3.727068380e-02f, 4.677693173e-02f, -5.969540216e-03f, -1.058114227e-02f, -2.825833391e-03f,
     -3.326159786e-04f, -2.020526335e-05f},
    {8.901758492e-02f, -2.486116998e-02f, 6.132035051e-03f, 4.810552299e-02f, 1.908825710e-02f, 3.257710487e-03f,
     2.861694375e-04f, 1.378540856e-05f},
    {1.046917588e-01f, 1.693242341e-01f, -1.675230861e-01f, -9.017766267e-02f, -2.172697894e-02f, -2.758207032e-03f,
     -1.952192833e-04f, -7.911728062e-06f},
    {-3.353509605e-01f, -1.002174690e-01f, 2.956517339e-01f, 9.235620499e-02f, 1.607015729e-02f, 1.612267457e-03f,
     9.486933413e-05f, 3.306070994e-06f},
    {-1.811654866e-01f, -4.070351124e-01f, -2.365212291e-01f, -5.277483538e-02f, -7.142299786e-03f, -5.862942780e-04f,
     -2.919364670e-05f, -8.818866490e-07f},
    {1.105305552e+00f, 9.482074976e-01f, 7.709987462e-02f, 1.332832873e-02f, 1.462716726e-03f, 1.006219100e-04f,
     4.302769867e-06f, 1.137258892e-07f},
};
constexpr float LOG_TERMS[] = {7.0376836292e-2f, -1.1514610310e-1f, 1.1676998740e-1f, -1.2420140846e-1f,
                               1.4249322787e-1f, -1.6668057665e-1f, 2.0000714765e-1f, -2.4999993993e-1f,
                               3.3333331174e-1f};
constexpr float SQRT_HALF = 0.707106781186547524f, SMALLEST_NORMAL = 1.17549435e-38f, TWO_TO_23 = 8388608.0f;

alignas(32) constexpr float ERF_CENTRES[8] = {0.25f, 0.75f, 1.25f, 1.75f, 2.25f, 2.75f, 3.25f, 3.75f};

inline float exp(float t) {
    if (t != t) return t;
    t = t >= LOW ? t : LOW;
    t = t <= HIGH ? t : HIGH;
    const float n = (t * LOG2E + ROUND) - ROUND;
    const float r = (t - n * LN2_HI) - n * LN2_LO;
    float p = P0;
    p = p * r + P1;
    p = p * r + P2;
    p = p * r + P3;
    p = p * r + P4;
    p = p * r + P5;
    const int bits = ((int)n + 127) << 23;
    float two_to_n;
    __builtin_memcpy(&two_to_n, &bits, sizeof two_to_n);
    return ((p * (r * r) + r) + 1.0f) * two_to_n;
}

inline float log(float x) {
    if (x != x) return x;
    if (x < 0.0f) return __builtin_nanf("");
    if (x == 0.0f) return -__builtin_inff();
    if (x == __builtin_inff()) return x;
    const bool subnormal = x < SMALLEST_NORMAL;
    const float normal = subnormal ? x * TWO_TO_23 : x;
    int bits;
    __builtin_memcpy(&bits, &normal, sizeof bits);
    const int e = ((bits >> 23) & 0xFF) - 126 - (subnormal ? 23 : 0);
    bits = (bits & 0x007FFFFF) | 0x3F000000;
    float m;
    __builtin_memcpy(&m, &bits, sizeof m);
    const bool below = m < SQRT_HALF;
    const float f = (below ? m + m : m) - 1.0f, fe = (float)(e - (below ? 1 : 0)), z = f * f;
    float q = LOG_TERMS[0];
    for (int i = 1; i < 9; ++i) q = q * f + LOG_TERMS[i];
    float y = (q * f) * z;
    y = y + fe * LN2_LO;
    y = y - 0.5f * z;
    return (f + y) + fe * LN2_HI;
}

inline float sigmoid(float x) {
    if (x != x) return x;
    return 1.0f / (1.0f + exp(-x));
}

inline float tanh(float x) {
    if (x != x) return x;
    const float a = x < 0.0f ? -x : x;
    if (a < TANH_SPLIT) {
        const float z = x * x;
        float p = TANH_NEAR[0];
        for (int i = 1; i < 5; ++i) p = p * z + TANH_NEAR[i];
        return __builtin_copysignf(p * z * x + x, x);
    }
    return __builtin_copysignf(1.0f - 2.0f / (exp(a + a) + 1.0f), x);
}

inline float erf(float x) {
    if (x != x) return x;
    const float a = x < 0.0f ? -x : x;
    if (!(a < 4.0f)) return __builtin_copysignf(1.0f, x);
    const int k = (int)(a * 2.0f);  // below 8 here: fmin's 7 changes nothing
    const float t = a - ERF_CENTRES[k];
    float p = ERF_TERMS[0][k];
    for (int j = 1; j <= ERF_DEGREE; ++j) p = p * t + ERF_TERMS[j][k];
    return __builtin_copysignf(a < 1.0f ? a * p : 1.0f - p, x);
}

// exp on N vectors of eight lanes, in place, the same float32 operations in the same order: max(t, LOW)
// gives LOW for a NaN, as t >= LOW ? t : LOW does, and the NaN lanes take their input at the end. Each
// step runs over the N vectors before the next: their chains of dependent operations interleave, so
// that one's latency hides behind another's work.
template <int N>
__attribute__((target("avx2"))) inline void exp_lanes_n(__m256 *t) {
    const __m256 round = _mm256_set1_ps(ROUND);
    __m256 n[N], r[N], p[N];
    for (int v = 0; v < N; ++v) {
        const __m256 clamped = _mm256_min_ps(_mm256_max_ps(t[v], _mm256_set1_ps(LOW)), _mm256_set1_ps(HIGH));
        n[v] = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(clamped, _mm256_set1_ps(LOG2E)), round), round);
        r[v] = _mm256_sub_ps(_mm256_sub_ps(clamped, _mm256_mul_ps(n[v], _mm256_set1_ps(LN2_HI))),
                             _mm256_mul_ps(n[v], _mm256_set1_ps(LN2_LO)));
        p[v] = _mm256_set1_ps(P0);
    }
    for (const float c : {P1, P2, P3, P4, P5})
        for (int v = 0; v < N; ++v) p[v] = _mm256_add_ps(_mm256_mul_ps(p[v], r[v]), _mm256_set1_ps(c));
    for (int v = 0; v < N; ++v) {
        const __m256 two_to_n = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n[v]), _mm256_set1_epi32(127)), 23));
        const __m256 e = _mm256_mul_ps(_mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p[v], _mm256_mul_ps(r[v], r[v])), r[v]),
                                                     _mm256_set1_ps(1.0f)), two_to_n);
        t[v] = _mm256_blendv_ps(e, t[v], _mm256_cmp_ps(t[v], t[v], _CMP_UNORD_Q));
    }
}

__attribute__((target("avx2"))) inline __m256 exp_lanes(__m256 t) {
    exp_lanes_n<1>(&t);
    return t;
}

// exp_lanes_n on vectors of sixteen lanes: the same operations, each on twice the lanes.
template <int N>
__attribute__((target("avx512f"))) inline void exp_lanes_512_n(__m512 *t) {
    const __m512 round = _mm512_set1_ps(ROUND);
    __m512 n[N], r[N], p[N];
    for (int v = 0; v < N; ++v) {
        const __m512 clamped = _mm512_min_ps(_mm512_max_ps(t[v], _mm512_set1_ps(LOW)), _mm512_set1_ps(HIGH));
        n[v] = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(LOG2E)), round), round);
        r[v] = _mm512_sub_ps(_mm512_sub_ps(clamped, _mm512_mul_ps(n[v], _mm512_set1_ps(LN2_HI))),
                             _mm512_mul_ps(n[v], _mm512_set1_ps(LN2_LO)));
        p[v] = _mm512_set1_ps(P0);
    }
    for (const float c : {P1, P2, P3, P4, P5})
        for (int v = 0; v < N; ++v) p[v] = _mm512_add_ps(_mm512_mul_ps(p[v], r[v]), _mm512_set1_ps(c));
    for (int v = 0; v < N; ++v) {
        const __m512 two_to_n = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n[v]), _mm512_set1_epi32(127)), 23));
        const __m512 e = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p[v], _mm512_mul_ps(r[v], r[v])), r[v]),
                                                     _mm512_set1_ps(1.0f)), two_to_n);
        t[v] = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(t[v], t[v], _CMP_UNORD_Q), e, t[v]);
    }
}

// sigmoid on N vectors of eight lanes, in place (their exps interleaved, as exp_lanes_n's): the NaN lanes
// take x.
template <int N>
__attribute__((target("avx2"))) inline void sigmoid_lanes_n(__m256 *x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 e[N];
    for (int v = 0; v < N; ++v) e[v] = _mm256_xor_ps(x[v], _mm256_set1_ps(-0.0f));
    exp_lanes_n<N>(e);
    for (int v = 0; v < N; ++v)
        x[v] = _mm256_blendv_ps(_mm256_div_ps(one, _mm256_add_ps(one, e[v])), x[v], _mm256_cmp_ps(x[v], x[v], _CMP_UNORD_Q));
}

__attribute__((target("avx2"))) inline __m256 sigmoid_lanes(__m256 x) {
    sigmoid_lanes_n<1>(&x);
    return x;
}

// tanh on N vectors of eight lanes, in place (their exps interleaved, as exp_lanes_n's): both ranges
// computed, each lane taking its own.
template <int N>
__attribute__((target("avx2"))) inline void tanh_lanes_n(__m256 *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 a[N], e[N];
    for (int v = 0; v < N; ++v) {
        a[v] = _mm256_andnot_ps(sign, x[v]);
        e[v] = _mm256_add_ps(a[v], a[v]);
    }
    exp_lanes_n<N>(e);
    for (int v = 0; v < N; ++v) {
        const __m256 z = _mm256_mul_ps(x[v], x[v]);
        __m256 p = _mm256_set1_ps(TANH_NEAR[0]);
        for (int i = 1; i < 5; ++i) p = _mm256_add_ps(_mm256_mul_ps(p, z), _mm256_set1_ps(TANH_NEAR[i]));
        const __m256 near = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, z), x[v]), x[v]);
        const __m256 far = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e[v], one)));
        __m256 y = _mm256_blendv_ps(far, near, _mm256_cmp_ps(a[v], _mm256_set1_ps(TANH_SPLIT), _CMP_LT_OQ));
        y = _mm256_or_ps(_mm256_andnot_ps(sign, y), _mm256_and_ps(x[v], sign));  // x's sign (copysign)
        x[v] = _mm256_blendv_ps(y, x[v], _mm256_cmp_ps(x[v], x[v], _CMP_UNORD_Q));
    }
}

__attribute__((target("avx2"))) inline __m256 tanh_lanes(__m256 x) {
    tanh_lanes_n<1>(&x);
    return x;
}

// erf on N vectors of eight lanes, in place, their steps interleaved as exp_lanes_n's: each lane's
// coefficients picked from the eight-lane tables by its interval k (vpermps), so that every lane takes one
// polynomial; min(a·2, 7) gives 7 for a NaN, as fmin does, and the NaN lanes take x at the end.
template <int N>
__attribute__((target("avx2"))) inline void erf_lanes_n(__m256 *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f), four = _mm256_set1_ps(4.0f);
    const __m256 centres = _mm256_load_ps(ERF_CENTRES);
    __m256 a[N], t[N], p[N];
    __m256i k[N];
    for (int v = 0; v < N; ++v) {
        a[v] = _mm256_andnot_ps(sign, x[v]);
        k[v] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_mul_ps(a[v], _mm256_set1_ps(2.0f)), _mm256_set1_ps(7.0f)));
        t[v] = _mm256_sub_ps(a[v], _mm256_permutevar8x32_ps(centres, k[v]));
        p[v] = _mm256_permutevar8x32_ps(_mm256_load_ps(ERF_TERMS[0]), k[v]);
    }
    for (int j = 1; j <= ERF_DEGREE; ++j) {
        const __m256 terms = _mm256_load_ps(ERF_TERMS[j]);
        for (int v = 0; v < N; ++v)
            p[v] = _mm256_add_ps(_mm256_mul_ps(p[v], t[v]), _mm256_permutevar8x32_ps(terms, k[v]));
    }
    for (int v = 0; v < N; ++v) {
        __m256 y = _mm256_blendv_ps(_mm256_sub_ps(one, p[v]), _mm256_mul_ps(a[v], p[v]), _mm256_cmp_ps(a[v], one, _CMP_LT_OQ));
        y = _mm256_blendv_ps(one, y, _mm256_cmp_ps(a[v], four, _CMP_LT_OQ));
        y = _mm256_or_ps(y, _mm256_and_ps(x[v], sign));  // x's sign: y is not negative
        x[v] = _mm256_blendv_ps(y, x[v], _mm256_cmp_ps(x[v], x[v], _CMP_UNORD_Q));
    }
}

__attribute__((target("avx2"))) inline __m256 erf_lanes(__m256 x) {
    erf_lanes_n<1>(&x);
    return x;
}

// log on eight lanes: every lane takes the polynomial, then the special values their own (NaN below 0 and
// for NaN, −inf at ±0, +inf at +inf).
__attribute__((target("avx2"))) inline __m256 log_lanes(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 subnormal = _mm256_cmp_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(SMALLEST_NORMAL), _CMP_LT_OQ);
    const __m256i bits = _mm256_castps_si256(_mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(TWO_TO_23)), subnormal));
    __m256i e = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(0xFF)), _mm256_set1_epi32(126));
    e = _mm256_sub_epi32(e, _mm256_and_si256(_mm256_castps_si256(subnormal), _mm256_set1_epi32(23)));
    const __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007FFFFF)),
                                                         _mm256_set1_epi32(0x3F000000)));
    const __m256 below = _mm256_cmp_ps(m, _mm256_set1_ps(SQRT_HALF), _CMP_LT_OQ);
    const __m256 f = _mm256_sub_ps(_mm256_blendv_ps(m, _mm256_add_ps(m, m), below), one);
    const __m256 fe = _mm256_cvtepi32_ps(_mm256_add_epi32(e, _mm256_castps_si256(below)));  // below: all bits set, −1
    const __m256 z = _mm256_mul_ps(f, f);
    __m256 q = _mm256_set1_ps(LOG_TERMS[0]);
    for (int i = 1; i < 9; ++i) q = _mm256_add_ps(_mm256_mul_ps(q, f), _mm256_set1_ps(LOG_TERMS[i]));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(q, f), z);
    y = _mm256_add_ps(y, _mm256_mul_ps(fe, _mm256_set1_ps(LN2_LO)));
    y = _mm256_sub_ps(y, _mm256_mul_ps(_mm256_set1_ps(0.5f), z));
    y = _mm256_add_ps(_mm256_add_ps(f, y), _mm256_mul_ps(fe, _mm256_set1_ps(LN2_HI)));
    const __m256 zero = _mm256_setzero_ps(), infinity = _mm256_set1_ps(__builtin_inff());
    y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_nanf("")), _mm256_cmp_ps(x, zero, _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_xor_ps(infinity, sign), _mm256_cmp_ps(x, zero, _CMP_EQ_OQ));
    y = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, infinity, _CMP_EQ_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

}  // namespace lpt_exp
