/*
 * thresholds/thresholds_internal.h — what the files of thresholds/ share: the
 * per-(layer, KV head) cache simulator behind both quality measurements (the capture error and the
 * kvq_simcache backend), the capture layer reader, and the perplexity driver.
 * Not a public header.
 */
#ifndef KVQ_THRESHOLDS_INTERNAL_H
#define KVQ_THRESHOLDS_INTERNAL_H

#include "kvq/thresholds.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ==========================================================================
 * Attention over a cache (double accumulation)
 * ========================================================================== */

/* out[g] = sum_j p_g(j) V_j with p_g = softmax_j(q_g . K_j / sqrt(d)) over the rows j in
 * [0, n) whose cls[j] != KVQ_LEANKV_PRUNED (cls NULL: every row). p receives the
 * probabilities [gs, n] (0 for skipped rows). A query that sees no row gets out = 0.
 *   q: [gs, d]  K, V: [n, d]  out: [gs, d] (may be NULL)  p: [gs, n] */
void thr_attend(const float *q, int32_t gs, int32_t d, const float *K, const float *V,
                int64_t n, const uint8_t *cls, double *p, float *out);

/* ==========================================================================
 * One (layer, KV head) of a simulated compressed cache
 * ========================================================================== */

typedef struct thr_head {
    kvq_simcache_kind kind;
    kvq_leankv_params lk;
    kvq_pats_params pt;
    int32_t d, gs;
    int64_t n, cap;
    int64_t seq_len;      /* PATS T (0 = the tokens seen so far) */
    int64_t prompt_len;   /* LeanKV P */
    int classified;       /* LeanKV: the prompt rule has run */
    float *k, *v;         /* [cap, d] exact post-RoPE keys, values (LeanKV) */
    float *kc, *vc;       /* [cap, d] the cache's rows: dequantized (LeanKV), truncated
                             (PATS) */
    uint8_t *cls;         /* [cap] LeanKV classes */
    double *acc;          /* [cap, gs] attention received from later queries, per head */
    int64_t *qcum;        /* [cap] queries seen at rows <= j */
    int64_t nq;           /* queries seen */
    double *sig;          /* [cap] scratch */
    double *p;            /* [gs, cap] scratch probabilities */
    double pats_bytes;    /* PATS packed bytes and unpacked bits of the rows so far */
    double pats_bits;
} thr_head;

/* Zeroed head of the given kind and shape (lk / pt copied; either may be NULL when not
 * used). No allocation until the first push. */
void thr_head_init(thr_head *h, kvq_simcache_kind kind, const kvq_leankv_params *lk,
                   const kvq_pats_params *pt, int32_t d, int32_t gs);
void thr_head_free(thr_head *h);
/* Starts a sequence (keeps the buffers). */
void thr_head_begin(thr_head *h, int64_t seq_len, int64_t prompt_len);
/* Appends token n: post-RoPE key and value [d]; q [gs, d] post-RoPE queries of the row
 * (NULL: no stored query at this row); out [gs, d] (NULL: not wanted; ignored without
 * q). Errors: KVQ_E_NOMEM, KVQ_E_NUMERIC (LeanKV quantization). */
kvq_status thr_head_push(thr_head *h, const float *k, const float *v, const float *q,
                         float *out, kvq_err *err);
/* dst becomes a copy of src's sequence state (dst must be initialized; its params stay
 * those of src until changed). KVQ_E_NOMEM. */
kvq_status thr_head_copy(thr_head *dst, const thr_head *src, kvq_err *err);
/* Adds this head's cache memory to m (LeanKV: runs the prompt rule first if the
 * sequence never left the prompt). Errors: KVQ_E_NUMERIC. */
kvq_status thr_head_memory(thr_head *h, kvq_simcache_memory *m, kvq_err *err);

/* LeanKV internals used by thr_head (leankv.c). */
kvq_status thr_leankv_finish_prompt(thr_head *h, kvq_err *err);
kvq_status thr_leankv_push(thr_head *h, const float *q, float *out, kvq_err *err);
/* The first j < len with cls[j] == sec whose sig[j] is least (ties: the earliest; -1 if
 * none): Algorithm 1's choice. Scalar here; the profile's kernels (lk_kernels.h) equal it. */
typedef int64_t (*thr_argmin_fn)(const double *sig, const uint8_t *cls, uint8_t sec,
                                 int64_t len);
int64_t thr_leankv_argmin_scalar(const double *sig, const uint8_t *cls, uint8_t sec, int64_t len);
/* kvq_leankv_generation_step with that choice made by argmin. */
int64_t thr_leankv_step(const double *sig, int64_t n, const kvq_leankv_params *p, uint8_t *cls,
                        thr_argmin_fn argmin);
/* PATS internals (pats.c). */
void thr_pats_push(thr_head *h, const float *q, float *out);

/* ==========================================================================
 * Capture layer files
 * ========================================================================== */

typedef struct thr_layer {
    kvq_capture_layer f;
    const kvq_tensor_view *k, *v, *q;
    int32_t *pos;         /* [n_tokens] */
    int32_t *qidx;        /* [n_tokens] stored query index of each row, or -1 */
    int64_t n_q;
} thr_layer;

/* Opens file i of the capture with the capture layer reader (kvq_capture_layer_open)
 * and reads k, v (with values), q, pos and q_rows, checked against capture.json.
 * Rows of k, v and q are read with kvq_capture_read_heads. Errors: the reader's. */
kvq_status thr_layer_open(const kvq_capture_info *ci, int32_t i, thr_layer *L, kvq_err *err);
void thr_layer_close(thr_layer *L);
/* pos[row]. */
int64_t thr_layer_pos(const thr_layer *L, int64_t row);

/* The cos and sin of RoPE at the positions of a layer's rows (kvq_rope_cossin), made
 * once for the layer's jobs (profile_grid.c: every KV head and sequence rotates its rows
 * with them): cs [slots, d], the d/2 cosines then the d/2 sines; a slot per position when
 * every position lies in [0, n_tokens) (sequences share them), else a slot per row.
 * Free cs. thr_rope_tab_rotate rotates n vectors of head_dim of row `row` in place:
 * kvq_rope_apply at the row's position, the same bits. */
typedef struct thr_rope_tab {
    float *cs;
    int by_pos;
    const int32_t *pos; /* the layer's positions (thr_layer pos) */
} thr_rope_tab;
kvq_status thr_rope_tab_make(const kvq_capture_info *ci, const thr_layer *L, int threads,
                             thr_rope_tab *T, kvq_err *err);
void thr_rope_tab_rotate(const kvq_capture_info *ci, const thr_rope_tab *T, int64_t row, float *x,
                         int n);

/* The prompt length of a sequence of n tokens: floor(fraction * n), at most n - 1. */
int64_t thr_prompt_len(double fraction, int64_t n);

/* ==========================================================================
 * The LeanKV / PATS grid on a capture (profile.c drives, profile_fast.c computes)
 * ========================================================================== */

/* One setting's sums over jobs: the error of the measured (row, query head) pairs (sum,
 * sum of squares, count) and the cache memory at the end of each sequence. */
typedef struct thr_acc {
    double err_sum, err_sq, err_n;
    kvq_simcache_memory mem;
} thr_acc;

/* Adds, for each of the gs query heads of one row, the relative error
 * ||o - ex|| / ||ex|| (in double; rows with ex = 0 skipped) to a's sums.
 * o, ex: [gs, d]. */
void thr_add_rel_err(const float *o, const float *ex, int32_t gs, int32_t d, thr_acc *a);

/* The grids, flattened: LeanKV settings first, then PATS. */
typedef struct thr_grid {
    int64_t n_lk, n_pt;
    kvq_leankv_params *lk;  /* [n_lk] */
    kvq_pats_params *pt;    /* [n_pt] */
    const uint8_t *pt_thin; /* [n_pt] or NULL: 1 for a PATS setting that saves no memory
                               (never chosen): a sampled pass measures it on the
                               thr_thin_count rows of its sample only */
} thr_grid;

/* Rows a sampled job measures a thin PATS setting on: a quarter of its nm sampled rows
 * (at least one; thr_sample_rows of them), or all nm when they are all nc continuation
 * rows. */
int64_t thr_thin_count(int64_t nm, int64_t nc);

/* The rows of one (sequence, KV head) job: post-RoPE keys, values and queries. */
typedef struct thr_rows {
    int64_t n, P;          /* tokens, prompt length */
    int32_t d, gs;
    const float *k, *v;    /* [n, d] */
    const float *q;        /* [n, gs, d] (rows without a query: unused) */
    const uint8_t *has_q;  /* [n] */
} thr_rows;

/* The fast path of one job: every setting of G on the rows R, with the error measured
 * on `sample` evenly spaced continuation query rows (0: all; < 0: every row but the
 * -sample that a sample of -sample measures, thr_sample_complement). acc [n_lk + n_pt] gets
 * the job's sums; *n_err the (row) count measured. Exact attention once (SGEMM), the
 * LeanKV settings from shared logits of the three versions a token can have in the
 * cache, PATS on the measured rows only. Errors: KVQ_E_NOMEM, KVQ_E_NUMERIC. */
kvq_status thr_fast_job(const thr_rows *R, const thr_grid *G, int64_t sample, thr_acc *acc,
                        int64_t *n_err, kvq_err *err);

/* Every layer of the capture through the grid G (p->reference: the reference path,
 * else the fast one with p->sample_rows, as thr_fast_job's sample), the sums into total [n_lk + n_pt] (added to),
 * the evaluated and the measured query rows into *n_rows and *n_err (added to, x
 * layers). Progress under `what`. Errors: the layer reader's, the jobs', CANCELLED. */
kvq_status thr_grid_run(const kvq_capture_info *ci, const kvq_profile_params *p, const thr_grid *G,
                        const char *what, thr_acc *total, int64_t *n_rows, int64_t *n_err,
                        kvq_err *err);

/* What thr_grid_profile measured. The caller gives the arrays, [n_lk + n_pt] each. */
typedef struct thr_grid_out {
    thr_acc *total;    /* the settings' sums (added to) */
    uint8_t *refined;  /* 1: measured on every row (the sample's sums plus the rest) */
    double *job_ci;    /* 95% half-width over jobs of a setting left on the job sample
                          (its figures are the sampled jobs'); NaN: every job */
    int64_t n_rows, n_err; /* evaluated and measured query rows, x layers (every job) */
    int64_t n_thin;    /* the rows the thin PATS settings were measured on (G->pt_thin) */
    int64_t n_jobs, n_jobs_in; /* (layer, sequence, KV head) jobs; in the job sample (all
                                  of them when there is none) */
} thr_grid_out;

/* The grid as the profile runs it: with refine (the choice is made here against `tol`),
 * the row sample (p->sample_rows) and enough jobs, first every setting on a sample of
 * each layer's jobs (p->sample_jobs; thr_jobs_plan), then the settings that may be
 * within tolerance or the best (thr_jobs_mark) on the other jobs; without it every job.
 * Then (refine, a row sample) the settings measured on every job whose sampled error
 * leaves the choice open (thr_mark_refine) on the rows the sample left out. Arguments
 * and errors as thr_grid_run. */
kvq_status thr_grid_profile(const kvq_capture_info *ci, const kvq_profile_params *p,
                            const thr_grid *G, double tol, int refine, thr_grid_out *o,
                            kvq_err *err);

/* The job sample of the grid (profile_jobs.c): in each layer, n_in of its n_elig
 * eligible (sequence, KV head) jobs, drawn by a fixed seed; on = 0: every job (the
 * fraction is 1, or the sample would be too small: fewer than 2 jobs a layer, or fewer
 * than 20 in all, or no job left out). y, x: the sampled jobs' error sums and counts per
 * setting, as the first pass recorded them. */
typedef struct thr_jobs {
    int on;
    int32_t n_files;
    int64_t n_jobs, n_set; /* jobs per layer (sequences x KV heads), settings */
    int64_t n_elig, n_in;  /* per layer: jobs with a sequence of 2 or more tokens; sampled */
    uint8_t *in;           /* [n_files, n_jobs] 1: in the sample */
    double *y, *x;         /* [n_files, n_jobs, n_set] */
} thr_jobs;

/* Draws the sample of `fraction` of each layer's jobs, per_seq jobs per sequence (the
 * grid: its KV heads; the budget pass: 1), for n_set settings. KVQ_E_NOMEM. */
kvq_status thr_jobs_plan(const kvq_capture_info *ci, double fraction, int64_t per_seq,
                         int64_t n_set, thr_jobs *J, kvq_err *err);
void thr_jobs_free(thr_jobs *J);
/* 1 when a pass runs job jb of layer f: want 1 the sampled jobs, 0 the others, -1 every
 * job (J NULL or off: every job for want != 0, none for want 0). */
int thr_jobs_run(const thr_jobs *J, int32_t f, int64_t jb, int want);
/* Keeps a sampled job's sums acc [n_set] (nothing for other jobs, or J NULL or off). */
void thr_jobs_record(thr_jobs *J, int32_t f, int64_t jb, const thr_acc *acc);
/* Keeps one setting c's error sum y and count x of sampled job jb of layer f (J NULL or
 * off, or another job: nothing). */
void thr_jobs_put(thr_jobs *J, int32_t f, int64_t jb, int64_t c, double y, double x);
/* Setting c's error over the sampled jobs and its stratified standard error over jobs
 * (the formula is in profile_jobs.c); NaN without a measured row. */
void thr_jobs_interval(const thr_jobs *J, int64_t c, double *mean, double *se);
/* R_c - R_b over the sampled jobs (paired: the same jobs) and its standard error. */
void thr_jobs_diff(const thr_jobs *J, int64_t c, int64_t b, double *mean, double *se);
/* Marks the settings of [lo, hi) to measure on the other jobs: those (with memory below
 * max_mem) that may be within tolerance tol or may have the least error, by 4 standard
 * errors of thr_jobs_interval (paired: the least error by the paired difference to the
 * best sampled setting, thr_jobs_diff); when none may be within tolerance and the
 * possible best are one setting, none (thr_unmark_single). */
void thr_jobs_mark(const thr_jobs *J, const thr_acc *total, int64_t lo, int64_t hi, double tol,
                   double max_mem, int paired, uint8_t *mark);

/* Mean and standard error of a setting's measured errors (NaN without any). */
void thr_acc_interval(const thr_acc *a, double *mean, double *se);
/* Marks (mark[c] = 1, else 0) the settings of one table [lo, hi) of total whose choice
 * against tolerance tol the sampled errors cannot settle: the ambiguous ones (tol within
 * 4 standard errors of the sampled error) using no more memory (mem.bytes /
 * mem.bytes_f16) than the least-memory setting surely within tolerance; when none can
 * be within tolerance, those that may have the least error, unless they are one
 * setting (thr_unmark_single). */
void thr_mark_refine(const thr_acc *total, int64_t lo, int64_t hi, double tol, uint8_t *mark);
/* thr_mark_refine among the settings whose memory is below max_mem only (the others are
 * never chosen, so never measured again): PATS rows that save nothing against the f16
 * cache (THR_PATS_MAX_MEMORY, the selection's limit). */
#define THR_PATS_MAX_MEMORY 1.0
/* PATS settings whose packed memory is within this share of the f16 cache of the least
 * memory within tolerance count as equal: the better quality is chosen among them
 * (docs/decisions/020-profile-pats-ties.md). */
#define THR_PATS_MEMORY_TIE 0.005
/* The profile's choice of a table's row (profile.c): least cost1 (then cost2, quality)
 * within limit on column qcol, then the best quality within tie of that cost; else the
 * best quality. Rows with cost1 >= max_cost are ignored. Sets t->chosen and t->met. */
void thr_select_row(kvq_profile_table *t, int qcol, int cost1, int cost2, double limit,
                    double max_cost, double tie);
void thr_mark_refine_below(const thr_acc *total, int64_t lo, int64_t hi, double tol,
                           double max_mem, uint8_t *mark);
/* Clears the marks of [lo, hi) when the settings marked as possibly the best (none can
 * be within tolerance, so the least error is kept) are one setting or duplicates of it
 * (equal figures): measuring it again on every row cannot change the choice, and its
 * error keeps its sampled interval. */
void thr_unmark_single(const thr_acc *total, int64_t lo, int64_t hi, uint8_t *mark);

/* The measured rows of a sequence: the `sample` evenly spaced ones among the cand
 * [n_cand] (ascending), all of them when sample is 0 or >= n_cand: out [min]. Returns
 * the count. */
int64_t thr_sample_rows(const int64_t *cand, int64_t n_cand, int64_t sample, int64_t *out);
/* The rows of cand that thr_sample_rows(cand, n_cand, sample) leaves out, ascending
 * (none when sample is 0 or >= n_cand): out [n_cand]. Returns the count. */
int64_t thr_sample_complement(const int64_t *cand, int64_t n_cand, int64_t sample, int64_t *out);

/* ==========================================================================
 * Several ranks: layers split, per-layer records gathered (profile_dist.c)
 * ========================================================================== */

/* A pass over the capture's layer files on p->dist's ranks: each rank runs a balanced
 * contiguous share of the layers (every layer costs the same: the same sequences and
 * heads), keeps one record of rec_bytes per layer it ran (what one process would have
 * added to its totals after that layer), and rank 0 gathers them and replays them in
 * layer order, so it performs the additions of one process in the same order. */
typedef struct thr_split {
    const kvq_dist *d;        /* NULL or size 1: one process, every layer, no records */
    int32_t n_files, first, end; /* this rank's layer files [first, end) */
    size_t rec_bytes;
    uint8_t *recs;            /* [end - first, rec_bytes] */
} thr_split;

/* Starts a pass over n_files layers (logs the split under `what` on rank 0).
 * KVQ_E_NOMEM. */
kvq_status thr_split_begin(thr_split *sp, const kvq_profile_params *p, const char *what,
                           int32_t n_files, size_t rec_bytes, kvq_err *err);
/* 1 when this process runs layer file f. */
int thr_split_mine(const thr_split *sp, int32_t f);
/* The record slot of layer f (one of this rank's). */
uint8_t *thr_split_rec(thr_split *sp, int32_t f);
/* The progress after `done` of this rank's layers, as the whole pass's (kvq_dist_progress). */
uint64_t thr_split_progress(const thr_split *sp, int32_t done);
/* Collective, with this rank's status st: gathers every rank's records to rank 0, which
 * calls replay(user, f, record) for f = 0 .. n_files-1 in order; every rank returns the
 * agreed status (kvq_dist_agree: "rank R of N: ..."). Frees the records. */
kvq_status thr_split_end(thr_split *sp, kvq_status st,
                         void (*replay)(void *user, int32_t f, const uint8_t *rec), void *user,
                         kvq_err *err);

/* ==========================================================================
 * Perplexity driver (profile.c)
 * ========================================================================== */

typedef struct thr_ppl thr_ppl;
/* Perplexity over positions P .. n-2 of every held-out sequence with `backend` (NULL:
 * full attention). `begin` (may be NULL) is called after each sequence reset with
 * (user, n, P). */
kvq_status thr_ppl_eval(thr_ppl *e, const kvq_attn_backend *backend,
                        void (*begin)(void *user, int64_t n, int64_t P), void *user,
                        double *ppl, kvq_err *err);
const kvq_model_config *thr_ppl_config(const thr_ppl *e);

/* ==========================================================================
 * Budget profile (budget.c)
 * ========================================================================== */

/* Fills the budget and mass tables (those whose knob is set in p->knobs) from the
 * capture with the runtime opened on artifact_path; ppl (may be NULL) adds perplexity.
 * The error is measured on p->sample_rows rows per sequence (thr_sample_rows); with
 * tol >= 0, first on the job sample (p->sample_jobs of each layer's sequences,
 * thr_jobs_plan), the settings that may be within it or the best then on the other
 * sequences, and the settings whose choice the row sample leaves open (thr_mark_refine)
 * again on every row. *n_jobs, *n_jobs_in: its (layer, sequence) jobs, and those of the
 * job sample (all of them without one). p->reference: every row of every sequence by
 * retrieval in one chunk (prefill_full = 0), as before the sampled path.
 * A knob that cannot run gets its `skipped` reason and KVQ_OK. */
kvq_status thr_budget_profile(const kvq_capture_info *ci, const char *artifact_path,
                              const kvq_profile_params *p, double tol, thr_ppl *ppl,
                              kvq_profile_table *budget, kvq_profile_table *mass,
                              int64_t *n_jobs, int64_t *n_jobs_in, kvq_err *err);

/* Allocates t->rows for n rows (NaN-filled) and sets the columns. KVQ_E_NOMEM. */
kvq_status thr_table_init(kvq_profile_table *t, const char *name, int32_t n_cols,
                          const char *const *cols, int64_t n_rows, kvq_err *err);

#endif
