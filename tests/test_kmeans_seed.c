/* test_kmeans_seed.c — the seeding's bf16 filter (kmeans/kmeans_seed_avx512.c): the
 * filtered candidate kernel against the scalar reference (every potential bit, and
 * min(dist, D) on every lane), and whole seedings with the filter against the same
 * seedings without it (kvq_km_data.no_seed_filter), on data built to stress the proof:
 * a large shared offset, exact duplicates (D = 0 and ties), zero weights, an odd d, tiny
 * and huge scales, every tile width and k-means||, 1 and 2 threads. Skipped (with the
 * reason) on a CPU without AVX-512 BF16, where the filter is never used. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"
#include "kmeans/kmeans_internal.h"

#define L KVQ_KM_CAND_LANES

/* nc blobs of `per` points around offset + sep * N(0, 1) centres, noise sd, scaled by
 * `scale`; with dup, every second point repeats the one before it. */
static float *blobs(int32_t nc, int64_t per, int32_t d, float off, float sep, float sd,
                    float scale, int dup, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *c = malloc((size_t)nc * d * sizeof *c);
    float *x = malloc((size_t)nc * per * d * sizeof *x);
    for (int32_t j = 0; j < nc * d; j++)
        c[j] = off + sep * (float)kvq_rng_normal(&r);
    for (int64_t i = 0; i < nc * per; i++)
        for (int32_t t = 0; t < d; t++) {
            const float v = c[(i % nc) * d + t] + sd * (float)kvq_rng_normal(&r);
            x[i * d + t] = dup && i % 2 ? x[(i - 1) * d + t] : scale * v;
        }
    free(c);
    return x;
}

static double filter_frac;

static void seed_log(void *user, kvq_log_level level, const char *msg)
{
    const char *at = strstr(msg, "bf16 filter: ");
    (void)user;
    (void)level;
    if (at)
        filter_frac = atof(at + strlen("bf16 filter: "));
}

/* The seeding of x with and without the filter, on 1 and 2 threads: the same bits. */
static void seed_same(const float *x, const float *w, int64_t n, int32_t d, int32_t k,
                      kvq_kmeans_init init, int32_t trials)
{
    float *c[4];
    void *ctx = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_km_backend_cpu.create(x, w, n, d, 2, &ctx, &e), KVQ_OK);
    for (int v = 0; v < 4; v++) {
        c[v] = malloc((size_t)k * d * sizeof(float));
        kvq_km_data data = {.x = x, .w = w, .n = n, .d = d, .force_threads = 1,
                            .no_seed_filter = v & 1};
        kvq_kmeans_params p = kvq_kmeans_params_default();
        p.k = k;
        p.init = init;
        p.greedy_trials = trials;
        p.seed_points_per_centroid = 0;
        p.threads = v < 2 ? 1 : 2;
        p.cb.log = seed_log;
        assert_int_equal(kvq_km_seed(&data, &p, &kvq_km_backend_cpu, ctx, c[v], &e), KVQ_OK);
    }
    for (int v = 1; v < 4; v++)
        assert_memory_equal(c[0], c[v], (size_t)k * d * sizeof(float));
    for (int v = 0; v < 4; v++)
        free(c[v]);
    kvq_km_backend_cpu.destroy(ctx);
}

static int skip_without_bf16(void)
{
    if (kvq_km_seed_bf16_ok())
        return 0;
    print_message("skipped: this CPU has no AVX-512 BF16, the filter is never used\n");
    skip();
    return 1;
}

/* Whole seedings: every tile width (trials 1, 2, 4, 7, 12: 16, 8, 4, 2, 1 points per
 * tile; 20: two chunks), k-means||, on the stress data. */
static void test_seedings_same(void **state)
{
    (void)state;
    if (skip_without_bf16())
        return;
    const int32_t trials[] = {1, 2, 4, 7, 12, 20};
    const struct {
        int32_t d, nc;
        int64_t per;
        float off, sep, sd, scale;
        int dup;
    } sets[] = {
        {128, 40, 60, 30.0f, 1.0f, 0.3f, 1.0f, 0},  /* key-like: offset >> spread */
        {33, 30, 50, 0.0f, 2.0f, 0.5f, 1.0f, 1},    /* odd d, duplicates */
        {64, 20, 60, 5.0f, 1.0f, 0.2f, 1e-18f, 0},  /* tiny values */
        {64, 20, 60, 5.0f, 1.0f, 0.2f, 1e15f, 0},   /* huge values */
        {48, 1, 900, 3.0f, 0.0f, 0.0f, 1.0f, 0},    /* every point the same */
    };
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        const int64_t n = sets[si].nc * sets[si].per;
        const int32_t d = sets[si].d;
        float *x = blobs(sets[si].nc, sets[si].per, d, sets[si].off, sets[si].sep,
                         sets[si].sd, sets[si].scale, sets[si].dup, 7 + si);
        float *w = malloc((size_t)n * sizeof *w);
        for (int64_t i = 0; i < n; i++)
            w[i] = i % 5 == 4 ? 0.0f : 1.0f + (float)(i % 3);
        for (size_t ti = 0; ti < sizeof trials / sizeof trials[0]; ti++) {
            seed_same(x, NULL, n, d, 24, KVQ_KMEANS_INIT_GREEDY_PP, trials[ti]);
            seed_same(x, w, n, d, 24, KVQ_KMEANS_INIT_GREEDY_PP, trials[ti]);
        }
        seed_same(x, w, n, d, 24, KVQ_KMEANS_INIT_PARALLEL, 0);
        free(x);
        free(w);
    }
    /* the filter does prove lanes on clustered data (else this file tests nothing) */
    filter_frac = -1;
    float *x = blobs(64, 64, 128, 30.0f, 1.0f, 0.2f, 1.0f, 0, 99);
    seed_same(x, NULL, 64 * 64, 128, 128, KVQ_KMEANS_INIT_GREEDY_PP, 4);
    assert_true(filter_frac >= 0.0 && filter_frac < 0.5);
    free(x);
}

/* The filtered kernel against kvq_km_cand_eval_ref on random tiles: the potentials bit
 * for bit, and min(dist, dmin) on every live lane; dmin mixes +inf, 0, values near the
 * candidates' distances and far below them. */
static void test_kernel_matches_ref(void **state)
{
    (void)state;
    if (skip_without_bf16())
        return;
#if defined(__x86_64__) && defined(__GNUC__)
    const int32_t d = 37, dp = 38;
    const int64_t n = 16 * 24 + 16; /* 25 tiles of 16 points */
    float *x = blobs(6, n / 6 + 1, d, 10.0f, 1.0f, 0.3f, 1.0f, 1, 5);
    float mu[37];
    for (int32_t j = 0; j < d; j++)
        mu[j] = 10.0f;
    for (int P = 1; P <= 16; P *= 2) {
        const int64_t nt = n / P;
        float *xi = calloc((size_t)n * d, sizeof *xi), *xn = calloc(n, sizeof *xn);
        float *w = calloc(n, sizeof *w), *dm = calloc(n, sizeof *dm);
        float *bn = calloc(n, sizeof *bn), *yr = calloc(n, sizeof *yr);
        uint16_t *xb = calloc((size_t)n * dp, sizeof *xb);
        float *d0 = calloc((size_t)nt * L, sizeof *d0), *d1 = calloc((size_t)nt * L, sizeof *d1);
        float ct[37 * L], cn[L], bnc[L], zr[L];
        uint16_t cb[38 * L];
        double p0[L], p1[L];
        kvq_rng r;
        kvq_rng_seed(&r, 11 + P);
        for (int64_t i = 0; i < n; i++) {
            for (int32_t j = 0; j < d; j++)
                xi[((i / P) * d + j) * P + i % P] = x[i * d + j];
            xn[i] = kvq_km_norm2_fma(x + i * d, d);
            w[i] = (float)(i % 4);
            kvq_km_seed_bf16_row(x + i * d, mu, d, xb + ((i / P) * (dp / 2) * P + i % P) * 2,
                                 2 * P, &bn[i], &yr[i]);
        }
        for (int l = 0; l < L; l++) {
            const int64_t c = (l / P * 37 + 3) % n;
            for (int32_t j = 0; j < d; j++)
                ct[j * L + l] = x[c * d + j];
            for (int32_t j = 0; j < dp / 2; j++) {
                const uint16_t *src = xb + ((c / P) * (dp / 2) * P + c % P) * 2;
                cb[(j * L + l) * 2] = src[j * P * 2];
                cb[(j * L + l) * 2 + 1] = src[j * P * 2 + 1];
            }
            cn[l] = xn[c];
            bnc[l] = bn[c];
            zr[l] = yr[c];
        }
        for (int64_t i = 0; i < n; i++) { /* around the distance to candidate 0 (point 3) */
            double s = 0.0;
            for (int32_t j = 0; j < d; j++)
                s += ((double)x[i * d + j] - x[3 * d + j]) * ((double)x[i * d + j] - x[3 * d + j]);
            const double u = kvq_rng_uniform(&r);
            const int kind = i < 16 ? 0 : 1 + (int)((i / P) % 4); /* one kind a tile */
            dm[i] = kind == 0 ? INFINITY : kind == 1 ? 0.0f : kind == 2 ? (float)(s * (0.98 + 0.04 * u))
                    : (float)(s * 4.0 * u);
        }
        kvq_km_cand_bf16 f = {.xb = xb, .bn = bn, .yr = yr, .cb = cb, .bnc = bnc, .zr = zr,
                              .dp = dp, .live = 0xffffu, .eta = 1.25f * (2 * d + 16) / 16777216.0f,
                              .kappa = (float)(dp + 16) / 4194304.0f};
        memset(p0, 0, sizeof p0);
        memset(p1, 0, sizeof p1);
        kvq_km_cand_eval_ref(xi, xn, w, dm, nt, d, P, ct, cn, d0, p0);
        const int64_t exact =
            kvq_km_cand_eval_bf16_avx512(xi, xn, w, dm, nt, d, P, ct, cn, &f, d1, p1);
        assert_memory_equal(p0, p1, sizeof p0);
        for (int64_t g = 0; g < nt; g++)
            for (int l = 0; l < L; l++) {
                const float m = dm[g * P + l % P];
                const float a = d0[g * L + l] < m ? d0[g * L + l] : m;
                const float b = d1[g * L + l] < m ? d1[g * L + l] : m;
                assert_memory_equal(&a, &b, sizeof a);
            }
        assert_true(exact > 0 && exact < nt); /* some tiles proved, some computed */
        free(xi);
        free(xn);
        free(w);
        free(dm);
        free(bn);
        free(yr);
        free(xb);
        free(d0);
        free(d1);
    }
    free(x);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_matches_ref),
        cmocka_unit_test(test_seedings_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
