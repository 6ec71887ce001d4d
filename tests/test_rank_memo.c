/* test_rank_memo.c — the rerank's top k of kvq_retrieval_probe's steps (runtime/
 * rank_memo.c): the rows ranked once per (row, head), each step's top k taken as its
 * candidates of least rank. Checked against kvq_rk_topk on the scores the rerank
 * computes (rerank.c: the summed query's logit, or the heads' logits summed in head
 * order, or their maximum; here recomputed by the test from the logits), for random
 * ascending candidate sets and every k, with ties, signed zeros and scores sharing their
 * high bytes (the sort's skipped passes); and the order itself against qsort. */
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
#include "runtime/kernels/kernels.h"
#include "runtime/select/mass.h"
#include "runtime/kernels/rk.h"

static const float *cmp_sc;
static int cmp_desc(const void *a, const void *b) /* by value (-0 == +0), then index */
{
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const float x = cmp_sc[i], y = cmp_sc[j];
    if (x != y)
        return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}

/* Logits [nq, nv]: mode 0 spread, 1 whole numbers (ties), 2 signed zeros and ones, 3
 * values within one binade (the sort's high bytes all equal). */
static void fill(float *x, int64_t n, kvq_rng *r, int mode)
{
    for (int64_t j = 0; j < n; j++) {
        const double g = kvq_rng_normal(r);
        x[j] = mode == 0   ? (float)(3.0 * g)
               : mode == 1 ? roundf((float)(2.0 * g))
               : mode == 2 ? (float)(j % 3 == 0 ? 0.0 : j % 3 == 1 ? -0.0 : 1.0)
                           : (float)(1.0 + 0.001 * fabs(g));
    }
}

static void test_score_order(void **state)
{
    (void)state;
    kvq_rng r;
    kvq_rng_seed(&r, 5);
    for (int mode = 0; mode < 4; mode++)
        for (int64_t n = 1; n <= 700; n += 1 + n / 2) {
            float *sc = malloc(sizeof *sc * (size_t)n);
            int32_t *a = malloc(sizeof *a * (size_t)n), *want = malloc(sizeof *want * (size_t)n);
            uint64_t *v = malloc(sizeof *v * 2 * (size_t)n);
            fill(sc, n, &r, mode);
            for (int64_t j = 0; j < n; j++)
                want[j] = (int32_t)j;
            cmp_sc = sc;
            qsort(want, (size_t)n, sizeof *want, cmp_desc);
            kvq_rt_score_order(sc, n, v, a);
            if (memcmp(a, want, sizeof *a * (size_t)n))
                fail_msg("mode %d n %lld: order differs", mode, (long long)n);
            free(sc);
            free(a);
            free(want);
            free(v);
        }
}

static void test_rank_memo_topk(void **state)
{
    (void)state;
    kvq_rng r;
    kvq_rng_seed(&r, 17);
    rt_rank_memo *R = kvq_rt_rank_memo_new();
    const int32_t gs = 3;
    int checked = 0;
    for (int rep = 0; rep < 24; rep++) {
        const int mode = rep % 4, kind = (rep / 4) % 3; /* 0: summed row, 1: sum, 2: max */
        const int64_t nv = 1 + (int64_t)kvq_rng_below(&r, rep < 12 ? 90 : 900);
        const int64_t lo = (int64_t)kvq_rng_below(&r, 50);
        const int32_t nq = kind == 0 ? gs + 1 : gs;
        float *lgb = malloc(sizeof *lgb * (size_t)nq * (size_t)nv);
        fill(lgb, nq * nv, &r, mode);
        assert_int_equal(kvq_rt_rank_memo_build(R, lgb, nv, nq, gs, kind == 2), 1);
        int32_t *rows = malloc(sizeof *rows * (size_t)nv), *want = malloc(sizeof *want * (size_t)nv),
                *got = malloc(sizeof *got * (size_t)nv);
        float *sc = malloc(sizeof *sc * (size_t)nv);
        uint32_t *work = malloc(sizeof *work * 2 * (size_t)nv);
        for (int sub = 0; sub < 6; sub++) {
            int64_t n = 0; /* an ascending subset; the last one every row */
            for (int64_t j = 0; j < nv; j++)
                if (sub == 5 || kvq_rng_below(&r, 4) < (uint64_t)(1 + sub % 3))
                    rows[n++] = (int32_t)(lo + j);
            for (int64_t a = 0; a < n; a++) { /* the rerank's score of the candidate */
                const int64_t j = rows[a] - lo;
                if (kind == 0) {
                    sc[a] = lgb[(size_t)gs * nv + j];
                    continue;
                }
                float s = lgb[j];
                for (int32_t g = 1; g < gs; g++) {
                    const float l = lgb[(size_t)g * nv + j];
                    s = kind == 2 ? (l > s ? l : s) : s + l;
                }
                sc[a] = s;
            }
            for (int64_t k = 0; k <= n; k += 1 + k / 4) {
                const int64_t w = kvq_rk_topk(KVQ_ISA_SCALAR, sc, n, k, want, work);
                const int64_t g = kvq_rt_rank_memo_topk(R, lo, rows, n, k, got);
                assert_int_equal(g, w);
                if (memcmp(got, want, sizeof *got * (size_t)w))
                    fail_msg("rep %d subset %d: top %lld of %lld differs", rep, sub,
                             (long long)k, (long long)n);
                checked++;
            }
        }
        free(lgb);
        free(rows);
        free(want);
        free(got);
        free(sc);
        free(work);
    }
    assert_true(checked > 500);
    kvq_rt_rank_memo_free(R);
    kvq_rt_rank_memo_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_score_order),
        cmocka_unit_test(test_rank_memo_topk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
