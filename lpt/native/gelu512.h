// GELU sixteen lanes at a time: the reference's float32 operations (gelu_reference_512_n, lpt.kernels.gelu's
// bits), and a cheaper approximation (gelu_fast_512_n) that an 8-bit output stage uses where it gives the
// reference's level, as levels_512 uses a product for a quotient (s16.cpp: gelu_stage_512).
#pragma once

#include "exp.h"

#include <immintrin.h>

#include <cstdint>

namespace lpt_s16 {

// What the reference keeps in registers: the post-op's constants and erf's eight-entry tables (in the low
// half of a register: an interval k < 8 picks from there only).
struct GeluReference512 {
    __m512 divisor, one, half, centres, terms[lpt_exp::ERF_DEGREE + 1];
};

__attribute__((target("avx512f"))) inline GeluReference512 gelu_reference_512(float divisor, float one, float half) {
    GeluReference512 g;
    g.divisor = _mm512_set1_ps(divisor), g.one = _mm512_set1_ps(one), g.half = _mm512_set1_ps(half);
    g.centres = _mm512_castps256_ps512(_mm256_load_ps(lpt_exp::ERF_CENTRES));
    for (int j = 0; j <= lpt_exp::ERF_DEGREE; ++j)
        g.terms[j] = _mm512_castps256_ps512(_mm256_load_ps(lpt_exp::ERF_TERMS[j]));
    return g;
}

// x·(erf(x / divisor) + one)·half of N vectors in place: lpt_exp::erf_lanes_n's operations in the same
// order, so each lane the same bits, the N vectors' steps interleaved.
template <int N>
__attribute__((target("avx512f"), always_inline)) inline void gelu_reference_512_n(__m512 *x, const GeluReference512 &g) {
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f), four = _mm512_set1_ps(4.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u), seven = _mm512_set1_epi32(7);
    __m512 e[N], a[N], t[N], p[N];
    __m512i k[N];
    for (int v = 0; v < N; ++v) {
        e[v] = _mm512_div_ps(x[v], g.divisor);
        a[v] = _mm512_abs_ps(e[v]);
        // trunc(min(a·2, 7)): a NaN or a·2 past int32 converts to 2^31, which the unsigned min makes 7
        k[v] = _mm512_min_epu32(_mm512_cvttps_epi32(_mm512_mul_ps(a[v], two)), seven);
        t[v] = _mm512_sub_ps(a[v], _mm512_permutexvar_ps(k[v], g.centres));
        p[v] = _mm512_permutexvar_ps(k[v], g.terms[0]);
    }
    for (int d = 1; d <= lpt_exp::ERF_DEGREE; ++d)
        for (int v = 0; v < N; ++v) p[v] = _mm512_add_ps(_mm512_mul_ps(p[v], t[v]), _mm512_permutexvar_ps(k[v], g.terms[d]));
    for (int v = 0; v < N; ++v) {
        __m512 y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a[v], one, _CMP_LT_OQ), _mm512_sub_ps(one, p[v]),
                                        _mm512_mul_ps(a[v], p[v]));
        y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a[v], four, _CMP_LT_OQ), one, y);
        // the argument's sign (y is not negative), and a NaN argument as it is
        y = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y), _mm512_and_si512(_mm512_castps_si512(e[v]), sign)));
        y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(e[v], e[v], _CMP_UNORD_Q), e[v]);
        x[v] = _mm512_mul_ps(_mm512_mul_ps(x[v], _mm512_add_ps(y, g.one)), g.half);
    }
}

// The approximation, for the reference with divisor float32's √2, one 1 and half 0.5 (PaddleOCR's GELU):
// x·(erf(x/√2) + 1)/2 = max(x, 0) − R(|x|), R(a) = a·erfc(a/√2)/2, which is small and smooth, so a cubic
// per interval approximates it within 5.2e-7: u = min(|x|·4√2, GELU_FAST_LAST) (32 intervals over
// [0, 4√2), where the reference's erf reaches 1), k = floor(u), t = u − k, R ≈ ((c0·t + c1)·t + c2)·t + c3
// with fused multiply-adds, each coefficient picked from a 32-entry table by k (vpermt2ps). That is
// 4 table lookups and 3 FMAs, against the reference's 8 lookups, 12 operations, a compare, two blends and
// a division. The coefficients are numpy.polyfit's (float64, 400 Chebyshev points of each interval)
// rounded to float32. What the stage relies on is not the fit but this bound, checked for every float32
// below GELU_FAST_CHECKED_BELOW in magnitude by gelu_fast_worst_ratio (tests/native/test_native_gelu_fast.py;
// the largest ratio is 0.832, at x = 0, where the fit's constant term gives −5.0e-7):
//     |fast(x) − reference(x)| ≤ GELU_FAST_ABS + GELU_FAST_PER_U·u
// (u the clamped argument above, about 5.66·min(|x|, 4√2)). Past 4√2 the reference gives x, or −0 for a
// negative x, and the approximation x − R(4√2) (which rounds to x from 1 on) or −R(4√2), −4.4e-8.
constexpr float GELU_FAST_DIVISOR = 0x1.6a09e6p+0f, GELU_FAST_ONE = 1.0f, GELU_FAST_HALF = 0.5f;
constexpr float GELU_FAST_PER_UNIT = 0x1.6a09e6p+2f;  // float32's 4√2: intervals per unit of |x|
constexpr float GELU_FAST_LAST = 0x1.fffffep+4f;      // the largest float32 below 32
constexpr float GELU_FAST_ABS = 6e-7f, GELU_FAST_PER_U = 4.5e-8f;
constexpr double GELU_FAST_CHECKED_BELOW = 0x1p126;  // the reference's x·2 overflows from 2^127
constexpr int GELU_FAST_DEGREE = 3, GELU_FAST_INTERVALS = 32;
alignas(64) constexpr float GELU_FAST_TERMS[GELU_FAST_DEGREE + 1][GELU_FAST_INTERVALS] = {
    {1.288225758e-04, 3.687315620e-04, 5.590116489e-04, 6.775704096e-04, 7.158216904e-04, 6.790888729e-04,
     5.839033402e-04, 4.532331368e-04, 3.111039405e-04, 1.780060702e-04, 6.801592826e-05, -1.208048161e-05,
     -6.195684546e-05, -8.586001786e-05, -9.040031728e-05, -8.260914910e-05, -6.859759014e-05, -5.288988905e-05,
     -3.831857248e-05, -2.627964386e-05, -1.714468817e-05, -1.067658741e-05, -6.362405202e-06, -3.635165513e-06,
     -1.994276772e-06, -1.051762979e-06, -5.337494713e-07, -2.608476848e-07, -1.228436730e-07, -5.577981455e-08,
     -2.443242764e-08, -1.032761165e-08},
    {-1.254713628e-02, -1.215246785e-02, -1.103152148e-02, -9.336048737e-03, -7.284572348e-03, -5.121076945e-03,
     -3.072641324e-03, -1.315496047e-03, 4.425508814e-05, 9.734872147e-04, 1.500984654e-03, 1.697743544e-03,
     1.654767431e-03, 1.463528373e-03, 1.202251064e-03, 9.289360023e-04, 6.802558200e-04, 4.744672333e-04,
     3.162812209e-04, 2.019973617e-04, 1.238293917e-04, 7.296638069e-05, 4.137393262e-05, 2.259560461e-05,
     1.189408249e-05, 6.038232186e-06, 2.957877541e-06, 1.398711674e-06, 6.387236908e-07, 2.817553479e-07,
     1.200950663e-07, 4.947396448e-08},
    {8.840434998e-02, 6.372634321e-02, 4.055126011e-02, 2.018002234e-02, 3.545449814e-03, -8.880723268e-03,
     -1.709737256e-02, -2.150714025e-02, -2.279607952e-02, -2.179081365e-02, -1.932353154e-02, -1.612752490e-02,
     -1.277454011e-02, -9.653902613e-03, -6.985034794e-03, -4.850795027e-03, -3.239024896e-03, -2.082358580e-03,
     -1.290280139e-03, -7.711704238e-04, -4.448711697e-04, -2.478348615e-04, -1.333892869e-04, -6.938482693e-05,
     -3.489178562e-05, -1.696708023e-05, -7.980141163e-06, -3.630905439e-06, -1.598419203e-06, -6.809253819e-07,
     -2.807344117e-07, -1.120280970e-07},
    {-4.991543960e-07, 7.598559558e-02, 1.279283166e-01, 1.580072045e-01, 1.695288867e-01, 1.665057093e-01,
     1.531830877e-01, 1.335970163e-01, 1.112276092e-01, 8.878685534e-02, 6.814748794e-02, 5.039290339e-02,
     3.595099226e-02, 2.476922236e-02, 1.649295911e-02, 1.061975956e-02, 6.615285296e-03, 3.987918608e-03,
     2.327140886e-03, 1.314828522e-03, 7.193807978e-04, 3.811986244e-04, 1.956568158e-04, 9.728138684e-05,
     4.685852400e-05, 2.186749953e-05, 9.887451597e-06, 4.331754099e-06, 1.838882213e-06, 7.564300404e-07,
     3.015229595e-07, 1.164713410e-07},
};

inline bool gelu_fast_applies(float divisor, float one, float half) {
    return divisor == GELU_FAST_DIVISOR && one == GELU_FAST_ONE && half == GELU_FAST_HALF;
}

struct GeluFast512 {
    __m512 terms[GELU_FAST_DEGREE + 1][2], per_unit, last;
};

__attribute__((target("avx512f"))) inline GeluFast512 gelu_fast_512() {
    GeluFast512 g;
    for (int d = 0; d <= GELU_FAST_DEGREE; ++d)
        g.terms[d][0] = _mm512_load_ps(GELU_FAST_TERMS[d]), g.terms[d][1] = _mm512_load_ps(GELU_FAST_TERMS[d] + 16);
    g.per_unit = _mm512_set1_ps(GELU_FAST_PER_UNIT), g.last = _mm512_set1_ps(GELU_FAST_LAST);
    return g;
}

// The approximation of N vectors x into y, and each lane's clamped argument u (the bound's).
template <int N>
__attribute__((target("avx512f,avx512dq"), always_inline)) inline void gelu_fast_512_n(const __m512 *x,
                                                                                      const GeluFast512 &g, __m512 *y,
                                                                                      __m512 *u) {
    __m512 t[N], p[N];
    __m512i k[N];
    for (int v = 0; v < N; ++v) {
        u[v] = _mm512_min_ps(_mm512_mul_ps(_mm512_abs_ps(x[v]), g.per_unit), g.last);  // not negative, below 32
        k[v] = _mm512_cvttps_epi32(u[v]);                                               // floor(u)
        t[v] = _mm512_reduce_ps(u[v], _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);       // u − floor(u), exactly
        p[v] = _mm512_permutex2var_ps(g.terms[0][0], k[v], g.terms[0][1]);
    }
    for (int d = 1; d <= GELU_FAST_DEGREE; ++d)
        for (int v = 0; v < N; ++v)
            p[v] = _mm512_fmadd_ps(p[v], t[v], _mm512_permutex2var_ps(g.terms[d][0], k[v], g.terms[d][1]));
    for (int v = 0; v < N; ++v) y[v] = _mm512_sub_ps(_mm512_max_ps(x[v], _mm512_setzero_ps()), p[v]);
}

}  // namespace lpt_s16
