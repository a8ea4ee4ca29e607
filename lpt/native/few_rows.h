// lpt's own kernel for a matmul of a few rows by int8 weights (a recurrent layer's h·R at each time step,
// a batch of one through a dense layer): lpt/native/few_rows.cpp.
//
// oneDNN 3.2 runs an M = 1 matmul on its brgemm kernels, whose AMX tiles hold sixteen rows: a 1 × 512
// source by [512, 512] took 3.1-3.5 µs in a native program on a Xeon with AMX (2 threads), well above
// what its 256 K products need. Here each source word of four bytes is broadcast to sixteen lanes and
// multiplied by sixteen columns' four weights with one vpdpbusd (u8 × s8, four products added in int32:
// exact), the weights streamed once for all rows, and lpt_s16's output stage follows per column band.
#pragma once

#include <cstdint>
#include <vector>

#include "s16.h"

namespace lpt_few_rows {

constexpr int64_t MAX_ROWS = 4;  // rows at a time: each row's accumulators for four blocks in registers

// Whether this CPU runs the kernel: AVX-512 with VNNI, where sixteen lanes are allowed (lpt_s16::sixteen_lanes).
bool supported();

// The weights [K, N] as the kernel reads them: per block of sixteen columns, each word of four rows of
// K, the sixteen columns' four bytes (zeros past K and past N); and each column's sum of weights, which
// the source's zero point times gives the accumulators' correction.
struct Weights {
    std::vector<int32_t, lpt_s16::CacheLineAllocator<int32_t>> words;  // [blocks][words][16]
    std::vector<int32_t> sums;                                         // [blocks · 16]
    int64_t reduction = 0, columns = 0, words_per_column = 0, blocks = 0;
    bool empty() const { return words.empty(); }
};
Weights pack(const int8_t *weights, int64_t reduction, int64_t columns);

// out [rows, N] = the output stage `e` (float32, uint8 or int8) of Σ_k (src[r, k] − zero_point)·w[k, n],
// or those int32 accumulators where e is null; src u8, or s8 with `signed_src`, [rows, K] contiguous.
// rows at most MAX_ROWS. Needs supported().
void multiply(const uint8_t *src, int64_t rows, bool signed_src, int zero_point, const Weights &w,
              const lpt_s16::Epilogue *e, void *out, int threads);

}  // namespace lpt_few_rows
