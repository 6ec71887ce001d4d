/* cmd_profile.c — `kvq profile`: LeanKV thresholds, PATS schedules and retrieval budgets
 * profiled on a capture (memory versus quality), the chosen values written into a copy
 * of the artifact. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "kvq/thresholds.h"

static void profile_usage(FILE *f)
{
    fprintf(f,
            "usage: kvq profile --capture DIR --artifact IN.kvq -o OUT.kvq [options]\n"
            "\n"
            "Measures memory against quality for each compression knob on the capture and\n"
            "writes IN.kvq plus the chosen values and the full profile to OUT.kvq:\n"
            "  leankv   alpha_h x alpha_l (pairs with alpha_l <= alpha_h): K8V4 / K4V2 /\n"
            "           pruned by attention significance\n"
            "  pats     old-, new- and middle-heavy mantissa truncation, b_max up to the\n"
            "           dtype's mantissa bits\n"
            "  budget   retrieval budget (fraction of tokens) of the artifact's codebooks\n"
            "  mass     tau of hcattention's cumulative-mass rule\n"
            "Quality is the attention-output relative error of the continuation queries of\n"
            "each capture sequence (the first half is the prompt), or, with --model and\n"
            "--corpus, the perplexity of the same positions. The least memory whose quality\n"
            "stays within the tolerance is chosen; when none does, the best found is kept and\n"
            "flagged (a warning; thresholds.KNOB.met = 0 in OUT.kvq).\n"
            "\n"
            "options:\n"
            "  --capture DIR          capture directory from `kvq capture` (required)\n"
            "  --artifact IN.kvq      artifact from `kvq fit` (required)\n"
            "  -o, --output OUT.kvq   artifact to write (required)\n"
            "  --model M              GGUF file or HF directory: also measure perplexity\n"
            "  --corpus SPEC          held-out text for the perplexity (with --model)\n"
            "  --tolerance T          error <= T (default 0.05), or with --model perplexity\n"
            "                         <= full-attention perplexity x (1 + T) (default 0.01)\n"
            "  --knobs LIST           any of leankv,pats,budget,mass (default all)\n"
            "  --prompt-fraction F    prompt share of each sequence, [0, 1) (default 0.5)\n"
            "  --window W             LeanKV recent window kept at K8V4 (default 64)\n"
            "  --alpha-h LIST         LeanKV alpha_h grid (default 0,1,2,3,4,5)\n"
            "  --alpha-l LIST         LeanKV alpha_l grid (default 0,0.02,0.04,0.06,0.08,0.1)\n"
            "  --pats-b-min B         PATS bits always truncated (default 2)\n"
            "  --pats-dtype f16|bf16  cache dtype PATS truncates (default f16)\n"
            "  --budgets LIST         budget fractions, e.g. 1%%,5%%,0.1 (default 1..25%%)\n"
            "  --taus LIST            mass-rule tau values (default 0.5..0.99)\n"
            "  --sink S               sink tokens of the retrieval runs (default 4)\n"
            "  --positions P          wrope (default) or rope for the exact retrieval step\n"
            "  --seq-len N            perplexity sequence length (default: the capture's)\n"
            "  --ppl-tokens N         held-out tokens for the perplexity (default 4096)\n"
            "  --seed S               seed of synthetic corpus sources (default 0)\n"
            "  --sample-rows N        measure the error on N evenly spaced continuation\n"
            "                         rows per sequence (default 32; 0 = every row);\n"
            "                         settings near the tolerance are measured again on\n"
            "                         every row, PATS settings that save no memory (never\n"
            "                         chosen) on a quarter of them; +- in the tables is\n"
            "                         the 95%% interval\n"
            "  --sample-jobs F        measure every setting first on a random F of each\n"
            "                         layer's jobs ((sequence, KV head); budgets and taus:\n"
            "                         sequences) (default 1/3; 1 = every job); settings\n"
            "                         that may be within the tolerance or the best then on\n"
            "                         the other jobs too, the others keep the sample's\n"
            "                         figures (marked j, +- over jobs). Every job when the\n"
            "                         sample would be under 2 jobs a layer or 20 in all\n"
            "  --reference            LeanKV and PATS by the slow reference path (one\n"
            "                         simulated cache per setting, every row), for checks\n"
            "  --threads T            threads (default 1; the results do not depend on it)\n"
            "  --json                 print one JSON object instead of the tables\n"
            "  --force                overwrite OUT.kvq if it exists\n"
            "  -q, --quiet            no progress or summary on stderr\n"
            "  -v, --verbose          more detail\n"
            "  -h, --help             this help\n");
}

static int takes_value(const char *a)
{
    static const char *const opts[] = {
        "--capture", "--artifact", "-o", "--output", "--model", "--corpus", "--tolerance",
        "--knobs", "--prompt-fraction", "--window", "--alpha-h", "--alpha-l", "--pats-b-min",
        "--pats-dtype", "--budgets", "--taus", "--sink", "--positions", "--seq-len",
        "--ppl-tokens", "--seed", "--threads", "--sample-rows", "--sample-jobs", NULL};
    for (int i = 0; opts[i]; i++)
        if (!strcmp(a, opts[i]))
            return 1;
    return 0;
}

/* "0,0.5,5%" -> malloc'd doubles in [lo, hi] ('%' divides by 100 when percent). Returns 0
 * or prints the problem and returns 2. */
static int parse_list(const char *opt, const char *s, int percent, double lo, double hi,
                      double **out, size_t *n)
{
    size_t cap = 1;
    for (const char *c = s; *c; c++)
        cap += *c == ',';
    double *v = malloc(cap * sizeof *v);
    char *copy = strdup(s);
    int rc = 0;
    *n = 0;
    if (!v || !copy) {
        rc = cli_failf(2, "profile: out of memory");
        goto done;
    }
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t len = strlen(tok);
        double scale = 1;
        if (percent && len > 1 && tok[len - 1] == '%') {
            tok[len - 1] = 0;
            scale = 0.01;
        }
        double x;
        kvq_err e = {0};
        if (kvq_parse_f64(tok, -1e300, 1e300, &x, &e) || !(x * scale >= lo && x * scale <= hi)) {
            if (scale != 1) /* as the user wrote it: a percentage */
                rc = cli_failf(2, "profile: %s: '%s%%' is not a percentage in [%g%%, %g%%]", opt,
                               tok, 100 * lo, 100 * hi);
            else
                rc = cli_failf(2, "profile: %s: '%s' is not a number in [%g, %g]%s", opt, tok,
                               lo, hi, percent ? " (or a percentage, e.g. 5%)" : "");
            goto done;
        }
        v[(*n)++] = x * scale;
    }
    if (*n == 0 || *n != cap)
        rc = cli_failf(2, "profile: %s: empty item in '%s'", opt, s);
done:
    free(copy);
    if (rc)
        free(v);
    else
        *out = v;
    return rc;
}

/* ---- output ------------------------------------------------------------------------ */

static void print_cell(FILE *f, const kvq_profile_table *t, int32_t c, double x)
{
    if (isnan(x))
        fprintf(f, " %12s", "-");
    else if (!strcmp(t->cols[c], "schedule"))
        fprintf(f, " %12s", kvq_pats_schedule_name((kvq_pats_schedule)(int)x));
    else if (!strcmp(t->cols[c], "ppl"))
        fprintf(f, " %12.4f", x);
    else
        fprintf(f, " %12.5g", x);
}

static void print_tables(const kvq_profile_result *r, const kvq_profile_params *p)
{
    printf("profile: %lld sequences, %lld evaluated query rows; metric %s, tolerance %g",
           (long long)r->n_sequences, (long long)r->n_queries,
           r->metric_ppl ? "perplexity" : "attention-output relative error", r->tolerance);
    if (r->metric_ppl)
        printf(" (full attention %.4f: limit %.4f)", r->ppl_full, r->ppl_full * (1 + r->tolerance));
    printf("\n");
    if (r->n_measured < r->n_queries)
        printf("leankv / pats error measured on %lld of them (%lld per sequence, evenly spaced; "
               "settings near the tolerance on every row; budgets and taus likewise); +- is "
               "the 95%% interval\n",
               (long long)r->n_measured, (long long)p->sample_rows);
    if (r->n_jobs_sampled < r->n_jobs)
        printf("leankv / pats settings first measured on %lld of the %lld (layer, sequence, KV "
               "head) jobs (a random sample, as many in each layer); those that may be within "
               "the tolerance or the best on every job, the others (j) keep the sample's "
               "figures, +- over jobs\n",
               (long long)r->n_jobs_sampled, (long long)r->n_jobs);
    if (r->n_seq_jobs_sampled < r->n_seq_jobs)
        printf("budgets and taus likewise on %lld of the %lld (layer, sequence) jobs\n",
               (long long)r->n_seq_jobs_sampled, (long long)r->n_seq_jobs);
    if (r->n_nosave > 0 && r->n_measured_nosave < r->n_measured)
        printf("pats settings that save no memory against f16 (never chosen): error measured on "
               "%lld rows (a quarter of the sample)\n", (long long)r->n_measured_nosave);
    for (int i = 0; i < KVQ_PROFILE_N_TABLES; i++) {
        const kvq_profile_table *t = &r->table[i];
        printf("\n%s", t->name);
        if (i == KVQ_PROFILE_LEANKV)
            printf(" (window %d, K%dV%d / K%dV%d; memory = fraction of the f16 cache)",
                   (int)p->leankv.window, (int)p->leankv.k_high, (int)p->leankv.v_high,
                   (int)p->leankv.k_low, (int)p->leankv.v_low);
        else if (i == KVQ_PROFILE_PATS)
            printf(" (%s cache, 64-byte blocks; memory = packed fraction, bits = unpacked)",
                   p->pats_dtype == KVQ_DT_BF16 ? "bf16" : "f16");
        else
            printf(" (attended = fraction of visible tokens; mass = exact attention mass kept)");
        if (t->skipped[0]) {
            printf(": skipped: %s\n", t->skipped);
            continue;
        }
        printf("\n  ");
        for (int32_t c = 0; c < t->n_cols; c++)
            printf(" %12s", t->cols[c]);
        printf("\n");
        for (int64_t j = 0; j < t->n_rows; j++) {
            /* j: the row's figures come from the job sample alone */
            printf("%s%s", j == t->chosen ? "*" : " ",
                   t->job_sampled && t->job_sampled[j] ? "j" : " ");
            for (int32_t c = 0; c < t->n_cols; c++)
                print_cell(stdout, t, c, t->rows[(size_t)j * t->n_cols + c]);
            printf("\n");
        }
        int sampled = r->n_measured < r->n_queries && i <= KVQ_PROFILE_PATS;
        for (int64_t j = 0; t->err_ci && i > KVQ_PROFILE_PATS && j < t->n_rows; j++)
            sampled |= t->err_ci[j] > 0; /* budgets: sampled rows (p->sample_rows) */
        if (sampled && t->err_ci) {
            printf("  err +-");
            for (int64_t j = 0; j < t->n_rows; j++)
                printf(" %.2g", t->err_ci[j]);
            printf("\n");
        }
        if (t->chosen >= 0)
            printf("  chosen: row %lld (*)%s\n", (long long)t->chosen + 1,
                   t->met ? ", within tolerance" : ", NOT within tolerance: the best found is kept");
    }
}

static void json_num(double x)
{
    if (isfinite(x))
        printf("%.17g", x);
    else
        printf("null");
}

static void print_json(const kvq_profile_result *r, const char *out)
{
    printf("{\"output\": ");
    kvq_json_write_str(stdout, out);
    printf(", \"metric\": \"%s\", \"tolerance\": ", r->metric_ppl ? "perplexity" : "attn_rel_err");
    json_num(r->tolerance);
    printf(", \"ppl_full\": ");
    json_num(r->ppl_full);
    printf(", \"sequences\": %lld, \"query_rows\": %lld, \"measured_rows\": %lld, "
           "\"pats_nosave_measured_rows\": %lld, \"jobs\": %lld, \"sampled_jobs\": %lld, "
           "\"budget_jobs\": %lld, \"budget_sampled_jobs\": %lld, \"tables\": {",
           (long long)r->n_sequences, (long long)r->n_queries, (long long)r->n_measured,
           (long long)r->n_measured_nosave, (long long)r->n_jobs, (long long)r->n_jobs_sampled,
           (long long)r->n_seq_jobs, (long long)r->n_seq_jobs_sampled);
    for (int i = 0; i < KVQ_PROFILE_N_TABLES; i++) {
        const kvq_profile_table *t = &r->table[i];
        printf("%s\"%s\": {", i ? ", " : "", t->name);
        if (t->skipped[0]) {
            printf("\"skipped\": ");
            kvq_json_write_str(stdout, t->skipped);
            printf("}");
            continue;
        }
        printf("\"columns\": [");
        for (int32_t c = 0; c < t->n_cols; c++)
            printf("%s\"%s\"", c ? ", " : "", t->cols[c]);
        printf("], \"rows\": [");
        for (int64_t j = 0; j < t->n_rows; j++) {
            printf("%s[", j ? ", " : "");
            for (int32_t c = 0; c < t->n_cols; c++) {
                printf("%s", c ? ", " : "");
                json_num(t->rows[(size_t)j * t->n_cols + c]);
            }
            printf("]");
        }
        printf("]");
        if (t->job_sampled) {
            printf(", \"job_sampled\": [");
            for (int64_t j = 0; j < t->n_rows; j++)
                printf("%s%s", j ? ", " : "", t->job_sampled[j] ? "true" : "false");
            printf("]");
        }
        if (t->err_ci) {
            printf(", \"err_ci95\": [");
            for (int64_t j = 0; j < t->n_rows; j++) {
                printf("%s", j ? ", " : "");
                json_num(t->err_ci[j]);
            }
            printf("]");
        }
        printf(", \"chosen\": %lld, \"met\": %s}", (long long)t->chosen, t->met ? "true" : "false");
    }
    printf("}}\n");
}

typedef struct profile_opts {
    const char *capture, *in, *out;
    kvq_profile_params p;
    int quiet, verbose, json, force;
    double *ah, *al, *bu, *ta;  /* the lists p points to */
} profile_opts;

/* Parses argv into o: -1 to go on, else the exit code (0 after --help). */
static int profile_parse(int argc, char **argv, profile_opts *o)
{
    const char *cmd = "profile";
    int rc = 0;
    int64_t v;
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) {
            profile_usage(stdout);
            return 0;
        } else if (takes_value(a) && !val) {
            rc = cli_failf(2, "profile: %s needs a value", a);
        } else if (!strcmp(a, "--capture")) {
            o->capture = val, i++;
        } else if (!strcmp(a, "--artifact")) {
            o->in = val, i++;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            o->out = val, i++;
        } else if (!strcmp(a, "--model")) {
            o->p.model = val, i++;
        } else if (!strcmp(a, "--corpus")) {
            o->p.corpus = val, i++;
        } else if (!strcmp(a, "--tolerance")) {
            rc = cli_opt_f64(cmd, a, val, 0, 1e6, &o->p.tolerance), i++;
        } else if (!strcmp(a, "--knobs")) {
            rc = cli_parse_knobs("profile", val, &o->p.knobs), i++;
        } else if (!strcmp(a, "--prompt-fraction")) {
            rc = cli_opt_f64(cmd, a, val, 0, 0.999999, &o->p.prompt_fraction), i++;
        } else if (!strcmp(a, "--window")) {
            if (!(rc = cli_opt_i64(cmd, a, val, 0, 1 << 30, &v)))
                o->p.leankv.window = (int32_t)v;
            i++;
        } else if (!strcmp(a, "--alpha-h")) {
            free(o->ah), o->ah = NULL;
            rc = parse_list(a, val, 0, 0, 1e6, &o->ah, &o->p.n_alpha_h), i++;
            o->p.alpha_h = o->ah;
        } else if (!strcmp(a, "--alpha-l")) {
            free(o->al), o->al = NULL;
            rc = parse_list(a, val, 0, 0, 1e6, &o->al, &o->p.n_alpha_l), i++;
            o->p.alpha_l = o->al;
        } else if (!strcmp(a, "--pats-b-min")) {
            if (!(rc = cli_opt_i64(cmd, a, val, 0, 10, &v)))
                o->p.pats_b_min = (int32_t)v;
            i++;
        } else if (!strcmp(a, "--pats-dtype")) {
            if (!strcmp(val, "f16"))
                o->p.pats_dtype = KVQ_DT_F16;
            else if (!strcmp(val, "bf16"))
                o->p.pats_dtype = KVQ_DT_BF16;
            else
                rc = cli_failf(2, "profile: --pats-dtype must be f16 or bf16, not '%s'", val);
            i++;
        } else if (!strcmp(a, "--budgets")) {
            free(o->bu), o->bu = NULL;
            rc = parse_list(a, val, 1, 1e-9, 1, &o->bu, &o->p.n_budgets), i++;
            o->p.budgets = o->bu;
        } else if (!strcmp(a, "--taus")) {
            free(o->ta), o->ta = NULL;
            rc = parse_list(a, val, 0, 1e-9, 1, &o->ta, &o->p.n_taus), i++;
            o->p.taus = o->ta;
        } else if (!strcmp(a, "--sink")) {
            if (!(rc = cli_opt_i64(cmd, a, val, 0, 1 << 30, &v)))
                o->p.retrieval.sink = (int32_t)v;
            i++;
        } else if (!strcmp(a, "--positions")) {
            if (kvq_positions_parse(val, &o->p.retrieval.positions))
                rc = cli_failf(2, "profile: --positions must be wrope or rope, not '%s'", val);
            i++;
        } else if (!strcmp(a, "--seq-len")) {
            if (!(rc = cli_opt_i64(cmd, a, val, 2, 1 << 20, &v)))
                o->p.ppl_seq_len = (uint32_t)v;
            i++;
        } else if (!strcmp(a, "--ppl-tokens")) {
            if (!(rc = cli_opt_i64(cmd, a, val, 2, INT64_MAX, &v)))
                o->p.ppl_max_tokens = (uint64_t)v;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (!(rc = cli_opt_i64(cmd, a, val, 0, INT64_MAX, &v)))
                o->p.corpus_seed = (uint64_t)v;
            i++;
        } else if (!strcmp(a, "--threads")) {
            if (!(rc = cli_opt_i64(cmd, a, val, 1, 1024, &v)))
                o->p.threads = (int32_t)v;
            i++;
        } else if (!strcmp(a, "--sample-rows")) {
            if (!(rc = cli_opt_i64(cmd, a, val, 0, INT32_MAX, &v)))
                o->p.sample_rows = v;
            i++;
        } else if (!strcmp(a, "--sample-jobs")) {
            rc = cli_opt_f64(cmd, a, val, 1e-6, 1, &o->p.sample_jobs), i++;
        } else if (!strcmp(a, "--reference")) {
            o->p.reference = 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--force")) {
            o->force = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o->quiet = 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o->verbose++;
        } else {
            rc = cli_failf(2, "profile: unknown option '%s' (see kvq profile --help)", a);
        }
    }
    if (rc)
        return rc;
    if (!o->capture || !o->in || !o->out)
        return cli_failf(2, "profile: --capture, --artifact and -o are required "
                         "(see kvq profile --help)");
    if (!o->p.model != !o->p.corpus)
        return cli_failf(2, "profile: --model and --corpus go together");
    return -1;
}

int cmd_profile(int argc, char **argv)
{
    profile_opts o = {.p = kvq_profile_params_default()};
    kvq_profile_result *res = NULL;
    kvq_err e = {0};
    int rc = profile_parse(argc, argv, &o);
    if (rc >= 0)
        goto done;
    rc = 0;
    cli_keep_freed_memory(); /* per-job buffers of the grid (cli.h) */
    o.p.cb = cli_callbacks(o.verbose, o.quiet);
    o.p.dist = cli_dist(); /* under mpirun: the grid split by layers (docs/mpi.md) */
    if ((rc = cli_check_corpus(o.p.corpus)) ||
        (rc = cli_claim_output(o.out, (const char *const[]){o.capture, o.in, o.p.model}, 3)))
        goto done;
    if (kvq_profile_run(o.capture, o.in, o.out, o.force, &o.p, &res, &e) != KVQ_OK) {
        rc = cli_fail(&e);
        goto done;
    }
    if (o.json)
        print_json(res, o.out);
    else
        print_tables(res, &o.p);
    kvq_log(&o.p.cb, KVQ_LOG_INFO, "wrote %s", o.out);
done:
    kvq_profile_result_free(res);
    free(o.ah);
    free(o.al);
    free(o.bu);
    free(o.ta);
    return rc;
}
