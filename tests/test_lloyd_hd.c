/* test_lloyd_hd.c — the per-element logic of the device-resident batched k-means
 * (kmeans/cuda/lloyd_hd.h, KVQ_HD functions that the CUDA kernels of
 * kmeans/cuda/lloyd_batched.cu call), run on the CPU in every build. Each function is
 * checked against a computation written here independently (long double sums, a
 * sequential cumulative search, the repair worked by hand), not against kvq's own output.
 * tests/cuda/test_cuda_paths.c then checks the kernels against the CPU references
 * kvq_lb_seed_head_ref and kvq_lb_repair_head_ref on a GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kmeans/cuda/lloyd_hd.h"
#include "kvq/util.h"

static float *randn(size_t n, uint64_t seed, float scale)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * kvq_rng_normal(&r));
    return x;
}

/* The fused chain is within a few float roundings of the exact distance, and exact where
 * every term is (small integers). */
static void test_l2sq(void **state)
{
    (void)state;
    const int32_t d = 131;
    float *a = randn(d, 1, 1.0f), *b = randn(d, 2, 1.0f);
    long double ex = 0;
    for (int32_t j = 0; j < d; j++)
        ex += ((long double)a[j] - b[j]) * ((long double)a[j] - b[j]);
    const float v = kvq_lb_l2sq(a, b, d);
    assert_true(fabsl((long double)v - ex) <= 1e-5L * ex);
    for (int32_t j = 0; j < d; j++) {
        a[j] = (float)(j % 7);
        b[j] = (float)(j % 3);
    }
    int64_t exi = 0;
    for (int32_t j = 0; j < d; j++)
        exi += (int64_t)((j % 7) - (j % 3)) * ((j % 7) - (j % 3));
    assert_true(kvq_lb_l2sq(a, b, d) == (float)exi);
    assert_true(kvq_lb_l2sq(a, a, d) == 0.0f);
    free(a);
    free(b);
}

/* Chunk sums, then chunks in order: the total of a long double sequential sum within
 * 1e-13, weighted and not, for n on and off a chunk boundary. */
static void test_chunked_total(void **state)
{
    (void)state;
    static const int64_t ns[] = {1, 255, 256, 257, 5000, 81920};
    for (size_t q = 0; q < sizeof ns / sizeof ns[0]; q++) {
        const int64_t n = ns[q];
        float *v = randn((size_t)n, 10 + q, 3.0f), *w = randn((size_t)n, 20 + q, 1.0f);
        for (int64_t i = 0; i < n; i++) {
            v[i] = v[i] * v[i];
            w[i] = fabsf(w[i]);
        }
        for (int weighted = 0; weighted < 2; weighted++) {
            const float *wp = weighted ? w : NULL;
            const int64_t nch = kvq_lb_nchunks(n);
            assert_int_equal(nch, (n + 255) / 256);
            double *cs = malloc((size_t)nch * sizeof *cs);
            for (int64_t c = 0; c < nch; c++)
                cs[c] = kvq_lb_chunk_sum(v, wp, c * KVQ_LB_CHUNK,
                                         (c + 1) * KVQ_LB_CHUNK < n ? (c + 1) * KVQ_LB_CHUNK : n);
            long double ex = 0;
            for (int64_t i = 0; i < n; i++)
                ex += (weighted ? (long double)w[i] : 1.0L) * v[i];
            assert_true(fabsl((long double)kvq_lb_total(cs, nch) - ex) <= 1e-13L * ex);
            free(cs);
        }
        free(v);
        free(w);
    }
}

/* The stopping rule, case by case (kmeans.c's: zero inertia, or a relative change below
 * tol after the first iteration). */
static void test_converged(void **state)
{
    (void)state;
    assert_true(kvq_lb_converged(0, 0.0, 0.0, 1e-4));
    assert_false(kvq_lb_converged(0, 0.0, 5.0, 1e-4));
    assert_false(kvq_lb_converged(0, 5.0, 5.0, 1e-4)); /* the first iteration never stops */
    assert_true(kvq_lb_converged(3, 100.0, 99.995, 1e-4));
    assert_false(kvq_lb_converged(3, 100.0, 99.98, 1e-4));
    assert_true(kvq_lb_converged(3, 100.0, 100.005, 1e-4)); /* a rise counts by its size */
    assert_false(kvq_lb_converged(3, 100.0, 99.995, 0.0));
}

/* The strided subsample: m distinct points in increasing order, the first 0, every point
 * when m = n. */
static void test_sub_index(void **state)
{
    (void)state;
    static const int64_t mn[][2] = {{1, 1}, {1, 10}, {7, 10}, {16384, 81920}, {4096, 4097},
                                    {100, 100}};
    for (size_t q = 0; q < sizeof mn / sizeof mn[0]; q++) {
        const int64_t m = mn[q][0], n = mn[q][1];
        int64_t prev = -1;
        for (int64_t i = 0; i < m; i++) {
            const int64_t s = kvq_lb_sub_index(i, m, n);
            assert_true(s > prev && s < n);
            if (m == n)
                assert_int_equal(s, i);
            prev = s;
        }
        assert_int_equal(kvq_lb_sub_index(0, m, n), 0);
    }
}

/* D^2 sampling: against a sequential search of the long double cumulative sum (the first
 * i with S(i) > u * S(n)); where the target lies within 1e-12 of a boundary, the
 * neighbour is accepted. Zero-potential points are never picked; a zero total picks
 * floor(u m). */
static void test_pick(void **state)
{
    (void)state;
    const int64_t m = 3000;
    float *p = randn((size_t)m, 5, 1.0f);
    for (int64_t i = 0; i < m; i++)
        p[i] = (i % 5 == 0) ? 0.0f : p[i] * p[i]; /* every fifth point on a seed */
    const int64_t nch = kvq_lb_nchunks(m);
    double *cs = malloc((size_t)nch * sizeof *cs);
    for (int64_t c = 0; c < nch; c++)
        cs[c] = kvq_lb_chunk_sum(p, NULL, c * 256, (c + 1) * 256 < m ? (c + 1) * 256 : m);
    long double *cum = malloc((size_t)m * sizeof *cum), run = 0;
    for (int64_t i = 0; i < m; i++)
        cum[i] = (run += p[i]);
    int hit_last_chunk = 0;
    for (int64_t s = 0; s < 2000; s++) {
        const double u = kvq_lb_seed_u(99, 3, s);
        assert_true(u >= 0.0 && u < 1.0);
        const int64_t i = kvq_lb_pick(p, NULL, m, cs, u);
        assert_true(i >= 0 && i < m);
        assert_true(p[i] > 0.0f);
        const long double target = (long double)u * cum[m - 1];
        int64_t e = 0;
        while (e < m - 1 && !(cum[e] > target))
            e++;
        if (i != e) {
            const long double edge = cum[i < e ? i : e];
            assert_true(fabsl(edge - target) <= 1e-12L * cum[m - 1]);
        }
        hit_last_chunk |= i >= (nch - 1) * 256;
    }
    assert_true(hit_last_chunk);
    /* u = 0 takes the first positive point; a zero total falls back to floor(u m) */
    assert_int_equal(kvq_lb_pick(p, NULL, m, cs, 0.0), 1);
    memset(p, 0, (size_t)m * sizeof *p);
    memset(cs, 0, (size_t)nch * sizeof *cs);
    assert_int_equal(kvq_lb_pick(p, NULL, m, cs, 0.5), m / 2);
    assert_int_equal(kvq_lb_first(0.9999999999, m), m - 1);
    free(p);
    free(cs);
    free(cum);
}

/* The seeding reference on planted blobs far apart: one seed per blob (D^2 sampling puts
 * the next seed in an uncovered blob with probability about 1 - 1e-6 here); the same
 * seed gives the same picks, another seed other picks. */
static void test_seed_ref(void **state)
{
    (void)state;
    const int32_t nc = 24, d = 16;
    const int64_t per = 40, m = nc * per;
    float *c = randn((size_t)nc * d, 7, 30.0f), *x = randn((size_t)m * d, 8, 0.1f);
    for (int64_t i = 0; i < m; i++)
        for (int32_t t = 0; t < d; t++)
            x[i * d + t] += c[(i / per) * d + t];
    int64_t idx[24], idx2[24];
    float *cent = malloc(sizeof(float) * nc * d), *dmin = malloc(sizeof(float) * m);
    double cs[8];
    assert_true(kvq_lb_nchunks(m) <= 8);
    kvq_lb_seed_head_ref(x, m, d, nc, 1234, 0, idx, cent, dmin, cs);
    int seen[24] = {0};
    for (int32_t s = 0; s < nc; s++) {
        assert_true(idx[s] >= 0 && idx[s] < m);
        assert_int_equal(seen[idx[s] / per], 0);
        seen[idx[s] / per] = 1;
        assert_memory_equal(cent + (size_t)s * d, x + idx[s] * d, sizeof(float) * d);
    }
    kvq_lb_seed_head_ref(x, m, d, nc, 1234, 0, idx2, cent, dmin, cs);
    assert_memory_equal(idx, idx2, sizeof idx);
    kvq_lb_seed_head_ref(x, m, d, nc, 1234, 1, idx2, cent, dmin, cs); /* another head */
    assert_true(memcmp(idx, idx2, sizeof idx) != 0);
    free(c);
    free(x);
    free(cent);
    free(dmin);
}

/* The repair worked by hand: k 6, d 3; clusters 1 and 4 empty; weights 5, 0, 9, 9, 0, 3.
 * Cluster 1 splits the first heaviest, 2 (weights 4.5 / 4.5); then cluster 4 splits the
 * heaviest left, 3. Each split moves the pair apart by eps (|c| + sigma),
 * sigma = sqrt(cin / wsum / d), with opposite signs. */
static void test_repair_by_hand(void **state)
{
    (void)state;
    const int32_t k = 6, d = 3;
    float cent[18] = {1, 1, 1, 9, 9, 9, -2, 0.5f, 4, 3, -3, 0, 9, 9, 9, 7, 7, 7};
    const float c0[18] = {1, 1, 1, 9, 9, 9, -2, 0.5f, 4, 3, -3, 0, 9, 9, 9, 7, 7, 7};
    double wsum[6] = {5, 0, 9, 9, 0, 3}, cin[6] = {2, 0, 27, 54, 0, 1};
    assert_int_equal(kvq_lb_repair_head_ref(cent, k, d, wsum, cin, 77, 2, 5), 2);
    const double wexp[6] = {5, 4.5, 4.5, 4.5, 4.5, 3}, cexp[6] = {2, 13.5, 13.5, 27, 27, 1};
    for (int32_t c = 0; c < k; c++) {
        assert_true(wsum[c] == wexp[c]);
        assert_true(cin[c] == cexp[c]);
    }
    const int32_t pairs[2][2] = {{1, 2}, {4, 3}}; /* (empty, heavy) */
    const double sig[2] = {sqrt(27.0 / 9.0 / 3.0), sqrt(54.0 / 9.0 / 3.0)};
    int plus = 0;
    for (int q = 0; q < 2; q++) {
        const int32_t e = pairs[q][0], j = pairs[q][1];
        for (int32_t t = 0; t < d; t++) {
            const double base = c0[j * d + t];
            const double delta = (1.0 / 1024.0) * (fabs(base) + sig[q]);
            const double de = (double)cent[e * d + t] - base, dj = (double)cent[j * d + t] - base;
            assert_true(fabs(fabs(de) - delta) <= 1e-6 * (fabs(base) + 1));
            assert_true(fabs(de + dj) <= 1e-6 * (fabs(base) + 1)); /* opposite ways */
            plus += de > 0;
        }
    }
    assert_true(plus > 0 && plus < 6); /* signs of both kinds */
    /* the untouched clusters */
    assert_memory_equal(cent, c0, sizeof(float) * 3);
    assert_memory_equal(cent + 15, c0 + 15, sizeof(float) * 3);
    /* nothing empty: nothing changes */
    assert_int_equal(kvq_lb_repair_head_ref(cent, k, d, wsum, cin, 77, 2, 6), 0);
}

/* The split's signs: +-1, balanced over many coordinates, and a function of every input. */
static void test_repair_sign(void **state)
{
    (void)state;
    int pos = 0;
    for (int32_t t = 0; t < 10000; t++) {
        const double s = kvq_lb_repair_sign(5, 1, 3, 7, t);
        assert_true(s == 1.0 || s == -1.0);
        pos += s > 0;
    }
    assert_true(pos > 4700 && pos < 5300);
    int differ[4] = {0};
    for (int32_t t = 0; t < 64; t++) {
        const double s = kvq_lb_repair_sign(5, 1, 3, 7, t);
        differ[0] += s != kvq_lb_repair_sign(6, 1, 3, 7, t);
        differ[1] += s != kvq_lb_repair_sign(5, 2, 3, 7, t);
        differ[2] += s != kvq_lb_repair_sign(5, 1, 4, 7, t);
        differ[3] += s != kvq_lb_repair_sign(5, 1, 3, 8, t);
    }
    for (int q = 0; q < 4; q++)
        assert_true(differ[q] > 10);
    assert_true(kvq_lb_heavier(2.0, 5, 1.0, 0));
    assert_true(kvq_lb_heavier(2.0, 1, 2.0, 3));
    assert_false(kvq_lb_heavier(2.0, 3, 2.0, 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_l2sq),           cmocka_unit_test(test_chunked_total),
        cmocka_unit_test(test_converged),      cmocka_unit_test(test_sub_index),
        cmocka_unit_test(test_pick),           cmocka_unit_test(test_seed_ref),
        cmocka_unit_test(test_repair_by_hand), cmocka_unit_test(test_repair_sign),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
