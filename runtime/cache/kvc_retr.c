/*
 * runtime/cache/kvc_retr.c — retrieval over a compressed KV cache (kvq/kvcache.h "With
 * retrieval", docs/kvcache.md): the row reader between a LeanKV / PATS cache and the
 * retrieval context's decode step. The context keeps its own rows and its selector's
 * data (codes, residual bits) as without the compressed cache; its rerank reads the
 * candidates' keys and its attention the attended tokens' keys and values from the
 * compressed rows, decoded one row at a time into the step's scratch. The prompt's
 * exact prefill (prefill_full) reads the context's rows, as LeanKV attends its prompt
 * exactly.
 */
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef KVQ_UNSTABLE_API
#define KVQ_UNSTABLE_API
#endif
#include "kvq/kvcache.h"
#include "kvq/runtime.h"
#include "runtime/kernels/rk.h"
#include "runtime/runtime_internal.h"

kvq_status kvq_retrieval_set_kvcache(kvq_retrieval *r, kvq_kvcache *c, kvq_err *err)
{
    if (c && r->p.positions != KVQ_POSITIONS_ROPE)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval over a compressed KV cache needs "
                           "positions rope (--positions rope: the cache holds rotated keys)");
    if (c && (r->local || r->sliding_window > 0))
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "retrieval over a compressed KV cache: "
                           "models with local layers are not supported");
    if (c == r->kvc)
        return KVQ_OK;
    for (int32_t l = 0; l < r->n_layers; l++)
        if (r->layer[l].len)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval: a compressed KV cache is "
                               "attached or detached between sequences (layer %d holds %lld "
                               "tokens: kvq_forward_reset first)", (int)l,
                               (long long)r->layer[l].len);
    /* attached: the context's own rows go (it holds none while c is set); detached:
     * they come back with the next sequence's first rows (the layers regrow from 0) */
    for (int32_t l = 0; l < r->n_layers; l++) {
        rt_layer *L = &r->layer[l];
        for (int32_t h = 0; h < r->n_kv; h++) {
            free(L->head[h].k);
            free(L->head[h].v);
            L->head[h].k = L->head[h].v = NULL;
        }
        if (!c)
            L->cap = 0;
    }
    r->kvc = c;
    return KVQ_OK;
}

/* Token tok's rotated key and value (either NULL: not read) for a step of (layer, head):
 * r->kvc's row, or in the steps of LeanKV's prompt (kvc_inflight) the chunk's own rows
 * from the call. 1, or 0 for a pruned token. */
static int kvc_row(const kvq_retrieval *r, int32_t layer, int32_t head, int64_t tok, float *k,
                   float *v)
{
    if (r->kvc_inflight && tok >= r->akey_past) {
        const size_t d = (size_t)r->d;
        const size_t off = ((size_t)head * (size_t)r->akey_n + (size_t)(tok - r->akey_past)) * d;
        if (k)
            memcpy(k, r->akey + off, sizeof(float) * d);
        if (v)
            memcpy(v, r->aval + off, sizeof(float) * d);
        return 1;
    }
    return kvq_kvcache_row(r->kvc, layer, head, tok, k, v);
}

int kvq_rt_kvc_key(const rt_step *st, int64_t j, float *y)
{
    if (kvc_row(st->r, st->layer, st->head, kvq_rt_row_token(st->H, j), y, NULL))
        return 1;
    memset(y, 0, sizeof(float) * (size_t)st->r->d);
    return 0;
}

int64_t kvq_rt_kvc_filter(const rt_step *st, int32_t *rows, int64_t n)
{
    int64_t m = 0;
    for (int64_t a = 0; a < n; a++)
        if (kvc_row(st->r, st->layer, st->head, kvq_rt_row_token(st->H, rows[a]), NULL,
                    NULL)) /* the class only: no row is decoded */
            rows[m++] = rows[a];
    return m;
}

/* S->kvrows holds at least m rows [2, m, d] (0 when out of memory, S->status set). */
static int kvrows_reserve(rt_scratch *S, int64_t m, int32_t d)
{
    if (m <= S->kvrows_cap)
        return 1;
    if (!kvq_rt_grow((void **)&S->kvrows, sizeof(float) * 2 * (size_t)m * d)) {
        if (!S->status)
            S->status = kvq_err_set(&S->err, KVQ_E_NOMEM, "retrieval: out of memory");
        return 0;
    }
    S->kvrows_cap = m;
    return 1;
}

void kvq_rt_kvc_attend(const rt_step *st, const int32_t *att, int64_t m)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs;
    S->rr_kept = 0; /* the logits are computed here from the decoded rows */
    memset(S->o, 0, sizeof(float) * (size_t)gs * d);
    if (!kvrows_reserve(S, m, d))
        return;
    float *K = S->kvrows, *V = S->kvrows + (size_t)m * d;
    int32_t *tok = S->sel; /* free after the selection */
    for (int64_t a = 0; a < m; a++) {
        tok[a] = (int32_t)kvq_rt_row_token(st->H, att[a]);
        if (!kvc_row(r, st->layer, st->head, tok[a], K + (size_t)a * d,
                     V + (size_t)a * d)) { /* filtered before: not reached */
            memset(K + (size_t)a * d, 0, sizeof(float) * (size_t)d);
            memset(V + (size_t)a * d, 0, sizeof(float) * (size_t)d);
        }
    }
    if (m < 1)
        return;
    kvq_rk_logits(r->p.isa, S->qi, gs, d, K, KVQ_DT_F32, d, NULL, m, r->scale, S->logits, m);
    kvq_rt_softcap(S->logits, gs, m, m, r->softcap);
    kvq_rk_softmax(r->p.isa, S->logits, gs, m, m);
    kvq_rk_mix(r->p.isa, S->logits, gs, m, V, KVQ_DT_F32, d, NULL, m, d, S->o);
    if (!r->kvc_inflight)
        kvq_kvcache_count(r->kvc, st->layer, st->head, tok, m, S->logits, m);
}

void kvq_rt_kvc_exact(const rt_step *st)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs;
    const int64_t lo = st->lo, nv = st->nvis - lo;
    memset(S->pfull, 0, sizeof(float) * (size_t)gs * nv);
    memset(S->ofull, 0, sizeof(float) * (size_t)gs * d);
    if (!kvrows_reserve(S, nv, d))
        return;
    float *K = S->kvrows, *V = S->kvrows + (size_t)nv * d;
    int32_t *row = S->osel; /* the held rows; the oracle's selection is made after */
    int64_t m = 0;
    for (int64_t j = lo; j < st->nvis; j++)
        if (kvc_row(r, st->layer, st->head, kvq_rt_row_token(st->H, j), K + (size_t)m * d,
                    V + (size_t)m * d))
            row[m++] = (int32_t)j;
    if (m < 1)
        return;
    float *p = S->logits; /* [gs, m]: the step is done with it */
    kvq_rk_logits(r->p.isa, S->qi, gs, d, K, KVQ_DT_F32, d, NULL, m, r->scale, p, m);
    kvq_rt_softcap(p, gs, m, m, r->softcap);
    kvq_rk_softmax(r->p.isa, p, gs, m, m);
    kvq_rk_mix(r->p.isa, p, gs, m, V, KVQ_DT_F32, d, NULL, m, d, S->ofull);
    for (int32_t g = 0; g < gs; g++)
        for (int64_t a = 0; a < m; a++)
            S->pfull[(size_t)g * nv + (row[a] - lo)] = p[(size_t)g * m + a];
}

void kvq_rt_kvc_prefill(const kvq_retrieval *r, int32_t h, const kvq_attn_call *c, int64_t past,
                        rt_scratch *S)
{
    const int32_t d = r->d;
    const size_t n = (size_t)c->n;
    float *K = S->krot, *V = S->vbuf; /* [past + n, d] each (scratch_reserve) */
    int64_t pe = 0; /* earlier tokens held (by token: the row order does not matter) */
    for (int64_t j = 0; j < past; j++)
        pe += kvq_kvcache_row(r->kvc, c->layer, h, j, K + (size_t)pe * d, V + (size_t)pe * d);
    memcpy(K + (size_t)pe * d, r->akey + (size_t)h * n * d, sizeof(float) * n * d);
    memcpy(V + (size_t)pe * d, r->aval + (size_t)h * n * d, sizeof(float) * n * d);
    kvq_rt_prefill_rows(r, c, h, K, V, pe, S);
}

/* Decode steps of the call's rows i, one row after another (Algorithm 1 runs per token),
 * the KV heads of a row in parallel. */
static void kvc_steps(kvq_retrieval *r, const kvq_attn_call *c, int64_t past, int policy,
                      kvq_err *err, kvq_status *s)
{
    const int32_t d = r->d, gs = r->gs, nh = r->n_heads;
    for (int64_t i = 0; i < c->n && !*s; i++) {
        if ((*s = kvq_kvcache_put(r->kvc, c->layer, i, c->pos, c->k, c->v, err)))
            return;
#pragma omp parallel for num_threads(r->n_scr) schedule(dynamic, 1)
        for (int32_t h = 0; h < r->n_kv; h++) {
            rt_scratch *S = &r->scr[kvq_rt_thread_id()];
            const size_t off = ((size_t)i * nh + (size_t)h * gs) * d;
            kvq_rt_step(r, c->layer, h, c->q + off, c->pos[i], past + i + 1, i == c->n - 1, S,
                        c->out + off, d);
            kvq_err e = {0};
            kvq_status ps = policy ? kvq_kvcache_policy(r->kvc, c->layer, h, &e) : KVQ_OK;
            if (ps) {
#pragma omp critical(kvq_kvc_status)
                if (!S->status) {
                    S->status = ps;
                    S->err = e;
                }
            }
        }
        for (int32_t t = 0; t < r->n_scr; t++)
            if (r->scr[t].status && !*s)
                *s = kvq_err_set(err, r->scr[t].status, "%s", r->scr[t].err.msg);
    }
}

/* The call attended by r over the compressed cache: an exact prefill (the earlier
 * tokens' rows as the cache holds them before the chunk is put, the chunk's own from the
 * call), or one step per row and KV head (the rows were put: LeanKV's prompt, whose
 * probabilities the cache's own exact attention counts). */
static void plain_attend(kvq_retrieval *r, const kvq_attn_call *c, int64_t past)
{
    rt_layer *L = &r->layer[c->layer];
    const int32_t d = r->d, gs = r->gs, nh = r->n_heads;
    if (c->n > 1 && r->p.prefill_full) {
#pragma omp parallel for num_threads(r->n_scr) schedule(dynamic, 1)
        for (int32_t h = 0; h < r->n_kv; h++)
            kvq_rt_prefill_head(r, L, h, c, past, &r->scr[kvq_rt_thread_id()]);
    } else {
        const int64_t items = (int64_t)c->n * r->n_kv;
        r->kvc_inflight = 1;
#pragma omp parallel for num_threads(r->n_scr) schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t i = it / r->n_kv;
            const int32_t h = (int32_t)(it % r->n_kv);
            const size_t off = ((size_t)i * nh + (size_t)h * gs) * d;
            kvq_rt_step(r, c->layer, h, c->q + off, c->pos[i], past + i + 1, i == c->n - 1,
                        &r->scr[kvq_rt_thread_id()], c->out + off, d);
        }
        r->kvc_inflight = 0;
    }
}

kvq_status kvq_rt_kvc_call(kvq_retrieval *r, const kvq_attn_call *c, kvq_err *err)
{
    rt_layer *L = &r->layer[c->layer];
    const int64_t past = L->len - c->n; /* the rows were appended to r (its selector's data) */
    const int prefill = c->n > 1 && r->p.prefill_full;
    kvq_status s = KVQ_OK;
    for (int32_t t = 0; t < r->n_scr; t++)
        r->scr[t].status = KVQ_OK;
    if (prefill) /* before the chunk's rows enter the cache (and its policy moves rows) */
        plain_attend(r, c, past);
    if (kvq_kvcache_in_prompt(r->kvc, c->layer)) {
        /* LeanKV's prompt: attended by the compressed cache (exactly, counting the
         * significance that classifies it); r's outputs from its prefill, or from steps
         * over the rows the cache holds (exact in the prompt) */
        if ((s = kvq_kvcache_attend_aside(r->kvc, c, err)))
            return s;
        if (!prefill)
            plain_attend(r, c, past);
    } else if (prefill) {
        /* an exact prefill after the prompt: the rows put, one policy step a token */
        for (int64_t i = 0; i < c->n && !s; i++) {
            s = kvq_kvcache_put(r->kvc, c->layer, i, c->pos, c->k, c->v, err);
            for (int32_t h = 0; h < r->n_kv && !s; h++)
                s = kvq_kvcache_policy(r->kvc, c->layer, h, err);
        }
        if (s)
            return s;
    } else {
        kvc_steps(r, c, past, 1, err, &s);
    }
    for (int32_t t = 0; t < r->n_scr; t++) {
        rt_sums *b = &r->scr[t].sums;
        kvq_retrieval_stats_add(&r->sums, b);
        memset(b, 0, sizeof *b);
    }
    for (int32_t t = 0; t < r->n_scr && !s; t++) /* out of memory in a step */
        if (r->scr[t].status)
            s = kvq_err_set(err, r->scr[t].status, "%s", r->scr[t].err.msg);
    return s;
}
