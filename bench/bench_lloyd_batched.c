/*
 * bench_lloyd_batched.c — the device-resident batched k-means (kmeans/cuda/lloyd_batched.h)
 * on the shape of `kvq fit` for a 7B model: L layers of H KV heads, each head n points of
 * d dims into K clusters, all heads of a layer in one batch.
 *
 *   bench_lloyd_batched [--layers L] [--heads H] [--n N] [--d D] [--k K] [--iters I]
 *                       [--tol T] [--seed S]
 *   defaults: 32 layers x 8 heads, n 81920, d 128, K 4096, 25 iterations, tol 0 (every
 *   iteration runs, as PyTorch's loop in bench/kmeans_gpu_peers.py), seed 1234
 *
 * The data: a mixture of 64 Gaussian blobs per head (made once with a counter-based
 * generator on all cores, the same for every layer: the times do not depend on the
 * values). Prints, per layer, the upload, seeding and Lloyd times, the mean time per
 * iteration and the mean final inertia; then the whole fit. `--layers 1 --heads 1` is one
 * head, whose time per iteration compares with the peers' (scripts/device-run.sh runs both).
 *
 * A build without CUDA, or a machine with no usable GPU: one line saying so, exit 2 (the
 * device run counts that as a failure on a GPU machine). Status: never run (docs/cuda.md).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmeans/kmeans_kernels.h"
#include "kvq/kmeans.h"
#include "kvq/util.h"
#ifdef KVQ_HAVE_CUDA
#include "kmeans/cuda/lloyd_batched.h"
#endif

typedef struct opts {
    int32_t layers, heads, d, k, iters;
    int64_t n;
    double tol;
    uint64_t seed;
} opts;

static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){.layers = 32, .heads = 8, .d = 128, .k = 4096, .iters = 25, .n = 81920,
                .tol = 0.0, .seed = 1234};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--layers")) o->layers = atoi(v);
        else if (!strcmp(a, "--heads")) o->heads = atoi(v);
        else if (!strcmp(a, "--n")) o->n = atoll(v);
        else if (!strcmp(a, "--d")) o->d = atoi(v);
        else if (!strcmp(a, "--k")) o->k = atoi(v);
        else if (!strcmp(a, "--iters")) o->iters = atoi(v);
        else if (!strcmp(a, "--tol")) o->tol = atof(v);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else return -1;
    }
    if (argc % 2 == 0 || o->layers < 1 || o->heads < 1 || o->n < 1 || o->d < 1 || o->k < 1 ||
        o->k > o->n || o->iters < 1)
        return -1;
    return 0;
}

#ifdef KVQ_HAVE_CUDA
/* A normal number from counters (Box-Muller on two kvq_km_uniform_at draws). */
static float normal_at(uint64_t seed, uint64_t stream, uint64_t i)
{
    const double u1 = kvq_km_uniform_at(seed, stream, 2 * i) + 1e-300;
    const double u2 = kvq_km_uniform_at(seed, stream, 2 * i + 1);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* x [h, n, d]: each head 64 blobs, centres N(0, 1), spread 0.3. */
static void make_data(float *x, const opts *o)
{
    const int64_t rows = (int64_t)o->heads * o->n;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / o->n;
        const uint64_t blob = (uint64_t)(kvq_km_uniform_at(o->seed, 7, (uint64_t)r) * 64);
        for (int32_t t = 0; t < o->d; t++)
            x[r * o->d + t] = normal_at(o->seed, 1000 + (uint64_t)b * 64 + blob, (uint64_t)t) +
                              0.3f * normal_at(o->seed, 3, (uint64_t)(r * o->d + t));
    }
}

#endif

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: bench_lloyd_batched [--layers L] [--heads H] [--n N] [--d D] "
                        "[--k K] [--iters I] [--tol T] [--seed S]\n");
        return 1;
    }
    const char *why = NULL;
    if (!kvq_cuda_available(&why)) {
        printf("bench_lloyd_batched: not run: %s\n", why ? why : "no CUDA device");
        return 2;
    }
#ifndef KVQ_HAVE_CUDA
    printf("bench_lloyd_batched: not run: not a CUDA build (make CUDA=1)\n");
    return 2;
#else
    const size_t hnd = (size_t)o.heads * o.n * o.d;
    float *x = malloc(hnd * sizeof *x);
    float *c = malloc((size_t)o.heads * o.k * o.d * sizeof *c);
    if (!x || !c) {
        fprintf(stderr, "bench_lloyd_batched: out of memory\n");
        return 1;
    }
    double t0 = kvq_now();
    make_data(x, &o);
    printf("bench_lloyd_batched: %d layers x %d heads, n %lld, d %d, K %d, %d iterations, tol %g "
           "(data made in %.2f s)\n", o.layers, o.heads, (long long)o.n, o.d, o.k, o.iters,
           o.tol, kvq_now() - t0);
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = o.k;
    p.max_iters = o.iters;
    p.tol = o.tol;
    double all = 0, iter_sum = 0;
    int64_t iter_n = 0;
    for (int32_t l = 0; l < o.layers; l++) {
        kvq_lb_stats s;
        kvq_err e = {0};
        p.seed = o.seed + (uint64_t)l;
        t0 = kvq_now();
        if (kvq_km_cuda_fit_batched(x, o.heads, o.n, o.d, &p, c, NULL, &s, &e) != KVQ_OK) {
            fprintf(stderr, "bench_lloyd_batched: layer %d: %s\n", l, e.msg);
            return 1;
        }
        const double wall = kvq_now() - t0;
        all += wall;
        double it_s = 0, in = 0;
        for (int32_t t = 0; t < s.iters_run; t++)
            it_s += s.iter_seconds[t];
        for (int32_t b = 0; b < o.heads; b++)
            in += s.inertia_final[b] / o.heads;
        int64_t rep = 0;
        for (int32_t b = 0; b < o.heads; b++)
            rep += s.repairs[b];
        iter_sum += it_s;
        iter_n += s.iters_run;
        printf("  layer %2d: %.3f s (upload %.3f, seed %.3f, %d iterations %.3f s = %.2f ms "
               "each); mean final inertia %.6e; %lld repairs\n", l, wall, s.upload_seconds,
               s.seed_seconds, s.iters_run, it_s, 1e3 * it_s / s.iters_run, in, (long long)rep);
        kvq_lb_stats_free(&s);
    }
    printf("bench_lloyd_batched: whole fit %.2f s for %d heads (%d layers); per iteration of a "
           "layer %.3f ms, of a head %.3f ms\n", all, o.layers * o.heads, o.layers,
           1e3 * iter_sum / (double)iter_n, 1e3 * iter_sum / (double)iter_n / o.heads);
    free(x);
    free(c);
    return 0;
#endif
}
