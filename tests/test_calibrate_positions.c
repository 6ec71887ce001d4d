/*
 * test_calibrate_positions.c — the positions stage of kvq calibrate: the rule
 * (kvq_calibrate_choose_positions) on figures written by hand, and a run on the real
 * test model whose recorded choice must keep the position mode within tolerance of
 * exact attention (stories260K: WRoPE is not, so it must get exact RoPE) and be what a
 * codebook set opened from the artifact reports (what kvq run / eval default to).
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

#include "helpers/testutil.h"
#include "kvq.h"
#include "kvq/artifact.h"
#include "kvq/calibrate.h"

/* The candidates with perplexities ppl[5] (NAN: not measured). */
static void cands(kvq_position_candidate c[KVQ_CALIB_POS_CANDIDATES], const double ppl[5])
{
    kvq_calibrate_position_candidates(c);
    for (int i = 0; i < KVQ_CALIB_POS_CANDIDATES; i++)
        c[i].ppl = ppl[i];
}

static void test_rule(void **state)
{
    (void)state;
    kvq_position_candidate c[KVQ_CALIB_POS_CANDIDATES];
    kvq_calibrate_position_candidates(c);
    assert_string_equal(c[0].name, "full-wrope");
    assert_int_equal(c[0].selector, KVQ_SELECT_FULL);
    assert_int_equal(c[0].positions, KVQ_POSITIONS_WROPE);
    /* SmolLM2's figures (docs/QUALITY.md): full under wrope +18%; even a wrope
     * codebook row that looked best must not be chosen */
    const double smol[5] = {16.5, 13.0, 15.26, 14.89, 14.59};
    cands(c, smol);
    int k = kvq_calibrate_choose_positions(13.98, 0.01, c, KVQ_CALIB_POS_CANDIDATES);
    assert_int_equal(c[k].positions, KVQ_POSITIONS_ROPE);
    assert_int_equal(c[k].score, KVQ_SCORE_BANDS);
    /* a mode that lowers the perplexity by more than the tolerance is no more exact */
    const double low[5] = {12.0, 13.9, 15.0, 14.0, 14.5};
    cands(c, low);
    k = kvq_calibrate_choose_positions(13.98, 0.01, c, KVQ_CALIB_POS_CANDIDATES);
    assert_int_equal(c[k].positions, KVQ_POSITIONS_ROPE);
    assert_int_equal(c[k].score, KVQ_SCORE_MEAN);
    /* within tolerance, WRoPE competes: the least change wins, below or above exact */
    const double ok[5] = {14.05, 13.95, 14.5, 14.2, 14.1};
    cands(c, ok);
    k = kvq_calibrate_choose_positions(13.98, 0.01, c, KVQ_CALIB_POS_CANDIDATES);
    assert_string_equal(c[k].name, "codebook-wrope-rb");
    /* not measured: not chosen; nothing measured: -1 */
    const double none[5] = {NAN, NAN, NAN, NAN, NAN};
    cands(c, none);
    assert_int_equal(kvq_calibrate_choose_positions(13.98, 0.01, c, KVQ_CALIB_POS_CANDIDATES), -1);
    const double one[5] = {NAN, 13.98, NAN, 20.0, NAN};
    cands(c, one);
    k = kvq_calibrate_choose_positions(13.98, 0.01, c, KVQ_CALIB_POS_CANDIDATES);
    assert_string_equal(c[k].name, "codebook-rope-mean"); /* wrope unmeasured: not admitted */
}

static double meta_num(const kvq_st *st, const char *key)
{
    const char *v = kvq_st_meta_get(st, key);
    return v ? atof(v) : NAN;
}

static void test_stage_on_model(void **state)
{
    (void)state;
    int stories;
    const char *model = test_real_model(&stories);
    if (!model)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    kvq_calibrate_params p = kvq_calibrate_params_default();
    p.work_dir = test_path("pos.work");
    p.capture.seq_len = stories ? 512 : 256; /* longer than sinks + window (4 + 64) */
    p.capture.max_tokens = stories ? 2048 : 512;
    p.heldout_tokens = stories ? 1024 : 256;
    p.positions_tokens = p.heldout_tokens;
    p.fit.codebook_size = 16;
    p.fit.iters = 2;
    p.profile = 0;
    kvq_calibrate_summary s;
    kvq_err e = {0};
    const char *out = test_path("pos.kvq");
    assert_int_equal(kvq_calibrate_run(model, out, &p, &s, &e), KVQ_OK);
    assert_int_equal(s.ran[KVQ_CALIB_POSITIONS], 1);

    kvq_artifact *a = NULL;
    assert_int_equal(kvq_artifact_open(out, &a, &e), KVQ_OK);
    const kvq_st *st = kvq_artifact_payload(a);
    const char *mode = kvq_st_meta_get(st, KVQ_META_POS_MODE);
    const char *score = kvq_st_meta_get(st, KVQ_META_POS_SCORE);
    assert_non_null(mode);
    assert_non_null(score);
    char key[96];
    snprintf(key, sizeof key, KVQ_META_POS_PPL, "full-wrope");
    const double exact = meta_num(st, KVQ_META_POS_PPL_EXACT);
    const double full_wrope = meta_num(st, key);
    assert_true(isfinite(exact) && isfinite(full_wrope));
    const double wrope_cost = fabs(full_wrope / exact - 1);
    /* the property: the recorded mode alone is within tolerance of exact attention */
    if (!strcmp(mode, "wrope"))
        assert_true(wrope_cost <= p.positions_tolerance);
    else
        assert_string_equal(mode, "rope");
    /* stories260K does not tolerate WRoPE (window 64 of 512-token sequences) */
    if (stories) {
        assert_true(wrope_cost > 0.05);
        assert_string_equal(mode, "rope");
    }
    /* the chosen codebook row is the least change among those measured under rope */
    const char *sc[3] = {"rb", "mean", "bands"};
    double best = INFINITY;
    for (int i = 0; i < 3; i++) {
        char name[48];
        snprintf(name, sizeof name, "codebook-rope-%s", sc[i]);
        snprintf(key, sizeof key, KVQ_META_POS_PPL, name);
        const double c = fabs(meta_num(st, key) / exact - 1);
        assert_true(isfinite(c));
        if (c < best)
            best = c;
    }
    if (!strcmp(mode, "rope")) {
        char name[48];
        snprintf(name, sizeof name, "codebook-rope-%s", score);
        snprintf(key, sizeof key, KVQ_META_POS_PPL, name);
        assert_true(fabs(meta_num(st, key) / exact - 1) == best);
    }
    assert_string_equal(s.positions, mode);
    assert_string_equal(s.score_pos, score);

    /* what kvq run / eval read from the artifact */
    kvq_model *m = NULL;
    kvq_model_params mp = kvq_model_params_default();
    assert_int_equal(kvq_model_open(model, &mp, &m, &e), KVQ_OK);
    kvq_model_id id;
    kvq_model_identity(m, &id);
    kvq_codebook_set *rt = NULL;
    assert_int_equal(kvq_codebook_set_open(out, &id, model, &rt, &e), KVQ_OK);
    kvq_positions pm = KVQ_POSITIONS_WROPE;
    kvq_score_pos ps = KVQ_SCORE_RB;
    assert_int_equal(kvq_codebook_set_positions(rt, &pm, &ps), 1);
    assert_string_equal(kvq_positions_name(pm), mode);
    assert_string_equal(kvq_score_pos_name(ps), score);
    kvq_codebook_set_close(rt);
    kvq_model_close(m);
    kvq_artifact_close(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule),
        cmocka_unit_test(test_stage_on_model),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    test_tmpdir_cleanup();
    return rc;
}
