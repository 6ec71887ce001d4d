/* eval_retrieval.c — `kvq eval` with retrieval attention: the selector x budget table.
 *
 * Per row (selector, budget):
 *   perplexity   every token of every sequence is predicted with retrieval attention
 *                at its position (prefill_full = 0), compared with full attention
 *   recall       mean over retrieval steps of |selected ∩ oracle's top-K| / K
 *   mass         mean exact attention mass (exact RoPE) on the attended tokens
 *   out_err      mean ||o - o_exact|| / ||o_exact|| of the attention output
 *   kv_read      bytes read per step (selector metadata + attended K, V) over the bytes
 *                of full attention, in the cache's storage
 *   passkey / kv-recall   answers decoded greedily with retrieval after an exact
 *                prompt, correct when the continuation starts with the answer
 * A retrieval step is one (query position, layer, KV head) with at least one candidate
 * (more tokens than sinks + window). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/retrieval.h"

/* ---- the corpus, held in memory ---------------------------------------------------- */

typedef struct seq_list {
    int32_t *ids; /* all sequences, concatenated */
    int64_t *off; /* [n + 1] */
    size_t n, cap;
    int64_t n_ids, ids_cap;
} seq_list;

static kvq_status keep_seq(void *user, const kvq_corpus_seq *seq, kvq_err *err)
{
    seq_list *l = user;
    if (l->n + 2 > l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        int64_t *o = realloc(l->off, sizeof *o * cap);
        if (!o)
            return kvq_err_set(err, KVQ_E_NOMEM, "eval: out of memory");
        l->off = o;
        l->cap = cap;
    }
    if (l->n_ids + seq->n > l->ids_cap) {
        int64_t cap = l->ids_cap ? 2 * l->ids_cap : 4096;
        while (cap < l->n_ids + seq->n)
            cap *= 2;
        int32_t *p = realloc(l->ids, sizeof *p * (size_t)cap);
        if (!p)
            return kvq_err_set(err, KVQ_E_NOMEM, "eval: out of memory");
        l->ids = p;
        l->ids_cap = cap;
    }
    if (l->n == 0)
        l->off[0] = 0;
    memcpy(l->ids + l->n_ids, seq->ids, sizeof(int32_t) * seq->n);
    l->n_ids += seq->n;
    l->off[++l->n] = l->n_ids;
    return KVQ_OK;
}

typedef struct task {
    kvq_corpus_task kind;
    int32_t *ids; /* prompt, BOS first */
    size_t n;
    char *answer;
    int32_t n_gen; /* tokens to generate */
} task;

typedef struct task_list {
    task *t;
    size_t n;
    int64_t longest; /* prompt + generated */
} task_list;

static void tasks_free(task_list *tl)
{
    for (size_t i = 0; i < tl->n; i++) {
        free(tl->t[i].ids);
        free(tl->t[i].answer);
    }
    free(tl->t);
}

/* The corpus's task documents (passkey, kv-recall) as prompts and answers. */
static kvq_status read_tasks(const kvq_corpus *corpus, const kvq_tokenizer *tok, task_list *tl,
                             kvq_err *err)
{
    kvq_corpus_iter *it = NULL;
    const kvq_corpus_doc *doc;
    kvq_status s = kvq_corpus_iter_new(corpus, &it, err);
    while (!s && !(s = kvq_corpus_iter_next(it, &doc, err)) && doc) {
        if (doc->task == KVQ_TASK_NONE || !doc->text)
            continue;
        task t = {.kind = doc->task};
        int32_t *ans = NULL;
        size_t n_ans = 0;
        if ((s = kvq_tokenizer_encode(tok, doc->text, doc->len, KVQ_ENCODE_MODEL_BOS, &t.ids,
                                      &t.n, err)) ||
            (s = kvq_tokenizer_encode(tok, doc->answer, strlen(doc->answer), 0, &ans, &n_ans,
                                      err))) {
            free(t.ids);
            break;
        }
        free(ans);
        t.n_gen = (int32_t)n_ans + 2;
        t.answer = strdup(doc->answer);
        task *nt = realloc(tl->t, sizeof *nt * (tl->n + 1));
        if (!t.answer || !nt) {
            free(t.ids);
            free(t.answer);
            s = kvq_err_set(err, KVQ_E_NOMEM, "eval: out of memory");
            break;
        }
        tl->t = nt;
        tl->t[tl->n++] = t;
        if ((int64_t)t.n + t.n_gen > tl->longest)
            tl->longest = (int64_t)t.n + t.n_gen;
    }
    kvq_corpus_iter_free(it);
    return s;
}

/* ---- measurements ---------------------------------------------------------------- */

/* Summed NLL and predicted tokens over every sequence, with f's current attention. */
static kvq_status perplexity(kvq_forward *f, const seq_list *l, int32_t chunk, int32_t vocab,
                             float *logits, double *nll, uint64_t *n_pred, kvq_err *err)
{
    *nll = 0;
    *n_pred = 0;
    for (size_t q = 0; q < l->n; q++) {
        const int32_t *ids = l->ids + l->off[q];
        const int64_t n = l->off[q + 1] - l->off[q];
        kvq_forward_reset(f);
        for (int64_t at = 0; at < n; at += chunk) {
            const int64_t cn = n - at < chunk ? n - at : chunk;
            kvq_status s = kvq_forward_tokens(f, ids + at, cn, KVQ_LOGITS_ALL, logits, err);
            if (s)
                return s;
            for (int64_t i = 0; i < cn && at + i + 1 < n; i++) {
                *nll += kvq_token_nll(logits + i * vocab, vocab, ids[at + i + 1]);
                (*n_pred)++;
            }
        }
    }
    return KVQ_OK;
}

/* Correct answers per task kind [3] (indexed by kvq_corpus_task). */
static kvq_status answer_tasks(kvq_forward *f, const kvq_tokenizer *tok, const task_list *tl,
                               int32_t vocab, float *logits, int32_t *ids, int correct[3],
                               kvq_err *err)
{
    memset(correct, 0, sizeof(int) * 3);
    for (size_t i = 0; i < tl->n; i++) {
        const task *t = &tl->t[i];
        kvq_status s;
        kvq_forward_reset(f);
        memcpy(ids, t->ids, sizeof(int32_t) * t->n);
        if ((s = kvq_forward_tokens(f, ids, (int64_t)t->n, KVQ_LOGITS_LAST, logits, err)))
            return s;
        size_t n = t->n;
        for (int32_t g = 0; g < t->n_gen; g++) {
            int32_t next = kvq_sample_token(logits, vocab, 0, 1, NULL, NULL, NULL);
            ids[n++] = next;
            if (g + 1 < t->n_gen &&
                (s = kvq_forward_tokens(f, &next, 1, KVQ_LOGITS_LAST, logits, err)))
                return s;
        }
        /* the continuation is the text past the decoded prompt */
        char *full = NULL, *prompt = NULL;
        size_t lf = 0, lp = 0;
        if ((s = kvq_tokenizer_decode(tok, ids, n, 0, &full, &lf, err)) ||
            (s = kvq_tokenizer_decode(tok, ids, t->n, 0, &prompt, &lp, err))) {
            free(full);
            return s;
        }
        const char *cont = full + (lp <= lf ? lp : lf);
        while (*cont == ' ' || *cont == '\n')
            cont++;
        correct[t->kind] += !strncmp(cont, t->answer, strlen(t->answer));
        free(full);
        free(prompt);
    }
    return KVQ_OK;
}

/* ---- the command ------------------------------------------------------------------ */

typedef struct row_result {
    double nll, ppl;
    kvq_retrieval_stats st;
    int correct[3];
} row_result;

static double mean(double sum, uint64_t n) { return n ? sum / (double)n : NAN; }

int cli_eval_retrieval(cli_retrieval *o, const kvq_model *m, const char *model_path,
                       const char *spec, const kvq_corpus *corpus, const kvq_tokenizer *tok,
                       int64_t seq_len, int64_t max_tokens, int32_t threads, int json,
                       const kvq_callbacks *cb)
{
    const kvq_model_config *c = kvq_model_config_get(m);
    kvq_runtime *rt = NULL;
    cli_row *rows = NULL;
    row_result *res = NULL;
    size_t n_rows = 0;
    seq_list sl = {0};
    task_list tl = {0};
    kvq_forward *f = NULL;
    kvq_retrieval *r = NULL;
    float *logits = NULL;
    int32_t *ids = NULL;
    kvq_err e = {0};
    int rc = 0, ref_correct[3] = {0};
    int n_task[3] = {0};
    kvq_status s;

    if ((rc = cli_retrieval_open(o, m, model_path, cb, &rt)) ||
        (rc = cli_retrieval_rows("eval", o, rt, &rows, &n_rows)))
        goto done;
    kvq_seq_params sp;
    kvq_seq_params_default(&sp);
    sp.seq_len = (uint32_t)seq_len;
    sp.max_tokens = (uint64_t)max_tokens;
    kvq_corpus_stats stats;
    if ((s = kvq_corpus_tokenize(corpus, tok, &sp, cb, keep_seq, &sl, &stats, &e)) ||
        (s = read_tasks(corpus, tok, &tl, &e))) {
        rc = cli_fail(&e);
        goto done;
    }
    for (size_t i = 0; i < tl.n; i++)
        n_task[tl.t[i].kind]++;
    const int64_t longest = tl.longest > seq_len ? tl.longest : seq_len;
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = threads;
    fp.max_tokens = longest;
    fp.cb = *cb;
    fp.cb.progress = NULL;
    res = calloc(n_rows, sizeof *res);
    logits = malloc(sizeof(float) * (size_t)fp.chunk * c->vocab_size);
    ids = malloc(sizeof(int32_t) * (size_t)longest);
    if (!res || !logits || !ids) {
        rc = cli_failf(1, "%s: out of memory", model_path);
        goto done;
    }
    if (kvq_forward_create(m, &fp, &f, &e) != KVQ_OK) {
        rc = cli_fail(&e);
        goto done;
    }

    /* the reference: full attention */
    double ref_nll;
    uint64_t n_pred;
    double t0 = kvq_now();
    if ((s = perplexity(f, &sl, fp.chunk, c->vocab_size, logits, &ref_nll, &n_pred, &e)) ||
        (s = answer_tasks(f, tok, &tl, c->vocab_size, logits, ids, ref_correct, &e))) {
        rc = cli_fail(&e);
        goto done;
    }
    if (n_pred == 0) {
        rc = cli_failf(1, "%s: no token to predict (sequences too short)", spec);
        goto done;
    }
    ref_nll /= (double)n_pred;
    kvq_log(cb, KVQ_LOG_INFO, "full attention: perplexity %.4f (%.2f s)", exp(ref_nll),
            kvq_now() - t0);

    for (size_t i = 0; i < n_rows; i++) {
        kvq_retrieval_params p = o->p;
        p.selector = rows[i].selector;
        p.budget = rows[i].budget;
        p.max_tokens = longest;
        p.cb = *cb;
        t0 = kvq_now();
        for (int pass = 0; pass < 2; pass++) {
            /* pass 0: perplexity, retrieval at every position, with measurements;
             * pass 1: the tasks, exact prompt then retrieval */
            p.prefill_full = pass;
            p.measure = !pass;
            if (pass == 1 && tl.n == 0)
                break;
            if (kvq_retrieval_create(c, rt, &p, &r, &e) != KVQ_OK) {
                rc = cli_fail(&e);
                goto done;
            }
            const kvq_attn_backend b = kvq_retrieval_backend(r);
            kvq_forward_set_attention(f, &b);
            uint64_t np;
            s = pass ? answer_tasks(f, tok, &tl, c->vocab_size, logits, ids, res[i].correct, &e)
                     : perplexity(f, &sl, fp.chunk, c->vocab_size, logits, &res[i].nll, &np, &e);
            if (!pass)
                kvq_retrieval_stats_get(r, &res[i].st);
            kvq_forward_set_attention(f, NULL);
            kvq_retrieval_free(r);
            r = NULL;
            if (s) {
                rc = cli_fail(&e);
                goto done;
            }
        }
        res[i].nll /= (double)n_pred;
        res[i].ppl = exp(res[i].nll);
        kvq_log(cb, KVQ_LOG_INFO, "%s, budget %s: perplexity %.4f (%.2f s)", rows[i].name,
                rows[i].budget_str, res[i].ppl, kvq_now() - t0);
    }

    /* ---- report */
    const char *method = rt ? kvq_codebook_method_name(kvq_runtime_method(rt)) : NULL;
    const int32_t window = o->p.window ? o->p.window : rt ? kvq_runtime_wrope_w(rt) : 64;
    const char *cache = o->p.cache_dtype == KVQ_DT_F16 ? "f16" : "f32";
    const char *pos = kvq_positions_name(o->p.positions);
    if (json) {
        printf("{\"model\": ");
        kvq_json_write_str(stdout, model_path);
        printf(", \"corpus\": ");
        kvq_json_write_str(stdout, spec);
        printf(", \"corpus_hash\": \"%016llx\", \"attention\": \"retrieval\", \"artifact\": ",
               (unsigned long long)stats.hash);
        if (o->artifact)
            kvq_json_write_str(stdout, o->artifact);
        else
            printf("null");
        printf(", \"method\": ");
        if (method)
            kvq_json_write_str(stdout, method);
        else
            printf("null");
        printf(", \"positions\": \"%s\", \"sink\": %d, \"window\": %d, \"cache\": \"%s\", "
               "\"group\": \"%s\", \"tau\": %.6g, \"seq_len\": %lld, \"sequences\": %zu, "
               "\"tokens\": %llu, \"predicted\": %llu, \"reference\": {\"nll\": %.6f, "
               "\"perplexity\": %.6f, \"passkey\": [%d, %d], \"kv_recall\": [%d, %d]}, \"rows\": [",
               pos, (int)o->p.sink, (int)window, cache, o->p.group == KVQ_GROUP_SUM ? "sum" : "max",
               o->p.tau, (long long)seq_len, sl.n, (unsigned long long)stats.n_tokens,
               (unsigned long long)n_pred, ref_nll, exp(ref_nll), ref_correct[KVQ_TASK_PASSKEY],
               n_task[KVQ_TASK_PASSKEY], ref_correct[KVQ_TASK_KV_RECALL],
               n_task[KVQ_TASK_KV_RECALL]);
        for (size_t i = 0; i < n_rows; i++) {
            const kvq_retrieval_stats *st = &res[i].st;
            printf(
                "%s{\"selector\": \"%s\", \"budget\": \"%s\", \"nll\": %.6f, \"perplexity\": %.6f, "
                "\"perplexity_delta\": %.6f, \"steps\": %llu, ",
                i ? ", " : "", rows[i].name, rows[i].budget_str, res[i].nll, res[i].ppl,
                res[i].ppl - exp(ref_nll), (unsigned long long)st->steps);
            if (st->steps)
                printf("\"recall_topk\": %.6f, \"recall_mass\": %.6f, \"out_rel_err\": %.6f, "
                       "\"kv_read_fraction\": %.6f, \"attended_fraction\": %.6f, ",
                       mean(st->recall_topk, st->measured), mean(st->recall_mass, st->measured),
                       mean(st->out_rel_err, st->measured), st->bytes_read / st->bytes_full,
                       st->attended / st->visible);
            else
                printf("\"recall_topk\": null, \"recall_mass\": null, \"out_rel_err\": null, "
                       "\"kv_read_fraction\": null, \"attended_fraction\": null, ");
            printf("\"passkey\": [%d, %d], \"kv_recall\": [%d, %d]}",
                   res[i].correct[KVQ_TASK_PASSKEY], n_task[KVQ_TASK_PASSKEY],
                   res[i].correct[KVQ_TASK_KV_RECALL], n_task[KVQ_TASK_KV_RECALL]);
        }
        printf("]}\n");
    } else {
        printf("model       %s\n", model_path);
        printf("corpus      %s\n", spec);
        printf("attention   retrieval: ");
        if (rt)
            printf("artifact %s (%s, K %d, G %d), ", o->artifact, method,
                   (int)kvq_runtime_codebook_size(rt), (int)kvq_runtime_groups(rt));
        printf("positions %s, sink %d, window %d, cache %s, group %s\n", pos, (int)o->p.sink,
               (int)window, cache, o->p.group == KVQ_GROUP_SUM ? "sum" : "max");
        printf("sequences   %zu of up to %lld tokens\n", sl.n, (long long)seq_len);
        printf("tokens      %llu (%llu predicted)\n", (unsigned long long)stats.n_tokens,
               (unsigned long long)n_pred);
        printf("reference   full attention: nll %.6f nats/token, perplexity %.4f\n", ref_nll,
               exp(ref_nll));
        if (tl.n)
            printf("tasks       passkey %d/%d, kv-recall %d/%d (full attention)\n",
                   ref_correct[KVQ_TASK_PASSKEY], n_task[KVQ_TASK_PASSKEY],
                   ref_correct[KVQ_TASK_KV_RECALL], n_task[KVQ_TASK_KV_RECALL]);
        printf("\n%-12s %-7s %10s %9s %7s %7s %8s %8s %8s %9s\n", "selector", "budget", "ppl",
               "d_ppl", "recall", "mass", "out_err", "kv_read", "passkey", "kv-recall");
        for (size_t i = 0; i < n_rows; i++) {
            const kvq_retrieval_stats *st = &res[i].st;
            char pk[32], kv[32];
            snprintf(pk, sizeof pk, "%d/%d", res[i].correct[KVQ_TASK_PASSKEY],
                     n_task[KVQ_TASK_PASSKEY]);
            snprintf(kv, sizeof kv, "%d/%d", res[i].correct[KVQ_TASK_KV_RECALL],
                     n_task[KVQ_TASK_KV_RECALL]);
            printf("%-12s %-7s %10.4f %+9.4f", rows[i].name, rows[i].budget_str, res[i].ppl,
                   res[i].ppl - exp(ref_nll));
            if (st->steps)
                printf(" %7.3f %7.3f %8.4f %7.2f%%", mean(st->recall_topk, st->measured),
                       mean(st->recall_mass, st->measured), mean(st->out_rel_err, st->measured),
                       100.0 * st->bytes_read / st->bytes_full);
            else
                printf(" %7s %7s %8s %8s", "-", "-", "-", "-");
            printf(" %8s %9s\n", pk, kv);
        }
    }
done:
    kvq_retrieval_free(r);
    kvq_forward_free(f);
    kvq_runtime_close(rt);
    tasks_free(&tl);
    free(sl.ids);
    free(sl.off);
    free(rows);
    free(res);
    free(logits);
    free(ids);
    return rc;
}
