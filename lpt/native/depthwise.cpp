// lpt's depthwise convolution on AVX-512 VNNI (depthwise.h says why and what).
//
// A task is one image's block of sixteen channels over a band of output rows. Each source row the band reads
// is copied as the block's sixteen bytes per column (flipped to u8 where signed, the padding holding the zero
// point), then rewritten as quads: quad x holds, in lane c, channel c's bytes at columns x … x + 3 (quad_row).
// Output position ox then takes quad ox·stride_w + 4d of each kernel row for the weights' quad d. The padding
// holds the zero point, so every output sums all its products of (q − zp)·w: acc = Σ q·w − zp·Σ w.

#include "depthwise.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "parallel.h"
#include "stage512.h"

namespace lpt_dw {
namespace {

constexpr int64_t LANES = 16;
constexpr int64_t QUAD = 64;          // bytes of one quad: sixteen lanes of four
constexpr int64_t POSITIONS = 8;      // positions at a time: their accumulators in registers
constexpr int64_t RUN = 6 * POSITIONS;  // positions per hand-over to the output stage
// A band's quad rows at most this many bytes, to be read from L2 by the output rows whose windows hold them.
constexpr int64_t QUAD_BAND_BYTES = 160 << 10;
constexpr double PARALLEL_PRODUCTS = 1 << 17;  // products below which one thread runs the layer
constexpr int64_t MAX_KERNEL_H = 64;            // kernel rows a position's pointers are kept for
// Quad rows a thread keeps between layers (a band of a very long row may need more: given back after its task).
constexpr size_t KEEP_QUAD_BYTES = 8u << 20;

// Columns [0, count) of a padded source row of the block's sixteen bytes per column as quads: byte 4c + j of quad x
// is byte 16j + c of the 64 from column x on (channel c at column x + j), one vpermb (with a vpermd and a vpshufb
// before, the quads of PaddleOCR's detector's 7×7 layer over 160×160 took 0.40 ms of its threads' time, 0.29 so).
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void quad_row(const uint8_t *columns, int64_t count,
                                                                      uint8_t *quads) {
    alignas(64) uint8_t order[QUAD];
    for (int k = 0; k < QUAD; ++k) order[k] = (uint8_t)(LANES * (k % 4) + k / 4);
    const __m512i interleave = _mm512_load_si512(order);
    for (int64_t x = 0; x < count; ++x) {
        const __m512i four_columns = _mm512_loadu_si512(columns + x * LANES);
        _mm512_store_si512(quads + x * QUAD, _mm512_permutexvar_epi8(interleave, four_columns));
    }
}

// Padded row yp of image n, block b: `count` columns of sixteen bytes (the zero point's byte outside the source).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void padded_row(const uint8_t *src, bool signed_src,
                                                                      uint8_t padding, const lpt_s16::Geometry &g,
                                                                      int64_t n, int64_t h, int64_t w, int64_t b,
                                                                      int64_t yp, int64_t count, uint8_t *columns) {
    const int64_t y = yp - g.pad_top, c = g.in_channels;
    if (y < 0 || y >= h) {
        std::memset(columns, padding, count * LANES);
        return;
    }
    const int64_t valid = std::min(LANES, c - b * LANES);
    const __mmask16 lanes = valid == LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << valid) - 1);
    const __m128i fill = _mm_set1_epi8((char)padding), flip = _mm_set1_epi8(signed_src ? (char)0x80 : 0);
    const uint8_t *row = src + (n * h + y) * w * c + b * LANES;
    for (int64_t xp = 0; xp < count; ++xp) {
        const int64_t x = xp - g.pad_left;
        __m128i v = fill;
        if (x >= 0 && x < w) {  // a masked load only for a partial block (Zen 4 takes one far more slowly)
            const uint8_t *at = row + x * c;
            v = _mm_xor_si128(lanes == 0xFFFF ? _mm_loadu_si128(reinterpret_cast<const __m128i *>(at))
                                              : _mm_maskz_loadu_epi8(lanes, at), flip);
        }
        _mm_storeu_si128(reinterpret_cast<__m128i *>(columns + xp * LANES), v);
    }
}

// How a block's accumulators leave the registers: as 8-bit levels (lpt_s16::in_registers), as float32 (a stage of no
// post-op: f32(acc)·multiplier + bias, the reference's two roundings), or into a tile that lpt_s16::stage_columns
// stages (any other).
enum class Stage { levels, floats, tile };

// A block's stage in registers: lpt_s16's constants, and what its levels and floats need besides.
struct BlockOut {
    lpt_s16::BlockStage stage;
    __m512 bound;  // the Levels' bound per lane, where `bounded` (lpt_s16::bounded_levels)
    bool bounded, bias;
    __mmask16 lanes;  // the block's channels
};

// N positions of one block: Σ over kernel rows and quads of vpdpbusd, less the correction, then staged as `S`
// says into out (rows of `channels` values) or tile [N][16]. rows[ky]: the first position's first quad in kernel
// row ky; step: bytes from one position's quads to the next; words: the block's weights, block_stride int32 from
// one kernel row's quad to the next (lpt_stem::Weights).
template <int N, Stage S>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"), always_inline)) inline void block_positions(
        const uint8_t *const *rows, int64_t kernel_h, int64_t quads, int64_t step, const int32_t *words,
        int64_t block_stride, __m512i correction, const BlockOut &o, char *out, int64_t channels, int32_t *tile) {
    const lpt_s16::BlockStage &stage = o.stage;
    __m512i acc[N];
    for (int v = 0; v < N; ++v) acc[v] = _mm512_setzero_si512();
    for (int64_t ky = 0; ky < kernel_h; ++ky)
        for (int64_t d = 0; d < quads; ++d) {
            const __m512i weights = _mm512_load_si512(words + (ky * quads + d) * block_stride);
            const uint8_t *at = rows[ky] + 4 * d * QUAD;
            for (int v = 0; v < N; ++v)
                acc[v] = _mm512_dpbusd_epi32(acc[v], _mm512_loadu_si512(at + v * step), weights);
        }
    for (int v = 0; v < N; ++v) acc[v] = _mm512_sub_epi32(acc[v], correction);
    if constexpr (S == Stage::levels) {
        __m512i levels[N];
        if (stage.fused)
            o.bounded ? lpt_s16::bounded_levels<N>(acc, stage, o.bound, levels)
                      : lpt_s16::fused_levels<N>(acc, stage, levels);
        else
            lpt_s16::reference_levels<N>(acc, stage, levels);
        for (int v = 0; v < N; ++v) {
            const __m128i bytes =
                    stage.is_signed ? _mm512_cvtsepi32_epi8(levels[v]) : _mm512_cvtusepi32_epi8(levels[v]);
            lpt_s16::store_bytes_16(reinterpret_cast<uint8_t *>(out) + v * channels, o.lanes, bytes);
        }
    } else if constexpr (S == Stage::floats) {
        for (int v = 0; v < N; ++v) {
            __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[v]), stage.multiplier);
            if (o.bias) x = _mm512_add_ps(x, stage.bias);
            float *to = reinterpret_cast<float *>(out) + v * channels;  // a masked store only for a partial block
            o.lanes == 0xFFFF ? _mm512_storeu_ps(to, x) : _mm512_mask_storeu_ps(to, o.lanes, x);
        }
    } else {
        for (int v = 0; v < N; ++v) _mm512_store_si512(tile + v * LANES, acc[v]);
    }
}

// `count` positions of one output row, POSITIONS at a time (out: the first one's values of this block).
template <Stage S>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))) void positions_of_row(
        const uint8_t *const *rows, int64_t kernel_h, int64_t quads, int64_t step, int64_t count, const int32_t *words,
        int64_t block_stride, __m512i correction, const BlockOut &o, char *out, int64_t channels, int64_t item,
        int32_t *tile) {
    const uint8_t *at[MAX_KERNEL_H];
    int64_t p = 0;
    for (; p + POSITIONS <= count; p += POSITIONS) {
        for (int64_t ky = 0; ky < kernel_h; ++ky) at[ky] = rows[ky] + p * step;
        block_positions<POSITIONS, S>(at, kernel_h, quads, step, words, block_stride, correction, o,
                                      out + p * channels * item, channels, tile + p * LANES);
    }
    for (; p < count; ++p) {
        for (int64_t ky = 0; ky < kernel_h; ++ky) at[ky] = rows[ky] + p * step;
        block_positions<1, S>(at, kernel_h, quads, step, words, block_stride, correction, o,
                              out + p * channels * item, channels, tile + p * LANES);
    }
}

// One task: image n's block b over output rows [oy0, oy1), its quad rows built first.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))) void run_task(
        const uint8_t *src, bool signed_src, uint8_t padding, const lpt_s16::Geometry &g, int64_t h, int64_t w,
        const lpt_stem::Weights &weights, const lpt_s16::Epilogue &e, int64_t n, int64_t b, int64_t oy0, int64_t oy1,
        int64_t quad_columns, char *out) {
    const int64_t out_h = g.out_h(h), out_w = g.out_w(w), c = g.out_channels, row_bytes = quad_columns * QUAD;
    const int64_t first_row = oy0 * g.stride_h, rows = (oy1 - 1 - oy0) * g.stride_h + g.kernel_h;
    thread_local std::vector<uint8_t, lpt_s16::CacheLineAllocator<uint8_t>> line, quads;
    line.resize((quad_columns + 3) * LANES);  // quad x reads columns x … x + 3
    quads.resize(rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
        padded_row(src, signed_src, padding, g, n, h, w, b, first_row + r, quad_columns + 3, line.data());
        quad_row(line.data(), quad_columns, quads.data() + r * row_bytes);
    }
    const int32_t *words = weights.words.data() + b * LANES;
    const int64_t weight_quads = weights.words_per_row, block_stride = weights.blocks * LANES;
    const __m512i correction = _mm512_mullo_epi32(_mm512_set1_epi32(padding),
                                                  _mm512_loadu_si512(weights.sums.data() + b * LANES));
    const int64_t valid = std::min(LANES, c - b * LANES), step = g.stride_w * QUAD;
    const __mmask16 lanes = valid == LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << valid) - 1);
    const Stage kind = lpt_s16::in_registers(e) ? Stage::levels
                       : e.type == lpt_s16::Epilogue::f32 && e.post_op_count == 0 ? Stage::floats : Stage::tile;
    BlockOut o{};
    o.lanes = lanes, o.bias = e.bias != nullptr;
    if (kind == Stage::levels) o.stage = lpt_s16::block_stage(e, true);
    if (kind != Stage::tile) lpt_s16::block_constants(o.stage, e, b * LANES, lanes);
    o.bounded = o.stage.fused && e.levels.lane_bound;
    if (o.bounded) o.bound = _mm512_loadu_ps(e.levels.lane_bound + b * LANES);
    const auto run = kind == Stage::levels ? positions_of_row<Stage::levels>
                     : kind == Stage::floats ? positions_of_row<Stage::floats> : positions_of_row<Stage::tile>;
    const int64_t item = e.type == lpt_s16::Epilogue::f32 ? 4 : 1;
    alignas(64) int32_t tile[RUN * LANES];
    const uint8_t *at[MAX_KERNEL_H];
    for (int64_t oy = oy0; oy < oy1; ++oy)
        for (int64_t x0 = 0; x0 < out_w; x0 += RUN) {
            const int64_t count = std::min(RUN, out_w - x0);
            for (int64_t ky = 0; ky < g.kernel_h; ++ky)
                at[ky] = quads.data() + ((oy - oy0) * g.stride_h + ky) * row_bytes + x0 * step;
            char *to = out + ((n * out_h + oy) * out_w + x0) * c * item;
            run(at, g.kernel_h, weight_quads, step, count, words, block_stride, correction, o, to + b * LANES * item, c,
                item, tile);
            if (kind == Stage::tile)
                lpt_s16::stage_columns(e, tile, nullptr, count, b * LANES, valid, LANES, to, c);
        }
    if (quads.capacity() > KEEP_QUAD_BYTES) decltype(quads)().swap(quads);
    if (line.capacity() > KEEP_QUAD_BYTES) decltype(line)().swap(line);
}

}  // namespace

bool supported() {
    return lpt_s16::sixteen_lanes() && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vbmi");
}

bool fits(const lpt_s16::Geometry &g) {
    return g.in_channels == g.out_channels && g.dilation_h == 1 && g.dilation_w == 1 && g.kernel_h <= MAX_KERNEL_H;
}

void convolve_staged(const uint8_t *src, bool signed_src, int zero_point, const lpt_s16::Geometry &g, int64_t images,
                     int64_t h, int64_t w, const lpt_stem::Weights &weights, const lpt_s16::Epilogue &e, void *out,
                     int threads) {
    const int64_t out_h = g.out_h(h), out_w = g.out_w(w);
    // quad x is read by positions up to the last one's last quad
    const int64_t quad_columns = (out_w - 1) * g.stride_w + 4 * (weights.words_per_row - 1) + 1;
    const int64_t fitting = (QUAD_BAND_BYTES / (quad_columns * QUAD) - g.kernel_h) / g.stride_h + 1;
    const int64_t band = std::clamp<int64_t>(fitting, 1, out_h), bands = (out_h + band - 1) / band;
    const int64_t blocks = weights.blocks, tasks = images * blocks * bands;
    const uint8_t padding = (uint8_t)(zero_point + (signed_src ? 128 : 0));
    const double products = (double)images * out_h * out_w * g.out_channels * g.kernel_h * g.kernel_w;
    const lpt_s16::Geometry *geometry = &g;
    const lpt_stem::Weights *packed = &weights;
    const lpt_s16::Epilogue *stage = &e;
    char *to = static_cast<char *>(out);
    lpt_parallel::for_each(products >= PARALLEL_PRODUCTS ? threads : 1, tasks, [=](int64_t task) {
        const int64_t oy0 = task / blocks % bands * band;
        run_task(src, signed_src, padding, *geometry, h, w, *packed, *stage, task / (blocks * bands), task % blocks,
                 oy0, std::min(out_h, oy0 + band), quad_columns, to);
    });
}

}  // namespace lpt_dw
