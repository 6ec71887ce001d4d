/*
 * common/hd.h — KVQ_HD, the qualifier of the per-element functions in the headers
 * that the CPU code and the CUDA kernels share (codebook/nearest.h, kmeans/kmeans_kernels.h,
 * runtime/kernels/kernels.h): __host__ __device__ under nvcc, nothing in C. Not public.
 */
#ifndef KVQ_COMMON_HD_H
#define KVQ_COMMON_HD_H

#ifndef KVQ_HD
#if defined(__CUDACC__)
#define KVQ_HD __host__ __device__
#else
#define KVQ_HD
#endif
#endif

#endif /* KVQ_COMMON_HD_H */
