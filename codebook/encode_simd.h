/*
 * codebook/encode_simd.h — the AVX2 kernels of kvq_codebook_encode (codebook/encode_avx2.c),
 * equal bit for bit to the scalar rule they replace (codebook.c, codebook/nearest.h;
 * tests/test_encode_simd.c). Not a public header.
 */
#ifndef KVQ_CODEBOOK_ENCODE_SIMD_H
#define KVQ_CODEBOOK_ENCODE_SIMD_H

#include <stdint.h>

/* z = k L in double, rounded to float: z[b] = sum over a = b .. d-1, ascending, of
 * k[a] L[a][b] (L lower triangular, [d, d]; what lies above the diagonal is not read
 * into the sums). As codebook.c's mul_lower. k, z: [d] (not aliased). */
void kvq_cb_mul_lower_avx2(const float *k, const float *L, int32_t d, float *z);

/* The nearest of the K centroids W [K, dg] to x [dg] by the expanded-form distance
 * kvq_km_dist_from_dot(xn, cn[c], kvq_km_dot(x, W[c], dg)) (xn = kvq_km_norm2(x, dg)),
 * first minimum (kvq_km_better), 0 when none compares: as codebook.c's nearest above
 * KVQ_KM_DIRECT_MAX_D. dg: a multiple of 8. */
int32_t kvq_cb_nearest_avx2(const float *x, float xn, const float *W, const float *cn, int32_t K,
                            int32_t dg);

#endif /* KVQ_CODEBOOK_ENCODE_SIMD_H */
