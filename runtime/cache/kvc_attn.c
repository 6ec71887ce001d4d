/*
 * runtime/cache/kvc_attn.c — full attention over a compressed KV cache (kvq/kvcache.h):
 * the attention backend that keeps one LeanKV or PATS cache per (layer, KV head)
 * (runtime/cache/kvc.h) and attends every query over the rows as stored.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/kvcache.h"
#include "kvq/rope.h"
#include "runtime/cache/kvc.h"

struct kvq_kvcache {
    kvq_kvcache_params p;
    int32_t n_layers, n_heads, n_kv, d, gs;
    kvq_rope rope;
    double theta[KVQ_ROPE_MAX_DIM / 2];
    kvq_rt_lk_head *lk;     /* [n_layers * n_kv] (LeanKV) */
    kvq_rt_pats_head *pt;   /* [n_layers * n_kv] (PATS) */
    kvq_status *hs;         /* [n_kv] each head's status of a call */
    kvq_err *he;            /* [n_kv] */
    float *qbuf, *kbuf;     /* [rows, n_heads, d], [rows, n_kv, d] rotated */
    int64_t buf_rows;
    kvq_kvcache_memory done; /* sequences ended */
    kvq_status broken;       /* a reset that could not make the heads again */
    kvq_err berr;
    float *aside;            /* kvq_kvcache_attend_aside's outputs */
    size_t aside_n;
};

static const char *const kind_names[] = {"f16", "leankv", "pats", "leankv+pats"};

const char *kvq_kv_kind_name(kvq_kv_kind k)
{
    return (unsigned)k < 4 ? kind_names[k] : "unknown";
}

int kvq_kv_kind_parse(const char *name, kvq_kv_kind *k)
{
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, kind_names[i])) {
            *k = (kvq_kv_kind)i;
            return 0;
        }
    return -1;
}

int kvq_kvcache_schedule_parse(const char *name, int32_t *s)
{
    return kvq_rt_pats_schedule_parse(name, s);
}

kvq_kvcache_params kvq_kvcache_params_default(void)
{
    const kvq_rt_lk_params l = kvq_rt_lk_params_default();
    kvq_kvcache_params p = {.kind = KVQ_KV_LEANKV, .alpha_h = l.alpha_h, .alpha_l = l.alpha_l,
                            .window = l.window, .schedule = KVQ_RT_PATS_MIDDLE_HEAVY,
                            .b_min = 2, .b_max = 8, .prompt_tokens = 0, .max_tokens = 4096};
    return p;
}

static kvq_rt_lk_params lk_params(const kvq_kvcache_params *p)
{
    kvq_rt_lk_params l = kvq_rt_lk_params_default();
    l.alpha_h = p->alpha_h;
    l.alpha_l = p->alpha_l;
    l.window = p->window;
    return l;
}

/* (Re)makes every head's empty cache. */
static kvq_status heads_init(kvq_kvcache *c, kvq_err *err)
{
    const int64_t nh = (int64_t)c->n_layers * c->n_kv;
    kvq_status s = KVQ_OK;
    const kvq_rt_lk_params l = lk_params(&c->p);
    const kvq_rt_pats_params pp = {.schedule = c->p.schedule, .b_min = c->p.b_min,
                                   .b_max = c->p.b_max};
    for (int64_t i = 0; i < nh && !s; i++) {
        if (c->p.kind != KVQ_KV_PATS) { /* leankv, leankv+pats */
            s = kvq_rt_lk_head_init(&c->lk[i], c->d, c->gs, &l, err);
            if (!s && c->p.prompt_tokens == 0)
                s = kvq_rt_lk_end_prompt(&c->lk[i], err); /* no prompt: generation only */
        } else {
            s = kvq_rt_pats_head_init(&c->pt[i], c->d, c->gs, c->p.max_tokens, &pp, err);
        }
    }
    return s;
}

static void heads_free(kvq_kvcache *c)
{
    const int64_t nh = (int64_t)c->n_layers * c->n_kv;
    for (int64_t i = 0; i < nh; i++) {
        if (c->lk)
            kvq_rt_lk_head_free(&c->lk[i]);
        if (c->pt)
            kvq_rt_pats_head_free(&c->pt[i]);
    }
}

/* The current sequence's memory added to m. */
static void memory_add(const kvq_kvcache *c, kvq_kvcache_memory *m)
{
    const int64_t nh = (int64_t)c->n_layers * c->n_kv;
    const int64_t tokens = c->lk ? c->lk[0].n : c->pt[0].n;
    m->tokens += (double)tokens;
    m->bytes_f16 += (double)tokens * (double)nh * 4.0 * c->d;
    for (int64_t i = 0; i < nh; i++) {
        if (c->lk) {
            double lo, hi, ex;
            kvq_rt_lk_bytes(&c->lk[i], &lo, &hi, &ex);
            m->bytes_low += lo;
            m->bytes_high += hi;
            m->bytes_exact += ex;
            m->bytes += lo + hi + ex;
            for (int64_t j = 0; j < c->lk[i].n; j++)
                m->pruned += c->lk[i].cls[j] == KVQ_RT_LK_PRUNED;
        } else {
            m->bytes_high += (double)c->pt[i].bytes;
            m->bytes += (double)c->pt[i].bytes;
        }
    }
}

void kvq_kvcache_memory_get(const kvq_kvcache *c, kvq_kvcache_memory *out)
{
    *out = c->done;
    memory_add(c, out);
}

static void kvcache_reset(void *user)
{
    kvq_kvcache *c = user;
    memory_add(c, &c->done);
    heads_free(c);
    c->broken = heads_init(c, &c->berr); /* out of memory: the next call reports it */
}

kvq_status kvq_kvcache_begin(kvq_kvcache *c, int64_t prompt_tokens, int64_t n_tokens,
                             kvq_err *err)
{
    if (prompt_tokens < 0 || n_tokens < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "kv cache: prompt %lld of %lld tokens",
                           (long long)prompt_tokens, (long long)n_tokens);
    memory_add(c, &c->done);
    heads_free(c);
    c->p.prompt_tokens = prompt_tokens;
    c->p.max_tokens = n_tokens;
    c->broken = heads_init(c, err);
    if (c->broken)
        c->berr = *err;
    return c->broken;
}

void kvq_kvcache_free(kvq_kvcache *c)
{
    if (!c)
        return;
    heads_free(c);
    free(c->lk);
    free(c->pt);
    free(c->hs);
    free(c->he);
    free(c->qbuf);
    free(c->kbuf);
    free(c->aside);
    free(c);
}

kvq_status kvq_kvcache_create(const kvq_model_config *cfg, const kvq_kvcache_params *p,
                              kvq_kvcache **out, kvq_err *err)
{
    kvq_status s;
    *out = NULL;
    if (p->kind != KVQ_KV_LEANKV && p->kind != KVQ_KV_PATS && p->kind != KVQ_KV_LEANKV_PATS)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "kv cache %s: not a compressed cache kind",
                           kvq_kv_kind_name(p->kind));
    if (cfg->sliding_window > 0)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "kv cache %s: models with a sliding attention "
                           "window are not supported", kvq_kv_kind_name(p->kind));
    const kvq_rt_lk_params l = lk_params(p);
    const kvq_rt_pats_params pp = {.schedule = p->schedule, .b_min = p->b_min, .b_max = p->b_max};
    if (p->kind != KVQ_KV_PATS && (s = kvq_rt_lk_check(&l, err)))
        return s;
    if (p->kind != KVQ_KV_LEANKV && (s = kvq_rt_pats_check(&pp, err)))
        return s;
    if (p->prompt_tokens < 0 || p->max_tokens < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "kv cache: prompt_tokens %lld (>= 0), "
                           "max_tokens %lld (>= 1)", (long long)p->prompt_tokens,
                           (long long)p->max_tokens);
    kvq_kvcache *c = calloc(1, sizeof *c);
    if (!c)
        return kvq_err_set(err, KVQ_E_NOMEM, "kv cache: out of memory");
    c->p = *p;
    c->n_layers = cfg->n_layers;
    c->n_heads = cfg->n_heads;
    c->n_kv = cfg->n_kv_heads;
    c->d = cfg->head_dim;
    c->gs = cfg->n_heads / cfg->n_kv_heads;
    c->rope = cfg->rope;
    kvq_rope_freqs(&c->rope, c->theta);
    const size_t nh = (size_t)c->n_layers * (size_t)c->n_kv;
    if (p->kind != KVQ_KV_PATS)
        c->lk = calloc(nh, sizeof *c->lk);
    else
        c->pt = calloc(nh, sizeof *c->pt);
    c->hs = calloc((size_t)c->n_kv, sizeof *c->hs);
    c->he = calloc((size_t)c->n_kv, sizeof *c->he);
    if ((!c->lk && !c->pt) || !c->hs || !c->he) {
        kvq_kvcache_free(c);
        return kvq_err_set(err, KVQ_E_NOMEM, "kv cache: out of memory");
    }
    if ((s = heads_init(c, err))) {
        kvq_kvcache_free(c);
        return s;
    }
    *out = c;
    return KVQ_OK;
}

/* Appends a token's k, v [d] to LeanKV head H; under leankv+pats both truncated first
 * by PATS's b(t) for the token's place t = H->n + 1 in the sequence (kvq_rt_pats_truncate:
 * f16, its low b(t) mantissa bits dropped), so that LeanKV holds and quantizes those. */
static kvq_status lk_put(const kvq_kvcache *c, kvq_rt_lk_head *H, const float *k,
                         const float *v, kvq_err *err)
{
    if (c->p.kind != KVQ_KV_LEANKV_PATS)
        return kvq_rt_lk_append(H, k, v, err);
    const kvq_rt_pats_params pp = {.schedule = c->p.schedule, .b_min = c->p.b_min,
                                   .b_max = c->p.b_max};
    const int32_t b = kvq_rt_pats_bits(&pp, H->n + 1, c->p.max_tokens);
    float kt[512], vt[512];
    kvq_status s = kvq_rt_pats_truncate(k, c->d, b, kt, err);
    if (!s)
        s = kvq_rt_pats_truncate(v, c->d, b, vt, err);
    return s ? s : kvq_rt_lk_append(H, kt, vt, err);
}

/* Token i of the call for KV head h of the layer: append, attend, the policy. */
static kvq_status head_token(kvq_kvcache *c, int64_t hi, const float *k, const float *v,
                             const float *q, float *o, kvq_err *err)
{
    const float scale = 1.0f / sqrtf((float)c->d);
    kvq_status s;
    if (c->lk) {
        kvq_rt_lk_head *H = &c->lk[hi];
        if ((s = lk_put(c, H, k, v, err)))
            return s;
        const int generation = H->prompt_done;
        kvq_rt_lk_attend(H, q, scale, o);
        if (!generation)
            return H->n == c->p.prompt_tokens ? kvq_rt_lk_end_prompt(H, err) : KVQ_OK;
        return kvq_rt_lk_step(H, err);
    }
    kvq_rt_pats_head *P = &c->pt[hi];
    if ((s = kvq_rt_pats_append(P, k, v, err)))
        return s;
    kvq_rt_pats_attend(P, q, scale, o);
    return KVQ_OK;
}

static kvq_status kvcache_attend(void *user, const kvq_attn_call *call, kvq_err *err)
{
    kvq_kvcache *c = user;
    const int32_t d = c->d, nkv = c->n_kv, nq = c->n_heads, gs = c->gs;
    const int64_t n = call->n;
    if (c->broken)
        return kvq_err_set(err, c->broken, "%s", c->berr.msg);
    if (call->layer < 0 || call->layer >= c->n_layers || n < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "kv cache: bad attention call");
    if (n > c->buf_rows) {
        float *qb = realloc(c->qbuf, sizeof(float) * (size_t)n * nq * d);
        if (qb)
            c->qbuf = qb;
        float *kb = realloc(c->kbuf, sizeof(float) * (size_t)n * nkv * d);
        if (kb)
            c->kbuf = kb;
        if (!qb || !kb)
            return kvq_err_set(err, KVQ_E_NOMEM, "kv cache: out of memory");
        c->buf_rows = n;
    }
    memcpy(c->qbuf, call->q, sizeof(float) * (size_t)n * nq * d);
    memcpy(c->kbuf, call->k, sizeof(float) * (size_t)n * nkv * d);
    for (int64_t i = 0; i < n; i++) {
        kvq_rope_apply(&c->rope, c->theta, c->qbuf + (size_t)i * nq * d, nq, call->pos[i]);
        kvq_rope_apply(&c->rope, c->theta, c->kbuf + (size_t)i * nkv * d, nkv, call->pos[i]);
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->p.threads > 0 ? c->p.threads : omp_get_max_threads())
    for (int32_t h = 0; h < nkv; h++) {
        const int64_t hi = (int64_t)call->layer * nkv + h;
        c->hs[h] = KVQ_OK;
        for (int64_t i = 0; i < n && !c->hs[h]; i++) {
            const size_t ko = ((size_t)i * nkv + h) * d, qo = ((size_t)i * nq + (size_t)h * gs) * d;
            c->hs[h] = head_token(c, hi, c->kbuf + ko, call->v + ko, c->qbuf + qo,
                                  call->out + qo, &c->he[h]);
        }
    }
    for (int32_t h = 0; h < nkv; h++)
        if (c->hs[h])
            return kvq_err_set(err, c->hs[h], "%s", c->he[h].msg);
    return KVQ_OK;
}

kvq_attn_backend kvq_kvcache_backend(kvq_kvcache *c)
{
    kvq_attn_backend b = {.name = kvq_kv_kind_name(c->p.kind), .user = c,
                          .attend = kvcache_attend, .reset = kvcache_reset};
    return b;
}

/* One token's rows of a layer into the cache: k, v [n_kv, d] (k before RoPE), k rotated
 * to pos in kr ([n_kv, d] scratch), then each KV head's rows appended; LeanKV's prompt
 * ends when a head holds prompt_tokens rows, and with step a token after the prompt runs
 * the policy step (kvq_kvcache_put leaves that to kvq_kvcache_policy). */
static kvq_status token_put(kvq_kvcache *c, int32_t layer, const float *k, const float *v,
                            int64_t pos, int step, float *kr, kvq_err *err)
{
    const int32_t d = c->d, nkv = c->n_kv;
    memcpy(kr, k, sizeof(float) * (size_t)nkv * d);
    kvq_rope_apply(&c->rope, c->theta, kr, nkv, pos);
    kvq_status s = KVQ_OK;
    for (int32_t h = 0; h < nkv && !s; h++) {
        const int64_t hi = (int64_t)layer * nkv + h;
        const float *kh = kr + (size_t)h * d, *vh = v + (size_t)h * d;
        if (!c->lk) {
            s = kvq_rt_pats_append(&c->pt[hi], kh, vh, err);
            continue;
        }
        kvq_rt_lk_head *H = &c->lk[hi];
        if (!(s = lk_put(c, H, kh, vh, err)))
            s = step && H->prompt_done ? kvq_rt_lk_step(H, err)
                : !H->prompt_done && H->n == c->p.prompt_tokens ? kvq_rt_lk_end_prompt(H, err)
                : KVQ_OK;
    }
    return s;
}

kvq_status kvq_kvcache_append(kvq_kvcache *c, int32_t layer, int64_t n, const int64_t *pos,
                              const float *k, const float *v, kvq_err *err)
{
    const int32_t d = c->d, nkv = c->n_kv;
    if (c->broken)
        return kvq_err_set(err, c->broken, "%s", c->berr.msg);
    if (layer < 0 || layer >= c->n_layers || n < 1 || !pos || !k || !v)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "kv cache: bad append (layer %d, %lld rows)",
                           (int)layer, (long long)n);
    float *kr = malloc(sizeof(float) * (size_t)nkv * d);
    if (!kr)
        return kvq_err_set(err, KVQ_E_NOMEM, "kv cache: out of memory");
    kvq_status s = KVQ_OK;
    for (int64_t i = 0; i < n && !s; i++) {
        const size_t o = (size_t)i * nkv * d;
        s = token_put(c, layer, k + o, v + o, pos[i], 1, kr, err);
    }
    free(kr);
    return s;
}

int64_t kvq_kvcache_length(const kvq_kvcache *c, int32_t layer)
{
    if (layer < 0 || layer >= c->n_layers)
        return 0;
    const int64_t hi = (int64_t)layer * c->n_kv;
    return c->lk ? c->lk[hi].n : c->pt[hi].n;
}

double kvq_kvcache_bytes(const kvq_kvcache *c)
{
    kvq_kvcache_memory m;
    memset(&m, 0, sizeof m);
    memory_add(c, &m);
    return m.bytes;
}

/* ---- retrieval over the cache (runtime/cache/kvc_retr.c) ----------------------------- */

int kvq_kvcache_in_prompt(const kvq_kvcache *c, int32_t layer)
{
    return c->lk && layer >= 0 && layer < c->n_layers &&
           !c->lk[(int64_t)layer * c->n_kv].prompt_done;
}

int kvq_kvcache_row(const kvq_kvcache *c, int32_t layer, int32_t head, int64_t tok, float *k,
                    float *v)
{
    const int32_t d = c->d;
    const int64_t hi = (int64_t)layer * c->n_kv + head;
    if (c->pt) {
        const kvq_rt_pats_head *P = &c->pt[hi];
        if (tok < 0 || tok >= P->n)
            return 0;
        if (k)
            kvq_rk_pats_unpack(P->kr[tok], d, P->b[tok], k);
        if (v)
            kvq_rk_pats_unpack(P->vr[tok], d, P->b[tok], v);
        return 1;
    }
    const kvq_rt_lk_head *H = &c->lk[hi];
    if (tok < 0 || tok >= H->n)
        return 0;
    if (!H->prompt_done) {
        const float *x = H->exact + (size_t)tok * 2 * d;
        if (k)
            memcpy(k, x, sizeof(float) * (size_t)d);
        if (v)
            memcpy(v, x + d, sizeof(float) * (size_t)d);
        return 1;
    }
    const int cls = H->cls[tok];
    if (cls == KVQ_RT_LK_PRUNED)
        return 0;
    const kvq_rt_lk_pool *P = &H->pool[cls];
    const uint8_t *row = P->data + (size_t)H->slot[tok] * P->row;
    if (k)
        kvq_rk_lkq_dequant(row, d, P->kb, k);
    if (v)
        kvq_rk_lkq_dequant(row + P->krow, d, P->vb, v);
    return 1;
}

kvq_status kvq_kvcache_put(kvq_kvcache *c, int32_t layer, int64_t i, const int64_t *pos,
                           const float *k, const float *v, kvq_err *err)
{
    const int32_t d = c->d, nkv = c->n_kv;
    if (c->broken)
        return kvq_err_set(err, c->broken, "%s", c->berr.msg);
    if (layer < 0 || layer >= c->n_layers)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "kv cache: bad put (layer %d)", (int)layer);
    float *kr = malloc(sizeof(float) * (size_t)nkv * d);
    if (!kr)
        return kvq_err_set(err, KVQ_E_NOMEM, "kv cache: out of memory");
    const size_t o = (size_t)i * nkv * d;
    kvq_status s = token_put(c, layer, k + o, v + o, pos[i], 0, kr, err);
    free(kr);
    return s;
}

void kvq_kvcache_count(kvq_kvcache *c, int32_t layer, int32_t head, const int32_t *tok,
                       int64_t m, const float *p, int64_t ld)
{
    if (!c->lk)
        return;
    kvq_rt_lk_head *H = &c->lk[(int64_t)layer * c->n_kv + head];
    if (!H->prompt_done)
        return;
    for (int32_t g = 0; g < H->gs; g++)
        for (int64_t a = 0; a < m; a++)
            if (tok[a] < H->n - 1) /* the query's own token: not a later query */
                H->acc[(size_t)tok[a] * H->gs + g] += p[(size_t)g * ld + a];
    H->nq++;
}

kvq_status kvq_kvcache_policy(kvq_kvcache *c, int32_t layer, int32_t head, kvq_err *err)
{
    return c->lk ? kvq_rt_lk_step(&c->lk[(int64_t)layer * c->n_kv + head], err) : KVQ_OK;
}

kvq_status kvq_kvcache_attend_aside(kvq_kvcache *c, const kvq_attn_call *call, kvq_err *err)
{
    const size_t need = (size_t)call->n * c->n_heads * c->d;
    if (need > c->aside_n) {
        float *o = realloc(c->aside, sizeof(float) * need);
        if (!o)
            return kvq_err_set(err, KVQ_E_NOMEM, "kv cache: out of memory");
        c->aside = o;
        c->aside_n = need;
    }
    kvq_attn_call a = *call;
    a.out = c->aside;
    return kvcache_attend(c, &a, err);
}
