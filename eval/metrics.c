/* metrics.c — the figures of a row's retrieval statistics (kvq/eval.h): the one list
 * that `kvq eval` prints (JSON keys and text columns come from here) and the budget
 * profile tabulates. A new metric is one entry of `metrics` and one case of
 * kvq_eval_metric_value (and, when it needs a new sum, a field of kvq_retrieval_stats
 * computed in kvq_rt_measure_output: CONTRIBUTING.md "Adding a metric"). */
#include <math.h>

#include "eval/eval_internal.h"

static const kvq_eval_metric_info metrics[KVQ_EVAL_N_METRICS] = {
    [KVQ_EVAL_RECALL_TOPK] = {"recall_topk", "recall", 7, 3, 0},
    [KVQ_EVAL_RECALL_MASS] = {"recall_mass", "mass", 7, 3, 0},
    [KVQ_EVAL_OUT_REL_ERR] = {"out_rel_err", "out_err", 8, 4, 0},
    [KVQ_EVAL_KV_READ] = {"kv_read_fraction", "kv_read", 8, 2, 1},
    [KVQ_EVAL_ATTENDED] = {"attended_fraction", NULL, 0, 0, 0},
};

const kvq_eval_metric_info *kvq_eval_metric_get(kvq_eval_metric m)
{
    return (unsigned)m < KVQ_EVAL_N_METRICS ? &metrics[m] : NULL;
}

static double mean(double sum, double n) { return n > 0 ? sum / n : NAN; }

double kvq_eval_metric_value(const kvq_retrieval_stats *st, kvq_eval_metric m)
{
    const double n = (double)st->measured;
    switch (m) {
    case KVQ_EVAL_RECALL_TOPK:
        return mean(st->recall_topk, n);
    case KVQ_EVAL_RECALL_MASS:
        return mean(st->recall_mass, n);
    case KVQ_EVAL_OUT_REL_ERR:
        return mean(st->out_rel_err, n);
    case KVQ_EVAL_KV_READ:
        return st->steps ? st->bytes_read / st->bytes_full : NAN;
    case KVQ_EVAL_ATTENDED:
        return st->visible > 0 ? st->attended / st->visible : NAN;
    default:
        return NAN;
    }
}

void kvq_eval_stats_add(kvq_retrieval_stats *a, const kvq_retrieval_stats *b)
{
    kvq_retrieval_stats_add(a, b);
}
