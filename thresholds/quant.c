/*
 * quant.c — per-vector asymmetric quantization with an f16 scale and zero point (the
 * LeanKV storage of keys and values): kvq/thresholds.h's names for the runtime cache's
 * quantizer (runtime/cache/kvc.h, kvq_rt_lkq_codes), its dequantization and sizes.
 */
#include <stdlib.h>
#include <string.h>

#include "kvq/half.h"
#include "kvq/thresholds.h"
#include "runtime/cache/kvc.h"

kvq_status kvq_asymq_quantize_ref(const float *x, int32_t n, int32_t bits, uint8_t *codes,
                                  kvq_asymq_meta *meta, kvq_err *err)
{
    /* the runtime cache's quantizer (runtime/cache/kvc.h): the profile measures what
     * --kv leankv stores */
    return kvq_rt_lkq_codes(x, n, bits, codes, &meta->scale, &meta->zero, err);
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
