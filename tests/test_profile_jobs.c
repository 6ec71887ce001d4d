/*
 * test_profile_jobs.c — the job sample of the LeanKV/PATS grid (thresholds/profile_jobs.c,
 * kvq_profile_params.sample_jobs): the draw, the stratified interval over jobs against a
 * hand computation, and on SmolLM2 (the demo model, every layer) that the profile with
 * the job sample chooses what the profile with every row of every job chooses, at
 * tolerances across the measured range, with the figures it keeps from the sample
 * within their interval of every job's; the budget/tau pass likewise (its jobs: the
 * sequences of a layer).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "helpers/profiletest.h"
#include "helpers/testutil.h"
#include "kvq/capture.h"
#include "kvq/capture_dir.h"
#include "kvq/model.h"
#include "kvq/thresholds.h"
#include "thresholds/thresholds_internal.h"

/* A capture_info of n_files layers, n_kv KV heads and the given sequence lengths. */
static kvq_capture_info shape(int32_t n_files, int32_t n_kv, const int64_t *lens, int64_t ns,
                              int64_t *seqs)
{
    kvq_capture_info ci;
    memset(&ci, 0, sizeof ci);
    ci.n_files = n_files;
    ci.model.n_kv_heads = n_kv;
    ci.n_sequences = ns;
    for (int64_t q = 0, at = 0; q < ns; at += lens[q], q++) {
        seqs[2 * q] = at;
        seqs[2 * q + 1] = lens[q];
    }
    ci.sequences = seqs;
    return ci;
}

/* The draw: as many jobs in every layer, eligible ones only (a sequence of 2 or more
 * tokens), the same for the same shape, not the same set in every layer; none when the
 * sample is too small or the fraction 1. */
static void test_plan(void **state)
{
    (void)state;
    const int64_t lens[4] = {512, 1, 512, 300};
    int64_t seqs[8];
    kvq_capture_info ci = shape(30, 3, lens, 4, seqs);
    thr_jobs a, b;
    kvq_err e = {0};
    assert_int_equal(thr_jobs_plan(&ci, 1.0 / 3.0, 3, 5, &a, &e), KVQ_OK);
    assert_int_equal(thr_jobs_plan(&ci, 1.0 / 3.0, 3, 5, &b, &e), KVQ_OK);
    assert_true(a.on);
    assert_int_equal(a.n_jobs, 12);
    assert_int_equal(a.n_elig, 9); /* sequence 1 (one token) has no job */
    assert_int_equal(a.n_in, 3);
    assert_memory_equal(a.in, b.in, 30 * 12);
    int differ = 0;
    for (int32_t f = 0; f < 30; f++) {
        int n = 0;
        for (int64_t jb = 0; jb < 12; jb++) {
            n += a.in[f * 12 + jb];
            if (jb / 3 == 1)
                assert_int_equal(a.in[f * 12 + jb], 0);
            assert_int_equal(thr_jobs_run(&a, f, jb, 1), a.in[f * 12 + jb]);
            assert_int_equal(thr_jobs_run(&a, f, jb, 0), !a.in[f * 12 + jb]);
            assert_int_equal(thr_jobs_run(&a, f, jb, -1), 1);
        }
        assert_int_equal(n, 3);
        differ |= memcmp(a.in + f * 12, a.in, 12) != 0;
    }
    assert_true(differ);
    thr_jobs_free(&a);
    thr_jobs_free(&b);
    /* too small: 3 layers x 3 sampled jobs (9 < 20); one job a layer; fraction 1 */
    ci.n_files = 3;
    assert_int_equal(thr_jobs_plan(&ci, 1.0 / 3.0, 3, 5, &a, &e), KVQ_OK);
    assert_false(a.on);
    assert_int_equal(thr_jobs_run(&a, 0, 0, 1), 1);
    assert_int_equal(thr_jobs_run(&a, 0, 0, 0), 0);
    ci.n_files = 30;
    assert_int_equal(thr_jobs_plan(&ci, 0.1, 3, 5, &a, &e), KVQ_OK);
    assert_false(a.on);
    assert_int_equal(thr_jobs_plan(&ci, 1.0, 3, 5, &a, &e), KVQ_OK);
    assert_false(a.on);
    thr_jobs_free(&a);
}

/* The stratified ratio and its standard error over jobs, computed by hand: two layers
 * of four jobs, two sampled in each; error sums y and counts x
 *   layer 0: (2, 10), (4, 10); layer 1: (1, 10), (5, 10)
 * R = 12 / 40 = 0.3; z = y - R x: -1, 1 | -2, 2; s^2 = 2 | 8;
 * se^2 = (4^2 * 2 / 2 + 4^2 * 8 / 2) / (4 / 2 * 40)^2 = 80 / 6400, se = 0.111803... */
static void test_interval_by_hand(void **state)
{
    (void)state;
    uint8_t in[8] = {1, 0, 1, 0, 0, 1, 0, 1};
    double y[8] = {2, 0, 4, 0, 0, 1, 0, 5}, x[8] = {10, 0, 10, 0, 0, 10, 0, 10};
    thr_jobs J = {.on = 1, .n_files = 2, .n_jobs = 4, .n_set = 1, .n_elig = 4, .n_in = 2,
                  .in = in, .y = y, .x = x};
    double m, se;
    thr_jobs_interval(&J, 0, &m, &se);
    assert_true(fabs(m - 0.3) < 1e-15);
    assert_true(fabs(se - sqrt(80.0) / 80.0) < 1e-15);
    /* equal job means: no spread, no error */
    double y2[8] = {3, 0, 3, 0, 0, 3, 0, 3};
    J.y = y2;
    thr_jobs_interval(&J, 0, &m, &se);
    assert_true(fabs(m - 0.3) < 1e-15 && se == 0);
}

/* The settings measured on the other jobs: those that may be within tolerance (by 4
 * standard errors over jobs), or when none may be, that may have the least error unless
 * one setting; a setting that saves no memory (PATS) never. */
static void test_marks(void **state)
{
    (void)state;
    /* three settings, two layers of four jobs, two sampled: setting c's jobs all at
     * error e_c except a spread of +-s_c within each layer */
    const double e[3] = {0.04, 0.06, 0.30}, sp[3] = {0.001, 0.001, 0.001};
    uint8_t in[8] = {1, 0, 1, 0, 0, 1, 0, 1};
    double y[24] = {0}, x[24] = {0};
    for (int jb = 0; jb < 8; jb++)
        for (int c = 0; c < 3; c++) {
            const double sgn = jb % 4 < 2 ? -1.0 : 1.0;
            y[jb * 3 + c] = 100 * (e[c] + sgn * sp[c]);
            x[jb * 3 + c] = 100;
        }
    thr_jobs J = {.on = 1, .n_files = 2, .n_jobs = 4, .n_set = 3, .n_elig = 4, .n_in = 2,
                  .in = in, .y = y, .x = x};
    thr_acc tot[3];
    memset(tot, 0, sizeof tot);
    for (int c = 0; c < 3; c++)
        tot[c].mem.bytes = 0.5, tot[c].mem.bytes_f16 = 1;
    uint8_t mark[3];
    thr_jobs_mark(&J, tot, 0, 3, 0.05, INFINITY, 0, mark);
    assert_true(mark[0] && !mark[1] && !mark[2]);
    thr_jobs_mark(&J, tot, 0, 3, 0.059, INFINITY, 0, mark); /* 0.06 within 4 se of it */
    assert_true(mark[0] && mark[1] && !mark[2]);
    /* none may be within: the least error alone settles it */
    thr_jobs_mark(&J, tot, 0, 3, 0.01, INFINITY, 0, mark);
    assert_true(!mark[0] && !mark[1] && !mark[2]);
    /* never chosen: the first saves no memory, so the second is the best alone */
    tot[0].mem.bytes = 1;
    thr_jobs_mark(&J, tot, 0, 3, 0.05, THR_PATS_MAX_MEMORY, 0, mark);
    assert_true(!mark[0] && !mark[1] && !mark[2]);
}

/* SmolLM2 over docs/design.md, every layer (made once): 4 sequences x 3 KV heads x 30
 * layers, 360 jobs. */
static const char *capture_smollm2(const char *model)
{
    static const char *dir;
    if (!dir)
        dir = pt_capture(model, "capjobs", 256, 1024, NULL, 0);
    return dir;
}

/* select_row's rule on every row's figures (kvq/thresholds.h): the least memory (then
 * bits, then error) within tolerance, else the least error; PATS rows saving nothing
 * are never chosen. */
static int64_t expected_choice(const kvq_profile_table *a, int pats, double tol, int *met)
{
    const int ec = pats ? KVQ_PP_ERR : KVQ_PL_ERR, mc = pats ? KVQ_PP_MEMORY : KVQ_PL_MEMORY;
    const int bc = pats ? KVQ_PP_BITS : -1;
    int64_t best = -1;
    *met = 0;
    for (int64_t row = 0; row < a->n_rows; row++) {
        const double *r = a->rows + row * a->n_cols;
        if (pats && !(r[mc] < 1.0))
            continue;
        const int in = r[ec] <= tol;
        if (best < 0 || (in && !*met)) {
            best = row, *met = in;
            continue;
        }
        if (!in && *met)
            continue;
        const double *o = a->rows + best * a->n_cols;
        const int better = *met ? (r[mc] != o[mc]                ? r[mc] < o[mc]
                                   : bc >= 0 && r[bc] != o[bc]   ? r[bc] < o[bc]
                                                                 : r[ec] < o[ec])
                                : (r[ec] != o[ec] ? r[ec] < o[ec] : r[mc] < o[mc]);
        if (better)
            best = row;
    }
    return best;
}

/* The demo model, every layer: the job sample's choice equals every row's at
 * tolerances across the measured errors; the rows left on the sample are within 4
 * standard errors (over jobs) of every row's figure. */
static void test_smollm2_job_sample_choice(void **state)
{
    (void)state;
    const char *model = pt_smollm2_path();
    if (!model)
        TEST_SKIP("SmolLM2 not found (KVQ_SMOLLM2)");
    const char *cap = capture_smollm2(model);
    kvq_profile_params p = kvq_profile_params_default();
    p.knobs = KVQ_KNOB_LEANKV | KVQ_KNOB_PATS;
    p.threads = 2;
    p.leankv.window = 32;
    p.sample_rows = 0;
    kvq_profile_result *all = pt_profile(cap, &p);
    assert_int_equal(all->n_jobs, 360);
    assert_int_equal(all->n_jobs_sampled, 360);
    double errs[256];
    int ne = 0;
    for (int t = 0; t < 2; t++)
        for (int64_t i = 0; i < all->table[t].n_rows; i++)
            errs[ne++] = all->table[t].rows[i * all->table[t].n_cols + (t ? KVQ_PP_ERR : KVQ_PL_ERR)];
    qsort(errs, (size_t)ne, sizeof *errs, pt_cmp_double);
    int64_t n_kept = 0, n_other = 0;
    for (int k = 0; k <= 6; k++) {
        int at = (ne - 1) * k / 6; /* midway between errors at least 1e-3 apart */
        while (at + 1 < ne && errs[at + 1] - errs[at] < 1e-3 * errs[at + 1])
            at++;
        const double tol = at + 1 < ne ? 0.5 * (errs[at] + errs[at + 1]) : errs[ne - 1] * 1.01;
        kvq_profile_params q = p;
        q.sample_rows = 32;
        q.tolerance = tol;
        kvq_profile_result *b = pt_profile(cap, &q); /* the default job sample, 1/3 */
        assert_int_equal(b->n_jobs, 360);
        assert_int_equal(b->n_jobs_sampled, 120);
        for (int t = 0; t < 2; t++) {
            const kvq_profile_table *x = &all->table[t], *y = &b->table[t];
            const int ec = t ? KVQ_PP_ERR : KVQ_PL_ERR;
            int met;
            const int64_t want = expected_choice(x, t, tol, &met);
            if (want != y->chosen)
                fail_msg("tolerance %g: %s chosen row %lld (every row, every job) vs %lld (job "
                         "sample)", tol, x->name, (long long)want, (long long)y->chosen);
            assert_int_equal(met, y->met);
            for (int64_t i = 0; i < x->n_rows; i++) {
                const double ex = x->rows[i * x->n_cols + ec], ey = y->rows[i * y->n_cols + ec];
                if (!y->job_sampled[i]) {
                    n_other++;
                    continue;
                }
                n_kept++;
                if (!(fabs(ex - ey) <= 4.0 / 1.96 * y->err_ci[i]))
                    fail_msg("tolerance %g: %s row %lld kept from the job sample: err %.6g "
                             "(every job) vs %.6g +- %.2g", tol, x->name, (long long)i, ex, ey,
                             y->err_ci[i]);
            }
        }
        kvq_profile_result_free(b);
    }
    /* both kinds of rows occurred */
    assert_true(n_kept > 0 && n_other > 0);
    print_message("%s: job sample: %lld rows kept from it, %lld measured on every job\n", cap,
                  (long long)n_kept, (long long)n_other);
    kvq_profile_result_free(all);
}


/* The budget/tau pass with the job sample (2 of each layer's 4 sequences): the choice
 * every row of every sequence makes, at tolerances between the errors, below all and
 * above all; rows kept from the sample within 4 standard errors over jobs. */
static void test_smollm2_budget_job_sample(void **state)
{
    (void)state;
    const char *model = pt_smollm2_path();
    if (!model)
        TEST_SKIP("SmolLM2 not found (KVQ_SMOLLM2)");
    const char *cap = capture_smollm2(model);
    const char *art = pt_fit_artifact(cap, "jobs_fit");
    kvq_profile_result *all = pt_profile_budget(cap, art, 0, 0, -1, 2);
    double tols[40];
    const int nt = pt_budget_tolerances(all, tols);
    int64_t n_kept = 0, n_other = 0;
    for (int k = 0; k < nt; k++) {
        kvq_profile_result *b = pt_profile_budget(cap, art, 0, 32, tols[k], 2);
        assert_int_equal(b->n_seq_jobs, 120); /* 30 layers x 4 sequences, 2 a layer sampled */
        assert_int_equal(b->n_seq_jobs_sampled, 60);
        for (int t = KVQ_PROFILE_BUDGET; t <= KVQ_PROFILE_MASS; t++) {
            const kvq_profile_table *x = &all->table[t], *y = &b->table[t];
            const int64_t want = pt_expected_budget_choice(x, tols[k], t == KVQ_PROFILE_MASS);
            if (y->chosen != want)
                fail_msg("%s tol %g: job sample chose %lld, every row %lld", y->name, tols[k],
                         (long long)y->chosen, (long long)want);
            for (int64_t i = 0; i < y->n_rows; i++) {
                const double ex = x->rows[i * KVQ_PB_NCOLS + KVQ_PB_ERR];
                const double ey = y->rows[i * KVQ_PB_NCOLS + KVQ_PB_ERR];
                if (!y->job_sampled[i]) {
                    n_other++;
                    continue;
                }
                n_kept++;
                if (!(fabs(ex - ey) <= 4.0 / 1.96 * y->err_ci[i]))
                    fail_msg("%s tol %g row %lld kept from the job sample: err %.6g (every "
                             "row) vs %.6g +- %.2g", y->name, tols[k], (long long)i, ex, ey,
                             y->err_ci[i]);
            }
        }
        kvq_profile_result_free(b);
    }
    assert_true(n_kept > 0 && n_other > 0);
    print_message("budget/tau job sample: %lld rows kept from it, %lld measured on every job\n",
                  (long long)n_kept, (long long)n_other);
    kvq_profile_result_free(all);
}

/* The PATS rows of the SmolLM2 demo profile (`kvq inspect demo-out/model.kvq`: schedule,
 * b_min, b_max, packed memory, unpacked bits, attention-output error). The old rule took
 * the least memory, new-heavy 2..8 (0.95801), over middle-heavy 2..8 (0.95898, a 0.1%
 * difference) whose error is lower; `kvq eval --kv pats` measured +5.0% and +0.9%
 * perplexity for them (docs/kvcache.md). With the tie band the better error wins. */
static void test_pats_memory_tie(void **state)
{
    (void)state;
    static const double rows[12][KVQ_PP_NCOLS] = {
        {0, 2, 4, 1, 0.8125, 0.0088062, NAN},      {0, 2, 6, 1, 0.75, 0.036349, NAN},
        {0, 2, 8, 0.95801, 0.6875, 0.14199, NAN},  {0, 2, 10, 0.84375, 0.625, 0.40405, NAN},
        {1, 2, 4, 1, 0.8125, 0.0071837, NAN},      {1, 2, 6, 1, 0.75, 0.022613, NAN},
        {1, 2, 8, 0.95801, 0.6875, 0.063424, NAN}, {1, 2, 10, 0.84375, 0.625, 0.1558, NAN},
        {2, 2, 4, 1, 0.8125, 0.005966, NAN},       {2, 2, 6, 1, 0.75, 0.016349, NAN},
        {2, 2, 8, 0.95898, 0.68799, 0.047539, NAN}, {2, 2, 10, 0.84375, 0.625, 0.12411, NAN},
    };
    kvq_profile_table t;
    memset(&t, 0, sizeof t);
    t.n_cols = KVQ_PP_NCOLS;
    t.n_rows = 12;
    t.rows = (double *)rows;
    thr_select_row(&t, KVQ_PP_ERR, KVQ_PP_MEMORY, KVQ_PP_BITS, 0.1, THR_PATS_MAX_MEMORY, 0);
    assert_int_equal(t.chosen, 6); /* new-heavy 2..8: the least memory */
    assert_true(t.met);
    thr_select_row(&t, KVQ_PP_ERR, KVQ_PP_MEMORY, KVQ_PP_BITS, 0.1, THR_PATS_MAX_MEMORY,
                   THR_PATS_MEMORY_TIE);
    assert_int_equal(t.chosen, 10); /* middle-heavy 2..8: within the tie, lower error */
    assert_true(t.met);
    /* a tie band never takes a row beyond the limit or beyond the band */
    thr_select_row(&t, KVQ_PP_ERR, KVQ_PP_MEMORY, KVQ_PP_BITS, 0.05, THR_PATS_MAX_MEMORY, 0.2);
    assert_int_equal(t.chosen, 10); /* 2..10 (0.844) over the limit; 2..8 middle within */
    thr_select_row(&t, KVQ_PP_ERR, KVQ_PP_MEMORY, KVQ_PP_BITS, 0.2, THR_PATS_MAX_MEMORY, 0.05);
    assert_int_equal(t.chosen, 11); /* 2..10 middle-heavy: least memory, best of its band */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_interval_by_hand),
        cmocka_unit_test(test_marks),
        cmocka_unit_test(test_smollm2_job_sample_choice),
        cmocka_unit_test(test_smollm2_budget_job_sample),
        cmocka_unit_test(test_pats_memory_tie),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    test_tmpdir_cleanup();
    return rc;
}
