/*
 * codebook/encode_simd.h — the AVX2 kernels of kvq_codebook_encode (codebook/encode_avx2.c),
 * equal bit for bit to the scalar rule they replace (codebook.c, codebook/nearest.h;
 * tests/test_encode_simd.c). Not a public header.
 */
#ifndef KVQ_CODEBOOK_ENCODE_SIMD_H
#define KVQ_CODEBOOK_ENCODE_SIMD_H

#include <stdint.h>

/* z = k L in double, rounded to float: z[b] = sum over a = b .. d-1, ascending, of
 * k[a] L[a][b], from Ld: L in double [d, d] with +0 above the diagonal (the exact
 * conversions; the zeros leave a sum at +0 before its column's row), as codebook.c's
 * mul_lower. k, z: [d] (not aliased). */
void kvq_cb_mul_lower_d_avx2(const float *k, const double *Ld, int32_t d, float *z);

/* The nearest of the K centroids W [K, dg] to x [dg] by the expanded-form distance
 * kvq_km_dist_from_dot(xn, cn[c], kvq_km_dot(x, W[c], dg)) (xn = kvq_km_norm2(x, dg)),
 * first minimum (kvq_km_better), 0 when none compares: as codebook.c's nearest above
 * KVQ_KM_DIRECT_MAX_D. dg: a multiple of 8. */
int32_t kvq_cb_nearest_avx2(const float *x, float xn, const float *W, const float *cn, int32_t K,
                            int32_t dg);

/* Keys encoded a tile at a time (kvq_codebook_encode). */
#define KVQ_CB_TILE 16

/* kvq_cb_nearest_avx2 of n <= KVQ_CB_TILE vectors at once: x_i = x + i ldx, its norm
 * xn[i], its nearest centroid into out[i ldo]; the same results as n calls (each key's
 * sums and comparisons are the same operations in the same order), the centroids read
 * from L1 by every key of the tile. */
void kvq_cb_nearest_tile_avx2(const float *x, int64_t ldx, const float *xn, int32_t n,
                              const float *W, const float *cn, int32_t K, int32_t dg,
                              int32_t *out, int64_t ldo);

#endif /* KVQ_CODEBOOK_ENCODE_SIMD_H */
