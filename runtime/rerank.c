/*
 * rerank.c — the second stage of the codebook selector (kvq_retrieval_params.rerank,
 * kvq/runtime.h): the codebook's scores pick R x budget candidates, their exact keys
 * are read, and the exact scores (the oracle's, under the same position mode and GQA
 * rule) keep the best `budget` of them. Only those are attended.
 *
 * With rows in code order (row_order.c) the candidates of one code sit in one run of
 * rows, so the key rows come in runs too.
 */
#include <math.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"

int64_t kvq_rt_rerank_count(const kvq_retrieval *r, int64_t k, int64_t nc)
{
    if (!(r->p.rerank > 1.0) || k >= nc)
        return k;
    const double want = ceil(r->p.rerank * (double)k);
    return want >= (double)nc ? nc : (int64_t)want;
}

/* Exact scores of rows[0..n) into scores: under ROPE q R_i . k_j R_{p_j}, under WROPE
 * q R_b . k_j (the far tokens' exact logits), with q the sum of the group's queries
 * (KVQ_GROUP_SUM) or the maximum over the group's heads (KVQ_GROUP_MAX). */
static void exact_scores(const rt_step *st, const int32_t *rows, int64_t n, float *scores)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs;
    const int max = r->p.group == KVQ_GROUP_MAX;
    const int32_t nq = max ? gs : 1;
    const int rope = r->p.positions == KVQ_POSITIONS_ROPE;
    const float *qg = rope ? S->qi : S->qb;
    float *q = S->qx; /* [nq, d] */
    memcpy(q, qg, sizeof(float) * (size_t)nq * d);
    for (int32_t g = 1; !max && g < gs; g++)
        for (int32_t t = 0; t < d; t++)
            q[t] += qg[(size_t)g * d + t];
    float *out = max ? S->logits : scores; /* [nq, n] */
    if (rope) {
        /* rotate each candidate by its token's position into krot (T rows under ROPE) */
        for (int64_t a = 0; a < n; a++) {
            float *y = S->krot + (size_t)a * d;
            if (S->ktok)
                memcpy(y, S->ktok + (size_t)kvq_rt_row_token(st->H, rows[a]) * d,
                       sizeof(float) * (size_t)d);
            else
                kvq_rt_key_rotated(r, st->L, st->H, rows[a], y);
        }
        kvq_rk_logits(r->p.isa, q, nq, d, S->krot, KVQ_DT_F32, d, NULL, n, 1.0f, out, n);
    } else {
        kvq_rk_logits(r->p.isa, q, nq, d, st->H->k, r->p.cache_dtype, d, rows, n, 1.0f, out, n);
    }
    for (int64_t j = 0; max && j < n; j++) {
        float m = out[j];
        for (int32_t g = 1; g < gs; g++)
            m = out[(size_t)g * n + j] > m ? out[(size_t)g * n + j] : m;
        scores[j] = m;
    }
}

int64_t kvq_rt_rerank(const rt_step *st, int32_t *rows, int64_t n, int64_t k, double *sel_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    if (n <= 0)
        return 0;
    /* the candidates' key rows are read here; the attention reads the kept ones again
     * from cache, so the step counts them there and the rest here */
    const int64_t keep = k < n ? k : n;
    *sel_bytes += (double)(n - keep) * r->d * (double)r->es;
    if (keep == n)
        return n;
    exact_scores(st, rows, n, S->scores);
    const int64_t m = kvq_rk_topk(r->p.isa, S->scores, n, keep, S->sel, S->work);
    /* S->sel ascending, S->sel[i] >= i: compacts rows in place, still ascending */
    for (int64_t i = 0; i < m; i++)
        rows[i] = rows[S->sel[i]];
    return m;
}
