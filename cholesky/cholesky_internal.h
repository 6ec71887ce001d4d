/* cholesky/cholesky_internal.h — pieces of the regularized Cholesky shared by the CPU
 * driver (cholesky.c, moments.c) and the CUDA backend (cuda/moments_cuda.cu). Not public. */
#ifndef KVQ_CHOLESKY_INTERNAL_H
#define KVQ_CHOLESKY_INTERNAL_H

#include "kvq/moments.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The k-th lambda of the schedule for a head with trace tr(H): k = 0 gives 0,
 * k >= 1 gives eps0 * 10^(k-1) * tr(H)/d (eps in *eps). Returns -1 past eps_max. */
double kvq_chol_schedule(double trace, int d, const kvq_moments_params *p, int k, double *eps);

/* 1 when H + lambda I passes the eigenvalue test (eig_min + lambda >
 * d * DBL_EPSILON * (eig_max + lambda)); dpotrf must succeed as well. */
int kvq_chol_eig_ok(const kvq_moments_head_stats *s, int d, double lambda);

/* CPU dpotrf of H + lambda I into L (lower, zeros above).  H, L: [d, d]
 * Returns 0 on success, > 0 when not positive definite, < 0 on a LAPACK argument error. */
int kvq_chol_potrf(const double *H, int d, double lambda, double *L);

/* Zeros the upper triangle of L and computes Linv = L^-1 (dtrtri, lower).
 * KVQ_E_NUMERIC if L is singular, KVQ_E_BACKEND on a LAPACK error.  L, Linv: [d, d] */
kvq_status kvq_chol_finish(double *L, int d, double *Linv, const char *label, kvq_err *err);

/* tr(H).  H: [d, d] */
double kvq_chol_trace(const double *H, int d);

#ifdef KVQ_HAVE_CUDA
/* Batched lower Cholesky of A[i] (row-major, symmetric) on the GPU with cuSOLVER.
 *   A: [n, d, d] host in;  L: [n, d, d] host out (lower, zeros above);  info: [n]
 * info[i] = 0 on success, > 0 when A[i] is not positive definite. Errors (the whole
 * batch): KVQ_E_NO_DEVICE, KVQ_E_BACKEND (a CUDA/cuSOLVER call failed, named), KVQ_E_NOMEM. */
kvq_status kvq_moments_cuda_potrf_batched(const double *A, int n, int d, double *L, int *info,
                                          kvq_err *err);
#endif

#ifdef __cplusplus
}
#endif
#endif
