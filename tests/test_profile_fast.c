/* test_profile_fast.c — the profile's fast path (thresholds/profile_fast.c: exact
 * attention once per job, the LeanKV settings from shared logits, sampled rows) against
 * the reference path (one simulated cache per setting fed row by row, every row:
 * params.reference = 1), on captures of stories260K and of SmolLM2-135M (each skipped
 * when its model file is absent) over natural text (docs/design.md).
 *
 * Expected values come from the reference, which is the contract of kvq/thresholds.h
 * written out directly (and itself tested against hand counts and a double-precision
 * attention in test_thresholds.c). The fast path computes logits with SGEMM rather than
 * a sequential dot product, so the two agree to f32 rounding: token classes and memory
 * exactly (a class flips only when a significance lands within rounding of a threshold,
 * which these captures do not have), errors to 1e-4 relative, and the chosen settings
 * exactly at every tolerance tried. Sampling: the choice with the default sample equals
 * the choice with every row; the thread count does not change a byte.
 *
 * The budget/tau profile (thresholds/budget.c) likewise: its sampled path with every row
 * against its reference (every row by retrieval in one chunk, params.reference = 1),
 * the sampled choice against the every-row choice at tolerances placed between the
 * settings' errors, and the same bytes for any thread count. */
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
#include "helpers/tiny_spm.h"
#include "kvq/capture.h"
#include "kvq/capture_dir.h"
#include "kvq/fit.h"
#include "kvq/moments.h"
#include "kvq/model.h"
#include "kvq/thresholds.h"
#include "thresholds/lk_kernels.h"
#include "thresholds/thresholds_internal.h"

static kvq_profile_params base_params(void)
{
    kvq_profile_params p = kvq_profile_params_default();
    p.knobs = KVQ_KNOB_LEANKV | KVQ_KNOB_PATS;
    p.threads = 2;
    return p;
}

/* The fast path with every row against the reference: same memory and classes, errors
 * to 1e-4 relative; then the choice at several tolerances, including the sampled
 * default. */
static void compare_paths(const char *cap, int32_t window)
{
    kvq_profile_params p = base_params();
    p.leankv.window = window;
    p.reference = 1;
    kvq_profile_result *ref = pt_profile(cap, &p);
    p.reference = 0;
    p.sample_rows = 0;
    kvq_profile_result *fast = pt_profile(cap, &p);
    assert_int_equal(ref->n_queries, fast->n_queries);
    assert_int_equal(fast->n_measured, fast->n_queries);
    const int errc[2] = {KVQ_PL_ERR, KVQ_PP_ERR};
    double emin = INFINITY, emax = 0;
    for (int t = 0; t < 2; t++) {
        const kvq_profile_table *a = &ref->table[t], *b = &fast->table[t];
        assert_int_equal(a->n_rows, b->n_rows);
        assert_true(a->n_rows > 0);
        for (int64_t i = 0; i < a->n_rows; i++)
            for (int32_t c = 0; c < a->n_cols; c++) {
                const double x = a->rows[i * a->n_cols + c], y = b->rows[i * b->n_cols + c];
                if (isnan(x)) {
                    assert_true(isnan(y));
                } else if (c == errc[t]) {
                    if (fabs(x - y) > 1e-4 * fabs(x))
                        fail_msg("%s row %lld: err %.9g (reference) vs %.9g (fast)", a->name,
                                 (long long)i, x, y);
                    emin = x < emin ? x : emin;
                    emax = x > emax ? x : emax;
                } else if (x != y) {
                    fail_msg("%s row %lld column %s: %.17g (reference) vs %.17g (fast)", a->name,
                             (long long)i, a->cols[c], x, y);
                }
            }
        assert_int_equal(a->chosen, b->chosen);
        for (int64_t i = 0; i < b->n_rows; i++) /* every row measured: no interval */
            assert_true(isnan(b->rows[i * b->n_cols + errc[t]]) ? isnan(b->err_ci[i])
                                                                 : b->err_ci[i] == 0);
    }
    /* the choice at tolerances across the measured range: the reference's rows decide
     * as select_row does (least memory, then bits, then error, among rows within the
     * tolerance; else the least error); the sampled default must choose the same */
    double errs[256];
    int ne = 0;
    for (int t = 0; t < 2; t++)
        for (int64_t i = 0; i < ref->table[t].n_rows && ne < 256; i++)
            errs[ne++] = ref->table[t].rows[i * ref->table[t].n_cols + errc[t]];
    qsort(errs, (size_t)ne, sizeof *errs, pt_cmp_double);
    for (int k = 0; k <= 6; k++) {
        /* midway between two neighbouring measured errors at least 1e-3 apart, so that
         * rounding cannot put a row on the other side of the tolerance */
        int at = (ne - 1) * k / 6;
        while (at + 1 < ne && errs[at + 1] - errs[at] < 1e-3 * errs[at + 1])
            at++;
        const double tol = at + 1 < ne ? 0.5 * (errs[at] + errs[at + 1]) : errs[ne - 1] * 1.01;
        kvq_profile_params q = base_params();
        q.leankv.window = window;
        q.tolerance = tol;
        kvq_profile_result *b = pt_profile(cap, &q); /* sampled (default sample_rows) */
        for (int t = 0; t < 2; t++) {
            const kvq_profile_table *a = &ref->table[t];
            const int mc = t ? KVQ_PP_MEMORY : KVQ_PL_MEMORY, bc = t ? KVQ_PP_BITS : -1;
            int64_t best = -1;
            int met = 0;
            for (int64_t row = 0; row < a->n_rows; row++) {
                const double *r = a->rows + row * a->n_cols;
                /* a PATS row that saves nothing against f16 is never chosen (the rule of
                 * kvq/thresholds.h) */
                if (t == 1 && !(r[mc] < 1.0))
                    continue;
                const int in = r[errc[t]] <= tol;
                if (best < 0 || (in && !met)) {
                    best = row, met = in;
                    continue;
                }
                if (!in && met)
                    continue;
                const double *o = a->rows + best * a->n_cols;
                int better;
                if (met)
                    better = r[mc] != o[mc]                     ? r[mc] < o[mc]
                             : bc >= 0 && r[bc] != o[bc]        ? r[bc] < o[bc]
                                                                : r[errc[t]] < o[errc[t]];
                else
                    better = r[errc[t]] != o[errc[t]] ? r[errc[t]] < o[errc[t]] : r[mc] < o[mc];
                if (better)
                    best = row;
            }
            if (best != b->table[t].chosen)
                fail_msg("tolerance %g: %s chosen row %lld (reference, every row) vs %lld "
                         "(sampled)", tol, a->name, (long long)best, (long long)b->table[t].chosen);
            assert_int_equal(met, b->table[t].met);
        }
        /* PATS rows that save no memory (never chosen): measured on a quarter of the
         * sample (32 per sequence here: 8), their errors within 4 standard errors of
         * every row's, the others on the whole sample */
        const kvq_profile_table *pa = &ref->table[1], *pb = &b->table[1];
        int64_t nosave = 0;
        for (int64_t row = 0; row < pa->n_rows; row++) {
            const double *x = pa->rows + row * pa->n_cols, *y = pb->rows + row * pb->n_cols;
            nosave += !(x[KVQ_PP_MEMORY] < 1.0);
            if (!(x[KVQ_PP_MEMORY] < 1.0) &&
                !(fabs(x[KVQ_PP_ERR] - y[KVQ_PP_ERR]) <= 4.0 / 1.96 * pb->err_ci[row]))
                fail_msg("pats row %lld (no memory saved): err %.6g (every row) vs %.6g +- %.2g",
                         (long long)row, x[KVQ_PP_ERR], y[KVQ_PP_ERR], pb->err_ci[row]);
        }
        assert_int_equal(b->n_nosave, nosave);
        if (nosave)
            assert_int_equal(b->n_measured_nosave * 4, b->n_measured);
        assert_int_equal(fast->n_measured_nosave, fast->n_measured); /* every row: all */
        kvq_profile_result_free(b);
    }
    print_message("%s: %lld evaluated rows; err %.4g .. %.4g; %lld PATS rows save no memory\n",
                  cap, (long long)fast->n_queries, emin, emax, (long long)fast->n_nosave);
    kvq_profile_result_free(ref);
    kvq_profile_result_free(fast);
}

static void test_stories260k_fast_equals_reference(void **state)
{
    (void)state;
    int stories;
    const char *model = test_real_model(&stories);
    if (!model)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    /* without stories260K: SmolLM2 at two layers the test below does not profile */
    static const int32_t smol[] = {1, 7};
    const char *cap = pt_capture(model, "cap260k", 192, 768, stories ? NULL : smol, stories ? 0 : 2);
    compare_paths(cap, 16);
}

static void test_smollm2_fast_equals_reference(void **state)
{
    (void)state;
    const char *model = pt_smollm2_path();
    if (!model)
        TEST_SKIP("SmolLM2 not found (KVQ_SMOLLM2)");
    static const int32_t layers[] = {0, 14, 29};
    const char *cap = pt_capture(model, "capsmol", 256, 512, layers, 3);
    compare_paths(cap, 32);
}

/* The sampled profile: a measured-row count, intervals, and the same bytes for any
 * thread count. */
static void test_sampled_threads_same_bytes(void **state)
{
    (void)state;
    int stories;
    const char *model = test_real_model(&stories);
    if (!model)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    static const int32_t smol[] = {0, 1}; /* SmolLM2: two layers, for time */
    const char *cap = pt_capture(model, "capthreads", 192, 768, stories ? NULL : smol,
                              stories ? 0 : 2);
    kvq_profile_params p = base_params();
    p.leankv.window = 16;
    p.sample_rows = 8;
    p.threads = 1;
    kvq_profile_result *a = pt_profile(cap, &p);
    p.threads = 3;
    kvq_profile_result *b = pt_profile(cap, &p);
    /* more threads than a layer's sampled jobs: several layers run at once */
    p.threads = 13;
    kvq_profile_result *c = pt_profile(cap, &p);
    assert_true(a->n_measured < a->n_queries);
    if (stories) /* 16 jobs a layer, 6 sampled: 3 layers at once on 13 threads */
        assert_true(a->n_jobs_sampled * 2 < a->n_jobs);
    assert_int_equal(a->n_measured, b->n_measured);
    assert_int_equal(a->n_measured, c->n_measured);
    for (int t = 0; t < 2; t++) {
        const kvq_profile_table *x = &a->table[t], *y = &b->table[t], *z = &c->table[t];
        assert_memory_equal(x->rows, y->rows, sizeof(double) * (size_t)(x->n_rows * x->n_cols));
        assert_memory_equal(x->err_ci, y->err_ci, sizeof(double) * (size_t)x->n_rows);
        assert_memory_equal(x->rows, z->rows, sizeof(double) * (size_t)(x->n_rows * x->n_cols));
        assert_memory_equal(x->err_ci, z->err_ci, sizeof(double) * (size_t)x->n_rows);
        assert_memory_equal(x->job_sampled, z->job_sampled, (size_t)x->n_rows);
        assert_int_equal(x->chosen, y->chosen);
        assert_int_equal(x->chosen, z->chosen);
        for (int64_t i = 0; i < x->n_rows; i++)
            assert_true(x->err_ci[i] >= 0 && isfinite(x->err_ci[i]));
    }
    kvq_profile_result_free(a);
    kvq_profile_result_free(b);
    kvq_profile_result_free(c);
}

/* ---- the budget/tau profile ------------------------------------------------------- */


static void assert_close(double x, double y, double rel)
{
    if (!(fabs(x - y) <= rel * fabs(y)))
        fail_msg("%.17g != %.17g", x, y);
}

static void test_budget_sampled_equals_every_row(void **state)
{
    (void)state;
    /* stories260K, else its committed stand-in (tests/helpers/tiny_spm.h): what is
     * compared is two code paths on the same capture, not the model */
    const char *model = test_model_path();
    if (!model)
        model = TINY_SPM_GGUF;
    const char *cap = pt_capture(model, "capbudget", 192, 768, NULL, 0);
    const char *art = pt_fit_artifact(cap, "budget_fit");

    /* every row: the sampled path (prefill chunks, one call per measured row) equals
     * the reference (every row by retrieval) */
    kvq_profile_result *ref = pt_profile_budget(cap, art, 1, 0, -1, 2);
    kvq_profile_result *all = pt_profile_budget(cap, art, 0, 0, -1, 2);
    for (int t = KVQ_PROFILE_BUDGET; t <= KVQ_PROFILE_MASS; t++) {
        const kvq_profile_table *x = &all->table[t], *y = &ref->table[t];
        assert_int_equal(x->n_rows, y->n_rows);
        assert_true(x->n_rows > 1);
        for (int64_t i = 0; i < x->n_rows; i++) {
            const double *a = x->rows + i * KVQ_PB_NCOLS, *b = y->rows + i * KVQ_PB_NCOLS;
            assert_true(b[KVQ_PB_ERR] > 0 && isfinite(b[KVQ_PB_ERR]));
            /* budgets: the same token counts; tau: the mass rule's count sits on float
             * sums whose rounding depends on how the rows were chunked (one token in
             * 10^5 seen) */
            if (t == KVQ_PROFILE_BUDGET && a[KVQ_PB_ATTENDED] != b[KVQ_PB_ATTENDED])
                fail_msg("row %lld attended %.17g != %.17g", (long long)i, a[KVQ_PB_ATTENDED],
                         b[KVQ_PB_ATTENDED]);
            assert_close(a[KVQ_PB_ATTENDED], b[KVQ_PB_ATTENDED], 1e-4);
            assert_close(a[KVQ_PB_MASS], b[KVQ_PB_MASS], 1e-4);
            assert_close(a[KVQ_PB_ERR], b[KVQ_PB_ERR], 1e-4);
            assert_true(x->err_ci[i] == 0);
        }
        assert_int_equal(x->chosen, y->chosen);
    }

    /* sampled (8 of 96 continuation rows per sequence): the choice that the rule of
     * kvq/thresholds.h "Selection" makes on the every-row figures, at tolerances between
     * the settings' errors of either table, below all and above all */
    double tols[40];
    const int nt = pt_budget_tolerances(all, tols);
    int sampled_some = 0;
    for (int k = 0; k < nt; k++) {
        kvq_profile_result *b = pt_profile_budget(cap, art, 0, 8, tols[k], 2);
        for (int t = KVQ_PROFILE_BUDGET; t <= KVQ_PROFILE_MASS; t++) {
            const int64_t want =
                pt_expected_budget_choice(&all->table[t], tols[k], t == KVQ_PROFILE_MASS);
            if (b->table[t].chosen != want)
                fail_msg("table %d tol %g: sampled chose %lld, every row %lld", t, tols[k],
                         (long long)b->table[t].chosen, (long long)want);
            for (int64_t i = 0; i < b->table[t].n_rows; i++)
                sampled_some |= b->table[t].err_ci[i] > 0;
        }
        kvq_profile_result_free(b);
    }
    assert_true(sampled_some);

    /* the thread count does not change a byte */
    kvq_profile_result *t1 = pt_profile_budget(cap, art, 0, 8, -1, 1);
    kvq_profile_result *t3 = pt_profile_budget(cap, art, 0, 8, -1, 3);
    for (int t = KVQ_PROFILE_BUDGET; t <= KVQ_PROFILE_MASS; t++) {
        const kvq_profile_table *x = &t1->table[t], *y = &t3->table[t];
        assert_memory_equal(x->rows, y->rows, sizeof(double) * (size_t)(x->n_rows * x->n_cols));
        assert_memory_equal(x->err_ci, y->err_ci, sizeof(double) * (size_t)x->n_rows);
        assert_int_equal(x->chosen, y->chosen);
    }
    kvq_profile_result_free(t1);
    kvq_profile_result_free(t3);
    kvq_profile_result_free(ref);
    kvq_profile_result_free(all);
}

/* ---- the LeanKV grid kernels ------------------------------------------------------- */

static uint64_t lk_rng = 88172645463325252ull;
static double lk_unif(void)
{
    lk_rng ^= lk_rng << 13;
    lk_rng ^= lk_rng >> 7;
    lk_rng ^= lk_rng << 17;
    return (double)(lk_rng >> 11) / 9007199254740992.0;
}

/* A gather that adds in one running sum: what a kernel that ignored the eight partial
 * sums would compute (the comparison below must tell it apart). */
static double gather_one_sum(const float *const e[4], const uint8_t *ver, int64_t len, float *w)
{
    double z = 0;
    for (int64_t j = 0; j < len; j++) {
        w[j] = ver[j] ? e[ver[j]][j] : 0.0f;
        z += (double)w[j];
    }
    return z;
}

/* A mix that rounds each product before adding it (no fused multiply-add): the
 * comparison below must tell it apart. */
static void mix_unfused(float *o, const float *w, double inv, const uint8_t *ver,
                        const float *const v[4], int64_t len, int32_t d)
{
    for (int32_t c = 0; c < d; c++) {
        volatile float s = 0.0f;
        for (int64_t j = 0; j < len; j++)
            if (ver[j]) {
                volatile float p = (float)((double)w[j] * inv) * v[ver[j]][(size_t)j * d + c];
                s = s + p;
            }
        o[c] = s;
    }
}

/* Every SIMD level's kernels equal the scalar ones bit for bit: lengths with and without
 * tails, head counts 1 to 5 (the kernels take heads in groups), head dims with partial
 * vectors, counts at or below zero, pruned tokens; a one-sum gather and an unfused mix
 * do not. */
/* The grid's RoPE table (thr_rope_tab, profile_grid.c): every row of a layer rotated by
 * it equals kvq_rope_apply at the row's position (test_rope checks that against numpy),
 * bit for bit, with a slot per position (positions repeating over sequences) and with a
 * slot per row (a position outside [0, n_tokens)), for both layouts and llama3 scaling.
 * A table that misplaces one position fails it. */
static void test_rope_table(void **state)
{
    (void)state;
    enum { NT = 40, D = 16, NH = 3 };
    int32_t pos[NT];
    float x[NH * D], y[NH * D];
    double theta[D / 2];
    for (int kind = 0; kind < 4; kind++) {
        kvq_capture_info ci;
        memset(&ci, 0, sizeof ci);
        ci.n_tokens = NT;
        ci.model.head_dim = D;
        ci.model.rope = kvq_rope_default(D);
        ci.model.rope.layout = kind & 1 ? KVQ_ROPE_HALF : KVQ_ROPE_INTERLEAVED;
        if (kind == 3) {
            ci.model.rope.scaling = KVQ_ROPE_SCALING_LLAMA3;
            ci.model.rope.factor = 8;
            ci.model.rope.low_freq_factor = 1;
            ci.model.rope.high_freq_factor = 4;
            ci.model.rope.original_max_pos = 64;
        }
        for (int r = 0; r < NT; r++) /* sequences of 10 at 0..9; kind 2+: one far position */
            pos[r] = kind >= 2 && r == 17 ? 100000 + r : r % 10;
        thr_layer L;
        memset(&L, 0, sizeof L);
        L.pos = pos;
        thr_rope_tab T = {0};
        assert_int_equal(thr_rope_tab_make(&ci, &L, 2, &T, NULL), KVQ_OK);
        assert_int_equal(T.by_pos, kind < 2);
        kvq_rope_freqs(&ci.model.rope, theta);
        for (int r = 0; r < NT; r++) {
            for (int i = 0; i < NH * D; i++)
                x[i] = y[i] = (float)sin(0.37 * (r * NH * D + i) + kind) * 3.0f;
            thr_rope_tab_rotate(&ci, &T, r, x, NH);
            kvq_rope_apply(&ci.model.rope, theta, y, NH, pos[r]);
            assert_memory_equal(x, y, sizeof x);
        }
        free(T.cs);
    }
}

static void test_lk_kernels_equal_scalar(void **state)
{
    (void)state;
    const thr_lk_kernels *ref = thr_lk_kernels_get(0);
    assert_string_equal(ref->name, "scalar");
    enum { N = 600, GS = 5, D = 80 };
    double *acc = malloc(sizeof(double) * GS * N), *a0 = malloc(sizeof(double) * N),
           *a1 = malloc(sizeof(double) * N);
    float *w0 = malloc(sizeof(float) * GS * N), *w1 = malloc(sizeof(float) * GS * N);
    /* e: 4 versions x GS heads x N tokens (heads N apart); v: 4 versions of N x D */
    float *e = malloc(sizeof(float) * 4 * GS * N), *v = malloc(sizeof(float) * 4 * N * D);
    int64_t *qcum = malloc(sizeof(int64_t) * N);
    uint8_t *ver = malloc(N);
    for (int64_t i = 0; i < GS * N; i++)
        acc[i] = lk_unif() * 3.0;
    for (int64_t i = 0; i < 4 * GS * N; i++) /* exponentials over a wide range: sums round */
        e[i] = (float)exp(-60.0 * lk_unif());
    for (int64_t i = 0; i < 4 * N * D; i++)
        v[i] = (float)(lk_unif() - 0.5);
    for (int64_t j = 0; j < N; j++) {
        qcum[j] = j / 2;
        ver[j] = (uint8_t)(lk_unif() * 4.0);
    }
    const float *ev[4] = {NULL, e + GS * N, e + 2 * GS * N, e + 3 * GS * N};
    const float *vv[4] = {NULL, v + N * D, v + 2 * N * D, v + 3 * N * D};
    const double inv[GS] = {0.01, 0.37, 1.0 / 3.0, 2.5, 0.07};
    int one_sum_differs = 0, unfused_differs = 0;
    for (int level = 1; level <= 2; level++) {
        const thr_lk_kernels *k = thr_lk_kernels_get(level);
        for (int64_t len = 0; len <= N; len += len < 40 ? 1 : 71) {
            const int64_t nq = len / 3; /* qcum[j] >= nq from j = 2 nq on: +inf there */
            k->significance(a1, acc, N, 3, qcum, nq, len);
            ref->significance(a0, acc, N, 3, qcum, nq, len);
            assert_memory_equal(a0, a1, sizeof(double) * (size_t)len);
            for (int32_t gs = 1; gs <= GS; gs++) {
                double z0[GS], z1[GS];
                ref->gather(ev, N, ver, len, gs, w0, N, z0);
                k->gather(ev, N, ver, len, gs, w1, N, z1);
                assert_memory_equal(z0, z1, sizeof(double) * (size_t)gs);
                for (int32_t g = 0; g < gs; g++)
                    assert_memory_equal(w0 + (size_t)g * N, w1 + (size_t)g * N,
                                        sizeof(float) * (size_t)len);
            }
            const double zo = gather_one_sum(ev, ver, len, w1);
            double zr[1];
            ref->gather(ev, N, ver, len, 1, w1, N, zr);
            one_sum_differs |= memcmp(&zo, &zr[0], sizeof zo) != 0;
            memcpy(a0, acc, sizeof(double) * (size_t)len);
            memcpy(a1, acc, sizeof(double) * (size_t)len);
            ref->daxpy(a0, 0.37, w0, len);
            k->daxpy(a1, 0.37, w0, len);
            assert_memory_equal(a0, a1, sizeof(double) * (size_t)len);
            for (int32_t d = 1; d <= D; d += d < 8 ? 1 : 24) /* 1..8, 32, 56, 80 */
                for (int32_t gs = 1; gs <= GS; gs += d < 8 ? 4 : 1) {
                    float o0[GS * D], o1[GS * D];
                    ref->mix(o0, w0, N, inv, ver, vv, len, d, gs);
                    k->mix(o1, w0, N, inv, ver, vv, len, d, gs);
                    assert_memory_equal(o0, o1, sizeof(float) * (size_t)(gs * d));
                    mix_unfused(o1, w0, inv[0], ver, vv, len, d);
                    unfused_differs |= memcmp(o0, o1, sizeof(float) * (size_t)d) != 0;
                }
        }
    }
    assert_true(one_sum_differs);
    assert_true(unfused_differs);
    /* Algorithm 1's choice: ties (sig on a coarse grid), every class, a NaN */
    double *sg = malloc(sizeof(double) * N);
    uint8_t *cl = malloc(N);
    int last_tie_differs = 0;
    for (int round = 0; round < 3; round++) {
        for (int64_t j = 0; j < N; j++) {
            sg[j] = floor(lk_unif() * 20.0) / 7.0;
            cl[j] = (uint8_t)(lk_unif() * 3.0);
        }
        if (round == 2)
            sg[N / 2] = NAN;
        for (int level = 1; level <= 2; level++)
            for (int64_t len = 0; len <= N; len += len < 40 ? 1 : 71)
                for (uint8_t sec = 0; sec < 4; sec++) {
                    const int64_t a = thr_leankv_argmin_scalar(sg, cl, sec, len);
                    assert_int_equal(ref->argmin(sg, cl, sec, len), a);
                    assert_int_equal(thr_lk_kernels_get(level)->argmin(sg, cl, sec, len), a);
                    int64_t b = -1; /* the last tie: a wrong rule */
                    for (int64_t j = 0; j < len; j++)
                        if (cl[j] == sec && (b < 0 || sg[j] <= sg[b]))
                            b = j;
                    last_tie_differs |= a != b;
                }
    }
    assert_true(last_tie_differs);
    free(sg);
    free(cl);
    free(acc);
    free(w0);
    free(w1);
    free(a0);
    free(a1);
    free(e);
    free(v);
    free(qcum);
    free(ver);
}

/* Algorithm 1's choice without the significance of every token (sigmin: keys by an
 * approximate reciprocal, exact division near the least) against its definition
 * (significance, then the scalar argmin) on significances a few ulp apart, exact ties,
 * +inf counts, a class of +inf only, NaN, and every class. The least key alone (no
 * exact step) picks another token on these inputs. */
static void test_lk_sigmin(void **state)
{
    (void)state;
    enum { N = 300, GS = 3 };
    double *acc = malloc(sizeof(double) * GS * N), *key = malloc(sizeof(double) * N),
           *sg = malloc(sizeof(double) * N);
    int64_t *qcum = malloc(sizeof(int64_t) * N);
    uint8_t *cl = malloc(N);
    int least_key_differs = 0;
    for (int round = 0; round < 6; round++) {
        const int64_t nq = round == 4 ? 0 : 400; /* round 4: no positive count */
        for (int64_t j = 0; j < N; j++) {
            qcum[j] = j + (int64_t)(lk_unif() * 3.0); /* counts 398 .. 100, unequal */
            if (round == 3 && j >= N - 50)
                qcum[j] = nq; /* +inf from here */
            const double cnt = (double)(nq - qcum[j]);
            /* significances 0.25 (1 + k 2^-50), k in 0..3: ties and ulp neighbours, one
             * head the largest (as the maximum takes it) */
            const double a = 0.25 * cnt * (1.0 + floor(lk_unif() * 4.0) * 0x1p-50);
            for (int g = 0; g < GS; g++)
                acc[(size_t)g * N + j] = g == j % GS ? a : a * lk_unif();
            cl[j] = (uint8_t)(round == 5 ? KVQ_LEANKV_HIGH : lk_unif() * 3.0);
        }
        for (int g = 0; round == 2 && g < GS; g++) /* every head NaN: -inf (max skips NaN) */
            acc[(size_t)g * N + N / 3] = NAN;
        for (int level = 0; level <= 2; level++) {
            const thr_lk_kernels *k = thr_lk_kernels_get(level);
            for (int64_t len = 0; len <= N; len += len < 20 ? 1 : 37)
                for (uint8_t sec = 0; sec < 3; sec++) {
                    k->significance(sg, acc, N, GS, qcum, nq, len);
                    const int64_t want = thr_leankv_argmin_scalar(sg, cl, sec, len);
                    assert_int_equal(k->sigmin(acc, N, GS, qcum, nq, cl, sec, len, key), want);
                    int64_t b = -1; /* the least key by a float reciprocal */
                    for (int64_t j = 0; j < len; j++) {
                        const int64_t cnt = nq - qcum[j];
                        const double x = cnt > 0 ? (sg[j] * (double)cnt) *
                                                       (double)(1.0f / (float)cnt)
                                                 : INFINITY;
                        if (cl[j] == sec && (b < 0 || x < key[0]))
                            key[0] = x, b = j;
                    }
                    least_key_differs |= b != want;
                }
        }
    }
    assert_true(least_key_differs);
    free(acc);
    free(key);
    free(sg);
    free(qcum);
    free(cl);
}

/* The rows a sample leaves out (thr_sample_complement): with the sample, every row
 * once. On a capture, the grid's sums over the sample plus those over the rest equal the
 * sums over every row (what the profile adds for the settings it measures again); a
 * complement that took every row would count the sample twice. */
static void test_sample_complement(void **state)
{
    (void)state;
    enum { NC = 37 };
    int64_t cand[NC], a[NC], b[NC], seen[3 * NC + 3];
    for (int64_t i = 0; i < NC; i++)
        cand[i] = 3 * i + 1;
    for (int64_t sample = 0; sample <= NC + 1; sample++) {
        const int64_t na = thr_sample_rows(cand, NC, sample, a);
        const int64_t nb = thr_sample_complement(cand, NC, sample, b);
        assert_int_equal(na + nb, NC);
        assert_int_equal(nb, sample == 0 || sample >= NC ? 0 : NC - sample);
        memset(seen, 0, sizeof seen);
        for (int64_t i = 0; i < na; i++)
            seen[a[i]]++;
        for (int64_t i = 0; i < nb; i++) {
            seen[b[i]]++;
            assert_true(i == 0 || b[i] > b[i - 1]);
        }
        for (int64_t i = 0; i < NC; i++)
            assert_int_equal(seen[cand[i]], 1);
    }
    int stories;
    const char *model = test_real_model(&stories);
    if (!model)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    static const int32_t smol[] = {3}; /* SmolLM2: one layer, for time */
    const char *cap = pt_capture(model, "capcompl", 192, 384, stories ? NULL : smol,
                              stories ? 0 : 1);
    kvq_capture_info *ci = NULL;
    kvq_err e = {0};
    assert_int_equal(kvq_capture_info_read(cap, &ci, &e), KVQ_OK);
    kvq_leankv_params lk[2] = {kvq_leankv_params_default(), kvq_leankv_params_default()};
    lk[0].window = lk[1].window = 16;
    lk[1].alpha_h = 2;
    lk[1].alpha_l = 0.04;
    kvq_pats_params pt[2] = {kvq_pats_params_default(), kvq_pats_params_default()};
    pt[1].b_max = 10;
    const thr_grid G = {2, 2, lk, pt, NULL};
    kvq_profile_params p = base_params();
    thr_acc sums[3][4];
    int64_t rows[3] = {0, 0, 0}, meas[3] = {0, 0, 0};
    const int64_t samples[3] = {8, -8, 0};
    for (int r = 0; r < 3; r++) {
        memset(sums[r], 0, sizeof sums[r]);
        p.sample_rows = samples[r];
        assert_int_equal(thr_grid_run(ci, &p, &G, "test", sums[r], &rows[r], &meas[r], &e), KVQ_OK);
    }
    assert_int_equal(rows[0], rows[2]);
    assert_true(meas[0] > 0 && meas[1] > 0);
    assert_int_equal(meas[0] + meas[1], meas[2]);
    for (int c = 0; c < 4; c++) {
        assert_true(sums[0][c].err_n > 0 && sums[1][c].err_n > 0);
        assert_int_equal(sums[0][c].err_n + sums[1][c].err_n, sums[2][c].err_n);
        /* the same rows, so the same count exactly; their errors to the rounding of the
         * exact outputs, which come from sgemm over blocks of other rows: with
         * OPENBLAS_CORETYPE=Haswell (set on the CI machine) a row's output depends in its
         * last bits on the block's size (1.3e-9 relative in the sum there), while one row
         * missing or counted twice moves the sum by about 1 / err_n */
        assert_close(sums[0][c].err_sum + sums[1][c].err_sum, sums[2][c].err_sum, 1e-6);
        assert_close(sums[0][c].err_sq + sums[1][c].err_sq, sums[2][c].err_sq, 1e-6);
        assert_memory_equal(&sums[0][c].mem, &sums[2][c].mem, sizeof sums[0][c].mem);
    }
    /* a thin PATS setting (G.pt_thin: saves no memory) is measured on a quarter of the
     * sample (8: 2 per sequence), the same rows' errors as measured with the whole
     * sample added up in another order; every row: all of them */
    const uint8_t thin[2] = {1, 0};
    const thr_grid Gt = {2, 2, lk, pt, thin};
    thr_acc st[2][4];
    int64_t rt[2] = {0, 0}, mt[2] = {0, 0};
    for (int r = 0; r < 2; r++) {
        memset(st[r], 0, sizeof st[r]);
        p.sample_rows = r ? 0 : 8;
        assert_int_equal(thr_grid_run(ci, &p, &Gt, "test", st[r], &rt[r], &mt[r], &e), KVQ_OK);
    }
    assert_int_equal(st[0][2].err_n * 4, sums[0][2].err_n);
    assert_true(st[0][2].err_sum < sums[0][2].err_sum);
    assert_int_equal(st[0][3].err_n, sums[0][3].err_n); /* the other one: the whole sample */
    assert_true(st[0][3].err_sum == sums[0][3].err_sum);
    assert_memory_equal(&st[0][2].mem, &sums[0][2].mem, sizeof st[0][2].mem);
    for (int c = 0; c < 4; c++)
        assert_true(memcmp(&st[1][c], &sums[2][c], sizeof st[1][c]) == 0);
    assert_int_equal(thr_thin_count(8, 96), 2);
    assert_int_equal(thr_thin_count(3, 96), 1);
    assert_int_equal(thr_thin_count(8, 8), 8);
    assert_int_equal(thr_thin_count(0, 96), 0);
    kvq_capture_info_free(ci);
}

/* n errors of mean m and standard deviation sd, memory mem. */
static thr_acc acc_of(double m, double sd, double mem)
{
    thr_acc a;
    memset(&a, 0, sizeof a);
    a.err_n = 100;
    a.err_sum = 100 * m;
    a.err_sq = 99 * sd * sd + 100 * m * m;
    a.mem.bytes = mem;
    a.mem.bytes_f16 = 1;
    return a;
}

/* The settings measured again on every row when none can be within tolerance: the ones
 * that may have the least error, unless that is one setting (or its duplicates, equal
 * figures), which no measurement can unseat. */
static void test_refine_marks(void **state)
{
    (void)state;
    uint8_t mark[4];
    /* one clear best: nothing measured again */
    thr_acc a[4] = {acc_of(0.30, 0.01, 0.1), acc_of(0.20, 0.01, 0.5), acc_of(0.40, 0.01, 0.2),
                    acc_of(0.35, 0.01, 0.3)};
    thr_mark_refine(a, 0, 4, 0.05, mark);
    for (int c = 0; c < 4; c++)
        assert_int_equal(mark[c], 0);
    /* the best and its duplicate: nothing */
    a[3] = a[1];
    thr_mark_refine(a, 0, 4, 0.05, mark);
    for (int c = 0; c < 4; c++)
        assert_int_equal(mark[c], 0);
    /* two that may be the best: both */
    a[3] = acc_of(0.2005, 0.01, 0.3);
    thr_mark_refine(a, 0, 4, 0.05, mark);
    assert_true(mark[1] && mark[3] && !mark[0] && !mark[2]);
    /* the tolerance within reach: the ambiguous ones, as before */
    thr_mark_refine(a, 0, 4, 0.2, mark);
    assert_true(mark[1] && mark[3] && !mark[0] && !mark[2]);
    /* PATS: a setting that saves no memory is never chosen, so never measured again,
     * even on the tolerance (and it keeps no cheaper one from being marked) */
    thr_acc p[4] = {acc_of(0.0501, 0.01, 1.0), acc_of(0.0499, 0.01, 0.96),
                    acc_of(0.01, 0.001, 1.0), acc_of(0.30, 0.01, 0.84)};
    thr_mark_refine_below(p, 0, 4, 0.05, THR_PATS_MAX_MEMORY, mark);
    assert_true(!mark[0] && mark[1] && !mark[2] && !mark[3]);
    thr_mark_refine(p, 0, 4, 0.05, mark); /* without the limit: both on the tolerance */
    assert_true(mark[0] && mark[1] && !mark[2] && !mark[3]);
    /* none choosable within reach: the least error among the choosable, alone: none */
    p[1] = acc_of(0.20, 0.01, 0.96);
    thr_mark_refine_below(p, 0, 4, 0.05, THR_PATS_MAX_MEMORY, mark);
    for (int c = 0; c < 4; c++)
        assert_int_equal(mark[c], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k_fast_equals_reference),
        cmocka_unit_test(test_smollm2_fast_equals_reference),
        cmocka_unit_test(test_sampled_threads_same_bytes),
        cmocka_unit_test(test_budget_sampled_equals_every_row),
        cmocka_unit_test(test_lk_kernels_equal_scalar),
        cmocka_unit_test(test_lk_sigmin),
        cmocka_unit_test(test_rope_table),
        cmocka_unit_test(test_sample_complement),
        cmocka_unit_test(test_refine_marks),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    test_tmpdir_cleanup();
    return rc;
}
