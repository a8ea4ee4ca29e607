// The pool behind lpt_parallel::run (parallel.h).
//
// One loop is open at a time. A caller publishes it (`job`, `wanted`), opens it (`inside` = 0) and
// bumps `generation`; a worker that sees the new generation joins by raising `inside` while it is
// below `wanted`, takes chunks until none is left, and leaves. The caller takes chunks too, then
// closes the loop by turning `inside` from 0 to −1: a worker that comes later finds it closed.
// A second caller (another Python thread, or a loop inside a loop's task) does not wait: it runs its
// loop alone.
#include "parallel.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace lpt_parallel {
namespace {

// How long a worker spins for the next loop before it sleeps: inside a program run, the gap between
// two loops; outside, only the gap between two calls from Python. Longer spins keep more runs fast
// after the machine idled, but take the cores from other processes. Measured with two processes of
// 2 threads on 2 cores (plcmos_v2 and dnsmos_p808 side by side): OpenMP asleep 13.0 / 10.7 ms, spins
// of 1 ms 16.4 / 15.2, of 100 µs 12.3 / 11.0; alone after 0.2 s idle, plcmos_v2 12.9 (OpenMP), 8.0
// (1 ms), 7.7 (100 µs), 9.1 (30 µs).
constexpr auto SPIN_BUSY = std::chrono::microseconds(100);
// SPIN_IDLE counts from the last moment a worker saw the pool held, not from its last loop: counted from the
// loop, a worker still waiting for the next run's first loop slept whenever it looked in the few microseconds
// between two runs of a plan, and every run paid its wake-up (silero_vad_16k_op15, whose first program opens a
// loop and whose onnxruntime regions follow: a sleep and a wake each run, 190-220 -> 116-139 µs a run;
// oww_embedding_model 0.33-0.55 -> 0.29-0.30 ms, magika 0.93-0.99 -> 0.86-0.94; the others within their noise).
constexpr auto SPIN_IDLE = std::chrono::microseconds(50);
// While the pool is held, a worker past SPIN_BUSY spins on up to SPIN_YIELDING, giving its CPU to any
// other thread that wants it at each look (sched_yield): a plan's steps outside the engine (onnxruntime's
// regions, NumPy) run meanwhile, and its next loop finds the worker awake. In a VM, a worker asleep costs
// the loop that wakes it tens of microseconds (its vCPU halted), and so does each onnxruntime worker woken
// on a halted vCPU. ddddocr_common_old_dynq, whose 110 steps alternate between the engine and onnxruntime
// every 0.05-0.3 ms: 12.4-13.6 -> 9.8-10.8 ms a run (sets of two rounds alternating, a Xeon with AMX, 2
// threads); its DynamicQuantizeLinear took 0.13 ms after an onnxruntime region and 0.03 when called again
// at once. Spinning as long without the yield: 11.9 ms against 13.8-14.0 (onnxruntime's threads waited).
// The other corpus models moved within their noise. An onnxruntime region of two threads lifts the hold while
// it runs (lpt.native.workers_let_go): it ran slower with the worker spinning so (dnsmos_sig_bak_ovr's STFT
// region 1.13-1.16 ms in its plan, 0.78-0.81 let go).
constexpr auto SPIN_YIELDING = std::chrono::microseconds(1000);

struct Job {
    Task task;
    void *context;
    int64_t n, grain;
    std::atomic<int64_t> next{0};
};

struct Pool {
    std::atomic<bool> claimed{false};  // a loop is open (or being opened or closed)
    std::atomic<uint64_t> generation{0};
    std::atomic<int> inside{-1};       // workers in the open loop; −1: no loop is open
    std::atomic<int> wanted{0};        // workers the open loop takes
    std::atomic<Job *> job{nullptr};
    std::atomic<int> busy{0};
    std::atomic<int> sleepers{0};
    std::atomic<uint64_t> wakeups{0};  // Busy's calls to sleeping workers, which then spin for the next loop
    std::atomic<int> caller_cpu{-1};   // the CPU the open loop's caller was on as it opened it
    std::mutex sleep_lock;
    std::condition_variable wake;
    int workers = 0;                   // started so far (by the thread that claimed the pool)

    void work();
    void wait_for_loop(uint64_t seen);
    void step_aside() const;
};

// Never destroyed: detached workers may still be asleep on it when the process exits.
Pool *pool = new Pool;

void Pool::wait_for_loop(uint64_t seen) {
    const auto start = std::chrono::steady_clock::now();
    auto last_held = start;  // SPIN_IDLE counts from the end of a hold: a plan's next run may follow at once
    const uint64_t woken = wakeups.load(std::memory_order_acquire);
    for (int spins = 0; generation.load(std::memory_order_acquire) == seen; ++spins) {
        if (spins % 64 == 63) {
            const auto now = std::chrono::steady_clock::now();
            const auto spun = now - start;
            const bool held = busy.load(std::memory_order_relaxed) > 0;
            if (held) last_held = now;
            if (held && spun >= SPIN_BUSY && spun < SPIN_YIELDING) std::this_thread::yield();
            if (held ? spun >= SPIN_YIELDING : now - last_held >= SPIN_IDLE) {
                std::unique_lock<std::mutex> lock(sleep_lock);
                sleepers.fetch_add(1);  // seq_cst, against the caller's bump of `generation` then read of it
                wake.wait(lock, [&] { return generation.load() != seen || wakeups.load() != woken; });
                sleepers.fetch_sub(1);
                return;
            }
        }
        _mm_pause();
    }
}

// A worker the scheduler placed on its caller's CPU (on waking it, Linux may put a thread where its
// waker runs) takes turns with the caller there while another CPU idles, until the load balancer
// parts them, milliseconds later: oww_embedding_model's 0.6 ms runs took 0.9-2.3 ms for 15 runs so,
// after the process idled 0.1 s. Such a worker moves itself to another of the CPUs it may run on
// (pinned for the move, then allowed all of them again). Blocks of 20 ms of runs after 0.1 s idle,
// alternating in one process: oww_embedding_model 1.39 -> 0.93 ms (60 rounds, twice), dnsmos_p808 7.5 -> 6.2 ms
// (30), magika and the PaddleOCR recognizer unchanged (30).
void Pool::step_aside() const {
    const int here = sched_getcpu(), caller = caller_cpu.load(std::memory_order_relaxed);
    if (here < 0 || here != caller) return;
    cpu_set_t allowed, elsewhere;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    CPU_ZERO(&elsewhere);
    for (int i = 1; i < CPU_SETSIZE; ++i) {  // the next allowed CPU after the caller's
        const int cpu = (caller + i) % CPU_SETSIZE;
        if (CPU_ISSET(cpu, &allowed)) {
            CPU_SET(cpu, &elsewhere);
            break;
        }
    }
    if (CPU_COUNT(&elsewhere) && sched_setaffinity(0, sizeof elsewhere, &elsewhere) == 0)
        sched_setaffinity(0, sizeof allowed, &allowed);
}

void Pool::work() {
    uint64_t seen = generation.load(std::memory_order_acquire);
    for (;;) {
        wait_for_loop(seen);
        seen = generation.load(std::memory_order_acquire);
        bool joined = false;
        for (int count = inside.load(std::memory_order_acquire);
             !joined && count >= 0 && count < wanted.load(std::memory_order_acquire);)
            joined = inside.compare_exchange_weak(count, count + 1, std::memory_order_acq_rel);
        if (!joined) continue;
        step_aside();
        // Possibly a loop opened after `seen`: any open loop is as good
        Job *j = job.load(std::memory_order_acquire);
        Chunks chunks(&j->next, j->n, j->grain);
        j->task(j->context, chunks);
        inside.fetch_sub(1, std::memory_order_release);
    }
}

void start_afresh_after_fork() { pool = new Pool; }  // the child has none of the parent's workers

[[maybe_unused]] const bool registered = pthread_atfork(nullptr, nullptr, start_afresh_after_fork) == 0;

}  // namespace

void run_erased(int threads, int64_t n, int64_t grain, Task task, void *context) {
    if (n <= 0) return;
    if (grain <= 0) grain = std::max<int64_t>(1, n / (8 * std::max(threads, 1)));
    Job job{task, context, n, grain};
    Chunks mine(&job.next, n, grain);
    Pool &p = *pool;
    if (threads <= 1 || n <= grain || p.claimed.exchange(true, std::memory_order_acquire)) {
        task(context, mine);
        return;
    }
    for (; p.workers < threads - 1; ++p.workers) std::thread([&p] { p.work(); }).detach();
    p.job.store(&job, std::memory_order_release);
    p.wanted.store(threads - 1, std::memory_order_release);
    p.caller_cpu.store(sched_getcpu(), std::memory_order_relaxed);
    p.inside.store(0, std::memory_order_release);
    p.generation.fetch_add(1);  // seq_cst, against a worker's raise of `sleepers` then read of this
    if (p.sleepers.load() > 0) {
        std::lock_guard<std::mutex> lock(p.sleep_lock);
        p.wake.notify_all();
    }
    auto close = [&p] {  // after the workers inside have left; their writes are then visible here
        // A worker descheduled inside its chunk holds the loop open: past a few thousand spins, give it
        // this core.
        for (int count = 0, spins = 0; !p.inside.compare_exchange_weak(count, -1, std::memory_order_acq_rel);
             count = 0)
            if (++spins % 4096 == 0) std::this_thread::yield();
            else _mm_pause();
        p.claimed.store(false, std::memory_order_release);
    };
    try {
        task(context, mine);
    } catch (...) {
        job.next.store(n);  // no worker starts another chunk
        close();
        throw;
    }
    close();
}

void hold() { pool->busy.fetch_add(1, std::memory_order_relaxed); }
void release() { pool->busy.fetch_sub(1, std::memory_order_relaxed); }
int holds() { return pool->busy.load(std::memory_order_relaxed); }

Busy::Busy(bool wake_sleepers) {
    Pool &p = *pool;
    hold();
    if (wake_sleepers && p.sleepers.load() > 0) {
        std::lock_guard<std::mutex> lock(p.sleep_lock);
        p.wakeups.fetch_add(1);
        p.wake.notify_all();
    }
}
Busy::~Busy() { release(); }

uint64_t loops_opened() { return pool->generation.load(std::memory_order_relaxed); }

}  // namespace lpt_parallel
