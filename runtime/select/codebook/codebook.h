/*
 * runtime/select/codebook/codebook.h — the codebook selector (kvq_retrieval_params
 * selector codebook; its data also serves the mass selector, runtime/select/mass.c).
 * Not a public header.
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

/* What the codebook (and mass) selector keeps per head: rt_head.sdata. */
typedef struct rt_cb_head {
    uint16_t *codes; /* [cap, G] the keys' codes, by row */
    uint32_t *hist;  /* [K] single-group codebooks: how many of rows [0, len) have each code */
    uint8_t *rq;     /* [cap, ceil(d b / 8)] residual stage: packed quantized residuals
                        (rotated by position under ROPE), by row; NULL when off */
    float *rqs;      /* [cap] their scales, by row */
} rt_cb_head;

/* The head's codebook data (the context's selector is codebook or mass). */
static inline rt_cb_head *kvq_rt_cb(const rt_head *H) { return (rt_cb_head *)H->sdata; }

/* Per-head data of the codebook and mass selectors (codebook.c): reserve grows codes
 * (and with resid the residuals) to cap rows; free_head, reset_head, append (the
 * chunk's codes by kvq_codebook_encode, residuals, code counts, the device copy),
 * appended (the row order) as rt_selector's. */
int kvq_rt_cb_reserve(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t cap,
                      int resid);
void kvq_rt_cb_free_head(rt_head *H);
void kvq_rt_cb_reset_head(const kvq_retrieval *r, const rt_layer *L, int32_t h, rt_head *H);
kvq_status kvq_rt_cb_append(kvq_retrieval *r, rt_layer *L, const kvq_attn_call *c, int64_t past,
                            kvq_err *err);
kvq_status kvq_rt_cb_appended(kvq_retrieval *r, rt_layer *L, int64_t past, kvq_err *err);
/* The candidates' first-stage scores [nc] (sum or max over the group, as the
 * selector's group rule), adding the LUT tables' bytes to *cb_bytes (codebook.c). */
void kvq_rt_codebook_scores(const rt_step *st, float *scores, double *cb_bytes);
/* Bits per key: the codes, and (resid) the residual stage when it is on (codebook.c). */
double kvq_rt_cb_bits_per_key(const kvq_retrieval_params *p, const kvq_codebook_set *rt,
                              int32_t d, int resid);

/* After a chunk starting at token `past` was appended to L: puts each head's far rows
 * in code order when the rule of kvq/runtime.h "Row order" says so (row_order.c).
 * Errors: KVQ_E_NOMEM naming the rows. */
kvq_status kvq_rt_sort_rows(kvq_retrieval *r, rt_layer *L, int64_t past, kvq_err *err);

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
int32_t kvq_rt_banded_groups(const rt_step *st, int32_t *grp);

#endif /* KVQ_RUNTIME_SELECT_CODEBOOK_H */
