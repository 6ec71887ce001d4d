/* perplexity.c — the per-token loss, the perplexity loop over a forward pass and the
 * in-memory sequence set (see kvq/perplexity.h for the contracts). */
#include "kvq/perplexity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double kvq_token_nll(const float *logits, int32_t vocab, int32_t target)
{
    double mx = logits[0], sum = 0;
    for (int32_t i = 1; i < vocab; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (int32_t i = 0; i < vocab; i++)
        sum += exp(logits[i] - mx);
    return mx + log(sum) - logits[target];
}

/* ==========================================================================
 * Sequence set
 * ========================================================================== */

kvq_status kvq_seq_set_push(kvq_seq_set *l, const int32_t *ids, int64_t n, kvq_err *err)
{
    if (l->n + 2 > l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        int64_t *o = realloc(l->off, sizeof *o * cap);
        if (!o)
            return kvq_err_set(err, KVQ_E_NOMEM, "perplexity: out of memory (%zu sequences)",
                               l->n);
        l->off = o;
        l->cap = cap;
    }
    if (l->n_ids + n > l->ids_cap) {
        int64_t cap = l->ids_cap ? 2 * l->ids_cap : 4096;
        while (cap < l->n_ids + n)
            cap *= 2;
        int32_t *p = realloc(l->ids, sizeof *p * (size_t)cap);
        if (!p)
            return kvq_err_set(err, KVQ_E_NOMEM, "perplexity: out of memory (%lld tokens)",
                               (long long)l->n_ids);
        l->ids = p;
        l->ids_cap = cap;
    }
    if (l->n == 0)
        l->off[0] = 0;
    memcpy(l->ids + l->n_ids, ids, sizeof(int32_t) * (size_t)n);
    l->n_ids += n;
    l->off[++l->n] = l->n_ids;
    return KVQ_OK;
}

void kvq_seq_set_free(kvq_seq_set *s)
{
    if (!s)
        return;
    free(s->ids);
    free(s->off);
    memset(s, 0, sizeof *s);
}

/* ==========================================================================
 * The loop
 * ========================================================================== */

/* The loop of kvq_perplexity_seq on a sequence that was reset already. */
static kvq_status run_seq(kvq_forward *f, const int32_t *ids, int64_t n, int64_t from,
                          int32_t chunk, int32_t vocab, float *logits, kvq_nll_sum *acc,
                          kvq_err *err)
{
    for (int64_t at = 0; at < n; at += chunk) {
        const int64_t cn = n - at < chunk ? n - at : chunk;
        kvq_status s = kvq_forward_tokens(f, ids + at, cn, KVQ_LOGITS_ALL, logits, err);
        if (s != KVQ_OK)
            return s;
        for (int64_t i = 0; i < cn && at + i + 1 < n; i++) {
            if (at + i < from)
                continue;
            acc->nll += kvq_token_nll(logits + (size_t)i * (size_t)vocab, vocab, ids[at + i + 1]);
            acc->n_pred++;
        }
    }
    return KVQ_OK;
}

kvq_status kvq_perplexity_seq(kvq_forward *f, const int32_t *ids, int64_t n, int64_t from,
                              int32_t chunk, int32_t vocab, float *logits, kvq_nll_sum *acc,
                              kvq_err *err)
{
    kvq_forward_reset(f);
    return run_seq(f, ids, n, from, chunk, vocab, logits, acc, err);
}

kvq_status kvq_perplexity_seq_last(kvq_forward *f, const int32_t *ids, int64_t n, int64_t n_last,
                                   int32_t chunk, int32_t vocab, float *logits, kvq_nll_sum *acc,
                                   kvq_err *err)
{
    if (n_last < 1 || chunk < 3) /* chunk 2 cannot cut an odd prompt into calls of two */
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "perplexity: n_last %lld, chunk %d",
                           (long long)n_last, (int)chunk);
    kvq_forward_reset(f);
    const int64_t pre = n - n_last - 1 > 0 ? n - n_last - 1 : 0;
    /* a prompt whose last chunk would be one token: two calls, the second of two */
    const int64_t cut = pre > 2 && pre % chunk == 1 ? pre - 2 : pre;
    kvq_status s = kvq_forward_tokens(f, ids, cut, KVQ_LOGITS_NONE, logits, err);
    if (s == KVQ_OK)
        s = kvq_forward_tokens(f, ids + cut, pre - cut, KVQ_LOGITS_NONE, logits, err);
    for (int64_t t = pre; s == KVQ_OK && t + 1 < n; t++) {
        if ((s = kvq_forward_tokens(f, ids + t, 1, KVQ_LOGITS_LAST, logits, err)) != KVQ_OK)
            break;
        acc->nll += kvq_token_nll(logits, vocab, ids[t + 1]);
        acc->n_pred++;
    }
    return s;
}

kvq_status kvq_perplexity_chunk_llama(kvq_forward *f, int32_t *ids, int64_t n_ctx, int32_t bos,
                                      int32_t chunk, int32_t vocab, float *logits,
                                      kvq_nll_sum *acc, kvq_err *err)
{
    const int32_t first = ids[0];
    if (bos >= 0)
        ids[0] = bos; /* as llama-perplexity does for the first batch of every chunk */
    kvq_status st = kvq_perplexity_seq(f, ids, n_ctx, n_ctx / 2, chunk, vocab, logits, acc, err);
    ids[0] = first;
    return st;
}

kvq_status kvq_perplexity_set(kvq_forward *f, const kvq_seq_set *s, int32_t chunk,
                              int32_t vocab, float *logits, kvq_ppl_begin_fn begin, void *user,
                              kvq_nll_sum *acc, kvq_err *err)
{
    for (size_t q = 0; q < s->n; q++) {
        const int64_t n = s->off[q + 1] - s->off[q];
        kvq_forward_reset(f);
        /* after the reset: begin may prepare the attention backend for the sequence */
        const int64_t from = begin ? begin(user, n) : 0;
        kvq_status st = run_seq(f, s->ids + s->off[q], n, from, chunk, vocab, logits, acc, err);
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}
