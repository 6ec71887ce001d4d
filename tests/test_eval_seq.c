/* test_eval_seq.c — captured rows through the harness (eval/seq.c, kvq/eval.h):
 * kvq_eval_seq_probe's per-row figures summed over every continuation row equal those
 * of a context per setting attending the same rows by retrieval (kvq_eval_seq_attend),
 * the counts exactly and the sums to rounding, and differ for another setting (the
 * comparison can fail); kvq_eval_sample_interval against numpy. */
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
#include "kvq/eval.h"
#include "kvq/util.h"

enum { NL = 2, NH = 4, NKV = 2, D = 16, N = 320, P = 160, NS = 3 };

static float *randn(size_t n, uint64_t seed)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; x && i < n; i++)
        x[i] = (float)kvq_rng_normal(&r);
    return x;
}

static kvq_retrieval_params oracle_params(kvq_budget b)
{
    kvq_retrieval_params p = kvq_retrieval_params_default();
    p.selector = KVQ_SELECT_ORACLE;
    p.budget = b;
    p.measure = 1;
    p.prefill_full = 0;
    p.threads = 1;
    return p;
}

static void near(double want, double got, const char *what, int c)
{
    if (!(fabs(want - got) <= 1e-12 * fabs(want) + 1e-300))
        fail_msg("setting %d: %s %.17g (attend) != %.17g (probe)", c, what, want, got);
}

static void test_probe_equals_attend(void **state)
{
    (void)state;
    const kvq_model_config c = test_synthetic_config(NL, NH, NKV, D);
    float *q = randn((size_t)N * NH * D, 11), *k = randn((size_t)N * NKV * D, 12);
    float *v = randn((size_t)N * NKV * D, 13), *o = malloc(sizeof(float) * N * NH * D);
    int64_t pos[N], mrow[N - P];
    for (int64_t i = 0; i < N; i++)
        pos[i] = i;
    for (int64_t i = P; i < N; i++)
        mrow[i - P] = i;
    for (int64_t i = 0; i < (int64_t)N * NH * D; i++)
        q[i] *= 2.0f; /* peaked attention: the budgets differ */
    const kvq_retrieval_setting set[NS] = {{KVQ_SELECT_ORACLE, {.fraction = 0.05}, 0.9},
                                           {KVQ_SELECT_ORACLE, {.fraction = 0.2}, 0.9},
                                           {KVQ_SELECT_ORACLE, {.count = 8}, 0.9}};
    kvq_retrieval_stats *z = calloc((size_t)(N - P) * NS, sizeof *z);
    kvq_retrieval_stats want[NL][NS], got[NL][NS];
    memset(got, 0, sizeof got);
    kvq_err e = {0};
    for (int32_t l = 0; l < NL; l++) {
        const kvq_eval_seq S = {.layer = l, .n = N, .P = P, .q = q, .k = k, .v = v, .pos = pos,
                                .mrow = mrow, .nm = N - P, .nh = NH, .nkv = NKV, .d = D};
        /* the reference path: a context per setting, every continuation row by retrieval */
        for (int cs = 0; cs < NS; cs++) {
            const kvq_retrieval_params p = oracle_params(set[cs].budget);
            kvq_retrieval *r = NULL;
            assert_int_equal(kvq_retrieval_create(&c, NULL, &p, &r, &e), KVQ_OK);
            if (kvq_eval_seq_attend(r, &S, o, &want[l][cs], &e))
                fail_msg("%s", e.msg);
            kvq_retrieval_free(r);
        }
        /* the sampled path with every row sampled: one context, every setting per row */
        const kvq_retrieval_params p = oracle_params(set[0].budget);
        kvq_retrieval *r = NULL;
        assert_int_equal(kvq_retrieval_create(&c, NULL, &p, &r, &e), KVQ_OK);
        if (kvq_eval_seq_probe(r, &S, set, NS, z, &e))
            fail_msg("%s", e.msg);
        kvq_retrieval_free(r);
        for (int64_t i = 0; i < N - P; i++)
            for (int cs = 0; cs < NS; cs++)
                kvq_retrieval_stats_add(&got[l][cs], &z[i * NS + cs]);
    }
    int other_differs = 0;
    for (int32_t l = 0; l < NL; l++)
        for (int cs = 0; cs < NS; cs++) {
            const kvq_retrieval_stats *w = &want[l][cs], *g = &got[l][cs];
            /* every continuation row of both KV heads has candidates (N > sink + window) */
            assert_int_equal(w->steps, (uint64_t)(N - P) * NKV);
            assert_int_equal(g->steps, w->steps);
            assert_int_equal(g->measured, w->measured);
            near(w->visible, g->visible, "visible", cs);
            near(w->attended, g->attended, "attended", cs);
            near(w->bytes_read, g->bytes_read, "bytes_read", cs);
            near(w->bytes_full, g->bytes_full, "bytes_full", cs);
            near(w->recall_mass, g->recall_mass, "recall_mass", cs);
            near(w->out_rel_err, g->out_rel_err, "out_rel_err", cs);
            assert_true(g->recall_topk == 0.0); /* the probe measures no oracle recall */
            const kvq_retrieval_stats *x = &got[l][(cs + 1) % NS]; /* another setting */
            other_differs += x->attended != w->attended && x->recall_mass != w->recall_mass;
        }
    assert_int_equal(other_differs, NL * NS);
    /* the figures the profile reads are in range: mass in (0, 1], the error finite, >= 0 */
    const double mass = kvq_eval_metric_value(&got[0][1], KVQ_EVAL_RECALL_MASS);
    const double err = kvq_eval_metric_value(&got[0][1], KVQ_EVAL_OUT_REL_ERR);
    if (!(mass > 0.0 && mass <= 1.0 + 1e-9 && err >= 0.0 && isfinite(err)))
        fail_msg("mass %g err %g", mass, err);
    free(z);
    free(q);
    free(k);
    free(v);
    free(o);
}

/* mean and standard error against numpy:
 *   x = np.array([0.1, 0.4, 0.35, 0.8]); x.mean(), x.std(ddof=1) / np.sqrt(4)
 *   -> 0.4125, 0.14487782208928093 */
static void test_sample_interval(void **state)
{
    (void)state;
    const double x[4] = {0.1, 0.4, 0.35, 0.8};
    double sum = 0, sq = 0, mean, se;
    for (int i = 0; i < 4; i++) {
        sum += x[i];
        sq += x[i] * x[i];
    }
    kvq_eval_sample_interval(sum, sq, 4, &mean, &se);
    assert_true(fabs(mean - 0.4125) < 1e-15);
    assert_true(fabs(se - 0.14487782208928093) < 1e-12);
    kvq_eval_sample_interval(0.3, 0.09, 1, &mean, &se); /* one unit: no spread */
    assert_true(mean == 0.3 && se == 0.0);
    kvq_eval_sample_interval(0, 0, 0, &mean, &se); /* none */
    assert_true(isnan(mean) && isnan(se));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_probe_equals_attend),
                                       cmocka_unit_test(test_sample_interval)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
