/* harness.c — the evaluation harness (kvq/eval.h): the reference and each row's
 * perplexity and statistics over a set of sequences, every prediction by retrieval at
 * its position or (last = N) the last N of each sequence after one exact prefill per
 * sequence replayed into every row (eval_internal.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval/eval_internal.h"

kvq_eval_params kvq_eval_params_default(void)
{
    kvq_eval_params p = {.max_tokens = 2, .threads = 1, .measure = 1, .name = "eval"};
    return p;
}

void eval_progress(kvq_eval *ev, uint64_t n)
{
    ev->done += n;
    if (ev->total)
        kvq_progress(&ev->p.cb, "eval", ev->done < ev->total ? ev->done : ev->total, ev->total);
}

void kvq_eval_progress_plan(kvq_eval *ev, uint64_t total)
{
    ev->total = total;
    ev->done = 0;
    if (total)
        kvq_progress(&ev->p.cb, "eval", 0, total);
}

void kvq_eval_free(kvq_eval *ev)
{
    if (!ev)
        return;
    kvq_forward_free(ev->f);
    free(ev->logits);
    free(ev->ids);
    free(ev);
}

kvq_status kvq_eval_create(const kvq_model *m, const kvq_codebook_set *rt,
                           const kvq_eval_params *p, kvq_eval **out, kvq_err *err)
{
    *out = NULL;
    kvq_eval *ev = calloc(1, sizeof *ev);
    if (!ev)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", p->name);
    ev->c = kvq_model_config_get(m);
    ev->rt = rt;
    ev->p = *p;
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = p->threads;
    fp.max_tokens = p->max_tokens;
    fp.cb = p->cb;
    fp.cb.progress = NULL; /* the harness reports progress, in tokens run */
    ev->chunk = fp.chunk;
    ev->logits = malloc(sizeof(float) * (size_t)fp.chunk * (size_t)ev->c->vocab_size);
    ev->ids = malloc(sizeof(int32_t) * (size_t)(p->max_tokens > 0 ? p->max_tokens : 1));
    kvq_status s = ev->logits && ev->ids
                       ? kvq_forward_create(m, &fp, &ev->f, err)
                       : kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", p->name);
    if (s) {
        kvq_eval_free(ev);
        return s;
    }
    *out = ev;
    return KVQ_OK;
}

/* ---- perplexity --------------------------------------------------------------------- */

/* last = N: predictions from position n - N - 1 on (kvq_ppl_begin_fn). */
static int64_t last_from(void *user, int64_t n)
{
    const int64_t last = *(const int64_t *)user;
    return n > last + 1 ? n - last - 1 : 0;
}

/* Summed NLL and predicted tokens over every sequence with the forward's current
 * attention: every prediction (last 0) or the last `last` of each sequence, all logits
 * of a chunk at once. */
static kvq_status perplexity(kvq_eval *ev, const kvq_seq_set *l, double *nll, uint64_t *n_pred,
                             kvq_err *err)
{
    kvq_nll_sum sum = {0};
    int64_t last = ev->p.last;
    kvq_status s = kvq_perplexity_set(ev->f, l, ev->chunk, ev->c->vocab_size, ev->logits,
                                      last ? last_from : NULL, &last, &sum, err);
    *nll = sum.nll;
    *n_pred = sum.n_pred;
    return s;
}

kvq_status kvq_eval_reference(kvq_eval *ev, const kvq_seq_set *ss, kvq_eval_result *out,
                              kvq_err *err)
{
    memset(out, 0, sizeof *out);
    const double t0 = kvq_now();
    kvq_status s = perplexity(ev, ss, &out->nll, &out->n_pred, err);
    if (s)
        return s;
    eval_progress(ev, (uint64_t)ss->n_ids);
    out->seconds = kvq_now() - t0;
    if (out->n_pred == 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: no token to predict (sequences too short)",
                           ev->p.name);
    out->nll /= (double)out->n_pred;
    out->ppl = exp(out->nll);
    return KVQ_OK;
}

/* Row parameters as the harness runs them. */
static kvq_retrieval_params row_params(const kvq_eval *ev, const kvq_retrieval_params *row)
{
    kvq_retrieval_params p = *row;
    p.max_tokens = ev->p.max_tokens;
    p.cb = ev->p.cb;
    p.prefill_full = ev->p.last > 0;
    p.measure = ev->p.measure;
    return p;
}

/* One row, every position by retrieval. */
static kvq_status eval_row(kvq_eval *ev, const kvq_seq_set *ss, const kvq_retrieval_params *row,
                           const char *name, const kvq_eval_result *ref, kvq_eval_result *res,
                           kvq_err *err)
{
    kvq_retrieval *r = NULL;
    const kvq_retrieval_params p = row_params(ev, row);
    const double t0 = kvq_now();
    kvq_status s = kvq_retrieval_create(ev->c, ev->rt, &p, &r, err);
    if (s)
        return s;
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(ev->f, &b);
    uint64_t np;
    s = perplexity(ev, ss, &res->nll, &np, err);
    kvq_retrieval_stats_get(r, &res->st);
    kvq_forward_set_attention(ev->f, NULL);
    kvq_retrieval_free(r);
    if (s)
        return s;
    eval_progress(ev, (uint64_t)ss->n_ids);
    res->n_pred = np;
    res->nll /= (double)ref->n_pred;
    res->ppl = exp(res->nll);
    res->seconds = kvq_now() - t0;
    if (name)
        kvq_log(&ev->p.cb, KVQ_LOG_INFO, "%s: perplexity %.4f (%.2f s)", name, res->ppl,
                res->seconds);
    return KVQ_OK;
}

/* Sequence ids[0, n)'s last predictions under row `row`: a fresh context with the
 * recorded prefill of the first m tokens appended (rp), tokens [m, pre) run (pre < 2
 * only), then one-token steps from pre on, as kvq_perplexity_seq_last does. */
static kvq_status row_last(kvq_eval *ev, kvq_retrieval_params p, const eval_replay *rp,
                           const int32_t *ids, int64_t n, int64_t pre, kvq_nll_sum *acc,
                           kvq_retrieval_stats *st, kvq_err *e)
{
    kvq_retrieval *r = NULL;
    kvq_status s = kvq_retrieval_create(ev->c, ev->rt, &p, &r, e);
    if (s)
        return s;
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(ev->f, &b);
    s = eval_replay_apply(rp, ev->f, r, e);
    if (!s && rp->m < pre)
        s = kvq_forward_tokens(ev->f, ids + rp->m, pre - rp->m, KVQ_LOGITS_NONE, ev->logits, e);
    for (int64_t t = pre; !s && t + 1 < n; t++) {
        if ((s = kvq_forward_tokens(ev->f, ids + t, 1, KVQ_LOGITS_LAST, ev->logits, e)))
            break;
        acc->nll += kvq_token_nll(ev->logits, ev->c->vocab_size, ids[t + 1]);
        acc->n_pred++;
    }
    kvq_retrieval_stats z;
    kvq_retrieval_stats_get(r, &z);
    kvq_eval_stats_add(st, &z);
    kvq_forward_set_attention(ev->f, NULL);
    kvq_retrieval_free(r);
    return s;
}

/* last = N, every row: per sequence one exact prefill of the tokens before the last N
 * predictions, recorded and replayed into each row's fresh context, then the row's N
 * one-token steps: the figures of a prefill per row (kvq_perplexity_seq_last) at one
 * prefill per sequence. */
static kvq_status rows_last(kvq_eval *ev, const kvq_seq_set *ss, const kvq_retrieval_params *rows,
                            size_t n_rows, kvq_nll_sum *acc, kvq_eval_result *out,
                            kvq_err *e)
{
    eval_replay rp = {0};
    int64_t cap = 1;
    for (size_t q = 0; q < ss->n; q++)
        if (ss->off[q + 1] - ss->off[q] > cap)
            cap = ss->off[q + 1] - ss->off[q];
    kvq_status s = eval_replay_init(&rp, ev->c, cap, e);
    const int64_t last = ev->p.last;
    for (size_t q = 0; q < ss->n && !s; q++) {
        const int32_t *ids = ss->ids + ss->off[q];
        const int64_t n = ss->off[q + 1] - ss->off[q];
        const int64_t pre = n - last - 1 > 0 ? n - last - 1 : 0;
        /* kvq_perplexity_seq_last's calls: none of one token (exact) from 2 tokens on */
        const int64_t cut = pre > 2 && pre % ev->chunk == 1 ? pre - 2 : pre;
        const double q0 = kvq_now();
        kvq_retrieval_params p = row_params(ev, &rows[0]);
        p.measure = 0;
        if (pre >= 2)
            s = eval_replay_record(&rp, ev->f, ev->c, ev->rt, &p, ids, pre, cut, NULL, e);
        else
            rp.m = 0, rp.n_chunks = 0;
        const double prefill_s = kvq_now() - q0;
        for (size_t i = 0; i < n_rows && !s; i++) {
            const double r0 = kvq_now();
            s = row_last(ev, row_params(ev, &rows[i]), &rp, ids, n, pre, &acc[i], &out[i].st, e);
            out[i].seconds += kvq_now() - r0;
            eval_progress(ev, (uint64_t)n);
        }
        if (!s)
            kvq_log(&ev->p.cb, KVQ_LOG_INFO, "sequence %zu/%zu: one exact prefill (%.2f s), %zu "
                    "rows (%.2f s)", q + 1, ss->n, prefill_s, n_rows, kvq_now() - q0);
    }
    eval_replay_free(&rp);
    return s;
}

kvq_status kvq_eval_rows(kvq_eval *ev, const kvq_seq_set *ss, const kvq_retrieval_params *rows,
                         const char *const *names, size_t n_rows, const kvq_eval_result *ref,
                         kvq_eval_result *out, kvq_err *err)
{
    for (size_t i = 0; i < n_rows; i++)
        memset(&out[i], 0, sizeof out[i]);
    if (!ev->p.last) {
        for (size_t i = 0; i < n_rows; i++) {
            kvq_status s = eval_row(ev, ss, &rows[i], names ? names[i] : NULL, ref, &out[i], err);
            if (s)
                return s;
        }
        return KVQ_OK;
    }
    kvq_nll_sum *acc = calloc(n_rows ? n_rows : 1, sizeof *acc);
    if (!acc)
        return kvq_err_set(err, KVQ_E_NOMEM, "eval: out of memory");
    kvq_status s = rows_last(ev, ss, rows, n_rows, acc, out, err);
    for (size_t i = 0; i < n_rows && !s; i++) {
        out[i].n_pred = acc[i].n_pred;
        out[i].nll = acc[i].nll / (double)ref->n_pred;
        out[i].ppl = exp(out[i].nll);
        if (names)
            kvq_log(&ev->p.cb, KVQ_LOG_INFO, "%s: perplexity %.4f (%.2f s, and the prefills)",
                names[i], out[i].ppl, out[i].seconds);
    }
    free(acc);
    return s;
}
