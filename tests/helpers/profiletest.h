/*
 * profiletest.h — what the profile tests share (tests/test_profile_fast.c,
 * tests/test_profile_jobs.c): the SmolLM2 path, a small codebook fit of a capture, and
 * the selection rule of kvq/thresholds.h "Selection" written out on a budget or tau
 * table's every-row figures (the expected choice the sampled paths must make).
 */
#ifndef KVQ_TESTS_PROFILETEST_H
#define KVQ_TESTS_PROFILETEST_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/thresholds.h"

/* KVQ_SMOLLM2, else .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf; NULL when not
 * readable. */
const char *pt_smollm2_path(void);
/* Captures `model` over docs/design.md in the test directory under name: sequences of
 * seq_len, max_tokens, the given layers (NULL: all); fails the test on error. Returns
 * a static path (two slots, used in turn). */
const char *pt_capture(const char *model, const char *name, int64_t seq_len, int64_t max_tokens,
                       const int32_t *layers, size_t n_layers);
/* kvq_profile_capture of cap without an artifact; fails the test on error. */
kvq_profile_result *pt_profile(const char *cap, const kvq_profile_params *p);
/* Moments and a codebook artifact (K 16, 4 iterations: the selection, not its quality,
 * is under test) of the capture at cap, in the test directory under name (.kvq, and
 * name's moments next to it); fails the test on error. Returns a static path. */
const char *pt_fit_artifact(const char *cap, const char *name);
/* The budget and tau knobs of cap with the artifact art (reference: the every-row
 * reference path; sample rows; tolerance tol, < 0 the default; threads); both tables
 * must run (not skipped). */
kvq_profile_result *pt_profile_budget(const char *cap, const char *art, int reference,
                                      int64_t sample, double tol, int32_t threads);
/* Within tolerance the least memory (budget: the fraction; tau: the attended share,
 * then tau), ties the lower error, then the earlier row; none within: the lowest error,
 * ties less memory. */
int64_t pt_expected_budget_choice(const kvq_profile_table *t, double tol, int mass);
/* Tolerances for the budget and tau tables of every-row figures `all`: between
 * neighbouring errors of either table (a few), below all and above all. tols: room for
 * 40. Returns how many. */
int pt_budget_tolerances(const kvq_profile_result *all, double *tols);
/* qsort comparator of doubles, ascending. */
int pt_cmp_double(const void *a, const void *b);

#endif
