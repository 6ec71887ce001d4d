/* ruler_run.c — the RULER-style suite through the harness (kvq/eval.h): every prompt
 * generated up front, its context prefilled once with full attention and replayed into
 * each row's retrieval context (eval_internal.h), then the question run and the answer
 * decoded greedily with the row's retrieval, scored by RULER's string match. */
#include <stdlib.h>
#include <string.h>

#include "eval/eval_internal.h"

void kvq_ruler_result_free(kvq_ruler_result *r)
{
    if (!r)
        return;
    const size_t n = r->n_rows * r->n_cells * r->samples;
    for (size_t i = 0; r->pred && i < n; i++)
        free(r->pred[i]);
    free(r->pred);
    free(r->task);
    free(r->length);
    free(r->score);
    memset(r, 0, sizeof *r);
}

double kvq_ruler_result_mean(const kvq_ruler_result *r, size_t i, size_t c)
{
    double s = 0;
    const double *v = r->score + (i * r->n_cells + c) * r->samples;
    for (uint32_t k = 0; k < r->samples; k++)
        s += v[k];
    return r->samples ? s / r->samples : 0.0;
}

/* ---- progress through the prefills ----------------------------------------------------
 * The harness's forward reports nothing; here it reports its prefill chunks, relayed as
 * the harness's "eval" progress (the tokens run before the prompt plus the chunk's), so a
 * long prefill moves the line. Logs go through unchanged. */
typedef struct relay {
    kvq_callbacks cb;   /* the caller's */
    kvq_eval *ev;
} relay;

static void relay_log(void *user, kvq_log_level level, const char *msg)
{
    const relay *r = user;
    if (r->cb.log)
        r->cb.log(r->cb.user, level, msg);
}

static int relay_progress(void *user, const char *what, uint64_t done, uint64_t total)
{
    const relay *r = user;
    (void)what;
    (void)total;
    const uint64_t at = r->ev->done + done;
    if (!r->ev->total || at >= r->ev->total)
        return 0;
    return kvq_progress(&r->cb, "eval", at, r->ev->total);
}

/* kvq_eval_create with the forward's prefill progress relayed through rl. */
static kvq_status ruler_eval_create(const kvq_model *m, const kvq_codebook_set *rt,
                                    const kvq_eval_params *p, relay *rl, kvq_eval **out,
                                    kvq_err *err)
{
    kvq_eval *ev = calloc(1, sizeof *ev);
    *out = NULL;
    if (!ev)
        return kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
    ev->c = kvq_model_config_get(m);
    ev->rt = rt;
    ev->p = *p;
    rl->cb = p->cb;
    rl->ev = ev;
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = p->threads;
    fp.max_tokens = p->max_tokens;
    fp.cb = (kvq_callbacks){.log = relay_log, .progress = relay_progress, .user = rl};
    ev->chunk = fp.chunk;
    ev->logits = malloc(sizeof(float) * (size_t)fp.chunk * (size_t)ev->c->vocab_size);
    ev->ids = malloc(sizeof(int32_t) * (size_t)p->max_tokens);
    kvq_status s = ev->logits && ev->ids
                       ? kvq_forward_create(m, &fp, &ev->f, err)
                       : kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
    if (s)
        kvq_eval_free(ev);
    else
        *out = ev;
    return s;
}

/* The greedy continuation of the logits in ev->logits (ids[0, n) the prompt): at most
 * n_gen tokens, stopping at EOS, as text into *pred. */
static kvq_status decode_answer(kvq_eval *ev, const kvq_tokenizer *tok, size_t n, int32_t n_gen,
                                int32_t *n_run, char **pred, kvq_err *err)
{
    const int32_t eos = kvq_tokenizer_eos(tok), vocab = ev->c->vocab_size;
    int32_t *gen = ev->ids + n;
    int32_t g = 0;
    kvq_status s = KVQ_OK;
    while (g < n_gen) {
        const int32_t next = kvq_sample_token(ev->logits, vocab, 0, 1, NULL, NULL, NULL);
        if (next == eos)
            break;
        gen[g++] = next;
        if (g < n_gen && (s = kvq_forward_tokens(ev->f, &next, 1, KVQ_LOGITS_LAST, ev->logits,
                                                 err)))
            return s;
    }
    *n_run = g;
    size_t len = 0;
    return kvq_tokenizer_decode(tok, gen, (size_t)g, KVQ_DECODE_KEEP_PREFIX, pred, &len, err);
}

/* Row q's answer to prompt pr: the recorded context replayed, the question and the
 * answer with retrieval. */
static kvq_status row_answer(kvq_eval *ev, const eval_replay *kr, const kvq_tokenizer *tok,
                             const kvq_ruler_prompt *pr, const kvq_retrieval_params *row,
                             double *score, char **pred, kvq_err *err)
{
    kvq_retrieval_params q = *row;
    q.max_tokens = ev->p.max_tokens;
    q.cb = ev->p.cb;
    q.prefill_full = 0; /* the question's tokens by retrieval too */
    q.measure = 0;
    kvq_retrieval *r = NULL;
    kvq_status s = kvq_retrieval_create(ev->c, ev->rt, &q, &r, err);
    if (s)
        return s;
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(ev->f, &b);
    const int64_t m = kr->m, n = (int64_t)pr->n_ids;
    int32_t g = 0;
    memcpy(ev->ids, pr->ids, sizeof(int32_t) * pr->n_ids);
    s = eval_replay_apply(kr, ev->f, r, err);
    if (!s)
        s = kvq_forward_tokens(ev->f, ev->ids + m, n - m, KVQ_LOGITS_LAST, ev->logits, err);
    if (!s)
        s = decode_answer(ev, tok, pr->n_ids, pr->n_gen, &g, pred, err);
    kvq_forward_set_attention(ev->f, NULL);
    kvq_retrieval_free(r);
    if (s)
        return s;
    *score = kvq_ruler_score(*pred, (const char *const *)pr->answers, pr->n_answers,
                             kvq_ruler_task_match_all(pr->task));
    eval_progress(ev, (uint64_t)(n - m + pr->n_gen));
    return KVQ_OK;
}

/* One prompt: the context recorded once, every row's answer (score and pred strided by
 * stride). */
static kvq_status run_prompt(kvq_eval *ev, eval_replay *kr, const kvq_tokenizer *tok,
                             const kvq_ruler_prompt *pr, const kvq_retrieval_params *rows,
                             size_t n_rows, double *score, char **pred, size_t stride,
                             kvq_err *err)
{
    const double t0 = kvq_now();
    const int64_t m = (int64_t)pr->n_ctx;
    /* no one-token chunk in the recorded prefill (it would be a retrieval step) */
    const int64_t cut = m > 2 && m % ev->chunk == 1 ? m - 2 : m;
    kvq_retrieval_params rec = rows[0];
    rec.max_tokens = ev->p.max_tokens;
    rec.cb = ev->p.cb;
    rec.measure = 0;
    kvq_status s = eval_replay_record(kr, ev->f, ev->c, ev->rt, &rec, pr->ids, m, cut, NULL, err);
    if (s)
        return s;
    eval_progress(ev, (uint64_t)m);
    const double t1 = kvq_now();
    for (size_t j = 0; j < n_rows && !s; j++)
        s = row_answer(ev, kr, tok, pr, &rows[j], &score[j * stride], &pred[j * stride], err);
    if (!s)
        kvq_log(&ev->p.cb, KVQ_LOG_INFO, "ruler %s at %lld, sample %u: %zu tokens, prefill "
                "%.1f s, %zu rows %.1f s", kvq_ruler_task_name(pr->task), (long long)pr->length,
                (unsigned)pr->sample, pr->n_ids, t1 - t0, n_rows, kvq_now() - t1);
    return s;
}

/* The cells (tasks of the mask x lengths) and every prompt, generated. */
static kvq_status plan(const kvq_ruler_filler *f, const kvq_tokenizer *tok,
                       const kvq_ruler_params *rp, kvq_ruler_result *out,
                       kvq_ruler_prompt **prompts, kvq_err *err)
{
    for (int t = 0; t < KVQ_RULER_N_TASKS; t++)
        out->n_cells += ((rp->tasks >> t) & 1) * rp->n_lengths;
    out->samples = rp->samples;
    const size_t n_p = out->n_cells * rp->samples;
    out->task = calloc(out->n_cells + 1, sizeof *out->task);
    out->length = calloc(out->n_cells + 1, sizeof *out->length);
    *prompts = calloc(n_p + 1, sizeof **prompts);
    if (!out->task || !out->length || !*prompts)
        return kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
    size_t c = 0;
    for (int t = 0; t < KVQ_RULER_N_TASKS; t++)
        for (size_t l = 0; ((rp->tasks >> t) & 1) && l < rp->n_lengths; l++, c++) {
            out->task[c] = (kvq_ruler_task)t;
            out->length[c] = rp->lengths[l];
        }
    kvq_status s = KVQ_OK;
    for (size_t i = 0; i < n_p && !s; i++)
        s = kvq_ruler_generate(f, tok, out->task[i / rp->samples], out->length[i / rp->samples],
                               rp->seed, (uint32_t)(i % rp->samples), &(*prompts)[i], err);
    return s;
}

kvq_status kvq_eval_ruler_run(const kvq_model *m, const kvq_codebook_set *rt,
                              const kvq_ruler_filler *f, const kvq_tokenizer *tok,
                              const kvq_ruler_params *rp, const kvq_eval_params *p,
                              const kvq_retrieval_params *rows, size_t n_rows,
                              kvq_ruler_result *out, kvq_err *err)
{
    memset(out, 0, sizeof *out);
    if (!n_rows || !rp->samples || !rp->n_lengths || !rp->tasks)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "ruler: no row, sample, length or task");
    const double t0 = kvq_now();
    kvq_ruler_prompt *pr = NULL;
    kvq_eval *ev = NULL;
    eval_replay kr = {0};
    kvq_status s = plan(f, tok, rp, out, &pr, err);
    const size_t n_p = out->n_cells * rp->samples;
    int64_t longest = 2, ctx = 1;
    uint64_t total = 0;
    for (size_t i = 0; !s && i < n_p; i++) {
        if ((int64_t)pr[i].n_ids + pr[i].n_gen > longest)
            longest = (int64_t)pr[i].n_ids + pr[i].n_gen;
        if ((int64_t)pr[i].n_ctx > ctx)
            ctx = (int64_t)pr[i].n_ctx;
        total += pr[i].n_ctx + n_rows * (pr[i].n_ids - pr[i].n_ctx + (size_t)pr[i].n_gen);
    }
    out->n_rows = n_rows;
    if (!s) {
        out->score = calloc(n_rows * n_p + 1, sizeof *out->score);
        out->pred = calloc(n_rows * n_p + 1, sizeof *out->pred);
        if (!out->score || !out->pred)
            s = kvq_err_set(err, KVQ_E_NOMEM, "ruler: out of memory");
    }
    kvq_eval_params q = *p;
    q.max_tokens = longest;
    q.measure = 0;
    relay rl;
    if (!s && !(s = ruler_eval_create(m, rt, &q, &rl, &ev, err)))
        s = eval_replay_init(&kr, ev->c, ctx, err);
    if (!s)
        kvq_eval_progress_plan(ev, total);
    /* score[row][cell][sample]: prompt i is cell i / samples, sample i % samples */
    for (size_t i = 0; !s && i < n_p; i++)
        s = run_prompt(ev, &kr, tok, &pr[i], rows, n_rows, out->score + i, out->pred + i, n_p, err);
    eval_replay_free(&kr);
    kvq_eval_free(ev);
    for (size_t i = 0; pr && i < n_p; i++)
        kvq_ruler_prompt_free(&pr[i]);
    free(pr);
    out->seconds = kvq_now() - t0;
    if (s)
        kvq_ruler_result_free(out);
    return s;
}
