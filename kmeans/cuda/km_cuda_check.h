/* km_cuda_check.h — the k-means CUDA files' (kmeans_cuda.cu, lloyd_batched.cu) error
 * check: a CUDA error as a kvq status and message. Included by .cu files only. */
#ifndef KVQ_KM_CUDA_CHECK_H
#define KVQ_KM_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "kvq/common.h"

/* Out of device memory is NOMEM, any other error BACKEND; the message
 * "WHO: WHAT: CUDA's reason". */
static inline kvq_status km_cuda_fail(cudaError_t e, const char *who, const char *what,
                                      kvq_err *err)
{
    return kvq_err_set(err, e == cudaErrorMemoryAllocation ? KVQ_E_NOMEM : KVQ_E_BACKEND,
                       "%s: %s: %s", who, what, cudaGetErrorString(e));
}

/* In a function with `kvq_status st`, `kvq_err *err` and a `done:` label: on a CUDA
 * error, st = the error (km_cuda_fail) and goto done. */
#define KM_CU_TRY(who, call, what)                                                           \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            st = km_cuda_fail(e_, who, what, err);                                           \
            goto done;                                                                       \
        }                                                                                    \
    } while (0)

#endif
