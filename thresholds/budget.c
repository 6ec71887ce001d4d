/*
 * budget.c — retrieval budget profiles: the artifact's codebook selector at budget
 * fractions, and hcattention's mass rule at values of tau, measured with the runtime
 * (kvq/runtime.h) on the capture's rows, with the runtime's `measure` statistics of
 * continuation rows (P .. N-1, as in kvq/thresholds.h "Quality").
 *
 * A retrieval step reads the cache (the codes of the tokens before it), never the
 * outputs of earlier steps, so a row's figures do not depend on how the rows before it
 * were attended: the prompt and the rows between measured ones are only appended to the
 * cache (in the chunks a context attending them would get, so the rows are ordered
 * alike), and each measured row is measured under every setting at once by the
 * harness (kvq_eval_seq_probe, kvq/eval.h: kvq_retrieval_probe on one context per
 * thread, sequences of a layer in parallel, sums in sequence order): its figures are
 * those of a context per setting attending the row alone (tests/test_runtime.c). The measured rows are p->sample_rows evenly spaced
 * continuation rows per sequence (thr_sample_rows, as the LeanKV/PATS grid); the
 * settings whose choice the sample leaves open against the tolerance (thr_mark_refine,
 * memory = the fraction for budgets, the attended share for tau, the keys profile.c
 * selects on) are measured again on every row, so the choice equals the every-row
 * choice (tests/test_profile_fast.c).
 * The attended and mass columns stay sampled figures (the same rows for every setting).
 * p->reference keeps the former path: every row by retrieval (prefill_full = 0), also
 * through the harness (kvq_eval_seq_attend). What stays here is the profile's policy,
 * shared with the LeanKV/PATS grid: the row and job samples, the interval
 * (kvq_eval_sample_interval through thr_acc_interval) and which settings to refine.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kvq/eval.h"
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
/* The harness's figures (kvq/eval.h) of a step or of the sums of a setting. */
static kvq_retrieval_stats as_stats(double measured, double out_rel_err, double visible,
                                    double attended, double mass)
{
    const kvq_retrieval_stats z = {.steps = 1, .measured = (uint64_t)measured,
                                   .out_rel_err = out_rel_err, .visible = visible,
                                   .attended = attended, .recall_mass = mass};
    return z;
}

/* A step's mean output error over its KV heads (NaN: none measured). */
static double step_err(const bstep *x)
{
    const kvq_retrieval_stats z = as_stats(x->measured, x->out_rel_err, 0, 0, 0);
    return kvq_eval_metric_value(&z, KVQ_EVAL_OUT_REL_ERR);
}

static void step_add(bsetting *b, const bstep *x, int per_row)
{
    b->measured += x->measured;
    if (per_row && x->measured > 0) {
        const double e = step_err(x);
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

/* The sampled path of one sequence, every setting at once, through the harness
 * (kvq_eval_seq_probe: the measured rows of S each measured under every setting on ctx,
 * one encoding of each key and one exact attention per row). The figures go to sums
 * [n_set] (added, row by row) and rec (each setting's error of each measured row:
 * rec[c * rec_ld + rec_at + i], NaN when no step counted; rec may be NULL). z: [S->nm,
 * n_set]. */
static kvq_status probe_sequence(kvq_retrieval *ctx, const kvq_retrieval_setting *rs,
                                 int64_t n_set, const kvq_eval_seq *S, bsetting *sums,
                                 kvq_retrieval_stats *z, double *rec, int64_t rec_ld,
                                 int64_t rec_at, kvq_err *err)
{
    kvq_status s = kvq_eval_seq_probe(ctx, S, rs, (int32_t)n_set, z, err);
    for (int64_t i = 0; i < S->nm && !s; i++)
        for (int64_t c = 0; c < n_set; c++) {
            const kvq_retrieval_stats *x = &z[i * n_set + c];
            stats_add(&sums[c], x, 1);
            if (rec)
                rec[c * rec_ld + rec_at + i] = kvq_eval_metric_value(x, KVQ_EVAL_OUT_REL_ERR);
        }
    return s;
}

/* The reference path of one setting through the harness (kvq_eval_seq_attend: the
 * prompt, then every continuation row by retrieval, row by row). */
static kvq_status run_reference(bsetting *b, const kvq_eval_seq *S, float *o, kvq_err *err)
{
    kvq_retrieval_stats z;
    kvq_status s = kvq_eval_seq_attend(b->r, S, o, &z, err);
    if (s)
        return s;
    stats_add(b, &z, 0);
    b->err_sq = NAN; /* not per row */
    return KVQ_OK;
}

/* The reference path of one sequence of one layer through every setting, the settings
 * in parallel (each context runs single-threaded, so its sums do not depend on the
 * thread count). */
static kvq_status run_sequence(bsetting *set, int64_t n_set, int32_t threads, const kvq_eval_seq *S,
                               float *out, kvq_status *st, kvq_err *errs, kvq_err *err)
{
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t c = 0; c < n_set; c++) {
        float *o = out + (size_t)c * S->n * S->nh * S->d;
        st[c] = run_reference(&set[c], S, o, &errs[c]);
    }
    for (int64_t c = 0; c < n_set; c++)
        if (st[c]) {
            if (err)
                *err = errs[c];
            return st[c];
        }
    return KVQ_OK;
}

/* A table row; *ci the 95% half-width of the error (0 when every row was measured;
 * job_ci when it is not NaN: a setting left on the job sample). */
static void fill_row(double *row, double *ci, double value, const bsetting *b, int all_rows,
                     double job_ci)
{
    row[KVQ_PB_VALUE] = value;
    const kvq_retrieval_stats z = as_stats(b->measured, 0, b->visible, b->attended, b->mass);
    row[KVQ_PB_ATTENDED] = kvq_eval_metric_value(&z, KVQ_EVAL_ATTENDED);
    row[KVQ_PB_MASS] = kvq_eval_metric_value(&z, KVQ_EVAL_RECALL_MASS);
    row[KVQ_PB_ERR] = b->err_n > 0 ? b->err / b->err_n : NAN;
    const thr_acc a = {.err_sum = b->err, .err_sq = b->err_sq, .err_n = b->err_n};
    double m, se;
    thr_acc_interval(&a, &m, &se);
    *ci = isnan(m) ? NAN : !isnan(job_ci) ? job_ci : all_rows ? 0.0 : 1.96 * se;
}

/* Buffers: of one sequence (longest rows) per thread, of every setting's outputs on
 * one sequence (reference path), and the probe contexts (sampled path). */
typedef struct seq_bufs {
    int32_t n_thr;
    int64_t longest;
    float *q, *k, *v;  /* [n_thr][longest, nh, d], [n_thr][longest, nkv, d] x 2 */
    float *out;        /* [n_set, longest, nh, d] (reference) */
    int64_t *pos;      /* [n_thr][longest] */
    int64_t *cand, *mrow; /* [n_thr][longest] */
    double *rec;       /* [n_set, rec_ld] the errors of the sampled pass's measured rows */
    int64_t rec_ld;
    kvq_status *st;    /* [n_set] */
    kvq_err *errs;     /* [n_set] */
    kvq_retrieval **ctx;       /* [n_thr] probe contexts (measure, one thread) */
    kvq_retrieval_setting *rs; /* [n_set] */
    kvq_retrieval_stats *z;    /* [n_thr][longest, n_set] (a sequence's measured rows) */
    thr_jobs *J;               /* the job sample (sequences of a layer) or NULL */
    int want, record;          /* a pass's sequences (thr_jobs_run) and whether it keeps
                                  the sampled ones' sums in J */
} seq_bufs;

/* The settings: the codebook selector at each budget fraction fr [n_b], then the mass
 * rule at each tau [n_set - n_b]; measured, single-threaded. The reference path: one
 * retrieval context per setting; the sampled path: one per thread (b->ctx). */
static kvq_status create_settings(bsetting *set, int64_t n_set, int64_t n_b, const double *fr,
                                  const double *tau, const kvq_profile_params *p,
                                  const kvq_model_config *cfg, const kvq_codebook_set *rt,
                                  const seq_bufs *b, kvq_err *err)
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
        if (p->reference)
            s = kvq_retrieval_create(cfg, rt, &rp, &set[c].r, err);
    }
    /* the sampled path: one probe context per thread, every setting measured on it */
    for (int32_t t = 0; !p->reference && t < b->n_thr && !s; t++) {
        kvq_retrieval_params rp = set[0].rp;
        rp.prefill_full = 0;
        s = kvq_retrieval_create(cfg, rt, &rp, &b->ctx[t], err);
    }
    return s;
}

/* Sequence i of layer file L into thread t's buffers; the kvq_eval_seq of it (measured rows:
 * `sample` of the continuation rows, thr_sample_rows). probe: only what the sampled path
 * reads (probe_sequence): the queries of the measured rows, the keys and values up to
 * the last of them; else every row (the reference path). */
static kvq_eval_seq load_sequence(const kvq_capture_info *ci, const thr_layer *L, int32_t layer,
                          int64_t i, int32_t t, int64_t sample, double prompt_fraction,
                          int probe, const seq_bufs *b)
{
    const int32_t nh = ci->model.n_heads, nkv = ci->model.n_kv_heads, d = ci->model.head_dim;
    const int64_t r0 = ci->sequences[2 * i], n = ci->sequences[2 * i + 1], lg = b->longest;
    float *q = b->q + (size_t)t * lg * nh * d, *k = b->k + (size_t)t * lg * nkv * d,
          *v = b->v + (size_t)t * lg * nkv * d;
    int64_t *pos = b->pos + (size_t)t * lg, *cand = b->cand + (size_t)t * lg,
            *mrow = b->mrow + (size_t)t * lg;
    const int64_t P = thr_prompt_len(prompt_fraction, n);
    for (int64_t j = P; j < n; j++)
        cand[j - P] = j;
    const kvq_eval_seq S = {.layer = layer, .n = n, .P = P, .q = q, .k = k, .v = v, .pos = pos,
                            .mrow = mrow, .nm = thr_sample_rows(cand, n - P, sample, mrow),
                            .nh = nh, .nkv = nkv, .d = d};
    const int64_t end = probe ? (S.nm > 0 ? mrow[S.nm - 1] + 1 : 0) : n;
    for (int64_t j = 0; j < end; j++) {
        kvq_capture_read_heads(L->k, r0 + j, 0, nkv, k + (size_t)j * nkv * d);
        kvq_capture_read_heads(L->v, r0 + j, 0, nkv, v + (size_t)j * nkv * d);
        pos[j] = thr_layer_pos(L, r0 + j);
    }
    for (int64_t a = 0; a < (probe ? S.nm : n); a++) {
        const int64_t j = probe ? mrow[a] : a;
        kvq_capture_read_heads(L->q, L->qidx[r0 + j], 0, nh, q + (size_t)j * nh * d);
    }
    return S;
}

static void sums_add(bsetting *a, const bsetting *b)
{
    a->measured += b->measured;
    a->err += b->err;
    a->err_sq += b->err_sq;
    a->err_n += b->err_n;
    a->visible += b->visible;
    a->attended += b->attended;
    a->mass += b->mass;
}

static int thread_num(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The sampled path of one layer: its sequences in parallel (each through
 * probe_sequence on its thread's context), their sums added to set in sequence order
 * (the same bytes for any thread count). *rec_at: the rec column of the layer's first
 * measured row (advanced). */
static kvq_status probe_layer(const kvq_capture_info *ci, const thr_layer *L, int32_t f,
                              bsetting *set, int64_t n_set, const kvq_profile_params *p,
                              int64_t sample, const seq_bufs *b, int64_t *rec_at, kvq_err *err)
{
    const int32_t layer = ci->layers[f];
    const int64_t ns = ci->n_sequences;
    bsetting *part = calloc((size_t)(ns * n_set), sizeof *part);
    int64_t *at = malloc(sizeof *at * (size_t)ns);
    kvq_status *st = calloc((size_t)ns, sizeof *st);
    kvq_err *errs = calloc((size_t)ns, sizeof *errs);
    kvq_status s = KVQ_OK;
    if (!part || !at || !st || !errs) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
        goto done;
    }
    for (int64_t i = 0; i < ns; i++) { /* the measured rows' columns, in sequence order */
        const int64_t n = ci->sequences[2 * i + 1];
        const int64_t nc = n < 2 ? 0 : n - thr_prompt_len(p->prompt_fraction, n);
        at[i] = *rec_at;
        *rec_at += sample > 0 && sample < nc ? sample : nc;
    }
    /* a split pass: each row's steps logged at its place in the layer's log */
    for (int64_t i = 0; i < ns; i++)
        for (int64_t c = 0; c < n_set; c++) {
            bstep *lg = set[c].log ? set[c].log + (at[i] - at[0]) : NULL;
            part[i * n_set + c].log = lg;
            /* a sequence the pass leaves out logs steps that count nothing */
            if (lg && !thr_jobs_run(b->J, f, i, b->want))
                memset(lg, 0, sizeof *lg * (size_t)((i + 1 < ns ? at[i + 1] : *rec_at) - at[i]));
        }
#pragma omp parallel for num_threads(b->n_thr) schedule(dynamic, 1)
    for (int64_t i = 0; i < ns; i++) {
        if (ci->sequences[2 * i + 1] < 2 || !thr_jobs_run(b->J, f, i, b->want))
            continue;
        const int32_t t = thread_num();
        const kvq_eval_seq S = load_sequence(ci, L, layer, i, t, sample, p->prompt_fraction, 1,
                                             b);
        st[i] = probe_sequence(b->ctx[t], b->rs, n_set, &S, part + i * n_set,
                               b->z + (size_t)t * b->longest * n_set, sample ? b->rec : NULL,
                               b->rec_ld, at[i], &errs[i]);
    }
    for (int64_t i = 0; i < ns && !s; i++) {
        if (st[i]) {
            if (err)
                *err = errs[i];
            s = st[i];
        }
        for (int64_t c = 0; c < n_set && !s; c++) {
            sums_add(&set[c], &part[i * n_set + c]);
            if (b->record)
                thr_jobs_put(b->J, f, i, c, part[i * n_set + c].err, part[i * n_set + c].err_n);
        }
    }
    for (int64_t c = 0; c < n_set && ns > 0; c++)
        if (set[c].log)
            set[c].n_log = *rec_at - at[0];
done:
    free(part);
    free(at);
    free(st);
    free(errs);
    return s;
}

/* One pass over the layers (sp: this rank's share, each layer's steps logged into its
 * record; NULL: every layer); see run_layers. */
static kvq_status layers_pass(const kvq_capture_info *ci, const kvq_codebook_set *rt,
                              bsetting *set, int64_t n_set, const kvq_profile_params *p,
                              int64_t sample, const char *what, const seq_bufs *b, thr_split *sp,
                              int64_t n_z, int32_t *n_layers_done, kvq_err *err)
{
    int64_t rec_at = 0;
    kvq_status s = KVQ_OK;
    for (int64_t c = 0; c < n_set; c++)
        b->rs[c] = (kvq_retrieval_setting){.selector = set[c].rp.selector,
                                           .budget = set[c].rp.budget,
                                           .tau = set[c].rp.tau};
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
        if (!p->reference)
            s = probe_layer(ci, &L, f, set, n_set, p, sample, b, &rec_at, err);
        for (int64_t i = 0; p->reference && i < ci->n_sequences && !s; i++) {
            if (ci->sequences[2 * i + 1] < 2)
                continue;
            const kvq_eval_seq S = load_sequence(ci, &L, layer, i, 0, 0, p->prompt_fraction, 0, b);
            s = run_sequence(set, n_set, p->threads, &S, b->out, b->st, b->errs, err);
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
 * layer order as one process adds them (sampled path: a sequence's rows into its own
 * sums first, then those in sequence order, as probe_layer; reference path: one step
 * per sequence, straight into the sums, as run_reference), and the sampled rows'
 * errors (rec). */
typedef struct budget_replay {
    bsetting *set;
    int64_t n_set, n_z, at;
    int per_row;
    const int64_t *seq_rows; /* [ns] the rows logged per sequence (sampled path) */
    int64_t ns;
    double *rec;      /* NULL: not kept */
    int64_t rec_ld;
    thr_jobs *J;      /* the job sample or NULL; want and record as in seq_bufs */
    int want, record;
} budget_replay;

static void replay_layer(void *user, int32_t f, const uint8_t *rec)
{
    budget_replay *g = user;
    const int64_t *n_logged = (const int64_t *)rec;
    const bstep *steps = (const bstep *)(n_logged + 1);
    for (int64_t c = 0; c < g->n_set; c++) {
        int64_t i = 0;
        for (int64_t q = 0; i < *n_logged && (!g->per_row || q < g->ns); q++) {
            const int64_t m = g->per_row ? g->seq_rows[q] : 1;
            bsetting part = {0};
            bsetting *to = g->per_row ? &part : &g->set[c];
            for (int64_t j = 0; j < m && i < *n_logged; j++, i++) {
                const bstep *x = &steps[c * g->n_z + i];
                step_add(to, x, g->per_row);
                if (g->rec && (!g->per_row || thr_jobs_run(g->J, f, q, g->want)))
                    g->rec[c * g->rec_ld + g->at + i] = step_err(x);
            }
            if (g->per_row) {
                sums_add(&g->set[c], &part);
                if (g->record)
                    thr_jobs_put(g->J, f, q, c, part.err, part.err_n);
            } else
                g->set[c].err_sq = NAN; /* as run_reference */
        }
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
    int64_t *seq_rows = calloc((size_t)ci->n_sequences + 1, sizeof *seq_rows);
    for (int64_t i = 0; seq_rows && i < ci->n_sequences; i++) {
        const int64_t n = ci->sequences[2 * i + 1], nc = n - thr_prompt_len(p->prompt_fraction, n);
        seq_rows[i] = n < 2 ? 0 : p->reference ? 1 : sample > 0 && sample < nc ? sample : nc;
        n_z += seq_rows[i];
    }
    thr_split sp;
    kvq_status s = thr_split_begin(&sp, p, what, ci->n_files,
                                   sizeof(int64_t) + sizeof(bstep) * (size_t)(n_set * n_z), err);
    bsetting *before = malloc(sizeof *before * (size_t)n_set);
    int32_t mine = 0;
    if (!s && (!before || !seq_rows))
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
    budget_replay g = {set, n_set, n_z, 0, !p->reference, seq_rows, ci->n_sequences,
                       sample ? b->rec : NULL, b->rec_ld, b->J, b->want, b->record};
    s = thr_split_end(&sp, s, replay_layer, &g, err);
    free(seq_rows);
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
 * to it is within REFINE_Z standard errors of zero or below; none when that is the best
 * alone (thr_unmark_single: nothing measured again can change the choice). */
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
    thr_unmark_single(a, lo, hi, mark);
}

/* After the job sample's pass (b->J on): the settings that may be within tolerance or
 * the best (thr_jobs_mark, the best paired as mark_table) run on the other sequences,
 * their sums added to set's; the others keep the sample's, and job_ci [n_set] gets their
 * 95% half-width over jobs (NaN: every job). Split by layers: rank 0 holds the sums and
 * decides for every rank. */
static kvq_status other_jobs(const kvq_capture_info *ci, const kvq_codebook_set *rt,
                             bsetting *set, int64_t n_set, int64_t n_b, const double *fr,
                             double tol, const kvq_profile_params *p, seq_bufs *b,
                             double *job_ci, kvq_err *err)
{
    thr_acc *a = calloc((size_t)n_set, sizeof *a);
    bsetting *sub = calloc((size_t)n_set, sizeof *sub);
    int64_t *idx = calloc((size_t)n_set, sizeof *idx);
    uint8_t *mark = calloc((size_t)n_set, 1);
    kvq_status s = a && sub && idx && mark ? KVQ_OK
                                           : kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    if ((s = kvq_dist_agree(p->dist, s, err)))
        goto done;
    to_acc(set, n_set, n_b, fr, a);
    thr_jobs_mark(b->J, a, 0, n_b, tol, INFINITY, 1, mark);
    thr_jobs_mark(b->J, a, n_b, n_set, tol, INFINITY, 1, mark);
    if ((s = kvq_dist_bcast(p->dist, mark, (size_t)n_set, err)))
        goto done;
    int64_t m = 0;
    for (int64_t c = 0; c < n_set; c++) {
        double mean, se;
        thr_jobs_interval(b->J, c, &mean, &se);
        job_ci[c] = mark[c] ? NAN : 1.96 * se;
        if (mark[c]) {
            sub[m].rp = set[c].rp;
            sub[m].r = set[c].r;
            idx[m++] = c;
        }
    }
    if (m == 0)
        goto done;
    kvq_log(&p->cb, KVQ_LOG_INFO, "profile: %lld budget/tau settings may be within the "
            "tolerance or the best: measured on the other sequences", (long long)m);
    int32_t nl = 0;
    b->want = 0;
    b->record = 0;
    s = run_layers(ci, rt, sub, m, p, p->sample_rows, "profile: budget, other jobs", b, &nl, err);
    b->want = -1;
    for (int64_t i = 0; i < m && !s; i++)
        sums_add(&set[idx[i]], &sub[i]);
done:
    free(a);
    free(sub);
    free(idx);
    free(mark);
    return s;
}

/* The settings whose choice against tol the sample leaves open, measured again on every
 * row: their error sums replaced, refined[c] = 1. */
static kvq_status refine_settings(const kvq_capture_info *ci, const kvq_codebook_set *rt,
                                  bsetting *set, int64_t n_set, int64_t n_b, const double *fr,
                                  double tol, const kvq_profile_params *p, const seq_bufs *b,
                                  const double *job_ci, uint8_t *refined, kvq_err *err)
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
    for (int64_t c = 0; c < n_set; c++) /* left on the job sample: no part, never marked */
        if (!isnan(job_ci[c]))
            a[c].err_sum = a[c].err_sq = a[c].err_n = 0;
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

/* The buffers of seq_bufs for n_set settings on n_thr threads (rec: rec_ld x n_set,
 * NaN-filled; out only for the reference path). KVQ_E_NOMEM. */
static kvq_status bufs_alloc(const kvq_capture_info *ci, int64_t n_set, int32_t n_thr,
                             int reference, int64_t rec_ld, seq_bufs *b, kvq_err *err)
{
    const size_t nh = (size_t)ci->model.n_heads, nkv = (size_t)ci->model.n_kv_heads,
                 d = (size_t)ci->model.head_dim;
    int64_t longest = 1;
    for (int64_t i = 0; i < ci->n_sequences; i++)
        longest = ci->sequences[2 * i + 1] > longest ? ci->sequences[2 * i + 1] : longest;
    const size_t lg = (size_t)longest, nt = (size_t)n_thr, ns = (size_t)n_set;
    memset(b, 0, sizeof *b);
    b->n_thr = n_thr;
    b->longest = longest;
    b->rec_ld = rec_ld;
    b->q = malloc(sizeof(float) * nt * lg * nh * d);
    b->k = malloc(sizeof(float) * nt * lg * nkv * d);
    b->v = malloc(sizeof(float) * nt * lg * nkv * d);
    b->out = reference ? malloc(sizeof(float) * ns * lg * nh * d) : NULL;
    b->pos = malloc(sizeof(int64_t) * nt * lg);
    b->cand = malloc(sizeof(int64_t) * nt * lg);
    b->mrow = malloc(sizeof(int64_t) * nt * lg);
    b->rec = malloc(sizeof(double) * (size_t)(rec_ld > 0 ? rec_ld * n_set : 1));
    b->st = calloc(ns, sizeof *b->st);
    b->errs = calloc(ns, sizeof *b->errs);
    b->ctx = calloc(nt, sizeof *b->ctx);
    b->rs = calloc(ns, sizeof *b->rs);
    b->z = calloc(nt * lg * ns, sizeof *b->z);
    if (!b->q || !b->k || !b->v || (reference && !b->out) || !b->pos || !b->cand || !b->mrow ||
        !b->rec || !b->st || !b->errs || !b->ctx || !b->rs || !b->z)
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    for (int64_t i = 0; i < rec_ld * n_set; i++)
        b->rec[i] = NAN;
    b->want = -1; /* every sequence */
    return KVQ_OK;
}

static void bufs_free(seq_bufs *b)
{
    for (int32_t t = 0; b->ctx && t < b->n_thr; t++)
        kvq_retrieval_free(b->ctx[t]);
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->out);
    free(b->pos);
    free(b->cand);
    free(b->mrow);
    free(b->rec);
    free(b->st);
    free(b->errs);
    free(b->ctx);
    free(b->rs);
    free(b->z);
}

kvq_status thr_budget_profile(const kvq_capture_info *ci, const char *artifact_path,
                              const kvq_profile_params *p, double tol, thr_ppl *ppl,
                              kvq_profile_table *budget, kvq_profile_table *mass,
                              int64_t *n_jobs, int64_t *n_jobs_in, kvq_err *err)
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
    const kvq_model_config cfg = kvq_model_config_from_id(&ci->model);
    kvq_codebook_set *rt = NULL;
    bsetting *set = NULL;
    seq_bufs bufs = {0};
    thr_jobs J = {0};
    uint8_t *refined = NULL;
    double *job_ci = NULL;
    int blas_prev = 0;
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
    refined = calloc((size_t)n_set, 1);
    job_ci = malloc(sizeof *job_ci * (size_t)n_set);
    for (int64_t c = 0; job_ci && c < n_set; c++)
        job_ci[c] = NAN;
    if (!set || !refined || !job_ci) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
        goto setup;
    }
    if ((s = bufs_alloc(ci, n_set, p->reference ? 1 : p->threads, p->reference, rec_ld, &bufs,
                        err)) ||
        (s = create_settings(set, n_set, n_b, fr, tau, p, &cfg, rt, &bufs, err)))
        goto setup;
    /* the job sample (sequences of each layer): with the row sample and a choice made
     * here against the tolerance, as the LeanKV/PATS grid */
    if ((s = thr_jobs_plan(ci, sample > 0 && tol >= 0 ? p->sample_jobs : 1.0, 1, n_set, &J,
                           err)))
        goto setup;
    *n_jobs = J.n_elig * ci->n_files;
    *n_jobs_in = J.on ? J.n_in * ci->n_files : *n_jobs;
    bufs.J = &J;
    bufs.want = J.on ? 1 : -1;
    bufs.record = 1;

setup: /* split by layers: every rank runs the passes, or none */
    if ((s = kvq_dist_agree(p->dist, s, err)))
        goto done;
    /* the settings (reference) or sequences run in parallel: OpenBLAS threads would only
     * compete with them (process-wide setting, restored below) */
    blas_prev = openblas_get_num_threads();
    openblas_set_num_threads(1);
    if ((s = run_layers(ci, rt, set, n_set, p, sample,
                        J.on ? "profile: budget, job sample" : "profile: budget", &bufs,
                        &n_layers_done, err)))
        goto done;
    bufs.want = -1;
    bufs.record = 0;
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
    if (J.on && measured > 0 &&
        (s = other_jobs(ci, rt, set, n_set, n_b, fr, tol, p, &bufs, job_ci, err)))
        goto done;
    if (!all_rows && tol >= 0 && measured > 0 &&
        (s = refine_settings(ci, rt, set, n_set, n_b, fr, tol, p, &bufs, job_ci, refined, err)))
        goto done;
    if (n_layers_done == 0 || measured == 0) {
        snprintf(why, sizeof why, n_layers_done ? "no retrieval step had candidates (sequences "
                                                  "shorter than sink + window)"
                                                : "no captured layer has codebooks");
        goto skip;
    }
    for (int64_t c = 0; c < n_b; c++) {
        fill_row(budget->rows + (size_t)c * KVQ_PB_NCOLS, &budget->err_ci[c], fr[c], &set[c],
                 all_rows || refined[c], job_ci[c]);
        budget->job_sampled[c] = !isnan(job_ci[c]);
    }
    for (int64_t c = 0; c < n_t; c++) {
        fill_row(mass->rows + (size_t)c * KVQ_PB_NCOLS, &mass->err_ci[c], tau[c], &set[n_b + c],
                 all_rows || refined[n_b + c], job_ci[n_b + c]);
        mass->job_sampled[c] = !isnan(job_ci[n_b + c]);
    }

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
    bufs_free(&bufs);
    thr_jobs_free(&J);
    free(refined);
    free(job_ci);
    kvq_codebook_set_close(rt);
    return s;
}
