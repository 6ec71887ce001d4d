/*
 * profiletest.h — what the profile tests share (tests/test_profile_fast.c,
 * tests/test_profile_jobs.c): the SmolLM2 path, a small codebook fit of a capture, and
 * the selection rule of kvq/thresholds.h "Selection" written out on a budget or tau
 * table's every-row figures (the expected choice the sampled paths must make).
 */
#ifndef KVQ_TESTS_PROFILETEST_H
#define KVQ_TESTS_PROFILETEST_H

#include <stdint.h>

#include "kvq/thresholds.h"

/* KVQ_SMOLLM2, else .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf; NULL when not
 * readable. */
const char *pt_smollm2_path(void);
/* Moments and a codebook artifact (K 16, 4 iterations: the selection, not its quality,
 * is under test) of the capture at cap, in the test directory under name (.kvq, and
 * name's moments next to it); fails the test on error. Returns a static path. */
const char *pt_fit_artifact(const char *cap, const char *name);
/* Within tolerance the least memory (budget: the fraction; tau: the attended share,
 * then tau), ties the lower error, then the earlier row; none within: the lowest error,
 * ties less memory. */
int64_t pt_expected_budget_choice(const kvq_profile_table *t, double tol, int mass);
/* qsort comparator of doubles, ascending. */
int pt_cmp_double(const void *a, const void *b);

#endif
