// device.cu — kvq_cuda_available() for builds with the CUDA backend.
//
// Answers whether a usable device is present right now: one is counted, and a probe
// kernel compiled into this build runs on it. A device the build has no code for (an
// architecture older than the build's list with no PTX that the driver can compile, or
// PTX newer than the driver: cudaErrorNoKernelImageForDevice,
// cudaErrorUnsupportedPtxVersion) fails the probe, so every caller falls back to the
// CPU instead of failing at its first kernel. The first call caches the answer; the
// reason is one line the CLI prints once before falling back to the CPU.
#include <cstdio>
#include <cuda_runtime.h>

#include "kvq/common.h"

// Writes a known value: the launch fails when the build holds no code for this device.
__global__ void k_probe(int *out) { *out = 0x6b7671; }

// 0 when the probe kernel launches and writes its value on device 0; else the error.
static cudaError_t probe(void)
{
    int *d = nullptr, h = 0;
    cudaError_t e = cudaMalloc((void **)&d, sizeof *d);
    if (e != cudaSuccess)
        return e;
    k_probe<<<1, 1>>>(d);
    e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e == cudaSuccess && h != 0x6b7671)
        e = cudaErrorUnknown;
    return e;
}

extern "C" int kvq_cuda_available(const char **why)
{
    static int cached = -1;
    static char reason[256];
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
        } else if ((e = probe()) != cudaSuccess) {
            cudaDeviceProp pr;
            int ok = cudaGetDeviceProperties(&pr, 0) == cudaSuccess;
            snprintf(reason, sizeof reason,
                     "no CUDA device this build can run on (%s, sm_%d%d: %s); using the CPU",
                     ok ? pr.name : "device 0", ok ? pr.major : 0, ok ? pr.minor : 0,
                     cudaGetErrorString(e));
            cudaGetLastError(); // clear a sticky launch error for later callers
            cached = 0;
        } else {
            cached = 1;
        }
    }
    if (!cached && why)
        *why = reason;
    return cached;
}
