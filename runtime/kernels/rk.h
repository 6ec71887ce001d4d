/*
 * runtime/kernels/rk.h — the retrieval kernels kvq_rk_*: LUT build, score gather, top-k
 * selection and sparse attention over an f16 or f32 cache. Each has a scalar reference
 * and AVX2 / AVX-512 paths chosen at run time (kvq_isa, kvq/runtime.h); tests check
 * fast == scalar within the tolerances below.
 *
 * Not a public header: not installed, used by runtime/, the tests and the benchmarks
 * only (an engine embeds kvq through kvq/engine.h, tools through kvq/runtime.h).
 */
#ifndef KVQ_RUNTIME_RK_H
#define KVQ_RUNTIME_RK_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/codebook.h"
#include "kvq/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tolerances of the fast paths against the scalar references (tests use these):
 *   dot products (LUT entries, logits): |fast - ref| <= KVQ_RK_TOL_DOT * sum_t |a_t b_t|
 *   softmax probabilities:              |fast - ref| <= KVQ_RK_TOL_PROB * (p_ref + 1e-6)
 *   attention outputs:                  |fast - ref| <= KVQ_RK_TOL_OUT * sum_j p_j |v_j|
 * Score gather and top-k are exact: every path gives the same bits / the same set. */
#define KVQ_RK_TOL_DOT 1e-5
#define KVQ_RK_TOL_PROB 1e-5
#define KVQ_RK_TOL_OUT 2e-5
#define KVQ_RK_TOL_LUT16 1e-3 /* LUT from the f16 table vs kvq_codebook_lut_ref */

/* The LUT table of a codebook: its key-space (or, for grouped query-aware methods,
 * z-space) centroids stored transposed in f16, [G, d/G, K], the layout the fast LUT
 * build streams through. Half the bytes of the f32 centroids: a decode step reads the
 * whole table once per KV head, so its size is part of the cost per step. Centroids
 * beyond f16's range (|w| > 65504, possible in qapq's z-space) are stored divided by a
 * power of two, and the query multiplied by it, so no entry becomes Inf; a centroid
 * beyond 65504 x 2^40 is refused (KVQ_E_NUMERIC). Keeps a pointer to cb (which must
 * outlive it). Errors: KVQ_E_NOMEM, KVQ_E_NUMERIC. Memory: 2 K d bytes. */
typedef struct kvq_rk_table kvq_rk_table;
kvq_status kvq_rk_table_create(const kvq_codebook *cb, kvq_rk_table **out, kvq_err *err);
void kvq_rk_table_free(kvq_rk_table *t); /* NULL is fine */
uint64_t kvq_rk_table_bytes(const kvq_rk_table *t);
const kvq_codebook *kvq_rk_table_codebook(const kvq_rk_table *t);

/* LUT of a scoring query qs [d] (kvq_codebook_query_pe): lut [G, K] with
 * lut[g*K + c] = q'_g . W_g[c] as kvq_codebook_lut_ref defines it, computed from the f16
 * table: q' = qs L^-T in double for grouped query-aware codebooks, else qs (qavq uses
 * the key-space codebook C = C^z L^-1). KVQ_ISA_SCALAR sums in double; the fast paths
 * in float with FMA. Against kvq_codebook_lut_ref (the reference, f32 centroids) every path
 * agrees within KVQ_RK_TOL_LUT16 * sum_t |q'_t w_t| (the f16 rounding of the table).
 * Cost: K d multiply-adds (+ d^2 / 2), reading 2 K d bytes. */
void kvq_rk_lut(kvq_isa isa, const kvq_rk_table *t, const float *qs, float *lut);

/* kvq_rk_lut of nq scoring queries qs [nq, d] into lut [nq, G K]: the same bits as nq
 * calls (every path), the table read once for all of them on the fast paths (one LUT
 * per distance band: --score-pos bands). */
void kvq_rk_lut_multi(kvq_isa isa, const kvq_rk_table *t, const float *qs, int32_t nq,
                      float *lut);

/* Score gather: scores[j] = sum over g = 0..G-1 (in order, float) of
 * lut[g*K + codes[j*G + g]] for j < n. Codes must be < K. Every path gives the bits of
 * kvq_codebook_score. Cost: n G lookups. */
void kvq_rk_score(kvq_isa isa, const float *lut, int32_t G, int32_t K, const uint16_t *codes,
                  int64_t n, float *scores);

/* Residual stage, 1 bit per channel (runtime/select/codebook/resid.c): the signed-sum table of a
 * query q [d] (d % 8 == 0), tab [KVQ_RK_SIGN_TABLE_LEN(d)]: first [d/8, 256],
 * tab[p*256 + v] = sum over c = 0..7 of (bit c of v ? +q[8p + c] : -q[8p + c]), summed as
 * two nibbles (each four terms in order c = 0..3 from 0.0f, then lower + upper) in float;
 * then the nibbles' sums themselves [d/4, 16] (nibble m of value v at d/8 256 + 16 m + v;
 * the AVX-512 path of kvq_rk_resid_scores looks them up). Cost 3 d 16 adds. */
#define KVQ_RK_SIGN_TABLE_LEN(d) ((size_t)(d) / 8 * 256 + (size_t)(d) / 4 * 16)
void kvq_rk_sign_table(const float *q, int32_t d, float *tab);

/* Residual stage scores: out[a] = first[a] + scale[t] * s with t = tok[a] (the record of
 * candidate a: its row in the runtime) and s the float sum from 0.0f, in order
 * p = 0 .. nb8 - 1, of tab[p*256 + bits[t*nb8 + p]] (the sign dot q . (+-1)^d of record
 * t's packed bits, channel c = byte c/8, bit c%8), the
 * product and the sum rounded separately (no FMA). out may alias first. Every path gives
 * the same bits (KVQ_ISA_SCALAR one candidate at a time; AVX2 four interleaved, rows
 * prefetched; AVX-512 sixteen per vector from the nibble tables when nb8 % 4 == 0:
 * kernels.c, kernels_avx512.c). tab as kvq_rk_sign_table writes it. Cost: n nb8 lookups. */
void kvq_rk_resid_scores(kvq_isa isa, const float *tab, int32_t nb8, const uint8_t *bits,
                         const float *scale, const int32_t *tok, const float *first, int64_t n,
                         float *out);

/* Residual stage scores by the best head of a GQA group of gs query heads
 * (select/codebook/resid.c, --resid-group max): out[a] = the maximum over h = 0 .. gs - 1, in
 * order (a later head replaces the kept score only when strictly greater), of
 *   first[h fs + f] + scale[t] * s_h,   f = grp ? grp[a] : a,  t = tok[a],
 * s_h the float sum from 0.0f, in order p = 0 .. nb8 - 1, of tab[h tl + p*256 +
 * bits[t*nb8 + p]] with tl = KVQ_RK_SIGN_TABLE_LEN(8 nb8) (head h's table as
 * kvq_rk_sign_table writes it, the heads' tables back to back): gs calls of
 * kvq_rk_resid_scores and their maximum, the same bits, but each record's bits and
 * scale read once for all the heads. grp: each candidate's entry in every head's
 * first-stage table (its (code, band) group, kvq_rk_topk_bands_grouped; first [gs, fs]
 * the heads' LUTs), or NULL (first [gs, fs] one score per candidate, fs >= n). out must
 * not alias first. Every path gives the same bits (KVQ_ISA_SCALAR one candidate at a
 * time; AVX2 eight per vector from the nibble tables when nb8 == 8 or nb8 % 16 == 0,
 * else eight interleaved in blocks scored head after head; AVX-512 sixteen per vector
 * from the nibble tables when nb8 % 4 == 0, 16 consecutive records loaded as one block:
 * resid.c, resid_avx2.c, resid_avx512.c). Cost: n nb8 bytes
 * read, n gs nb8 lookups. */
void kvq_rk_resid_scores_max(kvq_isa isa, const float *tab, int32_t gs, int32_t nb8,
                             const uint8_t *bits, const float *scale, const int32_t *tok,
                             const float *first, size_t fs, const int32_t *grp, int64_t n,
                             float *out);

/* Top-k selection in O(n), no sort: radix select (digits of 11/11/10 bits over
 * order-preserving keys, later digits only over the keys sharing the earlier ones);
 * from 16384 scores on, a strided sample of 1024 first brackets the threshold so that
 * one vector pass keeps only the keys near it, and the radix select runs over their
 * offsets from the bracket's low end (digits spread over its width; the full radix pass
 * runs when the bracket misses). Writes the indices of the min(k, n) largest of scores[0..n) (finite values) to idx,
 * in increasing index order; among equal scores the lower index wins. Returns the
 * count. work: [2n] uint32 scratch. Every path selects the same set. */
int64_t kvq_rk_topk(kvq_isa isa, const float *scores, int64_t n, int64_t k, int32_t *idx,
                    uint32_t *work);

/* Top-k from codes, for single-group codebooks (G = 1), where candidate j's score is
 * lut[codes[j]]: selects exactly what kvq_rk_topk selects from the scores kvq_rk_score
 * gives (same indices, increasing, same tie rule) without writing the scores. The
 * threshold comes from the K LUT entries weighted by counts (a radix select over K
 * keys), then one pass over the codes looks up each token's key and emits the indices.
 * counts[c] must be the number of codes[0..n) equal to c (kvq_rk_code_counts).
 * work: [3K] uint32 scratch. Cost: O(K) plus n lookups, one pass over 2n bytes of
 * codes, against kvq_rk_score + kvq_rk_topk's n lookups and two or three passes over
 * the 4n bytes of scores. */
int64_t kvq_rk_topk_codes(kvq_isa isa, const float *lut, int32_t K, const uint32_t *counts,
                          const uint16_t *codes, int64_t n, int64_t k, int32_t *idx,
                          uint32_t *work);

/* The key T (kvq_rk_key) of the k-th largest of the multiset in which keys[i] occurs
 * w[i] times (1 <= k <= sum of w; w[i] may be 0); *ties: how many occurrences of T are
 * in the top k. A radix select over the m entries, digit by digit as kvq_rk_topk's.
 * keys and w are overwritten. */
uint32_t kvq_rk_kth_key_weighted(uint32_t *keys, uint32_t *w, int64_t m, int64_t k,
                                 int64_t *ties);

/* Top-k of candidates scored per (code, distance band), single-group codebooks
 * (--score-pos bands on rows in code order, runtime/kernels/topk_bands.c). The candidates are
 * rows [0, n + nu):
 *   rows [0, n)       runs of one code in code order, code c's run cnt[c] rows long;
 *                     tok[j] the token of row j, increasing within a run
 *   rows [n, n + nu)  in token order: row n + i holds token utok0 + i, code ucodes[i]
 * A row's band: the first b < nb - 1 with token >= tb[b] (tb non-increasing: band 0 is
 * the nearest), else nb - 1. Its score: lut[b K + code]. Selects exactly what
 * kvq_rk_topk selects from those scores (the min(k, n + nu) largest, increasing row
 * indices into idx, among equal scores the lower row first) without writing a score per
 * row: the threshold from the nb K groups weighted by their row counts, the groups'
 * row ranges from a search of each run, then the rows emitted group by group.
 * work: [3 nb K] uint32. Cost: O(nb K log(n / K)) + nu + k, against the rows'
 * score fill and top-k's passes over 4 (n + nu) bytes. */
typedef struct kvq_rk_bands {
    int32_t K, nb;
    const float *lut;     /* [nb, K] */
    int64_t n;            /* rows in code order */
    const uint32_t *cnt;  /* [K] run lengths (sum n) */
    const int32_t *tok;   /* [n] */
    const int64_t *tb;    /* [nb - 1] first token of each band but the farthest */
    int64_t nu;           /* rows in token order after them */
    int64_t utok0;        /* the token of row n */
    const uint16_t *ucodes; /* [nu] */
} kvq_rk_bands;
int64_t kvq_rk_topk_bands(const kvq_rk_bands *B, int64_t k, int32_t *idx, uint32_t *work);
/* The same selection, and val [min(k, n + nu)] (when not NULL): val[i] = the score of row
 * idx[i], its group's LUT entry lut[b K + code] (the first-stage score the residual
 * stage adds its part to, runtime/select/codebook/resid.c: no band search per row). */
int64_t kvq_rk_topk_bands_scored(const kvq_rk_bands *B, int64_t k, int32_t *idx, float *val,
                                 uint32_t *work);
/* The same selection, and (each when not NULL) val as kvq_rk_topk_bands_scored and grp
 * [min(k, n + nu)]: grp[i] = b K + code, the (code, band) group of row idx[i], its entry
 * in any [nb, K] table of the bands (the residual stage's per-head LUTs,
 * kvq_rk_resid_scores_max: no band search per row). */
int64_t kvq_rk_topk_bands_grouped(const kvq_rk_bands *B, int64_t k, int32_t *idx, float *val,
                                  int32_t *grp, uint32_t *work);
/* Every row's group when all n + nu are selected (k >= n + nu above selects rows 0, 1,
 * ... in order, which this writes without the threshold): grp [n + nu], grp[j] = b K + code
 * of row j. B->lut is not read (may be NULL). work: [2 nb K] uint32. For the residual
 * stage over every candidate (select/codebook/resid.c, resid_share 1: the first cut selects
 * nothing). Cost: the runs' band searches, O(nb K log(n / K)), and n + nu writes. */
void kvq_rk_bands_groups(const kvq_rk_bands *B, int32_t *grp, uint32_t *work);
/* The same groups by pieces, so that a caller scoring every row in chunks keeps them in
 * L1 instead of writing and reading n + nu of them: bands_cursor_begin splits the runs
 * (work [2 nb K] uint32, kept by the cursor), then each bands_cursor_next writes the
 * groups of the next m rows (from row 0 on, in order) into grp [m]: the same values as
 * kvq_rk_bands_groups' grp over those rows. Cost: the runs' band searches once, then m
 * writes a call. */
typedef struct kvq_rk_bands_cursor {
    const kvq_rk_bands *B;
    const uint32_t *start; /* [K nb] the sub-runs' first rows */
    int64_t row;           /* the next row */
    int64_t rs;            /* the first row of code c's run */
    int32_t c, b;          /* the (code, band) sub-run of row (c == K: the tail, band b) */
} kvq_rk_bands_cursor;
void kvq_rk_bands_cursor_begin(const kvq_rk_bands *B, uint32_t *work, kvq_rk_bands_cursor *cur);
void kvq_rk_bands_cursor_next(kvq_rk_bands_cursor *cur, int64_t m, int32_t *grp);

/* Whether selecting n candidates from nb bands' groups (kvq_rk_topk_bands) is expected to
 * beat the per-row score fill + kvq_rk_topk for a K-entry codebook: its per-group work
 * (a search of each run per band, the threshold and the emission over nb K groups)
 * pays off once the candidates outnumber the groups four to one (bench_decode
 * --score bands at 128K: K 256 and 1024 faster from the groups, K 4096 from the scores;
 * docs/BENCHMARKS.md). Either way the selection is the same. */
static inline int kvq_rk_bands_select_pays(int64_t n, int32_t nb, int32_t K)
{
    return n >= 4 * (int64_t)nb * K;
}

/* Whether selecting n candidates from codes (kvq_rk_topk_codes) is expected to beat
 * score gather + kvq_rk_topk for a K-entry codebook: its O(K) part (about 17 us at
 * K = 4096) pays off once the candidates outnumber the codes four to one (bench_topk,
 * docs/BENCHMARKS.md "Decode"). Either way the selection is the same. */
static inline int kvq_rk_codes_select_pays(int64_t n, int32_t K) { return n >= 4 * (int64_t)K; }

/* Stable order of n rows by code (codes < K): order[i] = the row that comes i-th when
 * rows are sorted by code, rows of one code in increasing index (a counting sort).
 * count: [K] scratch. */
void kvq_rk_code_order(const uint16_t *codes, int64_t n, int32_t K, uint32_t *count,
                       int32_t *order);

/* counts[c] = how many of codes[a..b) equal c (0 <= a <= b <= len), for codes < K. hist,
 * when not NULL, holds the same counts over codes[0..len) (kept as tokens are
 * appended): when the codes outside [a, b) are few, counts = hist minus those, else
 * codes[a..b) are counted. counts: [K]. */
void kvq_rk_code_counts(const uint32_t *hist, int32_t K, const uint16_t *codes, int64_t len,
                        int64_t a, int64_t b, uint32_t *counts);

/* Logits of nq queries against m rows of a key cache:
 *   logits[h*ld_l + j] = scale * q[h*d ..] . K[row_j * ld_k ..]   (row_j = idx ? idx[j] : j)
 * K: f16 (uint16_t) or f32 rows of d elements, ld_k elements apart. dt: KVQ_DT_F16 or
 * KVQ_DT_F32. The scalar reference sums in double. Cost: nq m d; reads m rows once.
 * Only columns [0, m) of each row of logits are written. The AVX-512 path sums in one
 * fixed order (tests/test_logits_order.c writes it out): the rerank's choices and the
 * attention's outputs depend on its bits. */
void kvq_rk_logits(kvq_isa isa, const float *q, int32_t nq, int32_t d, const void *K, kvq_dtype dt,
                   int64_t ld_k, const int32_t *idx, int64_t m, float scale, float *logits,
                   int64_t ld_l);

/* Softmax in place of `rows` rows of m values, ld apart: x = exp(x - max) / sum. The
 * scalar reference uses expf and a double sum; the fast paths a polynomial exp
 * (relative error below 2e-7) and float sums. m >= 1. */
void kvq_rk_softmax(kvq_isa isa, float *x, int32_t rows, int64_t m, int64_t ld);

/* Weighted sum of value rows: out[h*d + t] = sum_j p[h*ld_p + j] * V[row_j*ld_v + t],
 * rows as in kvq_rk_logits. out: [nq, d] (overwritten). Cost: nq m d; reads m rows. */
void kvq_rk_mix(kvq_isa isa, const float *p, int32_t nq, int64_t ld_p, const void *V, kvq_dtype dt,
                int64_t ld_v, const int32_t *idx, int64_t m, int32_t d, float *out);

/* Fused sparse attention (one pass, online softmax): the kernel of a decode step.
 * state: kvq_rk_attend_floats(nq, d) floats = per query head the running max, the
 * running sum of exp(logit - max) and the running output [d].
 *   init     empty state (max -inf, sums 0)
 *   rows     adds m rows: logit_hj = scale * q_h . K[krow_j], value V[vrow_j], with
 *            krow_j = kidx ? kidx[j] : j and vrow_j = vidx ? vidx[j] : j (K and V may
 *            differ in dtype and layout, e.g. rotated window keys in f32 next to an f16
 *            value cache). Calls chain: the result does not depend on how the rows
 *            are split between calls, beyond rounding.
 *   finish   out[h] = output / sum   (out: [nq, d]; a state with no rows gives 0)
 * Equal to logits + softmax + mix over the same rows within KVQ_RK_TOL_OUT (tests).
 * The fast paths work in blocks of rows and prefetch the next block's K and V rows,
 * so scattered rows are fetched with both streams in flight.
 * Cost: 2 nq m d multiply-adds, m exponentials per head; reads each row once. */
size_t kvq_rk_attend_floats(int32_t nq, int32_t d);
void kvq_rk_attend_init(float *state, int32_t nq, int32_t d);
void kvq_rk_attend_rows(kvq_isa isa, float *state, const float *q, int32_t nq, int32_t d,
                        const void *K, kvq_dtype kdt, int64_t ld_k, const int32_t *kidx,
                        const void *V, kvq_dtype vdt, int64_t ld_v, const int32_t *vidx, int64_t m,
                        float scale);
void kvq_rk_attend_finish(const float *state, int32_t nq, int32_t d, float *out);

/* The table's f16 centroids [G, dg, K] (kvq_rk_table layout) and sizes (kernels.c; the
 * CUDA mirror and the codebook selector read them). */
const uint16_t *kvq_rk_table_f16(const kvq_rk_table *t, int32_t *G, int32_t *dg, int32_t *K);
/* The query the table's LUT is built from: q' = qs L^-T (grouped query-aware
 * codebooks, in double, rounded to float) or qs.   qs, qp: [d] (kernels.c) */
void kvq_rk_table_query(const kvq_rk_table *t, const float *qs, float *qp);

/* The candidates j < n with rank[j] < k, ascending, into sel (sel needs room for those
 * only; n ends at the last of them); returns their count. Scalar, and AVX-512 (compress
 * stores, runtime/kernels/rank_select_avx512.c; the same list; the mass selector's
 * memo and the rerank's, runtime/select/). */
int64_t kvq_rt_rank_select(const int32_t *rank, int64_t n, int32_t k, int32_t *sel);
int64_t kvq_rt_rank_select_avx512(const int32_t *rank, int64_t n, int32_t k, int32_t *sel);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_RUNTIME_RK_H */
