/*
 * rerank_resid.c — the residual stage of the codebook selector
 * (kvq_retrieval_params.resid_bits, resid_wide; kvq/runtime.h): each cached key keeps,
 * besides its code, its residual from the centroid quantized to b bits per channel
 * with one f32 scale (d b / 8 + 4 bytes). At a step the codebook picks
 * ceil(resid_wide k2) candidates, k2 = ceil(rerank k) (k without the exact rerank); the
 * residual scores q . (c + r^) under the position mode (ROPE: the reconstruction
 * rotated by the token's position, as the oracle rotates the key) keep k2 of them,
 * which the exact rerank (rerank.c) then cuts to k. It tells apart the tokens that share a centroid (a
 * copy token and its neighbours) for a few bytes each instead of a key row.
 *
 * Quantizer of a residual r [d] (kvq_rt_resid_quantize): b = 1: r^_c = +-a with
 * a = mean |r_c| (sign of r_c, + for 0); b >= 2: L = 2^b levels of step
 * s = 2 max |r_c| / L, index i_c = clamp(floor(r_c / s) + L/2, 0, L - 1),
 * r^_c = (i_c - L/2 + 1/2) s. The centroid is the key-space codebook's (G = 1); with
 * none (grouped query-aware codebooks, vq-postrope) the key itself is quantized.
 * Indices are stored one per byte (the bytes read are counted at b bits).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"

/* Largest share of the candidates the stage scores (kvq_rt_resid_count). */
#define KVQ_RT_RESID_MAX_SHARE 0.5

void kvq_rt_resid_quantize(const float *x, int32_t d, int32_t bits, uint8_t *idx, float *scale)
{
    if (bits == 1) {
        double a = 0;
        for (int32_t c = 0; c < d; c++)
            a += fabs((double)x[c]);
        *scale = (float)(a / d);
        for (int32_t c = 0; c < d; c++)
            idx[c] = x[c] >= 0 ? 1 : 0;
        return;
    }
    const int32_t L = 1 << bits;
    float m = 0;
    for (int32_t c = 0; c < d; c++)
        m = fabsf(x[c]) > m ? fabsf(x[c]) : m;
    const float s = 2.0f * m / (float)L;
    *scale = s;
    for (int32_t c = 0; c < d; c++) {
        int32_t i = s > 0 ? (int32_t)floorf(x[c] / s) + L / 2 : L / 2;
        idx[c] = (uint8_t)(i < 0 ? 0 : i > L - 1 ? L - 1 : i);
    }
}

void kvq_rt_resid_dequantize(const uint8_t *idx, float scale, int32_t d, int32_t bits, float *y)
{
    if (bits == 1) {
        for (int32_t c = 0; c < d; c++)
            y[c] = idx[c] ? scale : -scale;
        return;
    }
    const int32_t L = 1 << bits;
    for (int32_t c = 0; c < d; c++)
        y[c] = ((float)(idx[c] - L / 2) + 0.5f) * scale;
}

/* The key-space centroid of code c, or NULL (grouped codebooks have none; vq-postrope's
 * centroids are of rotated keys). */
static const float *centroid(const kvq_codebook *cb, int32_t c)
{
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const float *C = D->method == KVQ_CODEBOOK_VQ_POSTROPE ? NULL : kvq_codebook_key_codebook(cb);
    return C ? C + (size_t)c * D->dim : NULL;
}

void kvq_rt_resid_append(const kvq_retrieval *r, const kvq_codebook *cb, rt_head *H,
                         const float *keys, const int32_t *codes, int64_t first, int64_t n)
{
    const int32_t d = r->d, bits = r->p.resid_bits;
    float x[KVQ_ROPE_MAX_DIM];
    for (int64_t i = 0; i < n; i++) {
        const float *k = keys + (size_t)i * d;
        const float *c = centroid(cb, codes[i * kvq_codebook_get_desc(cb)->groups]);
        for (int32_t t = 0; t < d; t++)
            x[t] = c ? k[t] - c[t] : k[t];
        kvq_rt_resid_quantize(x, d, bits, H->rq + (size_t)(first + i) * d, H->rqs + first + i);
    }
}

/* The reconstruction c + r^ of row j (its code by row, its residual by token), rotated
 * by the token's position under ROPE.   y: [d] */
static void reconstruct(const rt_step *st, int64_t j, float *y)
{
    const kvq_retrieval *r = st->r;
    const rt_head *H = st->H;
    const kvq_codebook *cb = st->L->cb[st->head];
    const int32_t d = r->d;
    const int64_t t = kvq_rt_row_token(H, j);
    kvq_rt_resid_dequantize(H->rq + (size_t)t * d, H->rqs[t], d, r->p.resid_bits, y);
    const float *c = centroid(cb, H->codes[(size_t)j * kvq_codebook_get_desc(cb)->groups]);
    for (int32_t a = 0; c && a < d; a++)
        y[a] += c[a];
    if (r->p.positions == KVQ_POSITIONS_ROPE)
        kvq_rt_rotate(r, y, st->L->pos[t], y);
}

int64_t kvq_rt_resid_count(const kvq_retrieval *r, int64_t k, int64_t nc)
{
    if (r->p.resid_bits <= 0 || !(r->p.resid_wide > 1.0) || k >= nc)
        return k;
    /* at most half the candidates (KVQ_RT_RESID_MAX_SHARE), never fewer than k: the
     * stage's bytes stay under (d B / 8 + 4) / 2 per key at large budgets */
    double want = ceil(r->p.resid_wide * (double)k);
    const double cap = ceil(KVQ_RT_RESID_MAX_SHARE * (double)nc);
    want = want > cap ? (cap > (double)k ? cap : (double)k) : want;
    return want >= (double)nc ? nc : (int64_t)want;
}

int64_t kvq_rt_resid_stage(const rt_step *st, int32_t *rows, int64_t n, int64_t keep,
                           double *sel_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs;
    if (n <= 0)
        return 0;
    *sel_bytes += (double)n * ((double)d * r->p.resid_bits / 8.0 + 4.0);
    if (keep >= n)
        return n;
    /* the group's queries as the oracle scores: q R_i (ROPE) or q R_b, summed in head
     * order, or each head's for the maximum */
    const int max = r->p.group == KVQ_GROUP_MAX;
    const int32_t nq = max ? gs : 1;
    const float *qsrc = r->p.positions == KVQ_POSITIONS_ROPE ? S->qi : S->qb;
    float *q = S->rr; /* [gs, d] */
    memcpy(q, qsrc, sizeof(float) * (size_t)(max ? gs : 1) * d);
    for (int32_t g = 1; !max && g < gs; g++)
        for (int32_t t = 0; t < d; t++)
            q[t] += qsrc[(size_t)g * d + t];
    float y[KVQ_ROPE_MAX_DIM];
    for (int64_t a = 0; a < n; a++) {
        reconstruct(st, rows[a], y);
        float best = 0;
        for (int32_t g = 0; g < nq; g++) {
            double s = 0;
            for (int32_t t = 0; t < d; t++)
                s += (double)q[(size_t)g * d + t] * y[t];
            if (g == 0 || (float)s > best)
                best = (float)s;
        }
        S->scores[a] = best;
    }
    const int64_t m = kvq_rk_topk(r->p.isa, S->scores, n, keep, S->sel, S->work);
    for (int64_t i = 0; i < m; i++) /* S->sel ascending: compacts in place */
        rows[i] = rows[S->sel[i]];
    return m;
}
