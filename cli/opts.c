/* opts.c — the option groups shared by several subcommands (cli/opts.h). */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "kvq/codebook.h"

int cli_model_opt(const char *cmd, cli_model_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    int rc = 0;
    if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
        o->quiet = 1;
        return 0;
    } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
        o->verbose++;
        return 0;
    } else if (!strcmp(a, "--accept-approx-tokenizer")) {
        o->approx_tokenizer = 1;
        return 0;
    } else if (!strcmp(a, "--model")) {
        if (!val)
            return cli_failf(2, "%s: %s needs a value", cmd, a);
        o->model = val;
    } else if (!strcmp(a, "--seed")) {
        rc = cli_opt_i64(cmd, a, val, 0, INT64_MAX, &o->seed);
    } else if (!strcmp(a, "--threads")) {
        rc = cli_opt_i64(cmd, a, val, 1, 1024, &o->threads);
    } else {
        return -1;
    }
    if (!rc)
        (*i)++;
    return rc;
}

int cli_fit_opt(const char *cmd, kvq_fit_params *p, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    kvq_err e = {0};
    int64_t v;
    int rc = 0;
    if (!strcmp(a, "--method")) {
        if (kvq_codebook_method_parse(val, &p->method, &e))
            return cli_failf(2, "%s: --method: %s", cmd, e.msg);
    } else if (!strcmp(a, "--codebook")) {
        if (!(rc = cli_opt_i64(cmd, a, val, 2, 65536, &v)))
            p->codebook_size = (int32_t)v;
    } else if (!strcmp(a, "--groups")) {
        if (!(rc = cli_opt_i64(cmd, a, val, 1, 65536, &v)))
            p->groups = (int32_t)v;
    } else if (!strcmp(a, "--iters")) {
        if (!(rc = cli_opt_i64(cmd, a, val, 0, 1000000, &v)))
            p->iters = (int32_t)v;
    } else if (!strcmp(a, "--init")) {
        if (kvq_kmeans_init_parse(val, &p->init, &e) || p->init == KVQ_KMEANS_INIT_GIVEN)
            return cli_failf(2, "%s: --init: %s", cmd,
                             e.msg[0] ? e.msg : "'given' needs centroids");
    } else {
        return -1;
    }
    if (!rc)
        (*i)++;
    return rc;
}

int cli_parse_knobs(const char *cmd, const char *s, unsigned *knobs)
{
    static const struct {
        const char *name;
        unsigned bit;
    } k[] = {{"leankv", KVQ_KNOB_LEANKV}, {"pats", KVQ_KNOB_PATS}, {"budget", KVQ_KNOB_BUDGET},
             {"mass", KVQ_KNOB_MASS},     {"all", KVQ_KNOB_ALL}};
    char *copy = s ? strdup(s) : NULL, *save = NULL;
    int rc = 0;
    *knobs = 0;
    if (!s)
        return cli_failf(2, "%s: --knobs needs a value", cmd);
    for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; t && !rc;
         t = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < sizeof k / sizeof k[0] && strcmp(t, k[i].name))
            i++;
        if (i == sizeof k / sizeof k[0])
            rc = cli_failf(2, "%s: --knobs: unknown knob '%s' (leankv, pats, budget, mass)", cmd,
                           t);
        else
            *knobs |= k[i].bit;
    }
    free(copy);
    if (!rc && !*knobs)
        rc = cli_failf(2, "%s: --knobs: no knob in '%s'", cmd, s);
    return rc;
}
