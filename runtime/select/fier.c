/*
 * fier.c — the FIER selector: each cached key's post-RoPE channels quantized to one bit
 * against its group's per-channel range (groups of fier_group tokens: min and max kept
 * in f32), scored by kvq_rk_fier_score; sum or max over the group's queries, top k.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/kernels/kernels.h"
#include "runtime/select/selector.h"

/* Bytes of one key's bits. */
#define FIER_BYTES(d) (((d) + 7) / 8)

/* rt_head.sdata of the FIER selector. */
typedef struct fier_head {
    uint8_t *bits;   /* [cap, FIER_BYTES(d)] 1-bit post-RoPE keys */
    float *lo, *hi;  /* [cap / fier_group + 1, d] per-channel min / max of each group */
    float *grp;      /* [min(fier_group, cap), d] the last group's rotated keys (a moved
                        range re-quantizes them: no cached row is read back) */
} fier_head;

static int fier_reserve(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t cap)
{
    (void)L;
    if (!H->sdata && !(H->sdata = calloc(1, sizeof(fier_head))))
        return 0;
    fier_head *F = H->sdata;
    const size_t d = (size_t)r->d, c = (size_t)cap, groups = c / (size_t)r->p.fier_group + 1;
    const size_t g = (size_t)r->p.fier_group < c ? (size_t)r->p.fier_group : c;
    return kvq_rt_grow((void **)&F->bits, c * (size_t)FIER_BYTES(r->d)) &&
           kvq_rt_grow((void **)&F->lo, groups * d * sizeof(float)) &&
           kvq_rt_grow((void **)&F->hi, groups * d * sizeof(float)) &&
           kvq_rt_grow((void **)&F->grp, g * d * sizeof(float));
}

static void fier_free_head(rt_head *H)
{
    fier_head *F = H->sdata;
    if (F) {
        free(F->bits);
        free(F->lo);
        free(F->hi);
        free(F->grp);
        free(F);
    }
    H->sdata = NULL;
}

/* Fier: after token j was stored, update its group's per-channel range of the
 * post-RoPE keys; when the range moves, re-quantize the group's earlier tokens (their
 * keys kept in F->grp from their own append: the exact keys, as the cache dtype holds
 * them, with or without the context's rows). */
static void fier_append_row(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t j)
{
    fier_head *F = H->sdata;
    const int32_t d = r->d, fg = r->p.fier_group, db = FIER_BYTES(d);
    const int64_t g = j / fg, first = g * fg;
    float *lo = F->lo + (size_t)g * d, *hi = F->hi + (size_t)g * d;
    float *kr = F->grp + (size_t)(j - first) * d; /* rows are tokens in order here */
    kvq_rt_append_key(r, L, H, j, kr);
    int moved = 0;
    if (j == first) {
        memcpy(lo, kr, sizeof(float) * (size_t)d);
        memcpy(hi, kr, sizeof(float) * (size_t)d);
    } else {
        for (int32_t c = 0; c < d; c++) {
            if (kr[c] < lo[c]) {
                lo[c] = kr[c];
                moved = 1;
            }
            if (kr[c] > hi[c]) {
                hi[c] = kr[c];
                moved = 1;
            }
        }
    }
    for (int64_t t = moved ? first : j; t <= j; t++) {
        const float *kt = F->grp + (size_t)(t - first) * d;
        uint8_t *b = F->bits + (size_t)t * db;
        memset(b, 0, (size_t)db);
        for (int32_t c = 0; c < d; c++)
            if (kvq_rk_fier_bit(kt[c], lo[c], hi[c]))
                b[c >> 3] |= (uint8_t)(1u << (c & 7));
    }
}

static kvq_status fier_append(kvq_retrieval *r, rt_layer *L, const kvq_attn_call *c,
                              int64_t past, kvq_err *err)
{
    (void)err;
    kvq_rt_append_rows(r, L, past, c->n, fier_append_row);
    return KVQ_OK;
}

static void fier_scores(const rt_step *st, float *scores, double *bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const fier_head *F = st->H->sdata;
    const int32_t d = r->d, gs = r->gs, fg = r->p.fier_group, db = FIER_BYTES(d);
    const int max = r->p.group == KVQ_GROUP_MAX;
    const int32_t nq = max ? gs : 1;
    if (max)
        memcpy(S->qx, S->qi, sizeof(float) * (size_t)gs * d);
    else
        kvq_rt_group_sum(S->qi, gs, d, S->qx);
    float qs[KVQ_ROPE_MAX_DIM];
    const int64_t j0 = st->s_end, j1 = st->w_beg;
    int64_t groups = 0;
    for (int64_t gbeg = j0 - j0 % fg; gbeg < j1; gbeg += fg, groups++) {
        const int64_t gi = gbeg / fg;
        const float *lo = F->lo + (size_t)gi * d, *hi = F->hi + (size_t)gi * d;
        const int64_t a = gbeg > j0 ? gbeg : j0, b = gbeg + fg < j1 ? gbeg + fg : j1;
        for (int32_t h = 0; h < nq; h++) {
            const float *q = S->qx + (size_t)h * d;
            float off = 0;
            for (int32_t c = 0; c < d; c++) {
                off += q[c] * lo[c];
                qs[c] = q[c] * (hi[c] - lo[c]);
            }
            for (int64_t j = a; j < b; j++) {
                const float s = kvq_rk_fier_score(F->bits + (size_t)j * db, qs, off, d);
                if (h == 0 || s > scores[j - j0])
                    scores[j - j0] = s;
            }
        }
    }
    *bytes += (double)st->nc * db + (double)groups * 2.0 * d * sizeof(float);
}

static int64_t fier_select(const rt_step *st, int64_t k, int32_t *sel, double *sel_bytes,
                          double *cb_bytes)
{
    (void)cb_bytes;
    return kvq_rt_select_scored(st, k, sel, fier_scores, sel_bytes);
}

static double fier_bits(const kvq_retrieval_params *p, const kvq_codebook_set *rt, int32_t d)
{
    (void)rt;
    return (double)d + 2.0 * d * 32.0 / (double)p->fier_group;
}

/* Bytes per row: its bits, and a group's ranges shared by its fier_group rows. */
static double fier_row_bytes(const kvq_retrieval *r, const rt_layer *L, const rt_head *H)
{
    (void)L;
    return H->sdata ? FIER_BYTES(r->d) + 2.0 * r->d * sizeof(float) / (double)r->p.fier_group
                    : 0;
}

const rt_selector kvq_rt_selector_fier = {
    .id = KVQ_SELECT_FIER,
    .name = "fier",
    .reserve = fier_reserve,
    .free_head = fier_free_head,
    .append = fier_append,
    .select = fier_select,
    .bits_per_key = fier_bits,
    .row_bytes = fier_row_bytes,
};
