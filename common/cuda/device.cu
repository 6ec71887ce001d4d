// device.cu — kvq_cuda_available() for builds with the CUDA backend.
//
// Answers whether a usable device is present right now. The first call caches the
// answer; a missing driver or device gives a one-line reason the CLI prints once
// before falling back to the CPU.
#include <cstdio>
#include <cuda_runtime.h>

#include "kvq/common.h"

extern "C" int kvq_cuda_available(const char **why)
{
    static int cached = -1;
    static char reason[160];
    if (cached < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) {
            snprintf(reason, sizeof reason, "no CUDA device found (%s); using the CPU",
                     cudaGetErrorString(e));
            cached = 0;
        } else if (n == 0) {
            snprintf(reason, sizeof reason, "no CUDA device found; using the CPU");
            cached = 0;
        } else {
            cached = 1;
        }
    }
    if (!cached && why)
        *why = reason;
    return cached;
}
