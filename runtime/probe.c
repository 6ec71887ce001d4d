/*
 * probe.c — kvq_retrieval_probe (kvq/runtime.h): one cached query row measured under
 * several selector settings at once. The cache (keys, values, codes, row order) is the
 * same for every budget and tau of the codebook and mass selectors, and so is the exact
 * attention the measurement compares with: both are made once, and each setting runs
 * only its own retrieval step (selection and the attention over what it selected), the
 * step of retrieval.c under the setting's parameters. So the figures are those of a
 * context created with each setting attending the row alone (tests/test_runtime_probe.c),
 * at the cost of one exact attention plus one step per setting, where the separate
 * contexts re-encode every key and attend exactly once per setting.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/runtime.h"
#include "kvq/util.h"
#include "runtime/runtime_internal.h"
#include "runtime/select/codebook/codebook.h"
#include "runtime/kernels/kernels.h"
#include "runtime/select/mass.h"

/* The keys of one layer rotated by their positions, by token, for every KV head:
 * converted and rotated once per token of a sequence, not once per probed row. */
struct rt_probe {
    int32_t layer;
    uint64_t gen;  /* r->seq_gen they belong to */
    int64_t valid; /* tokens [0, valid) hold */
    int64_t cap;
    float **k;     /* [n_kv][cap, d] */
    int32_t n_kv;
    rt_mass_memo *memo; /* the mass steps of one (row, head): scores and exponentials */
    float *lgi, *lgb;   /* [gs, lcap], [gs + 1, lcap] the steps' logits (rt_logit_memo) */
    float *qb;          /* [gs + 1, d] */
    int64_t lcap;
    rt_sign_memo *sign; /* the residual stage's sign table of one (row, head) */
    rt_rank_memo *rank; /* the rows by the rerank's score (one (row, head)) */
};

void kvq_rt_probe_free(struct rt_probe *p)
{
    if (!p)
        return;
    for (int32_t h = 0; p->k && h < p->n_kv; h++)
        free(p->k[h]);
    free(p->k);
    kvq_rt_mass_memo_free(p->memo);
    free(p->lgi);
    free(p->lgb);
    free(p->qb);
    free(p->sign);
    kvq_rt_rank_memo_free(p->rank);
    free(p);
}

/* Brings r->probe up to the nvis tokens of `layer`. KVQ_E_NOMEM. */
static kvq_status probe_keys(kvq_retrieval *r, int32_t layer, int64_t nvis, kvq_err *err)
{
    struct rt_probe *P = r->probe;
    if (!P) {
        if (!(P = r->probe = calloc(1, sizeof *P)) ||
            !(P->k = calloc((size_t)r->n_kv, sizeof *P->k)) ||
            !(P->memo = kvq_rt_mass_memo_new()) ||
            !(P->sign = calloc(1, sizeof *P->sign)) || !(P->rank = kvq_rt_rank_memo_new()) ||
            !(P->qb = malloc(sizeof(float) * (size_t)(r->gs + 1) * (size_t)r->d)))
            return kvq_err_set(err, KVQ_E_NOMEM, "retrieval probe: out of memory");
        P->n_kv = r->n_kv;
    }
    if (P->layer != layer || P->gen != r->seq_gen || P->valid > nvis)
        P->valid = 0;
    P->layer = layer;
    P->gen = r->seq_gen;
    const size_t d = (size_t)r->d;
    if (nvis > P->cap) {
        const int64_t cap = nvis > 2 * P->cap ? nvis : 2 * P->cap;
        for (int32_t h = 0; h < r->n_kv; h++) {
            float *k = realloc(P->k[h], sizeof(float) * (size_t)cap * d);
            if (!k)
                return kvq_err_set(err, KVQ_E_NOMEM, "retrieval probe: out of memory");
            P->k[h] = k;
        }
        P->cap = cap;
    }
    if (nvis > P->lcap) {
        const size_t gs = (size_t)r->gs;
        float *a = realloc(P->lgi, sizeof(float) * gs * (size_t)P->cap);
        if (a)
            P->lgi = a;
        float *b = a ? realloc(P->lgb, sizeof(float) * (gs + 1) * (size_t)P->cap) : NULL;
        if (!b)
            return kvq_err_set(err, KVQ_E_NOMEM, "retrieval probe: out of memory");
        P->lgb = b;
        P->lcap = P->cap;
    }
    const rt_layer *L = &r->layer[layer];
    for (int32_t h = 0; h < r->n_kv && P->valid < nvis; h++)
        for (int64_t j = 0; j < nvis; j++) { /* rows in code order hold earlier tokens */
            const int64_t t = kvq_rt_row_token(&L->head[h], j);
            if (t >= P->valid)
                kvq_rt_key_rotated(r, L, &L->head[h], j, P->k[h] + (size_t)t * d);
        }
    P->valid = nvis;
    return KVQ_OK;
}

/* Settings the context's cache serves as a context of their own would hold it: the
 * context's selector, or codebook and mass for each other (the same codes and row
 * order). Full and oracle contexts keep rows in token order, which would change the
 * float sums of a context in code order. */
static int setting_fits(kvq_selector ctx, const kvq_retrieval_setting *s)
{
    const int coded = ctx == KVQ_SELECT_CODEBOOK || ctx == KVQ_SELECT_MASS;
    if (s->selector == KVQ_SELECT_CODEBOOK || s->selector == KVQ_SELECT_MASS)
        return coded;
    return s->selector == ctx;
}

static kvq_status check_probe(const kvq_retrieval *r, int32_t layer, const float *q,
                              int32_t n_set, const kvq_retrieval_setting *set,
                              const kvq_retrieval_stats *stats, kvq_err *err)
{
    if (!r || !q || n_set < 0 || (n_set > 0 && (!set || !stats)))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval probe: bad call");
    if (layer < 0 || layer >= r->n_layers || r->layer[layer].len < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "retrieval probe: layer %d holds no token to measure", (int)layer);
    if (!r->p.measure)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "retrieval probe: the context was created without measure");
    if (r->kvc) /* it reads the context's own rows, which it does not hold then */
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "retrieval probe: not over a compressed KV "
                           "cache (kvq_retrieval_set_kvcache)");
    for (int32_t c = 0; c < n_set; c++) {
        const kvq_retrieval_setting *s = &set[c];
        if (!setting_fits(r->p.selector, s))
            return kvq_err_set(err, KVQ_E_INVALID_ARG,
                               "retrieval probe: setting %d: selector %s on a context of "
                               "selector %s",
                               (int)c, kvq_selector_name(s->selector),
                               kvq_selector_name(r->p.selector));
        if (s->budget.count < 0 || (s->budget.count == 0 && !(s->budget.fraction > 0.0 &&
                                                              s->budget.fraction <= 1.0)))
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "retrieval probe: setting %d: bad budget",
                               (int)c);
        if (s->selector == KVQ_SELECT_MASS && !(s->tau > 0.0 && s->tau <= 1.0))
            return kvq_err_set(err, KVQ_E_INVALID_ARG,
                               "retrieval probe: setting %d: tau %g not in (0, 1]", (int)c, s->tau);
    }
    return KVQ_OK;
}

/* The far logits of the steps (rt_logit_memo.lgb): the group's queries rotated by R_b
 * (as retrieval.c's rotate_queries), then under KVQ_GROUP_SUM with gs < 4 their sum in
 * head order (as rerank.c's exact_logits), against the stored keys of rows [lo, nvis);
 * M->nqb set. */
static void far_logits(const kvq_retrieval *r, const rt_head *H, const float *q, int64_t lo,
                       int64_t nvis, float *qb, float *lgb, rt_logit_memo *M)
{
    const int32_t d = r->d, gs = r->gs;
    const int32_t nq = r->p.group == KVQ_GROUP_SUM && gs < 4 ? gs + 1 : gs;
    for (int32_t g = 0; g < gs; g++)
        kvq_rk_rotate(q + (size_t)g * d, r->bcos, r->bsin, (int)r->rope.layout, d,
                      qb + (size_t)g * d);
    if (nq > gs) {
        float *qs = qb + (size_t)gs * d;
        memcpy(qs, qb, sizeof(float) * (size_t)d);
        for (int32_t g = 1; g < gs; g++)
            for (int32_t t = 0; t < d; t++)
                qs[t] += qb[(size_t)g * d + t];
    }
    const int64_t nv = nvis - lo;
    kvq_rk_logits(r->p.isa, qb, nq, d, (const char *)H->k + (size_t)lo * d * r->es,
                  r->p.cache_dtype, d, NULL, nv, 1.0f, lgb, nv);
    M->nqb = nq;
}

/* Exact attention of the row's group over the visible rows [lo, nvis) of H (as the
 * step's measurement computes it): probabilities into S->pfull [gs, nvis - lo], outputs
 * into S->ofull [gs, d]; the logits before the softmax into lgi [gs, nvis - lo]. */
static void exact_row(const kvq_retrieval *r, const rt_layer *L, const rt_head *H,
                      const float *ktok, const float *q, int64_t pos, int64_t lo, int64_t nvis,
                      rt_scratch *S, float *lgi)
{
    const int32_t d = r->d, gs = r->gs;
    const int64_t nv = nvis - lo;
    const float scale = r->scale; /* the model's score scale (archs-rt) */
    for (int32_t g = 0; g < gs; g++)
        kvq_rt_rotate(r, q + (size_t)g * d, pos, S->qi + (size_t)g * d);
    /* row j's key is token kvq_rt_row_token(H, j)'s of ktok: gathered by the kernel (the
     * same values as from a copy in row order) */
    kvq_rk_logits(r->p.isa, S->qi, gs, d, H->tok ? ktok : ktok + (size_t)lo * d, KVQ_DT_F32, d,
                  H->tok ? H->tok + lo : NULL, nv, scale, S->pfull, nv);
    memcpy(lgi, S->pfull, sizeof(float) * (size_t)gs * (size_t)nv);
    kvq_rt_softcap(S->pfull, gs, nv, nv, r->softcap);
    kvq_rk_softmax(r->p.isa, S->pfull, gs, nv, nv);
    kvq_rk_mix(r->p.isa, S->pfull, gs, nv, (const char *)H->v + (size_t)lo * d * r->es,
               r->p.cache_dtype, d, NULL, nv, d, S->ofull);
}

kvq_status kvq_retrieval_probe(kvq_retrieval *r, int32_t layer, const float *q, int32_t n_set,
                               const kvq_retrieval_setting *set, kvq_retrieval_stats *stats,
                               kvq_err *err)
{
    kvq_status s = check_probe(r, layer, q, n_set, set, stats, err);
    if (s || (s = probe_keys(r, layer, r->layer[layer].len, err)))
        return s;
    const rt_layer *L = &r->layer[layer];
    const int64_t nvis = L->len, pos = L->pos[nvis - 1];
    const int32_t d = r->d, gs = r->gs;
    const kvq_model_config mc = {.sliding_window = r->sliding_window,
                                 .sliding_from = r->sliding_from};
    const int64_t lo = kvq_model_window_start(&mc, layer, nvis);
    rt_scratch *S = &r->scr[0];
    float *o = malloc(sizeof(float) * (size_t)gs * d);
    double *f2 = malloc(sizeof(double) * (size_t)gs);
    if (!o || !f2) {
        free(o);
        free(f2);
        return kvq_err_set(err, KVQ_E_NOMEM, "retrieval probe: out of memory");
    }
    memset(stats, 0, sizeof *stats * (size_t)n_set);
    const rt_sums saved = S->sums; /* the context's pending sums stay as they were */
    kvq_retrieval rc = *r;         /* the context under each setting's parameters */
    rt_logit_memo M;               /* the steps' logits of the current head */
    rc.p.measure = 0;              /* measured here, against one exact attention */
    S->status = KVQ_OK;
    int rerank = 0; /* a codebook setting reranks (rerank.c): its top k from one order */
    for (int32_t c = 0; c < n_set; c++)
        rerank |= set[c].selector == KVQ_SELECT_CODEBOOK && kvq_rt_rerank_on(&r->p) &&
                  r->p.positions != KVQ_POSITIONS_ROPE;
    for (int32_t h = 0; h < r->n_kv; h++) {
        const float *qh = q + (size_t)h * gs * d;
        const float *ktok = r->probe->k[h];
        exact_row(r, L, &L->head[h], ktok, qh, pos, lo, nvis, S, r->probe->lgi);
        M = (rt_logit_memo){.lo = lo, .nv = nvis - lo, .lgi = r->probe->lgi, .lgb = r->probe->lgb,
                            .sign = r->probe->sign};
        r->probe->sign->have = 0; /* a new row or head: built again on its first step */
        if (!r->keys_rotated) { /* under ROPE the steps read lgi only (the stored rows are
                                 * rotated keys, which q R_b must not meet) */
            far_logits(r, &L->head[h], qh, lo, nvis, r->probe->qb, r->probe->lgb, &M);
            if (rerank && kvq_rt_rank_memo_build(r->probe->rank, M.lgb, nvis - lo, M.nqb, gs,
                                                 r->p.group == KVQ_GROUP_MAX))
                M.rank = r->probe->rank; /* out of memory: kvq_rk_topk per step */
        }
        S->lg_memo = &M; /* the steps' logits, gathered */
        S->ktok = ktok; /* the steps' keys from the same table */
        S->mass_memo = r->probe->memo; /* the mass steps' scores, exponentials */
        kvq_rt_mass_memo_next(S->mass_memo);
        kvq_rt_exact_norms(S, gs, d, f2);
        for (int32_t c = 0; c < n_set; c++) {
            rc.p.selector = set[c].selector;
            rc.p.budget = set[c].budget;
            rc.p.tau = set[c].tau;
            memset(&S->sums, 0, sizeof S->sums);
            kvq_rt_step(&rc, layer, h, qh, pos, nvis, 0, S, o, d);
            if (S->sums.steps) /* a step with candidates: counted and measured (as a
                                  * measured context's step, without the oracle's recall) */
                kvq_rt_measure_output(S, gs, d, lo, nvis - lo, S->att,
                                      (int64_t)S->sums.attended, o, f2, &S->sums);
            kvq_retrieval_stats_add(&stats[c], &S->sums);
        }
    }
    S->ktok = NULL;
    S->lg_memo = NULL;
    S->mass_memo = NULL;
    S->sums = saved;
    free(o);
    free(f2);
    if (S->status) {
        s = kvq_err_set(err, S->status, "%s", S->err.msg);
        S->status = KVQ_OK;
    }
    return s;
}
