/* table.c — kvq_eval_table_run (kvq/eval.h): a corpus read into sequences and task
 * documents, the reference, every row, and the task answers, as `kvq eval` prints them. */
#include <stdlib.h>
#include <string.h>

#include "eval/eval_internal.h"

void kvq_eval_table_free(kvq_eval_table *t)
{
    if (!t)
        return;
    free(t->rows);
    free(t->answers);
    memset(t, 0, sizeof *t);
}

const char *kvq_eval_table_answers(const kvq_eval_table *t, long i)
{
    return t->answers + (size_t)(i + 1) * (t->n_tasks + 1);
}

/* The tokens the table runs: the sequences and task prompts, once for the reference
 * and once per row. */
static uint64_t planned(const kvq_seq_set *ss, const kvq_eval_tasks *tl, size_t n_rows)
{
    uint64_t n = (uint64_t)ss->n_ids;
    for (size_t i = 0; i < tl->n; i++)
        n += tl->t[i].n;
    return n * (1 + n_rows);
}

static kvq_status table_measure(kvq_eval *ev, const kvq_seq_set *ss, const kvq_eval_tasks *tl,
                                const kvq_tokenizer *tok, const kvq_retrieval_params *rows,
                                const char *const *names, kvq_eval_table *t, kvq_err *err)
{
    const kvq_callbacks *cb = &ev->p.cb;
    double t0 = kvq_now();
    kvq_status s = kvq_eval_reference(ev, ss, &t->reference, err);
    if (!s)
        s = kvq_eval_tasks_reference(ev, tl, tok, t->reference.correct, t->answers, err);
    if (s)
        return s;
    kvq_log(cb, KVQ_LOG_INFO, "full attention: perplexity %.4f (%.2f s)", t->reference.ppl,
            kvq_now() - t0);
    t->n_pred = t->reference.n_pred;
    if ((s = kvq_eval_rows(ev, ss, rows, names, t->n_rows, &t->reference, t->rows, err)))
        return s;
    if (!tl->n)
        return KVQ_OK;
    t0 = kvq_now();
    s = kvq_eval_tasks_rows(ev, tl, tok, rows, t->n_rows, t->rows, t->answers + tl->n + 1, err);
    if (!s)
        kvq_log(cb, KVQ_LOG_INFO, "tasks: %zu prompts x %zu rows (%.2f s)", tl->n, t->n_rows,
                kvq_now() - t0);
    return s;
}

kvq_status kvq_eval_table_run(const kvq_model *m, const kvq_codebook_set *rt,
                              const kvq_corpus *corpus, const kvq_tokenizer *tok,
                              int64_t seq_len, int64_t max_tokens, const kvq_eval_params *p,
                              const kvq_retrieval_params *rows, const char *const *names,
                              size_t n_rows, kvq_eval_table *t, kvq_err *err)
{
    memset(t, 0, sizeof *t);
    kvq_seq_set ss = {0};
    kvq_eval_tasks *tl = NULL;
    kvq_eval *ev = NULL;
    kvq_seq_params sp;
    kvq_seq_params_default(&sp);
    kvq_seq_params_model_bos(&sp, tok);
    sp.seq_len = (uint32_t)seq_len;
    sp.max_tokens = (uint64_t)max_tokens;
    kvq_status s = kvq_seq_set_collect(corpus, tok, &sp, &p->cb, &ss, &t->stats, err);
    if (!s)
        s = kvq_eval_tasks_read(corpus, tok, &tl, err);
    if (s)
        goto done;
    t->n_sequences = ss.n;
    t->n_tasks = tl->n;
    for (int k = 0; k < 3; k++)
        t->n_task[k] = (int)kvq_eval_tasks_count(tl, k);
    kvq_eval_params q = *p;
    q.max_tokens = tl->longest > seq_len ? tl->longest : seq_len;
    if (p->max_tokens > q.max_tokens)
        q.max_tokens = p->max_tokens;
    t->n_rows = n_rows;
    t->rows = calloc(n_rows ? n_rows : 1, sizeof *t->rows);
    t->answers = calloc((n_rows + 1) * (tl->n + 1), 1);
    if (!t->rows || !t->answers) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", p->name);
        goto done;
    }
    if ((s = kvq_eval_create(m, rt, &q, &ev, err)))
        goto done;
    kvq_eval_progress_plan(ev, planned(&ss, tl, n_rows));
    s = table_measure(ev, &ss, tl, tok, rows, names, t, err);
done:
    kvq_eval_free(ev);
    kvq_eval_tasks_free(tl);
    kvq_seq_set_free(&ss);
    if (s)
        kvq_eval_table_free(t);
    return s;
}
