/*
 * keys.c — how the cache holds keys (rt_head.k) and how a step reads them rotated.
 *
 * WROPE (kvq_retrieval_params.positions, the default): rt_head.k holds the pre-RoPE
 * keys in the cache dtype; the far rows are scored with q R_b against the stored key,
 * the window's keys are rotated on read (kvq_rt_key_rotated).
 *
 * ROPE: every read wants k_j R_{p_j} (the rerank's candidates, the sinks, the
 * selection, the window, the oracle, fier and quest), so the keys are held rotated
 * (kvq_retrieval.keys_rotated): at append each key is rounded to the cache dtype (what
 * a pre-RoPE cache holds), converted to f32 and rotated by its position from the table
 * — the arithmetic a read-time rotation of the stored row performed — and stored in
 * f32. A read is then the row itself: the logits kernels take the rows by index, no copy
 * and no rotation (an f16 conversion, d/2 pair rotations and two table rows at a
 * scattered position: about 150 ns per key) per read. Every result is bit for bit what
 * read-time rotation gave. The rows are f32 whatever the cache dtype, since rounding
 * the rotated key to f16 would change results: with an f16 cache (the default) the keys
 * take twice the memory and a key row read moves 4 d bytes instead of 2 d (the KV cache
 * 1.5x); bytes_read and kv_read still count the cache dtype's bytes (the KV a pre-RoPE
 * cache of that dtype holds), so statistics are unchanged. Nothing reads the pre-RoPE
 * key after the append: the codebook encoder takes it from the append (kvq_rt_key_pre).
 */
#include <string.h>

#include "kvq/half.h"
#include "runtime/kernels.h"
#include "runtime/runtime_internal.h"

void kvq_rt_rotate(const kvq_retrieval *r, const float *x, int64_t p, float *y)
{
    const size_t half = (size_t)r->d / 2;
    kvq_rk_rotate(x, r->rcos + (size_t)p * half, r->rsin + (size_t)p * half, (int)r->rope.layout,
                  r->d, y);
}

void kvq_rt_key_pre(const kvq_retrieval *r, const float *k, float *out)
{
    const size_t d = (size_t)r->d;
    if (r->es == 2) { /* exact conversions: any ISA gives the same bits */
        uint16_t h[KVQ_ROPE_MAX_DIM];
        kvq_f32_to_f16(k, h, d);
        kvq_f16_to_f32(h, out, d);
    } else {
        memcpy(out, k, d * sizeof *out);
    }
}

void kvq_rt_store_key(const kvq_retrieval *r, rt_head *H, int64_t j, int64_t pos, const float *k)
{
    const size_t d = (size_t)r->d;
    if (r->keys_rotated) {
        float x[KVQ_ROPE_MAX_DIM];
        kvq_rt_key_pre(r, k, x);
        kvq_rt_rotate(r, x, pos, (float *)H->k + (size_t)j * d);
    } else if (r->es == 2) {
        kvq_f32_to_f16(k, (uint16_t *)H->k + (size_t)j * d, d);
    } else {
        memcpy((float *)H->k + (size_t)j * d, k, sizeof(float) * d);
    }
}

void kvq_rt_key_rotated(const kvq_retrieval *r, const rt_layer *L, const rt_head *H, int64_t j,
                        float *y)
{
    const size_t d = (size_t)r->d;
    if (r->keys_rotated) {
        memcpy(y, (const float *)H->k + (size_t)j * d, sizeof(float) * d);
        return;
    }
    if (r->es == 2)
        kvq_f16_to_f32((const uint16_t *)H->k + (size_t)j * d, y, d);
    else
        memcpy(y, (const float *)H->k + (size_t)j * d, sizeof(float) * d);
    kvq_rt_rotate(r, y, L->pos[kvq_rt_row_token(H, j)], y);
}
