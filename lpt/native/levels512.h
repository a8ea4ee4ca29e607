// The levels of an 8-bit output stage sixteen values at a time, from a product by the scale's reciprocal
// where that gives the quotient's integer: lpt_s16's stages (s16.cpp) and lpt_stem's kernel (stem.cpp).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace lpt_s16 {

// rint(clamp(x / scale, low, high)) (low = qmin − zero_point, high = qmax − zero_point) from a product
// where that gives the same integer (vdivps takes 10 cycles per 16 lanes on an Intel core). With
// r = RN(1/scale), y' = RN(x·r) and y = RN(x / scale), |y' − y| ≤ |x / scale|·(3·2^-24 + 2^-48) (three
// roundings), below 3.02·2^-24·bound where y' lies in [low, high] and bound = max(|low|, |high|, 1) (near
// zero a subnormal's absolute error is far smaller). So where y' is at less than near_half =
// 1/2 − 2^-21·bound from its nearest integer n, y is too, and no half lies between them: rint(y) = n.
// Where y' is clamped, y lies beyond the same bound's half. Otherwise (a share of about 2^-20·bound of
// the values, those next to a half) the quotient is computed. A scale whose reciprocal is not a normal
// float divides always (near_half −1).
struct Reciprocal {
    float value, near_half;
};
inline Reciprocal reciprocal(float scale, int zero_point, int qmin, int qmax) {
    const float r = 1.0f / scale;
    if (!(std::isnormal(scale) && std::isnormal(r))) return {0.0f, -1.0f};
    const float bound = std::max({std::fabs((float)(qmin - zero_point)), std::fabs((float)(qmax - zero_point)), 1.0f});
    return {r, 0.5f - bound * 0x1p-21f};
}

// store_quantized's constants, sixteen lanes per register.
struct Quantizer512 {
    __m512 scale, reciprocal, near_half, low, high;
    __m512i zero_point;
};

__attribute__((target("avx512f"))) inline Quantizer512 quantizer_512(float scale, int zero_point, int qmin, int qmax) {
    const Reciprocal r = reciprocal(scale, zero_point, qmin, qmax);
    return {_mm512_set1_ps(scale), _mm512_set1_ps(r.value), _mm512_set1_ps(r.near_half),
            _mm512_set1_ps((float)(qmin - zero_point)), _mm512_set1_ps((float)(qmax - zero_point)),
            _mm512_set1_epi32(zero_point)};
}

// y's nearest integers (half to even), and the lanes where y lies at near_half or more from them: next to a half.
__attribute__((target("avx512f,avx512dq"), always_inline)) inline __mmask16 nearest_levels(__m512 y, __m512 near_half,
                                                                                           __m512i &levels) {
    constexpr int NEAREST = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    levels = _mm512_cvt_roundps_epi32(y, NEAREST);
    return _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_reduce_ps(y, NEAREST)), near_half, _CMP_GE_OQ);
}

// store_quantized's levels of sixteen values as int32: rint(clamp(x / scale)) + zero_point, the product
// with the reciprocal standing for the quotient where it gives the same integer (Reciprocal). 200 704
// values on one thread of a Xeon: 29 µs, against 39 dividing; with eight lanes (store_quantized) the
// checks cost what they save, so AVX2 divides. vreduceps gives y − rint(y) for the test in one operation,
// vcvtps2dq rounds half to even (lpt_stem's 1 → 128 layer over 900×161 with it, 2 threads on a Zen 4: 2.24 →
// 2.01 ms, against the magic-number rounding and a subtraction before).
// levels_512 of N vectors at once (their chains interleave; one test of all N for a value next to a half).
template <int N>
__attribute__((target("avx512f,avx512dq"), always_inline)) inline void levels_512_n(const __m512 *x,
                                                                                   const Quantizer512 &q,
                                                                                   __m512i *levels) {
    constexpr int NEAREST = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __mmask16 near[N], any = 0;
    for (int v = 0; v < N; ++v) {
        const __m512 y = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x[v], q.reciprocal), q.low), q.high);
        near[v] = nearest_levels(y, q.near_half, levels[v]);
        any |= near[v];
    }
    if (any)
        for (int v = 0; v < N; ++v)
            if (near[v]) {  // next to a half: the quotient's level
                const __m512 exact = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(x[v], q.scale), q.low), q.high);
                levels[v] = _mm512_mask_mov_epi32(levels[v], near[v], _mm512_cvt_roundps_epi32(exact, NEAREST));
            }
    for (int v = 0; v < N; ++v) levels[v] = _mm512_add_epi32(levels[v], q.zero_point);
}

// Sixteen values from `from`, those of `lanes` (0 in the others): a masked load only where some lane is left out,
// which Zen 4 takes far more slowly than a whole one (a quantization of 1.2 M values, 2 threads: 0.42 → 0.17 ms).
__attribute__((target("avx512f"))) inline __m512 load_16(const float *from, __mmask16 lanes) {
    return lanes == 0xFFFF ? _mm512_loadu_ps(from) : _mm512_maskz_loadu_ps(lanes, from);
}
__attribute__((target("avx512f"))) inline __m512i load_16(const int32_t *from, __mmask16 lanes) {
    return lanes == 0xFFFF ? _mm512_loadu_si512(from) : _mm512_maskz_loadu_epi32(lanes, from);
}

// The bytes of `lanes` into out: a masked store only where some lane is left out, which Zen 4 takes far more
// slowly than a whole one (lpt_stem's 1 → 128 layer over 900×161, 18.5 MB out: 2.0 → 1.4 ms, 2 threads).
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void store_bytes_16(T *out, __mmask16 lanes,
                                                                                 __m128i bytes) {
    if (lanes == 0xFFFF)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out), bytes);
    else
        _mm_mask_storeu_epi8(out, lanes, bytes);
}

__attribute__((target("avx512f,avx512dq"))) inline __m512i levels_512(__m512 x, const Quantizer512 &q) {
    __m512i level;
    levels_512_n<1>(&x, q, &level);
    return level;
}

}  // namespace lpt_s16
