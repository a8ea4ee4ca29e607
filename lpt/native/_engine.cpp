// lpt.native._engine: one prepared int8 convolution or matmul on oneDNN 3.2, exact to the integer.
//
// An operation is created once with everything constant (weights, window, zero point, output stage,
// route, threads) and then run many times. For each source shape it meets, it creates the oneDNN
// primitive and reorders the weights into the layout the primitive chose, once (`Prepared`).
//
// oneDNN computes the int32 accumulators acc = Σ (q_src − zp_src)·q_wei (source channels-last,
// accumulators channels-last). The output stage runs here, on those accumulators, with the float32
// operations of lpt/kernels/_elementwise.c in the same order: built with -ffp-contract=off and
// without -ffast-math, it is bit-identical to lpt's NumPy output stage. On route u8s8 oneDNN's
// primitive applies the common stages itself, with the same operations (stages_in_onednn).
//
// Routes (lpt/native/__init__.py chooses one after probing both):
// - "u8s8": the plain primitive. Exact with VNNI/AMX; on AVX2 oneDNN adds pairs of u8·s8 products
//   in int16 with saturation (vpmaddubsw), so nearly every accumulator is wrong there.
// - "split": w = 64·hi + lo with lo in [0, 63] and hi in [−2, 1]: a pair sum is at most
//   2·255·63 = 32130 ≤ 32767, so nothing saturates. The same primitive runs twice (weights hi, then
//   lo) and acc = 64·acc_hi + acc_lo is formed in integers inside the output stage.
// - "s16": not oneDNN but lpt's own AVX2 kernel (s16.cpp): the source widened to int16, pairs of
//   products added in int32 (vpmaddwd). Exact by construction; one group, 1-D or 2-D, and matmul.
// An s8 source runs as u8 (q + 128, zero point + 128: the same differences), since oneDNN's s8
// source path on AVX2 halves the weights and is not exact either.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <xmmintrin.h>

#include "oneapi/dnnl/dnnl.hpp"
#include "float_ops.h"
#include "integer_ops.h"
#include "s16.h"
#include "depthwise.h"
#include "stem.h"
#include "few_rows.h"
#include "exp.h"
#include "parallel.h"

using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

namespace {

const char *CAPSULE = "lpt.native._engine.Operation";

engine &cpu() {
    static engine e(engine::kind::cpu, 0);
    return e;
}

// oneDNN streams are not meant to be shared between threads; one per calling thread.
stream &thread_stream() {
    static thread_local stream s(cpu());
    return s;
}

// ---------------------------------------------------------------- output stage
//
// x = f32(acc)·m[c]; x = x + bias[c]; each post-op: a LeakyRelu's x < 0 ? x·slope : x (where the
// slope is not 1), then its clip as max then min, or lpt's Sigmoid (exp.h); then, for an 8-bit
// destination, y = x / s_dst,
// clamped to [qmin − zp, qmax − zp], rounded half to even, + zp. Exactly lpt.kernels.output_stage
// (and, for Relu and Clip, lpt/kernels/_elementwise.c's output_stage).

constexpr int64_t PARALLEL_WORK = 1 << 15;  // values below which a loop of ours runs on one thread

enum class Dst { f32, u8, s8, s32 };  // s32: the accumulators themselves

size_t item_size(Dst dst) { return dst == Dst::u8 || dst == Dst::s8 ? 1 : 4; }

struct OutputStage {
    std::vector<float> multiplier;  // [C]
    std::vector<float> bias;        // [C] or empty
    std::vector<float> post_ops;    // (kind, slope, low, high) each: lpt_s16::PostOp
    Dst dst = Dst::f32;
    float scale = 1.0f;
    int zero_point = 0, qmin = 0, qmax = 255;
};

// rint for |y| ≤ 2^22 (lpt/kernels/_elementwise.c explains it): the float32 add rounds half to even.
inline float round_half_even(float y) { return (y + 12582912.0f) - 12582912.0f; }

// One row of C channels: acc from hi (and lo on the split route) → out[c * out_stride].
template <typename T>
void stage_row(const OutputStage &s, const int32_t *hi, const int32_t *lo, int64_t channels, float *x,
               T *out, int64_t out_stride) {
    if constexpr (std::is_same_v<T, int32_t>) {
        for (int64_t c = 0; c < channels; ++c)
            out[c * out_stride] = lo ? (int32_t)((uint32_t)hi[c] * 64u + (uint32_t)lo[c]) : hi[c];
        return;
    } else {
        const float *m = s.multiplier.data();
        if (lo)
            for (int64_t c = 0; c < channels; ++c)
                x[c] = (float)(int32_t)((uint32_t)hi[c] * 64u + (uint32_t)lo[c]) * m[c];
        else
            for (int64_t c = 0; c < channels; ++c) x[c] = (float)hi[c] * m[c];
        if (!s.bias.empty()) {
            const float *b = s.bias.data();
            for (int64_t c = 0; c < channels; ++c) x[c] = x[c] + b[c];
        }
        for (size_t k = 0; k + 3 < s.post_ops.size(); k += lpt_s16::POST_OP_FIELDS) {
            const float kind = s.post_ops[k], slope = s.post_ops[k + 1], low = s.post_ops[k + 2], high = s.post_ops[k + 3];
            if (kind == lpt_s16::SIGMOID) {
                for (int64_t c = 0; c < channels; ++c) x[c] = lpt_exp::sigmoid(x[c]);
                continue;
            }
            if (kind == lpt_s16::SILU) {
                for (int64_t c = 0; c < channels; ++c) x[c] = x[c] * lpt_exp::sigmoid(x[c]);
                continue;
            }
            if (kind == lpt_s16::HARD_SWISH) {  // slope, low: alpha, beta; the clip as below
                for (int64_t c = 0; c < channels; ++c) {
                    float h = x[c] * slope + low;
                    h = h <= 0.0f ? 0.0f : h;
                    x[c] = x[c] * (h >= 1.0f ? 1.0f : h);
                }
                continue;
            }
            if (kind == lpt_s16::GELU) {  // slope, low, high: divisor, one, half
                for (int64_t c = 0; c < channels; ++c) x[c] = (x[c] * (lpt_exp::erf(x[c] / slope) + low)) * high;
                continue;
            }
            if (slope != 1.0f)  // LeakyRelu
                for (int64_t c = 0; c < channels; ++c) x[c] = x[c] < 0.0f ? x[c] * slope : x[c];
            // numpy's maximum(x, low) and minimum(x, high), as kernels.output_stage: a NaN stays NaN, and
            // where x equals the bound the bound is taken (a GELU's −0 through a Relu is +0)
            for (int64_t c = 0; c < channels; ++c) x[c] = x[c] <= low ? low : x[c];
            for (int64_t c = 0; c < channels; ++c) x[c] = x[c] >= high ? high : x[c];
        }
        if constexpr (std::is_same_v<T, float>) {
            for (int64_t c = 0; c < channels; ++c) out[c * out_stride] = x[c];
        } else {
            const float zp = (float)s.zero_point, low = (float)(s.qmin - s.zero_point),
                        high = (float)(s.qmax - s.zero_point), scale = s.scale;
            for (int64_t c = 0; c < channels; ++c) {
                float y = x[c] / scale;
                y = y >= low ? y : low;  // a NaN gives the bound, as numpy's fmax/fmin
                y = y <= high ? y : high;
                x[c] = round_half_even(y) + zp;
            }
            for (int64_t c = 0; c < channels; ++c) out[c * out_stride] = (T)(int)x[c];
        }
    }
}

// Rows [row_begin, row_end) of the accumulators [images, positions, C] (channels-last; a row is one
// position's C channels) → out, either channels-last too or channels-first [images, C, positions].
// Channels-first goes through a tile of BLOCK positions, so that each output row is written in runs
// of BLOCK contiguous values. With `fast` (the same stage as s16's Epilogue, where the CPU has AVX2),
// the rows go through lpt_s16::stage_rows, eight channels per instruction, and channels-first output
// is their transpose. One thread; x and tile are its scratch.
constexpr int64_t STAGE_BLOCK = 64;

template <typename T>
void finish_rows(const OutputStage &s, const int32_t *hi, const int32_t *lo, int64_t positions, int64_t channels,
                 bool channels_first, T *out, const lpt_s16::Epilogue *fast, int64_t row_begin, int64_t row_end,
                 int64_t acc_row0, std::vector<float> &x, std::vector<char> &tile_bytes) {
    constexpr int64_t BLOCK = STAGE_BLOCK;
    x.resize(channels);
    if (channels_first) tile_bytes.resize(BLOCK * channels * sizeof(T));
    T *tile = reinterpret_cast<T *>(tile_bytes.data());  // [c][p], or [p][c] with `fast`
    for (int64_t first_row = row_begin; first_row < row_end;) {
        const int64_t n = first_row / positions, p0 = first_row % positions;
        const int64_t count = std::min({BLOCK, row_end - first_row, positions - p0});
        const int64_t first = first_row * channels, first_acc = (first_row - acc_row0) * channels;
        first_row += count;
        if (fast && !std::is_same_v<T, int32_t>) {
            if (!channels_first) {
                lpt_s16::stage_rows(*fast, hi + first_acc, lo ? lo + first_acc : nullptr, count, channels, out + first);
                continue;
            }
            lpt_s16::stage_rows(*fast, hi + first_acc, lo ? lo + first_acc : nullptr, count, channels, tile);
            for (int64_t c = 0; c < channels; ++c) {
                T *o = out + (n * channels + c) * positions + p0;
                for (int64_t p = 0; p < count; ++p) o[p] = tile[p * channels + c];
            }
            continue;
        }
        for (int64_t p = 0; p < count; ++p) {
            const int64_t row = first + p * channels, acc = first_acc + p * channels;
            if (channels_first)
                stage_row<T>(s, hi + acc, lo ? lo + acc : nullptr, channels, x.data(), tile + p, BLOCK);
            else
                stage_row<T>(s, hi + acc, lo ? lo + acc : nullptr, channels, x.data(), out + row, 1);
        }
        if (channels_first)
            for (int64_t c = 0; c < channels; ++c)
                std::memcpy(out + (n * channels + c) * positions + p0, tile + c * BLOCK, count * sizeof(T));
    }
}

// Every row, in tasks of at most STAGE_BLOCK rows of one image on `threads` threads.
template <typename T>
void finish(const OutputStage &s, const int32_t *hi, const int32_t *lo, int64_t images, int64_t positions,
            int64_t channels, bool channels_first, void *out_v, int threads, const lpt_s16::Epilogue *fast) {
    T *out = static_cast<T *>(out_v);
    const int64_t blocks = (positions + STAGE_BLOCK - 1) / STAGE_BLOCK, tasks = images * blocks;
    // A second thread costs its wake-up (far more on a loaded machine): small outputs take one.
    const int loop_threads = images * positions * channels >= PARALLEL_WORK ? threads : 1;
    lpt_parallel::run(loop_threads, tasks, 0, [&](lpt_parallel::Chunks &chunks) {
        std::vector<float> x;
        std::vector<char> tile;
        for (int64_t t; chunks.next(t);) {
            const int64_t first = t / blocks * positions + t % blocks * STAGE_BLOCK;
            finish_rows<T>(s, hi, lo, positions, channels, channels_first, out, fast, first,
                           std::min(first + STAGE_BLOCK, (t / blocks + 1) * positions), 0, x, tile);
        }
    });
}

void finish_as(Dst dst, const OutputStage &s, const int32_t *hi, const int32_t *lo, int64_t images,
               int64_t positions, int64_t channels, bool channels_first, void *out, int threads,
               const lpt_s16::Epilogue *fast = nullptr) {
    switch (dst) {
        case Dst::s32: finish<int32_t>(s, hi, lo, images, positions, channels, channels_first, out, threads, fast); break;
        case Dst::f32: finish<float>(s, hi, lo, images, positions, channels, channels_first, out, threads, fast); break;
        case Dst::u8: finish<uint8_t>(s, hi, lo, images, positions, channels, channels_first, out, threads, fast); break;
        case Dst::s8: finish<int8_t>(s, hi, lo, images, positions, channels, channels_first, out, threads, fast); break;
    }
}

// Rows [row_begin, row_end) only, on the calling thread (finish_rows): a band's, right after its primitive, from
// accumulators that start at row row_begin (hi and lo point at that row's).
void finish_rows_as(Dst dst, const OutputStage &s, const int32_t *hi, const int32_t *lo, int64_t positions,
                    int64_t channels, bool channels_first, void *out, const lpt_s16::Epilogue *fast, int64_t row_begin,
                    int64_t row_end, std::vector<float> &x, std::vector<char> &tile) {
    const auto rows = [&](auto *to) {
        finish_rows(s, hi, lo, positions, channels, channels_first, to, fast, row_begin, row_end, row_begin, x, tile);
    };
    switch (dst) {
        case Dst::s32: rows(static_cast<int32_t *>(out)); break;
        case Dst::f32: rows(static_cast<float *>(out)); break;
        case Dst::u8: rows(static_cast<uint8_t *>(out)); break;
        case Dst::s8: rows(static_cast<int8_t *>(out)); break;
    }
}

// ---------------------------------------------------------------- operations

enum class Kind { conv, matmul };
enum class Route { u8s8, split, s16 };

constexpr size_t MAX_PREPARED_SHAPES = 4;  // per operation; more are prepared again when met
constexpr size_t KEEP_SCRATCH_BYTES = 128u << 20;  // per calling thread; larger scratch is freed after the run
constexpr size_t KEEP_WIDENED_BYTES = 64u << 20;  // s16's widened source, one per calling thread

// Arrays on 64-byte boundaries, as oneDNN's own memory: malloc's 16-byte alignment put a layer's source
// and accumulators off the cache lines its AMX kernel reads and writes whole, and ResNet-18's 3×3 64 → 64
// convolution over 56×56 took 1.2× the time so (0.100 against 0.084 ms, one thread, a Xeon with AMX).
template <typename T>
struct CacheLineDelete {
    void operator()(T *p) const { ::operator delete[](p, std::align_val_t(64)); }
};
template <typename T>
using CacheLineArray = std::unique_ptr<T[], CacheLineDelete<T>>;
template <typename T>
CacheLineArray<T> cache_line_array(size_t count) {
    return CacheLineArray<T>(new (std::align_val_t(64)) T[count]);
}

// Memory a kernel writes whole before it reads it: grown as needed and never value-initialised.
// std::vector's resize zero-fills each growth, a pass over megabytes whenever a layer's source is
// larger than the layer's before it.
template <typename T>
class Scratch {
  public:
    T *get(size_t count) {
        if (count > capacity_) {
            data_ = cache_line_array<T>(count);
            capacity_ = count;
        }
        return data_.get();
    }
    size_t bytes() const { return capacity_ * sizeof(T); }
    void release() {
        data_.reset();
        capacity_ = 0;
    }

  private:
    CacheLineArray<T> data_;
    size_t capacity_ = 0;
};

// One primitive over a band of the layer's output (band_rows: some of its images, of one image's first
// spatial axis, or of a matmul's rows), reading the source from `src_offset` bytes and writing from
// `dst_offset` accumulators: the accumulator rows (positions) [first_row, end_row). Or, in a layer of
// channel bands (channel_band_count), every row of the output channels [first_channel, + channels), with
// those channels' weights of its own.
struct Band {
    primitive prim;
    memory src, dst_hi, dst_lo, scratchpad, weights;
    memory multiplier, bias;  // where oneDNN stages (Prepared::staged): its channels' output stage
    memory other;             // with a join: the other operand's values for its rows, as float32
    // The primitive's arguments (and the split route's second pass's), made once: a run binds new
    // pointers to the memory objects above (set_data_handle), which these share.
    std::unordered_map<int, memory> arguments, arguments_lo;
    size_t src_offset = 0, dst_offset = 0;
    int64_t first_row = 0, end_row = 0, first_channel = 0, channels = 0;
};

// A residual join that a staged convolution's primitive applies after its own stage (join_in_bands): the
// layer's 8-bit levels q are never written; out = to(relu((q − shift)·scale ⊕ (q_other − other_shift)·other_scale)),
// ⊕ an addition or a product, lpt_ops::join's operations in its order, into an 8-bit `to`. `other` is the
// other operand's levels, in the layer's output layout.
struct Join {
    const uint8_t *other = nullptr;
    bool other_signed = false, multiply = false, relu = false;
    float scale = 1, other_shift = 0, other_scale = 1;  // the layer's side: q − its own zero point
    lpt_ops::Destination to;
};

struct Prepared {  // one source shape
    std::vector<Band> bands;  // one per thread where the layer is large enough (band_count), else one
    memory zero_point;
    memory weights_hi, weights_lo;  // reordered once; on the u8s8 route weights_hi holds w itself
    size_t src_bytes = 0, accumulators = 0;  // the whole source's, the whole output's
    bool has_zero_point = false;
    bool channel_bands = false;  // the bands split output channels, not rows
    bool staged = false;  // the primitives write the 8-bit output themselves (stages_in_onednn)
    memory divisor;  // staged: the destination scale, which the output stage divides by (as f32 [1, …])
    float divisor_value = 1;  // what divisor holds: the scale, or its reciprocal (reciprocal_stage)
    int divisor_index = 0;  // staged: the division's place in the post-ops
    bool joined = false;    // the primitives apply a join after the stage (Join)
    int other_index = 0, join_divisor_index = 0;  // joined: the join's binary post-ops
    float join_scale = 1;  // joined: the join's destination scale (or its reciprocal), which join_divisor holds
    memory join_divisor;
    std::string impl;
};

struct Operation {
    Kind kind;
    Route route;
    int threads;  // > 0
    // weights as given (conv: [OC, IC/g, *kernel]; matmul: [K, N]), and the split halves
    std::vector<int8_t> weights, hi, lo;
    memory::dims weight_dims;  // oneDNN's: conv [g, OC/g, IC/g, *k] or [OC, IC, *k]; matmul [K, N]
    int64_t groups = 1, out_channels = 0, in_channels = 0;
    memory::dims strides, dilations, pads_begin, pads_end;  // dilations as oneDNN counts them (d − 1)
    // A 1×1 convolution with a stride: its source is subsampled here (subsample) and the primitive has
    // stride 1. With the stride, oneDNN 3.2's jit_uni_int8_1x1:avx2 (which subsamples into a buffer of
    // its own) sometimes gives one output position (all its channels) wrong accumulators, in a varying
    // number of runs: 8 → 16 or 32 channels over 4 × 32 × 32, stride 2, 1 to 13 runs in 40, on 1 or 2
    // threads.
    bool subsample = false;
    int src_zero_point = 0;
    OutputStage stage;
    std::map<std::vector<int64_t>, std::unique_ptr<Prepared>> prepared;  // key: source dims + signedness
    std::string last_impl;
    // The layer without spatial axes of extent 1 (unit_axes), one per set of them met (bit a: spatial axis a):
    // the primitives made from one read its stage's memory, so it lives as long as this one
    std::map<unsigned, std::unique_ptr<Operation>> without_unit_axes;
    // The layer over phases of its source (prepare_polyphase), where it has one: `phase_outputs` consecutive
    // outputs of each of its channels per position
    std::unique_ptr<Operation> polyphase;
    int64_t phase_outputs = 0;
    // route s16: the geometry, the packed weights and the output stage as the kernel applies it (on
    // arrays padded to 16 channels); its scratch is per calling thread (run_s16)
    lpt_s16::Geometry geometry{};
    bool depthwise = false;  // one input and one output channel per group (s16's depthwise kernel)
    memory::dims kernel_shape;  // conv: the weights' [OC, IC/groups, *kernel]
    // A 3×3 convolution of stride 1 that s16 can run by Winograd's F(2×2, 3×3): where it pays (auto),
    // always (LPT_WINOGRAD=1, as tests force it) or never (LPT_WINOGRAD=0). Each form's weights are
    // packed at its first run, so a network at one batch size packs each layer's once.
    enum class Winograd { never, automatic, always } winograd = Winograd::never;
    lpt_s16::PackedWeights winograd_packed;
    lpt_s16::PackedWeights packed;
    lpt_s16::NarrowWeights narrow;  // in place of `packed` where those are many (narrow_large_weights)
    lpt_s16::ByteWeights bytes;     // for the direct kernel on bytes, where it runs (take_bytes)
    bool bytes_always = false;      // whatever the source (LPT_S16_BYTES=1)
    lpt_s16::Epilogue epilogue;
    lpt_stem::Weights stem;  // route u8s8, where lpt_stem's kernel runs the convolution (prepare_stem)
    lpt_stem::Weights dw;    // route u8s8, where lpt_dw's kernel runs the depthwise convolution (prepare_depthwise)
    bool dw_any_size = false;  // whatever the source's size (takes_depthwise)
    lpt_few_rows::Weights few_rows;  // route u8s8, a matmul's weights for lpt_few_rows's kernel (prepare_few_rows)
    std::vector<float> padded_multiplier, padded_bias;
    std::vector<float> level_constants;  // the epilogue's Levels (lpt_s16::prepare_clipped_levels)
    bool onednn_stage = false;  // onednn_can_stage
    std::mutex lock;  // one run at a time: the prepared primitives' memory objects take its pointers
};

// Weights past what the caches hold, read once per few positions, bound their layer by their stream:
// as int8, sign-extended in the kernel, they are half the bytes (lpt_s16::NarrowWeights). Measured here
// (Zen 3, 2 threads, alternating): a classifier's [1024, 8210] over 32 steps (ddddocr) 0.85-0.96 of
// the int16 weights' time, [120, 18710] over 40 (the PaddleOCR recognizer's) 0.87-1.0 but for one
// round; weights of 1-2 MB, which the caches hold, 1.0-1.1 (the sign extensions cost more than they save).
constexpr size_t NARROW_WEIGHTS_BYTES = 4u << 20;  // as int16

void narrow_large_weights(Operation &op) {
    if (op.winograd != Operation::Winograd::never || op.packed.size() * sizeof(int16_t) <= NARROW_WEIGHTS_BYTES)
        return;
    op.narrow = lpt_s16::narrow_weights(op.packed);
    lpt_s16::PackedWeights().swap(op.packed);
}

// A matmul of one row (a recurrence's step at batch 1) reads each weight once, so their stream bounds it
// once they are past a core's L2 (512 kB on Zen 3), whatever their size: it keeps an int8 copy beside the
// int16 one for such runs (run_s16). Measured (Zen 3, one thread, alternating in one process, with
// lpt_s16's row tiles): one row by [512, 2048] 53-58 µs with the int16 weights, 39-44 with the int8 copy.
constexpr size_t ONE_ROW_NARROW_BYTES = 256u << 10;  // as int16

void narrow_for_one_row(Operation &op) {
    if (op.narrow.empty() && op.packed.size() * sizeof(int16_t) > ONE_ROW_NARROW_BYTES)
        op.narrow = lpt_s16::narrow_weights(op.packed);
}

std::vector<int64_t> layer_output_dims(const Operation &op, const std::vector<int64_t> &src) {
    std::vector<int64_t> dims = {src[0], op.out_channels};
    if (op.kind == Kind::matmul) {
        dims = std::vector<int64_t>(src.begin(), src.end() - 1);
        dims.push_back(op.out_channels);
        return dims;
    }
    const size_t spatial = src.size() - 2;
    for (size_t i = 0; i < spatial; ++i) {
        const int64_t k = op.weight_dims[op.weight_dims.size() - spatial + i];
        const int64_t extent = (k - 1) * (op.dilations[i] + 1) + 1;
        dims.push_back((src[2 + i] + op.pads_begin[i] + op.pads_end[i] - extent) / op.strides[i] + 1);
    }
    return dims;
}

// While one lives, this thread's vector arithmetic takes subnormal inputs as zero and gives zero for
// subnormal results (MXCSR's DAZ and FTZ bits), then as before. Around a primitive that stages into 8 bits:
// there a value that small quantizes to the zero point with or without them (tiny_values_quantize_as_zero,
// which onednn_can_stage requires), while each operation on one takes a microcode assist. PaddleOCR's
// detector has channels of zero weights with biases of 1e-41: its 1×1 384 → 384 over 20×20 that reads
// them took 0.25 ms on a Xeon with AMX (2 threads), 0.05 with the same primitive on other weights.
// lpt's own arithmetic never runs under it: its float32 results are IEEE's, subnormals included.
class SubnormalsAsZero {
public:
    explicit SubnormalsAsZero(bool on) : saved_(_mm_getcsr()), on_(on) {
        if (on_) _mm_setcsr(saved_ | DAZ | FTZ);
    }
    ~SubnormalsAsZero() {
        if (on_) _mm_setcsr(saved_);
    }
    SubnormalsAsZero(const SubnormalsAsZero &) = delete;
    SubnormalsAsZero &operator=(const SubnormalsAsZero &) = delete;

private:
    static constexpr unsigned DAZ = 0x0040, FTZ = 0x8000;
    unsigned saved_;
    bool on_;
};

tag channels_last_tag(int rank) { return rank == 2 ? tag::ab : rank == 3 ? tag::acb : rank == 4 ? tag::acdb : tag::acdeb; }
tag plain_tag(int rank) { return rank == 2 ? tag::ab : rank == 3 ? tag::abc : rank == 4 ? tag::abcd : tag::abcde; }

memory reordered(const int8_t *w, const memory::desc &user, const memory::desc &chosen) {
    memory from(user, cpu(), const_cast<int8_t *>(w));
    memory to(chosen, cpu());
    reorder(from, to).execute(thread_stream(), from, to);
    thread_stream().wait();
    return to;
}

// A convolution that is a matmul of its channels-last source [positions, IC] by its weights: one group,
// every kernel axis 1, stride 1 (or a subsampled source), no padding, no dilation. oneDNN 3.2 runs it as a
// matmul primitive (brgemm), whose kernels are faster than its 1×1 convolution's: on a Xeon with AMX, 2
// threads, into u8 with a Relu, 48 → 96 over 160×160 0.62-0.66 ms by jit_1x1:avx512_core_amx, 0.39-0.40 as
// a matmul; 192 → 96 over 80×80 0.57 → 0.11, 384 → 192 over 20×20 0.067 → 0.024; with oneDNN held to
// AVX-512 VNNI (ONEDNN_MAX_CPU_ISA) its brgconv_1x1 against the matmul 0.58 → 0.51, 0.26 → 0.22, 0.08 → 0.05.
bool pointwise(const Operation &op) {
    if (op.kind != Kind::conv || op.groups != 1) return false;
    const auto zero = [](memory::dim d) { return d == 0; };
    const auto one = [](memory::dim d) { return d == 1; };
    return std::all_of(op.kernel_shape.begin() + 2, op.kernel_shape.end(), one) &&
           (op.subsample || (std::all_of(op.strides.begin(), op.strides.end(), one) &&
                             std::all_of(op.pads_begin.begin(), op.pads_begin.end(), zero) &&
                             std::all_of(op.pads_end.begin(), op.pads_end.end(), zero))) &&
           std::all_of(op.dilations.begin(), op.dilations.end(), zero);
}

memory::desc user_weights_desc(const Operation &op) {
    if (op.kind == Kind::matmul) return memory::desc(op.weight_dims, dt::s8, tag::ab);
    if (pointwise(op)) return memory::desc({op.in_channels, op.out_channels}, dt::s8, tag::ba);  // [OC, IC] as [K, N]
    const int rank = (int)op.weight_dims.size();  // 3..6 with the group axis
    static const tag tags[] = {tag::abc, tag::abcd, tag::abcde, tag::abcdef};
    return memory::desc(op.weight_dims, dt::s8, tags[rank - 3]);
}

// The output dims of the primitive reading src_dims: a subsampled source (Operation::subsample) has them.
memory::dims primitive_output_dims(const Operation &op, const memory::dims &src_dims) {
    if (op.kind == Kind::matmul) return {src_dims[0], op.out_channels};
    memory::dims dims = layer_output_dims(op, src_dims);
    if (op.subsample) std::copy(src_dims.begin() + 2, src_dims.end(), dims.begin() + 2);
    return dims;
}

// The extent of the axis that bands split: a matmul's rows; a convolution's images, or for one
// image the first spatial axis of its output.
int64_t band_rows(const Operation &op, const memory::dims &out) {
    return op.kind == Kind::matmul ? out[0] : out[0] > 1 ? out[0] : out[2];
}

// The accumulators of one band at most, where the layer has more rows than bands: the thread that
// computed a band stages it right away, while they are in that core's L2 cache. (A ResNet-18 at batch 1
// ran as fast with 256 KB, 1 MB or one band per thread; a layer of 900×161 positions has 37 MB of them.)
constexpr size_t BAND_ACCUMULATOR_BYTES = 512u << 10;

// Products below which a layer is one band, on the calling thread: a few microseconds of work on one core,
// less than a worker that has just woken takes to join. silero_vad_16k_op15's 128 → 64 convolution over 4
// positions (49152 products) took 0.030 ms in two bands after an onnxruntime region, 0.005 in one; its plan
// 0.25-0.28 → 0.20-0.23 ms with this bound instead of 2^15 (a Xeon with AMX, 2 threads), seven other corpus
// models the same within the noise.
constexpr double BAND_WORK = 1 << 20;

// How many dense products a depthwise layer's product costs: oneDNN's depthwise kernels have no sum across
// input channels for the dot-product instructions to take. The PaddleOCR recognizer's 192-channel 3×3
// over 6×80 (0.83 M products) took 0.032 ms into float32 and 0.045 into 8 bits on one thread, about what 8 M
// products of a dense layer take (a Xeon with AMX); in two bands 0.019 and 0.025, and its plan 5.45 → 5.2-5.3 ms.
constexpr double DEPTHWISE_COST = 8;

// How many bands a run computes: at least one per thread, each a oneDNN primitive that runs on a thread
// of lpt's own, single-threaded. oneDNN's threads are OpenMP's: asleep between calls
// (OMP_WAIT_POLICY=PASSIVE, _library.py says why), waking them cost each call about 0.08 ms on a 2-core
// VM (a Xeon with AMX: the PaddleOCR recognizer's 1×1 convolutions of one position took 0.086 ms on the
// u8s8 route, 0.002 ms on lpt's s16), while lpt's workers spin through a program's run. Its plan took
// 15.1 → 10.0 ms so, the detector's 71 → 60 ms; a layer below BAND_WORK products is one band. More bands
// than threads where a band's accumulators would pass BAND_ACCUMULATOR_BYTES (or a join's float32 operand,
// as many bytes); where neither passes through memory (the primitives stage, no join: `no_accumulators`),
// one band per thread keeps the threads' work even: ResNet-18's stem, 3.2 MB of accumulators, ran in 7
// bands, 4 on one thread and 3 on the other.
int band_count(const Operation &op, const memory::dims &src_dims, bool no_accumulators) {
    const memory::dims out = primitive_output_dims(op, src_dims);
    double products = (double)op.weights.size(), accumulators = 1;
    for (auto d : out) accumulators *= (double)d;
    products *= (double)out[0];  // a matmul's rows, a convolution's images
    if (op.kind == Kind::conv) for (size_t i = 2; i < out.size(); ++i) products *= (double)out[i];
    if (op.depthwise) products *= DEPTHWISE_COST;
    if (products < BAND_WORK) return 1;
    const double bytes = no_accumulators ? 0 : accumulators * sizeof(int32_t) * (op.route == Route::split ? 2 : 1);
    const int64_t cached = (int64_t)std::ceil(bytes / BAND_ACCUMULATOR_BYTES);
    return (int)std::min<int64_t>(std::max<int64_t>(op.threads, cached), band_rows(op, out));
}

// Bands of output channels (a matmul's columns) instead of rows where a layer's weights outweigh its source
// (deep layers of few positions, classifier heads of few rows, whose weights come from L3 at each run):
// bands of rows each read all the weights and part of the source, bands of channels part of the weights
// and all the source. On route u8s8, for a channels-last output staged by lpt_s16 (stage_columns); 0 where
// rows split. ResNet-18's 512-channel 3×3 layers over 7×7 took 0.14-0.16 ms in bands of rows, 0.09-0.13
// so (a Xeon with AMX, 2 threads), the network 2.50-2.66 → 2.31-2.54 ms (six runs alternating).
constexpr size_t CHANNEL_BAND_WEIGHT_BYTES = 256u << 10;

int channel_band_count(const Operation &op, const memory::dims &src_dims, bool channels_last_out) {
    if (op.route != Route::u8s8 || op.groups != 1 || (op.kind == Kind::conv && !channels_last_out) ||
        !lpt_s16::supported() || op.threads < 2 || op.weights.size() < CHANNEL_BAND_WEIGHT_BYTES)
        return 0;
    double source = 1;
    for (auto d : src_dims) source *= (double)d;
    if ((double)op.weights.size() <= source) return 0;
    return (int)std::min<int64_t>(op.threads, op.out_channels / 16);
}

bool tiny_values_quantize_as_zero(const OutputStage &s);

// Whether oneDNN's primitive applies an operation's output stage and writes the output itself, instead of
// int32 accumulators that lpt stages (finish_rows). On route u8s8, for a Relu, Clip or LeakyRelu or no
// post-op, the primitive computes the stage's float32 operations in its order, bit for bit: x = f32(acc)·m[c]
// (the weights' scales), + bias[c] (not fused into one rounding: oneDNN's f32 output equals it on every
// kernel tried), the post-op; for an 8-bit destination then y = x / s_dst by a binary division post-op
// (vdivps: its destination scale would multiply by 1/s, and add the zero point before rounding, so ties
// and the values next to them would move by 1 LSB), rounded half to even, + zp, saturated. A Xeon with AMX,
// one thread, a 3×3 64 → 64 convolution over 56×56 with a Relu: 0.19 ms with lpt's stage after the
// primitive, 0.12 so (its int32 accumulators alone took 0.078). x is finite (the bounds below); subnormal
// values cannot move a level where tiny_values_quantize_as_zero holds, and a float32 destination takes
// them as IEEE arithmetic gives them, as lpt does. Decided once, when the operation is made
// (prepare_epilogue); LPT_ONEDNN_STAGE=off keeps lpt's stage, to compare, and =reciprocal trades the
// division's exactness for speed (reciprocal_stage).
bool onednn_can_stage(const Operation &op) {
    static const bool off = [] {
        const char *v = std::getenv("LPT_ONEDNN_STAGE");
        return v && std::strcmp(v, "off") == 0;
    }();
    const OutputStage &s = op.stage;
    if (off || op.route != Route::u8s8 || s.dst == Dst::s32 || (s.dst != Dst::f32 && !tiny_values_quantize_as_zero(s)))
        return false;
    if (!s.post_ops.empty()) {
        if (s.post_ops.size() != lpt_s16::POST_OP_FIELDS || s.post_ops[0] != lpt_s16::SLOPE_CLIP) return false;
        const float slope = s.post_ops[1], low = s.post_ops[2], high = s.post_ops[3];
        if (!(std::isfinite(slope) && low <= high && !std::isnan(low) && !std::isnan(high))) return false;
        // a float32 output keeps a zero's sign: slope·(−0) is −0, as lpt's −0 < 0 ? … : x, only where slope ≥ 0
        if (s.dst == Dst::f32 && slope < 0) return false;
    }
    // |acc| < 2^31: x and x / s stay far from float32's overflow
    double largest = 0;
    for (float m : s.multiplier) largest = std::max(largest, (double)std::fabs(m) * 0x1p31);
    for (float b : s.bias) largest = std::max(largest, 2 * (double)std::fabs(b));
    if (!s.post_ops.empty()) largest *= std::max(1.0, (double)std::fabs(s.post_ops[1]));
    return largest < 0x1p100 && largest / s.scale < 0x1p100;
}

// LPT_ONEDNN_STAGE=reciprocal: the primitive multiplies by RN(1/s) where it divides by s, as OpenVINO's
// int8 layers and oneDNN's destination scales do. Not exact: a value whose quotient lies next to a half can
// round to the neighbouring level (1 LSB). The division takes 10 cycles per 16 values in each staged layer
// (twice with a join); ResNet-18 on a Xeon with AMX, 2 threads: 0.98-1.01x OpenVINO's int8 so, 1.05-1.10x exact.
bool reciprocal_stage() {
    static const bool on = [] {
        const char *v = std::getenv("LPT_ONEDNN_STAGE");
        return v && std::strcmp(v, "reciprocal") == 0;
    }();
    return on;
}

// A run that oneDNN stages: the operation's own destination, channels-last for a convolution.
bool stages_in_onednn(const Operation &op, Dst dst, bool channels_last_out) {
    return op.onednn_stage && dst == op.stage.dst && (op.kind == Kind::matmul || channels_last_out);
}

// The quantization that ends a staged chain: y (already divided by the scale) rounded half to even, + zp,
// clipped to [qmin, qmax] where that is narrower than the 8-bit type's range, which the conversion saturates to.
void append_levels(post_ops &chain, bool is_unsigned, int zero_point, int qmin, int qmax) {
    if (zero_point != 0) {  // rint(y) + zp: the conversion to 8 bits would round y + zp
        chain.append_eltwise(algorithm::eltwise_round, 0.0f, 0.0f);
        chain.append_eltwise(algorithm::eltwise_linear, 1.0f, (float)zero_point);
    }
    if (qmin > (is_unsigned ? 0 : -128) || qmax < (is_unsigned ? 255 : 127))
        chain.append_eltwise(algorithm::eltwise_clip, (float)qmin, (float)qmax);
}

// The attributes that make a primitive apply the output stage (stages_in_onednn), and a join after it where
// given, for a destination of dims `dst`. The binary post-ops' places go into p, their operands at each run.
void stage_attributes(primitive_attr &attr, const Operation &op, const memory::dims &dst, const Join *join, Prepared &p) {
    const int rank = (int)dst.size();
    const OutputStage &s = op.stage;
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, rank == 2 ? 1 << 1 : op.groups > 1 ? 3 : 1);  // a matmul's columns
    post_ops chain;
    if (!s.post_ops.empty()) {
        const float slope = s.post_ops[1], low = s.post_ops[2], high = s.post_ops[3];
        // x > 0 ? x : slope·x, which differs from lpt's x < 0 ? x·slope : x only in a zero's sign
        if (slope != 1.0f) chain.append_eltwise(algorithm::eltwise_relu, slope, 0.0f);
        if (slope == 1.0f && low == 0.0f && high == INFINITY)
            chain.append_eltwise(algorithm::eltwise_relu, 0.0f, 0.0f);
        else if (low != -INFINITY || high != INFINITY)  // x is finite: ±FLT_MAX bound nothing
            chain.append_eltwise(algorithm::eltwise_clip, std::max(low, -FLT_MAX), std::min(high, FLT_MAX));
    }
    if (s.dst == Dst::f32) {
        // lpt's clip at 0 gives +0 for every x ≤ 0, oneDNN's Relu 0·x (−0 where x < 0): x·1 + 0 makes it +0
        // and leaves every other value as it is
        if (!s.post_ops.empty() && s.post_ops[2] == 0.0f) chain.append_eltwise(algorithm::eltwise_linear, 1.0f, 0.0f);
        attr.set_post_ops(chain);
        return;
    }
    const memory::desc one(memory::dims(rank, 1), dt::f32, plain_tag(rank));
    const algorithm quotient = reciprocal_stage() ? algorithm::binary_mul : algorithm::binary_div;
    p.divisor_index = chain.len();
    chain.append_binary(quotient, one);
    if (!join) {
        append_levels(chain, s.dst == Dst::u8, s.zero_point, s.qmin, s.qmax);
        attr.set_post_ops(chain);
        return;
    }
    // q − zp = clip(rint(y), qmin − zp, qmax − zp), then lpt_ops::join's operations
    chain.append_eltwise(algorithm::eltwise_round, 0.0f, 0.0f);
    chain.append_eltwise(algorithm::eltwise_clip, (float)(s.qmin - s.zero_point), (float)(s.qmax - s.zero_point));
    chain.append_eltwise(algorithm::eltwise_linear, join->scale, 0.0f);  // RN(d·scale), + 0 exact
    p.other_index = chain.len();
    chain.append_binary(join->multiply ? algorithm::binary_mul : algorithm::binary_add,
                        memory::desc(dst, dt::f32, channels_last_tag(rank)));
    if (join->relu) chain.append_eltwise(algorithm::eltwise_relu, 0.0f, 0.0f);  // −0 for +0: the same level
    p.join_divisor_index = chain.len();
    chain.append_binary(quotient, one);
    append_levels(chain, join->to.type == 'B', join->to.zero_point, join->to.qmin, join->to.qmax);
    attr.set_post_ops(chain);
}

// A convolution's descriptor, past oneDNN 3.2's AMX kernels on the layers where they are wrong. Fuzzers of
// thousands of layers each against lpt's NumPy reference, on a Xeon with AMX: on 3-D convolutions its
// brgconv:avx512_core_amx gave wrong sums (differing from run to run), crashed or corrupted the heap; on
// dilated 1-D and 2-D ones its AMX kernels crashed creating the primitive now and then (a window wholly in
// the padding, or a source zero point with padding after); with a source zero point and padding its
// jit:avx512_core_amx (which oneDNN picks over brgconv there) summed 34 of 5700 layers wrong, by up to 1.5
// million, and corrupted the heap: each was padded by more than half the window on a side, or padded on
// its first axis and not on its last. On all other 1-D and 2-D layers (a band of rows of a "same"
// convolution, padded on its last axis only, among them) they were right. The VNNI kernels next in
// oneDNN's list, and its AVX2 ones, were right on every one of them.
convolution_forward::primitive_desc convolution_descriptor(
        const memory::desc &src, const memory::desc &weights, const memory::desc &bias, const memory::desc &dst,
        const memory::dims &strides, const memory::dims &dilations, const memory::dims &pads_begin,
        const memory::dims &pads_end, const primitive_attr &attr, bool zero_point) {
    auto pd = convolution_forward::primitive_desc(cpu(), prop_kind::forward_inference, algorithm::convolution_direct,
                                                  src, weights, bias, dst, strides, dilations, pads_begin, pads_end,
                                                  attr);
    const auto positive = [](memory::dim d) { return d > 0; };
    bool padded = false, beyond_half = false;  // padded by more than half the window on a side
    for (size_t a = 0; a < pads_begin.size(); ++a) {
        const memory::dim half = (weights.get_dims()[weights.get_ndims() - pads_begin.size() + a] - 1) / 2;
        padded = padded || pads_begin[a] > 0 || pads_end[a] > 0;
        beyond_half = beyond_half || pads_begin[a] > half || pads_end[a] > half;
    }
    const bool last_axis_unpadded = pads_begin.back() == 0 && pads_end.back() == 0;
    const bool amx_wrong = src.get_ndims() == 5 || std::any_of(dilations.begin(), dilations.end(), positive) ||
                           (zero_point && padded && (beyond_half || last_axis_unpadded));
    while (amx_wrong && std::string(pd.impl_info_str()).find("amx") != std::string::npos)
        if (!pd.next_impl()) throw std::runtime_error("oneDNN has no convolution but its AMX one for this layer");
    return pd;
}

// A band's primitive and memory objects from the descriptor oneDNN made for it; returns the layout it
// chose for the weights, and names its implementation in `impl`.
template <typename Primitive, typename Descriptor>
memory::desc adopt(Band &band, const Descriptor &pd, std::string &impl) {
    impl = pd.impl_info_str();
    band.prim = Primitive(pd);
    band.src = memory(pd.src_desc(), cpu(), nullptr);
    band.dst_hi = memory(pd.dst_desc(), cpu(), nullptr);
    band.dst_lo = memory(pd.dst_desc(), cpu(), nullptr);
    band.scratchpad = memory(pd.scratchpad_desc(), cpu());
    return pd.weights_desc();
}

// src dims: conv [N, C, *spatial], matmul [M, K]; zero_point: the u8 source's, as the primitive reads it
// (an s8 source is read as q + 128). Whether there is one is part of the primitive; its value is set
// at each run (execute), as a dynamic quantization gives a new one each run. `staged`: the primitives
// write the output stage's values (stages_in_onednn), not int32 accumulators; `join`: and the join's after.
std::unique_ptr<Prepared> make_prepared(Operation &op, const memory::dims &src_dims, int zero_point,
                                        bool channels_last_out, bool staged, const Join *join) {
    // A primitive keeps the thread count it was made under (oneDNN reads OpenMP's) and opens an OpenMP team
    // of that many at each run. Each band runs on one thread (execute), so each is made for one. Made under
    // the default of one per core, a process's first layer woke a team at every run: silero_vad's 129 → 128
    // convolution over 4 positions took 0.10-0.12 ms instead of 0.015.
    omp_set_num_threads(1);
    auto p = std::make_unique<Prepared>();
    p->has_zero_point = zero_point != 0;
    p->staged = staged;
    p->joined = staged && join;
    // a band's attributes: a join's operand has the band's output shape
    const auto attributes = [&](const memory::dims &band_dst) {
        primitive_attr attr;
        attr.set_scratchpad_mode(scratchpad_mode::user);  // each band its own: bands run on several threads
        if (p->has_zero_point) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
        if (staged) stage_attributes(attr, op, band_dst, p->joined ? join : nullptr, *p);
        return attr;
    };
    const bool as_matmul = op.kind == Kind::matmul || pointwise(op);  // a matmul primitive
    const int dst_rank = as_matmul ? 2 : (int)src_dims.size();
    const Dst out = p->joined ? (join->to.type == 'B' ? Dst::u8 : Dst::s8) : op.stage.dst;
    const dt dst_type = !staged ? dt::s32 : out == Dst::u8 ? dt::u8 : out == Dst::s8 ? dt::s8 : dt::f32;
    // The float32 operand of a band's join (its output shape), its memory bound at each run
    const auto join_operand = [&](Band &band, const memory::dims &band_dst) {
        if (p->joined) band.other = memory(memory::desc(band_dst, dt::f32, channels_last_tag((int)band_dst.size())), cpu(), nullptr);
    };
    const bool biased = staged && !op.stage.bias.empty();
    // The bias and the weights' scales of channels [first, first + count), for a staged band.
    const auto stage_memory = [&](Band &band, int64_t first, int64_t count) {
        if (!staged) return;
        float *m = const_cast<float *>(op.stage.multiplier.data()) + first;
        band.multiplier = memory(memory::desc({count}, dt::f32, tag::x), cpu(), m);
        if (biased)
            band.bias = memory(memory::desc({count}, dt::f32, tag::x), cpu(), const_cast<float *>(op.stage.bias.data()) + first);
    };
    const auto bias_desc = [&](int64_t count) {
        if (!biased) return memory::desc();
        return as_matmul ? memory::desc({1, count}, dt::f32, tag::ab) : memory::desc({count}, dt::f32, tag::x);
    };
    const memory::desc weights_any(op.weight_dims, dt::s8, tag::any);
    const memory::dims dst_dims = primitive_output_dims(op, src_dims);
    int64_t image_bytes = 1, image_items = 1;  // a convolution's, channels-last
    for (size_t i = 1; i < src_dims.size(); ++i) image_bytes *= src_dims[i];
    for (size_t i = 1; i < dst_dims.size(); ++i) image_items *= dst_dims[i];
    const int64_t rows = band_rows(op, dst_dims);
    const memory::desc user = user_weights_desc(op);
    if (const int bands = channel_band_count(op, src_dims, channels_last_out)) {
        p->channel_bands = true;
        const int rank = (int)src_dims.size();
        const int64_t positions = op.kind == Kind::conv ? (int64_t)(image_items / op.out_channels) * dst_dims[0]
                                                        : src_dims[0];
        const int64_t per_channel = (int64_t)op.weights.size() / op.out_channels;
        for (int b = 0; b < bands; ++b) {  // channels in blocks of 16, as the stage takes them
            const int64_t first = op.out_channels * b / bands / 16 * 16;
            const int64_t end = b + 1 == bands ? op.out_channels : op.out_channels * (b + 1) / bands / 16 * 16;
            Band band;
            if (!as_matmul) {
                memory::dims weight_dims = op.weight_dims, band_dst = dst_dims;
                weight_dims[0] = band_dst[1] = end - first;
                const bool sub = op.subsample;
                const memory::dims ones(rank - 2, 1), none(rank - 2, 0);
                auto pd = convolution_descriptor(
                        memory::desc(src_dims, dt::u8, channels_last_tag(rank)), memory::desc(weight_dims, dt::s8, tag::any),
                        bias_desc(end - first), memory::desc(band_dst, dst_type, channels_last_tag(rank)),
                        sub ? ones : op.strides, op.dilations, sub ? none : op.pads_begin, sub ? none : op.pads_end,
                        attributes(band_dst), p->has_zero_point);
                join_operand(band, band_dst);
                const memory::desc chosen = adopt<convolution_forward>(band, pd, p->impl);
                const tag plain = rank == 3 ? tag::abc : rank == 4 ? tag::abcd : tag::abcde;  // [OC, IC, *kernel]
                band.weights = reordered(op.weights.data() + first * per_channel,
                                         memory::desc(weight_dims, dt::s8, plain), chosen);
            } else {  // the weights' columns [K, first:end]: a matmul's made contiguous, a pointwise convolution's
                      // rows [first:end] of [OC, IC] as they are
                const int64_t k = op.in_channels, width = end - first;
                std::vector<int8_t> columns;
                if (op.kind == Kind::matmul) {
                    columns.resize((size_t)(k * width));
                    for (int64_t i = 0; i < k; ++i)
                        std::memcpy(columns.data() + i * width, op.weights.data() + i * op.out_channels + first, width);
                }
                const memory::dims weight_dims = {k, width};
                auto pd = matmul::primitive_desc(cpu(), memory::desc({positions, k}, dt::u8, tag::ab),
                                                 memory::desc(weight_dims, dt::s8, tag::any), bias_desc(width),
                                                 memory::desc({positions, width}, dst_type, tag::ab),
                                                 attributes({positions, width}));
                const memory::desc chosen = adopt<matmul>(band, pd, p->impl);
                band.weights = op.kind == Kind::matmul
                        ? reordered(columns.data(), memory::desc(weight_dims, dt::s8, tag::ab), chosen)
                        : reordered(op.weights.data() + first * k, memory::desc(weight_dims, dt::s8, tag::ba), chosen);
            }
            band.dst_offset = (size_t)(positions * first);
            band.first_row = 0, band.end_row = positions;
            band.first_channel = first, band.channels = end - first;
            stage_memory(band, first, end - first);
            p->bands.push_back(std::move(band));
        }
    }
    memory::desc weights_desc;
    // a matmul's rows: a pointwise convolution's output positions, of every image
    const int64_t matmul_rows = op.kind == Kind::matmul ? src_dims[0] : image_items / op.out_channels * dst_dims[0];
    const int64_t matmul_k = op.in_channels;
    for (int b = 0, bands = p->channel_bands ? 0 : band_count(op, src_dims, staged && !join); b < bands; ++b) {
        const int64_t extent = as_matmul ? matmul_rows : rows;
        const int64_t begin = extent * b / bands, end = extent * (b + 1) / bands;  // output rows
        Band band;
        memory::desc chosen;
        if (!as_matmul) {
            const int rank = (int)src_dims.size();
            const bool sub = op.subsample;  // its source is subsampled already: stride 1, no padding
            memory::dims band_src = src_dims, band_dst = dst_dims;
            memory::dims pads_begin = sub ? memory::dims(rank - 2, 0) : op.pads_begin;
            memory::dims pads_end = sub ? memory::dims(rank - 2, 0) : op.pads_end;
            if (bands > 1 && dst_dims[0] > 1) {  // a band of images
                band_src[0] = band_dst[0] = end - begin;
                band.src_offset = (size_t)(begin * image_bytes);
                band.dst_offset = (size_t)(begin * image_items);
            } else if (bands > 1) {  // a band of one image's first spatial axis: the rows it reads, the padding beside them
                const int64_t stride = sub ? 1 : op.strides[0], pad = pads_begin[0];
                const int64_t k = op.weight_dims[op.weight_dims.size() - (rank - 2)];
                const int64_t extent = (k - 1) * (op.dilations[0] + 1) + 1;
                const int64_t first = begin * stride - pad, last = (end - 1) * stride - pad + extent;  // [first, last)
                const int64_t from = std::max<int64_t>(first, 0), to = std::min<int64_t>(last, src_dims[2]);
                if (to <= from) {  // a band within the padding: the whole layer in one
                    p->bands.clear();
                    b = -1, bands = 1;
                    continue;
                }
                band_src[2] = to - from;
                band_dst[2] = end - begin;
                pads_begin[0] = from - first;
                pads_end[0] = last - to;
                band.src_offset = (size_t)(from * image_bytes / src_dims[2]);
                band.dst_offset = (size_t)(begin * image_items / dst_dims[2]);
            }
            const memory::desc src_md(band_src, dt::u8, channels_last_tag(rank));
            const memory::desc dst_md(band_dst, dst_type, channels_last_tag(rank));
            const memory::dims ones(rank - 2, 1);
            auto pd = convolution_descriptor(src_md, weights_any, bias_desc(op.out_channels), dst_md,
                                             sub ? ones : op.strides, op.dilations, pads_begin, pads_end,
                                             attributes(band_dst), p->has_zero_point);
            join_operand(band, band_dst);
            chosen = adopt<convolution_forward>(band, pd, p->impl);
            int64_t items = 1;
            for (auto d : band_dst) items *= d;
            band.first_row = (int64_t)band.dst_offset / op.out_channels;
            band.end_row = band.first_row + items / op.out_channels;
        } else {
            const memory::desc src_md({end - begin, matmul_k}, dt::u8, tag::ab);
            const memory::desc dst_md({end - begin, op.out_channels}, dst_type, tag::ab);
            const memory::desc weights({matmul_k, op.out_channels}, dt::s8, tag::any);
            auto pd = matmul::primitive_desc(cpu(), src_md, weights, bias_desc(op.out_channels), dst_md,
                                             attributes({end - begin, op.out_channels}));
            join_operand(band, {end - begin, op.out_channels});
            chosen = adopt<matmul>(band, pd, p->impl);
            band.src_offset = (size_t)(begin * matmul_k);
            band.dst_offset = (size_t)(begin * op.out_channels);
            band.first_row = begin, band.end_row = end;
        }
        stage_memory(band, 0, op.out_channels);
        if (b == 0) {
            weights_desc = chosen;
        } else if (chosen != weights_desc) {  // the bands share one reordered copy of the weights: one band
            p->bands.clear();
            b = -1, bands = 1;
            continue;
        }
        p->bands.push_back(std::move(band));
    }
    if (op.route == Route::split) {
        p->weights_hi = reordered(op.hi.data(), user, weights_desc);
        p->weights_lo = reordered(op.lo.data(), user, weights_desc);
    } else if (!p->channel_bands) {  // channel bands hold their own
        p->weights_hi = reordered(op.weights.data(), user, weights_desc);
    }
    int64_t items = 1, bytes = 1;
    for (auto d : dst_dims) items *= d;
    for (auto d : src_dims) bytes *= d;
    p->accumulators = (size_t)items;
    p->src_bytes = (size_t)bytes;
    p->zero_point = memory({{1}, dt::s32, tag::x}, cpu());
    const memory::desc one(memory::dims(dst_rank, 1), dt::f32, plain_tag(dst_rank));
    const auto divisor_of = [](float scale) { return reciprocal_stage() ? 1.0f / scale : scale; };
    p->divisor_value = divisor_of(op.stage.scale);
    if (staged && op.stage.dst != Dst::f32) p->divisor = memory(one, cpu(), &p->divisor_value);
    if (p->joined) {
        p->join_scale = divisor_of(join->to.scale);
        p->join_divisor = memory(one, cpu(), &p->join_scale);
    }
    for (Band &band : p->bands) {
        auto &a = band.arguments;
        a = {{DNNL_ARG_SRC, band.src}, {DNNL_ARG_WEIGHTS, p->channel_bands ? band.weights : p->weights_hi},
             {DNNL_ARG_DST, band.dst_hi}, {DNNL_ARG_SCRATCHPAD, band.scratchpad}};
        if (p->has_zero_point) a[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = p->zero_point;
        if (staged) {
            a[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] = band.multiplier;
            if (band.bias) a[DNNL_ARG_BIAS] = band.bias;
            if (p->divisor) a[DNNL_ARG_ATTR_MULTIPLE_POST_OP(p->divisor_index) | DNNL_ARG_SRC_1] = p->divisor;
        }
        if (p->joined) {
            a[DNNL_ARG_ATTR_MULTIPLE_POST_OP(p->other_index) | DNNL_ARG_SRC_1] = band.other;
            a[DNNL_ARG_ATTR_MULTIPLE_POST_OP(p->join_divisor_index) | DNNL_ARG_SRC_1] = p->join_divisor;
        }
        if (op.route == Route::split) {
            band.arguments_lo = a;
            band.arguments_lo[DNNL_ARG_WEIGHTS] = p->weights_lo;
            band.arguments_lo[DNNL_ARG_DST] = band.dst_lo;
        }
    }
    return p;
}

// A convolution's spatial axes (bit a: axis a) where the source has extent 1 and the window spans 1 without padding,
// while some axis remains: a Conv1D exported as a 2-D convolution ([N, C, 1, W] by a [1, k] kernel: basic_pitch's
// constant-Q front end) or magika's [N, 256, 512, 1] by [5, 1]. Channels-last, the source and the output are the same
// bytes without them, and oneDNN's brgconv blocks its work along the last axis: magika's 256 → 512 layer took
// 1.27 ms as [512, 1], 0.64 as [1, 512] and 0.47 as one axis of 512 (Zen 4, 2 threads, lpt bench; OpenVINO 0.48).
unsigned unit_axes(const Operation &op, const memory::dims &src_dims) {
    if (op.kind != Kind::conv || op.subsample || pointwise(op)) return 0;
    const size_t spatial = src_dims.size() - 2;
    unsigned axes = 0;
    for (size_t a = 0; a < spatial; ++a)
        if (src_dims[2 + a] == 1 && op.kernel_shape[2 + a] == 1 && op.pads_begin[a] == 0 && op.pads_end[a] == 0)
            axes |= 1u << a;
    return axes == (1u << spatial) - 1 ? 0 : axes;
}

// `op` without the spatial axes `axes`: the geometry and what make_prepared reads, weights and stage copied
std::unique_ptr<Operation> without_axes(const Operation &op, unsigned axes) {
    auto r = std::make_unique<Operation>();
    r->kind = op.kind, r->route = op.route, r->threads = op.threads;
    r->weights = op.weights, r->hi = op.hi, r->lo = op.lo;
    r->groups = op.groups, r->out_channels = op.out_channels, r->in_channels = op.in_channels;
    r->subsample = op.subsample, r->src_zero_point = op.src_zero_point, r->stage = op.stage;
    r->depthwise = op.depthwise, r->onednn_stage = op.onednn_stage;
    const size_t spatial = op.strides.size();
    r->weight_dims.assign(op.weight_dims.begin(), op.weight_dims.end() - spatial);
    r->kernel_shape.assign(op.kernel_shape.begin(), op.kernel_shape.end() - spatial);
    for (size_t a = 0; a < spatial; ++a) {
        if (axes >> a & 1) continue;
        r->weight_dims.push_back(op.weight_dims[op.weight_dims.size() - spatial + a]);
        r->kernel_shape.push_back(op.kernel_shape[op.kernel_shape.size() - spatial + a]);
        r->strides.push_back(op.strides[a]), r->dilations.push_back(op.dilations[a]);
        r->pads_begin.push_back(op.pads_begin[a]), r->pads_end.push_back(op.pads_end[a]);
    }
    return r;
}

Prepared &prepare(Operation &op, const memory::dims &src_dims, bool signed_src, int zero_point, bool channels_last_out,
                  bool staged, const Join *join) {
    std::vector<int64_t> key(src_dims.begin(), src_dims.end());
    key.push_back(signed_src);
    key.push_back(zero_point != 0);
    key.push_back(channels_last_out);
    key.push_back(staged);
    if (join) {  // its constants are the primitive's
        const auto bits = [](float v) { int32_t b; std::memcpy(&b, &v, sizeof b); return (int64_t)b; };
        for (int64_t v : {(int64_t)join->other_signed, (int64_t)join->multiply, (int64_t)join->relu, bits(join->scale),
                          bits(join->to.scale), (int64_t)join->to.type, (int64_t)join->to.zero_point,
                          (int64_t)join->to.qmin, (int64_t)join->to.qmax})
            key.push_back(v);
    }
    auto found = op.prepared.find(key);
    if (found != op.prepared.end()) return *found->second;
    // Each shape holds its primitives and their reordered weights: calibration meets many batch
    // sizes, and keeping them all took a real model (dnsmos_sig_bak_ovr) past 10 GB.
    if (op.prepared.size() >= MAX_PREPARED_SHAPES) op.prepared.clear();
    Operation *layer = &op;
    memory::dims dims = src_dims;
    if (const unsigned axes = unit_axes(op, src_dims)) {
        auto &reduced = op.without_unit_axes[axes];
        if (!reduced) reduced = without_axes(op, axes);
        layer = reduced.get();
        dims.assign(src_dims.begin(), src_dims.begin() + 2);
        for (size_t a = 0; a + 2 < src_dims.size(); ++a)
            if (!(axes >> a & 1)) dims.push_back(src_dims[2 + a]);
    }
    auto p = make_prepared(*layer, dims, zero_point, channels_last_out, staged, join);
    // oneDNN's reference kernels take the post-ops where its fast ones do not: lpt's stage is faster then
    // (a join stays: its caller has no memory for the layer's own output)
    if (staged && !join && p->impl.find("ref") != std::string::npos)
        p = make_prepared(*layer, dims, zero_point, channels_last_out, false, nullptr);
    op.last_impl = p->impl;
    return *op.prepared.emplace(key, std::move(p)).first->second;
}

// src [N, C, P] channels-first → scratch [N, P, C], XOR 0x80 for an s8 source (q + 128 as u8).
void to_channels_last(const uint8_t *src, uint8_t *dst, int64_t images, int64_t channels, int64_t positions,
                      uint8_t flip, int threads) {
    constexpr int64_t BLOCK = 64;
    const int64_t blocks = (positions + BLOCK - 1) / BLOCK;
    lpt_parallel::for_each(images * positions * channels >= PARALLEL_WORK ? threads : 1,
                           images * blocks, [=](int64_t t) {
        const int64_t n = t / blocks, p0 = (t % blocks) * BLOCK, count = std::min(BLOCK, positions - p0);
        if (channels == 3 && lpt_s16::supported()) {  // an RGB image (a stem): byte by byte, 2% of ResNet-18's time
            lpt_s16::interleave_three_planes(src + n * 3 * positions + p0, positions, count, flip,
                                             dst + (n * positions + p0) * 3);
            return;
        }
        for (int64_t c = 0; c < channels; ++c) {
            const uint8_t *from = src + (n * channels + c) * positions + p0;
            uint8_t *to = dst + (n * positions + p0) * channels + c;
            for (int64_t p = 0; p < count; ++p) to[p * channels] = from[p] ^ flip;
        }
    });
}

// The source positions a 1×1 convolution's strides read (Operation::subsample), channels-last
// [N, *out_spatial, C], XOR `flip`; a position in the padding holds `pad` (the zero point: adds nothing).
// src: [N, C, *spatial] channels-first, or with `channels_last` [N, *spatial, C].
void subsample(const uint8_t *src, const memory::dims &dims, bool channels_last, const Operation &op,
               const memory::dims &out_dims, uint8_t flip, uint8_t pad, uint8_t *dst, int threads) {
    const int64_t images = dims[0], channels = dims[1];
    // up to three spatial axes, as depth, height and width (an axis of 1 where the convolution has none)
    int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, stride[3] = {1, 1, 1}, begin[3] = {0, 0, 0};
    const int spatial = (int)dims.size() - 2;
    for (int i = 0; i < spatial; ++i) {
        const int axis = 3 - spatial + i;
        in[axis] = dims[2 + i], out[axis] = out_dims[2 + i];
        stride[axis] = op.strides[i], begin[axis] = op.pads_begin[i];
    }
    const int64_t in_positions = in[0] * in[1] * in[2], rows = images * out[0] * out[1];
    lpt_parallel::for_each(rows * out[2] * channels >= PARALLEL_WORK ? threads : 1, rows, [=](int64_t row) {
        const int64_t n = row / (out[0] * out[1]), z = row / out[1] % out[0], y = row % out[1];
        const int64_t iz = z * stride[0] - begin[0], iy = y * stride[1] - begin[1];
        uint8_t *to = dst + row * out[2] * channels;
        for (int64_t x = 0; x < out[2]; ++x, to += channels) {
            const int64_t ix = x * stride[2] - begin[2];
            if (iz < 0 || iz >= in[0] || iy < 0 || iy >= in[1] || ix < 0 || ix >= in[2]) {
                std::memset(to, pad, channels);
                continue;
            }
            const int64_t position = (iz * in[1] + iy) * in[2] + ix;
            if (channels_last) {
                const uint8_t *from = src + (n * in_positions + position) * channels;
                for (int64_t c = 0; c < channels; ++c) to[c] = from[c] ^ flip;
            } else {
                const uint8_t *from = src + n * channels * in_positions + position;
                for (int64_t c = 0; c < channels; ++c) to[c] = from[c * in_positions] ^ flip;
            }
        }
    });
}

void flip_signs(const uint8_t *src, uint8_t *dst, int64_t count, int threads) {
    lpt_parallel::for_each(count >= 4 * PARALLEL_WORK ? threads : 1, count, [=](int64_t i) { dst[i] = src[i] ^ 0x80; });
}

// ---------------------------------------------------------------- Python glue

struct Buffer {  // a Py_buffer released on scope exit
    Py_buffer view{};
    bool held = false;
    ~Buffer() {
        if (held) PyBuffer_Release(&view);
    }
    bool get(PyObject *o, int flags) {
        held = PyObject_GetBuffer(o, &view, flags) == 0;
        return held;
    }
    char format() const {
        const char *f = view.format ? view.format : "B";
        if (*f == '<' || *f == '=' || *f == '@' || *f == '|') ++f;
        return f[1] == '\0' ? f[0] : '?';
    }
};

Operation *operation(PyObject *capsule) {
    return static_cast<Operation *>(PyCapsule_GetPointer(capsule, CAPSULE));
}

void destroy(PyObject *capsule) { delete operation(capsule); }

std::vector<int64_t> int_sequence(PyObject *o, const char *name) {
    std::vector<int64_t> values;
    PyObject *seq = PySequence_Fast(o, name);
    if (!seq) throw std::invalid_argument(std::string(name) + " must be a sequence of integers");
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            PyErr_Clear();
            throw std::invalid_argument(std::string(name) + " must be a sequence of integers");
        }
        values.push_back(v);
    }
    Py_DECREF(seq);
    return values;
}

std::vector<float> float_vector(PyObject *o, const char *name) {
    Buffer b;
    if (!b.get(o, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) || b.format() != 'f') {
        PyErr_Clear();
        throw std::invalid_argument(std::string(name) + " must be a contiguous float32 array");
    }
    const float *data = static_cast<const float *>(b.view.buf);
    return std::vector<float>(data, data + b.view.len / sizeof(float));
}

void parse_stage(OutputStage &stage, PyObject *multiplier, PyObject *bias, PyObject *post_ops, const char *dst,
                 double scale, int zero_point, int qmin, int qmax) {
    stage.multiplier = float_vector(multiplier, "multiplier");
    if (bias != Py_None) stage.bias = float_vector(bias, "bias");
    stage.post_ops = float_vector(post_ops, "post_ops");
    if (stage.post_ops.size() % lpt_s16::POST_OP_FIELDS)
        throw std::invalid_argument("post_ops must be (kind, slope, low, high) quadruples");
    for (size_t k = 0; k < stage.post_ops.size(); k += lpt_s16::POST_OP_FIELDS)
        if (stage.post_ops[k] != lpt_s16::SLOPE_CLIP && stage.post_ops[k] != lpt_s16::SIGMOID &&
            stage.post_ops[k] != lpt_s16::GELU && stage.post_ops[k] != lpt_s16::SILU &&
            stage.post_ops[k] != lpt_s16::HARD_SWISH)
            throw std::invalid_argument(
                    "a post-op's kind must be 0 (slope and clip), 1 (sigmoid), 2 (gelu), 3 (silu) or 4 (hard swish)");
    if ((int64_t)stage.post_ops.size() / lpt_s16::POST_OP_FIELDS > lpt_s16::MAX_POST_OPS)
        throw std::invalid_argument("at most " + std::to_string(lpt_s16::MAX_POST_OPS) + " post-ops");
    const std::string d(dst);
    stage.dst = d == "f32" ? Dst::f32 : d == "u8" ? Dst::u8 : d == "s8" ? Dst::s8 : Dst::s32;
    if (d != "f32" && d != "u8" && d != "s8") throw std::invalid_argument("dst must be 'f32', 'u8' or 's8'");
    stage.scale = (float)scale;
    stage.zero_point = zero_point;
    stage.qmin = qmin;
    stage.qmax = qmax;
}

// The part of create() that both kinds share: weights, route, zero point, output stage, threads.
bool parse_common(Operation &op, PyObject *weights, const char *route, int threads, int src_zero_point,
                  PyObject *multiplier, PyObject *bias, PyObject *post_ops, const char *dst, double scale,
                  int zero_point, int qmin, int qmax) {
    Buffer w;
    if (!w.get(weights, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) return false;
    if (w.format() != 'b') throw std::invalid_argument("weights must be a C-contiguous int8 array");
    const int8_t *data = static_cast<const int8_t *>(w.view.buf);
    op.weights.assign(data, data + w.view.len);
    const std::string r(route);
    if (r == "u8s8") op.route = Route::u8s8;
    else if (r == "split") op.route = Route::split;
    else if (r == "s16") op.route = Route::s16;
    else throw std::invalid_argument("route must be 'u8s8', 'split' or 's16', got '" + r + "'");
    if (op.route == Route::s16 && !lpt_s16::supported()) throw std::invalid_argument("route s16 needs AVX2");
    if (op.route == Route::split) {
        op.hi.resize(op.weights.size());
        op.lo.resize(op.weights.size());
        for (size_t i = 0; i < op.weights.size(); ++i) {
            op.hi[i] = (int8_t)(op.weights[i] >> 6);  // floor(w / 64): an arithmetic shift
            op.lo[i] = (int8_t)(op.weights[i] & 63);
        }
    }
    op.threads = threads > 0 ? threads : omp_get_num_procs();
    op.src_zero_point = src_zero_point;
    parse_stage(op.stage, multiplier, bias, post_ops, dst, scale, zero_point, qmin, qmax);
    return true;
}

void check_stage(const Operation &op) {
    const size_t c = (size_t)op.out_channels;
    if (op.stage.multiplier.size() != c) throw std::invalid_argument("multiplier must have one value per output channel");
    if (!op.stage.bias.empty() && op.stage.bias.size() != c)
        throw std::invalid_argument("bias must have one value per output channel");
}

// Whether every x with |x| < TINY (2^-96) gives the level x = 0 gives, so that the vector stage may take
// such x as 0 and keep subnormal floats out of its post-ops (lpt_s16::Epilogue::flush_tiny). An 8-bit
// destination of scale at least 2^-20, and at most four post-ops, each either taking x = 0 and x tiny to
// the same value (a Sigmoid: 0.5, exp(−x) rounding to 1) or to values at most 2^16 times x in magnitude
// (a LeakyRelu's slope and a HardSwish's alpha at most 2^8 in magnitude, a GELU's `one` and `half` too; a
// clip moves two values no further apart, and where it takes either to a bound of its, both are that
// bound or both are tiny). So both reach the quantization below 2^-96·2^64 = 2^-32 in magnitude, or
// equal: below 2^-12 once divided by the scale, both round to 0, and the level is the same.
bool tiny_values_quantize_as_zero(const OutputStage &s) {
    const size_t fields = lpt_s16::POST_OP_FIELDS;
    if (s.dst == Dst::f32 || !(s.scale >= 0x1p-20f) || s.post_ops.size() > 4 * fields) return false;
    for (size_t k = 0; k < s.post_ops.size(); k += fields) {
        const float kind = s.post_ops[k], first = std::fabs(s.post_ops[k + 1]), second = std::fabs(s.post_ops[k + 2]),
                    third = std::fabs(s.post_ops[k + 3]);
        if ((kind == lpt_s16::SLOPE_CLIP || kind == lpt_s16::HARD_SWISH) && !(first <= 256.0f)) return false;
        if (kind == lpt_s16::GELU && !(second <= 256.0f && third <= 256.0f)) return false;
    }
    return true;
}

// The output stage as lpt_s16's vector code takes it (s16.h: Epilogue): route s16 applies it to each
// tile of accumulators, the other routes to each channels-last row oneDNN leaves.
void prepare_epilogue(Operation &op) {
    const OutputStage &s = op.stage;
    const size_t padded = (size_t)(op.out_channels + 15) / 16 * 16;
    op.padded_multiplier = s.multiplier;
    op.padded_multiplier.resize(padded, 0.0f);
    lpt_s16::Epilogue &e = op.epilogue;
    e.multiplier = op.padded_multiplier.data();
    if (!s.bias.empty()) {
        op.padded_bias = s.bias;
        op.padded_bias.resize(padded, 0.0f);
        e.bias = op.padded_bias.data();
    }
    e.post_ops = s.post_ops.data();
    e.post_op_count = (int64_t)s.post_ops.size() / lpt_s16::POST_OP_FIELDS;
    e.type = s.dst == Dst::u8 ? lpt_s16::Epilogue::u8 : s.dst == Dst::s8 ? lpt_s16::Epilogue::s8 : lpt_s16::Epilogue::f32;
    e.scale = s.scale;
    e.zero_point = s.zero_point, e.qmin = s.qmin, e.qmax = s.qmax;
    e.flush_tiny = tiny_values_quantize_as_zero(s);
    lpt_s16::prepare_gelu_fast(e, op.out_channels);
    // each channel's largest accumulator: Σ |w| · 255 (|q − zero point| ≤ 255 for a zero point in range)
    std::vector<double> largest((size_t)op.out_channels, 0.0);
    const int64_t n = op.out_channels;
    for (size_t i = 0; i < op.weights.size(); ++i)  // conv [OC, ...]; matmul [K, N]
        largest[op.kind == Kind::matmul ? i % n : i / (op.weights.size() / n)] += 255.0 * std::abs((int)op.weights[i]);
    lpt_s16::prepare_clipped_levels(e, largest.data(), op.out_channels, op.level_constants);
    op.onednn_stage = onednn_can_stage(op);
}

PyObject *fail(const std::exception &e) {
    if (!PyErr_Occurred()) {
        if (dynamic_cast<const std::invalid_argument *>(&e)) PyErr_SetString(PyExc_ValueError, e.what());
        else PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return nullptr;
}

// Whether route s16 runs this operation: a matmul, or a 1-D or 2-D convolution of one group or depthwise.
bool s16_runs(const Operation &op) {
    return op.kind == Kind::matmul ||
           ((op.groups == 1 || op.depthwise) && op.kernel_shape.size() - 2 <= 2 && lpt_s16::supported());
}

// A 1-D or 2-D convolution's geometry as lpt's kernels take it.
lpt_s16::Geometry conv_geometry(const Operation &op) {
    const memory::dims &shape = op.kernel_shape;
    const int spatial = (int)shape.size() - 2;
    const int y = spatial - 2;  // the index of the height axis; none (−1) for a 1-D convolution
    auto axis = [&](const memory::dims &v, int i, int64_t none) { return i < 0 ? none : v[i]; };
    return {op.in_channels, op.out_channels, y < 0 ? 1 : shape[2], shape.back(),
            axis(op.strides, y, 1), op.strides.back(), axis(op.dilations, y, 0) + 1,
            op.dilations.back() + 1, axis(op.pads_begin, y, 0), op.pads_begin.back(),
            axis(op.pads_end, y, 0), op.pads_end.back()};
}

// On route u8s8, a convolution of one group with few products per output runs on lpt_stem's kernel
// where this CPU has it (stem.h says why): its geometry and weights.
void prepare_stem(Operation &op) {
    if (op.route != Route::u8s8 || op.groups != 1 || op.kernel_shape.size() > 4 || !lpt_stem::supported()) return;
    const lpt_s16::Geometry g = conv_geometry(op);
    if (!lpt_stem::fits(g, op.epilogue)) return;
    op.geometry = g;
    op.stem = lpt_stem::pack(op.weights.data(), g);
}

// On route u8s8, a depthwise convolution runs on lpt_dw's kernel where this CPU has it (depthwise.h says why), if it
// has DEPTHWISE_TAPS taps or more, or fewer than DEPTHWISE_FEW_PRODUCTS products (takes_depthwise). Between, oneDNN's
// jit_int8 is as fast or faster: a 3×3 of 48 channels over 160×160 took 0.13-0.17 ms there, 0.20-0.27 on the kernel,
// whose quads cost as much as its products then; a 5×5 of 96 over 80×80 0.15 against 0.13, a 7×7 of 96 over 160×160
// 0.97 against 0.70, over 40×40 0.072 against 0.045. A small layer is mostly jit_int8's fixed cost: the PaddleOCR
// recognizer's 1×7 of 120 channels over 40 positions (33 600 products) 16.8 → 4.0 µs in its plan, its 3×3 layers over
// 3-12 × 80 positions (0.83 M) level, the detector's 3×3 of 192 channels over 20×20 with a stride of 2 (0.69 M) 26 →
// 36 µs (Zen 4, 2 threads). LPT_DEPTHWISE=1 takes the kernel for any layer it fits, 0 for none (so that tests run
// it on any layer, and oneDNN's on large ones).
constexpr int64_t DEPTHWISE_TAPS = 25;
constexpr double DEPTHWISE_FEW_PRODUCTS = 1 << 17;

void prepare_depthwise(Operation &op) {
    if (op.route != Route::u8s8 || !op.depthwise || op.kernel_shape.size() > 4 || !lpt_dw::supported()) return;
    const lpt_s16::Geometry g = conv_geometry(op);
    const char *choice = std::getenv("LPT_DEPTHWISE");
    const std::string c = choice ? choice : "";
    if (c == "0" || !lpt_dw::fits(g)) return;
    op.geometry = g;
    lpt_s16::Geometry one_channel = g;  // each channel's weights [1, KH, KW], packed as a stem's of one input channel
    one_channel.in_channels = 1;
    op.dw = lpt_stem::pack(op.weights.data(), one_channel);
    op.dw_any_size = c == "1" || g.kernel_h * g.kernel_w >= DEPTHWISE_TAPS;
}

// Whether lpt_dw's kernel runs a depthwise layer over a source of these dims (prepare_depthwise says when).
bool takes_depthwise(const Operation &op, const memory::dims &dims) {
    if (op.dw.words.empty()) return false;
    if (op.dw_any_size) return true;
    const lpt_s16::Geometry &g = op.geometry;
    const int64_t h = dims.size() == 4 ? dims[2] : 1, w = dims.back();
    const double products = (double)dims[0] * g.out_h(h) * g.out_w(w) * g.out_channels * g.kernel_h * g.kernel_w;
    return products < DEPTHWISE_FEW_PRODUCTS;
}

// A matmul's weights as lpt_few_rows's kernel reads them, on route u8s8 where the CPU runs it: sources of at
// most MAX_ROWS rows go there instead of oneDNN (execute).
void prepare_few_rows(Operation &op) {
    if (op.route != Route::u8s8 || !lpt_few_rows::supported()) return;
    op.few_rows = lpt_few_rows::pack(op.weights.data(), op.in_channels, op.out_channels);
}

// Whether route s16 runs a direct convolution on bytes (lpt_s16::ByteWeights): where they fit and the source lies
// mostly within the kernel's window (lpt_s16::pad_bytes); LPT_S16_BYTES=1 takes it wherever it fits, whatever the
// source, 0 never (so that tests run both kernels on any CPU, and the values outside the window by the thousand).
// Layers of at most 8 output channels too, since its half tiles: 64 → 8 and 64 → 4 3×3 layers over 80×80 took
// 0.17 ms on the int16 kernel's half tiles, 0.14 so; PaddleOCR's detector's last upsampling's matmul, 24 → 4 over
// 320×320 with its Sigmoid, 0.60 → 0.55 (Zen 4 forced to AVX2, 2 threads).
void take_bytes(Operation &op, const int8_t *weights) {
    const char *choice = std::getenv("LPT_S16_BYTES");
    const std::string c = choice ? choice : "";
    if (c == "0" || !lpt_s16::bytes_fit(op.geometry)) return;
    op.bytes = lpt_s16::pack_byte_weights(weights, op.geometry);
    op.bytes_always = c == "1";
}

// Route s16's geometry and packed weights.
void prepare_s16(Operation &op) {
    if (op.kind == Kind::matmul) {  // a 1×1 convolution with K input channels and N outputs
        const int64_t k = op.in_channels, n = op.out_channels;
        op.geometry = {k, n, 1, 1};
        std::vector<int8_t> transposed(op.weights.size());
        for (int64_t i = 0; i < k; ++i)
            for (int64_t j = 0; j < n; ++j) transposed[j * k + i] = op.weights[i * n + j];
        op.packed = lpt_s16::pack_weights(transposed.data(), op.geometry);
        narrow_large_weights(op);
        narrow_for_one_row(op);
        take_bytes(op, transposed.data());
        return;
    }
    op.geometry = conv_geometry(op);
    if (!op.depthwise && lpt_s16::winograd_fits(op.geometry)) {
        const char *choice = std::getenv("LPT_WINOGRAD");
        const std::string c = choice ? choice : "";
        op.winograd = c == "0" ? Operation::Winograd::never
                      : c == "1" ? Operation::Winograd::always : Operation::Winograd::automatic;
    }
    // Winograd reads channel pairs: its source keeps the even layout, which the direct kernel then shares
    op.geometry.whole_runs = !op.depthwise && !lpt_s16::winograd_fits(op.geometry) && (op.in_channels & 1) &&
                             op.geometry.dilation_w == 1;
    if (op.winograd == Operation::Winograd::never)
        op.packed = op.depthwise ? lpt_s16::pack_depthwise_weights(op.weights.data(), op.geometry)
                                 : lpt_s16::pack_weights(op.weights.data(), op.geometry);
    if (!op.depthwise) narrow_large_weights(op);
    if (!op.depthwise) take_bytes(op, op.weights.data());
}

// A convolution of one input channel along its last axis (every other axis spanned by 1, unstrided, unpadded)
// with a long window and few output channels, such as basic_pitch's constant-Q front end (1 → 1 channel, 256
// taps, stride 2, over 44 098 samples), gives its primitives a sum over one channel for each of few outputs:
// oneDNN's jit_int8 took 0.73 ms for that one (7.6 G products/s; Zen 4, 2 threads), lpt's s16 0.30. Read as P =
// stride·G phases, the source is channels-last [L/P, P], and G consecutive outputs of OC channels are one
// position of G·OC channels of a convolution over it, stride 1, ⌈(stride·(G − 1) + K)/P⌉ taps, the weights
// shifted by the stride per output (zeros beyond them): 0.020 ms on oneDNN's brgconv and 0.045 on s16 with
// G = 16, for 12% more products. The source is copied into phases with the zero point past its ends and the
// padding (each output's products outside its window meet zero weights), and the outputs past the last are
// computed and left out (run_polyphase). Over 16 000 samples, 1 or 4 output channels, 16 to 256 taps, stride 1
// or 2: 2.0-22× faster on route u8s8 (lpt_stem's kernel or jit_int8 before), 2.1-7.6× on s16 (Zen 4).
constexpr int64_t POLYPHASE_CHANNELS = 16;  // G·OC at least: a block of sixteen output channels
constexpr int64_t POLYPHASE_MIN_TAPS = 16;  // measured from there

void prepare_polyphase(Operation &op) {
    const size_t spatial = op.kernel_shape.size() - 2;
    if (op.kind != Kind::conv || op.groups != 1 || op.in_channels != 1 || op.out_channels > POLYPHASE_CHANNELS / 2 ||
        op.kernel_shape.back() < POLYPHASE_MIN_TAPS || op.dilations.back() != 0)
        return;
    for (size_t a = 0; a + 1 < spatial; ++a)
        if (op.kernel_shape[2 + a] != 1 || op.strides[a] != 1 || op.pads_begin[a] || op.pads_end[a]) return;
    const int64_t k = op.kernel_shape.back(), stride = op.strides.back(), oc = op.out_channels;
    const int64_t g = (POLYPHASE_CHANNELS + oc - 1) / oc, phases = stride * g;
    const int64_t taps = (stride * (g - 1) + k + phases - 1) / phases;
    auto r = std::make_unique<Operation>();
    r->kind = Kind::conv, r->route = op.route, r->threads = op.threads, r->src_zero_point = op.src_zero_point;
    r->out_channels = g * oc, r->in_channels = phases;
    r->weight_dims = r->kernel_shape = {g * oc, phases, taps};
    r->strides = {1}, r->dilations = {0}, r->pads_begin = {0}, r->pads_end = {0};
    r->weights.assign((size_t)(g * oc * phases * taps), 0);
    for (int64_t j = 0; j < g; ++j)  // output j of a position: channels j·OC + o
        for (int64_t o = 0; o < oc; ++o)
            for (int64_t i = 0; i < k; ++i) {  // sample stride·j + i of the position's phases
                const int64_t at = stride * j + i;
                const size_t to = (size_t)(((j * oc + o) * phases + at % phases) * taps + at / phases);
                r->weights[to] = op.weights[o * k + i];
            }
    if (r->route == Route::split) {  // as parse_common splits them
        r->hi.resize(r->weights.size());
        r->lo.resize(r->weights.size());
        for (size_t i = 0; i < r->weights.size(); ++i)
            r->hi[i] = (int8_t)(r->weights[i] >> 6), r->lo[i] = (int8_t)(r->weights[i] & 63);
    }
    r->stage = op.stage;
    r->stage.multiplier.clear(), r->stage.bias.clear();
    for (int64_t j = 0; j < g; ++j) {
        r->stage.multiplier.insert(r->stage.multiplier.end(), op.stage.multiplier.begin(), op.stage.multiplier.end());
        r->stage.bias.insert(r->stage.bias.end(), op.stage.bias.begin(), op.stage.bias.end());
    }
    prepare_epilogue(*r);
    if (r->route == Route::s16) prepare_s16(*r);
    prepare_stem(*r);
    op.polyphase = std::move(r);
    op.phase_outputs = g;
}

const char CONV_DOC[] =
    "conv(weights, groups, strides, dilations, pads_begin, pads_end, src_zero_point, route, threads,\n"
    "     multiplier, bias, post_ops, dst, dst_scale, dst_zero_point, qmin, qmax) -> operation\n\n"
    "weights: int8 [OC, IC/groups, *kernel] (1 to 3 spatial axes); dilations as ONNX counts them (1 = none);\n"
    "multiplier, bias: float32 [OC] (bias may be None); post_ops: float32 (kind, slope, low, high) quadruples (s16.h: PostOp); dst 'f32', 'u8', 's8'.";

PyObject *py_conv(PyObject *, PyObject *args) {
    PyObject *weights, *shape_o, *strides_o, *dilations_o, *begin_o, *end_o, *multiplier, *bias, *post_ops;
    int groups, src_zero_point, threads, zero_point, qmin, qmax;
    const char *route, *dst;
    double scale;
    if (!PyArg_ParseTuple(args, "OOiOOOOisiOOOsdiii", &weights, &shape_o, &groups, &strides_o, &dilations_o,
                          &begin_o, &end_o, &src_zero_point, &route, &threads, &multiplier, &bias, &post_ops, &dst,
                          &scale, &zero_point, &qmin, &qmax))
        return nullptr;
    auto op = std::make_unique<Operation>();
    try {
        op->kind = Kind::conv;
        if (!parse_common(*op, weights, route, threads, src_zero_point, multiplier, bias, post_ops, dst, scale,
                          zero_point, qmin, qmax))
            return nullptr;
        const auto shape = int_sequence(shape_o, "weight shape");
        const int spatial = (int)shape.size() - 2;
        if (spatial < 1 || spatial > 3) throw std::invalid_argument("weights must be [OC, IC/groups, *kernel] with 1 to 3 kernel axes");
        int64_t count = 1;
        for (auto v : shape) count *= v;
        if ((size_t)count != op->weights.size()) throw std::invalid_argument("weights do not have the given shape");
        if (groups < 1 || shape[0] % groups) throw std::invalid_argument("output channels must divide into the groups");
        op->groups = groups;
        op->out_channels = shape[0];
        op->in_channels = shape[1] * groups;
        if (groups > 1) {
            op->weight_dims = {groups, shape[0] / groups};
            op->weight_dims.insert(op->weight_dims.end(), shape.begin() + 1, shape.end());
        } else {
            op->weight_dims.assign(shape.begin(), shape.end());
        }
        op->strides = int_sequence(strides_o, "strides");
        op->dilations = int_sequence(dilations_o, "dilations");
        for (auto &d : op->dilations) d -= 1;
        op->pads_begin = int_sequence(begin_o, "pads_begin");
        op->pads_end = int_sequence(end_o, "pads_end");
        for (const auto *v : {&op->strides, &op->dilations, &op->pads_begin, &op->pads_end})
            if ((int)v->size() != spatial) throw std::invalid_argument("strides, dilations and pads need one value per kernel axis");
        op->subsample = std::all_of(shape.begin() + 2, shape.end(), [](int64_t k) { return k == 1; }) &&
                        std::any_of(op->strides.begin(), op->strides.end(), [](int64_t s) { return s > 1; });
        check_stage(*op);
        prepare_epilogue(*op);
        op->kernel_shape = shape;
        op->depthwise = groups > 1 && shape[1] == 1 && shape[0] == groups;
        if (op->route == Route::s16) {
            if (!s16_runs(*op))
                throw std::invalid_argument("route s16 runs 1-D and 2-D convolutions of one group, and depthwise ones");
            prepare_s16(*op);
        }
        prepare_stem(*op);
        prepare_depthwise(*op);
        prepare_polyphase(*op);
    } catch (const std::exception &e) {
        return fail(e);
    }
    return PyCapsule_New(op.release(), CAPSULE, destroy);
}

const char MATMUL_DOC[] =
    "matmul(weights, src_zero_point, route, threads, multiplier, bias, post_ops, dst, dst_scale, dst_zero_point,\n"
    "       qmin, qmax) -> operation\n\nweights: int8 [K, N]; multiplier, bias: float32 [N].";

PyObject *py_matmul(PyObject *, PyObject *args) {
    PyObject *weights, *shape_o, *multiplier, *bias, *post_ops;
    int src_zero_point, threads, zero_point, qmin, qmax;
    const char *route, *dst;
    double scale;
    if (!PyArg_ParseTuple(args, "OOisiOOOsdiii", &weights, &shape_o, &src_zero_point, &route, &threads, &multiplier,
                          &bias, &post_ops, &dst, &scale, &zero_point, &qmin, &qmax))
        return nullptr;
    auto op = std::make_unique<Operation>();
    try {
        op->kind = Kind::matmul;
        if (!parse_common(*op, weights, route, threads, src_zero_point, multiplier, bias, post_ops, dst, scale,
                          zero_point, qmin, qmax))
            return nullptr;
        const auto shape = int_sequence(shape_o, "weight shape");
        if (shape.size() != 2 || (size_t)(shape[0] * shape[1]) != op->weights.size())
            throw std::invalid_argument("weights must be [K, N]");
        op->weight_dims = {shape[0], shape[1]};
        op->in_channels = shape[0];
        op->out_channels = shape[1];
        check_stage(*op);
        prepare_epilogue(*op);
        if (op->route == Route::s16) prepare_s16(*op);
        prepare_few_rows(*op);
    } catch (const std::exception &e) {
        return fail(e);
    }
    return PyCapsule_New(op.release(), CAPSULE, destroy);
}

// Where a conv source lies in memory: channels-first [N, C, *spatial] contiguous, or channels-last
// ([N, *spatial, C] contiguous, seen as [N, C, *spatial]). Anything else: neither.
enum class Layout { channels_first, channels_last, other };

Layout layout_of(const Py_buffer &v) {
    Py_ssize_t expected = v.itemsize;
    bool first = true;
    for (int i = v.ndim - 1; i >= 0; --i) {
        if (v.shape[i] != 1 && v.strides[i] != expected) first = false;
        expected *= v.shape[i];
    }
    if (first) return Layout::channels_first;
    expected = v.itemsize;
    bool last = v.shape[1] == 1 || v.strides[1] == expected;
    expected *= v.shape[1];
    for (int i = v.ndim - 1; i >= 2; --i) {
        if (v.shape[i] != 1 && v.strides[i] != expected) last = false;
        expected *= v.shape[i];
    }
    if (v.shape[0] != 1 && v.strides[0] != expected) last = false;
    return last ? Layout::channels_last : Layout::other;
}

// A matmul whose every source row holds at most one value other than its zero point (a one-hot: magika
// multiplies its bytes' one-hot, 257 wide, by its first Dense) needs one weight row per source row:
// acc[r] = (q − zp)·weights[k], the same exact sums as the kernel's over all K, then the same output
// stage (or the accumulators, for an s32 `dst`), on any route. src: [rows, K]. False, with nothing written,
// where some row has two or more such values: the route's kernel runs.
bool gather_single_value_rows(const Operation &op, const uint8_t *src, bool signed_src, int zero_point, int64_t rows,
                              Dst dst, void *out) {
    const int64_t k = op.in_channels, n = op.out_channels;
    const uint8_t zero = (uint8_t)zero_point;  // as a byte: an int8 zero point in two's complement
    // Every matmul comes here first: a dense source leaves at its first row, before any allocation or
    // any wake of the pool's workers.
    if (rows > 0 && lpt_s16::single_other_byte(src, k, zero) == -2) return false;
    std::vector<int64_t> at(rows);  // each row's one value's place, or −1: a row of zero points
    std::atomic<bool> dense{false};
    lpt_parallel::for_each(rows * k >= PARALLEL_WORK ? op.threads : 1, rows, [=, &at, &dense](int64_t r) {
        if (dense.load(std::memory_order_relaxed)) return;
        at[r] = lpt_s16::single_other_byte(src + r * k, k, zero);
        if (at[r] == -2) dense.store(true, std::memory_order_relaxed);
    });
    if (dense.load()) return false;
    const int8_t *weights = op.weights.data();  // [K, N]
    const lpt_s16::Epilogue *epilogue = dst == Dst::s32 ? nullptr : &op.epilogue;
    char *o = static_cast<char *>(out);
    const size_t row_bytes = n * item_size(dst);
    lpt_parallel::for_each(rows * n >= PARALLEL_WORK ? op.threads : 1, rows, [=, &at](int64_t r) {
        thread_local std::vector<int32_t> row;
        row.resize(n);
        int32_t *acc = epilogue ? row.data() : reinterpret_cast<int32_t *>(o + r * row_bytes);
        if (at[r] < 0) {
            std::fill(acc, acc + n, 0);
        } else {
            const uint8_t q = src[r * k + at[r]];
            const int32_t v = (signed_src ? (int32_t)(int8_t)q : (int32_t)q) - zero_point;
            lpt_s16::scaled_weights(v, weights + at[r] * n, n, acc);
        }
        if (epilogue) lpt_s16::stage_rows(*epilogue, acc, nullptr, 1, n, o + r * row_bytes);
    });
    return true;
}

// What a caller does with output rows [first_row, end_row) as soon as they are written, on `threads` threads
// (a residual join after a convolution: join_in_bands).
using RowsDone = std::function<void(int64_t first_row, int64_t end_row, int threads)>;

// Route s16's int32 accumulators [images, positions, OC], from accumulate(acc), through finish_as into dst: where
// the output stage does not run in the kernel. One scratch per calling thread for both of s16's kernels, as execute's.
template <typename Accumulate>
void finish_s16(Operation &op, int64_t images, int64_t positions, Dst dst, bool channels_first_out, void *out,
                const Accumulate &accumulate) {
    thread_local Scratch<int32_t> accumulators;
    int32_t *acc = accumulators.get((size_t)(images * positions * op.out_channels));
    accumulate(acc);
    finish_as(dst, op.stage, acc, nullptr, images, positions, op.out_channels, channels_first_out, out, op.threads);
    if (accumulators.bytes() > KEEP_SCRATCH_BYTES) accumulators.release();
}

// run_s16 where the direct kernel on bytes takes the layer: the source padded as bytes, then the kernel with
// `staged`'s output stage in it, or finish_s16. False, having run nothing, where too much of the source lies
// outside the kernel's window (lpt_s16::pad_bytes).
bool run_s16_bytes(Operation &op, const uint8_t *src, int64_t images, int64_t h, int64_t w, int64_t positions,
                   bool channels_last, bool signed_src, int src_zero_point, const lpt_s16::Epilogue *staged, Dst dst,
                   bool channels_first_out, void *out) {
    const lpt_s16::Geometry &g = op.geometry;
    thread_local Scratch<uint8_t> bytes;
    thread_local lpt_s16::Outside outside;
    uint8_t *padded = bytes.get(lpt_s16::padded_bytes_size(g, images, h, w));
    const bool windowed = lpt_s16::pad_bytes(src, signed_src, channels_last, src_zero_point, g, images, h, w,
                                             op.bytes_always, padded, outside, op.threads);
    if (windowed && staged)
        lpt_s16::convolve_bytes_staged(padded, outside, op.bytes, src_zero_point, signed_src, g, images, h, w, *staged,
                                       out, op.threads);
    else if (windowed)
        finish_s16(op, images, positions, dst, channels_first_out, out, [&](int32_t *acc) {
            lpt_s16::convolve_bytes(padded, outside, op.bytes, src_zero_point, signed_src, g, images, h, w, acc,
                                    op.threads);
        });
    if (windowed) op.last_impl = "lpt:s16_bytes_avx2";
    if (bytes.bytes() > KEEP_WIDENED_BYTES) bytes.release();
    if (outside.values.size() * sizeof(lpt_s16::OutsideValue) > KEEP_WIDENED_BYTES) outside.values = {};
    return windowed;
}

// Whether route s16 runs a convolution over an h × w source by Winograd.
bool takes_winograd(const Operation &op, int64_t h, int64_t w) {
    return op.winograd == Operation::Winograd::always ||
           (op.winograd == Operation::Winograd::automatic && lpt_s16::winograd_pays(op.geometry, h, w));
}

// Route s16: widen the source, convolve with lpt's kernel, then the output stage, as the other routes. With
// `staging`, that output stage instead of the layer's, into dst (add_in_stage's). With `pool` (a max pool after
// the convolution that pool_in_stage runs with it), out is the pool's output.
void run_s16(Operation &op, const uint8_t *src, const memory::dims &dims, bool channels_last, bool signed_src,
             int src_zero_point, Dst dst, bool channels_last_out, void *out, size_t out_bytes,
             const lpt_s16::Epilogue *staging = nullptr, const lpt_ops::Pool *pool = nullptr) {
    const lpt_s16::Geometry &g = op.geometry;
    // conv [N, C, (H,) W]; matmul [M, K]: one image one row high and M wide, channels-last
    const bool conv = op.kind == Kind::conv;
    const int64_t images = conv ? dims[0] : 1, h = conv && dims.size() == 4 ? dims[2] : 1,
                  w = conv ? dims.back() : dims[0];
    const int64_t positions = pool ? g.out_h(h) / pool->kernel_h * (g.out_w(w) / pool->kernel_w)
                              : conv ? g.out_h(h) * g.out_w(w) : w;
    const size_t items = (size_t)(images * positions * op.out_channels);
    if (out_bytes != items * item_size(dst)) throw std::invalid_argument("out does not have the output's size");
    // One widened source per calling thread, shared by every layer it runs: a network's layers then
    // reuse the same cache-warm memory instead of each keeping its own.
    const bool winograd = takes_winograd(op, h, w);
    const bool channels_last_src = channels_last || !conv || h * w == 1;
    // the output stage as each tile is done: no accumulators in memory, no pass after
    const bool staged = (staging || (dst != Dst::s32 && dst == op.stage.dst)) && (!conv || channels_last_out);
    const lpt_s16::Epilogue &epilogue = staging ? *staging : op.epilogue;
    if (!pool && !winograd && !op.depthwise && positions > 1 && !op.bytes.packed.empty() &&
        run_s16_bytes(op, src, images, h, w, positions, channels_last_src, signed_src, src_zero_point,
                      staged ? &epilogue : nullptr, dst, conv && !channels_last_out, out))
        return;
    if (op.depthwise) {  // reads the source itself (pairs of it, band by band); its weights packed when made
        if (staged)
            lpt_s16::depthwise_staged(src, signed_src, channels_last_src, src_zero_point, op.packed.data(), g, images, h,
                                      w, epilogue, out, op.threads);
        else
            finish_s16(op, images, positions, dst, conv && !channels_last_out, out, [&](int32_t *acc) {
                lpt_s16::depthwise(src, signed_src, channels_last_src, src_zero_point, op.packed.data(), g, images, h, w,
                                   acc, op.threads);
            });
        op.last_impl = "lpt:s16_avx2";
        return;
    }
    lpt_s16::PackedWeights &weights = winograd ? op.winograd_packed : op.packed;
    const bool narrow = !pool && !winograd && !op.narrow.empty() && (op.packed.empty() || positions == 1);
    if (weights.empty() && !narrow)
        weights = winograd ? lpt_s16::pack_winograd_weights(op.weights.data(), g) : lpt_s16::pack_weights(op.weights.data(), g);
    thread_local Scratch<int16_t> wide;
    const lpt_s16::Geometry widening = winograd ? lpt_s16::winograd_widening(g, h, w) : g;
    const int64_t wide_size = lpt_s16::widened_size(widening, images, h, w);
    int16_t *widened = wide.get(wide_size + lpt_s16::READ_SLACK);
    std::memset(widened + wide_size, 0, lpt_s16::READ_SLACK * sizeof(int16_t));
    lpt_s16::widen(src, signed_src, channels_last_src, src_zero_point, widening, images, h, w, widened, op.threads);
    if (pool && winograd) {
        lpt_s16::winograd_pooled_staged(widened, weights.data(), g, images, h, w, epilogue, out, op.threads);
    } else if (pool) {
        lpt_s16::convolve_pooled_staged(widened, weights.data(), g, images, h, w, pool->kernel_h, pool->kernel_w,
                                        epilogue, out, op.threads);
    } else if (staged) {
        if (narrow) {
            lpt_s16::convolve_staged(widened, op.narrow.data(), g, images, h, w, epilogue, out, op.threads);
        } else {
            const auto staged = winograd ? lpt_s16::winograd_staged : lpt_s16::convolve_staged<int16_t>;
            staged(widened, weights.data(), g, images, h, w, epilogue, out, op.threads);
        }
    } else {
        finish_s16(op, images, positions, dst, conv && !channels_last_out, out, [&](int32_t *acc) {
            if (narrow) {
                lpt_s16::convolve(widened, op.narrow.data(), g, images, h, w, acc, op.threads);
            } else {
                const auto accumulate = winograd ? lpt_s16::winograd : lpt_s16::convolve<int16_t>;
                accumulate(widened, weights.data(), g, images, h, w, acc, op.threads);
            }
        });
    }
    op.last_impl = winograd ? (pool ? "lpt:s16_winograd_avx2_pooled" : "lpt:s16_winograd_avx2")
                            : pool ? "lpt:s16_avx2_pooled" : "lpt:s16_avx2";
    if (wide.bytes() > KEEP_WIDENED_BYTES) wide.release();
}

// Route u8s8, a convolution one of lpt's own AVX-512 VNNI kernels takes (prepare_stem, prepare_depthwise): the kernel
// and the output stage, into a channels-last output, from a channels-last source.
void run_own_kernel(Operation &op, const uint8_t *src, const memory::dims &dims, bool channels_last, bool signed_src,
                    int src_zero_point, Dst dst, void *out, size_t out_bytes) {
    const lpt_s16::Geometry &g = op.geometry;
    const int64_t images = dims[0], h = dims.size() == 4 ? dims[2] : 1, w = dims.back();
    if (out_bytes != (size_t)(images * g.out_h(h) * g.out_w(w) * op.out_channels) * item_size(dst))
        throw std::invalid_argument("out does not have the output's size");
    if (!channels_last && g.in_channels > 1 && h * w > 1) {  // the kernels read each pixel's channels together
        thread_local Scratch<uint8_t> scratch;
        uint8_t *moved = scratch.get((size_t)(images * g.in_channels * h * w));
        to_channels_last(src, moved, images, g.in_channels, h * w, 0, op.threads);
        src = moved;
    }
    if (!op.stem.words.empty()) {
        lpt_stem::convolve_staged(src, signed_src, src_zero_point, g, images, h, w, op.stem, op.epilogue, out,
                                  op.threads);
        op.last_impl = "lpt:stem_avx512_vnni";
    } else {
        lpt_dw::convolve_staged(src, signed_src, src_zero_point, g, images, h, w, op.dw, op.epilogue, out, op.threads);
        op.last_impl = "lpt:depthwise_avx512_vnni";
    }
}

// x[r][c] = (f32(q[r][first + c]) − shift)·scale for `rows` rows of columns [first, first + width) of `channels`:
// a join's other operand as its primitive reads it, with lpt_ops::join's operations.
__attribute__((target_clones("avx2", "default"))) void dequantize_columns(const uint8_t *q, bool is_signed, int64_t rows,
                                                                         int64_t channels, int64_t first, int64_t width,
                                                                         float shift, float scale, float *x) {
    for (int64_t r = 0; r < rows; ++r, x += width) {
        const uint8_t *row = q + r * channels + first;
        if (is_signed)
            for (int64_t c = 0; c < width; ++c) x[c] = ((float)(int8_t)row[c] - shift) * scale;
        else
            for (int64_t c = 0; c < width; ++c) x[c] = ((float)row[c] - shift) * scale;
    }
}

bool run_polyphase(Operation &op, const uint8_t *src, const memory::dims &dims, bool signed_src, int src_zero_point,
                   Dst dst, bool channels_last_out, void *out, size_t out_bytes);

// One run of a prepared operation on raw memory: src u8/s8 (conv [N, C, *spatial], channels-first or,
// with `channels_last`, [N, *spatial, C]; matmul [M, K]) → out (out_bytes long) in `dst`'s type.
// src_zero_point: the operation's own, or one given at run time (py_run).
// `rows_done`, where given, sees each band's rows once staged, on the thread that staged them (every row at
// the end on route s16 and for a layer of one band). `join`, on route u8s8 where stages_in_onednn holds: out
// is the join's output (Join), the layer's own never written.
void execute(Operation &op, const uint8_t *src, const memory::dims &dims, bool channels_last, bool signed_src,
             int src_zero_point, Dst dst, bool channels_last_out, void *out, size_t out_bytes,
             const RowsDone *rows_done = nullptr, const Join *join = nullptr) {
    std::lock_guard<std::mutex> guard(op.lock);
    if (op.polyphase && !join &&
        run_polyphase(op, src, dims, signed_src, src_zero_point, dst, channels_last_out, out, out_bytes)) {
        if (rows_done) (*rows_done)(0, (int64_t)(out_bytes / item_size(dst)) / op.out_channels, op.threads);
        return;
    }
    if (op.kind == Kind::matmul && (dst == Dst::s32 || dst == op.stage.dst) && lpt_s16::supported() &&
        out_bytes == (size_t)(dims[0] * op.out_channels) * item_size(dst) &&
        gather_single_value_rows(op, src, signed_src, src_zero_point, dims[0], dst, out)) {
        op.last_impl = "lpt:rows_avx2";
        return;
    }
    if (op.kind == Kind::matmul && !op.few_rows.empty() && dims[0] <= lpt_few_rows::MAX_ROWS && !join &&
        (dst == Dst::s32 || (dst == op.stage.dst && lpt_s16::supported())) &&
        out_bytes == (size_t)(dims[0] * op.out_channels) * item_size(dst)) {
        lpt_few_rows::multiply(src, dims[0], signed_src, src_zero_point, op.few_rows,
                               dst == Dst::s32 ? nullptr : &op.epilogue, out, op.threads);
        op.last_impl = "lpt:few_rows_avx512_vnni";
        return;
    }
    if (op.route == Route::s16) {
        run_s16(op, src, dims, channels_last, signed_src, src_zero_point, dst, channels_last_out, out, out_bytes);
        if (rows_done) (*rows_done)(0, (int64_t)(out_bytes / item_size(dst)) / op.out_channels, op.threads);
        return;
    }
    if ((!op.stem.words.empty() || takes_depthwise(op, dims)) && dst != Dst::s32 && dst == op.stage.dst &&
        channels_last_out && !join) {
        run_own_kernel(op, src, dims, channels_last, signed_src, src_zero_point, dst, out, out_bytes);
        if (rows_done) (*rows_done)(0, (int64_t)(out_bytes / item_size(dst)) / op.out_channels, op.threads);
        return;
    }
    const int zero_point = src_zero_point + (signed_src ? 128 : 0);
    memory::dims read_dims = dims;  // the source as the primitive reads it
    if (op.subsample) {
        read_dims = layer_output_dims(op, dims);
        read_dims[1] = dims[1];
    }
    const bool staged = stages_in_onednn(op, dst, channels_last_out);
    Prepared &p = prepare(op, read_dims, signed_src, zero_point, channels_last_out, staged, staged ? join : nullptr);
    if (join && !p.joined) throw std::logic_error("a join given for a layer oneDNN does not stage");
    *static_cast<int32_t *>(p.zero_point.get_data_handle()) = zero_point;
    const int64_t images = dims[0];
    int64_t positions = 1;
    for (size_t i = 2; i < dims.size(); ++i) positions *= dims[i];
    const uint8_t *data = src;
    const size_t src_bytes = p.src_bytes;
    const size_t out_items = p.accumulators;
    // The calling thread's scratch, which every layer it runs reuses: a layer's own, given back after
    // each run where large, cost a page fault per 4 KB at each run (dnsmos_sig_bak_ovr's 3×3 64→64 over
    // 900×161, 37 MB of accumulators: 23.8 ms in oneDNN, 2.1 ms over half the rows).
    thread_local Scratch<uint8_t> src_scratch;
    thread_local Scratch<int32_t> accumulators_hi, accumulators_lo;
    // Bands of rows that lpt stages each write their accumulators into their thread's scratch of one band, reused
    // from band to band in that core's L2, instead of into their rows of the whole layer's, whose lines came from
    // memory at each run and went back dirty: the detector's 1×1 48 → 96 layers with a GELU (9.8 MB of
    // accumulators in 19 bands) took 1.32-1.38 ms on one thread so, 1.01-1.04 now; on two 0.70-0.72 → 0.54-0.55
    // (Zen 4; OpenVINO's 0.43), the detector's program 14.6-14.8 → 14.0-14.2 ms.
    const int64_t bands = (int64_t)p.bands.size();
    const bool band_scratch = bands > 1 && !p.staged && !p.channel_bands;
    int32_t *acc_hi = band_scratch ? nullptr : accumulators_hi.get(out_items),
            *acc_lo = op.route == Route::split && !band_scratch ? accumulators_lo.get(out_items) : nullptr;
    if (out_bytes != out_items * item_size(dst))
        throw std::invalid_argument("out does not have the output's size");
    // The source as the primitive reads it: u8, channels-last. Bound in place where it is already so.
    if (op.subsample) {
        uint8_t *scratch = src_scratch.get(src_bytes);
        subsample(data, dims, channels_last, op, read_dims, signed_src ? 0x80 : 0, (uint8_t)zero_point, scratch,
                  op.threads);
        data = scratch;
    } else if (op.kind == Kind::conv && !channels_last && dims[1] > 1 && positions > 1) {
        uint8_t *scratch = src_scratch.get(src_bytes);
        to_channels_last(data, scratch, images, dims[1], positions, signed_src ? 0x80 : 0, op.threads);
        data = scratch;
    } else if (signed_src) {
        uint8_t *scratch = src_scratch.get(src_bytes);
        flip_signs(data, scratch, (int64_t)src_bytes, op.threads);
        data = scratch;
    }
    const int64_t channels = op.out_channels;
    // conv: [N, out positions, OC] accumulators; matmul: one "image" of M rows
    const int64_t out_images = op.kind == Kind::conv ? images : 1;
    const int64_t out_positions = (int64_t)out_items / (out_images * channels);
    const bool channels_first = op.kind == Kind::conv && !channels_last_out;
    const lpt_s16::Epilogue *fast = dst == op.stage.dst && lpt_s16::supported() ? &op.epilogue : nullptr;
    // Each band on a thread of lpt's pool, oneDNN on that thread alone: no OpenMP team to wake
    // (band_count); then its output stage on the same thread, its accumulators still in that core's cache.
    const size_t out_item = item_size(dst);
    lpt_parallel::run(std::min<int64_t>(bands, op.threads), bands, 1, [&](lpt_parallel::Chunks &chunks) {
        omp_set_num_threads(1);
        std::vector<float> x;
        std::vector<char> tile;
        thread_local Scratch<int32_t> band_hi, band_lo;
        for (int64_t b; chunks.next(b);) {
            Band &band = p.bands[b];
            band.src.set_data_handle(const_cast<uint8_t *>(data) + band.src_offset);
            const size_t band_items = (size_t)((band.end_row - band.first_row) * channels);
            int32_t *hi = band_scratch ? band_hi.get(band_items) : acc_hi + band.dst_offset, *lo = nullptr;
            if (op.route == Route::split) lo = band_scratch ? band_lo.get(band_items) : acc_lo + band.dst_offset;
            // staged: the output's values into out (a channel band's into the scratch, whose columns are then copied)
            uint8_t *staged_to = p.channel_bands ? reinterpret_cast<uint8_t *>(acc_hi) : static_cast<uint8_t *>(out);
            band.dst_hi.set_data_handle(p.staged ? static_cast<void *>(staged_to + band.dst_offset * out_item)
                                                 : static_cast<void *>(hi));
            if (p.joined) {  // the other operand's values for this band's outputs, while they are to be read
                const int64_t width = p.channel_bands ? band.channels : channels;
                thread_local Scratch<float> other;
                float *values = other.get((size_t)((band.end_row - band.first_row) * width));
                dequantize_columns(join->other + band.first_row * channels, join->other_signed,
                                   band.end_row - band.first_row, channels, p.channel_bands ? band.first_channel : 0,
                                   width, join->other_shift, join->other_scale, values);
                band.other.set_data_handle(values);
            }
            {
                SubnormalsAsZero flushed(p.staged && dst != Dst::f32);
                band.prim.execute(thread_stream(), band.arguments);
                if (op.route == Route::split) {
                    band.dst_lo.set_data_handle(lo);
                    band.prim.execute(thread_stream(), band.arguments_lo);
                }
                thread_stream().wait();
            }
            if (p.staged) {
                if (p.channel_bands) {  // [positions][band.channels] into those columns of out [positions][OC]
                    const uint8_t *from = staged_to + band.dst_offset * out_item;
                    for (int64_t r = 0; r < band.end_row; ++r)
                        std::memcpy(static_cast<uint8_t *>(out) + (r * channels + band.first_channel) * out_item,
                                    from + r * band.channels * out_item, band.channels * out_item);
                } else if (bands > 1 && rows_done) {
                    (*rows_done)(band.first_row, band.end_row, 1);
                }
            } else if (p.channel_bands) {  // acc [positions][band.channels] into those columns of out [positions][OC]
                const int32_t *acc = acc_hi + band.dst_offset;
                if (dst == Dst::s32) {
                    for (int64_t r = 0; r < band.end_row; ++r)
                        std::memcpy(static_cast<int32_t *>(out) + r * channels + band.first_channel,
                                    acc + r * band.channels, band.channels * sizeof(int32_t));
                } else {
                    lpt_s16::stage_columns(*fast, acc, nullptr, band.end_row, band.first_channel, band.channels,
                                           band.channels, out, channels);
                }
            } else if (bands > 1) {
                finish_rows_as(dst, op.stage, hi, lo, out_positions, channels, channels_first, out, fast,
                               band.first_row, band.end_row, x, tile);
                if (rows_done) (*rows_done)(band.first_row, band.end_row, 1);
                if (band_hi.bytes() + band_lo.bytes() > KEEP_SCRATCH_BYTES) {  // a large batch's band
                    band_hi.release();
                    band_lo.release();
                }
            }
        }
    });
    if (bands == 1 && !p.staged)  // one band (a small layer, or one that does not split): its stage may still take every thread
        finish_as(dst, op.stage, acc_hi, acc_lo, out_images, out_positions, channels, channels_first, out,
                  op.threads, fast);
    if (rows_done && (bands == 1 || p.channel_bands)) (*rows_done)(0, out_images * out_positions, op.threads);
    if (accumulators_hi.bytes() + accumulators_lo.bytes() + src_scratch.bytes() > KEEP_SCRATCH_BYTES) {
        // a large batch's scratch would stay allocated: give it back
        accumulators_hi.release();
        accumulators_lo.release();
        src_scratch.release();
    }
}

// prepare_polyphase's form of the layer, where the source is one row (every axis but the last of extent 1) long
// enough for an output; returns whether it ran. The outputs past the last, which complete its last position, are
// computed into the scratch and left out.
bool run_polyphase(Operation &op, const uint8_t *src, const memory::dims &dims, bool signed_src, int src_zero_point,
                   Dst dst, bool channels_last_out, void *out, size_t out_bytes) {
    for (size_t a = 2; a + 1 < dims.size(); ++a)
        if (dims[a] != 1) return false;
    Operation &phased = *op.polyphase;
    const int64_t images = dims[0], length = dims.back(), k = op.kernel_shape.back(), stride = op.strides.back();
    const int64_t before = op.pads_begin.back(), padded = before + length + op.pads_end.back();
    if (padded < k) return false;
    const int64_t outputs = (padded - k) / stride + 1, oc = op.out_channels, g = op.phase_outputs;
    const int64_t phases = phased.in_channels, taps = phased.kernel_shape.back();
    const int64_t positions = (outputs + g - 1) / g, rows = positions + taps - 1;
    const size_t item = item_size(dst), kept = (size_t)(outputs * oc) * item;
    const size_t computed = (size_t)(positions * g * oc) * item;
    if (out_bytes != images * kept) throw std::invalid_argument("out does not have the output's size");
    const uint8_t flip = signed_src ? 0x80 : 0, zero_point = (uint8_t)(src_zero_point + (signed_src ? 128 : 0));
    thread_local Scratch<uint8_t> phase_source, phase_outputs;
    uint8_t *x = phase_source.get((size_t)(images * rows * phases)), *y = phase_outputs.get(images * computed);
    for (int64_t n = 0; n < images; ++n) {  // [before zero points, the row, zero points to rows·phases]
        uint8_t *to = x + n * rows * phases;
        const uint8_t *from = src + n * length;
        const int64_t total = rows * phases, first = std::min(before, total), last = std::min(before + length, total);
        std::memset(to, zero_point, (size_t)first);
        for (int64_t i = first; i < last; ++i) to[i] = from[i - before] ^ flip;
        std::memset(to + last, zero_point, (size_t)(total - last));
    }
    execute(phased, x, {images, phases, rows}, true, false, zero_point, dst, true, y, images * computed);
    uint8_t *to = static_cast<uint8_t *>(out);
    for (int64_t n = 0; n < images; ++n) {  // each image's first `outputs` rows, [outputs, OC] or [OC, outputs]
        const uint8_t *from = y + n * computed;
        if (channels_last_out || oc == 1)
            std::memcpy(to + n * kept, from, kept);
        else
            lpt_ops::transpose(from, to + n * kept, 1, outputs, oc, (int)item, op.threads);
    }
    op.last_impl = phased.last_impl + " over phases";
    if (phase_source.bytes() + phase_outputs.bytes() > KEEP_SCRATCH_BYTES) {  // a long recording's: give it back
        phase_source.release();
        phase_outputs.release();
    }
    return true;
}

struct Unsupported : std::runtime_error {  // what lpt's step-by-step path runs instead (program.py)
    using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------- products of two run-time tensors
//
// MatMulInteger of two activations (attention's Q·Kᵀ and weights·V): both operands arrive at run
// time, so nothing is packed ahead. dst[b, m, n] = output stage of Σ_k (a[b, m, k] − za)·(b[b, k, n] − zb),
// each term at most 255·255 in magnitude and the sum exact in int32 while K·65 025 < 2^31.

struct Product {
    int a_zero_point = 0, b_zero_point = 0, threads = 1;
    OutputStage stage;  // multiplier and bias: one value, or one per column
};

const char *PRODUCT_CAPSULE = "lpt.native._engine.Product";
constexpr int64_t MAX_PRODUCT_REDUCTION = ((int64_t)1 << 31) / (255 * 255);

Product *product_of(PyObject *capsule) {
    return static_cast<Product *>(PyCapsule_GetPointer(capsule, PRODUCT_CAPSULE));
}

// row[c] = Σ_j a_row[j]·b[j, c]: eight int32 lanes at a time where the CPU has AVX2 (vpmulld), four
// with SSE2's emulation of it elsewhere; the same integers either way.
__attribute__((target_clones("avx2", "default"))) void accumulate_row(const int32_t *a_row, const int32_t *b,
                                                                      int64_t k, int64_t n, int32_t *row) {
    std::fill(row, row + n, 0);
    for (int64_t j = 0; j < k; ++j) {
        const int32_t av = a_row[j];
        const int32_t *bk = b + j * n;
        for (int64_t c = 0; c < n; ++c) row[c] += av * bk[c];
    }
}

// run_product where the CPU has AVX2: lpt_s16's pair kernel, and its vector output stage (the same
// operations as stage_row), the stage's per-column values padded as its Epilogue reads them.
void run_product_avx2(const Product &p, const OutputStage &stage, const uint8_t *a, bool a_signed, const uint8_t *b,
                      bool b_signed, int64_t batches, int64_t m, int64_t k, int64_t n, void *out) {
    const int64_t columns = lpt_s16::product_columns(n), pairs = (k + 1) / 2;
    const size_t padded = (size_t)(n + 15) / 16 * 16;
    std::vector<float> multiplier(stage.multiplier), bias(stage.bias);
    multiplier.resize(padded, 0.0f);
    if (!bias.empty()) bias.resize(padded, 0.0f);
    lpt_s16::Epilogue e;
    e.multiplier = multiplier.data();
    e.bias = bias.empty() ? nullptr : bias.data();
    e.post_ops = stage.post_ops.data();
    e.post_op_count = (int64_t)stage.post_ops.size() / lpt_s16::POST_OP_FIELDS;
    e.type = stage.dst == Dst::u8 ? lpt_s16::Epilogue::u8 : stage.dst == Dst::s8 ? lpt_s16::Epilogue::s8 : lpt_s16::Epilogue::f32;
    e.scale = stage.scale;
    e.zero_point = stage.zero_point, e.qmin = stage.qmin, e.qmax = stage.qmax;
    const size_t item = item_size(stage.dst);
    // Below about 4M products a second thread costs more than it saves (measured on a Zen 3: 2 threads
    // 0.033 against 0.013 ms for attention's 2×64×64×16, level at 2×128×64×64×2, 1.7× faster at 33M).
    constexpr int64_t PARALLEL_PRODUCTS = (int64_t)1 << 22;
    const int threads = batches * m * n * k >= PARALLEL_PRODUCTS ? p.threads : 1;
    lpt_parallel::run(threads, batches * m, 0, [&](lpt_parallel::Chunks &chunks) {
        std::vector<int16_t> packed((size_t)(pairs * columns * 2)), a_pairs((size_t)(2 * pairs), 0);
        std::vector<int32_t> row((size_t)columns);
        int64_t packed_batch = -1;
        for (int64_t t; chunks.next(t);) {
            const int64_t batch = t / m, i = t % m;
            if (packed_batch != batch) {
                lpt_s16::pack_product_operand(b + batch * k * n, b_signed, p.b_zero_point, k, n, packed.data());
                packed_batch = batch;
            }
            const uint8_t *aq = a + (batch * m + i) * k;
            for (int64_t j = 0; j < k; ++j)
                a_pairs[j] = (int16_t)((a_signed ? (int)(int8_t)aq[j] : (int)aq[j]) - p.a_zero_point);
            lpt_s16::product_row(a_pairs.data(), packed.data(), k, n, row.data());
            char *o = static_cast<char *>(out) + (batch * m + i) * n * item;
            if (stage.dst == Dst::s32) std::memcpy(o, row.data(), n * sizeof(int32_t));
            else lpt_s16::stage_rows(e, row.data(), nullptr, 1, n, o);
        }
    });
}

// a [batches, M, K] and b [batches, K, N], 8-bit, C-contiguous → out [batches, M, N] in the stage's type.
void run_product(const Product &p, const uint8_t *a, bool a_signed, const uint8_t *b, bool b_signed, int64_t batches,
                 int64_t m, int64_t k, int64_t n, void *out) {
    if (k > MAX_PRODUCT_REDUCTION) throw Unsupported("a product's reduction could overflow int32");
    OutputStage stage = p.stage;  // one value per column
    for (auto *v : {&stage.multiplier, &stage.bias})
        if (v->size() == 1) v->assign((size_t)n, (*v)[0]);
    if ((int64_t)stage.multiplier.size() != n || (!stage.bias.empty() && (int64_t)stage.bias.size() != n))
        throw Unsupported("a product's multiplier or bias does not fit its columns");
    const size_t item = item_size(stage.dst);
    auto value = [](const uint8_t *q, bool is_signed, int64_t i) { return is_signed ? (int32_t)(int8_t)q[i] : (int32_t)q[i]; };
    if (lpt_s16::supported()) {
        run_product_avx2(p, stage, a, a_signed, b, b_signed, batches, m, k, n, out);
        return;
    }
    const int threads = batches * m * n * k >= PARALLEL_WORK ? p.threads : 1;
    lpt_parallel::run(threads, batches * m, 0, [&](lpt_parallel::Chunks &chunks) {
        std::vector<int32_t> row(n), a_row(k);
        std::vector<float> x(n);
        std::vector<int32_t> wide_b;  // b − zb of the batch a thread is in
        int64_t widened = -1;
        for (int64_t t; chunks.next(t);) {
            const int64_t batch = t / m, i = t % m;
            if (widened != batch) {
                wide_b.resize((size_t)(k * n));
                const uint8_t *bq = b + batch * k * n;
                for (int64_t j = 0; j < k * n; ++j) wide_b[j] = value(bq, b_signed, j) - p.b_zero_point;
                widened = batch;
            }
            const uint8_t *aq = a + (batch * m + i) * k;
            for (int64_t j = 0; j < k; ++j) a_row[j] = value(aq, a_signed, j) - p.a_zero_point;
            accumulate_row(a_row.data(), wide_b.data(), k, n, row.data());
            char *o = static_cast<char *>(out) + (batch * m + i) * n * item;
            switch (stage.dst) {
                case Dst::f32: stage_row<float>(stage, row.data(), nullptr, n, x.data(), (float *)o, 1); break;
                case Dst::u8: stage_row<uint8_t>(stage, row.data(), nullptr, n, x.data(), (uint8_t *)o, 1); break;
                case Dst::s8: stage_row<int8_t>(stage, row.data(), nullptr, n, x.data(), (int8_t *)o, 1); break;
                case Dst::s32: stage_row<int32_t>(stage, row.data(), nullptr, n, x.data(), (int32_t *)o, 1); break;
            }
        }
    });
}

const char PRODUCT_DOC[] =
    "product(a_zero_point, b_zero_point, threads, multiplier, bias, post_ops, dst, dst_scale, dst_zero_point,\n"
    "        qmin, qmax) -> product\n\nmultiplier, bias: float32, one value or one per column.";

PyObject *py_product(PyObject *, PyObject *args) {
    PyObject *multiplier, *bias, *post_ops;
    int a_zero_point, b_zero_point, threads, zero_point, qmin, qmax;
    const char *dst;
    double scale;
    if (!PyArg_ParseTuple(args, "iiiOOOsdiii", &a_zero_point, &b_zero_point, &threads, &multiplier, &bias, &post_ops,
                          &dst, &scale, &zero_point, &qmin, &qmax))
        return nullptr;
    auto p = std::make_unique<Product>();
    try {
        p->a_zero_point = a_zero_point, p->b_zero_point = b_zero_point;
        p->threads = threads > 0 ? threads : omp_get_num_procs();
        parse_stage(p->stage, multiplier, bias, post_ops, dst, scale, zero_point, qmin, qmax);
    } catch (const std::exception &e) {
        return fail(e);
    }
    return PyCapsule_New(p.release(), PRODUCT_CAPSULE, [](PyObject *c) { delete product_of(c); });
}

const char RUN_DOC[] =
    "run(operation, src, out, accumulators=False, channels_last=False, src_zero_point=None)\n\n"
    "conv: src uint8/int8 [N, C, *spatial] (contiguous, or a channels-last view); out [N, OC, *out_spatial],\n"
    "C-contiguous (or [N, *out_spatial, OC] with channels_last). matmul: src [M, K] C-contiguous, out [M, N].\n"
    "out is float32/uint8/int8 as the operation's dst, or int32 with `accumulators` (no output stage).\n"
    "src_zero_point: this run's, in place of the operation's (a dynamic quantization's, given at run time).";

PyObject *py_run(PyObject *, PyObject *args) {
    PyObject *capsule, *src_o, *out_o;
    PyObject *zero_point_o = Py_None;
    int accumulators = 0, channels_last_out = 0;
    if (!PyArg_ParseTuple(args, "OOO|ppO", &capsule, &src_o, &out_o, &accumulators, &channels_last_out,
                          &zero_point_o))
        return nullptr;
    Operation *op = operation(capsule);
    if (!op) return nullptr;
    int src_zero_point = op->src_zero_point;
    if (zero_point_o != Py_None) {
        src_zero_point = (int)PyLong_AsLong(zero_point_o);
        if (src_zero_point == -1 && PyErr_Occurred()) return nullptr;
    }
    Buffer src, out;
    if (!src.get(src_o, PyBUF_RECORDS_RO) || !out.get(out_o, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE))
        return nullptr;
    const char sf = src.format(), of = out.format();
    if (sf != 'B' && sf != 'b') {
        PyErr_SetString(PyExc_TypeError, "src must be uint8 or int8");
        return nullptr;
    }
    if (sf == 'B' ? src_zero_point < 0 || src_zero_point > 255 : src_zero_point < -128 || src_zero_point > 127) {
        PyErr_Format(PyExc_ValueError, "source zero point %d is outside the source's type", src_zero_point);
        return nullptr;
    }
    const Dst dst = accumulators ? Dst::s32 : op->stage.dst;
    const char expected_format = dst == Dst::s32 ? 'i' : dst == Dst::f32 ? 'f' : dst == Dst::u8 ? 'B' : 'b';
    if (of != expected_format) {
        PyErr_Format(PyExc_TypeError, "out must have the format '%c', not '%c'", expected_format, of);
        return nullptr;
    }
    const Py_buffer &v = src.view;
    memory::dims dims(v.shape, v.shape + v.ndim);
    Layout layout = Layout::channels_first;
    if (op->kind == Kind::conv) {
        const int rank = (int)op->weight_dims.size() - (op->groups > 1 ? 1 : 0);
        if (v.ndim != rank || dims[1] != op->in_channels) {
            PyErr_Format(PyExc_ValueError, "src must be [N, %lld, ...] of rank %d", (long long)op->in_channels, rank);
            return nullptr;
        }
        layout = layout_of(v);
    } else {
        if (v.ndim != 2 || dims[1] != op->in_channels) {
            PyErr_Format(PyExc_ValueError, "src must be [M, %lld]", (long long)op->in_channels);
            return nullptr;
        }
        layout = PyBuffer_IsContiguous(&v, 'C') ? Layout::channels_first : Layout::other;
    }
    if (layout == Layout::other) {
        PyErr_SetString(PyExc_ValueError, "src must be contiguous (conv: channels-first or channels-last)");
        return nullptr;
    }
    std::string error;
    Py_BEGIN_ALLOW_THREADS;
    try {
        execute(*op, static_cast<const uint8_t *>(v.buf), dims, layout == Layout::channels_last, sf == 'b',
                src_zero_point, dst, channels_last_out, out.view.buf, (size_t)out.view.len);
    } catch (const dnnl::error &e) {
        error = std::string("oneDNN: ") + e.what();
    } catch (const std::exception &e) {
        error = e.what();
    }
    Py_END_ALLOW_THREADS;
    if (!error.empty()) {
        PyErr_SetString(PyExc_RuntimeError, error.c_str());
        return nullptr;
    }
    Py_RETURN_NONE;
}

// ---------------------------------------------------------------- programs
//
// A program runs a sequence of a plan's steps in one call (lpt/native/program.py builds it): int8
// layers (prepared operations), quantize, max pool, joins, views and transposes, and the float32 ops
// between layers (lpt/backend/float_steps.py, lpt/native/float_ops.h), on memory it keeps between
// runs, so Python is not entered between steps. Every instruction computes what lpt's step does,
// bit for bit (integer_ops.h, and execute() above). Convolutions leave their outputs channels-last,
// the layout they read fastest, and the instructions after them keep it; a flatten, a matmul and
// the program's outputs see channels-first values, as the steps do.

enum class Code {
    quantize, layer, upsample, max_pool, join, flatten, reshape, transpose, mean, product,
    dynamic_layer,  // float32 in and out: a dynamically quantized convolution, as onnxruntime runs it
    resize_nearest,  // values of any type
    // and the float32 ops:
    identity, squeeze, unsqueeze, average_pool, relu, clip, hard_swish, hard_sigmoid, sigmoid, tanh, erf, gelu, tanh_gelu,
    sqrt, log, affine,
    binary,
    concat, softmax, layer_norm, moment_layer_norm, mean_axis_1, mean_last_axis, extreme_middle, extreme_all, global_max,
    gather,
    pad, slice,  // values of any type
    one_hot,     // integers → 8-bit levels
    dense,       // a float32 MatMul or an STFT's Conv by constant weights
    chain,       // binary ops one after the other, in one pass (fold_binaries)
    folded  // a quantize the binary op before it computes (fold_quantizes), a binary op a chain computes
};

struct Instruction {
    Code code;
    std::vector<int> in;
    int out = 0;
    Operation *operation = nullptr;  // layer, upsample
    Product *product = nullptr;      // product
    PyObject *capsule = nullptr;     // layer, upsample, product: a reference that keeps `operation` or `product` alive
    lpt_ops::Pool pool{};            // max_pool, average_pool
    bool multiply = false, relu = false, signed_out = false;  // join; quantize: the output's type
    bool count_include_pad = false;  // average_pool
    lpt_ops::Silu silu = lpt_ops::NO_SILU;  // dynamic_layer
    char op = 0;                     // binary, chain (its first op): '*', '+', '-' or '/'
    // chain: each later op and whether the chain's value is its second operand; in: the first op's two
    // operands, then each later op's other operand
    std::vector<std::pair<char, bool>> chain;
    std::vector<std::pair<int64_t, int64_t>> upsampling;  // chain: each later op's operand's (fold_upsamplings), (1, 1) if none
    bool quantized = false;          // binary: into 8-bit values, as quantize_to says (fold_quantizes)
    lpt_ops::QuantizeTo quantize_to;
    float a_shift = 0, a_scale = 1, b_shift = 0, b_scale = 1, scale = 1;
    float alpha = 0, offset = 0;  // hard_sigmoid: α and β; clip: α, the slope below 0; gelu: divisor, one
    float low = 0, high = 0;              // clip
    bool low_read = false, high_read = false;  // clip: the bound is an input (one value), after the source
    float cube = 0, root = 0, one = 0, half = 0;  // tanh_gelu
    int zero_point = 0, qmin = 0, qmax = 255;
    lpt_ops::Destination to;  // join
    int64_t axis = 1;  // flatten
    bool into_convolutions = false;  // transpose: only convolutions read it (mark_transposes_into_convolutions)
    // reshape: ONNX's target (0: the input's dimension unless allow_zero, −1: inferred); transpose: perm;
    // (un)squeeze: axes; gather: the table's shape
    std::vector<int64_t> shape;
    bool allow_zero = false;
    bool shape_read = false;  // reshape: its target is its second input, computed at run time
    bool drop_axes = false;  // slice: its axes leave the output (a Gather of one index: each must keep one value)
    bool reflect = false;  // pad: the border mirrors the values next to it (ONNX's mode "reflect"), not ins.fill
    std::vector<float> gamma, beta;  // layer_norm: scale and bias (beta may be empty); affine: a and b;
                                     // dynamic_layer: beta its float32 bias (or empty)
    float epsilon = 0;               // layer_norm, moment_layer_norm
    float factor = 0;                // moment_layer_norm: 1 / the count
    bool keepdims = false;           // mean_axis_1, mean_last_axis, extreme_middle
    bool ones_only = false;          // squeeze (squeeze_ones): only those of its axes that hold one value
    bool smallest = false;           // extreme_middle: a min, not a max
    float fill = 0;                  // pad: the border's value (ins.shape: ONNX's pads, the begins then the ends)
    std::vector<float> table;        // gather: rows of a constant float32 table, shape in `shape`
    std::vector<int64_t> values;     // one_hot: the integers each value is compared with; dynamic_layer: its
                                     // residual weights, each (output channel, source channel, tap…, value)
    // dynamic_layer: the weight scales (one, or one per output channel) its bias is divided by and its output
    // multiplied by, each with the source's
    std::vector<float> bias_weight_scales, weight_scales;
    uint8_t low_level = 0, high_level = 0;  // one_hot: the levels of 0 and 1 (signed_out: as int8)
    std::vector<float> packed, bias;        // dense: the weights as lpt_ops::pack_dense_weights lays them out; bias or empty
                                            // (dynamic_layer: its float32 bias or empty)
    int64_t depth = 0, width = 0, stride = 0;  // dense: the weights' [depth, width]; a Conv's stride (0: a MatMul)
    // dense of a Conv: writes [N, frames, width], not [N, width, frames] (frames_into_transposes)
    bool frames_first = false;
    int64_t frame_channels = 1, pad_begin = 0, pad_end = 0;  // dense of a Conv: its source's channels, its zero pads
    // dense of a Conv of one channel whose weights are even (1) or odd (−1) about their middle: each frame of
    // fold_kernel samples folded as kernels.fold_frames folds it (depth = fold_kernel / 2 + 1); 0: not folded
    int64_t fold_kernel = 0, fold_sign = 0;
};

// Memory a slot holds for its values: allocated without being cleared (every instruction writes its
// whole output), and passed between slots through the program's pool.
struct Memory {
    CacheLineArray<unsigned char> bytes;
    size_t capacity = 0;
};

inline int item_of(char type) { return type == 'q' ? 8 : type == 'f' || type == 'i' ? 4 : 1; }

struct Slot {  // a tensor during a run: its shape, type ('f', 'B', 'b'; 'q', 'i': int64, int32 indices) and values
    std::vector<int64_t> dims;  // as the step sees them: [N, C, *spatial]
    char type = 'f';
    bool channels_last = false;  // the values lie as [N, *spatial, C]
    const void *data = nullptr;
    Memory memory;  // the slot's own (an input, a flatten or a reshape points elsewhere)
    std::vector<Memory> *pool = nullptr;  // the program's free memory, where `memory` comes from and goes back
    int64_t count() const {
        int64_t n = 1;
        for (auto d : dims) n *= d;
        return n;
    }
    int64_t positions() const {
        int64_t n = 1;
        for (size_t i = 2; i < dims.size(); ++i) n *= dims[i];
        return n;
    }
    int item() const { return item_of(type); }
    bool eight_bit() const { return type == 'B' || type == 'b'; }
    bool transposed() const {  // channels-last in memory, and not also channels-first (one channel or position)
        return channels_last && dims.size() > 2 && dims[1] > 1 && positions() > 1;
    }
    // The values channels-first (into `to`, which must hold count() items) or channels-last.
    void channels_first_into(void *to, int threads) const {
        lpt_ops::transpose(data, to, dims[0], positions(), dims[1], item(), threads);
    }
    void channels_last_into(void *to, int threads) const {
        lpt_ops::transpose(data, to, dims[0], dims[1], positions(), item(), threads);
    }
    // Memory for `items` values of type t: the slot's own if it is large enough, else the smallest in
    // the pool that is (or a new block).
    void *allocate(char t, int64_t items) {
        type = t;
        const size_t need = std::max<size_t>(1, (size_t)items * item_of(t));
        if (memory.capacity < need) {
            release();
            size_t best = pool->size();
            for (size_t i = 0; i < pool->size(); ++i)
                if ((*pool)[i].capacity >= need && (best == pool->size() || (*pool)[i].capacity < (*pool)[best].capacity))
                    best = i;
            if (best < pool->size()) {
                memory = std::move((*pool)[best]);
                (*pool)[best] = std::move(pool->back());
                pool->pop_back();
            } else {
                memory.bytes = cache_line_array<unsigned char>(need);
                memory.capacity = need;
            }
        }
        data = memory.bytes.get();
        return memory.bytes.get();
    }
    void release() {  // the slot's memory back to the pool, for a later slot of the run
        if (memory.capacity) pool->push_back(std::move(memory));
        memory = Memory();
    }
};

struct Program {
    std::vector<Instruction> code;
    std::vector<int> inputs, outputs;
    std::vector<Slot> slots;
    // The instruction after which each slot is read no more (then its memory goes to the pool for the
    // slots after it); a view (flatten, reshape, ...) extends its source's; outputs live to the end.
    std::vector<size_t> last_use;
    std::vector<Memory> pool;
    Scratch<unsigned char> scratch;  // a tensor in the other layout, while an instruction reads it
    Scratch<unsigned char> upsampled;  // an upsampling's matmul output, before its layout; a dynamic matmul's source
    std::vector<double> seconds;         // each instruction's time in the last run: where a program's time goes
    bool opens_loops = true;             // the last run opened loops to the pool's workers (lpt_parallel::Busy)
    int threads = 1;
    std::mutex lock;
    ~Program() {
        for (auto &i : code) Py_XDECREF(i.capsule);
    }
};

const char *PROGRAM_CAPSULE = "lpt.native._engine.Program";
constexpr size_t KEEP_PROGRAM_BYTES = (size_t)512 << 20;


// How many images a layer runs at a time, each of in_image source and out_image output values: within the
// scratch Conv._run allows itself (operations.py: SCRATCH_BYTES).
int64_t images_per_chunk(int64_t in_image, int64_t out_image) {
    return std::max<int64_t>(1, (64 << 20) / std::max<int64_t>(1, 3 * in_image + 8 * out_image));
}

// With `join` (a convolution's, join_in_bands), `out` is the join's output.
void run_layer(const Instruction &ins, const Slot &src, Slot &out, Scratch<unsigned char> &scratch,
               const RowsDone *rows_done = nullptr, const Join *join = nullptr) {
    Operation &op = *ins.operation;
    if (!src.eight_bit()) throw Unsupported("a layer reads other than 8-bit integers");
    const int expected_rank = op.kind == Kind::conv ? (int)op.weight_dims.size() - (op.groups > 1 ? 1 : 0) : -1;
    if ((op.kind == Kind::conv && (int)src.dims.size() != expected_rank) || src.dims.size() < 2 ||
        (op.kind == Kind::conv ? src.dims[1] : src.dims.back()) != op.in_channels)
        throw Unsupported("a layer's source does not fit its weights");
    out.dims = layer_output_dims(op, src.dims);
    const Dst dst = op.stage.dst;
    const char type = join ? join->to.type : dst == Dst::f32 ? 'f' : dst == Dst::u8 ? 'B' : 'b';
    void *o = out.allocate(type, out.count());
    const bool signed_src = src.type == 'b';
    const uint8_t *in = static_cast<const uint8_t *>(src.data);
    out.channels_last = op.kind == Kind::conv;
    if (op.kind == Kind::matmul) {
        if (src.transposed()) {  // a matmul reads its last axis: the channels-first order's
            unsigned char *order = scratch.get(src.count());
            src.channels_first_into(order, op.threads);
            in = order;
        }
        const int64_t rows = src.count() / op.in_channels;
        if (rows)
            execute(op, in, {rows, op.in_channels}, false, signed_src, op.src_zero_point, dst, false, o,
                    (size_t)(out.count() * item_size(dst)));
        return;
    }
    // a few images at a time (images_per_chunk)
    const int64_t images = src.dims[0], in_image = src.count() / std::max<int64_t>(images, 1),
                  out_image = out.count() / std::max<int64_t>(images, 1);
    const int64_t chunk = images_per_chunk(in_image, out_image);
    for (int64_t first = 0; first < images; first += chunk) {
        const int64_t count = std::min(chunk, images - first);
        memory::dims dims(src.dims.begin(), src.dims.end());
        dims[0] = count;
        // rows_done counts the rows of the whole output, execute those of these images
        const int64_t first_row = first * out_image / op.out_channels;
        const RowsDone these = [&](int64_t begin, int64_t end, int threads) {
            (*rows_done)(first_row + begin, first_row + end, threads);
        };
        Join these_images;
        if (join) {
            these_images = *join;
            these_images.other += first * out_image;
        }
        execute(op, in + first * in_image, dims, src.transposed(), signed_src, op.src_zero_point, dst, true,
                static_cast<char *>(o) + first * out_image * item_size(dst), (size_t)(count * out_image * item_size(dst)),
                rows_done ? &these : nullptr, join ? &these_images : nullptr);
    }
}

// A dynamically quantized convolution or matmul, as onnxruntime runs quantize_dynamic's graph of it
// (lpt.backend.dynamic_layers): DynamicQuantizeLinear of the float32 source, the exact accumulators with its zero
// point, each residual weight (a value w − zw beyond int8, the rest of it) added where it meets the source, then
// lpt_ops::dynamic_stage with the scales the source's scale makes. Out: float32, a convolution's channels-last.
void run_dynamic_layer(Program &program, const Instruction &ins, const Slot &src, Slot &out) {
    Operation &op = *ins.operation;
    const bool conv = op.kind == Kind::conv;
    const size_t rank = conv ? op.kernel_shape.size() - 2 : 0;
    if (src.type != 'f') throw Unsupported("a dynamic layer reads other than float32");
    if (conv ? src.dims.size() != rank + 2 || src.dims[1] != op.in_channels
             : src.dims.empty() || src.dims.back() != op.in_channels)
        throw Unsupported("a dynamic layer's source does not fit its weights");
    const int64_t n = src.count();
    uint8_t *q = program.scratch.get((size_t)n);
    float source_scale;
    int zero_point;
    lpt_ops::dynamic_quantize(static_cast<const float *>(src.data), n, q, source_scale, zero_point, program.threads);
    if (!std::isfinite(source_scale) || source_scale == 0.0f)  // the step raises onnxruntime's error
        throw Unsupported("a dynamic quantization's range is beyond float32 or below its steps");
    if (!conv && src.transposed()) {  // a matmul reads its last axis: the channels-first order's
        uint8_t *order = program.upsampled.get((size_t)n);
        lpt_ops::transpose(q, order, src.dims[0], src.positions(), src.dims[1], 1, program.threads);
        q = order;
    }
    out.dims = layer_output_dims(op, src.dims);
    int32_t *acc = static_cast<int32_t *>(out.allocate('f', out.count()));
    out.channels_last = conv;
    const int64_t channels = op.out_channels, rows = out.count() / std::max<int64_t>(channels, 1);
    if (out.count())
        execute(op, q, conv ? memory::dims(src.dims.begin(), src.dims.end()) : memory::dims{rows, op.in_channels},
                conv && src.transposed(), false, zero_point, Dst::s32, conv, acc,
                (size_t)out.count() * sizeof(int32_t));
    const auto add = [zero_point](int32_t &a, int64_t value, uint8_t level) {  // int32's wrapping sum
        a = (int32_t)((uint32_t)a + (uint32_t)(value * ((int64_t)level - zero_point)));
    };
    const int64_t width = conv ? (int64_t)rank + 3 : 3;
    for (size_t e = 0; e < ins.values.size(); e += width) {
        const int64_t *entry = ins.values.data() + e, value = entry[width - 1];
        if (!conv) {  // (row k of the weights, column, value)
            for (int64_t r = 0; r < rows; ++r)
                add(acc[r * channels + entry[1]], value, q[r * op.in_channels + entry[0]]);
            continue;
        }
        // (output channel, source channel, tap…, value): output position o reads source position
        // o·stride + tap·dilation − pad along each axis
        const int64_t oc = entry[0], channel = entry[1], images = src.dims[0], positions = out.positions(),
                      in_positions = src.positions(), in_channels = src.dims[1];
        for (int64_t o = 0; o < positions; ++o) {
            int64_t at = 0, rest = o, stride = 1;
            bool inside = true;
            for (size_t i = rank; i-- > 0;) {  // the last axis varies fastest
                const int64_t extent = out.dims[2 + i], coordinate = rest % extent;
                rest /= extent;
                const int64_t read =
                    coordinate * op.strides[i] + entry[2 + i] * (op.dilations[i] + 1) - op.pads_begin[i];
                inside = inside && read >= 0 && read < src.dims[2 + i];
                at += read * stride;
                stride *= src.dims[2 + i];
            }
            if (!inside) continue;
            for (int64_t image = 0; image < images; ++image)
                add(acc[(image * positions + o) * channels + oc], value,
                    q[src.transposed() ? (image * in_positions + at) * in_channels + channel
                                       : (image * in_channels + channel) * in_positions + at]);
        }
    }
    // the scales' products as onnxruntime's Mul(s, sw) makes them, one per channel
    const auto times_source = [&](const std::vector<float> &weight_scales) {
        std::vector<float> scales(channels);
        for (int64_t c = 0; c < channels; ++c) scales[c] = source_scale * weight_scales[weight_scales.size() > 1 ? c : 0];
        return scales;
    };
    std::vector<int32_t> bias_q(ins.bias.size());
    if (!ins.bias.empty())
        lpt_ops::dynamic_bias(ins.bias.data(), channels, times_source(ins.bias_weight_scales).data(), bias_q.data());
    lpt_ops::dynamic_stage(acc, rows, channels, bias_q.empty() ? nullptr : bias_q.data(),
                           times_source(ins.weight_scales).data(), ins.beta.empty() ? nullptr : ins.beta.data(),
                           ins.silu, program.threads);
}

// `count` runs of `bytes` bytes, from src (runs src_stride bytes apart) to dst (dst_stride apart). Runs of
// a few bytes (a one-channel float map's pair of pixels, a part's 24 channels in a concatenation) go
// as moves of a size known here: a memcpy call per run cost more than its bytes (PaddleOCR's detector's
// last upsampling, 409 600 runs of 4 bytes, spent most of its 3.5 ms so).
template <int64_t BYTES>
void copy_fixed_runs(char *dst, int64_t dst_stride, const char *src, int64_t src_stride, int64_t count) {
    for (int64_t i = 0; i < count; ++i) std::memcpy(dst + i * dst_stride, src + i * src_stride, BYTES);
}

void copy_runs(char *dst, int64_t dst_stride, const char *src, int64_t src_stride, int64_t bytes, int64_t count) {
    switch (bytes) {
        case 1: return copy_fixed_runs<1>(dst, dst_stride, src, src_stride, count);
        case 2: return copy_fixed_runs<2>(dst, dst_stride, src, src_stride, count);
        case 4: return copy_fixed_runs<4>(dst, dst_stride, src, src_stride, count);
        case 8: return copy_fixed_runs<8>(dst, dst_stride, src, src_stride, count);
        case 12: return copy_fixed_runs<12>(dst, dst_stride, src, src_stride, count);
        case 16: return copy_fixed_runs<16>(dst, dst_stride, src, src_stride, count);
        case 24: return copy_fixed_runs<24>(dst, dst_stride, src, src_stride, count);
        case 32: return copy_fixed_runs<32>(dst, dst_stride, src, src_stride, count);
        case 48: return copy_fixed_runs<48>(dst, dst_stride, src, src_stride, count);
        case 64: return copy_fixed_runs<64>(dst, dst_stride, src, src_stride, count);
    }
    for (int64_t i = 0; i < count; ++i) std::memcpy(dst + i * dst_stride, src + i * src_stride, bytes);
}

// A ConvTranspose whose stride is its kernel (kh × kw, in ins.shape): each output pixel reads one input
// pixel, so it is the matmul op of every pixel's channels (its columns [kh][kw][C_out]: lpt.backend.
// int8_steps._NativeUpsampling), each pixel's kh·kw runs of C_out values then laid out as pixels,
// channels-last [N, H·kh, W·kw, C_out] as a convolution's output.
void run_upsampling(Program &program, const Instruction &ins, const Slot &src, Slot &out) {
    Operation &op = *ins.operation;
    const int64_t kh = ins.shape[0], kw = ins.shape[1], taps = kh * kw;
    if (op.kind != Kind::matmul || !src.eight_bit() || src.dims.size() != 4 || src.dims[1] != op.in_channels ||
        op.out_channels % taps)
        throw Unsupported("an upsampling's source does not fit its weights");
    const int64_t images = src.dims[0], h = src.dims[2], w = src.dims[3], rows = images * h * w;
    const int64_t c_out = op.out_channels / taps;
    const uint8_t *in = static_cast<const uint8_t *>(src.data);
    if (!src.channels_last && src.dims[1] > 1 && h * w > 1) {  // the matmul reads each pixel's channels
        unsigned char *order = program.scratch.get(src.count());
        src.channels_last_into(order, program.threads);
        in = order;
    }
    const Dst dst = op.stage.dst;
    const size_t item = item_size(dst);
    const size_t columns_bytes = (size_t)(rows * op.out_channels) * item;
    unsigned char *columns = program.upsampled.get(columns_bytes);
    if (rows)
        execute(op, in, {rows, op.in_channels}, false, src.type == 'b', op.src_zero_point, dst, false, columns,
                columns_bytes);
    out.dims = {images, c_out, h * kh, w * kw};
    char *o = static_cast<char *>(out.allocate(dst == Dst::f32 ? 'f' : dst == Dst::u8 ? 'B' : 'b', out.count()));
    out.channels_last = true;
    // output row (image, y·kh + i): for each source pixel x of row y, its taps i·kw … i·kw + kw − 1
    const int64_t run = kw * c_out * (int64_t)item, pixel = taps * c_out * (int64_t)item;
    lpt_parallel::for_each(rows * op.out_channels >= PARALLEL_WORK ? program.threads : 1, images * h * kh,
                           [=](int64_t row) {
        const int64_t source_row = row / kh, i = row % kh;
        copy_runs(o + row * w * run, run, reinterpret_cast<const char *>(columns) + source_row * w * pixel + i * run,
                  pixel, run, w);
    });
}

// `out` as `a`'s values where they lie, seen with `dims` and `channels_last`: a view (the slot it reads
// lives as long as this one: plan_memory).
void alias(Slot &out, const Slot &a, std::vector<int64_t> dims, bool channels_last) {
    out.type = a.type;
    out.data = a.data;
    out.dims = std::move(dims);
    out.channels_last = channels_last;
}

// `out` as `a`'s values with other dimensions: a view of them, or, where `a` lies channels-last, a
// channels-first copy (a flatten or reshape reads the channels-first order).
void view_as(Slot &out, const Slot &a, std::vector<int64_t> dims, int threads) {
    if (!a.transposed()) return alias(out, a, std::move(dims), false);
    a.channels_first_into(out.allocate(a.type, a.count()), threads);
    out.dims = std::move(dims);
}

// a's values channels-first: its own, or a copy in the program's scratch where it lies channels-last
// The shapes a written-out reduction's Reshapes and Expands are given at this run, its inputs after the
// first (float_steps.reduced_shapes_hold): here only x's dimensions with 1 at the reduced axis, written
// out; any other form, the step's.
void check_reduced_shapes(const Instruction &ins, const std::vector<Slot> &slots, const std::vector<int64_t> &dims,
                          size_t axis) {
    std::vector<int64_t> expected = dims;
    expected[axis] = 1;
    for (size_t k = 1; k < ins.in.size(); ++k) {
        const Slot &shape = slots[ins.in[k]];
        if (shape.type != 'q' || shape.count() != (int64_t)expected.size() ||
            !std::equal(expected.begin(), expected.end(), static_cast<const int64_t *>(shape.data)))
            throw Unsupported("a reduction whose Reshape or Expand is given another shape than its input's with 1 there");
    }
}

float one_value(const Slot &s, const char *what) {
    if (s.type != 'f' || s.count() != 1) throw Unsupported(std::string(what) + " by other than one float32 value");
    return *static_cast<const float *>(s.data);
}

const void *channels_first(const Slot &a, Program &program) {
    if (!a.transposed()) return a.data;
    unsigned char *order = program.scratch.get(a.count() * a.item());
    a.channels_first_into(order, program.threads);
    return order;
}

// Whether `perm` of values of `dims` moves one block of axes past the next, leaving out axes of one value
// and taking axes that stay side by side as one: [A, B, C] to [A, C, B] (A may be 1), which lpt_ops::transpose
// copies in blocks through registers (images A, rows B, columns C). permute reads along the output's last axis,
// a column of the input here: a program of one (0, 2, 1) transpose of [1, 96, 25600] float32 took 5.0-5.2 ms so,
// 1.3 ms with the blocks; of [1, 25600, 96] 2.4-2.6 → 0.6-0.9 (Zen 4, one and two threads).
bool as_block_transpose(const std::vector<int64_t> &dims, const std::vector<int64_t> &perm, int64_t &images,
                        int64_t &rows, int64_t &columns) {
    const int64_t rank = (int64_t)dims.size();
    const auto next_kept = [&](int64_t axis) {  // the input's next axis of more than one value
        while (++axis < rank && dims[axis] == 1) {}
        return axis;
    };
    std::vector<std::pair<int64_t, int64_t>> groups;  // runs of input axes [first, last], in the output's order
    for (int64_t axis : perm) {
        if (dims[axis] == 1) continue;
        if (!groups.empty() && next_kept(groups.back().second) == axis) groups.back().second = axis;
        else groups.emplace_back(axis, axis);
    }
    const auto extent = [&](const std::pair<int64_t, int64_t> &g) {
        int64_t n = 1;
        for (int64_t axis = g.first; axis <= g.second; ++axis) n *= dims[axis];
        return n;
    };
    if (groups.size() == 2 && groups[0].first > groups[1].first) {  // [B, C] → [C, B]
        images = 1, rows = extent(groups[1]), columns = extent(groups[0]);
        return true;
    }
    if (groups.size() == 3 && groups[0].first < groups[2].first && groups[2].first < groups[1].first) {
        images = extent(groups[0]), rows = extent(groups[2]), columns = extent(groups[1]);
        return true;
    }
    return false;
}

// Whether `a`, transposed by `perm`, is its own values lying channels-last: `a` lies channels-first,
// and the axes of the result's channels-last order ([N, *spatial, C]) are a's in order, but for a's
// axes of one value, which may go anywhere.
bool lies_channels_last(const Slot &a, const std::vector<int64_t> &perm) {
    const size_t rank = perm.size();
    if (a.transposed() || rank < 3) return false;
    std::vector<int64_t> order{perm[0]};
    for (size_t i = 2; i < rank; ++i) order.push_back(perm[i]);
    order.push_back(perm[1]);
    int64_t last = -1;
    for (int64_t axis : order) {
        if (a.dims[axis] == 1) continue;
        if (axis < last) return false;
        last = axis;
    }
    return true;
}

// Where ONNX's Slice starts on an axis of `dim` values and how many it takes: a negative start or end
// counts from the end, and both are clamped to the axis ([0, dim] stepping forward, [−1, dim − 1] back).
struct SliceRange {
    int64_t first, count;
};
SliceRange slice_range(int64_t dim, int64_t start, int64_t end, int64_t step) {
    if (dim == 0) return {0, 0};
    if (start < 0) start += dim;
    if (end < 0) end += dim;
    if (step > 0) {
        start = std::clamp<int64_t>(start, 0, dim);
        end = std::clamp<int64_t>(end, 0, dim);
        return {start, end > start ? (end - start + step - 1) / step : 0};
    }
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
    return {start, start > end ? (start - end - step - 1) / -step : 0};
}

// Whether `small` broadcasts onto `big` by repeating whole: its dimensions big's last ones, after 1s.
bool repeats(const std::vector<int64_t> &small, const std::vector<int64_t> &big) {
    if (small.size() > big.size()) return false;
    const size_t skip = big.size() - small.size();
    size_t first = 0;
    while (first < small.size() && small[first] == 1) ++first;
    for (size_t i = first; i < small.size(); ++i)
        if (small[i] != big[skip + i]) return false;
    return true;
}

// Whether `join` (code[join_at]) reads the output of the convolution `layer` and one other tensor (a residual
// join). `view`: the slot the join reads the output as, the output itself or an Identity's view of it just before
// the join (PaddleOCR's exports put one there), which only the join reads.
bool joins_layer(const Program &program, const Instruction &layer, int view, const Instruction &join, size_t join_at) {
    if (layer.code != Code::layer || layer.operation->kind != Kind::conv || join.code != Code::join) return false;
    return (join.in[0] == view) != (join.in[1] == view) && (view == layer.out || program.last_use[view] == join_at);
}

// Whether oneDNN's primitive of the convolution `layer` (code[at]) applies the join after it too, its output
// never written (Join): where oneDNN stages the layer, nothing after the join reads that output, and the
// join's values stay normal floats far from overflow (scales within 2^±40), so that its operations give
// lpt_ops::join's bits; the layer's side dequantized with its own zero point, and an 8-bit destination.
bool joins_in_primitive(const Program &program, size_t at, const Instruction &layer, int view,
                        const Instruction &join) {
    const Operation &op = *layer.operation;
    const bool layer_first = join.in[0] == view;
    const float shift = layer_first ? join.a_shift : join.b_shift;
    const auto moderate = [](float v) { return std::fabs(v) >= 0x1p-40f && std::fabs(v) <= 0x1p40f; };
    return stages_in_onednn(op, op.stage.dst, true) && program.last_use[layer.out] == at + 1 &&
           (join.to.type == 'B' || join.to.type == 'b') && shift == (float)op.stage.zero_point &&
           moderate(join.a_scale) && moderate(join.b_scale) && moderate(join.to.scale) &&
           std::nearbyint(join.a_shift) == join.a_shift && std::nearbyint(join.b_shift) == join.b_shift;
}

// A convolution and the residual join after it (joins_layer) in one pass: each band's rows joined right after
// their output stage, on the thread that staged them, while they are in its cache, instead of a pass over
// the whole tensor after the layer. The same operations on the same values as step's join, a range of rows
// at a time. False, with nothing run, where the other operand is not 8-bit in the convolution's output shape
// and layout: then the two run one after the other.
bool join_in_bands(Program &program, size_t at, const Instruction &layer, int view, const Instruction &join) {
    std::vector<Slot> &slots = program.slots;
    const Slot &src = slots[layer.in[0]];
    const bool layer_first = join.in[0] == view;
    const Slot &other = slots[join.in[layer_first ? 1 : 0]];
    Operation &op = *layer.operation;
    const size_t rank = op.weight_dims.size() - (op.groups > 1 ? 1 : 0);
    if (!src.eight_bit() || !other.eight_bit() || op.stage.dst == Dst::f32 || src.dims.size() != rank) return false;
    const std::vector<int64_t> dims = layer_output_dims(op, src.dims);
    int64_t positions = 1;
    for (size_t i = 2; i < dims.size(); ++i) positions *= dims[i];
    const bool transposed = dims[1] > 1 && positions > 1;  // as Slot::transposed() will say of the layer's output
    if (other.dims != dims || other.transposed() != transposed) return false;
    Slot &out = slots[join.out], &mid = slots[layer.out];
    if (joins_in_primitive(program, at, layer, view, join)) {
        Join fused;
        fused.other = static_cast<const uint8_t *>(other.data);
        fused.other_signed = other.type == 'b';
        fused.multiply = join.multiply, fused.relu = join.relu;
        fused.scale = layer_first ? join.a_scale : join.b_scale;
        fused.other_shift = layer_first ? join.b_shift : join.a_shift;
        fused.other_scale = layer_first ? join.b_scale : join.a_scale;
        fused.to = join.to;
        run_layer(layer, src, out, program.scratch, nullptr, &fused);
        out.channels_last = transposed;
        return true;
    }
    out.dims = dims;
    out.channels_last = transposed;
    char *o = static_cast<char *>(out.allocate(join.to.type, dims[0] * dims[1] * positions));
    const int64_t channels = op.out_channels, out_item = item_of(join.to.type);
    const RowsDone joined = [&](int64_t begin, int64_t end, int threads) {
        const Slot &a = layer_first ? mid : other, &b = layer_first ? other : mid;
        const int64_t first = begin * channels;
        lpt_ops::join(static_cast<const char *>(a.data) + first, a.type == 'b', static_cast<const char *>(b.data) + first,
                      b.type == 'b', (end - begin) * channels, join.multiply, join.a_shift, join.a_scale, join.b_shift,
                      join.b_scale, join.relu, join.to, o + first * out_item, threads);
    };
    run_layer(layer, src, mid, program.scratch, &joined);
    return true;
}

// Whether `binary` adds one float32 tensor to the output of the convolution `layer` (code[at]) that nothing else
// reads, where lpt's s16 kernel can add it in the layer's output stage (add_in_stage): a stage into float32
// with no post-op (a residual Add after a layer whose output stays float32: PaddleOCR's detector's).
// `view`: the slot the Add reads the output as, the output itself or an Identity's view of it just before the Add
// (code[at + 1], the Add code[at + 2]).
bool adds_to_layer(const Program &program, size_t at, const Instruction &layer, int view, const Instruction &binary) {
    if (layer.code != Code::layer || binary.code != Code::binary || binary.op != '+') return false;
    const Operation &op = *layer.operation;
    const size_t add_at = at + (view == layer.out ? 1 : 2);
    return op.kind == Kind::conv && op.route == Route::s16 && op.stage.dst == Dst::f32 &&
           op.epilogue.post_op_count == 0 && !op.epilogue.flush_tiny &&
           (binary.in[0] == view) != (binary.in[1] == view) && program.last_use[layer.out] == add_at &&
           program.last_use[view] == add_at;
}

// The convolution `layer` and the Add after it (adds_to_layer) in one pass: each tile's float32 values plus
// the other operand's, quantized where the Add's output is (fold_quantizes), the layer's float32 output never
// written nor read again. The same operations on the same values as the two instructions'. False, with
// nothing run, where the other operand is not float32 in the layer's output shape and layout.
bool add_in_stage(Program &program, const Instruction &layer, int view, const Instruction &binary) {
    std::vector<Slot> &slots = program.slots;
    const Slot &src = slots[layer.in[0]];
    const bool layer_first = binary.in[0] == view;
    const Slot &other = slots[binary.in[layer_first ? 1 : 0]];
    Operation &op = *layer.operation;
    const size_t rank = op.weight_dims.size() - (op.groups > 1 ? 1 : 0);
    if (!src.eight_bit() || other.type != 'f' || src.dims.size() != rank || src.dims[1] != op.in_channels)
        return false;
    const std::vector<int64_t> dims = layer_output_dims(op, src.dims);
    int64_t positions = 1;
    for (size_t i = 2; i < dims.size(); ++i) positions *= dims[i];
    const bool transposed = dims[1] > 1 && positions > 1;  // as Slot::transposed() would say of the layer's output
    if (other.dims != dims || other.transposed() != transposed) return false;
    lpt_s16::Epilogue staging = op.epilogue;
    staging.addend_first = !layer_first;
    Dst dst = Dst::f32;
    if (binary.quantized) {
        const lpt_ops::QuantizeTo &to = binary.quantize_to;
        dst = to.is_signed ? Dst::s8 : Dst::u8;
        staging.type = to.is_signed ? lpt_s16::Epilogue::s8 : lpt_s16::Epilogue::u8;
        staging.scale = to.scale, staging.zero_point = to.zero_point, staging.qmin = to.qmin, staging.qmax = to.qmax;
    }
    Slot &out = slots[binary.out];
    out.dims = dims;
    out.channels_last = true;
    char *o = static_cast<char *>(out.allocate(dst == Dst::f32 ? 'f' : dst == Dst::u8 ? 'B' : 'b', out.count()));
    // a few images at a time, as run_layer
    const int64_t images = src.dims[0], in_image = src.count() / std::max<int64_t>(images, 1),
                  out_image = out.count() / std::max<int64_t>(images, 1), item = item_size(dst);
    const int64_t chunk = images_per_chunk(in_image, out_image);
    std::lock_guard<std::mutex> guard(op.lock);
    for (int64_t first = 0; first < images; first += chunk) {
        const int64_t count = std::min(chunk, images - first);
        memory::dims part(src.dims.begin(), src.dims.end());
        part[0] = count;
        staging.addend = static_cast<const float *>(other.data) + first * out_image;
        run_s16(op, static_cast<const uint8_t *>(src.data) + first * in_image, part, src.transposed(),
                src.type == 'b', op.src_zero_point, dst, true, o + first * out_image * item,
                (size_t)(count * out_image * item), &staging);
    }
    return true;
}

// out = a ∘ b (op '*', '+', '-' or '/'), one broadcast to the other's shape as far as lpt_ops::binary takes
// it; into 8 bits with `to` (fold_quantizes); with `steps`, a chain's later ops too (run_chain), whose
// operands lie as the bigger of a and b does.
void run_binary(Program &program, char op, const Slot &a, const Slot &b, const lpt_ops::QuantizeTo *to, Slot &out,
                const std::vector<lpt_ops::ChainStep> *steps = nullptr) {
    if (a.type != 'f' || b.type != 'f') throw Unsupported("a binary op of other than float32 tensors");
    const bool small_first = b.count() > a.count();  // a is the broadcast operand
    const Slot &big = small_first ? b : a, &small = small_first ? a : b;
    out.dims = big.dims;
    out.channels_last = big.transposed();
    void *o = out.allocate(!to ? 'f' : to->is_signed ? 'b' : 'B', big.count());
    // out's values from `first` on = big's from `first` on ∘ small (lpt_ops::binary's arguments)
    auto binary = [&](const float *small_values, int64_t first, int64_t images, int64_t channels, int64_t positions,
                      bool channels_last) {
        const float *big_values = static_cast<const float *>(big.data) + first;
        if (steps) {
            std::vector<lpt_ops::ChainStep> from_first(*steps);
            for (auto &step : from_first) {
                if (step.upsampled) step.offset += first;
                else step.operand += first;
            }
            lpt_ops::chain(op, big_values, small_values, small_first, images, channels, positions, channels_last,
                           from_first, to, static_cast<char *>(o) + first * (to ? 1 : sizeof(float)), program.threads);
        } else if (to) {
            lpt_ops::binary_quantized(op, big_values, small_values, small_first, images, channels, positions,
                                      channels_last, *to, static_cast<char *>(o) + first, program.threads);
        } else {
            lpt_ops::binary(op, big_values, small_values, small_first, images, channels, positions, channels_last,
                            static_cast<float *>(o) + first, program.threads);
        }
    };
    const float *values = static_cast<const float *>(small.data);
    if (big.dims == small.dims) {
        if (small.transposed() != big.transposed()) {  // in big's layout
            unsigned char *order = program.scratch.get(small.count() * sizeof(float));
            if (big.transposed()) small.channels_last_into(order, program.threads);
            else small.channels_first_into(order, program.threads);
            values = reinterpret_cast<const float *>(order);
        }
        binary(values, 0, 1, 0, big.count(), false);
    } else if (small.count() == 1 && small.dims.size() <= big.dims.size()) {
        binary(values, 0, 1, -1, big.count(), false);
    } else if (small.dims.size() == big.dims.size() && small.dims.back() == 1 && !big.transposed() &&
               std::equal(small.dims.begin(), small.dims.end() - 1, big.dims.begin())) {
        // one value per row, [..., 1] over [..., n]: a written-out LayerNorm's mean
        const int64_t n = big.dims.back();
        binary(values, 0, 1, n ? big.count() / n : 0, n, false);
    } else if (repeats(small.dims, big.dims) && !big.transposed() && !small.transposed()) {
        // small once per leading index of big ([1, T, C] over [N, T, C]: a position embedding)
        const int64_t times = big.count() / small.count();
        for (int64_t t = 0; t < times; ++t) binary(values, t * small.count(), 1, 0, small.count(), false);
    } else {
        // one value per image and channel, [N, C, 1, ...], over [N, C, *spatial] (a squeeze-excite's
        // scale), or per channel, [1, C, 1, ...], for every image (a bias after the layer's views)
        if (big.dims.size() < 3 || small.dims.size() != big.dims.size() ||
            (small.dims[0] != big.dims[0] && small.dims[0] != 1) || small.dims[1] != big.dims[1] ||
            small.positions() != 1)
            throw Unsupported("a binary op that broadcasts other than one value, or one per channel");
        const int64_t images = big.dims[0], channels = big.dims[1], positions = big.positions();
        if (small.dims[0] == images)
            binary(values, 0, images, channels, positions, big.transposed());
        else
            for (int64_t n = 0; n < images; ++n)
                binary(values, n * channels * positions, 1, channels, positions, big.transposed());
    }
}

// A chain (fold_binaries): in one pass where each later op's operand has the shape and layout of the first
// op's bigger operand (and so of the chain's values), else its ops one after the other through temporaries.
void run_chain(Program &program, const Instruction &ins, Slot &out) {
    const std::vector<Slot> &slots = program.slots;
    const Slot &a = slots[ins.in[0]], &b = slots[ins.in[1]];
    const Slot &big = b.count() > a.count() ? b : a;
    const lpt_ops::QuantizeTo *to = ins.quantized ? &ins.quantize_to : nullptr;
    // An operand whose upsampling fold_upsamplings took is read from its source where it lies as the chain's
    // values do and upsamples to their shape; one after the other, the ops read it upsampled here.
    const auto upsampled_dims = [&](size_t k, const Slot &v) {
        const int64_t up_h = ins.upsampling[k].first, up_w = ins.upsampling[k].second;
        if (v.dims.size() != 4) throw Unsupported("a nearest upsampling of other than [N, C, H, W]");
        return memory::dims{v.dims[0], v.dims[1], v.dims[2] * up_h, v.dims[3] * up_w};
    };
    const auto is_upsampled = [&](size_t k) { return ins.upsampling[k] != std::pair<int64_t, int64_t>(1, 1); };
    bool together = true;
    for (size_t k = 0; k < ins.chain.size(); ++k) {
        const Slot &v = slots[ins.in[k + 2]];
        together = together && v.type == 'f' && v.transposed() == big.transposed() &&
                   (is_upsampled(k) ? upsampled_dims(k, v) == big.dims : v.dims == big.dims);
    }
    if (together) {
        std::vector<lpt_ops::ChainStep> steps;
        for (size_t k = 0; k < ins.chain.size(); ++k) {
            const Slot &v = slots[ins.in[k + 2]];
            lpt_ops::ChainStep step{ins.chain[k].first, ins.chain[k].second, static_cast<const float *>(v.data)};
            if (is_upsampled(k)) {
                step.upsampled = true, step.channels_last = v.transposed();
                step.up_h = ins.upsampling[k].first, step.up_w = ins.upsampling[k].second;
                step.channels = big.dims[1], step.height = big.dims[2], step.width = big.dims[3];
            }
            steps.push_back(step);
        }
        run_binary(program, ins.op, a, b, to, out, &steps);
        return;
    }
    std::vector<Slot> upsampled(ins.chain.size());
    std::vector<const Slot *> operands(ins.chain.size());
    for (size_t k = 0; k < ins.chain.size(); ++k) {
        const Slot &v = slots[ins.in[k + 2]];
        operands[k] = &v;
        if (!is_upsampled(k)) continue;
        Slot &u = upsampled[k];
        u.pool = &program.pool;
        u.dims = upsampled_dims(k, v);
        u.channels_last = v.transposed();
        lpt_ops::upsample_nearest(v.data, v.item(), v.dims[0], v.dims[1], v.dims[2], v.dims[3], ins.upsampling[k].first,
                                  ins.upsampling[k].second, u.channels_last, u.allocate(v.type, u.count()),
                                  program.threads);
        operands[k] = &u;
    }
    Slot value[2];
    value[0].pool = value[1].pool = &program.pool;
    run_binary(program, ins.op, a, b, nullptr, value[0]);
    for (size_t k = 0; k < ins.chain.size(); ++k) {
        const Slot &v = *operands[k], &so_far = value[k % 2];
        const bool last = k + 1 == ins.chain.size();
        Slot &into = last ? out : value[(k + 1) % 2];
        if (ins.chain[k].second) run_binary(program, ins.chain[k].first, v, so_far, last ? to : nullptr, into);
        else run_binary(program, ins.chain[k].first, so_far, v, last ? to : nullptr, into);
    }
    value[0].release();
    value[1].release();
    for (Slot &u : upsampled) u.release();
}

// A concatenation along an axis other than the channels: each part channels-first, then for each index of
// the axes before `axis`, each part's values from there on in turn.
void concatenate_along(Program &program, const Instruction &ins, Slot &out) {
    const Slot &a = program.slots[ins.in[0]];
    const size_t axis = (size_t)ins.axis;
    if (axis >= a.dims.size()) throw Unsupported("a concatenation along an axis past the rank");
    int64_t extent = 0;
    for (int slot : ins.in) {
        const Slot &part = program.slots[slot];
        for (size_t d = 0; d < a.dims.size(); ++d)
            if (part.type != a.type || part.dims.size() != a.dims.size() || (d != axis && part.dims[d] != a.dims[d]))
                throw Unsupported("a concatenation of other than one type and shape but for its axis");
        extent += part.dims[axis];
    }
    out.dims = a.dims;
    out.dims[axis] = extent;
    const int64_t item = a.item();
    int64_t outer = 1, inner = item;  // the indices before the axis, and the bytes of one index of it onwards
    for (size_t d = 0; d < axis; ++d) outer *= a.dims[d];
    for (size_t d = axis + 1; d < a.dims.size(); ++d) inner *= a.dims[d];
    const int64_t row = extent * inner;
    char *o = static_cast<char *>(out.allocate(a.type, out.count()));
    std::vector<std::vector<char>> reordered;  // parts that lie channels-last, channels-first
    std::vector<std::pair<const char *, int64_t>> parts;  // values, bytes per index before the axis
    for (int slot : ins.in) {
        const Slot &part = program.slots[slot];
        const char *values = static_cast<const char *>(part.data);
        if (part.transposed()) {
            reordered.emplace_back((size_t)(part.count() * item));
            part.channels_first_into(reordered.back().data(), program.threads);
            values = reordered.back().data();
        }
        parts.emplace_back(values, part.dims[axis] * inner);
    }
    // each block of rows from every part in turn, while the block's output lines are in cache
    constexpr int64_t block = 256;
    lpt_parallel::for_each(outer * row >= PARALLEL_WORK ? program.threads : 1, (outer + block - 1) / block, [&](int64_t b) {
        const int64_t first = b * block, count = std::min(block, outer - first);
        int64_t offset = 0;
        for (const auto &[values, width] : parts) {
            copy_runs(o + first * row + offset, row, values + first * width, width, width, count);
            offset += width;
        }
    });
}

// A dense instruction's product as lpt_ops::dense takes it: its source channels-first, how its rows lie in it,
// and its output, whose shape dense_call sets and whose memory it allocates (on the program's thread: the slots'
// pool is the program's). `framed`: each row is a frame of the source, which run_dense copies first, folded or
// not, on whichever thread runs it.
struct DenseCall {
    const float *in = nullptr;
    int64_t groups = 1, group_step = 0, rows = 0, row_step = 0, length = 0;
    bool framed = false;
    float *out = nullptr;
};

DenseCall dense_call(const Instruction &ins, const Slot &a, Slot &out, Program &program) {
    if (a.type != 'f') throw Unsupported("a float32 product of integers");
    DenseCall call;
    call.in = static_cast<const float *>(channels_first(a, program));
    call.row_step = ins.depth;
    if (ins.stride == 0) {
        if (a.dims.size() < 2 || a.dims.back() != ins.depth)
            throw Unsupported("a float32 MatMul whose source does not fit its weights");
        out.dims = a.dims;
        out.dims.back() = ins.width;
        call.rows = a.count() / ins.depth;  // the parser refuses a depth of 0
    } else if (ins.frame_channels == 1 && ins.pad_begin == 0 && ins.pad_end == 0 && !ins.fold_sign) {
        if (a.dims.size() != 3 || a.dims[1] != 1 || a.dims[2] < ins.depth)  // an STFT's frames, read where they lie
            throw Unsupported("an STFT's convolution of other than [N, 1, at least its kernel]");
        call.groups = a.dims[0], call.group_step = a.dims[2], call.rows = (a.dims[2] - ins.depth) / ins.stride + 1;
        call.row_step = ins.stride;
        out.dims = {a.dims[0], ins.width, call.rows};
    } else {  // each frame's kernel of samples of every channel, channel by channel, copied into a row
        const int64_t kernel = ins.fold_sign ? ins.fold_kernel : ins.depth / ins.frame_channels;
        if (a.dims.size() != 3 || a.dims[1] != ins.frame_channels || a.dims[2] + ins.pad_begin + ins.pad_end < kernel)
            throw Unsupported("a convolution's source of other than [N, its channels, at least its kernel]");
        call.length = a.dims[2];
        call.groups = a.dims[0], call.rows = (call.length + ins.pad_begin + ins.pad_end - kernel) / ins.stride + 1;
        call.group_step = call.rows * ins.depth;
        call.framed = true;
        out.dims = {a.dims[0], ins.width, call.rows};
    }
    if (ins.frames_first) std::swap(out.dims[1], out.dims[2]);
    call.out = static_cast<float *>(out.allocate('f', out.count()));
    return call;
}

void run_dense(const Instruction &ins, const DenseCall &call, int threads) {
    thread_local Scratch<float> frames;  // a Conv's frames copied into rows
    const float *in = call.in;
    if (call.framed) {
        const int64_t channels = ins.frame_channels, kernel = ins.fold_sign ? ins.fold_kernel : ins.depth / channels;
        const int64_t groups = call.groups, rows = call.rows, group_step = call.group_step, length = call.length;
        float *f = frames.get((size_t)(groups * group_step));
        if (ins.fold_sign) {  // f[0] = x[0], f[n] = x[n] ± x[k − n], f[k / 2] = x[k / 2] (k even)
            const int64_t half = (kernel - 1) / 2;
            for (int64_t g = 0; g < groups; ++g)
                for (int64_t r = 0; r < rows; ++r) {
                    const float *signal = in + g * length;
                    const int64_t start = r * ins.stride - ins.pad_begin;
                    auto x = [&](int64_t j) { return start + j >= 0 && start + j < length ? signal[start + j] : 0.0f; };
                    float *row = f + g * group_step + r * ins.depth;
                    row[0] = x(0);
                    if (ins.fold_sign > 0)
                        for (int64_t n = 1; n <= half; ++n) row[n] = x(n) + x(kernel - n);
                    else
                        for (int64_t n = 1; n <= half; ++n) row[n] = x(n) - x(kernel - n);
                    if (kernel % 2 == 0) row[kernel / 2] = x(kernel / 2);
                }
        } else {
            for (int64_t g = 0; g < groups; ++g)
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t c = 0; c < channels; ++c) {
                        const float *signal = in + (g * channels + c) * length;
                        float *row = f + g * group_step + r * ins.depth + c * kernel;
                        for (int64_t j = 0, t = r * ins.stride - ins.pad_begin; j < kernel; ++j, ++t)
                            row[j] = t >= 0 && t < length ? signal[t] : 0.0f;
                    }
        }
        in = f;
    }
    lpt_ops::dense(in, call.groups, call.group_step, call.rows, call.row_step, ins.depth, ins.packed.data(), ins.width,
                   ins.bias.empty() ? nullptr : ins.bias.data(), ins.stride > 0 && !ins.frames_first, call.out,
                   threads);
    if (frames.bytes() > KEEP_SCRATCH_BYTES) frames.release();  // a long signal's would stay allocated
}

// Two dense products in a row, the second not reading the first (an STFT's real and imaginary parts), each too
// small to split between threads (lpt_ops::DENSE_PARALLEL_WORK): one on each thread at once. oww_melspectrogram's
// two 5 × 257 × 257 products took 4.1-4.6 µs each one after the other. False (nothing done) where they do not
// qualify; larger ones run one after the other, each on the program's threads.
bool denses_at_once(Program &program, const Instruction &first, const Instruction &second) {
    if (program.threads < 2 || first.code != Code::dense || second.code != Code::dense ||
        std::count(second.in.begin(), second.in.end(), first.out))
        return false;
    const Slot &a = program.slots[first.in[0]], &b = program.slots[second.in[0]];
    if (a.transposed() || b.transposed()) return false;  // channels_first would give both the program's one scratch
    Slot &x = program.slots[first.out], &y = program.slots[second.out];
    x.channels_last = y.channels_last = false;
    const DenseCall calls[2] = {dense_call(first, a, x, program), dense_call(second, b, y, program)};
    const Instruction *const both[2] = {&first, &second};
    const auto small = [&](int k) {
        return calls[k].groups * calls[k].rows * both[k]->depth * both[k]->width < lpt_ops::DENSE_PARALLEL_WORK;
    };
    if (small(0) && small(1)) {
        lpt_parallel::for_each(2, 2, [=](int64_t k) { run_dense(*both[k], calls[k], 1); });
    } else {
        for (int k = 0; k < 2; ++k) run_dense(*both[k], calls[k], program.threads);
    }
    return true;
}

void step(Program &program, const Instruction &ins) {
    if (ins.code == Code::folded) return;
    std::vector<Slot> &slots = program.slots;
    Slot &out = slots[ins.out];
    const Slot &a = slots[ins.in[0]];
    out.channels_last = false;
    switch (ins.code) {
        case Code::layer: run_layer(ins, a, out, program.scratch); break;
        case Code::dynamic_layer: run_dynamic_layer(program, ins, a, out); break;
        case Code::upsample: run_upsampling(program, ins, a, out); break;
        case Code::quantize: {
            if (a.type != 'f') throw Unsupported("a quantize reads integers");
            out.dims = a.dims;
            out.channels_last = a.channels_last;
            void *o = out.allocate(ins.signed_out ? 'b' : 'B', a.count());
            lpt_ops::quantize(static_cast<const float *>(a.data), a.count(), ins.scale, ins.zero_point, ins.qmin,
                              ins.qmax, o, ins.signed_out, program.threads);
            break;
        }
        case Code::max_pool: {
            if ((!a.eight_bit() && a.type != 'f') || a.dims.size() != 4)
                throw Unsupported("max pool on other than 8-bit or float32 [N, C, H, W]");
            const int64_t h = a.dims[2], w = a.dims[3];
            out.dims = {a.dims[0], a.dims[1], ins.pool.out_h(h), ins.pool.out_w(w)};
            void *o = out.allocate(a.type, out.count());
            out.channels_last = a.transposed();
            if (out.channels_last)
                lpt_ops::max_pool_channels_last(a.data, a.type, a.dims[0], a.dims[1], h, w, ins.pool, o,
                                                program.threads);
            else
                lpt_ops::max_pool(a.data, a.type, a.dims[0] * a.dims[1], h, w, ins.pool, o, program.threads);
            break;
        }
        case Code::resize_nearest: {  // ins.shape: (kh, kw)
            if (a.dims.size() != 4) throw Unsupported("a nearest upsampling of other than [N, C, H, W]");
            const int64_t h = a.dims[2], w = a.dims[3], kh = ins.shape[0], kw = ins.shape[1];
            out.dims = {a.dims[0], a.dims[1], h * kh, w * kw};
            out.channels_last = a.transposed();
            void *o = out.allocate(a.type, out.count());
            lpt_ops::upsample_nearest(a.data, a.item(), a.dims[0], a.dims[1], h, w, kh, kw, out.channels_last, o,
                                      program.threads);
            break;
        }
        case Code::join: {
            const Slot &b = slots[ins.in[1]];
            if (!a.eight_bit() || !b.eight_bit() || a.dims != b.dims) throw Unsupported("a join of other than equal 8-bit shapes");
            out.dims = a.dims;
            out.channels_last = a.transposed();
            const void *b_data = b.data;  // b in a's layout
            if (b.transposed() != a.transposed()) {
                unsigned char *order = program.scratch.get(b.count());
                if (a.transposed()) b.channels_last_into(order, program.threads);
                else b.channels_first_into(order, program.threads);
                b_data = order;
            }
            void *o = out.allocate(ins.to.type, a.count());
            lpt_ops::join(a.data, a.type == 'b', b_data, b.type == 'b', a.count(), ins.multiply, ins.a_shift,
                          ins.a_scale, ins.b_shift, ins.b_scale, ins.relu, ins.to, o, program.threads);
            break;
        }
        case Code::product: {
            const Slot &b = slots[ins.in[1]];
            const size_t r = a.dims.size();
            if (!a.eight_bit() || !b.eight_bit() || r < 2 || b.dims.size() != r)
                throw Unsupported("a product of other than two 8-bit tensors of one rank");
            if (!std::equal(a.dims.begin(), a.dims.end() - 2, b.dims.begin()) || a.dims[r - 1] != b.dims[r - 2])
                throw Unsupported("a product whose operands do not fit without broadcasting");
            int64_t batches = 1;
            for (size_t i = 0; i + 2 < r; ++i) batches *= a.dims[i];
            const uint8_t *a_values = static_cast<const uint8_t *>(a.data), *b_values = static_cast<const uint8_t *>(b.data);
            Scratch<unsigned char> a_order, b_order;  // channels-first values, where a convolution left them not so
            if (a.transposed()) {
                unsigned char *order = a_order.get(a.count());
                a.channels_first_into(order, program.threads);
                a_values = order;
            }
            if (b.transposed()) {
                unsigned char *order = b_order.get(b.count());
                b.channels_first_into(order, program.threads);
                b_values = order;
            }
            out.dims = a.dims;
            out.dims[r - 1] = b.dims[r - 1];
            const Dst dst = ins.product->stage.dst;
            void *o = out.allocate(dst == Dst::f32 ? 'f' : dst == Dst::u8 ? 'B' : 'b', out.count());
            run_product(*ins.product, a_values, a.type == 'b', b_values, b.type == 'b', batches, a.dims[r - 2],
                        a.dims[r - 1], b.dims[r - 1], o);
            break;
        }
        case Code::mean: {
            if (a.type != 'f' || a.dims.size() < 3) throw Unsupported("a mean of other than float32 [N, C, *spatial]");
            out.dims = a.dims;
            for (size_t i = 2; i < out.dims.size(); ++i) out.dims[i] = 1;
            void *o = out.allocate('f', out.count());
            lpt_ops::mean_of_positions(static_cast<const float *>(a.data), a.dims[0], a.dims[1], a.positions(),
                                       a.transposed(), static_cast<float *>(o), program.threads);
            break;
        }
        case Code::average_pool: {
            if (a.type != 'f' || a.dims.size() != 4) throw Unsupported("an average pool of other than float32 [N, C, H, W]");
            const float *in = static_cast<const float *>(a.data);
            const int64_t h = a.dims[2], w = a.dims[3];
            out.dims = {a.dims[0], a.dims[1], ins.pool.out_h(h), ins.pool.out_w(w)};
            float *o = static_cast<float *>(out.allocate('f', out.count()));
            out.channels_last = a.transposed();
            if (out.channels_last)
                lpt_ops::average_pool_channels_last(in, a.dims[0], a.dims[1], h, w, ins.pool, ins.count_include_pad, o,
                                                    program.threads);
            else
                lpt_ops::average_pool(in, a.dims[0] * a.dims[1], h, w, ins.pool, ins.count_include_pad, o,
                                      program.threads);
            break;
        }
        case Code::identity:  // a view of any type, in its layout
            alias(out, a, a.dims, a.channels_last);
            break;
        case Code::squeeze:
        case Code::unsqueeze: {  // ins.shape: the axes, ONNX's (negative ones from the end of the output's rank);
                                 // a squeeze of none: every axis of 1, as ONNX's without axes
            std::vector<int64_t> dims = a.dims, axes;
            if (ins.code == Code::squeeze && ins.shape.empty()) {
                for (size_t i = 0; i < dims.size(); ++i)
                    if (dims[i] == 1) axes.push_back((int64_t)i);
            } else {
                const int64_t rank = (int64_t)dims.size() + (ins.code == Code::unsqueeze ? (int64_t)ins.shape.size() : 0);
                for (auto axis : ins.shape) axes.push_back(axis < 0 ? axis + rank : axis);
                std::sort(axes.begin(), axes.end());
                if (std::adjacent_find(axes.begin(), axes.end()) != axes.end() || (!axes.empty() && (axes[0] < 0 || axes.back() >= rank)))
                    throw Unsupported("a squeeze or unsqueeze axis outside the rank");
                if (ins.ones_only)  // squeeze_ones: an axis longer than 1 stays
                    axes.erase(std::remove_if(axes.begin(), axes.end(), [&](int64_t axis) { return dims[axis] != 1; }),
                               axes.end());
            }
            if (ins.code == Code::unsqueeze) {
                for (auto axis : axes) dims.insert(dims.begin() + axis, 1);
            } else {
                for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
                    if (dims[*it] != 1) throw Unsupported("a squeeze of an axis longer than 1");
                    dims.erase(dims.begin() + *it);
                }
            }
            if (a.transposed() && (axes.empty() || axes[0] >= 2)) {
                // positions of one value, after the channels: the channels-last order is the same (magika's
                // convolution [N, C, T, 1] squeezed to [N, C, T]: copied channels-first, it cost 0.3 ms)
                alias(out, a, std::move(dims), true);
                break;
            }
            view_as(out, a, dims, program.threads);
            break;
        }
        case Code::affine: {
            if (a.type != 'f' || a.dims.size() < 2) throw Unsupported("an affine of other than float32 [N, C, ...]");
            if ((int64_t)ins.gamma.size() != a.dims[1]) throw Unsupported("an affine whose values do not fit the channels");
            out.dims = a.dims;
            out.channels_last = a.transposed();
            lpt_ops::affine(static_cast<const float *>(a.data), ins.gamma.data(), ins.beta.data(), a.dims[0], a.dims[1],
                            a.positions(), a.transposed(), static_cast<float *>(out.allocate('f', a.count())),
                            program.threads);
            break;
        }
        case Code::relu:
        case Code::clip:
        case Code::sigmoid:
        case Code::tanh:
        case Code::hard_swish:
        case Code::hard_sigmoid:
        case Code::sqrt:
        case Code::log:
        case Code::gelu:
        case Code::tanh_gelu:
        case Code::erf: {  // elementwise: either layout
            if (a.type != 'f') throw Unsupported("a float32 elementwise op of integers");
            out.dims = a.dims;
            out.channels_last = a.channels_last;
            const float *in = static_cast<const float *>(a.data);
            float *o = static_cast<float *>(out.allocate('f', a.count()));
            if (ins.code == Code::erf) lpt_ops::erf(in, a.count(), o, program.threads);
            else if (ins.code == Code::gelu) lpt_ops::gelu(in, a.count(), ins.alpha, ins.offset, ins.scale, o, program.threads);
            else if (ins.code == Code::tanh_gelu)
                lpt_ops::tanh_gelu(in, a.count(), ins.cube, ins.root, ins.one, ins.half, o, program.threads);
            else if (ins.code == Code::relu) lpt_ops::relu(in, a.count(), o, program.threads);
            else if (ins.code == Code::sqrt) lpt_ops::square_root(in, a.count(), o, program.threads);
            else if (ins.code == Code::clip) {
                float low = ins.low, high = ins.high;
                size_t next = 1;
                if (ins.low_read) low = one_value(slots[ins.in[next++]], "a clip");
                if (ins.high_read) high = one_value(slots[ins.in[next++]], "a clip");
                lpt_ops::slope_and_clip(in, a.count(), ins.alpha, low, high, o, program.threads);
            }
            else if (ins.code == Code::log) lpt_ops::log(in, a.count(), o, program.threads);
            else if (ins.code == Code::sigmoid) lpt_ops::sigmoid(in, a.count(), o, program.threads);
            else if (ins.code == Code::tanh) lpt_ops::tanh(in, a.count(), o, program.threads);
            else if (ins.code == Code::hard_sigmoid) lpt_ops::hard_sigmoid(in, a.count(), ins.alpha, ins.offset, o, program.threads);
            else lpt_ops::hard_swish(in, a.count(), o, program.threads);
            break;
        }
        case Code::binary: run_binary(program, ins.op, a, slots[ins.in[1]], ins.quantized ? &ins.quantize_to : nullptr, out); break;
        case Code::chain: run_chain(program, ins, out); break;
        case Code::concat: {
            if (ins.axis != 1) {
                concatenate_along(program, ins, out);
                break;
            }
            int64_t channels = 0;  // along the channels
            for (int slot : ins.in) {
                const Slot &part = slots[slot];
                if (part.type != a.type || part.dims.size() != a.dims.size() || part.dims.size() < 2 ||
                    part.dims[0] != a.dims[0] || !std::equal(part.dims.begin() + 2, part.dims.end(), a.dims.begin() + 2))
                    throw Unsupported("a concatenation of other than one type and shape but for the channels");
                channels += part.dims[1];
            }
            out.dims = a.dims;
            out.dims[1] = channels;
            const int64_t images = a.dims[0], item = a.item(), plane = a.positions() * item;
            char *o = static_cast<char *>(out.allocate(a.type, out.count()));
            const bool any_channels_last = std::any_of(ins.in.begin(), ins.in.end(),
                                                       [&](int slot) { return slots[slot].transposed(); });
            if (any_channels_last && out.dims.size() > 2 && a.positions() > 1) {
                // Kept channels-last, as the convolutions that make and read it lay their tensors: each
                // position's channels from each part in turn. Made channels-first, one Concat of the
                // PaddleOCR detector cost 15.8 ms in transposes (and its reader a transpose back).
                out.channels_last = true;
                const int64_t rows = images * a.positions(), row_bytes = channels * item, block = 256;
                // Each block of rows from every part in turn, while the block's output lines are in the
                // core's cache: part by part, each line was fetched and written once per part (the
                // detector's two 24-channel halves of 320×320, 4.9 MB: 0.52 ms so against 0.34 in
                // OpenVINO). A part channels-first goes channels-last first, into the scratch, by itself.
                std::vector<std::pair<const char *, int64_t>> parts;  // values, bytes per row
                const auto copy_parts = [&](int64_t first_channel) {
                    if (parts.empty()) return;
                    const std::vector<std::pair<const char *, int64_t>> from = parts;
                    lpt_parallel::for_each(rows * row_bytes >= PARALLEL_WORK ? program.threads : 1,
                                           (rows + block - 1) / block, [=](int64_t b) {
                        const int64_t first = b * block, count = std::min(block, rows - first);
                        int64_t start = first_channel * item;
                        for (const auto &[values, width] : from) {
                            copy_runs(o + first * row_bytes + start, row_bytes, values + first * width, width, width, count);
                            start += width;
                        }
                    });
                };
                int64_t offset = 0, parts_offset = 0;  // channels before the part's, before `parts`'
                for (int slot : ins.in) {
                    const Slot &part = slots[slot];
                    const int64_t width = part.dims[1] * item;
                    if (!part.channels_last && part.dims[1] > 1) {
                        copy_parts(parts_offset);
                        unsigned char *order = program.scratch.get(part.count() * item);
                        part.channels_last_into(order, program.threads);
                        parts = {{reinterpret_cast<const char *>(order), width}};
                        copy_parts(offset);
                        parts.clear();
                        parts_offset = offset + part.dims[1];
                    } else {
                        parts.emplace_back(static_cast<const char *>(part.data), width);
                    }
                    offset += part.dims[1];
                }
                copy_parts(parts_offset);
                break;
            }
            int64_t offset = 0;  // bytes into each output image
            for (int slot : ins.in) {
                const Slot &part = slots[slot];
                const char *values = static_cast<const char *>(part.data);
                if (part.transposed()) {
                    unsigned char *order = program.scratch.get(part.count() * item);
                    part.channels_first_into(order, program.threads);
                    values = reinterpret_cast<const char *>(order);
                }
                const int64_t bytes = part.dims[1] * plane;
                for (int64_t n = 0; n < images; ++n)
                    std::memcpy(o + n * channels * plane + offset, values + n * bytes, bytes);
                offset += bytes;
            }
            break;
        }
        case Code::reshape: {
            std::vector<int64_t> target = ins.shape;
            if (ins.shape_read) {
                const Slot &shape = slots[ins.in[1]];
                if (shape.type != 'q' || shape.dims.size() != 1) throw Unsupported("a reshape to other than int64 [rank]");
                target.assign(static_cast<const int64_t *>(shape.data), static_cast<const int64_t *>(shape.data) + shape.count());
            }
            std::vector<int64_t> dims;
            int64_t known = 1, inferred = -1;
            for (size_t i = 0; i < target.size(); ++i) {
                int64_t d = target[i];
                if (d == 0 && !ins.allow_zero) {
                    if (i >= a.dims.size()) throw Unsupported("a reshape that copies a dimension past the rank");
                    d = a.dims[i];
                }
                if (d < -1 || (d == -1 && inferred >= 0)) throw Unsupported("a reshape to no shape (ONNX's: one −1 at most)");
                if (d == -1) inferred = (int64_t)i;
                else known *= d;
                dims.push_back(d);
            }
            if (inferred >= 0) {
                if (known == 0 || a.count() % known) throw Unsupported("a reshape whose −1 has no whole size");
                dims[inferred] = a.count() / known;
            } else if (known != a.count()) {
                throw Unsupported("a reshape to another number of values");
            }
            view_as(out, a, dims, program.threads);  // reshaped in the channels-first order
            break;
        }
        case Code::transpose: {
            const size_t rank = a.dims.size();
            if (ins.shape.size() != rank) throw Unsupported("a transpose whose perm does not fit the rank");
            std::vector<int64_t> dims(rank);
            for (size_t i = 0; i < rank; ++i) dims[i] = a.dims[ins.shape[i]];
            bool channels_to_last = a.transposed() && ins.shape[0] == 0 && ins.shape[rank - 1] == 1;
            for (size_t i = 1; i + 1 < rank; ++i) channels_to_last = channels_to_last && ins.shape[i] == (int64_t)i + 1;
            if (channels_to_last) {  // [N, C, *spatial] lying channels-last, to [N, *spatial, C]: a view of it
                alias(out, a, std::move(dims), false);
                break;
            }
            if (ins.into_convolutions && lies_channels_last(a, ins.shape)) {
                // channels-first values whose channels-last order, transposed, is the order they lie in
                // (a jax2tf [N, T, C, 1] to the [N, C, T, 1] a convolution reads): a view, which the
                // convolution reads channels-last. magika's copy cost 0.2 ms.
                alias(out, a, std::move(dims), true);
                break;
            }
            const unsigned char *in = static_cast<const unsigned char *>(channels_first(a, program));
            std::vector<int64_t> in_strides(rank, 1), step(rank);  // input elements per step of each output axis
            for (size_t i = rank; i-- > 1;) in_strides[i - 1] = in_strides[i] * a.dims[i];
            for (size_t i = 0; i < rank; ++i) step[i] = in_strides[ins.shape[i]];
            out.dims = std::move(dims);
            const int64_t count = a.count();
            unsigned char *o = static_cast<unsigned char *>(out.allocate(a.type, count));
            int64_t images = 0, rows = 0, columns = 0;
            if (rank == 0) std::memcpy(o, in, a.item());
            else if (as_block_transpose(a.dims, ins.shape, images, rows, columns))
                lpt_ops::transpose(in, o, images, rows, columns, a.item(), program.threads);
            else if (count) lpt_ops::permute(in, a.item(), out.dims.data(), step.data(), (int)rank, o);
            break;
        }
        case Code::softmax:
        case Code::layer_norm: {  // along the last axis
            if (a.type != 'f' || a.dims.empty()) throw Unsupported("a softmax or layer norm of other than float32");
            if (ins.code == Code::softmax) check_reduced_shapes(ins, slots, a.dims, a.dims.size() - 1);
            const float *in = static_cast<const float *>(channels_first(a, program));
            const int64_t n = a.dims.back(), rows = n ? a.count() / n : 0;
            out.dims = a.dims;
            float *o = static_cast<float *>(out.allocate('f', a.count()));
            if (ins.code == Code::softmax) {
                lpt_ops::softmax(in, rows, n, o, program.threads);
            } else {
                if ((int64_t)ins.gamma.size() != n || (!ins.beta.empty() && (int64_t)ins.beta.size() != n))
                    throw Unsupported("a layer norm whose scale or bias does not fit its last axis");
                lpt_ops::layer_norm(in, rows, n, ins.gamma.data(), ins.beta.empty() ? nullptr : ins.beta.data(),
                                    ins.epsilon, o, program.threads);
            }
            break;
        }
        case Code::moment_layer_norm: {  // over axis 1 of [N, C, T] or [N, C]
            if (a.type != 'f' || a.dims.size() < 2 || a.dims.size() > 3 || a.dims[1] != (int64_t)ins.gamma.size())
                throw Unsupported("a layer norm over axis 1 of other than float32 [N, C, T] or [N, C] of its channels");
            check_reduced_shapes(ins, slots, a.dims, 1);
            const float *in = static_cast<const float *>(channels_first(a, program));
            out.dims = a.dims;
            float *o = static_cast<float *>(out.allocate('f', a.count()));
            lpt_ops::moment_layer_norm(in, a.dims[0], a.dims[1], a.dims.size() == 3 ? a.dims[2] : 1, ins.factor,
                                       ins.epsilon, ins.gamma.data(), ins.beta.data(), o, program.threads);
            break;
        }
        case Code::one_hot: {  // integers v [..., 1] → levels [..., K] (lpt.kernels.one_hot_levels)
            if ((a.type != 'i' && a.type != 'q') || a.dims.empty() || a.dims.back() != 1 || a.transposed())
                throw Unsupported("a one-hot of other than integers [..., 1]");
            if (ins.in.size() == 2) {  // its Expand's shape, here only v's own written out (the step broadcasts)
                const Slot &shape = slots[ins.in[1]];
                if (shape.type != 'q' || shape.count() != (int64_t)a.dims.size() ||
                    !std::equal(a.dims.begin(), a.dims.end(), static_cast<const int64_t *>(shape.data)))
                    throw Unsupported("a one-hot whose Expand is given another shape than its integers'");
            }
            const int64_t k = (int64_t)ins.values.size();
            out.dims = a.dims;
            out.dims.back() = k;
            void *o = out.allocate(ins.signed_out ? 'b' : 'B', a.count() * k);
            lpt_ops::one_hot(a.data, a.type == 'q', a.count(), ins.values.data(), k, ins.low_level, ins.high_level,
                             static_cast<uint8_t *>(o), program.threads);
            break;
        }
        case Code::mean_axis_1:
            if (a.dims.size() == 3) {  // [N, T, C] → [N, C] or [N, 1, C]: C channels-last over T positions
                if (a.type != 'f' || a.transposed()) throw Unsupported("a mean over axis 1 of other than float32 [N, T, C]");
                out.dims = ins.keepdims ? std::vector<int64_t>{a.dims[0], 1, a.dims[2]} : std::vector<int64_t>{a.dims[0], a.dims[2]};
                lpt_ops::mean_of_positions(static_cast<const float *>(a.data), a.dims[0], a.dims[2], a.dims[1], true,
                                           static_cast<float *>(out.allocate('f', out.count())), program.threads);
                break;
            }
            // axis 1 of [N, T] is the last (a rank the graph did not give: after an If that squeezes where an axis is 1)
            if (a.dims.size() != 2) throw Unsupported("a mean over axis 1 of other than float32 [N, T, C] or [N, T]");
            [[fallthrough]];
        case Code::mean_last_axis: {
            if (a.type != 'f' || a.dims.empty() || a.dims.back() == 0) throw Unsupported("a mean of other than float32 rows");
            const float *in = static_cast<const float *>(channels_first(a, program));
            const int64_t n = a.dims.back();
            out.dims = a.dims;
            if (ins.keepdims) out.dims.back() = 1;
            else out.dims.pop_back();
            lpt_ops::mean_of_rows(in, a.count() / n, n, static_cast<float *>(out.allocate('f', a.count() / n)),
                                  program.threads);
            break;
        }
        case Code::global_max: {  // [N, C, *spatial] → [N, C, 1, …]: each channel's maximum over its positions
            if (a.type != 'f' || a.dims.size() < 3) throw Unsupported("a global max pool of other than float32 [N, C, *spatial]");
            const float *lying = static_cast<const float *>(a.data);  // channels-last, as the fold reads them
            if (!a.transposed() && a.dims[1] > 1) {
                float *order = reinterpret_cast<float *>(program.scratch.get(a.count() * sizeof(float)));
                a.channels_last_into(order, program.threads);
                lying = order;
            }
            out.dims = a.dims;
            std::fill(out.dims.begin() + 2, out.dims.end(), 1);
            lpt_ops::extreme_of_positions(lying, a.dims[0], a.positions(), a.dims[1], false,
                                          static_cast<float *>(out.allocate('f', out.count())), program.threads);
            break;
        }
        case Code::extreme_middle: {  // [N, *middle, C] → [N, C] or [N, 1, …, 1, C]: each channel over the middle positions
            if (a.type != 'f' || a.dims.size() < 3 || a.transposed())
                throw Unsupported("a max or min over the middle axes of other than float32 [N, *middle, C]");
            const int64_t images = a.dims[0], channels = a.dims.back();
            int64_t middle = 1;
            for (size_t i = 1; i + 1 < a.dims.size(); ++i) middle *= a.dims[i];
            out.dims.assign(ins.keepdims ? a.dims.size() : 2, 1);
            out.dims.front() = images;
            out.dims.back() = channels;
            lpt_ops::extreme_of_positions(static_cast<const float *>(a.data), images, middle, channels, ins.smallest,
                                          static_cast<float *>(out.allocate('f', images * channels)), program.threads);
            break;
        }
        case Code::extreme_all: {  // every value: [] or [1, …, 1] with keepdims
            if (a.type != 'f') throw Unsupported("a max or min of other than float32 values");
            out.dims.assign(ins.keepdims ? a.dims.size() : 0, 1);
            lpt_ops::extreme_of_all(static_cast<const float *>(channels_first(a, program)), a.count(), ins.smallest,
                                    static_cast<float *>(out.allocate('f', 1)));
            break;
        }
        case Code::slice: {  // ins.shape: starts, ends, axes and steps, one quarter each, as ONNX's Slice
            const int64_t rank = (int64_t)a.dims.size(), n = (int64_t)ins.shape.size() / 4;
            if (a.type != 'f' && !a.eight_bit()) throw Unsupported("a slice of other than float32 or 8-bit values");
            std::vector<int64_t> first(rank, 0), step(rank, 1);
            out.dims = a.dims;
            for (int64_t i = 0; i < n; ++i) {
                const int64_t axis = ins.shape[2 * n + i] < 0 ? ins.shape[2 * n + i] + rank : ins.shape[2 * n + i];
                if (axis < 0 || axis >= rank) throw Unsupported("a slice's axis past the input's rank");
                const SliceRange range = slice_range(a.dims[axis], ins.shape[i], ins.shape[n + i], ins.shape[3 * n + i]);
                first[axis] = range.first;
                step[axis] = ins.shape[3 * n + i];
                out.dims[axis] = range.count;
            }
            std::vector<int64_t> kept = out.dims;  // the output's dims without the dropped axes
            if (ins.drop_axes) {
                std::vector<bool> dropped(rank, false);
                for (int64_t i = 0; i < n; ++i) {
                    const int64_t axis = ins.shape[2 * n + i] < 0 ? ins.shape[2 * n + i] + rank : ins.shape[2 * n + i];
                    if (out.dims[axis] != 1) throw Unsupported("a gather's index outside its axis");
                    dropped[axis] = true;
                }
                kept.clear();
                for (int64_t i = 0; i < rank; ++i)
                    if (!dropped[i]) kept.push_back(out.dims[i]);
            }
            // every value, in order (magika's after its convolution); dropping an axis of values lying
            // channels-last would move the channels' axis: those are copied channels-first below
            if (out.dims == a.dims && std::all_of(step.begin(), step.end(), [](int64_t s) { return s == 1; }) &&
                !(ins.drop_axes && a.transposed())) {
                alias(out, a, kept, a.channels_last);
                break;
            }
            const unsigned char *in = static_cast<const unsigned char *>(channels_first(a, program));
            std::vector<int64_t> stride(rank, 1);  // input elements per step of each output axis
            for (int64_t i = rank - 1; i > 0; --i) stride[i - 1] = stride[i] * a.dims[i];
            int64_t offset = 0;
            for (int64_t i = 0; i < rank; ++i) {
                offset += first[i] * stride[i];
                stride[i] *= step[i];
            }
            unsigned char *o = static_cast<unsigned char *>(out.allocate(a.type, out.count()));
            if (rank == 0) std::memcpy(o, in, a.item());
            else if (out.count()) lpt_ops::permute(in + offset * a.item(), a.item(), out.dims.data(), stride.data(), (int)rank, o);
            out.dims = kept;
            break;
        }
        case Code::pad: {  // a copy of the values (channels-first) inside a border of ins.fill, or of their mirror
            const size_t rank = a.dims.size();
            if (ins.shape.size() != 2 * rank || rank == 0) throw Unsupported("a pad whose pads do not fit the rank");
            if (a.type != 'f' && !a.eight_bit()) throw Unsupported("a pad of other than float32 or 8-bit values");
            for (size_t i = 0; i < rank && ins.reflect; ++i)  // each border mirrors values of the axis, its edge once
                if (ins.shape[i] >= a.dims[i] || ins.shape[rank + i] >= a.dims[i])
                    if (ins.shape[i] || ins.shape[rank + i]) throw Unsupported("a reflection as wide as its axis");
            // where index `at` of an axis of n values reads from: the border the value at the mirrored index
            const auto mirrored = [&](int64_t at, int64_t n) { return at < 0 ? -at : at >= n ? 2 * (n - 1) - at : at; };
            const unsigned char *in = static_cast<const unsigned char *>(channels_first(a, program));
            out.dims = a.dims;
            for (size_t i = 0; i < rank; ++i) out.dims[i] += ins.shape[i] + ins.shape[rank + i];
            const int item = a.item();
            unsigned char *o = static_cast<unsigned char *>(out.allocate(a.type, out.count()));
            unsigned char fill[4];  // the border's value in the values' type
            if (a.type == 'f') std::memcpy(fill, &ins.fill, 4);
            else if (a.type == 'B') fill[0] = (unsigned char)(uint8_t)ins.fill;
            else fill[0] = (unsigned char)(int8_t)ins.fill;
            // Axes after the last padded one are copied whole with each value of it: a Keras ZeroPadding2D
            // of [1, 76, 32, 1] is 76 rows of 32 one-byte values so, not 2 584 rows of one (31 µs before).
            size_t axes = rank;
            int64_t inner = 1;
            while (axes > 1 && ins.shape[axes - 1] == 0 && ins.shape[rank + axes - 1] == 0) inner *= a.dims[--axes];
            const int64_t width = a.dims[axes - 1] * inner, out_width = out.dims[axes - 1] * inner;
            const int64_t rows = out.count() / std::max<int64_t>(1, out_width);
            std::vector<int64_t> index(axes, 0);  // the output row's index on each axis but the last
            for (int64_t row = 0; row < rows && out_width; ++row) {
                unsigned char *to = o + row * out_width * item;
                int64_t source = 0;  // the source row, or −1 where the output row lies in the border
                for (size_t i = 0; i + 1 < axes && source >= 0; ++i) {
                    const int64_t at = ins.reflect ? mirrored(index[i] - ins.shape[i], a.dims[i]) : index[i] - ins.shape[i];
                    source = at < 0 || at >= a.dims[i] ? -1 : source * a.dims[i] + at;
                }
                const int64_t before = ins.shape[axes - 1] * inner;
                if (ins.reflect) {  // the row whole, then the borders of the last padded axis in units of `inner` values
                    const unsigned char *from = in + source * width * item;
                    const int64_t lead = ins.shape[axes - 1], n = a.dims[axes - 1], unit = inner * item;
                    if (width) std::memcpy(to + before * item, from, width * item);
                    for (int64_t u = 0; u < lead; ++u) std::memcpy(to + u * unit, from + mirrored(u - lead, n) * unit, unit);
                    for (int64_t u = lead + n; u < out.dims[axes - 1]; ++u)
                        std::memcpy(to + u * unit, from + mirrored(u - lead, n) * unit, unit);
                } else {
                    for (int64_t x = 0; x < out_width; ++x)
                        if (source < 0 || x < before || x >= before + width) std::memcpy(to + x * item, fill, item);
                    if (source >= 0 && width) std::memcpy(to + before * item, in + source * width * item, width * item);
                }
                for (size_t i = axes - 1; i-- > 0;) {  // the next output row
                    if (++index[i] < out.dims[i]) break;
                    index[i] = 0;
                }
            }
            break;
        }
        case Code::gather: {  // rows of the table by int32/int64 index, negative ones from the end
            if (a.type != 'q' && a.type != 'i') throw Unsupported("a gather by other than int32 or int64 indices");
            const int64_t rows = ins.shape[0], width = rows ? (int64_t)ins.table.size() / rows : 0;
            out.dims = a.dims;
            out.dims.insert(out.dims.end(), ins.shape.begin() + 1, ins.shape.end());
            float *o = static_cast<float *>(out.allocate('f', out.count()));
            for (int64_t i = 0; i < a.count(); ++i) {
                int64_t index = a.type == 'q' ? static_cast<const int64_t *>(a.data)[i] : static_cast<const int32_t *>(a.data)[i];
                if (index < -rows || index >= rows) throw Unsupported("a gather index outside the table");
                if (index < 0) index += rows;
                std::memcpy(o + i * width, ins.table.data() + index * width, width * sizeof(float));
            }
            break;
        }
        case Code::dense:  // a MatMul [..., m, depth] × [depth, width], or a Conv's frames of [images, 1, length]
            run_dense(ins, dense_call(ins, a, out, program), program.threads);
            break;
        case Code::flatten: {
            const int64_t axis = ins.axis < 0 ? ins.axis + (int64_t)a.dims.size() : ins.axis;
            if (axis < 0 || axis > (int64_t)a.dims.size()) throw Unsupported("a flatten axis outside the rank");
            int64_t outer = 1;
            for (int64_t i = 0; i < axis; ++i) outer *= a.dims[i];
            view_as(out, a, {outer, outer ? a.count() / outer : 0}, program.threads);  // the channels-first order
            break;
        }
    }
}

// How many times each slot is read: by each instruction (but a folded one, whose reads are the chain's that took
// it, where `skip_folded`), and once more where it is a program output (its caller reads it).
std::vector<int> slot_reads(const Program &program, bool skip_folded) {
    std::vector<int> reads(program.slots.size(), 0);
    for (const Instruction &ins : program.code)
        if (!skip_folded || ins.code != Code::folded)
            for (int slot : ins.in) ++reads[slot];
    for (int slot : program.outputs) ++reads[slot];
    return reads;
}

// A binary op whose float32 result only the quantize right after it reads writes that quantize's 8-bit output
// itself, and the quantize does nothing (Code::folded): the float32 tensor between them is never written
// nor read again. PaddleOCR's detector has ten: residual and pyramid Adds' sums, quantized for the next layer.
// A binary op whose result only a binary op after it reads (directly or through identity views, which then
// do nothing) becomes that op's first (Code::chain, run_chain): the reader computes both in one pass, and the
// float32 tensor between them is never written. A chain can take a next op in turn. PaddleOCR's detector
// ends its pyramid with y + y·s + up(r) over 96 × 160 × 160: a multiply and two adds, each a pass over
// 9.8 MB tensors (0.59, 0.66 and 0.55 ms on a Xeon with AMX, 2 threads, memory-bound), one pass of 1.12 ms so.
void fold_binaries(Program &program) {
    std::vector<Instruction> &code = program.code;
    const std::vector<int> reads = slot_reads(program, false);
    std::vector<int> producer(program.slots.size(), -1);
    for (size_t i = 0; i < code.size(); ++i) producer[code[i].out] = (int)i;
    for (Instruction &reader : code) {
        if (reader.code != Code::binary) continue;
        for (int side = 0; side < 2; ++side) {
            int slot = reader.in[side], at = producer[slot];
            std::vector<int> views;
            while (at >= 0 && code[at].code == Code::identity && reads[slot] == 1) {
                views.push_back(at);
                slot = code[at].in[0];
                at = producer[slot];
            }
            if (at < 0 || reads[slot] != 1 || (code[at].code != Code::binary && code[at].code != Code::chain))
                continue;
            Instruction &first = code[at];
            Instruction chained;
            chained.code = Code::chain;
            chained.op = first.op;
            chained.in = first.in;
            chained.chain = first.chain;
            chained.upsampling = first.upsampling;
            chained.in.push_back(reader.in[1 - side]);
            chained.chain.emplace_back(reader.op, side == 1);
            chained.upsampling.emplace_back(1, 1);
            chained.out = reader.out;
            reader = std::move(chained);
            first.code = Code::folded;
            for (int view : views) code[view].code = Code::folded;
            break;
        }
    }
}

// A nearest upsampling whose output only a chain's later op reads (directly or through identity views) is read
// by that op from its source (run_chain): the upsampled tensor is never written. PaddleOCR's detector ends its
// pyramid with y + y·s + up(r), r 96 × 80 × 80 upsampled to 160 × 160: 0.46-0.56 ms for the upsampling on a
// Xeon with AMX (2 threads), which wrote 9.8 MB that the chain then read.
void fold_upsamplings(Program &program) {
    std::vector<Instruction> &code = program.code;
    const std::vector<int> reads = slot_reads(program, true);
    std::vector<int> producer(program.slots.size(), -1);
    for (size_t i = 0; i < code.size(); ++i) producer[code[i].out] = (int)i;
    for (Instruction &reader : code) {
        if (reader.code != Code::chain) continue;
        for (size_t k = 0; k < reader.chain.size(); ++k) {
            int slot = reader.in[k + 2], at = producer[slot];
            std::vector<int> views;
            while (at >= 0 && code[at].code == Code::identity && reads[slot] == 1) {
                views.push_back(at);
                slot = code[at].in[0];
                at = producer[slot];
            }
            if (at < 0 || reads[slot] != 1 || code[at].code != Code::resize_nearest) continue;
            reader.in[k + 2] = code[at].in[0];
            reader.upsampling[k] = {code[at].shape[0], code[at].shape[1]};
            code[at].code = Code::folded;
            for (int view : views) code[view].code = Code::folded;
        }
    }
}

void fold_quantizes(Program &program) {
    const std::vector<int> reads = slot_reads(program, false);
    for (size_t i = 0; i + 1 < program.code.size(); ++i) {
        Instruction &op = program.code[i], &quantize = program.code[i + 1];
        if ((op.code != Code::binary && op.code != Code::chain) || quantize.code != Code::quantize ||
            quantize.in[0] != op.out || reads[op.out] != 1)
            continue;
        op.quantized = true;
        op.quantize_to = {quantize.scale, quantize.zero_point, quantize.qmin, quantize.qmax, quantize.signed_out};
        op.out = quantize.out;
        quantize.code = Code::folded;
    }
}

// Transposes whose output only convolutions read, which read either layout: such a transpose may leave
// its values where they lie, channels-last (other instructions would take them channels-first, or not
// at all: a per-row broadcast).
void mark_transposes_into_convolutions(Program &program) {
    std::vector<bool> other_reader(program.slots.size(), false);
    for (const Instruction &ins : program.code)
        for (int slot : ins.in)
            if (ins.code != Code::layer || ins.operation->kind != Kind::conv) other_reader[slot] = true;
    for (int slot : program.outputs) other_reader[slot] = true;
    for (Instruction &ins : program.code)
        if (ins.code == Code::transpose) ins.into_convolutions = !other_reader[ins.out];
}

// A convolution's frames by its weights (a dense with a stride: an STFT) give [N, width, frames]; PyTorch's exports
// read that through an Unsqueeze (or not) and a Transpose of the last two axes, which copied it back into the
// order the product computes it in: [N, frames, width]. Where only that chain reads the dense, the dense writes
// its own order and the transpose becomes a view (oww_melspectrogram: its two 5 × 257 STFTs' transposes took
// 0.5 µs each of a 15 µs run).
void frames_into_transposes(Program &program) {
    const std::vector<int> reads = slot_reads(program, false);
    std::vector<int> reader(program.slots.size(), -1);
    for (size_t i = 0; i < program.code.size(); ++i)
        for (int slot : program.code[i].in) reader[slot] = (int)i;
    const auto only_reader = [&](int slot) { return reads[slot] == 1 ? &program.code[reader[slot]] : nullptr; };
    for (Instruction &dense : program.code) {
        if (dense.code != Code::dense || dense.stride == 0) continue;
        Instruction *next = only_reader(dense.out), *transpose = next;
        int64_t rank = 3;
        if (next && next->code == Code::unsqueeze) {  // its axes must leave the last two where they are
            rank += (int64_t)next->shape.size();
            bool before_last_two = true;
            for (int64_t axis : next->shape)
                before_last_two = before_last_two && (axis < 0 ? axis + rank : axis) < rank - 2;
            transpose = before_last_two ? only_reader(next->out) : nullptr;
        }
        if (!transpose || transpose->code != Code::transpose || (int64_t)transpose->shape.size() != rank) continue;
        bool swaps_last_two = transpose->shape[rank - 2] == rank - 1 && transpose->shape[rank - 1] == rank - 2;
        for (int64_t i = 0; i + 2 < rank; ++i) swaps_last_two = swaps_last_two && transpose->shape[i] == i;
        if (!swaps_last_two) continue;
        dense.frames_first = true;
        transpose->code = Code::identity;
    }
}

// Program::last_use, and each slot's pool.
void plan_memory(Program &program) {
    const size_t end = program.code.size();
    program.last_use.assign(program.slots.size(), 0);
    for (size_t i = 0; i < end; ++i)
        for (int slot : program.code[i].in) program.last_use[slot] = i;
    for (int slot : program.outputs) program.last_use[slot] = end;
    for (size_t i = end; i-- > 0;) {  // a view's source lives as long as the view (later views first)
        const Instruction &ins = program.code[i];
        const bool view = ins.code == Code::flatten || ins.code == Code::reshape || ins.code == Code::squeeze ||
                          ins.code == Code::unsqueeze || ins.code == Code::identity || ins.code == Code::transpose ||
                          ins.code == Code::slice;
        if (view) program.last_use[ins.in[0]] = std::max(program.last_use[ins.in[0]], program.last_use[ins.out]);
    }
    for (auto &slot : program.slots) slot.pool = &program.pool;
}

// Whether an instruction reads as many slots as its code takes.
bool reads_fit(const Instruction &ins) {
    const size_t reads = ins.in.size();
    switch (ins.code) {
        case Code::join:
        case Code::product:
        case Code::binary: return reads == 2;
        case Code::concat: return reads >= 1;  // its parts
        case Code::softmax:
        case Code::moment_layer_norm: return reads >= 1;  // its source, then the shapes it checks
        case Code::one_hot: return reads == 1 || reads == 2;  // its integers, then its Expand's shape if any
        case Code::reshape: return reads == 1u + ins.shape_read;  // its source, then its target if computed
        case Code::clip: return reads == 1u + ins.low_read + ins.high_read;  // its source, then the bounds it reads
        default: return reads == 1;
    }
}

// The instructions that take no parameters (their extra is None)
const std::map<std::string, Code> PLAIN_INSTRUCTIONS = {
    {"mean", Code::mean}, {"identity", Code::identity}, {"relu", Code::relu}, {"hard_swish", Code::hard_swish},
    {"sigmoid", Code::sigmoid}, {"tanh", Code::tanh}, {"erf", Code::erf}, {"sqrt", Code::sqrt}, {"log", Code::log},
    {"softmax", Code::softmax}, {"global_max", Code::global_max}};

bool one_or_per_channel(const std::vector<float> &values, int64_t channels) {
    return values.size() == 1 || (int64_t)values.size() == channels;
}

PyObject *py_program(PyObject *, PyObject *args) {
    PyObject *code_o, *inputs_o, *outputs_o;
    int slot_count, threads;
    if (!PyArg_ParseTuple(args, "OiOOi", &code_o, &slot_count, &inputs_o, &outputs_o, &threads)) return nullptr;
    auto program = std::make_unique<Program>();
    try {
        program->threads = std::max(1, threads);
        program->slots.resize(slot_count);
        for (auto v : int_sequence(inputs_o, "inputs")) program->inputs.push_back((int)v);
        for (auto v : int_sequence(outputs_o, "outputs")) program->outputs.push_back((int)v);
        PyObject *iterator = PyObject_GetIter(code_o);
        if (!iterator) return nullptr;
        struct Release {  // the iterator, on every way out
            PyObject *o;
            ~Release() { Py_DECREF(o); }
        } release{iterator};
        while (PyObject *item = PyIter_Next(iterator)) {
            Instruction ins;
            const char *kind = nullptr;
            PyObject *in_o = nullptr, *extra = nullptr;
            const bool ok = PyArg_ParseTuple(item, "sOiO", &kind, &in_o, &ins.out, &extra);
            Py_DECREF(item);
            if (!ok) return nullptr;
            for (auto v : int_sequence(in_o, "instruction inputs")) ins.in.push_back((int)v);
            const std::string k(kind);
            bool parsed = true;
            auto hold = [&](const void *pointer) {  // the capsule behind a layer or a product, kept alive
                if (pointer) {
                    ins.capsule = extra;
                    Py_INCREF(extra);
                }
                return pointer != nullptr;
            };
            if (const auto plain = PLAIN_INSTRUCTIONS.find(k); plain != PLAIN_INSTRUCTIONS.end()) {
                ins.code = plain->second;
            } else if (k == "concat") {  // None: the channels; else the axis
                ins.code = Code::concat;
                ins.axis = 1;
                if (extra != Py_None) {
                    ins.axis = PyLong_AsLongLong(extra);
                    parsed = !PyErr_Occurred() && ins.axis >= 0;
                }
            } else if (k == "layer") {
                ins.code = Code::layer;
                parsed = hold(ins.operation = operation(extra));
            } else if (k == "upsample") {  // (a MatMul's capsule, kernel_h, kernel_w)
                PyObject *matmul;
                int64_t kh, kw;
                ins.code = Code::upsample;
                parsed = PyArg_ParseTuple(extra, "OLL", &matmul, &kh, &kw) && hold(ins.operation = operation(matmul));
                ins.shape = {kh, kw};
            } else if (k == "resize_nearest") {  // (kh, kw)
                ins.code = Code::resize_nearest;
                ins.shape = int_sequence(extra, "resize_nearest's factors");
                parsed = ins.shape.size() == 2 && ins.shape[0] >= 1 && ins.shape[1] >= 1;
                if (!parsed) throw std::invalid_argument("resize_nearest takes two whole factors of at least 1");
            } else if (k == "quantize") {
                int signed_out;
                ins.code = Code::quantize;
                parsed = PyArg_ParseTuple(extra, "fiiip", &ins.scale, &ins.zero_point, &ins.qmin, &ins.qmax, &signed_out);
                ins.signed_out = signed_out;
            } else if (k == "join") {  // destination: None (float32) or (scale, zero point, qmin, qmax, signed)
                int multiply, relu, signed_out = 0;
                PyObject *destination;
                ins.code = Code::join;
                parsed = PyArg_ParseTuple(extra, "pffffpO", &multiply, &ins.a_shift, &ins.a_scale, &ins.b_shift,
                                          &ins.b_scale, &relu, &destination);
                lpt_ops::Destination &to = ins.to;
                if (parsed && destination != Py_None) {
                    parsed = PyArg_ParseTuple(destination, "fiiip", &to.scale, &to.zero_point, &to.qmin, &to.qmax,
                                              &signed_out);
                    to.type = signed_out ? 'b' : 'B';
                }
                ins.multiply = multiply, ins.relu = relu;
            } else if (k == "dynamic_layer") {  // (a Conv's or MatMul's capsule, bias or None, the bias's and the
                                                 //  output's weight scales, the float32 bias or None, the SiLU,
                                                 //  residuals)
                PyObject *conv, *bias, *bias_scales, *scales, *float_bias, *residuals;
                int silu;
                ins.code = Code::dynamic_layer;
                parsed = PyArg_ParseTuple(extra, "OOOOOiO", &conv, &bias, &bias_scales, &scales, &float_bias, &silu,
                                          &residuals) && hold(ins.operation = operation(conv));
                if (parsed) {
                    if (silu < lpt_ops::NO_SILU || silu > lpt_ops::CLAMPED_SILU)
                        throw std::invalid_argument("a dynamic layer's SiLU must be 0 (none), 1 or 2 (clamped)");
                    ins.silu = static_cast<lpt_ops::Silu>(silu);
                    ins.bias_weight_scales = float_vector(bias_scales, "a dynamic layer's bias scales");
                    ins.weight_scales = float_vector(scales, "a dynamic layer's weight scales");
                    if (bias != Py_None) ins.bias = float_vector(bias, "a dynamic layer's bias");
                    if (float_bias != Py_None) ins.beta = float_vector(float_bias, "a dynamic layer's float32 bias");
                    ins.values = int_sequence(residuals, "a dynamic layer's residuals");
                    const Operation &op = *ins.operation;
                    if (ins.values.size() % (op.kind == Kind::conv ? op.kernel_shape.size() + 1 : 3) ||
                        (!ins.bias.empty() && (int64_t)ins.bias.size() != op.out_channels) ||
                        (!ins.beta.empty() && (int64_t)ins.beta.size() != op.out_channels) ||
                        !one_or_per_channel(ins.bias_weight_scales, op.out_channels) ||
                        !one_or_per_channel(ins.weight_scales, op.out_channels))
                        throw std::invalid_argument("a dynamic layer's parameters do not fit its convolution");
                }
            } else if (k == "product") {
                ins.code = Code::product;
                parsed = hold(ins.product = product_of(extra));
            } else if (k == "max_pool") {
                ins.code = Code::max_pool;
                lpt_ops::Pool &p = ins.pool;
                parsed = PyArg_ParseTuple(extra, "(LL)(LL)(LL)(LLLL)", &p.kernel_h, &p.kernel_w, &p.stride_h, &p.stride_w,
                                          &p.dilation_h, &p.dilation_w, &p.pad_top, &p.pad_left, &p.pad_bottom,
                                          &p.pad_right);
            } else if (k == "average_pool") {  // ((kh, kw), (sh, sw), (top, left, bottom, right), count_include_pad)
                int count_include_pad;
                ins.code = Code::average_pool;
                lpt_ops::Pool &p = ins.pool;
                p.dilation_h = p.dilation_w = 1;
                parsed = PyArg_ParseTuple(extra, "(LL)(LL)(LLLL)p", &p.kernel_h, &p.kernel_w, &p.stride_h, &p.stride_w,
                                          &p.pad_top, &p.pad_left, &p.pad_bottom, &p.pad_right, &count_include_pad);
                ins.count_include_pad = count_include_pad;
            } else if (k == "squeeze" || k == "unsqueeze" || k == "squeeze_ones") {  // axes
                ins.code = k == "unsqueeze" ? Code::unsqueeze : Code::squeeze;
                ins.ones_only = k == "squeeze_ones";
                ins.shape = int_sequence(extra, "axes");
                if (ins.ones_only && ins.shape.empty()) throw std::invalid_argument("a squeeze_ones of no axes");
            } else if (k == "affine") {  // (a, b): one value each per channel
                PyObject *a, *b;
                ins.code = Code::affine;
                parsed = PyArg_ParseTuple(extra, "OO", &a, &b);
                if (parsed) {
                    ins.gamma = float_vector(a, "affine's a");
                    ins.beta = float_vector(b, "affine's b");
                    if (ins.gamma.size() != ins.beta.size()) throw std::invalid_argument("affine's a and b differ in size");
                }
            } else if (k == "clip") {  // (slope, low, high): a bound None is the next input's one value
                PyObject *low, *high;
                ins.code = Code::clip;
                parsed = PyArg_ParseTuple(extra, "fOO", &ins.alpha, &low, &high);
                ins.low_read = parsed && low == Py_None, ins.high_read = parsed && high == Py_None;
                if (parsed && !ins.low_read) ins.low = (float)PyFloat_AsDouble(low);
                if (parsed && !ins.high_read) ins.high = (float)PyFloat_AsDouble(high);
                parsed = parsed && !PyErr_Occurred();
            } else if (k == "hard_sigmoid") {  // (alpha, beta)
                ins.code = Code::hard_sigmoid;
                parsed = PyArg_ParseTuple(extra, "ff", &ins.alpha, &ins.offset);
            } else if (k == "gelu") {  // (divisor, one, half)
                ins.code = Code::gelu;
                parsed = PyArg_ParseTuple(extra, "fff", &ins.alpha, &ins.offset, &ins.scale);
            } else if (k == "tanh_gelu") {  // (cube, root, one, half)
                ins.code = Code::tanh_gelu;
                parsed = PyArg_ParseTuple(extra, "ffff", &ins.cube, &ins.root, &ins.one, &ins.half);
            } else if (k == "mean_last_axis" || k == "mean_axis_1") {  // keepdims
                int keepdims;
                ins.code = k == "mean_last_axis" ? Code::mean_last_axis : Code::mean_axis_1;
                parsed = PyArg_ParseTuple(extra, "p", &keepdims);
                ins.keepdims = keepdims;
            } else if (k == "pad") {  // (pads, value[, mode]): mode "constant" (the default) or "reflect"
                PyObject *pads;
                const char *mode = "constant";
                ins.code = Code::pad;
                parsed = PyArg_ParseTuple(extra, "Of|s", &pads, &ins.fill, &mode);
                if (parsed && std::strcmp(mode, "constant") && std::strcmp(mode, "reflect"))
                    throw std::invalid_argument("a pad's mode is 'constant' or 'reflect'");
                ins.reflect = parsed && !std::strcmp(mode, "reflect");
                if (parsed) ins.shape = int_sequence(pads, "pad's pads");
                if (parsed && (ins.shape.size() % 2 || std::any_of(ins.shape.begin(), ins.shape.end(), [](int64_t p) { return p < 0; })))
                    throw std::invalid_argument("a pad's pads are a begin and an end per axis, none negative");
            } else if (k == "extreme_middle" || k == "extreme_all") {  // (keepdims, smallest)
                int keepdims, smallest;
                ins.code = k == "extreme_all" ? Code::extreme_all : Code::extreme_middle;
                parsed = PyArg_ParseTuple(extra, "pp", &keepdims, &smallest);
                ins.keepdims = keepdims;
                ins.smallest = smallest;
            } else if (k == "binary") {  // "mul", "add", "sub" or "div"
                ins.code = Code::binary;
                const char *which = PyUnicode_AsUTF8(extra);
                parsed = which != nullptr;
                const std::string w = parsed ? which : "";
                ins.op = w == "mul" ? '*' : w == "add" ? '+' : w == "sub" ? '-' : w == "div" ? '/' : 0;
                if (parsed && !ins.op) throw std::invalid_argument("a binary instruction is 'mul', 'add', 'sub' or 'div'");
            } else if (k == "reshape") {  // (target shape, allow_zero)
                PyObject *target;
                int allow_zero;
                ins.code = Code::reshape;
                parsed = PyArg_ParseTuple(extra, "Op", &target, &allow_zero);
                if (parsed && target != Py_None) ins.shape = int_sequence(target, "reshape's shape");
                ins.shape_read = parsed && target == Py_None;  // computed: the instruction's second input
                ins.allow_zero = parsed && allow_zero;
            } else if (k == "slice") {  // (starts, ends, axes, steps[, drop_axes])
                PyObject *starts, *ends, *axes, *steps;
                int drop = 0;
                ins.code = Code::slice;
                parsed = PyArg_ParseTuple(extra, "OOOO|p", &starts, &ends, &axes, &steps, &drop);
                ins.drop_axes = drop;
                if (parsed) {
                    const size_t n = int_sequence(starts, "slice's starts").size();
                    for (PyObject *part : {starts, ends, axes, steps}) {
                        const std::vector<int64_t> values = int_sequence(part, "slice's parameters");
                        if (values.size() != n) throw std::invalid_argument("a slice's starts, ends, axes and steps differ in length");
                        ins.shape.insert(ins.shape.end(), values.begin(), values.end());
                    }
                    if (std::any_of(ins.shape.begin() + 3 * n, ins.shape.end(), [](int64_t s) { return s == 0; }))
                        throw std::invalid_argument("a slice's step of 0");
                }
            } else if (k == "transpose") {  // perm
                ins.code = Code::transpose;
                ins.shape = int_sequence(extra, "transpose's perm");
                std::vector<int64_t> sorted = ins.shape;
                std::sort(sorted.begin(), sorted.end());
                for (size_t i = 0; i < sorted.size(); ++i)
                    if (sorted[i] != (int64_t)i) throw std::invalid_argument("a transpose's perm must order the axes");
            } else if (k == "moment_layer_norm") {  // (factor, epsilon, scale, bias)
                PyObject *scale, *bias;
                ins.code = Code::moment_layer_norm;
                parsed = PyArg_ParseTuple(extra, "ffOO", &ins.factor, &ins.epsilon, &scale, &bias);
                if (parsed) ins.gamma = float_vector(scale, "layer norm's scale");
                if (parsed) ins.beta = float_vector(bias, "layer norm's bias");
                if (parsed && ins.gamma.size() != ins.beta.size())
                    throw std::invalid_argument("a layer norm's scale and bias need one value per channel");
            } else if (k == "layer_norm") {  // (scale, bias or None, epsilon)
                PyObject *scale, *bias;
                ins.code = Code::layer_norm;
                parsed = PyArg_ParseTuple(extra, "OOf", &scale, &bias, &ins.epsilon);
                if (parsed) ins.gamma = float_vector(scale, "layer norm's scale");
                if (parsed && bias != Py_None) ins.beta = float_vector(bias, "layer norm's bias");
            } else if (k == "gather") {  // (the table's values, its shape)
                PyObject *values, *shape;
                ins.code = Code::gather;
                parsed = PyArg_ParseTuple(extra, "OO", &values, &shape);
                if (parsed) {
                    ins.table = float_vector(values, "gather's table");
                    ins.shape = int_sequence(shape, "gather's table shape");
                    int64_t count = 1;
                    for (auto d : ins.shape) count *= d;
                    if (ins.shape.empty() || count != (int64_t)ins.table.size())
                        throw std::invalid_argument("gather's table does not have its shape");
                }
            } else if (k == "one_hot") {  // (the table, the level of 0, the level of 1, signed)
                PyObject *values;
                int low, high, is_signed;
                ins.code = Code::one_hot;
                parsed = PyArg_ParseTuple(extra, "Oiip", &values, &low, &high, &is_signed);
                if (parsed) {
                    ins.values = int_sequence(values, "one-hot's table");
                    if (ins.values.empty()) throw std::invalid_argument("a one-hot's table is empty");
                    ins.low_level = (uint8_t)low, ins.high_level = (uint8_t)high, ins.signed_out = is_signed;
                }
            } else if (k == "dense") {  // (weights [depth, width], bias or None, stride: 0 for a MatMul
                                         //  [, a Conv's source channels, its pads at the start and the end
                                         //  [, its kernel and 1 or −1 where its frames are folded]])
                PyObject *weights, *bias;
                long long stride, channels = 1, pad_begin = 0, pad_end = 0, fold_kernel = 0, fold_sign = 0;
                ins.code = Code::dense;
                parsed = PyArg_ParseTuple(extra, "OOL|LLLLL", &weights, &bias, &stride, &channels, &pad_begin, &pad_end,
                                          &fold_kernel, &fold_sign);
                if (parsed) {
                    Buffer w;
                    if (!w.get(weights, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) || w.format() != 'f' || w.view.ndim != 2) {
                        PyErr_Clear();
                        throw std::invalid_argument("a dense instruction's weights must be a contiguous float32 [depth, width]");
                    }
                    ins.depth = w.view.shape[0], ins.width = w.view.shape[1], ins.stride = stride;
                    ins.packed = lpt_ops::pack_dense_weights(static_cast<const float *>(w.view.buf), ins.depth, ins.width);
                    if (bias != Py_None) ins.bias = float_vector(bias, "dense's bias");
                    if (!ins.bias.empty() && (int64_t)ins.bias.size() != ins.width)
                        throw std::invalid_argument("a dense instruction's bias needs one value per column");
                    if (stride < 0 || ins.depth == 0) throw std::invalid_argument("a dense instruction's stride is negative or its depth 0");
                    if (channels < 1 || ins.depth % channels || pad_begin < 0 || pad_end < 0 ||
                        (stride == 0 && (channels != 1 || pad_begin || pad_end)))
                        throw std::invalid_argument("a dense instruction's channels do not divide its depth, or its pads are negative or on a MatMul");
                    ins.frame_channels = channels, ins.pad_begin = pad_begin, ins.pad_end = pad_end;
                    if (fold_sign && (stride == 0 || channels != 1 || (fold_sign != 1 && fold_sign != -1) ||
                                      fold_kernel < 2 || ins.depth != fold_kernel / 2 + 1))
                        throw std::invalid_argument("a folded dense instruction needs a Conv of one channel, a sign of 1 or -1 and a depth of half its kernel and one");
                    ins.fold_kernel = fold_sign ? fold_kernel : 0, ins.fold_sign = fold_sign;
                }
            } else if (k == "flatten") {
                ins.code = Code::flatten;
                ins.axis = PyLong_AsLongLong(extra);
                parsed = !PyErr_Occurred();
            } else {
                throw std::invalid_argument("unknown instruction '" + k + "'");
            }
            if (!parsed) return nullptr;
            for (int slot : ins.in)
                if (slot < 0 || slot >= slot_count) throw std::invalid_argument("an instruction reads a slot out of range");
            if (ins.out < 0 || ins.out >= slot_count || !reads_fit(ins))
                throw std::invalid_argument("an instruction's slots do not fit it");
            program->code.push_back(std::move(ins));
        }
        if (PyErr_Occurred()) return nullptr;
        fold_binaries(*program);
        fold_upsamplings(*program);
        fold_quantizes(*program);
        frames_into_transposes(*program);
        mark_transposes_into_convolutions(*program);
        plan_memory(*program);
    } catch (const std::exception &e) {
        return fail(e);
    }
    return PyCapsule_New(program.release(), PROGRAM_CAPSULE, [](PyObject *c) {
        delete static_cast<Program *>(PyCapsule_GetPointer(c, PROGRAM_CAPSULE));
    });
}

const char PROGRAM_RUN_DOC[] =
    "program_run(program, arrays) -> [ndarray]\n\n"
    "Each output an ndarray over a bytearray, or over the memory the program computed it in (an object with\n"
    "the buffer protocol).\n"
    "arrays: the program's inputs, C-contiguous float32/uint8/int8. Raises NotImplementedError where an\n"
    "instruction does not take what it meets (lpt runs the steps one by one then).";

// An input slot reading `view` (whose first `skip` axes are left out: a scanned sequence's time axis).
bool bind_input(Slot &slot, const Buffer &buffer, int skip = 0) {
    const Py_buffer &v = buffer.view;
    slot.type = buffer.format();
    if (slot.type == 'l' && v.itemsize == 8) slot.type = 'q';  // int64: a gather's indices
    if (slot.type != 'f' && slot.type != 'B' && slot.type != 'b' && slot.type != 'q' && slot.type != 'i') {
        PyErr_SetString(PyExc_NotImplementedError, "program_run: an input other than float32, 8-bit or int32/int64");
        return false;
    }
    slot.dims.assign(v.shape + skip, v.shape + v.ndim);
    slot.data = v.buf;
    return true;
}

// Whether the max pool `pool` (code[at + 1]) reads the output of the convolution `layer` (code[at]), which nothing
// else reads, over windows as far apart as they are long (no pads, no dilation), after a stage whose levels keep
// the accumulators' order (lpt_s16::stage_keeps_order): route s16 may then run the two as one (pool_in_stage).
bool pools_layer(const Program &program, size_t at, const Instruction &layer, const Instruction &pool) {
    if (layer.code != Code::layer || pool.code != Code::max_pool || pool.in[0] != layer.out ||
        program.last_use[layer.out] != at + 1)
        return false;
    const Operation &op = *layer.operation;
    const lpt_ops::Pool &p = pool.pool;
    return op.route == Route::s16 && op.kind == Kind::conv && op.weight_dims.size() == 4 && op.groups == 1 &&
           p.stride_h == p.kernel_h && p.stride_w == p.kernel_w && p.dilation_h == 1 && p.dilation_w == 1 &&
           p.pad_top == 0 && p.pad_left == 0 && p.pad_bottom == 0 && p.pad_right == 0 &&
           lpt_s16::stage_keeps_order(op.epilogue, op.out_channels);
}

// A convolution and the max pool after it (pools_layer) in one pass, where the convolution runs on s16's int16
// kernels (direct, or by Winograd under a 2×2 pool): each window's largest accumulators are staged
// (lpt_s16::convolve_pooled_staged, winograd_pooled_staged), the levels the pool would take, and the layer's
// output is never written. dnsmos_p808 (its 1 → 32 stem over 900×120 and a 2×2
// pool), the two plans in turns in one process on a Zen 3: one thread 8.04 against 8.81 ms (the tenth fastest of
// 200 runs), two 6.33 against 7.03. False, with nothing run, where the layer runs otherwise (the kernel on bytes,
// Winograd under another pool) or the pool's output would not be channels-last.
bool pool_in_stage(Program &program, const Instruction &layer, const Instruction &pool) {
    Operation &op = *layer.operation;
    const Slot &src = program.slots[layer.in[0]];
    if (!src.eight_bit() || src.dims.size() != 4 || src.dims[1] != op.in_channels) return false;
    const int64_t h = src.dims[2], w = src.dims[3];
    const lpt_s16::Geometry &g = op.geometry;
    if (h + g.pad_top + g.pad_bottom < g.kernel_h || w + g.pad_left + g.pad_right < g.kernel_w) return false;
    const int64_t rows = g.out_h(h) / pool.pool.kernel_h, columns = g.out_w(w) / pool.pool.kernel_w;
    const bool winograd = takes_winograd(op, h, w);  // by Winograd, a 2×2 pool's windows are its blocks
    if (rows * columns <= 1 || op.out_channels <= 1 || (!winograd && !op.bytes.packed.empty()) ||
        (winograd && (pool.pool.kernel_h != 2 || pool.pool.kernel_w != 2 || g.dilation_h != 1 || g.dilation_w != 1)))
        return false;
    Slot &out = program.slots[pool.out];
    out.dims = {src.dims[0], op.out_channels, rows, columns};
    out.channels_last = true;  // as step's max pool leaves it after a layer's channels-last output
    char *o = static_cast<char *>(out.allocate(op.stage.dst == Dst::u8 ? 'B' : 'b', out.count()));
    // a few images at a time, as run_layer (the widened source of a large batch is not held at once)
    const int64_t images = src.dims[0], in_image = src.count() / std::max<int64_t>(images, 1),
                  out_image = out.count() / std::max<int64_t>(images, 1);
    const int64_t chunk = images_per_chunk(in_image, out_image);
    std::lock_guard<std::mutex> guard(op.lock);
    for (int64_t first = 0; first < images; first += chunk) {
        memory::dims dims(src.dims.begin(), src.dims.end());
        dims[0] = std::min(chunk, images - first);
        run_s16(op, static_cast<const uint8_t *>(src.data) + first * in_image, dims, src.transposed(), src.type == 'b',
                op.src_zero_point, op.stage.dst, true, o + first * out_image, (size_t)(dims[0] * out_image), nullptr,
                &pool.pool);
    }
    return true;
}

// The program's instructions, once, on the slots bound: throws where one fails.
void run_code(Program &program) {
    program.seconds.assign(program.code.size(), 0.0);
    const uint64_t loops_before = lpt_parallel::loops_opened();
    auto start = std::chrono::steady_clock::now();
    const std::vector<Instruction> &code = program.code;
    for (size_t i = 0; i < code.size(); ++i) {
        // a convolution and the residual join or Add after it run as one (join_in_bands, add_in_stage), the join or
        // Add reading the layer's output or an Identity's view of it, or a convolution and its max pool
        // (pool_in_stage), or two dense products at once (denses_at_once): the second's time is the first's
        size_t last = i;  // the last instruction this pass runs
        const bool through_view = i + 2 < code.size() && code[i + 1].code == Code::identity &&
                                  code[i + 1].in[0] == code[i].out;
        const size_t add_at = i + 1 + through_view;
        const int view = through_view ? code[i + 1].out : code[i].out;
        if (add_at < code.size() && joins_layer(program, code[i], view, code[add_at], add_at) &&
            join_in_bands(program, i, code[i], view, code[add_at]))
            last = add_at;
        if (last == i && add_at < code.size() && adds_to_layer(program, i, code[i], view, code[add_at]) &&
            add_in_stage(program, code[i], view, code[add_at]))
            last = add_at;
        if (last == i && i + 1 < code.size() && pools_layer(program, i, code[i], code[i + 1]) &&
            pool_in_stage(program, code[i], code[i + 1]))
            last = i + 1;
        if (last == i && i + 1 < code.size() && denses_at_once(program, code[i], code[i + 1])) last = i + 1;
        if (last == i) step(program, code[i]);
        for (size_t k = i; k <= last; ++k)
            for (int slot : code[k].in)  // inputs are the caller's: they hold no memory to release
                if (program.last_use[slot] == k) program.slots[slot].release();
        const auto end = std::chrono::steady_clock::now();
        program.seconds[i] = std::chrono::duration<double>(end - start).count();
        start = end;
        i = last;
    }
    program.opens_loops = lpt_parallel::loops_opened() != loops_before;
}

// A slot's values channels-first into `to` (count() · item() bytes).
void copy_out(const Program &program, const Slot &slot, char *to) {
    const size_t bytes = (size_t)(slot.count() * slot.item());
    if (slot.transposed()) slot.channels_first_into(to, program.threads);
    else if (bytes) std::memcpy(to, slot.data, bytes);
}

PyObject *shape_tuple(const std::vector<int64_t> &dims) {
    PyObject *shape = PyTuple_New((Py_ssize_t)dims.size());
    for (size_t d = 0; shape && d < dims.size(); ++d) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(dims[d]));
    return shape;
}

// numpy, numpy.ndarray, and the dtype of a slot's type ('f', 'B', 'b', 'q', 'i': numpy's own codes for them),
// each looked up once (references kept for the process's life); null with a Python error set where numpy fails.
PyObject *numpy_module() {
    static PyObject *numpy = nullptr;
    if (!numpy) numpy = PyImport_ImportModule("numpy");
    return numpy;
}

PyObject *ndarray_type() {
    static PyObject *ndarray = nullptr;
    if (!ndarray && numpy_module()) ndarray = PyObject_GetAttrString(numpy_module(), "ndarray");
    return ndarray;
}

PyObject *dtype_of(char type) {
    static PyObject *dtypes[128] = {};
    PyObject *&dtype = dtypes[(unsigned char)type & 127];
    if (!dtype && numpy_module()) dtype = PyObject_CallMethod(numpy_module(), "dtype", "C", type);
    return dtype;
}

// An ndarray of `dims` and `type` over `data`'s buffer appended to `results` (cleared on failure, or where `data`
// is null); takes `data`'s reference. Made here, not by Python from (data, shape, format) entries: that loop cost
// a call of oww_melspectrogram's program 0.3 µs of its 10.
void append_entry(PyObject *&results, PyObject *data, const std::vector<int64_t> &dims, char type) {
    PyObject *shape = data && results ? shape_tuple(dims) : nullptr, *dtype = shape ? dtype_of(type) : nullptr;
    PyObject *ndarray = dtype ? ndarray_type() : nullptr;
    PyObject *array = ndarray ? PyObject_CallFunctionObjArgs(ndarray, shape, dtype, data, nullptr) : nullptr;
    Py_XDECREF(data);
    Py_XDECREF(shape);
    if (!array || PyList_Append(results, array) < 0) Py_CLEAR(results);
    Py_XDECREF(array);
}

// An ndarray of `bytes` bytes from `fill` (a new bytearray's), appended to `results` (cleared on failure).
template <typename Fill>
void append_result(PyObject *&results, const std::vector<int64_t> &dims, char type, Py_ssize_t bytes, Fill fill) {
    if (!results) return;
    PyObject *data = PyByteArray_FromStringAndSize(nullptr, bytes);
    if (data) fill(PyByteArray_AsString(data));
    append_entry(results, data, dims, type);
}

// A program's output handed to Python with the memory its slot computed it in, where a copy into a new
// bytearray would cost a pass over it: numpy reads it through the buffer protocol (np.frombuffer), and it is
// freed with the last array over it. The PaddleOCR recognizer's [1, 40, 18710] float32 output (3 MB): its
// program took 0.12 ms a run beyond its instructions, 0.10-0.12 of it the copy, and 0.014 so (Zen 4, 2 threads).
struct OutputBlock {
    PyObject_HEAD
    unsigned char *bytes;  // a CacheLineArray's, released to this block
    Py_ssize_t size;
};

void output_block_dealloc(PyObject *self) {
    CacheLineDelete<unsigned char>()(reinterpret_cast<OutputBlock *>(self)->bytes);
    Py_TYPE(self)->tp_free(self);
}

int output_block_buffer(PyObject *self, Py_buffer *view, int flags) {
    const auto *block = reinterpret_cast<OutputBlock *>(self);
    return PyBuffer_FillInfo(view, self, block->bytes, block->size, 0, flags);  // writable, as a bytearray
}

PyBufferProcs output_block_procs = {output_block_buffer, nullptr};
PyTypeObject output_block_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Outputs below this many bytes are copied: the slot keeps its memory for the next run, and a copy costs less
// than allocating anew.
constexpr size_t HAND_OVER_BYTES = 256u << 10;

// The bytes of output `slot` (`bytes` of them) as an object with the buffer protocol: the slot's own memory,
// taken from it, where it holds the values as they are returned (channels-first, not a view of another's) in
// not much more memory than they fill and is no other output's; else a bytearray they are copied into.
PyObject *output_bytes(const Program &program, Slot &slot, size_t bytes, bool shared) {
    const bool own = slot.memory.capacity && slot.data == slot.memory.bytes.get() && !slot.transposed();
    if (own && !shared && bytes >= HAND_OVER_BYTES && slot.memory.capacity <= bytes + bytes / 4) {
        auto *block = PyObject_New(OutputBlock, &output_block_type);
        if (!block) return nullptr;
        block->bytes = slot.memory.bytes.release();
        block->size = (Py_ssize_t)bytes;
        slot.memory = Memory();
        slot.data = nullptr;
        return reinterpret_cast<PyObject *>(block);
    }
    PyObject *data = PyByteArray_FromStringAndSize(nullptr, (Py_ssize_t)bytes);
    if (data) copy_out(program, slot, PyByteArray_AsString(data));
    return data;
}

// The slots' memory back to the program's pool (between a Scan's steps, and at the end of a run).
void release_slots(Program &program) {
    for (auto &slot : program.slots) {
        slot.release();
        slot.data = nullptr;  // inputs are the caller's
        slot.channels_last = false;
    }
}

// After a run: the slots' memory back to the pool, which stays for the next run up to KEEP_PROGRAM_BYTES
// in all (a large batch's would stay allocated otherwise). Slots whose lifetimes do not overlap share
// it, so a run needs about its largest set of live tensors, and the next run reuses it (no new pages to
// fault in).
void end_run(Program &program) {
    release_slots(program);
    size_t kept = program.scratch.bytes() + program.upsampled.bytes();
    for (const auto &memory : program.pool) kept += memory.capacity;
    if (kept > KEEP_PROGRAM_BYTES) {
        program.pool.clear();
        program.scratch.release();
        program.upsampled.release();
    }
}

// Runs `body`, turning what it throws into `error` (`unsupported` where it is an Unsupported).
template <typename Body>
void captured(std::string &error, bool &unsupported, Body body) {
    try {
        body();
    } catch (const Unsupported &e) {
        error = e.what();
        unsupported = true;
    } catch (const dnnl::error &e) {
        error = std::string("oneDNN: ") + e.what();
    } catch (const std::exception &e) {
        error = e.what();
    }
}

// Runs `body` on the program (the GIL released), turning what it throws into `error`.
template <typename Body>
void guarded(std::string &error, bool &unsupported, Body body) {
    Py_BEGIN_ALLOW_THREADS;
    captured(error, unsupported, body);
    Py_END_ALLOW_THREADS;
}

PyObject *py_program_run(PyObject *, PyObject *args) {
    PyObject *capsule, *arrays_o;
    if (!PyArg_ParseTuple(args, "OO", &capsule, &arrays_o)) return nullptr;
    auto *program = static_cast<Program *>(PyCapsule_GetPointer(capsule, PROGRAM_CAPSULE));
    if (!program) return nullptr;
    const Py_ssize_t count = PySequence_Size(arrays_o);
    if (count != (Py_ssize_t)program->inputs.size()) {
        PyErr_SetString(PyExc_ValueError, "program_run: wrong number of inputs");
        return nullptr;
    }
    std::vector<Buffer> buffers(count);
    std::lock_guard<std::mutex> guard(program->lock);
    for (Py_ssize_t i = 0; i < count; ++i) {
        PyObject *array = PySequence_GetItem(arrays_o, i);
        const bool ok = array && buffers[i].get(array, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
        Py_XDECREF(array);  // the buffer holds its own reference
        if (!ok || !bind_input(program->slots[program->inputs[i]], buffers[i])) return nullptr;
    }
    std::string error;
    bool unsupported = false;
    guarded(error, unsupported, [&] {
        const lpt_parallel::Busy busy(program->opens_loops);
        run_code(*program);
    });
    PyObject *results = error.empty() ? PyList_New(0) : nullptr;
    const std::vector<int> &outputs = program->outputs;
    for (size_t i = 0; results && i < outputs.size(); ++i) {
        Slot &slot = program->slots[outputs[i]];
        const bool shared = std::count(outputs.begin(), outputs.end(), outputs[i]) > 1;
        append_entry(results, output_bytes(*program, slot, (size_t)(slot.count() * slot.item()), shared), slot.dims,
                     slot.type);
    }
    end_run(*program);
    if (!error.empty())
        PyErr_SetString(unsupported ? PyExc_NotImplementedError : PyExc_RuntimeError, error.c_str());
    return results;
}

const char PROGRAM_SCAN_DOC[] =
    "program_scan(program, arrays, roles, emits) -> [ndarray]\n\n"
    "An ONNX Scan whose body is the program, run over its sequences' first axis in one call. roles, one per\n"
    "input: -1 the same array at each step, -2 a sequence read forwards, -3 backwards, k >= 0 a state: its\n"
    "initial value, then the program's output k. emits, one per output: -1 a state (exactly one input reads\n"
    "it), 0 a value stacked over the steps along a new first axis, 1 the same stacked backwards. Returns each\n"
    "output in order: a state's final value, or the stack. Raises NotImplementedError as program_run does,\n"
    "or where a state or an emitted value changes its shape or type from step to step.";

// A tensor carried from step to step, or stacked over the steps, in memory of the call's own.
struct Carried {
    std::vector<int64_t> dims;
    char type = 'f';
    std::vector<char> bytes;
};

// One Scan of program_scan(s): its inputs as Python gave them, and what it carries and stacks.
struct ScanJob {
    Program *program = nullptr;
    std::vector<Buffer> buffers;
    std::vector<int64_t> roles, emits;
    std::vector<Slot> bound;  // each input as the first step reads it (a sequence's first item)
    std::vector<Carried> value, next;  // per output: a state's value (initial, then the last step's) or the stack
    int64_t length = -1;
    std::string error;
    bool unsupported = false;
};

// Reads (program, arrays, roles, emits) into `job`; false with a Python error set where they do not fit.
bool parse_scan(PyObject *capsule, PyObject *arrays_o, PyObject *roles_o, PyObject *emits_o, ScanJob &job) {
    job.program = static_cast<Program *>(PyCapsule_GetPointer(capsule, PROGRAM_CAPSULE));
    if (!job.program) return false;
    try {
        job.roles = int_sequence(roles_o, "roles");
        job.emits = int_sequence(emits_o, "emits");
    } catch (const std::exception &e) {
        fail(e);
        return false;
    }
    const std::vector<int64_t> &roles = job.roles, &emits = job.emits;
    const Py_ssize_t count = PySequence_Size(arrays_o);
    const size_t outputs = job.program->outputs.size();
    std::vector<int> readers(outputs, 0);
    bool fits = count == (Py_ssize_t)job.program->inputs.size() && roles.size() == (size_t)count &&
                emits.size() == outputs;
    for (size_t i = 0; fits && i < roles.size(); ++i) {
        fits = roles[i] >= -3 && roles[i] < (int64_t)outputs && (roles[i] < 0 || emits[roles[i]] == -1);
        if (fits && roles[i] >= 0) ++readers[roles[i]];
    }
    for (size_t k = 0; fits && k < outputs; ++k) fits = emits[k] >= -1 && emits[k] <= 1 && (emits[k] != -1 || readers[k] == 1);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "program_scan: the roles or emits do not fit the program");
        return false;
    }
    job.buffers = std::vector<Buffer>(count);
    for (Py_ssize_t i = 0; i < count; ++i) {
        PyObject *array = PySequence_GetItem(arrays_o, i);
        const bool ok = array && job.buffers[i].get(array, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
        Py_XDECREF(array);
        if (!ok) return false;
        if (roles[i] <= -2) {
            const Py_buffer &v = job.buffers[i].view;
            if (v.ndim < 1 || (job.length >= 0 && v.shape[0] != job.length)) {
                PyErr_SetString(PyExc_ValueError, "program_scan: the sequences differ in length");
                return false;
            }
            job.length = v.shape[0];
        }
    }
    if (job.length <= 0) {
        PyErr_SetString(PyExc_ValueError, "program_scan: no sequence, or one of length 0");
        return false;
    }
    job.value.assign(outputs, Carried());
    job.next.assign(outputs, Carried());
    job.bound = std::vector<Slot>(count);
    for (Py_ssize_t i = 0; i < count; ++i) {
        if (!bind_input(job.bound[i], job.buffers[i], roles[i] <= -2 ? 1 : 0)) return false;
        if (roles[i] >= 0) {
            const Slot &b = job.bound[i];
            Carried &s = job.value[roles[i]];
            s.dims = b.dims;
            s.type = b.type;
            s.bytes.assign((const char *)b.data, (const char *)b.data + b.count() * b.item());
        }
    }
    return true;
}

// The Scan's steps, the GIL released: throws where an instruction fails, or a shape changes.
void run_scan(ScanJob &job) {
    Program &program = *job.program;
    const std::vector<int64_t> &roles = job.roles, &emits = job.emits;
    const int64_t length = job.length;
    const size_t inputs = roles.size(), outputs = emits.size();
    std::lock_guard<std::mutex> guard(program.lock);
    for (int64_t t = 0; t < length; ++t) {
        for (size_t i = 0; i < inputs; ++i) {
            Slot &slot = program.slots[program.inputs[i]];
            if (roles[i] >= 0) {
                const Carried &s = job.value[roles[i]];
                slot.dims = s.dims;
                slot.type = s.type;
                slot.data = s.bytes.data();
            } else {
                const Slot &b = job.bound[i];
                const int64_t at = roles[i] == -2 ? t : roles[i] == -3 ? length - 1 - t : 0;
                slot.dims = b.dims;
                slot.type = b.type;
                slot.data = static_cast<const char *>(b.data) + at * b.count() * b.item();
            }
            slot.channels_last = false;
        }
        run_code(program);
        // every output copied before any state changes: an output may be a view of a state's input
        for (size_t k = 0; k < outputs; ++k) {
            const Slot &slot = program.slots[program.outputs[k]];
            const size_t bytes = (size_t)(slot.count() * slot.item());
            if (emits[k] == -1) {
                if (slot.dims != job.value[k].dims || slot.type != job.value[k].type)
                    throw Unsupported("a Scan's state changes its shape or type");
                job.next[k].bytes.resize(bytes);
                copy_out(program, slot, job.next[k].bytes.data());
                continue;
            }
            Carried &e = job.value[k];
            if (t == 0) {
                e.dims = slot.dims;
                e.type = slot.type;
                e.bytes.resize(bytes * length);
            } else if (slot.dims != e.dims || slot.type != e.type) {
                throw Unsupported("a Scan's output changes its shape or type");
            }
            copy_out(program, slot, e.bytes.data() + (emits[k] == 1 ? length - 1 - t : t) * bytes);
        }
        for (size_t k = 0; k < outputs; ++k)
            if (emits[k] == -1) std::swap(job.value[k].bytes, job.next[k].bytes);
        release_slots(program);  // the pool kept for the next step
    }
}

// The job's outputs as program_scan returns them, or null with its error set. The program's memory is the
// caller's to give back (end_run).
PyObject *scan_results(const ScanJob &job) {
    PyObject *results = job.error.empty() ? PyList_New(0) : nullptr;
    for (size_t k = 0; k < job.value.size(); ++k) {
        const Carried &v = job.value[k];
        std::vector<int64_t> dims(v.dims);
        if (job.emits[k] != -1) dims.insert(dims.begin(), job.length);
        append_result(results, dims, v.type, (Py_ssize_t)v.bytes.size(),
                      [&](char *to) { std::memcpy(to, v.bytes.data(), v.bytes.size()); });
    }
    if (!job.error.empty())
        PyErr_SetString(job.unsupported ? PyExc_NotImplementedError : PyExc_RuntimeError, job.error.c_str());
    return results;
}

PyObject *py_program_scan(PyObject *, PyObject *args) {
    PyObject *capsule, *arrays_o, *roles_o, *emits_o;
    if (!PyArg_ParseTuple(args, "OOOO", &capsule, &arrays_o, &roles_o, &emits_o)) return nullptr;
    ScanJob job;
    if (!parse_scan(capsule, arrays_o, roles_o, emits_o, job)) return nullptr;
    guarded(job.error, job.unsupported, [&] {
        const lpt_parallel::Busy busy(job.program->opens_loops);
        run_scan(job);
    });
    PyObject *results = scan_results(job);
    std::lock_guard<std::mutex> guard(job.program->lock);
    end_run(*job.program);
    return results;
}

const char PROGRAM_SCANS_DOC[] =
    "program_scans(scans, threads) -> [[ndarray], ...]\n\n"
    "Independent Scans at once, each on one of up to `threads` threads: scans, a list of (program, arrays,\n"
    "roles, emits) as program_scan takes them, whose programs are distinct and run on one thread each.\n"
    "Returns each one's outputs; raises what the first that failed raised.";

PyObject *py_program_scans(PyObject *, PyObject *args) {
    PyObject *scans_o;
    int threads;
    if (!PyArg_ParseTuple(args, "Oi", &scans_o, &threads)) return nullptr;
    const Py_ssize_t count = PySequence_Size(scans_o);
    if (count < 0) return nullptr;
    std::vector<ScanJob> jobs(count);
    for (Py_ssize_t j = 0; j < count; ++j) {
        PyObject *scan = PySequence_GetItem(scans_o, j);
        PyObject *capsule, *arrays_o, *roles_o, *emits_o;
        const bool ok = scan && PyArg_ParseTuple(scan, "OOOO", &capsule, &arrays_o, &roles_o, &emits_o) &&
                        parse_scan(capsule, arrays_o, roles_o, emits_o, jobs[j]);
        Py_XDECREF(scan);
        if (!ok) return nullptr;
        for (Py_ssize_t i = 0; i < j; ++i)
            if (jobs[i].program == jobs[j].program) {
                PyErr_SetString(PyExc_ValueError, "program_scans: a program given twice");
                return nullptr;
            }
        if (jobs[j].program->threads != 1) {
            PyErr_SetString(PyExc_ValueError, "program_scans: a program of more than one thread");
            return nullptr;
        }
    }
    std::string error;
    bool unsupported = false;
    guarded(error, unsupported, [&] {
        const lpt_parallel::Busy busy(true);
        lpt_parallel::run(std::max(1, threads), count, 1, [&](lpt_parallel::Chunks &chunks) {
            for (int64_t j; chunks.next(j);) captured(jobs[j].error, jobs[j].unsupported, [&] { run_scan(jobs[j]); });
        });
    });
    PyObject *all = error.empty() ? PyList_New(0) : nullptr;
    for (ScanJob &job : jobs) {
        if (job.error.empty() && !error.empty()) job.error = error;
        PyObject *results = scan_results(job);
        if (!results) Py_CLEAR(all);  // the first error stays set
        else if (all && PyList_Append(all, results) < 0) Py_CLEAR(all);
        Py_XDECREF(results);
        if (!all) break;
    }
    for (ScanJob &job : jobs) {  // every program gives its memory back, after an error too
        std::lock_guard<std::mutex> guard(job.program->lock);
        end_run(*job.program);
    }
    return all;
}

PyObject *py_program_seconds(PyObject *, PyObject *args) {
    PyObject *capsule;
    if (!PyArg_ParseTuple(args, "O", &capsule)) return nullptr;
    auto *program = static_cast<Program *>(PyCapsule_GetPointer(capsule, PROGRAM_CAPSULE));
    if (!program) return nullptr;
    std::lock_guard<std::mutex> guard(program->lock);
    PyObject *list = PyList_New((Py_ssize_t)program->seconds.size());
    for (size_t i = 0; list && i < program->seconds.size(); ++i)
        PyList_SET_ITEM(list, (Py_ssize_t)i, PyFloat_FromDouble(program->seconds[i]));
    return list;
}

PyObject *py_stages(PyObject *, PyObject *args) {
    PyObject *capsule;
    if (!PyArg_ParseTuple(args, "O", &capsule)) return nullptr;
    Operation *op = operation(capsule);
    if (!op) return nullptr;
    return PyBool_FromLong(op->onednn_stage || !op->stem.words.empty());
}

PyObject *py_implementation(PyObject *, PyObject *args) {
    PyObject *capsule;
    if (!PyArg_ParseTuple(args, "O", &capsule)) return nullptr;
    Operation *op = operation(capsule);
    if (!op) return nullptr;
    return PyUnicode_FromString(op->last_impl.c_str());
}

const char DYNAMIC_QUANTIZE_DOC[] =
    "dynamic_quantize(x, out, threads) -> (scale, zero_point)\n\n"
    "ONNX DynamicQuantizeLinear of x (float32, C-contiguous) into out (uint8, as many values), exactly as\n"
    "lpt.numerics.dynamic_quantize_linear.";

PyObject *py_dynamic_quantize(PyObject *, PyObject *args) {
    PyObject *x_o, *out_o;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOi", &x_o, &out_o, &threads)) return nullptr;
    Buffer x, out;
    if (!x.get(x_o, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) ||
        !out.get(out_o, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE))
        return nullptr;
    if (x.format() != 'f' || out.format() != 'B' || out.view.len * 4 != x.view.len) {
        PyErr_SetString(PyExc_TypeError, "x must be float32 and out uint8, of as many values");
        return nullptr;
    }
    float scale = 1.0f;
    int zero_point = 0;
    Py_BEGIN_ALLOW_THREADS;
    lpt_ops::dynamic_quantize(static_cast<const float *>(x.view.buf), out.view.len,
                              static_cast<uint8_t *>(out.view.buf), scale, zero_point, std::max(threads, 1));
    Py_END_ALLOW_THREADS;
    return Py_BuildValue("(di)", (double)scale, zero_point);
}

PyObject *py_version(PyObject *, PyObject *) {
    const dnnl_version_t *v = dnnl_version();
    return Py_BuildValue("(iiis)", v->major, v->minor, v->patch, v->hash);
}

PyObject *py_s16_supported(PyObject *, PyObject *) { return PyBool_FromLong(lpt_s16::supported()); }

PyObject *py_float_lanes(PyObject *, PyObject *args) {
    int allowed;
    if (!PyArg_ParseTuple(args, "p", &allowed)) return nullptr;
    return PyBool_FromLong(lpt_ops::allow_eight_lanes(allowed));
}

PyObject *py_hold_pool(PyObject *, PyObject *) {
    lpt_parallel::hold();
    Py_RETURN_NONE;
}

PyObject *py_release_pool(PyObject *, PyObject *) {
    lpt_parallel::release();
    Py_RETURN_NONE;
}

PyObject *py_pool_holds(PyObject *, PyObject *) { return PyLong_FromLong(lpt_parallel::holds()); }

PyObject *py_gelu_fast_worst_ratio(PyObject *, PyObject *args) {
    unsigned int first, last;
    int threads;
    if (!PyArg_ParseTuple(args, "IIi", &first, &last, &threads)) return nullptr;
    if (!lpt_s16::sixteen_lanes() && !lpt_s16::fused_multiply_add()) {
        PyErr_SetString(PyExc_RuntimeError, "the GELU stage's approximation needs AVX-512, or AVX2 and FMA");
        return nullptr;
    }
    if (first % 16 || last % 16 || last < first) {
        PyErr_SetString(PyExc_ValueError, "first and last must be multiples of 16, first <= last");
        return nullptr;
    }
    float at = 0.0f;
    double worst;
    Py_BEGIN_ALLOW_THREADS;
    worst = lpt_s16::gelu_fast_worst_ratio(first, last, std::max(1, threads), &at);
    Py_END_ALLOW_THREADS;
    return Py_BuildValue("(dd)", worst, (double)at);
}

PyMethodDef methods[] = {
        {"conv", py_conv, METH_VARARGS, CONV_DOC},
        {"matmul", py_matmul, METH_VARARGS, MATMUL_DOC},
        {"product", py_product, METH_VARARGS, PRODUCT_DOC},
        {"run", py_run, METH_VARARGS, RUN_DOC},
        {"dynamic_quantize", py_dynamic_quantize, METH_VARARGS, DYNAMIC_QUANTIZE_DOC},
        {"implementation", py_implementation, METH_VARARGS, "the oneDNN implementation last prepared (impl_info_str)"},
        {"stages", py_stages, METH_VARARGS,
         "whether the operation's kernel applies its output stage as it goes (oneDNN's primitive, or lpt_stem's), on 8-bit runs"},
        {"version", py_version, METH_NOARGS, "oneDNN's (major, minor, patch, commit)"},
        {"s16_supported", py_s16_supported, METH_NOARGS, "whether this CPU runs the s16 route (AVX2)"},
        {"float_lanes", py_float_lanes, METH_VARARGS,
         "float_lanes(allowed) -> previous: whether programs' float32 ops may take eight lanes (AVX2) at a time"},
        {"hold_pool", py_hold_pool, METH_NOARGS,
         "hold_pool(): the pool's workers spin between loops until release_pool() (lpt_parallel::hold)"},
        {"release_pool", py_release_pool, METH_NOARGS, "release_pool(): ends one hold_pool()"},
        {"pool_holds", py_pool_holds, METH_NOARGS, "pool_holds() -> the holds (and native program runs) open now"},
        {"gelu_fast_worst_ratio", py_gelu_fast_worst_ratio, METH_VARARGS,
         "gelu_fast_worst_ratio(first, last, threads) -> (ratio, x): the GELU stage approximation's largest error "
         "against its bound (gelu512.h, or gelu256.h without AVX-512) over the float32 values whose bits are in [first, last)"},
        {"program", py_program, METH_VARARGS, "program(instructions, slots, inputs, outputs, threads) -> program"},
        {"program_run", py_program_run, METH_VARARGS, PROGRAM_RUN_DOC},
        {"program_scan", py_program_scan, METH_VARARGS, PROGRAM_SCAN_DOC},
        {"program_scans", py_program_scans, METH_VARARGS, PROGRAM_SCANS_DOC},
        {"program_seconds", py_program_seconds, METH_VARARGS, "program_seconds(program) -> each instruction's seconds in the last run"},
        {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_engine",
                      "int8 convolution and matmul on oneDNN with lpt's exact output stage", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__engine(void) {
    output_block_type.tp_name = "_engine.OutputBlock";
    output_block_type.tp_doc = "A program's output: its bytes, through the buffer protocol.";
    output_block_type.tp_basicsize = sizeof(OutputBlock);
    output_block_type.tp_flags = Py_TPFLAGS_DEFAULT;
    output_block_type.tp_dealloc = output_block_dealloc;
    output_block_type.tp_as_buffer = &output_block_procs;
    if (PyType_Ready(&output_block_type) < 0) return nullptr;
    return PyModule_Create(&module);
}
