// lpt's kernel for a matmul of a few rows (few_rows.h says why and what).
//
// The columns go in tiles of up to four blocks of sixteen, spread over the threads; each tile's
// weights stream once while every row's accumulators for it stay in registers. The source rows are
// first copied into words of their own (flipped to u8 where signed, zeros past K), so the last word
// reads no byte past a row. acc = Σ q·w − zp·Σ w: the zero point's correction one product per column.

#include "few_rows.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "parallel.h"

namespace lpt_few_rows {
namespace {

constexpr int64_t LANES = 16;
// Blocks of sixteen columns per tile: eight for one or two rows, four for more; a tile's accumulators,
// rows × blocks, stay in registers.
constexpr int64_t MAX_ACCUMULATORS = 16;
constexpr int64_t tile_blocks(int64_t rows) { return rows <= 2 ? 8 : 4; }
constexpr int64_t PARALLEL_WORK = 1 << 16;   // products below which one thread runs the matmul

// The accumulators of ROWS rows by BLOCKS blocks (starting at `block`), into acc [ROWS][BLOCKS · 16].
template <int ROWS, int BLOCKS>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void tile(const int32_t *src_words,
                                                                           const Weights &w, int64_t block,
                                                                           int correction_zp, int32_t *acc) {
    const int64_t words = w.words_per_column;
    __m512i sum[ROWS][BLOCKS];
    for (int r = 0; r < ROWS; ++r)
        for (int j = 0; j < BLOCKS; ++j) sum[r][j] = _mm512_setzero_si512();
    const int32_t *weights[BLOCKS];
    for (int j = 0; j < BLOCKS; ++j) weights[j] = w.words.data() + (block + j) * words * LANES;
    for (int64_t d = 0; d < words; ++d) {
        __m512i column[BLOCKS];
        for (int j = 0; j < BLOCKS; ++j) column[j] = _mm512_load_si512(weights[j] + d * LANES);
        for (int r = 0; r < ROWS; ++r) {
            const __m512i word = _mm512_set1_epi32(src_words[r * words + d]);
            for (int j = 0; j < BLOCKS; ++j) sum[r][j] = _mm512_dpbusd_epi32(sum[r][j], word, column[j]);
        }
    }
    const __m512i zp = _mm512_set1_epi32(correction_zp);
    for (int j = 0; j < BLOCKS; ++j) {
        const __m512i correction = _mm512_mullo_epi32(zp, _mm512_loadu_si512(w.sums.data() + (block + j) * LANES));
        for (int r = 0; r < ROWS; ++r)
            _mm512_storeu_si512(acc + r * BLOCKS * LANES + j * LANES, _mm512_sub_epi32(sum[r][j], correction));
    }
}

template <int ROWS>
void tile_of(int64_t blocks, const int32_t *src_words, const Weights &w, int64_t block, int zp, int32_t *acc) {
    switch (blocks) {
        case 1: return tile<ROWS, 1>(src_words, w, block, zp, acc);
        case 2: return tile<ROWS, 2>(src_words, w, block, zp, acc);
        case 3: return tile<ROWS, 3>(src_words, w, block, zp, acc);
        case 4: return tile<ROWS, 4>(src_words, w, block, zp, acc);
    }
    if constexpr (ROWS <= 2) {
        switch (blocks) {
            case 5: return tile<ROWS, 5>(src_words, w, block, zp, acc);
            case 6: return tile<ROWS, 6>(src_words, w, block, zp, acc);
            case 7: return tile<ROWS, 7>(src_words, w, block, zp, acc);
            default: return tile<ROWS, 8>(src_words, w, block, zp, acc);
        }
    }
}

}  // namespace

bool supported() { return lpt_s16::sixteen_lanes() && __builtin_cpu_supports("avx512vnni"); }

Weights pack(const int8_t *weights, int64_t reduction, int64_t columns) {
    Weights p;
    p.reduction = reduction;
    p.columns = columns;
    p.words_per_column = (reduction + 3) / 4;
    p.blocks = (columns + LANES - 1) / LANES;
    p.words.assign(p.blocks * p.words_per_column * LANES, 0);
    p.sums.assign(p.blocks * LANES, 0);
    int8_t *bytes = reinterpret_cast<int8_t *>(p.words.data());
    for (int64_t k = 0; k < reduction; ++k)
        for (int64_t n = 0; n < columns; ++n) {
            const int8_t v = weights[k * columns + n];
            const int64_t word = ((n / LANES) * p.words_per_column + k / 4) * LANES + n % LANES;
            bytes[word * 4 + k % 4] = v;
            p.sums[n] += v;
        }
    return p;
}

void multiply(const uint8_t *src, int64_t rows, bool signed_src, int zero_point, const Weights &w,
              const lpt_s16::Epilogue *e, void *out, int threads) {
    const int64_t words = w.words_per_column, k = w.reduction, n = w.columns;
    std::vector<int32_t> src_words((size_t)(rows * words), 0);
    uint8_t *bytes = reinterpret_cast<uint8_t *>(src_words.data());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < k; ++i) bytes[r * words * 4 + i] = signed_src ? src[r * k + i] ^ 0x80 : src[r * k + i];
    // past K the source words hold zeros and the weights too: no product there
    const int zp = zero_point + (signed_src ? 128 : 0);
    const int64_t per_tile = tile_blocks(rows), tiles = (w.blocks + per_tile - 1) / per_tile;
    const int team = rows * k * n >= PARALLEL_WORK ? threads : 1;
    // The calling thread takes tiles from the first on, the others from the last back: where they keep
    // pace, each computes the same columns at every call, whose weights then stay in its core's L2 (a
    // recurrent layer's h·R at each time step). Taken in any order a 1 × 512 by [512, 512] took longer on
    // two threads than on one.
    std::atomic<uint64_t> ends{(uint64_t)tiles << 32};  // (back << 32) | front: tiles [front, back) are left
    const std::thread::id caller = std::this_thread::get_id();
    lpt_parallel::run(std::min<int64_t>(team, tiles), tiles, 1, [&](lpt_parallel::Chunks &) {
        alignas(64) int32_t acc[MAX_ACCUMULATORS * LANES];
        const bool forwards = std::this_thread::get_id() == caller;
        for (;;) {
            uint64_t seen = ends.load(std::memory_order_relaxed), taken;
            int64_t t;
            do {
                const int64_t front = (int64_t)(seen & 0xFFFFFFFFu), back = (int64_t)(seen >> 32);
                if (front >= back) return;
                t = forwards ? front : back - 1;
                taken = forwards ? seen + 1 : seen - ((uint64_t)1 << 32);
            } while (!ends.compare_exchange_weak(seen, taken, std::memory_order_relaxed));
            const int64_t block = t * per_tile, blocks = std::min(per_tile, w.blocks - block);
            switch (rows) {
                case 1: tile_of<1>(blocks, src_words.data(), w, block, zp, acc); break;
                case 2: tile_of<2>(blocks, src_words.data(), w, block, zp, acc); break;
                case 3: tile_of<3>(blocks, src_words.data(), w, block, zp, acc); break;
                default: tile_of<4>(blocks, src_words.data(), w, block, zp, acc); break;
            }
            const int64_t first = block * LANES, width = std::min(blocks * LANES, n - first);
            if (e) {
                lpt_s16::stage_columns(*e, acc, nullptr, rows, first, width, blocks * LANES, out, n);
            } else {
                for (int64_t r = 0; r < rows; ++r)
                    std::memcpy(static_cast<int32_t *>(out) + r * n + first, acc + r * blocks * LANES,
                                width * sizeof(int32_t));
            }
        }
    });
}

}  // namespace lpt_few_rows
