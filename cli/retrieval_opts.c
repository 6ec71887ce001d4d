/* retrieval_opts.c — retrieval-attention options shared by `kvq run` and `kvq eval`. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/retrieval_opts.h"
#include "kvq/eval.h"

void cli_retrieval_init(cli_retrieval *o)
{
    memset(o, 0, sizeof *o);
    o->p = kvq_retrieval_params_default();
}

/* A GQA group rule (--group, --resid-group): sum or max; 2 with a message otherwise. */
static int group_opt(const char *cmd, const char *opt, const char *val, kvq_group_score *g)
{
    if (!strcmp(val, "sum") || !strcmp(val, "max")) {
        *g = !strcmp(val, "sum") ? KVQ_GROUP_SUM : KVQ_GROUP_MAX;
        return 0;
    }
    fprintf(stderr, "kvq %s: %s: '%s' is not sum or max\n", cmd, opt, val);
    return 2;
}

/* --rerank R (R x budget candidates; 0 = off) or +E (the budget plus E of the cache's
 * candidates: a fraction, 0.08, or a percentage, 8%) */
static int rerank_opt(const char *cmd, const char *val, kvq_retrieval_params *p)
{
    double f = 0;
    if (val[0] == '+') {
        char buf[64];
        const size_t n = strlen(val + 1);
        const int pct = n > 0 && val[n] == '%';
        if (n == 0 || n >= sizeof buf || (pct && n == 1)) {
            fprintf(stderr, "kvq %s: --rerank: '%s' is not +E (a share of the cache)\n", cmd, val);
            return 2;
        }
        memcpy(buf, val + 1, n - (size_t)pct);
        buf[n - (size_t)pct] = 0;
        if (cli_opt_f64(cmd, "--rerank", buf, 1e-9, pct ? 99 : 0.99, &f))
            return 2;
        p->rerank = 0;
        p->rerank_extra = pct ? f / 100 : f;
        return 0;
    }
    if (cli_opt_f64(cmd, "--rerank", val, 0, 64, &f))
        return 2;
    if (f > 0 && f < 1) {
        fprintf(stderr, "kvq %s: --rerank: %s is not 0 (off), in [1, 64] or +E\n", cmd, val);
        return 2;
    }
    p->rerank = f;
    p->rerank_extra = 0;
    return 0;
}

int cli_retrieval_opt(const char *cmd, cli_retrieval *o, int argc, char **argv, int *i, int eval)
{
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    const char *sel_opt = eval ? "--selectors" : "--selector";
    const char *bud_opt = eval ? "--budgets" : "--budget";
    static const char *const value_opts[] = {
        "--artifact", "--selector", "--selectors", "--budget", "--budgets", "--positions",
        "--sink",     "--window",   "--cache",     "--group",  "--tau",     "--attn-threads",
        "--device",   "--rows",     "--score-pos", "--rerank",
        "--resid-bits", "--resid-wide", "--resid-group", "--resid-share"};
    if (!strcmp(a, "--accept-model-mismatch")) {
        o->accept_mismatch = 1;
        return 0;
    }
    int known = 0;
    for (size_t k = 0; k < sizeof value_opts / sizeof value_opts[0]; k++)
        known |= !strcmp(a, value_opts[k]);
    if (!known || (!strcmp(a, "--selector") && eval) || (!strcmp(a, "--selectors") && !eval) ||
        (!strcmp(a, "--budget") && eval) || (!strcmp(a, "--budgets") && !eval))
        return -1;
    if (!val) {
        fprintf(stderr, "kvq %s: %s needs a value\n", cmd, a);
        return 2;
    }
    int64_t v;
    double f;
    int rc = 0;
    o->given = 1;
    (*i)++;
    if (!strcmp(a, "--artifact")) {
        o->artifact = val;
    } else if (!strcmp(a, sel_opt)) {
        o->selectors = val;
    } else if (!strcmp(a, bud_opt)) {
        o->budgets = val;
        /* each comma-separated budget checked now, before any model is read */
        for (const char *b = val; !rc && *b;) {
            const size_t n = strcspn(b, ",");
            char item[64];
            kvq_budget bud;
            kvq_err e = {0};
            snprintf(item, sizeof item, "%.*s", (int)(n < sizeof item ? n : sizeof item - 1), b);
            if (kvq_budget_parse(item, &bud, &e) != KVQ_OK) {
                fprintf(stderr, "kvq %s: %s\n", cmd, e.msg);
                rc = 2;
            }
            b += n + (b[n] == ',');
        }
    } else if (!strcmp(a, "--positions")) {
        o->pos_given = 1;
        if (kvq_positions_parse(val, &o->p.positions)) {
            fprintf(stderr, "kvq %s: --positions: '%s' is not wrope or rope\n", cmd, val);
            rc = 2;
        }
    } else if (!strcmp(a, "--score-pos")) {
        o->score_given = 1;
        if (kvq_score_pos_parse(val, &o->p.score_pos)) {
            fprintf(stderr, "kvq %s: --score-pos: '%s' is not rb, mean or bands\n", cmd, val);
            rc = 2;
        }
    } else if (!strcmp(a, "--sink")) {
        if (!(rc = cli_opt_i64(cmd, a, val, 0, 1 << 20, &v)))
            o->p.sink = (int32_t)v;
    } else if (!strcmp(a, "--window")) {
        if (!(rc = cli_opt_i64(cmd, a, val, 1, 1 << 20, &v)))
            o->p.window = (int32_t)v;
    } else if (!strcmp(a, "--cache")) {
        if (!strcmp(val, "f16"))
            o->p.cache_dtype = KVQ_DT_F16;
        else if (!strcmp(val, "f32"))
            o->p.cache_dtype = KVQ_DT_F32;
        else {
            fprintf(stderr, "kvq %s: --cache: '%s' is not f16 or f32\n", cmd, val);
            rc = 2;
        }
    } else if (!strcmp(a, "--group")) {
        rc = group_opt(cmd, a, val, &o->p.group);
    } else if (!strcmp(a, "--rerank")) {
        rc = rerank_opt(cmd, val, &o->p);
    } else if (!strcmp(a, "--resid-bits")) {
        if (!(rc = cli_opt_f64(cmd, a, val, 0, 8, &f)) && f != 0 && f != 1 && f != 2 && f != 4 &&
            f != 8) {
            fprintf(stderr, "kvq %s: --resid-bits: %s is not 0 (off), 1, 2, 4 or 8\n", cmd, val);
            rc = 2;
        }
        if (!rc)
            o->p.resid_bits = (int32_t)f;
    } else if (!strcmp(a, "--resid-wide")) {
        if (!(rc = cli_opt_f64(cmd, a, val, 1, 64, &f)))
            o->p.resid_wide = f;
    } else if (!strcmp(a, "--resid-group")) {
        rc = group_opt(cmd, a, val, &o->p.resid_group);
    } else if (!strcmp(a, "--resid-share")) {
        if (!(rc = cli_opt_f64(cmd, a, val, 0.01, 1, &f)))
            o->p.resid_share = f;
    } else if (!strcmp(a, "--tau")) {
        if (!(rc = cli_opt_f64(cmd, a, val, 1e-12, 1, &f)))
            o->p.tau = f;
    } else if (!strcmp(a, "--device")) {
        kvq_err e = {0};
        if (kvq_retrieval_device_parse(val, &o->p.device, &e) != KVQ_OK) {
            fprintf(stderr, "kvq %s: --device: '%s' is not cpu, cuda or auto\n", cmd, val);
            rc = 2;
        }
    } else if (!strcmp(a, "--rows")) {
        if (!strcmp(val, "code"))
            o->p.code_order = 1;
        else if (!strcmp(val, "token"))
            o->p.code_order = 0;
        else {
            fprintf(stderr, "kvq %s: --rows: '%s' is not code or token\n", cmd, val);
            rc = 2;
        }
    } else if (!strcmp(a, "--attn-threads")) {
        if (!(rc = cli_opt_i64(cmd, a, val, 1, 1024, &v)))
            o->p.threads = (int32_t)v;
    } else {
        rc = -1;
    }
    return rc;
}

void cli_retrieval_usage(FILE *f, int eval)
{
    fprintf(f, "retrieval attention (any of these switches it on):\n"
               "  --artifact A       the model's .kvq artifact (codebooks); refused when it was\n"
               "                     made for another model or other weights (fingerprint)\n"
               "  --accept-model-mismatch  use an artifact whose weight fingerprint differs\n"
               "                     from the model's, with a warning (not its shape)\n");
    if (eval)
        fprintf(f,
                "  --selectors LIST   comma-separated: full, oracle, codebook (or the artifact's\n"
                "                     method name), fier, quest, mass (default: all that apply)\n"
                "  --budgets LIST     comma-separated budgets: a token count, a fraction (0.06)\n"
                "                     or a percentage (6%%), or all (default 6%%)\n");
    else
        fprintf(f, "  --selector S       full, oracle, codebook (or the artifact's method name),\n"
                   "                     fier, quest, mass (default codebook with an artifact)\n"
                   "  --budget B         retrieved tokens per step besides sinks and window: a\n"
                   "                     count, a fraction (0.06), a percentage (6%%) or all "
                   "(default 6%%)\n");
    fprintf(f, "  --positions P      wrope (R_b outside the window) or rope (exact) (default:\n"
               "                     the artifact's positions.mode, chosen by kvq calibrate;\n"
               "                     wrope without one)\n"
               "  --score-pos S      codebook scoring query: rb (q R_b), mean (the mean\n"
               "                     rotation over the candidates' distances) or bands (one\n"
               "                     LUT per doubling band of distances) (default: the\n"
               "                     artifact's positions.score, else mean)\n"
               "  --rerank R|+E      codebook selector in two stages: the codebook's\n"
               "                     candidates, R x budget or the budget plus E of the\n"
               "                     cache (+0.08 or +8%%), are read exactly and the best\n"
               "                     budget kept; 0 = off (default +8%%)\n"
               "  --resid-bits B     residual stage before the rerank: each key's residual\n"
               "                     from its centroid at B = 1, 2, 4 or 8 bits per channel\n"
               "                     (d B / 8 + 4 bytes); 0 = off (default 1)\n"
               "  --resid-wide W     with --resid-bits: the codebook picks W x the rerank's\n"
               "                     candidates, residual scores keep the rerank's (default 64)\n"
               "  --resid-group G    the residual stage's rule over the GQA group: sum (the\n"
               "                     summed query) or max (each head's own score, the best\n"
               "                     kept) (default max)\n"
               "  --resid-share S    largest share of the candidates the residual stage\n"
               "                     scores, (0, 1] (default 1: every candidate)\n"
               "  --sink N           first tokens always attended (default 4)\n"
               "  --window N         last tokens always attended, exact RoPE (default: the\n"
               "                     artifact's wrope.w, else 64)\n"
               "  --cache T          KV cache storage, f16 (default) or f32\n"
               "  --group G          GQA group's shared selection: sum (default) or max\n"
               "  --tau T            mass selector: softmax mass to reach, (0, 1] (default 0.9)\n"
               "  --rows R           order of the far cache rows with a single-group codebook:\n"
               "                     code (default: sorted by code, so a step reads runs of\n"
               "                     rows) or token\n"
               "  --attn-threads N   KV heads attended in parallel (default 1)\n"
               "  --device D         where the codebook selection runs: cpu (default), cuda\n"
               "                     or auto; cuda without a device warns and uses the CPU\n");
}

int cli_retrieval_open(cli_retrieval *o, const kvq_model *m, const char *model_path,
                       const kvq_callbacks *cb, kvq_codebook_set **rt)
{
    *rt = NULL;
    /* once per command, so a CUDA request that cannot be met warns once however many
     * contexts (eval rows) follow */
    o->p.device = kvq_retrieval_device_resolve(o->p.device, cb);
    if (!o->artifact)
        return 0;
    kvq_model_id id;
    kvq_model_identity(m, &id);
    kvq_err e = {0};
    const unsigned flags = o->accept_mismatch ? KVQ_OPEN_ACCEPT_MODEL_MISMATCH : 0;
    if (kvq_codebook_set_open_ex(o->artifact, &id, model_path, flags, rt, &e) != KVQ_OK) {
        cli_fail(&e);
        if (e.status == KVQ_E_MISMATCH && strstr(e.msg, "fingerprint"))
            fprintf(stderr, "kvq: (--accept-model-mismatch uses it anyway)\n");
        return 1;
    }
    if (kvq_codebook_set_weights(*rt) != KVQ_WEIGHTS_MATCH)
        fprintf(stderr, "kvq: warning: %s\n", kvq_codebook_set_weights_note(*rt));
    /* the position mode and scoring query kvq calibrate chose, unless given */
    kvq_positions pm;
    kvq_score_pos ps;
    if (kvq_eval_artifact_positions(*rt, &o->p, o->pos_given, o->score_given) &&
        kvq_codebook_set_positions(*rt, &pm, &ps))
        kvq_log(cb, KVQ_LOG_INFO, "positions %s, score %s (kvq calibrate measured and chose %s, "
                "%s)", kvq_positions_name(o->p.positions), kvq_score_pos_name(o->p.score_pos),
                kvq_positions_name(pm), kvq_score_pos_name(ps));
    return 0;
}

int cli_retrieval_rows(const char *cmd, const cli_retrieval *o, const kvq_codebook_set *rt,
                       cli_row **rows, size_t *n_rows)
{
    kvq_eval_row *r = NULL;
    size_t n = 0;
    kvq_err e = {0};
    if (kvq_eval_rows_expand(o->selectors, o->budgets, rt, &o->p, &r, &n, &e) != KVQ_OK)
        return e.status == KVQ_E_NOMEM ? cli_failf(1, "out of memory")
                                       : cli_failf(e.status == KVQ_E_MISMATCH ? 1 : 2, "%s: %s",
                                                   cmd, e.msg);
    cli_row *out = calloc(n + 1, sizeof *out);
    if (!out) {
        free(r);
        return cli_failf(1, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        out[i].selector = r[i].rp.selector;
        out[i].budget = r[i].rp.budget;
        memcpy(out[i].name, r[i].name, sizeof out[i].name);
        memcpy(out[i].budget_str, r[i].budget, sizeof out[i].budget_str);
    }
    free(r);
    *rows = out;
    *n_rows = n;
    return 0;
}
