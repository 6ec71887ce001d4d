/* cmd_calibrate.c — `kvq calibrate`: capture, moments, fit, held-out capture and profile
 * in one resumable run (kvq/calibrate.h), with stage banners on stderr and a summary
 * on stdout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "kvq/calibrate.h"

static void calibrate_usage(FILE *f)
{
    fprintf(f,
            "usage: kvq calibrate --model M -o OUT.kvq [options]\n"
            "\n"
            "Runs the whole pipeline with defaults sized for a quick run: capture of the\n"
            "calibration tokens, query moments, codebook fit, a capture of the held-out tokens\n"
            "that follow them, and the threshold / budget profile measured on those. Writes\n"
            "the final artifact to OUT.kvq and keeps every stage's output in a work directory;\n"
            "a stage whose output is there and was made with the same parameters is skipped,\n"
            "so an interrupted run resumes, and a changed parameter reruns only that stage and\n"
            "the ones after it. Stage banners and progress go to stderr, the summary to stdout.\n"
            "With the defaults, stories260K takes about 45 s on 2 cores (most of it profiling).\n"
            "Under mpirun or srun the captures and the fit are split among the ranks, with\n"
            "the same output bytes (docs/mpi.md).\n"
            "\n"
            "options:\n"
            "  --model M              GGUF file or HF directory (required)\n"
            "  -o, --output OUT.kvq   artifact to write (required); replaced when its content\n"
            "                         changes if this work directory wrote it, else only\n"
            "                         with --force; never when it is not a .kvq artifact\n"
            "  --corpus SPEC          calibration text, as kvq capture takes it; default\n"
            "                         %s (about 20,000 synthetic\n"
            "                         tokens: UUID lines, passkey and key-value recall\n"
            "                         prompts; kvq has no built-in natural text: give text\n"
            "                         files for a real model)\n"
            "  --work DIR             work directory (default OUT.kvq.work): one that kvq made\n"
            "                         (marked .kvq-work) or an empty one\n"
            "  --method M             qavq (default), vq, pq, qapq, vq-postrope (see kvq fit)\n"
            "  --seq-len N            tokens per sequence, BOS included (default 512)\n"
            "  --max-tokens N         calibration tokens (default 16384)\n"
            "  --heldout-tokens N     tokens after those that the profile measures on; 0 =\n"
            "                         profile on the calibration capture (default 2048)\n"
            "  --codebook K           centroids per codebook (default: 4096 halved until each\n"
            "                         centroid has 39 training keys: 256 with the defaults)\n"
            "  --groups G             codebooks per head (default 1; 4 for pq and qapq)\n"
            "  --iters N              k-means iterations (default 25)\n"
            "  --init NAME            greedy-k-means++ (default), k-means++, k-means||, random\n"
            "  --tolerance T          profile: quality tolerance on the attention-output error\n"
            "                         (default 0.05)\n"
            "  --positions P          profile: exact step of the budget runs, wrope (default:\n"
            "                         R_b outside the window, as kvq run) or rope (exact RoPE)\n"
            "  --no-profile           stop after the fit (no held-out capture, no thresholds)\n"
            "  --positions-tokens N   held-out tokens the positions stage measures on: exact\n"
            "                         attention, full under wrope, the codebook at the\n"
            "                         default budget under wrope/rb and rope/rb|mean|bands;\n"
            "                         it records the best whose position mode costs at most\n"
            "                         --positions-tolerance, the default of kvq run / eval\n"
            "                         (default 1024)\n"
            "  --positions-tolerance T  relative perplexity (default 0.01)\n"
            "  --no-positions         no positions stage (kvq run / eval then default to\n"
            "                         wrope, mean)\n"
            "  --knobs LIST           what the profile profiles: any of leankv,pats,budget,\n"
            "                         mass (default all; see kvq profile)\n"
            "  --seed S               seed of the synthetic corpus, query sample and k-means\n"
            "                         (default 1234)\n"
            "  --threads T            threads (default: all CPUs; outputs do not depend on it)\n"
            "  --device cpu|cuda      where moments and k-means run (default cpu; cuda falls\n"
            "                         back to the CPU with a warning when no GPU is usable)\n"
            "  --force                rerun every stage, and replace OUT.kvq even when this\n"
            "                         work directory did not write it\n"
            "  --accept-approx-tokenizer\n"
            "                         use a tokenizer whose pre-tokenizer kvq does not\n"
            "                         implement, approximated by the GPT-2 split and\n"
            "                         recorded in the artifact (default: refused)\n"
            "  -q, --quiet            only warnings and errors on stderr\n"
            "  -v, --verbose          more detail\n"
            "  -h, --help             this help\n"
            "\n"
            "work directory: capture/, moments.safetensors, fit.kvq, heldout/, profile.kvq,\n"
            "positions.kvq, and\n"
            "STAGE.params.json next to each (the parameters it was made with). One run at a\n"
            "time holds the work directory and the output (lock files .kvq-lock and\n"
            "OUT.kvq.lock); a second run stops at once, naming the first (docs/outputs.md).\n"
            "\n"
            "example: kvq calibrate --model stories260K.gguf -o stories260K.kvq\n",
            KVQ_CALIBRATE_CORPUS);
}

static int takes_value(const char *a)
{
    static const char *const opts[] = {"--model", "-o", "--output", "--corpus", "--work",
                                       "--method", "--seq-len", "--max-tokens",
                                       "--heldout-tokens", "--codebook", "--groups", "--iters",
                                       "--init", "--tolerance", "--positions", "--seed",
                                       "--positions-tokens", "--positions-tolerance",
                                       "--threads", "--device", NULL};
    for (int i = 0; opts[i]; i++)
        if (!strcmp(a, opts[i]))
            return 1;
    return 0;
}

typedef struct banner_state {
    int quiet;
} banner_state;

/* Stage banners: "== [2/5] moments: WHAT", then what happened to it. */
static void on_stage(void *user, const kvq_calibrate_stage_info *s)
{
    const banner_state *b = user;
    if (s->stage == KVQ_CALIB_PROFILE && s->event == KVQ_CALIB_EVENT_RUN)
        cli_keep_freed_memory(); /* per-job buffers of the grid (cli.h) */
    if (b->quiet)
        return;
    const char *name = kvq_calibrate_stage_name(s->stage);
    switch (s->event) {
    case KVQ_CALIB_EVENT_SKIP:
        fprintf(stderr, "kvq: == [%d/%d] %s: %s\nkvq:    skipped: %s (%s)\n", (int)s->index,
                (int)s->count, name, s->what, s->why, s->output);
        break;
    case KVQ_CALIB_EVENT_RUN:
        fprintf(stderr, "kvq: == [%d/%d] %s: %s\nkvq:    running: %s\n", (int)s->index,
                (int)s->count, name, s->what, s->why);
        break;
    case KVQ_CALIB_EVENT_DONE:
        fprintf(stderr, "kvq:    done in %.1f s: %s\n", s->seconds, s->output);
        break;
    }
    fflush(stderr);
}

static const char *met_str(int met)
{
    return met == 1 ? "within tolerance" : met == 0 ? "NOT within tolerance: best found" : "";
}

static void print_summary(const char *out, const kvq_calibrate_summary *s)
{
    struct stat st;
    const long long bytes = stat(out, &st) == 0 ? (long long)st.st_size : -1;
    printf("calibrate: %s %s (%lld bytes)\n", s->out_replaced ? "wrote" : "up to date:", out,
           bytes);
    printf("  work directory  %s/\n", s->work_dir);
    printf("  stages         ");
    for (int i = 0; i < KVQ_CALIB_N_STAGES; i++) {
        if (s->ran[i] < 0)
            continue;
        printf(" %s ", kvq_calibrate_stage_name((kvq_calibrate_stage)i));
        if (s->ran[i])
            printf("%.1f s", s->seconds[i]);
        else
            printf("skipped");
        printf(i + 1 < KVQ_CALIB_N_STAGES ? "," : "");
    }
    printf("\n");
    printf("  tokens          %lld calibration in %lld sequences", (long long)s->n_tokens,
           (long long)s->n_sequences);
    if (s->n_heldout_tokens > 0)
        printf("; %lld held-out in %lld", (long long)s->n_heldout_tokens,
               (long long)s->n_heldout_sequences);
    printf("\n");
    printf("  codebooks       %s, K %d, G %d, %d heads\n", s->method, (int)s->codebook_size,
           (int)s->groups, (int)s->n_heads);
    if (isfinite(s->score_mse) && isfinite(s->score_mse_ref) && s->score_mse_ref > 0)
        printf("  score MSE       %.4g held out vs %.4g for plain %s: ratio %.3f\n", s->score_mse,
               s->score_mse_ref, s->groups > 1 ? "pq" : "vq", s->score_mse / s->score_mse_ref);
    else if (isfinite(s->score_mse))
        printf("  score MSE       %.4g held out\n", s->score_mse);
    if (s->positions[0])
        printf("  positions       %s, score %s: codebook %+.2f%% at the default budget; full "
               "under wrope %+.2f%% (exact perplexity %.4f)\n", s->positions, s->score_pos,
               100 * (s->positions_ppl / s->positions_ppl_exact - 1),
               100 * (s->positions_ppl_full_wrope / s->positions_ppl_exact - 1),
               s->positions_ppl_exact);
    if (!s->profiled)
        return;
    printf("  profile         metric %s, tolerance %g\n", s->metric, s->tolerance);
    if (s->leankv_met >= 0)
        printf("  leankv          alpha_h %g, alpha_l %g: memory %.1f%% of f16, err %.4f (%s)\n",
               s->leankv_alpha_h, s->leankv_alpha_l, 100 * s->leankv_memory, s->leankv_err,
               met_str(s->leankv_met));
    if (s->pats_met >= 0)
        printf("  pats            %s, b %d..%d: %.1f%% of the bits, %.1f%% of f16 in 64-byte "
               "blocks, err %.4f (%s)\n", s->pats_schedule, (int)s->pats_b_min,
               (int)s->pats_b_max, 100 * s->pats_bits, 100 * s->pats_memory, s->pats_err,
               met_str(s->pats_met));
    if (s->budget_met >= 0)
        printf("  budget          %g%% of tokens: %.1f%% attended with sinks and window, "
               "err %.4f (%s)\n", 100 * s->budget_fraction, 100 * s->budget_attended,
               s->budget_err, met_str(s->budget_met));
    if (s->mass_met >= 0)
        printf("  mass            tau %g: %.1f%% attended, err %.4f (%s)\n", s->mass_tau,
               100 * s->mass_attended, s->mass_err, met_str(s->mass_met));
}

int cmd_calibrate(int argc, char **argv)
{
    const char *cmd = "calibrate", *model = NULL, *out = NULL;
    kvq_calibrate_params p = kvq_calibrate_params_default();
    p.fit.date = cli_today();
    int quiet = 0, verbose = 0, rc = 0, r;
    int64_t v;
    kvq_err e = {0};

    p.threads = cli_default_threads();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) {
            calibrate_usage(stdout);
            return 0;
        } else if (takes_value(a) && !val) {
            return cli_failf(2, "calibrate: %s needs a value", a);
        } else if ((r = cli_fit_opt(cmd, &p.fit, argc, argv, &i)) >= 0) {
            if (r)
                return r;
        } else if (!strcmp(a, "--model")) {
            model = val, i++;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            out = val, i++;
        } else if (!strcmp(a, "--corpus")) {
            p.corpus = val, i++;
        } else if (!strcmp(a, "--work")) {
            p.work_dir = val, i++;
        } else if (!strcmp(a, "--seq-len")) {
            if ((rc = cli_opt_i64(cmd, a, val, 2, INT32_MAX, &p.capture.seq_len)))
                return rc;
            i++;
        } else if (!strcmp(a, "--max-tokens")) {
            if ((rc = cli_opt_i64(cmd, a, val, 2, INT32_MAX, &p.capture.max_tokens))) /* 1 seq */
                return rc;
            i++;
        } else if (!strcmp(a, "--heldout-tokens")) {
            if ((rc = cli_opt_i64(cmd, a, val, 0, INT32_MAX, &p.heldout_tokens)))
                return rc;
            i++;
        } else if (!strcmp(a, "--tolerance")) {
            if ((rc = cli_opt_f64(cmd, a, val, 0, 1e6, &p.prof.tolerance)))
                return rc;
            i++;
        } else if (!strcmp(a, "--positions")) {
            if (kvq_positions_parse(val, &p.prof.retrieval.positions))
                return cli_failf(2, "calibrate: --positions must be wrope or rope, not '%s'", val);
            i++;
        } else if (!strcmp(a, "--no-profile")) {
            p.profile = 0;
        } else if (!strcmp(a, "--no-positions")) {
            p.positions = 0;
        } else if (!strcmp(a, "--positions-tokens")) {
            if ((rc = cli_opt_i64(cmd, a, val, 2, INT32_MAX, &p.positions_tokens)))
                return rc;
            i++;
        } else if (!strcmp(a, "--positions-tolerance")) {
            if ((rc = cli_opt_f64(cmd, a, val, 0, 1e6, &p.positions_tolerance)))
                return rc;
            i++;
        } else if (!strcmp(a, "--knobs")) {
            if ((rc = cli_parse_knobs(cmd, val, &p.prof.knobs)))
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
        } else if (!strcmp(a, "--device")) {
            if (!strcmp(val, "cpu")) {
                p.fit.device = KVQ_KMEANS_DEVICE_CPU;
                p.moments.device = KVQ_MOMENTS_CPU;
            } else if (!strcmp(val, "cuda")) {
                p.fit.device = KVQ_KMEANS_DEVICE_CUDA;
                p.moments.device = KVQ_MOMENTS_CUDA;
            } else {
                return cli_failf(2, "calibrate: --device must be cpu or cuda, not '%s'", val);
            }
            i++;
        } else if (!strcmp(a, "--force")) {
            p.force = 1;
        } else if (!strcmp(a, "--accept-approx-tokenizer")) {
            p.accept_approx_tokenizer = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose++;
        } else {
            return cli_failf(2, "calibrate: unknown option '%s' (see kvq calibrate --help)", a);
        }
    }
    if (!model || !out)
        return cli_failf(2, "calibrate: --model and -o are required (see kvq calibrate --help)");

    if ((rc = cli_check_corpus(p.corpus)))
        return rc;
    banner_state bs = {quiet};
    p.cb = cli_callbacks(verbose, quiet);
    p.on_stage = on_stage;
    p.stage_user = &bs;
    p.dist = cli_dist();
    kvq_calibrate_summary sum;
    if (kvq_calibrate_run(model, out, &p, &sum, &e) != KVQ_OK)
        return cli_fail(&e);
    print_summary(out, &sum);
    return rc;
}
