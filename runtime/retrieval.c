/*
 * retrieval.c — the decoding context of kvq/runtime.h: its parameters, the per-thread
 * scratch, and the kvq_attn_backend that plugs the cache (runtime/cache/) and the
 * decode step (step.c) into the forward pass.
 *
 *   attend(call)  1. append the chunk to the cache (kvq_rt_append: K, V, positions and
 *                    the selector's data of every row, runtime/select/);
 *                 2. attend: exactly for prefill chunks (prefill_full), else one
 *                    retrieval step per query row and KV head (heads in parallel):
 *                    sinks + selection + window, exact attention over their union.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#include <sys/mman.h>

#include <cblas.h>

#include "kvq/half.h"
#include "kvq/runtime.h"
#include "kvq/util.h"
#include "runtime/runtime_internal.h"
#include "runtime/kernels/rk.h"
#include "runtime/local.h"
#include "runtime/select/selector.h"

#define MAX_POSITION ((int64_t)1 << 31)

/* ==========================================================================
 * Parameters
 * ========================================================================== */

kvq_retrieval_params kvq_retrieval_params_default(void)
{
    kvq_retrieval_params p;
    memset(&p, 0, sizeof p);
    p.selector = KVQ_SELECT_CODEBOOK;
    p.budget = (kvq_budget){.count = 0, .fraction = 0.06};
    p.sink = 4;
    p.window = 0;
    p.wrope_b = -1;
    p.positions = KVQ_POSITIONS_WROPE;
    p.score_pos = KVQ_SCORE_MEAN;
    p.group = KVQ_GROUP_SUM;
    p.rerank = 0; /* the rerank by rerank_extra: the budget plus 8% of the cache */
    p.rerank_extra = 0.08;
    p.resid_bits = 1;
    p.resid_wide = 64; /* with resid_share 1: every candidate through the stage */
    p.resid_group = KVQ_GROUP_MAX;
    p.resid_share = 1;
    p.tau = 0.9;
    p.fier_group = 32;
    p.quest_page = 16;
    p.cache_dtype = KVQ_DT_F16;
    p.prefill_full = 1;
    p.measure = 0;
    p.code_order = 1;
    p.max_tokens = (int64_t)1 << 20;
    p.threads = 1;
    p.isa = kvq_isa_best();
    p.device = KVQ_RETRIEVAL_DEVICE_CPU;
    return p;
}

static kvq_status check_params(const kvq_retrieval_params *p, const kvq_codebook_set *rt, kvq_err *err)
{
    const char *bad = NULL;
    if ((unsigned)p->selector >= KVQ_SELECT_COUNT)
        bad = "selector";
    else if (p->budget.count < 0 ||
             (p->budget.count == 0 && !(p->budget.fraction > 0 && p->budget.fraction <= 1)))
        bad = "budget";
    else if (p->sink < 0)
        bad = "sink";
    else if (p->window < 0)
        bad = "window";
    else if (p->wrope_b < -1 || p->wrope_b >= MAX_POSITION)
        bad = "wrope_b";
    else if (p->positions != KVQ_POSITIONS_WROPE && p->positions != KVQ_POSITIONS_ROPE)
        bad = "positions";
    else if ((unsigned)p->score_pos > KVQ_SCORE_BANDS)
        bad = "score_pos";
    else if (p->group != KVQ_GROUP_SUM && p->group != KVQ_GROUP_MAX)
        bad = "group";
    else if (!(p->rerank == 0 || (p->rerank >= 1 && p->rerank <= 64)))
        bad = "rerank";
    else if (!(p->rerank_extra >= 0 && p->rerank_extra < 1))
        bad = "rerank_extra";
    else if (!(p->resid_bits == 0 || p->resid_bits == 1 || p->resid_bits == 2 ||
               p->resid_bits == 4 || p->resid_bits == 8))
        bad = "resid_bits";
    else if (!(p->resid_wide == 0 || (p->resid_wide >= 1 && p->resid_wide <= 64)))
        bad = "resid_wide";
    else if (p->resid_group != KVQ_GROUP_SUM && p->resid_group != KVQ_GROUP_MAX)
        bad = "resid_group";
    else if (!(p->resid_share > 0 && p->resid_share <= 1))
        bad = "resid_share";
    else if (!(p->tau > 0 && p->tau <= 1))
        bad = "tau";
    else if (p->code_order != 0 && p->code_order != 1)
        bad = "code_order";
    else if (p->fier_group < 1)
        bad = "fier_group";
    else if (p->quest_page < 1)
        bad = "quest_page";
    else if (p->cache_dtype != KVQ_DT_F16 && p->cache_dtype != KVQ_DT_F32)
        bad = "cache_dtype (f16 or f32)";
    else if (p->max_tokens < 1 || p->max_tokens > MAX_POSITION)
        bad = "max_tokens";
    else if (p->threads < 1 || p->threads > 1024)
        bad = "threads";
    else if ((unsigned)p->device > KVQ_RETRIEVAL_DEVICE_CUDA)
        bad = "device";
    if (bad)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval: bad parameter %s", bad);
    if (kvq_selector_needs_artifact(p->selector) && !rt)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "retrieval: the %s selector needs an artifact (--artifact)",
                           kvq_selector_name(p->selector));
    return KVQ_OK;
}

/* The artifact must describe this model's attention (it was checked against the
 * model identity when opened; this guards a context built for another config). */
static kvq_status check_config(const kvq_model_config *c, const kvq_codebook_set *rt, kvq_err *err)
{
    kvq_model_id cid;
    kvq_model_id_from_config(c, "", &cid);
    return kvq_model_id_compare_attention(kvq_codebook_set_model(rt), "retrieval: artifact", &cid,
                                          "model", err);
}

/* Per-layer attention (kvq_model_layer_attn). The local layers (runtime/local.h) are
 * attended exactly over their window; every other layer goes through retrieval, which
 * holds one RoPE (the model's), one score scale and one softcap: each such layer must
 * have them. None of the supported architectures has a retrieval layer that differs
 * (gemma3's other RoPE base is on its local layers); a model that did is refused here,
 * by layer, rather than attended wrongly. */
static kvq_status check_layers(const kvq_model_config *c, float *scale, float *softcap,
                               kvq_err *err)
{
    int first = 1;
    kvq_layer_attn a0 = {0}, a;
    for (int32_t l = 0; l < c->n_layers; l++) {
        if (kvq_rt_layer_local(c, l))
            continue;
        kvq_model_layer_attn(c, l, &a);
        const kvq_rope *ra = &a.rope, *rm = &c->rope;
        const char *what = !a.use_rope ? "a layer without RoPE"
                           : ra->base != rm->base || ra->scaling != rm->scaling ||
                                     ra->factor != rm->factor
                               ? "a RoPE of its own"
                           : !first && (a.scale != a0.scale || a.softcap != a0.softcap)
                               ? "a score scale or softcap of its own"
                               : NULL;
        if (what)
            return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                               "retrieval: layer %d has %s (RoPE base %g, scale %g, softcap %g): "
                               "the retrieval runtime attends every non-local layer alike",
                               (int)l, what, ra->base, a.scale, a.softcap);
        if (first)
            a0 = a;
        first = 0;
    }
    *scale = (float)a0.scale;
    *softcap = (float)a0.softcap;
    return KVQ_OK;
}

/* ==========================================================================
 * Create / free
 * ========================================================================== */

static void scratch_free(const rt_selector *sel, rt_scratch *S)
{
    if (sel->scratch_free)
        sel->scratch_free(S);
    free(S->scores);
    free(S->tmp);
    free(S->work);
    free(S->mwork);
    free(S->sel);
    free(S->osel);
    free(S->att);
    free(S->msel);
    free(S->logits);
    free(S->pfull);
    free(S->krot);
    free(S->qb);
    free(S->qi);
    free(S->qx);
    free(S->o);
    free(S->ofull);
    free(S->pre);
    free(S->vbuf);
    free(S->qpre);
    free(S->kvrows);
}

void kvq_retrieval_free(kvq_retrieval *r)
{
    if (!r)
        return;
    const rt_selector *sel = kvq_rt_selector(r->p.selector);
    if (sel->close)
        sel->close(r);
    for (int32_t l = 0; r->layer && l < r->n_layers; l++) {
        rt_layer *L = &r->layer[l];
        for (int32_t h = 0; L->head && h < r->n_kv; h++)
            kvq_rt_head_free(r, &L->head[h]);
        free(L->head);
        free(L->pos);
        free(L->cb);
        free(L->tab);
    }
    for (int32_t t = 0; r->scr && t < r->n_scr; t++)
        scratch_free(sel, &r->scr[t]);
    kvq_rt_probe_free(r->probe);
    kvq_rt_local_free(r->local);
    free(r->layer);
    free(r->scr);
    free(r->rcos);
    free(r->rsin);
    free(r->akey);
    free(r->aval);
    free(r);
}

kvq_status kvq_retrieval_create(const kvq_model_config *cfg, const kvq_codebook_set *rt,
                                const kvq_retrieval_params *p, kvq_retrieval **out, kvq_err *err)
{
    kvq_status s;
    *out = NULL;
    kvq_retrieval_params P = p ? *p : kvq_retrieval_params_default();
    if ((s = check_params(&P, rt, err)) || (s = kvq_rope_check(&cfg->rope, err)))
        return s;
    if (cfg->n_layers < 1 || cfg->n_kv_heads < 1 || cfg->n_heads % cfg->n_kv_heads ||
        cfg->head_dim != cfg->rope.head_dim || cfg->head_dim > KVQ_ROPE_MAX_DIM)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval: inconsistent model config");
    if (rt && (s = check_config(cfg, rt, err)))
        return s;
    float scale = 0, softcap = 0;
    if ((s = check_layers(cfg, &scale, &softcap, err)))
        return s;
    P.isa = kvq_isa_clamp(P.isa);
    kvq_retrieval *r = calloc(1, sizeof *r);
    if (!r)
        return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
    r->p = P;
    r->rt = rt;
    r->n_layers = cfg->n_layers;
    r->n_heads = cfg->n_heads;
    r->n_kv = cfg->n_kv_heads;
    r->d = cfg->head_dim;
    r->gs = cfg->n_heads / cfg->n_kv_heads;
    r->rope = cfg->rope;
    r->window = P.window > 0 ? P.window : rt ? kvq_codebook_set_wrope_w(rt) : 64;
    r->sliding_window = cfg->sliding_window;
    r->sliding_from = cfg->sliding_from;
    r->scale = scale;
    r->softcap = softcap;
    if ((s = kvq_rt_local_create(cfg, P.max_tokens, P.threads, &r->local, err))) {
        free(r);
        return s;
    }
    if (r->local) /* the windowed layers are local: the others attend every token */
        r->sliding_window = 0;
    r->wrope_b = P.wrope_b >= 0 ? P.wrope_b : rt ? kvq_codebook_set_wrope_b(rt) : 2048;
    r->es = P.cache_dtype == KVQ_DT_F16 ? 2 : 4;
    r->keys_rotated = P.positions == KVQ_POSITIONS_ROPE; /* keys.c */
    kvq_rope_freqs(&r->rope, r->theta);
    for (int32_t m = 0; m < r->d / 2; m++) {
        const double a = (double)r->wrope_b * r->theta[m];
        r->bcos[m] = (float)cos(a);
        r->bsin[m] = (float)sin(a);
    }
    r->layer = calloc((size_t)r->n_layers, sizeof *r->layer);
    r->n_scr = P.threads;
    r->scr = calloc((size_t)r->n_scr, sizeof *r->scr);
    if (!r->layer || !r->scr)
        goto nomem;
    for (int32_t t = 0; t < r->n_scr; t++)
        r->scr[t].slot = t;
    for (int32_t l = 0; l < r->n_layers; l++) {
        rt_layer *L = &r->layer[l];
        L->head = calloc((size_t)r->n_kv, sizeof *L->head);
        L->cb = calloc((size_t)r->n_kv, sizeof *L->cb);
        L->tab = calloc((size_t)r->n_kv, sizeof *L->tab);
        if (!L->head || !L->cb || !L->tab)
            goto nomem;
        for (int32_t h = 0; rt && h < r->n_kv; h++) {
            L->cb[h] = kvq_codebook_set_at(rt, l, h);
            L->tab[h] = kvq_codebook_set_table(rt, l, h);
        }
    }
    r->device = kvq_rt_device_choose(&r->p, rt);
    const rt_selector *sel = kvq_rt_selector(r->p.selector);
    if (sel->open && (s = sel->open(r, err))) {
        kvq_retrieval_free(r);
        return s;
    }
    *out = r;
    return KVQ_OK;
nomem:
    kvq_retrieval_free(r);
    return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
}

const kvq_retrieval_params *kvq_retrieval_get_params(const kvq_retrieval *r) { return &r->p; }

int64_t kvq_retrieval_length(const kvq_retrieval *r)
{
    for (int32_t l = 0; l < r->n_layers; l++) /* layer 0 may be local */
        if (!kvq_rt_local_has(r->local, l))
            return r->layer[l].len;
    return kvq_rt_local_length(r->local, 0);
}

void kvq_retrieval_reset(kvq_retrieval *r)
{
    const rt_selector *sel = kvq_rt_selector(r->p.selector);
    r->seq_gen++;
    kvq_rt_local_reset(r->local);
    for (int32_t l = 0; l < r->n_layers; l++) {
        rt_layer *L = &r->layer[l];
        L->len = 0;
        L->pos_unordered = 0;
        for (int32_t h = 0; h < r->n_kv; h++) {
            L->head[h].n_sel = 0;
            free(L->head[h].tok);
            L->head[h].tok = NULL;
            L->head[h].sorted_end = 0;
            if (sel->reset_head)
                sel->reset_head(r, L, h, &L->head[h]);
        }
    }
}

/* ==========================================================================
 * Growth: cache rows, RoPE table, scratch
 * ========================================================================== */

/* Every thread's scratch for T visible tokens and a chunk of n. */
static kvq_status scratch_reserve(kvq_retrieval *r, int64_t T, int64_t n, kvq_err *err)
{
    if (r->p.prefill_full && n > 1) {
        size_t pre, vb;
        if (!kvq_size_mul((size_t)n, (size_t)T, &pre) || !kvq_size_mul(pre, sizeof(float), &pre) ||
            !kvq_size_mul((size_t)T, (size_t)r->d * sizeof(float), &vb))
            return kvq_err_set(err, KVQ_E_TOO_LARGE, "retrieval: prefill of %lld x %lld",
                               (long long)n, (long long)T);
        for (int32_t t = 0; t < r->n_scr; t++) {
            rt_scratch *S = &r->scr[t];
            if (pre > S->pre_bytes) {
                if (!kvq_rt_grow((void **)&S->pre, pre))
                    return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory for prefill");
                S->pre_bytes = pre;
            }
            if (vb > S->vbuf_bytes) {
                if (!kvq_rt_grow((void **)&S->vbuf, vb) ||
                    !kvq_rt_grow((void **)&S->qpre, (size_t)n * r->d * sizeof(float) > vb
                                                 ? (size_t)n * r->d * sizeof(float)
                                                 : vb))
                    return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory for prefill");
                S->vbuf_bytes = vb;
            }
        }
    }
    const int need_rot =
        r->p.positions == KVQ_POSITIONS_ROPE || r->p.measure || (r->p.prefill_full && n > 1);
    const int64_t krot_rows = need_rot ? T : r->window;
    const size_t gs = (size_t)r->gs, d = (size_t)r->d;
    const rt_selector *sel = kvq_rt_selector(r->p.selector);
    for (int32_t t = 0; t < r->n_scr; t++) {
        rt_scratch *S = &r->scr[t];
        if (T <= S->cap && krot_rows <= S->krot_rows && S->scores)
            continue;
        const int64_t cap = T > S->cap ? (T > 2 * S->cap ? T : 2 * S->cap) : S->cap;
        const size_t c = (size_t)cap;
        int ok = kvq_rt_grow((void **)&S->scores, c * sizeof(float)) &&
                 kvq_rt_grow((void **)&S->tmp, c * sizeof(float)) &&
                 kvq_rt_grow((void **)&S->work, 2 * c * sizeof(uint32_t)) &&
                 kvq_rt_grow((void **)&S->mwork, c * sizeof(double)) &&
                 kvq_rt_grow((void **)&S->sel, c * sizeof(int32_t)) &&
                 kvq_rt_grow((void **)&S->osel, c * sizeof(int32_t)) &&
                 kvq_rt_grow((void **)&S->att, c * sizeof(int32_t)) &&
                 kvq_rt_grow((void **)&S->logits, gs * c * sizeof(float)) &&
                 (!r->p.measure || (kvq_rt_grow((void **)&S->pfull, gs * c * sizeof(float)) &&
                                    kvq_rt_grow((void **)&S->msel, c * sizeof(int32_t)))) &&
                 kvq_rt_grow((void **)&S->qb, gs * d * sizeof(float)) &&
                 kvq_rt_grow((void **)&S->qi, gs * d * sizeof(float)) &&
                 kvq_rt_grow((void **)&S->qx, gs * d * sizeof(float)) &&
                 kvq_rt_grow((void **)&S->o, gs * d * sizeof(float)) &&
                 kvq_rt_grow((void **)&S->ofull, gs * d * sizeof(float)) &&
                 (!sel->scratch || sel->scratch(r, S, cap));
        const int64_t kr = need_rot ? cap : krot_rows;
        if (ok && kr > S->krot_rows) {
            ok = kvq_rt_grow((void **)&S->krot, (size_t)kr * d * sizeof(float));
            if (ok)
                S->krot_rows = kr;
        }
        if (!ok)
            return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory for scratch");
        S->cap = cap;
    }
    return KVQ_OK;
}

/* Checks a call of n rows at positions pos onto layer L (the cache stays within
 * max_tokens, every position in [0, MAX_POSITION)) and reserves what it needs: the
 * layer's rows, the RoPE table up to the largest position, the scratch. */
static kvq_status reserve_rows(kvq_retrieval *r, rt_layer *L, int64_t n, const int64_t *pos,
                               kvq_err *err)
{
    const int64_t T = L->len + n;
    if (T > r->p.max_tokens)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "retrieval: sequence of %lld tokens exceeds max_tokens %lld",
                           (long long)T, (long long)r->p.max_tokens);
    int64_t max_pos = 0;
    for (int64_t i = 0; i < n; i++) {
        if (pos[i] < 0 || pos[i] >= MAX_POSITION)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval: position %lld out of range",
                               (long long)pos[i]);
        max_pos = pos[i] > max_pos ? pos[i] : max_pos;
    }
    kvq_status s;
    if ((s = kvq_rt_layer_reserve(r, L, T, err)) || (s = kvq_rt_rope_reserve(r, max_pos, err)))
        return s;
    return scratch_reserve(r, T, n, err);
}

/* ==========================================================================
 * Keys: storage and rotation
 * ========================================================================== */

/* ==========================================================================
 * Attention
 * ========================================================================== */

static kvq_status retrieval_attend(void *user, const kvq_attn_call *c, kvq_err *err)
{
    kvq_retrieval *r = user;
    kvq_status s;
    if (c->layer < 0 || c->layer >= r->n_layers || c->n < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval: bad attention call");
    if (kvq_rt_local_has(r->local, c->layer)) /* exactly, over the window */
        return kvq_rt_local_attend(r->local, c, err);
    rt_layer *L = &r->layer[c->layer];
    const int64_t past = L->len, n = c->n;
    const int32_t d = r->d, gs = r->gs, nh = r->n_heads;
    if ((s = reserve_rows(r, L, n, c->pos, err)) || (s = kvq_rt_append(r, c, err)))
        return s;
    if (r->kvc) /* over a compressed cache (runtime/cache/kvc_retr.c) */
        return kvq_rt_kvc_call(r, c, err);

    for (int32_t t = 0; t < r->n_scr; t++)
        r->scr[t].status = KVQ_OK;
    if (n > 1 && r->p.prefill_full) {
        /* Prefill: exact attention of every row over the tokens before it. */
#pragma omp parallel for num_threads(r->n_scr) schedule(dynamic, 1)
        for (int32_t h = 0; h < r->n_kv; h++)
            kvq_rt_prefill_head(r, L, h, c, past, &r->scr[kvq_rt_thread_id()]);
    } else {
        const int64_t items = n * r->n_kv;
#pragma omp parallel for num_threads(r->n_scr) schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t i = it / r->n_kv;
            const int32_t h = (int32_t)(it % r->n_kv);
            const size_t off = ((size_t)i * nh + (size_t)h * gs) * d;
            kvq_rt_step(r, c->layer, h, c->q + off, c->pos[i], past + i + 1, i == n - 1,
                        &r->scr[kvq_rt_thread_id()], c->out + off, d);
        }
    }
    for (int32_t t = 0; t < r->n_scr; t++) {
        rt_sums *b = &r->scr[t].sums;
        kvq_retrieval_stats_add(&r->sums, b);
        memset(b, 0, sizeof *b);
    }
    for (int32_t t = 0; t < r->n_scr; t++) /* a device failure in some step */
        if (r->scr[t].status)
            return kvq_err_set(err, r->scr[t].status, "%s", r->scr[t].err.msg);
    return KVQ_OK;
}

static void retrieval_reset(void *user) { kvq_retrieval_reset(user); }

kvq_attn_backend kvq_retrieval_backend(kvq_retrieval *r)
{
    kvq_attn_backend b = {.name = kvq_selector_name(r->p.selector),
                          .user = r,
                          .attend = retrieval_attend,
                          .reset = retrieval_reset,
                          .per_layer = 1}; /* local layers, scale and softcap */
    return b;
}

/* ==========================================================================
 * Statistics and test hooks
 * ========================================================================== */

void kvq_retrieval_stats_get(const kvq_retrieval *r, kvq_retrieval_stats *out)
{
    *out = r->sums;
}

void kvq_retrieval_stats_add(kvq_retrieval_stats *a, const kvq_retrieval_stats *b)
{
    a->steps += b->steps;
    a->visible += b->visible;
    a->attended += b->attended;
    a->bytes_read += b->bytes_read;
    a->bytes_full += b->bytes_full;
    a->bytes_codebook += b->bytes_codebook;
    a->measured += b->measured;
    a->recall_topk += b->recall_topk;
    a->recall_mass += b->recall_mass;
    a->out_rel_err += b->out_rel_err;
}

void kvq_retrieval_stats_reset(kvq_retrieval *r) { memset(&r->sums, 0, sizeof r->sums); }

int64_t kvq_retrieval_sorted_rows(const kvq_retrieval *r, int32_t layer, int32_t head)
{
    if (layer < 0 || layer >= r->n_layers || head < 0 || head >= r->n_kv)
        return 0;
    const rt_head *H = &r->layer[layer].head[head];
    return H->tok && H->sorted_end > r->p.sink ? H->sorted_end - r->p.sink : 0;
}

/* The bytes the scratch of one thread holds now (scratch_reserve's arrays). */
static double scratch_bytes(const kvq_retrieval *r, const rt_scratch *S)
{
    const double c = (double)S->cap, gs = r->gs, d = r->d;
    return c * (2 * sizeof(float) + 2 * sizeof(uint32_t) + sizeof(double) + 3 * sizeof(int32_t) +
                gs * sizeof(float) * (r->p.measure ? 2 : 1)) +
           (double)S->krot_rows * d * sizeof(float) + (double)S->pre_bytes +
           2.0 * (double)S->vbuf_bytes + (double)S->kvrows_cap * 2 * d * sizeof(float) +
           5 * gs * d * sizeof(float);
}

void kvq_retrieval_held_get(const kvq_retrieval *r, kvq_retrieval_held *out)
{
    memset(out, 0, sizeof *out);
    const rt_selector *sel = kvq_rt_selector(r->p.selector);
    int32_t layers = 0;
    for (int32_t l = 0; l < r->n_layers; l++) {
        if (kvq_rt_local_has(r->local, l))
            continue;
        const rt_layer *L = &r->layer[l];
        layers++;
        out->positions += sizeof *L->pos;
        for (int32_t h = 0; h < r->n_kv; h++) {
            const rt_head *H = &L->head[h];
            out->rows += r->kvc ? 0.0 : 2.0 * r->d * (double)r->es;
            out->selector += sel->row_bytes ? sel->row_bytes(r, L, H) : 0.0;
            out->positions += H->tok ? sizeof *H->tok : 0;
        }
    }
    out->rope = layers ? 2.0 * (r->d / 2) * sizeof(float) : 0.0;
    out->total = out->rows + out->selector + out->positions + out->rope;
    for (int32_t t = 0; t < r->n_scr; t++)
        out->scratch += scratch_bytes(r, &r->scr[t]);
    out->scratch += 2.0 * (double)r->akey_bytes;
}

const int32_t *kvq_retrieval_last_selection(const kvq_retrieval *r, int32_t layer, int32_t head,
                                            int64_t *count)
{
    *count = 0;
    if (layer < 0 || layer >= r->n_layers || head < 0 || head >= r->n_kv)
        return NULL;
    const rt_head *H = &r->layer[layer].head[head];
    *count = H->n_sel;
    if (!H->n_sel)
        return NULL;
    /* rows -> tokens, ascending (rows in code order are not) */
    for (int64_t a = 0; a < H->n_sel; a++)
        H->sel_tok[a] = (int32_t)kvq_rt_row_token(H, H->sel[a]);
    if (H->tok)
        qsort(H->sel_tok, (size_t)H->n_sel, sizeof *H->sel_tok, kvq_cmp_i32);
    return H->sel_tok;
}

kvq_status kvq_retrieval_append(kvq_retrieval *r, int32_t layer, int32_t n, const int64_t *pos,
                                const float *k, const float *v, kvq_err *err)
{
    if (!r || layer < 0 || layer >= r->n_layers || n < 1 || !pos || !k || !v)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval: bad append call");
    rt_layer *L = &r->layer[layer];
    const kvq_attn_call c = {.layer = layer, .n = n, .pos = pos, .k = k, .v = v};
    if (kvq_rt_local_has(r->local, layer))
        return kvq_rt_local_attend(r->local, &c, err);
    kvq_status s = reserve_rows(r, L, n, pos, err);
    return s ? s : kvq_rt_append(r, &c, err);
}
