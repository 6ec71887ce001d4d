/*
 * fit_artifact.c — the .kvq artifact that `kvq fit` writes (kmeans/fit_internal.h):
 * every job's tensors in job order, the per-head held-out score grids, the model,
 * method and provenance metadata and the run's summary (docs/format.md).
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/artifact.h"
#include "kvq/util.h"
#include "kmeans/fit_internal.h"

/* "0-3,5" for a sorted list. */
static void format_layers(const int32_t *l, size_t n, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && used < cap; i++) {
        size_t j = i;
        while (j + 1 < n && l[j + 1] == l[j] + 1)
            j++;
        int w = j > i ? snprintf(buf + used, cap - used, "%s%d-%d", i ? "," : "", (int)l[i],
                                 (int)l[j])
                      : snprintf(buf + used, cap - used, "%s%d", i ? "," : "", (int)l[i]);
        used += w > 0 ? (size_t)w : 0;
        i = j;
    }
}


static kvq_status set_meta(kvq_st_writer *w, const char *key, kvq_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static kvq_status set_meta(kvq_st_writer *w, const char *key, kvq_err *err, const char *fmt, ...)
{
    char v[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    return kvq_st_writer_set_meta(w, key, v, err);
}

/* Mean of finite values, NaN when none. */
static double mean_finite(const double *x, size_t n)
{
    double s = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]))
            s += x[i], k++;
    return k ? s / (double)k : NAN;
}

kvq_status fit_write_artifact(fit_ctx *c, const char *out_path, kvq_fit_summary *sum,
                              kvq_err *err)
{
    const kvq_fit_params *p = c->p;
    const size_t nj = (size_t)c->jobs_total;
    const kvq_capture_info *ci = c->ci;
    kvq_st_writer *w = kvq_st_writer_new();
    double *mse = malloc(nj * sizeof *mse), *ref = malloc(nj * sizeof *ref),
           *pow_ = malloc(nj * sizeof *pow_);
    kvq_status s = KVQ_OK;
    char buf[4096];
    int cuda = 0;
    if (!w || !mse || !ref || !pow_) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", out_path);
        goto done;
    }
    for (size_t i = 0; i < nj; i++) {
        mse[i] = fit_job_scalar(&c->jobs[i], "score_mse");
        pow_[i] = fit_job_scalar(&c->jobs[i], "score_power");
        ref[i] = fit_job_scalar(&c->jobs[i], "ref.score_mse");
        cuda |= c->jobs[i].cuda;
    }
    const int have_mse = isfinite(mean_finite(mse, nj));
    const int have_ref = isfinite(mean_finite(ref, nj));
    for (size_t i = 0; i < nj && !s; i++)
        for (size_t t = 0; t < c->jobs[i].n_t && !s; t++) {
            const fit_tensor *ft = &c->jobs[i].t[t];
            s = kvq_st_writer_declare(w, ft->name, ft->dtype, ft->ndim, ft->shape, err);
        }
    const int64_t grid[2] = {(int64_t)c->n_layers, c->n_kv};
    if (!s && have_mse)
        s = kvq_st_writer_declare(w, KVQ_DIAG_FIT_SCORE_MSE, KVQ_DT_F64, 2, grid, err);
    if (!s && have_mse)
        s = kvq_st_writer_declare(w, KVQ_DIAG_FIT_SCORE_POWER, KVQ_DT_F64, 2, grid, err);
    if (!s && have_ref)
        s = kvq_st_writer_declare(w, KVQ_DIAG_FIT_SCORE_MSE_REF, KVQ_DT_F64, 2, grid, err);
    if (s)
        goto done;

    /* Metadata: model identity, method settings, provenance, summary. */
    format_layers(c->layers, c->n_layers, buf, sizeof buf);
    const char *refname = !p->reference ? "none" : kvq_codebook_method_name(c->ref_method);
    if ((s = kvq_model_id_set_meta(&ci->model, KVQ_META_MODEL_PREFIX, w, err)) ||
        (s = set_meta(w, KVQ_META_METHOD, err, "%s", kvq_codebook_method_format_name(p->method))) ||
        (s = set_meta(w, KVQ_META_CODEBOOK_SIZE, err, "%d", (int)c->K)) ||
        (s = set_meta(w, KVQ_META_GROUPS, err, "%d", (int)c->G)) ||
        (s = set_meta(w, KVQ_META_WROPE_W, err, "%d", (int)c->wrope_w)) ||
        (s = set_meta(w, KVQ_META_WROPE_B, err, "%lld", (long long)c->wrope_b)) ||
        (s = set_meta(w, KVQ_META_SEED, err, "%" PRIu64, p->seed)) ||
        (s = set_meta(w, KVQ_META_LAYERS, err, "%s", buf)) ||
        (s = set_meta(w, KVQ_META_KMEANS_INIT, err, "%s", kvq_kmeans_init_name(p->init))) ||
        (s = set_meta(w, KVQ_META_KMEANS_ITERS, err, "%d", (int)p->iters)) ||
        (s = set_meta(w, KVQ_META_KMEANS_SAMPLE, err, "%lld",
                      (long long)kvq_kmeans_params_default().max_points_per_centroid)) ||
        (s = set_meta(w, KVQ_META_FIT_METHOD, err, "%s", kvq_codebook_method_name(p->method))) ||
        (s = set_meta(w, KVQ_META_FIT_TOL, err, "%.17g", p->tol)) ||
        (s = set_meta(w, KVQ_META_FIT_HOLDOUT, err, "%.17g", p->holdout)) ||
        (s = set_meta(w, KVQ_META_FIT_REFERENCE, err, "%s", refname)) ||
        (s = set_meta(w, KVQ_META_FIT_POSITIONS, err, "%s",
                      kvq_positions_name(kvq_moments_positions(c->m)))) ||
        (s = set_meta(w, KVQ_META_FIT_N_TRAIN, err, "%lld", (long long)c->n_train)) ||
        (s = set_meta(w, KVQ_META_FIT_N_HELDOUT_KEYS, err, "%lld", (long long)c->n_hold_rows)) ||
        (s = set_meta(w, KVQ_META_TOOL_VERSION, err, "kvq %s", kvq_version())) ||
        (s = set_meta(w, KVQ_META_CORPUS_HASH, err, "%s", ci->corpus_hash)) ||
        (s = set_meta(w, KVQ_META_CORPUS, err, "%s", ci->corpus_spec)) ||
        (s = set_meta(w, KVQ_META_N_TOKENS, err, "%lld", (long long)ci->n_tokens)) ||
        (s = set_meta(w, KVQ_META_BACKEND, err, "%s", cuda ? "cuda" : "cpu")) ||
        (s = set_meta(w, KVQ_META_CORPUS_SEED, err, "%" PRIu64, ci->corpus_seed)) ||
        (s = set_meta(w, KVQ_META_SEQ_LEN, err, "%lld", (long long)ci->seq_len)) ||
        (s = set_meta(w, KVQ_META_N_SEQUENCES, err, "%lld", (long long)ci->n_sequences)) ||
        (ci->tokenizer_approx[0] &&
         (s = set_meta(w, KVQ_META_TOKENIZER_APPROX, err, "%s", ci->tokenizer_approx))))
        goto done;
    if (p->date && p->date[0] && (s = set_meta(w, KVQ_META_DATE, err, "%s", p->date)))
        goto done;
    sum->score_mse = mean_finite(mse, nj);
    sum->score_mse_ref = mean_finite(ref, nj);
    sum->score_power = mean_finite(pow_, nj);
    if (have_mse && ((s = set_meta(w, KVQ_DIAG_FIT_SCORE_MSE, err, "%.17g", sum->score_mse)) ||
                     (s = set_meta(w, KVQ_DIAG_FIT_SCORE_POWER, err, "%.17g", sum->score_power))))
        goto done;
    if (have_ref && (s = set_meta(w, KVQ_DIAG_FIT_SCORE_MSE_REF, err, "%.17g", sum->score_mse_ref)))
        goto done;

    if ((s = kvq_st_writer_begin_buffer(w, err)))
        goto done;
    for (size_t i = 0; i < nj && !s; i++)
        for (size_t t = 0; t < c->jobs[i].n_t && !s; t++)
            s = kvq_st_writer_write(w, c->jobs[i].t[t].data, c->jobs[i].t[t].nbytes, err);
    if (!s && have_mse)
        s = kvq_st_writer_write(w, mse, nj * sizeof *mse, err);
    if (!s && have_mse)
        s = kvq_st_writer_write(w, pow_, nj * sizeof *pow_, err);
    if (!s && have_ref)
        s = kvq_st_writer_write(w, ref, nj * sizeof *ref, err);
    if (!s)
        s = kvq_st_writer_finish(w, err);
    if (s)
        goto done;
    size_t size = 0;
    const void *payload = kvq_st_writer_buffer(w, &size);
    s = kvq_artifact_write(out_path, p->overwrite, payload, size, p->zstd_level, err);
done:
    kvq_st_writer_free(w);
    free(mse);
    free(ref);
    free(pow_);
    return s;
}
