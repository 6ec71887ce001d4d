/*
 * profile_jobs.c — the job sample of the LeanKV/PATS grid (kvq_profile_params.sample_jobs).
 *
 * A job is one (sequence, KV head) of one layer. The grid first runs every setting on a
 * stratified random sample of the jobs: in each layer (the strata) the same number of
 * its jobs, drawn without replacement by a fixed seed (thr_jobs_plan). The settings
 * that cannot be within the tolerance by that sample, or, when none can, cannot have
 * the least error, keep the sample's figures; the others then run on the jobs the
 * sample left out, so their figures and the choice come from every job
 * (profile_grid.c, thr_grid_profile).
 *
 * The estimate of a setting's error from the sample is the ratio of its sums over the
 * sampled jobs (every layer has the same number of jobs and of sampled ones, so that is
 * the stratified ratio estimator), and its standard error is the stratified one over
 * jobs: with y_j, x_j a sampled job's error sum and count, R the ratio,
 * z_j = y_j - R x_j, N_h and m_h the jobs and sampled jobs of layer h,
 *     se^2 = sum_h N_h^2 s_h^2(z) / m_h / X^2,   X = sum_h N_h / m_h sum_{j in h} x_j,
 * (the with-replacement form, which leaves out the finite-population factor 1 - m_h/N_h
 * and so also covers the rows sampled inside each job). The spread between jobs is in
 * it, unlike the interval over rows that thr_acc_interval gives (rows of one job are
 * not independent of each other: docs/BENCHMARKS.md, "Sampling held-out sequences").
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"
#include "thresholds/thresholds_internal.h"

#define JOBS_SEED 0x6b7671u /* the draw's seed: the sample is a function of the shape */
#define JOBS_MIN_PER_LAYER 2
#define JOBS_MIN_SAMPLED 20
#define JOBS_Z 4.0 /* as thr_mark_refine */

void thr_jobs_free(thr_jobs *J)
{
    free(J->in);
    free(J->y);
    free(J->x);
    memset(J, 0, sizeof *J);
}

kvq_status thr_jobs_plan(const kvq_capture_info *ci, double fraction, int64_t n_set,
                         thr_jobs *J, kvq_err *err)
{
    const int64_t n_kv = ci->model.n_kv_heads, n_jobs = ci->n_sequences * n_kv;
    memset(J, 0, sizeof *J);
    J->n_files = ci->n_files;
    J->n_jobs = n_jobs;
    J->n_set = n_set;
    int64_t n_elig = 0;
    for (int64_t q = 0; q < ci->n_sequences; q++)
        n_elig += ci->sequences[2 * q + 1] >= 2 ? n_kv : 0;
    /* the same count in every layer: every layer has the same jobs */
    const int64_t m = (int64_t)ceil(fraction * (double)n_elig - 1e-9);
    J->n_elig = n_elig;
    J->n_in = m;
    if (!(fraction > 0 && fraction < 1) || m < JOBS_MIN_PER_LAYER || m >= n_elig ||
        m * ci->n_files < JOBS_MIN_SAMPLED)
        return KVQ_OK; /* every job */
    const size_t cells = (size_t)J->n_files * (size_t)n_jobs;
    J->in = calloc(cells ? cells : 1, 1);
    J->y = calloc(cells * (size_t)(n_set ? n_set : 1), sizeof *J->y);
    J->x = calloc(cells * (size_t)(n_set ? n_set : 1), sizeof *J->x);
    int64_t *idx = malloc(sizeof *idx * (size_t)(n_jobs ? n_jobs : 1));
    if (!J->in || !J->y || !J->x || !idx) {
        free(idx);
        thr_jobs_free(J);
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    }
    kvq_rng rng;
    kvq_rng_seed(&rng, JOBS_SEED);
    for (int32_t f = 0; f < J->n_files; f++) {
        /* m of the layer's eligible jobs by a partial Fisher-Yates shuffle */
        int64_t ne = 0;
        for (int64_t jb = 0; jb < n_jobs; jb++)
            if (ci->sequences[2 * (jb / n_kv) + 1] >= 2)
                idx[ne++] = jb;
        for (int64_t i = 0; i < m; i++) {
            const int64_t k = i + (int64_t)kvq_rng_below(&rng, (uint64_t)(ne - i));
            const int64_t t = idx[i];
            idx[i] = idx[k];
            idx[k] = t;
            J->in[(size_t)f * n_jobs + idx[i]] = 1;
        }
    }
    free(idx);
    J->on = 1;
    return KVQ_OK;
}

int thr_jobs_run(const thr_jobs *J, int32_t f, int64_t jb, int want)
{
    if (want < 0 || !J || !J->on)
        return want != 0; /* every job; the complement of no sample is empty */
    return J->in[(size_t)f * J->n_jobs + jb] == (want == 1);
}

void thr_jobs_record(thr_jobs *J, int32_t f, int64_t jb, const thr_acc *acc)
{
    if (!J || !J->on || !J->in[(size_t)f * J->n_jobs + jb])
        return;
    const size_t o = ((size_t)f * J->n_jobs + (size_t)jb) * (size_t)J->n_set;
    for (int64_t c = 0; c < J->n_set; c++) {
        J->y[o + c] = acc[c].err_sum;
        J->x[o + c] = acc[c].err_n;
    }
}

void thr_jobs_interval(const thr_jobs *J, int64_t c, double *mean, double *se)
{
    double Y = 0, X = 0;
    for (int32_t f = 0; f < J->n_files; f++)
        for (int64_t jb = 0; jb < J->n_jobs; jb++) {
            const size_t o = ((size_t)f * J->n_jobs + (size_t)jb) * (size_t)J->n_set + c;
            Y += J->in[(size_t)f * J->n_jobs + jb] ? J->y[o] : 0.0;
            X += J->in[(size_t)f * J->n_jobs + jb] ? J->x[o] : 0.0;
        }
    *mean = X > 0 ? Y / X : NAN;
    *se = NAN;
    if (!(X > 0))
        return;
    const double R = Y / X, w = (double)J->n_elig / (double)J->n_in; /* N_h / m_h */
    double v = 0;
    for (int32_t f = 0; f < J->n_files; f++) {
        double s1 = 0, s2 = 0; /* the layer's z sums, two passes for the variance */
        for (int64_t jb = 0; jb < J->n_jobs; jb++) {
            const size_t o = ((size_t)f * J->n_jobs + (size_t)jb) * (size_t)J->n_set + c;
            s1 += J->in[(size_t)f * J->n_jobs + jb] ? J->y[o] - R * J->x[o] : 0.0;
        }
        const double zbar = s1 / (double)J->n_in;
        for (int64_t jb = 0; jb < J->n_jobs; jb++) {
            const size_t o = ((size_t)f * J->n_jobs + (size_t)jb) * (size_t)J->n_set + c;
            const double dz = J->y[o] - R * J->x[o] - zbar;
            s2 += J->in[(size_t)f * J->n_jobs + jb] ? dz * dz : 0.0;
        }
        const double var_h = s2 / (double)(J->n_in - 1); /* s_h^2(z) */
        v += (double)J->n_elig * (double)J->n_elig * var_h / (double)J->n_in;
    }
    const double Xhat = w * X;
    *se = sqrt(v) / Xhat;
}

void thr_jobs_mark(const thr_jobs *J, const thr_acc *total, int64_t lo, int64_t hi, double tol,
                   double max_mem, uint8_t *mark)
{
    double best_hi = INFINITY;
    int any_in = 0;
    for (int64_t c = lo; c < hi; c++) {
        double m, se;
        thr_jobs_interval(J, c, &m, &se);
        const double mem = total[c].mem.bytes / total[c].mem.bytes_f16;
        if (!(mem < max_mem) || isnan(m))
            continue;
        any_in |= m - JOBS_Z * se <= tol;
        best_hi = m + JOBS_Z * se < best_hi ? m + JOBS_Z * se : best_hi;
    }
    for (int64_t c = lo; c < hi; c++) {
        double m, se;
        thr_jobs_interval(J, c, &m, &se);
        const double mem = total[c].mem.bytes / total[c].mem.bytes_f16;
        if (!(mem < max_mem) || isnan(m))
            mark[c] = 0;
        else /* may be within tolerance, or may have the least error (the choice when
              * none is within it after all) */
            mark[c] = m - JOBS_Z * se <= tol || m - JOBS_Z * se <= best_hi;
    }
    if (!any_in) /* the best is kept: one candidate (or duplicates of it) settles it */
        thr_unmark_single(total, lo, hi, mark);
}
