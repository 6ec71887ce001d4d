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

kvq_status thr_jobs_plan(const kvq_capture_info *ci, double fraction, int64_t n_kv,
                         int64_t n_set, thr_jobs *J, kvq_err *err)
{
    const int64_t n_jobs = ci->n_sequences * n_kv;
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

/* Setting c's ratio over the sampled jobs: Y / X. */
static void ratio_of(const thr_jobs *J, int64_t c, double *Y, double *X)
{
    *Y = *X = 0;
    for (size_t k = 0; k < (size_t)J->n_files * (size_t)J->n_jobs; k++)
        if (J->in[k]) {
            *Y += J->y[k * (size_t)J->n_set + (size_t)c];
            *X += J->x[k * (size_t)J->n_set + (size_t)c];
        }
}

/* The linearized term of sampled job k: (y - R x) / Xhat of setting c, minus that of
 * setting b when b >= 0 (a paired difference). */
static double term(const thr_jobs *J, size_t k, int64_t c, double Rc, double Xc, int64_t b,
                   double Rb, double Xb)
{
    const double *y = J->y + k * (size_t)J->n_set, *x = J->x + k * (size_t)J->n_set;
    const double u = (y[c] - Rc * x[c]) / Xc;
    return b >= 0 ? u - (y[b] - Rb * x[b]) / Xb : u;
}

/* The stratified standard error of R_c (b < 0) or of R_c - R_b over jobs. */
static double strat_se(const thr_jobs *J, int64_t c, int64_t b)
{
    double Yc, Xc, Yb = 0, Xb = 1;
    ratio_of(J, c, &Yc, &Xc);
    if (b >= 0)
        ratio_of(J, b, &Yb, &Xb);
    if (!(Xc > 0) || !(Xb > 0))
        return NAN;
    const double w = (double)J->n_elig / (double)J->n_in; /* N_h / m_h */
    const double Rc = Yc / Xc, Rb = Yb / Xb, Xhc = w * Xc, Xhb = w * Xb;
    double v = 0;
    for (int32_t f = 0; f < J->n_files; f++) {
        const size_t k0 = (size_t)f * J->n_jobs;
        double s1 = 0, s2 = 0; /* the layer's terms, two passes for the variance */
        for (int64_t jb = 0; jb < J->n_jobs; jb++)
            s1 += J->in[k0 + jb] ? term(J, k0 + jb, c, Rc, Xhc, b, Rb, Xhb) : 0.0;
        const double mean = s1 / (double)J->n_in;
        for (int64_t jb = 0; jb < J->n_jobs; jb++) {
            const double dz = J->in[k0 + jb] ? term(J, k0 + jb, c, Rc, Xhc, b, Rb, Xhb) - mean
                                             : 0.0;
            s2 += dz * dz;
        }
        v += (double)J->n_elig * (double)J->n_elig * (s2 / (double)(J->n_in - 1)) /
             (double)J->n_in;
    }
    return sqrt(v);
}

void thr_jobs_put(thr_jobs *J, int32_t f, int64_t jb, int64_t c, double y, double x)
{
    if (!J || !J->on || !J->in[(size_t)f * J->n_jobs + (size_t)jb])
        return;
    const size_t k = (size_t)f * J->n_jobs + (size_t)jb;
    J->y[k * (size_t)J->n_set + (size_t)c] = y;
    J->x[k * (size_t)J->n_set + (size_t)c] = x;
}

void thr_jobs_interval(const thr_jobs *J, int64_t c, double *mean, double *se)
{
    double Y, X;
    ratio_of(J, c, &Y, &X);
    *mean = X > 0 ? Y / X : NAN;
    *se = strat_se(J, c, -1);
}

void thr_jobs_diff(const thr_jobs *J, int64_t c, int64_t b, double *mean, double *se)
{
    double mc, mb, s;
    thr_jobs_interval(J, c, &mc, &s);
    thr_jobs_interval(J, b, &mb, &s);
    *mean = mc - mb;
    *se = strat_se(J, c, b);
}

void thr_jobs_mark(const thr_jobs *J, const thr_acc *total, int64_t lo, int64_t hi, double tol,
                   double max_mem, int paired, uint8_t *mark)
{
    double best_hi = INFINITY, best_m = INFINITY, best_mem = INFINITY;
    int64_t best = -1;
    int any_in = 0;
    for (int64_t c = lo; c < hi; c++) {
        double m, se;
        thr_jobs_interval(J, c, &m, &se);
        const double mem = total[c].mem.bytes / total[c].mem.bytes_f16;
        if (!(mem < max_mem) || isnan(m))
            continue;
        any_in |= m - JOBS_Z * se <= tol;
        best_hi = m + JOBS_Z * se < best_hi ? m + JOBS_Z * se : best_hi;
        if (m < best_m || (m == best_m && mem < best_mem))
            best = c, best_m = m, best_mem = mem;
    }
    for (int64_t c = lo; c < hi; c++) {
        double m, se;
        thr_jobs_interval(J, c, &m, &se);
        const double mem = total[c].mem.bytes / total[c].mem.bytes_f16;
        if (!(mem < max_mem) || isnan(m)) {
            mark[c] = 0;
            continue;
        }
        /* may be within tolerance, or may have the least error (the choice when none is
         * within it after all): by its own interval, or paired, by its difference to
         * the best sampled setting on the same jobs (which varies far less) */
        int may_best = m - JOBS_Z * se <= best_hi;
        if (paired) {
            double dm, dse;
            thr_jobs_diff(J, c, best, &dm, &dse);
            may_best = c == best || dm - JOBS_Z * dse <= 0.0;
        }
        mark[c] = m - JOBS_Z * se <= tol || may_best;
    }
    if (!any_in) /* the best is kept: one candidate (or duplicates of it) settles it */
        thr_unmark_single(total, lo, hi, mark);
}
