/*
 * select.c — the registry of retrieval selectors and what they share: which candidates
 * of one step (query row, layer, KV head) are attended. Every selector scores the
 * candidates [s_end, w_beg) and keeps the best, by its table (selector.h); see
 * kvq/runtime.h for the definitions and the GQA rule (sum, or max, over the group's
 * query heads).
 *
 * The step (step.c) has already filled S->qb (q R_b) and S->qi (q R_i) for the group's
 * query heads.
 */
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"
#include "runtime/kernels/rk.h"
#include "runtime/select/selector.h"

/* The registry: one line per selector, its kvq_selector value and its table (defined
 * in the selector's own file). */
#define KVQ_RT_SELECTORS(X)                                                                   \
    X(KVQ_SELECT_FULL, kvq_rt_selector_full)         /* full.c */                             \
    X(KVQ_SELECT_ORACLE, kvq_rt_selector_oracle)     /* oracle.c */                           \
    X(KVQ_SELECT_CODEBOOK, kvq_rt_selector_codebook) /* codebook/codebook.c */                \
    X(KVQ_SELECT_FIER, kvq_rt_selector_fier)         /* fier.c */                             \
    X(KVQ_SELECT_QUEST, kvq_rt_selector_quest)       /* quest.c */                            \
    X(KVQ_SELECT_MASS, kvq_rt_selector_mass)         /* mass.c */

#define DECLARE(id, table) extern const rt_selector table;
#define ENTRY(id, table) [id] = &table,
KVQ_RT_SELECTORS(DECLARE)
static const rt_selector *const registry[KVQ_SELECT_COUNT] = {KVQ_RT_SELECTORS(ENTRY)};

const rt_selector *kvq_rt_selector(kvq_selector id)
{
    return (unsigned)id < KVQ_SELECT_COUNT ? registry[id] : NULL;
}

/* Sum of the group's query rows.   q: [gs, d] -> out: [d] */
void kvq_rt_group_sum(const float *q, int32_t gs, int32_t d, float *out)
{
    memcpy(out, q, sizeof(float) * (size_t)d);
    for (int32_t g = 1; g < gs; g++)
        for (int32_t t = 0; t < d; t++)
            out[t] += q[(size_t)g * d + t];
}

int64_t kvq_rt_select_all(const rt_step *st, int32_t *sel)
{
    for (int64_t j = 0; j < st->nc; j++)
        sel[j] = (int32_t)(st->s_end + j);
    return st->nc;
}

int64_t kvq_rt_select_top(const rt_step *st, int64_t k, int32_t *sel)
{
    const int64_t n = kvq_rk_topk(st->r->p.isa, st->S->scores, st->nc, k, sel, st->S->work);
    for (int64_t j = 0; j < n; j++)
        sel[j] += (int32_t)st->s_end;
    return n;
}

int64_t kvq_rt_select_scored(const rt_step *st, int64_t k, int32_t *sel,
                             void (*score)(const rt_step *st, float *scores, double *bytes),
                             double *bytes)
{
    if (st->nc <= 0)
        return 0;
    if (k >= st->nc)
        return kvq_rt_select_all(st, sel);
    score(st, st->S->scores, bytes);
    return kvq_rt_select_top(st, k, sel);
}

void kvq_rt_append_rows(const kvq_retrieval *r, const rt_layer *L, int64_t past, int64_t n,
                        void (*row)(const kvq_retrieval *r, const rt_layer *L, rt_head *H,
                                    int64_t j))
{
    for (int32_t h = 0; h < r->n_kv; h++)
        for (int64_t i = 0; i < n; i++)
            row(r, L, &L->head[h], past + i);
}

int64_t kvq_rt_select(const rt_step *st, kvq_selector selector, int64_t k, int32_t *sel,
                      double *sel_bytes, double *codebook_bytes)
{
    st->S->rr_kept = 0; /* set by the rerank when it hands its logits to the attention */
    const rt_selector *s = kvq_rt_selector(selector);
    /* Layers without codebooks attend fully (the format's rule for absent layers). */
    if (s->needs_artifact && !st->L->cb[st->head])
        s = registry[KVQ_SELECT_FULL];
    return s->select(st, k, sel, sel_bytes, codebook_bytes);
}
