/* seq.c — captured rows through the harness (kvq/eval.h): one sequence's query, key and
 * value rows (a capture's, no model forward) measured under selector settings. The
 * sampled path appends the rows to one context and measures each sampled continuation
 * row under every setting at once (kvq_retrieval_probe: the figures of a context per
 * setting attending the row alone, tests/test_runtime.c); the reference path attends
 * every continuation row by retrieval in a context of the setting's own. The budget
 * profile (thresholds/budget.c) measures its settings here. */
#include <math.h>
#include <string.h>

#include "eval/eval_internal.h"

/* Rows [r0, r1) attended through b's attention (outputs into o at the rows' place). */
static kvq_status attend_rows(kvq_attn_backend b, const kvq_eval_seq *S, int64_t r0, int64_t r1,
                              float *o, kvq_err *err)
{
    const size_t qo = (size_t)r0 * S->nh * S->d, ko = (size_t)r0 * S->nkv * S->d;
    const kvq_attn_call call = {.layer = S->layer, .n = (int32_t)(r1 - r0), .pos = S->pos + r0,
                                .q = S->q + qo, .k = S->k + ko, .v = S->v + ko,
                                .out = o + qo};
    return b.attend(b.user, &call, err);
}

/* Appends rows [r0, r1) of the sequence to ctx's cache (no attention). */
static kvq_status append_rows(kvq_retrieval *ctx, const kvq_eval_seq *S, int64_t r0, int64_t r1,
                              kvq_err *err)
{
    const size_t ko = (size_t)r0 * S->nkv * S->d;
    return kvq_retrieval_append(ctx, S->layer, (int32_t)(r1 - r0), S->pos + r0, S->k + ko,
                                S->v + ko, err);
}

kvq_status kvq_eval_seq_probe(kvq_retrieval *ctx, const kvq_eval_seq *S,
                              const kvq_retrieval_setting *set, int32_t n_set,
                              kvq_retrieval_stats *z, kvq_err *err)
{
    kvq_status s = KVQ_OK;
    int64_t prev = 0;
    kvq_retrieval_reset(ctx);
    for (int64_t i = 0; i < S->nm && !s; i++) {
        const int64_t r = S->mrow[i];
        if ((r > prev && (s = append_rows(ctx, S, prev, r, err))) ||
            (s = append_rows(ctx, S, r, r + 1, err)) ||
            (s = kvq_retrieval_probe(ctx, S->layer, S->q + (size_t)r * S->nh * S->d, n_set, set,
                                     z + (size_t)i * (size_t)n_set, err)))
            break;
        prev = r + 1;
    }
    return s;
}

kvq_status kvq_eval_seq_attend(kvq_retrieval *ctx, const kvq_eval_seq *S, float *o,
                               kvq_retrieval_stats *z, kvq_err *err)
{
    kvq_retrieval_reset(ctx);
    kvq_attn_backend be = kvq_retrieval_backend(ctx);
    kvq_status s = S->P > 0 ? attend_rows(be, S, 0, S->P, o, err) : KVQ_OK;
    if (s)
        return s;
    kvq_retrieval_stats_reset(ctx);
    if ((s = attend_rows(be, S, S->P, S->n, o, err)))
        return s;
    kvq_retrieval_stats_get(ctx, z);
    return KVQ_OK;
}

void kvq_eval_sample_interval(double sum, double sq, double n, double *mean, double *se)
{
    *mean = n > 0 ? sum / n : NAN;
    const double var = n > 1 ? (sq - sum * sum / n) / (n - 1) : 0.0;
    *se = n > 0 ? sqrt(var > 0 ? var : 0.0) / sqrt(n) : NAN;
}
