/*
 * profile_write.c — kvq_profile_write (kvq/thresholds.h): a copy of the input artifact
 * without earlier profiles, plus the chosen thresholds (tensors and the metadata the
 * runtime reads) and the measured tables with their columns and selection (docs/format.md).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kvq/util.h"
#include "thresholds/thresholds_internal.h"

static int owned_tensor(const char *name)
{
    return kvq_has_prefix(name, KVQ_META_PREFIX_THRESHOLDS) ||
           kvq_has_prefix(name, KVQ_META_PREFIX_PROFILE);
}

static int owned_key(const char *key)
{
    static const char *const pre[] = {KVQ_META_PREFIX_THRESHOLDS, KVQ_META_PREFIX_PROFILE,
                                      KVQ_META_PREFIX_LEANKV,     KVQ_META_PREFIX_PATS,
                                      KVQ_META_PREFIX_BUDGET,     KVQ_META_PREFIX_MASS,
                                      KVQ_META_PREFIX_DIAG_PROFILE};
    for (size_t i = 0; i < N_OF(pre); i++)
        if (kvq_has_prefix(key, pre[i]))
            return 1;
    return 0;
}

/* Collects the new scalars and tables before declaring them: 4 scalars and 3 tensors
 * per table at most. */
#define NT_MAX (4 + 3 * KVQ_PROFILE_N_TABLES)
typedef struct new_tensor {
    char name[64];
    kvq_dtype dtype;
    int ndim;
    int64_t shape[2];
    const void *data;
    float scalar;
} new_tensor;

static kvq_status set_meta_f(kvq_st_writer *w, const char *key, double v, kvq_err *err)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", v);
    return kvq_st_writer_set_meta(w, key, buf, err);
}

static const double *chosen_row(const kvq_profile_table *t)
{
    return t->rows && !t->skipped[0] && t->chosen >= 0 ? t->rows + (size_t)t->chosen * t->n_cols
                                                        : NULL;
}

/* The new tensors: the chosen LeanKV alphas, budget and mass tau as F32 scalars, then
 * each measured table as F64 [n_rows, n_cols] with its F64 [n_rows] intervals and U8
 * [n_rows] job-sample marks. nt [NT_MAX]; returns how many. Scalars point
 * at their own .scalar field, so nt must stay where it is until written. */
static int new_tensors(const kvq_profile_result *r, const double *lk, const double *bu,
                       const double *ma, new_tensor *nt)
{
    int n_new = 0;
    if (lk) {
        nt[n_new++] = (new_tensor){.name = KVQ_TENSOR_LEANKV_ALPHA_H, .dtype = KVQ_DT_F32,
                                   .scalar = (float)lk[KVQ_PL_ALPHA_H]};
        nt[n_new++] = (new_tensor){.name = KVQ_TENSOR_LEANKV_ALPHA_L, .dtype = KVQ_DT_F32,
                                   .scalar = (float)lk[KVQ_PL_ALPHA_L]};
    }
    if (bu)
        nt[n_new++] = (new_tensor){.name = KVQ_TENSOR_THR_BUDGET, .dtype = KVQ_DT_F32,
                                   .scalar = (float)bu[KVQ_PB_VALUE]};
    if (ma)
        nt[n_new++] = (new_tensor){.name = KVQ_TENSOR_THR_MASS_TAU, .dtype = KVQ_DT_F32,
                                   .scalar = (float)ma[KVQ_PB_VALUE]};
    for (int i = 0; i < KVQ_PROFILE_N_TABLES; i++) {
        const kvq_profile_table *t = &r->table[i];
        if (!t->rows || t->skipped[0] || t->n_rows < 1)
            continue;
        new_tensor x = {.dtype = KVQ_DT_F64, .ndim = 2, .shape = {t->n_rows, t->n_cols},
                        .data = t->rows};
        snprintf(x.name, sizeof x.name, KVQ_TENSOR_PROFILE, t->name);
        nt[n_new++] = x;
        /* how each row's err was measured: its 95% half-width, and the rows whose
         * figures come from the job sample alone */
        if (t->err_ci) {
            new_tensor c = {.dtype = KVQ_DT_F64, .ndim = 1, .shape = {t->n_rows},
                            .data = t->err_ci};
            snprintf(c.name, sizeof c.name, KVQ_TENSOR_PROFILE_ERR_CI, t->name);
            nt[n_new++] = c;
        }
        if (t->job_sampled) {
            new_tensor j = {.dtype = KVQ_DT_U8, .ndim = 1, .shape = {t->n_rows},
                            .data = t->job_sampled};
            snprintf(j.name, sizeof j.name, KVQ_TENSOR_PROFILE_JOB_SAMPLED, t->name);
            nt[n_new++] = j;
        }
    }
    for (int i = 0; i < n_new; i++)
        if (!nt[i].data)
            nt[i].data = &nt[i].scalar;
    return n_new;
}

/* Declarations: the input's tensors (minus earlier profiles), then ours. */
static kvq_status declare_tensors(kvq_st_writer *w, const kvq_st *st, const new_tensor *nt,
                                  int n_new, kvq_err *err)
{
    kvq_status s = KVQ_OK;
    for (size_t i = 0; i < kvq_st_count(st) && !s; i++) {
        const kvq_tensor_view *t = kvq_st_tensor(st, i);
        if (!owned_tensor(t->name))
            s = kvq_st_writer_declare(w, t->name, t->dtype, t->ndim, t->shape, err);
    }
    for (int i = 0; i < n_new && !s; i++)
        s = kvq_st_writer_declare(w, nt[i].name, nt[i].dtype, nt[i].ndim, nt[i].shape, err);
    return s;
}

/* Metadata of the measurement: the input's keys (minus earlier profiles), the metric,
 * tolerance and prompt fraction, and per table its columns or why it was skipped, and
 * the chosen row. */
static kvq_status set_profile_meta(kvq_st_writer *w, const kvq_st *st,
                                   const kvq_profile_result *r, const kvq_profile_params *p,
                                   kvq_err *err)
{
    kvq_status s = KVQ_OK;
    char key[128], cols[256];
    for (size_t i = 0; i < kvq_st_meta_count(st) && !s; i++)
        if (!owned_key(kvq_st_meta_key(st, i)))
            s = kvq_st_writer_set_meta(w, kvq_st_meta_key(st, i), kvq_st_meta_value(st, i), err);
    if (!s)
        s = kvq_st_writer_set_meta(w, KVQ_META_THR_METRIC, r->metric_ppl ? "perplexity" : "attn_rel_err",
                                   err);
    if (!s)
        s = set_meta_f(w, KVQ_META_THR_TOLERANCE, r->tolerance, err);
    if (!s)
        s = set_meta_f(w, KVQ_META_THR_PROMPT_FRACTION, p->prompt_fraction, err);
    if (!s && r->metric_ppl)
        s = set_meta_f(w, KVQ_META_DIAG_PPL_FULL, r->ppl_full, err);
    if (!s)
        s = set_meta_f(w, KVQ_META_PROFILE_SAMPLE_ROWS, (double)p->sample_rows, err);
    if (!s)
        s = set_meta_f(w, KVQ_META_PROFILE_SAMPLE_JOBS, p->sample_jobs, err);
    char jobs[64];
    snprintf(jobs, sizeof jobs, "%lld,%lld", (long long)r->n_jobs, (long long)r->n_jobs_sampled);
    if (!s && r->n_jobs > 0)
        s = kvq_st_writer_set_meta(w, KVQ_META_PROFILE_JOBS, jobs, err);
    snprintf(jobs, sizeof jobs, "%lld,%lld", (long long)r->n_seq_jobs,
             (long long)r->n_seq_jobs_sampled);
    if (!s && r->n_seq_jobs > 0)
        s = kvq_st_writer_set_meta(w, KVQ_META_PROFILE_BUDGET_JOBS, jobs, err);
    for (int i = 0; i < KVQ_PROFILE_N_TABLES && !s; i++) {
        const kvq_profile_table *t = &r->table[i];
        if (!t->rows)
            continue;
        if (t->skipped[0]) {
            snprintf(key, sizeof key, KVQ_META_PROFILE_SKIPPED, t->name);
            s = kvq_st_writer_set_meta(w, key, t->skipped, err);
            continue;
        }
        size_t at = 0;
        cols[0] = 0;
        for (int32_t c = 0; c < t->n_cols; c++)
            at += (size_t)snprintf(cols + at, sizeof cols - at, "%s%s", c ? "," : "", t->cols[c]);
        snprintf(key, sizeof key, KVQ_META_PROFILE_COLUMNS, t->name);
        if ((s = kvq_st_writer_set_meta(w, key, cols, err)))
            break;
        if (t->chosen < 0)
            continue;
        snprintf(key, sizeof key, KVQ_META_THR_MET, t->name);
        if ((s = kvq_st_writer_set_meta(w, key, t->met ? "1" : "0", err)))
            break;
        const double *row = t->rows + (size_t)t->chosen * t->n_cols;
        for (int32_t c = 0; c < t->n_cols && !s; c++) {
            if (isnan(row[c]))
                continue;
            snprintf(key, sizeof key, KVQ_META_DIAG_PROFILE, t->name, t->cols[c]);
            s = set_meta_f(w, key, row[c], err);
        }
    }
    return s;
}

/* Metadata of the chosen settings, the keys the runtime reads: LeanKV (lk), PATS (pt),
 * retrieval budget (bu) and mass (ma); NULL rows were not chosen. */
static kvq_status set_chosen_meta(kvq_st_writer *w, const kvq_profile_params *p,
                                  const double *lk, const double *pt, const double *bu,
                                  const double *ma, kvq_err *err)
{
    kvq_status s = KVQ_OK;
    if (!s && lk) {
        if (!(s = set_meta_f(w, KVQ_META_LEANKV_WINDOW, p->leankv.window, err)) &&
            !(s = set_meta_f(w, KVQ_META_LEANKV_ALPHA_H, lk[KVQ_PL_ALPHA_H], err)) &&
            !(s = set_meta_f(w, KVQ_META_LEANKV_ALPHA_L, lk[KVQ_PL_ALPHA_L], err))) {
            char bits[64];
            snprintf(bits, sizeof bits, "K%dV%d,K%dV%d", (int)p->leankv.k_high,
                     (int)p->leankv.v_high, (int)p->leankv.k_low, (int)p->leankv.v_low);
            s = kvq_st_writer_set_meta(w, KVQ_META_LEANKV_BITS, bits, err);
        }
    }
    if (!s && pt) {
        if (!(s = kvq_st_writer_set_meta(
                  w, KVQ_META_PATS_SCHEDULE,
                  kvq_pats_schedule_name((kvq_pats_schedule)(int)pt[KVQ_PP_SCHEDULE]), err)) &&
            !(s = set_meta_f(w, KVQ_META_PATS_B_MIN, pt[KVQ_PP_B_MIN], err)) &&
            !(s = set_meta_f(w, KVQ_META_PATS_B_MAX, pt[KVQ_PP_B_MAX], err)))
            s = kvq_st_writer_set_meta(w, KVQ_META_PATS_DTYPE, p->pats_dtype == KVQ_DT_BF16 ? "bf16" : "f16",
                                       err);
    }
    if (!s && (bu || ma)) {
        if (!(s = kvq_st_writer_set_meta(w, KVQ_META_BUDGET_SELECTOR, "codebook", err)) &&
            !(s = set_meta_f(w, KVQ_META_BUDGET_SINK, p->retrieval.sink, err)) &&
            !(s = kvq_st_writer_set_meta(w, KVQ_META_BUDGET_POSITIONS,
                                         kvq_positions_name(p->retrieval.positions), err)) &&
            bu)
            s = set_meta_f(w, KVQ_META_BUDGET_FRACTION, bu[KVQ_PB_VALUE], err);
        if (!s && ma)
            s = set_meta_f(w, KVQ_META_MASS_TAU, ma[KVQ_PB_VALUE], err);
    }
    return s;
}

/* Data, in declaration order, then the writer's end. */
static kvq_status write_tensors(kvq_st_writer *w, const kvq_st *st, const new_tensor *nt,
                                int n_new, kvq_err *err)
{
    kvq_status s = kvq_st_writer_begin_buffer(w, err);
    for (size_t i = 0; i < kvq_st_count(st) && !s; i++) {
        const kvq_tensor_view *t = kvq_st_tensor(st, i);
        if (!owned_tensor(t->name))
            s = kvq_st_writer_write(w, t->data, t->nbytes, err);
    }
    for (int i = 0; i < n_new && !s; i++) {
        size_t bytes = kvq_dtype_size(nt[i].dtype);
        for (int k = 0; k < nt[i].ndim; k++)
            bytes *= (size_t)nt[i].shape[k];
        s = kvq_st_writer_write(w, nt[i].data, bytes, err);
    }
    if (!s)
        s = kvq_st_writer_finish(w, err);
    return s;
}

kvq_status kvq_profile_write(const kvq_artifact *in, const kvq_profile_result *r,
                             const kvq_profile_params *p, const char *out_path, int overwrite,
                             kvq_err *err)
{
    const kvq_st *st = kvq_artifact_payload(in);
    kvq_st_writer *w = kvq_st_writer_new();
    new_tensor nt[NT_MAX];
    int n_new = 0;
    kvq_status s = KVQ_OK;
    if (!w)
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");

    const double *lk = chosen_row(&r->table[KVQ_PROFILE_LEANKV]);
    const double *pt = chosen_row(&r->table[KVQ_PROFILE_PATS]);
    const double *bu = chosen_row(&r->table[KVQ_PROFILE_BUDGET]);
    const double *ma = chosen_row(&r->table[KVQ_PROFILE_MASS]);
    n_new = new_tensors(r, lk, bu, ma, nt);
    if (!(s = declare_tensors(w, st, nt, n_new, err)) &&
        !(s = set_profile_meta(w, st, r, p, err)) &&
        !(s = set_chosen_meta(w, p, lk, pt, bu, ma, err)))
        s = write_tensors(w, st, nt, n_new, err);
    if (!s) {
        size_t n;
        const void *buf = kvq_st_writer_buffer(w, &n);
        s = kvq_artifact_write(out_path, overwrite, buf, n, 0 /* the default */, err);
    }
    kvq_st_writer_free(w);
    return s;
}
