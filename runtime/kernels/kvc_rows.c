/*
 * runtime/kernels/kvc_rows.c — the scalar readers of LeanKV and PATS rows (formats in
 * kvc_rows.h): codes and fields are taken from the stored bits as the loop goes.
 */
#include "runtime/kernels/kvc_rows.h"

#include <string.h>

#include "kvq/half.h"

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

static void put_bits(uint8_t *p, uint64_t off, int32_t w, uint32_t v)
{
    for (int32_t k = 0; k < w; k++)
        if (v >> k & 1u)
            p[(off + (uint64_t)k) >> 3] |= (uint8_t)(1u << ((off + (uint64_t)k) & 7u));
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
    float s, z;
    lkq_meta(row, &s, &z);
    double qc = 0, qs = 0;
    for (int32_t t = 0; t < n; t++) {
        qc += (double)q[t] * (double)kvq_rk_lkq_code(row, t, bits);
        qs += (double)q[t];
    }
    return (float)((double)s * qc - (double)z * qs);
}

void kvq_rk_lkq_axpy(float a, const uint8_t *row, int32_t n, int32_t bits, float *y)
{
    float s, z;
    lkq_meta(row, &s, &z);
    for (int32_t t = 0; t < n; t++)
        y[t] += a * (s * (float)kvq_rk_lkq_code(row, t, bits) - z);
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

void kvq_rk_lkq_dot_n(const float *q, int32_t nq, int64_t ldq, const uint8_t *row, int32_t n,
                      int32_t bits, float *out)
{
    float c[512], s, z;
    lkq_meta(row, &s, &z);
    lkq_codes(row, n, bits, c);
    for (int32_t g = 0; g < nq; g++) {
        const float *qg = q + (size_t)g * (size_t)ldq;
        double qc = 0, qs = 0;
        for (int32_t t = 0; t < n; t++) {
            qc += (double)qg[t] * (double)c[t];
            qs += (double)qg[t];
        }
        out[g] = (float)((double)s * qc - (double)z * qs);
    }
}

void kvq_rk_lkq_axpy_n(const float *a, int32_t na, const uint8_t *row, int32_t n, int32_t bits,
                       float *y, int64_t ldy)
{
    float c[512], s, z;
    lkq_meta(row, &s, &z);
    lkq_codes(row, n, bits, c);
    for (int32_t t = 0; t < n; t++)
        c[t] = s * c[t] - z;
    for (int32_t g = 0; g < na; g++) {
        if (a[g] == 0)
            continue;
        float *yg = y + (size_t)g * (size_t)ldy;
        for (int32_t t = 0; t < n; t++)
            yg[t] += a[g] * c[t];
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
    double s = 0;
    for (int32_t c = 0; c < n; c++)
        s += (double)q[c] * (double)kvq_f16_to_f32_ref(kvq_rk_pats_elem(row, c, b));
    return (float)s;
}

void kvq_rk_pats_axpy(float a, const uint8_t *row, int32_t n, int32_t b, float *y)
{
    for (int32_t c = 0; c < n; c++)
        y[c] += a * kvq_f16_to_f32_ref(kvq_rk_pats_elem(row, c, b));
}

void kvq_rk_pats_dot_n(const float *q, int32_t nq, int64_t ldq, const uint8_t *row, int32_t n,
                       int32_t b, float *out)
{
    float x[512];
    kvq_rk_pats_unpack(row, n, b, x);
    for (int32_t g = 0; g < nq; g++) {
        const float *qg = q + (size_t)g * (size_t)ldq;
        double s = 0;
        for (int32_t c = 0; c < n; c++)
            s += (double)qg[c] * (double)x[c];
        out[g] = (float)s;
    }
}

void kvq_rk_pats_axpy_n(const float *a, int32_t na, const uint8_t *row, int32_t n, int32_t b,
                        float *y, int64_t ldy)
{
    float x[512];
    kvq_rk_pats_unpack(row, n, b, x);
    for (int32_t g = 0; g < na; g++) {
        if (a[g] == 0)
            continue;
        float *yg = y + (size_t)g * (size_t)ldy;
        for (int32_t c = 0; c < n; c++)
            yg[c] += a[g] * x[c];
    }
}
