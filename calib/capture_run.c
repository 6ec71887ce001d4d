/* capture_run.c — capture from a model: the forward pass with an observer that feeds a
 * capture writer (kvq_capture_tokens), and from a corpus spec (kvq_capture_run)
 * (kvq/capture.h, docs/capture.md). The writer is in capture.c. */
#include "kvq/capture.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "kvq/corpus.h"
#include "kvq/util.h"

#include "calib/capture_internal.h"

#define MIB (1024.0 * 1024.0)

/* ======================================================================================
 * Capture from a model
 * ====================================================================================== */

kvq_capture_params kvq_capture_params_default(void)
{
    kvq_capture_params p;
    memset(&p, 0, sizeof p);
    p.seq_len = 256;
    p.dtype = KVQ_DT_F16;
    p.values = 1;
    p.chunk = 256;
    return p;
}

typedef struct cap_run {
    kvq_capture_writer *w;
    const kvq_callbacks *cb;
    int32_t last_layer;       /* progress is reported after this layer's chunks */
    uint64_t done, total;     /* tokens through the last layer */
    int observer_failed;      /* the error came from the writer (message complete) */
} cap_run;

static kvq_status cap_observe(void *user, const kvq_attn_call *c, kvq_err *err)
{
    cap_run *r = user;
    kvq_status st = kvq_capture_writer_append(r->w, c->layer, c->n, c->q, c->k, c->v, err);
    if (st) {
        r->observer_failed = 1;
        return st;
    }
    if (c->layer == r->last_layer) {
        r->done += (uint64_t)c->n;
        if (kvq_progress(r->cb, "capture", r->done, r->total)) {
            r->observer_failed = 1;
            return kvq_err_set(err, KVQ_E_CANCELLED, "capture cancelled");
        }
    }
    return KVQ_OK;
}

/* Bytes of one layer file (approximate header) for the disk estimate. */
static double layer_file_bytes(const kvq_model_id *m, int64_t nt, int64_t nq, kvq_dtype dt,
                               int values)
{
    double es = (double)kvq_dtype_size(dt), d = m->head_dim;
    return (double)nt * m->n_kv_heads * d * es * (values ? 2 : 1) +
           (double)nq * m->n_heads * d * es + 4.0 * ((double)nq + 3.0 * (double)nt) +
           8.0 * m->n_heads * (d * d + 1) + 2048.0;
}

/* Free bytes on the file system that will hold dir, or -1 when unknown. */
static double free_bytes_for(const char *dir)
{
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/')
        parent[--n] = 0;
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == parent)
        parent[1] = 0;
    else
        *slash = 0;
    struct statvfs sv;
    if (statvfs(parent, &sv) != 0)
        return -1;
    return (double)sv.f_bavail * (double)sv.f_frsize;
}

void capture_set_corpus(kvq_capture_info *ci, const kvq_capture_corpus *corpus,
                        const int32_t *tokens, int64_t n_tokens)
{
    memset(ci->corpus_spec, 0, sizeof ci->corpus_spec);
    ci->corpus_seed = 0;
    ci->n_documents = 0;
    if (corpus) {
        /* provenance without local paths: file and directory names only */
        kvq_spec_redact_paths(corpus->spec ? corpus->spec : "", ci->corpus_spec,
                              sizeof ci->corpus_spec);
        ci->corpus_seed = corpus->seed;
        snprintf(ci->corpus_hash, sizeof ci->corpus_hash, "%016" PRIx64, corpus->hash);
        ci->n_documents = corpus->n_documents;
    } else {
        snprintf(ci->corpus_hash, sizeof ci->corpus_hash, "%016" PRIx64,
                 kvq_fnv1a64(tokens, (size_t)n_tokens * sizeof *tokens, KVQ_FNV1A64_INIT));
    }
}

/* The capture description of a run: model, corpus, dtype, sequences and layers (every
 * layer of the model when p names none; *all_layers then owns that list). */
static kvq_status capture_describe(const kvq_model *m, const int32_t *tokens, int64_t n_tokens,
                                   const int64_t *sequences, int64_t n_sequences,
                                   const kvq_capture_corpus *corpus,
                                   const kvq_capture_params *p, const char *dir,
                                   kvq_capture_info *ci, int32_t **all_layers, kvq_err *err)
{
    const kvq_model_config *cfg = kvq_model_config_get(m);
    memset(ci, 0, sizeof *ci);
    kvq_model_identity(m, &ci->model);
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    if (tok && kvq_tokenizer_approx(tok))
        snprintf(ci->tokenizer_approx, sizeof ci->tokenizer_approx, "%s",
                 kvq_tokenizer_approx(tok));
    capture_set_corpus(ci, corpus, tokens, n_tokens);
    ci->dtype = p->dtype;
    ci->seq_len = p->seq_len;
    ci->n_tokens = n_tokens;
    ci->n_sequences = n_sequences;
    ci->sequences = (int64_t *)sequences;
    ci->n_queries = p->n_queries;
    ci->has_values = p->values != 0;
    if (p->layers && p->n_layers) {
        if (p->n_layers > (size_t)cfg->n_layers)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: %zu layers asked for, the model has %d",
                               dir, p->n_layers, cfg->n_layers);
        ci->layers = (int32_t *)p->layers;
        ci->n_files = (int32_t)p->n_layers;
    } else {
        if (!(*all_layers = malloc((size_t)cfg->n_layers * sizeof **all_layers)))
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        for (int32_t l = 0; l < cfg->n_layers; l++)
            (*all_layers)[l] = l;
        ci->layers = *all_layers;
        ci->n_files = cfg->n_layers;
    }
    return KVQ_OK;
}

/* Says up front what the run needs: memory, disk, and a warning when the disk that will
 * hold dir has too little free. */
static void capture_log_needs(const kvq_model *m, const kvq_forward_params *fp,
                              const kvq_capture_info *ci, const kvq_capture_params *p,
                              int64_t longest, const char *dir)
{
    const kvq_model_config *cfg = kvq_model_config_get(m);
    const kvq_callbacks *cb = &p->cb;
    const int64_t n_tokens = ci->n_tokens, n_sequences = ci->n_sequences;
    kvq_model_memory mm;
    kvq_model_memory_estimate(m, fp, longest, &mm);
    int64_t nq = p->n_queries > 0 && p->n_queries < n_tokens ? p->n_queries : n_tokens;
    double mom = 2.0 * ci->n_files * cfg->n_heads * (double)cfg->head_dim * cfg->head_dim * 8;
    double cap_mem = mom + 4.0 * (double)(n_tokens + nq) + 16.0 * n_sequences +
                     (double)p->chunk * cfg->n_heads * cfg->head_dim * 4 + COPY_CHUNK;
    double layer = layer_file_bytes(&ci->model, n_tokens, nq, p->dtype, ci->has_values);
    double disk = layer * ci->n_files, peak = disk + layer;
    kvq_log(cb, KVQ_LOG_INFO,
            "capture: %" PRId64 " tokens in %" PRId64 " sequences, %d of %d layers, q at %s"
            " rows, %s%s",
            n_tokens, n_sequences, ci->n_files, cfg->n_layers, nq == n_tokens ? "all" : "sampled",
            kvq_capture_dtype_word(p->dtype), ci->has_values ? "" : ", no values");
    kvq_log(cb, KVQ_LOG_INFO,
            "capture: needs %.1f MiB of memory (model %.1f MiB mapped, %.1f MiB working; "
            "capture %.1f MiB) and %.1f MiB of disk (%.1f MiB at the peak)",
            ((double)mm.total_bytes + cap_mem) / MIB, (double)mm.mapped_bytes / MIB,
            (double)(mm.total_bytes - mm.mapped_bytes) / MIB, cap_mem / MIB, disk / MIB,
            peak / MIB);
    double avail = free_bytes_for(dir);
    if (avail >= 0 && avail < peak)
        kvq_log(cb, KVQ_LOG_WARN, "capture: %s: only %.1f MiB free, %.1f MiB needed", dir,
                avail / MIB, peak / MIB);
}

/* Runs every sequence through the forward pass, whose observer feeds run->w. */
static kvq_status capture_sequences(kvq_forward *fw, const cap_run *run, const int32_t *tokens,
                                    const int64_t *sequences, int64_t n_sequences, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    for (int64_t s = 0; s < n_sequences; s++) {
        kvq_err e = {0};
        kvq_forward_reset(fw);
        st = kvq_forward_tokens(fw, tokens + sequences[2 * s], sequences[2 * s + 1],
                                KVQ_LOGITS_NONE, NULL, &e);
        if (st) {
            if (run->observer_failed)
                kvq_err_set(err, st, "%s", e.msg);
            else
                kvq_err_set(err, st, "%s (sequence %" PRId64 ", rows %" PRId64 "..%" PRId64 ")",
                            e.msg, s, sequences[2 * s], sequences[2 * s] + sequences[2 * s + 1] - 1);
            return st;
        }
    }
    return KVQ_OK;
}

kvq_status kvq_capture_tokens(const kvq_model *m, const int32_t *tokens, int64_t n_tokens,
                              const int64_t *sequences, int64_t n_sequences,
                              const kvq_capture_corpus *corpus, const kvq_capture_params *p_in,
                              const char *dir, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_capture_writer *w = NULL;
    kvq_forward *fw = NULL;
    int32_t *all_layers = NULL;
    kvq_capture_params p = p_in ? *p_in : kvq_capture_params_default();
    const kvq_callbacks *cb = &p.cb;
    if (!m || !dir || (n_tokens > 0 && (!tokens || !sequences)))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture: NULL argument");
    const kvq_model_config *cfg = kvq_model_config_get(m);
    if (n_tokens < 1 || n_sequences < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: the corpus has no tokens to capture",
                           corpus && corpus->spec ? corpus->spec : dir);
    if (p.n_queries < 0 || p.chunk < 1 || p.seq_len < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: negative query count, seq_len or chunk",
                           dir);
    if (kvq_dist_size(p.dist) > 1) /* every rank got here: the checks above are the same */
        return capture_tokens_dist(m, tokens, n_tokens, sequences, n_sequences, corpus, &p, dir,
                                   err);

    /* The capture description. */
    kvq_capture_info ci;
    if ((st = capture_describe(m, tokens, n_tokens, sequences, n_sequences, corpus, &p, dir, &ci,
                               &all_layers, err)))
        return st;
    int32_t last = 0;
    for (int32_t i = 0; i < ci.n_files; i++)
        if (ci.layers[i] > last)
            last = ci.layers[i];
    int64_t longest = 0;
    for (int64_t s = 0; s < n_sequences; s++)
        if (sequences[2 * s + 1] > longest)
            longest = sequences[2 * s + 1];
    int64_t ctx_need = longest > p.seq_len ? longest : p.seq_len;
    if (ctx_need > cfg->context_length)
        kvq_log(cb, KVQ_LOG_WARN,
                "capture: sequences of %" PRId64 " tokens exceed the model's context length %d: "
                "states past it are out of distribution", ctx_need, cfg->context_length);
    if (cfg->sliding_window > 0 && ctx_need > cfg->sliding_window) {
        char which[64];
        if (cfg->sliding_period > 0)
            snprintf(which, sizeof which, "all but every %dth layer", cfg->sliding_period);
        else
            snprintf(which, sizeof which, "layers %d and on", cfg->sliding_from);
        /* a model with global layers too: its windowed layers get no codebook (the
         * runtime attends them exactly), so only the profiles are concerned */
        int local = 0;
        for (int32_t l = 0; l < cfg->n_layers; l++)
            local |= !kvq_model_layer_sliding(cfg, l);
        kvq_log(cb, KVQ_LOG_WARN,
                "capture: sequences of %" PRId64 " tokens exceed the model's sliding window of %d "
                "(%s): the capture applies it, but %s treat every captured sequence as fully "
                "visible", ctx_need, cfg->sliding_window, which,
                local ? "the LeanKV and PATS profiles (kvq profile) of those layers"
                      : "kvq moments and kvq profile");
    }

    kvq_capture_writer_params wp = kvq_capture_writer_params_default();
    wp.seed = p.seed;
    wp.threads = p.threads;
    wp.overwrite = p.overwrite;
    wp.cb = p.cb;
    if ((st = kvq_capture_writer_create(dir, &ci, tokens, &wp, &w, err)))
        goto done;

    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = p.threads;
    fp.chunk = p.chunk;
    fp.max_tokens = longest;
    fp.n_layers = last + 1; /* layers past the last captured one are not needed */
    fp.cb = p.cb;
    fp.cb.progress = NULL; /* the observer reports "capture" progress over the whole run */

    capture_log_needs(m, &fp, &ci, &p, longest, dir);

    if ((st = kvq_forward_create(m, &fp, &fw, err)))
        goto done;
    cap_run run = {w, cb, last, 0, (uint64_t)n_tokens, 0};
    kvq_forward_set_observer(fw, cap_observe, &run);
    if ((st = capture_sequences(fw, &run, tokens, sequences, n_sequences, err)))
        goto done;
    kvq_forward_free(fw);
    fw = NULL;
    st = kvq_capture_writer_finish(w, err);
done:
    kvq_forward_free(fw);
    kvq_capture_writer_free(w); /* removes the temporary directory unless finished */
    free(all_layers);
    return st;
}

/* ---- from a corpus spec ------------------------------------------------------------- */

typedef struct tok_sink {
    int32_t *tokens;          /* [n, grows] */
    int64_t n, cap;
    int64_t *seqs;            /* [n_seqs, 2, grows] */
    int64_t n_seqs, cap_seqs;
} tok_sink;

static kvq_status sink_seq(void *user, const kvq_corpus_seq *seq, kvq_err *err)
{
    tok_sink *s = user;
    if (s->n + seq->n > INT32_MAX)
        return kvq_err_set(err, KVQ_E_TOO_LARGE,
                           "capture: more than 2^31 - 1 tokens (use --max-tokens)");
    if (s->n + seq->n > s->cap) {
        int64_t c = s->cap ? s->cap : 65536;
        while (c < s->n + seq->n)
            c *= 2;
        int32_t *t = realloc(s->tokens, (size_t)c * sizeof *t);
        if (!t)
            return kvq_err_set(err, KVQ_E_NOMEM, "capture: out of memory for the tokens");
        s->tokens = t;
        s->cap = c;
    }
    if (s->n_seqs == s->cap_seqs) {
        int64_t c = s->cap_seqs ? 2 * s->cap_seqs : 1024;
        int64_t *q = realloc(s->seqs, (size_t)c * 2 * sizeof *q);
        if (!q)
            return kvq_err_set(err, KVQ_E_NOMEM, "capture: out of memory for the sequences");
        s->seqs = q;
        s->cap_seqs = c;
    }
    memcpy(s->tokens + s->n, seq->ids, (size_t)seq->n * sizeof *seq->ids);
    s->seqs[2 * s->n_seqs] = s->n;
    s->seqs[2 * s->n_seqs + 1] = seq->n;
    s->n_seqs++;
    s->n += seq->n;
    return KVQ_OK;
}

kvq_status kvq_capture_run(const kvq_model *m, const char *spec, const kvq_corpus_params *cp,
                           const kvq_capture_params *p_in, const char *dir, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_corpus *c = NULL;
    kvq_tokenizer *own_tok = NULL;
    tok_sink sink = {0};
    kvq_capture_params p = p_in ? *p_in : kvq_capture_params_default();
    if (!m || !spec || !dir)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture: NULL argument");
    if (p.seq_len < 2 || p.seq_len > INT32_MAX)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture: seq_len %" PRId64
                           " is not in [2, 2^31)", p.seq_len);
    if (p.max_tokens < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture: negative max_tokens");
    /* Refuse an existing output before reading the whole corpus (the writer checks
     * again, atomically, when it creates the temporary directory). */
    if ((st = kvq_capture_output_check(dir, p.overwrite, err)))
        return st;
    const kvq_model_config *cfg = kvq_model_config_get(m);
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    if (!tok) {
        /* No vocabulary: only pre-tokenized (ids:) corpora can be read. */
        if ((st = kvq_tokenizer_new_ids((uint32_t)cfg->vocab_size, cfg->bos_id, cfg->eos_id,
                                        &own_tok, err)))
            goto done;
        tok = own_tok;
    }
    kvq_corpus_params cpar;
    if (cp)
        cpar = *cp;
    else
        kvq_corpus_params_default(&cpar);
    if ((st = kvq_corpus_open(spec, &cpar, &c, err)) ||
        (!kvq_model_tokenizer(m) && (st = kvq_corpus_check_no_tokenizer(c, kvq_model_path(m), err))))
        goto done;

    kvq_seq_params sp;
    kvq_seq_params_default(&sp);
    sp.seq_len = (uint32_t)p.seq_len;
    sp.max_tokens = (uint64_t)p.max_tokens;
    sp.add_bos = kvq_tokenizer_add_bos(tok) && kvq_tokenizer_bos(tok) >= 0; /* the model says */
    sp.sep = sp.add_bos ? KVQ_DOC_SEP_BOS
                        : kvq_tokenizer_eos(tok) >= 0 ? KVQ_DOC_SEP_EOS : KVQ_DOC_SEP_NONE;
    kvq_corpus_stats stats;
    memset(&stats, 0, sizeof stats);
    if ((st = kvq_corpus_tokenize(c, tok, &sp, &p.cb, sink_seq, &sink, &stats, err)))
        goto done;
    if (sink.n == 0) {
        st = kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: the corpus has no tokens", spec);
        goto done;
    }
    kvq_log(&p.cb, KVQ_LOG_INFO,
            "capture: corpus %s: %" PRIu64 " documents, %" PRIu64 " bytes, %" PRIu64
            " tokens in %" PRIu64 " sequences (%" PRIu64 " dropped)",
            spec, stats.n_docs, stats.n_bytes, stats.n_tokens, stats.n_seqs, stats.n_dropped);
    kvq_capture_corpus corpus = {spec, cpar.seed, stats.hash, (int64_t)stats.n_docs};
    st = kvq_capture_tokens(m, sink.tokens, sink.n, sink.seqs, sink.n_seqs, &corpus, &p, dir,
                            err);
done:
    free(sink.tokens);
    free(sink.seqs);
    kvq_corpus_free(c);
    kvq_tokenizer_free(own_tok);
    return st;
}
