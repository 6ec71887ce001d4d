/*
 * mass.c — the mass selector (hcattention's cumulative-mass rule): the codebook's
 * first-stage scores of the candidates (runtime/select/codebook/, whose per-head codes it
 * shares) taken as approximate logits, and the fewest of them, at most the budget, whose
 * softmax holds tau of the mass (k*, mass_count.c).
 */
#include <math.h>

#include "runtime/kernels/rk.h"
#include "runtime/select/codebook/codebook.h"
#include "runtime/select/mass.h"
#include "runtime/select/selector.h"

static int64_t mass_select(const rt_step *st, int64_t k, int32_t *sel, double *sel_bytes,
                           double *codebook_bytes)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const int64_t nc = st->nc;
    float *scores = S->scores;
    if (nc <= 0)
        return 0;
    /* the probe's steps of one (row, head) score the candidates once (mass.h) */
    if (!kvq_rt_mass_memo_scores(S->mass_memo, nc, scores, codebook_bytes))
        kvq_rt_codebook_scores(st, scores, codebook_bytes);
    *sel_bytes += (double)nc * 2.0 * kvq_codebook_get_desc(st->L->cb[st->head])->groups;
    /* approximate logits: the mean (SUM) or max of the heads' scores, / sqrt(d) */
    const float sc =
        r->scale / (r->p.group == KVQ_GROUP_SUM ? (float)r->gs : 1.0f);
    for (int64_t j = 0; j < nc; j++)
        S->tmp[j] = scores[j] * sc;
    const int64_t kstar =
        r->p.tau >= 1.0 ? nc
                        : kvq_rt_mass_count_memo(S->mass_memo, scores, *codebook_bytes, S->tmp, nc,
                                                 r->p.tau, S->work, S->mwork);
    k = kstar < k ? kstar : k;
    int64_t n = kvq_rt_mass_memo_topk(S->mass_memo, nc, k, sel);
    if (n < 0)
        n = kvq_rk_topk(r->p.isa, scores, nc, k, sel, S->work);
    for (int64_t j = 0; j < n; j++)
        sel[j] += (int32_t)st->s_end;
    return n;
}

static int mass_reserve(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t cap)
{
    return kvq_rt_cb_reserve(r, L, H, cap, 0); /* codes only: no residual stage */
}

static double mass_bits(const kvq_retrieval_params *p, const kvq_codebook_set *rt, int32_t d)
{
    return kvq_rt_cb_bits_per_key(p, rt, d, 0);
}

const rt_selector kvq_rt_selector_mass = {
    .id = KVQ_SELECT_MASS,
    .name = "mass",
    .needs_artifact = 1,
    .reserve = mass_reserve,
    .free_head = kvq_rt_cb_free_head,
    .reset_head = kvq_rt_cb_reset_head,
    .append = kvq_rt_cb_append,
    .appended = kvq_rt_cb_appended,
    .select = mass_select,
    .bits_per_key = mass_bits,
};
