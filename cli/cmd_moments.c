/* cmd_moments.c — `kvq moments`: query second moments and Cholesky factors from a capture. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "kvq/moments.h"

static void moments_usage(FILE *f)
{
    fprintf(f,
            "usage: kvq moments --capture DIR -o FILE [options]\n"
            "\n"
            "Computes, per layer and KV head, the query second moment H (the GQA group's\n"
            "queries averaged), its Cholesky factor L (H + lambda I = L L^T) and L^-1, and\n"
            "writes them to FILE (safetensors) for `kvq fit`.\n"
            "\n"
            "options:\n"
            "  --capture DIR          capture directory written by `kvq capture` (required)\n"
            "  -o, --output FILE      moments file to write (required)\n"
            "  --positions MODE       wrope: H = R_b^T E[q^T q] R_b (default)\n"
            "                         rope:  H from post-RoPE stored queries (ablation)\n"
            "  --wrope-b N            WRoPE position b (default 2048)\n"
            "  --wrope-w N            WRoPE window w, recorded for later stages (default 64)\n"
            "  --device cpu|cuda      where to factor (default cpu; cuda falls back to the\n"
            "                         CPU with a warning when no GPU is usable)\n"
            "  --force                overwrite FILE if it exists\n"
            "  -q, --quiet            no progress or summary\n"
            "  -v, --verbose          more detail\n"
            "  -h, --help             this help\n");
}

/* One line per layer: regularized heads, largest lambda, condition range. */
static int print_summary(const char *path, const kvq_callbacks *cb)
{
    kvq_err e = {0};
    kvq_moments *m = NULL;
    if (kvq_moments_open(path, &m, &e) != KVQ_OK)
        return cli_fail(&e);
    const kvq_model_id *id = kvq_moments_model(m);
    for (int32_t i = 0; i < kvq_moments_n_layers(m); i++) {
        const int32_t layer = kvq_moments_layer(m, i);
        double cmin = INFINITY, cmax = 0, lmax = 0, count = 0;
        int n_reg = 0;
        for (int32_t h = 0; h < id->n_kv_heads; h++) {
            kvq_moments_head_stats s;
            if (kvq_moments_get_stats(m, layer, h, &s, &e) != KVQ_OK) {
                kvq_moments_close(m);
                return cli_fail(&e);
            }
            cmin = fmin(cmin, s.cond);
            cmax = fmax(cmax, s.cond);
            lmax = fmax(lmax, s.lambda);
            n_reg += s.lambda > 0;
            count = s.count;
        }
        kvq_log(cb, KVQ_LOG_INFO,
                "layer %d: %d KV heads, %.0f queries each, cond %.3g .. %.3g, "
                "%d regularized (max lambda %.3g)", (int)layer, (int)id->n_kv_heads, count,
                cmin, cmax, n_reg, lmax);
    }
    kvq_moments_close(m);
    return 0;
}

int cmd_moments(int argc, char **argv)
{
    const char *cmd = "moments", *capture = NULL, *out = NULL;
    kvq_moments_params p = kvq_moments_params_default();
    int force = 0, quiet = 0, verbose = 0, rc;
    int64_t v;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) {
            moments_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--capture") && val) {
            capture = val, i++;
        } else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && val) {
            out = val, i++;
        } else if (!strcmp(a, "--positions") && val) {
            if (kvq_positions_parse(val, &p.positions))
                return cli_failf(2, "moments: --positions must be wrope or rope, not '%s'", val);
            i++;
        } else if (!strcmp(a, "--wrope-b")) {
            if ((rc = cli_opt_i64(cmd, a, val, 0, INT32_MAX, &p.wrope_b)))
                return rc;
            i++;
        } else if (!strcmp(a, "--wrope-w")) {
            if ((rc = cli_opt_i64(cmd, a, val, 1, INT32_MAX, &v)))
                return rc;
            p.wrope_w = (int32_t)v;
            i++;
        } else if (!strcmp(a, "--device") && val) {
            if (!strcmp(val, "cpu"))
                p.device = KVQ_MOMENTS_CPU;
            else if (!strcmp(val, "cuda"))
                p.device = KVQ_MOMENTS_CUDA;
            else
                return cli_failf(2, "moments: --device must be cpu or cuda, not '%s'", val);
            i++;
        } else if (!strcmp(a, "--force")) {
            force = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose++;
        } else if (!val && (!strcmp(a, "--capture") || !strcmp(a, "-o") ||
                            !strcmp(a, "--output") || !strcmp(a, "--positions") ||
                            !strcmp(a, "--device"))) {
            return cli_failf(2, "moments: %s needs a value", a);
        } else {
            moments_usage(stderr);
            return cli_failf(2, "moments: unknown option '%s'", a);
        }
    }
    if (!capture || !out) {
        moments_usage(stderr);
        return cli_failf(2, "moments: --capture and -o are required");
    }

    if ((rc = cli_claim_output(out, (const char *const[]){capture}, 1)))
        return rc;
    kvq_callbacks cb = cli_callbacks(verbose, quiet);
    kvq_err e = {0};
    if (kvq_moments_compute(capture, out, force, &p, &cb, &e) != KVQ_OK)
        return cli_fail(&e);
    if ((rc = print_summary(out, &cb)))
        return rc;
    kvq_log(&cb, KVQ_LOG_INFO, "wrote %s (positions %s, b %lld)", out,
            kvq_positions_name(p.positions), (long long)p.wrope_b);
    return 0;
}
