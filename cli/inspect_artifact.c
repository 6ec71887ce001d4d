/* inspect_artifact.c — `kvq inspect` of a .kvq artifact: header and conformance, the
 * summary of what `kvq fit` and `kvq profile` recorded (kvq_artifact_summary,
 * docs/format.md sections 9 and 10), the metadata by group, and the payload's tensors.
 *
 * One description: kvq_describe builds the JSON document; --json prints it and the
 * text report is rendered from it (kvq_text). Everything in the summary is optional
 * in an artifact: a piece that is missing or malformed shows as "-" (null in JSON),
 * never as an error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/inspect.h"
#include "kvq/artifact_summary.h"
#include "kvq/runtime.h"

/* ==========================================================================
 * metadata groups
 * ========================================================================== */

static int is_model_key(const char *k) { return kvq_has_prefix(k, KVQ_META_MODEL_PREFIX); }
static int is_provenance_key(const char *k) { return kvq_has_prefix(k, KVQ_META_PREFIX_PROVENANCE); }

static int is_method_key(const char *k)
{
    static const char *const keys[] = {KVQ_META_METHOD, KVQ_META_CODEBOOK_SIZE, KVQ_META_GROUPS,
                                       KVQ_META_WROPE_W, KVQ_META_WROPE_B, KVQ_META_SEED,
                                       KVQ_META_LAYERS};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(k, keys[i]))
            return 1;
    return kvq_has_prefix(k, KVQ_META_PREFIX_KMEANS) || kvq_has_prefix(k, KVQ_META_PREFIX_LEANKV) ||
           kvq_has_prefix(k, KVQ_META_PREFIX_PATS);
}

static int is_other_key(const char *k)
{
    return !is_model_key(k) && !is_provenance_key(k) && !is_method_key(k);
}

/* ==========================================================================
 * the description (JSON)
 * ========================================================================== */

static const char *const fit_figure[KVQ_FIT_N_FIGURES] = {"score_mse", "score_mse_ref",
                                                          "score_power"};

/* The figures of fit layer i (i = -1: over every layer) and their ratio, into o. */
static void fit_figures_json(cJSON *o, const kvq_artifact_fit *f, int64_t i)
{
    for (int k = 0; k < KVQ_FIT_N_FIGURES; k++)
        cJSON_AddItemToObject(o, fit_figure[k],
                              json_num_or_null(kvq_artifact_fit_mean(f, (kvq_fit_figure)k, i)));
    cJSON_AddItemToObject(o, "ratio",
                          json_num_or_null(kvq_artifact_fit_mean(f, KVQ_FIT_SCORE_MSE, i) /
                                           kvq_artifact_fit_mean(f, KVQ_FIT_SCORE_MSE_REF, i)));
}

static cJSON *fit_json(const kvq_st *st, const kvq_artifact_fit *f)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, KVQ_META_METHOD, f->method);
    cJSON_AddItemToObject(o, "artifact_method", json_str_or_null(kvq_st_meta_get(st,
                                                                                KVQ_META_METHOD)));
    cJSON_AddStringToObject(o, "reference", f->reference);
    cJSON_AddItemToObject(o, KVQ_META_CODEBOOK_SIZE, json_num_or_null(kvq_st_meta_num(st,
                                                                         KVQ_META_CODEBOOK_SIZE)));
    cJSON_AddItemToObject(o, KVQ_META_GROUPS, json_num_or_null(kvq_st_meta_num(st, KVQ_META_GROUPS)));
    cJSON_AddItemToObject(o, "bits_per_token", f->bits_per_token
                                                   ? cJSON_CreateNumber(f->bits_per_token)
                                                   : cJSON_CreateNull());
    /* a u64: as a number when a double holds it exactly, else the decimal string */
    const char *seed = kvq_st_meta_get(st, KVQ_META_SEED);
    int64_t s64;
    kvq_err e = {0};
    cJSON_AddItemToObject(o, KVQ_META_SEED, !seed ? cJSON_CreateNull()
                                     : kvq_parse_i64(seed, 0, (int64_t)1 << 53, &s64, &e) == KVQ_OK
                                         ? json_i64(s64) : cJSON_CreateString(seed));
    cJSON *kl = cJSON_AddArrayToObject(o, KVQ_META_LAYERS);
    for (size_t i = 0; i < f->n_fit; i++)
        cJSON_AddItemToArray(kl, cJSON_CreateNumber(f->layers[i]));
    cJSON_AddItemToObject(o, "n_kv_heads", f->n_kv ? json_i64(f->n_kv) : cJSON_CreateNull());
    cJSON *km = cJSON_AddObjectToObject(o, "kmeans");
    cJSON_AddItemToObject(km, "init", json_str_or_null(kvq_st_meta_get(st, KVQ_META_KMEANS_INIT)));
    cJSON_AddItemToObject(km, "iters", json_num_or_null(kvq_st_meta_num(st, KVQ_META_KMEANS_ITERS)));
    cJSON_AddItemToObject(km, "sample", json_num_or_null(kvq_st_meta_num(st, KVQ_META_KMEANS_SAMPLE)));
    cJSON_AddItemToObject(km, "tol", json_num_or_null(kvq_st_meta_num(st, KVQ_META_FIT_TOL)));
    cJSON_AddItemToObject(o, "holdout", json_num_or_null(kvq_st_meta_num(st, KVQ_META_FIT_HOLDOUT)));
    cJSON_AddItemToObject(o, "positions", json_str_or_null(kvq_st_meta_get(st,
                                                                           KVQ_META_FIT_POSITIONS)));
    cJSON_AddItemToObject(o, "n_train", json_num_or_null(kvq_st_meta_num(st, KVQ_META_FIT_N_TRAIN)));
    cJSON_AddItemToObject(o, "n_heldout_keys",
                          json_num_or_null(kvq_st_meta_num(st, KVQ_META_FIT_N_HELDOUT_KEYS)));
    /* over every (layer, head); NaN (null) without a table */
    fit_figures_json(o, f, -1);
    cJSON *pl = cJSON_AddArrayToObject(o, "per_layer");
    const size_t n_kv = (size_t)f->n_kv;
    for (size_t i = 0; i < f->n_fit; i++) {
        cJSON *r = cJSON_CreateObject(), *heads = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "layer", f->layers[i]);
        fit_figures_json(r, f, (int64_t)i);
        for (int k = 0; k < KVQ_FIT_N_FIGURES; k++) {
            cJSON *a = cJSON_AddArrayToObject(heads, fit_figure[k]);
            for (size_t h = 0; h < n_kv; h++)
                cJSON_AddItemToArray(a, json_num_or_null(f->head[k][i * n_kv + h]));
        }
        /* the order of the JSON keys: the figures, then ratio, then heads */
        cJSON_AddItemToObject(r, "heads", heads);
        cJSON_AddItemToArray(pl, r);
    }
    return o;
}

static cJSON *knob_json(const kvq_artifact_knob *t)
{
    cJSON *ko = cJSON_CreateObject();
    if (t->skipped) {
        cJSON_AddStringToObject(ko, "skipped", t->skipped);
        return ko;
    }
    /* the chosen setting: numbers as numbers, names as strings */
    for (int s = 0; s < t->n_settings; s++) {
        const char *field = strchr(t->setting_key[s], '.') + 1;
        cJSON_AddItemToObject(ko, field, !t->setting[s] ? cJSON_CreateNull()
                                         : isfinite(t->setting_num[s])
                                             ? cJSON_CreateNumber(t->setting_num[s])
                                             : cJSON_CreateString(t->setting[s]));
    }
    cJSON_AddItemToObject(ko, "met", t->met < 0 ? cJSON_CreateNull() : cJSON_CreateBool(t->met));
    cJSON_AddItemToObject(ko, "chosen", t->chosen < 0 ? cJSON_CreateNull() : json_i64(t->chosen));
    cJSON *cols = cJSON_AddArrayToObject(ko, "columns");
    for (int c = 0; c < t->n_cols; c++)
        cJSON_AddItemToArray(cols, cJSON_CreateString(t->cols[c]));
    cJSON *rows = cJSON_AddArrayToObject(ko, "rows");
    for (int64_t r = 0; r < t->n_rows; r++) {
        cJSON *row = cJSON_CreateArray();
        for (int c = 0; c < t->n_cols; c++) {
            const double x = kvq_tensor_f64_at(t->rows, (size_t)r * t->n_cols + c);
            cJSON_AddItemToArray(row, json_num_or_null(x));
        }
        cJSON_AddItemToArray(rows, row);
    }
    return ko;
}

static cJSON *profile_json(const kvq_artifact_profile *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "metric", json_str_or_null(p->metric));
    cJSON_AddItemToObject(o, "tolerance", json_num_or_null(p->tolerance));
    cJSON_AddItemToObject(o, "prompt_fraction", json_num_or_null(p->prompt_fraction));
    cJSON_AddItemToObject(o, "ppl_full", json_num_or_null(p->ppl_full));
    for (int k = 0; k < KVQ_SUMMARY_N_KNOBS; k++) {
        const kvq_artifact_knob *t = &p->knob[k];
        if (t->skipped || t->rows)
            cJSON_AddItemToObject(o, t->name, knob_json(t));
    }
    return o;
}

static cJSON *kvq_describe(const char *path, uint64_t file_size, const kvq_artifact *a,
                           const kvq_artifact_summary *sum, const kvq_err *problem)
{
    const kvq_st *st = kvq_artifact_payload(a);
    cJSON *doc = json_header(path, "kvq", file_size);
    char ver[32];
    snprintf(ver, sizeof ver, "%u.%u", kvq_artifact_major(a), kvq_artifact_minor(a));
    cJSON_AddStringToObject(doc, "version", ver);
    cJSON_AddNumberToObject(doc, "major", kvq_artifact_major(a));
    cJSON_AddNumberToObject(doc, "minor", kvq_artifact_minor(a));
    cJSON_AddItemToObject(doc, "payload_size", json_u64(kvq_artifact_payload_size(a)));
    cJSON_AddBoolToObject(doc, "valid", problem == NULL);
    if (problem)
        cJSON_AddStringToObject(doc, "problem", problem->msg);
    cJSON_AddItemToObject(doc, "model", st_meta_json(st, KVQ_META_MODEL_PREFIX, is_model_key));
    cJSON_AddItemToObject(doc, KVQ_META_METHOD, st_meta_json(st, NULL, is_method_key));
    cJSON_AddItemToObject(doc, "provenance", st_meta_json(st, KVQ_META_PREFIX_PROVENANCE, is_provenance_key));
    if (sum->fit.method)
        cJSON_AddItemToObject(doc, "fit", fit_json(st, &sum->fit));
    if (sum->profile.present)
        cJSON_AddItemToObject(doc, "thresholds", profile_json(&sum->profile));
    cJSON_AddItemToObject(doc, "metadata", st_meta_json(st, NULL, NULL));
    cJSON_AddItemToObject(doc, "tensors", st_tensors_json(st));
    return doc;
}

/* ==========================================================================
 * the text, rendered from the description
 * ========================================================================== */

/* x in a 12-wide cell with printf format fmt, or "-" when it is not finite. */
static void put_cell(const char *fmt, double x)
{
    if (isfinite(x))
        printf(fmt, x);
    else
        printf(" %12s", "-");
}

/* The fit section; md: the artifact's metadata (all keys, as written). */
static void fit_text(const cJSON *fo, const cJSON *md)
{
    const char *na = "-";
    const int bits = (int)jnum_or(fo, "bits_per_token", 0);
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(fo, "per_layer");
    const int n_fit = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(fo, KVQ_META_LAYERS));
    const double n_kv = jnum_or(fo, "n_kv_heads", 0);
    const char *method = jstr(fo, KVQ_META_METHOD, na), *reference = jstr(fo, "reference", na);
    printf("\nfit:\n");
    printf("  method      %s (artifact method %s), reference %s\n", method,
           jstr(md, KVQ_META_METHOD, na), reference);
    printf("  codebooks   %s centroids x %s group(s)", jstr(md, KVQ_META_CODEBOOK_SIZE, na),
           jstr(md, KVQ_META_GROUPS, na));
    if (bits)
        printf(": %d bits per token per KV head", bits);
    printf("\n  seed        %s\n", jstr(md, KVQ_META_SEED, na));
    printf("  layers      %s", jstr(md, KVQ_META_LAYERS, "all"));
    if (n_kv)
        printf(" (%d of %lld), %lld KV heads each", n_fit,
               (long long)jmeta_num(md, KVQ_META_N_LAYERS), (long long)n_kv);
    /* the layers without a codebook because they slide beside global ones (archs-rt) */
    const double sw = jmeta_num(md, "model.attention.sliding_window");
    if (isfinite(sw) && sw > 0) {
        const double sf = jmeta_num(md, "model.attention.sliding_from"),
                     sp = jmeta_num(md, "model.attention.sliding_period");
        const kvq_model_config lc = {.n_layers = (int32_t)jmeta_num(md, KVQ_META_N_LAYERS),
                                     .sliding_window = (int32_t)sw,
                                     .sliding_from = isfinite(sf) ? (int32_t)sf : 0,
                                     .sliding_period = isfinite(sp) ? (int32_t)sp : 0};
        char note[256];
        if (kvq_retrieval_layers_note(&lc, note, sizeof note))
            printf("\n  local       %s (no codebook)", note);
    }
    printf("\n  k-means     %s, at most %s iterations, tol %g, sample %s x K\n",
           jstr(md, KVQ_META_KMEANS_INIT, na), jstr(md, KVQ_META_KMEANS_ITERS, na), jmeta_num(md, KVQ_META_FIT_TOL),
           jstr(md, KVQ_META_KMEANS_SAMPLE, na));
    printf("  keys        %s training, %s held out per head (holdout %g of the sequences)\n",
           jstr(md, KVQ_META_FIT_N_TRAIN, na), jstr(md, KVQ_META_FIT_N_HELDOUT_KEYS, na),
           jmeta_num(md, KVQ_META_FIT_HOLDOUT));
    printf("  positions   %s (w %s, b %s)\n", jstr(md, KVQ_META_FIT_POSITIONS, na),
           jstr(md, KVQ_META_WROPE_W, na), jstr(md, KVQ_META_WROPE_B, na));
    if (cJSON_GetArraySize(pl) == 0)
        return;
    char ratio[64];
    snprintf(ratio, sizeof ratio, "%s/%s", method, reference);
    printf("\nheld-out attention-score MSE per layer (mean over %lld KV heads; power = "
           "E[score^2]):\n", (long long)n_kv);
    printf("  %5s %12.12s %12.12s %12.12s %12s\n", "layer", method, reference, ratio, "power");
    /* rows: each fit layer, then "all" over every (layer, head) */
    const cJSON *row = pl->child;
    for (int i = 0; i <= n_fit; i++, row = row ? row->next : NULL) {
        const cJSON *r = i < n_fit ? row : fo;
        if (i < n_fit)
            printf("  %5d", (int)jnum_or(r, "layer", 0));
        else
            printf("  %5s", "all");
        put_cell(" %12.4g", jnum_or(r, "score_mse", NAN));
        put_cell(" %12.4g", jnum_or(r, "score_mse_ref", NAN));
        put_cell(" %12.4f", jnum_or(r, "ratio", NAN));
        put_cell(" %12.4g", jnum_or(r, "score_power", NAN));
        putchar('\n');
    }
}

static const char *const knob_name[KVQ_SUMMARY_N_KNOBS] = {"leankv", "pats", "budget", "mass"};
static const char *const knob_note[KVQ_SUMMARY_N_KNOBS] = {
    "memory: of the f16 cache; high/low/pruned: token shares",
    "memory: packed, of the cache; bits: unpacked, of 16",
    "attended: of the visible tokens; mass: attention mass kept",
    "attended: of the visible tokens; mass: attention mass kept",
};

static const char *met_text(const cJSON *met)
{
    return cJSON_IsTrue(met) ? "within tolerance"
           : cJSON_IsFalse(met) ? "NOT within tolerance (the best found)"
                                : "tolerance not recorded";
}

/* The chosen setting of knob k in words, from the keys profile writes. */
static void knob_setting_text(const cJSON *md, int k)
{
    const char *na = "-";
    switch (k) {
    case KVQ_SUMMARY_LEANKV:
        printf("alpha_h %g, alpha_l %g (window %s, %s)", jmeta_num(md, KVQ_META_LEANKV_ALPHA_H),
               jmeta_num(md, KVQ_META_LEANKV_ALPHA_L), jstr(md, KVQ_META_LEANKV_WINDOW, na),
               jstr(md, KVQ_META_LEANKV_BITS, na));
        break;
    case KVQ_SUMMARY_PATS:
        printf("schedule %s, b_min %s, b_max %s (%s cache)", jstr(md, KVQ_META_PATS_SCHEDULE, na),
               jstr(md, KVQ_META_PATS_B_MIN, na), jstr(md, KVQ_META_PATS_B_MAX, na), jstr(md, KVQ_META_PATS_DTYPE, na));
        break;
    case KVQ_SUMMARY_BUDGET:
        printf("fraction %g (%s selector, sink %s, positions %s)",
               jmeta_num(md, KVQ_META_BUDGET_FRACTION), jstr(md, KVQ_META_BUDGET_SELECTOR, na),
               jstr(md, KVQ_META_BUDGET_SINK, na), jstr(md, KVQ_META_BUDGET_POSITIONS, na));
        break;
    default:
        printf("tau %g", jmeta_num(md, KVQ_META_MASS_TAU));
        break;
    }
}

/* One knob's table (* = the chosen row). */
static void knob_table_text(int k, const cJSON *ko)
{
    const cJSON *cols = cJSON_GetObjectItemCaseSensitive(ko, "columns");
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(ko, "rows");
    const double chosen = jnum_or(ko, "chosen", -1);
    printf("\n%s profile (* = chosen; %s):\n  ", knob_name[k], knob_note[k]);
    for (const cJSON *c = cols ? cols->child : NULL; c; c = c->next)
        printf(" %12.12s", c->valuestring);
    putchar('\n');
    int r = 0;
    for (const cJSON *row = rows ? rows->child : NULL; row; row = row->next, r++) {
        printf("%s ", r == chosen ? "*" : " ");
        const cJSON *c = cols ? cols->child : NULL;
        for (const cJSON *x = row->child; x && c; x = x->next, c = c->next) {
            const double v = jvalue(x);
            if (isnan(v))
                printf(" %12s", "-");
            else if (!strcmp(c->valuestring, "schedule"))
                printf(" %12s", kvq_pats_schedule_name((kvq_pats_schedule)(int)v));
            else
                printf(" %12.5g", v);
        }
        putchar('\n');
    }
}

static void profile_text(const cJSON *po, const cJSON *md)
{
    printf("\nthresholds (metric %s, tolerance %g, prompt fraction %g):\n",
           jstr(md, KVQ_META_THR_METRIC, "-"), jmeta_num(md, KVQ_META_THR_TOLERANCE),
           jmeta_num(md, KVQ_META_THR_PROMPT_FRACTION));
    const double ppl = jmeta_num(md, KVQ_META_DIAG_PPL_FULL);
    if (isfinite(ppl))
        printf("  %-7s %.4f (perplexity with full attention)\n", "ppl", ppl);
    for (int k = 0; k < KVQ_SUMMARY_N_KNOBS; k++) {
        const cJSON *ko = cJSON_GetObjectItemCaseSensitive(po, knob_name[k]);
        const char *skipped = jstr(ko, "skipped", NULL);
        if (!ko) {
            continue;
        } else if (skipped) {
            printf("  %-7s skipped: %s\n", knob_name[k], skipped);
        } else if (jnum_or(ko, "chosen", -1) >= 0) {
            printf("  %-7s ", knob_name[k]);
            knob_setting_text(md, k);
            printf(": %s\n", met_text(cJSON_GetObjectItemCaseSensitive(ko, "met")));
        } else {
            printf("  %-7s no setting chosen\n", knob_name[k]);
        }
    }
    for (int k = 0; k < KVQ_SUMMARY_N_KNOBS; k++) {
        const cJSON *ko = cJSON_GetObjectItemCaseSensitive(po, knob_name[k]);
        if (ko && !jstr(ko, "skipped", NULL))
            knob_table_text(k, ko);
    }
}

static void kvq_text(const cJSON *doc, uint64_t data_size)
{
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(doc, "metadata");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(doc, "tensors");
    const uint64_t file_size = ju64(doc, "file_size"), payload = ju64(doc, "payload_size");
    printf("%s: kvq artifact version %d.%d, %llu bytes\n", jstr(doc, "path", "?"),
           (int)jnum_or(doc, "major", 0), (int)jnum_or(doc, "minor", 0),
           (unsigned long long)file_size);
    printf("  payload %llu bytes (safetensors, compressed %.2fx), %d tensors, "
           "%d metadata keys\n", (unsigned long long)payload,
           file_size ? (double)payload / (double)file_size : 0.0, cJSON_GetArraySize(ts),
           cJSON_GetArraySize(md));
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "valid")))
        printf("  conforms to format %d.%d\n", KVQ_ARTIFACT_MAJOR, KVQ_ARTIFACT_MINOR);
    else
        printf("  does not conform to format %d.%d: %s\n", KVQ_ARTIFACT_MAJOR,
               KVQ_ARTIFACT_MINOR, jstr(doc, "problem", ""));
    const cJSON *fo = cJSON_GetObjectItemCaseSensitive(doc, "fit");
    const cJSON *po = cJSON_GetObjectItemCaseSensitive(doc, "thresholds");
    if (fo)
        fit_text(fo, md);
    if (po)
        profile_text(po, md);
    meta_text(md, "model", is_model_key);
    meta_text(md, KVQ_META_METHOD, is_method_key);
    meta_text(md, "provenance", is_provenance_key);
    meta_text(md, "other metadata", is_other_key);
    tensors_text(ts, data_size);
}

int inspect_kvq(const char *path, uint64_t file_size, int json)
{
    kvq_err e = {0}, ve = {0};
    kvq_artifact *a = NULL;
    kvq_artifact_summary sum;
    if (kvq_artifact_open(path, &a, &e) != KVQ_OK)
        return cli_fail(&e);
    const kvq_st *st = kvq_artifact_payload(a);
    const int valid = kvq_artifact_validate(a, &ve) == KVQ_OK;
    const size_t np = strlen(path); /* the problem without the path that starts it */
    if (!valid && !strncmp(ve.msg, path, np) && !strncmp(ve.msg + np, ": ", 2))
        memmove(ve.msg, ve.msg + np + 2, strlen(ve.msg + np + 2) + 1);
    int rc = 0;
    if (kvq_artifact_summary_read(st, &sum, &e) != KVQ_OK) {
        rc = cli_fail(&e);
    } else {
        cJSON *doc = kvq_describe(path, file_size, a, &sum, valid ? NULL : &ve);
        if (json) {
            rc = json_emit(path, doc); /* frees doc */
        } else if (!doc) {
            rc = cli_failf(1, "%s: out of memory describing the artifact", path);
        } else {
            kvq_text(doc, kvq_st_data_size(st));
            cJSON_Delete(doc);
        }
        /* the rule kvq run and eval open an artifact by (kvq_artifact_validate): an
         * artifact they refuse is reported, and inspect fails too */
        if (!rc && !valid) {
            fflush(stdout);
            rc = cli_failf(1, "%s: does not conform to format %d.%d: %s", path,
                           KVQ_ARTIFACT_MAJOR, KVQ_ARTIFACT_MINOR, ve.msg);
        }
    }
    kvq_artifact_summary_free(&sum);
    kvq_artifact_close(a);
    return rc;
}
