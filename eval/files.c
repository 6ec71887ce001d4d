/* files.c — kvq_eval_files (kvq/eval.h): the stable entry point of the harness. Opens
 * the model, the artifact and the corpus, expands the rows, runs kvq_eval_table_run and
 * copies the table into the caller's plain report. */
#include <stdlib.h>
#include <string.h>

#include "eval/eval_internal.h"

int kvq_eval_artifact_positions(const kvq_codebook_set *rt, kvq_retrieval_params *p,
                                int keep_positions, int keep_score)
{
    kvq_positions pm;
    kvq_score_pos ps;
    if (!rt || !kvq_codebook_set_positions(rt, &pm, &ps) || (keep_positions && keep_score))
        return 0;
    if (!keep_positions)
        p->positions = pm;
    if (!keep_score)
        p->score_pos = ps;
    return 1;
}

/* The files opened for an evaluation. */
typedef struct ev_files {
    kvq_model *m;
    kvq_corpus *corpus;
    kvq_tokenizer *ids_tok;
    const kvq_tokenizer *tok;
    kvq_codebook_set *rt;
    kvq_eval_row *rows;
    size_t n_rows;
} ev_files;

static void files_close(ev_files *f)
{
    free(f->rows);
    kvq_codebook_set_close(f->rt);
    kvq_tokenizer_free(f->ids_tok);
    kvq_corpus_free(f->corpus);
    kvq_model_close(f->m);
}

static kvq_status files_open(const char *model_path, const char *artifact_path,
                             const char *spec, const kvq_eval_options *o, ev_files *f,
                             kvq_err *err)
{
    kvq_model_params mp = kvq_model_params_default();
    mp.cb = o->cb;
    kvq_corpus_params cp;
    kvq_corpus_params_default(&cp);
    cp.seed = o->seed;
    kvq_status s = kvq_model_open(model_path, &mp, &f->m, err);
    if (!s)
        s = kvq_corpus_open(spec, &cp, &f->corpus, err);
    if (s)
        return s;
    const kvq_model_config *c = kvq_model_config_get(f->m);
    f->tok = kvq_model_tokenizer(f->m);
    if (!f->tok && !(s = kvq_tokenizer_new_ids((uint32_t)c->vocab_size, c->bos_id, c->eos_id,
                                               &f->ids_tok, err)))
        f->tok = f->ids_tok;
    if (!s && artifact_path) {
        kvq_model_id id;
        kvq_model_identity(f->m, &id);
        const unsigned flags = o->accept_model_mismatch ? KVQ_OPEN_ACCEPT_MODEL_MISMATCH : 0;
        s = kvq_codebook_set_open_ex(artifact_path, &id, model_path, flags, &f->rt, err);
    }
    kvq_retrieval_params base = kvq_retrieval_params_default();
    base.window = o->window;
    kvq_eval_artifact_positions(f->rt, &base, 0, 0);
    if (!s)
        s = kvq_eval_rows_expand(o->selectors, o->budgets, f->rt, &base, &f->rows, &f->n_rows,
                                 err);
    if (!s && f->n_rows > KVQ_EVAL_MAX_ROWS)
        s = kvq_err_set(err, KVQ_E_TOO_LARGE, "eval: %zu rows, at most %d", f->n_rows,
                        KVQ_EVAL_MAX_ROWS);
    return s;
}

/* The harness's table as the plain report. */
static void fill_report(const ev_files *f, const kvq_eval_table *t, kvq_eval_report *out)
{
    const int32_t head_dim = kvq_model_config_get(f->m)->head_dim;
    out->corpus_hash = t->stats.hash;
    out->tokens = t->stats.n_tokens;
    out->predicted = t->n_pred;
    out->sequences = t->n_sequences;
    out->nll = t->reference.nll;
    out->perplexity = t->reference.ppl;
    out->passkey[0] = t->reference.correct[KVQ_TASK_PASSKEY];
    out->passkey[1] = t->n_task[KVQ_TASK_PASSKEY];
    out->kv_recall[0] = t->reference.correct[KVQ_TASK_KV_RECALL];
    out->kv_recall[1] = t->n_task[KVQ_TASK_KV_RECALL];
    out->n_rows = (uint32_t)t->n_rows;
    for (size_t i = 0; i < t->n_rows; i++) {
        kvq_eval_row_result *r = &out->rows[i];
        const kvq_eval_result *x = &t->rows[i];
        memcpy(r->selector, f->rows[i].name, sizeof r->selector);
        memcpy(r->budget, f->rows[i].budget, sizeof r->budget);
        r->bits_per_key = kvq_selector_bits_per_key(f->rows[i].rp.selector, &f->rows[i].rp,
                                                    f->rt, head_dim);
        r->nll = x->nll;
        r->perplexity = x->ppl;
        r->steps = x->st.steps;
        for (int k = 0; k < KVQ_EVAL_N_METRICS; k++)
            r->metric[k] = kvq_eval_metric_value(&x->st, (kvq_eval_metric)k);
        r->passkey[0] = x->correct[KVQ_TASK_PASSKEY];
        r->passkey[1] = t->n_task[KVQ_TASK_PASSKEY];
        r->kv_recall[0] = x->correct[KVQ_TASK_KV_RECALL];
        r->kv_recall[1] = t->n_task[KVQ_TASK_KV_RECALL];
    }
}

kvq_status kvq_eval_files(const char *model_path, const char *artifact_path,
                          const char *corpus, const kvq_eval_options *o, kvq_eval_report *out,
                          kvq_err *err)
{
    static const kvq_eval_options none = {0};
    o = o ? o : &none;
    memset(out, 0, sizeof *out);
    ev_files f = {0};
    kvq_eval_table t = {0};
    kvq_retrieval_params *rp = NULL;
    kvq_status s = files_open(model_path, artifact_path, corpus, o, &f, err);
    if (!s && !(rp = calloc(f.n_rows ? f.n_rows : 1, sizeof *rp)))
        s = kvq_err_set(err, KVQ_E_NOMEM, "eval: out of memory");
    if (!s) {
        for (size_t i = 0; i < f.n_rows; i++)
            rp[i] = f.rows[i].rp;
        kvq_eval_params p = kvq_eval_params_default();
        p.last = o->score_last;
        p.threads = o->threads > 0 ? o->threads : 1;
        p.name = corpus;
        p.cb = o->cb;
        s = kvq_eval_table_run(f.m, f.rt, f.corpus, f.tok, o->seq_len ? o->seq_len : 512,
                               o->max_tokens, &p, rp, NULL, f.n_rows, &t, err);
    }
    if (!s)
        fill_report(&f, &t, out);
    kvq_eval_table_free(&t);
    free(rp);
    files_close(&f);
    return s;
}
