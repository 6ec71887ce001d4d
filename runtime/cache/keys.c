/*
 * keys.c — how the cache holds keys (rt_head.k) and how a step reads them rotated.
 *
 * WROPE (kvq_retrieval_params.positions, the default): rt_head.k holds the pre-RoPE
 * keys in the cache dtype; the far rows are scored with q R_b against the stored key,
 * the window's keys are rotated on read (kvq_rt_key_rotated).
 *
 * ROPE: every read wants k_j R_{p_j} (the rerank's candidates, the sinks, the
 * selection, the window, the oracle, fier and quest), so the keys are held rotated
 * (kvq_retrieval.keys_rotated) in the cache dtype: at append the f32 key of the forward
 * pass is rotated in f32 by its position (from the table, kvq_rt_rotate) and then
 * rounded to the cache dtype, once. That is llama.cpp's rule: its graph applies
 * ggml_rope_ext to the f32 K of the projection and copies the rotated K into its cache
 * of type_k (f16 by default: ggml_set_rows / ggml_cpy, round to nearest even); it never
 * holds a pre-RoPE key, so nothing is rounded before the rotation. An f32 cache holds
 * the f32 rotated key (no rounding at all). A read is then the row itself: the logits
 * kernels take the rows by index in the cache dtype, no copy and no rotation (an f16
 * conversion, d/2 pair rotations and two table rows at a scattered position: about
 * 150 ns per key) per read, and a key row moves d es bytes, like a value row.
 *
 * Against rotating the stored pre-RoPE key on each read (what kvq did before, and still
 * does under WROPE's window) results differ by where the f16 rounding falls: f16(k R)
 * instead of f16(k) R, each within half an f16 ulp of k R per element. With an f32
 * cache both are k R, bit for bit.
 *
 * The codebook encoder still takes the pre-RoPE key as a pre-RoPE cache of the dtype
 * would hold it (kvq_rt_key_pre, f16-rounded in an f16 cache: the codes are the same
 * under WROPE and ROPE); nothing reads the pre-RoPE key after the append.
 */
#include <string.h>

#include "kvq/half.h"
#include "runtime/kernels/kernels.h"
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
    float x[KVQ_ROPE_MAX_DIM];
    if (r->keys_rotated) { /* rotate the f32 key, then round once (llama.cpp's order) */
        kvq_rt_rotate(r, k, pos, x);
        k = x;
    }
    if (r->es == 2) {
        kvq_f32_to_f16(k, (uint16_t *)H->k + (size_t)j * d, d);
    } else {
        memcpy((float *)H->k + (size_t)j * d, k, sizeof(float) * d);
    }
}

void kvq_rt_key_rotated(const kvq_retrieval *r, const rt_layer *L, const rt_head *H, int64_t j,
                        float *y)
{
    const size_t d = (size_t)r->d;
    if (r->es == 2) /* exact conversion: any ISA gives the same bits */
        kvq_f16_to_f32((const uint16_t *)H->k + (size_t)j * d, y, d);
    else
        memcpy(y, (const float *)H->k + (size_t)j * d, sizeof(float) * d);
    if (!r->keys_rotated)
        kvq_rt_rotate(r, y, L->pos[kvq_rt_row_token(H, j)], y);
}

void kvq_rt_key_held(const kvq_retrieval *r, const float *k, int64_t pos, float *y)
{
    const size_t d = (size_t)r->d;
    kvq_rt_rotate(r, k, pos, y);
    if (r->es == 2) { /* store_key's rounding, converted back exactly */
        uint16_t h[KVQ_ROPE_MAX_DIM];
        kvq_f32_to_f16(y, h, d);
        kvq_f16_to_f32(h, y, d);
    }
}

void kvq_rt_append_key(const kvq_retrieval *r, const rt_layer *L, const rt_head *H, int64_t j,
                       float *y)
{
    if (H->k) {
        kvq_rt_key_rotated(r, L, H, j, y);
        return;
    }
    const size_t h = (size_t)(H - L->head), d = (size_t)r->d;
    memcpy(y, r->akey + (h * (size_t)r->akey_n + (size_t)(j - r->akey_past)) * d,
           sizeof(float) * d);
}
