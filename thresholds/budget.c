/*
 * budget.c — retrieval budget profiles: the artifact's codebook selector at budget
 * fractions, and hcattention's mass rule at values of tau, measured with the runtime
 * (kvq/runtime.h) on the capture's rows, with the runtime's `measure` statistics of
 * continuation rows (P .. N-1, as in kvq/thresholds.h "Quality").
 *
 * A retrieval step reads the cache (the codes of the tokens before it), never the
 * outputs of earlier steps, so a row's figures do not depend on how the rows before it
 * were attended: the prompt and the rows between measured ones go in as prefill chunks
 * (prefill_full: exact attention, nothing counted), and each measured row alone by
 * retrieval. The measured rows are p->sample_rows evenly spaced continuation rows per
 * sequence (thr_sample_rows, as the LeanKV/PATS grid); the settings whose choice the
 * sample leaves open against the tolerance (thr_mark_refine, memory = the fraction for
 * budgets, the attended share for tau, the keys profile.c selects on) are measured again
 * on every row, so the choice equals the every-row choice (tests/test_profile_fast.c).
 * The attended and mass columns stay sampled figures (the same rows for every setting).
 * p->reference keeps the former path: every row by retrieval (prefill_full = 0).
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thresholds/thresholds_internal.h"

static const double default_budgets[] = {0.01, 0.02, 0.03, 0.05, 0.08, 0.10, 0.15, 0.20, 0.25};
static const double default_taus[] = {0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99};

/* One setting: its context and the sums of its measured continuation steps (one per row
 * and KV head): `measured` steps (mass over them), the error (sum and sum of squares
 * over err_n rows of each row's mean over its steps; the reference path: sum over
 * err_n steps, no squares), visible and attended tokens. */
/* The statistics of a measured run that the sums take (a step of a split pass's log). */
typedef struct bstep {
    double measured, out_rel_err, visible, attended, mass;
} bstep;

typedef struct bsetting {
    kvq_retrieval_params rp;
    kvq_retrieval *r;
    double measured, err, err_sq, err_n, visible, attended, mass;
    bstep *log;      /* a pass split by layers: this layer's steps, in order, for rank 0 */
    int64_t n_log;
} bsetting;

/* Adds the statistics x. per_row: x is one row's (its steps, one per KV head), and the
 * error counts as the row's mean over its steps, one sample of the rows (the unit the
 * rows are sampled in); else x covers many rows and adds its steps' sums. */
static void step_add(bsetting *b, const bstep *x, int per_row)
{
    b->measured += x->measured;
    if (per_row && x->measured > 0) {
        const double e = x->out_rel_err / x->measured;
        b->err += e;
        b->err_sq += e * e;
        b->err_n += 1;
    } else if (!per_row) {
        b->err += x->out_rel_err;
        b->err_n += x->measured;
    }
    b->visible += x->visible;
    b->attended += x->attended;
    b->mass += x->mass;
}

static void stats_add(bsetting *b, const kvq_retrieval_stats *z, int per_row)
{
    const bstep x = {(double)z->measured, z->out_rel_err, z->visible, z->attended,
                     z->recall_mass};
    if (b->log)
        b->log[b->n_log++] = x;
    step_add(b, &x, per_row);
}

/* One sequence (n tokens, prompt P) of one layer. */
typedef struct bseq {
    int32_t layer;
    int64_t n, P;
    const float *q, *k, *v;  /* [n, nh, d], [n, nkv, d] x 2 */
    const int64_t *pos;      /* [n] */
    const int64_t *mrow;     /* [nm] measured rows, ascending, in [P, n) */
    int64_t nm;
    double *rec;             /* NULL, or each setting's error of each measured row:
                                rec[c * rec_ld + rec_at + i] (NaN: no step counted) */
    int64_t rec_ld, rec_at;
    int32_t nh, nkv, d;
} bseq;

static kvq_status attend_rows(kvq_attn_backend b, const bseq *S, int64_t r0, int64_t r1,
                              float *o, kvq_err *err)
{
    const size_t qo = (size_t)r0 * S->nh * S->d, ko = (size_t)r0 * S->nkv * S->d;
    const kvq_attn_call call = {.layer = S->layer, .n = (int32_t)(r1 - r0), .pos = S->pos + r0,
                                .q = S->q + qo, .k = S->k + ko, .v = S->v + ko,
                                .out = o + qo};
    return b.attend(b.user, &call, err);
}

/* The sampled path of one setting: the prompt and the rows between measured ones in
 * chunks (prefill_full: exact attention, no step counted), each measured row alone by
 * retrieval with the statistics of that step only. Rows after the last measured one
 * are not run (nothing later reads them). */
static kvq_status run_sampled(bsetting *b, const bseq *S, double *rec, float *o, kvq_err *err)
{
    kvq_attn_backend be = kvq_retrieval_backend(b->r);
    kvq_status s = KVQ_OK;
    int64_t prev = 0;
    for (int64_t i = 0; i < S->nm && !s; i++) {
        const int64_t r = S->mrow[i];
        if (r > prev && (s = attend_rows(be, S, prev, r, o, err)))
            break;
        kvq_retrieval_stats_reset(b->r);
        if ((s = attend_rows(be, S, r, r + 1, o, err)))
            break;
        kvq_retrieval_stats z;
        kvq_retrieval_stats_get(b->r, &z);
        stats_add(b, &z, 1);
        if (rec)
            rec[i] = z.measured > 0 ? z.out_rel_err / (double)z.measured : NAN;
        prev = r + 1;
    }
    return s;
}

/* The reference path of one setting: the prompt, then every continuation row, each
 * chunk by retrieval row by row (prefill_full = 0). */
static kvq_status run_reference(bsetting *b, const bseq *S, float *o, kvq_err *err)
{
    kvq_attn_backend be = kvq_retrieval_backend(b->r);
    kvq_status s = S->P > 0 ? attend_rows(be, S, 0, S->P, o, err) : KVQ_OK;
    if (s)
        return s;
    kvq_retrieval_stats_reset(b->r);
    if ((s = attend_rows(be, S, S->P, S->n, o, err)))
        return s;
    kvq_retrieval_stats z;
    kvq_retrieval_stats_get(b->r, &z);
    stats_add(b, &z, 0);
    b->err_sq = NAN; /* not per row */
    return KVQ_OK;
}

/* Runs one sequence of one layer through every setting, the settings in parallel
 * (each context runs single-threaded, so its sums do not depend on the thread count). */
static kvq_status run_sequence(bsetting *set, int64_t n_set, int32_t threads, int reference,
                               const bseq *S, float *out, kvq_status *st, kvq_err *errs,
                               kvq_err *err)
{
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t c = 0; c < n_set; c++) {
        float *o = out + (size_t)c * S->n * S->nh * S->d;
        kvq_retrieval_reset(set[c].r);
        st[c] = reference ? run_reference(&set[c], S, o, &errs[c])
                          : run_sampled(&set[c], S,
                                        S->rec ? S->rec + c * S->rec_ld + S->rec_at : NULL, o,
                                        &errs[c]);
    }
    for (int64_t c = 0; c < n_set; c++)
        if (st[c]) {
            if (err)
                *err = errs[c];
            return st[c];
        }
    return KVQ_OK;
}

/* A table row; *ci the 95% half-width of the error (0 when every row was measured). */
static void fill_row(double *row, double *ci, double value, const bsetting *b, int all_rows)
{
    row[KVQ_PB_VALUE] = value;
    row[KVQ_PB_ATTENDED] = b->visible > 0 ? b->attended / b->visible : NAN;
    row[KVQ_PB_MASS] = b->measured > 0 ? b->mass / b->measured : NAN;
    row[KVQ_PB_ERR] = b->err_n > 0 ? b->err / b->err_n : NAN;
    const thr_acc a = {.err_sum = b->err, .err_sq = b->err_sq, .err_n = b->err_n};
    double m, se;
    thr_acc_interval(&a, &m, &se);
    *ci = isnan(m) ? NAN : all_rows ? 0.0 : 1.96 * se;
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
        rp.prefill_full = !p->reference;
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
    int64_t *cand, *mrow; /* [longest] */
    double *rec;       /* [n_set, rec_ld] the errors of the sampled pass's measured rows */
    int64_t rec_ld;
    kvq_status *st;    /* [n_set] */
    kvq_err *errs;     /* [n_set] */
} seq_bufs;

/* One pass over the layers (sp: this rank's share, each layer's steps logged into its
 * record; NULL: every layer); see run_layers. */
static kvq_status layers_pass(const kvq_capture_info *ci, const kvq_codebook_set *rt,
                              bsetting *set, int64_t n_set, const kvq_profile_params *p,
                              int64_t sample, const char *what, const seq_bufs *b, thr_split *sp,
                              int64_t n_z, int32_t *n_layers_done, kvq_err *err)
{
    int64_t rec_at = 0;
    const int32_t nh = ci->model.n_heads, nkv = ci->model.n_kv_heads, d = ci->model.head_dim;
    kvq_status s = KVQ_OK;
    for (int32_t f = sp ? sp->first : 0; f < (sp ? sp->end : ci->n_files) && !s; f++) {
        const int32_t layer = ci->layers[f];
        int64_t *n_logged = sp ? (int64_t *)thr_split_rec(sp, f) : NULL;
        if (n_logged) /* the layer's record: its step count (0: no codebooks), the steps */
            *n_logged = 0;
        if (!kvq_codebook_set_at(rt, layer, 0))
            continue;
        for (int64_t c = 0; sp && c < n_set; c++) {
            set[c].log = (bstep *)(n_logged + 1) + c * n_z;
            set[c].n_log = 0;
        }
        thr_layer L;
        if ((s = thr_layer_open(ci, f, &L, err)))
            break;
        for (int64_t i = 0; i < ci->n_sequences && !s; i++) {
            const int64_t r0 = ci->sequences[2 * i], n = ci->sequences[2 * i + 1];
            if (n < 2)
                continue;
            for (int64_t t = 0; t < n; t++) {
                kvq_capture_read_heads(L.q, L.qidx[r0 + t], 0, nh, b->q + (size_t)t * nh * d);
                kvq_capture_read_heads(L.k, r0 + t, 0, nkv, b->k + (size_t)t * nkv * d);
                kvq_capture_read_heads(L.v, r0 + t, 0, nkv, b->v + (size_t)t * nkv * d);
                b->pos[t] = thr_layer_pos(&L, r0 + t);
            }
            const int64_t P = thr_prompt_len(p->prompt_fraction, n);
            for (int64_t t = P; t < n; t++)
                b->cand[t - P] = t;
            const bseq S = {.layer = layer, .n = n, .P = P, .q = b->q, .k = b->k, .v = b->v,
                            .pos = b->pos, .mrow = b->mrow,
                            .nm = thr_sample_rows(b->cand, n - P, sample, b->mrow),
                            .nh = nh, .nkv = nkv, .d = d, .rec = sample && !sp ? b->rec : NULL,
                            .rec_ld = b->rec_ld, .rec_at = rec_at};
            rec_at += S.nm;
            s = run_sequence(set, n_set, p->threads, p->reference, &S, b->out, b->st, b->errs,
                             err);
        }
        thr_layer_close(&L);
        (*n_layers_done)++;
        if (n_logged)
            *n_logged = set[0].n_log;
        if (!s && kvq_progress(&p->cb, what,
                               sp ? thr_split_progress(sp, f + 1 - sp->first) : (uint64_t)f + 1,
                               (uint64_t)ci->n_files))
            s = kvq_err_set(err, KVQ_E_CANCELLED, "profile: cancelled");
    }
    return s;
}

/* Rank 0 of a split pass: each layer's logged steps added to the settings' sums in
 * layer order, as one process adds them, and the sampled rows' errors (rec). */
typedef struct budget_replay {
    bsetting *set;
    int64_t n_set, n_z, at;
    int per_row;
    double *rec;      /* NULL: not kept */
    int64_t rec_ld;
} budget_replay;

static void replay_layer(void *user, int32_t f, const uint8_t *rec)
{
    budget_replay *g = user;
    const int64_t *n_logged = (const int64_t *)rec;
    const bstep *steps = (const bstep *)(n_logged + 1);
    (void)f;
    for (int64_t c = 0; c < g->n_set; c++)
        for (int64_t i = 0; i < *n_logged; i++) {
            const bstep *x = &steps[c * g->n_z + i];
            step_add(&g->set[c], x, g->per_row);
            if (!g->per_row)
                g->set[c].err_sq = NAN; /* as run_reference */
            if (g->rec)
                g->rec[c * g->rec_ld + g->at + i] =
                    x->measured > 0 ? x->out_rel_err / x->measured : NAN;
        }
    g->at += *n_logged;
}

/* Every sequence of every captured layer that has codebooks, through every setting,
 * the error measured on `sample` rows per sequence (0: every row); *n_layers_done
 * counts the layers run. With several ranks (p->dist) the layers are split
 * (thr_split): each rank logs its layers' steps, rank 0 adds them in layer order. */
static kvq_status run_layers(const kvq_capture_info *ci, const kvq_codebook_set *rt, bsetting *set,
                             int64_t n_set, const kvq_profile_params *p, int64_t sample,
                             const char *what, const seq_bufs *b, int32_t *n_layers_done,
                             kvq_err *err)
{
    if (kvq_dist_size(p->dist) <= 1)
        return layers_pass(ci, rt, set, n_set, p, sample, what, b, NULL, 0, n_layers_done, err);
    int64_t n_z = 0; /* the steps of a layer: one per measured row, or per sequence */
    for (int64_t i = 0; i < ci->n_sequences; i++) {
        const int64_t n = ci->sequences[2 * i + 1], nc = n - thr_prompt_len(p->prompt_fraction, n);
        n_z += n < 2 ? 0 : p->reference ? 1 : sample > 0 && sample < nc ? sample : nc;
    }
    thr_split sp;
    kvq_status s = thr_split_begin(&sp, p, what, ci->n_files,
                                   sizeof(int64_t) + sizeof(bstep) * (size_t)(n_set * n_z), err);
    bsetting *before = malloc(sizeof *before * (size_t)n_set);
    int32_t mine = 0;
    if (!s && !before)
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    if (!s) {
        memcpy(before, set, sizeof *before * (size_t)n_set);
        s = layers_pass(ci, rt, set, n_set, p, sample, what, b, &sp, n_z, &mine, err);
        /* the sums as before the pass: rank 0 adds every layer's steps in layer order */
        for (int64_t c = 0; c < n_set; c++) {
            set[c].measured = before[c].measured, set[c].err = before[c].err;
            set[c].err_sq = before[c].err_sq, set[c].err_n = before[c].err_n;
            set[c].visible = before[c].visible, set[c].attended = before[c].attended;
            set[c].mass = before[c].mass;
        }
    }
    free(before);
    for (int64_t c = 0; c < n_set; c++)
        set[c].log = NULL;
    budget_replay g = {set, n_set, n_z, 0, !p->reference, sample ? b->rec : NULL, b->rec_ld};
    s = thr_split_end(&sp, s, replay_layer, &g, err);
    *n_layers_done = 0;
    for (int32_t f = 0; f < ci->n_files; f++)
        *n_layers_done += kvq_codebook_set_at(rt, ci->layers[f], 0) != NULL;
    return s;
}

/* The settings' errors as thr_acc, memory = the knob's selection order (budget: the
 * fraction; mass: the attended share, as profile.c selects). */
static void to_acc(const bsetting *set, int64_t n_set, int64_t n_b, const double *fr,
                   thr_acc *a)
{
    for (int64_t c = 0; c < n_set; c++) {
        memset(&a[c], 0, sizeof a[c]);
        a[c].err_sum = set[c].err;
        a[c].err_sq = set[c].err_sq;
        a[c].err_n = set[c].err_n;
        a[c].mem.bytes = c < n_b ? fr[c] : set[c].attended;
        a[c].mem.bytes_f16 = c < n_b ? 1.0 : set[c].visible;
    }
}

#define REFINE_Z 4.0 /* as thr_mark_refine */

/* The settings of one table [lo, hi) to measure on every row: thr_mark_refine's, except
 * when no setting can be within tolerance. Then the best quality is kept, and the
 * settings' errors on the same rows are compared in pairs (their differences vary far
 * less than the errors): the best sampled setting and every one whose mean difference
 * to it is within REFINE_Z standard errors of zero or below. */
static void mark_table(const thr_acc *a, int64_t lo, int64_t hi, double tol, const seq_bufs *b,
                       uint8_t *mark)
{
    thr_mark_refine(a, lo, hi, tol, mark);
    int64_t best = -1;
    double best_m = INFINITY, best_mem = INFINITY;
    for (int64_t c = lo; c < hi; c++) {
        double m, se;
        thr_acc_interval(&a[c], &m, &se);
        if (!isnan(m) && m - REFINE_Z * se <= tol)
            return; /* some setting may be within tolerance */
        const double mem = a[c].mem.bytes / a[c].mem.bytes_f16;
        if (!isnan(m) && (m < best_m || (m == best_m && mem < best_mem))) {
            best = c;
            best_m = m;
            best_mem = mem;
        }
    }
    if (best < 0)
        return;
    for (int64_t c = lo; c < hi; c++) {
        const double *x = b->rec + c * b->rec_ld, *y = b->rec + best * b->rec_ld;
        double n = 0, sum = 0, sq = 0;
        for (int64_t i = 0; i < b->rec_ld; i++)
            if (!isnan(x[i]) && !isnan(y[i])) {
                const double t = x[i] - y[i];
                n++;
                sum += t;
                sq += t * t;
            }
        const double mean = n > 0 ? sum / n : 0.0;
        const double var = n > 1 ? (sq - sum * sum / n) / (n - 1) : 0.0;
        const double se = n > 0 ? sqrt(var > 0 ? var : 0.0) / sqrt(n) : 0.0;
        mark[c] = c == best || mean - REFINE_Z * se <= 0.0;
    }
}

/* The settings whose choice against tol the sample leaves open, measured again on every
 * row: their error sums replaced, refined[c] = 1. */
static kvq_status refine_settings(const kvq_capture_info *ci, const kvq_codebook_set *rt,
                                  bsetting *set, int64_t n_set, int64_t n_b, const double *fr,
                                  double tol, const kvq_profile_params *p, const seq_bufs *b,
                                  uint8_t *refined, kvq_err *err)
{
    thr_acc *a = calloc((size_t)n_set, sizeof *a);
    bsetting *sub = calloc((size_t)n_set, sizeof *sub);
    int64_t *idx = calloc((size_t)n_set, sizeof *idx);
    kvq_status s = KVQ_OK;
    if (!a || !sub || !idx)
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    if ((s = kvq_dist_agree(p->dist, s, err))) /* split by layers: all ranks go on, or none */
        goto done;
    to_acc(set, n_set, n_b, fr, a);
    mark_table(a, 0, n_b, tol, b, refined);
    mark_table(a, n_b, n_set, tol, b, refined);
    /* split by layers: rank 0 holds the sums; every rank runs the settings it marked */
    if ((s = kvq_dist_bcast(p->dist, refined, (size_t)n_set, err)))
        goto done;
    int64_t m = 0;
    for (int64_t c = 0; c < n_set; c++)
        if (refined[c]) {
            sub[m].rp = set[c].rp;
            sub[m].r = set[c].r;
            idx[m++] = c;
        }
    if (m == 0)
        goto done;
    kvq_log(&p->cb, KVQ_LOG_INFO, "profile: %lld budget/tau settings near the tolerance: "
            "measured again on every row", (long long)m);
    int32_t nl = 0;
    if ((s = run_layers(ci, rt, sub, m, p, 0, "profile: budget, every row", b, &nl, err)))
        goto done;
    for (int64_t i = 0; i < m; i++) {
        set[idx[i]].err = sub[i].err;
        set[idx[i]].err_sq = sub[i].err_sq;
        set[idx[i]].err_n = sub[i].err_n;
    }
done:
    free(a);
    free(sub);
    free(idx);
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
        rp.prefill_full = 0; /* every row by retrieval, as in the runs measured */
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

/* The steps measured by every setting; split by layers, rank 0's sums decide for every
 * rank. */
static kvq_status sum_measured(const bsetting *set, int64_t n_set, const kvq_profile_params *p,
                               double *measured, kvq_err *err)
{
    *measured = 0;
    for (int64_t c = 0; c < n_set; c++)
        *measured += set[c].measured;
    return kvq_dist_bcast(p->dist, measured, sizeof *measured, err);
}

kvq_status thr_budget_profile(const kvq_capture_info *ci, const char *artifact_path,
                              const kvq_profile_params *p, double tol, thr_ppl *ppl,
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
    int64_t *pos = NULL, *cand = NULL, *mrow = NULL;
    uint8_t *refined = NULL;
    double *rec = NULL;
    int blas_prev = 0;
    kvq_status *st = NULL;
    kvq_err *errs = NULL;
    kvq_status s = KVQ_OK;
    char why[256] = "";
    kvq_err e2 = {0};
    int32_t n_layers_done = 0;
    const int64_t sample = p->reference ? 0 : p->sample_rows;
    const int64_t rec_ld = (int64_t)ci->n_files * ci->n_sequences * (sample > 0 ? sample : 0);

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
        goto setup;
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
    cand = malloc(sizeof(int64_t) * (size_t)longest);
    mrow = malloc(sizeof(int64_t) * (size_t)longest);
    refined = calloc((size_t)n_set, 1);
    if (!set || !q || !out || !k || !v || !pos || !cand || !mrow || !refined || !st || !errs) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
        goto setup;
    }
    if ((s = create_settings(set, n_set, n_b, fr, tau, p, &cfg, rt, err)))
        goto setup;

    /* ---- the capture, layer by layer (layers without codebooks attend fully: skipped) */
    rec = malloc(sizeof(double) * (size_t)(rec_ld > 0 ? rec_ld * n_set : 1));
    if (!rec) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
        goto setup;
    }
    for (int64_t i = 0; i < rec_ld * n_set; i++)
        rec[i] = NAN;
setup: /* split by layers: every rank runs the passes, or none */
    if ((s = kvq_dist_agree(p->dist, s, err)))
        goto done;
    const seq_bufs bufs = {q, k, v, out, pos, cand, mrow, rec, rec_ld, st, errs};
    /* the settings run in parallel: OpenBLAS threads (the prefill chunks' SGEMMs) would
     * only compete with them (process-wide setting, restored below) */
    blas_prev = openblas_get_num_threads();
    openblas_set_num_threads(1);
    if ((s = run_layers(ci, rt, set, n_set, p, sample, "profile: budget", &bufs, &n_layers_done,
                        err)))
        goto done;
    double measured = 0, steps_all = 0;
    if ((s = sum_measured(set, n_set, p, &measured, err)))
        goto done;
    /* every row measured already when no sequence has more continuation rows than the
     * sample */
    int all_rows = sample <= 0;
    for (int64_t i = 0; !all_rows && i < ci->n_sequences; i++) {
        const int64_t n = ci->sequences[2 * i + 1];
        steps_all += n - thr_prompt_len(p->prompt_fraction, n) > sample;
    }
    all_rows |= steps_all == 0;
    if (!all_rows && tol >= 0 && measured > 0 &&
        (s = refine_settings(ci, rt, set, n_set, n_b, fr, tol, p, &bufs, refined, err)))
        goto done;
    if (n_layers_done == 0 || measured == 0) {
        snprintf(why, sizeof why, n_layers_done ? "no retrieval step had candidates (sequences "
                                                  "shorter than sink + window)"
                                                : "no captured layer has codebooks");
        goto skip;
    }
    for (int64_t c = 0; c < n_b; c++)
        fill_row(budget->rows + (size_t)c * KVQ_PB_NCOLS, &budget->err_ci[c], fr[c], &set[c],
                 all_rows || refined[c]);
    for (int64_t c = 0; c < n_t; c++)
        fill_row(mass->rows + (size_t)c * KVQ_PB_NCOLS, &mass->err_ci[c], tau[c], &set[n_b + c],
                 all_rows || refined[n_b + c]);

    /* ---- perplexity with each setting (no measurement: plain retrieval decoding) */
    s = ppl_column(set, n_set, n_b, p, ppl, rt, budget, mass, err);
    goto done;

skip:
    kvq_log(&p->cb, KVQ_LOG_WARN, "profile: budget profile skipped: %s", why);
    snprintf(budget->skipped, sizeof budget->skipped, "%.250s", why);
    snprintf(mass->skipped, sizeof mass->skipped, "%.250s", why);
done:
    if (blas_prev > 0)
        openblas_set_num_threads(blas_prev);
    for (int64_t c = 0; set && c < n_set; c++)
        kvq_retrieval_free(set[c].r);
    free(set);
    free(q);
    free(k);
    free(v);
    free(out);
    free(pos);
    free(cand);
    free(mrow);
    free(refined);
    free(rec);
    free(st);
    free(errs);
    kvq_codebook_set_close(rt);
    return s;
}
