/* artifact_summary.c — the fit and profile sections of a .kvq artifact read back as
 * one summary (see kvq/artifact_summary.h; key names: docs/format.md, sections 9
 * and 10). */
#include "kvq/artifact_summary.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/artifact.h"
#include "kvq/util.h"

double kvq_tensor_f64_at(const kvq_tensor_view *t, size_t i)
{
    double v = NAN;
    if (t->dtype == KVQ_DT_F64 && i < t->nbytes / 8) {
        memcpy(&v, (const char *)t->data + i * 8, 8);
    } else if (t->dtype == KVQ_DT_F32 && i < t->nbytes / 4) {
        float f;
        memcpy(&f, (const char *)t->data + i * 4, 4);
        v = f;
    }
    return v;
}

double kvq_st_meta_num(const kvq_st *st, const char *key)
{
    const char *v = kvq_st_meta_get(st, key);
    char *end = NULL;
    double x = v && *v ? strtod(v, &end) : NAN;
    return end && *end == '\0' ? x : NAN;
}

static const char *meta_str(const kvq_st *st, const char *key, const char *dflt)
{
    const char *v = kvq_st_meta_get(st, key);
    return v ? v : dflt;
}

static int64_t meta_i64(const kvq_st *st, const char *key, int64_t dflt)
{
    const char *v = kvq_st_meta_get(st, key);
    int64_t x;
    return v && kvq_parse_i64(v, INT64_MIN, INT64_MAX, &x, NULL) == KVQ_OK ? x : dflt;
}

/* ==========================================================================
 * kvq fit
 * ========================================================================== */

/* The [n_fit_layers, n_kv_heads] grids, and the per-head scalars used without them. */
static const char *const fit_grid[KVQ_FIT_N_FIGURES] = {
    KVQ_DIAG_FIT_SCORE_MSE, KVQ_DIAG_FIT_SCORE_MSE_REF, KVQ_DIAG_FIT_SCORE_POWER};
static const char *const fit_scalar[KVQ_FIT_N_FIGURES] = {"score_mse", "ref.score_mse",
                                                             "score_power"};

/* Code bits per token per KV head: groups x ceil(log2 codebook_size); 0 if unknown. */
static int fit_code_bits(const kvq_st *st)
{
    const double k = kvq_st_meta_num(st, KVQ_META_CODEBOOK_SIZE);
    const double g = kvq_st_meta_num(st, KVQ_META_GROUPS);
    if (!(k >= 2 && k <= 65536 && g >= 1 && g <= 65536))
        return 0;
    int bits = 0;
    while ((double)(1 << bits) < k)
        bits++;
    return bits * (int)g;
}

/* The per-(fit layer, head) figures: the grid when it has the right shape, else the
 * per-head scalars. */
static void fit_heads(const kvq_st *st, kvq_artifact_fit *f, size_t n_fit)
{
    const size_t n_kv = (size_t)f->n_kv;
    for (int k = 0; k < KVQ_FIT_N_FIGURES; k++) {
        const kvq_tensor_view *g = kvq_st_find(st, fit_grid[k]);
        const int grid = g && g->ndim == 2 && g->shape[0] == (int64_t)n_fit &&
                         g->shape[1] == f->n_kv;
        for (size_t i = 0; i < n_fit; i++)
            for (size_t h = 0; h < n_kv; h++) {
                double x = NAN;
                if (grid) {
                    x = kvq_tensor_f64_at(g, i * n_kv + h);
                } else {
                    char name[128];
                    snprintf(name, sizeof name, KVQ_TENSOR_DIAG_HEAD, f->layers[i], (int)h, fit_scalar[k]);
                    const kvq_tensor_view *t = kvq_st_find(st, name);
                    if (t && t->ndim == 0)
                        x = kvq_tensor_f64_at(t, 0);
                }
                f->head[k][i * n_kv + h] = x;
            }
    }
}

/* The table is left empty (n_fit 0) when the model keys or `layers` do not parse. */
static kvq_status fit_read(const kvq_st *st, kvq_artifact_fit *f, kvq_err *err)
{
    kvq_err e = {0};
    for (int k = 0; k < KVQ_FIT_N_FIGURES; k++) {
        const char *v = kvq_st_meta_get(st, fit_grid[k]);
        double x;
        f->mean[k] = v && kvq_parse_f64(v, -INFINITY, INFINITY, &x, NULL) == KVQ_OK ? x : NAN;
    }
    f->codebook_size = meta_i64(st, KVQ_META_CODEBOOK_SIZE, -1);
    f->groups = meta_i64(st, KVQ_META_GROUPS, -1);
    f->method = kvq_st_meta_get(st, KVQ_META_FIT_METHOD);
    if (!f->method)
        return KVQ_OK;
    f->reference = meta_str(st, KVQ_META_FIT_REFERENCE, "none");
    f->bits_per_token = fit_code_bits(st);
    if (kvq_parse_i64(meta_str(st, KVQ_META_N_LAYERS, ""), 1, 1 << 20, &f->n_layers, &e) ||
        kvq_parse_i64(meta_str(st, KVQ_META_N_KV_HEADS, ""), 1, 1 << 20, &f->n_kv, &e)) {
        f->n_layers = f->n_kv = 0;
        return KVQ_OK;
    }
    const char *layers = kvq_st_meta_get(st, KVQ_META_LAYERS);
    size_t n_fit = 0;
    if (layers) {
        if (kvq_parse_index_list(layers, f->n_layers, &f->layers, &n_fit, &e))
            return KVQ_OK;
    } else {
        n_fit = (size_t)f->n_layers;
        if (!(f->layers = malloc(n_fit * sizeof *f->layers)))
            return kvq_err_set(err, KVQ_E_NOMEM, "artifact summary: out of memory");
        for (size_t i = 0; i < n_fit; i++)
            f->layers[i] = (int32_t)i;
    }
    for (int k = 0; k < KVQ_FIT_N_FIGURES; k++)
        if (!(f->head[k] = malloc(n_fit * (size_t)f->n_kv * sizeof *f->head[k])))
            return kvq_err_set(err, KVQ_E_NOMEM, "artifact summary: out of memory");
    fit_heads(st, f, n_fit);
    f->n_fit = n_fit;
    return KVQ_OK;
}

/* Mean of the finite values of x[0..n); NaN when there is none. */
static double mean_finite(const double *x, size_t n)
{
    double s = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i])) {
            s += x[i];
            k++;
        }
    return k ? s / (double)k : NAN;
}

double kvq_artifact_fit_mean(const kvq_artifact_fit *f, kvq_fit_figure q, int64_t i)
{
    const size_t n_kv = (size_t)f->n_kv;
    if (i < 0)
        return f->head[q] ? mean_finite(f->head[q], f->n_fit * n_kv) : NAN;
    if ((size_t)i >= f->n_fit)
        return NAN;
    return mean_finite(f->head[q] + (size_t)i * n_kv, n_kv);
}

/* ==========================================================================
 * kvq profile
 * ========================================================================== */

static const char *const knob_name[KVQ_SUMMARY_N_KNOBS] = {"leankv", "pats", "budget", "mass"};
/* The chosen setting of each knob, as the method keys profile writes. */
static const char *const knob_setting[KVQ_SUMMARY_N_KNOBS][KVQ_KNOB_MAX_SETTINGS + 1] = {
    {KVQ_META_LEANKV_ALPHA_H, KVQ_META_LEANKV_ALPHA_L, KVQ_META_LEANKV_WINDOW, KVQ_META_LEANKV_BITS, NULL},
    {KVQ_META_PATS_SCHEDULE, KVQ_META_PATS_B_MIN, KVQ_META_PATS_B_MAX, KVQ_META_PATS_DTYPE, NULL},
    {KVQ_META_BUDGET_FRACTION, KVQ_META_BUDGET_SELECTOR, KVQ_META_BUDGET_SINK, KVQ_META_BUDGET_POSITIONS, NULL},
    {KVQ_META_MASS_TAU, NULL},
};

static void knob_read(const kvq_st *st, int k, kvq_artifact_knob *t)
{
    char key[128];
    t->name = knob_name[k];
    t->chosen = -1;
    for (int s = 0; knob_setting[k][s]; s++) {
        t->setting_key[s] = knob_setting[k][s];
        t->setting[s] = kvq_st_meta_get(st, knob_setting[k][s]);
        t->setting_num[s] = kvq_st_meta_num(st, knob_setting[k][s]);
        t->n_settings = s + 1;
    }
    snprintf(key, sizeof key, KVQ_META_PROFILE_SKIPPED, t->name);
    t->skipped = kvq_st_meta_get(st, key);
    snprintf(key, sizeof key, KVQ_META_THR_MET, t->name);
    const double met = kvq_st_meta_num(st, key);
    t->met = met == 1 ? 1 : met == 0 ? 0 : -1;
    snprintf(key, sizeof key, KVQ_META_PROFILE_COLUMNS, t->name);
    snprintf(t->col_buf, sizeof t->col_buf, "%s", meta_str(st, key, ""));
    char *save = NULL;
    for (char *c = strtok_r(t->col_buf, ",", &save); c && t->n_cols < KVQ_KNOB_MAX_COLS;
         c = strtok_r(NULL, ",", &save))
        t->cols[t->n_cols++] = c;
    /* profile writes the chosen row's finite values as diag.profile.NAME.COLUMN (%.17g,
     * exact) */
    for (int c = 0; c < t->n_cols; c++) {
        snprintf(key, sizeof key, KVQ_META_DIAG_PROFILE, t->name, t->cols[c]);
        t->chosen_value[c] = kvq_st_meta_num(st, key);
    }
    snprintf(key, sizeof key, KVQ_TENSOR_PROFILE, t->name);
    const kvq_tensor_view *v = kvq_st_find(st, key);
    if (!v || v->dtype != KVQ_DT_F64 || v->ndim != 2 || t->n_cols == 0 ||
        v->shape[1] != t->n_cols)
        return;
    t->rows = v;
    t->n_rows = v->shape[0];
    /* the first row that agrees on every column is the chosen one */
    for (int64_t r = 0; r < t->n_rows && t->chosen < 0; r++) {
        int same = 1;
        for (int c = 0; c < t->n_cols && same; c++) {
            const double m = t->chosen_value[c];
            const double x = kvq_tensor_f64_at(v, (size_t)r * t->n_cols + c);
            same = isnan(x) ? isnan(m) : m == x;
        }
        if (same)
            t->chosen = r;
    }
}

static void profile_read(const kvq_st *st, kvq_artifact_profile *p)
{
    p->metric = kvq_st_meta_get(st, KVQ_META_THR_METRIC);
    p->present = p->metric != NULL;
    p->tolerance = kvq_st_meta_num(st, KVQ_META_THR_TOLERANCE);
    p->prompt_fraction = kvq_st_meta_num(st, KVQ_META_THR_PROMPT_FRACTION);
    p->ppl_full = kvq_st_meta_num(st, KVQ_META_DIAG_PPL_FULL);
    for (int k = 0; k < KVQ_SUMMARY_N_KNOBS; k++)
        knob_read(st, k, &p->knob[k]);
}

/* ==========================================================================
 * The summary
 * ========================================================================== */

kvq_status kvq_artifact_summary_read(const kvq_st *st, kvq_artifact_summary *out, kvq_err *err)
{
    memset(out, 0, sizeof *out);
    profile_read(st, &out->profile);
    return fit_read(st, &out->fit, err);
}

void kvq_artifact_summary_free(kvq_artifact_summary *s)
{
    if (!s)
        return;
    free(s->fit.layers);
    for (int k = 0; k < KVQ_FIT_N_FIGURES; k++)
        free(s->fit.head[k]);
    memset(s, 0, sizeof *s);
}
