/* opts.c — the option groups shared by several subcommands (cli/opts.h). */
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
