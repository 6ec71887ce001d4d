/* test_calibrate.c — the pipeline driver (kvq/calibrate.h): defaults, the checks made
 * before anything is created (exact statuses, nothing left behind), the stage events
 * of a first run, a resumed run and a changed parameter, the summary read back from
 * the outputs, and a corpus too short for a held-out set. The real-model tests use
 * small settings and skip when the model is absent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers/testutil.h"
#include "kvq.h"
#include "kvq/calibrate.h"

/* ======================================================================================
 * Helpers
 * ====================================================================================== */

/* Every stage event of a run, in order. */
typedef struct events {
    int n;
    kvq_calibrate_stage stage[32];
    kvq_calibrate_event event[32];
    int32_t index[32], count[32];
    char why[32][160];
} events;

static void record(void *user, const kvq_calibrate_stage_info *s)
{
    events *e = user;
    if (e->n >= 32)
        return;
    e->stage[e->n] = s->stage;
    e->event[e->n] = s->event;
    e->index[e->n] = s->index;
    e->count[e->n] = s->count;
    snprintf(e->why[e->n], sizeof e->why[e->n], "%s", s->why);
    e->n++;
}

/* The event of stage s that is not DONE (SKIP or RUN), or -1; why into *why. */
static int event_of(const events *e, kvq_calibrate_stage s, const char **why)
{
    for (int i = 0; i < e->n; i++)
        if (e->stage[i] == s && e->event[i] != KVQ_CALIB_EVENT_DONE) {
            if (why)
                *why = e->why[i];
            return (int)e->event[i];
        }
    return -1;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* Small settings: 512 calibration tokens in sequences of 64, K 8, 2 iterations. */
static kvq_calibrate_params small_params(const char *work, events *ev)
{
    kvq_calibrate_params p = kvq_calibrate_params_default();
    p.work_dir = work;
    p.capture.seq_len = 64;
    p.capture.max_tokens = 512;
    p.heldout_tokens = 128;
    p.fit.codebook_size = 8;
    p.fit.iters = 2;
    p.prof.knobs = KVQ_KNOB_LEANKV;
    static const double ah[] = {0, 2}, al[] = {0, 0.05};
    p.prof.alpha_h = ah;
    p.prof.n_alpha_h = 2;
    p.prof.alpha_l = al;
    p.prof.n_alpha_l = 2;
    p.prof.leankv.window = 16;
    p.positions = 0; /* the positions stage: tests/test_calibrate_positions.c */
    p.on_stage = record;
    p.stage_user = ev;
    return p;
}

/* ======================================================================================
 * Tests
 * ====================================================================================== */

static void test_defaults(void **state)
{
    (void)state;
    const kvq_calibrate_params p = kvq_calibrate_params_default();
    assert_int_equal(p.capture.seq_len, 512);
    assert_int_equal(p.capture.max_tokens, 16384);
    assert_int_equal(p.heldout_tokens, 2048);
    assert_int_equal(p.seed, 1234);
    assert_int_equal(p.threads, 1);
    assert_int_equal(p.profile, 1);
    assert_int_equal(p.capture.values, 1);
    assert_int_equal(p.fit.method, KVQ_CODEBOOK_QAVQ);
    assert_null(p.corpus);
    assert_null(p.work_dir);
    assert_string_equal(kvq_calibrate_stage_name(KVQ_CALIB_CAPTURE), "capture");
    assert_string_equal(kvq_calibrate_stage_name(KVQ_CALIB_HELDOUT), "heldout");
    assert_string_equal(kvq_calibrate_stage_name(KVQ_CALIB_PROFILE), "profile");
    assert_string_equal(kvq_calibrate_stage_name(KVQ_CALIB_POSITIONS), "positions");
    assert_string_equal(kvq_calibrate_stage_name((kvq_calibrate_stage)9), "unknown");
}

/* Each check fails with its status and creates neither the output nor the work dir. */
static void test_checks_before_anything(void **state)
{
    (void)state;
    const char *model = test_model_path();
    const char *some_model = model ? model : test_path("absent.gguf");
    const char *out = test_path("chk.kvq");
    const char *work = test_path("chk.kvq.work");
    kvq_err e = {0};
    kvq_calibrate_params p = kvq_calibrate_params_default();

    p.threads = 0;
    assert_int_equal(kvq_calibrate_run(some_model, out, &p, NULL, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "threads"));
    p = kvq_calibrate_params_default();
    p.capture.values = 0;
    assert_int_equal(kvq_calibrate_run(some_model, out, &p, NULL, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "values"));
    p = kvq_calibrate_params_default();
    p.capture.max_tokens = 0;
    assert_int_equal(kvq_calibrate_run(some_model, out, &p, NULL, &e), KVQ_E_INVALID_ARG);
    p = kvq_calibrate_params_default();
    assert_int_equal(kvq_calibrate_run(NULL, out, &p, NULL, &e), KVQ_E_INVALID_ARG);

    /* An output that is a directory, or a file that is not an artifact, is never replaced. */
    const char *dir_out = test_path("adir");
    assert_int_equal(mkdir(dir_out, 0777), 0);
    assert_int_equal(kvq_calibrate_run(some_model, dir_out, &p, NULL, &e), KVQ_E_EXISTS);
    const char *txt = test_path("notes.txt");
    assert_int_equal(test_write_file(txt, "hello", 5), 0);
    assert_int_equal(kvq_calibrate_run(some_model, txt, &p, NULL, &e), KVQ_E_EXISTS);
    assert_non_null(strstr(e.msg, "is not a .kvq artifact"));
    struct stat st;
    assert_int_equal(stat(txt, &st), 0);
    assert_int_equal(st.st_size, 5);

    assert_int_equal(kvq_calibrate_run(test_path("absent.gguf"), out, &p, NULL, &e),
                     KVQ_E_NOT_FOUND);
    assert_non_null(strstr(e.msg, "absent.gguf"));
    if (model) {
        p.corpus = "uuid:0";
        assert_int_equal(kvq_calibrate_run(model, out, &p, NULL, &e), KVQ_E_INVALID_ARG);
        p.corpus = test_path("no-such-corpus.txt");
        assert_int_equal(kvq_calibrate_run(model, out, &p, NULL, &e), KVQ_E_NOT_FOUND);
        /* An empty corpus fails at tokenization, before the work directory exists. */
        const char *empty = test_path("empty.txt");
        assert_int_equal(test_write_file(empty, "", 0), 0);
        p.corpus = empty;
        assert_int_equal(kvq_calibrate_run(model, out, &p, NULL, &e), KVQ_E_INVALID_ARG);
        assert_non_null(strstr(e.msg, "contains no text"));
    }
    assert_false(exists(out));
    assert_false(exists(work));
    assert_false(exists(test_path("notes.txt.work")));
}

static void test_stages_resume_and_summary(void **state)
{
    (void)state;
    int stories;
    const char *model = test_real_model(&stories);
    if (!model)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    char work[1024], out[1024], out2[1024];
    snprintf(work, sizeof work, "%s", test_path("run.work"));
    snprintf(out, sizeof out, "%s", test_path("run.kvq"));
    snprintf(out2, sizeof out2, "%s", test_path("run2.kvq"));
    events ev = {0};
    kvq_calibrate_summary s;
    kvq_err e = {0};

    /* First run: five stages run, in pipeline order, numbered 1..5. */
    kvq_calibrate_params p = small_params(work, &ev);
    assert_int_equal(kvq_calibrate_run(model, out, &p, &s, &e), KVQ_OK);
    assert_int_equal(ev.n, 10);
    static const kvq_calibrate_stage order[5] = {KVQ_CALIB_CAPTURE, KVQ_CALIB_MOMENTS,
                                                 KVQ_CALIB_FIT, KVQ_CALIB_HELDOUT,
                                                 KVQ_CALIB_PROFILE};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(ev.stage[2 * i], order[i]);
        assert_int_equal(ev.event[2 * i], KVQ_CALIB_EVENT_RUN);
        assert_string_equal(ev.why[2 * i], "no previous output");
        assert_int_equal(ev.event[2 * i + 1], KVQ_CALIB_EVENT_DONE);
        assert_int_equal(ev.index[2 * i], i + 1);
        assert_int_equal(ev.count[2 * i], 5);
        assert_int_equal(s.ran[order[i]], 1);
    }
    assert_int_equal(s.out_replaced, 1);
    assert_int_equal(s.n_tokens, 512);
    assert_int_equal(s.n_sequences, 8);
    assert_int_equal(s.n_heldout_tokens, 128);
    assert_int_equal(s.n_heldout_sequences, 2);
    assert_string_equal(s.method, "qavq");
    assert_int_equal(s.codebook_size, 8);
    assert_int_equal(s.groups, 1);
    /* stories260K: 5 layers x 4 KV heads; SmolLM2: 30 x 3 (testutil.h) */
    const int n_heads = stories ? 20 : 90;
    assert_int_equal(s.n_heads, n_heads);
    assert_true(s.score_mse > 0 && s.score_mse_ref > 0 && s.score_power > 0);
    assert_int_equal(s.profiled, 1);
    assert_string_equal(s.metric, "attn_rel_err");
    assert_true(s.leankv_met == 0 || s.leankv_met == 1);
    assert_true(s.leankv_alpha_h == 0 || s.leankv_alpha_h == 2);
    assert_int_equal(s.pats_met, -1); /* not profiled */
    assert_true(isnan(s.budget_fraction));
    assert_true(exists(out));

    /* Again: everything skipped; the output holds the same bytes already. */
    memset(&ev, 0, sizeof ev);
    assert_int_equal(kvq_calibrate_run(model, out, &p, &s, &e), KVQ_OK);
    assert_int_equal(ev.n, 5);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(ev.event[i], KVQ_CALIB_EVENT_SKIP);
        assert_string_equal(ev.why[i], "up to date");
        assert_int_equal(s.ran[order[i]], 0);
    }
    assert_int_equal(s.out_replaced, 0);
    assert_int_equal(s.n_heads, n_heads);

    /* A moments parameter: capture and heldout skipped; moments, fit, profile rerun. */
    memset(&ev, 0, sizeof ev);
    p.moments.eps0 = 1e-5;
    const char *why = NULL;
    assert_int_equal(kvq_calibrate_run(model, out2, &p, &s, &e), KVQ_OK);
    assert_int_equal(event_of(&ev, KVQ_CALIB_CAPTURE, NULL), KVQ_CALIB_EVENT_SKIP);
    assert_int_equal(event_of(&ev, KVQ_CALIB_HELDOUT, NULL), KVQ_CALIB_EVENT_SKIP);
    assert_int_equal(event_of(&ev, KVQ_CALIB_MOMENTS, &why), KVQ_CALIB_EVENT_RUN);
    assert_string_equal(why, "eps0 changed: 9.9999999999999995e-07 -> 1.0000000000000001e-05");
    assert_int_equal(event_of(&ev, KVQ_CALIB_FIT, &why), KVQ_CALIB_EVENT_RUN);
    assert_string_equal(why, "its input moments changed");
    assert_int_equal(event_of(&ev, KVQ_CALIB_PROFILE, &why), KVQ_CALIB_EVENT_RUN);
    assert_string_equal(why, "its input fit changed");
    assert_int_equal(s.out_replaced, 1);

    /* Threads are not part of any record. */
    memset(&ev, 0, sizeof ev);
    p.threads = 2;
    assert_int_equal(kvq_calibrate_run(model, out2, &p, &s, &e), KVQ_OK);
    for (int i = 0; i < 5; i++)
        assert_int_equal(s.ran[order[i]], 0);

    /* The codebook selector's stages are: the budget profile measures with them (a work
     * directory profiled under another default is profiled again), nothing before it. */
    memset(&ev, 0, sizeof ev);
    p.prof.retrieval.rerank_extra = 0.1;
    assert_int_equal(kvq_calibrate_run(model, out2, &p, &s, &e), KVQ_OK);
    assert_int_equal(event_of(&ev, KVQ_CALIB_FIT, NULL), KVQ_CALIB_EVENT_SKIP);
    assert_int_equal(event_of(&ev, KVQ_CALIB_PROFILE, &why), KVQ_CALIB_EVENT_RUN);
    assert_string_equal(why, "retrieval.rerank_extra changed: 0.080000000000000002 -> 0.10000000000000001");
    p.prof.retrieval.rerank_extra = 0.08;

    /* A run killed inside the profile: no record, temporaries left behind. Only the
     * profile reruns, and its leftovers (only its own) are removed first. */
    char path[1100], tmp_rec[1100], other[1100];
    snprintf(path, sizeof path, "%s/profile.params.json", work);
    assert_int_equal(unlink(path), 0);
    snprintf(path, sizeof path, "%s/profile.kvq.tmp.abc123", work);
    snprintf(tmp_rec, sizeof tmp_rec, "%s/profile.params.json.tmp.x", work);
    snprintf(other, sizeof other, "%s/keep.tmp.1", work);
    assert_int_equal(test_write_file(path, "x", 1), 0);
    assert_int_equal(test_write_file(tmp_rec, "x", 1), 0);
    assert_int_equal(test_write_file(other, "x", 1), 0);
    memset(&ev, 0, sizeof ev);
    assert_int_equal(kvq_calibrate_run(model, out2, &p, &s, &e), KVQ_OK);
    assert_int_equal(event_of(&ev, KVQ_CALIB_PROFILE, &why), KVQ_CALIB_EVENT_RUN);
    assert_string_equal(why, "no parameter record (interrupted?)");
    for (int i = 0; i < 4; i++)
        assert_int_equal(s.ran[order[i]], 0);
    assert_int_equal(s.out_replaced, 0); /* the same bytes as before */
    assert_false(exists(path));
    assert_false(exists(tmp_rec));
    assert_true(exists(other));

    /* No profile: three stages, the output is the fit artifact. */
    memset(&ev, 0, sizeof ev);
    p.profile = 0;
    assert_int_equal(kvq_calibrate_run(model, test_path("fit-only.kvq"), &p, &s, &e), KVQ_OK);
    assert_int_equal(ev.n, 3);
    assert_int_equal(ev.count[0], 3);
    assert_int_equal(s.ran[KVQ_CALIB_HELDOUT], -1);
    assert_int_equal(s.ran[KVQ_CALIB_PROFILE], -1);
    assert_int_equal(s.profiled, 0);
    assert_int_equal(s.leankv_met, -1);
}

/* A corpus that ends inside the calibration set: a warning, a note instead of the
 * held-out capture, and the profile on the calibration capture. */
static int n_warn;
static void count_warn(void *user, kvq_log_level level, const char *msg)
{
    (void)user;
    if (level == KVQ_LOG_WARN && strstr(msg, "ended before any held-out token"))
        n_warn++;
}

static void test_short_corpus_profiles_on_capture(void **state)
{
    (void)state;
    int stories;
    const char *model = test_real_model(&stories);
    if (!model)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    char work[1024];
    snprintf(work, sizeof work, "%s", test_path("short.work"));
    events ev = {0};
    kvq_calibrate_summary s;
    kvq_err e = {0};
    kvq_calibrate_params p = small_params(work, &ev);
    p.corpus = "kv-recall:1"; /* about 700 tokens */
    p.capture.max_tokens = 4096;
    p.cb.log = count_warn;
    /* Sequences of 64: the corpus's last sequences are held out (at most an eighth of
     * its tokens), no warning, and the profile runs on them (issue 30 item 14). */
    n_warn = 0;
    assert_int_equal(kvq_calibrate_run(model, test_path("share.kvq"), &p, &s, &e), KVQ_OK);
    assert_int_equal(n_warn, 0);
    assert_true(s.n_heldout_tokens > 0 && 8 * s.n_heldout_tokens <= s.n_tokens + s.n_heldout_tokens);
    assert_true(s.n_tokens + s.n_heldout_tokens > 500 && s.n_tokens + s.n_heldout_tokens < 1000);
    assert_int_equal(s.profiled, 1);
    /* One sequence of it all: nothing to hold out; the profile runs on the capture, with
     * a warning and a note. */
    snprintf(work, sizeof work, "%s", test_path("short1.work"));
    p.work_dir = work;
    p.capture.seq_len = 1024;
    n_warn = 0;
    assert_int_equal(kvq_calibrate_run(model, test_path("short.kvq"), &p, &s, &e), KVQ_OK);
    assert_int_equal(n_warn, 1);
    assert_true(s.n_tokens > 500 && s.n_tokens < 1000);
    assert_int_equal(s.n_heldout_tokens, 0);
    assert_int_equal(s.profiled, 1);
    char note[1100];
    snprintf(note, sizeof note, "%s/heldout.none", work);
    assert_true(exists(note));
    /* Resumable like any other stage. */
    memset(&ev, 0, sizeof ev);
    assert_int_equal(kvq_calibrate_run(model, test_path("short.kvq"), &p, &s, &e), KVQ_OK);
    assert_int_equal(s.ran[KVQ_CALIB_HELDOUT], 0);
    assert_int_equal(s.ran[KVQ_CALIB_PROFILE], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_checks_before_anything),
        cmocka_unit_test(test_stages_resume_and_summary),
        cmocka_unit_test(test_short_corpus_profiles_on_capture),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    test_tmpdir_cleanup();
    return rc;
}
