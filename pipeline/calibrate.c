/*
 * calibrate.c — `kvq calibrate`: the pipeline driver (kvq/calibrate.h).
 *
 *   records    each stage's parameter record: canonical JSON, one key per line
 *   identity   path, size and mtime of the model and corpus files
 *   tokens     the corpus tokenized once, split into calibration and held-out sets
 *   stages     capture, moments, fit, heldout, profile: skip or run, then record
 *   summary    read back from the outputs
 *
 * The driver only sequences the public stage functions; it adds no numerics of its
 * own. It sits in calib/ for the build, but uses the stages above calib/ (cholesky,
 * kmeans, thresholds) as a client would.
 */
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
#include <unistd.h>

#include "kvq/artifact.h"
#include "kvq/corpus.h"
#include "kvq/kmeans.h"
#include "kvq/model.h"
#include "kvq/runtime.h"
#include "kvq/tokenizer.h"
#include "kvq/util.h"

#define CALIB_RECORD_VERSION 1
#define CALIB_IDENT_DEPTH 8 /* directory levels hashed into a file identity */

static const char *const stage_names[KVQ_CALIB_N_STAGES] = {"capture", "moments", "fit",
                                                            "heldout", "profile"};

const char *kvq_calibrate_stage_name(kvq_calibrate_stage s)
{
    return (unsigned)s < KVQ_CALIB_N_STAGES ? stage_names[s] : "unknown";
}

kvq_calibrate_params kvq_calibrate_params_default(void)
{
    kvq_calibrate_params p;
    memset(&p, 0, sizeof p);
    kvq_corpus_params_default(&p.corpus_params);
    p.seed = 1234;
    p.threads = 1;
    p.capture = kvq_capture_params_default();
    p.capture.seq_len = 512;
    p.capture.max_tokens = 16384;
    p.heldout_tokens = 2048;
    p.moments = kvq_moments_params_default();
    p.fit = kvq_fit_params_default();
    p.profile = 1;
    p.prof = kvq_profile_params_default();
    return p;
}

/* ==========================================================================
 * Parameter records: {"key": value, ...} with one key per line
 * ========================================================================== */

static void rec_begin(kvq_strbuf *b, kvq_calibrate_stage s)
{
    kvq_sb_printf(b, "{\n  \"stage\": \"%s\",\n  \"record\": %d,\n  \"tool\": \"kvq %s\"",
              stage_names[s], CALIB_RECORD_VERSION, kvq_version());
}
static void rec_str(kvq_strbuf *b, const char *key, const char *v)
{
    kvq_sb_printf(b, ",\n  \"%s\": ", key);
    if (v)
        kvq_sb_json_str(b, v);
    else
        kvq_sb_printf(b, "null");
}
static void rec_i64(kvq_strbuf *b, const char *key, int64_t v)
{
    kvq_sb_printf(b, ",\n  \"%s\": %" PRId64, key, v);
}
static void rec_u64(kvq_strbuf *b, const char *key, uint64_t v)
{
    kvq_sb_printf(b, ",\n  \"%s\": %" PRIu64, key, v);
}
static void rec_f64(kvq_strbuf *b, const char *key, double v)
{
    if (isfinite(v))
        kvq_sb_printf(b, ",\n  \"%s\": %.17g", key, v);
    else
        kvq_sb_printf(b, ",\n  \"%s\": \"%g\"", key, v);
}
static void rec_hex(kvq_strbuf *b, const char *key, uint64_t v)
{
    kvq_sb_printf(b, ",\n  \"%s\": \"%016" PRIx64 "\"", key, v);
}
/* A list of doubles, or the string "default" for NULL. */
static void rec_f64_list(kvq_strbuf *b, const char *key, const double *v, size_t n)
{
    if (!v) {
        rec_str(b, key, "default");
        return;
    }
    kvq_sb_printf(b, ",\n  \"%s\": [", key);
    for (size_t i = 0; i < n; i++)
        kvq_sb_printf(b, "%s%.17g", i ? ", " : "", v[i]);
    kvq_sb_printf(b, "]");
}
static void rec_i32_list(kvq_strbuf *b, const char *key, const int32_t *v, size_t n)
{
    if (!v) {
        rec_str(b, key, "all");
        return;
    }
    kvq_sb_printf(b, ",\n  \"%s\": [", key);
    for (size_t i = 0; i < n; i++)
        kvq_sb_printf(b, "%s%d", i ? ", " : "", (int)v[i]);
    kvq_sb_printf(b, "]");
}
static void rec_end(kvq_strbuf *b) { kvq_sb_printf(b, "\n}\n"); }

static uint64_t rec_hash(const kvq_strbuf *b) { return kvq_fnv1a64(b->s, b->len, KVQ_FNV1A64_INIT); }

/* Line `i` (0-based) of text, into out (cap bytes; "" past the end). */
static void text_line(const char *text, size_t i, char *out, size_t cap)
{
    const char *p = text;
    for (size_t k = 0; k < i && p; k++) {
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    out[0] = 0;
    if (!p || !*p)
        return;
    size_t n = strcspn(p, "\n");
    if (n >= cap)
        n = cap - 1;
    memcpy(out, p, n);
    out[n] = 0;
}

/* Splits a record line `  "key": value,` into key and value (trailing comma dropped). */
static void line_kv(char *line, const char **key, const char **value)
{
    char *s = line;
    while (*s == ' ')
        s++;
    char *colon = strstr(s, "\": ");
    *key = s;
    *value = "";
    if (*s == '"' && colon) {
        *colon = 0;
        *key = s + 1;
        *value = colon + 3;
    }
    size_t n = strlen(*value);
    if (n && (*value)[n - 1] == ',')
        ((char *)*value)[n - 1] = 0;
}

/* "KEY changed: OLD -> NEW" for the first line where old and new differ. */
static void record_diff(const char *old, const char *new_text, char *why, size_t cap)
{
    char a[256], b[256];
    for (size_t i = 0;; i++) {
        text_line(old, i, a, sizeof a);
        text_line(new_text, i, b, sizeof b);
        if (!a[0] && !b[0])
            break;
        if (strcmp(a, b) != 0) {
            const char *ka, *va, *kb, *vb;
            line_kv(a, &ka, &va);
            line_kv(b, &kb, &vb);
            if (!strcmp(ka, kb) && !strncmp(kb, "input.", 6))
                snprintf(why, cap, "its input %s changed", kb + 6);
            else if (!strcmp(ka, kb))
                snprintf(why, cap, "%s changed: %.60s -> %.60s", kb, va, vb);
            else
                snprintf(why, cap, "parameters changed (%.60s)", kb[0] ? kb : ka);
            return;
        }
    }
    snprintf(why, cap, "parameters changed");
}

/* ==========================================================================
 * File identity: path, type, size and mtime, recursively for directories
 * ========================================================================== */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static uint64_t ident_mix(uint64_t h, const void *data, size_t n) { return kvq_fnv1a64(data, n, h); }

/* Hashes what `path` is; unreadable entries hash as such (the caller checked that the
 * top-level path exists). */
static uint64_t ident_path(const char *path, int depth, uint64_t h)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return ident_mix(h, "?", 1);
    const int64_t v[4] = {(int64_t)(st.st_mode & S_IFMT), (int64_t)st.st_size,
                          (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
    h = ident_mix(h, v, sizeof v);
    if (!S_ISDIR(st.st_mode) || depth >= CALIB_IDENT_DEPTH)
        return h;
    DIR *d = opendir(path);
    if (!d)
        return ident_mix(h, "!", 1);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 32;
            char **nn = realloc(names, nc * sizeof *nn);
            if (!nn)
                break;
            names = nn;
            cap = nc;
        }
        if (!(names[n] = strdup(e->d_name)))
            break;
        n++;
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        h = ident_mix(h, names[i], strlen(names[i]) + 1);
        char *sub = kvq_path_join(path, names[i]);
        if (sub) {
            h = ident_path(sub, depth + 1, h);
            free(sub);
        }
        free(names[i]);
    }
    free(names);
    return h;
}

/* ==========================================================================
 * The run's context
 * ========================================================================== */

typedef struct calib_ctx {
    const kvq_calibrate_params *p;
    const char *model_path;
    const char *spec;               /* corpus spec */
    kvq_corpus *corpus;
    char *work;                     /* work directory */
    int created_work;               /* this run created it */
    int stage_done;                 /* some stage finished in this run */
    char *out_path[KVQ_CALIB_N_STAGES];    /* outputs */
    char *rec_path[KVQ_CALIB_N_STAGES];    /* parameter records */
    char *none_path;                /* heldout.none */
    kvq_strbuf rec[KVQ_CALIB_N_STAGES];   /* this run's records */
    int active[KVQ_CALIB_N_STAGES]; /* stage is part of this run */
    int32_t index[KVQ_CALIB_N_STAGES], count;
    kvq_calibrate_summary *sum;

    /* Opened and tokenized only when a capture stage has to run. */
    kvq_model *model;
    int tokenized;
    int32_t *ids;                   /* [n_ids] calibration then held-out tokens */
    size_t n_ids, cap_ids;
    int64_t *seqs;                  /* [n_seqs, 2] first index into ids, length */
    size_t n_seqs, cap_seqs;
    size_t n_cal_seqs;              /* the first n_cal_seqs sequences are calibration */
    int64_t n_cal_tokens, n_held_tokens;
    int phase;                      /* 0 calibration, 1 held-out, 2 done */
    kvq_corpus_stats stats;
} calib_ctx;

/* The capture directory the profile reads: heldout/ when it holds a capture. */
static const char *profile_capture(const calib_ctx *c)
{
    char *cj = kvq_path_join(c->out_path[KVQ_CALIB_HELDOUT], KVQ_CAPTURE_JSON);
    const int held = c->active[KVQ_CALIB_HELDOUT] && cj && access(cj, F_OK) == 0;
    free(cj);
    return held ? c->out_path[KVQ_CALIB_HELDOUT] : c->out_path[KVQ_CALIB_CAPTURE];
}

/* ==========================================================================
 * The records of this run
 * ========================================================================== */

static void rec_capture_common(calib_ctx *c, kvq_strbuf *b)
{
    const kvq_calibrate_params *p = c->p;
    const kvq_capture_params *cp = &p->capture;
    rec_str(b, "model", c->model_path);
    rec_hex(b, "model.identity", ident_path(c->model_path, 0, KVQ_FNV1A64_INIT));
    rec_str(b, "corpus", c->spec);
    uint64_t h = KVQ_FNV1A64_INIT;
    for (size_t i = 0; i < kvq_corpus_source_count(c->corpus); i++) {
        const kvq_corpus_source *s = kvq_corpus_source_at(c->corpus, i);
        if (s && s->path)
            h = ident_path(s->path, 0, ident_mix(h, s->path, strlen(s->path) + 1));
    }
    rec_hex(b, "corpus.identity", h);
    rec_u64(b, "corpus.uuid_lines", p->corpus_params.uuid_lines);
    rec_u64(b, "corpus.passkey_filler", p->corpus_params.passkey_filler);
    rec_u64(b, "corpus.kv_pairs", p->corpus_params.kv_pairs);
    rec_u64(b, "corpus.max_doc_bytes", p->corpus_params.max_doc_bytes);
    rec_u64(b, "seed", p->seed);
    rec_i64(b, "seq_len", cp->seq_len);
    rec_i64(b, "max_tokens", cp->max_tokens);
    rec_str(b, "dtype", kvq_dtype_name(cp->dtype));
    rec_i64(b, "values", cp->values);
    rec_i64(b, "queries", cp->n_queries);
    rec_i64(b, "chunk", cp->chunk);
    rec_i32_list(b, "layers", cp->layers, cp->n_layers);
}

static void rec_profile_params(kvq_strbuf *b, const kvq_profile_params *q)
{
    rec_u64(b, "knobs", q->knobs);
    rec_f64(b, "tolerance", q->tolerance);
    rec_f64(b, "prompt_fraction", q->prompt_fraction);
    rec_i64(b, "leankv.window", q->leankv.window);
    rec_i64(b, "leankv.k_high", q->leankv.k_high);
    rec_i64(b, "leankv.v_high", q->leankv.v_high);
    rec_i64(b, "leankv.k_low", q->leankv.k_low);
    rec_i64(b, "leankv.v_low", q->leankv.v_low);
    rec_f64_list(b, "alpha_h", q->alpha_h, q->n_alpha_h);
    rec_f64_list(b, "alpha_l", q->alpha_l, q->n_alpha_l);
    rec_i64(b, "pats_b_min", q->pats_b_min);
    rec_str(b, "pats_dtype", kvq_dtype_name(q->pats_dtype));
    rec_f64_list(b, "budgets", q->budgets, q->n_budgets);
    rec_f64_list(b, "taus", q->taus, q->n_taus);
    const kvq_retrieval_params *r = &q->retrieval;
    rec_i64(b, "retrieval.sink", r->sink);
    rec_i64(b, "retrieval.window", r->window);
    rec_i64(b, "retrieval.wrope_b", r->wrope_b);
    rec_str(b, "retrieval.positions", kvq_positions_name(r->positions));
    rec_i64(b, "retrieval.group", r->group);
    rec_i64(b, "retrieval.fier_group", r->fier_group);
    rec_i64(b, "retrieval.quest_page", r->quest_page);
    rec_str(b, "retrieval.cache", kvq_dtype_name(r->cache_dtype));
    rec_i64(b, "retrieval.max_tokens", r->max_tokens);
    rec_str(b, "retrieval.isa", kvq_isa_name(r->isa));
    rec_str(b, "ppl.model", q->model);
    rec_str(b, "ppl.corpus", q->corpus);
    rec_u64(b, "ppl.corpus_seed", q->corpus_seed);
    rec_i64(b, "ppl.seq_len", q->ppl_seq_len);
    rec_u64(b, "ppl.max_tokens", q->ppl_max_tokens);
}

static kvq_status build_records(calib_ctx *c, kvq_err *err)
{
    const kvq_calibrate_params *p = c->p;
    kvq_strbuf *b;

    b = &c->rec[KVQ_CALIB_CAPTURE];
    rec_begin(b, KVQ_CALIB_CAPTURE);
    rec_capture_common(c, b);
    rec_end(b);
    const uint64_t h_cap = rec_hash(b);

    b = &c->rec[KVQ_CALIB_MOMENTS];
    rec_begin(b, KVQ_CALIB_MOMENTS);
    rec_hex(b, "input.capture", h_cap);
    rec_str(b, "positions", kvq_positions_name(p->moments.positions));
    rec_i64(b, "wrope_b", p->moments.wrope_b);
    rec_i64(b, "wrope_w", p->moments.wrope_w);
    rec_f64(b, "eps0", p->moments.eps0);
    rec_f64(b, "eps_max", p->moments.eps_max);
    rec_str(b, "device", p->moments.device == KVQ_MOMENTS_CUDA ? "cuda" : "cpu");
    rec_end(b);
    const uint64_t h_mom = rec_hash(b);

    const kvq_fit_params *f = &p->fit;
    b = &c->rec[KVQ_CALIB_FIT];
    rec_begin(b, KVQ_CALIB_FIT);
    rec_hex(b, "input.capture", h_cap);
    rec_hex(b, "input.moments", h_mom);
    rec_str(b, "method", kvq_codebook_method_name(f->method));
    rec_i64(b, "codebook_size", f->codebook_size);
    rec_i64(b, "groups", f->groups);
    rec_i64(b, "iters", f->iters);
    rec_f64(b, "tol", f->tol);
    rec_u64(b, "seed", p->seed);
    rec_str(b, "init", kvq_kmeans_init_name(f->init));
    rec_str(b, "device", f->device == KVQ_KMEANS_DEVICE_CUDA ? "cuda"
                         : f->device == KVQ_KMEANS_DEVICE_AUTO ? "auto" : "cpu");
    rec_f64(b, "holdout", f->holdout);
    rec_i64(b, "reference", f->reference);
    rec_i32_list(b, "layers", f->layers, f->n_layers);
    rec_i64(b, "zstd_level", f->zstd_level);
    rec_end(b);
    const uint64_t h_fit = rec_hash(b);

    b = &c->rec[KVQ_CALIB_HELDOUT];
    rec_begin(b, KVQ_CALIB_HELDOUT);
    rec_capture_common(c, b);
    rec_i64(b, "heldout_tokens", p->heldout_tokens);
    rec_end(b);
    const uint64_t h_held = rec_hash(b);

    b = &c->rec[KVQ_CALIB_PROFILE];
    rec_begin(b, KVQ_CALIB_PROFILE);
    if (c->active[KVQ_CALIB_HELDOUT])
        rec_hex(b, "input.heldout", h_held);
    else
        rec_hex(b, "input.capture", h_cap);
    rec_hex(b, "input.fit", h_fit);
    rec_profile_params(b, &p->prof);
    rec_end(b);

    for (int s = 0; s < KVQ_CALIB_N_STAGES; s++)
        if (c->rec[s].oom)
            return kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory");
    return KVQ_OK;
}

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
    const int64_t held_max = c->p->profile ? c->p->heldout_tokens : 0;
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
    if (!c->model && (st = kvq_model_open(c->model_path, &mp, &c->model, err)))
        goto done;
    const kvq_model_config *cfg = kvq_model_config_get(c->model);
    const kvq_tokenizer *tok = kvq_model_tokenizer(c->model);
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
    const int64_t held = p->profile ? p->heldout_tokens : 0;
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
        unlink(c->none_path);
        return capture_set(c, 1, c->out_path[KVQ_CALIB_HELDOUT], err);
    }
    /* The corpus ended inside the calibration set: profile on the capture itself. */
    const char *note = "the corpus ended before any held-out token: the profile runs on the "
                       "calibration capture\n";
    kvq_log(&c->p->cb, KVQ_LOG_WARN, "calibrate: %.*s", (int)strlen(note) - 1, note);
    kvq_rmtree(c->out_path[KVQ_CALIB_HELDOUT]);
    st = write_text(c->none_path, note, strlen(note), err);
    return st;
}

static kvq_status run_stage(calib_ctx *c, kvq_calibrate_stage s, kvq_err *err)
{
    const kvq_calibrate_params *p = c->p;
    kvq_status st = KVQ_OK;
    switch (s) {
    case KVQ_CALIB_CAPTURE:
        if (!(st = need_tokens(c, err)) && !(st = need_work(c, err)))
            st = capture_set(c, 0, c->out_path[s], err);
        break;
    case KVQ_CALIB_MOMENTS:
        st = kvq_moments_compute(c->out_path[KVQ_CALIB_CAPTURE], c->out_path[s], 1, &p->moments,
                                 &p->cb, err);
        break;
    case KVQ_CALIB_FIT: {
        kvq_fit_params fp = p->fit;
        fp.seed = p->seed;
        fp.threads = p->threads;
        fp.overwrite = 1;
        fp.cb = p->cb;
        st = kvq_fit_run(c->out_path[KVQ_CALIB_CAPTURE], c->out_path[KVQ_CALIB_MOMENTS],
                         c->out_path[s], &fp, NULL, err);
        break;
    }
    case KVQ_CALIB_HELDOUT:
        if (!(st = need_tokens(c, err)) && !(st = need_work(c, err)))
            st = run_heldout(c, err);
        break;
    case KVQ_CALIB_PROFILE: {
        kvq_profile_params q = p->prof;
        q.threads = p->threads;
        q.cb = p->cb;
        kvq_profile_result *res = NULL;
        st = kvq_profile_run(profile_capture(c), c->out_path[KVQ_CALIB_FIT], c->out_path[s], 1,
                             &q, &res, err);
        kvq_profile_result_free(res);
        break;
    }
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
    if (p->on_stage) {
        p->on_stage(p->stage_user, &info);
        return;
    }
    if (ev == KVQ_CALIB_EVENT_DONE)
        kvq_log(&p->cb, KVQ_LOG_INFO, "calibrate: %s: done in %.1f s", stage_names[s], seconds);
    else
        kvq_log(&p->cb, KVQ_LOG_INFO, "calibrate: %s: %s (%s)", stage_names[s],
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

/* Skips or runs stage s. */
static kvq_status do_stage(calib_ctx *c, kvq_calibrate_stage s, kvq_err *err)
{
    const kvq_calibrate_params *p = c->p;
    kvq_status st = KVQ_OK;
    char why[256];
    uint8_t *old = NULL;
    size_t old_len = 0;
    const int have_out = output_exists(c, s);
    int have_rec = kvq_read_file(c->rec_path[s], &old, &old_len, NULL) == KVQ_OK;
    if (!p->force && have_out && have_rec && old_len == c->rec[s].len &&
        !memcmp(old, c->rec[s].s, old_len)) {
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
        record_diff((const char *)old, c->rec[s].s, why, sizeof why);
    report(c, s, KVQ_CALIB_EVENT_RUN, why, 0);
    if (have_rec && unlink(c->rec_path[s]) != 0) {
        st = kvq_err_set(err, KVQ_E_IO, "%s: cannot remove: %s", c->rec_path[s], strerror(errno));
        goto done;
    }
    remove_leftovers(c, s);
    const double t0 = kvq_now();
    if ((st = run_stage(c, s, err)))
        goto done;
    if ((st = write_text(c->rec_path[s], c->rec[s].s, c->rec[s].len, err)))
        goto done;
    c->stage_done = 1;
    c->sum->ran[s] = 1;
    c->sum->seconds[s] = kvq_now() - t0;
    report(c, s, KVQ_CALIB_EVENT_DONE, "", c->sum->seconds[s]);
done:
    free(old);
    return st;
}

/* ==========================================================================
 * Output and summary
 * ========================================================================== */

/* Refuses an out_path that exists and is not a .kvq artifact. */
static kvq_status check_out(const char *path, kvq_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return KVQ_OK;
    if (!S_ISREG(st.st_mode))
        return kvq_err_set(err, KVQ_E_EXISTS, "%s: exists and is not a file", path);
    uint8_t b[4] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(b, 1, 4, f) : 0;
    if (f)
        fclose(f);
    const uint32_t magic = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                           (uint32_t)b[3] << 24;
    if (n != 4 || magic != KVQ_ARTIFACT_SKIPPABLE_MAGIC)
        return kvq_err_set(err, KVQ_E_EXISTS, "%s: exists and is not a .kvq artifact; "
                           "calibrate does not replace it", path);
    return KVQ_OK;
}

/* Copies the final artifact to out_path unless it holds the same bytes already. */
static kvq_status publish(const char *from, const char *to, int *replaced, kvq_err *err)
{
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    kvq_status st = kvq_read_file(from, &a, &na, err);
    *replaced = 0;
    if (st)
        goto done;
    if (kvq_read_file(to, &b, &nb, NULL) == KVQ_OK && na == nb && !memcmp(a, b, na))
        goto done;
    kvq_atomic_file af;
    if ((st = kvq_atomic_open(to, 1, &af, err)))
        goto done;
    if (fwrite(a, 1, na, af.fp) != na) {
        kvq_atomic_abort(&af);
        st = kvq_err_set(err, KVQ_E_IO, "%s: write failed: %s", to, strerror(errno));
        goto done;
    }
    if (!(st = kvq_atomic_commit(&af, err)))
        *replaced = 1;
done:
    free(a);
    free(b);
    return st;
}

static double meta_f64(const kvq_st *st, const char *key)
{
    const char *v = kvq_st_meta_get(st, key);
    double x;
    return v && kvq_parse_f64(v, -INFINITY, INFINITY, &x, NULL) == KVQ_OK ? x : NAN;
}
static int64_t meta_i64(const kvq_st *st, const char *key, int64_t dflt)
{
    const char *v = kvq_st_meta_get(st, key);
    int64_t x;
    return v && kvq_parse_i64(v, INT64_MIN, INT64_MAX, &x, NULL) == KVQ_OK ? x : dflt;
}
static void meta_str(const kvq_st *st, const char *key, char *out, size_t cap)
{
    const char *v = kvq_st_meta_get(st, key);
    snprintf(out, cap, "%s", v ? v : "");
}

static void summary_reset(kvq_calibrate_summary *s)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < KVQ_CALIB_N_STAGES; i++)
        s->ran[i] = -1;
    s->codebook_size = s->groups = s->n_heads = -1;
    s->score_mse = s->score_mse_ref = s->score_power = NAN;
    s->tolerance = NAN;
    s->leankv_alpha_h = s->leankv_alpha_l = s->leankv_memory = s->leankv_err = NAN;
    s->pats_memory = s->pats_bits = s->pats_err = NAN;
    s->pats_b_min = s->pats_b_max = -1;
    s->budget_fraction = s->budget_attended = s->budget_err = NAN;
    s->mass_tau = s->mass_attended = s->mass_err = NAN;
    s->leankv_met = s->pats_met = s->budget_met = s->mass_met = -1;
}

static kvq_status read_summary(calib_ctx *c, const char *final, kvq_err *err)
{
    kvq_calibrate_summary *s = c->sum;
    kvq_capture_info *ci = NULL;
    kvq_artifact *a = NULL;
    int32_t *layers = NULL;
    size_t n_layers = 0;
    kvq_status st = kvq_capture_info_read(c->out_path[KVQ_CALIB_CAPTURE], &ci, err);
    if (st)
        goto done;
    s->n_tokens = ci->n_tokens;
    s->n_sequences = ci->n_sequences;
    kvq_capture_info_free(ci);
    ci = NULL;
    if (c->active[KVQ_CALIB_HELDOUT] &&
        profile_capture(c) == c->out_path[KVQ_CALIB_HELDOUT]) {
        if ((st = kvq_capture_info_read(c->out_path[KVQ_CALIB_HELDOUT], &ci, err)))
            goto done;
        s->n_heldout_tokens = ci->n_tokens;
        s->n_heldout_sequences = ci->n_sequences;
    }
    if ((st = kvq_artifact_open(final, &a, err)))
        goto done;
    const kvq_st *m = kvq_artifact_payload(a);
    meta_str(m, "fit.method", s->method, sizeof s->method);
    s->codebook_size = (int32_t)meta_i64(m, KVQ_META_CODEBOOK_SIZE, -1);
    s->groups = (int32_t)meta_i64(m, KVQ_META_GROUPS, -1);
    const int64_t n_kv = meta_i64(m, KVQ_META_N_KV_HEADS, -1);
    const int64_t n_l = meta_i64(m, KVQ_META_N_LAYERS, -1);
    const char *ls = kvq_st_meta_get(m, KVQ_META_LAYERS);
    if (n_kv > 0 && n_l > 0) {
        if (!ls)
            s->n_heads = (int32_t)(n_kv * n_l);
        else if (kvq_parse_index_list(ls, n_l, &layers, &n_layers, NULL) == KVQ_OK)
            s->n_heads = (int32_t)(n_kv * (int64_t)n_layers);
    }
    s->score_mse = meta_f64(m, "diag.fit.score_mse");
    s->score_mse_ref = meta_f64(m, "diag.fit.score_mse_ref");
    s->score_power = meta_f64(m, "diag.fit.score_power");

    s->profiled = kvq_st_meta_get(m, "thresholds.metric") != NULL;
    if (!s->profiled)
        goto done;
    meta_str(m, "thresholds.metric", s->metric, sizeof s->metric);
    s->tolerance = meta_f64(m, "thresholds.tolerance");
    s->leankv_met = (int)meta_i64(m, "thresholds.leankv.met", -1);
    s->leankv_alpha_h = meta_f64(m, "leankv.alpha_h");
    s->leankv_alpha_l = meta_f64(m, "leankv.alpha_l");
    s->leankv_memory = meta_f64(m, "diag.profile.leankv.memory");
    s->leankv_err = meta_f64(m, "diag.profile.leankv.err");
    s->pats_met = (int)meta_i64(m, "thresholds.pats.met", -1);
    meta_str(m, "pats.schedule", s->pats_schedule, sizeof s->pats_schedule);
    s->pats_b_min = (int32_t)meta_i64(m, "pats.b_min", -1);
    s->pats_b_max = (int32_t)meta_i64(m, "pats.b_max", -1);
    s->pats_memory = meta_f64(m, "diag.profile.pats.memory");
    s->pats_bits = meta_f64(m, "diag.profile.pats.bits");
    s->pats_err = meta_f64(m, "diag.profile.pats.err");
    s->budget_met = (int)meta_i64(m, "thresholds.budget.met", -1);
    s->budget_fraction = meta_f64(m, "budget.fraction");
    s->budget_attended = meta_f64(m, "diag.profile.budget.attended");
    s->budget_err = meta_f64(m, "diag.profile.budget.err");
    s->mass_met = (int)meta_i64(m, "thresholds.mass.met", -1);
    s->mass_tau = meta_f64(m, "mass.tau");
    s->mass_attended = meta_f64(m, "diag.profile.mass.attended");
    s->mass_err = meta_f64(m, "diag.profile.mass.err");
done:
    free(layers);
    kvq_artifact_close(a);
    kvq_capture_info_free(ci);
    return st;
}

/* ==========================================================================
 * The driver
 * ========================================================================== */

static kvq_status check_params(const kvq_calibrate_params *p, kvq_err *err)
{
    const char *bad = NULL;
    if (p->threads < 1)
        bad = "threads must be >= 1";
    else if (p->capture.seq_len < 2 || p->capture.seq_len > INT32_MAX)
        bad = "capture.seq_len must be in [2, 2^31)";
    else if (p->capture.max_tokens < 1 || p->capture.max_tokens > INT32_MAX)
        bad = "capture.max_tokens must be in [1, 2^31)";
    else if (p->heldout_tokens < 0 || p->heldout_tokens > INT32_MAX)
        bad = "heldout_tokens must be in [0, 2^31)";
    else if (p->profile && !p->capture.values)
        bad = "the profile needs captured values (capture.values = 1)";
    if (bad)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "calibrate: %s", bad);
    return kvq_moments_params_check(&p->moments, err);
}

static void ctx_free(calib_ctx *c)
{
    for (int s = 0; s < KVQ_CALIB_N_STAGES; s++) {
        free(c->out_path[s]);
        free(c->rec_path[s]);
        kvq_sb_free(&c->rec[s]);
    }
    free(c->none_path);
    free(c->work);
    free(c->ids);
    free(c->seqs);
    kvq_model_close(c->model);
    kvq_corpus_free(c->corpus);
}

kvq_status kvq_calibrate_run(const char *model_path, const char *out_path,
                             const kvq_calibrate_params *p_in, kvq_calibrate_summary *summary,
                             kvq_err *err)
{
    kvq_status st = KVQ_OK;
    calib_ctx c;
    kvq_calibrate_summary local;
    memset(&c, 0, sizeof c);
    kvq_calibrate_params p = p_in ? *p_in : kvq_calibrate_params_default();
    c.p = &p;
    c.model_path = model_path;
    c.sum = summary ? summary : &local;
    summary_reset(c.sum);
    if (!model_path || !out_path || !*model_path || !*out_path)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "calibrate: a model and an output are required");
    if ((st = check_params(&p, err)) || (st = check_out(out_path, err)))
        goto done;
    struct stat mst;
    if (stat(model_path, &mst) != 0) {
        st = kvq_err_set(err, errno == ENOENT ? KVQ_E_NOT_FOUND : KVQ_E_IO, "%s: %s", model_path,
                         strerror(errno));
        goto done;
    }
    c.spec = p.corpus ? p.corpus : KVQ_CALIBRATE_CORPUS;
    kvq_corpus_params cpar = p.corpus_params;
    cpar.seed = p.seed;
    p.corpus_params = cpar;
    if ((st = kvq_corpus_open(c.spec, &cpar, &c.corpus, err)))
        goto done;

    /* Paths. */
    if (p.work_dir) {
        c.work = strdup(p.work_dir);
    } else if ((c.work = malloc(strlen(out_path) + 6))) {
        sprintf(c.work, "%s.work", out_path);
    }
    static const char *const outs[KVQ_CALIB_N_STAGES] = {"capture", "moments.safetensors",
                                                          "fit.kvq", "heldout", "profile.kvq"};
    int oom = !c.work;
    for (int s = 0; s < KVQ_CALIB_N_STAGES && !oom; s++) {
        char rec[64];
        snprintf(rec, sizeof rec, "%s.params.json", stage_names[s]);
        c.out_path[s] = kvq_path_join(c.work, outs[s]);
        c.rec_path[s] = kvq_path_join(c.work, rec);
        oom = !c.out_path[s] || !c.rec_path[s];
    }
    if (oom || !(c.none_path = kvq_path_join(c.work, "heldout.none"))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory");
        goto done;
    }
    snprintf(c.sum->work_dir, sizeof c.sum->work_dir, "%s", c.work);

    /* The stages of this run, in order. */
    static const kvq_calibrate_stage order[KVQ_CALIB_N_STAGES] = {
        KVQ_CALIB_CAPTURE, KVQ_CALIB_MOMENTS, KVQ_CALIB_FIT, KVQ_CALIB_HELDOUT, KVQ_CALIB_PROFILE};
    c.active[KVQ_CALIB_CAPTURE] = c.active[KVQ_CALIB_MOMENTS] = c.active[KVQ_CALIB_FIT] = 1;
    c.active[KVQ_CALIB_HELDOUT] = p.profile && p.heldout_tokens > 0;
    c.active[KVQ_CALIB_PROFILE] = p.profile;
    for (int i = 0; i < KVQ_CALIB_N_STAGES; i++)
        if (c.active[order[i]])
            c.index[order[i]] = ++c.count;
    if ((st = build_records(&c, err)))
        goto done;

    for (int i = 0; i < KVQ_CALIB_N_STAGES; i++)
        if (c.active[order[i]] && (st = do_stage(&c, order[i], err)))
            goto done;

    const char *final = c.out_path[p.profile ? KVQ_CALIB_PROFILE : KVQ_CALIB_FIT];
    snprintf(c.sum->final_artifact, sizeof c.sum->final_artifact, "%s", final);
    if ((st = publish(final, out_path, &c.sum->out_replaced, err)))
        goto done;
    st = read_summary(&c, final, err);
done:
    /* A run that created the work directory and finished nothing leaves nothing. */
    if (st && c.created_work && !c.stage_done)
        rmdir(c.work);
    ctx_free(&c);
    return st;
}
