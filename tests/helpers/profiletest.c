/* profiletest.c — see profiletest.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "helpers/profiletest.h"
#include "helpers/testutil.h"
#include "kvq/fit.h"
#include "kvq/moments.h"

#define SMOLLM2_DEFAULT ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"

const char *pt_smollm2_path(void)
{
    const char *p = getenv("KVQ_SMOLLM2");
    if (!p || !*p)
        p = SMOLLM2_DEFAULT;
    return access(p, R_OK) == 0 ? p : NULL;
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

int pt_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
