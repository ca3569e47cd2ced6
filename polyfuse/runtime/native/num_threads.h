// The default size of polyfuse's thread pools, from $POLYFUSE_NUM_THREADS: the one reader
// of the variable, for the in-process runtime (runtime.cpp) and for the C pool of
// ahead-of-time bundles (thread_pool.c). C11 and C++17.
//
// Unset, empty or blank: one thread per online CPU (at most POLYFUSE_MAX_THREADS).
// Otherwise a whole number from 1 to POLYFUSE_MAX_THREADS, blanks around it allowed.
// Anything else is refused: a non-number ("many", "2.5", "4x", "0x10"), 0, a negative,
// more than POLYFUSE_MAX_THREADS (an overflowing one included). A refused value never
// picks a size of its own: the pool takes the default, one thread per CPU, and the caller
// reports why (runtime.cpp as a Python RuntimeWarning, thread_pool.c on stderr), so a
// mistyped value is neither fatal to a program that would run anyway nor silent.

#ifndef POLYFUSE_NUM_THREADS_H
#define POLYFUSE_NUM_THREADS_H

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

// The largest pool; the Python API's set_num_threads() and options share it
// (polyfuse/scheduler/options.py's THREADS_MAX).
#define POLYFUSE_MAX_THREADS 4096

static inline int polyfuse_online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > POLYFUSE_MAX_THREADS ? POLYFUSE_MAX_THREADS : (int)n;
}

// The pool's size that $POLYFUSE_NUM_THREADS asks for. `problem` (`size` bytes) is left
// empty, or, for a refused value, holds a sentence saying so and what is used instead.
static inline int polyfuse_num_threads_from_env(char *problem, size_t size) {
    const char *text = getenv("POLYFUSE_NUM_THREADS");
    int fallback = polyfuse_online_cpus();
    if (size > 0) problem[0] = '\0';
    if (text == NULL) return fallback;
    const char *start = text;
    while (isspace((unsigned char)*start)) ++start;
    if (*start == '\0') return fallback;
    char *end = NULL;
    errno = 0;
    long n = strtol(start, &end, 10);
    while (isspace((unsigned char)*end)) ++end;
    if (end != start && *end == '\0' && errno == 0 && n >= 1 && n <= POLYFUSE_MAX_THREADS) return (int)n;
    snprintf(problem, size, "POLYFUSE_NUM_THREADS='%s' is not a whole number from 1 to %d; using %d threads, "
             "one per CPU", text, POLYFUSE_MAX_THREADS, fallback);
    return fallback;
}

#endif
