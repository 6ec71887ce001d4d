/*
 * mass.c — the mass selector (hcattention's cumulative-mass rule): the codebook's
 * first-stage scores of the candidates (runtime/select/codebook/codes.h: the codes and
 * first stage it shares with the codebook selector) taken as approximate logits, and
 * the fewest of them, at most the budget, whose softmax holds tau of the mass (k*,
 * mass_count.c).
 */
#include <math.h>
#include <stdlib.h>

#include "runtime/kernels/rk.h"
#include "runtime/select/codebook/codes.h"
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

/* Its data is the piece it shares with the codebook selector (codes.h): the codes per
 * head, the encoder and backend per context, the first stage's scratch per thread. */
static int mass_reserve(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t cap)
{
    if (!H->sdata && !(H->sdata = calloc(1, sizeof(rt_codes_head))))
        return 0;
    return kvq_rt_codes_reserve(r, L, kvq_rt_codes(H), cap);
}

static void mass_free_head(rt_head *H)
{
    if (H->sdata)
        kvq_rt_codes_free(kvq_rt_codes(H));
    free(H->sdata);
    H->sdata = NULL;
}

static kvq_status mass_append(kvq_retrieval *r, rt_layer *L, const kvq_attn_call *c, int64_t past,
                              kvq_err *err)
{
    return kvq_rt_codes_append(r, L, c, past, NULL, err);
}

static kvq_status mass_appended(kvq_retrieval *r, rt_layer *L, int64_t past, kvq_err *err)
{
    return kvq_rt_sort_rows(r, L, past, 0, err);
}

static int mass_scratch(const kvq_retrieval *r, rt_scratch *S, int64_t cap)
{
    (void)cap;
    if (!S->sscr && !(S->sscr = calloc(1, sizeof(rt_codes_scratch))))
        return 0;
    return kvq_rt_codes_scratch(r, kvq_rt_codes_scr(S));
}

static void mass_scratch_free(rt_scratch *S)
{
    if (S->sscr)
        kvq_rt_codes_scratch_free(kvq_rt_codes_scr(S));
    free(S->sscr);
    S->sscr = NULL;
}

/* Bits per key: the codes. */
static double mass_bits(const kvq_retrieval_params *p, const kvq_codebook_set *rt, int32_t d)
{
    (void)p;
    (void)d;
    return rt ? (double)kvq_codebook_set_groups(rt) * log2((double)kvq_codebook_set_size(rt)) : 0.0;
}

static double mass_row_bytes(const kvq_retrieval *r, const rt_layer *L, const rt_head *H)
{
    return H->sdata ? kvq_rt_codes_row_bytes(r, L) : 0;
}

const rt_selector kvq_rt_selector_mass = {
    .id = KVQ_SELECT_MASS,
    .name = "mass",
    .needs_artifact = 1,
    .open = kvq_rt_codes_open,
    .close = kvq_rt_codes_close,
    .scratch = mass_scratch,
    .scratch_free = mass_scratch_free,
    .reserve = mass_reserve,
    .free_head = mass_free_head,
    .reset_head = kvq_rt_codes_reset_head,
    .append = mass_append,
    .appended = mass_appended,
    .select = mass_select,
    .bits_per_key = mass_bits,
    .row_bytes = mass_row_bytes,
};
