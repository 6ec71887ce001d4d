/*
 * runtime/select/codebook/codebook.h — the codebook selector (kvq_retrieval_params
 * selector codebook): its data and stages. What it shares with the mass selector (the
 * codes, the first stage's backend and scratch) is codes.h. Not a public header.
 *
 * A step runs in stages, each keeping fewer candidates (codebook.c):
 *   1. the codebook's first stage: the LUT of the scoring query (score_pos.c: q R_b, the
 *      mean rotation, or one LUT per distance band) over the cached codes; top k1 by the
 *      device's kernels (device.c: CPU or CUDA), or per (code, band) group on rows in
 *      code order (row_order.c, kvq_rk_topk_bands)
 *   2. the 1-bit residual stage (resid.c): k1 -> k2 by the residuals' scores
 *   3. the exact rerank (rerank.c, rank_memo.c): k2 -> k by exact scores
 */
#ifndef KVQ_RUNTIME_SELECT_CODEBOOK_H
#define KVQ_RUNTIME_SELECT_CODEBOOK_H

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"
#include "runtime/select/codebook/codes.h"

/* What the codebook selector keeps per head (rt_head.sdata): the codes it shares with the
 * mass selector (codes.h, first), then the residual stage's. */
typedef struct rt_cb_head {
    rt_codes_head c; /* first: kvq_rt_codes reads it */
    uint8_t *rq;     /* [cap, ceil(d b / 8)] residual stage: packed quantized residuals
                        (rotated by position under ROPE), by row; NULL when off */
    float *rqs;      /* [cap] their scales, by row */
} rt_cb_head;

/* Its per-thread scratch (rt_scratch.sscr): the first stage's (codes.h, first), then the
 * residual stage's and the rerank's. */
typedef struct rt_cb_scratch {
    rt_codes_scratch c; /* first: kvq_rt_codes_scr reads it */
    int32_t bsel_nb;    /* > 0: kvq_rt_banded_select chose this step's candidates from its
                           nb LUTs [nb, K] left in S->scores, and (residual stage on) left
                           each selected row's group score, its first-stage score, in
                           S->tmp [n] in selection order (kvq_rk_topk_bands_scored;
                           resid.c reads them); under resid_group MAX each selected row's
                           (code, band) group b K + code in S->sel [n] instead
                           (kvq_rk_topk_bands_grouped, kvq_rt_head_band_luts) */
    float *stab;        /* [gs, KVQ_RK_SIGN_TABLE_LEN(2 d)] the heads' sign tables of the
                           residual stage under resid_group MAX (resid.c) */
    float *rr;          /* [gs + 1, d + cap] rerank.c: its queries [gs + 1, d], then the
                           candidates' exact logits [gs + 1, n]; resid.c's LUTs */
    int64_t rr_cap;     /* cap that rr holds */
} rt_cb_scratch;

/* The head's codebook data and the thread's scratch (the context's selector is codebook). */
static inline rt_cb_head *kvq_rt_cb(const rt_head *H) { return (rt_cb_head *)H->sdata; }
static inline rt_cb_scratch *kvq_rt_cb_scr(const rt_scratch *S)
{
    return (rt_cb_scratch *)S->sscr;
}

/* Residual stage (resid.c): quantizer of x [d] at `bits` into idx [d] and
 * *scale, its inverse; the residuals of n keys [n, d] with their codes [n, G] and
 * positions [n] stored as rows (= tokens) first..first + n - 1; the candidate count
 * ceil(resid_wide k) (k when off; k = the rerank's count);
 * the stage over rows[0..n): keeps the `keep` best by residual score (rows compacted,
 * ascending), adding the bytes it reads. */
void kvq_rt_resid_quantize(const float *x, int32_t d, int32_t bits, uint8_t *idx, float *scale);
void kvq_rt_resid_dequantize(const uint8_t *idx, float scale, int32_t d, int32_t bits, float *y);
size_t kvq_rt_resid_row_bytes(int32_t d, int32_t bits);
/* rows first + i <- rows first + order[i] (i < n) of the residuals; 1 when out of memory */
int kvq_rt_resid_permute(const kvq_retrieval *r, rt_head *H, int64_t first, const int32_t *order,
                         int64_t n);
void kvq_rt_resid_append(const kvq_retrieval *r, const kvq_codebook *cb, rt_head *H,
                         const float *keys, const int32_t *codes, const int64_t *pos,
                         int64_t first, int64_t n);
int64_t kvq_rt_resid_count(const kvq_retrieval *r, int64_t k, int64_t nc);
int64_t kvq_rt_resid_stage(const rt_step *st, int32_t *rows, int64_t n, int64_t keep,
                           double *sel_bytes);

/* Two-stage codebook selection (rerank.c, kvq_retrieval_params.rerank).
 *   rerank_on     the codebook selector reranks: R > 1 or rerank_extra > 0
 *   rerank_count  candidates the codebook picks for a budget of k out of nc: the larger
 *                 of ceil(R k) (k when R <= 1) and k + ceil(E nc) (E = rerank_extra > 0),
 *                 capped at nc, or k when reranking is off or k >= nc
 *   rerank        exact scores of rows[0..n) (the oracle's, same position mode and GQA
 *                 rule, from the per-head logits) keep the best min(k, n), in place,
 *                 ascending; returns the count. The kept rows' logits go to the step's
 *                 attention (S->rr_kept).
 *                 sel_bytes gets the key rows read that the attention does not read
 *                 again ((n - kept) d es bytes). */
int kvq_rt_rerank_on(const kvq_retrieval_params *p);
int64_t kvq_rt_rerank_count(const kvq_retrieval *r, int64_t k, int64_t nc);
int64_t kvq_rt_rerank(const rt_step *st, int32_t *rows, int64_t n, int64_t k, double *sel_bytes);

/* Positions in the scoring query (score_pos.c, kvq_score_pos).
 *   mean_rotation      per pair m, the mean of e^{i delta theta_m} over delta in [a, b]
 *                      as cos / sin parts [d/2]
 *   scoring_query      the scoring query of one pre-RoPE query q [d] for candidates at
 *                      distances [a, b] under r->p.score_pos: q R_b (RB, and always for
 *                      vq-postrope: q R_i) or q rotated by the mean rotation
 *   candidate_distances  [a, b] of the step's candidates
 *   banded_scores      BANDS: the candidates' scores [nc] from one LUT per distance band
 *                      of the (summed) pre-RoPE query q [d] */
void kvq_rt_mean_rotation(const kvq_retrieval *r, int64_t a, int64_t b, float *cs, float *sn);
void kvq_rt_scoring_query(const rt_step *st, const kvq_codebook *cb, const float *q, int64_t a,
                          int64_t b, float *out);
void kvq_rt_candidate_distances(const rt_step *st, int64_t *a, int64_t *b);
void kvq_rt_banded_scores(const rt_step *st, const float *q, float *scores, double *cb_bytes);
/* BANDS under the group sum on rows in code order: the top k of the candidates as
 * kvq_rt_banded_scores + kvq_rk_topk select them (candidate rows, ascending, into sel;
 * returns the count), from the (code, band) groups without a score per row
 * (kvq_rk_topk_bands); -1 where it does not apply (the caller scores). */
int64_t kvq_rt_banded_select(const rt_step *st, int64_t k, int32_t *sel, double *cb_bytes);
/* Each head's own first-stage score of rows[0..n) (the residual stage under the maximum,
 * resid.c), out [gs, n]; 0 when its LUTs do not fit the scratch (score_pos.c). */
int kvq_rt_head_first_scores(const rt_step *st, const int32_t *rows, int64_t n, float *out);
int64_t kvq_rt_head_band_luts(const rt_step *st, float *luts, int64_t cap);
/* The groups of every candidate row for the residual stage over every candidate: B (tb
 * [64] its band starts) and a cursor over the rows' groups (kvq_rk_bands_cursor_next,
 * a piece of rows at a time; S->work held until the last piece); returns nb, or 0 where
 * the bands do not apply (score_pos.c). */
int32_t kvq_rt_banded_cursor(const rt_step *st, kvq_rk_bands *B, int64_t *tb,
                             kvq_rk_bands_cursor *cur);

#endif /* KVQ_RUNTIME_SELECT_CODEBOOK_H */
