/* eval_retrieval.c — `kvq eval` with retrieval attention: the selector x budget table.
 *
 * Per row (selector, budget):
 *   perplexity   every token of every sequence is predicted with retrieval attention
 *                at its position (prefill_full = 0), compared with full attention;
 *                with --score last:N only the last N of each sequence, each one
 *                decode step after an exact prefill of the tokens before it
 *   recall       mean over retrieval steps of |selected ∩ oracle's top-K| / K
 *   mass         mean exact attention mass (exact RoPE) on the attended tokens
 *   out_err      mean ||o - o_exact|| / ||o_exact|| of the attention output
 *   kv_read      bytes read per step (selector metadata + attended K, V) over the bytes
 *                of full attention, in the cache's storage
 *   passkey / kv-recall   answers decoded greedily with retrieval after an exact
 *                prompt, correct when the continuation starts with the answer; the
 *                prompt is prefilled once for every row (cli/eval_tasks.c)
 * A retrieval step is one (query position, layer, KV head) with at least one candidate
 * (more tokens than sinks + window). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/eval_replay.h"
#include "cli/eval_tasks.h"
#include "cli/retrieval_opts.h"
#include "kvq/perplexity.h"

/* ---- measurements ---------------------------------------------------------------- */

/* --score last:N: predictions from position n - N - 1 on (kvq_ppl_begin_fn). */
static int64_t last_from(void *user, int64_t n)
{
    const int64_t last = *(const int64_t *)user;
    return n > last + 1 ? n - last - 1 : 0;
}

/* Summed NLL and predicted tokens over every sequence, with f's current attention:
 * every prediction (last 0), or the last `last` of each sequence, all logits of a
 * chunk at once (decode 0) or one decode step each (decode 1). */
static kvq_status perplexity(kvq_forward *f, const kvq_seq_set *l, int64_t last, int decode,
                             int32_t chunk, int32_t vocab, float *logits, double *nll,
                             uint64_t *n_pred, kvq_err *err)
{
    kvq_nll_sum sum = {0};
    kvq_status s = KVQ_OK;
    if (!decode)
        s = kvq_perplexity_set(f, l, chunk, vocab, logits, last ? last_from : NULL, &last, &sum,
                               err);
    for (size_t q = 0; decode && q < l->n && !s; q++)
        s = kvq_perplexity_seq_last(f, l->ids + l->off[q], l->off[q + 1] - l->off[q], last,
                                    chunk, vocab, logits, &sum, err);
    *nll = sum.nll;
    *n_pred = sum.n_pred;
    return s;
}

/* ---- the command ------------------------------------------------------------------ */

typedef struct row_result {
    double nll, ppl;
    kvq_retrieval_stats st;
    int correct[3];
} row_result;

static double mean(double sum, uint64_t n) { return n ? sum / (double)n : NAN; }

/* One `kvq eval` with retrieval: its inputs, buffers and results. */
typedef struct evr {
    const kvq_model_config *c;
    kvq_codebook_set *rt;
    cli_row *rows;
    row_result *res;         /* [n_rows] */
    size_t n_rows;
    kvq_seq_set sl;          /* the corpus's sequences */
    kvq_corpus_stats stats;
    task_list tl;
    int n_task[3];           /* task documents per kind */
    int64_t longest;         /* longest sequence or task (prompt + generated) */
    int64_t last;            /* --score last:N: N, else 0 (every prediction) */
    int32_t chunk;
    kvq_forward *f;
    float *logits;           /* [chunk, vocab] */
    int32_t *ids;            /* [longest] */
    double ref_nll;          /* full attention: mean NLL over n_pred tokens */
    uint64_t n_pred;
    int ref_correct[3];
    char *answers;           /* [1 + n_rows][n tasks + 1]: the reference's, then each row's
                                task answers ('1' correct, '0' not), NUL-terminated */
} evr;

static void evr_free(evr *x)
{
    kvq_forward_free(x->f);
    kvq_codebook_set_close(x->rt);
    tasks_free(&x->tl);
    kvq_seq_set_free(&x->sl);
    free(x->rows);
    free(x->res);
    free(x->logits);
    free(x->ids);
    free(x->answers);
}

/* The artifact and rows, the sequences and task documents, the forward pass. */
static int evr_prepare(evr *x, cli_retrieval *o, const kvq_model *m, const char *model_path,
                       const kvq_corpus *corpus, const kvq_tokenizer *tok, int64_t seq_len,
                       int64_t max_tokens, int32_t threads, const kvq_callbacks *cb)
{
    kvq_err e = {0};
    int rc;
    x->c = kvq_model_config_get(m);
    if ((rc = cli_retrieval_open(o, m, model_path, cb, &x->rt)) ||
        (rc = cli_retrieval_rows("eval", o, x->rt, &x->rows, &x->n_rows)))
        return rc;
    kvq_seq_params sp;
    kvq_seq_params_default(&sp);
    kvq_seq_params_model_bos(&sp, tok);
    sp.seq_len = (uint32_t)seq_len;
    sp.max_tokens = (uint64_t)max_tokens;
    if (kvq_seq_set_collect(corpus, tok, &sp, cb, &x->sl, &x->stats, &e) ||
        tasks_read(corpus, tok, &x->tl, &e))
        return cli_fail(&e);
    for (size_t i = 0; i < x->tl.n; i++)
        x->n_task[x->tl.t[i].kind]++;
    x->longest = x->tl.longest > seq_len ? x->tl.longest : seq_len;
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = threads;
    fp.max_tokens = x->longest;
    fp.cb = *cb;
    fp.cb.progress = NULL;
    x->chunk = fp.chunk;
    x->res = calloc(x->n_rows, sizeof *x->res);
    x->logits = malloc(sizeof(float) * (size_t)fp.chunk * x->c->vocab_size);
    x->ids = malloc(sizeof(int32_t) * (size_t)x->longest);
    x->answers = calloc((x->n_rows + 1) * (x->tl.n + 1), 1);
    if (!x->res || !x->logits || !x->ids || !x->answers)
        return cli_failf(1, "%s: out of memory", model_path);
    if (kvq_forward_create(m, &fp, &x->f, &e) != KVQ_OK)
        return cli_fail(&e);
    return 0;
}

/* The reference: perplexity and task answers with full attention. */
static int evr_reference(evr *x, const kvq_tokenizer *tok, const char *spec,
                         const kvq_callbacks *cb)
{
    kvq_err e = {0};
    double t0 = kvq_now();
    if (perplexity(x->f, &x->sl, x->last, 0, x->chunk, x->c->vocab_size, x->logits, &x->ref_nll,
                   &x->n_pred, &e) ||
        tasks_answer(x->f, tok, &x->tl, x->c->vocab_size, x->logits, x->ids, x->ref_correct,
                     x->answers, &e))
        return cli_fail(&e);
    if (x->n_pred == 0)
        return cli_failf(1, "%s: no token to predict (sequences too short)", spec);
    x->ref_nll /= (double)x->n_pred;
    kvq_log(cb, KVQ_LOG_INFO, "full attention: perplexity %.4f (%.2f s)", exp(x->ref_nll),
            kvq_now() - t0);
    return 0;
}

/* Row i: perplexity with retrieval at every position (with the measurements); with
 * --score last:N an exact prefill and retrieval at the last N. */
static int evr_row(evr *x, size_t i, const cli_retrieval *o, const kvq_callbacks *cb)
{
    const kvq_model_config *c = x->c;
    row_result *res = &x->res[i];
    kvq_retrieval *r = NULL;
    kvq_err e = {0};
    kvq_retrieval_params p = o->p;
    p.selector = x->rows[i].selector;
    p.budget = x->rows[i].budget;
    p.max_tokens = x->longest;
    p.cb = *cb;
    p.prefill_full = x->last > 0;
    p.measure = 1;
    double t0 = kvq_now();
    if (kvq_retrieval_create(c, x->rt, &p, &r, &e) != KVQ_OK)
        return cli_fail(&e);
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(x->f, &b);
    uint64_t np;
    kvq_status s = perplexity(x->f, &x->sl, x->last, x->last > 0, x->chunk, c->vocab_size,
                              x->logits, &res->nll, &np, &e);
    kvq_retrieval_stats_get(r, &res->st);
    kvq_forward_set_attention(x->f, NULL);
    kvq_retrieval_free(r);
    if (s)
        return cli_fail(&e);
    res->nll /= (double)x->n_pred;
    res->ppl = exp(res->nll);
    kvq_log(cb, KVQ_LOG_INFO, "%s, budget %s: perplexity %.4f (%.2f s)", x->rows[i].name,
            x->rows[i].budget_str, res->ppl, kvq_now() - t0);
    return 0;
}

static void stats_add(kvq_retrieval_stats *a, const kvq_retrieval_stats *b)
{
    a->steps += b->steps;
    a->visible += b->visible;
    a->attended += b->attended;
    a->bytes_read += b->bytes_read;
    a->bytes_full += b->bytes_full;
    a->bytes_codebook += b->bytes_codebook;
    a->measured += b->measured;
    a->recall_topk += b->recall_topk;
    a->recall_mass += b->recall_mass;
    a->out_rel_err += b->out_rel_err;
}

/* Sequence q's last predictions under row i: a fresh context with the recorded
 * prefill of the first m tokens appended (rp), tokens [m, pre) run (pre < 2 only), then
 * one-token steps from pre on, as kvq_perplexity_seq_last does. */
static kvq_status row_last(evr *x, size_t i, kvq_retrieval_params p, const eval_replay *rp,
                           const int32_t *ids, int64_t n, int64_t pre, kvq_nll_sum *acc,
                           kvq_err *e)
{
    p.selector = x->rows[i].selector;
    p.budget = x->rows[i].budget;
    kvq_retrieval *r = NULL;
    kvq_status s = kvq_retrieval_create(x->c, x->rt, &p, &r, e);
    if (s)
        return s;
    const kvq_attn_backend b = kvq_retrieval_backend(r);
    kvq_forward_set_attention(x->f, &b);
    s = eval_replay_apply(rp, x->f, r, e);
    if (!s && rp->m < pre)
        s = kvq_forward_tokens(x->f, ids + rp->m, pre - rp->m, KVQ_LOGITS_NONE, x->logits, e);
    for (int64_t t = pre; !s && t + 1 < n; t++) {
        if ((s = kvq_forward_tokens(x->f, ids + t, 1, KVQ_LOGITS_LAST, x->logits, e)))
            break;
        acc->nll += kvq_token_nll(x->logits, x->c->vocab_size, ids[t + 1]);
        acc->n_pred++;
    }
    kvq_retrieval_stats st;
    kvq_retrieval_stats_get(r, &st);
    stats_add(&x->res[i].st, &st);
    kvq_forward_set_attention(x->f, NULL);
    kvq_retrieval_free(r);
    return s;
}

/* --score last:N, every row: per sequence one exact prefill of the tokens before the
 * last N predictions, recorded and replayed into each row's fresh context
 * (eval_replay.h), then the row's N one-token steps: the figures of a prefill per row
 * (kvq_perplexity_seq_last) at one prefill per sequence. */
static int evr_rows_last(evr *x, const cli_retrieval *o, const kvq_callbacks *cb)
{
    kvq_err e = {0};
    kvq_nll_sum *acc = calloc(x->n_rows, sizeof *acc);
    double *secs = calloc(x->n_rows, sizeof *secs);
    eval_replay rp = {0};
    int64_t cap = 1;
    for (size_t q = 0; q < x->sl.n; q++)
        if (x->sl.off[q + 1] - x->sl.off[q] > cap)
            cap = x->sl.off[q + 1] - x->sl.off[q];
    kvq_status s = acc && secs ? eval_replay_init(&rp, x->c, cap, &e)
                               : kvq_err_set(&e, KVQ_E_NOMEM, "eval: out of memory");
    kvq_retrieval_params p = o->p;
    p.max_tokens = x->longest;
    p.cb = *cb;
    p.prefill_full = 1;
    for (size_t q = 0; q < x->sl.n && !s; q++) {
        const int32_t *ids = x->sl.ids + x->sl.off[q];
        const int64_t n = x->sl.off[q + 1] - x->sl.off[q];
        const int64_t pre = n - x->last - 1 > 0 ? n - x->last - 1 : 0;
        /* kvq_perplexity_seq_last's calls: none of one token (exact) from 2 tokens on */
        const int64_t cut = pre > 2 && pre % x->chunk == 1 ? pre - 2 : pre;
        const double q0 = kvq_now();
        p.selector = x->rows[0].selector;
        p.budget = x->rows[0].budget;
        p.measure = 0;
        if (pre >= 2)
            s = eval_replay_record(&rp, x->f, x->c, x->rt, &p, ids, pre, cut, NULL, &e);
        else
            rp.m = 0, rp.n_chunks = 0;
        p.measure = 1;
        const double prefill_s = kvq_now() - q0;
        for (size_t i = 0; i < x->n_rows && !s; i++) {
            const double r0 = kvq_now();
            s = row_last(x, i, p, &rp, ids, n, pre, &acc[i], &e);
            secs[i] += kvq_now() - r0;
        }
        if (!s)
            kvq_log(cb, KVQ_LOG_INFO, "sequence %zu/%zu: one exact prefill (%.2f s), %zu rows "
                    "(%.2f s)", q + 1, x->sl.n, prefill_s, x->n_rows, kvq_now() - q0);
    }
    for (size_t i = 0; i < x->n_rows && !s; i++) {
        x->res[i].nll = acc[i].nll / (double)x->n_pred;
        x->res[i].ppl = exp(x->res[i].nll);
        kvq_log(cb, KVQ_LOG_INFO, "%s, budget %s: perplexity %.4f (%.2f s, and the prefills)",
                x->rows[i].name, x->rows[i].budget_str, x->res[i].ppl, secs[i]);
    }
    eval_replay_free(&rp);
    free(acc);
    free(secs);
    return s ? cli_fail(&e) : 0;
}

/* Every row's task answers: exact prompt (prefilled once for all rows), retrieval
 * while decoding (tasks_answer_rows). */
static int evr_tasks(evr *x, const cli_retrieval *o, const kvq_tokenizer *tok,
                     const kvq_callbacks *cb)
{
    kvq_err e = {0};
    int(*correct)[3] = calloc(x->n_rows, sizeof *correct);
    if (!correct)
        return cli_failf(1, "eval: out of memory");
    kvq_retrieval_params p = o->p;
    p.max_tokens = x->longest;
    p.cb = *cb;
    const double t0 = kvq_now();
    kvq_status s = tasks_answer_rows(x->f, tok, &x->tl, x->c, x->rt, &p, x->rows, x->n_rows,
                                     x->chunk, x->logits, x->ids, correct,
                                     x->answers + x->tl.n + 1, cb, &e);
    for (size_t i = 0; i < x->n_rows && !s; i++)
        memcpy(x->res[i].correct, correct[i], sizeof correct[i]);
    free(correct);
    if (s)
        return cli_fail(&e);
    kvq_log(cb, KVQ_LOG_INFO, "tasks: %zu prompts x %zu rows (%.2f s)", x->tl.n, x->n_rows,
            kvq_now() - t0);
    return 0;
}

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
    printf("{\"model\": ");
    kvq_json_write_str(stdout, model_path);
    printf(", \"corpus\": ");
    kvq_json_write_str(stdout, spec);
    printf(", \"corpus_hash\": \"%016llx\", \"attention\": \"retrieval\", \"artifact\": ",
           (unsigned long long)x->stats.hash);
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
    printf(", \"positions\": \"%s\", \"sink\": %d, \"window\": %d, \"cache\": \"%s\", "
           "\"group\": \"%s\", \"tau\": %.6g, \"seq_len\": %lld, \"scored\": \"%s\", "
           "\"sequences\": %zu, "
           "\"tokens\": %llu, \"predicted\": %llu, \"reference\": {\"nll\": %.6f, "
           "\"perplexity\": %.6f, \"passkey\": [%d, %d], \"kv_recall\": [%d, %d], "
           "\"answers\": \"%s\"}, \"rows\": [",
           pos, (int)o->p.sink, (int)window, cache, o->p.group == KVQ_GROUP_SUM ? "sum" : "max",
           o->p.tau, (long long)seq_len, g->scored, x->sl.n, (unsigned long long)x->stats.n_tokens,
           (unsigned long long)x->n_pred, x->ref_nll, exp(x->ref_nll),
           x->ref_correct[KVQ_TASK_PASSKEY],
           x->n_task[KVQ_TASK_PASSKEY], x->ref_correct[KVQ_TASK_KV_RECALL],
           x->n_task[KVQ_TASK_KV_RECALL], x->answers);
    for (size_t i = 0; i < x->n_rows; i++) {
        const kvq_retrieval_stats *st = &x->res[i].st;
        printf(
            "%s{\"selector\": \"%s\", \"budget\": \"%s\", \"bits_per_key\": %.4f, "
            "\"nll\": %.6f, \"perplexity\": %.6f, \"perplexity_delta\": %.6f, "
            "\"perplexity_rel\": %.6f, \"steps\": %llu, ",
            i ? ", " : "", x->rows[i].name, x->rows[i].budget_str, row_bits(x, o, i),
            x->res[i].nll, x->res[i].ppl, x->res[i].ppl - exp(x->ref_nll),
            x->res[i].ppl / exp(x->ref_nll) - 1.0, (unsigned long long)st->steps);
        if (st->steps)
            printf("\"recall_topk\": %.6f, \"recall_mass\": %.6f, \"out_rel_err\": %.6f, "
                   "\"kv_read_fraction\": %.6f, \"attended_fraction\": %.6f, ",
                   mean(st->recall_topk, st->measured), mean(st->recall_mass, st->measured),
                   mean(st->out_rel_err, st->measured), st->bytes_read / st->bytes_full,
                   st->attended / st->visible);
        else
            printf("\"recall_topk\": null, \"recall_mass\": null, \"out_rel_err\": null, "
                   "\"kv_read_fraction\": null, \"attended_fraction\": null, ");
        printf("\"passkey\": [%d, %d], \"kv_recall\": [%d, %d], \"answers\": \"%s\"}",
               x->res[i].correct[KVQ_TASK_PASSKEY], x->n_task[KVQ_TASK_PASSKEY],
               x->res[i].correct[KVQ_TASK_KV_RECALL], x->n_task[KVQ_TASK_KV_RECALL],
               x->answers + (i + 1) * (x->tl.n + 1));
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
    printf("sequences   %zu of up to %lld tokens", x->sl.n, (long long)seq_len);
    if (x->last)
        printf(", the last %lld of each scored (exact prefill, retrieval decode)",
               (long long)x->last);
    printf("\n");
    printf("tokens      %llu (%llu predicted)\n", (unsigned long long)x->stats.n_tokens,
           (unsigned long long)x->n_pred);
    printf("reference   full attention: nll %.6f nats/token, perplexity %.4f\n", x->ref_nll,
           exp(x->ref_nll));
    if (x->tl.n)
        printf("tasks       passkey %d/%d, kv-recall %d/%d (full attention)\n",
               x->ref_correct[KVQ_TASK_PASSKEY], x->n_task[KVQ_TASK_PASSKEY],
               x->ref_correct[KVQ_TASK_KV_RECALL], x->n_task[KVQ_TASK_KV_RECALL]);
    printf("\n%-12s %-7s %6s %10s %9s %8s %7s %7s %8s %8s %8s %9s\n", "selector", "budget",
           "bits", "ppl", "d_ppl", "d_ppl%", "recall", "mass", "out_err", "kv_read", "passkey",
           "kv-recall");
    for (size_t i = 0; i < x->n_rows; i++) {
        const kvq_retrieval_stats *st = &x->res[i].st;
        char pk[32], kv[32];
        snprintf(pk, sizeof pk, "%d/%d", x->res[i].correct[KVQ_TASK_PASSKEY],
                 x->n_task[KVQ_TASK_PASSKEY]);
        snprintf(kv, sizeof kv, "%d/%d", x->res[i].correct[KVQ_TASK_KV_RECALL],
                 x->n_task[KVQ_TASK_KV_RECALL]);
        printf("%-12s %-7s %6.1f %10.4f %+9.4f %+7.2f%%", x->rows[i].name, x->rows[i].budget_str,
               row_bits(x, o, i), x->res[i].ppl, x->res[i].ppl - exp(x->ref_nll),
               100.0 * (x->res[i].ppl / exp(x->ref_nll) - 1.0));
        if (st->steps)
            printf(" %7.3f %7.3f %8.4f %7.2f%%", mean(st->recall_topk, st->measured),
                   mean(st->recall_mass, st->measured), mean(st->out_rel_err, st->measured),
                   100.0 * st->bytes_read / st->bytes_full);
        else
            printf(" %7s %7s %8s %8s", "-", "-", "-", "-");
        printf(" %8s %9s\n", pk, kv);
    }
}

int cli_eval_retrieval(cli_retrieval *o, const kvq_model *m, const char *model_path,
                       const char *spec, const kvq_corpus *corpus, const kvq_tokenizer *tok,
                       int64_t seq_len, int64_t max_tokens, int64_t score_last,
                       int32_t threads, int json, const kvq_callbacks *cb)
{
    evr x = {.last = score_last};
    int rc = evr_prepare(&x, o, m, model_path, corpus, tok, seq_len, max_tokens, threads, cb);
    if (!rc)
        rc = evr_reference(&x, tok, spec, cb);
    if (!rc && x.last)
        rc = evr_rows_last(&x, o, cb);
    for (size_t i = 0; i < x.n_rows && !rc && !x.last; i++)
        rc = evr_row(&x, i, o, cb);
    if (!rc && x.tl.n)
        rc = evr_tasks(&x, o, tok, cb);
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
