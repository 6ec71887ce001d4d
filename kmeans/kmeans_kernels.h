/*
 * kmeans_kernels.h — per-element logic of k-means, shared by the CPU backend and
 * the CUDA kernels (KVQ_HD = __host__ __device__ under nvcc, nothing in C).
 *
 * These functions are the specification: the CPU tests call them directly and
 * through the CPU backend, and the CUDA kernels call the same functions.
 * Plain C99/C++ only (no restrict, no libm), so one text compiles in both.
 */
#ifndef KVQ_KMEANS_KERNELS_H
#define KVQ_KMEANS_KERNELS_H

#include <stdint.h>

#include "codebook/nearest.h" /* KVQ_HD, the distances and the tie rule */

/* ---- centroid update ---------------------------------------------------------- */

/* One weighted term of a centroid sum, accumulated in double. */
KVQ_HD static inline double kvq_km_accum(double sum, float x, float w)
{
    return sum + (double)w * (double)x;
}

/* Centroid coordinate from its weighted sum and total weight (wsum > 0). */
KVQ_HD static inline float kvq_km_centroid_coord(double sum, double wsum)
{
    return (float)(sum / wsum);
}

/* ---- random numbers by counter ------------------------------------------------ */

/* SplitMix64 finalizer: a bijective 64-bit mix. */
KVQ_HD static inline uint64_t kvq_km_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A uniform double in [0, 1) that depends only on (seed, stream, i): lets every
 * point draw its own random number in parallel, independent of thread count. */
KVQ_HD static inline double kvq_km_uniform_at(uint64_t seed, uint64_t stream, uint64_t i)
{
    uint64_t h = kvq_km_mix64(seed ^ kvq_km_mix64(stream ^ kvq_km_mix64(i)));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

#endif /* KVQ_KMEANS_KERNELS_H */
