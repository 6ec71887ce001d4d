/*
 * runtime/kernels/kvc_rows.c — the scalar readers of LeanKV and PATS rows (formats in
 * kvc_rows.h): codes and fields are taken from the stored bits as the loop goes.
 */
#include "runtime/kernels/kvc_rows.h"

#include <string.h>

#include <math.h>

#include "kvq/half.h"
#include "runtime/kernels/kernels_simd.h"
#include "runtime/kernels/kvc_rows_simd.h"

/* ==========================================================================
 * Bit streams
 * ========================================================================== */

/* `w` (1..16) bits at bit offset `off` of the little-endian stream p. */
static uint32_t get_bits(const uint8_t *p, uint64_t off, int32_t w)
{
    const uint8_t *b = p + (off >> 3);
    const uint32_t sh = (uint32_t)(off & 7u);
    uint32_t v = (uint32_t)b[0];
    if (sh + (uint32_t)w > 8)
        v |= (uint32_t)b[1] << 8;
    if (sh + (uint32_t)w > 16)
        v |= (uint32_t)b[2] << 16;
    return (v >> sh) & ((1u << w) - 1u);
}

/* ORs the w (1..16) bits of v (< 2^w) into the stream at bit offset off. */
static void put_bits(uint8_t *p, uint64_t off, int32_t w, uint32_t v)
{
    (void)w;
    uint8_t *b = p + (off >> 3);
    for (uint32_t x = v << (off & 7u); x; x >>= 8)
        *b++ |= (uint8_t)x;
}

/* ==========================================================================
 * LeanKV rows
 * ========================================================================== */

size_t kvq_rk_lkq_row_bytes(int32_t n, int32_t bits)
{
    return 4u + ((size_t)n * (size_t)bits + 7u) / 8u;
}

uint32_t kvq_rk_lkq_code(const uint8_t *row, int32_t t, int32_t bits)
{
    return get_bits(row + 4, (uint64_t)t * (uint64_t)bits, bits);
}

void kvq_rk_lkq_put_code(uint8_t *row, int32_t t, int32_t bits, uint32_t c)
{
    put_bits(row + 4, (uint64_t)t * (uint64_t)bits, bits, c);
}

static void lkq_meta(const uint8_t *row, float *s, float *z)
{
    *s = kvq_f16_to_f32_ref((uint16_t)(row[0] | row[1] << 8));
    *z = kvq_f16_to_f32_ref((uint16_t)(row[2] | row[3] << 8));
}

void kvq_rk_lkq_dequant(const uint8_t *row, int32_t n, int32_t bits, float *out)
{
    float s, z;
    lkq_meta(row, &s, &z);
    for (int32_t t = 0; t < n; t++)
        out[t] = s * (float)kvq_rk_lkq_code(row, t, bits) - z;
}

float kvq_rk_lkq_dot(const float *q, const uint8_t *row, int32_t n, int32_t bits)
{
    float out;
    const float qs = kvq_rk_qsum(q, n);
    const int8_t b = (int8_t)bits;
    kvq_rk_lkq_logits(KVQ_ISA_SCALAR, q, 1, 0, &qs, &row, &b, 1, n, 1.0f, &out, 1);
    return out;
}

void kvq_rk_lkq_axpy(float a, const uint8_t *row, int32_t n, int32_t bits, float *y)
{
    const int8_t b = (int8_t)bits;
    kvq_rk_lkq_mix(KVQ_ISA_SCALAR, &a, 1, 1, &row, &b, 1, n, y, 0);
}

/* The codes of a row as floats, c [n] (n <= 512): byte-aligned widths without the bit
 * stream. */
static void lkq_codes(const uint8_t *row, int32_t n, int32_t bits, float *c)
{
    const uint8_t *p = row + 4;
    if (bits == 8) {
        for (int32_t t = 0; t < n; t++)
            c[t] = (float)p[t];
    } else if (bits == 4) {
        for (int32_t t = 0; t < n; t++)
            c[t] = (float)((p[t >> 1] >> ((t & 1) * 4)) & 15u);
    } else if (bits == 2) {
        for (int32_t t = 0; t < n; t++)
            c[t] = (float)((p[t >> 2] >> ((t & 3) * 2)) & 3u);
    } else {
        for (int32_t t = 0; t < n; t++)
            c[t] = (float)kvq_rk_lkq_code(row, t, bits);
    }
}

/* ==========================================================================
 * PATS rows
 * ========================================================================== */

size_t kvq_rk_pats_row_bytes(int32_t n, int32_t b)
{
    const size_t w = (size_t)(16 - b), B = 512u / w;
    return 64u * (((size_t)n + B - 1u) / B);
}

void kvq_rk_pats_pack(const uint16_t *h, int32_t n, int32_t b, uint8_t *row)
{
    const int32_t w = 16 - b, B = 512 / w;
    const size_t bytes = kvq_rk_pats_row_bytes(n, b);
    for (size_t i = 0; i < bytes; i++)
        row[i] = 0;
    for (int32_t c = 0; c < n; c++)
        put_bits(row + 64 * (size_t)(c / B), (uint64_t)(c % B) * (uint64_t)w, w,
                 (uint32_t)h[c] >> b);
}

uint16_t kvq_rk_pats_elem(const uint8_t *row, int32_t c, int32_t b)
{
    const int32_t w = 16 - b, B = 512 / w;
    const uint32_t f = get_bits(row + 64 * (size_t)(c / B), (uint64_t)(c % B) * (uint64_t)w, w);
    return (uint16_t)(f << b);
}

/* A finite f16 as f32 (PATS rows hold no Inf or NaN): a normal one by rebiasing its
 * exponent, a subnormal one by scaling its bits in f32's place by 2^112 (exact). */
static inline float f16_finite(uint16_t h)
{
    const uint32_t m = (uint32_t)(h & 0x7fffu) << 13, sign = (uint32_t)(h & 0x8000u) << 16;
    float f;
    if (h & 0x7c00u) { /* normal: rebias the exponent */
        const uint32_t x = sign | (m + (112u << 23));
        memcpy(&f, &x, sizeof f);
        return f;
    }
    memcpy(&f, &m, sizeof f); /* zero or subnormal: scaled, exact */
    f *= 0x1p112f;
    return sign ? -f : f;
}

void kvq_rk_pats_unpack(const uint8_t *row, int32_t n, int32_t b, float *out)
{
    const int32_t w = 16 - b, B = 512 / w;
    const uint64_t mask = (1u << w) - 1u;
    uint64_t word[9];
    word[8] = 0;
    for (int32_t blk = 0, c = 0; c < n; blk++) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(word, row + 64 * (size_t)blk, 64); /* the block as 8 little-endian words */
#else
        for (int k = 0; k < 8; k++) {
            const uint8_t *q = row + 64 * (size_t)blk + 8 * k;
            word[k] = 0;
            for (int j = 7; j >= 0; j--)
                word[k] = word[k] << 8 | q[j];
        }
#endif
        for (int32_t i = 0; i < B && c < n; i++, c++) {
            const uint32_t o = (uint32_t)(i * w), k = o >> 6, sh = o & 63u;
            uint64_t v = word[k] >> sh;
            if (sh + (uint32_t)w > 64)
                v |= word[k + 1] << (64 - sh);
            out[c] = f16_finite((uint16_t)((v & mask) << b));
        }
    }
}

float kvq_rk_pats_dot(const float *q, const uint8_t *row, int32_t n, int32_t b)
{
    float out;
    const int8_t bb = (int8_t)b;
    kvq_rk_pats_logits(KVQ_ISA_SCALAR, q, 1, 0, &row, &bb, 1, n, 1.0f, &out, 1);
    return out;
}

void kvq_rk_pats_axpy(float a, const uint8_t *row, int32_t n, int32_t b, float *y)
{
    const int8_t bb = (int8_t)b;
    kvq_rk_pats_mix(KVQ_ISA_SCALAR, &a, 1, 1, &row, &bb, 1, n, y, 0);
}

/* ==========================================================================
 * Many rows: the scalar specification and the dispatch
 * ========================================================================== */

static float lane_reduce(float *acc)
{
    for (int w = 8; w >= 1; w >>= 1)
        for (int l = 0; l < w; l++)
            acc[l] = acc[l] + acc[l + w];
    return acc[0];
}

static float lanesum(const float *a, const float *b, int32_t n)
{
    float acc[16] = {0};
    for (int32_t t = 0; t < n; t++)
        acc[t & 15] = fmaf(a[t], b[t], acc[t & 15]);
    return lane_reduce(acc);
}

float kvq_rk_qsum(const float *q, int32_t n)
{
    float acc[16] = {0};
    for (int32_t t = 0; t < n; t++)
        acc[t & 15] = acc[t & 15] + q[t];
    return lane_reduce(acc);
}

static void lkq_logits_scalar(const float *q, int32_t nq, int64_t ldq, const float *qsum,
                              const uint8_t *const *row, const int8_t *bits, int64_t m,
                              int32_t n, float scale, float *out, int64_t ldo)
{
    float c[512], s, z;
    for (int64_t i = 0; i < m; i++) {
        lkq_meta(row[i], &s, &z);
        lkq_codes(row[i], n, bits[i], c);
        for (int32_t g = 0; g < nq; g++) {
            const float t1 = s * lanesum(q + (size_t)g * (size_t)ldq, c, n), t2 = z * qsum[g];
            out[(size_t)g * (size_t)ldo + (size_t)i] = scale * (t1 - t2);
        }
    }
}

static void lkq_mix_scalar(const float *p, int32_t nq, int64_t ldp, const uint8_t *const *row,
                           const int8_t *bits, int64_t m, int32_t n, float *y, int64_t ldy)
{
    float c[512], s, z;
    for (int64_t i = 0; i < m; i++) {
        lkq_meta(row[i], &s, &z);
        lkq_codes(row[i], n, bits[i], c);
        for (int32_t t = 0; t < n; t++)
            c[t] = s * c[t] - z;
        for (int32_t g = 0; g < nq; g++) {
            const float a = p[(size_t)g * (size_t)ldp + (size_t)i];
            float *yg = y + (size_t)g * (size_t)ldy;
            if (a != 0)
                for (int32_t t = 0; t < n; t++)
                    yg[t] = fmaf(a, c[t], yg[t]);
        }
    }
}

static void pats_logits_scalar(const float *q, int32_t nq, int64_t ldq,
                               const uint8_t *const *row, const int8_t *bits, int64_t m,
                               int32_t n, float scale, float *out, int64_t ldo)
{
    float x[512];
    for (int64_t i = 0; i < m; i++) {
        kvq_rk_pats_unpack(row[i], n, bits[i], x);
        for (int32_t g = 0; g < nq; g++)
            out[(size_t)g * (size_t)ldo + (size_t)i] =
                scale * lanesum(q + (size_t)g * (size_t)ldq, x, n);
    }
}

static void pats_mix_scalar(const float *p, int32_t nq, int64_t ldp, const uint8_t *const *row,
                            const int8_t *bits, int64_t m, int32_t n, float *y, int64_t ldy)
{
    float x[512];
    for (int64_t i = 0; i < m; i++) {
        kvq_rk_pats_unpack(row[i], n, bits[i], x);
        for (int32_t g = 0; g < nq; g++) {
            const float a = p[(size_t)g * (size_t)ldp + (size_t)i];
            float *yg = y + (size_t)g * (size_t)ldy;
            if (a != 0)
                for (int32_t t = 0; t < n; t++)
                    yg[t] = fmaf(a, x[t], yg[t]);
        }
    }
}

/* The SIMD path for rows of n elements, or the scalar one. */
static kvq_isa kvc_isa(kvq_isa isa, int32_t n)
{
    return n % 16 == 0 && n <= 512 ? kvq_isa_clamp(isa) : KVQ_ISA_SCALAR;
}

#if KVQ_RK_HAVE_X86
#define KVC_DISPATCH(isa, n, name, args)                                                         \
    do {                                                                                         \
        switch (kvc_isa(isa, n)) {                                                               \
        case KVQ_ISA_AVX512: kvq_kvc_##name##_avx512 args; return;                                        \
        case KVQ_ISA_AVX2: kvq_kvc_##name##_avx2 args; return;                                           \
        default: name##_scalar args; return;                                                     \
        }                                                                                        \
    } while (0)
#else
#define KVC_DISPATCH(isa, n, name, args) name##_scalar args
int kvq_kvc_avx512_vbmi(int on)
{
    (void)on;
    return 0;
}
#endif

void kvq_rk_lkq_logits(kvq_isa isa, const float *q, int32_t nq, int64_t ldq, const float *qsum,
                       const uint8_t *const *row, const int8_t *bits, int64_t m, int32_t n,
                       float scale, float *out, int64_t ldo)
{
    KVC_DISPATCH(isa, n, lkq_logits, (q, nq, ldq, qsum, row, bits, m, n, scale, out, ldo));
}

void kvq_rk_lkq_mix(kvq_isa isa, const float *p, int32_t nq, int64_t ldp,
                    const uint8_t *const *row, const int8_t *bits, int64_t m, int32_t n,
                    float *y, int64_t ldy)
{
    KVC_DISPATCH(isa, n, lkq_mix, (p, nq, ldp, row, bits, m, n, y, ldy));
}

void kvq_rk_pats_logits(kvq_isa isa, const float *q, int32_t nq, int64_t ldq,
                        const uint8_t *const *row, const int8_t *bits, int64_t m, int32_t n,
                        float scale, float *out, int64_t ldo)
{
    KVC_DISPATCH(isa, n, pats_logits, (q, nq, ldq, row, bits, m, n, scale, out, ldo));
}

void kvq_rk_pats_mix(kvq_isa isa, const float *p, int32_t nq, int64_t ldp,
                     const uint8_t *const *row, const int8_t *bits, int64_t m, int32_t n,
                     float *y, int64_t ldy)
{
    KVC_DISPATCH(isa, n, pats_mix, (p, nq, ldp, row, bits, m, n, y, ldy));
}
