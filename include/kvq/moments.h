/*
 * kvq/moments.h — query second moments H per (layer, KV head), their Cholesky factors,
 * and the moments file that `kvq fit` reads.
 *
 * Math (docs/design.md, row vectors). For layer l and KV head h with GQA group
 * G(h) = query heads h*r .. h*r + r - 1, r = n_heads / n_kv_heads (query head g uses
 * KV head g / r, the llama/HF convention):
 *   H_pre = (sum over g in G(h) of S_g) / (sum over g in G(h) of count_g)
 * where S_g = sum over rows of q^T q (pre-RoPE, the capture's q_moment_sum). Then
 *   positions "wrope":  H = R_b^T H_pre R_b   (q~ = q R_b, b = wrope_b, default 2048)
 *   positions "rope":   H = mean over stored queries i and g in G(h) of (q R_pos_i)^T (q R_pos_i)
 *                       (post-RoPE ablation, from the captured q rows and their pos)
 * H is symmetrized ((H + H^T) / 2) and factored H + lambda I = L L^T (L lower,
 * LAPACKE_dpotrf), L^-1 by LAPACKE_dtrtri.
 *
 * Regularization: lambda = 0 when H is numerically positive definite: dpotrf succeeds
 * and eig_min(H) > d * DBL_EPSILON * eig_max(H) (the usual numerical-rank tolerance).
 * Otherwise lambda = eps * tr(H) / d for eps = eps0, 10 eps0, 100 eps0, ... up to
 * eps_max; the first eps for which H + lambda I passes the same test is used. If none
 * does (or tr(H) <= 0, or H has NaN/Inf), KVQ_E_NUMERIC.
 *
 * Diagnostics per (layer, KV head), from LAPACKE_dsyev on H:
 *   eig_min, eig_max  extreme eigenvalues of H (before regularization)
 *   cond              (eig_max + lambda) / (eig_min + lambda): the condition number of the
 *                     matrix that was factored
 *   anisotropy        1 - (tr(H)/d)^2 / (||H||_F^2 / d) = 1 - mean(eig)^2 / mean(eig^2),
 *                     the share of the eigenvalue energy that is spread, not mean: 0 exactly
 *                     for a multiple of I, 1 - 1/d for a rank-1 H, in [0, 1) for H >= 0
 *   count             number of query vectors averaged (sum of the group's counts)
 *
 * Moments file (safetensors, written atomically), per captured model layer L:
 *   layer.L.H           F64 [n_kv_heads, d, d]   H (without lambda)
 *   layer.L.L           F64 [n_kv_heads, d, d]   lower factor of H + lambda I
 *   layer.L.Linv        F64 [n_kv_heads, d, d]   L^-1 (lower)
 *   layer.L.L_f32       F32 [n_kv_heads, d, d]
 *   layer.L.Linv_f32    F32 [n_kv_heads, d, d]
 *   layer.L.lambda      F64 [n_kv_heads]
 *   layer.L.eig_min, layer.L.eig_max, layer.L.cond, layer.L.anisotropy, layer.L.count
 *                       F64 [n_kv_heads]
 * __metadata__: format "kvq-moments", version "1", positions "wrope"|"rope", wrope_b,
 * wrope_w, layers ("0,1,2"), model.* (kvq_model_id_set_meta), capture (the directory),
 * corpus.hash, n_tokens, tool. Matrices are row-major; d = head_dim.
 *
 * Determinism: the output depends only on the capture and the parameters (in "rope"
 * mode also on the BLAS thread count, through DSYRK's summation order).
 */
#ifndef KVQ_MOMENTS_H
#define KVQ_MOMENTS_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/moments.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include "kvq/capture_dir.h"
#include "kvq/common.h"
#include "kvq/rope.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_MOMENTS_FORMAT "kvq-moments"
#define KVQ_MOMENTS_VERSION 1


typedef enum kvq_moments_device {
    KVQ_MOMENTS_CPU = 0,
    KVQ_MOMENTS_CUDA = 1      /* cuSOLVER batched potrf; CPU fallback with one warning */
} kvq_moments_device;

typedef struct kvq_moments_params {
    kvq_positions positions;  /* default KVQ_POSITIONS_WROPE */
    int64_t wrope_b;          /* b in R_b, [0, 2^31), default 2048 */
    int32_t wrope_w;          /* window w, recorded for later stages, [1, 2^31), default 64 */
    double eps0;              /* first regularization eps, (0, eps_max], default 1e-6 */
    double eps_max;           /* last eps tried, default 1.0 (lambda = mean eigenvalue) */
    kvq_moments_device device;/* default CPU */
} kvq_moments_params;

kvq_moments_params kvq_moments_params_default(void);
/* KVQ_E_INVALID_ARG naming the bad field. */
kvq_status kvq_moments_params_check(const kvq_moments_params *p, kvq_err *err);

/* Per (layer, KV head) results and diagnostics (see the top of this file). */
typedef struct kvq_moments_head_stats {
    double lambda;
    double eps;               /* lambda / (tr(H)/d); 0 when not regularized */
    double eig_min, eig_max, cond, anisotropy;
    double count;
} kvq_moments_head_stats;

/* ---- math primitives (pure, no I/O; the CPU reference) -------------------------- */

/* GQA grouping and mean: H[h] = sum_{g in G(h)} S[g] / sum_{g in G(h)} counts[g],
 * count[h] = that count sum.
 *   S: [n_heads, d, d]   counts: [n_heads]   H: [n_kv_heads, d, d]   count: [n_kv_heads]
 * Errors: KVQ_E_INVALID_ARG (n_heads not a multiple of n_kv_heads, d < 1),
 * KVQ_E_NUMERIC (NaN/Inf in S or counts, a negative or non-integral count, a group
 * with count 0). Cost: n_heads * d^2. */
kvq_status kvq_moments_group(const double *S, const double *counts, int n_heads, int n_kv_heads,
                             int d, double *H, double *count, kvq_err *err);

/* H <- R^T H R, then symmetrized. H, R: [d, d]; work: [d, d] scratch. Cost 2 d^3. */
void kvq_moments_rotate(double *H, const double *R, int d, double *work);

/* H <- (H + H^T) / 2.  H: [d, d] */
void kvq_moments_symmetrize(double *H, int d);

/* Diagnostics of a symmetric H (lambda is used for cond only).  H: [d, d]
 * Fills eig_min, eig_max, cond, anisotropy. Errors: KVQ_E_NUMERIC (NaN/Inf, tr <= 0),
 * KVQ_E_BACKEND (dsyev failed), KVQ_E_NOMEM. Cost: one dsyev, O(d^3). */
kvq_status kvq_moments_diagnose(const double *H, int d, double lambda,
                                kvq_moments_head_stats *out, kvq_err *err);

/* Regularized Cholesky of a symmetric H (the rule at the top of this file).
 *   H: [d, d] in;  L, Linv: [d, d] out (lower triangular, zeros above the diagonal)
 * Fills stats (lambda, eps, eig_min, eig_max, cond, anisotropy; count untouched).
 * `label` names the head in messages ("layer 3 head 1"). Errors: KVQ_E_NUMERIC (not
 * factorable within eps_max, NaN/Inf, tr <= 0), KVQ_E_BACKEND, KVQ_E_NOMEM,
 * KVQ_E_INVALID_ARG (params). Cost: O(d^3). */
kvq_status kvq_cholesky_regularized(const double *H, int d, const kvq_moments_params *p,
                                    const char *label, double *L, double *Linv,
                                    kvq_moments_head_stats *stats, kvq_err *err);

/* ---- the stage ------------------------------------------------------------------- */

/* Reads the capture directory, computes every captured layer and writes the moments
 * file `out_path` atomically (overwrite = 0: KVQ_E_EXISTS if it exists). Progress:
 * "moments" per layer; a callback asking to stop gives KVQ_E_CANCELLED and no file.
 * Logs (INFO) each regularized head with its lambda; with device CUDA and no usable
 * device, one WARN and the CPU. Errors: those of kvq_capture_info_read and
 * kvq_st_open (layer files), KVQ_E_NOT_FOUND (a tensor missing, named),
 * KVQ_E_SHAPE_MISMATCH (a tensor's dtype or shape disagrees with capture.json),
 * KVQ_E_OUT_OF_BOUNDS (q_rows or pos out of range), KVQ_E_NUMERIC, KVQ_E_BACKEND,
 * KVQ_E_NOMEM, KVQ_E_IO, KVQ_E_EXISTS, KVQ_E_CANCELLED. Memory: O(n_heads d^2) per
 * layer (plus a chunk of queries in "rope" mode). */
kvq_status kvq_moments_compute(const char *capture_dir, const char *out_path, int overwrite,
                               const kvq_moments_params *p, const kvq_callbacks *cb,
                               kvq_err *err);

/* ---- reading a moments file ------------------------------------------------------- */
typedef struct kvq_moments kvq_moments;

/* Opens and validates a moments file: format, version, model identity and every
 * layer's tensors (names, dtypes, shapes). Errors: those of kvq_st_open,
 * KVQ_E_BAD_MAGIC (format), KVQ_E_VERSION, KVQ_E_NOT_FOUND (a key or tensor, named),
 * KVQ_E_SHAPE_MISMATCH, KVQ_E_CORRUPT. Cost: reads the header; tensors are read on
 * demand from the mapping. */
kvq_status kvq_moments_open(const char *path, kvq_moments **out, kvq_err *err);
void kvq_moments_close(kvq_moments *m); /* NULL is fine */
/* 1 when path is a safetensors file with format "kvq-moments": the files --force lets
 * `kvq moments` replace (kvq_output_owned_fn). */
int kvq_moments_is_moments(const char *path);

const kvq_model_id *kvq_moments_model(const kvq_moments *m);
int32_t kvq_moments_n_layers(const kvq_moments *m);          /* layers in the file */
int32_t kvq_moments_layer(const kvq_moments *m, int32_t i);  /* model layer index of entry i */
int kvq_moments_has_layer(const kvq_moments *m, int32_t layer);
kvq_positions kvq_moments_positions(const kvq_moments *m);
int64_t kvq_moments_wrope_b(const kvq_moments *m);
int32_t kvq_moments_wrope_w(const kvq_moments *m);
const char *kvq_moments_meta(const kvq_moments *m, const char *key); /* NULL if absent */

typedef enum kvq_moments_matrix {
    KVQ_MOMENTS_MAT_H = 0,
    KVQ_MOMENTS_MAT_L = 1,
    KVQ_MOMENTS_MAT_LINV = 2
} kvq_moments_matrix;

/* Copies one [d, d] matrix of (model layer, KV head). KVQ_E_INVALID_ARG for a layer
 * not in the file or a head out of range. */
kvq_status kvq_moments_get_f64(const kvq_moments *m, int32_t layer, int32_t head,
                               kvq_moments_matrix which, double *out, kvq_err *err);
/* L or L^-1 as float (the stored _f32 tensors); H -> KVQ_E_INVALID_ARG.  out: [d, d] */
kvq_status kvq_moments_get_f32(const kvq_moments *m, int32_t layer, int32_t head,
                               kvq_moments_matrix which, float *out, kvq_err *err);
kvq_status kvq_moments_get_stats(const kvq_moments *m, int32_t layer, int32_t head,
                                 kvq_moments_head_stats *out, kvq_err *err);

/* KVQ_OK when the moments file was computed from this capture: the same model and the
 * same captured tokens (the capture's corpus hash and token count, which the moments
 * file records as corpus.hash and n_tokens); otherwise KVQ_E_MISMATCH, the message
 * naming both files and the field ("M.safetensors vs DIR/capture.json: model.n_heads
 * differs (8 vs 4)"). A moments file that records no capture is KVQ_E_MISMATCH too.
 * Which layers a caller needs is its own business: see kvq_moments_has_layer. */
kvq_status kvq_moments_check_capture(const kvq_moments *m, const kvq_capture_info *ci,
                                     kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif
