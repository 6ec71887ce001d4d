/* profiletest.c — see profiletest.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "helpers/profiletest.h"
#include "helpers/testutil.h"
#include "kvq/capture.h"
#include "kvq/fit.h"
#include "kvq/model.h"
#include "kvq/moments.h"

#define SMOLLM2_DEFAULT ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"

const char *pt_smollm2_path(void)
{
    const char *p = getenv("KVQ_SMOLLM2");
    if (!p || !*p)
        p = SMOLLM2_DEFAULT;
    return access(p, R_OK) == 0 ? p : NULL;
}

const char *pt_capture(const char *model, const char *name, int64_t seq_len,
                           int64_t max_tokens, const int32_t *layers, size_t n_layers)
{
    static char dir[2][512];
    static int slot;
    char *d = dir[slot++ & 1];
    snprintf(d, sizeof dir[0], "%s", test_path(name));
    kvq_model *m = NULL;
    kvq_err e = {0};
    kvq_model_params mp = kvq_model_params_default();
    assert_int_equal(kvq_model_open(model, &mp, &m, &e), KVQ_OK);
    kvq_capture_params cp = kvq_capture_params_default();
    cp.seq_len = seq_len;
    cp.max_tokens = max_tokens;
    cp.layers = layers;
    cp.n_layers = n_layers;
    cp.threads = 2;
    char spec[600];
    snprintf(spec, sizeof spec, "file:%s", "docs/design.md");
    kvq_status s = kvq_capture_run(m, spec, NULL, &cp, d, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    kvq_model_close(m);
    return d;
}

kvq_profile_result *pt_profile(const char *cap, const kvq_profile_params *p)
{
    kvq_profile_result *r = NULL;
    kvq_err e = {0};
    kvq_status s = kvq_profile_capture(cap, NULL, p, &r, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    return r;
}

const char *pt_fit_artifact(const char *cap, const char *name)
{
    static char path[512], mom[512];
    char file[128];
    snprintf(file, sizeof file, "%s.kvq", name);
    snprintf(path, sizeof path, "%s", test_path(file));
    snprintf(file, sizeof file, "%s_mom.safetensors", name);
    snprintf(mom, sizeof mom, "%s", test_path(file));
    kvq_err e = {0};
    kvq_moments_params mp = kvq_moments_params_default();
    kvq_status s = kvq_moments_compute(cap, mom, 1, &mp, NULL, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    kvq_fit_params fp = kvq_fit_params_default();
    fp.codebook_size = 16;
    fp.iters = 4;
    fp.holdout = 0;
    fp.reference = 0;
    fp.checkpoint = 0;
    fp.overwrite = 1;
    fp.threads = 2;
    s = kvq_fit_run(cap, mom, path, &fp, NULL, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    return path;
}

kvq_profile_result *pt_profile_budget(const char *cap, const char *art, int reference,
                                     int64_t sample, double tol, int32_t threads)
{
    kvq_profile_params p = kvq_profile_params_default();
    p.knobs = KVQ_KNOB_BUDGET | KVQ_KNOB_MASS;
    p.reference = reference;
    p.sample_rows = sample;
    p.tolerance = tol;
    p.threads = threads;
    kvq_profile_result *r = NULL;
    kvq_err e = {0};
    kvq_status s = kvq_profile_capture(cap, art, &p, &r, &e);
    if (s)
        print_error("%s\n", e.msg);
    assert_int_equal(s, KVQ_OK);
    for (int t = KVQ_PROFILE_BUDGET; t <= KVQ_PROFILE_MASS; t++)
        assert_string_equal(r->table[t].skipped, "");
    return r;
}

int64_t pt_expected_budget_choice(const kvq_profile_table *t, double tol, int mass)
{
    int64_t best = -1;
    int best_in = 0;
    for (int64_t i = 0; i < t->n_rows; i++) {
        const double *r = t->rows + i * KVQ_PB_NCOLS;
        const int in = r[KVQ_PB_ERR] <= tol;
        if (best < 0 || in > best_in) {
            best = i;
            best_in = in;
            continue;
        }
        if (in < best_in)
            continue;
        const double *b = t->rows + best * KVQ_PB_NCOLS;
        const double m1 = mass ? r[KVQ_PB_ATTENDED] : r[KVQ_PB_VALUE];
        const double b1 = mass ? b[KVQ_PB_ATTENDED] : b[KVQ_PB_VALUE];
        const double m2 = r[KVQ_PB_VALUE], b2 = b[KVQ_PB_VALUE];
        const double e = r[KVQ_PB_ERR], be = b[KVQ_PB_ERR];
        const int better = in ? (m1 < b1 || (m1 == b1 && (mass && m2 != b2 ? m2 < b2 : e < be)))
                              : (e < be || (e == be && m1 < b1));
        if (better)
            best = i;
    }
    return best;
}

int pt_budget_tolerances(const kvq_profile_result *all, double *tols)
{
    int nt = 0;
    double lo = INFINITY, hi = 0;
    for (int t = KVQ_PROFILE_BUDGET; t <= KVQ_PROFILE_MASS; t++) {
        const kvq_profile_table *y = &all->table[t];
        double e[32];
        const int64_t n = y->n_rows < 32 ? y->n_rows : 32;
        for (int64_t i = 0; i < n; i++)
            e[i] = y->rows[i * KVQ_PB_NCOLS + KVQ_PB_ERR];
        qsort(e, (size_t)n, sizeof *e, pt_cmp_double);
        lo = n > 0 && e[0] < lo ? e[0] : lo;
        hi = n > 0 && e[n - 1] > hi ? e[n - 1] : hi;
        for (int64_t i = n / 4; i + 1 < n; i += n / 3 > 0 ? n / 3 : 1)
            if (e[i + 1] > e[i])
                tols[nt++] = 0.5 * (e[i] + e[i + 1]);
    }
    tols[nt++] = 0.5 * lo;
    tols[nt++] = 2 * hi;
    return nt;
}

int pt_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
