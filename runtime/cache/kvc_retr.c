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
    if (c && r->local)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "retrieval over a compressed KV cache: "
                           "models with local layers are not supported");
    r->kvc = c;
    return KVQ_OK;
}

void kvq_rt_kvc_key(const rt_step *st, int64_t j, float *y)
{
    if (!kvq_kvcache_row(st->r->kvc, st->layer, st->head, kvq_rt_row_token(st->H, j), y, NULL))
        memset(y, 0, sizeof(float) * (size_t)st->r->d);
}

int64_t kvq_rt_kvc_filter(const rt_step *st, int32_t *rows, int64_t n)
{
    int64_t m = 0;
    for (int64_t a = 0; a < n; a++)
        if (kvq_kvcache_row(st->r->kvc, st->layer, st->head, kvq_rt_row_token(st->H, rows[a]),
                            NULL, NULL)) /* the class only: no row is decoded */
            rows[m++] = rows[a];
    return m;
}

void kvq_rt_kvc_attend(const rt_step *st, const int32_t *att, int64_t m)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs;
    S->rr_kept = 0; /* the logits are computed here from the decoded rows */
    memset(S->o, 0, sizeof(float) * (size_t)gs * d);
    if (m > S->kvrows_cap) {
        if (!kvq_rt_grow((void **)&S->kvrows, sizeof(float) * 2 * (size_t)m * d)) {
            if (!S->status)
                S->status = kvq_err_set(&S->err, KVQ_E_NOMEM, "retrieval: out of memory");
            return;
        }
        S->kvrows_cap = m;
    }
    float *K = S->kvrows, *V = S->kvrows + (size_t)m * d;
    int32_t *tok = S->sel; /* free after the selection */
    for (int64_t a = 0; a < m; a++) {
        tok[a] = (int32_t)kvq_rt_row_token(st->H, att[a]);
        if (!kvq_kvcache_row(r->kvc, st->layer, st->head, tok[a], K + (size_t)a * d,
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
    kvq_kvcache_count(r->kvc, st->layer, st->head, tok, m, S->logits, m);
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

/* The call attended as r attends it without a compressed cache (r's own rows): an exact
 * prefill, or one step per row and KV head. */
static void plain_attend(kvq_retrieval *r, const kvq_attn_call *c, int64_t past)
{
    struct kvq_kvcache *kc = r->kvc;
    rt_layer *L = &r->layer[c->layer];
    const int32_t d = r->d, gs = r->gs, nh = r->n_heads;
    r->kvc = NULL;
    if (c->n > 1 && r->p.prefill_full) {
#pragma omp parallel for num_threads(r->n_scr) schedule(dynamic, 1)
        for (int32_t h = 0; h < r->n_kv; h++)
            kvq_rt_prefill_head(r, L, h, c, past, &r->scr[kvq_rt_thread_id()]);
    } else {
        const int64_t items = (int64_t)c->n * r->n_kv;
#pragma omp parallel for num_threads(r->n_scr) schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t i = it / r->n_kv;
            const int32_t h = (int32_t)(it % r->n_kv);
            const size_t off = ((size_t)i * nh + (size_t)h * gs) * d;
            kvq_rt_step(r, c->layer, h, c->q + off, c->pos[i], past + i + 1, i == c->n - 1,
                        &r->scr[kvq_rt_thread_id()], c->out + off, d);
        }
    }
    r->kvc = kc;
}

kvq_status kvq_rt_kvc_call(kvq_retrieval *r, const kvq_attn_call *c, kvq_err *err)
{
    rt_layer *L = &r->layer[c->layer];
    const int64_t past = L->len - c->n; /* the rows were appended to r's cache */
    kvq_status s = KVQ_OK;
    for (int32_t t = 0; t < r->n_scr; t++)
        r->scr[t].status = KVQ_OK;
    if (kvq_kvcache_in_prompt(r->kvc, c->layer)) {
        /* LeanKV's prompt: attended by the compressed cache (exactly, counting the
         * significance that classifies it), r's outputs from its own exact prefill */
        if ((s = kvq_kvcache_attend_aside(r->kvc, c, err)))
            return s;
        plain_attend(r, c, past);
    } else if (c->n > 1 && r->p.prefill_full) {
        /* an exact prefill after the prompt: the rows put, one policy step a token */
        for (int64_t i = 0; i < c->n && !s; i++) {
            s = kvq_kvcache_put(r->kvc, c->layer, i, c->pos, c->k, c->v, err);
            for (int32_t h = 0; h < r->n_kv && !s; h++)
                s = kvq_kvcache_policy(r->kvc, c->layer, h, err);
        }
        if (s)
            return s;
        plain_attend(r, c, past);
    } else {
        kvc_steps(r, c, past, 1, err, &s);
    }
    for (int32_t t = 0; t < r->n_scr; t++) {
        rt_sums *b = &r->scr[t].sums;
        kvq_retrieval_stats_add(&r->sums, b);
        memset(b, 0, sizeof *b);
    }
    return s;
}
