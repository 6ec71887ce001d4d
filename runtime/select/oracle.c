/*
 * oracle.c — the oracle selector: the exact scores of the candidates under the position
 * mode (q R_b . k_j on the stored keys under WROPE, q R_i . k_j R_j under ROPE; sum or
 * max over the group), top k. It reads every candidate's key row: the reference the
 * others are measured against (kvq_retrieval_params.measure's recall). Over a compressed
 * cache (kvq_retrieval_set_kvcache) it scores the keys the cache holds (decoded by
 * kvq_kvcache_row; pruned tokens score -inf): the oracle over what the cache holds.
 */
#include <math.h>
#include <string.h>

#include "runtime/kernels/rk.h"
#include "runtime/select/selector.h"

static void oracle_scores(const rt_step *st, float *scores)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int32_t d = r->d, gs = r->gs;
    const int max = r->p.group == KVQ_GROUP_MAX;
    const int32_t nq = max ? gs : 1;
    float *q = S->qx; /* [nq, d] */
    if (r->p.positions == KVQ_POSITIONS_WROPE) {
        /* q R_b . k_j on the stored (pre-RoPE) keys */
        if (max)
            memcpy(q, S->qb, sizeof(float) * (size_t)gs * d);
        else
            kvq_rt_group_sum(S->qb, gs, d, q);
        const char *base = (const char *)st->H->k + (size_t)st->s_end * d * r->es;
        float *out = max ? S->logits : scores;
        kvq_rk_logits(r->p.isa, q, nq, d, base, r->p.cache_dtype, d, NULL, st->nc, 1.0f, out,
                      st->nc);
        if (max)
            for (int64_t j = 0; j < st->nc; j++) {
                float m = out[j];
                for (int32_t g = 1; g < gs; g++)
                    m = out[(size_t)g * st->nc + j] > m ? out[(size_t)g * st->nc + j] : m;
                scores[j] = m;
            }
        return;
    }
    /* ROPE: q R_i . k_j R_j (the cache holds the keys rotated: keys.c) */
    if (max)
        memcpy(q, S->qi, sizeof(float) * (size_t)gs * d);
    else
        kvq_rt_group_sum(S->qi, gs, d, q);
    float kr[KVQ_ROPE_MAX_DIM];
    for (int64_t j = 0; j < st->nc; j++) {
        if (r->kvc) { /* the keys the compressed cache holds; a pruned token is last */
            scores[j] = kvq_rt_kvc_key(st, st->s_end + j, kr) ? kvq_rt_group_best_dot(q, nq, d, kr)
                                                              : -INFINITY;
            continue;
        }
        kvq_rt_key_rotated(r, st->L, st->H, st->s_end + j, kr);
        scores[j] = kvq_rt_group_best_dot(q, nq, d, kr);
    }
}

/* The scores, and the key rows read for them. */
static void oracle_scored(const rt_step *st, float *scores, double *bytes)
{
    oracle_scores(st, scores);
    *bytes += (double)st->nc * st->r->d * st->r->es;
}

static int64_t oracle_select(const rt_step *st, int64_t k, int32_t *sel, double *sel_bytes,
                             double *cb_bytes)
{
    (void)cb_bytes;
    return kvq_rt_select_scored(st, k, sel, oracle_scored, sel_bytes);
}

static double oracle_bits(const kvq_retrieval_params *p, const kvq_codebook_set *rt, int32_t d)
{
    (void)p, (void)rt;
    return 16.0 * d;
}

const rt_selector kvq_rt_selector_oracle = {
    .id = KVQ_SELECT_ORACLE, .name = "oracle", .select = oracle_select, .bits_per_key = oracle_bits,
};
