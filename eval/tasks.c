/* tasks.c — the task documents of the harness (kvq/eval.h) and their answers: with
 * full attention (the reference) and under every row, the exact prompt prefilled once
 * for all rows (eval_internal.h). */
#include <stdlib.h>
#include <string.h>

#include "eval/eval_internal.h"

void kvq_eval_tasks_free(kvq_eval_tasks *tl)
{
    if (!tl)
        return;
    for (size_t i = 0; i < tl->n; i++) {
        free(tl->t[i].ids);
        free(tl->t[i].answer);
    }
    free(tl->t);
    free(tl);
}

size_t kvq_eval_tasks_count(const kvq_eval_tasks *t, int kind)
{
    size_t n = 0;
    for (size_t i = 0; t && i < t->n; i++)
        n += kind < 0 || (int)t->t[i].kind == kind;
    return n;
}

int64_t kvq_eval_tasks_longest(const kvq_eval_tasks *t) { return t ? t->longest : 0; }

kvq_status kvq_eval_tasks_read(const kvq_corpus *corpus, const kvq_tokenizer *tok,
                               kvq_eval_tasks **out, kvq_err *err)
{
    kvq_corpus_iter *it = NULL;
    const kvq_corpus_doc *doc;
    kvq_eval_tasks *tl = calloc(1, sizeof *tl);
    *out = NULL;
    if (!tl)
        return kvq_err_set(err, KVQ_E_NOMEM, "eval: out of memory");
    kvq_status s = kvq_corpus_iter_new(corpus, &it, err);
    while (!s && !(s = kvq_corpus_iter_next(it, &doc, err)) && doc) {
        if (doc->task == KVQ_TASK_NONE || !doc->text)
            continue;
        task t = {.kind = doc->task};
        int32_t *ans = NULL;
        size_t n_ans = 0;
        if ((s = kvq_tokenizer_encode(tok, doc->text, doc->len, KVQ_ENCODE_MODEL_BOS, &t.ids,
                                      &t.n, err)) ||
            (s = kvq_tokenizer_encode(tok, doc->answer, strlen(doc->answer), 0, &ans, &n_ans,
                                      err))) {
            free(t.ids);
            break;
        }
        free(ans);
        t.n_gen = (int32_t)n_ans + 2;
        t.answer = strdup(doc->answer);
        task *nt = realloc(tl->t, sizeof *nt * (tl->n + 1));
        if (!t.answer || !nt) {
            free(t.ids);
            free(t.answer);
            s = kvq_err_set(err, KVQ_E_NOMEM, "eval: out of memory");
            break;
        }
        tl->t = nt;
        tl->t[tl->n++] = t;
        if ((int64_t)t.n + t.n_gen > tl->longest)
            tl->longest = (int64_t)t.n + t.n_gen;
    }
    kvq_corpus_iter_free(it);
    if (s)
        kvq_eval_tasks_free(tl);
    else
        *out = tl;
    return s;
}

/* Decodes task t's answer greedily from the prompt's last logits (ids[0, t->n) hold
 * the prompt) and says whether the continuation starts with it. */
static kvq_status decode_answer(kvq_forward *f, const kvq_tokenizer *tok, const task *t,
                                int32_t vocab, float *logits, int32_t *ids, int *ok,
                                kvq_err *err)
{
    kvq_status s;
    size_t n = t->n;
    for (int32_t g = 0; g < t->n_gen; g++) {
        int32_t next = kvq_sample_token(logits, vocab, 0, 1, NULL, NULL, NULL);
        ids[n++] = next;
        if (g + 1 < t->n_gen && (s = kvq_forward_tokens(f, &next, 1, KVQ_LOGITS_LAST, logits, err)))
            return s;
    }
    /* the continuation is the text past the decoded prompt */
    char *full = NULL, *prompt = NULL;
    size_t lf = 0, lp = 0;
    if ((s = kvq_tokenizer_decode(tok, ids, n, 0, &full, &lf, err)) ||
        (s = kvq_tokenizer_decode(tok, ids, t->n, 0, &prompt, &lp, err))) {
        free(full);
        return s;
    }
    const char *cont = full + (lp <= lf ? lp : lf);
    while (*cont == ' ' || *cont == '\n')
        cont++;
    *ok = !strncmp(cont, t->answer, strlen(t->answer));
    free(full);
    free(prompt);
    return KVQ_OK;
}

kvq_status kvq_eval_tasks_reference(kvq_eval *ev, const kvq_eval_tasks *tl,
                                    const kvq_tokenizer *tok, int correct[3], char *answers,
                                    kvq_err *err)
{
    kvq_forward *f = ev->f;
    const int32_t vocab = ev->c->vocab_size;
    float *logits = ev->logits;
    int32_t *ids = ev->ids;
    memset(correct, 0, sizeof(int) * 3);
    for (size_t i = 0; i < tl->n; i++) {
        const task *t = &tl->t[i];
        kvq_status s;
        int ok = 0;
        kvq_forward_reset(f);
        memcpy(ids, t->ids, sizeof(int32_t) * t->n);
        if ((s = kvq_forward_tokens(f, ids, (int64_t)t->n, KVQ_LOGITS_LAST, logits, err)) ||
            (s = decode_answer(f, tok, t, vocab, logits, ids, &ok, err)))
            return s;
        correct[t->kind] += ok;
        answers[i] = ok ? '1' : '0';
        eval_progress(ev, t->n);
    }
    answers[tl->n] = 0;
    return KVQ_OK;
}

/* ---- one exact prefill for every row ---------------------------------------------- */

/* Tokens of t's prompt prefilled exactly by a prefill of the whole prompt in chunks of
 * `chunk`: all of them unless the last chunk holds one token (a decode step). */
static int64_t exact_prefix(const task *t, int32_t chunk)
{
    const int64_t n = (int64_t)t->n;
    if (n <= 1 || chunk <= 1)
        return 0;
    return (n - 1) % chunk == 0 ? n - 1 : n;
}

/* One row's answer to t: the recorded prefix appended, the rest of the prompt and the
 * answer through the forward. */
static kvq_status row_answer(kvq_forward *f, const kvq_tokenizer *tok, const kvq_model_config *c,
                             const kvq_codebook_set *rt, const kvq_retrieval_params *p,
                             const task *t, const eval_replay *kr, const float *prefix_logits,
                             float *logits, int32_t *ids, int *ok, kvq_err *err)
{
    kvq_retrieval *r = NULL;
    kvq_status s = kvq_retrieval_create(c, rt, p, &r, err);
    if (s)
        return s;
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(f, &b);
    const int64_t m = kr->m, n = (int64_t)t->n;
    s = eval_replay_apply(kr, f, r, err);
    memcpy(ids, t->ids, sizeof(int32_t) * t->n);
    if (!s && m < n)
        s = kvq_forward_tokens(f, ids + m, n - m, KVQ_LOGITS_LAST, logits, err);
    else if (!s)
        memcpy(logits, prefix_logits, sizeof(float) * (size_t)c->vocab_size);
    if (!s)
        s = decode_answer(f, tok, t, c->vocab_size, logits, ids, ok, err);
    kvq_forward_set_attention(f, NULL);
    kvq_retrieval_free(r);
    return s;
}

/* Row j's parameters for the task answers: exact prompt, no measurement. */
static kvq_retrieval_params task_params(const kvq_eval *ev, const kvq_retrieval_params *row)
{
    kvq_retrieval_params q = *row;
    q.max_tokens = ev->p.max_tokens;
    q.cb = ev->p.cb;
    q.prefill_full = 1;
    q.measure = 0;
    return q;
}

kvq_status kvq_eval_tasks_rows(kvq_eval *ev, const kvq_eval_tasks *tl, const kvq_tokenizer *tok,
                               const kvq_retrieval_params *rows, size_t n_rows,
                               kvq_eval_result *out, char *answers, kvq_err *err)
{
    kvq_forward *f = ev->f;
    const kvq_model_config *c = ev->c;
    const kvq_codebook_set *rt = ev->rt;
    const kvq_callbacks *cb = &ev->p.cb;
    float *logits = ev->logits;
    int32_t *ids = ev->ids;
    const int32_t chunk = ev->chunk;
    for (size_t i = 0; i < n_rows; i++)
        memset(out[i].correct, 0, sizeof out[i].correct);
    if (!tl->n || !n_rows)
        return KVQ_OK;
    int64_t cap = 0;
    for (size_t i = 0; i < tl->n; i++)
        if ((int64_t)tl->t[i].n > cap)
            cap = (int64_t)tl->t[i].n;
    eval_replay kr = {0};
    float *prefix_logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    kvq_status s = prefix_logits ? eval_replay_init(&kr, c, cap, err)
                                 : kvq_err_set(err, KVQ_E_NOMEM, "eval: out of memory");
    for (size_t i = 0; i < tl->n && !s; i++) {
        const task *t = &tl->t[i];
        const double t0 = kvq_now();
        const int64_t m = exact_prefix(t, chunk);
        kvq_retrieval_params q = task_params(ev, &rows[0]);
        if (m > 0)
            s = eval_replay_record(&kr, f, c, rt, &q, t->ids, m, m, prefix_logits, err);
        else
            kr.m = kr.n_chunks = 0;
        for (size_t j = 0; j < n_rows && !s; j++) {
            int ok = 0;
            q = task_params(ev, &rows[j]);
            s = row_answer(f, tok, c, rt, &q, t, &kr, prefix_logits, logits, ids, &ok, err);
            out[j].correct[t->kind] += ok;
            eval_progress(ev, t->n);
            answers[j * (tl->n + 1) + i] = ok ? '1' : '0';
            answers[j * (tl->n + 1) + tl->n] = 0;
        }
        if (!s)
            kvq_log(cb, KVQ_LOG_INFO, "task %zu/%zu: %zu tokens, one exact prefill, %zu rows "
                    "(%.2f s)", i + 1, tl->n, t->n, n_rows, kvq_now() - t0);
    }
    eval_replay_free(&kr);
    free(prefix_logits);
    return s;
}
