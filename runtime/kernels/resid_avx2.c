/*
 * resid_avx2.c — AVX2 path of kvq_rk_resid_scores_max (runtime/kernels/rk.h,
 * resid.c): the residual stage by the best head, 8 candidates per vector.
 *
 * The operations of resid_avx512.c on 8 lanes: each byte's table entry formed
 * from the head's two 16-entry nibble tables (kvq_rk_sign_table writes them after the
 * byte tables) with the float add that built the byte table, summed over the bytes from
 * 0.0f in order (the running sum as the FMA e 1 + s: an exact product, the add's bits),
 * times the scale, plus the head's first-stage score, the best head kept by a strict
 * compare in head order: the scalar reference's bits. AVX2 has no 16-entry permute, so
 * a nibble's entry is looked up in both 8-entry halves of its table (vpermps on the low
 * three bits) and chosen by its bit 3 (a blend on the bit shifted to the sign). Each
 * candidate's record is read with one 16-byte load per 16 bytes (8 at d 64) and the 8
 * records transposed in registers (dword unpacks), the scale and the first-stage
 * entries gathered, or broadcast when the 8 share one group (one (code, band) run). For
 * nb8 % 16 == 0 or nb8 == 8 (d a multiple of 128, or 64, at 1 bit); else the caller's
 * interleaved loop. The session-7 interleaved loop (scalar byte-table lookups) it
 * replaces on AVX2 cost ~26 ns a candidate at gs 4, d 128 (docs/BENCHMARKS.md).
 */
#include "runtime/kernels/kernels_simd.h"

#if KVQ_RK_HAVE_X86
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/kernels/rk.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))

/* Most dwords of one vector of candidates kept for the heads: nb8 / 4 <= 32 */
#define MAX_X 32

/* The entry of each lane's nibble (bits 0-3 of idx; higher bits ignored) in the 16-entry
 * table t. */
static inline TARGET __attribute__((always_inline)) __m256 nib16(const float *t, __m256i idx,
                                                                __m256 bit3)
{
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(t), idx),
                            _mm256_permutevar8x32_ps(_mm256_loadu_ps(t + 8), idx), bit3);
}

/* Heads h0 .. h0 + hc - 1 (hc <= 4) of the 8 candidates whose records are x [nb8 / 4]:
 * each head's score, the best kept in *best. */
static inline TARGET __attribute__((always_inline)) void
heads(const float *nib0, size_t tl, int32_t nb8, const __m256i *x, __m256 sc, const float *first,
      size_t fs, const int32_t *grp, __m256i g, int64_t g0, int64_t a, int32_t h0, const int hc,
      __m256 *best)
{
    __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int32_t p4 = 0; p4 < nb8 / 4; p4++) {
        const __m256i xv = x[p4];
        for (int i = 0; i < 4; i++) {
            const __m256i lo = _mm256_srli_epi32(xv, 8 * i), hi = _mm256_srli_epi32(xv, 8 * i + 4);
            const __m256 lo3 = _mm256_castsi256_ps(_mm256_slli_epi32(lo, 28)),
                         hi3 = _mm256_castsi256_ps(_mm256_slli_epi32(hi, 28));
            for (int j = 0; j < hc; j++) {
                const float *nb = nib0 + (size_t)(h0 + j) * tl + (size_t)p4 * 128 + 32 * i;
                const __m256 e = _mm256_add_ps(nib16(nb, lo, lo3), nib16(nb + 16, hi, hi3));
                s[j] = _mm256_fmadd_ps(e, one, s[j]);
            }
        }
    }
    for (int j = 0; j < hc; j++) {
        const float *fh = first + (size_t)(h0 + j) * fs;
        const __m256 f = g0 >= 0 ? _mm256_set1_ps(fh[g0])
                         : grp  ? _mm256_i32gather_ps(fh, g, 4)
                                : _mm256_loadu_ps(fh + a);
        const __m256 v = _mm256_add_ps(f, _mm256_mul_ps(sc, s[j]));
        *best = h0 + j == 0 ? v : _mm256_blendv_ps(*best, v, _mm256_cmp_ps(v, *best, _CMP_GT_OQ));
    }
}

/* The records of the 8 candidates at rows t[0..8) (nb8 bytes each) as x[p4] lane r =
 * bytes 4 p4 .. 4 p4 + 3 of candidate r: per 16 bytes, rows r and r + 4 in one register,
 * then a 4 x 4 transpose of dwords in each 128-bit lane. */
static inline TARGET __attribute__((always_inline)) void records(const uint8_t *bits, int32_t nb8,
                                                                 const int32_t *t, __m256i *x)
{
    const uint8_t *p[8];
    for (int r = 0; r < 8; r++)
        p[r] = bits + (size_t)t[r] * nb8;
    if (nb8 == 8) {
        __m256i y[4];
        for (int r = 0; r < 4; r++)
            y[r] = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)p[r])),
                _mm_loadl_epi64((const __m128i *)p[r + 4]), 1);
        const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t2 = _mm256_unpacklo_epi32(y[2], y[3]);
        x[0] = _mm256_unpacklo_epi64(t0, t2);
        x[1] = _mm256_unpackhi_epi64(t0, t2);
        return;
    }
    for (int32_t c = 0; c < nb8 / 16; c++) {
        __m256i y[4];
        for (int r = 0; r < 4; r++)
            y[r] = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p[r] + 16 * c))),
                _mm_loadu_si128((const __m128i *)(p[r + 4] + 16 * c)), 1);
        const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]),
                      t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
        x[4 * c] = _mm256_unpacklo_epi64(t0, t2);
        x[4 * c + 1] = _mm256_unpackhi_epi64(t0, t2);
        x[4 * c + 2] = _mm256_unpacklo_epi64(t1, t3);
        x[4 * c + 3] = _mm256_unpackhi_epi64(t1, t3);
    }
}

TARGET int64_t kvq_rk_resid_scores_max_avx2(const float *tab, int32_t gs, int32_t nb8,
                                            const uint8_t *bits, const float *scale,
                                            const int32_t *tok, const float *first, size_t fs,
                                            const int32_t *grp, int64_t n, float *out)
{
    if (!(nb8 == 8 || (nb8 % 16 == 0 && nb8 / 4 <= MAX_X)) || gs <= 0)
        return 0;
    const size_t tl = KVQ_RK_SIGN_TABLE_LEN(8 * (size_t)nb8);
    const float *nib0 = tab + (size_t)nb8 * 256; /* head h's nibble tables at nib0 + h tl */
    __m256i x[MAX_X];
    int64_t a = 0;
    for (; a + 8 <= n; a += 8) {
        for (int64_t l = a + 32; l < a + 40 && l < n; l++) { /* the rows 4 vectors ahead */
            __builtin_prefetch(bits + (size_t)tok[l] * nb8);
            __builtin_prefetch(scale + tok[l]);
        }
        records(bits, nb8, tok + a, x);
        const __m256i t = _mm256_loadu_si256((const __m256i *)(tok + a));
        const __m256 sc = _mm256_i32gather_ps(scale, t, 4);
        const __m256i g = grp ? _mm256_loadu_si256((const __m256i *)(grp + a)) : _mm256_setzero_si256();
        /* one group for the 8 (rows of one (code, band) run): its entries broadcast */
        const int64_t g0 =
            grp && _mm256_movemask_epi8(_mm256_cmpeq_epi32(g, _mm256_set1_epi32(grp[a]))) == -1
                ? grp[a]
                : -1;
        __m256 best = _mm256_setzero_ps();
        int32_t h0 = 0;
        for (; h0 + 4 <= gs; h0 += 4)
            heads(nib0, tl, nb8, x, sc, first, fs, grp, g, g0, a, h0, 4, &best);
        switch (gs - h0) {
        case 3:
            heads(nib0, tl, nb8, x, sc, first, fs, grp, g, g0, a, h0, 3, &best);
            break;
        case 2:
            heads(nib0, tl, nb8, x, sc, first, fs, grp, g, g0, a, h0, 2, &best);
            break;
        case 1:
            heads(nib0, tl, nb8, x, sc, first, fs, grp, g, g0, a, h0, 1, &best);
            break;
        default:
            break;
        }
        _mm256_storeu_ps(out + a, best);
    }
    return a;
}

#endif /* KVQ_RK_HAVE_X86 */
