/*
 * kvq/fit.h — fitting key codebooks (kvq/codebook.h) with k-means (kvq/kmeans.h): one
 * codebook (kvq_codebook_fit, kmeans/codebook_fit.c) and the `kvq fit` stage that fits
 * every head of a model and writes the .kvq artifact (kvq_fit_run, kmeans/fit.c).
 * The fitted codebooks encode keys with kvq_codebook_encode, the same rule k-means
 * assigns by (codebook/nearest.h).
 */
#ifndef KVQ_FIT_H
#define KVQ_FIT_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/fit.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kvq/codebook.h"
#include "kvq/common.h"
#include "kvq/dist.h"
#include "kvq/kmeans.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    const int32_t *layers;       /* [n_layers] model layers to fit; NULL = every layer of
                                    the capture (each must be in the moments file) */
    size_t n_layers;
    int overwrite;               /* replace an existing output (a .kvq artifact only) */
    int checkpoint;              /* 1 (default): keep finished jobs in OUT.ckpt/ */
    int zstd_level;              /* 0 = the artifact default */
    const char *date;            /* provenance.date (YYYY-MM-DD, the caller's clock: the
                                    library reads none); NULL or "" = not recorded */
    kvq_callbacks cb;            /* log; progress("fit", heads done, heads total) after
                                    each head, non-zero -> KVQ_E_CANCELLED */
    const kvq_dist *dist;        /* NULL (default): one process; else the jobs are split
                                    among its ranks (kvq/dist.h): rank 0 writes the
                                    artifact, with the same bytes for any rank count */
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
 *   KVQ_E_MISMATCH  capture and moments of different models, or moments computed from
 *                   another capture (corpus hash or token count differ), or a capture
 *                   layer the moments lack when layers is NULL (the message names both
 *                   files and the field)
 *   KVQ_E_INVALID_ARG  bad parameters (named), groups not dividing d, a requested layer
 *                   missing from the capture or the moments file, a codebook larger than
 *                   the training keys
 *   KVQ_E_SHAPE_MISMATCH  a layer tensor whose dtype or shape disagrees with capture.json
 *   KVQ_E_OUT_OF_BOUNDS   pos, seq or q_rows out of range
 *   KVQ_E_NUMERIC   a non-finite key ("layer L head H row R (sequence S position P)")
 *   KVQ_E_EXISTS    the output exists and overwrite is 0, or it is not a .kvq artifact
 *                   (checked before any work, with KVQ_E_IO when it cannot be created)
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
#endif /* KVQ_FIT_H */
