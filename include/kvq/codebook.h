/*
 * kvq/codebook.h — key codebooks per (layer, KV head): the five methods, their fit,
 * encoding, lookup-table scoring, and the `kvq fit` stage that fits every head of a
 * model and writes the .kvq artifact.
 *
 * Math (DESIGN.md, row vectors; d = head dim, K = codebook size, G = groups, d/G dims
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
 * was fitted. Encoding uses kvq_kmeans_assign (SGEMM distances): it returns a nearest
 * centroid within KVQ_KMEANS_TOL_DIST of the exact one (kvq/kmeans.h), ties to the
 * lower index, and the same codes for any thread count.
 */
#ifndef KVQ_CODEBOOK_H
#define KVQ_CODEBOOK_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"
#include "kvq/kmeans.h"
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

/* ---- encode, decode, score ------------------------------------------------------- */

/* Codes of n keys: codes[j*G + g] = nearest centroid of group g of the fit-space key.
 *   keys [n, d] pre-RoPE   pos [n] (vq-postrope only, else may be NULL)   codes [n, G]
 * Errors: KVQ_E_INVALID_ARG, KVQ_E_NUMERIC (a non-finite key: the message names the
 * row), KVQ_E_NOMEM, KVQ_E_BACKEND. Cost: 2 n K d flops (SGEMM) plus the transform.
 * Memory: n d floats. */
kvq_status kvq_codebook_encode(const kvq_codebook *cb, const float *keys, const int32_t *pos,
                               int64_t n, int32_t threads, int32_t *codes, kvq_err *err);

/* Reconstruction in scoring space from codes [n, G] (each < K): khat [n, d] is the key
 * approximation (z^ L^-1 for query-aware methods; an approximation of k R_pos for
 * vq-postrope), so that the approximate score is qs . khat_j with qs the scoring query.
 * Codes out of range are an internal error (assert). Cost: n d (d^2 query-aware). */
void kvq_codebook_decode(const kvq_codebook *cb, const int32_t *codes, int64_t n, float *khat);

/* Lookup table of a scoring query qs [d] (from kvq_codebook_query_pe):
 * lut[g*K + c] = q'_g . W_g[c], q' = qs L^-T for query-aware methods, else qs.
 * lut: [G, K]. Cost: K d (+ d^2). */
void kvq_codebook_lut(const kvq_codebook *cb, const float *qs, float *lut);

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

/* ---- fit ------------------------------------------------------------------------- */

/* Training data of one head. */
typedef struct kvq_codebook_data {
    const float *keys;  /* [n, d] pre-RoPE keys, finite */
    const int32_t *pos; /* [n] positions (vq-postrope; otherwise may be NULL) */
    int64_t n;          /* >= K */
    const float *L;     /* [d, d] lower factor of H (query-aware methods, else NULL) */
    const float *Linv;  /* [d, d] its inverse (query-aware methods, else NULL) */
} kvq_codebook_data;

/* Statistics of a fit: one k-means run per group. */
typedef struct kvq_codebook_fit_stats {
    int32_t groups;
    kvq_kmeans_stats *group;  /* [groups] (malloc'd) */
} kvq_codebook_fit_stats;
void kvq_codebook_fit_stats_free(kvq_codebook_fit_stats *s); /* zeroed struct is fine */

/* Fits the codebook: fit-space keys, then per group g k-means (`km`: iterations, tol,
 * init, threads, device, callbacks; km->k is replaced by desc->k and km->seed by
 * kvq_codebook_group_seed(km->seed, g)) on the group's sub-vectors [n, d/G].
 * Errors: KVQ_E_INVALID_ARG (desc, data: n < K, NULL L for a query-aware method),
 * KVQ_E_NUMERIC (a non-finite key: the message names the row), and those of
 * kvq_kmeans_fit. Cost: the transform plus G k-means runs on d/G dims. */
kvq_status kvq_codebook_fit(const kvq_codebook_desc *desc, const kvq_codebook_data *data,
                            const kvq_kmeans_params *km, kvq_codebook **out,
                            kvq_codebook_fit_stats *stats, kvq_err *err);

/* Seed of group g's k-means from a head's seed (a fixed mix; g = 0 gives a different
 * value from `seed` too). Also used to derive per-head seeds in kvq_fit_run. */
uint64_t kvq_codebook_group_seed(uint64_t seed, int64_t g);

/* ==========================================================================
 * The fit stage: every (layer, KV head) of a capture -> one .kvq artifact
 * ========================================================================== */

typedef struct kvq_fit_params {
    kvq_codebook_method method;  /* default KVQ_CODEBOOK_QAVQ */
    int32_t codebook_size;       /* K, 2 .. 65536; 0 (default) = 4096 reduced to the largest
                                    power of two with at least 39 training keys per centroid
                                    (a warning when even 2 has fewer) */
    int32_t groups;              /* G dividing d; 0 (default) = the method's default */
    int32_t iters;               /* Lloyd iterations, >= 0. Default 25 */
    double tol;                  /* relative inertia tolerance, >= 0. Default 1e-4 */
    uint64_t seed;               /* default 1234 */
    int32_t threads;             /* >= 1, default 1; the output does not depend on it */
    kvq_kmeans_init init;        /* default greedy k-means++ */
    kvq_kmeans_device device;    /* default CPU; CUDA without a device: one warning, CPU */
    double holdout;              /* fraction of sequences held out for the score-MSE
                                    diagnostic, [0, 1). Default 0.1 */
    int reference;               /* 1 (default): also fit plain VQ with the same K and G
                                    ("vq" or "pq") on the same keys, for the diagnostic */
    const int32_t *layers;       /* [n_layers] model layers to fit; NULL = every layer in
                                    both the capture and the moments file */
    size_t n_layers;
    int overwrite;               /* replace an existing output */
    int checkpoint;              /* 1 (default): keep finished jobs in OUT.ckpt/ */
    int zstd_level;              /* 0 = the artifact default */
    kvq_callbacks cb;            /* log; progress("fit", heads done, heads total) after
                                    each head, non-zero -> KVQ_E_CANCELLED */
} kvq_fit_params;

kvq_fit_params kvq_fit_params_default(void);

/* What a run did (optional output of kvq_fit_run). */
typedef struct kvq_fit_summary {
    int32_t codebook_size;       /* K used */
    int32_t groups;              /* G used */
    int64_t n_train;             /* training keys per head */
    int64_t n_heldout_keys;      /* held-out keys per head (0 with holdout 0) */
    int64_t n_heldout_queries;   /* held-out query vectors per KV head (GQA group) */
    int32_t n_jobs;              /* (layer, KV head) jobs */
    int32_t n_resumed;           /* jobs loaded from the checkpoint */
    double score_mse;            /* mean over heads of the held-out score MSE (NaN
                                    without held-out data) */
    double score_mse_ref;        /* the same for the reference (NaN when none) */
    double score_power;          /* mean over heads of E[(q~.k)^2] on held-out data */
} kvq_fit_summary;

/*
 * Fits every requested (layer, KV head) of the capture with the moments' L and writes
 * the artifact `out_path` (docs/format.md, section "kvq fit") atomically.
 *
 * Jobs run in (layer, head) order; each finished job is written to
 * "<out_path>.ckpt/layer.L.head.H.safetensors" (atomically) with a key of every input
 * and parameter that changes its result, so a killed or cancelled run, started again
 * with the same arguments, loads the finished jobs instead of refitting them (a job
 * whose key differs is refitted). The checkpoint directory is removed once the
 * artifact is written. Capture directories are assumed immutable (they are written
 * whole, then renamed): the key covers their corpus hash and sizes, not every byte.
 *
 * Same inputs, parameters and seed give the same artifact bytes, for any thread count
 * and whether or not the run was resumed (CPU backend).
 *
 * Errors: those of kvq_capture_info_read, kvq_moments_open and kvq_st_open;
 *   KVQ_E_MISMATCH  capture and moments of different models (the message names both
 *                   files and the field)
 *   KVQ_E_INVALID_ARG  bad parameters (named), groups not dividing d, a requested layer
 *                   missing from the capture or the moments file, a codebook larger than
 *                   the training keys
 *   KVQ_E_SHAPE_MISMATCH  a layer tensor whose dtype or shape disagrees with capture.json
 *   KVQ_E_OUT_OF_BOUNDS   pos, seq or q_rows out of range
 *   KVQ_E_NUMERIC   a non-finite key ("layer L head H row R (sequence S position P)")
 *   KVQ_E_EXISTS    the output exists and overwrite is 0 (checked before any work)
 *   KVQ_E_CANCELLED the progress callback asked to stop (finished jobs stay checkpointed)
 *   and KVQ_E_IO, KVQ_E_NOMEM, KVQ_E_BACKEND.
 * Cost: per head, the k-means fits (method and reference) and one encode of the
 * held-out keys. Memory: one layer's keys of one head in f32 (x3 during a fit), plus
 * every finished codebook until the artifact is written.
 */
kvq_status kvq_fit_run(const char *capture_dir, const char *moments_path, const char *out_path,
                       const kvq_fit_params *p, kvq_fit_summary *summary, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CODEBOOK_H */
