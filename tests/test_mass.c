/* test_mass.c — the mass selector's count k* (runtime/select/mass_count.c): against a plain
 * reference (sort by logit, ties to the lower index, cumulative softmax mass), and the
 * memo that kvq_retrieval_probe's steps share across taus equal to the plain count on
 * every (row, tau), with its scores handed back only for the (row, head) that made them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/common.h"
#include "kvq/util.h"
#include "runtime/select/mass.h"
#include "runtime/kernels/rk.h"

static const float *cmp_lg;
static int cmp_desc(const void *a, const void *b)
{
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (cmp_lg[i] != cmp_lg[j])
        return cmp_lg[i] > cmp_lg[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

/* The reference: the smallest k whose k largest logits hold tau of the softmax mass,
 * summed in rank order. *clear: no prefix mass lies within 1e-9 of the target (the
 * radix sums group the terms otherwise, so only clear cases are compared). */
static int64_t ref_count(const float *lg, int64_t n, double tau, int *clear)
{
    int32_t *ord = malloc(sizeof *ord * (size_t)n);
    double mx = lg[0], Z = 0, c = 0;
    for (int64_t j = 0; j < n; j++) {
        ord[j] = (int32_t)j;
        mx = lg[j] > mx ? lg[j] : mx;
    }
    for (int64_t j = 0; j < n; j++)
        Z += exp(lg[j] - mx);
    cmp_lg = lg;
    qsort(ord, (size_t)n, sizeof *ord, cmp_desc);
    int64_t k = n;
    *clear = 1;
    for (int64_t j = 0; j < n; j++) {
        c += exp(lg[ord[j]] - mx);
        if (fabs(c - tau * Z) <= 1e-9 * Z)
            *clear = 0;
        if (c >= tau * Z && k == n)
            k = j + 1;
    }
    free(ord);
    return k;
}

static float *logits(int64_t n, uint64_t seed, int mode)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *x = malloc(sizeof *x * (size_t)n);
    for (int64_t j = 0; j < n; j++) {
        x[j] = (float)(3.0 * kvq_rng_normal(&r));
        if (mode == 1) /* ties: whole numbers */
            x[j] = roundf(x[j]);
        if (mode == 2) /* a few values */
            x[j] = (float)(j % 3);
    }
    return x;
}

static void test_mass_count_reference(void **state)
{
    (void)state;
    static const int64_t ns[] = {1, 2, 7, 300, 5000};
    static const double taus[] = {0.1, 0.5, 0.9, 0.99, 0.999};
    int compared = 0;
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (int mode = 0; mode < 3; mode++) {
            const int64_t n = ns[ni];
            float *lg = logits(n, 100 + ni * 3 + (uint64_t)mode, mode);
            uint32_t *keys = malloc(sizeof *keys * (size_t)n);
            double *w = malloc(sizeof *w * (size_t)n);
            for (size_t t = 0; t < sizeof taus / sizeof *taus; t++) {
                int clear;
                const int64_t want = ref_count(lg, n, taus[t], &clear);
                const int64_t got = kvq_rt_mass_count(lg, n, taus[t], keys, w);
                assert_true(got >= 1 && got <= n);
                if (clear) {
                    if (got != want)
                        fail_msg("n %lld mode %d tau %g: k* %lld, reference %lld", (long long)n,
                                 mode, taus[t], (long long)got, (long long)want);
                    compared++;
                }
            }
            free(lg);
            free(keys);
            free(w);
        }
    assert_true(compared >= 60); /* nearly every case is clear */
}

/* Rows of one head after another, several taus each: the memo's count equals the plain
 * one, its scores come back (with their codebook bytes) only after the row's first
 * count and never after kvq_rt_mass_memo_next. */
static void test_mass_count_memo(void **state)
{
    (void)state;
    static const double taus[] = {0.5, 0.6, 0.9, 0.99, 0.3};
    rt_mass_memo *m = kvq_rt_mass_memo_new();
    assert_non_null(m);
    const int64_t cap = 700;
    uint32_t *keys = malloc(sizeof *keys * cap), *keys2 = malloc(sizeof *keys2 * cap);
    double *w = malloc(sizeof *w * cap), *w2 = malloc(sizeof *w2 * cap);
    float *back = malloc(sizeof *back * cap);
    for (int row = 0; row < 12; row++) {
        const int64_t n = row == 3 || row == 4 ? 300 : 100 + 50 * row; /* rows 3, 4 alike */
        float *sc = logits(n, 900 + (uint64_t)row, row % 3), *lg = malloc(sizeof *lg * n);
        for (int64_t j = 0; j < n; j++)
            lg[j] = sc[j] * 0.125f;
        kvq_rt_mass_memo_next(m);
        double cb = 0;
        assert_int_equal(kvq_rt_mass_memo_scores(m, n, back, &cb), 0);
        for (size_t t = 0; t < sizeof taus / sizeof *taus; t++) {
            const int64_t want = kvq_rt_mass_count(lg, n, taus[t], keys2, w2);
            const int64_t got =
                kvq_rt_mass_count_memo(m, sc, 64.0 * (row + 1), lg, n, taus[t], keys, w);
            if (got != want)
                fail_msg("row %d tau %g: memo %lld, plain %lld", row, taus[t], (long long)got,
                         (long long)want);
            cb = 1.0;
            assert_int_equal(kvq_rt_mass_memo_scores(m, n, back, &cb), 1);
            assert_true(cb == 1.0 + 64.0 * (row + 1));
            assert_memory_equal(back, sc, sizeof *sc * (size_t)n);
            assert_int_equal(kvq_rt_mass_memo_scores(m, n + 1, back, &cb), 0);
        }
        free(sc);
        free(lg);
    }
    assert_int_equal(kvq_rt_mass_count_memo(NULL, back, 0, back, 1, 0.5, keys, w), 1);
    kvq_rt_mass_memo_free(m);
    kvq_rt_mass_memo_free(NULL);
    free(keys);
    free(keys2);
    free(w);
    free(w2);
    free(back);
}

/* Rows whose logits all share the first digit (values in [1, 1.25)): every tau of every
 * row walks the same first-digit bin, whose second-digit histogram the memo keeps across
 * the taus of a row; the count still equals the plain one on every (row, tau), so the
 * histogram is never one of another row's. */
static void test_mass_memo_one_bin(void **state)
{
    (void)state;
    rt_mass_memo *m = kvq_rt_mass_memo_new();
    const int64_t n = 200;
    uint32_t *keys = malloc(sizeof *keys * n), *keys2 = malloc(sizeof *keys2 * n);
    double *w = malloc(sizeof *w * n), *w2 = malloc(sizeof *w2 * n);
    float *sc = malloc(sizeof *sc * n);
    kvq_rng r;
    kvq_rng_seed(&r, 4242);
    for (int row = 0; row < 8; row++) {
        for (int64_t j = 0; j < n; j++)
            sc[j] = 1.0f + 0.2499f * (float)kvq_rng_uniform(&r);
        kvq_rt_mass_memo_next(m);
        for (int t = 1; t < 20; t++) {
            const double tau = 0.05 * t;
            const int64_t want = kvq_rt_mass_count(sc, n, tau, keys2, w2);
            const int64_t got = kvq_rt_mass_count_memo(m, sc, 0.0, sc, n, tau, keys, w);
            if (got != want)
                fail_msg("row %d tau %g: memo %lld, plain %lld", row, tau, (long long)got,
                         (long long)want);
        }
    }
    kvq_rt_mass_memo_free(m);
    free(keys);
    free(keys2);
    free(w);
    free(w2);
    free(sc);
}

/* The memo's top k (one order of the candidates, nested selections) equals kvq_rk_topk
 * for every k, with ties and signed zeros; the order is made from the scores put for
 * the current (row, head) only. */
static void test_mass_memo_topk(void **state)
{
    (void)state;
    rt_mass_memo *m = kvq_rt_mass_memo_new();
    const int64_t cap = 1200;
    int32_t *want = malloc(sizeof *want * cap), *got = malloc(sizeof *got * cap);
    uint32_t *work = malloc(sizeof *work * 2 * cap);
    for (int row = 0; row < 9; row++) {
        const int64_t n = row == 4 || row == 5 ? 400 : 30 + 130 * row; /* rows 4, 5 alike */
        float *sc = logits(n, 700 + (uint64_t)row, row % 3);
        if (row == 8)
            for (int64_t j = 0; j < n; j++)
                sc[j] = j % 2 ? 0.0f : -0.0f;
        kvq_rt_mass_memo_next(m);
        assert_int_equal(kvq_rt_mass_memo_topk(m, n, 1, got), -1);
        assert_int_equal(kvq_rt_mass_memo_put(m, sc, n, 0.0), 1);
        for (int64_t k = 0; k <= n + 1; k += 1 + k / 3) {
            const int64_t w = kvq_rk_topk(KVQ_ISA_SCALAR, sc, n, k, want, work);
            const int64_t g = kvq_rt_mass_memo_topk(m, n, k, got);
            assert_int_equal(g, w);
            if (memcmp(got, want, sizeof *got * (size_t)w))
                fail_msg("row %d: top %lld of %lld differs", row, (long long)k, (long long)n);
        }
        free(sc);
    }
    const float one = 1.0f;
    assert_int_equal(kvq_rt_mass_memo_put(NULL, &one, 1, 0.0), 0);
    assert_int_equal(kvq_rt_mass_memo_topk(NULL, 1, 1, got), -1);
    kvq_rt_mass_memo_free(m);
    free(want);
    free(got);
    free(work);
}

/* kvq_rt_rank_select, scalar and AVX-512: the indices ranked below k, ascending, and no
 * write past them (sel holds exactly that many; a guard after it stays). Every tail
 * length of the vector loop. */
static void test_rank_select(void **state)
{
    (void)state;
    kvq_rng r;
    kvq_rng_seed(&r, 91);
    for (int64_t n = 0; n <= 70; n++) {
        int32_t rank[70], want[70], sel[71];
        for (int64_t j = 0; j < n; j++) /* a permutation of 0 .. n-1 */
            rank[j] = (int32_t)j;
        for (int64_t j = n - 1; j > 0; j--) {
            const int64_t i = (int64_t)kvq_rng_below(&r, (uint64_t)j + 1);
            const int32_t t = rank[i];
            rank[i] = rank[j];
            rank[j] = t;
        }
        for (int32_t k = 0; k <= n; k += 1 + (int32_t)(n / 7)) {
            int64_t w = 0;
            for (int64_t j = 0; j < n; j++)
                if (rank[j] < k)
                    want[w++] = (int32_t)j;
            for (int path = 0; path < 2; path++) {
                if (path == 1 && !kvq_cpu_has_avx512())
                    continue;
                for (int i = 0; i < 71; i++)
                    sel[i] = -7;
                const int64_t g = path ? kvq_rt_rank_select_avx512(rank, n, k, sel)
                                       : kvq_rt_rank_select(rank, n, k, sel);
                assert_int_equal(g, w);
                if (memcmp(sel, want, sizeof *sel * (size_t)w) || (w < 71 && sel[w] != -7 &&
                                                                   path == 1))
                    fail_msg("n %lld k %d path %d differs", (long long)n, k, path);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mass_count_reference),
        cmocka_unit_test(test_mass_count_memo),
        cmocka_unit_test(test_mass_memo_one_bin),
        cmocka_unit_test(test_mass_memo_topk),
        cmocka_unit_test(test_rank_select),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
