/* cmd_run.c — `kvq run`: generate text from a model with full attention, or with
 * retrieval attention (--artifact / --selector: cli/retrieval.c, kvq/runtime.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/retrieval.h"
#include "kvq/model.h"
#include "kvq/tokenizer.h"

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: kvq run --model M [options]\n"
            "\n"
            "Generates text from the model M (a GGUF file or a Hugging Face directory)\n"
            "with exact (full) attention, and prints the prompt followed by the\n"
            "continuation on stdout. Timing and the memory estimate go to stderr.\n"
            "Generation stops after N tokens or at an end-of-sequence token.\n"
            "With --artifact or --selector the prompt is still attended exactly, and every\n"
            "generated token attends to the sink tokens, the recent window and the tokens\n"
            "the selector retrieves (the fraction of the KV cache read goes to stderr).\n"
            "\n"
            "options:\n"
            "  --model M          GGUF file or HF directory (required)\n"
            "  --prompt TEXT      text to continue (default: empty, start from BOS)\n"
            "  -n N               tokens to generate, 1 .. 1000000 (default 256)\n"
            "  --temp T           sampling temperature; 0 = greedy (default 0.8)\n"
            "  --top-p P          nucleus sampling mass, (0, 1] (default 0.95)\n"
            "  --seed S           sampling seed (default 0)\n"
            "  --threads T        BLAS threads (default: OpenBLAS's choice)\n"
            "  -q, --quiet        nothing on stderr but errors\n"
            "  -v, --verbose      more detail\n"
            "  -h, --help         this help\n"
            "\n");
    cli_retrieval_usage(f, 0);
    fprintf(f, "\n"
               "examples: kvq run --model stories260K.gguf -n 48 --temp 0\n"
               "          kvq run --model M --artifact M.kvq --budget 6%% --prompt \"...\"\n");
}

/* Prints the bytes of decode(ids) past *printed (decoding the whole prefix keeps
 * multi-byte characters and the dropped dummy-prefix space right). */
static int print_new_text(const kvq_tokenizer *tok, const int32_t *ids, size_t n,
                          size_t *printed, kvq_err *e)
{
    char *text = NULL;
    size_t len = 0;
    if (kvq_tokenizer_decode(tok, ids, n, 0, &text, &len, e) != KVQ_OK)
        return -1;
    if (len > *printed) {
        fwrite(text + *printed, 1, len - *printed, stdout);
        fflush(stdout);
        *printed = len;
    }
    free(text);
    return 0;
}

static void log_memory(const kvq_callbacks *cb, const kvq_model *m, const kvq_forward_params *p,
                       int64_t n_ctx)
{
    kvq_model_memory mem;
    kvq_model_memory_estimate(m, p, n_ctx, &mem);
    kvq_log(cb, KVQ_LOG_INFO,
            "memory: about %.1f MiB (weights %.1f MiB mapped, %.1f MiB converted to f32, "
            "KV cache %.1f MiB, scratch %.1f MiB)",
            mem.total_bytes / 1048576.0, mem.mapped_bytes / 1048576.0,
            mem.converted_bytes / 1048576.0, mem.kv_cache_bytes / 1048576.0,
            mem.scratch_bytes / 1048576.0);
}

int cmd_run(int argc, char **argv)
{
    const char *cmd = "run", *model_path = NULL, *prompt = "";
    int64_t n_gen = 256, seed = 0, threads = 0;
    double temp = 0.8, top_p = 0.95;
    int quiet = 0, verbose = 0, rc = 0;
    cli_retrieval ro;
    cli_retrieval_init(&ro);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        const int r = cli_retrieval_opt(cmd, &ro, argc, argv, &i, 0);
        if (r >= 0) {
            if (r)
                return r;
            continue;
        }
        if (cli_is_help(a)) {
            run_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose++;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--prompt")) {
            if (!val)
                return cli_failf(2, "run: %s needs a value", a);
            if (!strcmp(a, "--model"))
                model_path = val;
            else
                prompt = val;
            i++;
        } else if (!strcmp(a, "-n")) {
            if ((rc = cli_opt_i64(cmd, a, val, 1, 1000000, &n_gen)))
                return rc;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if ((rc = cli_opt_i64(cmd, a, val, 0, INT64_MAX, &seed)))
                return rc;
            i++;
        } else if (!strcmp(a, "--threads")) {
            if ((rc = cli_opt_i64(cmd, a, val, 1, 1024, &threads)))
                return rc;
            i++;
        } else if (!strcmp(a, "--temp")) {
            if ((rc = cli_opt_f64(cmd, a, val, 0, 100, &temp)))
                return rc;
            i++;
        } else if (!strcmp(a, "--top-p")) {
            if ((rc = cli_opt_f64(cmd, a, val, 1e-9, 1, &top_p)))
                return rc;
            i++;
        } else {
            run_usage(stderr);
            return cli_failf(2, "run: unknown option '%s'", a);
        }
    }
    if (!model_path) {
        run_usage(stderr);
        return cli_failf(2, "run: --model is required");
    }
    if (ro.given && !ro.artifact && !ro.selectors)
        return cli_failf(2, "run: retrieval options need --artifact or --selector");
    if (ro.selectors && strchr(ro.selectors, ','))
        return cli_failf(2, "run: --selector takes one selector");
    if (ro.budgets && strchr(ro.budgets, ','))
        return cli_failf(2, "run: --budget takes one budget");

    kvq_callbacks cb = cli_callbacks(verbose, quiet);
    kvq_err e = {0};
    kvq_model *m = NULL;
    kvq_forward *f = NULL;
    kvq_runtime *rt = NULL;
    kvq_retrieval *ret = NULL;
    cli_row *rows = NULL;
    size_t n_rows = 0;
    int32_t *ids = NULL, *prompt_ids = NULL, *work_i = NULL;
    float *logits = NULL, *work_p = NULL;
    size_t n_prompt = 0, printed = 0;
    kvq_model_params mp = kvq_model_params_default();
    mp.cb = cb;
    if (kvq_model_open(model_path, &mp, &m, &e) != KVQ_OK) {
        rc = cli_fail(&e);
        goto done;
    }
    const kvq_model_config *c = kvq_model_config_get(m);
    if (ro.given) {
        /* retrieval: one selector and budget (default: the artifact's codebook, 6%),
         * checked before anything runs */
        if ((rc = cli_retrieval_open(&ro, m, model_path, &cb, &rt)))
            goto done;
        if (!ro.selectors)
            ro.selectors = "codebook";
        if ((rc = cli_retrieval_rows(cmd, &ro, rt, &rows, &n_rows)))
            goto done;
    }
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    if (!tok) {
        rc = cli_failf(1, "%s: the model has no tokenizer", model_path);
        goto done;
    }
    /* BOS only when the model adds one (SmolLM2 does not); an empty prompt still needs
     * one token to start from */
    unsigned eflags = KVQ_ENCODE_MODEL_BOS;
    if (!prompt[0] && kvq_tokenizer_bos(tok) >= 0)
        eflags = KVQ_ENCODE_BOS;
    if (kvq_tokenizer_encode(tok, prompt, strlen(prompt), eflags, &prompt_ids, &n_prompt,
                             &e) != KVQ_OK) {
        rc = cli_fail(&e);
        goto done;
    }

    const int64_t total = (int64_t)n_prompt + n_gen;
    if (c->context_length > 0 && total > c->context_length)
        kvq_log(&cb, KVQ_LOG_WARN, "%s: %lld tokens exceed the trained context of %d", model_path,
                (long long)total, c->context_length);
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = (int32_t)threads;
    fp.max_tokens = total;
    fp.cb = cb;
    log_memory(&cb, m, &fp, total);
    ids = malloc(sizeof *ids * (size_t)total);
    logits = malloc(sizeof *logits * (size_t)c->vocab_size);
    work_p = malloc(sizeof *work_p * (size_t)c->vocab_size);
    work_i = malloc(sizeof *work_i * (size_t)c->vocab_size);
    if (!ids || !logits || !work_p || !work_i) {
        rc = cli_failf(1, "%s: out of memory", model_path);
        goto done;
    }
    if (kvq_forward_create(m, &fp, &f, &e) != KVQ_OK) {
        rc = cli_fail(&e);
        goto done;
    }
    if (ro.given) {
        kvq_retrieval_params rp = ro.p;
        rp.selector = rows[0].selector;
        rp.budget = rows[0].budget;
        rp.max_tokens = total;
        rp.cb = cb;
        if (kvq_retrieval_create(c, rt, &rp, &ret, &e) != KVQ_OK) {
            rc = cli_fail(&e);
            goto done;
        }
        const kvq_attn_backend backend = kvq_retrieval_backend(ret);
        kvq_forward_set_attention(f, &backend);
    }

    /* ---- prompt: one prefill; its text is printed as it decodes */
    memcpy(ids, prompt_ids, sizeof *ids * n_prompt);
    double t0 = kvq_now();
    if (kvq_forward_tokens(f, ids, (int64_t)n_prompt, KVQ_LOGITS_LAST, logits, &e) != KVQ_OK) {
        rc = cli_fail(&e);
        goto done;
    }
    if (print_new_text(tok, ids, n_prompt, &printed, &e)) {
        rc = cli_fail(&e);
        goto done;
    }
    double t1 = kvq_now();

    /* ---- generation: sample, stop at BOS/EOS, feed the token back */
    kvq_rng rng;
    kvq_rng_seed(&rng, (uint64_t)seed);
    int64_t n_out = 0;
    const int32_t bos = kvq_tokenizer_bos(tok), eos = kvq_tokenizer_eos(tok);
    while (n_out < n_gen) {
        int32_t next = kvq_sample_token(logits, c->vocab_size, temp, top_p, &rng, work_p, work_i);
        if (next == eos || next == bos)
            break;
        ids[n_prompt + (size_t)n_out++] = next;
        if (print_new_text(tok, ids, n_prompt + (size_t)n_out, &printed, &e)) {
            rc = cli_fail(&e);
            goto done;
        }
        if (n_out == n_gen)
            break;
        if (kvq_forward_tokens(f, &next, 1, KVQ_LOGITS_LAST, logits, &e) != KVQ_OK) {
            rc = cli_fail(&e);
            goto done;
        }
    }
    fputc('\n', stdout);
    fflush(stdout);
    double t2 = kvq_now();
    kvq_log(&cb, KVQ_LOG_INFO,
            "prompt: %zu tokens in %.3f s; generated %lld tokens in %.3f s (%.1f tokens/s)",
            n_prompt, t1 - t0, (long long)n_out, t2 - t1,
            t2 > t1 ? (double)n_out / (t2 - t1) : 0.0);
    if (ret) {
        kvq_retrieval_stats st;
        kvq_retrieval_stats_get(ret, &st);
        const double n = st.steps ? (double)st.steps : 1.0;
        kvq_log(&cb, KVQ_LOG_INFO,
                "retrieval: %s, budget %s: %llu steps (layer x KV head) attended %.1f of %.1f "
                "cached tokens on average, reading %.2f%% of the KV cache",
                rows[0].name, rows[0].budget_str, (unsigned long long)st.steps, st.attended / n,
                st.visible / n, st.bytes_full > 0 ? 100.0 * st.bytes_read / st.bytes_full : 100.0);
    }
done:
    kvq_forward_free(f);
    kvq_retrieval_free(ret);
    kvq_runtime_close(rt);
    free(rows);
    kvq_model_close(m);
    free(ids);
    free(prompt_ids);
    free(logits);
    free(work_p);
    free(work_i);
    return rc;
}
