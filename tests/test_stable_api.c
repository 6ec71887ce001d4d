/*
 * test_stable_api.c — the stable tier (docs/api.md) used alone: this file undefines
 * KVQ_UNSTABLE_API (which the Makefile defines for tests) before <kvq.h>, so it compiles
 * only if evaluation and calibration need nothing beyond the stable headers.
 *
 *   kvq_eval_files   on the committed stand-in model (tests/data/tiny_spm.gguf): the
 *                    reference is full attention over the last 8 predictions of each
 *                    32-token sequence, checked against llama.cpp's loss of the same
 *                    positions (tests/data/tiny_spm_nll.json, llama-cpp-python); with
 *                    4 sinks and a window of 4 every row has retrieval steps, `full`
 *                    reads the whole cache (kv_read 1), both attend oracle's top-K;
 *                    bad lists are refused with the harness's messages.
 *   kvq_calibrate_files  a capture + fit with K = 8 on the stand-in: the artifact opens
 *                    through the stable accessors with one [8, head_dim 8] codebook per
 *                    (layer, KV head) of the model (4 x 2, scripts/gen_tiny_spm.py).
 */
#undef KVQ_UNSTABLE_API
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/testutil.h"
#include "kvq.h"

#define TINY "tests/data/tiny_spm.gguf"
static const char story[] = "Once upon a time, there was a little girl named Lily. She loved to "
                            "play outside in the park. One day, she saw a big, red ball. She "
                            "wanted to\n";

/* llama.cpp's summed NLL and predictions of the last 8 of each 32-token sequence. */
static void llama_last8(double *nll, int *predicted)
{
    FILE *f = fopen("tests/data/tiny_spm_nll.json", "rb");
    assert_non_null(f);
    char buf[4096];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *l = cJSON_GetObjectItem(j, "seq_len_32_last_8");
    assert_non_null(l);
    *nll = cJSON_GetObjectItem(l, "nll")->valuedouble;
    *predicted = cJSON_GetObjectItem(l, "predicted")->valueint;
    cJSON_Delete(j);
}

static void test_eval_files_reference(void **state)
{
    (void)state;
    char spec[1100];
    assert_int_equal(test_write_file(test_path("story.txt"), story, strlen(story)), 0);
    snprintf(spec, sizeof spec, "file:%s", test_path("story.txt"));
    kvq_eval_options o = {.selectors = "full,oracle", .budgets = "4", .seq_len = 32,
                          .score_last = 8, .threads = 1, .window = 4};
    kvq_eval_report *r = malloc(sizeof *r);
    kvq_err e = {0};
    assert_int_equal(kvq_eval_files(TINY, NULL, spec, &o, r, &e), KVQ_OK);
    double nll;
    int predicted;
    llama_last8(&nll, &predicted);
    assert_int_equal(r->predicted, (uint64_t)predicted);
    assert_true(fabs(r->nll - nll) < fmax(2e-4, 2e-5 * nll));
    assert_true(fabs(r->perplexity - exp(r->nll)) < 1e-9 * r->perplexity);
    assert_int_equal(r->n_rows, 2);
    assert_string_equal(r->rows[0].selector, "full");
    assert_string_equal(r->rows[0].budget, "all");
    assert_string_equal(r->rows[1].selector, "oracle");
    assert_string_equal(r->rows[1].budget, "4");
    for (int i = 0; i < 2; i++) {
        assert_true(r->rows[i].steps > 0);
        assert_true(r->rows[i].metric[KVQ_EVAL_RECALL_TOPK] == 1.0);
    }
    assert_true(fabs(r->rows[0].metric[KVQ_EVAL_KV_READ] - 1.0) < 1e-9);
    assert_true(r->rows[1].metric[KVQ_EVAL_KV_READ] < 1.0);
    assert_string_equal(kvq_eval_metric_get(KVQ_EVAL_KV_READ)->key, "kv_read_fraction");
    free(r);
}

static void test_eval_files_bad_lists(void **state)
{
    (void)state;
    kvq_eval_report *r = malloc(sizeof *r);
    kvq_err e = {0};
    kvq_eval_options o = {.selectors = "full,nope", .seq_len = 32};
    assert_int_equal(kvq_eval_files(TINY, NULL, "uuid:1", &o, r, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "nope"));
    o.selectors = "codebook";
    assert_int_equal(kvq_eval_files(TINY, NULL, "uuid:1", &o, r, &e), KVQ_E_INVALID_ARG);
    assert_string_equal(e.msg, "the codebook selector needs --artifact");
    o.selectors = "oracle";
    o.budgets = "0";
    assert_int_equal(kvq_eval_files(TINY, NULL, "uuid:1", &o, r, &e), KVQ_E_INVALID_ARG);
    free(r);
}

static void test_calibrate_files(void **state)
{
    (void)state;
    const char *out = test_path("tiny.kvq");
    kvq_calibrate_options o = {.corpus = "uuid:4", .seq_len = 64, .max_tokens = 256,
                               .codebook_size = 8, .iters = 2, .no_profile = 1,
                               .no_positions = 1, .threads = 1};
    kvq_calibrate_summary sum;
    kvq_err e = {0};
    assert_int_equal(kvq_calibrate_files(TINY, out, &o, &sum, &e), KVQ_OK);
    assert_int_equal(sum.codebook_size, 8);
    assert_int_equal(sum.n_tokens, 256);
    assert_int_equal(sum.n_heads, 4 * 2);
    kvq_artifact *a = NULL;
    assert_int_equal(kvq_artifact_open(out, &a, &e), KVQ_OK);
    assert_string_equal(kvq_artifact_meta_get(a, "codebook_size"), "8");
    for (int l = 0; l < 4; l++)
        for (int h = 0; h < 2; h++) {
            kvq_artifact_tensor t;
            assert_int_equal(kvq_artifact_codebook(a, l, h, -1, &t, &e), KVQ_OK);
            assert_string_equal(t.dtype, "F32");
            assert_int_equal(t.ndim, 2);
            assert_int_equal(t.shape[0], 8);
            assert_int_equal(t.shape[1], 8);
            assert_int_equal(t.nbytes, 8 * 8 * 4);
        }
    kvq_artifact_tensor t;
    assert_int_equal(kvq_artifact_codebook(a, 4, 0, -1, &t, &e), KVQ_E_NOT_FOUND);
    kvq_artifact_close(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eval_files_reference),
        cmocka_unit_test(test_eval_files_bad_lists),
        cmocka_unit_test(test_calibrate_files),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    test_tmpdir_cleanup();
    return rc;
}
