/*
 * bench/bench_kmeans_common.h — what the k-means benchmarks share (bench_kmeans,
 * bench_kmeans_bounds): the SGEMM floor of one Lloyd assignment and the .npy files the
 * Python peers read. Each program gets its own static copies; includes bench_common.h
 * (bench_cpu_now).
 */
#ifndef KVQ_BENCH_KMEANS_COMMON_H
#define KVQ_BENCH_KMEANS_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>

#include "bench/bench_common.h"
#include "kvq/util.h"

/* Writes a float32 [rows, cols] .npy (format version 1.0). 0, or -1 / EOF on failure. */
static inline int bench_write_npy(const char *path, const float *v, int64_t rows, int64_t cols)
{
    char hdr[128];
    const int len = snprintf(hdr, sizeof hdr,
                             "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                             (long long)rows, (long long)cols);
    const int pad = (64 - (10 + len + 1) % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    const int hlen = len + pad + 1;
    pre[8] = (unsigned char)(hlen & 0xff);
    pre[9] = (unsigned char)(hlen >> 8);
    fwrite(pre, 1, 10, f);
    fwrite(hdr, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
    fwrite(v, sizeof *v, (size_t)(rows * cols), f);
    return fclose(f);
}

/* Seconds of one X [n, d] . C^T [d, k] SGEMM (OpenBLAS, threads): a warm-up, then the
 * best of reps, in row chunks of `chunk` so the output stays small. -1: out of memory. */
static inline double bench_sgemm_seconds(const float *x, const float *c, int64_t n, int32_t d,
                                         int32_t k, int threads, int64_t chunk, int reps)
{
    chunk = n < chunk ? n : chunk;
    float *out = malloc((size_t)chunk * k * sizeof *out);
    if (!out)
        return -1;
    openblas_set_num_threads(threads);
    double best = 1e30;
    for (int rep = 0; rep <= reps; rep++) { /* the first is a warm-up */
        const double t0 = kvq_now();
        for (int64_t i0 = 0; i0 < n; i0 += chunk) {
            const int64_t m = n - i0 < chunk ? n - i0 : chunk;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, k, d, 1.0f,
                        x + (size_t)i0 * d, d, c, d, 0.0f, out, k);
        }
        const double t = kvq_now() - t0;
        if (rep > 0 && t < best)
            best = t;
    }
    free(out);
    return best;
}

#endif
