/*
 * select.c — the selectors of retrieval decoding: which candidates of one step
 * (query row, layer, KV head) are attended. Every selector scores the candidates
 * [s_end, w_beg) and the top-k kernel keeps the best; see kvq/runtime.h for the
 * definitions and the GQA rule (sum, or max, over the group's query heads).
 *
 * The step (retrieval.c) has already filled S->qb (q R_b) and S->qi (q R_i) for the
 * group's query heads.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"
#include "runtime/kernels.h"
#include "runtime/mass.h"

/* Sum of the group's query rows.   q: [gs, d] -> out: [d] */
static void group_sum(const float *q, int32_t gs, int32_t d, float *out)
{
    memcpy(out, q, sizeof(float) * (size_t)d);
    for (int32_t g = 1; g < gs; g++)
        for (int32_t t = 0; t < d; t++)
            out[t] += q[(size_t)g * d + t];
}

/* ---- oracle: exact scores under the position mode ------------------------------------- */

static void oracle_scores(const rt_step *st, float *scores)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs;
    const int max = r->p.group == KVQ_GROUP_MAX;
    const int32_t nq = max ? gs : 1;
    float *q = S->qx; /* [nq, d] */
    if (r->p.positions == KVQ_POSITIONS_WROPE) {
        /* q R_b . k_j on the stored (pre-RoPE) keys */
        if (max)
            memcpy(q, S->qb, sizeof(float) * (size_t)gs * d);
        else
            group_sum(S->qb, gs, d, q);
        const char *base = (const char *)st->H->k + (size_t)st->s_end * d * r->es;
        float *out = max ? S->logits : scores;
        kvq_rk_logits(r->p.isa, q, nq, d, base, r->p.cache_dtype, d, NULL, st->nc, 1.0f, out,
                      st->nc);
        if (max)
            for (int64_t j = 0; j < st->nc; j++) {
                float m = out[j];
                for (int32_t g = 1; g < gs; g++)
                    m = out[(size_t)g * st->nc + j] > m ? out[(size_t)g * st->nc + j] : m;
                scores[j] = m;
            }
        return;
    }
    /* ROPE: q R_i . k_j R_j (the cache holds the keys rotated: keys.c) */
    if (max)
        memcpy(q, S->qi, sizeof(float) * (size_t)gs * d);
    else
        group_sum(S->qi, gs, d, q);
    float kr[KVQ_ROPE_MAX_DIM];
    for (int64_t j = 0; j < st->nc; j++) {
        kvq_rt_key_rotated(r, st->L, st->H, st->s_end + j, kr);
        scores[j] = kvq_rt_group_best_dot(q, nq, d, kr);
    }
}

/* ---- codebook: LUT of the scoring query over the codes -------------------------------- */

static void codebook_scores(const rt_step *st, float *scores, double *cb_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const kvq_codebook *cb = st->L->cb[st->head];
    const kvq_rk_table *tab = st->L->tab[st->head];
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const int32_t d = r->d, gs = r->gs, G = D->groups, K = D->k;
    const uint16_t *codes = st->H->codes + (size_t)st->s_end * G;
    float qs[KVQ_ROPE_MAX_DIM];
    int64_t a, b;
    kvq_rt_candidate_distances(st, &a, &b);
    if (r->p.score_pos == KVQ_SCORE_BANDS && D->method != KVQ_CODEBOOK_VQ_POSTROPE) {
        /* sum (or max) over the group of the per-band scores */
        for (int32_t g = 0; g < (r->p.group == KVQ_GROUP_SUM ? 1 : gs); g++) {
            if (r->p.group == KVQ_GROUP_SUM)
                group_sum(st->q, gs, d, qs);
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
        group_sum(S->qx, gs, d, qs);
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

/* ---- fier: 1-bit keys per group of tokens ----------------------------------------------- */

static void fier_scores(const rt_step *st, float *scores, double *bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs, fg = r->p.fier_group;
    const int max = r->p.group == KVQ_GROUP_MAX;
    const int32_t nq = max ? gs : 1;
    if (max)
        memcpy(S->qx, S->qi, sizeof(float) * (size_t)gs * d);
    else
        group_sum(S->qi, gs, d, S->qx);
    float qs[KVQ_ROPE_MAX_DIM];
    const int64_t j0 = st->s_end, j1 = st->w_beg;
    int64_t groups = 0;
    for (int64_t gbeg = j0 - j0 % fg; gbeg < j1; gbeg += fg, groups++) {
        const int64_t gi = gbeg / fg;
        const float *lo = st->H->flo + (size_t)gi * d, *hi = st->H->fhi + (size_t)gi * d;
        const int64_t a = gbeg > j0 ? gbeg : j0, b = gbeg + fg < j1 ? gbeg + fg : j1;
        for (int32_t h = 0; h < nq; h++) {
            const float *q = S->qx + (size_t)h * d;
            float off = 0;
            for (int32_t c = 0; c < d; c++) {
                off += q[c] * lo[c];
                qs[c] = q[c] * (hi[c] - lo[c]);
            }
            for (int64_t j = a; j < b; j++) {
                const float s = kvq_rk_fier_score(st->H->fbits + (size_t)j * r->db, qs, off, d);
                if (h == 0 || s > scores[j - j0])
                    scores[j - j0] = s;
            }
        }
    }
    *bytes += (double)st->nc * r->db + (double)groups * 2.0 * d * sizeof(float);
}

/* ---- quest: per-page upper bounds -------------------------------------------------------- */

static void quest_scores(const rt_step *st, float *scores, double *bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs, pg = r->p.quest_page;
    const int max = r->p.group == KVQ_GROUP_MAX;
    const int64_t j0 = st->s_end, j1 = st->w_beg;
    int64_t pages = 0;
    for (int64_t pbeg = j0 - j0 % pg; pbeg < j1; pbeg += pg, pages++) {
        const int64_t pi = pbeg / pg;
        const float *lo = st->H->plo + (size_t)pi * d, *hi = st->H->phi + (size_t)pi * d;
        float agg = 0;
        for (int32_t h = 0; h < gs; h++) {
            const float *q = S->qi + (size_t)h * d;
            float b = 0;
            for (int32_t c = 0; c < d; c++)
                b += kvq_rk_quest_term(q[c], lo[c], hi[c]);
            agg = h == 0 ? b : max ? (b > agg ? b : agg) : agg + b;
        }
        const int64_t a = pbeg > j0 ? pbeg : j0, e = pbeg + pg < j1 ? pbeg + pg : j1;
        for (int64_t j = a; j < e; j++)
            scores[j - j0] = agg;
    }
    *bytes += (double)pages * 2.0 * d * sizeof(float);
}

/* ---- the selection ------------------------------------------------------------------------ */

static int64_t select_once(const rt_step *st, kvq_selector selector, int64_t k, int32_t *sel,
                           double *sel_bytes, double *codebook_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int64_t nc = st->nc;
    if (nc <= 0)
        return 0;
    /* Layers without codebooks attend fully (the format's rule for absent layers). */
    if ((selector == KVQ_SELECT_CODEBOOK || selector == KVQ_SELECT_MASS) && !st->L->cb[st->head])
        selector = KVQ_SELECT_FULL;
    if (selector == KVQ_SELECT_FULL || (k >= nc && selector != KVQ_SELECT_MASS)) {
        for (int64_t j = 0; j < nc; j++)
            sel[j] = (int32_t)(st->s_end + j);
        return nc;
    }
    float *scores = S->scores;
    if (selector == KVQ_SELECT_CODEBOOK && r->p.group == KVQ_GROUP_SUM &&
        r->p.score_pos != KVQ_SCORE_BANDS) {
        /* the backend's LUT, gather and top-k (device.c): CPU or CUDA kernels */
        const kvq_codebook *cb = st->L->cb[st->head];
        const int32_t d = r->d, gs = r->gs;
        float qs[KVQ_ROPE_MAX_DIM];
        int64_t a, b;
        kvq_rt_candidate_distances(st, &a, &b);
        for (int32_t g = 0; g < gs; g++)
            kvq_rt_scoring_query(st, cb, st->q + (size_t)g * d, a, b, S->qx + (size_t)g * d);
        group_sum(S->qx, gs, d, qs);
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
                         st->H->codes + (size_t)st->s_end * D->groups, nc, scores);
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
    if (selector == KVQ_SELECT_CODEBOOK) { /* bands in code order: no score per row */
        const int64_t n = kvq_rt_banded_select(st, k, sel, codebook_bytes);
        if (n >= 0) {
            *sel_bytes += (double)nc * 2.0;
            return n;
        }
    }
    switch (selector) {
    case KVQ_SELECT_ORACLE:
        oracle_scores(st, scores);
        *sel_bytes += (double)nc * r->d * r->es;
        break;
    case KVQ_SELECT_MASS:
        /* the probe's steps of one (row, head) score the candidates once (mass.h) */
        if (!kvq_rt_mass_memo_scores(S->mass_memo, nc, scores, codebook_bytes))
            codebook_scores(st, scores, codebook_bytes);
        *sel_bytes += (double)nc * 2.0 * kvq_codebook_get_desc(st->L->cb[st->head])->groups;
        break;
    case KVQ_SELECT_CODEBOOK:
        codebook_scores(st, scores, codebook_bytes);
        *sel_bytes += (double)nc * 2.0 * kvq_codebook_get_desc(st->L->cb[st->head])->groups;
        break;
    case KVQ_SELECT_FIER:
        fier_scores(st, scores, sel_bytes);
        break;
    case KVQ_SELECT_QUEST:
        quest_scores(st, scores, sel_bytes);
        break;
    case KVQ_SELECT_FULL:
        break;
    }
    if (selector == KVQ_SELECT_MASS) {
        /* approximate logits: the mean (SUM) or max of the heads' scores, / sqrt(d) */
        const float sc =
            (float)(1.0 / sqrt((double)r->d)) / (r->p.group == KVQ_GROUP_SUM ? (float)r->gs : 1.0f);
        for (int64_t j = 0; j < nc; j++)
            S->tmp[j] = scores[j] * sc;
        const int64_t kstar =
            r->p.tau >= 1.0 ? nc
                            : kvq_rt_mass_count_memo(S->mass_memo, scores, *codebook_bytes,
                                                     S->tmp, nc, r->p.tau, S->work, S->mwork);
        k = kstar < k ? kstar : k;
    }
    int64_t n = selector == KVQ_SELECT_MASS ? kvq_rt_mass_memo_topk(S->mass_memo, nc, k, sel) : -1;
    if (n < 0)
        n = kvq_rk_topk(r->p.isa, scores, nc, k, sel, S->work);
    for (int64_t j = 0; j < n; j++)
        sel[j] += (int32_t)st->s_end;
    return n;
}

int64_t kvq_rt_select(const rt_step *st, kvq_selector selector, int64_t k, int32_t *sel,
                      double *sel_bytes, double *codebook_bytes)
{
    st->S->rr_kept = 0; /* set by the rerank when it hands its logits to the attention */
    st->S->bsel_nb = 0; /* set by kvq_rt_banded_select (the residual stage reads it) */
    /* rerank (rerank.c): the codebook picks R k candidates, exact scores keep k */
    const int cbk = selector == KVQ_SELECT_CODEBOOK && st->L->cb[st->head];
    const int64_t k2 = cbk ? kvq_rt_rerank_count(st->r, k, st->nc) : k;
    /* residual stage (rerank_resid.c): the codebook picks W k2, residual scores keep k2 */
    const int64_t k1 = cbk && st->H->rq ? kvq_rt_resid_count(st->r, k2, st->nc) : k2;
#ifdef KVQ_RT_DIAG_NEEDLE /* diag_needle.c: a diagnostic build only */
    if (cbk)
        kvq_rt_diag_needle_pre(st, k, k1, k2);
#define DIAG(stage, n) (cbk ? kvq_rt_diag_needle_stage(st, stage, sel, n) : (void)0)
#else
#define DIAG(stage, n) ((void)0)
#endif
    int64_t n = select_once(st, selector, k1, sel, sel_bytes, codebook_bytes);
    DIAG(0, n);
    if (k1 > k2)
        n = kvq_rt_resid_stage(st, sel, n, k2, sel_bytes);
    DIAG(1, n);
    if (k2 > k)
        n = kvq_rt_rerank(st, sel, n, k, sel_bytes);
    DIAG(2, n);
#ifdef KVQ_RT_DIAG_NEEDLE
    if (cbk)
        kvq_rt_diag_needle_post(st);
#endif
    return n;
}
#undef DIAG
