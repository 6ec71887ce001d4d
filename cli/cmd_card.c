/* cmd_card.c — `kvq card ARTIFACT`: a model card (markdown) for the repository that
 * ships the artifact next to its weights: what the file is, which weights it belongs to
 * (name, file, fingerprint), how it was calibrated (provenance and method settings), the
 * quality it measured (the fit's held-out score error, the profile's chosen settings and
 * tables) and how to use it. Everything comes from the artifact's own metadata and
 * diagnostics (kvq_artifact_summary_read); nothing is measured again. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void card_usage(FILE *f)
{
    fprintf(f, "usage: kvq card ARTIFACT.kvq [-o CARD.md] [--force]\n"
               "\n"
               "Writes a model card in markdown for the artifact (stdout by default): what\n"
               "the file is, the weights it was calibrated on (name, file name and weight\n"
               "fingerprint: kvq refuses the artifact for other weights), the calibration\n"
               "(corpus, tokens, seed, method and settings, kvq version, date), the quality\n"
               "the artifact measured (held-out attention-score error, profile tables) and\n"
               "how to use it. Nothing is recomputed.\n"
               "\n"
               "options:\n"
               "  -o FILE      write the card to FILE (refused when it exists, unless --force)\n"
               "  --force      replace FILE\n"
               "  -h, --help   this help\n");
}

static const char *meta(const kvq_st *st, const char *key)
{
    const char *v = kvq_st_meta_get(st, key);
    return v && v[0] ? v : "—";
}

static void card_fit(FILE *f, const kvq_artifact_fit *fit)
{
    if (!fit->method) {
        fprintf(f, "The artifact records no fit diagnostics.\n\n");
        return;
    }
    const char *ref = fit->reference ? fit->reference : "none";
    fprintf(f, "Held-out attention-score MSE of the codebooks (lower is better; `%s` is the "
               "plain-VQ reference fitted on the same keys; power = E[score²]):\n\n",
            ref);
    fprintf(f, "| layer | %s | %s | %s / %s | power |\n|---:|---:|---:|---:|---:|\n",
            fit->method, ref, fit->method, ref);
    for (int64_t i = 0; i <= (int64_t)fit->n_fit; i++) {
        const int64_t row = i == (int64_t)fit->n_fit ? -1 : i; /* -1: every layer */
        const double a = kvq_artifact_fit_mean(fit, KVQ_FIT_SCORE_MSE, row);
        const double b = kvq_artifact_fit_mean(fit, KVQ_FIT_SCORE_MSE_REF, row);
        const double p = kvq_artifact_fit_mean(fit, KVQ_FIT_SCORE_POWER, row);
        char name[32];
        if (row < 0)
            snprintf(name, sizeof name, "**all**");
        else
            snprintf(name, sizeof name, "%d", (int)fit->layers[row]);
        fprintf(f, "| %s | %.4g | %.4g | %.3f | %.4g |\n", name, a, b,
                isfinite(b) && b > 0 ? a / b : NAN, p);
    }
    fputc('\n', f);
}

static void card_profile(FILE *f, const kvq_artifact_profile *pr)
{
    if (!pr->present) {
        fprintf(f, "No threshold profile (`kvq profile`) was recorded.\n\n");
        return;
    }
    fprintf(f, "Profile (`kvq profile`): metric %s, tolerance %g. Chosen settings:\n\n",
            pr->metric ? pr->metric : "?", pr->tolerance);
    fprintf(f, "| knob | setting | within tolerance |\n|---|---|---|\n");
    for (int k = 0; k < KVQ_SUMMARY_N_KNOBS; k++) {
        const kvq_artifact_knob *kn = &pr->knob[k];
        if (!kn->name)
            continue;
        fprintf(f, "| %s | ", kn->name);
        if (kn->skipped)
            fprintf(f, "skipped: %s", kn->skipped);
        for (int s = 0; s < kn->n_settings && !kn->skipped; s++)
            fprintf(f, "%s%s %s", s ? ", " : "", kn->setting_key[s],
                    kn->setting[s] ? kn->setting[s] : "—");
        fprintf(f, " | %s |\n", kn->met == 1 ? "yes" : kn->met == 0 ? "**no**" : "—");
    }
    fputc('\n', f);
    for (int k = 0; k < KVQ_SUMMARY_N_KNOBS; k++) {
        const kvq_artifact_knob *kn = &pr->knob[k];
        if (!kn->name || !kn->rows || kn->n_cols < 1)
            continue;
        fprintf(f, "%s profile (chosen row in bold):\n\n|", kn->name);
        for (int c = 0; c < kn->n_cols; c++)
            fprintf(f, " %s |", kn->cols[c]);
        fprintf(f, "\n|");
        for (int c = 0; c < kn->n_cols; c++)
            fprintf(f, "---:|");
        fputc('\n', f);
        const double *v = (const double *)kn->rows->data;
        for (int64_t r = 0; r < kn->n_rows; r++) {
            fputc('|', f);
            for (int c = 0; c < kn->n_cols; c++)
                fprintf(f, r == kn->chosen ? " **%.4g** |" : " %.4g |", v[r * kn->n_cols + c]);
            fputc('\n', f);
        }
        fputc('\n', f);
    }
}

static void card_write(FILE *f, const char *path, const kvq_artifact *art,
                       const kvq_artifact_summary *sum)
{
    const kvq_st *st = kvq_artifact_payload(art);
    char file[256];
    kvq_path_basename(path, file, sizeof file);
    const char *model = meta(st, KVQ_META_MODEL_NAME);
    fprintf(f, "# %s — KV-cache codebooks for %s\n\n", file, model);
    fprintf(f, "`%s` is a kvq artifact (format %u.%u): per layer and KV head, a codebook of "
               "%s centroids (%s group(s); method `%s`) that selects the keys a decode step "
               "attends to (retrieval attention), for the weights below and only for them. "
               "It is shipped next to the model file.\n\n",
            file, kvq_artifact_major(art), kvq_artifact_minor(art), meta(st, KVQ_META_CODEBOOK_SIZE), meta(st, KVQ_META_GROUPS),
            meta(st, KVQ_META_METHOD));
    fprintf(f, "## Weights\n\n| | |\n|---|---|\n");
    fprintf(f, "| model | %s |\n| file | `%s` (%s) |\n", model, meta(st, KVQ_META_MODEL_PATH),
            meta(st, "model.source"));
    fprintf(f, "| weight fingerprint | `%s` |\n", meta(st, KVQ_META_MODEL_FINGERPRINT));
    fprintf(f, "| architecture | %s: %s layers, %s query heads, %s KV heads, head dim %s |\n",
            meta(st, KVQ_META_ARCH), meta(st, KVQ_META_N_LAYERS), meta(st, KVQ_META_N_HEADS),
            meta(st, KVQ_META_N_KV_HEADS), meta(st, KVQ_META_HEAD_DIM));
    fprintf(f, "| RoPE | base %s, pairs %s, scaling %s |\n\n", meta(st, KVQ_META_ROPE_BASE),
            meta(st, KVQ_META_ROPE_LAYOUT), meta(st, KVQ_META_ROPE_SCALING));
    fprintf(f, "The fingerprint hashes the values of the token embedding and of every layer's "
               "attention norm and Q/K projections (docs/format.md \"Weight fingerprint\"). "
               "`kvq inspect MODEL` prints a model's; `kvq run` and `kvq eval` refuse this "
               "artifact for a model whose fingerprint differs (another checkpoint, a "
               "fine-tune, another quantization) unless given `--accept-model-mismatch`.\n\n");
    fprintf(f, "## Calibration\n\n| | |\n|---|---|\n");
    fprintf(f, "| corpus | `%s` (hash %s, corpus seed %s) |\n", meta(st, KVQ_META_CORPUS),
            meta(st, KVQ_META_CORPUS_HASH), meta(st, KVQ_META_CORPUS_SEED));
    fprintf(f, "| tokens | %s in %s sequences of %s |\n", meta(st, KVQ_META_N_TOKENS),
            meta(st, KVQ_META_N_SEQUENCES), meta(st, KVQ_META_SEQ_LEN));
    fprintf(f, "| method | %s, %s centroids x %s group(s), layers %s |\n",
            meta(st, KVQ_META_FIT_METHOD), meta(st, KVQ_META_CODEBOOK_SIZE),
            meta(st, KVQ_META_GROUPS), meta(st, KVQ_META_LAYERS));
    fprintf(f, "| k-means | %s, %s iterations, tol %s, seed %s |\n", meta(st, KVQ_META_KMEANS_INIT),
            meta(st, KVQ_META_KMEANS_ITERS), meta(st, KVQ_META_FIT_TOL), meta(st, KVQ_META_SEED));
    fprintf(f, "| positions | %s (window %s, b %s) |\n", meta(st, KVQ_META_FIT_POSITIONS),
            meta(st, KVQ_META_WROPE_W), meta(st, KVQ_META_WROPE_B));
    fprintf(f, "| made by | %s (%s backend), %s |\n\n", meta(st, KVQ_META_TOOL_VERSION),
            meta(st, KVQ_META_BACKEND), meta(st, KVQ_META_DATE));
    fprintf(f, "## Measured quality\n\n");
    card_fit(f, &sum->fit);
    card_profile(f, &sum->profile);
    fprintf(f, "## Use\n\n```sh\nkvq inspect MODEL            # its fingerprint must be the one above\n"
               "kvq run  --model MODEL --artifact %s --prompt \"...\"\n"
               "kvq eval --model MODEL --artifact %s --corpus TEXT   # perplexity and recall "
               "per budget\n```\n\n",
            file, file);
    fprintf(f, "An inference engine with its own forward pass embeds the runtime through "
               "`kvq/engine.h` (`pkg-config --cflags --libs kvq`): `kvq_engine_open` with the "
               "model's shape and fingerprint, then per sequence `kvq_engine_seq_append` for "
               "prompt rows and `kvq_engine_seq_decode` per layer and token "
               "(docs/runtime.md \"Embedding\").\n");
}

int cmd_card(int argc, char **argv)
{
    const char *path = NULL, *out = NULL;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            card_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (++i >= argc)
                return cli_failf(2, "card: %s needs a value", argv[i - 1]);
            out = argv[i];
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            card_usage(stderr);
            return cli_failf(2, "card: unknown option '%s'", argv[i]);
        } else if (path) {
            return cli_failf(2, "card: one ARTIFACT only ('%s' and '%s')", path, argv[i]);
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        card_usage(stderr);
        return 2;
    }
    int rc = 0;
    if (out && (rc = cli_claim_output(out, (const char *const[]){path}, 1)))
        return rc;
    kvq_err e = {0};
    kvq_artifact *a = NULL;
    if (kvq_artifact_open(path, &a, &e) || kvq_artifact_validate(a, &e)) {
        kvq_artifact_close(a);
        return cli_fail(&e);
    }
    const kvq_st *st = kvq_artifact_payload(a);
    kvq_artifact_summary sum;
    if (kvq_artifact_summary_read(st, &sum, &e)) {
        rc = cli_fail(&e);
    } else if (!out) {
        card_write(stdout, path, a, &sum);
    } else {
        kvq_atomic_file af = {0};
        if (kvq_atomic_open(out, force, &af, &e) != KVQ_OK) {
            rc = cli_fail(&e);
        } else {
            card_write(af.fp, path, a, &sum);
            if (kvq_atomic_commit(&af, &e) != KVQ_OK)
                rc = cli_fail(&e);
        }
    }
    kvq_artifact_summary_free(&sum);
    kvq_artifact_close(a);
    return rc;
}
