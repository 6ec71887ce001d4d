/*
 * bench/bench_common.h — timing and memory helpers shared by the benchmarks (each
 * bench program includes it and gets its own static copies).
 */
#ifndef KVQ_BENCH_COMMON_H
#define KVQ_BENCH_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kvq/gguf.h"
#include "kvq/half.h"
#include "kvq/util.h"

/* Bytes streamed through the caches before a cold measurement: more than the last
 * level cache of the machines measured (105 MiB here). */
#define BENCH_FLUSH_BYTES ((size_t)256 << 20)

/* Keeps results alive so the compiler does not drop the loads that made them. */
static volatile uint64_t bench_sink;

/* Process CPU time in seconds, all threads: on a shared machine the wall clock also
 * counts the time other processes held the core; CPU time counts only ours (memory
 * stalls included). */
static inline double bench_cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Wall-clock seconds (CLOCK_MONOTONIC). */
static inline double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A quantized weight of `bytes` bytes (Q4_1 or Q8_0 blocks) with random bytes from r and
 * every block's scale (and Q4_1's minimum) 0.01, so every value is finite. */
static inline void bench_random_quant(uint32_t type, uint8_t *w, size_t bytes, kvq_rng *r)
{
    for (size_t i = 0; i < bytes; i++)
        w[i] = (uint8_t)kvq_rng_u64(r);
    const int bb = type == KVQ_GGML_Q4_1 ? 20 : 34;
    for (size_t b = 0; b < bytes / (size_t)bb; b++) { /* finite d, m */
        const uint16_t h = kvq_f32_to_f16_ref(0.01f);
        memcpy(w + b * (size_t)bb, &h, 2);
        if (type == KVQ_GGML_Q4_1)
            memcpy(w + b * (size_t)bb + 2, &h, 2);
    }
}

/* Streams buf (BENCH_FLUSH_BYTES) through the caches so the next measurement starts
 * cold. */
static inline void bench_flush_caches(uint64_t *buf)
{
    uint64_t s = 0;
    const size_t n = BENCH_FLUSH_BYTES / sizeof *buf;
    for (size_t i = 0; i < n; i += 8) {
        buf[i] += 1;
        s += buf[i];
    }
    bench_sink += s;
}

/* An array as the runtime allocates its KV cache (runtime/cache/cache.c): 2 MiB aligned
 * and advised for transparent huge pages. Free with free(). */
static inline void *bench_cache_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, (size_t)2 << 20, bytes))
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

#endif /* KVQ_BENCH_COMMON_H */
