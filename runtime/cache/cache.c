/*
 * cache.c — the per-sequence KV cache of a decoding context (rt_layer, rt_head of
 * runtime_internal.h): the rows of keys and values in the cache dtype, their positions
 * and tokens, the table of RoPE angles, and how they grow. The cache knows no selector:
 * what a selector keeps per row lives in rt_head.sdata, grown and filled through its
 * table (runtime/select/selector.h).
 *
 *   append   K and V into the cache (f16 or f32; under ROPE the keys rotated, then
 *            rounded: keys.c) and the positions; then the selector's data of the rows
 *            (its append: codes, fier bits, quest page bounds), the rows' tokens, the
 *            length, and the selector's appended (the codebook's row order).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kvq/half.h"
#include "kvq/runtime.h"
#include "kvq/util.h"
#include "runtime/runtime_internal.h"
#include "runtime/select/selector.h"

int kvq_rt_grow(void **p, size_t bytes) { return kvq_resize(p, bytes, 1) == 0; }

/* Grows a K or V array from old to bytes. Arrays of 4 MiB and more are 2 MiB aligned
 * and advised for transparent huge pages: a decode step reads a few percent of the
 * rows at random, and with 4 KiB pages nearly every row would cost a TLB miss. */
#define HUGE_BYTES ((size_t)4 << 20)

void *kvq_rt_cache_alloc(size_t bytes)
{
    if (bytes < HUGE_BYTES)
        return malloc(bytes ? bytes : 1);
    void *q = NULL;
    if (posix_memalign(&q, (size_t)2 << 20, bytes))
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(q, bytes, MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
    return q;
}

int kvq_rt_grow_cache(void **p, size_t old, size_t bytes)
{
    if (bytes < HUGE_BYTES)
        return kvq_rt_grow(p, bytes);
    void *q = kvq_rt_cache_alloc(bytes);
    if (!q)
        return 0;
    if (*p && old)
        memcpy(q, *p, old < bytes ? old : bytes);
    free(*p);
    *p = q;
    return 1;
}

/* Grows layer L to hold `need` rows (doubling, capped at max_tokens): its positions,
 * each head's keys, values and tokens, and the selector's data (its reserve). */
kvq_status kvq_rt_layer_reserve(kvq_retrieval *r, rt_layer *L, int64_t need, kvq_err *err)
{
    if (need <= L->cap)
        return KVQ_OK;
    int64_t cap = L->cap ? L->cap : 256;
    while (cap < need)
        cap *= 2;
    if (cap > r->p.max_tokens)
        cap = r->p.max_tokens;
    const size_t d = (size_t)r->d, c = (size_t)cap;
    const rt_selector *sel = kvq_rt_selector(r->p.selector);
    int ok = kvq_rt_grow((void **)&L->pos, c * sizeof *L->pos);
    for (int32_t h = 0; ok && h < r->n_kv; h++) {
        rt_head *H = &L->head[h];
        const size_t old = (size_t)L->cap * d * r->es;
        if (!r->kvc) /* over a compressed cache the context holds no rows */
            ok = kvq_rt_grow_cache(&H->k, old, c * d * r->es) &&
                 kvq_rt_grow_cache(&H->v, old, c * d * r->es);
        if (ok && H->tok)
            ok = kvq_rt_grow((void **)&H->tok, c * sizeof *H->tok);
        if (ok && sel->reserve)
            ok = sel->reserve(r, L, H, cap);
    }
    if (!ok)
        return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory for %lld cached tokens",
                           (long long)cap);
    L->cap = cap;
    return KVQ_OK;
}

/* cos / sin of every position up to max_pos (angles in double, as kvq_rope_apply). */
kvq_status kvq_rt_rope_reserve(kvq_retrieval *r, int64_t max_pos, kvq_err *err)
{
    if (max_pos < r->rcap)
        return KVQ_OK;
    int64_t cap = r->rcap ? r->rcap : 256;
    while (cap <= max_pos)
        cap *= 2;
    const size_t half = (size_t)r->d / 2, old = (size_t)r->rcap * half * sizeof(float);
    /* huge pages as the K/V arrays: under rope every rotated key reads its row at random */
    if (!kvq_rt_grow_cache((void **)&r->rcos, old, (size_t)cap * half * sizeof(float)) ||
        !kvq_rt_grow_cache((void **)&r->rsin, old, (size_t)cap * half * sizeof(float)))
        return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
    for (int64_t p = r->rcap; p < cap; p++)
        for (size_t m = 0; m < half; m++) {
            const double a = (double)p * r->theta[m];
            r->rcos[(size_t)p * half + m] = (float)cos(a);
            r->rsin[(size_t)p * half + m] = (float)sin(a);
        }
    r->rcap = cap;
    return KVQ_OK;
}

/* Without rows (a compressed cache attached): the chunk's keys (rotated) and values as
 * the cache dtype would hold them, [n_kv, n, d] in r->akey and r->aval, for the
 * selectors' append (kvq_rt_append_key), the prefill (kvq_rt_kvc_prefill) and the steps
 * of LeanKV's prompt (r->kvc_inflight). */
static kvq_status append_keys(kvq_retrieval *r, const kvq_attn_call *c, int64_t past,
                              kvq_err *err)
{
    const size_t n = (size_t)c->n, d = (size_t)r->d, kvd = (size_t)r->n_kv * d;
    const size_t bytes = (size_t)r->n_kv * n * d * sizeof(float);
    if (bytes > r->akey_bytes) {
        if (!kvq_rt_grow((void **)&r->akey, bytes) || !kvq_rt_grow((void **)&r->aval, bytes))
            return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
        r->akey_bytes = bytes;
    }
    for (size_t h = 0; h < (size_t)r->n_kv; h++)
        for (size_t i = 0; i < n; i++) {
            kvq_rt_key_held(r, c->k + i * kvd + h * d, c->pos[i], r->akey + (h * n + i) * d);
            kvq_rt_key_pre(r, c->v + i * kvd + h * d, r->aval + (h * n + i) * d); /* rounded */
        }
    r->akey_past = past;
    r->akey_n = c->n;
    return KVQ_OK;
}

/* Appends the chunk's n tokens to layer c->layer: K, V, positions, the selector's data. */
kvq_status kvq_rt_append(kvq_retrieval *r, const kvq_attn_call *c, kvq_err *err)
{
    rt_layer *L = &r->layer[c->layer];
    const int64_t n = c->n, past = L->len, d = r->d, kvd = (int64_t)r->n_kv * d;
    kvq_status s;
    for (int64_t i = 0; i < n; i++) {
        L->pos[past + i] = c->pos[i];
        L->pos_unordered |= past + i > 0 && c->pos[i] <= L->pos[past + i - 1];
    }
    if (r->kvc && (s = append_keys(r, c, past, err)))
        return s;
    for (int32_t h = 0; !r->kvc && h < r->n_kv; h++) {
        rt_head *H = &L->head[h];
        for (int64_t i = 0; i < n; i++) {
            const float *v = c->v + i * kvd + h * d;
            kvq_rt_store_key(r, H, past + i, c->pos[i], c->k + i * kvd + h * d);
            if (r->es == 2)
                kvq_f32_to_f16(v, (uint16_t *)H->v + (size_t)(past + i) * d, (size_t)d);
            else
                memcpy((float *)H->v + (size_t)(past + i) * d, v, sizeof(float) * (size_t)d);
        }
    }
    const rt_selector *sel = kvq_rt_selector(r->p.selector);
    if (sel->append && (s = sel->append(r, L, c, past, err)))
        return s;
    for (int32_t h = 0; h < r->n_kv; h++)
        if (L->head[h].tok)
            for (int64_t i = 0; i < n; i++)
                L->head[h].tok[past + i] = (int32_t)(past + i);
    L->len = past + n;
    return sel->appended ? sel->appended(r, L, past, err) : KVQ_OK;
}

/* Frees what head H holds (the selector's data through its free_head). */
void kvq_rt_head_free(const kvq_retrieval *r, rt_head *H)
{
    const rt_selector *sel = kvq_rt_selector(r->p.selector);
    if (sel && sel->free_head)
        sel->free_head(H);
    free(H->k);
    free(H->v);
    free(H->sel);
    free(H->sel_tok);
    free(H->tok);
}
