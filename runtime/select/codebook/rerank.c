/*
 * rerank.c — the second stage of the codebook selector (kvq_retrieval_params.rerank,
 * kvq/runtime.h): the codebook's scores pick R x budget candidates, their exact keys
 * are read, and the exact scores (the oracle's, under the same position mode and GQA
 * rule) keep the best `budget` of them. Only those are attended.
 *
 * With rows in code order (row_order.c) the candidates of one code sit in one run of
 * rows, so the key rows come in runs too.
 *
 * The rerank computes the exact logit of every candidate for each query head of the
 * group ([gs, n]; the group's score is (sum q) . k, or the sum of the heads' logits, or
 * their maximum), so the kept rows' logits go to the attention (kvq_rt_attend_union)
 * instead of being computed again: their key rows are read once per step, not twice
 * (under ROPE the cache holds them rotated, keys.c: the kernels read the rows by
 * index). One pass of the logits kernel covers up to four query rows, so the heads
 * cost what the summed query alone did (see exact_logits for when the summed query's
 * own logit is the score).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"
#include "runtime/select/codebook/codebook.h"
#include "runtime/select/mass.h"

int kvq_rt_rerank_on(const kvq_retrieval_params *p)
{
    return p->rerank > 1.0 || p->rerank_extra > 0;
}

int64_t kvq_rt_rerank_count(const kvq_retrieval *r, int64_t k, int64_t nc)
{
    if (!kvq_rt_rerank_on(&r->p) || k >= nc)
        return k;
    double want = r->p.rerank > 1.0 ? ceil(r->p.rerank * (double)k) : (double)k;
    if (r->p.rerank_extra > 0) {
        const double extra = (double)k + ceil(r->p.rerank_extra * (double)nc);
        want = extra > want ? extra : want;
    }
    return want >= (double)nc ? nc : (int64_t)want;
}

/* Exact logits (scale 1) of rows[0..n) into lg [nq, n]: under ROPE q R_i . k_j R_{p_j},
 * under WROPE q R_b . k_j (the far tokens' exact logits), for each query head of the
 * group (rows [0, gs)) and, under KVQ_GROUP_SUM with gs < 4, for the group's summed
 * query (row gs). One pass over the rows: the kernels take four query heads per pass,
 * and one costs a pass as four do, so the summed query is free up to three heads (the
 * score is then (sum q) . k exactly as the oracle computes it); with four or more it
 * would cost a second pass, and the score is the sum of the heads' logits instead (the
 * same up to float rounding). q: [gs + 1, d] scratch. Returns nq. */
static int32_t exact_logits(const rt_step *st, const int32_t *rows, int64_t n, float *q,
                            float *lg)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs;
    const int rope = r->p.positions == KVQ_POSITIONS_ROPE;
    const int32_t nq = r->p.group == KVQ_GROUP_SUM && gs < 4 ? gs + 1 : gs;
    memcpy(q, rope ? S->qi : S->qb, sizeof(float) * (size_t)gs * d);
    if (nq > gs) { /* in head order, as select.c's group_sum */
        float *qs = q + (size_t)gs * d;
        memcpy(qs, q, sizeof(float) * (size_t)d);
        for (int32_t g = 1; g < gs; g++)
            for (int32_t t = 0; t < d; t++)
                qs[t] += q[(size_t)g * d + t];
    }
    const rt_logit_memo *M = S->lg_memo;
    if (!rope && M && M->nqb >= nq) { /* the probe's: the same values, gathered */
        for (int32_t g = 0; g < nq; g++)
            for (int64_t a = 0; a < n; a++)
                lg[(size_t)g * n + a] = M->lgb[(size_t)g * M->nv + rows[a] - M->lo];
    } else if (rope && r->keys_rotated && !S->ktok && !r->kvc) { /* rows are k_j R_{p_j} */
        kvq_rk_logits(r->p.isa, q, nq, d, st->H->k, r->p.cache_dtype, d, rows, n, 1.0f, lg, n);
    } else if (rope) {
        for (int64_t a = 0; a < n; a++)
            kvq_rt_step_key(st, rows[a], S->krot + (size_t)a * d);
        kvq_rk_logits(r->p.isa, q, nq, d, S->krot, KVQ_DT_F32, d, NULL, n, 1.0f, lg, n);
    } else {
        kvq_rk_logits(r->p.isa, q, nq, d, st->H->k, r->p.cache_dtype, d, rows, n, 1.0f, lg, n);
    }
    return nq;
}

int64_t kvq_rt_rerank(const rt_step *st, int32_t *rows, int64_t n, int64_t k, double *sel_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    rt_cb_scratch *Y = kvq_rt_cb_scr(S);
    if (r->kvc) /* over a compressed cache: its pruned tokens are not candidates */
        n = kvq_rt_kvc_filter(st, rows, n);
    if (n <= 0)
        return 0;
    /* the candidates' key rows are read here; the attention reads the kept ones again
     * from cache, so the step counts them there and the rest here */
    const int64_t keep = k < n ? k : n;
    *sel_bytes += (double)(n - keep) * r->d * (double)r->es;
    if (keep == n)
        return n;
    const int32_t d = r->d, gs = r->gs;
    float *q = Y->rr, *lg = Y->rr + (size_t)(gs + 1) * d; /* [gs + 1, d], [nq, n] */
    /* the probe's steps: the candidates of least rank by the same scores, their logits
     * gathered from the probe's (the values exact_logits would gather; mass.h) */
    const rt_logit_memo *M = S->lg_memo;
    const int memo = M && M->rank && r->p.positions != KVQ_POSITIONS_ROPE;
    int64_t m;
    if (memo) {
        m = kvq_rt_rank_memo_topk(M->rank, M->lo, rows, n, keep, S->sel);
    } else {
        const int32_t nq = exact_logits(st, rows, n, q, lg);
        /* the group's score: the summed query's logit, or the sum (in head order) or the
         * maximum of the heads' logits */
        const int max = r->p.group == KVQ_GROUP_MAX;
        float *scores = S->scores;
        memcpy(scores, lg + (size_t)(nq > gs ? gs : 0) * n, sizeof(float) * (size_t)n);
        for (int32_t g = 1; nq == gs && g < gs; g++) {
            const float *l = lg + (size_t)g * n;
            for (int64_t j = 0; j < n; j++)
                scores[j] = max ? (l[j] > scores[j] ? l[j] : scores[j]) : scores[j] + l[j];
        }
        m = kvq_rk_topk(r->p.isa, scores, n, keep, S->sel, S->work);
    }
    /* S->sel ascending, S->sel[i] >= i: compacts rows in place, still ascending */
    for (int64_t i = 0; i < m; i++)
        rows[i] = rows[S->sel[i]];
    /* the kept rows' logits, scaled as the attention's, where it lays them out: att is
     * [sinks][selection][window], m_att columns per query head */
    const float scale = r->scale; /* the model's score scale (archs-rt) */
    const int64_t off = st->s_end - st->lo, m_att = off + m + (st->nvis - st->w_beg);
    for (int32_t g = 0; g < gs; g++)
        for (int64_t i = 0; i < m; i++)
            S->logits[(size_t)g * m_att + off + i] =
                (memo ? M->lgb[(size_t)g * M->nv + rows[i] - M->lo] : lg[(size_t)g * n + S->sel[i]]) *
                scale;
    S->rr_kept = m;
    return m;
}

