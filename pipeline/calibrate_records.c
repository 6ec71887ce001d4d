/* calibrate_records.c — the parameter record of each `kvq calibrate` stage (canonical
 * JSON, one key per line; a stage whose record and output are unchanged is skipped)
 * and the identity (path, size, mtime) of the model and corpus files in it. */
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
#include "kvq/artifact_summary.h"
#include "kvq/corpus.h"
#include "kvq/kmeans.h"
#include "kvq/model.h"
#include "kvq/runtime.h"
#include "kvq/tokenizer.h"
#include "kvq/util.h"
#include "pipeline/calibrate_ctx.h"

/* ==========================================================================
 * Parameter records: {"key": value, ...} with one key per line
 * ========================================================================== */

static void rec_begin(kvq_strbuf *b, kvq_calibrate_stage s)
{
    kvq_sb_printf(b, "{\n  \"stage\": \"%s\",\n  \"record\": %d,\n  \"tool\": \"kvq %s\"",
              kvq_calibrate_stage_name(s), CALIB_RECORD_VERSION, kvq_version());
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
void calib_record_diff(const char *old, const char *new_text, char *why, size_t cap)
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

/* The codebook selector's stages (kvq/runtime.h), which the budget profile and the
 * positions stage measure with: a work directory made under other ones (another default)
 * is measured again. */
static void rec_selector_stages(kvq_strbuf *b, const kvq_retrieval_params *r)
{
    rec_str(b, "retrieval.score_pos", kvq_score_pos_name(r->score_pos));
    rec_f64(b, "retrieval.rerank", r->rerank);
    rec_f64(b, "retrieval.rerank_extra", r->rerank_extra);
    rec_i64(b, "retrieval.resid_bits", r->resid_bits);
    rec_f64(b, "retrieval.resid_wide", r->resid_wide);
    rec_i64(b, "retrieval.resid_group", r->resid_group);
    rec_f64(b, "retrieval.resid_share", r->resid_share);
    rec_i64(b, "retrieval.code_order", r->code_order);
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
    rec_i64(b, "sample_rows", q->sample_rows);
    rec_f64(b, "sample_jobs", q->sample_jobs);
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
    rec_selector_stages(b, r);
    rec_str(b, "ppl.model", q->model);
    rec_str(b, "ppl.corpus", q->corpus);
    rec_u64(b, "ppl.corpus_seed", q->corpus_seed);
    rec_i64(b, "ppl.seq_len", q->ppl_seq_len);
    rec_u64(b, "ppl.max_tokens", q->ppl_max_tokens);
}

kvq_status calib_build_records(calib_ctx *c, kvq_err *err)
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
    const uint64_t h_prof = rec_hash(b);

    b = &c->rec[KVQ_CALIB_POSITIONS];
    rec_begin(b, KVQ_CALIB_POSITIONS);
    rec_capture_common(c, b); /* the tokens it measures on */
    rec_i64(b, "heldout_tokens", p->heldout_tokens);
    if (p->profile)
        rec_hex(b, "input.profile", h_prof);
    else
        rec_hex(b, "input.fit", h_fit);
    rec_i64(b, "positions_tokens", p->positions_tokens);
    rec_f64(b, "positions_tolerance", p->positions_tolerance);
    rec_i64(b, "candidates", KVQ_CALIB_POS_CANDIDATES);
    rec_str(b, "rule", "least |ppl / ppl_exact - 1|");
    const kvq_retrieval_params def = kvq_retrieval_params_default(); /* what it measures with */
    rec_selector_stages(b, &def);
    rec_end(b);

    for (int s = 0; s < KVQ_CALIB_N_STAGES; s++)
        if (c->rec[s].oom)
            return kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory");
    return KVQ_OK;
}
