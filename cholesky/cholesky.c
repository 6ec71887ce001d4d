/* cholesky.c — the math of the moments stage: GQA grouping, rotation by R_b,
 * diagnostics and the regularized Cholesky (see kvq/moments.h for the definitions).
 * Everything here is the CPU reference; the CUDA backend only replaces dpotrf. */
#include <assert.h>
#include <float.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cholesky/cholesky_internal.h"
#include "kvq/moments.h"

/* ======================================================================================
 * Parameters
 * ====================================================================================== */

kvq_moments_params kvq_moments_params_default(void)
{
    kvq_moments_params p = {
        .positions = KVQ_POSITIONS_WROPE,
        .wrope_b = 2048,
        .wrope_w = 64,
        .eps0 = 1e-6,
        .eps_max = 1.0,
        .device = KVQ_MOMENTS_CPU,
    };
    return p;
}

kvq_status kvq_moments_params_check(const kvq_moments_params *p, kvq_err *err)
{
    if (p->positions != KVQ_POSITIONS_WROPE && p->positions != KVQ_POSITIONS_ROPE)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "moments: unknown positions mode %d",
                           (int)p->positions);
    if (p->wrope_b < 0 || p->wrope_b > INT32_MAX)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "moments: wrope_b %lld is outside [0, 2^31)",
                           (long long)p->wrope_b);
    if (p->wrope_w < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "moments: wrope_w %d must be >= 1",
                           (int)p->wrope_w);
    if (!(p->eps0 > 0) || !(p->eps_max >= p->eps0) || !isfinite(p->eps_max))
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "moments: need 0 < eps0 <= eps_max < inf (got %g, %g)", p->eps0,
                           p->eps_max);
    if (p->device != KVQ_MOMENTS_CPU && p->device != KVQ_MOMENTS_CUDA)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "moments: unknown device %d", (int)p->device);
    return KVQ_OK;
}

/* ======================================================================================
 * Grouping, rotation, symmetrization
 * ====================================================================================== */

kvq_status kvq_moments_group(const double *S, const double *counts, int n_heads, int n_kv_heads,
                             int d, double *H, double *count, kvq_err *err)
{
    if (d < 1 || n_kv_heads < 1 || n_heads < n_kv_heads || n_heads % n_kv_heads)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "moments: %d query heads cannot be grouped over %d KV heads (d %d)",
                           n_heads, n_kv_heads, d);
    const int r = n_heads / n_kv_heads;
    const size_t dd = (size_t)d * d;
    for (int g = 0; g < n_heads; g++) {
        double c = counts[g];
        if (!isfinite(c) || c < 0 || c != floor(c))
            return kvq_err_set(err, KVQ_E_NUMERIC,
                               "moments: count of query head %d is %g (not a count)", g, c);
        for (size_t i = 0; i < dd; i++)
            if (!isfinite(S[g * dd + i]))
                return kvq_err_set(err, KVQ_E_NUMERIC,
                                   "moments: NaN/Inf in the moment sum of query head %d", g);
    }
    for (int h = 0; h < n_kv_heads; h++) {
        double *Hh = H + h * dd;
        double c = 0;
        memset(Hh, 0, dd * sizeof *Hh);
        /* G(h) = query heads h*r .. h*r + r - 1 (query head g reads KV head g / r). */
        for (int g = h * r; g < (h + 1) * r; g++) {
            c += counts[g];
            for (size_t i = 0; i < dd; i++)
                Hh[i] += S[g * dd + i];
        }
        if (c == 0)
            return kvq_err_set(err, KVQ_E_NUMERIC, "moments: KV head %d has no query samples", h);
        for (size_t i = 0; i < dd; i++)
            Hh[i] /= c;
        count[h] = c;
    }
    return KVQ_OK;
}

void kvq_moments_symmetrize(double *H, int d)
{
    for (int i = 0; i < d; i++)
        for (int j = i + 1; j < d; j++) {
            double m = 0.5 * (H[i * d + j] + H[j * d + i]);
            H[i * d + j] = H[j * d + i] = m;
        }
}

void kvq_moments_rotate(double *H, const double *R, int d, double *work)
{
    /* work = H R, then H = R^T work. Plain loops: d^3 per product is small next to
     * the eigen-decomposition, and the summation order is fixed. */
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double acc = 0;
            for (int k = 0; k < d; k++)
                acc += H[i * d + k] * R[k * d + j];
            work[i * d + j] = acc;
        }
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double acc = 0;
            for (int k = 0; k < d; k++)
                acc += R[k * d + i] * work[k * d + j];
            H[i * d + j] = acc;
        }
    kvq_moments_symmetrize(H, d);
}

/* ======================================================================================
 * Diagnostics
 * ====================================================================================== */

double kvq_chol_trace(const double *H, int d)
{
    double t = 0;
    for (int i = 0; i < d; i++)
        t += H[i * d + i];
    return t;
}

static kvq_status diagnose(const double *H, int d, double lambda, const char *label,
                           kvq_moments_head_stats *out, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const size_t dd = (size_t)d * d;
    double *A = NULL, *w = NULL;
    double fro2 = 0;
    for (size_t i = 0; i < dd; i++) {
        if (!isfinite(H[i]))
            return kvq_err_set(err, KVQ_E_NUMERIC, "%s: NaN/Inf in H", label);
        fro2 += H[i] * H[i];
    }
    const double tr = kvq_chol_trace(H, d);
    if (!(tr > 0))
        return kvq_err_set(err, KVQ_E_NUMERIC,
                           "%s: tr(H) = %g: the queries are all zero or H is corrupt", label, tr);
    A = malloc(dd * sizeof *A);
    w = malloc((size_t)d * sizeof *w);
    if (!A || !w) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    memcpy(A, H, dd * sizeof *A);
    lapack_int info = LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'L', d, A, d, w);
    if (info != 0) {
        st = kvq_err_set(err, KVQ_E_BACKEND, "%s: LAPACKE_dsyev failed (info %d)", label,
                         (int)info);
        goto done;
    }
    /* dsyev returns the eigenvalues in ascending order. */
    out->eig_min = w[0];
    out->eig_max = w[d - 1];
    out->cond = (w[d - 1] + lambda) / (w[0] + lambda);
    if (!(out->cond > 0))
        out->cond = INFINITY; /* singular or indefinite: no finite condition number */
    const double mean = tr / d;
    out->anisotropy = 1.0 - mean * mean / (fro2 / d);
    if (out->anisotropy < 0) /* rounding for H = c I */
        out->anisotropy = 0;
done:
    free(A);
    free(w);
    return st;
}

kvq_status kvq_moments_diagnose(const double *H, int d, double lambda,
                                kvq_moments_head_stats *out, kvq_err *err)
{
    if (d < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "moments: head dim %d", d);
    return diagnose(H, d, lambda, "moments", out, err);
}

/* ======================================================================================
 * Regularized Cholesky
 * ====================================================================================== */

double kvq_chol_schedule(double trace, int d, const kvq_moments_params *p, int k, double *eps)
{
    *eps = 0;
    if (k == 0)
        return 0;
    double e = p->eps0 * pow(10.0, k - 1);
    if (e > p->eps_max * (1 + 1e-9))
        return -1;
    *eps = e;
    return e * trace / d;
}

int kvq_chol_eig_ok(const kvq_moments_head_stats *s, int d, double lambda)
{
    return s->eig_min + lambda > d * DBL_EPSILON * (s->eig_max + lambda);
}

int kvq_chol_potrf(const double *H, int d, double lambda, double *L)
{
    const size_t dd = (size_t)d * d;
    memcpy(L, H, dd * sizeof *L);
    for (int i = 0; i < d; i++)
        L[i * d + i] += lambda;
    lapack_int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', d, L, d);
    return (int)info;
}

kvq_status kvq_chol_finish(double *L, int d, double *Linv, const char *label, kvq_err *err)
{
    for (int i = 0; i < d; i++)
        for (int j = i + 1; j < d; j++)
            L[i * d + j] = 0;
    memcpy(Linv, L, (size_t)d * d * sizeof *Linv);
    lapack_int info = LAPACKE_dtrtri(LAPACK_ROW_MAJOR, 'L', 'N', d, Linv, d);
    if (info > 0)
        return kvq_err_set(err, KVQ_E_NUMERIC, "%s: L is singular (dtrtri info %d)", label,
                           (int)info);
    if (info < 0)
        return kvq_err_set(err, KVQ_E_BACKEND, "%s: LAPACKE_dtrtri failed (info %d)", label,
                           (int)info);
    return KVQ_OK;
}

kvq_status kvq_cholesky_regularized(const double *H, int d, const kvq_moments_params *p,
                                    const char *label, double *L, double *Linv,
                                    kvq_moments_head_stats *stats, kvq_err *err)
{
    kvq_status st;
    if ((st = kvq_moments_params_check(p, err)))
        return st;
    if (d < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: head dim %d", label, d);
    kvq_moments_head_stats s = *stats;
    if ((st = diagnose(H, d, 0, label, &s, err)))
        return st;
    const double tr = kvq_chol_trace(H, d);
    double lambda = -1, eps = 0;
    for (int k = 0;; k++) {
        double e;
        double lam = kvq_chol_schedule(tr, d, p, k, &e);
        if (lam < 0)
            break;
        if (!kvq_chol_eig_ok(&s, d, lam))
            continue;
        int info = kvq_chol_potrf(H, d, lam, L);
        if (info < 0)
            return kvq_err_set(err, KVQ_E_BACKEND, "%s: LAPACKE_dpotrf failed (info %d)", label,
                               info);
        if (info == 0) {
            lambda = lam;
            eps = e;
            break;
        }
    }
    if (lambda < 0)
        return kvq_err_set(err, KVQ_E_NUMERIC,
                           "%s: H is not positive definite even with lambda = %g * tr(H)/d "
                           "(eigenvalues %g .. %g)", label, p->eps_max, s.eig_min, s.eig_max);
    if ((st = kvq_chol_finish(L, d, Linv, label, err)))
        return st;
    s.lambda = lambda;
    s.eps = eps;
    s.cond = (s.eig_max + lambda) / (s.eig_min + lambda);
    *stats = s;
    return KVQ_OK;
}
