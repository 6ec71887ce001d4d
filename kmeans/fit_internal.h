/*
 * kmeans/fit_internal.h — what the files of `kvq fit` share (kmeans/fit.c, the driver;
 * kmeans/fit_checkpoint.c, the per-job checkpoint files; kmeans/fit_artifact.c, the
 * .kvq writer): a job's result as a list of named tensors, and the run context.
 * Not a public header.
 */
#ifndef KVQ_FIT_INTERNAL_H
#define KVQ_FIT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/capture_dir.h"
#include "kvq/codebook.h"
#include "kvq/fit.h"
#include "kvq/moments.h"
#include "kvq/safetensors.h"

/* ==========================================================================
 * A job's result: named tensors (fit.c)
 * ========================================================================== */

typedef struct fit_tensor {
    char name[128];
    kvq_dtype dtype;
    int ndim;
    int64_t shape[KVQ_MAX_DIMS];
    void *data;       /* malloc'd, nbytes */
    size_t nbytes;
} fit_tensor;

typedef struct fit_job {
    int32_t layer, head;
    fit_tensor *t;    /* [n_t] in artifact order */
    size_t n_t, cap;
    int cuda;         /* some k-means ran on CUDA */
    int resumed;      /* read from the checkpoint */
} fit_job;

void fit_job_clear(fit_job *j);
/* Appends a tensor with a copy of `data` (nbytes from dtype and shape).
 * Errors: KVQ_E_TOO_LARGE, KVQ_E_NOMEM, KVQ_E_INVALID_ARG (name too long). */
kvq_status fit_job_add(fit_job *j, const char *name, kvq_dtype dt, int ndim,
                       const int64_t *shape, const void *data, kvq_err *err);
/* The value of a scalar F64 diagnostic "diag.layer.L.head.H.<what>", NaN if absent. */
double fit_job_scalar(const fit_job *j, const char *what);

/* ==========================================================================
 * Run context (fit.c)
 * ========================================================================== */

typedef struct fit_ctx {
    const kvq_fit_params *p;
    kvq_callbacks cb;           /* the caller's */
    kvq_capture_info *ci;
    kvq_moments *m;
    const char *moments_path;
    char *ckpt_dir;             /* NULL without checkpoints */
    int32_t d, n_heads, n_kv, r, K, G;
    int64_t wrope_b;
    int32_t wrope_w;
    kvq_codebook_method ref_method;
    int ref_fit;                /* the reference needs its own fit (method not plain) */
    kvq_kmeans_device device;   /* after the CUDA check */
    uint8_t *heldout;           /* [n_tokens] 1 = the row belongs to a held-out sequence */
    int64_t n_train, n_hold_rows;
    int32_t *layers;            /* [n_layers] sorted */
    size_t n_layers;
    fit_job *jobs;              /* [n_layers * n_kv] */
    int32_t jobs_done, jobs_total;
    int32_t jobs_prog;          /* the jobs progress counts: this rank's */
} fit_ctx;

/* ==========================================================================
 * Checkpoints (fit_checkpoint.c): one safetensors file per finished job in
 * <out>.ckpt/, reused when its key matches
 * ========================================================================== */

/* The checkpoint key of (layer, head) into buf [cap]: every input and parameter that
 * changes the job's tensors. Errors: KVQ_E_NOMEM, the moments reader's. */
kvq_status fit_job_key(const fit_ctx *c, int32_t layer, int32_t head, char *buf, size_t cap,
                       kvq_err *err);
/* Loads the checkpoint of a job if it exists and its key matches: 1 loaded, 0 not
 * (an unreadable or stale file is logged and refitted). */
int fit_ckpt_load(const fit_ctx *c, fit_job *j, const char *key);
/* 1 when job (layer, head) has a checkpoint file (not checked against its key). */
int fit_ckpt_exists(const fit_ctx *c, int32_t layer, int32_t head);
/* Removes "<out_path>.ckpt/" when it is what a finished run left (killed after its
 * final rename): out_path is an artifact written after every checkpoint in it, and it
 * holds nothing but checkpoints and their temporaries. */
void fit_ckpt_clean_finished(const char *out_path, const kvq_callbacks *cb);
/* Writes a job's tensors to its checkpoint file (atomically), creating c->ckpt_dir. */
kvq_status fit_ckpt_save(const fit_ctx *c, const fit_job *j, const char *key, kvq_err *err);

/* ==========================================================================
 * Jobs (fit.c) and their split among ranks (fit_dist.c)
 * ========================================================================== */

/* Runs the jobs i with mine[i] (NULL: all; job i: layer c->layers[i / n_kv], head
 * i % n_kv) into c->jobs: each from its checkpoint or fitted (and checkpointed). */
kvq_status fit_run_jobs(fit_ctx *c, const uint8_t *mine, kvq_fit_summary *sum,
                        kvq_err *err);
/* With c->p->dist of several ranks: deals the jobs in turn (those to fit and those with
 * a checkpoint each on their own), runs this rank's share, and gathers every job into
 * rank 0's c->jobs (sum->n_resumed counted there). Collective; errors agreed. */
kvq_status fit_dist_jobs(fit_ctx *c, kvq_fit_summary *sum, kvq_err *err);

/* ==========================================================================
 * The artifact (fit_artifact.c)
 * ========================================================================== */

/* Writes every job's tensors, the per-head score grids and the metadata to out_path,
 * and fills the score means of sum. Errors: KVQ_E_NOMEM, the writer's. */
kvq_status fit_write_artifact(fit_ctx *c, const char *out_path, kvq_fit_summary *sum,
                              kvq_err *err);

#endif
