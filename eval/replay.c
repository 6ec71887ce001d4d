/* replay.c — one exact prefill recorded and replayed into every row's retrieval
 * context (eval_internal.h). */
#include <stdlib.h>
#include <string.h>

#include "eval/eval_internal.h"

static kvq_status record(void *user, const kvq_attn_call *c, kvq_err *err)
{
    eval_replay *x = user;
    const int32_t l = c->layer;
    if (l < 0 || l >= x->n_layers || x->n[l] + c->n > x->cap || c->pos[0] != x->n[l])
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "eval: unexpected prefill chunk");
    memcpy(x->k[l] + (size_t)x->n[l] * x->kvd, c->k, sizeof(float) * (size_t)c->n * x->kvd);
    memcpy(x->v[l] + (size_t)x->n[l] * x->kvd, c->v, sizeof(float) * (size_t)c->n * x->kvd);
    x->n[l] += c->n;
    if (l == 0) /* at most one chunk per token */
        x->chunks[x->n_chunks++] = c->n;
    return KVQ_OK;
}

void eval_replay_free(eval_replay *x)
{
    for (int32_t l = 0; x->k && l < x->n_layers; l++) {
        free(x->k[l]);
        free(x->v[l]);
    }
    free(x->k);
    free(x->v);
    free(x->n);
    free(x->pos);
    free(x->chunks);
    memset(x, 0, sizeof *x);
}

kvq_status eval_replay_init(eval_replay *x, const kvq_model_config *c, int64_t cap,
                            kvq_err *err)
{
    memset(x, 0, sizeof *x);
    const size_t rows = (size_t)(cap > 0 ? cap : 1);
    x->n_layers = c->n_layers;
    x->kvd = (size_t)c->n_kv_heads * c->head_dim;
    x->cap = (int64_t)rows;
    x->n = calloc((size_t)c->n_layers, sizeof *x->n);
    x->k = calloc((size_t)c->n_layers, sizeof *x->k);
    x->v = calloc((size_t)c->n_layers, sizeof *x->v);
    x->pos = malloc(sizeof *x->pos * rows);
    x->chunks = malloc(sizeof *x->chunks * rows);
    int ok = x->n && x->k && x->v && x->pos && x->chunks;
    for (int32_t l = 0; ok && l < c->n_layers; l++) {
        x->k[l] = malloc(sizeof(float) * rows * x->kvd);
        x->v[l] = malloc(sizeof(float) * rows * x->kvd);
        ok = x->k[l] && x->v[l];
    }
    for (size_t j = 0; ok && j < rows; j++)
        x->pos[j] = (int64_t)j;
    if (ok)
        return KVQ_OK;
    eval_replay_free(x);
    return kvq_err_set(err, KVQ_E_NOMEM, "eval: out of memory for a prefill of %lld tokens",
                       (long long)cap);
}

kvq_status eval_replay_record(eval_replay *x, kvq_forward *f, const kvq_model_config *c,
                              const kvq_codebook_set *rt, const kvq_retrieval_params *p,
                              const int32_t *ids, int64_t m, int64_t cut, float *logits,
                              kvq_err *err)
{
    if (m > x->cap || cut > m || cut < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "eval: prefill of %lld tokens (room %lld)",
                           (long long)m, (long long)x->cap);
    kvq_retrieval_params q = *p;
    q.prefill_full = 1;
    kvq_retrieval *r = NULL;
    kvq_status s = kvq_retrieval_create(c, rt, &q, &r, err);
    if (s)
        return s;
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(f, &b); /* resets the sequence */
    memset(x->n, 0, sizeof *x->n * (size_t)x->n_layers);
    x->n_chunks = 0;
    x->m = m;
    kvq_forward_set_observer(f, record, x);
    const kvq_logits_mode lm = logits ? KVQ_LOGITS_LAST : KVQ_LOGITS_NONE;
    s = kvq_forward_tokens(f, ids, cut, cut == m ? lm : KVQ_LOGITS_NONE, logits, err);
    if (!s)
        s = kvq_forward_tokens(f, ids + cut, m - cut, lm, logits, err);
    kvq_forward_set_observer(f, NULL, NULL);
    kvq_forward_set_attention(f, NULL);
    kvq_retrieval_free(r);
    for (int32_t l = 0; !s && l < x->n_layers; l++)
        if (x->n[l] != m)
            s = kvq_err_set(err, KVQ_E_INVALID_ARG, "eval: layer %d recorded %lld of %lld tokens",
                            (int)l, (long long)x->n[l], (long long)m);
    return s;
}

kvq_status eval_replay_apply(const eval_replay *x, kvq_forward *f, kvq_retrieval *r,
                             kvq_err *err)
{
    kvq_status s = KVQ_OK;
    for (int32_t l = 0; !s && l < x->n_layers; l++) {
        int64_t j = 0;
        for (size_t i = 0; !s && i < x->n_chunks; j += x->chunks[i++])
            s = kvq_retrieval_append(r, l, x->chunks[i], x->pos + j, x->k[l] + (size_t)j * x->kvd,
                                     x->v[l] + (size_t)j * x->kvd, err);
    }
    return s ? s : kvq_forward_resume(f, x->m, err);
}
