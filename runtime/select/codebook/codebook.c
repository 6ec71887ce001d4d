/*
 * codebook.c — the codebook selector (kvq/runtime.h; codebook.h for its stages): the
 * first stage over the keys' codes (the LUT of the scoring query: device.c's kernels,
 * or per band, score_pos.c; the codes and what else it shares with the mass selector in
 * codes.c), then the residual stage (resid.c) and the exact rerank (rerank.c); its
 * table of rt_selector functions.
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
    const rt_backend *be = kvq_rt_codes_ctx(r)->be;
    float *lut = kvq_rt_codes_scr(S)->lut;
    rt_mass_memo *mm = be->device == KVQ_RETRIEVAL_DEVICE_CPU ? S->mass_memo : NULL;
    if (mm && kvq_rt_mass_memo_topk(mm, nc, k, sel) < 0) {
        const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
        const kvq_rk_table *tab = st->L->tab[st->head];
        kvq_rk_lut(r->p.isa, tab, qs, lut);
        kvq_rk_score(r->p.isa, lut, D->groups, D->k,
                     kvq_rt_codes(st->H)->codes + (size_t)st->s_end * D->groups, nc, scores);
        kvq_rt_mass_memo_put(mm, scores, nc, (double)kvq_rk_table_bytes(tab));
    }
    const int64_t nm = mm ? kvq_rt_mass_memo_topk(mm, nc, k, sel) : -1;
    for (int64_t j = 0; j < nm; j++)
        sel[j] += (int32_t)st->s_end;
    if (nm >= 0)
        return nm;
    kvq_err e = {0};
    const kvq_status s = be->select(st, qs, k, sel, &e);
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
    kvq_rt_cb_scr(st->S)->bsel_nb = 0; /* set by kvq_rt_banded_select (resid.c reads it) */
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

/* ==========================================================================
 * Its data: per head (codes, then residuals), per context, per thread
 * ========================================================================== */

static int codebook_reserve(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t cap)
{
    if (!H->sdata && !(H->sdata = calloc(1, sizeof(rt_cb_head))))
        return 0;
    rt_cb_head *C = H->sdata;
    const size_t c = (size_t)cap;
    int ok = kvq_rt_codes_reserve(r, L, &C->c, cap);
    if (ok && r->rt && L->cb[0] && r->p.resid_bits)
        ok = kvq_rt_grow((void **)&C->rq, c * kvq_rt_resid_row_bytes(r->d, r->p.resid_bits)) &&
             kvq_rt_grow((void **)&C->rqs, c * sizeof(float));
    return ok;
}

static void codebook_free_head(rt_head *H)
{
    rt_cb_head *C = H->sdata;
    if (C) {
        kvq_rt_codes_free(&C->c);
        free(C->rq);
        free(C->rqs);
        free(C);
    }
    H->sdata = NULL;
}

/* The chunk's residuals, after its codes (codes.c). */
static void resid_head(const kvq_retrieval *r, const rt_layer *L, int32_t h, const float *keys,
                       const int32_t *codes, const int64_t *pos, int64_t past, int64_t n)
{
    rt_head *H = &L->head[h];
    if (kvq_rt_cb(H)->rq)
        kvq_rt_resid_append(r, L->cb[h], H, keys, codes, pos, past, n);
}

static kvq_status codebook_append(kvq_retrieval *r, rt_layer *L, const kvq_attn_call *c,
                                  int64_t past, kvq_err *err)
{
    return kvq_rt_codes_append(r, L, c, past, resid_head, err);
}

static kvq_status codebook_appended(kvq_retrieval *r, rt_layer *L, int64_t past, kvq_err *err)
{
    return kvq_rt_sort_rows(r, L, past, 1, err);
}

static int codebook_scratch(const kvq_retrieval *r, rt_scratch *S, int64_t cap)
{
    if (!S->sscr && !(S->sscr = calloc(1, sizeof(rt_cb_scratch))))
        return 0;
    rt_cb_scratch *X = S->sscr;
    const size_t gs = (size_t)r->gs, d = (size_t)r->d;
    if (!kvq_rt_codes_scratch(r, &X->c))
        return 0;
    if (!X->stab && !kvq_rt_grow((void **)&X->stab,
                                 gs * KVQ_RK_SIGN_TABLE_LEN(2 * d) * sizeof(float)))
        return 0;
    if (cap > X->rr_cap) {
        if (!kvq_rt_grow((void **)&X->rr, (gs + 1) * (d + (size_t)cap) * sizeof(float)))
            return 0;
        X->rr_cap = cap;
    }
    return 1;
}

static void codebook_scratch_free(rt_scratch *S)
{
    rt_cb_scratch *X = S->sscr;
    if (X) {
        kvq_rt_codes_scratch_free(&X->c);
        free(X->stab);
        free(X->rr);
        free(X);
    }
    S->sscr = NULL;
}

/* Bits per key: the codes and the residual stage when it is on. */
static double codebook_bits(const kvq_retrieval_params *p, const kvq_codebook_set *rt, int32_t d)
{
    return rt ? (double)kvq_codebook_set_groups(rt) * log2((double)kvq_codebook_set_size(rt)) +
                    (p->resid_bits > 0 && p->resid_wide > 1.0
                         ? (double)d * p->resid_bits + 32.0 /* residual stage */
                         : 0.0)
              : 0.0;
}

/* Bytes per row: the codes (codes.c) and the residual stage's bits and scale. */
static double codebook_row_bytes(const kvq_retrieval *r, const rt_layer *L, const rt_head *H)
{
    const rt_cb_head *C = kvq_rt_cb(H);
    if (!C)
        return 0;
    return kvq_rt_codes_row_bytes(r, L) +
           (C->rq ? (double)kvq_rt_resid_row_bytes(r->d, r->p.resid_bits) + sizeof(float) : 0);
}

const rt_selector kvq_rt_selector_codebook = {
    .id = KVQ_SELECT_CODEBOOK,
    .name = "codebook",
    .needs_artifact = 1,
    .open = kvq_rt_codes_open,
    .close = kvq_rt_codes_close,
    .scratch = codebook_scratch,
    .scratch_free = codebook_scratch_free,
    .reserve = codebook_reserve,
    .free_head = codebook_free_head,
    .reset_head = kvq_rt_codes_reset_head,
    .append = codebook_append,
    .appended = codebook_appended,
    .select = codebook_select,
    .bits_per_key = codebook_bits,
    .row_bytes = codebook_row_bytes,
};
