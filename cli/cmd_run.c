/* cmd_run.c — `kvq run`: generate text from a model with full attention, or with
 * retrieval attention (--artifact / --selector: cli/retrieval_opts.c, kvq/runtime.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/eval_kv.h"
#include "cli/retrieval_opts.h"
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
            "  --threads T        threads (default: all CPUs; same bytes for any T)\n"
            "  --accept-approx-tokenizer\n"
            "                     use a tokenizer whose pre-tokenizer kvq does not\n"
            "                     implement, approximated by the GPT-2 split (default:\n"
            "                     refused, naming it)\n"
            "  -q, --quiet        nothing on stderr but errors\n"
            "  -v, --verbose      more detail\n"
            "  -h, --help         this help\n"
            "\n");
    cli_retrieval_usage(f, 0);
    cli_kv_usage(f);
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

typedef struct run_opts {
    cli_model_opts m;     /* --model --seed (sampling) --threads -q -v */
    const char *prompt;
    int64_t n_gen;
    double temp, top_p;
    cli_retrieval ro;
    cli_kv kv;            /* --kv (cli/eval_kv.c): the prompt is LeanKV's prompt */
} run_opts;

/* Parses argv into o: -1 to go on, else the exit code (0 after --help). */
static int run_parse(int argc, char **argv, run_opts *o)
{
    const char *cmd = "run";
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int r = cli_kv_opt(cmd, &o->kv, argc, argv, &i);
        if (r < 0)
            r = cli_retrieval_opt(cmd, &o->ro, argc, argv, &i, 0);
        if (r < 0)
            r = cli_model_opt(cmd, &o->m, argc, argv, &i);
        if (r >= 0) {
            if (r)
                return r;
            continue;
        }
        if (cli_is_help(a)) {
            run_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--prompt")) {
            if (!val)
                return cli_failf(2, "run: %s needs a value", a);
            o->prompt = val;
            i++;
        } else if (!strcmp(a, "-n")) {
            if ((rc = cli_opt_i64(cmd, a, val, 1, 1000000, &o->n_gen)))
                return rc;
            i++;
        } else if (!strcmp(a, "--temp")) {
            if ((rc = cli_opt_f64(cmd, a, val, 0, 100, &o->temp)))
                return rc;
            i++;
        } else if (!strcmp(a, "--top-p")) {
            if ((rc = cli_opt_f64(cmd, a, val, 1e-9, 1, &o->top_p)))
                return rc;
            i++;
        } else {
            run_usage(stderr);
            return cli_failf(2, "run: unknown option '%s'", a);
        }
    }
    if (!o->m.model) {
        run_usage(stderr);
        return cli_failf(2, "run: --model is required");
    }
    if (o->kv.kind != KVQ_KV_F16 && !o->ro.selectors && !o->ro.budgets)
        o->ro.given = 0; /* --artifact alone gives the cache's settings: full attention over
                            it; with --selector or --budget, retrieval over it */
    if (o->ro.given && !o->ro.artifact && !o->ro.selectors)
        return cli_failf(2, "run: retrieval options need --artifact or --selector");
    if (o->ro.selectors && strchr(o->ro.selectors, ','))
        return cli_failf(2, "run: --selector takes one selector");
    if (o->ro.budgets && strchr(o->ro.budgets, ','))
        return cli_failf(2, "run: --budget takes one budget");
    return -1;
}

/* What a run holds; every pointer is freed by run_free. */
typedef struct run_state {
    kvq_callbacks cb;
    kvq_model *m;
    const kvq_model_config *c;
    const kvq_tokenizer *tok;
    kvq_forward *f;
    kvq_codebook_set *rt;
    kvq_retrieval *ret;
    kvq_kvcache *kvc;                    /* --kv: the compressed cache */
    cli_row *rows;
    size_t n_rows;
    int32_t *ids, *prompt_ids, *work_i;  /* [total], [n_prompt], [vocab] */
    float *logits, *work_p;              /* [vocab], [vocab] */
    size_t n_prompt;
    int64_t total;                       /* prompt + generated tokens at most */
} run_state;

static void run_free(run_state *r)
{
    kvq_forward_free(r->f);
    kvq_retrieval_free(r->ret);
    kvq_kvcache_free(r->kvc);
    kvq_codebook_set_close(r->rt);
    free(r->rows);
    kvq_model_close(r->m);
    free(r->ids);
    free(r->prompt_ids);
    free(r->logits);
    free(r->work_p);
    free(r->work_i);
}

/* The model, the retrieval row (checked before anything runs), the prompt's tokens. */
static int run_open(run_opts *o, run_state *r)
{
    const char *model_path = o->m.model;
    kvq_err e = {0};
    int rc;
    kvq_model_params mp = kvq_model_params_default();
    mp.cb = r->cb;
    mp.accept_approx_tokenizer = o->m.approx_tokenizer;
    if (kvq_model_open(model_path, &mp, &r->m, &e) != KVQ_OK)
        return cli_fail(&e);
    r->c = kvq_model_config_get(r->m);
    if (o->ro.given) {
        /* retrieval: one selector and budget (default: the artifact's codebook, 6%),
         * checked before anything runs */
        if ((rc = cli_retrieval_open(&o->ro, r->m, model_path, &r->cb, &r->rt)))
            return rc;
        if (!o->ro.selectors)
            o->ro.selectors = "codebook";
        if ((rc = cli_retrieval_rows("run", &o->ro, r->rt, &r->rows, &r->n_rows)))
            return rc;
    }
    r->tok = kvq_model_tokenizer(r->m);
    if (!r->tok)
        return cli_failf(1, "%s: the model has no tokenizer", model_path);
    /* BOS only when the model adds one (SmolLM2 does not); an empty prompt still needs
     * one token to start from */
    unsigned eflags = KVQ_ENCODE_MODEL_BOS;
    if (!o->prompt[0] && kvq_tokenizer_bos(r->tok) >= 0)
        eflags = KVQ_ENCODE_BOS;
    if (kvq_tokenizer_encode(r->tok, o->prompt, strlen(o->prompt), eflags, &r->prompt_ids,
                             &r->n_prompt, &e) != KVQ_OK)
        return cli_fail(&e);
    return 0;
}

/* --kv: the compressed cache as the attention, the prompt its LeanKV prompt. */
static int run_kv_prepare(const run_opts *o, run_state *r)
{
    kvq_kvcache_params kp;
    double frac;
    kvq_err e = {0};
    int rc = cli_kv_resolve(&o->kv, o->ro.artifact, &kp, &frac);
    if (!rc && o->ro.p.device == KVQ_RETRIEVAL_DEVICE_CUDA)
        kvq_log(&r->cb, KVQ_LOG_WARN, "--kv %s has no CUDA path: it runs on the CPU",
                kvq_kv_kind_name(o->kv.kind));
    if (rc)
        return rc;
    kp.prompt_tokens = (int64_t)r->n_prompt;
    kp.max_tokens = r->total;
    kp.threads = (int32_t)o->m.threads;
    if (kvq_kvcache_create(r->c, &kp, &r->kvc, &e))
        return cli_fail(&e);
    if (r->ret) /* retrieval reads the compressed rows (kvq/kvcache.h) */
        return kvq_retrieval_set_kvcache(r->ret, r->kvc, &e) ? cli_fail(&e) : 0;
    const kvq_attn_backend backend = kvq_kvcache_backend(r->kvc);
    kvq_forward_set_attention(r->f, &backend);
    return 0;
}

/* The forward pass (with the retrieval backend when asked for) and its buffers. */
static int run_prepare(const run_opts *o, run_state *r)
{
    const char *model_path = o->m.model;
    const kvq_model_config *c = r->c;
    kvq_err e = {0};
    r->total = (int64_t)r->n_prompt + o->n_gen;
    if (c->context_length > 0 && r->total > c->context_length)
        kvq_log(&r->cb, KVQ_LOG_WARN, "%s: %lld tokens exceed the trained context of %d",
                model_path, (long long)r->total, c->context_length);
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = (int32_t)o->m.threads;
    fp.act_q8 = 1; /* decode's products with 8-bit activations (decision 019) */
    fp.max_tokens = r->total;
    fp.cb = r->cb;
    log_memory(&r->cb, r->m, &fp, r->total);
    r->ids = malloc(sizeof *r->ids * (size_t)r->total);
    r->logits = malloc(sizeof *r->logits * (size_t)c->vocab_size);
    r->work_p = malloc(sizeof *r->work_p * (size_t)c->vocab_size);
    r->work_i = malloc(sizeof *r->work_i * (size_t)c->vocab_size);
    if (!r->ids || !r->logits || !r->work_p || !r->work_i)
        return cli_failf(1, "%s: out of memory", model_path);
    if (kvq_forward_create(r->m, &fp, &r->f, &e) != KVQ_OK)
        return cli_fail(&e);
    if (o->ro.given) {
        kvq_retrieval_params rp = o->ro.p;
        rp.selector = r->rows[0].selector;
        rp.budget = r->rows[0].budget;
        rp.max_tokens = r->total;
        rp.cb = r->cb;
        if (kvq_retrieval_create(c, r->rt, &rp, &r->ret, &e) != KVQ_OK)
            return cli_fail(&e);
        const kvq_attn_backend backend = kvq_retrieval_backend(r->ret);
        kvq_forward_set_attention(r->f, &backend);
        char note[256]; /* sliding-window layers beside global ones (archs-rt) */
        if (kvq_retrieval_layers_note(c, note, sizeof note))
            kvq_log(&r->cb, KVQ_LOG_INFO, "retrieval: %s", note);
    }
    return o->kv.kind != KVQ_KV_F16 ? run_kv_prepare(o, r) : 0;
}

/* Prefill, then sample and print token by token; timing and retrieval figures to
 * stderr. */
static int run_generate(const run_opts *o, run_state *r)
{
    kvq_err e = {0};
    size_t printed = 0;
    const size_t n_prompt = r->n_prompt;

    /* ---- prompt: one prefill; its text is printed as it decodes */
    memcpy(r->ids, r->prompt_ids, sizeof *r->ids * n_prompt);
    double t0 = kvq_now();
    if (kvq_forward_tokens(r->f, r->ids, (int64_t)n_prompt, KVQ_LOGITS_LAST, r->logits, &e) !=
        KVQ_OK)
        return cli_fail(&e);
    if (print_new_text(r->tok, r->ids, n_prompt, &printed, &e))
        return cli_fail(&e);
    double t1 = kvq_now();

    /* ---- generation: sample, stop at BOS/EOS, feed the token back */
    kvq_rng rng;
    kvq_rng_seed(&rng, (uint64_t)o->m.seed);
    int64_t n_out = 0;
    const int32_t bos = kvq_tokenizer_bos(r->tok), eos = kvq_tokenizer_eos(r->tok);
    while (n_out < o->n_gen) {
        int32_t next = kvq_sample_token(r->logits, r->c->vocab_size, o->temp, o->top_p, &rng,
                                        r->work_p, r->work_i);
        if (next == eos || next == bos)
            break;
        r->ids[n_prompt + (size_t)n_out++] = next;
        if (print_new_text(r->tok, r->ids, n_prompt + (size_t)n_out, &printed, &e))
            return cli_fail(&e);
        if (n_out == o->n_gen)
            break;
        if (kvq_forward_tokens(r->f, &next, 1, KVQ_LOGITS_LAST, r->logits, &e) != KVQ_OK)
            return cli_fail(&e);
    }
    fputc('\n', stdout);
    fflush(stdout);
    double t2 = kvq_now();
    kvq_log(&r->cb, KVQ_LOG_INFO,
            "prompt: %zu tokens in %.3f s; generated %lld tokens in %.3f s (%.1f tokens/s)",
            n_prompt, t1 - t0, (long long)n_out, t2 - t1,
            t2 > t1 ? (double)n_out / (t2 - t1) : 0.0);
    if (r->kvc) {
        kvq_kvcache_memory m;
        kvq_kvcache_memory_get(r->kvc, &m);
        const double t = m.tokens > 0 ? m.tokens : 1;
        kvq_log(&r->cb, KVQ_LOG_INFO,
                "kv %s: %.1f bytes/token held (high %.1f, low %.1f, exact %.1f), %.1f%% of "
                "an f16 cache", kvq_kv_kind_name(o->kv.kind), m.bytes / t, m.bytes_high / t,
                m.bytes_low / t, m.bytes_exact / t, 100 * m.bytes / m.bytes_f16);
    }
    if (r->ret) {
        kvq_retrieval_stats st;
        kvq_retrieval_stats_get(r->ret, &st);
        const double n = st.steps ? (double)st.steps : 1.0;
        if (!st.steps) /* no decode step, or none whose cache outgrew the sinks + window */
            kvq_log(&r->cb, KVQ_LOG_INFO,
                    "retrieval: %s, budget %s: no step selected (the cache never held more "
                    "than the sinks and the window, or no token was decoded): attention was "
                    "exact",
                    r->rows[0].name, r->rows[0].budget_str);
        else
            kvq_log(&r->cb, KVQ_LOG_INFO,
                    "retrieval: %s, budget %s: %llu steps (layer x KV head) attended %.1f of "
                    "%.1f cached tokens on average, reading %.2f%% of the KV cache",
                    r->rows[0].name, r->rows[0].budget_str, (unsigned long long)st.steps,
                    st.attended / n, st.visible / n,
                    st.bytes_full > 0 ? 100.0 * st.bytes_read / st.bytes_full : 100.0);
    }
    return 0;
}

int cmd_run(int argc, char **argv)
{
    run_opts o = {.prompt = "", .n_gen = 256, .temp = 0.8, .top_p = 0.95};
    cli_retrieval_init(&o.ro);
    int rc = run_parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    run_state r = {.cb = cli_callbacks(o.m.verbose, o.m.quiet)};
    if (!(rc = run_open(&o, &r)) && !(rc = run_prepare(&o, &r)))
        rc = run_generate(&o, &r);
    run_free(&r);
    return rc;
}
