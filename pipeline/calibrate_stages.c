/* calibrate_stages.c — the corpus tokenized once and cut into the calibration and
 * held-out sets, and the stages of `kvq calibrate` (capture, moments, fit, heldout,
 * profile): each skipped when up to date, else run through its public stage function. */
#include "kvq/calibrate.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvq/artifact.h"
#include "kvq/artifact_summary.h"
#include "kvq/corpus.h"
#include "kvq/kmeans.h"
#include "kvq/model.h"
#include "kvq/runtime.h"
#include "kvq/tokenizer.h"
#include "kvq/util.h"
#include "pipeline/calibrate_ctx.h"

/* ==========================================================================
 * Tokens: the corpus once, cut into the calibration and held-out sets
 * ========================================================================== */

static kvq_status push_seq(calib_ctx *c, const int32_t *ids, uint32_t n, kvq_err *err)
{
    if (c->n_ids + n > c->cap_ids) {
        size_t cap = c->cap_ids ? c->cap_ids : 4096;
        while (cap < c->n_ids + n)
            cap *= 2;
        int32_t *v = realloc(c->ids, cap * sizeof *v);
        if (!v)
            return kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory (token ids)");
        c->ids = v;
        c->cap_ids = cap;
    }
    if (c->n_seqs == c->cap_seqs) {
        size_t cap = c->cap_seqs ? c->cap_seqs * 2 : 64;
        int64_t *v = realloc(c->seqs, cap * 2 * sizeof *v);
        if (!v)
            return kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory (sequences)");
        c->seqs = v;
        c->cap_seqs = cap;
    }
    memcpy(c->ids + c->n_ids, ids, (size_t)n * sizeof *ids);
    c->seqs[2 * c->n_seqs] = (int64_t)c->n_ids;
    c->seqs[2 * c->n_seqs + 1] = n;
    c->n_seqs++;
    c->n_ids += n;
    return KVQ_OK;
}

/* Takes up to `limit` tokens (0 = all) of seq into the current set; a cut leaving
 * fewer than 2 tokens drops them (a sequence needs one prediction). Returns the
 * tokens consumed from the set's budget. */
static kvq_status take(calib_ctx *c, const kvq_corpus_seq *seq, int64_t limit, int64_t *used,
                       kvq_err *err)
{
    int64_t n = seq->n;
    if (limit > 0 && n > limit)
        n = limit;
    *used = n;
    return n >= 2 ? push_seq(c, seq->ids, (uint32_t)n, err) : KVQ_OK;
}

static kvq_status on_seq(void *user, const kvq_corpus_seq *seq, kvq_err *err)
{
    calib_ctx *c = user;
    const int64_t cal_max = c->p->capture.max_tokens;
    const int64_t held_max = c->p->profile || c->p->positions ? c->p->heldout_tokens : 0;
    int64_t used = 0;
    kvq_status st = KVQ_OK;
    if (c->phase == 0) {
        if ((st = take(c, seq, cal_max - c->n_cal_tokens, &used, err)))
            return st;
        c->n_cal_tokens += used;
        c->n_cal_seqs = c->n_seqs;
        if (c->n_cal_tokens >= cal_max)
            c->phase = held_max > 0 ? 1 : 2;
    } else if (c->phase == 1) {
        if ((st = take(c, seq, held_max - c->n_held_tokens, &used, err)))
            return st;
        c->n_held_tokens += used;
        if (c->n_held_tokens >= held_max)
            c->phase = 2;
    }
    /* Enough tokens: stop reading the corpus (KVQ_E_CANCELLED with phase 2 is "done"). */
    return c->phase == 2 ? KVQ_E_CANCELLED : KVQ_OK;
}

/* A corpus that ended inside the calibration set leaves no held-out tokens: then its
 * last whole sequences are held out instead, up to heldout_tokens and at most an eighth
 * of the tokens (CALIB_HELDOUT_SHARE), keeping one calibration sequence at least, so the
 * profile never measures on what the codebooks were fitted to. */
static void hold_out_share(calib_ctx *c, int64_t held)
{
    if (held <= 0 || c->n_seqs > c->n_cal_seqs || c->n_cal_seqs < 2)
        return;
    const int64_t target = c->n_cal_tokens / CALIB_HELDOUT_SHARE < held
                               ? c->n_cal_tokens / CALIB_HELDOUT_SHARE : held;
    size_t k = c->n_cal_seqs;
    int64_t moved = 0;
    while (k > 1 && moved < target && moved + c->seqs[2 * (k - 1) + 1] <= target)
        moved += c->seqs[2 * --k + 1];
    if (k == c->n_cal_seqs)
        return;
    kvq_log(&c->p->cb, KVQ_LOG_INFO, "calibrate: the corpus '%s' ended before any held-out "
            "token: its last %zu sequences (%" PRId64 " tokens) are held out instead", c->spec,
            c->n_cal_seqs - k, moved);
    c->n_cal_seqs = k;
    c->n_cal_tokens -= moved;
    c->n_held_tokens = moved;
}

/* Opens the model and tokenizes the corpus, once per run. */
static kvq_status need_tokens(calib_ctx *c, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_tokenizer *own = NULL;
    if (c->tokenized)
        return KVQ_OK;
    const kvq_calibrate_params *p = c->p;
    kvq_model_params mp = kvq_model_params_default();
    mp.cb = p->cb;
    mp.accept_approx_tokenizer = p->accept_approx_tokenizer;
    if (!c->model && (st = kvq_model_open(c->model_path, &mp, &c->model, err)))
        goto done;
    const kvq_model_config *cfg = kvq_model_config_get(c->model);
    const kvq_tokenizer *tok = kvq_model_tokenizer(c->model);
    if (!tok && (st = kvq_corpus_check_no_tokenizer(c->corpus, c->model_path, err)))
        goto done;
    if (!tok) {
        if ((st = kvq_tokenizer_new_ids((uint32_t)cfg->vocab_size, cfg->bos_id, cfg->eos_id,
                                        &own, err)))
            goto done;
        tok = own;
    }
    kvq_seq_params sp;
    kvq_seq_params_default(&sp);
    sp.seq_len = (uint32_t)p->capture.seq_len;
    sp.add_bos = kvq_tokenizer_add_bos(tok) && kvq_tokenizer_bos(tok) >= 0; /* the model says */
    sp.sep = sp.add_bos ? KVQ_DOC_SEP_BOS
                        : kvq_tokenizer_eos(tok) >= 0 ? KVQ_DOC_SEP_EOS : KVQ_DOC_SEP_NONE;
    /* The calibration set, the rest of its last sequence, and the held-out set. */
    const int64_t held = p->profile || p->positions ? p->heldout_tokens : 0;
    sp.max_tokens = (uint64_t)p->capture.max_tokens + (held ? (uint64_t)(p->capture.seq_len + held) : 0);
    c->phase = 0;
    st = kvq_corpus_tokenize(c->corpus, tok, &sp, &p->cb, on_seq, c, &c->stats, err);
    if (st == KVQ_E_CANCELLED && c->phase == 2)
        st = KVQ_OK;
    if (st)
        goto done;
    if (c->n_cal_seqs == 0) {
        st = kvq_err_set(err, KVQ_E_INVALID_ARG, "corpus '%s' gave no sequence of 2 tokens or more",
                         c->spec);
        goto done;
    }
    hold_out_share(c, held);
    kvq_log(&p->cb, KVQ_LOG_INFO,
            "calibrate: corpus %s: %" PRIu64 " documents, %" PRId64 " calibration tokens in %zu "
            "sequences, %" PRId64 " held-out tokens in %zu", c->spec, c->stats.n_docs,
            c->n_cal_tokens, c->n_cal_seqs, c->n_held_tokens, c->n_seqs - c->n_cal_seqs);
    c->tokenized = 1;
done:
    kvq_tokenizer_free(own);
    return st;
}

/* Creates the work directory (and its parents' last level only) when missing. */
static kvq_status need_work(calib_ctx *c, kvq_err *err)
{
    struct stat st;
    if (stat(c->work, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return kvq_err_set(err, KVQ_E_EXISTS, "%s: exists and is not a directory", c->work);
        return KVQ_OK;
    }
    if (mkdir(c->work, 0777) != 0)
        return kvq_err_set(err, KVQ_E_IO, "%s: cannot create the work directory: %s", c->work,
                           strerror(errno));
    c->created_work = 1;
    return KVQ_OK;
}

/* ==========================================================================
 * Stages
 * ========================================================================== */

static kvq_status capture_set(calib_ctx *c, int held, const char *dir, kvq_err *err)
{
    const kvq_calibrate_params *p = c->p;
    const size_t s0 = held ? c->n_cal_seqs : 0, s1 = held ? c->n_seqs : c->n_cal_seqs;
    const int64_t first = s1 > s0 ? c->seqs[2 * s0] : 0;
    const int64_t n_tok = s1 > s0 ? c->seqs[2 * (s1 - 1)] + c->seqs[2 * (s1 - 1) + 1] - first : 0;
    int64_t *seqs = malloc((s1 - s0 + 1) * 2 * sizeof *seqs); // [s1 - s0, 2]
    if (!seqs)
        return kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory");
    for (size_t i = s0; i < s1; i++) {
        seqs[2 * (i - s0)] = c->seqs[2 * i] - first;
        seqs[2 * (i - s0) + 1] = c->seqs[2 * i + 1];
    }
    kvq_capture_params cp = p->capture;
    cp.seed = p->seed;
    cp.threads = p->threads;
    cp.overwrite = 1;
    cp.cb = p->cb;
    cp.dist = p->dist;
    const kvq_capture_corpus corpus = {c->spec, p->seed, c->stats.hash, (int64_t)c->stats.n_docs};
    kvq_status st = kvq_capture_tokens(c->model, c->ids + first, n_tok, seqs, (int64_t)(s1 - s0),
                                       &corpus, &cp, dir, err);
    free(seqs);
    return st;
}

/* Writes `text` to path atomically (replacing it). */
static kvq_status write_text(const char *path, const char *text, size_t len, kvq_err *err)
{
    kvq_atomic_file af;
    kvq_status st = kvq_atomic_open(path, 1, &af, err);
    if (st)
        return st;
    if (fwrite(text, 1, len, af.fp) != len) {
        kvq_atomic_abort(&af);
        return kvq_err_set(err, KVQ_E_IO, "%s: write failed: %s", path, strerror(errno));
    }
    return kvq_atomic_commit(&af, err);
}

static kvq_status run_heldout(calib_ctx *c, kvq_err *err)
{
    kvq_status st;
    if (c->n_seqs > c->n_cal_seqs) {
        if (kvq_dist_rank(c->p->dist) == 0)
            unlink(c->none_path);
        return capture_set(c, 1, c->out_path[KVQ_CALIB_HELDOUT], err);
    }
    if (kvq_dist_rank(c->p->dist) != 0) /* rank 0 writes the note */
        return kvq_dist_share(c->p->dist, KVQ_OK, err);
    /* The corpus ended inside the calibration set: profile on the capture itself. */
    const char *note = "the corpus ended before any held-out token: the profile runs on the "
                       "calibration capture\n";
    kvq_log(&c->p->cb, KVQ_LOG_WARN, "calibrate: %.*s", (int)strlen(note) - 1, note);
    const char *held = c->out_path[KVQ_CALIB_HELDOUT];
    if (access(held, F_OK) == 0) {
        if ((st = kvq_capture_dir_check_own(held, err)))
            return st;
        if (!kvq_capture_dir_is_capture(held))
            return kvq_err_set(err, KVQ_E_EXISTS, "%s: exists and is not a kvq capture "
                               "directory; calibrate removes only what it made", held);
        kvq_rmtree(held);
    }
    st = write_text(c->none_path, note, strlen(note), err);
    return kvq_dist_share(c->p->dist, st, err);
}

static kvq_status run_stage(calib_ctx *c, kvq_calibrate_stage s, kvq_err *err)
{
    const kvq_calibrate_params *p = c->p;
    kvq_status st = KVQ_OK;
    const int rank0 = kvq_dist_rank(p->dist) == 0;
    switch (s) {
    case KVQ_CALIB_CAPTURE:
        /* Every rank tokenizes (each captures its share); rank 0 makes the directory. */
        if (!(st = need_tokens(c, err)) && rank0)
            st = need_work(c, err);
        if (!(st = kvq_dist_agree(p->dist, st, err)))
            st = capture_set(c, 0, c->out_path[s], err);
        break;
    case KVQ_CALIB_MOMENTS:
        if (!rank0) /* rank 0 alone */
            return kvq_dist_share(p->dist, KVQ_OK, err);
        st = kvq_moments_compute(c->out_path[KVQ_CALIB_CAPTURE], c->out_path[s], 1, &p->moments,
                                 &p->cb, err);
        st = kvq_dist_share(p->dist, st, err);
        break;
    case KVQ_CALIB_FIT: {
        kvq_fit_params fp = p->fit;
        fp.seed = p->seed;
        fp.threads = p->threads;
        fp.overwrite = 1;
        fp.cb = p->cb;
        fp.dist = p->dist;
        st = kvq_fit_run(c->out_path[KVQ_CALIB_CAPTURE], c->out_path[KVQ_CALIB_MOMENTS],
                         c->out_path[s], &fp, NULL, err);
        break;
    }
    case KVQ_CALIB_HELDOUT:
        if (!(st = need_tokens(c, err)) && rank0)
            st = need_work(c, err);
        if (!(st = kvq_dist_agree(p->dist, st, err)))
            st = run_heldout(c, err);
        break;
    case KVQ_CALIB_PROFILE: {
        /* every rank: the LeanKV/PATS grid is split by layers, rank 0 writes */
        kvq_profile_params q = p->prof;
        q.threads = p->threads;
        q.cb = p->cb;
        q.dist = p->dist;
        kvq_profile_result *res = NULL;
        st = kvq_profile_run(calib_profile_capture(c), c->out_path[KVQ_CALIB_FIT], c->out_path[s], 1,
                             &q, &res, err);
        kvq_profile_result_free(res);
        break;
    }
    case KVQ_CALIB_POSITIONS:
        if (!rank0) /* rank 0 alone */
            return kvq_dist_share(p->dist, KVQ_OK, err);
        if (!(st = need_tokens(c, err)))
            st = calib_run_positions(c, c->out_path[p->profile ? KVQ_CALIB_PROFILE : KVQ_CALIB_FIT],
                                     c->out_path[s], err);
        st = kvq_dist_share(p->dist, st, err);
        break;
    }
    return st;
}

/* Does the stage's output exist? */
static int output_exists(const calib_ctx *c, kvq_calibrate_stage s)
{
    if (s == KVQ_CALIB_CAPTURE || s == KVQ_CALIB_HELDOUT) {
        char *cj = kvq_path_join(c->out_path[s], KVQ_CAPTURE_JSON);
        int ok = cj && access(cj, F_OK) == 0;
        free(cj);
        return ok || (s == KVQ_CALIB_HELDOUT && access(c->none_path, F_OK) == 0);
    }
    return access(c->out_path[s], F_OK) == 0;
}

static void describe(const calib_ctx *c, kvq_calibrate_stage s, char *buf, size_t cap)
{
    const kvq_calibrate_params *p = c->p;
    char k[32];
    switch (s) {
    case KVQ_CALIB_CAPTURE:
        snprintf(buf, cap, "pre-RoPE Q, K, V of %s over %" PRId64 " tokens of '%s' (sequences "
                 "of %" PRId64 ")", c->model_path, p->capture.max_tokens, c->spec,
                 p->capture.seq_len);
        break;
    case KVQ_CALIB_MOMENTS:
        snprintf(buf, cap, "query second moments H and Cholesky factors (positions %s, b %" PRId64
                 ")", kvq_positions_name(p->moments.positions), p->moments.wrope_b);
        break;
    case KVQ_CALIB_FIT:
        if (p->fit.codebook_size)
            snprintf(k, sizeof k, "%d", (int)p->fit.codebook_size);
        else
            snprintf(k, sizeof k, "auto");
        snprintf(buf, cap, "%s codebooks per layer and KV head: K %s, %d iterations, init %s",
                 kvq_codebook_method_name(p->fit.method), k, (int)p->fit.iters,
                 kvq_kmeans_init_name(p->fit.init));
        break;
    case KVQ_CALIB_HELDOUT:
        snprintf(buf, cap, "held-out capture: the %" PRId64 " tokens after the calibration set",
                 p->heldout_tokens);
        break;
    case KVQ_CALIB_PROFILE:
        snprintf(buf, cap, "LeanKV, PATS, budget and mass profiles on the %s capture",
                 c->active[KVQ_CALIB_HELDOUT] ? "held-out" : "calibration");
        break;
    case KVQ_CALIB_POSITIONS:
        snprintf(buf, cap, "position mode and scoring query measured on %" PRId64 " held-out "
                 "tokens (tolerance %g%%)", p->positions_tokens, 100 * p->positions_tolerance);
        break;
    }
}

static void report(const calib_ctx *c, kvq_calibrate_stage s, kvq_calibrate_event ev,
                   const char *why, double seconds)
{
    char what[512];
    describe(c, s, what, sizeof what);
    const kvq_calibrate_stage_info info = {s, ev, c->index[s], c->count, c->out_path[s], what,
                                           why, seconds};
    const kvq_calibrate_params *p = c->p;
    if (kvq_dist_rank(p->dist) != 0) /* rank 0 speaks for the group */
        return;
    if (p->on_stage) {
        p->on_stage(p->stage_user, &info);
        return;
    }
    if (ev == KVQ_CALIB_EVENT_DONE)
        kvq_log(&p->cb, KVQ_LOG_INFO, "calibrate: %s: done in %.1f s", kvq_calibrate_stage_name(s), seconds);
    else
        kvq_log(&p->cb, KVQ_LOG_INFO, "calibrate: %s: %s (%s)", kvq_calibrate_stage_name(s),
                ev == KVQ_CALIB_EVENT_SKIP ? "skipped" : "running", why);
}

/* Removes what a killed run of stage s left in the work directory: temporaries
 * "NAME.tmp.*" of its output and of its record (the stages write through
 * kvq_atomic_open / kvq_tmpdir_create, which a killed process cannot clean up). */
static void remove_leftovers(const calib_ctx *c, kvq_calibrate_stage s)
{
    const char *names[2] = {strrchr(c->out_path[s], '/'), strrchr(c->rec_path[s], '/')};
    DIR *d = opendir(c->work);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        for (int i = 0; i < 2; i++) {
            const size_t n = strlen(names[i] + 1);
            if (!strncmp(e->d_name, names[i] + 1, n) && !strncmp(e->d_name + n, ".tmp.", 5)) {
                char *path = kvq_path_join(c->work, e->d_name);
                if (path)
                    kvq_rmtree(path);
                free(path);
            }
        }
    }
    closedir(d);
}

/* ---- the run record STAGE.run.json (docs/outputs.md), for people and
 * `python -m kvq report`: the wall time, end (UTC) and command line of the run that
 * made the stage's output. Never compared: a stage is skipped on its parameters alone. */
static char *run_record_path(const calib_ctx *c, kvq_calibrate_stage s)
{
    const char *rec = c->rec_path[s], *suffix = ".params.json";
    const size_t n = strlen(rec), k = strlen(suffix);
    char *out = malloc(n + 16);
    if (out)
        snprintf(out, n + 16, "%.*s.run.json", (int)(n >= k ? n - k : n), rec);
    return out;
}

static kvq_status write_run_record(const calib_ctx *c, kvq_calibrate_stage s, double seconds,
                                   kvq_err *err)
{
    char cmd[4096], when[32] = "";
    kvq_self_command(cmd, sizeof cmd);
    const time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    kvq_strbuf b = {0};
    kvq_sb_printf(&b, "{\n  \"stage\": \"%s\",\n  \"seconds\": %.6f,\n  \"finished\": \"%s\",\n"
                  "  \"command\": ", kvq_calibrate_stage_name(s), seconds, when);
    kvq_sb_json_str(&b, cmd);
    kvq_sb_printf(&b, "\n}\n");
    char *path = run_record_path(c, s);
    kvq_status st = !path || b.oom ? kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory")
                                   : write_text(path, b.s, b.len, err);
    free(path);
    kvq_sb_free(&b);
    return st;
}

/* Removes a stage's run record before it runs again. */
static void remove_run_record(const calib_ctx *c, kvq_calibrate_stage s)
{
    char *path = run_record_path(c, s);
    if (path)
        unlink(path);
    free(path);
}

/* Skips or runs stage s. */
kvq_status calib_do_stage(calib_ctx *c, kvq_calibrate_stage s, kvq_err *err)
{
    const kvq_calibrate_params *p = c->p;
    kvq_status st = KVQ_OK;
    char why[256];
    uint8_t *old = NULL;
    size_t old_len = 0;
    const int have_out = output_exists(c, s);
    int have_rec = kvq_read_file(c->rec_path[s], &old, &old_len, NULL) == KVQ_OK;
    int skip = !p->force && have_out && have_rec && old_len == c->rec[s].len &&
               !memcmp(old, c->rec[s].s, old_len);
    /* With several ranks, rank 0's view of the work directory decides. */
    if ((st = kvq_dist_bcast(p->dist, &skip, sizeof skip, err)))
        goto done;
    const int rank0 = kvq_dist_rank(p->dist) == 0;
    if (skip) {
        c->sum->ran[s] = 0;
        report(c, s, KVQ_CALIB_EVENT_SKIP, "up to date", 0);
        goto done;
    }
    if (p->force)
        snprintf(why, sizeof why, "forced");
    else if (!have_out)
        snprintf(why, sizeof why, "no previous output");
    else if (!have_rec)
        snprintf(why, sizeof why, "no parameter record (interrupted?)");
    else
        calib_record_diff((const char *)old, c->rec[s].s, why, sizeof why);
    report(c, s, KVQ_CALIB_EVENT_RUN, why, 0);
    if (rank0 && have_rec && unlink(c->rec_path[s]) != 0)
        st = kvq_err_set(err, KVQ_E_IO, "%s: cannot remove: %s", c->rec_path[s], strerror(errno));
    if ((st = kvq_dist_share(p->dist, st, err)))
        goto done;
    if (rank0) {
        remove_leftovers(c, s);
        remove_run_record(c, s);
    }
    const double t0 = kvq_now();
    if ((st = run_stage(c, s, err)))
        goto done;
    const double seconds = kvq_now() - t0;
    if (rank0 && !(st = write_run_record(c, s, seconds, err)))
        st = write_text(c->rec_path[s], c->rec[s].s, c->rec[s].len, err);
    if ((st = kvq_dist_share(p->dist, st, err)))
        goto done;
    c->stage_done = 1;
    c->sum->ran[s] = 1;
    c->sum->seconds[s] = seconds;
    report(c, s, KVQ_CALIB_EVENT_DONE, "", c->sum->seconds[s]);
done:
    free(old);
    return st;
}
