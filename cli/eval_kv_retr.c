/* eval_kv_retr.c — the retrieval rows of `kvq eval --kv K --selectors S --budgets B`:
 * retrieval over a compressed KV cache (kvq/kvcache.h kvq_retrieval_set_kvcache).
 * Each sequence's first floor(prompt_fraction n) tokens are its prompt, prefilled
 * exactly in one pass; the others are decoded one token per call and predicted
 * (kvq_perplexity_seq_last); full attention run the same way is the reference (the
 * "decode" one, cli/eval_kv.c). A row: perplexity, the attended share, the memory the
 * compressed cache held (f16: an f16 cache's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/eval_kv.h"
#include "cli/retrieval_opts.h"
#include "kvq/perplexity.h"

/* Whether sequence q of x runs with the decode schedule (a prefill of two or more
 * tokens and one decoded after it); its prompt P and decoded tokens n_last. */
static int decoded(const cli_kv_run *x, size_t q, int64_t *n, int64_t *P, int64_t *n_last)
{
    *n = x->sl.off[q + 1] - x->sl.off[q];
    *P = (int64_t)floor(x->frac * (double)*n);
    *n_last = *n - 1 - *P;
    return *n_last >= 1 && *P >= 2;
}

uint64_t cli_kv_decode_steps(const cli_kv_run *x)
{
    uint64_t total = 0;
    int64_t n, P, n_last;
    for (size_t q = 0; q < x->sl.n; q++)
        if (decoded(x, q, &n, &P, &n_last))
            total += (uint64_t)n_last;
    return total;
}

kvq_status cli_kv_decode_ppl(cli_kv_run *x, kvq_kvcache *kc, double *nll, uint64_t *n_pred,
                             kvq_err *err)
{
    kvq_nll_sum sum = {0};
    const int32_t vocab = x->c->vocab_size;
    int64_t n, P, n_last;
    for (size_t q = 0; q < x->sl.n; q++) {
        if (!decoded(x, q, &n, &P, &n_last))
            continue; /* nothing decoded after a prefill of two or more tokens */
        kvq_status s = kc ? kvq_kvcache_begin(kc, P, n, err) : KVQ_OK;
        if (!s)
            s = kvq_perplexity_seq_last(x->f, x->sl.ids + x->sl.off[q], n, n_last, x->chunk,
                                        vocab, x->logits, &sum, err);
        if (s)
            return s;
    }
    *nll = sum.n_pred ? sum.nll / (double)sum.n_pred : NAN;
    *n_pred = sum.n_pred;
    return KVQ_OK;
}

int cli_kv_retr_row(cli_kv_run *x, const cli_retrieval *ro, const kvq_codebook_set *rt,
                    cli_kv_row *row, int dry)
{
    const kvq_model_config *c = x->c;
    kvq_err e = {0};
    kvq_retrieval *r = NULL;
    kvq_kvcache *kc = NULL;
    kvq_retrieval_params rp = ro->p;
    kvq_kvcache_memory mem;
    int rc = 0;
    rp.selector = row->sel->selector;
    rp.budget = row->sel->budget;
    rp.max_tokens = x->seq_len;
    rp.threads = x->threads > 0 ? x->threads : 1;
    rp.prefill_full = 1;
    if (kvq_retrieval_create(c, rt, &rp, &r, &e) ||
        (row->kp.kind != KVQ_KV_F16 &&
         (kvq_kvcache_create(c, &row->kp, &kc, &e) || kvq_retrieval_set_kvcache(r, kc, &e)))) {
        rc = cli_fail(&e);
        goto done;
    }
    if (dry)
        goto done;
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(x->f, &b);
    if (cli_kv_decode_ppl(x, kc, &row->nll, &row->n_pred, &e)) {
        rc = cli_fail(&e);
        goto done;
    }
    if (kc)
        kvq_kvcache_memory_get(kc, &mem);
    else /* r's f16 rows */
        cli_kv_f16_memory(x, &mem);
    kvq_retrieval_stats st;
    kvq_retrieval_stats_get(r, &st);
    row->mem = mem;
    row->attended = st.visible > 0 ? st.attended / st.visible : 1;
    /* what the process holds for the KV: the compressed cache plus the context's own
     * (kvq_retrieval_held_get: selector data, positions, RoPE table; its rows only
     * without a compressed cache, where they are the f16 memory above) */
    kvq_retrieval_held_get(r, &row->ctx);
    row->held = (kc ? mem.bytes / (mem.tokens > 0 ? mem.tokens : 1) : 0) + row->ctx.total;
done:
    if (x->f)
        kvq_forward_set_attention(x->f, NULL);
    kvq_retrieval_free(r);
    kvq_kvcache_free(kc);
    return rc;
}
