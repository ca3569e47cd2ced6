// polyfuse's thread pool in C with pthreads, for ahead-of-time bundles that ask for
// threads (the in-process runtime has the same pool in C++, thread_pool.h). It defines
// the parallel-for that generated kernels call:
//
//     typedef void (*polyfuse_body)(int64_t begin, int64_t end, void *ctx);
//     void polyfuse_parallel_for_threads(polyfuse_body, int64_t n, void *ctx, int64_t threads);
//
// [0, n) is cut into min(n, 4 x threads) contiguous chunks that the calling thread and
// the workers claim one at a time (a dynamic schedule). Workers start on the first
// region and then wait on a condition variable. The pool's size is
// polyfuse_set_num_threads(n) when called (n clamped to 1..POLYFUSE_MAX_THREADS), else
// what num_threads.h reads from $POLYFUSE_NUM_THREADS (a refused value is reported on
// stderr and gives one thread per online CPU); `threads` caps one region (0 or less: the
// pool's size). A region started inside a body runs inline. The symbols are weak, so two
// bundles with threads link into one program (sharing one pool).

#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "num_threads.h"

typedef void (*polyfuse_body)(int64_t begin, int64_t end, void *ctx);

#define CHUNKS_PER_THREAD 4

struct job {
    polyfuse_body body;
    void *ctx;
    int64_t n, chunks, threads;
};

static pthread_mutex_t submit_mu = PTHREAD_MUTEX_INITIALIZER;  // one region at a time
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;         // job, generation, pending
static pthread_cond_t wake_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static struct job job;
static uint64_t generation;          // bumped once per region, under mu
static int64_t pending;              // chunks of the region not yet done, under mu
static _Atomic uint64_t ticket;      // (region << 32) | the next chunk to claim
static int pool_size, workers;       // under submit_mu
static _Thread_local int inside;     // on workers, and on a caller running its chunks

static int default_size(void) {
    char problem[256];
    int n = polyfuse_num_threads_from_env(problem, sizeof problem);
    if (problem[0]) fprintf(stderr, "polyfuse: %s\n", problem);
    return n;
}

__attribute__((weak)) void polyfuse_set_num_threads(int n) {
    pthread_mutex_lock(&submit_mu);
    // workers already started stay; a smaller size leaves them idle
    pool_size = n < 1 ? 1 : n > POLYFUSE_MAX_THREADS ? POLYFUSE_MAX_THREADS : n;
    pthread_mutex_unlock(&submit_mu);
}

__attribute__((weak)) int polyfuse_get_num_threads(void) {
    pthread_mutex_lock(&submit_mu);
    if (!pool_size) pool_size = default_size();
    int n = pool_size;
    pthread_mutex_unlock(&submit_mu);
    return n;
}

static int claim(uint64_t region, int64_t chunks, int64_t *chunk) {
    uint64_t t = atomic_load(&ticket);
    for (;;) {
        if ((t >> 32) != (region & 0xffffffffu) || (int64_t)(t & 0xffffffffu) >= chunks) return 0;
        if (atomic_compare_exchange_weak(&ticket, &t, t + 1)) {
            *chunk = (int64_t)(t & 0xffffffffu);
            return 1;
        }
    }
}

static void work(struct job j, uint64_t region) {
    int64_t chunk, base = j.n / j.chunks, extra = j.n % j.chunks;
    while (claim(region, j.chunks, &chunk)) {
        int64_t begin = chunk * base + (chunk < extra ? chunk : extra);
        j.body(begin, begin + base + (chunk < extra ? 1 : 0), j.ctx);
        pthread_mutex_lock(&mu);
        if (--pending == 0) pthread_cond_signal(&done_cv);
        pthread_mutex_unlock(&mu);
    }
}

static void *worker_main(void *arg) {
    int64_t index = (int64_t)(intptr_t)arg;
    uint64_t seen;
    inside = 1;
    pthread_mutex_lock(&mu);
    seen = generation;
    for (;;) {
        while (generation == seen) pthread_cond_wait(&wake_cv, &mu);
        seen = generation;
        struct job j = job;
        pthread_mutex_unlock(&mu);
        if (index < j.threads) work(j, seen);
        pthread_mutex_lock(&mu);
    }
    return NULL;
}

__attribute__((weak)) void polyfuse_parallel_for_threads(polyfuse_body body, int64_t n, void *ctx,
                                                         int64_t max_threads) {
    if (n <= 0) return;
    if (inside) {
        body(0, n, ctx);
        return;
    }
    pthread_mutex_lock(&submit_mu);
    if (!pool_size) pool_size = default_size();
    int64_t threads = pool_size;
    if (max_threads > 0 && max_threads < threads) threads = max_threads;
    if (n < threads) threads = n;
    while (workers + 1 < threads) {  // start the workers this region needs
        pthread_t t;
        if (pthread_create(&t, NULL, worker_main, (void *)(intptr_t)(workers + 1)) != 0) break;
        pthread_detach(t);
        ++workers;
    }
    if (threads > workers + 1) threads = workers + 1;
    if (threads <= 1) {
        pthread_mutex_unlock(&submit_mu);
        body(0, n, ctx);
        return;
    }
    int64_t chunks = n < threads * CHUNKS_PER_THREAD ? n : threads * CHUNKS_PER_THREAD;
    pthread_mutex_lock(&mu);
    job = (struct job){body, ctx, n, chunks, threads};
    pending = chunks;
    uint64_t region = ++generation;
    atomic_store(&ticket, region << 32);
    pthread_cond_broadcast(&wake_cv);
    pthread_mutex_unlock(&mu);
    inside = 1;
    work(job, region);
    inside = 0;
    pthread_mutex_lock(&mu);
    while (pending != 0) pthread_cond_wait(&done_cv, &mu);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&submit_mu);
}

__attribute__((weak)) void polyfuse_parallel_for(polyfuse_body body, int64_t n, void *ctx) {
    polyfuse_parallel_for_threads(body, n, ctx, 0);
}
