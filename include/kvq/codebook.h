/*
 * kvq/codebook.h — key codebooks per (layer, KV head): the five methods, and the codebook
 * object the fit and the runtime share: create, load from / save to the .kvq artifact,
 * encode, decode, lookup-table scoring (codebook/codebook.c). Fitting one with k-means
 * and the `kvq fit` stage are in kvq/fit.h.
 *
 * Math (docs/design.md, row vectors; d = head dim, K = codebook size, G = groups, d/G dims
 * per group, group g covering dims g*d/G .. (g+1)*d/G - 1):
 *
 *   method        fit space x_j (k-means runs here)   scoring query      exact score
 *   vq            k_j                                 q~ = q_i R_b       q~ . k_j
 *   pq            k_j, G groups                       q~                 q~ . k_j
 *   qavq          z_j = k_j L                         q~                 q~ . k_j = q' . z_j
 *   qapq          z_j = k_j L, G groups of z dims     q~                 q' . z_j
 *   vq-postrope   k_j R_{pos_j}                       q_i R_{pos_i}      (q R_i) . (k R_j)
 *
 * with L the lower Cholesky factor of the query second moment H = L L^T
 * (kvq/moments.h) and q' = q~ L^-T, so that q~ . k = q' . z exactly. Per group g the
 * codebook W_g [K, d/G] holds k-means centroids of the fit-space sub-vectors; a key is
 * encoded as G indices s_jg = argmin_c ||x_jg - W_g[c]||^2, and scored with a lookup
 * table built once per query: LUT[g][c] = q'_g . W_g[c] (q' = q~ for the plain methods),
 * score_j = sum_g LUT[g][s_jg]. For qavq (G = 1) the key-space codebook
 * C = C^z L^-1 gives the same score as q~ . C[s_j]. The key-space reconstruction
 * ("decode") is the concatenation of the group centroids, times L^-1 for the
 * query-aware methods; for vq-postrope it approximates the rotated key k R_j.
 *
 * Numbers: keys, queries, centroids, L and L^-1 are f32; the transforms k L, q~ L^-T and
 * C^z L^-1 and every LUT entry are computed in double from those f32 values and rounded
 * once (RoPE rotations use kvq_rope_apply), so a codebook created from stored tensors
 * (kvq_codebook_create, kvq_codebook_load) encodes and scores exactly as the one that
 * was fitted. Encoding (kvq_codebook_encode) is the nearest-centroid rule of
 * codebook/nearest.h, the one k-means assigns by: for d/G <= KVQ_KM_DIRECT_MAX_D (16) the
 * exact distance ||x - c||^2 (kvq_km_l2sq), above it ||x||^2 + ||c||^2 - 2 x.c clamped
 * at 0 (kvq_km_dist_from_dot) with the norms and the dot summed in a fixed order; ties
 * go to the lower index. It gives the codes of kvq_kmeans_assign on the same centroids
 * exactly for d/G <= 16 on AVX2 CPUs and whenever the dot products are exact (e.g. ties
 * of small-integer data); otherwise (SGEMM rounds the dot differently) a nearest
 * centroid within KVQ_KMEANS_TOL_DIST. Every caller (the fit's diagnostics, the
 * runtime's cache) encodes through it, so they agree bit for bit, for any batch size
 * and thread count.
 */
#ifndef KVQ_CODEBOOK_H
#define KVQ_CODEBOOK_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/codebook.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"
#include "kvq/rope.h"
#include "kvq/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==========================================================================
 * Methods
 * ========================================================================== */

typedef enum kvq_codebook_method {
    KVQ_CODEBOOK_VQ = 0,          /* "vq": plain VQ of pre-RoPE keys (L = I); groups 1 */
    KVQ_CODEBOOK_QAVQ = 1,        /* "qavq": query-aware VQ in z = k L; groups 1 */
    KVQ_CODEBOOK_PQ = 2,          /* "pq": plain grouped VQ (hcattention); groups 4 */
    KVQ_CODEBOOK_QAPQ = 3,        /* "qapq": query-aware grouped VQ in z-space; groups 4 */
    KVQ_CODEBOOK_VQ_POSTROPE = 4  /* "vq-postrope": VQ of k R_pos (PQCache/ClusterKV
                                     baseline), scored with q R_pos; groups 1 */
} kvq_codebook_method;
#define KVQ_CODEBOOK_N_METHODS 5

/* "vq", "qavq", "pq", "qapq", "vq-postrope"; "unknown" otherwise. */
const char *kvq_codebook_method_name(kvq_codebook_method m);
/* Parses the names above and the old artifact spellings "qa-vq" (= qavq) and
 * "post-rope-vq" (= vq-postrope). KVQ_E_INVALID_ARG naming the text otherwise. */
kvq_status kvq_codebook_method_parse(const char *s, kvq_codebook_method *m, kvq_err *err);
/* The artifact's "method" value (docs/format.md section 7): "vq" for vq and pq,
 * "qavq" for qavq and qapq, "vq-postrope" for vq-postrope. */
const char *kvq_codebook_method_format_name(kvq_codebook_method m);
/* The method for an artifact "method" value and a group count: vq/pq and qavq/qapq
 * are told apart by groups (1 or more); the old spellings "qa-vq" and "post-rope-vq"
 * are read as "qavq" and "vq-postrope". KVQ_E_UNSUPPORTED for an unknown name. */
kvq_status kvq_codebook_method_from_format(const char *name, int32_t groups,
                                           kvq_codebook_method *m, kvq_err *err);
int32_t kvq_codebook_method_default_groups(kvq_codebook_method m); /* 1 or 4 */
int kvq_codebook_method_is_query_aware(kvq_codebook_method m);     /* qavq, qapq */

/* ==========================================================================
 * A codebook (one layer, one KV head): immutable once built
 * ========================================================================== */

/* What a codebook is, apart from its numbers. */
typedef struct kvq_codebook_desc {
    kvq_codebook_method method;
    int32_t dim;        /* d, head dim: even, 2 .. KVQ_ROPE_MAX_DIM */
    int32_t k;          /* K, centroids per group: 1 .. 65536 */
    int32_t groups;     /* G: divides dim */
    kvq_rope rope;      /* the model's RoPE (rope.head_dim == dim): keys of vq-postrope
                           and kvq_codebook_query_pe use it */
    int64_t wrope_b;    /* WRoPE position b: q~ = q R_b (every method but vq-postrope) */
} kvq_codebook_desc;

/* KVQ_E_INVALID_ARG naming the bad field. */
kvq_status kvq_codebook_desc_check(const kvq_codebook_desc *desc, kvq_err *err);

typedef struct kvq_codebook kvq_codebook;

/* Builds a codebook from its tensors (all copied):
 *   centroids  [G, K, d/G] fit-space centroids W_g (C^z groups for the query-aware
 *              methods, key-space otherwise); must be finite
 *   L, Linv    [d, d] row-major lower factor of H and its inverse (query-aware methods;
 *              ignored, may be NULL, otherwise); must be finite
 * For qavq the key-space codebook C = C^z L^-1 [K, d] is derived here.
 * Errors: KVQ_E_INVALID_ARG (desc, NULL arrays), KVQ_E_NUMERIC (a non-finite value),
 * KVQ_E_NOMEM. Memory: G K d/G floats (2 K d for qavq) plus 2 d^2 for L, L^-1. */
kvq_status kvq_codebook_create(const kvq_codebook_desc *desc, const float *centroids,
                               const float *L, const float *Linv, kvq_codebook **out,
                               kvq_err *err);
void kvq_codebook_free(kvq_codebook *cb); /* NULL is fine */

/* Loads (layer, KV head) from an artifact payload (kvq_artifact_payload) written by
 * `kvq fit`: method, codebook_size, groups, wrope.b and the model's RoPE from the
 * metadata, the tensors of docs/format.md section 7. Errors: KVQ_E_NOT_FOUND (a key or
 * tensor, named), KVQ_E_CORRUPT (a malformed value), KVQ_E_UNSUPPORTED (method "none"
 * or unknown), KVQ_E_SHAPE_MISMATCH (dtype or shape), and those of create. */
kvq_status kvq_codebook_load(const kvq_st *payload, int32_t layer, int32_t head,
                             kvq_codebook **out, kvq_err *err);

/* Saves (layer, KV head)'s tensors (docs/format.md section 7) in the artifact's order:
 * L and Linv (query-aware methods), then per group the fit-space centroids (Cz or
 * codebook, named per group when G > 1), then for qavq the key-space codebook C.
 * `add` receives each F32 tensor [rows, cols] (data row-major, valid during the call);
 * its error stops the save and is returned. The metadata keys the loader reads
 * (method, codebook_size, groups, wrope.b, model.*) are the writer's. */
typedef kvq_status (*kvq_codebook_tensor_fn)(void *user, const char *name, int64_t rows,
                                             int64_t cols, const float *data, kvq_err *err);
kvq_status kvq_codebook_save(const kvq_codebook *cb, int32_t layer, int32_t head,
                             kvq_codebook_tensor_fn add, void *user, kvq_err *err);

const kvq_codebook_desc *kvq_codebook_get_desc(const kvq_codebook *cb);
/* Group g's fit-space centroids W_g [K, d/G] (g < G). */
const float *kvq_codebook_centroids(const kvq_codebook *cb, int32_t g);
/* The key-space codebook C [K, d] when G == 1 (C = C^z L^-1 for qavq, W_0 otherwise);
 * NULL when G > 1 (a grouped query-aware codebook has no per-group key-space form). */
const float *kvq_codebook_key_codebook(const kvq_codebook *cb);
/* L and L^-1 [d, d] (query-aware methods), else NULL. */
const float *kvq_codebook_L(const kvq_codebook *cb);
const float *kvq_codebook_Linv(const kvq_codebook *cb);

/* ---- the method's spaces ------------------------------------------------------- */

/* Fit space of n keys: x_j = k_j L (query-aware), k_j R_{pos_j} (vq-postrope, rotated
 * by kvq_rope_apply: float rotation, double angles, as the models do), k_j (plain).
 *   keys: [n, d] pre-RoPE   pos: [n] (vq-postrope; otherwise may be NULL)
 * out: [n, d] (may not alias keys). `threads` >= 1 splits rows; the result does not
 * depend on it. Errors: KVQ_E_INVALID_ARG (NULL pos for vq-postrope, n < 0).
 * Cost: n d^2 (query-aware), n d (otherwise). */
kvq_status kvq_codebook_fit_space(const kvq_codebook_desc *desc, const float *L,
                                  const float *keys, const int32_t *pos, int64_t n,
                                  int32_t threads, float *out, kvq_err *err);

/* The scoring query of a pre-RoPE query q at position `pos`: q R_b (b = wrope_b) for
 * every method but vq-postrope, q R_pos for vq-postrope.   q, out: [d] (may alias) */
void kvq_codebook_query_pe(const kvq_codebook *cb, const float *q, int64_t pos, float *out);

/* Index of the first row of x [n, d] with a non-finite value, or -1. */
int64_t kvq_codebook_first_bad_row(const float *x, int64_t n, int32_t d);
/* Copies columns [g dg, (g+1) dg) of x [n, d] into sub [n, dg] (group g's sub-vectors). */
void kvq_codebook_take_group(const float *x, int64_t n, int32_t d, int32_t g, int32_t dg,
                             float *sub);

/* ---- encode, decode, score ------------------------------------------------------- */

/* Codes of n keys: codes[j*G + g] = nearest centroid of group g of the fit-space key
 * (the rule above; precomputed centroid norms).
 *   keys [n, d] pre-RoPE   pos [n] (vq-postrope only, else may be NULL)   codes [n, G]
 * Allocation-free (one key's fit space on the stack), so the runtime calls it per token.
 * `threads` >= 1 splits rows; the codes do not depend on it nor on n.
 * Errors: KVQ_E_INVALID_ARG, KVQ_E_NUMERIC (a non-finite key: the message names the
 * row). Cost: n K d multiply-adds plus the transform. */
kvq_status kvq_codebook_encode(const kvq_codebook *cb, const float *keys, const int32_t *pos,
                               int64_t n, int32_t threads, int32_t *codes, kvq_err *err);

/* Reconstruction in scoring space from codes [n, G] (each < K): khat [n, d] is the key
 * approximation (z^ L^-1 for query-aware methods; an approximation of k R_pos for
 * vq-postrope), so that the approximate score is qs . khat_j with qs the scoring query.
 * Codes out of range are an internal error (assert). Cost: n d (d^2 query-aware). */
void kvq_codebook_decode(const kvq_codebook *cb, const int32_t *codes, int64_t n, float *khat);

/* The LUT query of a scoring query qs [d]: q' = qs L^-T in double for query-aware
 * methods (q'[a] = sum_{b <= a} qs[b] Linv[a][b]), else qs.   qp: [d] */
void kvq_codebook_lut_query(const kvq_codebook *cb, const float *qs, double *qp);

/* The reference lookup table of a scoring query qs [d] (from kvq_codebook_query_pe):
 * lut[g*K + c] = q'_g . W_g[c] (q' from kvq_codebook_lut_query), in double from the f32
 * centroids, rounded once. lut: [G, K]. Cost: K d (+ d^2). The fast LUT the decode step
 * uses (f16 table, SIMD) is kvq_rk_lut (runtime/kernels/rk.h, internal), tested against
 * this one. */
void kvq_codebook_lut_ref(const kvq_codebook *cb, const float *qs, float *lut);

/* Approximate scores of n codes [n, G] from a LUT [G, K]:
 * scores[j] = sum over g = 0 .. G-1 (in that order, in float) of lut[g*K + codes[j*G+g]].
 * Cost: n G lookups. */
void kvq_codebook_score(const kvq_codebook *cb, const float *lut, const int32_t *codes,
                        int64_t n, float *scores);

/* The scalar reference for one code [G]: qs . decode(code), in double, straight from
 * the key-space reconstruction (no LUT). The LUT score equals it to float rounding. */
double kvq_codebook_score_ref(const kvq_codebook *cb, const float *qs, const int32_t *code);

/* Attention-score error over every pair of n_q scoring queries qs [n_q, d] and n_k keys
 * (pre-RoPE, with pos for vq-postrope):
 *   mse   = mean over (i, j) of (qs_i . s(k_j) - qs_i . khat_j)^2
 *   power = mean over (i, j) of (qs_i . s(k_j))^2      (the scale of the scores)
 * with s(k_j) the exact scoring-space key (k_j R_pos_j for vq-postrope, else k_j) and
 * khat_j its reconstruction from its code. Computed exactly as mean_j e_j Q e_j^T with
 * Q = mean_i qs_i^T qs_i, in double, in a fixed order (thread-count independent).
 * Errors: KVQ_E_INVALID_ARG (n_q or n_k < 1), those of encode. Cost: encode plus
 * (n_q + n_k) d^2. */
kvq_status kvq_codebook_score_mse(const kvq_codebook *cb, const float *qs, int64_t n_q,
                                  const float *keys, const int32_t *pos, int64_t n_k,
                                  int32_t threads, double *mse, double *power, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CODEBOOK_H */
