/* cmd_fit.c — `kvq fit`: codebooks per (layer, KV head) from a capture and its moments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "kvq/codebook.h"

static void fit_usage(FILE *f)
{
    fprintf(f,
            "usage: kvq fit --capture DIR --moments FILE -o OUT.kvq [options]\n"
            "\n"
            "Fits a key codebook per layer and KV head with k-means++ and writes the .kvq\n"
            "artifact (docs/format.md), with per-head diagnostics: inertia per iteration,\n"
            "cluster sizes and the held-out attention-score error E[(q~.k - q~.k^)^2] of the\n"
            "method and of plain VQ with the same K and G.\n"
            "\n"
            "options:\n"
            "  --capture DIR          capture directory from `kvq capture` (required)\n"
            "  --moments FILE         moments file from `kvq moments` (required)\n"
            "  -o, --output OUT.kvq   artifact to write (required)\n"
            "  --method M             qavq (default): query-aware VQ, k-means on z = k L\n"
            "                         vq: plain VQ of pre-RoPE keys\n"
            "                         pq: plain grouped VQ;  qapq: query-aware grouped VQ\n"
            "                         vq-postrope: VQ of keys after RoPE (baseline)\n"
            "  --codebook K           centroids per codebook, 2..65536 (default 4096, halved\n"
            "                         until there are 39 training keys per centroid)\n"
            "  --groups G             codebooks per head, dividing the head dim (default 1;\n"
            "                         4 for pq and qapq)\n"
            "  --iters N              k-means iterations (default 25)\n"
            "  --tol T                stop when the inertia improves less than T (1e-4)\n"
            "  --init NAME            greedy-k-means++ (default), k-means++, k-means||, random\n"
            "  --seed S               seed of every random choice (default 1234)\n"
            "  --threads T            threads (default: all CPUs; the output does not depend\n"
            "                         on it)\n"
            "  --layers LIST          layers to fit, e.g. 0,2,5-7 (default: all captured)\n"
            "  --device cpu|cuda|auto where k-means runs (default cpu; cuda falls back to the\n"
            "                         CPU with a warning when no GPU is usable)\n"
            "  --holdout F            fraction of sequences held out for the score error, in\n"
            "                         [0, 1) (default 0.1)\n"
            "  --no-reference         do not fit the plain-VQ reference\n"
            "  --no-checkpoint        do not keep finished heads in OUT.kvq.ckpt/ (a killed\n"
            "                         run started again with the same options resumes there)\n"
            "  --force                overwrite OUT.kvq if it exists\n"
            "  -q, --quiet            no progress or summary\n"
            "  -v, --verbose          more detail\n"
            "  -h, --help             this help\n");
}

/* Options that take a value, for the "needs a value" message. */
static int takes_value(const char *a)
{
    static const char *const opts[] = {"--capture", "--moments", "-o", "--output", "--method",
                                       "--codebook", "--groups", "--iters", "--tol", "--init",
                                       "--seed", "--threads", "--layers", "--device",
                                       "--holdout", NULL};
    for (int i = 0; opts[i]; i++)
        if (!strcmp(a, opts[i]))
            return 1;
    return 0;
}

int cmd_fit(int argc, char **argv)
{
    const char *cmd = "fit", *capture = NULL, *moments = NULL, *out = NULL, *layers = NULL;
    kvq_fit_params p = kvq_fit_params_default();
    p.date = cli_today();
    int quiet = 0, verbose = 0, rc = 0, r;
    int64_t v;
    int32_t *layer_list = NULL;
    size_t n_layers = 0;
    kvq_err e = {0};

    p.threads = cli_default_threads();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) {
            fit_usage(stdout);
            return 0;
        } else if (takes_value(a) && !val) {
            return cli_failf(2, "fit: %s needs a value", a);
        } else if ((r = cli_fit_opt(cmd, &p, argc, argv, &i)) >= 0) {
            if (r)
                return r;
        } else if (!strcmp(a, "--capture")) {
            capture = val, i++;
        } else if (!strcmp(a, "--moments")) {
            moments = val, i++;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            out = val, i++;
        } else if (!strcmp(a, "--tol")) {
            if ((rc = cli_opt_f64(cmd, a, val, 0, 1, &p.tol)))
                return rc;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if ((rc = cli_opt_i64(cmd, a, val, 0, INT64_MAX, &v)))
                return rc;
            p.seed = (uint64_t)v, i++;
        } else if (!strcmp(a, "--threads")) {
            if ((rc = cli_opt_i64(cmd, a, val, 1, 1024, &v)))
                return rc;
            p.threads = (int32_t)v, i++;
        } else if (!strcmp(a, "--layers")) {
            layers = val, i++;
        } else if (!strcmp(a, "--device")) {
            if (!strcmp(val, "cpu"))
                p.device = KVQ_KMEANS_DEVICE_CPU;
            else if (!strcmp(val, "cuda"))
                p.device = KVQ_KMEANS_DEVICE_CUDA;
            else if (!strcmp(val, "auto"))
                p.device = KVQ_KMEANS_DEVICE_AUTO;
            else
                return cli_failf(2, "fit: --device must be cpu, cuda or auto, not '%s'", val);
            i++;
        } else if (!strcmp(a, "--holdout")) {
            if ((rc = cli_opt_f64(cmd, a, val, 0, 0.999999, &p.holdout)))
                return rc;
            i++;
        } else if (!strcmp(a, "--no-reference")) {
            p.reference = 0;
        } else if (!strcmp(a, "--no-checkpoint")) {
            p.checkpoint = 0;
        } else if (!strcmp(a, "--force")) {
            p.overwrite = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose++;
        } else {
            return cli_failf(2, "fit: unknown option '%s' (see kvq fit --help)", a);
        }
    }
    if (!capture || !moments || !out)
        return cli_failf(2, "fit: --capture, --moments and -o are required (see kvq fit --help)");
    if ((rc = cli_claim_output(out, (const char *const[]){capture, moments}, 2)))
        return rc;
    if (layers) {
        if (kvq_parse_index_list(layers, 1 << 20, &layer_list, &n_layers, &e))
            return cli_failf(2, "fit: --layers: %s", e.msg);
        p.layers = layer_list;
        p.n_layers = n_layers;
    }

    p.cb = cli_callbacks(verbose, quiet);
    p.dist = cli_dist();
    kvq_fit_summary sum;
    if (kvq_fit_run(capture, moments, out, &p, &sum, &e) != KVQ_OK) {
        rc = cli_fail(&e);
        goto done;
    }
    if (isfinite(sum.score_mse) && isfinite(sum.score_mse_ref))
        kvq_log(&p.cb, KVQ_LOG_INFO, "held-out score MSE %.6g (%.4g of the score power), "
                "reference %s %.6g: ratio %.3f", sum.score_mse,
                sum.score_power > 0 ? sum.score_mse / sum.score_power : NAN,
                sum.groups > 1 ? "pq" : "vq", sum.score_mse_ref,
                sum.score_mse_ref > 0 ? sum.score_mse / sum.score_mse_ref : NAN);
    else if (isfinite(sum.score_mse))
        kvq_log(&p.cb, KVQ_LOG_INFO, "held-out score MSE %.6g (%.4g of the score power)",
                sum.score_mse, sum.score_power > 0 ? sum.score_mse / sum.score_power : NAN);
    kvq_log(&p.cb, KVQ_LOG_INFO, "wrote %s (%s, K %d, G %d, %d heads%s)", out,
            kvq_codebook_method_name(p.method), (int)sum.codebook_size, (int)sum.groups,
            (int)sum.n_jobs, sum.n_resumed ? ", some resumed from the checkpoint" : "");
done:
    free(layer_list);
    return rc;
}
