/*
 * bench_gather.c — how fast one core reads a decode step's rows, by how they lie.
 *
 *   bench_gather [--rows-per-run LIST] [--fraction 0.06] [--heads 8] [--context 131072]
 *                [--reps 7] [--prefetch NEAR,FAR]
 *
 * The question behind the runtime's row order (docs/runtime.md "Row order"): a step
 * attends a few percent of the cached rows; in token order they are scattered, in code
 * order they come in runs (every token of a selected code). Per head, a K and a V array
 * of `context` rows of 256 bytes (d = 128 in f16), allocated like the runtime's cache
 * (2 MiB aligned, transparent huge pages); rows chosen as runs of R consecutive rows,
 * each run taken with probability fraction (seeded), until about fraction of the rows;
 * the chosen K rows then the chosen V rows of every head are read with plain loads and
 * summed, nothing else, from a cold cache (256 MiB streamed through first). The
 * baseline in the same process is a streaming read of the same number of bytes.
 * Prints GB/s per R and its ratio to the streaming rate; times are the best of reps
 * in process CPU time. --prefetch NEAR,FAR measures each R a second time with the
 * prefetches of the runtime's AVX-512 kernels (kvq_rk_logits / kvq_rk_mix,
 * runtime/kernels/kernels_avx512.c): every line of the row NEAR rows ahead into L1, of the row
 * FAR rows ahead into L2 (0 leaves one out): what a kernel that reads these rows could
 * get from the memory system on one core (docs/BENCHMARKS.md, "The two-stage step
 * against its floor").
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "kvq/util.h"

#include "bench/bench_common.h"

#define ROW_U64 32 /* 256 bytes: one f16 row of d = 128 */
#define FLUSH_BYTES BENCH_FLUSH_BYTES

/* A cache-like array of `bytes`, written once (so its pages exist). */
static uint64_t *filled_array(size_t bytes)
{
    uint64_t *p = bench_cache_alloc(bytes);
    if (p)
        memset(p, 1, bytes);
    return p;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_gather [--rows-per-run LIST] [--fraction F] [--heads H] "
                    "[--context N] [--reps R] [--prefetch NEAR,FAR]\n");
    return 2;
}

/* Sum of rows[0..m) of each array: plain loads, and with near/far > 0 the prefetches
 * of row i + near (every line, into L1) and row i + far (into L2) before row i. */
static uint64_t read_rows(uint64_t *const *arr, int64_t n_arr, const int32_t *rows, int64_t m,
                          int64_t near, int64_t far)
{
    uint64_t s = 0;
    for (int64_t a = 0; a < n_arr; a++) {
        const uint64_t *base = arr[a];
        for (int64_t i = 0; i < m; i++) {
            if (near && i + near < m)
                for (int t = 0; t < ROW_U64; t += 8)
                    __builtin_prefetch(base + (size_t)rows[i + near] * ROW_U64 + t, 0, 3);
            if (far && i + far < m)
                for (int t = 0; t < ROW_U64; t += 8)
                    __builtin_prefetch(base + (size_t)rows[i + far] * ROW_U64 + t, 0, 2);
            const uint64_t *row = base + (size_t)rows[i] * ROW_U64;
            for (int t = 0; t < ROW_U64; t++)
                s += row[t];
        }
    }
    return s;
}

int main(int argc, char **argv)
{
    int64_t runs[16] = {1, 2, 4, 8, 16, 32, 64}, n_runs = 7, heads = 8, context = 131072,
            reps = 7, near = 0, far = 0;
    int prefetch = 0;
    double fraction = 0.06;
    kvq_err e = {0};
    for (int i = 1; i < argc; i += 2) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        if (!strcmp(o, "--rows-per-run")) {
            n_runs = 0;
            char *buf = strdup(v), *p = buf, *tok;
            while ((tok = strsep(&p, ",")) && n_runs < 16)
                if (kvq_parse_i64(tok, 1, 4096, &runs[n_runs++], &e)) {
                    fprintf(stderr, "bench_gather: %s\n", e.msg);
                    free(buf);
                    return 2;
                }
            free(buf);
        } else if (!strcmp(o, "--fraction")) {
            if (kvq_parse_f64(v, 1e-4, 1, &fraction, &e))
                return usage();
        } else if (!strcmp(o, "--heads")) {
            if (kvq_parse_i64(v, 1, 64, &heads, &e))
                return usage();
        } else if (!strcmp(o, "--context")) {
            if (kvq_parse_i64(v, 4096, (int64_t)1 << 22, &context, &e))
                return usage();
        } else if (!strcmp(o, "--reps")) {
            if (kvq_parse_i64(v, 1, 1000, &reps, &e))
                return usage();
        } else if (!strcmp(o, "--prefetch")) {
            const char *c = strchr(v, ',');
            char nb[32];
            if (!c || (size_t)(c - v) >= sizeof nb)
                return usage();
            memcpy(nb, v, (size_t)(c - v));
            nb[c - v] = '\0';
            if (kvq_parse_i64(nb, 0, 4096, &near, &e) || kvq_parse_i64(c + 1, 0, 4096, &far, &e))
                return usage();
            prefetch = 1;
        } else {
            return usage();
        }
    }
    const size_t bytes = (size_t)context * ROW_U64 * sizeof(uint64_t);
    uint64_t **arr = calloc((size_t)heads * 2, sizeof *arr);
    uint64_t *flush = malloc(FLUSH_BYTES);
    int32_t *rows = malloc(sizeof *rows * (size_t)context);
    if (!arr || !flush || !rows)
        return 1;
    memset(flush, 0, FLUSH_BYTES);
    for (int64_t a = 0; a < 2 * heads; a++)
        if (!(arr[a] = filled_array(bytes))) {
            fprintf(stderr, "bench_gather: out of memory (%lld arrays of %zu bytes)\n",
                    (long long)(2 * heads), bytes);
            return 1;
        }
    printf("bench_gather: %lld heads x (K, V) x %lld rows of 256 bytes, %.4g of the rows per "
           "head, best of %lld, process CPU time\n",
           (long long)heads, (long long)context, fraction, (long long)reps);

    /* baseline: a streaming read of the first array, as many bytes as the largest
     * selection (every array once is more than one step reads) */
    const size_t stream_u64 = bytes / sizeof(uint64_t);
    double best_stream = 1e30;
    for (int64_t r = 0; r < reps; r++) {
        bench_flush_caches(flush);
        const double t0 = bench_cpu_now();
        uint64_t s = 0;
        for (size_t i = 0; i < stream_u64; i++)
            s += arr[0][i];
        const double t = bench_cpu_now() - t0;
        bench_sink += s;
        best_stream = t < best_stream ? t : best_stream;
    }
    const double stream_bw = (double)bytes / best_stream;
    printf("streaming read: %.2f GB/s\n\n%12s %10s %10s %10s %9s %10s\n", stream_bw / 1e9,
           "rows per run", "rows/head", "ms", "GB/s", "of read", "prefetch");

    kvq_rng rng;
    for (int64_t ri = 0; ri < n_runs; ri++) {
        const int64_t R = runs[ri];
        kvq_rng_seed(&rng, 7);
        int64_t m = 0;
        const uint64_t p = (uint64_t)(fraction * 1e6);
        for (int64_t j = 0; j + R <= context; j += R)
            if (kvq_rng_below(&rng, 1000000) < p)
                for (int64_t k = 0; k < R; k++)
                    rows[m++] = (int32_t)(j + k);
        for (int pf = 0; pf <= prefetch; pf++) {
            double best = 1e30;
            for (int64_t r = 0; r < reps; r++) {
                bench_flush_caches(flush);
                const double t0 = bench_cpu_now();
                const uint64_t s = read_rows(arr, 2 * heads, rows, m, pf ? near : 0, pf ? far : 0);
                const double t = bench_cpu_now() - t0;
                bench_sink += s;
                best = t < best ? t : best;
            }
            const double moved = (double)m * 2.0 * (double)heads * 256.0;
            char lab[48] = "none";
            if (pf)
                snprintf(lab, sizeof lab, "%lld,%lld", (long long)near, (long long)far);
            printf("%12lld %10lld %10.3f %10.2f %8.0f%% %10s\n", (long long)R, (long long)m,
                   1e3 * best, moved / best / 1e9, 100.0 * (moved / best) / stream_bw, lab);
        }
    }
    for (int64_t a = 0; a < 2 * heads; a++)
        free(arr[a]);
    free(arr);
    free(flush);
    free(rows);
    return 0;
}
