/*
 * retrieval.c — the decoding context of kvq/runtime.h: the per-sequence KV cache, the
 * retrieval attention step and the kvq_attn_backend that plugs both into the forward
 * pass.
 *
 *   attend(call)  1. append the chunk: K and V into the cache (f16 or f32; under ROPE
 *                    the keys rotated, then rounded: keys.c),
 *                    positions, the codes of every key (kvq_codebook_encode, one call
 *                    per head and chunk), fier bits / quest page bounds; the far rows
 *                    of single-group codebooks then go in code order (row_order.c);
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
#include "runtime/kernels.h"

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

/* ==========================================================================
 * Create / free
 * ========================================================================== */

static void scratch_free(rt_scratch *S)
{
    free(S->scores);
    free(S->tmp);
    free(S->work);
    free(S->mwork);
    free(S->sel);
    free(S->osel);
    free(S->att);
    free(S->logits);
    free(S->rr);
    free(S->stab);
    free(S->pfull);
    free(S->krot);
    free(S->lut);
    free(S->cwork);
    free(S->qb);
    free(S->qi);
    free(S->qx);
    free(S->o);
    free(S->ofull);
    free(S->pre);
    free(S->vbuf);
    free(S->qpre);
}

static void head_free(rt_head *H)
{
    free(H->k);
    free(H->v);
    free(H->codes);
    free(H->hist);
    free(H->fbits);
    free(H->flo);
    free(H->fhi);
    free(H->plo);
    free(H->phi);
    free(H->sel);
    free(H->sel_tok);
    free(H->tok);
    free(H->rq);
    free(H->rqs);
}

void kvq_retrieval_free(kvq_retrieval *r)
{
    if (!r)
        return;
    if (r->be && r->be->fini)
        r->be->fini(r);
    for (int32_t l = 0; r->layer && l < r->n_layers; l++) {
        rt_layer *L = &r->layer[l];
        for (int32_t h = 0; L->head && h < r->n_kv; h++)
            head_free(&L->head[h]);
        free(L->head);
        free(L->pos);
        free(L->cb);
        free(L->tab);
    }
    for (int32_t t = 0; r->scr && t < r->n_scr; t++)
        scratch_free(&r->scr[t]);
    kvq_rt_probe_free(r->probe);
    free(r->layer);
    free(r->scr);
    free(r->rcos);
    free(r->rsin);
    free(r->kbuf);
    free(r->cbuf);
    free(r->pbuf);
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
    r->wrope_b = P.wrope_b >= 0 ? P.wrope_b : rt ? kvq_codebook_set_wrope_b(rt) : 2048;
    r->db = (r->d + 7) / 8;
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
    if ((s = kvq_rt_backend_open(r, err))) {
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

int64_t kvq_retrieval_length(const kvq_retrieval *r) { return r->layer[0].len; }

void kvq_retrieval_reset(kvq_retrieval *r)
{
    r->seq_gen++;
    for (int32_t l = 0; l < r->n_layers; l++) {
        rt_layer *L = &r->layer[l];
        L->len = 0;
        L->pos_unordered = 0;
        for (int32_t h = 0; h < r->n_kv; h++) {
            L->head[h].n_sel = 0;
            free(L->head[h].tok);
            L->head[h].tok = NULL;
            L->head[h].sorted_end = 0;
            if (L->head[h].hist)
                memset(L->head[h].hist, 0,
                       sizeof(uint32_t) * (size_t)kvq_codebook_get_desc(L->cb[h])->k);
        }
    }
}

/* ==========================================================================
 * Growth: cache rows, RoPE table, scratch
 * ========================================================================== */

static int grow(void **p, size_t bytes) { return kvq_resize(p, bytes, 1) == 0; }

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

static int grow_cache(void **p, size_t old, size_t bytes)
{
    if (bytes < HUGE_BYTES)
        return grow(p, bytes);
    void *q = kvq_rt_cache_alloc(bytes);
    if (!q)
        return 0;
    if (*p && old)
        memcpy(q, *p, old < bytes ? old : bytes);
    free(*p);
    *p = q;
    return 1;
}

/* Grows layer l to hold `need` rows (doubling, capped at max_tokens). */
static kvq_status layer_reserve(kvq_retrieval *r, rt_layer *L, int64_t need, kvq_err *err)
{
    if (need <= L->cap)
        return KVQ_OK;
    int64_t cap = L->cap ? L->cap : 256;
    while (cap < need)
        cap *= 2;
    if (cap > r->p.max_tokens)
        cap = r->p.max_tokens;
    const size_t d = (size_t)r->d, c = (size_t)cap;
    const int G = r->rt && L->cb[0] ? kvq_codebook_get_desc(L->cb[0])->groups : 0;
    const kvq_selector sel = r->p.selector;
    const size_t fgroups = c / (size_t)r->p.fier_group + 1, pages = c / (size_t)r->p.quest_page + 1;
    int ok = grow((void **)&L->pos, c * sizeof *L->pos);
    for (int32_t h = 0; ok && h < r->n_kv; h++) {
        rt_head *H = &L->head[h];
        const size_t old = (size_t)L->cap * d * r->es;
        ok = grow_cache(&H->k, old, c * d * r->es) && grow_cache(&H->v, old, c * d * r->es);
        if (ok && G && (sel == KVQ_SELECT_CODEBOOK || sel == KVQ_SELECT_MASS))
            ok = grow((void **)&H->codes, c * (size_t)G * sizeof *H->codes);
        if (ok && H->tok)
            ok = grow((void **)&H->tok, c * sizeof *H->tok);
        if (ok && G && sel == KVQ_SELECT_CODEBOOK && r->p.resid_bits)
            ok = grow((void **)&H->rq, c * kvq_rt_resid_row_bytes(d, r->p.resid_bits)) &&
                 grow((void **)&H->rqs, c * sizeof(float));
        if (ok && sel == KVQ_SELECT_FIER)
            ok = grow((void **)&H->fbits, c * (size_t)r->db) &&
                 grow((void **)&H->flo, fgroups * d * sizeof(float)) &&
                 grow((void **)&H->fhi, fgroups * d * sizeof(float));
        if (ok && sel == KVQ_SELECT_QUEST)
            ok = grow((void **)&H->plo, pages * d * sizeof(float)) &&
                 grow((void **)&H->phi, pages * d * sizeof(float));
    }
    if (!ok)
        return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory for %lld cached tokens",
                           (long long)cap);
    L->cap = cap;
    return KVQ_OK;
}

/* cos / sin of every position up to max_pos (angles in double, as kvq_rope_apply). */
static kvq_status rope_reserve(kvq_retrieval *r, int64_t max_pos, kvq_err *err)
{
    if (max_pos < r->rcap)
        return KVQ_OK;
    int64_t cap = r->rcap ? r->rcap : 256;
    while (cap <= max_pos)
        cap *= 2;
    const size_t half = (size_t)r->d / 2, old = (size_t)r->rcap * half * sizeof(float);
    /* huge pages as the K/V arrays: under rope every rotated key reads its row at random */
    if (!grow_cache((void **)&r->rcos, old, (size_t)cap * half * sizeof(float)) ||
        !grow_cache((void **)&r->rsin, old, (size_t)cap * half * sizeof(float)))
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
                if (!grow((void **)&S->pre, pre))
                    return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory for prefill");
                S->pre_bytes = pre;
            }
            if (vb > S->vbuf_bytes) {
                if (!grow((void **)&S->vbuf, vb) ||
                    !grow((void **)&S->qpre, (size_t)n * r->d * sizeof(float) > vb
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
    size_t lut = 1;
    for (int32_t l = 0; l < r->n_layers; l++)
        if (r->layer[l].cb[0]) {
            const kvq_codebook_desc *D = kvq_codebook_get_desc(r->layer[l].cb[0]);
            lut = (size_t)D->groups * D->k;
            break;
        }
    for (int32_t t = 0; t < r->n_scr; t++) {
        rt_scratch *S = &r->scr[t];
        if (T <= S->cap && krot_rows <= S->krot_rows && S->lut)
            continue;
        const int64_t cap = T > S->cap ? (T > 2 * S->cap ? T : 2 * S->cap) : S->cap;
        const size_t c = (size_t)cap;
        int ok = grow((void **)&S->scores, c * sizeof(float)) &&
                 grow((void **)&S->tmp, c * sizeof(float)) &&
                 grow((void **)&S->work, 2 * c * sizeof(uint32_t)) &&
                 grow((void **)&S->mwork, c * sizeof(double)) &&
                 grow((void **)&S->sel, c * sizeof(int32_t)) &&
                 grow((void **)&S->osel, c * sizeof(int32_t)) &&
                 grow((void **)&S->att, c * sizeof(int32_t)) &&
                 grow((void **)&S->logits, gs * c * sizeof(float)) &&
                 grow((void **)&S->rr, (gs + 1) * (d + c) * sizeof(float)) &&
                 grow((void **)&S->stab, gs * KVQ_RK_SIGN_TABLE_LEN(2 * d) * sizeof(float)) &&
                 (!r->p.measure || grow((void **)&S->pfull, gs * c * sizeof(float))) &&
                 grow((void **)&S->lut, lut * sizeof(float)) &&
                 grow((void **)&S->cwork, 4 * lut * sizeof(uint32_t)) &&
                 grow((void **)&S->qb, gs * d * sizeof(float)) &&
                 grow((void **)&S->qi, gs * d * sizeof(float)) &&
                 grow((void **)&S->qx, gs * d * sizeof(float)) &&
                 grow((void **)&S->o, gs * d * sizeof(float)) &&
                 grow((void **)&S->ofull, gs * d * sizeof(float));
        const int64_t kr = need_rot ? cap : krot_rows;
        if (ok && kr > S->krot_rows) {
            ok = grow((void **)&S->krot, (size_t)kr * d * sizeof(float));
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
    if ((s = layer_reserve(r, L, T, err)) || (s = rope_reserve(r, max_pos, err)))
        return s;
    return scratch_reserve(r, T, n, err);
}

/* ==========================================================================
 * Keys: storage and rotation
 * ========================================================================== */

/* Fier: after token j was stored, update its group's per-channel range of the
 * post-RoPE keys; when the range moves, re-quantize the group's earlier tokens. */
static void fier_append(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t j)
{
    const int32_t d = r->d, fg = r->p.fier_group;
    const int64_t g = j / fg, first = g * fg;
    float *lo = H->flo + (size_t)g * d, *hi = H->fhi + (size_t)g * d;
    float kr[KVQ_ROPE_MAX_DIM];
    kvq_rt_key_rotated(r, L, H, j, kr);
    int moved = 0;
    if (j == first) {
        memcpy(lo, kr, sizeof(float) * (size_t)d);
        memcpy(hi, kr, sizeof(float) * (size_t)d);
    } else {
        for (int32_t c = 0; c < d; c++) {
            if (kr[c] < lo[c]) {
                lo[c] = kr[c];
                moved = 1;
            }
            if (kr[c] > hi[c]) {
                hi[c] = kr[c];
                moved = 1;
            }
        }
    }
    for (int64_t t = moved ? first : j; t <= j; t++) {
        if (t != j)
            kvq_rt_key_rotated(r, L, H, t, kr);
        uint8_t *b = H->fbits + (size_t)t * r->db;
        memset(b, 0, (size_t)r->db);
        for (int32_t c = 0; c < d; c++)
            if (kvq_rk_fier_bit(kr[c], lo[c], hi[c]))
                b[c >> 3] |= (uint8_t)(1u << (c & 7));
    }
}

/* Quest: per-channel min / max of the post-RoPE keys of token j's page. */
static void quest_append(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t j)
{
    const int32_t d = r->d, pg = r->p.quest_page;
    const int64_t pi = j / pg;
    float *lo = H->plo + (size_t)pi * d, *hi = H->phi + (size_t)pi * d;
    float kr[KVQ_ROPE_MAX_DIM];
    kvq_rt_key_rotated(r, L, H, j, kr);
    for (int32_t c = 0; c < d; c++) {
        lo[c] = j % pg == 0 || kr[c] < lo[c] ? kr[c] : lo[c];
        hi[c] = j % pg == 0 || kr[c] > hi[c] ? kr[c] : hi[c];
    }
}

/* The first token a query of `layer` with n tokens before it (itself included) sees. */
static int64_t window_start(const kvq_retrieval *r, int32_t layer, int64_t n)
{
    const kvq_model_config c = {.sliding_window = r->sliding_window,
                                .sliding_from = r->sliding_from};
    return kvq_model_window_start(&c, layer, n);
}

/* Appends the chunk's n tokens to layer l: K, V, positions, codes, selector data. */
static kvq_status append(kvq_retrieval *r, const kvq_attn_call *c, kvq_err *err)
{
    rt_layer *L = &r->layer[c->layer];
    const int64_t n = c->n, past = L->len, d = r->d, kvd = (int64_t)r->n_kv * d;
    kvq_status s;
    for (int64_t i = 0; i < n; i++) {
        L->pos[past + i] = c->pos[i];
        L->pos_unordered |= past + i > 0 && c->pos[i] <= L->pos[past + i - 1];
    }
    for (int32_t h = 0; h < r->n_kv; h++) {
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
    const kvq_selector sel = r->p.selector;
    if ((sel == KVQ_SELECT_CODEBOOK || sel == KVQ_SELECT_MASS) && L->cb[0]) {
        const int32_t G = kvq_codebook_get_desc(L->cb[0])->groups;
        if (n > r->buf_rows) {
            if (!grow((void **)&r->kbuf, (size_t)n * d * sizeof(float)) ||
                !grow((void **)&r->cbuf, (size_t)n * G * sizeof(int32_t)) ||
                !grow((void **)&r->pbuf, (size_t)n * sizeof(int32_t)))
                return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
            r->buf_rows = n;
        }
        for (int64_t i = 0; i < n; i++)
            r->pbuf[i] = (int32_t)c->pos[i];
        for (int32_t h = 0; h < r->n_kv; h++) {
            rt_head *H = &L->head[h];
            /* the pre-RoPE key as a pre-RoPE cache holds it (f16-rounded in an f16
             * cache; under ROPE the stored row is the rotated key, keys.c): the same codes
             * under both position modes, and the fit assigned exactly these values when
             * they are f32 */
            for (int64_t i = 0; i < n; i++)
                kvq_rt_key_pre(r, c->k + i * kvd + h * d, r->kbuf + i * d);
            kvq_err e = {0};
            if ((s = kvq_codebook_encode(L->cb[h], r->kbuf, r->pbuf, n, 1, r->cbuf, &e)))
                return kvq_err_set(err, s, "retrieval: layer %d head %d: %s", (int)c->layer, (int)h,
                                   e.msg);
            for (int64_t i = 0; i < n * G; i++)
                H->codes[(size_t)past * G + i] = (uint16_t)r->cbuf[i];
            if (H->rq)
                kvq_rt_resid_append(r, L->cb[h], H, r->kbuf, r->cbuf, c->pos, past, n);
            if (G == 1) { /* per-code counts for kvq_rk_topk_codes */
                if (!H->hist &&
                    !(H->hist = calloc((size_t)kvq_codebook_get_desc(L->cb[h])->k,
                                       sizeof *H->hist)))
                    return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
                for (int64_t i = 0; i < n; i++)
                    H->hist[r->cbuf[i]]++;
            }
            if (r->be->codes && (s = r->be->codes(r, L, c->layer, h, past, n, err)))
                return s;
        }
    }
    for (int32_t h = 0; h < r->n_kv; h++)
        for (int64_t i = 0; i < n; i++) {
            if (sel == KVQ_SELECT_FIER)
                fier_append(r, L, &L->head[h], past + i);
            else if (sel == KVQ_SELECT_QUEST)
                quest_append(r, L, &L->head[h], past + i);
        }
    for (int32_t h = 0; h < r->n_kv; h++)
        if (L->head[h].tok)
            for (int64_t i = 0; i < n; i++)
                L->head[h].tok[past + i] = (int32_t)(past + i);
    L->len = past + n;
    return kvq_rt_sort_rows(r, L, past, err);
}

/* ==========================================================================
 * Attention
 * ========================================================================== */

/* Exact attention (exact RoPE) of the group's queries over the m tokens [lo, lo + m)
 * whose rotated keys are krot [m, d]: probabilities into p [gs, ld] and outputs into
 * o [gs, d]. qi: [gs, d] rotated queries. */
static void exact_attention(const kvq_retrieval *r, const rt_head *H, const float *krot,
                            const float *qi, int64_t lo, int64_t m, float *p, int64_t ld, float *o)
{
    const float scale = (float)(1.0 / sqrt((double)r->d));
    kvq_rk_logits(r->p.isa, qi, r->gs, r->d, krot, KVQ_DT_F32, r->d, NULL, m, scale, p, ld);
    kvq_rk_softmax(r->p.isa, p, r->gs, m, ld);
    kvq_rk_mix(r->p.isa, p, r->gs, ld, (const char *)H->v + (size_t)lo * r->d * r->es,
               r->p.cache_dtype, r->d, NULL, m, r->d, o);
}

/* The group's queries rotated by R_b (qb) and by their position (qi). */
static void rotate_queries(const kvq_retrieval *r, const float *q, int64_t pos, rt_scratch *S)
{
    const int32_t d = r->d;
    for (int32_t g = 0; g < r->gs; g++) {
        kvq_rk_rotate(q + (size_t)g * d, r->bcos, r->bsin, (int)r->rope.layout, d,
                      S->qb + (size_t)g * d);
        kvq_rt_rotate(r, q + (size_t)g * d, pos, S->qi + (size_t)g * d);
    }
}

/* Measurement of one step (measure = 1): exact attention over every visible token,
 * and the oracle's selection of the same size. */
static void measure_step(const rt_step *st, const int32_t *att, int64_t m, int64_t nsel)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs;
    const int64_t lo = st->lo, nv = st->nvis - lo; /* the visible tokens [lo, nvis) */
    for (int64_t j = lo; j < st->nvis; j++)
        kvq_rt_key_rotated(r, st->L, st->H, j, S->krot + (size_t)(j - lo) * d);
    exact_attention(r, st->H, S->krot, S->qi, lo, nv, S->pfull, nv, S->ofull);
    double mass = 0, rel = 0;
    for (int32_t g = 0; g < gs; g++) {
        const float *pf = S->pfull + (size_t)g * nv;
        double sm = 0, e2 = 0, f2 = 0;
        for (int64_t a = 0; a < m; a++)
            sm += pf[att[a] - lo];
        for (int32_t t = 0; t < d; t++) {
            const double x = S->o[(size_t)g * d + t], y = S->ofull[(size_t)g * d + t];
            e2 += (x - y) * (x - y);
            f2 += y * y;
        }
        mass += sm;
        rel += f2 > 0 ? sqrt(e2 / f2) : 0.0;
    }
    double recall = 1.0;
    if (nsel < st->nc && nsel > 0) {
        double unused = 0, unused2 = 0;
        const int64_t no = kvq_rt_select(st, KVQ_SELECT_ORACLE, nsel, S->osel, &unused, &unused2);
        /* both lists ascending: count the common indices */
        int64_t a = 0, b = 0, common = 0;
        const int32_t *sel = att + (st->s_end - st->lo); /* after the sinks */
        while (a < nsel && b < no) {
            if (sel[a] == S->osel[b]) {
                common++;
                a++;
                b++;
            } else if (sel[a] < S->osel[b]) {
                a++;
            } else {
                b++;
            }
        }
        recall = (double)common / (double)nsel;
    }
    S->sums.measured++;
    S->sums.recall_mass += mass / gs;
    S->sums.out_rel_err += rel / gs;
    S->sums.recall_topk += recall;
}

/* One retrieval step: query row `row` of the chunk (position pos, nvis tokens
 * visible) for KV head h; writes the group's outputs [gs, d] to out. */
void kvq_rt_step(const kvq_retrieval *r, int32_t layer, int32_t h, const float *q, int64_t pos,
                 int64_t nvis, int record, rt_scratch *S, float *out, int64_t ld_out)
{
    const rt_layer *L = &r->layer[layer];
    rt_head *H = &L->head[h];
    const int32_t d = r->d, gs = r->gs;
    rt_step st = {.r = r,
                  .L = L,
                  .H = H,
                  .layer = layer,
                  .head = h,
                  .q = q,
                  .pos = pos,
                  .nvis = nvis,
                  .S = S};
    st.lo = window_start(r, layer, nvis);
    st.s_end = st.lo + (r->p.sink < nvis - st.lo ? r->p.sink : nvis - st.lo);
    st.w_beg = nvis - r->window > st.s_end ? nvis - r->window : st.s_end;
    st.nc = st.w_beg - st.s_end;
    rotate_queries(r, q, pos, S);

    /* ---- selection: sinks, the chosen candidates, the window (ascending) */
    double sel_bytes = 0, cb_bytes = 0;
    int32_t *att = S->att;
    int64_t m = 0;
    for (int64_t j = st.lo; j < st.s_end; j++)
        att[m++] = (int32_t)j;
    const int64_t k = kvq_budget_tokens(&r->p.budget, nvis - st.lo);
    const int64_t nsel = kvq_rt_select(&st, r->p.selector, k, att + m, &sel_bytes, &cb_bytes);
    m += nsel;
    if (record) { /* the chunk's last row: one writer per head */
        if (nsel > H->sel_cap) {
            int64_t cap = H->sel_cap ? 2 * H->sel_cap : 64;
            while (cap < nsel)
                cap *= 2;
            /* a failed grow only loses the record kept for tests */
            if (grow((void **)&H->sel, (size_t)cap * sizeof *H->sel) &&
                grow((void **)&H->sel_tok, (size_t)cap * sizeof *H->sel_tok))
                H->sel_cap = cap;
        }
        H->n_sel = nsel <= H->sel_cap ? nsel : 0;
        if (H->n_sel)
            memcpy(H->sel, att + (st.s_end - st.lo), sizeof *H->sel * (size_t)H->n_sel);
    }
    /* Non-local under WROPE: the selection and the sinks that lie outside the last
     * `window` tokens. Sinks inside them (early in a sequence, when the window reaches
     * back to the sinks; then nothing is selected) are local: exact RoPE, as WRoPE
     * defines for i - j < w. att stays [far sinks][selection][near sinks][window]. */
    int64_t far_sinks = 0;
    for (int64_t j = st.lo; j < st.s_end && j < nvis - r->window; j++)
        far_sinks++;
    const int64_t m_far = far_sinks + nsel;
    for (int64_t j = st.w_beg; j < nvis; j++)
        att[m++] = (int32_t)j;

    /* ---- exact attention over the union: logits, softmax, weighted sum of values
     * (two passes: on the development machine this beat kvq_rk_attend_rows, the fused
     * one-pass kernel, by a few percent; bench_decode --attn compares them) */
    kvq_rt_attend_union(&st, att, m, m_far);
    for (int32_t g = 0; g < gs; g++)
        memcpy(out + (size_t)g * ld_out, S->o + (size_t)g * d, sizeof(float) * (size_t)d);

    /* ---- statistics */
    if (st.nc > 0) {
        S->sums.steps++;
        S->sums.visible += (double)(nvis - st.lo);
        S->sums.attended += (double)m;
        S->sums.bytes_read += sel_bytes + (double)m * 2.0 * d * r->es;
        S->sums.bytes_full += (double)(nvis - st.lo) * 2.0 * d * r->es;
        S->sums.bytes_codebook += cb_bytes;
        if (r->p.measure)
            measure_step(&st, att, m, nsel);
    }
}

/* Exact attention of a prefill chunk for KV head h, as matrix products (the full
 * attention backend's method): per query head S = (Q R) (K R)^T / sqrt(d) [n, T] with
 * cblas_sgemm, a causal softmax per row, O = S V. */
static void prefill_head(const kvq_retrieval *r, const rt_layer *L, int32_t h,
                         const kvq_attn_call *c, int64_t past, rt_scratch *S)
{
    const rt_head *H = &L->head[h];
    const int32_t d = r->d, gs = r->gs, nh = r->n_heads;
    const int64_t n = c->n, T = past + n;
    const float scale = (float)(1.0 / sqrt((double)d));
    const float *K = S->krot; /* rotated keys [T, d]: under ROPE the cache's (f16 converted) */
    if (r->keys_rotated && r->es == 4)
        K = H->k;
    else if (r->keys_rotated)
        kvq_f16_to_f32((const uint16_t *)H->k, S->krot, (size_t)T * d);
    else
        for (int64_t j = 0; j < T; j++)
            kvq_rt_key_rotated(r, L, H, j, S->krot + (size_t)j * d);
    const float *V = H->v;
    if (r->es == 2) {
        kvq_f16_to_f32((const uint16_t *)H->v, S->vbuf, (size_t)T * d);
        V = S->vbuf;
    }
    for (int32_t g = 0; g < gs; g++) {
        for (int64_t i = 0; i < n; i++)
            kvq_rt_rotate(r, c->q + ((size_t)i * nh + (size_t)h * gs + g) * d, c->pos[i],
                          S->qpre + (size_t)i * d);
        float *P = S->pre; /* [n, T] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)T, d, scale, S->qpre, d,
                    K, d, 0.0f, P, (int)T);
        for (int64_t i = 0; i < n; i++) { /* causal, over the sliding window if any */
            const int64_t nvis = past + i + 1, lo = window_start(r, c->layer, nvis);
            float *row = P + (size_t)i * T;
            kvq_rk_softmax(r->p.isa, row + lo, 1, nvis - lo, T);
            memset(row, 0, sizeof(float) * (size_t)lo);
            memset(row + nvis, 0, sizeof(float) * (size_t)(T - nvis));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, d, (int)T, 1.0f, P, (int)T,
                    V, d, 0.0f, c->out + (size_t)(h * gs + g) * d, nh * d);
    }
}

static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static kvq_status retrieval_attend(void *user, const kvq_attn_call *c, kvq_err *err)
{
    kvq_retrieval *r = user;
    kvq_status s;
    if (c->layer < 0 || c->layer >= r->n_layers || c->n < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval: bad attention call");
    rt_layer *L = &r->layer[c->layer];
    const int64_t past = L->len, n = c->n;
    const int32_t d = r->d, gs = r->gs, nh = r->n_heads;
    if ((s = reserve_rows(r, L, n, c->pos, err)) || (s = append(r, c, err)))
        return s;

    for (int32_t t = 0; t < r->n_scr; t++)
        r->scr[t].status = KVQ_OK;
    if (n > 1 && r->p.prefill_full) {
        /* Prefill: exact attention of every row over the tokens before it. */
#pragma omp parallel for num_threads(r->n_scr) schedule(dynamic, 1)
        for (int32_t h = 0; h < r->n_kv; h++)
            prefill_head(r, L, h, c, past, &r->scr[thread_id()]);
    } else {
        const int64_t items = n * r->n_kv;
#pragma omp parallel for num_threads(r->n_scr) schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t i = it / r->n_kv;
            const int32_t h = (int32_t)(it % r->n_kv);
            const size_t off = ((size_t)i * nh + (size_t)h * gs) * d;
            kvq_rt_step(r, c->layer, h, c->q + off, c->pos[i], past + i + 1, i == n - 1,
                        &r->scr[thread_id()], c->out + off, d);
        }
    }
    for (int32_t t = 0; t < r->n_scr; t++) {
        rt_sums *a = &r->sums, *b = &r->scr[t].sums;
        a->steps += b->steps;
        a->measured += b->measured;
        a->visible += b->visible;
        a->attended += b->attended;
        a->bytes_read += b->bytes_read;
        a->bytes_full += b->bytes_full;
        a->bytes_codebook += b->bytes_codebook;
        a->recall_topk += b->recall_topk;
        a->recall_mass += b->recall_mass;
        a->out_rel_err += b->out_rel_err;
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
                          .reset = retrieval_reset};
    return b;
}

/* ==========================================================================
 * Statistics and test hooks
 * ========================================================================== */

void kvq_retrieval_stats_get(const kvq_retrieval *r, kvq_retrieval_stats *out)
{
    const rt_sums *a = &r->sums;
    memset(out, 0, sizeof *out);
    out->steps = a->steps;
    out->visible = a->visible;
    out->attended = a->attended;
    out->bytes_read = a->bytes_read;
    out->bytes_full = a->bytes_full;
    out->bytes_codebook = a->bytes_codebook;
    out->measured = a->measured;
    out->recall_topk = a->recall_topk;
    out->recall_mass = a->recall_mass;
    out->out_rel_err = a->out_rel_err;
}

void kvq_retrieval_stats_reset(kvq_retrieval *r) { memset(&r->sums, 0, sizeof r->sums); }

int64_t kvq_retrieval_sorted_rows(const kvq_retrieval *r, int32_t layer, int32_t head)
{
    if (layer < 0 || layer >= r->n_layers || head < 0 || head >= r->n_kv)
        return 0;
    const rt_head *H = &r->layer[layer].head[head];
    return H->tok && H->sorted_end > r->p.sink ? H->sorted_end - r->p.sink : 0;
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

const uint16_t *kvq_retrieval_codes(const kvq_retrieval *r, int32_t layer, int32_t head, int64_t j)
{
    if (layer < 0 || layer >= r->n_layers || head < 0 || head >= r->n_kv)
        return NULL;
    const rt_layer *L = &r->layer[layer];
    const rt_head *H = &L->head[head];
    if (!H->codes || j < 0 || j >= L->len || !L->cb[head])
        return NULL;
    int64_t row = j;
    if (H->tok && j >= r->p.sink && j < H->sorted_end) /* find the row (a linear search) */
        for (row = r->p.sink; H->tok[row] != j; row++)
            ;
    return H->codes + (size_t)row * kvq_codebook_get_desc(L->cb[head])->groups;
}

kvq_status kvq_retrieval_append(kvq_retrieval *r, int32_t layer, int32_t n, const int64_t *pos,
                                const float *k, const float *v, kvq_err *err)
{
    if (!r || layer < 0 || layer >= r->n_layers || n < 1 || !pos || !k || !v)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval: bad append call");
    rt_layer *L = &r->layer[layer];
    const kvq_attn_call c = {.layer = layer, .n = n, .pos = pos, .k = k, .v = v};
    kvq_status s = reserve_rows(r, L, n, pos, err);
    return s ? s : append(r, &c, err);
}
