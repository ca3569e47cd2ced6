// The thread pool behind polyfuse_parallel_for; included by runtime.cpp only.
//
// One region runs at a time. [0, n) is cut into min(n, 4 x threads) contiguous chunks
// that the calling thread and the workers claim one at a time (a dynamic schedule):
// a worker that wakes late, or a core the machine takes away for a while, leaves its
// chunks to the others instead of holding the region up. Idle workers spin briefly,
// then sleep on a condition variable.

#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

extern "C" typedef void (*polyfuse_body)(int64_t begin, int64_t end, void* ctx);

namespace polyfuse {

// A model's kernels re-wake the pool every few tens of microseconds (the serial ones
// between them included), so threads spin this many pause instructions (about 200 us
// on Zen 5, 10 ns each) before sleeping on a condition variable: waking a sleeping
// worker cost more than a small kernel saves (MobileNetV3-Small ran slower on two
// threads than on one with 10 us of spinning).
constexpr int kSpinIterations = 20000;

// Chunks per thread of a region: enough to even out late or slow threads.
constexpr int64_t kChunksPerThread = 4;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// True on pool workers, and on a caller while it runs its own chunk: a parallel-for
// issued from there runs inline, which is what keeps nesting free of deadlock.
inline thread_local bool t_inside_parallel = false;

// Chunk `i` of `chunks` contiguous chunks of [0, n), without overflowing i * n.
inline void run_chunk(polyfuse_body body, int64_t n, int64_t chunks, int64_t i, void* ctx) {
    int64_t base = n / chunks, extra = n % chunks;
    int64_t begin = i * base + std::min(i, extra);
    body(begin, begin + base + (i < extra ? 1 : 0), ctx);
}

class ThreadPool {
public:
    explicit ThreadPool(int num_threads) : num_threads_(num_threads) {}

    int num_threads() const { return num_threads_.load(std::memory_order_relaxed); }

    void set_num_threads(int n) {
        std::lock_guard<std::mutex> submit(submit_mu_);
        if (n == num_threads()) return;
        stop_workers();  // restarted lazily, at the new size, by the next parallel-for
        num_threads_.store(n, std::memory_order_relaxed);
    }

    // Dynamic schedule: the caller and the workers claim chunks until none are left.
    void parallel_for(polyfuse_body body, int64_t n, void* ctx, int64_t max_threads) {
        if (n <= 0) return;
        if (t_inside_parallel || threads_for(n, max_threads) <= 1) {
            body(0, n, ctx);
            return;
        }
        // One region at a time: other threads' regions wait here, not in the workers.
        std::lock_guard<std::mutex> submit(submit_mu_);
        int64_t threads = threads_for(n, max_threads);  // the size may have changed meanwhile
        if (threads <= 1) {
            body(0, n, ctx);
            return;
        }
        if (workers_.size() + 1 < static_cast<size_t>(num_threads())) start_workers();
        int64_t chunks = std::min(n, threads * kChunksPerThread);
        uint64_t region;
        {
            std::lock_guard<std::mutex> lock(mu_);
            job_ = Job{body, ctx, n, chunks, threads};
            pending_.store(chunks, std::memory_order_relaxed);
            region = generation_.fetch_add(1, std::memory_order_release) + 1;
            ticket_.store(region << 32, std::memory_order_release);
        }
        wake_cv_.notify_all();
        t_inside_parallel = true;
        work(job_, region);
        t_inside_parallel = false;
        for (int i = 0; i < kSpinIterations && pending_.load(std::memory_order_acquire) != 0; ++i)
            cpu_relax();
        if (pending_.load(std::memory_order_acquire) != 0) {
            std::unique_lock<std::mutex> lock(mu_);
            done_cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
        }
    }

private:
    struct Job {
        polyfuse_body body;
        void* ctx;
        int64_t n;
        int64_t chunks;
        int64_t threads;  // the caller and workers 1 .. threads - 1 take part
    };

    int64_t threads_for(int64_t n, int64_t max_threads) const {
        int64_t threads = num_threads();
        if (max_threads > 0) threads = std::min(threads, max_threads);
        return std::min(threads, n);
    }

    // Claims the next chunk of region `region`; false once the region has none left (or
    // is over: a worker holding a stale copy of the job claims nothing of the next one,
    // because the region's number and the next chunk share one atomic word).
    bool claim(uint64_t region, int64_t chunks, int64_t* chunk) {
        uint64_t ticket = ticket_.load(std::memory_order_acquire);
        for (;;) {
            if ((ticket >> 32) != (region & 0xffffffffu) ||
                static_cast<int64_t>(ticket & 0xffffffffu) >= chunks)
                return false;
            if (ticket_.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel,
                                              std::memory_order_acquire)) {
                *chunk = static_cast<int64_t>(ticket & 0xffffffffu);
                return true;
            }
        }
    }

    // Runs chunks of the region until none are left; the last one done wakes the caller.
    void work(const Job& job, uint64_t region) {
        int64_t chunk;
        while (claim(region, job.chunks, &chunk)) {
            run_chunk(job.body, job.n, job.chunks, chunk, job.ctx);
            if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                std::lock_guard<std::mutex> lock(mu_);
                done_cv_.notify_one();
            }
        }
    }

    void start_workers() {  // under submit_mu_: no region is running
        uint64_t now = generation_.load(std::memory_order_relaxed);
        for (int k = static_cast<int>(workers_.size()) + 1; k < num_threads(); ++k)
            workers_.emplace_back([this, k, now] { worker_loop(k, now); });
    }

    void stop_workers() {  // under submit_mu_
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        wake_cv_.notify_all();
        for (std::thread& t : workers_) t.join();
        workers_.clear();
        stop_ = false;
    }

    void worker_loop(int64_t index, uint64_t seen) {
        t_inside_parallel = true;
        for (;;) {
            for (int i = 0; i < kSpinIterations && generation_.load(std::memory_order_acquire) == seen; ++i)
                cpu_relax();
            Job job;
            {
                std::unique_lock<std::mutex> lock(mu_);
                wake_cv_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_relaxed) != seen; });
                if (stop_) return;
                seen = generation_.load(std::memory_order_relaxed);
                job = job_;
            }
            // A region cannot end (and job_ cannot be replaced) before every chunk
            // claimed in it is done; claims of a finished region fail.
            if (index >= job.threads) continue;
            work(job, seen);
        }
    }

    std::mutex submit_mu_;        // held for a whole region, and to resize the pool
    std::mutex mu_;               // guards job_ and stop_; pairs with both condition variables
    std::condition_variable wake_cv_, done_cv_;
    std::vector<std::thread> workers_;  // workers 1 .. n - 1; the caller is "worker 0"
    std::atomic<int> num_threads_;
    std::atomic<uint64_t> generation_{0};  // bumped once per region
    std::atomic<int64_t> pending_{0};      // chunks of the current region not yet done
    std::atomic<uint64_t> ticket_{0};      // (region << 32) | the next chunk to claim
    Job job_{};
    bool stop_ = false;
};

}  // namespace polyfuse
