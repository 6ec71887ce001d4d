/*
 * bench_kmeans.c — k-means speed: seeding time, per-iteration time, final inertia,
 * and the fraction of the plain SGEMM rate that one Lloyd iteration achieves.
 *
 *   bench_kmeans [--case big|small|both] [--n N] [--d D] [--k K] [--iters I]
 *                [--threads T] [--init NAME] [--trials T] [--seed-ppc S] [--seed S]
 *                [--data mixture|hard] [--dump DIR] [--device cpu|cuda]
 *
 * Cases: big = n 65536, d 128, k 4096 (--n/--d/--k override it, e.g. --n 16384 for
 * a shorter run); small = the stories260K shape, n 16384, d 8, k 256.
 * Data: mixture = a Gaussian mixture (k/4 blobs, unit-variance centers, noise 0.5);
 * hard = k blobs of Zipf-like sizes (weight 1 / (1 + j / 20)) and spreads from 0.05
 * to 1, where seeding quality shows in the final inertia. Both seeded.
 * --init (default: the library's, greedy-k-means++), --trials (greedy_trials) and
 * --seed-ppc (seed_points_per_centroid) set the seeding; the defaults are the
 * library's. Times are wall clock and, in brackets, process CPU time (steadier on a
 * shared machine; equal to wall time x threads when the threads are never idle).
 * --dump DIR writes DIR/kmeans_<case>_x.npy [n, d] and DIR/kmeans_<case>_init.npy
 * [k, d] (the seeding's centroids), for bench/kmeans_peers.py to run faiss and
 * scikit-learn from the same start.
 * --device cuda runs the fit on the CUDA backend (a `make bench CUDA=1` build on a GPU
 * machine: bench/bench_kmeans_gpu.sh); the line "backend:" says which one ran. The plain
 * SGEMM reference stays OpenBLAS on the CPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "kvq.h"
#include "kvq/util.h"
#include "bench/bench_kmeans_common.h"

typedef struct bench_args {
    const char *which;
    int64_t n, d, k, iters, threads, seed, trials, seed_ppc;
    int n_set, d_set, k_set;
    const char *init;
    const char *data;
    const char *dump;
    int cuda; /* --device cuda */
} bench_args;

/* The hard data: k blobs with Zipf-like sizes and spreads from 0.05 to 1. */
static float *hard_mixture(int64_t n, int32_t d, int32_t blobs, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *c = malloc((size_t)blobs * d * sizeof *c);
    float *x = malloc((size_t)n * d * sizeof *x);
    float *sd = malloc((size_t)blobs * sizeof *sd);
    double *cum = malloc((size_t)blobs * sizeof *cum);
    if (!c || !x || !sd || !cum) {
        free(x);
        x = NULL;
        goto done;
    }
    double tot = 0;
    for (int32_t j = 0; j < blobs; j++) {
        tot += 1.0 / (1.0 + j * 0.05);
        cum[j] = tot;
        sd[j] = (float)(0.05 * pow(20.0, kvq_rng_uniform(&r)));
    }
    for (int64_t j = 0; j < (int64_t)blobs * d; j++)
        c[j] = (float)kvq_rng_normal(&r);
    for (int64_t i = 0; i < n; i++) {
        const double u = kvq_rng_uniform(&r) * tot;
        int32_t lo = 0, hi = blobs - 1; /* first j with cum[j] > u */
        while (lo < hi) {
            int32_t mid = (lo + hi) / 2;
            if (cum[mid] > u)
                hi = mid;
            else
                lo = mid + 1;
        }
        for (int32_t t = 0; t < d; t++)
            x[(size_t)i * d + t] = c[(size_t)lo * d + t] + sd[lo] * (float)kvq_rng_normal(&r);
    }
done:
    free(c);
    free(sd);
    free(cum);
    return x;
}

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

static int run_case(const char *name, int64_t n, int32_t d, int32_t k, const bench_args *a)
{
    int rc = 1;
    const int hard = !strcmp(a->data, "hard");
    float *x = hard ? hard_mixture(n, d, k, (uint64_t)a->seed)
                    : mixture(n, d, k / 4 > 0 ? k / 4 : 1, (uint64_t)a->seed);
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
    p.device = a->cuda ? KVQ_KMEANS_DEVICE_CUDA : KVQ_KMEANS_DEVICE_CPU;
    if (a->init && kvq_kmeans_init_parse(a->init, &p.init, &e) != KVQ_OK) {
        fprintf(stderr, "bench_kmeans: %s\n", e.msg);
        goto done;
    }
    if (a->trials >= 0)
        p.greedy_trials = (int32_t)a->trials;
    if (a->seed_ppc >= 0)
        p.seed_points_per_centroid = a->seed_ppc;
    printf("case %s: n=%lld d=%d k=%d threads=%d data=%s init=%s trials=%d seed_ppc=%lld "
           "iters=%lld\n", name, (long long)n, d, k, p.threads, a->data,
           kvq_kmeans_init_name(p.init), p.greedy_trials, (long long)p.seed_points_per_centroid,
           (long long)a->iters);

    /* seeding alone (max_iters 0), so the start can be dumped for the peers */
    p.max_iters = 0;
    double c0 = bench_cpu_now();
    if (kvq_kmeans_fit(x, n, d, NULL, &p, cent, NULL, &s, &e) != KVQ_OK) {
        fprintf(stderr, "bench_kmeans: %s\n", e.msg);
        goto done;
    }
    const double seed_wall = s.seed_seconds, seed_cpu = bench_cpu_now() - c0;
    printf("  seeding (%s): %.3f s [cpu %.3f s]\n", kvq_kmeans_init_name(p.init), seed_wall,
           seed_cpu);
    kvq_kmeans_stats_free(&s);
    if (a->dump) {
        char path[4096];
        snprintf(path, sizeof path, "%s/kmeans_%s_x.npy", a->dump, name);
        int bad = bench_write_npy(path, x, n, d);
        snprintf(path, sizeof path, "%s/kmeans_%s_init.npy", a->dump, name);
        bad |= bench_write_npy(path, cent, k, d);
        if (bad) {
            fprintf(stderr, "bench_kmeans: cannot write %s\n", path);
            goto done;
        }
        printf("  wrote %s/kmeans_%s_{x,init}.npy\n", a->dump, name);
    }

    /* GFLOP/s of the SGEMM with the Lloyd shape (chunks of 16384 rows, best of 2) */
    const double gemm_s = bench_sgemm_seconds(x, cent, n, d, k, p.threads, 16384, 2);
    const double gemm = gemm_s > 0 ? 2.0 * (double)n * d * k / gemm_s / 1e9 : 0;
    printf("  plain sgemm %lldx%dx%d (OpenBLAS, %d threads): %.1f GFLOP/s\n", (long long)n, k,
           d, p.threads, gemm);

    p.init = KVQ_KMEANS_INIT_GIVEN;
    p.max_iters = (int32_t)a->iters;
    c0 = bench_cpu_now();
    const int fit_rc = kvq_kmeans_fit(x, n, d, NULL, &p, cent, NULL, &s, &e);
    const double lloyd_cpu = bench_cpu_now() - c0;
    if (fit_rc != KVQ_OK) {
        fprintf(stderr, "bench_kmeans: %s\n", e.msg);
        goto done;
    }
    printf("  backend: %s\n", s.backend == KVQ_KMEANS_DEVICE_CUDA ? "cuda" : "cpu");
    double sum = 0, best = 1e30;
    for (int32_t t = 0; t < s.n_iters; t++) {
        printf("  iter %2d: %.4f s  inertia %.6e\n", t, s.iter_seconds[t], s.inertia[t]);
        sum += s.iter_seconds[t];
        if (s.iter_seconds[t] < best)
            best = s.iter_seconds[t];
    }
    const double mean = sum / (s.n_iters ? s.n_iters : 1);
    const double rate = 2.0 * (double)n * d * k / mean / 1e9;
    const double iter_cpu = lloyd_cpu / (s.n_iters ? s.n_iters : 1);
    printf("  per iteration: mean %.4f s, min %.4f s [cpu %.4f s] = %.1f GFLOP/s = %.2f of "
           "plain sgemm\n", mean, best, iter_cpu, rate, gemm > 0 ? rate / gemm : 0);
    printf("  seeding / iteration: %.2f (wall, mean) %.2f (wall, min) %.2f (cpu)\n",
           seed_wall / mean, seed_wall / best, seed_cpu / iter_cpu);
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
        else if (!strcmp(o, "--device") && (!strcmp(v, "cpu") || !strcmp(v, "cuda")))
            a->cuda = !strcmp(v, "cuda");
        else if (!strcmp(o, "--data") && (!strcmp(v, "mixture") || !strcmp(v, "hard")))
            a->data = v;
        else if (!strcmp(o, "--trials"))
            st = kvq_parse_i64(v, 0, INT32_MAX, &a->trials, &e);
        else if (!strcmp(o, "--seed-ppc"))
            st = kvq_parse_i64(v, 0, INT64_C(1) << 40, &a->seed_ppc, &e);
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
    bench_args a = {.which = "both", .iters = 10, .threads = 2, .seed = 1, .trials = -1,
                    .seed_ppc = -1, .init = NULL, .data = "mixture"};
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
