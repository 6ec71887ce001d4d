/*
 * bench_calib_projection.c — the calibration of a 7B-shaped model, projected from
 * stages timed on a slice of it on this machine.
 *
 *   bench_calib_projection [--layers 32] [--kv-heads 8] [--q-heads 32] [--d 128]
 *                          [--tokens 81920] [--k 4096] [--iters 25] [--threads 2]
 *                          [--d-model 4096] [--d-ff 14336] [--ctx 4096] [--init NAME]
 *                          [--slice-heads 1] [--ranks 1,2,4,8,16,32]
 *
 * Stages and what is timed (seconds per unit, then units x time):
 *   capture   the forward pass over the calibration tokens: one 7B-shaped layer's
 *             matmuls (q, k, v, o, gate, up, down) as F32 OpenBLAS SGEMMs over a chunk of
 *             512 tokens, plus attention over a ctx-token window, per token per layer.
 *             This is the F32 matmul floor of a forward pass, not kvq's own forward
 *             (which runs quantized weights); the line says so.
 *   moments   per (layer, KV head): the query second moments of its q-heads / kv-heads
 *             query heads over every token (one SSYRK [tokens, d] each), and a Cholesky.
 *   fit       per (layer, KV head): `kvq fit`'s k-means (seeding + iters Lloyd
 *             iterations with the exact bounds) at n = tokens, d, K, on whitened key-like
 *             data (the query-aware space), plus the plain-keys reference fit that
 *             `kvq fit` also runs by default; timed on --slice-heads heads.
 * The projection for N MPI ranks divides the tokens of capture and the (layer, head)
 * units of moments and fit between the ranks (each rank a machine like this one):
 * capture / N, ceil(units / N) x per-unit time. Communication is not counted.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <lapacke.h>

#include "kvq.h"
#include "kvq/util.h"
#include "bench/bench_common.h"

typedef struct args {
    int64_t layers, kv_heads, q_heads, d, tokens, k, iters, threads, d_model, d_ff, ctx,
        slice_heads;
    const char *init, *ranks;
} args;

static float *randn(int64_t n, uint64_t seed, float scale)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; x && i < n; i++)
        x[i] = scale * (float)kvq_rng_normal(&r);
    return x;
}

/* Seconds per token per layer of the forward's matmuls and attention (F32 SGEMM). */
static double capture_per_token_layer(const args *a)
{
    const int64_t T = 512, D = a->d_model, F = a->d_ff, hd = a->d;
    const int64_t kvd = a->kv_heads * hd;
    const int64_t shapes[4][2] = {{D, D + 2 * kvd}, {D, D}, {D, 2 * F}, {F, D}};
    double best = 1e30;
    float *x = randn(T * (F > D ? F : D), 1, 1.0f);
    const int64_t NC = 1024; /* weight columns per SGEMM (keeps the buffer small) */
    float *w = randn((F > D ? F : D) * NC, 2, 0.02f);
    float *y = malloc((size_t)T * (NC > hd ? NC : hd) * sizeof *y);
    float *att = malloc((size_t)T * a->ctx * sizeof *att);
    float *kc = randn(a->ctx * hd, 3, 1.0f);
    if (!x || !w || !y || !att || !kc)
        goto done;
    openblas_set_num_threads((int)a->threads);
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = kvq_now();
        for (int s = 0; s < 4; s++)
            for (int64_t c0 = 0; c0 < shapes[s][1]; c0 += NC) {
                const int64_t nc = shapes[s][1] - c0 < NC ? shapes[s][1] - c0 : NC;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)nc,
                            (int)shapes[s][0], 1.0f, x, (int)shapes[s][0], w, (int)nc, 0.0f,
                            y, (int)nc);
            }
        /* attention of every query head over a ctx window: scores and weighted sum */
        for (int64_t h = 0; h < a->q_heads; h++) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)a->ctx, (int)hd,
                        1.0f, x, (int)hd, kc, (int)hd, 0.0f, att, (int)a->ctx);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hd, (int)a->ctx,
                        1.0f, att, (int)a->ctx, kc, (int)hd, 0.0f, y, (int)hd);
        }
        const double t = kvq_now() - t0;
        best = t < best ? t : best;
    }
done:
    free(x);
    free(w);
    free(y);
    free(att);
    free(kc);
    return best / (double)T;
}

/* Seconds per (layer, KV head) of the moments: q-heads / kv-heads SSYRKs and a Cholesky. */
static double moments_per_head(const args *a)
{
    const int64_t n = a->tokens, d = a->d, per = a->q_heads / a->kv_heads;
    float *q = randn(n * d, 4, 1.0f);
    float *S = calloc((size_t)(d * d), sizeof *S);
    double best = 1e30;
    if (!q || !S)
        goto done;
    openblas_set_num_threads((int)a->threads);
    for (int rep = 0; rep < 2; rep++) {
        const double t0 = kvq_now();
        for (int64_t h = 0; h < per; h++) {
            cblas_ssyrk(CblasRowMajor, CblasLower, CblasTrans, (int)d, (int)n, 1.0f, q, (int)d,
                        0.0f, S, (int)d);
            for (int64_t u = 0; u < d; u++)
                S[u * d + u] += (float)n;
            if (LAPACKE_spotrf(LAPACK_ROW_MAJOR, 'L', (int)d, S, (int)d) != 0)
                break;
        }
        const double t = kvq_now() - t0;
        best = t < best ? t : best;
    }
done:
    free(q);
    free(S);
    return best;
}

/* Key-like data for one head: an offset, k / 4 anisotropic blobs; whitened by a
 * lower-triangular L with a decaying diagonal when qa. */
static float *head_data(const args *a, uint64_t seed, int qa)
{
    const int64_t n = a->tokens;
    const int32_t d = (int32_t)a->d, blobs = (int32_t)(a->k / 4 > 0 ? a->k / 4 : 1);
    float *x = malloc((size_t)n * d * sizeof *x);
    float *c = randn((int64_t)blobs * d, seed + 1, 1.0f), *off = randn(d, seed + 2, 3.0f);
    float *L = calloc((size_t)d * d, sizeof *L), *z = malloc((size_t)n * d * sizeof *z);
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    if (!x || !c || !off || !L || !z) {
        free(x);
        x = NULL;
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        const float *cj = c + (size_t)kvq_rng_below(&r, (uint64_t)blobs) * d;
        for (int32_t t = 0; t < d; t++)
            x[(size_t)i * d + t] = off[t] + cj[t] / (1.0f + t / 8.0f) +
                                   (float)(0.3 * kvq_rng_normal(&r)) / (1.0f + t / 8.0f);
    }
    if (qa) {
        for (int32_t u = 0; u < d; u++) {
            L[(size_t)u * d + u] = 1.0f / sqrtf(1.0f + u / 4.0f);
            for (int32_t v = 0; v < u; v++)
                L[(size_t)u * d + v] = 0.1f * (float)kvq_rng_normal(&r) / sqrtf(1.0f + u / 4.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, d, d, 1.0f, x, d, L, d,
                    0.0f, z, d);
        memcpy(x, z, (size_t)n * d * sizeof *x);
    }
done:
    free(c);
    free(off);
    free(L);
    free(z);
    return x;
}

/* Seconds of one k-means fit of `kvq fit` at the head shape (bounds, default seeding). */
static int fit_seconds(const args *a, int qa, double *out, double *seed_s, double *cpu_s)
{
    const int32_t d = (int32_t)a->d, k = (int32_t)a->k;
    double tot = 0, sd = 0, cpu = 0;
    for (int64_t h = 0; h < a->slice_heads; h++) {
        float *x = head_data(a, 100 + (uint64_t)h, qa);
        float *cent = malloc((size_t)k * d * sizeof *cent);
        kvq_kmeans_params p = kvq_kmeans_params_default();
        kvq_kmeans_stats s;
        kvq_err e = {0};
        memset(&s, 0, sizeof s);
        p.k = k;
        p.max_iters = (int32_t)a->iters;
        p.tol = 0;
        p.threads = (int32_t)a->threads;
        p.min_points_per_centroid = 0;
        int bad = !x || !cent ||
                  (a->init && kvq_kmeans_init_parse(a->init, &p.init, &e) != KVQ_OK);
        const double c0 = bench_cpu_now();
        if (!bad && kvq_kmeans_fit(x, a->tokens, d, NULL, &p, cent, NULL, &s, &e) != KVQ_OK)
            bad = 1;
        cpu += bench_cpu_now() - c0;
        tot += s.total_seconds;
        sd += s.seed_seconds;
        kvq_kmeans_stats_free(&s);
        free(x);
        free(cent);
        if (bad) {
            fprintf(stderr, "bench_calib_projection: fit: %s\n", e.msg[0] ? e.msg : "out of memory");
            return -1;
        }
    }
    *out = tot / (double)a->slice_heads;
    *seed_s = sd / (double)a->slice_heads;
    *cpu_s = cpu / (double)a->slice_heads;
    return 0;
}

static int parse(int argc, char **argv, args *a)
{
    static const struct {
        const char *name;
        size_t off;
        int64_t lo, hi;
    } opts[] = {
        {"--layers", offsetof(args, layers), 1, 1024},
        {"--kv-heads", offsetof(args, kv_heads), 1, 1024},
        {"--q-heads", offsetof(args, q_heads), 1, 4096},
        {"--d", offsetof(args, d), 17, 1024},
        {"--tokens", offsetof(args, tokens), 1, INT64_C(1) << 30},
        {"--k", offsetof(args, k), 1, 1 << 20},
        {"--iters", offsetof(args, iters), 1, 1000},
        {"--threads", offsetof(args, threads), 1, 1024},
        {"--d-model", offsetof(args, d_model), 1, 1 << 16},
        {"--d-ff", offsetof(args, d_ff), 1, 1 << 18},
        {"--ctx", offsetof(args, ctx), 1, 1 << 20},
        {"--slice-heads", offsetof(args, slice_heads), 1, 1024},
    };
    kvq_err e = {0};
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_calib_projection: %s needs a value\n", argv[i]);
            return -1;
        }
        const char *o = argv[i], *v = argv[i + 1];
        int found = 0;
        if (!strcmp(o, "--init")) {
            a->init = v;
            found = 1;
        } else if (!strcmp(o, "--ranks")) {
            a->ranks = v;
            found = 1;
        }
        for (size_t j = 0; !found && j < sizeof opts / sizeof opts[0]; j++)
            if (!strcmp(o, opts[j].name)) {
                found = 1;
                if (kvq_parse_i64(v, opts[j].lo, opts[j].hi, (int64_t *)((char *)a + opts[j].off),
                                  &e) != KVQ_OK) {
                    fprintf(stderr, "bench_calib_projection: %s: %s\n", o, e.msg);
                    return -1;
                }
            }
        if (!found) {
            fprintf(stderr, "bench_calib_projection: unknown option %s\n", o);
            return -1;
        }
    }
    if (a->q_heads % a->kv_heads) {
        fprintf(stderr, "bench_calib_projection: --q-heads must be a multiple of --kv-heads\n");
        return -1;
    }
    return 0;
}

static void print_min(const char *what, double s)
{
    printf("%s %9.1f s = %6.2f min\n", what, s, s / 60.0);
}

int main(int argc, char **argv)
{
    args a = {.layers = 32, .kv_heads = 8, .q_heads = 32, .d = 128, .tokens = 81920,
              .k = 4096, .iters = 25, .threads = 2, .d_model = 4096, .d_ff = 14336,
              .ctx = 4096, .slice_heads = 1, .init = NULL, .ranks = "1,2,4,8,16,32"};
    if (parse(argc, argv, &a) != 0)
        return 2;
    const int64_t units = a.layers * a.kv_heads;
    printf("7B-shaped calibration: %lld layers x %lld KV heads (%lld query heads), d %lld, "
           "%lld tokens, K %lld, %lld Lloyd iterations, %lld threads (this machine, shared: "
           "figures are upper bounds of a quiet one)\n", (long long)a.layers,
           (long long)a.kv_heads, (long long)a.q_heads, (long long)a.d, (long long)a.tokens,
           (long long)a.k, (long long)a.iters, (long long)a.threads);
    const double cap = capture_per_token_layer(&a);
    const double mom = moments_per_head(&a);
    double fit_qa, fit_ref, seed_qa, seed_ref, cpu_qa, cpu_ref;
    if (fit_seconds(&a, 1, &fit_qa, &seed_qa, &cpu_qa) ||
        fit_seconds(&a, 0, &fit_ref, &seed_ref, &cpu_ref))
        return 1;
    const double cap_all = cap * (double)a.tokens * (double)a.layers;
    printf("  capture : %.3f ms per token per layer (F32 SGEMM floor of the layer's matmuls "
           "and attention over %lld positions; kvq's quantized forward is slower) x %lld "
           "tokens x %lld layers\n", cap * 1e3, (long long)a.ctx, (long long)a.tokens,
           (long long)a.layers);
    printf("  moments : %.3f s per (layer, KV head) x %lld\n", mom, (long long)units);
    printf("  fit     : %.3f s per (layer, KV head) query-aware k-means (seeding %.3f s) + "
           "%.3f s the plain reference (seeding %.3f s), measured on %lld head(s) x %lld\n",
           fit_qa, seed_qa, fit_ref, seed_ref, (long long)a.slice_heads, (long long)units);
    printf("            process CPU time %.3f s + %.3f s (CPU / threads estimates a quiet "
           "machine's wall time; low where one thread runs alone)\n", cpu_qa, cpu_ref);
    printf("  ranks   capture        moments        fit (qa only)  fit (qa + ref)  total\n");
    for (const char *r = a.ranks; r && *r;) {
        const long nr = strtol(r, NULL, 10);
        if (nr < 1)
            break;
        const double per = (double)((units + nr - 1) / nr);
        const double c = cap_all / (double)nr, m = mom * per, f1 = fit_qa * per,
                     f2 = (fit_qa + fit_ref) * per;
        printf("  %5ld %9.1f min %9.2f min %9.2f min %9.2f min %9.1f min\n", nr, c / 60,
               m / 60, f1 / 60, f2 / 60, (c + m + f2) / 60);
        r = strchr(r, ',');
        r = r ? r + 1 : NULL;
    }
    print_min("  fit on 1 machine (query-aware k-means of every (layer, KV head)):",
              fit_qa * (double)units);
    print_min("  fit on 1 machine with the plain reference as `kvq fit` runs by default:",
              (fit_qa + fit_ref) * (double)units);
    print_min("  estimated from CPU time / threads, query-aware only:",
              cpu_qa / (double)a.threads * (double)units);
    print_min("  estimated from CPU time / threads, with the plain reference:",
              (cpu_qa + cpu_ref) / (double)a.threads * (double)units);
    return 0;
}
