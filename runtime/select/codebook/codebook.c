/*
 * codebook.c — the codebook selector (kvq/runtime.h; codebook.h for its stages): the
 * keys' codes by row, the first stage's scores (the LUT of the scoring query over the
 * codes: device.c's kernels, or per band, score_pos.c), then the residual stage
 * (resid.c) and the exact rerank (rerank.c). Its per-head data (codes, code counts,
 * residuals) also serves the mass selector (mass.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"
#include "runtime/kernels/rk.h"
#include "runtime/select/codebook/codebook.h"
#include "runtime/select/mass.h"
#include "runtime/select/selector.h"

/* ==========================================================================
 * Per-head data: codes, code counts, residuals
 * ========================================================================== */

int kvq_rt_cb_reserve(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t cap,
                      int resid)
{
    if (!H->sdata && !(H->sdata = calloc(1, sizeof(rt_cb_head))))
        return 0;
    rt_cb_head *C = H->sdata;
    const size_t d = (size_t)r->d, c = (size_t)cap;
    const int G = r->rt && L->cb[0] ? kvq_codebook_get_desc(L->cb[0])->groups : 0;
    int ok = !G || kvq_rt_grow((void **)&C->codes, c * (size_t)G * sizeof *C->codes);
    if (ok && G && resid && r->p.resid_bits)
        ok = kvq_rt_grow((void **)&C->rq, c * kvq_rt_resid_row_bytes(d, r->p.resid_bits)) &&
             kvq_rt_grow((void **)&C->rqs, c * sizeof(float));
    return ok;
}

void kvq_rt_cb_free_head(rt_head *H)
{
    rt_cb_head *C = H->sdata;
    if (C) {
        free(C->codes);
        free(C->hist);
        free(C->rq);
        free(C->rqs);
        free(C);
    }
    H->sdata = NULL;
}

void kvq_rt_cb_reset_head(const kvq_retrieval *r, const rt_layer *L, int32_t h, rt_head *H)
{
    (void)r;
    rt_cb_head *C = H->sdata;
    if (C && C->hist)
        memset(C->hist, 0, sizeof(uint32_t) * (size_t)kvq_codebook_get_desc(L->cb[h])->k);
}

/* The chunk's codes (one kvq_codebook_encode per head), residuals and code counts, and
 * the device's copy of the codes. */
kvq_status kvq_rt_cb_append(kvq_retrieval *r, rt_layer *L, const kvq_attn_call *c, int64_t past,
                            kvq_err *err)
{
    const int64_t n = c->n, d = r->d, kvd = (int64_t)r->n_kv * d;
    kvq_status s;
    if (!L->cb[0])
        return KVQ_OK;
    const int32_t G = kvq_codebook_get_desc(L->cb[0])->groups;
    if (n > r->buf_rows) {
        if (!kvq_rt_grow((void **)&r->kbuf, (size_t)n * d * sizeof(float)) ||
            !kvq_rt_grow((void **)&r->cbuf, (size_t)n * G * sizeof(int32_t)) ||
            !kvq_rt_grow((void **)&r->pbuf, (size_t)n * sizeof(int32_t)))
            return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
        r->buf_rows = n;
    }
    for (int64_t i = 0; i < n; i++)
        r->pbuf[i] = (int32_t)c->pos[i];
    for (int32_t h = 0; h < r->n_kv; h++) {
        rt_head *H = &L->head[h];
        rt_cb_head *C = kvq_rt_cb(H);
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
            C->codes[(size_t)past * G + i] = (uint16_t)r->cbuf[i];
        if (C->rq)
            kvq_rt_resid_append(r, L->cb[h], H, r->kbuf, r->cbuf, c->pos, past, n);
        if (G == 1) { /* per-code counts for kvq_rk_topk_codes */
            if (!C->hist &&
                !(C->hist = calloc((size_t)kvq_codebook_get_desc(L->cb[h])->k,
                                   sizeof *C->hist)))
                return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
            for (int64_t i = 0; i < n; i++)
                C->hist[r->cbuf[i]]++;
        }
        if (r->be->codes && (s = r->be->codes(r, L, c->layer, h, past, n, err)))
            return s;
    }
    return KVQ_OK;
}

kvq_status kvq_rt_cb_appended(kvq_retrieval *r, rt_layer *L, int64_t past, kvq_err *err)
{
    return kvq_rt_sort_rows(r, L, past, err);
}

const uint16_t *kvq_retrieval_codes(const kvq_retrieval *r, int32_t layer, int32_t head, int64_t j)
{
    if (layer < 0 || layer >= r->n_layers || head < 0 || head >= r->n_kv)
        return NULL;
    const rt_layer *L = &r->layer[layer];
    const rt_head *H = &L->head[head];
    const int cbsel = r->p.selector == KVQ_SELECT_CODEBOOK || r->p.selector == KVQ_SELECT_MASS;
    if (!cbsel || !H->sdata || !kvq_rt_cb(H)->codes || j < 0 || j >= L->len || !L->cb[head])
        return NULL;
    int64_t row = j;
    if (H->tok && j >= r->p.sink && j < H->sorted_end) /* find the row (a linear search) */
        for (row = r->p.sink; H->tok[row] != j; row++)
            ;
    return kvq_rt_cb(H)->codes + (size_t)row * kvq_codebook_get_desc(L->cb[head])->groups;
}

/* ==========================================================================
 * The first stage: the LUT of the scoring query over the codes
 * ========================================================================== */

void kvq_rt_codebook_scores(const rt_step *st, float *scores, double *cb_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const kvq_codebook *cb = st->L->cb[st->head];
    const kvq_rk_table *tab = st->L->tab[st->head];
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const int32_t d = r->d, gs = r->gs, G = D->groups, K = D->k;
    const uint16_t *codes = kvq_rt_cb(st->H)->codes + (size_t)st->s_end * G;
    float qs[KVQ_ROPE_MAX_DIM];
    int64_t a, b;
    kvq_rt_candidate_distances(st, &a, &b);
    if (r->p.score_pos == KVQ_SCORE_BANDS && D->method != KVQ_CODEBOOK_VQ_POSTROPE) {
        /* sum (or max) over the group of the per-band scores */
        for (int32_t g = 0; g < (r->p.group == KVQ_GROUP_SUM ? 1 : gs); g++) {
            if (r->p.group == KVQ_GROUP_SUM)
                kvq_rt_group_sum(st->q, gs, d, qs);
            else
                memcpy(qs, st->q + (size_t)g * d, sizeof(float) * (size_t)d);
            kvq_rt_banded_scores(st, qs, g ? S->tmp : scores, cb_bytes);
            for (int64_t j = 0; g && j < st->nc; j++)
                scores[j] = S->tmp[j] > scores[j] ? S->tmp[j] : scores[j];
        }
        return;
    }
    if (r->p.group == KVQ_GROUP_SUM) {
        for (int32_t g = 0; g < gs; g++)
            kvq_rt_scoring_query(st, cb, st->q + (size_t)g * d, a, b, S->qx + (size_t)g * d);
        kvq_rt_group_sum(S->qx, gs, d, qs);
        kvq_rk_lut(r->p.isa, tab, qs, S->lut);
        kvq_rk_score(r->p.isa, S->lut, G, K, codes, st->nc, scores);
        *cb_bytes += (double)kvq_rk_table_bytes(tab);
        return;
    }
    for (int32_t g = 0; g < gs; g++) {
        kvq_rt_scoring_query(st, cb, st->q + (size_t)g * d, a, b, qs);
        kvq_rk_lut(r->p.isa, tab, qs, S->lut);
        kvq_rk_score(r->p.isa, S->lut, G, K, codes, st->nc, g ? S->tmp : scores);
        for (int64_t j = 0; g && j < st->nc; j++)
            scores[j] = S->tmp[j] > scores[j] ? S->tmp[j] : scores[j];
        *cb_bytes += (double)kvq_rk_table_bytes(tab);
    }
}

/* Under the group sum without bands: the backend's LUT, gather and top-k (device.c: CPU
 * or CUDA kernels), or the probe's memo of the CPU's scores. */
static int64_t device_select(const rt_step *st, int64_t k, int32_t *sel, double *sel_bytes,
                             double *codebook_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int64_t nc = st->nc;
    float *scores = S->scores;
    /* the backend's LUT, gather and top-k (device.c): CPU or CUDA kernels */
    const kvq_codebook *cb = st->L->cb[st->head];
    const int32_t d = r->d, gs = r->gs;
    float qs[KVQ_ROPE_MAX_DIM];
    int64_t a, b;
    kvq_rt_candidate_distances(st, &a, &b);
    for (int32_t g = 0; g < gs; g++)
        kvq_rt_scoring_query(st, cb, st->q + (size_t)g * d, a, b, S->qx + (size_t)g * d);
    kvq_rt_group_sum(S->qx, gs, d, qs);
    *codebook_bytes += (double)kvq_rk_table_bytes(st->L->tab[st->head]);
    *sel_bytes += (double)nc * 2.0 * kvq_codebook_get_desc(cb)->groups;
    /* the probe's steps of one (row, head): the CPU backend's scores once, the top k
     * from one order of them (the same selection, mass.h) */
    rt_mass_memo *mm = r->be->device == KVQ_RETRIEVAL_DEVICE_CPU ? S->mass_memo : NULL;
    if (mm && kvq_rt_mass_memo_topk(mm, nc, k, sel) < 0) {
        const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
        const kvq_rk_table *tab = st->L->tab[st->head];
        kvq_rk_lut(r->p.isa, tab, qs, S->lut);
        kvq_rk_score(r->p.isa, S->lut, D->groups, D->k,
                     kvq_rt_cb(st->H)->codes + (size_t)st->s_end * D->groups, nc, scores);
        kvq_rt_mass_memo_put(mm, scores, nc, (double)kvq_rk_table_bytes(tab));
    }
    const int64_t nm = mm ? kvq_rt_mass_memo_topk(mm, nc, k, sel) : -1;
    for (int64_t j = 0; j < nm; j++)
        sel[j] += (int32_t)st->s_end;
    if (nm >= 0)
        return nm;
    kvq_err e = {0};
    const kvq_status s = r->be->select(st, qs, k, sel, &e);
    if (s) { /* recorded for attend(); the step attends sinks and window only */
        if (!S->status) {
            S->status = s;
            S->err = e;
        }
        return 0;
    }
    return k;
}

/* The first stage's top k of the candidates (rows, ascending, into sel). */
static int64_t first_stage(const rt_step *st, int64_t k, int32_t *sel, double *sel_bytes,
                           double *codebook_bytes)
{
    const kvq_retrieval *r = st->r;
    const int64_t nc = st->nc;
    if (nc <= 0)
        return 0;
    if (k >= nc)
        return kvq_rt_select_all(st, sel);
    if (r->p.group == KVQ_GROUP_SUM && r->p.score_pos != KVQ_SCORE_BANDS)
        return device_select(st, k, sel, sel_bytes, codebook_bytes);
    /* bands in code order: no score per row */
    const int64_t n = kvq_rt_banded_select(st, k, sel, codebook_bytes);
    if (n >= 0) {
        *sel_bytes += (double)nc * 2.0;
        return n;
    }
    kvq_rt_codebook_scores(st, st->S->scores, codebook_bytes);
    *sel_bytes += (double)nc * 2.0 * kvq_codebook_get_desc(st->L->cb[st->head])->groups;
    return kvq_rt_select_top(st, k, sel);
}

/* ==========================================================================
 * The selector: first stage k1, residual stage k2, exact rerank k
 * ========================================================================== */

static int64_t codebook_select(const rt_step *st, int64_t k, int32_t *sel, double *sel_bytes,
                               double *codebook_bytes)
{
    /* rerank (rerank.c): the codebook picks R k candidates, exact scores keep k */
    const int64_t k2 = kvq_rt_rerank_count(st->r, k, st->nc);
    /* residual stage (resid.c): the codebook picks W k2, residual scores keep k2 */
    const int64_t k1 = kvq_rt_cb(st->H)->rq ? kvq_rt_resid_count(st->r, k2, st->nc) : k2;
#ifdef KVQ_RT_DIAG_NEEDLE /* diag_needle.c: a diagnostic build only */
    kvq_rt_diag_needle_pre(st, k, k1, k2);
#define DIAG(stage, n) kvq_rt_diag_needle_stage(st, stage, sel, n)
#else
#define DIAG(stage, n) ((void)0)
#endif
    int64_t n = first_stage(st, k1, sel, sel_bytes, codebook_bytes);
    DIAG(0, n);
    if (k1 > k2)
        n = kvq_rt_resid_stage(st, sel, n, k2, sel_bytes);
    DIAG(1, n);
    if (k2 > k)
        n = kvq_rt_rerank(st, sel, n, k, sel_bytes);
    DIAG(2, n);
#ifdef KVQ_RT_DIAG_NEEDLE
    kvq_rt_diag_needle_post(st);
#endif
    return n;
}
#undef DIAG

/* Bits per key of the codebook and mass selectors: the codes, and the codebook's
 * residual stage when on. */
double kvq_rt_cb_bits_per_key(const kvq_retrieval_params *p, const kvq_codebook_set *rt,
                              int32_t d, int resid)
{
    return rt ? (double)kvq_codebook_set_groups(rt) * log2((double)kvq_codebook_set_size(rt)) +
                    (resid && p->resid_bits > 0 && p->resid_wide > 1.0
                         ? (double)d * p->resid_bits + 32.0 /* residual stage */
                         : 0.0)
              : 0.0;
}

static int codebook_reserve(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t cap)
{
    return kvq_rt_cb_reserve(r, L, H, cap, 1);
}

static double codebook_bits(const kvq_retrieval_params *p, const kvq_codebook_set *rt, int32_t d)
{
    return kvq_rt_cb_bits_per_key(p, rt, d, 1);
}

const rt_selector kvq_rt_selector_codebook = {
    .id = KVQ_SELECT_CODEBOOK,
    .name = "codebook",
    .needs_artifact = 1,
    .reserve = codebook_reserve,
    .free_head = kvq_rt_cb_free_head,
    .reset_head = kvq_rt_cb_reset_head,
    .append = kvq_rt_cb_append,
    .appended = kvq_rt_cb_appended,
    .select = codebook_select,
    .bits_per_key = codebook_bits,
};
