/* eval_suite.c — `kvq eval --suite ruler[:TASK,...]`: the RULER-style tasks (kvq/eval.h,
 * eval/ruler_*.c) at each length, filler from --corpus, scored for full attention and
 * every selector x budget row, printed as a text table (score and gap to dense per task
 * and length) or JSON rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/eval_suite.h"
#include "kvq/eval.h"

/* Short column names, in kvq_ruler_task order. */
static const char *const short_name[KVQ_RULER_N_TASKS] = {"s-num", "s-uuid", "mk", "mv",
                                                           "mq",    "vt",     "cwe"};

typedef struct suite_run {
    const kvq_model_config *c;
    kvq_codebook_set *rt;
    cli_row *rows;
    size_t n_rows;
    size_t dense;            /* the full-attention row */
    kvq_ruler_result r;
} suite_run;

int cli_suite_lengths(const char *val, int64_t *lengths, size_t *n)
{
    *n = 0;
    for (const char *p = val; p && *p;) {
        char *end = NULL;
        const long long v = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < 64 || v > (1 << 20) || *n >= 16)
            return cli_failf(2, "eval: --lengths '%s': a list of up to 16 token counts, each "
                             "64 .. 1048576", val);
        lengths[(*n)++] = v;
        p = *end ? end + 1 : end;
    }
    return *n ? 0 : cli_failf(2, "eval: --lengths needs a value");
}

/* The score of row i in cell c over the samples, and its gap to the dense row's. */
static double cell(const suite_run *x, size_t i, size_t c) { return 100.0 * kvq_ruler_result_mean(&x->r, i, c); }

/* Mean over the needle tasks (all but VT and CWE) of length l, NAN when none ran. */
static double needle_mean(const suite_run *x, size_t i, int64_t l)
{
    double s = 0;
    int n = 0;
    for (size_t c = 0; c < x->r.n_cells; c++)
        if (x->r.length[c] == l && x->r.task[c] < KVQ_RULER_VT) {
            s += cell(x, i, c);
            n++;
        }
    return n ? s / n : NAN;
}

static void print_text(const suite_run *x, const cli_retrieval *o, const char *model_path,
                       const char *spec, const cli_suite *su)
{
    const int64_t *lengths = su->lengths;
    const size_t n_len = su->n_lengths;
    printf("model       %s\n", model_path);
    printf("filler      %s\n", spec);
    printf("suite       %s: %u samples per task and length, seed %llu\n", su->suite,
           (unsigned)x->r.samples, (unsigned long long)su->seed);
    printf("protocol    context prefilled with full attention (once per prompt), question and "
           "answer decoded greedily with each row's retrieval; RULER string match\n");
    if (x->rt)
        printf("artifact    %s\n", o->artifact);
    for (size_t l = 0; l < n_len; l++) {
        printf("\nlength %lld: score %% (gap to full attention in points)\n",
               (long long)lengths[l]);
        printf("%-12s %-7s", "selector", "budget");
        for (int t = 0; t < KVQ_RULER_N_TASKS; t++)
            for (size_t c = 0; c < x->r.n_cells; c++)
                if (x->r.task[c] == (kvq_ruler_task)t && x->r.length[c] == lengths[l])
                    printf(" %15s", short_name[t]);
        printf(" %15s\n", "needles");
        for (size_t i = 0; i < x->n_rows; i++) {
            printf("%-12s %-7s", x->rows[i].name, x->rows[i].budget_str);
            for (size_t c = 0; c < x->r.n_cells; c++) {
                if (x->r.length[c] != lengths[l])
                    continue;
                if (i == x->dense)
                    printf(" %15.1f", cell(x, i, c));
                else
                    printf(" %7.1f (%+5.1f)", cell(x, i, c), cell(x, i, c) - cell(x, x->dense, c));
            }
            const double nm = needle_mean(x, i, lengths[l]), nd = needle_mean(x, x->dense, lengths[l]);
            if (isnan(nm))
                printf(" %15s\n", "-");
            else if (i == x->dense)
                printf(" %15.1f\n", nm);
            else
                printf(" %7.1f (%+5.1f)\n", nm, nm - nd);
        }
    }
    printf("\n%u prompts per cell: one prompt is %.1f points; binomial standard error at most "
           "%.1f points\n", (unsigned)x->r.samples, 100.0 / x->r.samples,
           50.0 / sqrt((double)x->r.samples));
}

static void print_json_row(const suite_run *x, const cli_retrieval *o, size_t i, size_t c,
                           int first)
{
    const double s = cell(x, i, c), d = cell(x, x->dense, c);
    const double p = s / 100.0;
    printf("%s{\"selector\": \"%s\", \"budget\": \"%s\", \"bits_per_key\": %.4f, \"suite\": "
           "\"ruler\", \"task\": \"%s\", \"length\": %lld, \"n\": %u, \"score\": %.4f, "
           "\"stderr\": %.4f, \"dense\": %.4f, \"gap\": %.4f, \"scores\": [",
           first ? "" : ", ", x->rows[i].name, x->rows[i].budget_str,
           kvq_selector_bits_per_key(x->rows[i].selector, &o->p, x->rt, x->c->head_dim),
           kvq_ruler_task_name(x->r.task[c]), (long long)x->r.length[c], (unsigned)x->r.samples,
           s, 100.0 * sqrt(p * (1 - p) / x->r.samples), d, s - d);
    const size_t base = (i * x->r.n_cells + c) * x->r.samples;
    for (uint32_t k = 0; k < x->r.samples; k++)
        printf("%s%.4f", k ? ", " : "", x->r.score[base + k]);
    printf("], \"predictions\": [");
    for (uint32_t k = 0; k < x->r.samples; k++) {
        printf("%s", k ? ", " : "");
        kvq_json_write_str(stdout, x->r.pred[base + k] ? x->r.pred[base + k] : "");
    }
    printf("]}");
}

static void print_json(const suite_run *x, const cli_retrieval *o, const char *model_path,
                       const char *spec, const char *suite, uint64_t seed)
{
    cli_eval_json_head(model_path, spec);
    printf(", \"suite\": ");
    kvq_json_write_str(stdout, suite);
    printf(", \"attention\": \"retrieval\", \"artifact\": ");
    if (o->artifact)
        kvq_json_write_str(stdout, o->artifact);
    else
        printf("null");
    printf(", \"method\": ");
    if (x->rt)
        kvq_json_write_str(stdout, kvq_codebook_method_name(kvq_codebook_set_method(x->rt)));
    else
        printf("null");
    printf(", \"positions\": \"%s\", \"score_units\": \"percent\", \"samples\": %u, \"seed\": "
           "%llu, \"seconds\": %.1f, \"rows\": [", kvq_positions_name(o->p.positions),
           (unsigned)x->r.samples, (unsigned long long)seed, x->r.seconds);
    int first = 1;
    for (size_t i = 0; i < x->n_rows; i++)
        for (size_t c = 0; c < x->r.n_cells; c++, first = 0)
            print_json_row(x, o, i, c, first);
    printf("]}\n");
}

/* The rows: the lists of the retrieval options with a full-attention row first when
 * they have none (no retrieval option: that row alone). */
static int suite_rows(suite_run *x, cli_retrieval *o)
{
    cli_retrieval q = *o;
    char sel[512];
    if (!o->given || !o->selectors)
        q.selectors = o->given ? NULL : "full";
    int rc = cli_retrieval_rows("eval", &q, x->rt, &x->rows, &x->n_rows);
    for (size_t i = 0; !rc && i < x->n_rows; i++)
        if (x->rows[i].selector == KVQ_SELECT_FULL) {
            x->dense = i;
            return 0;
        }
    if (rc)
        return rc;
    free(x->rows);
    x->rows = NULL;
    snprintf(sel, sizeof sel, "full,%s", q.selectors ? q.selectors : "");
    q.selectors = sel;
    x->dense = 0;
    return cli_retrieval_rows("eval", &q, x->rt, &x->rows, &x->n_rows);
}

int cli_eval_suite(cli_retrieval *o, const kvq_model *m, const char *model_path,
                   const char *spec, const kvq_corpus *corpus, const kvq_tokenizer *tok,
                   const cli_suite *su, int32_t threads, int json, const kvq_callbacks *cb)
{
    suite_run x = {.c = kvq_model_config_get(m)};
    kvq_err e = {0};
    kvq_ruler_params rp = {.lengths = su->lengths, .n_lengths = su->n_lengths,
                           .samples = su->samples, .seed = su->seed};
    if (kvq_ruler_tasks_parse(su->suite, &rp.tasks, &e))
        return cli_failf(2, "eval: --suite: %s", e.msg);
    for (size_t l = 0; l < su->n_lengths; l++)
        if (x.c->context_length > 0 && su->lengths[l] > x.c->context_length)
            return cli_failf(2, "eval: --lengths %lld is longer than the context of %s (%d "
                             "tokens)", (long long)su->lengths[l], model_path,
                             (int)x.c->context_length);
    kvq_ruler_filler *f = NULL;
    kvq_retrieval_params *rp_rows = NULL;
    int rc = cli_retrieval_open(o, m, model_path, cb, &x.rt);
    if (!rc)
        rc = suite_rows(&x, o);
    if (!rc && kvq_ruler_filler_read(corpus, tok, &f, &e))
        rc = cli_failf(2, "eval: --corpus %s: %s", spec, e.msg);
    if (!rc && !(rp_rows = calloc(x.n_rows, sizeof *rp_rows)))
        rc = cli_failf(1, "%s: out of memory", model_path);
    for (size_t i = 0; !rc && i < x.n_rows; i++) {
        rp_rows[i] = o->p;
        rp_rows[i].selector = x.rows[i].selector;
        rp_rows[i].budget = x.rows[i].budget;
    }
    kvq_eval_params p = kvq_eval_params_default();
    p.threads = threads;
    p.name = spec;
    p.cb = *cb;
    if (!rc && kvq_eval_ruler_run(m, x.rt, f, tok, &rp, &p, rp_rows, x.n_rows, &x.r, &e))
        rc = e.status == KVQ_E_INVALID_ARG ? cli_failf(2, "eval: %s", e.msg) : cli_fail(&e);
    if (!rc && json)
        print_json(&x, o, model_path, spec, su->suite, su->seed);
    else if (!rc)
        print_text(&x, o, model_path, spec, su);
    kvq_ruler_result_free(&x.r);
    kvq_ruler_filler_free(f);
    free(rp_rows);
    free(x.rows);
    kvq_codebook_set_close(x.rt);
    return rc;
}
