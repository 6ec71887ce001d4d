/*
 * codes.c — what the codebook selector (codebook.c) and the mass selector (mass.c) share
 * (codes.h): the keys' codes by row and their per-code counts, the encoder's buffers and
 * the first stage's backend of a context, the first stage's scratch of a thread, and the
 * first stage's scores of the candidates.
 */
#include <stdlib.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"
#include "runtime/kernels/rk.h"
#include "runtime/select/codebook/codebook.h"
#include "runtime/select/codebook/codes.h"
#include "runtime/select/selector.h"

/* ==========================================================================
 * Per head: codes and code counts
 * ========================================================================== */

int kvq_rt_codes_reserve(const kvq_retrieval *r, const rt_layer *L, rt_codes_head *C, int64_t cap)
{
    const int G = r->rt && L->cb[0] ? kvq_codebook_get_desc(L->cb[0])->groups : 0;
    return !G || kvq_rt_grow((void **)&C->codes, (size_t)cap * (size_t)G * sizeof *C->codes);
}

double kvq_rt_codes_row_bytes(const kvq_retrieval *r, const rt_layer *L)
{
    const int G = r->rt && L->cb[0] ? kvq_codebook_get_desc(L->cb[0])->groups : 0;
    return (double)G * sizeof(uint16_t);
}

void kvq_rt_codes_free(rt_codes_head *C)
{
    free(C->codes);
    free(C->hist);
    C->codes = NULL;
    C->hist = NULL;
}

void kvq_rt_codes_reset_head(const kvq_retrieval *r, const rt_layer *L, int32_t h, rt_head *H)
{
    (void)r;
    rt_codes_head *C = kvq_rt_codes(H);
    if (C && C->hist)
        memset(C->hist, 0, sizeof(uint32_t) * (size_t)kvq_codebook_get_desc(L->cb[h])->k);
}

/* The chunk's codes (one kvq_codebook_encode per head) and code counts, the selector's
 * own per-head part (head), and the device's copy of the codes. */
kvq_status kvq_rt_codes_append(kvq_retrieval *r, rt_layer *L, const kvq_attn_call *c, int64_t past,
                               void (*head)(const kvq_retrieval *r, const rt_layer *L, int32_t h,
                                            const float *keys, const int32_t *codes,
                                            const int64_t *pos, int64_t past, int64_t n),
                               kvq_err *err)
{
    rt_codes_ctx *X = kvq_rt_codes_ctx(r);
    const int64_t n = c->n, d = r->d, kvd = (int64_t)r->n_kv * d;
    kvq_status s;
    if (!L->cb[0])
        return KVQ_OK;
    const int32_t G = kvq_codebook_get_desc(L->cb[0])->groups;
    if (n > X->buf_rows) {
        if (!kvq_rt_grow((void **)&X->kbuf, (size_t)n * d * sizeof(float)) ||
            !kvq_rt_grow((void **)&X->cbuf, (size_t)n * G * sizeof(int32_t)) ||
            !kvq_rt_grow((void **)&X->pbuf, (size_t)n * sizeof(int32_t)))
            return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
        X->buf_rows = n;
    }
    for (int64_t i = 0; i < n; i++)
        X->pbuf[i] = (int32_t)c->pos[i];
    for (int32_t h = 0; h < r->n_kv; h++) {
        rt_codes_head *C = kvq_rt_codes(&L->head[h]);
        /* the pre-RoPE key as a pre-RoPE cache holds it (f16-rounded in an f16
         * cache; under ROPE the stored row is the rotated key, keys.c): the same codes
         * under both position modes, and the fit assigned exactly these values when
         * they are f32 */
        for (int64_t i = 0; i < n; i++)
            kvq_rt_key_pre(r, c->k + i * kvd + h * d, X->kbuf + i * d);
        kvq_err e = {0};
        if ((s = kvq_codebook_encode(L->cb[h], X->kbuf, X->pbuf, n, 1, X->cbuf, &e)))
            return kvq_err_set(err, s, "retrieval: layer %d head %d: %s", (int)c->layer, (int)h,
                               e.msg);
        for (int64_t i = 0; i < n * G; i++)
            C->codes[(size_t)past * G + i] = (uint16_t)X->cbuf[i];
        if (head)
            head(r, L, h, X->kbuf, X->cbuf, c->pos, past, n);
        if (G == 1) { /* per-code counts for kvq_rk_topk_codes */
            if (!C->hist &&
                !(C->hist = calloc((size_t)kvq_codebook_get_desc(L->cb[h])->k,
                                   sizeof *C->hist)))
                return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
            for (int64_t i = 0; i < n; i++)
                C->hist[X->cbuf[i]]++;
        }
        if (X->be->codes && (s = X->be->codes(r, L, c->layer, h, past, n, err)))
            return s;
    }
    return KVQ_OK;
}

const uint16_t *kvq_retrieval_codes(const kvq_retrieval *r, int32_t layer, int32_t head, int64_t j)
{
    if (layer < 0 || layer >= r->n_layers || head < 0 || head >= r->n_kv)
        return NULL;
    const rt_layer *L = &r->layer[layer];
    const rt_head *H = &L->head[head];
    const int cbsel = r->p.selector == KVQ_SELECT_CODEBOOK || r->p.selector == KVQ_SELECT_MASS;
    if (!cbsel || !H->sdata || !kvq_rt_codes(H)->codes || j < 0 || j >= L->len || !L->cb[head])
        return NULL;
    int64_t row = j;
    if (H->tok && j >= r->p.sink && j < H->sorted_end) /* find the row (a linear search) */
        for (row = r->p.sink; H->tok[row] != j; row++)
            ;
    return kvq_rt_codes(H)->codes + (size_t)row * kvq_codebook_get_desc(L->cb[head])->groups;
}

/* ==========================================================================
 * Per context and per thread
 * ========================================================================== */

kvq_status kvq_rt_codes_open(kvq_retrieval *r, kvq_err *err)
{
    if (!(r->sstate = calloc(1, sizeof(rt_codes_ctx))))
        return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory");
    return kvq_rt_backend_open(r, err);
}

void kvq_rt_codes_close(kvq_retrieval *r)
{
    rt_codes_ctx *X = kvq_rt_codes_ctx(r);
    if (!X)
        return;
    if (X->be && X->be->fini)
        X->be->fini(r);
    free(X->kbuf);
    free(X->cbuf);
    free(X->pbuf);
    free(X);
    r->sstate = NULL;
}

int kvq_rt_codes_scratch(const kvq_retrieval *r, rt_codes_scratch *X)
{
    if (X->lut)
        return 1;
    size_t lut = 1;
    for (int32_t l = 0; l < r->n_layers; l++)
        if (r->layer[l].cb[0]) {
            const kvq_codebook_desc *D = kvq_codebook_get_desc(r->layer[l].cb[0]);
            lut = (size_t)D->groups * D->k;
            break;
        }
    return kvq_rt_grow((void **)&X->lut, lut * sizeof(float)) &&
           kvq_rt_grow((void **)&X->cwork, 4 * lut * sizeof(uint32_t));
}

void kvq_rt_codes_scratch_free(rt_codes_scratch *X)
{
    free(X->lut);
    free(X->cwork);
    X->lut = NULL;
    X->cwork = NULL;
}

/* ==========================================================================
 * The first stage's scores: the LUT of the scoring query over the codes
 * ========================================================================== */

void kvq_rt_codebook_scores(const rt_step *st, float *scores, double *cb_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    float *lut = kvq_rt_codes_scr(S)->lut;
    const kvq_codebook *cb = st->L->cb[st->head];
    const kvq_rk_table *tab = st->L->tab[st->head];
    const kvq_codebook_desc *D = kvq_codebook_get_desc(cb);
    const int32_t d = r->d, gs = r->gs, G = D->groups, K = D->k;
    const uint16_t *codes = kvq_rt_codes(st->H)->codes + (size_t)st->s_end * G;
    float qs[KVQ_ROPE_MAX_DIM];
    int64_t a, b;
    kvq_rt_candidate_distances(st, &a, &b);
    if (r->p.score_pos == KVQ_SCORE_BANDS && D->method != KVQ_CODEBOOK_VQ_POSTROPE) {
        /* sum (or max) over the group of the per-band scores */
        for (int32_t g = 0; g < (r->p.group == KVQ_GROUP_SUM ? 1 : gs); g++) {
            if (r->p.group == KVQ_GROUP_SUM)
                kvq_rt_group_sum(st->q, gs, d, qs);
            else
                memcpy(qs, st->q + (size_t)g * d, sizeof(float) * (size_t)d);
            kvq_rt_banded_scores(st, qs, g ? S->tmp : scores, cb_bytes);
            for (int64_t j = 0; g && j < st->nc; j++)
                scores[j] = S->tmp[j] > scores[j] ? S->tmp[j] : scores[j];
        }
        return;
    }
    if (r->p.group == KVQ_GROUP_SUM) {
        for (int32_t g = 0; g < gs; g++)
            kvq_rt_scoring_query(st, cb, st->q + (size_t)g * d, a, b, S->qx + (size_t)g * d);
        kvq_rt_group_sum(S->qx, gs, d, qs);
        kvq_rk_lut(r->p.isa, tab, qs, lut);
        kvq_rk_score(r->p.isa, lut, G, K, codes, st->nc, scores);
        *cb_bytes += (double)kvq_rk_table_bytes(tab);
        return;
    }
    for (int32_t g = 0; g < gs; g++) {
        kvq_rt_scoring_query(st, cb, st->q + (size_t)g * d, a, b, qs);
        kvq_rk_lut(r->p.isa, tab, qs, lut);
        kvq_rk_score(r->p.isa, lut, G, K, codes, st->nc, g ? S->tmp : scores);
        for (int64_t j = 0; g && j < st->nc; j++)
            scores[j] = S->tmp[j] > scores[j] ? S->tmp[j] : scores[j];
        *cb_bytes += (double)kvq_rk_table_bytes(tab);
    }
}
