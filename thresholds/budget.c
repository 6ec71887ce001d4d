/*
 * budget.c — retrieval budget profiles: the artifact's codebook selector at budget
 * fractions, and hcattention's mass rule at values of tau, measured with the runtime
 * (kvq/runtime.h) on the capture's rows. Every row of a sequence is attended by
 * retrieval (prefill_full = 0) with the runtime's `measure` statistics; the figures of
 * the continuation rows (P .. N-1, as in kvq/thresholds.h "Quality") are kept.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thresholds/thresholds_internal.h"

static const double default_budgets[] = {0.01, 0.02, 0.03, 0.05, 0.08, 0.10, 0.15, 0.20, 0.25};
static const double default_taus[] = {0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99};

/* One setting: its context and the sums of its continuation steps. */
typedef struct bsetting {
    kvq_retrieval_params rp;
    kvq_retrieval *r;
    double measured, err, visible, attended, mass;
} bsetting;

static void stats_diff(bsetting *b, const kvq_retrieval_stats *a, const kvq_retrieval_stats *z)
{
    b->measured += (double)(z->measured - a->measured);
    b->err += z->out_rel_err - a->out_rel_err;
    b->visible += z->visible - a->visible;
    b->attended += z->attended - a->attended;
    b->mass += z->recall_mass - a->recall_mass;
}

/* Runs one sequence of one layer through every setting, the settings in parallel
 * (each context runs single-threaded, so its sums do not depend on the thread count). */
static kvq_status run_sequence(bsetting *set, int64_t n_set, int32_t threads, int32_t layer,
                               int64_t n, int64_t P, const float *q, const float *k,
                               const float *v, const int64_t *pos, int32_t nh, int32_t nkv,
                               int32_t d, float *out, kvq_status *st, kvq_err *errs, kvq_err *err)
{
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t c = 0; c < n_set; c++) {
        float *o = out + (size_t)c * n * nh * d;
        kvq_retrieval_reset(set[c].r);
        kvq_attn_backend b = kvq_retrieval_backend(set[c].r);
        kvq_retrieval_stats before, after;
        kvq_status s = KVQ_OK;
        if (P > 0) {
            const kvq_attn_call call = {.layer = layer, .n = (int32_t)P, .pos = pos, .q = q,
                                        .k = k, .v = v, .out = o};
            s = b.attend(b.user, &call, &errs[c]);
        }
        if (!s) {
            kvq_retrieval_stats_get(set[c].r, &before);
            const size_t qo = (size_t)P * nh * d, ko = (size_t)P * nkv * d;
            const kvq_attn_call call = {.layer = layer, .n = (int32_t)(n - P), .pos = pos + P,
                                        .q = q + qo, .k = k + ko, .v = v + ko, .out = o + qo};
            s = b.attend(b.user, &call, &errs[c]);
        }
        if (!s) {
            kvq_retrieval_stats_get(set[c].r, &after);
            stats_diff(&set[c], &before, &after);
        }
        st[c] = s;
    }
    for (int64_t c = 0; c < n_set; c++)
        if (st[c]) {
            if (err)
                *err = errs[c];
            return st[c];
        }
    return KVQ_OK;
}

static void fill_row(double *row, double value, const bsetting *b)
{
    row[KVQ_PB_VALUE] = value;
    row[KVQ_PB_ATTENDED] = b->visible > 0 ? b->attended / b->visible : NAN;
    row[KVQ_PB_MASS] = b->measured > 0 ? b->mass / b->measured : NAN;
    row[KVQ_PB_ERR] = b->measured > 0 ? b->err / b->measured : NAN;
}

/* One retrieval context per setting: the codebook selector at each budget fraction
 * fr [n_b], then the mass rule at each tau [n_set - n_b]; measured, single-threaded. */
static kvq_status create_settings(bsetting *set, int64_t n_set, int64_t n_b, const double *fr,
                                  const double *tau, const kvq_profile_params *p,
                                  const kvq_model_config *cfg, const kvq_codebook_set *rt,
                                  kvq_err *err)
{
    kvq_status s = KVQ_OK;
    for (int64_t c = 0; c < n_set && !s; c++) {
        kvq_retrieval_params rp = p->retrieval;
        rp.prefill_full = 0;
        rp.measure = 1;
        rp.threads = 1;
        rp.cb = p->cb;
        if (c < n_b) {
            rp.selector = KVQ_SELECT_CODEBOOK;
            rp.budget.count = 0;
            rp.budget.fraction = fr[c];
        } else {
            rp.selector = KVQ_SELECT_MASS;
            rp.budget.count = 0;
            rp.budget.fraction = 1.0;
            rp.tau = tau[c - n_b];
        }
        set[c].rp = rp;
        s = kvq_retrieval_create(cfg, rt, &rp, &set[c].r, err);
    }
    return s;
}

/* Buffers of one sequence (longest rows) and of every setting's outputs on it. */
typedef struct seq_bufs {
    float *q, *k, *v;  /* [longest, nh, d], [longest, nkv, d] x 2 */
    float *out;        /* [n_set, longest, nh, d] */
    int64_t *pos;      /* [longest] */
    kvq_status *st;    /* [n_set] */
    kvq_err *errs;     /* [n_set] */
} seq_bufs;

/* Every sequence of every captured layer that has codebooks, through every setting;
 * *n_layers_done counts the layers run. */
static kvq_status run_layers(const kvq_capture_info *ci, const kvq_codebook_set *rt, bsetting *set,
                             int64_t n_set, const kvq_profile_params *p, const seq_bufs *b,
                             int32_t *n_layers_done, kvq_err *err)
{
    const int32_t nh = ci->model.n_heads, nkv = ci->model.n_kv_heads, d = ci->model.head_dim;
    float *q = b->q, *k = b->k, *v = b->v, *out = b->out;
    int64_t *pos = b->pos;
    kvq_status *st = b->st;
    kvq_err *errs = b->errs;
    kvq_status s = KVQ_OK;
    for (int32_t f = 0; f < ci->n_files && !s; f++) {
        const int32_t layer = ci->layers[f];
        if (!kvq_codebook_set_at(rt, layer, 0))
            continue;
        thr_layer L;
        if ((s = thr_layer_open(ci, f, &L, err)))
            break;
        for (int64_t i = 0; i < ci->n_sequences && !s; i++) {
            const int64_t r0 = ci->sequences[2 * i], n = ci->sequences[2 * i + 1];
            if (n < 2)
                continue;
            for (int64_t t = 0; t < n; t++) {
                kvq_capture_read_heads(L.q, L.qidx[r0 + t], 0, nh, q + (size_t)t * nh * d);
                kvq_capture_read_heads(L.k, r0 + t, 0, nkv, k + (size_t)t * nkv * d);
                kvq_capture_read_heads(L.v, r0 + t, 0, nkv, v + (size_t)t * nkv * d);
                pos[t] = thr_layer_pos(&L, r0 + t);
            }
            s = run_sequence(set, n_set, p->threads, layer, n, thr_prompt_len(p->prompt_fraction, n),
                             q, k, v, pos, nh, nkv, d, out, st, errs, err);
        }
        thr_layer_close(&L);
        (*n_layers_done)++;
        if (!s && kvq_progress(&p->cb, "profile: budget", (uint64_t)f + 1, (uint64_t)ci->n_files))
            s = kvq_err_set(err, KVQ_E_CANCELLED, "profile: cancelled");
    }
    return s;
}

/* The perplexity column: plain retrieval decoding (no measurement) with each setting. */
static kvq_status ppl_column(const bsetting *set, int64_t n_set, int64_t n_b,
                             const kvq_profile_params *p, thr_ppl *ppl, const kvq_codebook_set *rt,
                             kvq_profile_table *budget, kvq_profile_table *mass, kvq_err *err)
{
    kvq_status s = KVQ_OK;
    for (int64_t c = 0; ppl && c < n_set && !s; c++) {
        kvq_retrieval *r = NULL;
        kvq_retrieval_params rp = set[c].rp;
        rp.measure = 0;
        rp.threads = p->threads; /* outputs do not depend on it without measurement */
        double val;
        if (!(s = kvq_retrieval_create(thr_ppl_config(ppl), rt, &rp, &r, err))) {
            const kvq_attn_backend b = kvq_retrieval_backend(r);
            if (!(s = thr_ppl_eval(ppl, &b, NULL, NULL, &val, err))) {
                if (c < n_b)
                    budget->rows[(size_t)c * KVQ_PB_NCOLS + KVQ_PB_PPL] = val;
                else
                    mass->rows[(size_t)(c - n_b) * KVQ_PB_NCOLS + KVQ_PB_PPL] = val;
            }
        }
        kvq_retrieval_free(r);
    }
    return s;
}

kvq_status thr_budget_profile(const kvq_capture_info *ci, const char *artifact_path,
                              const kvq_profile_params *p, thr_ppl *ppl,
                              kvq_profile_table *budget, kvq_profile_table *mass, kvq_err *err)
{
    static const char *const bcols[KVQ_PB_NCOLS] = {"fraction", "attended", "mass", "err", "ppl"};
    static const char *const mcols[KVQ_PB_NCOLS] = {"tau", "attended", "mass", "err", "ppl"};
    const double *fr = p->budgets ? p->budgets : default_budgets;
    const double *tau = p->taus ? p->taus : default_taus;
    const int64_t n_b = (p->knobs & KVQ_KNOB_BUDGET)
                            ? (int64_t)(p->budgets ? p->n_budgets
                                                   : sizeof default_budgets / sizeof *fr)
                            : 0;
    const int64_t n_t = (p->knobs & KVQ_KNOB_MASS)
                            ? (int64_t)(p->taus ? p->n_taus : sizeof default_taus / sizeof *tau)
                            : 0;
    const int64_t n_set = n_b + n_t;
    const int32_t nh = ci->model.n_heads, nkv = ci->model.n_kv_heads, d = ci->model.head_dim;
    const kvq_model_config cfg = kvq_model_config_from_id(&ci->model);
    kvq_codebook_set *rt = NULL;
    bsetting *set = NULL;
    float *q = NULL, *k = NULL, *v = NULL, *out = NULL;
    int64_t *pos = NULL;
    kvq_status *st = NULL;
    kvq_err *errs = NULL;
    kvq_status s = KVQ_OK;
    char why[256] = "";
    kvq_err e2 = {0};

    if ((s = thr_table_init(budget, "budget", KVQ_PB_NCOLS, bcols, n_b, err)) ||
        (s = thr_table_init(mass, "mass", KVQ_PB_NCOLS, mcols, n_t, err)))
        return s;
    if (n_set == 0)
        return KVQ_OK;
    if (ci->n_queries != 0) {
        snprintf(why, sizeof why, "the capture stores a sample of the queries; budgets need all");
        goto skip;
    }
    s = kvq_codebook_set_open(artifact_path, &ci->model, "capture", &rt, &e2);
    if (s == KVQ_E_UNSUPPORTED) {
        snprintf(why, sizeof why, "%.250s", e2.msg);
        s = KVQ_OK;
        goto skip;
    }
    if (s) {
        if (err)
            *err = e2;
        goto done;
    }
    set = calloc((size_t)n_set, sizeof *set);
    int64_t longest = 1;
    for (int64_t i = 0; i < ci->n_sequences; i++)
        longest = ci->sequences[2 * i + 1] > longest ? ci->sequences[2 * i + 1] : longest;
    q = malloc(sizeof(float) * (size_t)longest * nh * d);
    out = malloc(sizeof(float) * (size_t)n_set * longest * nh * d); /* per setting */
    st = calloc((size_t)n_set, sizeof *st);
    errs = calloc((size_t)n_set, sizeof *errs);
    k = malloc(sizeof(float) * (size_t)longest * nkv * d);
    v = malloc(sizeof(float) * (size_t)longest * nkv * d);
    pos = malloc(sizeof(int64_t) * (size_t)longest);
    if (!set || !q || !out || !k || !v || !pos || !st || !errs) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
        goto done;
    }
    if ((s = create_settings(set, n_set, n_b, fr, tau, p, &cfg, rt, err)))
        goto done;

    /* ---- the capture, layer by layer (layers without codebooks attend fully: skipped) */
    int32_t n_layers_done = 0;
    const seq_bufs bufs = {q, k, v, out, pos, st, errs};
    if ((s = run_layers(ci, rt, set, n_set, p, &bufs, &n_layers_done, err)))
        goto done;
    double measured = 0;
    for (int64_t c = 0; c < n_set; c++)
        measured += set[c].measured;
    if (n_layers_done == 0 || measured == 0) {
        snprintf(why, sizeof why, n_layers_done ? "no retrieval step had candidates (sequences "
                                                  "shorter than sink + window)"
                                                : "no captured layer has codebooks");
        goto skip;
    }
    for (int64_t c = 0; c < n_b; c++)
        fill_row(budget->rows + (size_t)c * KVQ_PB_NCOLS, fr[c], &set[c]);
    for (int64_t c = 0; c < n_t; c++)
        fill_row(mass->rows + (size_t)c * KVQ_PB_NCOLS, tau[c], &set[n_b + c]);

    /* ---- perplexity with each setting (no measurement: plain retrieval decoding) */
    s = ppl_column(set, n_set, n_b, p, ppl, rt, budget, mass, err);
    goto done;

skip:
    kvq_log(&p->cb, KVQ_LOG_WARN, "profile: budget profile skipped: %s", why);
    snprintf(budget->skipped, sizeof budget->skipped, "%.250s", why);
    snprintf(mass->skipped, sizeof mass->skipped, "%.250s", why);
done:
    for (int64_t c = 0; set && c < n_set; c++)
        kvq_retrieval_free(set[c].r);
    free(set);
    free(q);
    free(k);
    free(v);
    free(out);
    free(pos);
    free(st);
    free(errs);
    kvq_codebook_set_close(rt);
    return s;
}
