/*
 * quest.c — the Quest selector: per page of quest_page tokens the per-channel min / max
 * of the post-RoPE keys; a candidate's score is its page's upper bound of q . k
 * (kvq_rk_quest_term; sum or max over the group's queries), top k.
 */
#include <stdlib.h>

#include "runtime/kernels/kernels.h"
#include "runtime/select/selector.h"

/* rt_head.sdata of the Quest selector. */
typedef struct quest_head {
    float *lo, *hi; /* [cap / quest_page + 1, d] per-channel min / max of each page */
} quest_head;

static int quest_reserve(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t cap)
{
    (void)L;
    if (!H->sdata && !(H->sdata = calloc(1, sizeof(quest_head))))
        return 0;
    quest_head *Q = H->sdata;
    const size_t d = (size_t)r->d, pages = (size_t)cap / (size_t)r->p.quest_page + 1;
    return kvq_rt_grow((void **)&Q->lo, pages * d * sizeof(float)) &&
           kvq_rt_grow((void **)&Q->hi, pages * d * sizeof(float));
}

static void quest_free_head(rt_head *H)
{
    quest_head *Q = H->sdata;
    if (Q) {
        free(Q->lo);
        free(Q->hi);
        free(Q);
    }
    H->sdata = NULL;
}

/* Quest: per-channel min / max of the post-RoPE keys of token j's page. */
static void quest_append_row(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t j)
{
    quest_head *Q = H->sdata;
    const int32_t d = r->d, pg = r->p.quest_page;
    const int64_t pi = j / pg;
    float *lo = Q->lo + (size_t)pi * d, *hi = Q->hi + (size_t)pi * d;
    float kr[KVQ_ROPE_MAX_DIM];
    kvq_rt_append_key(r, L, H, j, kr);
    for (int32_t c = 0; c < d; c++) {
        lo[c] = j % pg == 0 || kr[c] < lo[c] ? kr[c] : lo[c];
        hi[c] = j % pg == 0 || kr[c] > hi[c] ? kr[c] : hi[c];
    }
}

static kvq_status quest_append(kvq_retrieval *r, rt_layer *L, const kvq_attn_call *c,
                               int64_t past, kvq_err *err)
{
    (void)err;
    kvq_rt_append_rows(r, L, past, c->n, quest_append_row);
    return KVQ_OK;
}

static void quest_scores(const rt_step *st, float *scores, double *bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const quest_head *Q = st->H->sdata;
    const int32_t d = r->d, gs = r->gs, pg = r->p.quest_page;
    const int max = r->p.group == KVQ_GROUP_MAX;
    const int64_t j0 = st->s_end, j1 = st->w_beg;
    int64_t pages = 0;
    for (int64_t pbeg = j0 - j0 % pg; pbeg < j1; pbeg += pg, pages++) {
        const int64_t pi = pbeg / pg;
        const float *lo = Q->lo + (size_t)pi * d, *hi = Q->hi + (size_t)pi * d;
        float agg = 0;
        for (int32_t h = 0; h < gs; h++) {
            const float *q = S->qi + (size_t)h * d;
            float b = 0;
            for (int32_t c = 0; c < d; c++)
                b += kvq_rk_quest_term(q[c], lo[c], hi[c]);
            agg = h == 0 ? b : max ? (b > agg ? b : agg) : agg + b;
        }
        const int64_t a = pbeg > j0 ? pbeg : j0, e = pbeg + pg < j1 ? pbeg + pg : j1;
        for (int64_t j = a; j < e; j++)
            scores[j - j0] = agg;
    }
    *bytes += (double)pages * 2.0 * d * sizeof(float);
}

static int64_t quest_select(const rt_step *st, int64_t k, int32_t *sel, double *sel_bytes,
                           double *cb_bytes)
{
    (void)cb_bytes;
    return kvq_rt_select_scored(st, k, sel, quest_scores, sel_bytes);
}

static double quest_bits(const kvq_retrieval_params *p, const kvq_codebook_set *rt, int32_t d)
{
    (void)rt;
    return 2.0 * d * 32.0 / (double)p->quest_page;
}

/* Bytes per row: a page's bounds shared by its quest_page rows. */
static double quest_row_bytes(const kvq_retrieval *r, const rt_layer *L, const rt_head *H)
{
    (void)L;
    return H->sdata ? 2.0 * r->d * sizeof(float) / (double)r->p.quest_page : 0;
}

const rt_selector kvq_rt_selector_quest = {
    .id = KVQ_SELECT_QUEST,
    .name = "quest",
    .reserve = quest_reserve,
    .free_head = quest_free_head,
    .append = quest_append,
    .select = quest_select,
    .bits_per_key = quest_bits,
    .row_bytes = quest_row_bytes,
};
