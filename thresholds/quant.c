/*
 * quant.c — per-vector asymmetric quantization with an f16 scale and zero point (the
 * LeanKV storage of keys and values): the scalar reference of kvq/thresholds.h.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/half.h"
#include "kvq/thresholds.h"

#define F16_MAX 65504.0f

/* The smallest f16 >= x for finite x >= 0 (x <= F16_MAX). */
static uint16_t f16_round_up(float x)
{
    uint16_t h = kvq_f32_to_f16_ref(x);
    if (kvq_f16_to_f32_ref(h) < x)
        h++; /* positive f16 bit patterns are ordered like their values */
    return h;
}

/* The codes of x [n] at zero point z and scale sc > 0: IEEE divisions, adds and floors
 * only, so the AVX2 clone (floor as one instruction, vectors) gives the scalar bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void asymq_codes(const float *x, int32_t n, float z, float sc, float levels,
                        uint8_t *codes)
{
    for (int32_t t = 0; t < n; t++) {
        float q = floorf((x[t] + z) / sc + 0.5f);
        q = q < 0 ? 0 : q > levels ? levels : q;
        codes[t] = (uint8_t)q;
    }
}

kvq_status kvq_asymq_quantize_ref(const float *x, int32_t n, int32_t bits, uint8_t *codes,
                                  kvq_asymq_meta *meta, kvq_err *err)
{
    if (n < 1 || bits < 1 || bits > KVQ_ASYMQ_MAX_BITS)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "asymq: n %d, bits %d (need n >= 1, bits 1..8)",
                           (int)n, (int)bits);
    float lo = x[0], hi = x[0];
    for (int32_t t = 0; t < n; t++) {
        if (!isfinite(x[t]))
            return kvq_err_set(err, KVQ_E_NUMERIC, "asymq: non-finite value at %d", (int)t);
        lo = x[t] < lo ? x[t] : lo;
        hi = x[t] > hi ? x[t] : hi;
    }
    const float levels = (float)((1u << bits) - 1u);
    const float s = (float)(((double)hi - (double)lo) / levels);
    if (fabsf(lo) > F16_MAX || s > F16_MAX)
        return kvq_err_set(err, KVQ_E_NUMERIC,
                           "asymq: range [%g, %g] does not fit an f16 scale and zero point",
                           (double)lo, (double)hi);
    const uint16_t z16 = kvq_f32_to_f16_ref(0.0f - lo); /* +0, not -0, for lo = 0 */
    const uint16_t s16 = s > 0 ? f16_round_up(s) : 0;
    const float z = kvq_f16_to_f32_ref(z16), sc = kvq_f16_to_f32_ref(s16);
    if (sc > 0)
        asymq_codes(x, n, z, sc, levels, codes);
    else
        memset(codes, 0, (size_t)n);
    meta->scale = s16;
    meta->zero = z16;
    return KVQ_OK;
}

void kvq_asymq_dequantize_ref(const uint8_t *codes, int32_t n, kvq_asymq_meta meta, float *out)
{
    const float sc = kvq_f16_to_f32_ref(meta.scale), z = kvq_f16_to_f32_ref(meta.zero);
    for (int32_t t = 0; t < n; t++)
        out[t] = sc * (float)codes[t] - z;
}

kvq_status kvq_asymq_roundtrip(const float *x, int32_t n, int32_t bits, float *out, kvq_err *err)
{
    uint8_t stack[512];
    uint8_t *codes = stack;
    kvq_asymq_meta meta;
    kvq_status s;
    if (n > (int32_t)sizeof stack) {
        /* rare: vectors longer than 512 (head dims are at most KVQ_ROPE_MAX_DIM) */
        codes = NULL;
        if (n >= 1)
            codes = (uint8_t *)malloc((size_t)n);
        if (!codes)
            return kvq_err_set(err, KVQ_E_NOMEM, "asymq: out of memory");
    }
    if ((s = kvq_asymq_quantize_ref(x, n, bits, codes, &meta, err)) == KVQ_OK)
        kvq_asymq_dequantize_ref(codes, n, meta, out);
    if (codes != stack)
        free(codes);
    return s;
}

uint64_t kvq_asymq_bytes(int32_t n, int32_t bits)
{
    return ((uint64_t)n * (uint64_t)bits + 7u) / 8u + 4u;
}
