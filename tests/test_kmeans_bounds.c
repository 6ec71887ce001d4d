/* test_kmeans_bounds.c — the CPU Lloyd iterations with bounds (kmeans/kmeans_bounds.c):
 * its kernels (AVX-512 and AVX2; skipped on a CPU without AVX-512) against their scalar
 * references bit for bit; the bounded fit against the
 * plain loop (every distance, the same arithmetic) on several seeded inputs, with ties,
 * repeated points, empty clusters, weights and 1 or 2 threads: the same assignment at
 * every iteration, the same inertia bits, the same centroids; and against plain Lloyd
 * computed with numpy (tests/data/kmeans_lloyd_ref.bin, scripts/gen_kmeans_lloyd_ref.py):
 * the same assignment at every iteration. */
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
#include "kmeans/kmeans_internal.h"
#include "kvq.h"

#define REF_FILE "tests/data/kmeans_lloyd_ref.bin"
#define MAX_IT 64

/* Every iteration's assignment, copied by the trace hook. */
typedef struct trace {
    int64_t m;
    int32_t iters;
    int32_t *a[MAX_IT];
    float *dist[MAX_IT];
} trace;

static void hook(void *user, int32_t it, const int32_t *a, const float *dist, int64_t m)
{
    trace *t = user;
    assert_true(it < MAX_IT);
    t->m = m;
    t->a[it] = malloc((size_t)m * sizeof *a);
    t->dist[it] = malloc((size_t)m * sizeof *dist);
    memcpy(t->a[it], a, (size_t)m * sizeof *a);
    memcpy(t->dist[it], dist, (size_t)m * sizeof *dist);
    t->iters = it + 1;
}

static void trace_free(trace *t)
{
    for (int32_t i = 0; i < t->iters; i++) {
        free(t->a[i]);
        free(t->dist[i]);
    }
    memset(t, 0, sizeof *t);
}

/* One fit with engine e; centroids in/out (init GIVEN or seeded as p says). */
static void fit(const float *x, int64_t n, int32_t d, const float *w, const kvq_kmeans_params *p,
                kvq_km_engine e, float *cent, trace *t, double *skipped, kvq_kmeans_stats *s)
{
    kvq_err err = {0};
    kvq_km_fit_opts o = {.engine = e, .trace = hook, .user = t, .skipped = skipped};
    kvq_status st = kvq_km_fit_ex(x, n, d, w, p, &o, cent, NULL, s, &err);
    if (st != KVQ_OK)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(st, KVQ_OK);
}

/* The bounded and the plain fit from the same start: identical at every iteration.
 * Returns the number of empty clusters repaired. */
static int64_t check_same(const float *x, int64_t n, int32_t d, const float *w,
                       const kvq_kmeans_params *p, const float *init, double *skip_out)
{
    const int32_t k = p->k;
    float *cb = malloc((size_t)k * d * sizeof *cb), *ce = malloc((size_t)k * d * sizeof *ce);
    double skipped[MAX_IT] = {0};
    trace tb = {0}, te = {0};
    kvq_kmeans_stats sb, se;
    if (init) {
        memcpy(cb, init, (size_t)k * d * sizeof *cb);
        memcpy(ce, init, (size_t)k * d * sizeof *ce);
    }
    fit(x, n, d, w, p, KVQ_KM_ENGINE_BOUNDS, cb, &tb, skipped, &sb);
    fit(x, n, d, w, p, KVQ_KM_ENGINE_EXHAUSTIVE, ce, &te, NULL, &se);
    assert_int_equal(tb.iters, te.iters);
    assert_int_equal(sb.n_iters, se.n_iters);
    for (int32_t it = 0; it < tb.iters; it++) {
        assert_memory_equal(tb.a[it], te.a[it], (size_t)n * sizeof(int32_t));
        assert_memory_equal(tb.dist[it], te.dist[it], (size_t)n * sizeof(float));
        assert_true(sb.inertia[it] == se.inertia[it]);
    }
    assert_memory_equal(cb, ce, (size_t)k * d * sizeof *cb);
    assert_int_equal(sb.n_empty_repairs, se.n_empty_repairs);
    const int64_t repairs = sb.n_empty_repairs;
    for (int32_t it = 0; skip_out && it < tb.iters; it++)
        skip_out[it] = skipped[it];
    trace_free(&tb);
    trace_free(&te);
    kvq_kmeans_stats_free(&sb);
    kvq_kmeans_stats_free(&se);
    free(cb);
    free(ce);
    return repairs;
}

static float *blobs(int64_t n, int32_t d, int32_t nb, float sd, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *c = malloc((size_t)nb * d * sizeof *c), *x = malloc((size_t)n * d * sizeof *x);
    for (int64_t j = 0; j < (int64_t)nb * d; j++)
        c[j] = (float)(3.0 + kvq_rng_normal(&r)); /* an offset, as keys have */
    for (int64_t i = 0; i < n; i++) {
        const float *cj = c + (size_t)kvq_rng_below(&r, (uint64_t)nb) * d;
        for (int32_t t = 0; t < d; t++)
            x[(size_t)i * d + t] = cj[t] + sd * (float)kvq_rng_normal(&r);
    }
    free(c);
    return x;
}

static kvq_kmeans_params params(int32_t k, int32_t iters, int32_t threads)
{
    kvq_kmeans_params p = kvq_kmeans_params_default();
    p.k = k;
    p.max_iters = iters;
    p.tol = 0;
    p.threads = threads;
    p.max_points_per_centroid = 0;
    p.min_points_per_centroid = 0;
    return p;
}

/* ---- kernels --------------------------------------------------------------------------- */

static void test_kernels_match_ref(void **state)
{
    (void)state;
#if defined(__x86_64__) && defined(__GNUC__)
    if (!kvq_cpu_has_avx512())
        skip();
    const int32_t d = 37, ncols = 48;
    float *x = blobs(8, d, 3, 2.0f, 5), *pan = blobs(ncols, d, 4, 1.0f, 6);
    float o1[8 * 48], o2[8 * 48];
    for (int32_t np = 1; np <= 8; np++)
        for (int32_t nc = 16; nc <= ncols; nc += 16) {
            const float *xp[8];
            for (int32_t p = 0; p < np; p++)
                xp[p] = x + (size_t)p * d;
            kvq_km_panel_dots_ref(xp, np, d, pan, nc, o1);
            kvq_km_panel_dots_avx512(xp, np, d, pan, nc, o2);
            assert_memory_equal(o1, o2, (size_t)np * nc * sizeof *o1);
            memset(o2, 0, sizeof o2);
            kvq_km_panel_dots_avx2(xp, np, d, pan, nc, o2);
            assert_memory_equal(o1, o2, (size_t)np * nc * sizeof *o1);
        }
    int32_t a[13];
    float p1[13], p2[13];
    for (int32_t i = 0; i < 13; i++)
        a[i] = (i * 5) % 8;
    kvq_km_pair_dots_ref(pan, 13, d, x, a, p1);
    kvq_km_pair_dots_avx512(pan, 13, d, x, a, p2);
    assert_memory_equal(p1, p2, sizeof p1);
    memset(p2, 0, sizeof p2);
    kvq_km_pair_dots_avx2(pan, 13, d, x, a, p2);
    assert_memory_equal(p1, p2, sizeof p1);
    /* group minima: ties inside and across lanes, +inf, one member, tails */
    float o[40], cn[40];
    for (int32_t u = 0; u < 40; u++) {
        o[u] = (float)((u * 7) % 5);
        cn[u] = 1.0f;
    }
    o[33] = o[17] = 9.0f; /* the smallest twice */
    for (int32_t gs = 1; gs <= 40; gs++) {
        float m1a, m2a, m1b, m2b;
        int32_t pa, pb;
        kvq_km_group_min_ref(o, cn, 20.0f, gs, &m1a, &pa, &m2a);
        kvq_km_group_min_avx512(o, cn, 20.0f, gs, &m1b, &pb, &m2b);
        assert_int_equal(pa, pb);
        assert_true(m1a == m1b && (m2a == m2b || (isinf(m2a) && isinf(m2b))));
    }
    /* a row's plan: bounds under, over and at the threshold, negative, +inf; tails */
    for (int32_t T = 1; T <= 40; T += 13) {
        float lb1[40], lb2[40], mv[40], mk1[40], mk2[40];
        uint16_t l1[40 * 4], l2[40 * 4];
        int32_t c1[40], c2[40];
        for (int32_t g = 0; g < T; g++) {
            lb1[g] = lb2[g] = (float)((g * 7) % 11) * 0.5f;
            mv[g] = g % 5 == 0 ? 6.0f : 0.25f * (float)(g % 3);
            c1[g] = c2[g] = g % 2;
        }
        lb1[T - 1] = lb2[T - 1] = INFINITY;
        kvq_km_plan_row_ref(lb1, mv, T, 4.0f, mk1, l1, 4, c1, 3);
        kvq_km_plan_row_avx512(lb2, mv, T, 4.0f, mk2, l2, 4, c2, 3);
        assert_memory_equal(lb1, lb2, (size_t)T * sizeof *lb1);
        assert_memory_equal(mk1, mk2, (size_t)T * sizeof *mk1);
        assert_memory_equal(c1, c2, (size_t)T * sizeof *c1);
        for (int32_t g = 0; g < T; g++)
            if (c1[g] > g % 2)
                assert_int_equal(l1[g * 4 + g % 2], l2[g * 4 + g % 2]);
    }
    float m1, m2;
    int32_t pos;
    kvq_km_group_min_ref(o, cn, 20.0f, 40, &m1, &pos, &m2);
    assert_int_equal(pos, 17);
    assert_true(m1 == m2);
    free(x);
    free(pan);
#else
    skip();
#endif
}

/* ---- bounded == plain -------------------------------------------------------------------- */

static void test_same_as_plain_blobs(void **state)
{
    (void)state;
    const int64_t n = 6000;
    const int32_t d = 40;
    double skipped[MAX_IT];
    float *x = blobs(n, d, 50, 0.7f, 11);
    for (int32_t threads = 1; threads <= 2; threads++) {
        kvq_kmeans_params p = params(96, 12, threads);
        p.seed = 3;
        check_same(x, n, d, NULL, &p, NULL, skipped);
    }
    /* the bounds must skip work once the centroids settle */
    assert_true(skipped[0] == 0.0);
    assert_true(skipped[11] > 0.5);
    free(x);
}

/* Repeated points, duplicated initial centroids (exact ties: the lower index wins, the
 * other cluster empties and is repaired) and integer data (ties throughout). */
static void test_same_as_plain_ties_duplicates_empty(void **state)
{
    (void)state;
    const int64_t n = 3000;
    const int32_t d = 20, k = 64;
    kvq_rng r;
    kvq_rng_seed(&r, 21);
    float *x = malloc((size_t)n * d * sizeof *x), *init = malloc((size_t)k * d * sizeof *init);
    for (int64_t i = 0; i < n; i++)
        for (int32_t t = 0; t < d; t++)
            x[(size_t)i * d + t] = (float)(kvq_rng_below(&r, 5)) - 2.0f;
    for (int64_t i = n / 2; i < n; i++) /* every point twice */
        memcpy(x + (size_t)i * d, x + (size_t)(i - n / 2) * d, (size_t)d * sizeof *x);
    for (int32_t j = 0; j < k; j++) /* centroids j and j + 8 equal for j < 8 */
        memcpy(init + (size_t)j * d, x + (size_t)(j < 8 || j >= 16 ? j : j - 8) * 7 * d,
               (size_t)d * sizeof *x);
    kvq_kmeans_params p = params(k, 10, 2);
    p.init = KVQ_KMEANS_INIT_GIVEN;
    assert_true(check_same(x, n, d, NULL, &p, init, NULL) >= 8);
    /* all points equal: every distance ties, every cluster but one empties */
    for (int64_t i = 0; i < n; i++)
        memcpy(x + (size_t)i * d, x, (size_t)d * sizeof *x);
    for (int32_t j = 0; j < k; j++)
        for (int32_t t = 0; t < d; t++)
            init[(size_t)j * d + t] = x[t] + 1.0f + (float)(j % 3);
    assert_true(check_same(x, n, d, NULL, &p, init, NULL) > 0);
    free(x);
    free(init);
}

static void test_same_as_plain_weights_and_seedings(void **state)
{
    (void)state;
    const int64_t n = 4000;
    const int32_t d = 24;
    float *x = blobs(n, d, 30, 1.5f, 31), *w = malloc((size_t)n * sizeof *w);
    kvq_rng r;
    kvq_rng_seed(&r, 32);
    for (int64_t i = 0; i < n; i++)
        w[i] = (float)kvq_rng_uniform(&r) * (i % 17 == 0 ? 0.0f : 2.0f);
    const kvq_kmeans_init inits[] = {KVQ_KMEANS_INIT_PP, KVQ_KMEANS_INIT_RANDOM,
                                     KVQ_KMEANS_INIT_GREEDY_PP};
    for (int v = 0; v < 3; v++) {
        kvq_kmeans_params p = params(64 + 7 * v, 9, 1 + v % 2);
        p.init = inits[v];
        p.seed = 40 + (uint64_t)v;
        check_same(x, n, d, v == 1 ? NULL : w, &p, NULL, NULL);
    }
    /* tol stops early: the same iteration in both */
    kvq_kmeans_params p = params(50, 25, 2);
    p.tol = 1e-3;
    check_same(x, n, d, NULL, &p, NULL, NULL);
    free(x);
    free(w);
}

/* The same fit with 1 and 2 threads and any group count: the same bits. */
static void test_threads_and_groups(void **state)
{
    (void)state;
    const int64_t n = 5000;
    const int32_t d = 33, k = 80;
    float *x = blobs(n, d, 40, 0.9f, 51);
    float *c[4];
    const int32_t groups[4] = {0, 1, 2, 80};
    for (int v = 0; v < 4; v++) {
        kvq_kmeans_params p = params(k, 8, 1 + v % 2);
        kvq_err err = {0};
        kvq_km_fit_opts o = {.engine = KVQ_KM_ENGINE_BOUNDS, .groups = groups[v]};
        c[v] = malloc((size_t)k * d * sizeof *c[v]);
        assert_int_equal(kvq_km_fit_ex(x, n, d, NULL, &p, &o, c[v], NULL, NULL, &err), KVQ_OK);
        if (v > 0)
            assert_memory_equal(c[0], c[v], (size_t)k * d * sizeof *c[0]);
    }
    for (int v = 0; v < 4; v++)
        free(c[v]);
    free(x);
}

/* ---- against numpy ------------------------------------------------------------------------ */

static void test_matches_numpy_lloyd(void **state)
{
    (void)state;
    FILE *f = fopen(REF_FILE, "rb");
    assert_non_null(f);
    int32_t h[4];
    assert_int_equal(fread(h, sizeof h[0], 4, f), 4);
    const int64_t n = h[0];
    const int32_t d = h[1], k = h[2], iters = h[3];
    assert_true(n > 0 && d > KVQ_KM_DIRECT_MAX_D && k > 0 && iters > 0 && iters <= MAX_IT);
    float *x = malloc((size_t)n * d * sizeof *x), *init = malloc((size_t)k * d * sizeof *init);
    int32_t *ref = malloc((size_t)iters * n * sizeof *ref);
    double *inertia = malloc((size_t)iters * sizeof *inertia);
    assert_int_equal(fread(x, sizeof *x, (size_t)n * d, f), (size_t)n * d);
    assert_int_equal(fread(init, sizeof *init, (size_t)k * d, f), (size_t)k * d);
    assert_int_equal(fread(ref, sizeof *ref, (size_t)iters * n, f), (size_t)iters * n);
    assert_int_equal(fread(inertia, sizeof *inertia, (size_t)iters, f), (size_t)iters);
    fclose(f);
    for (int32_t threads = 1; threads <= 2; threads++) {
        kvq_kmeans_params p = params(k, iters, threads);
        p.init = KVQ_KMEANS_INIT_GIVEN;
        float *cent = malloc((size_t)k * d * sizeof *cent);
        memcpy(cent, init, (size_t)k * d * sizeof *cent);
        trace t = {0};
        kvq_kmeans_stats s;
        fit(x, n, d, NULL, &p, KVQ_KM_ENGINE_BOUNDS, cent, &t, NULL, &s);
        assert_int_equal(t.iters, iters);
        for (int32_t it = 0; it < iters; it++) {
            assert_memory_equal(t.a[it], ref + (size_t)it * n, (size_t)n * sizeof *ref);
            assert_true(fabs(s.inertia[it] - inertia[it]) <= 1e-5 * inertia[it]);
        }
        assert_int_equal(s.n_empty_repairs, 0);
        kvq_kmeans_stats_free(&s);
        trace_free(&t);
        free(cent);
    }
    free(x);
    free(init);
    free(ref);
    free(inertia);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_match_ref),
        cmocka_unit_test(test_same_as_plain_blobs),
        cmocka_unit_test(test_same_as_plain_ties_duplicates_empty),
        cmocka_unit_test(test_same_as_plain_weights_and_seedings),
        cmocka_unit_test(test_threads_and_groups),
        cmocka_unit_test(test_matches_numpy_lloyd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
