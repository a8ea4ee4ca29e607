// An 8-bit output stage in AVX-512 registers, sixteen channels at a time, for kernels that keep their
// accumulators there: lpt_stem's (stem.cpp) and lpt_dw's (depthwise.cpp). Where it applies (in_registers): no
// post-op, or one clip (Relu, Clip, LeakyRelu), as lpt_s16's clipped stage; its levels are lpt_s16::stage's.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "levels512.h"
#include "s16.h"

namespace lpt_s16 {

// The output stage's constants for one block of sixteen channels, in registers. A Relu (a clip at 0, no slope, no
// upper bound) is the quantizer's lower bound: rint(clamp(max(0, x)·r, low, high)) = rint(clamp(x·r, max(0, low),
// high)), and so with x / scale, as rounding keeps the order and 0·r = 0 / scale = 0. Values below 2^-96 are not
// flushed to 0 (Epilogue::flush_tiny, which keeps them out of post-ops that would take them slowly): they
// give 0's level either way, the kernel's post-op is at most a clip, and acc·multiplier + bias falls below 2^-96
// only where it cancels to within that. dnsmos_sig_bak_ovr's 1 → 128 layer over 900×161 took 2.24 → 2.01 ms with
// those and levels_512's shorter form, and 1.36 with whole stores (store_bytes_16; Zen 4, 2 threads,
// lpt's layer alone; OpenVINO's 1.03 in its network).
struct BlockStage {
    __m512 multiplier, bias, slope, low, high;  // the post-op's clip, where it is not folded
    Quantizer512 quantizer;
    bool clipped, sloped, is_signed;
    // `fused`: the Epilogue's Levels (one fused product per value, the level clamped to [level_low, level_high])
    bool fused;
    __m512 level_multiplier, level_bias, level_low, level_high, near_half;
};

// The reference's levels of one vector of accumulators: lpt_s16's clipped stage, sixteen lanes (the bias added
// even where there is none: x + 0 is x but for −0, which quantizes as +0; the clip as max then min, each
// keeping a NaN as the comparisons do), then levels_512.
template <int N>
__attribute__((target("avx512f,avx512dq"), always_inline)) inline void reference_levels(const __m512i *acc,
                                                                                       const BlockStage &stage,
                                                                                       __m512i *levels) {
    __m512 x[N];
    for (int v = 0; v < N; ++v)
        x[v] = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[v]), stage.multiplier), stage.bias);
    if (stage.sloped)  // x < 0 ? x·slope : x
        for (int v = 0; v < N; ++v)
            x[v] = _mm512_mask_mul_ps(x[v], _mm512_cmp_ps_mask(x[v], _mm512_setzero_ps(), _CMP_LT_OQ), x[v],
                                      stage.slope);
    if (stage.clipped)
        for (int v = 0; v < N; ++v) x[v] = _mm512_min_ps(stage.high, _mm512_max_ps(stage.low, x[v]));
    levels_512_n<N>(x, stage.quantizer, levels);
}

// One vector by the reference, out of line: inlined into fused_levels' loop, its constants and registers crowded
// the fused product's. Static, each file its own copy: a call the compiler sees whole keeps its callers' registers
// (with one shared definition the stem kernel's 1 → 128 layer took 1.3 → 1.9-2.1 ms).
__attribute__((target("avx512f,avx512dq"), noinline)) static __m512i reference_levels_of(__m512i acc,
                                                                                 const BlockStage &stage) {
    __m512i levels;
    reference_levels<1>(&acc, stage, &levels);
    return levels;
}

// The same levels from one fused product each (Epilogue::Levels, prepare_clipped_levels says why they
// are the reference's): Y = RN(a·m' + b') clamped, its nearest integer, where Y lies at less than near_half from
// it; a vector with a lane next to a half again by reference_levels. dnsmos_sig_bak_ovr's 1 → 128 layer with a
// Relu over 900×161 (three runs alternating, in its program, Zen 4, 2 threads): 1.52-1.59 → 1.41-1.45 ms; with
// no stage at all it took 1.09-1.13.
template <int N>
__attribute__((target("avx512f,avx512dq"), always_inline)) inline void fused_levels(const __m512i *acc,
                                                                                   const BlockStage &stage,
                                                                                   __m512i *levels) {
    __mmask16 near[N], any = 0;
    for (int v = 0; v < N; ++v) {
        const __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[v]), stage.level_multiplier, stage.level_bias);
        near[v] = nearest_levels(_mm512_min_ps(_mm512_max_ps(y, stage.level_low), stage.level_high), stage.near_half,
                                 levels[v]);
        any |= near[v];
    }
    if (any)
        for (int v = 0; v < N; ++v)
            if (near[v]) levels[v] = reference_levels_of(acc[v], stage);
}

// fused_levels where the Levels have a bound per lane (Levels::lane_bound, `bound` its block's): a lane is next to a
// half where |Y − n| + |a|·bound reaches near_half, as lpt_s16's clipped_levels. A separate form: the stem kernel's
// four blocks at a time keep their constants in registers, which one more spilled (its 1 → 128 layer 1.27 → 1.7 ms).
template <int N>
__attribute__((target("avx512f,avx512dq"), always_inline)) inline void bounded_levels(const __m512i *acc,
                                                                                     const BlockStage &stage,
                                                                                     __m512 bound, __m512i *levels) {
    constexpr int NEAREST = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __mmask16 near[N], any = 0;
    for (int v = 0; v < N; ++v) {
        const __m512 a = _mm512_cvtepi32_ps(acc[v]);
        const __m512 y = _mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(a, stage.level_multiplier, stage.level_bias),
                                                     stage.level_low), stage.level_high);
        levels[v] = _mm512_cvt_roundps_epi32(y, NEAREST);
        const __m512 off = _mm512_fmadd_ps(_mm512_abs_ps(a), bound, _mm512_abs_ps(_mm512_reduce_ps(y, NEAREST)));
        near[v] = _mm512_cmp_ps_mask(off, stage.near_half, _CMP_GE_OQ);
        any |= near[v];
    }
    if (any)
        for (int v = 0; v < N; ++v)
            if (near[v]) levels[v] = reference_levels_of(acc[v], stage);
}

// Whether an Epilogue's stage runs in registers: an 8-bit destination after no post-op or one SLOPE_CLIP.
inline bool in_registers(const Epilogue &e) {
    return e.type != Epilogue::f32 && (e.post_op_count == 0 || (e.post_op_count == 1 && e.post_ops[0] == SLOPE_CLIP));
}

// e's constants that do not depend on the channel (in_registers(e)); block_constants sets the rest. The levels are
// fused where e's Levels apply, and where they have a bound per lane only if the caller takes it (`bounded`:
// bounded_levels).
__attribute__((target("avx512f"))) inline BlockStage block_stage(const Epilogue &e, bool bounded) {
    const bool clip = e.post_op_count == 1;
    const bool relu = clip && e.post_ops[1] == 1.0f && e.post_ops[2] == 0.0f && e.post_ops[3] == INFINITY;
    BlockStage stage{};
    stage.slope = _mm512_set1_ps(clip ? e.post_ops[1] : 1.0f);
    stage.low = _mm512_set1_ps(clip ? e.post_ops[2] : -INFINITY);
    stage.high = _mm512_set1_ps(clip ? e.post_ops[3] : INFINITY);
    stage.clipped = clip && !relu;
    stage.sloped = clip && e.post_ops[1] != 1.0f;
    stage.quantizer = quantizer_512(e.scale, e.zero_point, e.qmin, e.qmax);
    if (relu) stage.quantizer.low = _mm512_set1_ps(std::max((float)(e.qmin - e.zero_point), 0.0f));
    stage.is_signed = e.type == Epilogue::s8;
    const Epilogue::Levels &l = e.levels;
    stage.fused = levels_apply(e) && !stage.sloped && (bounded || !l.lane_bound);
    stage.level_low = _mm512_set1_ps(l.low), stage.level_high = _mm512_set1_ps(l.high);
    stage.near_half = _mm512_set1_ps(l.near_half);
    return stage;
}

// The constants of channels first … first + 15 (those past `lanes` zero; the Levels' arrays are padded to whole
// blocks of sixteen). Whole loads where every lane is: Zen 4 takes a masked one far more slowly, and the stem kernel
// sets a block's constants for each output row (dnsmos_sig_bak_ovr's 1 → 128 stem over 900×161: 1.1 → 2.4 ms with
// masked loads of whole blocks).
__attribute__((target("avx512f"))) inline void block_constants(BlockStage &stage, const Epilogue &e, int64_t first,
                                                             __mmask16 lanes) {
    stage.multiplier = load_16(e.multiplier + first, lanes);
    stage.bias = e.bias ? load_16(e.bias + first, lanes) : _mm512_setzero_ps();
    if (stage.fused) {
        stage.level_multiplier = _mm512_loadu_ps(e.levels.multiplier + first);
        stage.level_bias = _mm512_loadu_ps(e.levels.bias + first);
    }
}

}  // namespace lpt_s16
