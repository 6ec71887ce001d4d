/*
 * bench_kmeans.c — k-means speed: seeding time, per-iteration time, final inertia,
 * and the fraction of the plain SGEMM rate that one Lloyd iteration achieves.
 *
 *   bench_kmeans [--case big|small|both] [--n N] [--d D] [--k K] [--iters I]
 *                [--threads T] [--init NAME] [--seed S] [--dump DIR]
 *
 * Cases: big = n 65536, d 128, k 4096 (--n/--d/--k override it, e.g. --n 16384 for
 * a shorter run); small = the stories260K shape, n 16384, d 8, k 256.
 * Data: a Gaussian mixture (k/4 blobs, unit-variance centers, noise 0.5), seeded.
 * --dump DIR writes DIR/kmeans_<case>_x.npy [n, d] and DIR/kmeans_<case>_init.npy
 * [k, d] (the seeding's centroids), for bench/kmeans_peers.py to run faiss and
 * scikit-learn from the same start.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "kvq.h"

typedef struct bench_args {
    const char *which;
    int64_t n, d, k, iters, threads, seed;
    int n_set, d_set, k_set;
    const char *init;
    const char *dump;
} bench_args;

static float *mixture(int64_t n, int32_t d, int32_t blobs, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *c = malloc((size_t)blobs * d * sizeof *c);
    float *x = malloc((size_t)n * d * sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        return NULL;
    }
    for (int64_t j = 0; j < (int64_t)blobs * d; j++)
        c[j] = (float)kvq_rng_normal(&r);
    for (int64_t i = 0; i < n; i++) {
        const float *cj = c + (size_t)kvq_rng_below(&r, (uint64_t)blobs) * d;
        for (int32_t t = 0; t < d; t++)
            x[(size_t)i * d + t] = cj[t] + 0.5f * (float)kvq_rng_normal(&r);
    }
    free(c);
    return x;
}

/* Writes a float32 [rows, cols] .npy (format version 1.0). */
static int write_npy(const char *path, const float *a, int64_t rows, int64_t cols)
{
    char hdr[128];
    int len = snprintf(hdr, sizeof hdr,
                       "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                       (long long)rows, (long long)cols);
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;
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
    fwrite(a, sizeof *a, (size_t)(rows * cols), f);
    return fclose(f);
}

/* GFLOP/s of plain OpenBLAS SGEMM with the Lloyd shape: X [n, d] . C^T [d, k], taken
 * in row chunks of at most 16384 so the output stays small. */
static double sgemm_rate(const float *x, const float *c, int64_t n, int32_t d, int32_t k,
                         int threads)
{
    const int64_t chunk = n < 16384 ? n : 16384;
    float *out = malloc((size_t)chunk * k * sizeof *out);
    if (!out)
        return 0;
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)chunk, k, d, 1.0f, x, d, c, d,
                0.0f, out, k); /* warm-up */
    double best = 1e30;
    for (int rep = 0; rep < 2; rep++) {
        double t0 = kvq_now();
        for (int64_t i0 = 0; i0 < n; i0 += chunk) {
            int64_t m = n - i0 < chunk ? n - i0 : chunk;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, k, d, 1.0f,
                        x + (size_t)i0 * d, d, c, d, 0.0f, out, k);
        }
        double t = kvq_now() - t0;
        if (t < best)
            best = t;
    }
    free(out);
    return 2.0 * (double)n * d * k / best / 1e9;
}

static int run_case(const char *name, int64_t n, int32_t d, int32_t k, const bench_args *a)
{
    int rc = 1;
    float *x = mixture(n, d, k / 4 > 0 ? k / 4 : 1, (uint64_t)a->seed);
    float *cent = malloc((size_t)k * d * sizeof *cent);
    kvq_kmeans_stats s;
    memset(&s, 0, sizeof s);
    kvq_err e = {0};
    if (!x || !cent) {
        fprintf(stderr, "bench_kmeans: out of memory\n");
        goto done;
    }
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = k;
    p.threads = (int32_t)a->threads;
    p.seed = (uint64_t)a->seed;
    p.tol = 0; /* run every iteration */
    p.max_points_per_centroid = 0;
    if (kvq_kmeans_init_parse(a->init, &p.init, &e) != KVQ_OK) {
        fprintf(stderr, "bench_kmeans: %s\n", e.msg);
        goto done;
    }
    printf("case %s: n=%lld d=%d k=%d threads=%d init=%s iters=%lld\n", name, (long long)n, d,
           k, p.threads, kvq_kmeans_init_name(p.init), (long long)a->iters);

    /* seeding alone (max_iters 0), so the start can be dumped for the peers */
    p.max_iters = 0;
    if (kvq_kmeans_fit(x, n, d, NULL, &p, cent, NULL, &s, &e) != KVQ_OK) {
        fprintf(stderr, "bench_kmeans: %s\n", e.msg);
        goto done;
    }
    printf("  seeding (%s): %.3f s\n", kvq_kmeans_init_name(p.init), s.seed_seconds);
    kvq_kmeans_stats_free(&s);
    if (a->dump) {
        char path[4096];
        snprintf(path, sizeof path, "%s/kmeans_%s_x.npy", a->dump, name);
        int bad = write_npy(path, x, n, d);
        snprintf(path, sizeof path, "%s/kmeans_%s_init.npy", a->dump, name);
        bad |= write_npy(path, cent, k, d);
        if (bad) {
            fprintf(stderr, "bench_kmeans: cannot write %s\n", path);
            goto done;
        }
        printf("  wrote %s/kmeans_%s_{x,init}.npy\n", a->dump, name);
    }

    const double gemm = sgemm_rate(x, cent, n, d, k, p.threads);
    printf("  plain sgemm %lldx%dx%d (OpenBLAS, %d threads): %.1f GFLOP/s\n", (long long)n, k,
           d, p.threads, gemm);

    p.init = KVQ_KMEANS_INIT_GIVEN;
    p.max_iters = (int32_t)a->iters;
    if (kvq_kmeans_fit(x, n, d, NULL, &p, cent, NULL, &s, &e) != KVQ_OK) {
        fprintf(stderr, "bench_kmeans: %s\n", e.msg);
        goto done;
    }
    double sum = 0, best = 1e30;
    for (int32_t t = 0; t < s.n_iters; t++) {
        printf("  iter %2d: %.4f s  inertia %.6e\n", t, s.iter_seconds[t], s.inertia[t]);
        sum += s.iter_seconds[t];
        if (s.iter_seconds[t] < best)
            best = s.iter_seconds[t];
    }
    const double mean = sum / (s.n_iters ? s.n_iters : 1);
    const double rate = 2.0 * (double)n * d * k / mean / 1e9;
    printf("  per iteration: mean %.4f s, min %.4f s = %.1f GFLOP/s = %.2f of plain sgemm\n",
           mean, best, rate, gemm > 0 ? rate / gemm : 0);
    printf("  final inertia (after %d updates): %.6e   empty repairs: %lld\n", s.n_iters,
           s.inertia[s.n_iters - 1], (long long)s.n_empty_repairs);
    rc = 0;
done:
    kvq_kmeans_stats_free(&s);
    free(x);
    free(cent);
    return rc;
}

static int parse_args(int argc, char **argv, bench_args *a)
{
    kvq_err e = {0};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_kmeans: %s needs a value\n", o);
            return -1;
        }
        const char *v = argv[++i];
        kvq_status st = KVQ_OK;
        if (!strcmp(o, "--case"))
            a->which = v;
        else if (!strcmp(o, "--init"))
            a->init = v;
        else if (!strcmp(o, "--dump"))
            a->dump = v;
        else if (!strcmp(o, "--n"))
            st = kvq_parse_i64(v, 1, INT64_C(1) << 34, &a->n, &e), a->n_set = 1;
        else if (!strcmp(o, "--d"))
            st = kvq_parse_i64(v, 1, 65536, &a->d, &e), a->d_set = 1;
        else if (!strcmp(o, "--k"))
            st = kvq_parse_i64(v, 1, INT32_MAX, &a->k, &e), a->k_set = 1;
        else if (!strcmp(o, "--iters"))
            st = kvq_parse_i64(v, 1, 10000, &a->iters, &e);
        else if (!strcmp(o, "--threads"))
            st = kvq_parse_i64(v, 1, 1024, &a->threads, &e);
        else if (!strcmp(o, "--seed"))
            st = kvq_parse_i64(v, 0, INT64_MAX, &a->seed, &e);
        else {
            fprintf(stderr, "bench_kmeans: unknown option %s\n", o);
            return -1;
        }
        if (st != KVQ_OK) {
            fprintf(stderr, "bench_kmeans: %s: %s\n", o, e.msg);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    bench_args a = {.which = "both", .iters = 10, .threads = 2, .seed = 1,
                    .init = "k-means||"};
    if (parse_args(argc, argv, &a) != 0)
        return 2;
    int rc = 0;
    if (!strcmp(a.which, "small") || !strcmp(a.which, "both"))
        rc |= run_case("small", a.n_set && strcmp(a.which, "both") ? a.n : 16384,
                       (int32_t)(a.d_set && strcmp(a.which, "both") ? a.d : 8),
                       (int32_t)(a.k_set && strcmp(a.which, "both") ? a.k : 256), &a);
    if (!strcmp(a.which, "big") || !strcmp(a.which, "both"))
        rc |= run_case("big", a.n_set ? a.n : 65536, (int32_t)(a.d_set ? a.d : 128),
                       (int32_t)(a.k_set ? a.k : 4096), &a);
    return rc;
}
