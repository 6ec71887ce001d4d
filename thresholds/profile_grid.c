/*
 * profile_grid.c — the LeanKV and PATS grids over every layer of a capture: the rows of
 * each (sequence, KV head) job loaded with RoPE, the jobs of a layer in parallel, their
 * sums added in job order (the same bytes for any thread count). A job runs the fast
 * path (profile_fast.c) or the reference: one simulated cache (thr_head) per setting,
 * fed row by row, every continuation row measured, which is the contract of
 * kvq/thresholds.h "Quality" written out directly and what the tests compare the fast
 * path with.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/eval.h"
#include "thresholds/thresholds_internal.h"

kvq_status thr_rope_tab_make(const kvq_capture_info *ci, const thr_layer *L, int threads,
                             thr_rope_tab *T, kvq_err *err)
{
    const int64_t nt = ci->n_tokens, d = ci->model.head_dim;
    double theta[KVQ_ROPE_MAX_DIM / 2];
    int64_t slots = 0;
    kvq_rope_freqs(&ci->model.rope, theta);
    T->by_pos = 1;
    T->pos = L->pos;
    for (int64_t r = 0; r < nt; r++) {
        const int64_t pos = thr_layer_pos(L, r);
        T->by_pos &= pos >= 0 && pos < nt;
        slots = pos + 1 > slots ? pos + 1 : slots;
    }
    slots = T->by_pos ? slots : nt;
    T->cs = malloc(sizeof(float) * (size_t)((slots > 0 ? slots : 1) * d));
    if (!T->cs)
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < slots; i++) {
        float *c = T->cs + (size_t)i * d;
        kvq_rope_cossin(&ci->model.rope, theta, T->by_pos ? i : thr_layer_pos(L, i), c, c + d / 2);
    }
    return KVQ_OK;
}

void thr_rope_tab_rotate(const kvq_capture_info *ci, const thr_rope_tab *T, int64_t row, float *x,
                         int n)
{
    const int64_t d = ci->model.head_dim;
    const float *c = T->cs + (size_t)(T->by_pos ? T->pos[row] : row) * d;
    kvq_rope_rotate(&ci->model.rope, c, c + d / 2, x, n);
}

/* The rows of one job and the reference's scratch. */
typedef struct job_bufs {
    float *k, *v, *q;     /* [n, d], [n, d], [n, gs, d] post-RoPE (k, q) */
    uint8_t *has_q;       /* [n] */
    float *ex, *o;        /* [n, gs, d] exact and simulated outputs (reference) */
    double *p;            /* [gs, n] (reference) */
} job_bufs;

static void bufs_free(job_bufs *b)
{
    free(b->k);
    free(b->v);
    free(b->q);
    free(b->has_q);
    free(b->ex);
    free(b->o);
    free(b->p);
}

/* Reads rows r0 .. r0+n-1 of KV head h, RoPE at the captured positions; the queries of
 * rows before q_from are left out (the fast path without LeanKV settings reads only the
 * continuation's). */
static kvq_status load_rows(const kvq_capture_info *ci, const thr_layer *L, const thr_rope_tab *T,
                            int64_t r0, int64_t n, int32_t h, int reference, int64_t q_from,
                            job_bufs *b, kvq_err *err)
{
    const int32_t d = ci->model.head_dim, gs = ci->model.n_heads / ci->model.n_kv_heads;
    const size_t nd = (size_t)n * d, ngd = nd * gs;
    memset(b, 0, sizeof *b);
    b->k = malloc(sizeof(float) * nd);
    b->v = malloc(sizeof(float) * nd);
    b->q = malloc(sizeof(float) * ngd);
    b->has_q = malloc((size_t)n);
    if (reference) {
        b->ex = calloc(ngd, sizeof(float));
        b->o = calloc(ngd, sizeof(float));
        b->p = malloc(sizeof(double) * (size_t)n * gs);
    }
    if (!b->k || !b->v || !b->q || !b->has_q || (reference && (!b->ex || !b->o || !b->p)))
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    for (int64_t t = 0; t < n; t++) {
        const int64_t row = r0 + t;
        float *kt = b->k + (size_t)t * d, *qt = b->q + (size_t)t * gs * d;
        kvq_capture_read_heads(L->k, row, h, 1, kt);
        kvq_capture_read_heads(L->v, row, h, 1, b->v + (size_t)t * d);
        thr_rope_tab_rotate(ci, T, row, kt, 1);
        b->has_q[t] = L->qidx[row] >= 0;
        if (b->has_q[t] && t >= q_from) {
            kvq_capture_read_heads(L->q, L->qidx[row], h * gs, gs, qt);
            thr_rope_tab_rotate(ci, T, row, qt, gs);
        }
    }
    return KVQ_OK;
}

/* ==========================================================================
 * The reference
 * ========================================================================== */

/* Adds the error of the simulated outputs of rows P.. against the exact ones. */
static void add_error(const thr_rows *R, const job_bufs *b, thr_acc *a)
{
    const int32_t gs = R->gs, d = R->d;
    for (int64_t t = R->P; t < R->n; t++) {
        if (!R->has_q[t])
            continue;
        thr_add_rel_err(b->o + (size_t)t * gs * d, b->ex + (size_t)t * gs * d, gs, d, a);
    }
}

/* Every setting of the grid on one job with one simulated cache each: acc [n_lk + n_pt]. */
static kvq_status run_reference(const thr_rows *R, const kvq_leankv_params *lk0, const thr_grid *G,
                                const job_bufs *b, thr_acc *acc, kvq_err *err)
{
    const int32_t d = R->d, gs = R->gs;
    const int64_t n = R->n, P = R->P;
    const float *k = R->k, *v = R->v, *q = R->q;
    thr_head base, work;
    kvq_status s = KVQ_OK;
    thr_head_init(&base, KVQ_SIMCACHE_LEANKV, lk0, NULL, d, gs);
    thr_head_init(&work, KVQ_SIMCACHE_LEANKV, lk0, NULL, d, gs);
    /* exact outputs of the evaluated rows */
    for (int64_t t = P; t < n; t++)
        if (R->has_q[t])
            thr_attend(q + (size_t)t * gs * d, gs, d, k, v, t + 1, NULL, b->p,
                       b->ex + (size_t)t * gs * d);
    /* LeanKV: the prompt once, then each setting from a copy */
    if (G->n_lk) {
        thr_head_begin(&base, n, P);
        for (int64_t t = 0; t < P && !s; t++)
            s = thr_head_push(&base, k + (size_t)t * d, v + (size_t)t * d,
                              R->has_q[t] ? q + (size_t)t * gs * d : NULL, NULL, err);
    }
    for (int64_t c = 0; c < G->n_lk && !s; c++) {
        if ((s = thr_head_copy(&work, &base, err)))
            break;
        work.lk = G->lk[c];
        for (int64_t t = P; t < n && !s; t++)
            s = thr_head_push(&work, k + (size_t)t * d, v + (size_t)t * d,
                              R->has_q[t] ? q + (size_t)t * gs * d : NULL,
                              b->o + (size_t)t * gs * d, err);
        if (!s && !(s = thr_head_memory(&work, &acc[c].mem, err)))
            add_error(R, b, &acc[c]);
    }
    /* PATS: every setting from the start; queries only where they are evaluated */
    for (int64_t c = 0; c < G->n_pt && !s; c++) {
        thr_head ph;
        thr_head_init(&ph, KVQ_SIMCACHE_PATS, NULL, &G->pt[c], d, gs);
        thr_head_begin(&ph, n, P);
        for (int64_t t = 0; t < n && !s; t++)
            s = thr_head_push(&ph, k + (size_t)t * d, v + (size_t)t * d,
                              t >= P && R->has_q[t] ? q + (size_t)t * gs * d : NULL,
                              b->o + (size_t)t * gs * d, err);
        if (!s && !(s = thr_head_memory(&ph, &acc[G->n_lk + c].mem, err)))
            add_error(R, b, &acc[G->n_lk + c]);
        thr_head_free(&ph);
    }
    thr_head_free(&base);
    thr_head_free(&work);
    return s;
}

/* ==========================================================================
 * The driver
 * ========================================================================== */

/* One job: rows loaded, then the fast path or the reference. *n_rows: evaluated query
 * rows; *n_err: those measured. */
static kvq_status run_job(const kvq_capture_info *ci, const thr_layer *L, const thr_rope_tab *T,
                          const kvq_profile_params *p, const thr_grid *G, int64_t r0, int64_t n,
                          int32_t h, thr_acc *acc, int64_t *n_rows, int64_t *n_err, kvq_err *err)
{
    job_bufs b;
    const int reference = p->reference != 0;
    const int64_t P = thr_prompt_len(p->prompt_fraction, n);
    kvq_status s = load_rows(ci, L, T, r0, n, h, reference, reference || G->n_lk ? 0 : P, &b, err);
    const thr_rows R = {.n = n, .P = P,
                        .d = ci->model.head_dim, .gs = ci->model.n_heads / ci->model.n_kv_heads,
                        .k = b.k, .v = b.v, .q = b.q, .has_q = b.has_q};
    if (!s) {
        *n_rows = 0;
        for (int64_t t = R.P; t < n; t++)
            *n_rows += b.has_q[t] != 0;
        *n_err = *n_rows;
        s = reference ? run_reference(&R, &p->leankv, G, &b, acc, err)
                      : thr_fast_job(&R, G, p->sample_rows, acc, n_err, err);
    }
    bufs_free(&b);
    return s;
}

static void acc_add(thr_acc *a, const thr_acc *b)
{
    a->err_sum += b->err_sum;
    a->err_sq += b->err_sq;
    a->err_n += b->err_n;
    a->mem.bytes += b->mem.bytes;
    a->mem.bytes_f16 += b->mem.bytes_f16;
    a->mem.bits += b->mem.bits;
    a->mem.n_high += b->mem.n_high;
    a->mem.n_low += b->mem.n_low;
    a->mem.n_pruned += b->mem.n_pruned;
}

/* What one layer adds to the pass's totals: its jobs' sums in job order (one record of
 * a split pass, thr_split). */
typedef struct grid_sums {
    int64_t n_jobs, n_kv, n_set;
    thr_acc *total;
    int64_t *n_rows, *n_err, *n_thin; /* n_thin: may be NULL */
    thr_jobs *rec;                    /* NULL, or the job sample whose sums to keep */
} grid_sums;

static void grid_add_layer(void *user, int32_t f, const uint8_t *rec)
{
    const grid_sums *g = user;
    const thr_acc *acc = (const thr_acc *)rec;
    const int64_t *rows = (const int64_t *)(acc + g->n_jobs * g->n_set);
    for (int64_t jb = 0; jb < g->n_jobs; jb++) {
        for (int64_t c = 0; c < g->n_set; c++)
            acc_add(&g->total[c], &acc[jb * g->n_set + c]);
        thr_jobs_record(g->rec, f, jb, &acc[jb * g->n_set]);
        if (jb % g->n_kv == 0) {
            *g->n_rows += rows[2 * jb];
            *g->n_err += rows[2 * jb + 1];
            if (g->n_thin)
                *g->n_thin += thr_thin_count(rows[2 * jb + 1], rows[2 * jb]);
        }
    }
}

/* Which jobs a pass runs (thr_jobs_run's want, over J) and whether it keeps the
 * sampled jobs' sums in J (record). */
typedef struct grid_jobs {
    thr_jobs *J;
    int want, record;
} grid_jobs;

static kvq_status grid_run(const kvq_capture_info *ci, const kvq_profile_params *p,
                           const thr_grid *G, const char *what, const grid_jobs *gj,
                           thr_acc *total, int64_t *n_rows, int64_t *n_err, int64_t *n_thin,
                           kvq_err *err);

kvq_status thr_grid_run(const kvq_capture_info *ci, const kvq_profile_params *p, const thr_grid *G,
                        const char *what, thr_acc *total, int64_t *n_rows, int64_t *n_err,
                        kvq_err *err)
{
    const grid_jobs all = {NULL, -1, 0};
    return grid_run(ci, p, G, what, &all, total, n_rows, n_err, NULL, err);
}

/* The evaluated and the measured query rows of a job that a pass leaves out, as run_job
 * would count them (the row counts cover every job whatever the pass runs). */
static void job_counts(const thr_layer *L, const kvq_profile_params *p, int64_t r0, int64_t n,
                       int64_t *n_rows, int64_t *n_err)
{
    const int64_t P = thr_prompt_len(p->prompt_fraction, n), sample = p->sample_rows;
    int64_t nr = 0;
    for (int64_t t = P; t < n; t++)
        nr += L->qidx[r0 + t] >= 0;
    *n_rows = nr;
    *n_err = p->reference || sample <= 0 || sample >= nr ? nr : sample;
}

#define GRID_MAX_BATCH 8 /* layers open at once, at most */

/* The jobs a pass runs in each layer (the same in every layer). */
static int64_t per_layer_jobs(const kvq_capture_info *ci, const grid_jobs *gj)
{
    const int64_t n_kv = ci->model.n_kv_heads;
    int64_t n = 0;
    for (int64_t jb = 0; jb < ci->n_sequences * n_kv && ci->n_files > 0; jb++)
        n += ci->sequences[2 * (jb / n_kv) + 1] >= 2 && thr_jobs_run(gj->J, 0, jb, gj->want);
    return n;
}

static kvq_status grid_run(const kvq_capture_info *ci, const kvq_profile_params *p,
                           const thr_grid *G, const char *what, const grid_jobs *gj,
                           thr_acc *total, int64_t *n_rows, int64_t *n_err, int64_t *n_thin,
                           kvq_err *err)
{
    const int64_t n_set = G->n_lk + G->n_pt, n_kv = ci->model.n_kv_heads;
    const int64_t n_jobs = ci->n_sequences * n_kv;
    const grid_sums sums = {n_jobs, n_kv, n_set, total, n_rows, n_err, n_thin,
                            gj->record ? gj->J : NULL};
    /* one layer's record: acc [n_jobs, n_set], then rows [n_jobs, 2] */
    const size_t rec_bytes = sizeof(thr_acc) * (size_t)(n_jobs * n_set) +
                             sizeof(int64_t) * (size_t)(2 * n_jobs);
    thr_split sp;
    kvq_status s = thr_split_begin(&sp, p, what, ci->n_files, rec_bytes, err);
    /* layers run B at a time, their jobs in one parallel loop, when one layer has fewer
     * jobs to run than threads (a job sample: a third of them); added in layer order */
    const int64_t per = per_layer_jobs(ci, gj);
    int64_t B = per > 0 ? (p->threads + per - 1) / per : 1;
    B = B < 1 ? 1 : B > GRID_MAX_BATCH ? GRID_MAX_BATCH : B;
    uint8_t *own = malloc(rec_bytes ? rec_bytes * (size_t)B : 1);
    kvq_status *st = calloc((size_t)(n_jobs > 0 ? n_jobs * B : 1), sizeof *st);
    kvq_err *errs = calloc((size_t)(n_jobs > 0 ? n_jobs * B : 1), sizeof *errs);
    thr_layer *L = calloc((size_t)B, sizeof *L);
    thr_rope_tab *T = calloc((size_t)B, sizeof *T);
    uint8_t **rec = calloc((size_t)B, sizeof *rec);
    if (!s && (!own || !st || !errs || !L || !T || !rec))
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    /* one SGEMM thread per job: the jobs are the parallelism, and the sums do not depend
     * on how many there are */
    const int blas_prev = openblas_get_num_threads();
    openblas_set_num_threads(1);
    for (int32_t f0 = sp.first, n_done = 0; f0 < sp.end && !s; f0 += (int32_t)B) {
        const int64_t nb = sp.end - f0 < B ? sp.end - f0 : B;
        int64_t opened = 0;
        for (; opened < nb && !s; opened++) {
            const int32_t f = f0 + (int32_t)opened;
            if ((s = thr_layer_open(ci, f, &L[opened], err)))
                break;
            if ((s = thr_rope_tab_make(ci, &L[opened], p->threads, &T[opened], err))) {
                thr_layer_close(&L[opened]);
                break;
            }
            rec[opened] = sp.d ? thr_split_rec(&sp, f) : own + rec_bytes * (size_t)opened;
            memset(rec[opened], 0, rec_bytes);
        }
        if (!s) {
#pragma omp parallel for num_threads(p->threads) schedule(dynamic, 1)
            for (int64_t i = 0; i < nb * n_jobs; i++) {
                const int64_t b = i / n_jobs, jb = i % n_jobs, q = jb / n_kv;
                const int64_t r0 = ci->sequences[2 * q], n = ci->sequences[2 * q + 1];
                const int32_t f = f0 + (int32_t)b;
                thr_acc *acc = (thr_acc *)rec[b];
                int64_t *rows = (int64_t *)(acc + n_jobs * n_set);
                const int runs = n >= 2 && thr_jobs_run(gj->J, f, jb, gj->want);
                if (n >= 2 && !runs)
                    job_counts(&L[b], p, r0, n, &rows[2 * jb], &rows[2 * jb + 1]);
                st[i] = !runs ? KVQ_OK
                              : run_job(ci, &L[b], &T[b], p, G, r0, n, (int32_t)(jb % n_kv),
                                        acc + jb * n_set, &rows[2 * jb], &rows[2 * jb + 1],
                                        &errs[i]);
            }
        }
        for (int64_t b = 0; b < opened; b++) {
            thr_layer_close(&L[b]);
            free(T[b].cs);
            T[b].cs = NULL;
        }
        for (int64_t i = 0; i < nb * n_jobs && !s; i++) {
            if (st[i]) {
                s = st[i];
                if (err)
                    *err = errs[i];
            }
        }
        for (int64_t b = 0; b < nb && !s; b++) {
            if (!sp.d) /* one process adds now; a split pass on rank 0 after the gather */
                grid_add_layer((void *)&sums, f0 + (int32_t)b, rec[b]);
            if (kvq_progress(&p->cb, what, thr_split_progress(&sp, ++n_done),
                             (uint64_t)ci->n_files))
                s = kvq_err_set(err, KVQ_E_CANCELLED, "profile: cancelled");
        }
    }
    openblas_set_num_threads(blas_prev);
    s = thr_split_end(&sp, s, grid_add_layer, (void *)&sums, err);
    free(own);
    free(st);
    free(errs);
    free(L);
    free(T);
    free(rec);
    return s;
}

/* ==========================================================================
 * Sampling and the settings measured again on every row
 * ========================================================================== */

#define REFINE_Z 4.0 /* a setting is ambiguous when the tolerance lies within 4 standard
                        errors of its sampled error */

void thr_acc_interval(const thr_acc *a, double *mean, double *se)
{
    kvq_eval_sample_interval(a->err_sum, a->err_sq, a->err_n, mean, se); /* the harness's */
}

/* The settings of one table [lo, hi) of total whose choice the sample cannot settle:
 * ambiguous ones (the tolerance within REFINE_Z standard errors) that use no more memory
 * than the least-memory setting surely within tolerance; when none can be within
 * tolerance, those that may have the least error. mem(c) gives a setting's memory. */
void thr_mark_refine(const thr_acc *total, int64_t lo, int64_t hi, double tol, uint8_t *mark)
{
    thr_mark_refine_below(total, lo, hi, tol, INFINITY, mark);
}

/* Settings whose memory is not below max_mem are never chosen (select_row's max_cost):
 * never marked, and no part of the rule. */
void thr_mark_refine_below(const thr_acc *total, int64_t lo, int64_t hi, double tol,
                           double max_mem, uint8_t *mark)
{
    double best_mem = INFINITY, best_hi = INFINITY;
    int any_in = 0;
    for (int64_t c = lo; c < hi; c++) {
        double m, se;
        thr_acc_interval(&total[c], &m, &se);
        const double mem = total[c].mem.bytes / total[c].mem.bytes_f16;
        if (!(mem < max_mem))
            continue;
        if (m + REFINE_Z * se <= tol && mem < best_mem)
            best_mem = mem;
        any_in |= m - REFINE_Z * se <= tol;
        best_hi = m + REFINE_Z * se < best_hi ? m + REFINE_Z * se : best_hi;
    }
    for (int64_t c = lo; c < hi; c++) {
        double m, se;
        thr_acc_interval(&total[c], &m, &se);
        const double mem = total[c].mem.bytes / total[c].mem.bytes_f16;
        if (!(mem < max_mem))
            mark[c] = 0;
        else if (any_in)
            mark[c] = m - REFINE_Z * se <= tol && m + REFINE_Z * se > tol && mem <= best_mem;
        else
            mark[c] = m - REFINE_Z * se <= best_hi;
    }
    if (!any_in) /* the best is kept: one candidate (or duplicates of it) settles it */
        thr_unmark_single(total, lo, hi, mark);
}

/* Equal figures: duplicate settings (the same classes everywhere, lk_duplicate). */
static int same_figures(const thr_acc *a, const thr_acc *b)
{
    return a->err_sum == b->err_sum && a->err_sq == b->err_sq && a->err_n == b->err_n &&
           a->mem.bytes == b->mem.bytes && a->mem.bytes_f16 == b->mem.bytes_f16;
}

void thr_unmark_single(const thr_acc *total, int64_t lo, int64_t hi, uint8_t *mark)
{
    int64_t first = -1;
    for (int64_t c = lo; c < hi; c++)
        if (mark[c]) {
            if (first < 0)
                first = c;
            else if (!same_figures(&total[c], &total[first]))
                return;
        }
    for (int64_t c = lo; c < hi; c++)
        mark[c] = 0;
}

/* The settings of G that mark holds, as a grid of their own (no thin PATS settings:
 * never marked). */
static kvq_status sub_grid(const thr_grid *G, const uint8_t *mark, thr_grid *sub, kvq_err *err)
{
    memset(sub, 0, sizeof *sub);
    sub->lk = malloc(sizeof *sub->lk * (size_t)(G->n_lk ? G->n_lk : 1));
    sub->pt = malloc(sizeof *sub->pt * (size_t)(G->n_pt ? G->n_pt : 1));
    if (!sub->lk || !sub->pt)
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    for (int64_t c = 0; c < G->n_lk; c++)
        if (mark[c])
            sub->lk[sub->n_lk++] = G->lk[c];
    for (int64_t c = 0; c < G->n_pt; c++)
        if (mark[G->n_lk + c])
            sub->pt[sub->n_pt++] = G->pt[c];
    return KVQ_OK;
}

/* Adds the sums part [sub's settings] of the marked settings of G into total: the errors,
 * and with mem the memory too. */
static void add_marked(const thr_grid *G, const uint8_t *mark, const thr_grid *sub,
                       const thr_acc *part, int mem, thr_acc *total)
{
    for (int64_t c = 0, i = 0, k = 0; c < G->n_lk + G->n_pt; c++) {
        if (!mark[c])
            continue;
        const thr_acc *a = c < G->n_lk ? &part[i++] : &part[sub->n_lk + k++];
        if (mem) {
            acc_add(&total[c], a);
            continue;
        }
        total[c].err_sum += a->err_sum;
        total[c].err_sq += a->err_sq;
        total[c].err_n += a->err_n;
    }
}

/* After the job sample's pass: the settings that may be within tolerance or may have
 * the least error (thr_jobs_mark) run on the other jobs, their sums into total; the
 * others keep the sample's, and their interval over jobs (95% half-width) goes to
 * job_ci [n_set] (NaN for the settings measured on every job). */
static kvq_status other_jobs(const kvq_capture_info *ci, const kvq_profile_params *p,
                             const thr_grid *G, double tol, thr_jobs *J, thr_acc *total,
                             double *job_ci, kvq_err *err)
{
    const int64_t n_set = G->n_lk + G->n_pt;
    uint8_t *mark = calloc((size_t)n_set, 1);
    thr_acc *part = calloc((size_t)n_set, sizeof *part);
    thr_grid sub = {0};
    kvq_status s = mark && part ? KVQ_OK : kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    if (!s) {
        thr_jobs_mark(J, total, 0, G->n_lk, tol, INFINITY, 0, mark);
        thr_jobs_mark(J, total, G->n_lk, n_set, tol, THR_PATS_MAX_MEMORY, 0, mark);
        for (int64_t c = 0; c < n_set; c++) {
            double m, se;
            thr_jobs_interval(J, c, &m, &se);
            job_ci[c] = mark[c] ? NAN : 1.96 * se;
        }
        s = sub_grid(G, mark, &sub, err);
    }
    s = kvq_dist_agree(p->dist, s, err); /* split by layers: all ranks go on, or none */
    if (!s && sub.n_lk + sub.n_pt > 0) {
        kvq_log(&p->cb, KVQ_LOG_INFO,
                "profile: %lld LeanKV and %lld PATS settings may be within the tolerance or "
                "the best: measured on the %lld other jobs of each layer",
                (long long)sub.n_lk, (long long)sub.n_pt, (long long)(J->n_elig - J->n_in));
        const grid_jobs rest = {J, 0, 0};
        int64_t nr = 0, ne = 0;
        if (!(s = grid_run(ci, p, &sub, "profile: leankv/pats, other jobs", &rest, part, &nr, &ne,
                           NULL, err)))
            add_marked(G, mark, &sub, part, 1, total);
    }
    free(mark);
    free(part);
    free(sub.lk);
    free(sub.pt);
    return s;
}

/* The settings (measured on every job) whose choice the sampled rows leave open,
 * measured on the rows the sample left out (refined[c] = 1). */
static kvq_status every_row(const kvq_capture_info *ci, const kvq_profile_params *p,
                            const thr_grid *G, double tol, const double *job_ci, thr_acc *total,
                            uint8_t *refined, kvq_err *err)
{
    const int64_t n_set = G->n_lk + G->n_pt;
    uint8_t *mark = calloc((size_t)n_set, 1);
    thr_acc *part = calloc((size_t)n_set, sizeof *part);
    thr_acc *cand = malloc(sizeof *cand * (size_t)n_set);
    thr_grid sub = {0};
    kvq_status s = mark && part && cand ? KVQ_OK
                                        : kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    if (!s) {
        /* the settings left on the job sample take no part (no error: never marked) */
        for (int64_t c = 0; c < n_set; c++) {
            cand[c] = total[c];
            if (!isnan(job_ci[c]))
                cand[c].err_sum = cand[c].err_sq = cand[c].err_n = 0;
        }
        thr_mark_refine(cand, 0, G->n_lk, tol, mark);
        thr_mark_refine_below(cand, G->n_lk, n_set, tol, THR_PATS_MAX_MEMORY, mark);
        s = sub_grid(G, mark, &sub, err);
    }
    /* split by layers: all ranks go on, or none */
    if ((s = kvq_dist_agree(p->dist, s, err)) || sub.n_lk + sub.n_pt == 0)
        goto done;
    kvq_log(&p->cb, KVQ_LOG_INFO, "profile: %lld LeanKV and %lld PATS settings near the tolerance: "
            "measured on every row", (long long)sub.n_lk, (long long)sub.n_pt);
    /* the rows the sample left out: with the sample's sums, every row */
    kvq_profile_params all = *p;
    all.sample_rows = -p->sample_rows;
    int64_t nr = 0, ne = 0;
    if ((s = thr_grid_run(ci, &all, &sub, "profile: every row", part, &nr, &ne, err)))
        goto done;
    add_marked(G, mark, &sub, part, 0, total);
    for (int64_t c = 0; c < n_set; c++)
        refined[c] = mark[c];
done:
    free(mark);
    free(part);
    free(cand);
    free(sub.lk);
    free(sub.pt);
    return s;
}

kvq_status thr_grid_profile(const kvq_capture_info *ci, const kvq_profile_params *p,
                            const thr_grid *G, double tol, int refine, thr_grid_out *o,
                            kvq_err *err)
{
    const int64_t n_set = G->n_lk + G->n_pt;
    thr_jobs J = {0};
    o->n_rows = o->n_err = o->n_thin = 0;
    memset(o->refined, 0, (size_t)n_set);
    for (int64_t c = 0; c < n_set; c++)
        o->job_ci[c] = NAN;
    /* the job sample: with the row sample only (the reference and every row run every
     * job), and only where the choice is made against the tolerance here (refine) */
    const double frac = refine && !p->reference && p->sample_rows > 0 ? p->sample_jobs : 1.0;
    kvq_status s = thr_jobs_plan(ci, frac, ci->model.n_kv_heads, n_set, &J, err);
    o->n_jobs = J.n_elig * ci->n_files;
    o->n_jobs_in = J.on ? J.n_in * ci->n_files : o->n_jobs;
    const grid_jobs first = {&J, J.on ? 1 : -1, 1};
    if (!s)
        s = grid_run(ci, p, G, J.on ? "profile: leankv/pats, job sample" : "profile: leankv/pats",
                     &first, o->total, &o->n_rows, &o->n_err, &o->n_thin, err);
    /* split by layers: rank 0 holds the totals and the sampled jobs' sums; every rank
     * needs them to choose the same settings to measure again */
    const size_t cells = (size_t)J.n_files * (size_t)J.n_jobs * (size_t)n_set;
    if (!s && kvq_dist_size(p->dist) > 1 &&
        (!(s = kvq_dist_bcast(p->dist, o->total, sizeof *o->total * (size_t)n_set, err)) &&
         !(s = kvq_dist_bcast(p->dist, &o->n_rows, sizeof o->n_rows, err)) &&
         !(s = kvq_dist_bcast(p->dist, &o->n_thin, sizeof o->n_thin, err)) &&
         !(s = kvq_dist_bcast(p->dist, &o->n_err, sizeof o->n_err, err))) && J.on &&
        !(s = kvq_dist_bcast(p->dist, J.y, sizeof *J.y * cells, err)))
        s = kvq_dist_bcast(p->dist, J.x, sizeof *J.x * cells, err);
    if (s) /* the split pass and the broadcasts agree on their status */
        goto done;
    if (J.on && (s = other_jobs(ci, p, G, tol, &J, o->total, o->job_ci, err)))
        goto done;
    if (refine && !p->reference && o->n_err != o->n_rows)
        s = every_row(ci, p, G, tol, o->job_ci, o->total, o->refined, err);
done:
    thr_jobs_free(&J);
    return s;
}
