// The engine's loops over threads: the calling thread and a few pool workers take chunks of a loop's
// indices as each is free, so a worker that is late (asleep, descheduled, its core halted by the
// hypervisor) only does less of the loop; nobody waits for it to start.
//
// Why not OpenMP's: with OpenMP every loop ends at a barrier of all its threads. Its threads either
// spin between loops (and then take the cores from onnxruntime's regions and from everything else
// between runs) or sleep (OMP_WAIT_POLICY=PASSIVE), and then every loop pays a wake-up. Measured on a
// 2-core cloud VM: plcmos_v2's 57-step program ran in 6.7 ms back to back and 12.9 ms after 0.2 s
// idle, slower than on one thread (12.5), until ~50 ms of runs had warmed the wake-ups again.
// Here the workers spin between the loops of a native program run or of a plan's run (`Busy`, `hold`:
// parallel.cpp says for how long), and sleep otherwise.
//
// Which thread computes which index never changes a result: every loop writes disjoint outputs.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace lpt_parallel {

// The indices of one loop, handed out in chunks to whichever thread asks next.
class Chunks {
public:
    Chunks(std::atomic<int64_t> *next, int64_t n, int64_t grain) : next_(next), n_(n), grain_(grain) {}
    // The next chunk [begin, end) for this thread; false when the loop has none left.
    bool next(int64_t &begin, int64_t &end) {
        begin = next_->fetch_add(grain_, std::memory_order_relaxed);
        if (begin >= n_) return false;
        end = std::min(n_, begin + grain_);
        return true;
    }
    // The next index for this thread (from its chunk, or a new one); false when the loop has none left.
    bool next(int64_t &i) {
        if (at_ == end_ && !next(at_, end_)) return false;
        i = at_++;
        return true;
    }

private:
    std::atomic<int64_t> *next_;
    int64_t n_, grain_, at_ = 0, end_ = 0;
};

using Task = void (*)(void *context, Chunks &chunks);

// task(context, chunks) on the calling thread and on up to threads − 1 workers, each taking chunks of
// [0, n) (`grain` indices each; 0: about 8 per thread) until none is left; returns when all are done.
void run_erased(int threads, int64_t n, int64_t grain, Task task, void *context);

// task(chunks) once on each thread that joins the loop: per-thread scratch lives in the task.
template <typename F>
void run(int threads, int64_t n, int64_t grain, F &&task) {
    run_erased(threads, n, grain, [](void *f, Chunks &chunks) { (*static_cast<F *>(f))(chunks); }, &task);
}

// body(i) for each i in [0, n), on `threads` threads. Give it a lambda that captures by value ([=]):
// each thread runs its own copy, whose captures the compiler then keeps in registers. Captured by
// reference, they are read through pointers that a store through an 8-bit pointer may alias, so
// the loop reloads them after every such store and is not vectorized (an integer MaxPool ran 7×
// slower so).
template <typename F>
void for_each(int threads, int64_t n, const F &body) {
    run(threads, n, 0, [&body](Chunks &chunks) {
        const F local = body;
        for (int64_t begin, end; chunks.next(begin, end);)
            for (int64_t i = begin; i < end; ++i) local(i);
    });
}

// While one lives, the workers spin between loops instead of sleeping: a native program's run,
// whose loops follow each other within microseconds. With `wake_sleepers`, workers asleep are woken
// as it starts, to spin until its first loop: in a VM, waking a sleeping worker at a loop took that
// loop tens of microseconds (the PaddleOCR recognizer's first matmul after its shape arithmetic took
// 0.076-0.093 ms so, 0.031-0.032 woken ahead; its plan 4.96-5.05 -> 4.83-5.01 ms, three rounds
// alternating on a Xeon with AMX, 2 threads). Worth it only where a loop follows: woken at every run,
// silero_vad_16k_op15's small programs, which open none, lost a few microseconds each to the call.
struct Busy {
    explicit Busy(bool wake_sleepers = false);
    ~Busy();
    Busy(const Busy &) = delete;
    Busy &operator=(const Busy &) = delete;
};

// What Busy does, for a caller that spans calls from Python (a compiled plan's run: its steps outside the
// engine run between the engine's loops). Each hold() is ended by one release().
void hold();
void release();
int holds();  // open now, Busy's counted

// How many loops callers have opened to the workers so far: a run that opened none leaves it as it was.
uint64_t loops_opened();

}  // namespace lpt_parallel
