/* cmd_capture.c — `kvq capture`: record pre-RoPE Q, K, V per layer over a corpus, or
 * merge captures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kvq/capture.h"
#include "kvq/corpus.h"
#include "kvq/model.h"

static void capture_usage(FILE *f)
{
    fprintf(f,
            "usage: kvq capture --model M --corpus SPEC -o DIR [options]\n"
            "       kvq capture --merge A B [...] -o DIR [--force]\n"
            "\n"
            "Runs the model over the corpus and writes, per layer, the pre-RoPE keys,\n"
            "values and queries with the float64 query moments to the capture directory\n"
            "DIR (docs/capture.md). --merge concatenates captures of the same model.\n"
            "\n"
            "options:\n"
            "  --model M              GGUF file or HF directory (required)\n"
            "  --corpus SPEC          corpus sources, e.g. uuid:64,file:a.txt (required)\n"
            "  -o, --output DIR       capture directory to write (required)\n"
            "  --seq-len N            tokens per sequence, BOS included (default 256)\n"
            "  --max-tokens N         stop after N tokens (default: the whole corpus)\n"
            "  --layers LIST          layers to store, e.g. 0,2,5-7 (default: all)\n"
            "  --dtype f16|bf16|f32   storage of q, k, v (default f16)\n"
            "  --no-values            do not store v\n"
            "  --queries all|N        store q at every row (default) or at N sampled rows;\n"
            "                         the moments always sum over every row\n"
            "  --seed S               seed of the synthetic corpora and the query sample (0)\n"
            "  --threads T            threads (default: all)\n"
            "  --chunk N              tokens per forward chunk (default 256)\n"
            "  --force                replace DIR if it exists\n"
            "  --accept-approx-tokenizer\n"
            "                         use a tokenizer whose pre-tokenizer kvq does not\n"
            "                         implement, approximated by the GPT-2 split and\n"
            "                         recorded in capture.json (default: refused)\n"
            "  --merge A B [...]      merge the capture directories A, B, ... into DIR\n"
            "  -q, --quiet            no progress or summary\n"
            "  -v, --verbose          more detail\n"
            "  -h, --help             this help\n");
}

static int run_merge(const char *const *inputs, size_t n, const char *out, int force,
                     const kvq_callbacks *cb)
{
    kvq_err e = {0};
    if (kvq_capture_merge(inputs, n, out, force, cb, &e) != KVQ_OK)
        return cli_fail(&e);
    kvq_log(cb, KVQ_LOG_INFO, "wrote %s (%zu captures merged)", out, n);
    return 0;
}

typedef struct capture_opts {
    const char *model, *spec, *out, *layers;
    const char **merge;   /* [argc] the directories after --merge */
    size_t n_merge;
    int merging;
    kvq_capture_params p;
    int quiet, verbose, approx_tok;
    uint64_t seed;
} capture_opts;

/* Parses argv into o: -1 to go on, else the exit code (0 after --help). */
static int capture_parse(int argc, char **argv, capture_opts *o)
{
    const char *cmd = "capture";
    int rc = 0;
    int64_t v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int needs_value = !strcmp(a, "--model") || !strcmp(a, "--corpus") || !strcmp(a, "-o") ||
                          !strcmp(a, "--output") || !strcmp(a, "--layers") ||
                          !strcmp(a, "--dtype") || !strcmp(a, "--queries");
        if (needs_value && !val) {
            rc = cli_failf(2, "capture: %s needs a value", a);
            return rc;
        }
        if (cli_is_help(a)) {
            capture_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--merge")) {
            o->merging = 1;
            while (i + 1 < argc && argv[i + 1][0] != '-')
                o->merge[o->n_merge++] = argv[++i];
        } else if (!strcmp(a, "--model")) {
            o->model = val, i++;
        } else if (!strcmp(a, "--corpus")) {
            o->spec = val, i++;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            o->out = val, i++;
        } else if (!strcmp(a, "--layers")) {
            o->layers = val, i++;
        } else if (!strcmp(a, "--seq-len")) {
            if ((rc = cli_opt_i64(cmd, a, val, 2, INT32_MAX, &o->p.seq_len)))
                return rc;
            i++;
        } else if (!strcmp(a, "--max-tokens")) {
            if ((rc = cli_opt_i64(cmd, a, val, 1, INT64_MAX, &o->p.max_tokens)))
                return rc;
            i++;
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(val, "f16"))
                o->p.dtype = KVQ_DT_F16;
            else if (!strcmp(val, "bf16"))
                o->p.dtype = KVQ_DT_BF16;
            else if (!strcmp(val, "f32"))
                o->p.dtype = KVQ_DT_F32;
            else {
                rc = cli_failf(2, "capture: --dtype must be f16, bf16 or f32, not '%s'", val);
                return rc;
            }
            i++;
        } else if (!strcmp(a, "--no-values")) {
            o->p.values = 0;
        } else if (!strcmp(a, "--queries")) {
            if (!strcmp(val, "all"))
                o->p.n_queries = 0;
            else if ((rc = cli_opt_i64(cmd, a, val, 1, INT32_MAX, &o->p.n_queries)))
                return rc;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if ((rc = cli_opt_i64(cmd, a, val, 0, INT64_MAX, &v)))
                return rc;
            o->seed = (uint64_t)v;
            i++;
        } else if (!strcmp(a, "--threads")) {
            if ((rc = cli_opt_i64(cmd, a, val, 1, 4096, &v)))
                return rc;
            o->p.threads = (int32_t)v;
            i++;
        } else if (!strcmp(a, "--chunk")) {
            if ((rc = cli_opt_i64(cmd, a, val, 1, 1 << 20, &v)))
                return rc;
            o->p.chunk = (int32_t)v;
            i++;
        } else if (!strcmp(a, "--force")) {
            o->p.overwrite = 1;
        } else if (!strcmp(a, "--accept-approx-tokenizer")) {
            o->approx_tok = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o->quiet = 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o->verbose++;
        } else {
            capture_usage(stderr);
            rc = cli_failf(2, "capture: unknown option '%s'", a);
            return rc;
        }
    }

    return -1;
}

/* Captures the corpus with the model into o->out. */
static int capture_model(capture_opts *o, const kvq_callbacks *cb)
{
    kvq_capture_params p = o->p;
    kvq_err e = {0};
    kvq_model *m = NULL;
    int32_t *list = NULL;
    size_t n_list = 0;
    int rc = 0;
    kvq_model_params mp = kvq_model_params_default();
    mp.cb = *cb;
    mp.accept_approx_tokenizer = o->approx_tok;
    /* The output first: refused before the model is read. */
    if (kvq_capture_output_check(o->out, p.overwrite, &e) != KVQ_OK ||
        kvq_model_open(o->model, &mp, &m, &e) != KVQ_OK)
        return cli_fail(&e);
    if (o->layers) {
        if (kvq_parse_index_list(o->layers, kvq_model_config_get(m)->n_layers, &list, &n_list,
                                 &e) != KVQ_OK) {
            rc = cli_failf(2, "capture: --layers: %s", e.msg);
            kvq_model_close(m);
            return rc;
        }
        p.layers = list;
        p.n_layers = n_list;
    }
    p.seed = o->seed;
    p.cb = *cb;
    p.dist = cli_dist();
    kvq_corpus_params cp;
    kvq_corpus_params_default(&cp);
    cp.seed = o->seed;
    if (kvq_capture_run(m, o->spec, &cp, &p, o->out, &e) != KVQ_OK)
        rc = cli_fail(&e);
    else
        kvq_log(cb, KVQ_LOG_INFO, "wrote %s", o->out);
    free(list);
    kvq_model_close(m);
    return rc;
}

int cmd_capture(int argc, char **argv)
{
    capture_opts o = {.p = kvq_capture_params_default()};
    int rc;
    if (!(o.merge = calloc((size_t)argc, sizeof *o.merge)))
        return cli_failf(1, "capture: out of memory");
    if ((rc = capture_parse(argc, argv, &o)) >= 0)
        goto done;
    rc = 0;
    kvq_callbacks cb = cli_callbacks(o.verbose, o.quiet);
    if (o.merging) {
        if (!o.out || o.n_merge < 1 || o.model || o.spec) {
            capture_usage(stderr);
            rc = cli_failf(2, "capture: --merge takes capture directories and -o only");
            goto done;
        }
        if ((rc = cli_claim_output(o.out, o.merge, o.n_merge)))
            goto done;
        if (cli_dist_rank() == 0) /* a merge is not split: rank 0 does it */
            rc = run_merge(o.merge, o.n_merge, o.out, o.p.overwrite, &cb);
        goto done;
    }
    if (!o.model || !o.spec || !o.out) {
        capture_usage(stderr);
        rc = cli_failf(2, "capture: --model, --corpus and -o are required");
        goto done;
    }
    if ((rc = cli_check_corpus(o.spec)) ||
        (rc = cli_claim_output(o.out, (const char *const[]){o.model}, 1)))
        goto done;
    rc = capture_model(&o, &cb);
done:
    free(o.merge);
    return rc;
}
