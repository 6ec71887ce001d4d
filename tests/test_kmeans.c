/* test_kmeans.c — k-means: per-element kernels, SGEMM path vs the scalar reference,
 * AVX2 / AVX-512 paths vs their references, recovery of planted clusters, monotone
 * inertia, determinism across threads (Lloyd and every seeding path), seeding on a
 * subsample, empty-cluster repair, weights, seeding quality, errors, CUDA fallback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/testutil.h"
#include "kvq.h"
#include "kmeans/kmeans_internal.h"
#include "kmeans/kmeans_kernels.h"

/* ---- helpers ---------------------------------------------------------------------- */

typedef struct log_capture {
    int n[4];          /* lines per level */
    char last[4][512]; /* last line per level */
    char all[4096];    /* every line, concatenated */
} log_capture;

static void capture_log(void *user, kvq_log_level level, const char *msg)
{
    log_capture *c = user;
    c->n[level]++;
    snprintf(c->last[level], sizeof c->last[level], "%s", msg);
    size_t used = strlen(c->all);
    snprintf(c->all + used, sizeof c->all - used, "%s\n", msg);
}

static float *random_points(int64_t n, int32_t d, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *x = malloc((size_t)n * d * sizeof *x);
    for (int64_t i = 0; i < n * d; i++)
        x[i] = (float)kvq_rng_normal(&r);
    return x;
}

/* `nc` centers spaced `sep` apart on random axes, `per` points each with noise `sd`.
 * Point i belongs to planted cluster i / per. centers [nc, d] may be NULL. */
static float *planted(int32_t nc, int64_t per, int32_t d, float sep, float sd, uint64_t seed,
                      float *centers)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *c = malloc((size_t)nc * d * sizeof *c);
    for (int32_t j = 0; j < nc * d; j++)
        c[j] = (float)(sep * kvq_rng_normal(&r));
    float *x = malloc((size_t)nc * per * d * sizeof *x);
    for (int32_t j = 0; j < nc; j++)
        for (int64_t q = 0; q < per; q++)
            for (int32_t t = 0; t < d; t++)
                x[((size_t)j * per + q) * d + t] = c[j * d + t] + (float)(sd * kvq_rng_normal(&r));
    if (centers)
        memcpy(centers, c, (size_t)nc * d * sizeof *c);
    free(c);
    return x;
}

static double l2sq_double(const float *a, const float *b, int32_t d)
{
    double s = 0;
    for (int32_t t = 0; t < d; t++)
        s += ((double)a[t] - b[t]) * ((double)a[t] - b[t]);
    return s;
}

/* 1 if every planted cluster maps to its own fitted cluster (a bijection). */
static int recovered(const int32_t *assign, int32_t nc, int64_t per)
{
    int32_t lab[64];
    for (int32_t j = 0; j < nc; j++) {
        lab[j] = assign[(size_t)j * per];
        for (int64_t q = 0; q < per; q++)
            if (assign[(size_t)j * per + q] != lab[j])
                return 0;
        for (int32_t i = 0; i < j; i++)
            if (lab[i] == lab[j])
                return 0;
    }
    return 1;
}

/* ---- per-element kernels (kmeans_kernels.h) ------------------------------------------ */

static void test_kernels(void **state)
{
    kvq_rng r;
    kvq_rng_seed(&r, 3);
    float a[37], b[37], z[37] = {0};
    for (int t = 0; t < 37; t++) {
        a[t] = (float)kvq_rng_normal(&r);
        b[t] = (float)kvq_rng_normal(&r);
    }
    for (int32_t d = 1; d <= 37; d++) {
        double ref = l2sq_double(a, b, d);
        assert_true(fabs(kvq_km_l2sq(a, b, d) - ref) <= 1e-5 * ref);
        /* norm2 is l2sq against zero, with the same summation order: same bits */
        assert_true(kvq_km_norm2(a, d) == kvq_km_l2sq(a, z, d));
        double dot = 0;
        for (int t = 0; t < d; t++)
            dot += (double)a[t] * b[t];
        float e = kvq_km_dist_from_dot(kvq_km_norm2(a, d), kvq_km_norm2(b, d), (float)dot);
        double scale = kvq_km_norm2(a, d) + kvq_km_norm2(b, d);
        assert_true(fabs(e - ref) <= KVQ_KMEANS_TOL_DIST * scale);
    }
    /* the expanded form clamps cancellation below zero */
    assert_true(kvq_km_dist_from_dot(1.0f, 1.0f, 1.0000001f) == 0.0f);
    assert_true(kvq_km_dist_from_dot(2.0f, 3.0f, 1.0f) == 3.0f);
    /* ties go to the lower index, whatever order candidates arrive in */
    assert_true(kvq_km_better(1.0f, 5, 2.0f, 1));
    assert_false(kvq_km_better(2.0f, 0, 1.0f, 9));
    assert_true(kvq_km_better(1.0f, 3, 1.0f, 7));
    assert_false(kvq_km_better(1.0f, 7, 1.0f, 3));
    assert_false(kvq_km_better(1.0f, 3, 1.0f, 3));
    /* weighted sums in double, then one rounding to float */
    double s = 0;
    s = kvq_km_accum(s, 0.1f, 2.0f);
    s = kvq_km_accum(s, 0.3f, 1.0f);
    assert_true(s == 2.0 * (double)0.1f + (double)0.3f);
    assert_true(kvq_km_centroid_coord(s, 3.0) == (float)(s / 3.0));
    /* counter-based uniforms: reproducible, in [0, 1), roughly uniform */
    assert_true(kvq_km_uniform_at(1, 2, 3) == kvq_km_uniform_at(1, 2, 3));
    assert_true(kvq_km_uniform_at(1, 2, 3) != kvq_km_uniform_at(1, 3, 3));
    assert_true(kvq_km_mix64(0) != 0);
    double m = 0;
    for (uint64_t i = 0; i < 10000; i++) {
        double u = kvq_km_uniform_at(7, 1, i);
        assert_true(u >= 0.0 && u < 1.0);
        m += u;
    }
    assert_true(fabs(m / 10000 - 0.5) < 0.02);
}

/* ---- SGEMM path == scalar reference ---------------------------------------------------- */

static void test_gemm_matches_reference(void **state)
{
    const int64_t n = 9000; /* > one block of rows (4096) */
    const int32_t d = 37, k = 67;
    float *x = random_points(n, d, 11);
    float *c = random_points(k, d, 12);
    int32_t *a = malloc(n * sizeof *a);
    float *dist = malloc(n * sizeof *dist);
    int32_t *a2 = malloc(n * sizeof *a2);
    void *ctx = NULL;
    kvq_err e = {0};
    assert_true(kvq_km_block_rows(k) < n);
    assert_int_equal(kvq_km_backend_cpu.create(x, NULL, n, d, 2, &ctx, &e), KVQ_OK);
    assert_int_equal(kvq_km_backend_cpu.assign(ctx, c, k, a, dist, &e), KVQ_OK);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d;
        /* scalar reference: distance and first minimum */
        int32_t best = 0;
        float bd = INFINITY;
        for (int32_t j = 0; j < k; j++) {
            float v = kvq_km_l2sq(xi, c + j * d, d);
            if (kvq_km_better(v, j, bd, best)) {
                bd = v;
                best = j;
            }
        }
        const double scale = kvq_km_norm2(xi, d) + kvq_km_norm2(c + a[i] * d, d);
        const float ref_at = kvq_km_l2sq(xi, c + a[i] * d, d);
        assert_true(fabs(dist[i] - ref_at) <= KVQ_KMEANS_TOL_DIST * scale);
        if (a[i] != best) { /* only a near-tie may differ */
            differ++;
            assert_true(ref_at - bd <= 2 * KVQ_KMEANS_TOL_DIST * scale);
        }
    }
    assert_true(differ <= n / 1000);
    /* the public assign gives the same answer */
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = k;
    assert_int_equal(kvq_kmeans_assign(x, n, d, c, &p, a2, NULL, &e), KVQ_OK);
    assert_memory_equal(a, a2, n * sizeof *a);
    kvq_km_backend_cpu.destroy(ctx);
    free(x);
    free(c);
    free(a);
    free(a2);
    free(dist);
}

/* The AVX2 and AVX-512 fused argmins equal the scalar one bit for bit, ties included. */
static void test_argmin_simd_matches_ref(void **state)
{
#ifdef KVQ_KM_HAVE_AVX2_ARGMIN
    if (!kvq_cpu_has_avx2())
        TEST_SKIP("no AVX2 on this CPU");
    kvq_rng r;
    kvq_rng_seed(&r, 5);
    float s[203], cn[203];
    for (int rep = 0; rep < 2000; rep++) {
        const int32_t kc = 1 + (int32_t)kvq_rng_below(&r, 203);
        const float xn = (float)kvq_rng_below(&r, 4);
        for (int32_t j = 0; j < kc; j++) {
            /* few distinct values: many exact ties and clamped (<= 0) distances */
            s[j] = (float)kvq_rng_below(&r, 5) * 0.5f;
            cn[j] = (float)kvq_rng_below(&r, 4);
        }
        if (rep % 3 == 0) /* also continuous values */
            for (int32_t j = 0; j < kc; j++)
                s[j] = (float)kvq_rng_normal(&r);
        int32_t i1, i2;
        float d1, d2;
        kvq_km_row_argmin_ref(s, cn, xn, kc, &i1, &d1);
        kvq_km_row_argmin_avx2(s, cn, xn, kc, &i2, &d2);
        assert_int_equal(i1, i2);
        assert_memory_equal(&d1, &d2, sizeof d1);
        if (kvq_cpu_has_avx512()) {
            kvq_km_row_argmin_avx512(s, cn, xn, kc, &i2, &d2);
            assert_int_equal(i1, i2);
            assert_memory_equal(&d1, &d2, sizeof d1);
        }
        /* and both are the sequential first minimum */
        int32_t seq = 0;
        for (int32_t j = 1; j < kc; j++)
            if (kvq_km_dist_from_dot(xn, cn[j], s[j]) < kvq_km_dist_from_dot(xn, cn[seq], s[seq]))
                seq = j;
        assert_int_equal(i1, seq);
    }
#else
    TEST_SKIP("not an x86-64 build");
#endif
}

/* The small-d direct paths, AVX2 and AVX-512 (and so the CPU backend for
 * d <= KVQ_KM_DIRECT_MAX_D), equal the scalar reference bit for bit: kvq_km_l2sq and the
 * first minimum. */
static void test_direct_matches_reference(void **state)
{
#ifdef KVQ_KM_HAVE_AVX2_ARGMIN
    if (!kvq_cpu_has_avx2())
        TEST_SKIP("no AVX2 on this CPU");
    const int64_t n = 300;
    int32_t a[300], a2[300];
    float dist[300];
    kvq_rng r;
    kvq_rng_seed(&r, 6);
    for (int32_t d = 1; d <= KVQ_KM_DIRECT_MAX_D; d++) {
        const int32_t kc = 1 + (int32_t)kvq_rng_below(&r, 45);
        const int32_t kc8 = (kc + 7) & ~7;
        float *x = random_points(n, d, 100 + d);
        float *c = random_points(kc, d, 200 + d);
        for (int32_t j = 0; j + 1 < kc; j += 3) /* duplicate centroids: exact ties */
            memcpy(c + (j + 1) * d, c + j * d, d * sizeof(float));
        for (int64_t i = 0; i < 20; i++) /* points sitting on a centroid */
            memcpy(x + i * d, c + (i % kc) * d, d * sizeof(float));
        float *ct = calloc((size_t)KVQ_KM_DIRECT_DPAD(d) * kc8, sizeof *ct);
        for (int32_t j = 0; j < kc; j++)
            for (int32_t t = 0; t < d; t++)
                ct[t * kc8 + j] = c[j * d + t];
        kvq_km_assign_direct_avx2(x, n, d, ct, kc, a, dist);
        if (kvq_cpu_has_avx512()) { /* sixteen centroids per register: its own layout */
            const int32_t kc16 = (kc + 15) & ~15;
            float *ct16 = calloc((size_t)KVQ_KM_DIRECT_DPAD(d) * kc16, sizeof *ct16);
            int32_t a16[300];
            float dist16[300];
            for (int32_t j = 0; j < kc; j++)
                for (int32_t t = 0; t < d; t++)
                    ct16[t * kc16 + j] = c[j * d + t];
            kvq_km_assign_direct_avx512(x, n, d, ct16, kc, a16, dist16);
            assert_memory_equal(a16, a, sizeof a);
            assert_memory_equal(dist16, dist, sizeof dist);
            /* row counts that leave every tail of the 4- and 2-row loops */
            kvq_km_assign_direct_avx512(x + 3 * d, n - 3, d, ct16, kc, a16, dist16);
            assert_memory_equal(a16, a + 3, (n - 3) * sizeof *a);
            assert_memory_equal(dist16, dist + 3, (n - 3) * sizeof *dist);
            free(ct16);
        }
        for (int64_t i = 0; i < n; i++) {
            int32_t best = 0;
            float bd = INFINITY;
            for (int32_t j = 0; j < kc; j++) {
                float v = kvq_km_l2sq(x + i * d, c + j * d, d);
                if (kvq_km_better(v, j, bd, best)) {
                    bd = v;
                    best = j;
                }
            }
            assert_int_equal(a[i], best);
            assert_memory_equal(&dist[i], &bd, sizeof bd);
        }
        /* the public assign takes this path for small d */
        kvq_kmeans_params p = kvq_kmeans_params_default();
        p.k = kc;
        kvq_err e = {0};
        assert_int_equal(kvq_kmeans_assign(x, n, d, c, &p, a2, NULL, &e), KVQ_OK);
        assert_memory_equal(a, a2, sizeof a);
        free(ct);
        free(x);
        free(c);
    }
#else
    TEST_SKIP("not an x86-64 build");
#endif
}

/* The seeding kernel: AVX2 and AVX-512 equal the scalar reference bit for bit for every
 * tile shape (P points x 16 / P candidates), distances and potentials; a point equal to
 * a candidate is at distance exactly 0; the distances agree with the exact ones. */
static void test_cand_eval_matches_ref(void **state)
{
    enum { L = KVQ_KM_CAND_LANES, D = 37, MAXT = 13 };
    const int32_t d = D;
    kvq_rng r;
    kvq_rng_seed(&r, 8);
    const int32_t shapes[5] = {1, 2, 4, 8, 16};
    const int64_t tiles[3] = {1, 6, MAXT}; /* tails of the 8- and 4-tile loops */
    float *x = malloc((size_t)MAXT * 16 * d * sizeof *x);
    float *xi = malloc((size_t)MAXT * 16 * d * sizeof *xi);
    float xn[MAXT * 16], w[MAXT * 16], dm[MAXT * 16];
    float ct[D * L], cn[L];
    float *dist[3];
    for (int v = 0; v < 3; v++)
        dist[v] = malloc((size_t)MAXT * L * sizeof(float));
    for (int si = 0; si < 5; si++)
        for (int ti = 0; ti < 3; ti++) {
            const int32_t P = shapes[si], nc = L / P;
            const int64_t nt = tiles[ti], np = nt * P;
            for (int64_t i = 0; i < np * d; i++)
                x[i] = (float)kvq_rng_normal(&r);
            int64_t cand[16] = {0};
            for (int32_t t = 0; t < nc; t++)
                cand[t] = (int64_t)kvq_rng_below(&r, (uint64_t)np);
            if (nc > 1)
                cand[nc - 1] = cand[0]; /* two lanes with the same candidate */
            for (int64_t i = 0; i < np; i++) {
                const int64_t g = i / P, q = i % P;
                for (int32_t j = 0; j < d; j++)
                    xi[((size_t)g * d + j) * P + q] = x[i * d + j];
                xn[i] = kvq_km_norm2_fma(x + i * d, d);
                w[i] = (float)(i % 3) * 1.25f; /* includes weight 0 */
                dm[i] = i % 5 == 0 ? INFINITY : i % 5 == 1 ? 0.0f : (float)(kvq_rng_uniform(&r) * 80);
            }
            for (int l = 0; l < L; l++) {
                for (int32_t j = 0; j < d; j++)
                    ct[j * L + l] = x[cand[l / P] * d + j];
                cn[l] = xn[cand[l / P]];
            }
            double pot[3][L];
            for (int v = 0; v < 3; v++)
                for (int l = 0; l < L; l++)
                    pot[v][l] = 0.5 * l; /* the kernel adds to it */
            kvq_km_cand_eval_ref(xi, xn, w, dm, nt, d, P, ct, cn, dist[0], pot[0]);
            for (int64_t i = 0; i < np; i++)
                for (int32_t t = 0; t < nc; t++) {
                    const float v = dist[0][(i / P) * L + t * P + i % P];
                    if (i == cand[t])
                        assert_true(v == 0.0f);
                    const double ex = l2sq_double(x + i * d, x + cand[t] * d, d);
                    assert_true(fabs(v - ex) <= KVQ_KMEANS_TOL_DIST * (xn[i] + cn[t * P]));
                }
#ifdef KVQ_KM_HAVE_AVX2_ARGMIN
            if (kvq_cpu_has_avx2()) {
                kvq_km_cand_eval_avx2(xi, xn, w, dm, nt, d, P, ct, cn, dist[1], pot[1]);
                assert_memory_equal(dist[0], dist[1], (size_t)nt * L * sizeof(float));
                assert_memory_equal(pot[0], pot[1], sizeof pot[0]);
            }
            if (kvq_cpu_has_avx512()) {
                kvq_km_cand_eval_avx512(xi, xn, w, dm, nt, d, P, ct, cn, dist[2], pot[2]);
                assert_memory_equal(dist[0], dist[2], (size_t)nt * L * sizeof(float));
                assert_memory_equal(pot[0], pot[2], sizeof pot[0]);
            }
#endif
        }
    for (int v = 0; v < 3; v++)
        free(dist[v]);
    free(x);
    free(xi);
}

/* Every seeding path (k-means++: tiles of 16 points; greedy with 2, 3, 7, 12 and 20
 * candidates: 8, 4, 2, 1 points per tile and two chunks; k-means||) gives the same bits
 * on 1 and 2 threads with the per-step loops forced parallel, picks distinct data
 * points, and with weights never picks a weight-0 point. */
static void test_seed_paths_threads(void **state)
{
    const int64_t n = 2400; /* three seeding blocks */
    const int32_t d = 11, k = 10;
    float *x = planted(12, n / 12, d, 4.0f, 0.5f, 131, NULL);
    float *w = malloc(n * sizeof *w);
    for (int64_t i = 0; i < n; i++)
        w[i] = i % 4 == 3 ? 0.0f : 1.0f + (float)(i % 3);
    float c1[10 * 11], c2[10 * 11];
    void *ctx = NULL;
    kvq_err e = {0};
    const struct {
        kvq_kmeans_init init;
        int32_t trials;
    } cases[] = {{KVQ_KMEANS_INIT_PP, 0},        {KVQ_KMEANS_INIT_GREEDY_PP, 2},
                 {KVQ_KMEANS_INIT_GREEDY_PP, 3}, {KVQ_KMEANS_INIT_GREEDY_PP, 7},
                 {KVQ_KMEANS_INIT_GREEDY_PP, 12}, {KVQ_KMEANS_INIT_GREEDY_PP, 20},
                 {KVQ_KMEANS_INIT_PARALLEL, 0}};
    for (int wi = 0; wi < 2; wi++) {
        const float *wp = wi ? w : NULL;
        assert_int_equal(kvq_km_backend_cpu.create(x, wp, n, d, 2, &ctx, &e), KVQ_OK);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            kvq_km_data data = {.x = x, .w = wp, .n = n, .d = d, .force_threads = 1};
            kvq_kmeans_params p = kvq_kmeans_params_default();
            p.k = k;
            p.init = cases[ci].init;
            p.greedy_trials = cases[ci].trials;
            p.seed_points_per_centroid = 0; /* all 2400 points */
            p.threads = 1;
            assert_int_equal(kvq_km_seed(&data, &p, &kvq_km_backend_cpu, ctx, c1, &e), KVQ_OK);
            p.threads = 2;
            assert_int_equal(kvq_km_seed(&data, &p, &kvq_km_backend_cpu, ctx, c2, &e), KVQ_OK);
            assert_memory_equal(c1, c2, sizeof c1);
            for (int32_t j = 0; j < k; j++) {
                int64_t row = -1;
                for (int64_t i = 0; i < n && row < 0; i++)
                    if (memcmp(x + i * d, c1 + j * d, d * sizeof(float)) == 0)
                        row = i;
                assert_true(row >= 0);
                if (wp)
                    assert_true(wp[row] > 0.0f);
                for (int32_t q = 0; q < j; q++)
                    assert_memory_not_equal(c1 + q * d, c1 + j * d, d * sizeof(float));
            }
        }
        kvq_km_backend_cpu.destroy(ctx);
        ctx = NULL;
    }
    free(x);
    free(w);
}

/* Seeding runs on a seeded subsample of seed_points_per_centroid * k points: logged,
 * reproducible, different from seeding on every point, 0 = every point; negative is
 * rejected. */
static void test_seed_subsample(void **state)
{
    const int64_t n = 4000;
    const int32_t d = 6, k = 16;
    float *x = planted(8, n / 8, d, 5.0f, 1.0f, 141, NULL);
    log_capture lc;
    memset(&lc, 0, sizeof lc);
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = k;
    p.max_iters = 0;
    p.label = "sub";
    p.cb.log = capture_log;
    p.cb.user = &lc;
    float c1[16 * 6], c2[16 * 6], c3[16 * 6];
    kvq_err e = {0};
    p.seed_points_per_centroid = 10;
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c1, NULL, NULL, &e), KVQ_OK);
    assert_non_null(strstr(lc.all, "sub: seeding on a subsample of 160 of 4000 points"));
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c2, NULL, NULL, &e), KVQ_OK);
    assert_memory_equal(c1, c2, sizeof c1);
    memset(&lc, 0, sizeof lc);
    p.seed_points_per_centroid = 0;
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c3, NULL, NULL, &e), KVQ_OK);
    assert_null(strstr(lc.all, "seeding on a subsample"));
    assert_memory_not_equal(c1, c3, sizeof c1);
    p.seed_points_per_centroid = 250; /* 250 * 16 = n: no subsample, same as 0 */
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c2, NULL, NULL, &e), KVQ_OK);
    assert_memory_equal(c2, c3, sizeof c2);
    p.seed_points_per_centroid = -1;
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c2, NULL, NULL, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_kmeans_params_default().seed_points_per_centroid,
                     KVQ_KMEANS_SEED_PPC_DEFAULT);
    free(x);
}

/* The backend update equals a plain weighted mean summed in double in point order. */
static void test_update_matches_reference(void **state)
{
    const int64_t n = 5000;
    const int32_t d = 5, k = 9;
    float *x = random_points(n, d, 21);
    float *w = malloc(n * sizeof *w);
    int32_t *a = malloc(n * sizeof *a);
    kvq_rng r;
    kvq_rng_seed(&r, 22);
    for (int64_t i = 0; i < n; i++) {
        w[i] = (float)(kvq_rng_uniform(&r) * 3);
        a[i] = (int32_t)kvq_rng_below(&r, k - 1); /* cluster k-1 stays empty */
    }
    float c[9 * 5], ref[9 * 5];
    for (int j = 0; j < k * d; j++)
        c[j] = ref[j] = -7.0f;
    double wsum[9];
    int64_t count[9];
    void *ctx = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_km_backend_cpu.create(x, w, n, d, 2, &ctx, &e), KVQ_OK);
    assert_int_equal(kvq_km_backend_cpu.update(ctx, a, k, c, wsum, count, &e), KVQ_OK);
    for (int32_t j = 0; j < k; j++) {
        double s[5] = {0}, ws = 0;
        int64_t cnt = 0;
        for (int64_t i = 0; i < n; i++)
            if (a[i] == j) {
                for (int t = 0; t < d; t++)
                    s[t] += (double)w[i] * (double)x[i * d + t];
                ws += w[i];
                cnt++;
            }
        assert_int_equal(count[j], cnt);
        assert_true(wsum[j] == ws);
        if (ws > 0)
            for (int t = 0; t < d; t++)
                ref[j * d + t] = (float)(s[t] / ws);
    }
    assert_memory_equal(c, ref, sizeof c); /* bit-identical, the empty row untouched */
    assert_true(c[(k - 1) * d] == -7.0f);
    kvq_km_backend_cpu.destroy(ctx);
    free(x);
    free(w);
    free(a);
}

/* The Lloyd inertia (SGEMM distances) agrees with the scalar potential. */
static void test_inertia_matches_reference(void **state)
{
    const int64_t n = 3000;
    const int32_t d = 12;
    float *x = random_points(n, d, 31);
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = 40;
    p.max_iters = 1;
    float *c = malloc(p.k * d * sizeof *c);
    float *c0 = malloc(p.k * d * sizeof *c0);
    kvq_kmeans_stats s;
    kvq_err e = {0};
    /* max_iters = 0 returns the seeds themselves */
    p.max_iters = 0;
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c0, NULL, &s, &e), KVQ_OK);
    assert_int_equal(s.n_iters, 0);
    kvq_kmeans_stats_free(&s);
    p.max_iters = 1;
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c, NULL, &s, &e), KVQ_OK);
    kvq_km_data data = {.x = x, .w = NULL, .n = n, .d = d};
    double ref = kvq_km_potential_ref(&data, c0, p.k, 1);
    assert_true(fabs(s.inertia[0] - ref) <= KVQ_KMEANS_TOL_DIST * ref);
    kvq_kmeans_stats_free(&s);
    free(x);
    free(c);
    free(c0);
}

/* ---- Lloyd behaviour ---------------------------------------------------------------------- */

static void test_planted_recovery(void **state)
{
    const int32_t nc = 8, d = 16;
    const int64_t per = 200, n = nc * per;
    float truth[8 * 16];
    float *x = planted(nc, per, d, 10.0f, 0.1f, 41, truth);
    const kvq_kmeans_init inits[] = {KVQ_KMEANS_INIT_GREEDY_PP, KVQ_KMEANS_INIT_PP,
                                     KVQ_KMEANS_INIT_PARALLEL};
    for (size_t m = 0; m < sizeof inits / sizeof inits[0]; m++) {
        kvq_kmeans_params p = kvq_kmeans_params_default();
        p.k = nc;
        p.init = inits[m];
        float c[8 * 16];
        int32_t *a = malloc(n * sizeof *a);
        kvq_kmeans_stats s;
        kvq_err e = {0};
        assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c, a, &s, &e), KVQ_OK);
        assert_true(recovered(a, nc, per));
        assert_int_equal(s.converged, 1);
        assert_int_equal(s.backend, KVQ_KMEANS_DEVICE_CPU);
        for (int32_t j = 0; j < nc; j++) {
            const float *cj = c + a[j * per] * d;
            /* the centroid is the planted center up to the noise of 200 samples */
            assert_true(l2sq_double(cj, truth + j * d, d) < 16 * 0.01 * 4 / per);
            assert_int_equal(s.cluster_size[a[j * per]], per);
        }
        assert_true(s.inertia_final >= 0 && fabs(s.inertia_final - s.inertia[s.n_iters - 1]) <=
                                                1e-3 * s.inertia_final);
        kvq_kmeans_stats_free(&s);
        free(a);
    }
    free(x);
}

static void test_inertia_monotone(void **state)
{
    const int64_t n = 4000;
    const int32_t d = 20; /* the SGEMM path: inertia from the expanded form */
    float *x = random_points(n, d, 51); /* no structure: many iterations */
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = 50;
    p.tol = 0;
    p.max_iters = 30;
    p.init = KVQ_KMEANS_INIT_RANDOM;
    float *c = malloc(p.k * d * sizeof *c);
    kvq_kmeans_stats s;
    kvq_err e = {0};
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c, NULL, &s, &e), KVQ_OK);
    assert_int_equal(s.n_iters, 30);
    assert_int_equal(s.converged, 0);
    assert_true(s.inertia[s.n_iters - 1] < 0.8 * s.inertia[0]);
    for (int32_t t = 1; t < s.n_iters; t++)
        assert_true(s.inertia[t] <= s.inertia[t - 1] * (1 + 1e-6));
    for (int32_t t = 0; t < s.n_iters; t++)
        assert_true(s.iter_seconds[t] >= 0);
    kvq_kmeans_stats_free(&s);
    free(x);
    free(c);
}

/* Same seed -> same bytes, run to run and for 1 vs 2 threads, for every init method; d = 8 takes
 * the direct path (with AVX2), d = 24 the SGEMM path. */
static void check_determinism(int32_t d)
{
    const int64_t n = 12000; /* several seeding blocks and distance blocks */
    const int32_t k = 64;
    float *x = planted(16, n / 16, d, 3.0f, 1.0f, 61, NULL);
    float *w = malloc(n * sizeof *w);
    for (int64_t i = 0; i < n; i++)
        w[i] = 0.5f + (float)(i % 7);
    const kvq_kmeans_init inits[] = {KVQ_KMEANS_INIT_GREEDY_PP, KVQ_KMEANS_INIT_PP,
                                     KVQ_KMEANS_INIT_PARALLEL, KVQ_KMEANS_INIT_RANDOM};
    float *c[4];
    int32_t *a[4];
    for (int r = 0; r < 4; r++) {
        c[r] = malloc(k * d * sizeof(float));
        a[r] = malloc(n * sizeof(int32_t));
    }
    for (size_t m = 0; m < sizeof inits / sizeof inits[0]; m++) {
        const int threads[3] = {1, 1, 2};
        for (int r = 0; r < 3; r++) {
            kvq_kmeans_params p = kvq_kmeans_params_default();
            p.k = k;
            p.init = inits[m];
            p.max_iters = 8;
            p.max_points_per_centroid = 150; /* subsample 9600 of 12000 */
            p.threads = threads[r];
            kvq_err e = {0};
            assert_int_equal(kvq_kmeans_fit(x, n, d, m % 2 ? w : NULL, &p, c[r], a[r], NULL, &e),
                             KVQ_OK);
        }
        for (int r = 1; r < 3; r++) {
            assert_memory_equal(c[0], c[r], k * d * sizeof(float));
            assert_memory_equal(a[0], a[r], n * sizeof(int32_t));
        }
    }
    /* another seed gives other centroids */
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = k;
    p.max_iters = 8;
    p.seed = 99;
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c[1], NULL, NULL, NULL), KVQ_OK);
    p.seed = 100;
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c[2], NULL, NULL, NULL), KVQ_OK);
    assert_memory_not_equal(c[1], c[2], k * d * sizeof(float));
    for (int r = 0; r < 4; r++) {
        free(c[r]);
        free(a[r]);
    }
    free(x);
    free(w);
}

static void test_determinism(void **state)
{
    check_determinism(8);
    check_determinism(24);
}

/* A forced bad start: one centroid far from all data gets no points, is re-seeded by
 * splitting the heaviest cluster, and Lloyd then recovers every planted cluster. */
static void test_empty_cluster_repair(void **state)
{
    const int32_t nc = 4, d = 6;
    const int64_t per = 100, n = nc * per;
    float truth[4 * 6];
    float *x = planted(nc, per, d, 10.0f, 0.2f, 71, truth);
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = nc;
    p.init = KVQ_KMEANS_INIT_GIVEN;
    float c[4 * 6];
    memcpy(c, truth, 3 * d * sizeof(float)); /* clusters 0..2 right, 3 missing */
    for (int t = 0; t < d; t++)
        c[3 * d + t] = 1000.0f;
    int32_t a[400];
    kvq_kmeans_stats s;
    kvq_err e = {0};
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c, a, &s, &e), KVQ_OK);
    assert_true(s.n_empty_repairs >= 1);
    assert_true(recovered(a, nc, per));
    for (int32_t j = 0; j < nc; j++)
        assert_int_equal(s.cluster_size[j], per);
    kvq_kmeans_stats_free(&s);

    /* k above the number of distinct points: duplicates are fine, inertia is 0 */
    float dup[30 * 2];
    for (int i = 0; i < 30; i++) {
        dup[2 * i] = (float)(i % 3);
        dup[2 * i + 1] = (float)(i % 3) * 2.0f;
    }
    p = kvq_kmeans_params_default();
    p.k = 5;
    p.min_points_per_centroid = 0;
    float c5[5 * 2];
    assert_int_equal(kvq_kmeans_fit(dup, 30, 2, NULL, &p, c5, NULL, &s, &e), KVQ_OK);
    assert_true(s.inertia[s.n_iters - 1] == 0.0);
    for (int j = 0; j < 5; j++) {
        assert_true(c5[2 * j] == 0.0f || c5[2 * j] == 1.0f || c5[2 * j] == 2.0f);
        assert_true(c5[2 * j + 1] == 2 * c5[2 * j]);
    }
    kvq_kmeans_stats_free(&s);
    free(x);
}

/* A point of integer weight w acts as w copies; weight 0 acts as absent. */
static void test_weights(void **state)
{
    const int64_t n = 300;
    const int32_t d = 4, k = 6;
    float *x = random_points(n, d, 81);
    float *w = malloc(n * sizeof *w);
    int64_t nrep = 0;
    for (int64_t i = 0; i < n; i++) {
        w[i] = (float)(1 + i % 3);
        nrep += 1 + i % 3;
    }
    float *xr = malloc(nrep * d * sizeof *xr);
    int64_t *orig = malloc(nrep * sizeof *orig);
    for (int64_t i = 0, q = 0; i < n; i++)
        for (int r = 0; r < 1 + i % 3; r++, q++) {
            memcpy(xr + q * d, x + i * d, d * sizeof(float));
            orig[q] = i;
        }
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = k;
    p.init = KVQ_KMEANS_INIT_GIVEN;
    p.tol = 0;
    p.max_iters = 15;
    p.min_points_per_centroid = 0;
    float c1[6 * 4], c2[6 * 4];
    memcpy(c1, x, sizeof c1); /* first k points as the start */
    memcpy(c2, x, sizeof c2);
    int32_t *a1 = malloc(n * sizeof *a1), *a2 = malloc(nrep * sizeof *a2);
    kvq_kmeans_stats s1, s2;
    kvq_err e = {0};
    assert_int_equal(kvq_kmeans_fit(x, n, d, w, &p, c1, a1, &s1, &e), KVQ_OK);
    assert_int_equal(kvq_kmeans_fit(xr, nrep, d, NULL, &p, c2, a2, &s2, &e), KVQ_OK);
    for (int j = 0; j < k * d; j++)
        assert_true(fabsf(c1[j] - c2[j]) <= 1e-5f * (1 + fabsf(c2[j])));
    for (int64_t q = 0; q < nrep; q++)
        assert_int_equal(a2[q], a1[orig[q]]);
    for (int32_t t = 0; t < s1.n_iters; t++)
        assert_true(fabs(s1.inertia[t] - s2.inertia[t]) <= 1e-6 * s2.inertia[t]);
    kvq_kmeans_stats_free(&s1);
    kvq_kmeans_stats_free(&s2);

    /* a far outlier of weight 0 changes nothing (bit for bit) */
    float *xo = malloc((n + 1) * d * sizeof *xo), *wo = malloc((n + 1) * sizeof *wo);
    memcpy(xo, x, n * d * sizeof *xo);
    memcpy(wo, w, n * sizeof *wo);
    for (int t = 0; t < d; t++)
        xo[n * d + t] = 500.0f;
    wo[n] = 0.0f;
    memcpy(c2, x, sizeof c2);
    assert_int_equal(kvq_kmeans_fit(xo, n + 1, d, wo, &p, c2, NULL, NULL, &e), KVQ_OK);
    assert_memory_equal(c1, c2, sizeof c1);
    free(x);
    free(w);
    free(xr);
    free(orig);
    free(a1);
    free(a2);
    free(xo);
    free(wo);
}

/* ---- seeding quality ------------------------------------------------------------------ */

static void test_seeding_potential(void **state)
{
    const int32_t nc = 20, d = 8;
    const int64_t per = 100, n = nc * per;
    float *x = planted(nc, per, d, 5.0f, 0.3f, 91, NULL);
    const kvq_kmeans_init inits[] = {KVQ_KMEANS_INIT_RANDOM, KVQ_KMEANS_INIT_PP,
                                     KVQ_KMEANS_INIT_GREEDY_PP, KVQ_KMEANS_INIT_PARALLEL};
    double avg[4] = {0};
    const int seeds = 8;
    float c[20 * 8];
    for (int m = 0; m < 4; m++)
        for (int sd = 0; sd < seeds; sd++) {
            kvq_kmeans_params p = kvq_kmeans_params_default();
            p.k = nc;
            p.init = inits[m];
            p.seed = 1000 + sd;
            p.max_iters = 1;
            kvq_kmeans_stats s;
            kvq_err e = {0};
            assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c, NULL, &s, &e), KVQ_OK);
            assert_true(s.seed_seconds >= 0);
            avg[m] += s.inertia[0] / seeds;
            kvq_kmeans_stats_free(&s);
        }
    printf("initial potential: random %.1f  k-means++ %.1f  greedy %.1f  k-means|| %.1f\n",
           avg[0], avg[1], avg[2], avg[3]);
    assert_true(avg[1] < 0.5 * avg[0]);
    assert_true(avg[2] <= avg[1]);
    assert_true(avg[3] < 0.5 * avg[0]);
    free(x);
}

/* ---- parameters, logging, errors -------------------------------------------------------- */

static void test_subsample_and_warnings(void **state)
{
    const int64_t n = 1000;
    const int32_t d = 3;
    float *x = random_points(n, d, 101);
    int32_t *a = malloc(n * sizeof *a);
    log_capture lc;
    memset(&lc, 0, sizeof lc);
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = 4;
    p.max_points_per_centroid = 50; /* 1000 > 200: subsample */
    p.label = "L0H1";
    p.cb.log = capture_log;
    p.cb.user = &lc;
    float c[4 * 3];
    kvq_kmeans_stats s;
    kvq_err e = {0};
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c, a, &s, &e), KVQ_OK);
    assert_int_equal(s.n_train, 200);
    assert_non_null(strstr(lc.all, "L0H1: training on a seeded subsample of 200 of 1000"));
    assert_int_equal(lc.n[KVQ_LOG_WARN], 0);
    assert_true(s.inertia_final > 0);
    for (int64_t i = 0; i < n; i++)
        assert_true(a[i] >= 0 && a[i] < 4);
    kvq_kmeans_stats_free(&s);

    /* fewer than 39 points per centroid: one warning */
    memset(&lc, 0, sizeof lc);
    p.k = 30; /* 1000 < 39 * 30 */
    p.max_points_per_centroid = 256;
    float c30[30 * 3];
    assert_int_equal(kvq_kmeans_fit(x, n, d, NULL, &p, c30, NULL, NULL, &e), KVQ_OK);
    assert_int_equal(lc.n[KVQ_LOG_WARN], 1);
    assert_non_null(strstr(lc.last[KVQ_LOG_WARN], "fewer than 39 per centroid"));
    free(x);
    free(a);
}

static void test_errors(void **state)
{
    float x[10 * 2];
    for (int i = 0; i < 20; i++)
        x[i] = (float)i;
    float c[11 * 2];
    kvq_kmeans_params p = kvq_kmeans_params_default();
    kvq_err e = {0};
    p.k = 11;
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, NULL, &p, c, NULL, NULL, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(e.status, KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "k=11 is larger than n=10"));
    p.k = 0;
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, NULL, &p, c, NULL, NULL, &e), KVQ_E_INVALID_ARG);
    p.k = 2;
    p.threads = 0;
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, NULL, &p, c, NULL, NULL, &e), KVQ_E_INVALID_ARG);
    p.threads = 1;
    p.tol = NAN;
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, NULL, &p, c, NULL, NULL, &e), KVQ_E_INVALID_ARG);
    p.tol = 1e-4;
    assert_int_equal(kvq_kmeans_fit(NULL, 10, 2, NULL, &p, c, NULL, NULL, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_kmeans_fit(x, 10, 0, NULL, &p, c, NULL, NULL, &e), KVQ_E_INVALID_ARG);

    x[13] = NAN; /* row 6, col 1 */
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, NULL, &p, c, NULL, NULL, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "data row 6 col 1 is NaN"));
    x[13] = INFINITY;
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, NULL, &p, c, NULL, NULL, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "row 6 col 1 is Inf"));
    x[13] = 3e30f; /* finite, but its square overflows */
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, NULL, &p, c, NULL, NULL, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "row 6"));
    x[13] = 13.0f;

    float w[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    w[4] = -1;
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, w, &p, c, NULL, NULL, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "row 4"));
    w[4] = NAN;
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, w, &p, c, NULL, NULL, &e), KVQ_E_NUMERIC);
    memset(w, 0, sizeof w);
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, w, &p, c, NULL, NULL, &e), KVQ_E_INVALID_ARG);

    p.init = KVQ_KMEANS_INIT_GIVEN;
    c[0] = 1;
    c[1] = 2;
    c[2] = NAN;
    c[3] = 0;
    assert_int_equal(kvq_kmeans_fit(x, 10, 2, NULL, &p, c, NULL, NULL, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "initial centroid row 1"));
    int32_t a[10];
    assert_int_equal(kvq_kmeans_assign(x, 10, 2, c, &p, a, NULL, &e), KVQ_E_NUMERIC);

    kvq_kmeans_init m;
    assert_int_equal(kvq_kmeans_init_parse("k-means||", &m, &e), KVQ_OK);
    assert_int_equal(m, KVQ_KMEANS_INIT_PARALLEL);
    assert_int_equal(kvq_kmeans_init_parse("greedy", &m, &e), KVQ_OK);
    assert_int_equal(m, KVQ_KMEANS_INIT_GREEDY_PP);
    assert_string_equal(kvq_kmeans_init_name(KVQ_KMEANS_INIT_PP), "k-means++");
    assert_int_equal(kvq_kmeans_init_parse("kmeans+", &m, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "kmeans+"));
}

static int cancel_at_3(void *user, const char *what, uint64_t done, uint64_t total)
{
    (void)user;
    (void)total;
    return strcmp(what, "kmeans") == 0 && done >= 3;
}

static void test_cancel(void **state)
{
    float *x = random_points(2000, 4, 111);
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = 20;
    p.tol = 0;
    p.cb.progress = cancel_at_3;
    float c[20 * 4];
    kvq_kmeans_stats s;
    memset(&s, 0, sizeof s);
    kvq_err e = {0};
    assert_int_equal(kvq_kmeans_fit(x, 2000, 4, NULL, &p, c, NULL, &s, &e), KVQ_E_CANCELLED);
    assert_null(s.inertia); /* nothing handed out on failure */
    kvq_kmeans_stats_free(&s);
    free(x);
}

/* device=cuda with a usable GPU (a CUDA build on a GPU machine): the fit runs on it
 * (stats.backend), silently, and on separable blobs gives the CPU's assignment. */
static void cuda_fit_matches_cpu(const float *x)
{
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = 4;
    log_capture lc;
    memset(&lc, 0, sizeof lc);
    float c_cpu[4 * 5], c_gpu[4 * 5];
    int32_t a_cpu[400], a_gpu[400];
    kvq_kmeans_stats s;
    memset(&s, 0, sizeof s);
    kvq_err e = {0};
    assert_int_equal(kvq_kmeans_fit(x, 400, 5, NULL, &p, c_cpu, a_cpu, NULL, &e), KVQ_OK);
    p.device = KVQ_KMEANS_DEVICE_CUDA;
    p.cb.log = capture_log;
    p.cb.user = &lc;
    assert_int_equal(kvq_kmeans_fit(x, 400, 5, NULL, &p, c_gpu, a_gpu, &s, &e), KVQ_OK);
    assert_int_equal(s.backend, KVQ_KMEANS_DEVICE_CUDA);
    assert_int_equal(lc.n[KVQ_LOG_WARN], 0);
    assert_memory_equal(a_cpu, a_gpu, sizeof a_cpu);
    for (int i = 0; i < 4 * 5; i++) /* same clusters: centroids equal to float roundings */
        assert_true(fabsf(c_cpu[i] - c_gpu[i]) <= 1e-5f * (fabsf(c_cpu[i]) + 1.0f));
    kvq_kmeans_stats_free(&s);
}

/* device=cuda: without a usable GPU the CPU result and one warning line; with one, the
 * GPU's fit against the CPU's (tests/cuda/test_cuda_paths.c checks each step). */
static void test_cuda_fallback(void **state)
{
    const char *why = NULL;
    float *x = planted(4, 100, 5, 8.0f, 0.5f, 121, NULL);
    if (kvq_cuda_available(&why)) {
        cuda_fit_matches_cpu(x);
        free(x);
        return;
    }
    log_capture lc;
    memset(&lc, 0, sizeof lc);
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = 4;
    float c_cpu[4 * 5], c_gpu[4 * 5];
    int32_t a[400];
    kvq_kmeans_stats s;
    kvq_err e = {0};
    assert_int_equal(kvq_kmeans_fit(x, 400, 5, NULL, &p, c_cpu, NULL, NULL, &e), KVQ_OK);
    p.device = KVQ_KMEANS_DEVICE_CUDA;
    p.cb.log = capture_log;
    p.cb.user = &lc;
    assert_int_equal(kvq_kmeans_fit(x, 400, 5, NULL, &p, c_gpu, a, &s, &e), KVQ_OK);
    assert_memory_equal(c_cpu, c_gpu, sizeof c_cpu);
    assert_int_equal(s.backend, KVQ_KMEANS_DEVICE_CPU);
    assert_int_equal(lc.n[KVQ_LOG_WARN], 1);
    assert_non_null(strstr(lc.last[KVQ_LOG_WARN], "CUDA requested but unavailable"));
    assert_null(strchr(lc.last[KVQ_LOG_WARN], '\n'));
    kvq_kmeans_stats_free(&s);
    /* auto picks the CPU silently */
    memset(&lc, 0, sizeof lc);
    p.device = KVQ_KMEANS_DEVICE_AUTO;
    assert_int_equal(kvq_kmeans_fit(x, 400, 5, NULL, &p, c_gpu, NULL, NULL, &e), KVQ_OK);
    assert_int_equal(lc.n[KVQ_LOG_WARN], 0);
    assert_memory_equal(c_cpu, c_gpu, sizeof c_cpu);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_gemm_matches_reference),
        cmocka_unit_test(test_argmin_simd_matches_ref),
        cmocka_unit_test(test_direct_matches_reference),
        cmocka_unit_test(test_cand_eval_matches_ref),
        cmocka_unit_test(test_seed_paths_threads),
        cmocka_unit_test(test_seed_subsample),
        cmocka_unit_test(test_update_matches_reference),
        cmocka_unit_test(test_inertia_matches_reference),
        cmocka_unit_test(test_planted_recovery),
        cmocka_unit_test(test_inertia_monotone),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_empty_cluster_repair),
        cmocka_unit_test(test_weights),
        cmocka_unit_test(test_seeding_potential),
        cmocka_unit_test(test_subsample_and_warnings),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_cuda_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
