// GELU eight lanes at a time (AVX2 and FMA, a CPU without AVX-512): the reference's float32 operations
// (gelu_reference_256_n, lpt.kernels.gelu's bits), and a cheaper approximation (gelu_fast_256_n) that an
// 8-bit output stage uses where it gives the reference's level (s16.cpp: gelu_stage_256), as gelu512.h's
// does with sixteen lanes.
#pragma once

#include "exp.h"

#include <immintrin.h>

namespace lpt_s16 {

// x·(erf(x / divisor) + one)·half of N vectors in place: lpt_exp::erf_lanes_n's operations, the N vectors'
// steps interleaved.
template <int N>
__attribute__((target("avx2"), always_inline)) inline void gelu_reference_256_n(__m256 *x, __m256 divisor, __m256 one,
                                                                               __m256 half) {
    __m256 erf[N];
    for (int v = 0; v < N; ++v) erf[v] = _mm256_div_ps(x[v], divisor);
    lpt_exp::erf_lanes_n<N>(erf);
    for (int v = 0; v < N; ++v) x[v] = _mm256_mul_ps(_mm256_mul_ps(x[v], _mm256_add_ps(erf[v], one)), half);
}

// The approximation, for PaddleOCR's GELU (gelu512.h: GELU_FAST_DIVISOR, _ONE, _HALF): max(x, 0) − R(|x|),
// R(a) = a·erfc(a/√2)/2, as gelu512.h's, on 8 intervals instead of 32 so that each coefficient is one
// in-register lookup (vpermps) where AVX2 has no two-register one: u = min(|x|·√2, GELU_FAST8_LAST),
// k = floor(u), t = u − k, R ≈ a quintic in t with fused multiply-adds. 6 lookups and 5 FMAs against the
// reference's division, 8 lookups, 12 operations, a compare and two blends. The coefficients are
// numpy.polyfit's (float64, 600 Chebyshev points of each interval; the fit within 4.0e-7) rounded to
// float32. The stage relies on this bound, checked for every float32 below GELU_FAST_CHECKED_BELOW in
// magnitude by gelu_fast_worst_ratio (tests/native/test_native_gelu_fast.py):
//     |fast(x) − reference(x)| ≤ GELU_FAST8_ABS + GELU_FAST8_PER_U·u
constexpr float GELU_FAST8_PER_UNIT = 0x1.6a09e6p+0f;  // float32's √2: intervals per unit of |x|
constexpr float GELU_FAST8_LAST = 0x1.fffffep+2f;      // the largest float32 below 8
constexpr float GELU_FAST8_ABS = 6e-7f, GELU_FAST8_PER_U = 1.8e-7f;
constexpr int GELU_FAST8_DEGREE = 5;
alignas(32) constexpr float GELU_FAST8_TERMS[GELU_FAST8_DEGREE + 1][8] = {
    {-3.142347094e-03f, -2.415693598e-03f, 1.377732027e-03f, 8.102804422e-04f, -9.756028157e-05f, -9.570057591e-05f,
     -1.690217141e-05f, -1.319711600e-06f},
    {1.983072236e-02f, 1.589563035e-04f, -1.042194571e-02f, -2.380953170e-03f, 1.163833658e-03f, 5.205763737e-04f,
     7.704013115e-05f, 5.472171779e-06f},
    {-1.563725877e-03f, 4.656220600e-02f, 2.502909862e-02f, -3.046495374e-03f, -4.985119216e-03f, -1.330331201e-03f,
     -1.596012153e-04f, -9.981476978e-06f},
    {-1.991200745e-01f, -1.168140769e-01f, -1.220868726e-04f, 2.637868188e-02f, 1.098483428e-02f, 2.013711026e-03f,
     1.940966613e-04f, 1.042701842e-05f},
    {3.535242677e-01f, 1.420702878e-02f, -9.113917500e-02f, -5.109711736e-02f, -1.296191383e-02f, -1.780790742e-03f,
     -1.396549633e-04f, -6.393410786e-06f},
    {3.926000431e-07f, 1.695285290e-01f, 1.112272069e-01f, 3.595103696e-02f, 6.615341641e-03f, 7.193867932e-04f,
     4.685784006e-05f, 1.838736921e-06f},
};

struct GeluFast256 {
    __m256 terms[GELU_FAST8_DEGREE + 1], per_unit, last;
};

__attribute__((target("avx2"))) inline GeluFast256 gelu_fast_256() {
    GeluFast256 g;
    for (int d = 0; d <= GELU_FAST8_DEGREE; ++d) g.terms[d] = _mm256_load_ps(GELU_FAST8_TERMS[d]);
    g.per_unit = _mm256_set1_ps(GELU_FAST8_PER_UNIT), g.last = _mm256_set1_ps(GELU_FAST8_LAST);
    return g;
}

// The approximation of N vectors x into y, and each lane's clamped argument u (the bound's).
template <int N>
__attribute__((target("avx2,fma"), always_inline)) inline void gelu_fast_256_n(const __m256 *x, const GeluFast256 &g,
                                                                              __m256 *y, __m256 *u) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t[N], p[N];
    __m256i k[N];
    for (int v = 0; v < N; ++v) {
        u[v] = _mm256_min_ps(_mm256_mul_ps(_mm256_andnot_ps(sign, x[v]), g.per_unit), g.last);
        const __m256 whole = _mm256_round_ps(u[v], _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        k[v] = _mm256_cvttps_epi32(whole);
        t[v] = _mm256_sub_ps(u[v], whole);
        p[v] = _mm256_permutevar8x32_ps(g.terms[0], k[v]);
    }
    for (int d = 1; d <= GELU_FAST8_DEGREE; ++d)
        for (int v = 0; v < N; ++v) p[v] = _mm256_fmadd_ps(p[v], t[v], _mm256_permutevar8x32_ps(g.terms[d], k[v]));
    for (int v = 0; v < N; ++v) y[v] = _mm256_sub_ps(_mm256_max_ps(x[v], _mm256_setzero_ps()), p[v]);
}

}  // namespace lpt_s16
