/* cmd_eval.c — `kvq eval`: perplexity of a model on a corpus, full attention; with
 * --artifact / --selectors, the retrieval table of cli/eval_table.c (the harness of kvq/eval.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/eval_kv.h"
#include "cli/eval_suite.h"
#include "cli/opts.h"
#include "cli/retrieval_opts.h"
#include "kvq/corpus.h"
#include "kvq/eval.h"
#include "kvq/model.h"
#include "kvq/perplexity.h"
#include "kvq/tokenizer.h"

static void eval_usage(FILE *f)
{
    fprintf(f,
            "usage: kvq eval --model M --corpus SPEC [options]\n"
            "\n"
            "Reports the perplexity exp(mean negative log-likelihood) of the corpus with\n"
            "exact (full) attention, counted as llama.cpp's perplexity tool counts it\n"
            "(--score second-half, the default): the corpus is one token stream (documents\n"
            "joined by the model's separator), starting with BOS when the model adds one\n"
            "(tokenizer.ggml.add_bos_token, HF add_bos_token); it is cut into chunks of\n"
            "--seq-len tokens (the tokens after the last whole chunk are not scored); each\n"
            "chunk runs from an empty cache with its first token replaced by BOS when the\n"
            "model adds one, and only its second half is scored: the tokens at positions\n"
            "seq-len/2 + 1 .. seq-len - 1, seq-len/2 - 1 per chunk of even length.\n"
            "--score all: every token after the first of sequences of --seq-len tokens\n"
            "(a BOS put at the start of each when the model adds one; a shorter last\n"
            "sequence kept).\n"
            "--score last:N: the long-context way (a server's prefill, then decoding):\n"
            "sequences of --seq-len tokens as with all; per sequence only the predictions\n"
            "of its last N tokens are scored (all when it is shorter than N + 1). With\n"
            "retrieval options the prompt before them is attended exactly, as a prefill,\n"
            "and each of the N is a one-token decode step with retrieval over the whole\n"
            "cache; with full attention the figure is the same positions' loss.\n"
            "\n"
            "options:\n"
            "  --model M          GGUF file or HF directory (required)\n"
            "  --corpus SPEC      corpus (required): file:PATH, dir:PATH, jsonl:PATH,\n"
            "                     ids:PATH, uuid:N, passkey:N, kv-recall:N or a plain path,\n"
            "                     comma-separated (see docs)\n"
            "  --seq-len N        tokens per sequence, 2 .. 1048576 (default 512)\n"
            "  --max-tokens N     stop after N tokens; 0 = the whole corpus (default 0)\n"
            "  --score MODE       second-half (default; llama-perplexity), all, or last:N\n"
            "                     (above)\n"
            "  --accept-approx-tokenizer\n"
            "                     use a tokenizer whose pre-tokenizer kvq does not\n"
            "                     implement, approximated by the GPT-2 split (default:\n"
            "                     refused, naming it)\n"
            "  --seed S           seed of the synthetic corpus sources (default 0)\n"
            "  --passkey-filler N filler lines per passkey: document (default 40; about 25\n"
            "                     tokens each with SmolLM2: 160 for a 4K prompt)\n"
            "  --kv-pairs N       pairs per kv-recall: document (default 32)\n"
            "  --threads T        threads (default: all CPUs; same bytes for any T)\n"
            "  --suite ruler[:TASK,...]\n"
            "                     the RULER-style long-context tasks (docs/ruler.md) instead\n"
            "                     of perplexity, with --corpus as the filler text: tasks\n"
            "                     niah_single_number, niah_single_uuid, niah_multikey,\n"
            "                     niah_multivalue, niah_multiquery, vt, cwe (default: all)\n"
            "  --lengths L,...    suite prompt lengths in the model's tokens, prompt plus\n"
            "                     answer, at most the model's context (default 4096)\n"
            "  --samples N        suite prompts per task and length (default 4)\n"
            "  --json             print one JSON object instead of the text report\n"
            "  -q, --quiet        nothing on stderr but errors\n"
            "  -v, --verbose      more detail\n"
            "  -h, --help         this help\n"
            "\n");
    cli_retrieval_usage(f, 1);
    cli_kv_usage_list(f);
    fprintf(f,
            "\n"
            "With retrieval options, eval first measures full attention (the reference), then\n"
            "for every selector and budget: perplexity with retrieval at every predicted\n"
            "position (d_ppl: minus the reference), recall of the oracle's top-K tokens,\n"
            "exact attention mass on the attended tokens, relative error of the attention\n"
            "output, the fraction of the KV cache read per step, and the passkey and\n"
            "kv-recall accuracy of the corpus's task documents (prompt attended exactly,\n"
            "answer decoded greedily with retrieval). An exact prefill (--score last:N,\n"
            "the task prompts) runs once and is replayed into every row.\n"
            "\n"
            "With --suite, each prompt's context is prefilled once with full attention and\n"
            "replayed into every row; the question and the answer are decoded greedily with\n"
            "the row's retrieval (full attention always gets a row: the dense score) and\n"
            "scored with RULER's string match (the share of the expected strings found in the\n"
            "answer). The table gives the score in percent per task and length and the gap\n"
            "to full attention in points; --json gives one row per selector, budget, task\n"
            "and length (score, stderr, dense, gap, per-prompt scores and answers).\n"
            "\n"
            "examples: kvq eval --model stories260K.gguf --corpus uuid:8 --seq-len 256\n"
            "          kvq eval --model M --artifact M.kvq --suite ruler --corpus dir:TEXTS \\\n"
            "              --lengths 4096,8192 --samples 4 --selectors codebook --budgets 6%%\n"
            "          kvq eval --model M --artifact M.kvq --corpus passkey:8 --budgets 3%%,6%%\n"
            "          kvq eval --model M --artifact M.kvq --corpus dir:TEXTS --seq-len 2048 \\\n"
            "              --kv all --selectors codebook --budgets 6%%\n");
}

typedef struct eval_opts {
    cli_model_opts m;     /* --model --seed (of the corpus) --threads -q -v */
    const char *spec;     /* --corpus */
    int64_t seq_len, max_tokens;
    int json, score_all;
    int64_t score_last;   /* --score last:N: N, else 0 */
    int64_t passkey_filler, kv_pairs; /* --passkey-filler, --kv-pairs (0: the defaults) */
    cli_retrieval ro;
    cli_kv kv;            /* --kv and its parameters (cli/eval_kv.c) */
    cli_suite su;         /* --suite --lengths --samples (cli/eval_suite.c) */
    int suite_opt;        /* --lengths or --samples given */
} eval_opts;

/* Parses argv into o: -1 to go on, else the exit code (0 after --help). */
static int eval_parse(int argc, char **argv, eval_opts *o)
{
    const char *cmd = "eval";
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int r = cli_kv_opt_list(cmd, &o->kv, argc, argv, &i);
        if (r < 0)
            r = cli_retrieval_opt(cmd, &o->ro, argc, argv, &i, 1);
        if (r < 0)
            r = cli_model_opt(cmd, &o->m, argc, argv, &i);
        if (r >= 0) {
            if (r)
                return r;
            continue;
        }
        if (cli_is_help(a)) {
            eval_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--score")) {
            if (val && !strncmp(val, "last:", 5)) {
                if ((rc = cli_opt_i64(cmd, a, val + 5, 1, 1 << 20, &o->score_last)))
                    return rc;
            } else if (!val || (strcmp(val, "all") && strcmp(val, "second-half"))) {
                return cli_failf(2, "eval: --score must be second-half, all or last:N");
            }
            o->score_all = val && strcmp(val, "second-half");
            i++;
        } else if (!strcmp(a, "--corpus")) {
            if (!val)
                return cli_failf(2, "eval: %s needs a value", a);
            o->spec = val;
            i++;
        } else if (!strcmp(a, "--seq-len")) {
            if ((rc = cli_opt_i64(cmd, a, val, 2, 1 << 20, &o->seq_len)))
                return rc;
            i++;
        } else if (!strcmp(a, "--max-tokens")) {
            if ((rc = cli_opt_i64(cmd, a, val, 0, INT64_MAX, &o->max_tokens)))
                return rc;
            i++;
        } else if (!strcmp(a, "--passkey-filler")) {
            if ((rc = cli_opt_i64(cmd, a, val, 0, 1000000, &o->passkey_filler)))
                return rc;
            i++;
        } else if (!strcmp(a, "--suite")) {
            if (!val)
                return cli_failf(2, "eval: %s needs a value", a);
            o->su.suite = val;
            i++;
        } else if (!strcmp(a, "--lengths")) {
            if ((rc = cli_suite_lengths(val, o->su.lengths, &o->su.n_lengths)))
                return rc;
            o->suite_opt = 1;
            i++;
        } else if (!strcmp(a, "--samples")) {
            int64_t n = 0;
            if ((rc = cli_opt_i64(cmd, a, val, 1, 100000, &n)))
                return rc;
            o->su.samples = (uint32_t)n;
            o->suite_opt = 1;
            i++;
        } else if (!strcmp(a, "--kv-pairs")) {
            if ((rc = cli_opt_i64(cmd, a, val, 1, 65536, &o->kv_pairs)))
                return rc;
            i++;
        } else {
            eval_usage(stderr);
            return cli_failf(2, "eval: unknown option '%s'", a);
        }
    }
    if (!o->m.model || !o->spec) {
        eval_usage(stderr);
        return cli_failf(2, "eval: --model and --corpus are required");
    }
    if (o->suite_opt && !o->su.suite)
        return cli_failf(2, "eval: --lengths and --samples need --suite");
    if (o->su.suite && (o->kv.kind != KVQ_KV_F16 || o->kv.list))
        return cli_failf(2, "eval: --suite with --kv is not implemented");
    if (o->su.suite && o->score_last)
        return cli_failf(2, "eval: --suite scores answers; --score does not apply");
    return -1;
}

/* Perplexity with full attention over the corpus (kvq_eval_full), printed as text or
 * JSON. */
static int eval_full(const eval_opts *o, const kvq_model *m, const kvq_corpus *corpus,
                     const kvq_tokenizer *tok, const kvq_callbacks *cb)
{
    const char *model_path = o->m.model, *spec = o->spec;
    const int64_t seq_len = o->seq_len;
    const int half = !o->score_all;
    kvq_err e = {0};
    kvq_eval_params p = kvq_eval_params_default();
    p.threads = (int32_t)o->m.threads;
    p.last = o->score_last;
    p.name = spec;
    p.cb = *cb;
    kvq_eval_full_result r;
    if (kvq_eval_full(m, corpus, tok, seq_len, o->max_tokens, half, &p, &r, &e) != KVQ_OK)
        return cli_fail(&e);
    const double secs = r.seconds;
    char score[32];
    if (o->score_last)
        snprintf(score, sizeof score, "last:%lld", (long long)o->score_last);
    else
        snprintf(score, sizeof score, "%s", half ? "second-half" : "all");
    if (o->json) {
        printf("{\"model\": ");
        kvq_json_write_str(stdout, model_path);
        printf(", \"corpus\": ");
        kvq_json_write_str(stdout, spec);
        printf(", \"corpus_hash\": \"%016llx\", \"attention\": \"full\", \"seq_len\": %lld, "
               "\"score\": \"%s\", \"sequences\": %llu, \"tokens\": %llu, \"predicted\": %llu, "
               "\"nll\": %.6f, "
               "\"perplexity\": %.6f, \"seconds\": %.3f, \"tokens_per_second\": %.1f}\n",
               (unsigned long long)r.stats.hash, (long long)seq_len,
               score, (unsigned long long)r.n_seq, (unsigned long long)r.stats.n_tokens,
               (unsigned long long)r.n_pred, r.nll, r.ppl, secs,
               secs > 0 ? (double)r.stats.n_tokens / secs : 0.0);
    } else {
        printf("model       %s\n", model_path);
        printf("corpus      %s\n", spec);
        printf("attention   full\n");
        if (half)
            printf("chunks      %llu of %lld tokens, second half scored (as llama-perplexity)\n",
                   (unsigned long long)r.n_seq, (long long)seq_len);
        else if (o->score_last)
            printf("sequences   %llu of up to %lld tokens, the last %lld scored\n",
                   (unsigned long long)r.n_seq, (long long)seq_len, (long long)o->score_last);
        else
            printf("sequences   %llu of up to %lld tokens\n", (unsigned long long)r.n_seq,
                   (long long)seq_len);
        printf("tokens      %llu (%llu predicted)\n", (unsigned long long)r.stats.n_tokens,
               (unsigned long long)r.n_pred);
        printf("nll         %.6f nats/token\n", r.nll);
        printf("perplexity  %.4f\n", r.ppl);
    }
    kvq_log(cb, KVQ_LOG_INFO, "%llu tokens in %.3f s (%.1f tokens/s)",
            (unsigned long long)r.stats.n_tokens, secs,
            secs > 0 ? (double)r.stats.n_tokens / secs : 0.0);
    return 0;
}

int cmd_eval(int argc, char **argv)
{
    eval_opts o = {.seq_len = 512, .su = {.lengths = {4096}, .n_lengths = 1, .samples = 4}};
    cli_retrieval_init(&o.ro);
    cli_kv_init(&o.kv);
    int rc = eval_parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    const char *model_path = o.m.model;
    kvq_callbacks cb = cli_callbacks(o.m.verbose, o.m.quiet);
    if (o.json)
        cli_progress_json(); /* progress lines on stderr as JSON too */
    kvq_err e = {0};
    kvq_model *m = NULL;
    kvq_corpus *corpus = NULL;
    kvq_tokenizer *ids_tok = NULL;
    kvq_model_params mp = kvq_model_params_default();
    mp.cb = cb;
    if ((rc = cli_check_corpus(o.spec)))
        goto done;
    mp.accept_approx_tokenizer = o.m.approx_tokenizer;
    if (kvq_model_open(model_path, &mp, &m, &e) != KVQ_OK) {
        rc = cli_fail(&e);
        goto done;
    }
    const kvq_model_config *c = kvq_model_config_get(m);
    kvq_corpus_params cp;
    kvq_corpus_params_default(&cp);
    cp.seed = (uint64_t)o.m.seed;
    if (o.passkey_filler)
        cp.passkey_filler = (uint32_t)o.passkey_filler;
    if (o.kv_pairs)
        cp.kv_pairs = (uint32_t)o.kv_pairs;
    if (kvq_corpus_open(o.spec, &cp, &corpus, &e) != KVQ_OK) {
        rc = cli_fail(&e);
        goto done;
    }
    /* A model without a tokenizer can still be evaluated on ids: corpora. */
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    if (!tok) {
        if (kvq_tokenizer_new_ids((uint32_t)c->vocab_size, c->bos_id, c->eos_id, &ids_tok, &e)) {
            rc = cli_fail(&e);
            goto done;
        }
        tok = ids_tok;
    }
    o.su.seed = (uint64_t)o.m.seed;
    if (o.su.suite)
        rc = cli_eval_suite(&o.ro, m, model_path, o.spec, corpus, tok, &o.su,
                            (int32_t)o.m.threads, o.json, &cb);
    else if (o.kv.list || o.kv.kind != KVQ_KV_F16 ||
             (o.kv.given && (o.ro.selectors || o.ro.budgets))) /* cache kinds (eval_kv.c) */
        rc = cli_eval_kv(&o.kv, &o.ro, m, model_path, o.spec, corpus, tok, o.seq_len,
                         o.max_tokens, (int32_t)o.m.threads, o.json, &cb);
    else if (o.ro.given)
        rc = cli_eval_retrieval(&o.ro, m, model_path, o.spec, corpus, tok, o.seq_len,
                                o.max_tokens, o.score_last, (int32_t)o.m.threads, o.json, &cb);
    else
        rc = eval_full(&o, m, corpus, tok, &cb);
done:
    kvq_tokenizer_free(ids_tok);
    kvq_corpus_free(corpus);
    kvq_model_close(m);
    return rc;
}
