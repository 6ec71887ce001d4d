/*
 * profile.c — `kvq profile`: the LeanKV and PATS grids measured on a capture (and,
 * with a model and a corpus, by perplexity), the budget tables (budget.c), the
 * selection of the least memory within tolerance, and kvq_profile_run (the writer of
 * the artifact is profile_write.c).
 * The measurement protocol is the contract in kvq/thresholds.h ("Quality").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvq/corpus.h"
#include "kvq/perplexity.h"
#include "kvq/tokenizer.h"
#include "kvq/util.h"
#include "thresholds/thresholds_internal.h"

/* ==========================================================================
 * Parameters, tables, results
 * ========================================================================== */

static const double default_alpha_h[] = {0, 1, 2, 3, 4, 5};
static const double default_alpha_l[] = {0, 0.02, 0.04, 0.06, 0.08, 0.1};

static const char *const leankv_cols[KVQ_PL_NCOLS] = {"alpha_h", "alpha_l", "memory", "high",
                                                      "low", "pruned", "err", "ppl"};
static const char *const pats_cols[KVQ_PP_NCOLS] = {"schedule", "b_min", "b_max", "memory",
                                                    "bits", "err", "ppl"};
static const char *const budget_cols[KVQ_PB_NCOLS] = {"fraction", "attended", "mass", "err",
                                                      "ppl"};
static const char *const mass_cols[KVQ_PB_NCOLS] = {"tau", "attended", "mass", "err", "ppl"};

kvq_profile_params kvq_profile_params_default(void)
{
    kvq_profile_params p;
    memset(&p, 0, sizeof p);
    p.knobs = KVQ_KNOB_ALL;
    p.tolerance = -1;
    p.prompt_fraction = 0.5;
    p.leankv = kvq_leankv_params_default();
    p.pats_b_min = 2;
    p.pats_dtype = KVQ_DT_F16;
    p.retrieval = kvq_retrieval_params_default();
    p.ppl_max_tokens = 4096;
    p.threads = 1;
    p.sample_rows = 32;
    p.sample_jobs = 1.0 / 3.0;
    return p;
}

kvq_status thr_table_init(kvq_profile_table *t, const char *name, int32_t n_cols,
                          const char *const *cols, int64_t n_rows, kvq_err *err)
{
    t->name = name;
    t->n_cols = n_cols;
    for (int32_t c = 0; c < n_cols; c++)
        t->cols[c] = cols[c];
    t->n_rows = n_rows;
    t->chosen = -1;
    t->met = 0;
    free(t->rows);
    free(t->err_ci);
    free(t->job_sampled);
    t->rows = malloc(sizeof(double) * (size_t)(n_rows > 0 ? n_rows : 1) * (size_t)n_cols);
    t->err_ci = malloc(sizeof(double) * (size_t)(n_rows > 0 ? n_rows : 1));
    t->job_sampled = calloc((size_t)(n_rows > 0 ? n_rows : 1), 1);
    if (!t->rows || !t->err_ci || !t->job_sampled)
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    for (int64_t i = 0; i < n_rows * n_cols; i++)
        t->rows[i] = NAN;
    for (int64_t i = 0; i < n_rows; i++)
        t->err_ci[i] = NAN;
    return KVQ_OK;
}

void kvq_profile_result_free(kvq_profile_result *r)
{
    if (!r)
        return;
    for (int i = 0; i < KVQ_PROFILE_N_TABLES; i++) {
        free(r->table[i].rows);
        free(r->table[i].err_ci);
        free(r->table[i].job_sampled);
    }
    free(r);
}

int64_t thr_prompt_len(double fraction, int64_t n)
{
    int64_t P = (int64_t)floor(fraction * (double)n);
    P = P > n - 1 ? n - 1 : P;
    return P < 0 ? 0 : P;
}

/* ==========================================================================
 * Capture layer files
 * ========================================================================== */

void thr_layer_close(thr_layer *L)
{
    kvq_capture_layer_close(&L->f);
    free(L->pos);
    free(L->qidx);
    memset(L, 0, sizeof *L);
}

kvq_status thr_layer_open(const kvq_capture_info *ci, int32_t i, thr_layer *L, kvq_err *err)
{
    kvq_status s;
    int32_t *rows = NULL;
    memset(L, 0, sizeof *L);
    if ((s = kvq_capture_layer_open(ci, i, &L->f, err)) ||
        (s = kvq_capture_layer_tensor(&L->f, "k", &L->k, err)) ||
        (ci->has_values && (s = kvq_capture_layer_tensor(&L->f, "v", &L->v, err))) ||
        (s = kvq_capture_layer_tensor(&L->f, "q", &L->q, err)) ||
        (s = kvq_capture_layer_column(&L->f, "pos", &L->pos, err)) ||
        (s = kvq_capture_layer_column(&L->f, "q_rows", &rows, err)))
        goto done;
    const int64_t nt = ci->n_tokens;
    L->n_q = L->f.n_q;
    L->qidx = malloc(sizeof(int32_t) * (size_t)(nt > 0 ? nt : 1));
    if (!L->qidx) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", L->f.path);
        goto done;
    }
    for (int64_t r = 0; r < nt; r++)
        L->qidx[r] = -1;
    for (int64_t a = 0; a < L->n_q; a++)
        L->qidx[rows[a]] = (int32_t)a;
done:
    if (s)
        thr_layer_close(L);
    free(rows);
    return s;
}

int64_t thr_layer_pos(const thr_layer *L, int64_t row)
{
    return L->pos[row];
}

/* ==========================================================================
 * Perplexity driver
 * ========================================================================== */

struct thr_ppl {
    kvq_model *model;
    kvq_forward *f;
    kvq_seq_set seqs;     /* the corpus's sequences */
    double fraction;
    int32_t chunk, vocab;
    float *logits;        /* [chunk, vocab] */
};

static void ppl_free(thr_ppl *e)
{
    if (!e)
        return;
    kvq_seq_set_free(&e->seqs);
    free(e->logits);
    kvq_forward_free(e->f);
    kvq_model_close(e->model);
    free(e);
}

static kvq_status ppl_open(const kvq_capture_info *ci, const kvq_profile_params *p, thr_ppl **out,
                           kvq_err *err)
{
    kvq_status s;
    kvq_corpus *corpus = NULL;
    thr_ppl *e = calloc(1, sizeof *e);
    *out = NULL;
    if (!e)
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    e->fraction = p->prompt_fraction;
    kvq_model_params mp = kvq_model_params_default();
    mp.cb = p->cb;
    if ((s = kvq_model_open(p->model, &mp, &e->model, err)))
        goto done;
    kvq_model_id id;
    kvq_model_identity(e->model, &id);
    if ((s = kvq_model_id_compare(&ci->model, "capture", &id, p->model, err)))
        goto done;
    const kvq_tokenizer *tok = kvq_model_tokenizer(e->model);
    if (!tok) {
        s = kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: the model has no tokenizer", p->model);
        goto done;
    }
    kvq_corpus_params cp;
    kvq_corpus_params_default(&cp);
    cp.seed = p->corpus_seed;
    if ((s = kvq_corpus_open(p->corpus, &cp, &corpus, err)))
        goto done;
    kvq_seq_params sp;
    kvq_seq_params_default(&sp);
    kvq_seq_params_model_bos(&sp, tok);
    sp.seq_len = p->ppl_seq_len ? p->ppl_seq_len : (uint32_t)ci->seq_len;
    sp.max_tokens = p->ppl_max_tokens;
    if ((s = kvq_seq_set_collect(corpus, tok, &sp, &p->cb, &e->seqs, NULL, err)))
        goto done;
    kvq_forward_params fp = kvq_forward_params_default();
    fp.cb = p->cb;
    fp.max_tokens = sp.seq_len;
    e->chunk = fp.chunk;
    e->vocab = kvq_model_config_get(e->model)->vocab_size;
    e->logits = malloc(sizeof(float) * (size_t)e->chunk * (size_t)e->vocab);
    if (!e->logits) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
        goto done;
    }
    s = kvq_forward_create(e->model, &fp, &e->f, err);
done:
    kvq_corpus_free(corpus);
    if (s)
        ppl_free(e);
    else
        *out = e;
    return s;
}

const kvq_model_config *thr_ppl_config(const thr_ppl *e)
{
    return kvq_model_config_get(e->model);
}

/* The prompt of each sequence (thr_prompt_len), announced to the caller's begin. */
typedef struct ppl_begin_ctx {
    const thr_ppl *e;
    void (*begin)(void *user, int64_t n, int64_t P);
    void *user;
} ppl_begin_ctx;

static int64_t ppl_begin(void *user, int64_t n)
{
    const ppl_begin_ctx *c = user;
    const int64_t P = thr_prompt_len(c->e->fraction, n);
    if (c->begin)
        c->begin(c->user, n, P);
    return P;
}

kvq_status thr_ppl_eval(thr_ppl *e, const kvq_attn_backend *backend,
                        void (*begin)(void *user, int64_t n, int64_t P), void *user,
                        double *ppl, kvq_err *err)
{
    kvq_nll_sum sum = {0};
    ppl_begin_ctx bc = {.e = e, .begin = begin, .user = user};
    kvq_forward_set_attention(e->f, backend);
    kvq_status s = kvq_perplexity_set(e->f, &e->seqs, e->chunk, e->vocab, e->logits, ppl_begin,
                                      &bc, &sum, err);
    kvq_forward_set_attention(e->f, NULL);
    if (!s && sum.n_pred == 0)
        s = kvq_err_set(err, KVQ_E_INVALID_ARG,
                        "profile: the corpus gave no token to predict after the prompt");
    if (!s)
        *ppl = exp(sum.nll / (double)sum.n_pred);
    return s;
}

/* ==========================================================================
 * LeanKV and PATS on the capture: thr_grid_run (profile_grid.c)
 * ========================================================================== */

/* ==========================================================================
 * Perplexity of the LeanKV and PATS grids
 * ========================================================================== */

static void simcache_begin(void *user, int64_t n, int64_t P)
{
    kvq_simcache_begin(user, n, P);
}

static kvq_status ppl_of(thr_ppl *e, kvq_simcache_kind kind, const kvq_leankv_params *lk,
                         const kvq_pats_params *pt, int32_t threads, double *ppl, kvq_err *err)
{
    kvq_simcache *sc = NULL;
    kvq_status s = kvq_simcache_create(thr_ppl_config(e), kind, lk, pt, threads, &sc, err);
    if (!s) {
        const kvq_attn_backend b = kvq_simcache_backend(sc);
        s = thr_ppl_eval(e, &b, simcache_begin, sc, ppl, err);
    }
    kvq_simcache_free(sc);
    return s;
}

/* ==========================================================================
 * Selection
 * ========================================================================== */

/* Picks the least cost (cost1, then cost2 when >= 0, then quality, then index) among
 * rows whose quality is within `limit`; if there is none, the best quality (then
 * cost1). Then, with tie > 0, the best quality among the rows within the limit whose
 * cost1 is within `tie` of that least cost (PATS: docs/decisions/020-profile-pats-ties.md;
 * equal quality: the first of them). Rows with NaN quality, and
 * rows whose cost1 is not below max_cost (a setting that saves nothing), are ignored. */
void thr_select_row(kvq_profile_table *t, int qcol, int cost1, int cost2, double limit,
                    double max_cost, double tie)
{
    int64_t best = -1;
    int met = 0;
    for (int64_t i = 0; i < t->n_rows; i++) {
        const double *r = t->rows + (size_t)i * t->n_cols;
        if (isnan(r[qcol]) || !(r[cost1] < max_cost))
            continue;
        const int in = r[qcol] <= limit;
        if (best < 0 || (in && !met)) {
            best = i;
            met = in;
            continue;
        }
        if (!in && met)
            continue;
        const double *b = t->rows + (size_t)best * t->n_cols;
        int better;
        if (met) /* least cost, then fewer bits (cost2), then better quality */
            better = r[cost1] != b[cost1] ? r[cost1] < b[cost1]
                     : cost2 >= 0 && r[cost2] != b[cost2] ? r[cost2] < b[cost2]
                     : r[qcol] < b[qcol];
        else /* best quality, then least cost */
            better = r[qcol] != b[qcol] ? r[qcol] < b[qcol] : r[cost1] < b[cost1];
        if (better)
            best = i;
    }
    if (met && tie > 0) {
        const double least = t->rows[(size_t)best * t->n_cols + cost1];
        for (int64_t i = 0; i < t->n_rows; i++) {
            const double *r = t->rows + (size_t)i * t->n_cols;
            const double *b = t->rows + (size_t)best * t->n_cols;
            if (!isnan(r[qcol]) && r[cost1] < max_cost && r[qcol] <= limit &&
                r[cost1] <= least + tie && r[qcol] < b[qcol])
                best = i;
        }
    }
    t->chosen = best;
    t->met = met;
}

static void describe_row(const kvq_profile_table *t, int64_t i, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = 0;
    for (int32_t c = 0; c < t->n_cols && at < cap; c++) {
        const double x = t->rows[(size_t)i * t->n_cols + c];
        int k;
        if (!strcmp(t->cols[c], "schedule"))
            k = snprintf(buf + at, cap - at, "%sschedule %s", c ? ", " : "",
                         kvq_pats_schedule_name((kvq_pats_schedule)(int)x));
        else
            k = snprintf(buf + at, cap - at, "%s%s %.4g", c ? ", " : "", t->cols[c], x);
        if (k < 0)
            break;
        at += (size_t)k;
    }
}

static void select_all(kvq_profile_result *r, const kvq_profile_params *p)
{
    static const int qerr[KVQ_PROFILE_N_TABLES] = {KVQ_PL_ERR, KVQ_PP_ERR, KVQ_PB_ERR, KVQ_PB_ERR};
    static const int qppl[KVQ_PROFILE_N_TABLES] = {KVQ_PL_PPL, KVQ_PP_PPL, KVQ_PB_PPL, KVQ_PB_PPL};
    static const int c1[KVQ_PROFILE_N_TABLES] = {KVQ_PL_MEMORY, KVQ_PP_MEMORY, KVQ_PB_VALUE,
                                                 KVQ_PB_ATTENDED};
    static const int c2[KVQ_PROFILE_N_TABLES] = {-1, KVQ_PP_BITS, -1, KVQ_PB_VALUE};
    const double limit = r->metric_ppl ? r->ppl_full * (1 + r->tolerance) : r->tolerance;
    for (int i = 0; i < KVQ_PROFILE_N_TABLES; i++) {
        kvq_profile_table *t = &r->table[i];
        if (!t->rows || t->skipped[0])
            continue;
        /* A PATS row costs at least the f16 cache when d is small (whole 64-byte blocks
         * per row, kvq/thresholds.h): such a row is never chosen. */
        const double max_cost = i == KVQ_PROFILE_PATS ? THR_PATS_MAX_MEMORY : INFINITY;
        thr_select_row(t, r->metric_ppl ? qppl[i] : qerr[i], c1[i], c2[i], limit, max_cost,
                       i == KVQ_PROFILE_PATS ? THR_PATS_MEMORY_TIE : 0);
        if (t->chosen < 0) {
            if (i == KVQ_PROFILE_PATS)
                kvq_log(&p->cb, KVQ_LOG_WARN, "profile: pats: no setting saves memory against "
                        "the f16 cache (a small head dim: packed rows fill whole 64-byte "
                        "blocks); none chosen");
            continue;
        }
        char what[512];
        describe_row(t, t->chosen, what, sizeof what);
        if (t->met)
            kvq_log(&p->cb, KVQ_LOG_INFO, "profile: %s: chose %s", t->name, what);
        else
            kvq_log(&p->cb, KVQ_LOG_WARN,
                    "profile: %s: no setting meets the tolerance (%s <= %.4g); keeping the best "
                    "found: %s", t->name, r->metric_ppl ? "ppl" : "err", limit, what);
    }
}

/* ==========================================================================
 * The stage
 * ========================================================================== */

static kvq_status check_params(const kvq_profile_params *p, kvq_err *err)
{
    kvq_status s;
    if (!(p->prompt_fraction >= 0 && p->prompt_fraction < 1))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "profile: prompt fraction %g is not in [0, 1)",
                           p->prompt_fraction);
    if (!(p->tolerance < 0 || isfinite(p->tolerance)))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "profile: tolerance %g", p->tolerance);
    if (!(p->sample_jobs > 0 && p->sample_jobs <= 1))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "profile: job sample fraction %g is not in "
                           "(0, 1]", p->sample_jobs);
    if (p->threads < 1 || p->threads > 4096)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "profile: threads %d", (int)p->threads);
    if ((s = kvq_leankv_check(&p->leankv, err)))
        return s;
    kvq_pats_params pt = kvq_pats_params_default();
    pt.dtype = p->pats_dtype;
    pt.b_min = pt.b_max = p->pats_b_min;
    if ((p->knobs & KVQ_KNOB_PATS) && (s = kvq_pats_check(&pt, err)))
        return s;
    const struct { const double *v; size_t n; const char *what; double lo; int open_lo; } g[] = {
        {p->alpha_h, p->n_alpha_h, "alpha_h", 0, 0}, {p->alpha_l, p->n_alpha_l, "alpha_l", 0, 0},
        {p->budgets, p->n_budgets, "budget", 0, 1}, {p->taus, p->n_taus, "tau", 0, 1}};
    for (size_t i = 0; i < N_OF(g); i++) {
        if (g[i].v && !g[i].n)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "profile: empty %s grid", g[i].what);
        for (size_t k = 0; g[i].v && k < g[i].n; k++) {
            const double x = g[i].v[k];
            const int bad = !isfinite(x) || x < g[i].lo || (g[i].open_lo && x <= g[i].lo) ||
                            (g[i].open_lo && x > 1);
            if (bad)
                return kvq_err_set(err, KVQ_E_INVALID_ARG, "profile: %s %g is out of range",
                                   g[i].what, x);
        }
    }
    if (p->model && !p->corpus)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "profile: a model needs a corpus for perplexity");
    return KVQ_OK;
}

static kvq_status make_grid(const kvq_profile_params *p, thr_grid *G, kvq_err *err)
{
    const double *ah = p->alpha_h ? p->alpha_h : default_alpha_h;
    const double *al = p->alpha_l ? p->alpha_l : default_alpha_l;
    const size_t nah = p->alpha_h ? p->n_alpha_h : N_OF(default_alpha_h);
    const size_t nal = p->alpha_l ? p->n_alpha_l : N_OF(default_alpha_l);
    memset(G, 0, sizeof *G);
    if (p->knobs & KVQ_KNOB_LEANKV) { /* the pairs the cache accepts: alpha_l <= alpha_h */
        for (size_t a = 0; a < nah; a++)
            for (size_t b = 0; b < nal; b++)
                G->n_lk += al[b] <= ah[a];
        if (!G->n_lk)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "profile: no LeanKV point has alpha_l <= "
                               "alpha_h (alpha_l above alpha_h is refused by the cache)");
    }
    /* PATS: b_max = b_min + 2, + 4, ... up to the mantissa bits (which is always in) */
    const int32_t mant = kvq_pats_mantissa_bits(p->pats_dtype);
    int32_t bmax[16], nb = 0;
    if (p->knobs & KVQ_KNOB_PATS) {
        for (int32_t b = p->pats_b_min + 2; b < mant && nb < 15; b += 2)
            bmax[nb++] = b;
        bmax[nb++] = mant > p->pats_b_min ? mant : p->pats_b_min;
        G->n_pt = (int64_t)KVQ_PATS_N_SCHEDULES * nb;
    }
    G->lk = calloc((size_t)(G->n_lk ? G->n_lk : 1), sizeof *G->lk);
    G->pt = calloc((size_t)(G->n_pt ? G->n_pt : 1), sizeof *G->pt);
    if (!G->lk || !G->pt)
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    for (size_t a = 0, c = 0; c < (size_t)G->n_lk; a++)
        for (size_t b = 0; b < nal; b++) {
            if (al[b] > ah[a])
                continue;
            G->lk[c] = p->leankv;
            G->lk[c].alpha_h = ah[a];
            G->lk[c].alpha_l = al[b];
            c++;
        }
    for (int32_t sc = 0, c = 0; G->n_pt && sc < KVQ_PATS_N_SCHEDULES; sc++)
        for (int32_t b = 0; b < nb; b++, c++) {
            G->pt[c].schedule = (kvq_pats_schedule)sc;
            G->pt[c].b_min = p->pats_b_min;
            G->pt[c].b_max = bmax[b];
            G->pt[c].dtype = p->pats_dtype;
        }
    return KVQ_OK;
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : NAN;
}

/* The capture can be profiled: values, a layer, a sequence of 2 or more tokens
 * (*n_eval of them). */
static kvq_status check_capture(const kvq_capture_info *ci, const char *capture_dir,
                                int64_t *n_eval_out, kvq_err *err)
{
    if (!ci->has_values)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "%s: the capture has no values (--no-values)", capture_dir);
    if (ci->n_files < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: the capture has no layer",
                           capture_dir);
    int64_t n_eval = 0;
    for (int64_t q = 0; q < ci->n_sequences; q++)
        n_eval += ci->sequences[2 * q + 1] >= 2;
    if (n_eval == 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "%s: no sequence of 2 or more tokens to evaluate", capture_dir);
    *n_eval_out = n_eval;
    return KVQ_OK;
}

/* The four tables of r, sized for the grid G. */
static kvq_status init_tables(kvq_profile_result *r, const kvq_profile_params *p,
                              const thr_grid *G_, kvq_err *err)
{
    const thr_grid G = *G_;
    kvq_status s;
    if ((s = thr_table_init(&r->table[KVQ_PROFILE_LEANKV], "leankv", KVQ_PL_NCOLS, leankv_cols,
                            G.n_lk, err)) ||
        (s = thr_table_init(&r->table[KVQ_PROFILE_PATS], "pats", KVQ_PP_NCOLS, pats_cols, G.n_pt,
                            err)) ||
        (s = thr_table_init(&r->table[KVQ_PROFILE_BUDGET], "budget", KVQ_PB_NCOLS, budget_cols, 0,
                            err)) ||
        (s = thr_table_init(&r->table[KVQ_PROFILE_MASS], "mass", KVQ_PB_NCOLS, mass_cols, 0, err)))
        return s;
    if (!(p->knobs & KVQ_KNOB_LEANKV))
        snprintf(r->table[KVQ_PROFILE_LEANKV].skipped, 256, "not asked for");
    if (!(p->knobs & KVQ_KNOB_PATS))
        snprintf(r->table[KVQ_PROFILE_PATS].skipped, 256, "not asked for");
    return KVQ_OK;
}

/* G->pt_thin: the PATS settings whose packed rows take no less than the f16 cache over
 * the capture's sequences (the memory column, computed as the jobs add it up), which
 * select_all never chooses. NULL with no PATS setting or out of memory (then none thin). */
static uint8_t *pats_thin(const kvq_capture_info *ci, const thr_grid *G)
{
    uint8_t *thin = G->n_pt ? calloc((size_t)G->n_pt, 1) : NULL;
    const int32_t d = ci->model.head_dim;
    for (int64_t c = 0; thin && c < G->n_pt; c++) {
        double bytes = 0, f16 = 0;
        for (int64_t q = 0; q < ci->n_sequences; q++) {
            const int64_t n = ci->sequences[2 * q + 1];
            for (int64_t t = 0; n >= 2 && t < n; t++)
                bytes += 2.0 * (double)kvq_pats_row_bytes(d, kvq_pats_bits(&G->pt[c], t + 1, n));
            f16 += n >= 2 ? 4.0 * d * (double)n : 0.0;
        }
        thin[c] = f16 > 0 && !(bytes / f16 < THR_PATS_MAX_MEMORY);
    }
    return thin;
}

/* The 95% half-width of a setting's error: 0 when every evaluated row was measured. */
static double half_width(const thr_acc *a, int all_rows)
{
    double m, se;
    thr_acc_interval(a, &m, &se);
    return all_rows ? (isnan(m) ? NAN : 0.0) : 1.96 * se;
}

/* The LeanKV and PATS rows from what the grid measured (thr_grid_out): the settings
 * left on the job sample take its interval over jobs. */
static void fill_grid_rows(kvq_profile_result *r, const thr_grid *G_, const thr_grid_out *o)
{
    const thr_grid G = *G_;
    const thr_acc *total = o->total;
    const int all = r->n_measured == r->n_queries;
    for (int64_t c = 0; c < G.n_lk + G.n_pt; c++) {
        kvq_profile_table *t = &r->table[c < G.n_lk ? KVQ_PROFILE_LEANKV : KVQ_PROFILE_PATS];
        const int64_t i = c < G.n_lk ? c : c - G.n_lk;
        t->job_sampled[i] = !isnan(o->job_ci[c]);
        t->err_ci[i] = t->job_sampled[i] ? o->job_ci[c] : half_width(&total[c], all || o->refined[c]);
    }
    for (int64_t c = 0; c < G.n_lk; c++) {
        double *row = r->table[KVQ_PROFILE_LEANKV].rows + (size_t)c * KVQ_PL_NCOLS;
        const thr_acc *a = &total[c];
        const double ntok = a->mem.n_high + a->mem.n_low + a->mem.n_pruned;
        row[KVQ_PL_ALPHA_H] = G.lk[c].alpha_h;
        row[KVQ_PL_ALPHA_L] = G.lk[c].alpha_l;
        row[KVQ_PL_MEMORY] = ratio(a->mem.bytes, a->mem.bytes_f16);
        row[KVQ_PL_HIGH] = ratio(a->mem.n_high, ntok);
        row[KVQ_PL_LOW] = ratio(a->mem.n_low, ntok);
        row[KVQ_PL_PRUNED] = ratio(a->mem.n_pruned, ntok);
        row[KVQ_PL_ERR] = ratio(a->err_sum, a->err_n);
    }
    for (int64_t c = 0; c < G.n_pt; c++) {
        double *row = r->table[KVQ_PROFILE_PATS].rows + (size_t)c * KVQ_PP_NCOLS;
        const thr_acc *a = &total[G.n_lk + c];
        row[KVQ_PP_SCHEDULE] = (double)G.pt[c].schedule;
        row[KVQ_PP_B_MIN] = G.pt[c].b_min;
        row[KVQ_PP_B_MAX] = G.pt[c].b_max;
        row[KVQ_PP_MEMORY] = ratio(a->mem.bytes, a->mem.bytes_f16);
        row[KVQ_PP_BITS] = ratio(a->mem.bits, 8.0 * a->mem.bytes_f16);
        row[KVQ_PP_ERR] = ratio(a->err_sum, a->err_n);
    }
}

/* The perplexity column of the LeanKV and PATS rows, and the full-attention one. */
static kvq_status ppl_rows(thr_ppl *ppl, const kvq_profile_params *p, const thr_grid *G_,
                           kvq_profile_result *r, kvq_err *err)
{
    const thr_grid G = *G_;
    const int64_t n_set = G.n_lk + G.n_pt;
    kvq_status s = KVQ_OK;
    if ((s = thr_ppl_eval(ppl, NULL, NULL, NULL, &r->ppl_full, err)))
        return s;
    kvq_log(&p->cb, KVQ_LOG_INFO, "profile: full-attention perplexity %.4f", r->ppl_full);
    for (int64_t c = 0; c < n_set && !s; c++) {
        const int lean = c < G.n_lk;
        double v;
        if ((s = ppl_of(ppl, lean ? KVQ_SIMCACHE_LEANKV : KVQ_SIMCACHE_PATS,
                        lean ? &G.lk[c] : NULL, lean ? NULL : &G.pt[c - G.n_lk], p->threads,
                        &v, err)))
            break;
        if (lean)
            r->table[KVQ_PROFILE_LEANKV].rows[(size_t)c * KVQ_PL_NCOLS + KVQ_PL_PPL] = v;
        else
            r->table[KVQ_PROFILE_PATS].rows[(size_t)(c - G.n_lk) * KVQ_PP_NCOLS + KVQ_PP_PPL] = v;
        if (kvq_progress(&p->cb, "profile: perplexity", (uint64_t)c + 1, (uint64_t)n_set))
            s = kvq_err_set(err, KVQ_E_CANCELLED, "profile: cancelled");
    }
    return s;
}

kvq_status kvq_profile_capture(const char *capture_dir, const char *artifact_path,
                               const kvq_profile_params *p, kvq_profile_result **out,
                               kvq_err *err)
{
    kvq_capture_info *ci = NULL;
    kvq_artifact *art = NULL;
    kvq_profile_result *r = NULL;
    thr_ppl *ppl = NULL;
    thr_grid G = {0};
    thr_grid_out go = {0};
    int64_t n_eval = 0;
    kvq_status s;
    const int rank0 = kvq_dist_rank(p->dist) == 0;
    *out = NULL;
    if ((s = check_params(p, err)) || (s = kvq_capture_info_read(capture_dir, &ci, err)))
        goto setup;
    if (artifact_path) {
        kvq_model_id aid;
        if ((s = kvq_artifact_open(artifact_path, &art, err)) ||
            (s = kvq_model_id_from_meta(kvq_artifact_payload(art), KVQ_META_MODEL_PREFIX, artifact_path, &aid,
                                        err)) ||
            (s = kvq_model_id_compare(&ci->model, capture_dir, &aid, artifact_path, err)))
            goto setup;
    }
    if ((s = check_capture(ci, capture_dir, &n_eval, err)))
        goto setup;
    r = calloc(1, sizeof *r);
    if (!r) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
        goto setup;
    }
    r->ppl_full = NAN;
    r->n_sequences = n_eval;
    if ((s = make_grid(p, &G, err)))
        goto setup;
    if ((s = init_tables(r, p, &G, err)))
        goto setup;
    /* the perplexity runs on rank 0 alone (a forward pass through every layer) */
    if (p->model && rank0 && (s = ppl_open(ci, p, &ppl, err)))
        goto setup;
    r->metric_ppl = p->model != NULL;
    r->tolerance = p->tolerance >= 0 ? p->tolerance : r->metric_ppl ? 0.01 : 0.05;

setup: /* with several ranks, every rank reaches the split passes, or none */
    if ((s = kvq_dist_agree(p->dist, s, err)))
        goto done;
    /* ---- LeanKV and PATS on the capture */
    const int64_t n_set = G.n_lk + G.n_pt;
    go.total = calloc((size_t)(n_set ? n_set : 1), sizeof *go.total);
    go.refined = calloc((size_t)(n_set ? n_set : 1), 1);
    go.job_ci = malloc(sizeof *go.job_ci * (size_t)(n_set ? n_set : 1));
    if (!go.total || !go.refined || !go.job_ci) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
        goto done;
    }
    uint8_t *thin = pats_thin(ci, &G);
    G.pt_thin = thin;
    if (n_set) {
        kvq_log(&p->cb, KVQ_LOG_INFO, "profile: %lld LeanKV and %lld PATS settings on %lld sequences x %d layers",
                (long long)G.n_lk, (long long)G.n_pt, (long long)n_eval, (int)ci->n_files);
        if ((s = thr_grid_profile(ci, p, &G, r->tolerance, !r->metric_ppl, &go, err))) {
            free(thin);
            goto done;
        }
        r->n_queries = go.n_rows;
        r->n_measured = go.n_err;
        r->n_measured_nosave = go.n_thin;
        r->n_jobs = go.n_jobs;
        r->n_jobs_sampled = go.n_jobs_in;
    }
    for (int64_t c = 0; c < G.n_pt && thin; c++)
        r->n_nosave += thin[c];
    free(thin);
    G.pt_thin = NULL;
    fill_grid_rows(r, &G, &go);
    /* ---- perplexity of the same settings (rank 0; the others wait for its status) */
    if (ppl)
        s = ppl_rows(ppl, p, &G, r, err);
    if ((s = kvq_dist_agree(p->dist, s, err)))
        goto done;
    /* ---- retrieval budgets */
    if (p->knobs & (KVQ_KNOB_BUDGET | KVQ_KNOB_MASS)) {
        if (!artifact_path) {
            snprintf(r->table[KVQ_PROFILE_BUDGET].skipped, 256, "no artifact");
            snprintf(r->table[KVQ_PROFILE_MASS].skipped, 256, "no artifact");
        } else if ((s = thr_budget_profile(ci, artifact_path, p,
                                           r->metric_ppl ? -1.0 : r->tolerance, ppl,
                                           &r->table[KVQ_PROFILE_BUDGET],
                                           &r->table[KVQ_PROFILE_MASS], &r->n_seq_jobs,
                                           &r->n_seq_jobs_sampled, err))) {
            goto done;
        }
    }
    if (!(p->knobs & KVQ_KNOB_BUDGET))
        snprintf(r->table[KVQ_PROFILE_BUDGET].skipped, 256, "not asked for");
    if (!(p->knobs & KVQ_KNOB_MASS))
        snprintf(r->table[KVQ_PROFILE_MASS].skipped, 256, "not asked for");
    select_all(r, p);
done:
    free(go.total);
    free(go.refined);
    free(go.job_ci);
    free(G.lk);
    free(G.pt);
    ppl_free(ppl);
    kvq_artifact_close(art);
    kvq_capture_info_free(ci);
    if (s)
        kvq_profile_result_free(r);
    else
        *out = r;
    return s;
}

kvq_status kvq_profile_run(const char *capture_dir, const char *in_path, const char *out_path,
                           int overwrite, const kvq_profile_params *p,
                           kvq_profile_result **out, kvq_err *err)
{
    kvq_profile_result *r = NULL;
    kvq_artifact *in = NULL;
    kvq_status s;
    /* several ranks: rank 0 alone checks and writes the output */
    const int rank0 = kvq_dist_rank(p->dist) == 0;
    if (out)
        *out = NULL;
    s = rank0 ? kvq_output_check(out_path, overwrite, kvq_artifact_is_artifact, "a .kvq artifact",
                                 err)
              : KVQ_OK;
    if ((s = kvq_dist_agree(p->dist, s, err)))
        return s;
    if (!(s = kvq_profile_capture(capture_dir, in_path, p, &r, err)) && rank0 &&
        !(s = kvq_artifact_open(in_path, &in, err)))
        s = kvq_profile_write(in, r, p, out_path, overwrite, err);
    s = kvq_dist_share(p->dist, s, err);
    kvq_artifact_close(in);
    if (!s && out)
        *out = r;
    else
        kvq_profile_result_free(r);
    return s;
}
