// moments_cuda.cu — batched Cholesky of the per-head H matrices with cuSOLVER.
//
// Only dpotrf runs here: the eigenvalue diagnostics, the choice of lambda and L^-1
// stay on the CPU (cholesky.c), which is also the fallback for any head the GPU
// could not factor. Row-major symmetric A is the same bytes as column-major A; an
// upper factor U (A = U^T U) in column-major storage read back row-major is the lower
// L = U^T with A = L L^T, so we ask cuSOLVER for CUBLAS_FILL_MODE_UPPER.
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <cstdlib>
#include <cstring>

#include "cholesky/cholesky_internal.h"

extern "C" kvq_status kvq_moments_cuda_potrf_batched(const double *A, int n, int d, double *L,
                                                     int *info, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    cusolverDnHandle_t handle = nullptr;
    double *dA = nullptr;       // [n, d, d] device
    double **dPtr = nullptr;    // [n] device pointers into dA
    int *dInfo = nullptr;       // [n] device
    double **hPtr = nullptr;    // [n] host copy of the pointer array
    size_t dd = (size_t)d * d, bytes = dd * (size_t)n * sizeof(double);
    cudaError_t ce = cudaSuccess;
    cusolverStatus_t cs = CUSOLVER_STATUS_SUCCESS;
    const char *why = nullptr;

    if (!kvq_cuda_available(&why))
        return kvq_err_set(err, KVQ_E_NO_DEVICE, "moments: %s", why);
    hPtr = (double **)malloc((size_t)n * sizeof *hPtr);
    if (!hPtr) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "moments: out of memory");
        goto done;
    }
    if ((ce = cudaMalloc((void **)&dA, bytes)) != cudaSuccess ||
        (ce = cudaMalloc((void **)&dPtr, (size_t)n * sizeof *dPtr)) != cudaSuccess ||
        (ce = cudaMalloc((void **)&dInfo, (size_t)n * sizeof *dInfo)) != cudaSuccess) {
        st = kvq_err_set(err, KVQ_E_BACKEND, "moments: cudaMalloc: %s", cudaGetErrorString(ce));
        goto done;
    }
    for (int i = 0; i < n; i++)
        hPtr[i] = dA + (size_t)i * dd;
    if ((ce = cudaMemcpy(dA, A, bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (ce = cudaMemcpy(dPtr, hPtr, (size_t)n * sizeof *dPtr, cudaMemcpyHostToDevice)) !=
            cudaSuccess) {
        st = kvq_err_set(err, KVQ_E_BACKEND, "moments: cudaMemcpy: %s", cudaGetErrorString(ce));
        goto done;
    }
    if ((cs = cusolverDnCreate(&handle)) != CUSOLVER_STATUS_SUCCESS) {
        st = kvq_err_set(err, KVQ_E_BACKEND, "moments: cusolverDnCreate failed (%d)", (int)cs);
        goto done;
    }
    cs = cusolverDnDpotrfBatched(handle, CUBLAS_FILL_MODE_UPPER, d, dPtr, d, dInfo, n);
    if (cs != CUSOLVER_STATUS_SUCCESS) {
        st = kvq_err_set(err, KVQ_E_BACKEND, "moments: cusolverDnDpotrfBatched failed (%d)",
                         (int)cs);
        goto done;
    }
    if ((ce = cudaMemcpy(L, dA, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (ce = cudaMemcpy(info, dInfo, (size_t)n * sizeof *dInfo, cudaMemcpyDeviceToHost)) !=
            cudaSuccess) {
        st = kvq_err_set(err, KVQ_E_BACKEND, "moments: cudaMemcpy: %s", cudaGetErrorString(ce));
        goto done;
    }
    // The untouched triangle still holds A: zero what lies above the diagonal.
    for (int b = 0; b < n; b++)
        for (int i = 0; i < d; i++)
            memset(L + b * dd + (size_t)i * d + i + 1, 0, (size_t)(d - i - 1) * sizeof *L);
done:
    if (handle)
        cusolverDnDestroy(handle);
    cudaFree(dInfo);
    cudaFree(dPtr);
    cudaFree(dA);
    free(hPtr);
    return st;
}
