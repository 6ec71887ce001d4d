/* eval_table.c — `kvq eval` with retrieval attention: the rows of the selector x budget
 * lists measured by the library's harness (kvq/eval.h, kvq_eval_table_run), printed as
 * a text table or JSON. The metric columns come from kvq_eval_metric_get. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/retrieval_opts.h"
#include "kvq/eval.h"

/* The harness's table and the rows it measured. */
typedef struct evr {
    const kvq_model_config *c;
    kvq_codebook_set *rt;
    cli_row *rows;
    size_t n_rows;
    int64_t last;            /* --score last:N: N, else 0 */
    kvq_eval_table t;
} evr;

/* The retrieval settings as reported. */
typedef struct evr_setting {
    const char *method, *cache, *pos;
    char scored[32];         /* "all" or "last:N" */
    int32_t window;
} evr_setting;

/* Selector metadata bits per cached key of row i (kvq_selector_bits_per_key). */
static double row_bits(const evr *x, const cli_retrieval *o, size_t i)
{
    return kvq_selector_bits_per_key(x->rows[i].selector, &o->p, x->rt, x->c->head_dim);
}

static void evr_print_json(const evr *x, const cli_retrieval *o, const evr_setting *g,
                           const char *model_path, const char *spec, int64_t seq_len)
{
    const char *method = g->method, *cache = g->cache, *pos = g->pos;
    const int32_t window = g->window;
    cli_eval_json_head(model_path, spec);
    printf(", \"corpus_hash\": \"%016llx\", \"attention\": \"retrieval\", \"artifact\": ",
           (unsigned long long)x->t.stats.hash);
    if (o->artifact)
        kvq_json_write_str(stdout, o->artifact);
    else
        printf("null");
    printf(", \"method\": ");
    if (method)
        kvq_json_write_str(stdout, method);
    else
        printf("null");
    printf(", \"score\": \"%s\", \"rerank\": %g, \"rerank_extra\": %g, \"resid_bits\": %d, "
           "\"resid_wide\": %g, \"resid_group\": \"%s\", \"resid_share\": %g",
           kvq_score_pos_name(o->p.score_pos), o->p.rerank, o->p.rerank_extra,
           (int)o->p.resid_bits, o->p.resid_wide,
           o->p.resid_group == KVQ_GROUP_SUM ? "sum" : "max", o->p.resid_share);
    printf(", \"local_layers\": ["); /* attended exactly over their window (archs-rt) */
    for (int32_t l = 0, n = 0; l < x->c->n_layers; l++)
        if (kvq_retrieval_layer_local(x->c, l))
            printf("%s%d", n++ ? ", " : "", (int)l);
    printf("]");
    printf(", \"positions\": \"%s\", \"sink\": %d, \"window\": %d, \"cache\": \"%s\", "
           "\"group\": \"%s\", \"tau\": %.6g, \"seq_len\": %lld, \"scored\": \"%s\", "
           "\"sequences\": %zu, "
           "\"tokens\": %llu, \"predicted\": %llu, \"reference\": {\"nll\": %.6f, "
           "\"perplexity\": %.6f, \"passkey\": [%d, %d], \"kv_recall\": [%d, %d], "
           "\"answers\": \"%s\"}, \"rows\": [",
           pos, (int)o->p.sink, (int)window, cache, o->p.group == KVQ_GROUP_SUM ? "sum" : "max",
           o->p.tau, (long long)seq_len, g->scored, x->t.n_sequences, (unsigned long long)x->t.stats.n_tokens,
           (unsigned long long)x->t.n_pred, x->t.reference.nll, exp(x->t.reference.nll),
           x->t.reference.correct[KVQ_TASK_PASSKEY],
           x->t.n_task[KVQ_TASK_PASSKEY], x->t.reference.correct[KVQ_TASK_KV_RECALL],
           x->t.n_task[KVQ_TASK_KV_RECALL], kvq_eval_table_answers(&x->t, -1));
    for (size_t i = 0; i < x->n_rows; i++) {
        const kvq_retrieval_stats *st = &x->t.rows[i].st;
        printf(
            "%s{\"selector\": \"%s\", \"budget\": \"%s\", \"bits_per_key\": %.4f, "
            "\"nll\": %.6f, \"perplexity\": %.6f, \"perplexity_delta\": %.6f, "
            "\"perplexity_rel\": %.6f, \"steps\": %llu, ",
            i ? ", " : "", x->rows[i].name, x->rows[i].budget_str, row_bits(x, o, i),
            x->t.rows[i].nll, x->t.rows[i].ppl, x->t.rows[i].ppl - exp(x->t.reference.nll),
            x->t.rows[i].ppl / exp(x->t.reference.nll) - 1.0, (unsigned long long)st->steps);
        for (int k = 0; k < KVQ_EVAL_N_METRICS; k++) {
            const kvq_eval_metric_info *mi = kvq_eval_metric_get((kvq_eval_metric)k);
            if (st->steps)
                printf("\"%s\": %.6f, ", mi->key, kvq_eval_metric_value(st, (kvq_eval_metric)k));
            else
                printf("\"%s\": null, ", mi->key);
        }
        printf("\"passkey\": [%d, %d], \"kv_recall\": [%d, %d], \"answers\": \"%s\"}",
               x->t.rows[i].correct[KVQ_TASK_PASSKEY], x->t.n_task[KVQ_TASK_PASSKEY],
               x->t.rows[i].correct[KVQ_TASK_KV_RECALL], x->t.n_task[KVQ_TASK_KV_RECALL],
               kvq_eval_table_answers(&x->t, (long)i));
    }
    printf("]}\n");
}

static void evr_print_text(const evr *x, const cli_retrieval *o, const evr_setting *g,
                           const char *model_path, const char *spec, int64_t seq_len)
{
    const char *method = g->method, *cache = g->cache, *pos = g->pos;
    const int32_t window = g->window;
    printf("model       %s\n", model_path);
    printf("corpus      %s\n", spec);
    printf("attention   retrieval: ");
    if (x->rt)
        printf("artifact %s (%s, K %d, G %d), ", o->artifact, method,
               (int)kvq_codebook_set_size(x->rt), (int)kvq_codebook_set_groups(x->rt));
    char rr[32], rs[96];
    if (o->p.rerank > 1 || !(o->p.rerank_extra > 0))
        snprintf(rr, sizeof rr, "%g", o->p.rerank > 1 ? o->p.rerank : 0);
    else
        snprintf(rr, sizeof rr, "+%g", o->p.rerank_extra);
    if (o->p.resid_bits > 0)
        snprintf(rs, sizeof rs, "%d bit (%s, W %g, share %g)", (int)o->p.resid_bits,
                 o->p.resid_group == KVQ_GROUP_SUM ? "sum" : "max", o->p.resid_wide,
                 o->p.resid_share);
    else
        snprintf(rs, sizeof rs, "off");
    printf("positions %s, score %s, rerank %s, residual %s, sink %d, window %d, cache %s, "
           "group %s\n",
           pos, kvq_score_pos_name(o->p.score_pos), rr, rs, (int)o->p.sink, (int)window, cache,
           o->p.group == KVQ_GROUP_SUM ? "sum" : "max");
    char note[256]; /* sliding-window layers beside global ones (archs-rt) */
    if (kvq_retrieval_layers_note(x->c, note, sizeof note))
        printf("local       %s\n", note);
    printf("sequences   %zu of up to %lld tokens", x->t.n_sequences, (long long)seq_len);
    if (x->last)
        printf(", the last %lld of each scored (exact prefill, retrieval decode)",
               (long long)x->last);
    printf("\n");
    printf("tokens      %llu (%llu predicted)\n", (unsigned long long)x->t.stats.n_tokens,
           (unsigned long long)x->t.n_pred);
    printf("reference   full attention: nll %.6f nats/token, perplexity %.4f\n", x->t.reference.nll,
           exp(x->t.reference.nll));
    if (x->t.n_tasks)
        printf("tasks       passkey %d/%d, kv-recall %d/%d (full attention)\n",
               x->t.reference.correct[KVQ_TASK_PASSKEY], x->t.n_task[KVQ_TASK_PASSKEY],
               x->t.reference.correct[KVQ_TASK_KV_RECALL], x->t.n_task[KVQ_TASK_KV_RECALL]);
    printf("\n%-12s %-7s %6s %10s %9s %8s", "selector", "budget", "bits", "ppl", "d_ppl", "d_ppl%");
    for (int k = 0; k < KVQ_EVAL_N_METRICS; k++) {
        const kvq_eval_metric_info *mi = kvq_eval_metric_get((kvq_eval_metric)k);
        if (mi->column)
            printf(" %*s", mi->width, mi->column);
    }
    printf(" %8s %9s\n", "passkey", "kv-recall");
    for (size_t i = 0; i < x->n_rows; i++) {
        const kvq_retrieval_stats *st = &x->t.rows[i].st;
        char pk[32], kv[32];
        snprintf(pk, sizeof pk, "%d/%d", x->t.rows[i].correct[KVQ_TASK_PASSKEY],
                 x->t.n_task[KVQ_TASK_PASSKEY]);
        snprintf(kv, sizeof kv, "%d/%d", x->t.rows[i].correct[KVQ_TASK_KV_RECALL],
                 x->t.n_task[KVQ_TASK_KV_RECALL]);
        printf("%-12s %-7s %6.1f %10.4f %+9.4f %+7.2f%%", x->rows[i].name, x->rows[i].budget_str,
               row_bits(x, o, i), x->t.rows[i].ppl, x->t.rows[i].ppl - exp(x->t.reference.nll),
               100.0 * (x->t.rows[i].ppl / exp(x->t.reference.nll) - 1.0));
        for (int k = 0; k < KVQ_EVAL_N_METRICS; k++) {
            const kvq_eval_metric_info *mi = kvq_eval_metric_get((kvq_eval_metric)k);
            const double v = kvq_eval_metric_value(st, (kvq_eval_metric)k);
            if (!mi->column)
                continue;
            if (!st->steps)
                printf(" %*s", mi->width, "-");
            else if (mi->percent)
                printf(" %*.*f%%", mi->width - 1, mi->precision, 100.0 * v);
            else
                printf(" %*.*f", mi->width, mi->precision, v);
        }
        printf(" %8s %9s\n", pk, kv);
    }
}

static void evr_free(evr *x)
{
    kvq_codebook_set_close(x->rt);
    kvq_eval_table_free(&x->t);
    free(x->rows);
}

/* Opens the artifact, expands the rows and runs the harness over them. */
static int evr_run(evr *x, cli_retrieval *o, const kvq_model *m, const char *model_path,
                   const char *spec, const kvq_corpus *corpus, const kvq_tokenizer *tok,
                   int64_t seq_len, int64_t max_tokens, int32_t threads, const kvq_callbacks *cb)
{
    int rc;
    x->c = kvq_model_config_get(m);
    if ((rc = cli_retrieval_open(o, m, model_path, cb, &x->rt)) ||
        (rc = cli_retrieval_rows("eval", o, x->rt, &x->rows, &x->n_rows)))
        return rc;
    kvq_retrieval_params *rp = calloc(x->n_rows ? x->n_rows : 1, sizeof *rp);
    char(*label)[80] = calloc(x->n_rows ? x->n_rows : 1, sizeof *label);
    const char **names = calloc(x->n_rows ? x->n_rows : 1, sizeof *names);
    kvq_err e = {0};
    kvq_eval_params p = kvq_eval_params_default();
    p.last = x->last;
    p.threads = threads;
    p.name = spec;
    p.cb = *cb;
    if (!rp || !label || !names) {
        rc = cli_failf(1, "%s: out of memory", model_path);
    } else {
        for (size_t i = 0; i < x->n_rows; i++) {
            rp[i] = o->p;
            rp[i].selector = x->rows[i].selector;
            rp[i].budget = x->rows[i].budget;
            snprintf(label[i], sizeof label[i], "%s, budget %s", x->rows[i].name,
                     x->rows[i].budget_str);
            names[i] = label[i];
        }
        if (kvq_eval_table_run(m, x->rt, corpus, tok, seq_len, max_tokens, &p, rp, names,
                               x->n_rows, &x->t, &e))
            rc = cli_fail(&e);
    }
    free(rp);
    free(label);
    free(names);
    return rc;
}

int cli_eval_retrieval(cli_retrieval *o, const kvq_model *m, const char *model_path,
                       const char *spec, const kvq_corpus *corpus, const kvq_tokenizer *tok,
                       int64_t seq_len, int64_t max_tokens, int64_t score_last,
                       int32_t threads, int json, const kvq_callbacks *cb)
{
    evr x = {.last = score_last};
    int rc = evr_run(&x, o, m, model_path, spec, corpus, tok, seq_len, max_tokens, threads, cb);
    if (!rc) {
        evr_setting g = {
            .method = x.rt ? kvq_codebook_method_name(kvq_codebook_set_method(x.rt)) : NULL,
            .window = o->p.window ? o->p.window : x.rt ? kvq_codebook_set_wrope_w(x.rt) : 64,
            .cache = o->p.cache_dtype == KVQ_DT_F16 ? "f16" : "f32",
            .pos = kvq_positions_name(o->p.positions),
        };
        if (x.last)
            snprintf(g.scored, sizeof g.scored, "last:%lld", (long long)x.last);
        else
            snprintf(g.scored, sizeof g.scored, "all");
        if (json)
            evr_print_json(&x, o, &g, model_path, spec, seq_len);
        else
            evr_print_text(&x, o, &g, model_path, spec, seq_len);
    }
    evr_free(&x);
    return rc;
}
