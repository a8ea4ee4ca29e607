// lpt's kernel for convolutions with few products per output (stem.h says why and what).
//
// One task per output row: the kernel's kh source rows are copied, flipped to u8 where signed and
// padded with the zero point, into rows of their own (so no bound is tested per position), then for
// each block of sixteen output channels, eight positions at a time (or four blocks, two positions at a
// time: four_blocks), each kernel row's words are broadcast and multiplied in, and the output stage
// follows in registers. The padding holds the zero point, so every output sums all its products of
// (q − zp)·w: acc = Σ q·w − zp·Σ w, the correction one product per channel.

#include "stem.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "parallel.h"
#include "stage512.h"

namespace lpt_stem {
namespace {

constexpr int64_t LANES = 16;
constexpr int64_t POSITIONS = 8;             // positions at a time: their accumulators in registers
constexpr int64_t FOUR_BLOCK_POSITIONS = 2;  // four_blocks' positions at a time (it says why)
constexpr int64_t PARALLEL_WORK = 1 << 14;   // output values below which one thread runs the layer
constexpr int64_t ROW_SLACK = 4 * MAX_WORDS; // read past a padded row by its last positions' last word
constexpr int64_t FEW_PRODUCTS = 32;         // as lpt/native/routes.py's

using lpt_s16::BlockStage;
using lpt_s16::fused_levels;
using lpt_s16::reference_levels;

// N positions of one block of sixteen channels: their accumulators, then their output stage into out (rows
// of `channels` bytes).
template <int N>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"), always_inline)) inline void positions(
        const uint8_t *const *rows, int64_t kernel_h, int64_t words, int64_t step, const int32_t *block_words,
        int64_t block_stride, __m512i correction, __mmask16 lanes, const BlockStage &stage, uint8_t *out,
        int64_t channels) {
    __m512i acc[N];
    for (int v = 0; v < N; ++v) acc[v] = _mm512_setzero_si512();
    for (int64_t ky = 0; ky < kernel_h; ++ky)
        for (int64_t d = 0; d < words; ++d) {
            const __m512i weights = _mm512_load_si512(block_words + (ky * words + d) * block_stride);
            const uint8_t *at = rows[ky] + 4 * d;
            for (int v = 0; v < N; ++v) {
                int32_t word;
                std::memcpy(&word, at + v * step, 4);
                acc[v] = _mm512_dpbusd_epi32(acc[v], _mm512_set1_epi32(word), weights);
            }
        }
    for (int v = 0; v < N; ++v) acc[v] = _mm512_sub_epi32(acc[v], correction);
    __m512i levels[N];
    if (stage.fused)
        fused_levels<N>(acc, stage, levels);
    else
        reference_levels<N>(acc, stage, levels);
    for (int v = 0; v < N; ++v) {
        const __m128i bytes = stage.is_signed ? _mm512_cvtsepi32_epi8(levels[v]) : _mm512_cvtusepi32_epi8(levels[v]);
        lpt_s16::store_bytes_16(out + v * channels, lanes, bytes);
    }
}

// Four whole blocks of sixteen channels of N positions, where the stage is fused_levels': each source word
// broadcast once for the four, and a position's 64 levels packed into one store of a whole cache line
// (vpackssdw, vpack[us|ss]wb, which give per 128-bit lane four channels of each block, then vpermd) instead
// of four conversions of two operations each and four stores of 16 bytes. dnsmos_sig_bak_ovr's 1 → 128 layer
// (its program, Zen 4, 2 threads): 1.34-1.40 → 1.04-1.08 ms (OpenVINO's 1.1); two positions at a time, as
// one took 1.26-1.32, three 1.53-1.57 and four 2.1-2.5 (their registers spilled). Streaming the stores past the
// caches (_mm512_stream_si512): 1.16-1.19, and the next layer, which reads them, no faster.
template <int N>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"), always_inline)) inline void four_blocks(
        const uint8_t *const *rows, int64_t kernel_h, int64_t words, int64_t step, const int32_t *block_words,
        int64_t block_stride, const __m512i *correction, const BlockStage *stage, uint8_t *out, int64_t channels) {
    __m512i acc[4][N];
    for (int j = 0; j < 4; ++j)
        for (int v = 0; v < N; ++v) acc[j][v] = _mm512_setzero_si512();
    for (int64_t ky = 0; ky < kernel_h; ++ky)
        for (int64_t d = 0; d < words; ++d) {
            const int32_t *weights = block_words + (ky * words + d) * block_stride;
            const uint8_t *at = rows[ky] + 4 * d;
            for (int v = 0; v < N; ++v) {
                int32_t word;
                std::memcpy(&word, at + v * step, 4);
                const __m512i source = _mm512_set1_epi32(word);
                for (int j = 0; j < 4; ++j)
                    acc[j][v] = _mm512_dpbusd_epi32(acc[j][v], source, _mm512_load_si512(weights + j * LANES));
            }
        }
    __m512i levels[4][N];
    for (int j = 0; j < 4; ++j) {
        for (int v = 0; v < N; ++v) acc[j][v] = _mm512_sub_epi32(acc[j][v], correction[j]);
        fused_levels<N>(acc[j], stage[j], levels[j]);
    }
    // dword 4i + j of the packed bytes holds channels 4i … 4i + 3 of block j: block j's are dwords 4j … 4j + 3
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int v = 0; v < N; ++v) {
        const __m512i first = _mm512_packs_epi32(levels[0][v], levels[1][v]);
        const __m512i second = _mm512_packs_epi32(levels[2][v], levels[3][v]);
        const __m512i bytes =
                stage[0].is_signed ? _mm512_packs_epi16(first, second) : _mm512_packus_epi16(first, second);
        _mm512_storeu_si512(out + v * channels, _mm512_permutexvar_epi32(order, bytes));
    }
}

// The output stage of a row's `count` positions into out (rows of `channels` bytes), the first one's kernel
// rows at rows[ky].
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))) void output_row(
        const uint8_t *const *rows, int64_t kernel_h, int64_t step, int64_t count, const Weights &w, int zero_point,
        int64_t channels, const lpt_s16::Epilogue &e, uint8_t *out) {
    const int64_t block_stride = w.blocks * LANES;
    BlockStage stage = lpt_s16::block_stage(e, false);
    if (stage.fused && channels % (4 * LANES) == 0) {
        for (int64_t b = 0; b < w.blocks; b += 4) {
            BlockStage stages[4] = {stage, stage, stage, stage};
            __m512i corrections[4];
            for (int j = 0; j < 4; ++j) {
                const int64_t first = (b + j) * LANES;
                corrections[j] = _mm512_mullo_epi32(_mm512_set1_epi32(zero_point),
                                                    _mm512_loadu_si512(w.sums.data() + first));
                lpt_s16::block_constants(stages[j], e, first, (__mmask16)0xFFFF);
            }
            const int32_t *block_words = w.words.data() + b * LANES;
            const uint8_t *at[FEW_PRODUCTS];
            int64_t p = 0;
            for (; p + FOUR_BLOCK_POSITIONS <= count; p += FOUR_BLOCK_POSITIONS) {
                for (int64_t ky = 0; ky < kernel_h; ++ky) at[ky] = rows[ky] + p * step;
                four_blocks<FOUR_BLOCK_POSITIONS>(at, kernel_h, w.words_per_row, step, block_words, block_stride,
                                                  corrections, stages, out + p * channels + b * LANES, channels);
            }
            for (; p < count; ++p) {
                for (int64_t ky = 0; ky < kernel_h; ++ky) at[ky] = rows[ky] + p * step;
                four_blocks<1>(at, kernel_h, w.words_per_row, step, block_words, block_stride, corrections, stages,
                               out + p * channels + b * LANES, channels);
            }
        }
        return;
    }
    for (int64_t b = 0; b < w.blocks; ++b) {
        const int64_t left = channels - b * LANES;
        const __mmask16 lanes = left >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        const __m512i correction = _mm512_mullo_epi32(_mm512_set1_epi32(zero_point),
                                                      _mm512_loadu_si512(w.sums.data() + b * LANES));
        lpt_s16::block_constants(stage, e, b * LANES, lanes);
        const int32_t *block_words = w.words.data() + b * LANES;
        const uint8_t *at[FEW_PRODUCTS];
        int64_t p = 0;
        for (; p + POSITIONS <= count; p += POSITIONS) {
            for (int64_t ky = 0; ky < kernel_h; ++ky) at[ky] = rows[ky] + p * step;
            positions<POSITIONS>(at, kernel_h, w.words_per_row, step, block_words, block_stride, correction, lanes,
                                 stage, out + p * channels + b * LANES, channels);
        }
        for (; p < count; ++p) {
            for (int64_t ky = 0; ky < kernel_h; ++ky) at[ky] = rows[ky] + p * step;
            positions<1>(at, kernel_h, w.words_per_row, step, block_words, block_stride, correction, lanes, stage,
                         out + p * channels + b * LANES, channels);
        }
    }
}

}  // namespace

bool supported() {
    return lpt_s16::sixteen_lanes() && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512dq");
}

bool fits(const lpt_s16::Geometry &g, const lpt_s16::Epilogue &e) {
    return g.dilation_w == 1 && g.kernel_w * g.in_channels <= 4 * MAX_WORDS &&
           g.kernel_h * g.kernel_w * g.in_channels < FEW_PRODUCTS && lpt_s16::in_registers(e);
}

Weights pack(const int8_t *weights, const lpt_s16::Geometry &g) {
    Weights p;
    const int64_t run = g.kernel_w * g.in_channels;
    p.words_per_row = (run + 3) / 4;
    p.blocks = (g.out_channels + LANES - 1) / LANES;
    p.words.assign(g.kernel_h * p.words_per_row * p.blocks * LANES, 0);
    p.sums.assign(p.blocks * LANES, 0);
    int8_t *bytes = reinterpret_cast<int8_t *>(p.words.data());
    for (int64_t oc = 0; oc < g.out_channels; ++oc)
        for (int64_t ky = 0; ky < g.kernel_h; ++ky)
            for (int64_t r = 0; r < run; ++r) {  // the run is channels-last: kx = r / C, channel r % C
                const int64_t kx = r / g.in_channels, c = r % g.in_channels;
                const int8_t v = weights[((oc * g.in_channels + c) * g.kernel_h + ky) * g.kernel_w + kx];
                const int64_t word = (ky * p.words_per_row + r / 4) * p.blocks * LANES + oc;
                bytes[word * 4 + r % 4] = v;
                p.sums[oc] += v;
            }
    return p;
}

void convolve_staged(const uint8_t *src, bool signed_src, int zero_point, const lpt_s16::Geometry &g, int64_t images,
                     int64_t h, int64_t w, const Weights &weights, const lpt_s16::Epilogue &e, void *out, int threads) {
    const int64_t out_h = g.out_h(h), out_w = g.out_w(w), channels = g.out_channels, c = g.in_channels;
    const int64_t row_bytes = (g.pad_left + w + g.pad_right) * c + ROW_SLACK;
    const uint8_t flip = signed_src ? 0x80 : 0, padding = (uint8_t)(zero_point + (signed_src ? 128 : 0));
    const Weights *packed = &weights;
    const lpt_s16::Epilogue *stage = &e;
    uint8_t *to = static_cast<uint8_t *>(out);
    const int64_t work = images * out_h * out_w * channels;
    lpt_parallel::for_each(work >= PARALLEL_WORK ? threads : 1, images * out_h, [=](int64_t task) {
        const int64_t n = task / out_h, oy = task % out_h;
        thread_local std::vector<uint8_t> padded;
        padded.resize(g.kernel_h * row_bytes);
        const uint8_t *rows[FEW_PRODUCTS];
        for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
            uint8_t *row = padded.data() + ky * row_bytes;
            const int64_t iy = oy * g.stride_h - g.pad_top + ky * g.dilation_h;
            if (iy < 0 || iy >= h) {
                std::memset(row, padding, row_bytes);
            } else {
                const uint8_t *from = src + (n * h + iy) * w * c;
                std::memset(row, padding, g.pad_left * c);
                for (int64_t i = 0; i < w * c; ++i) row[g.pad_left * c + i] = from[i] ^ flip;
                std::memset(row + (g.pad_left + w) * c, padding, g.pad_right * c + ROW_SLACK);
            }
            rows[ky] = row;
        }
        output_row(rows, g.kernel_h, g.stride_w * c, out_w, *packed, padding, channels, *stage,
                   to + (n * out_h + oy) * out_w * channels);
    });
}

}  // namespace lpt_stem
