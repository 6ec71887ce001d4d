/* calibrate_positions.c — the positions stage of `kvq calibrate` (kvq/calibrate.h):
 * measures, on held-out tokens, what each position mode and codebook scoring query
 * costs in perplexity against exact attention, chooses by kvq_calibrate_choose_positions
 * and writes the artifact again with the choice (KVQ_META_POS_*), which kvq run / eval
 * then use by default.
 *
 * Candidates (kvq_calibrate_position_candidates): `full` under WRoPE (every token,
 * R_b outside the window: the position mode alone), the codebook selector at the
 * default budget under WRoPE with q R_b (a2ats), and under exact RoPE with the rb,
 * mean and bands scoring queries. `full` under RoPE is exact attention itself (cost 0
 * by construction) and is not run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/artifact.h"
#include "kvq/calibrate.h"
#include "kvq/eval.h"
#include "kvq/model.h"
#include "kvq/perplexity.h"
#include "kvq/runtime.h"
#include "kvq/util.h"
#include "pipeline/calibrate_ctx.h"

static const kvq_position_candidate cand_init[KVQ_CALIB_POS_CANDIDATES] = {
    {"full-wrope", KVQ_SELECT_FULL, KVQ_POSITIONS_WROPE, KVQ_SCORE_RB, NAN},
    {"codebook-wrope-rb", KVQ_SELECT_CODEBOOK, KVQ_POSITIONS_WROPE, KVQ_SCORE_RB, NAN},
    {"codebook-rope-rb", KVQ_SELECT_CODEBOOK, KVQ_POSITIONS_ROPE, KVQ_SCORE_RB, NAN},
    {"codebook-rope-mean", KVQ_SELECT_CODEBOOK, KVQ_POSITIONS_ROPE, KVQ_SCORE_MEAN, NAN},
    {"codebook-rope-bands", KVQ_SELECT_CODEBOOK, KVQ_POSITIONS_ROPE, KVQ_SCORE_BANDS, NAN},
};

void kvq_calibrate_position_candidates(kvq_position_candidate out[KVQ_CALIB_POS_CANDIDATES])
{
    memcpy(out, cand_init, sizeof cand_init);
}

/* |ppl / ppl_exact - 1|: how far from exact attention, either way (NaN stays NaN) */
static double cost(double ppl, double ppl_exact) { return fabs(ppl / ppl_exact - 1.0); }

int kvq_calibrate_choose_positions(double ppl_exact, double tol, const kvq_position_candidate *c,
                                   int n)
{
    double full_wrope = NAN; /* the WRoPE mode alone: `full` under it */
    for (int i = 0; i < n; i++)
        if (c[i].selector == KVQ_SELECT_FULL && c[i].positions == KVQ_POSITIONS_WROPE)
            full_wrope = c[i].ppl;
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (c[i].selector == KVQ_SELECT_FULL || !isfinite(c[i].ppl))
            continue;
        /* the position mode alone must be within tolerance: exact RoPE is, WRoPE only
         * when its `full` run was measured within it */
        if (c[i].positions == KVQ_POSITIONS_WROPE && !(cost(full_wrope, ppl_exact) <= tol))
            continue;
        if (best < 0 || cost(c[i].ppl, ppl_exact) < cost(c[best].ppl, ppl_exact))
            best = i;
    }
    return best;
}

/* The held-out sequences (up to positions_tokens tokens), or the last calibration
 * sequence when the corpus ended first. */
static kvq_status held_set(calib_ctx *c, kvq_seq_set *ss, kvq_err *err)
{
    size_t s0 = c->n_cal_seqs;
    if (s0 >= c->n_seqs) {
        kvq_log(&c->p->cb, KVQ_LOG_WARN, "calibrate: no held-out token: the positions stage "
                "measures on the last calibration sequence");
        s0 = c->n_seqs - 1;
    }
    int64_t left = c->p->positions_tokens;
    kvq_status s = KVQ_OK;
    for (size_t i = s0; i < c->n_seqs && left >= 2 && !s; i++) {
        int64_t n = c->seqs[2 * i + 1] < left ? c->seqs[2 * i + 1] : left;
        s = kvq_seq_set_push(ss, c->ids + c->seqs[2 * i], n, err);
        left -= n;
    }
    return s;
}

/* Measures every candidate on ss with the artifact at art_path, through the
 * evaluation harness (kvq/eval.h): the reference and one row per candidate. */
static kvq_status measure(calib_ctx *c, const char *art_path, const kvq_seq_set *ss,
                          kvq_position_candidate *cand, double *ppl_exact, kvq_err *err)
{
    const kvq_calibrate_params *p = c->p;
    kvq_model_id id;
    kvq_model_identity(c->model, &id);
    kvq_codebook_set *rt = NULL;
    kvq_eval *ev = NULL;
    kvq_eval_params ep = kvq_eval_params_default();
    ep.threads = p->threads;
    ep.cb = p->cb;
    ep.measure = 0;
    ep.name = "calibrate: positions";
    for (size_t i = 0; i < ss->n; i++)
        if (ss->off[i + 1] - ss->off[i] > ep.max_tokens)
            ep.max_tokens = ss->off[i + 1] - ss->off[i];
    kvq_eval_result ref = {0}, res;
    kvq_status s = kvq_codebook_set_open(art_path, &id, c->model_path, &rt, err);
    if (!s && !(s = kvq_eval_create(c->model, rt, &ep, &ev, err)))
        s = kvq_eval_reference(ev, ss, &ref, err);
    *ppl_exact = ref.ppl;
    if (!s)
        kvq_log(&p->cb, KVQ_LOG_INFO, "calibrate: positions: exact attention: perplexity %.4f",
                *ppl_exact);
    for (int i = 0; i < KVQ_CALIB_POS_CANDIDATES && !s; i++) {
        /* the codebook under WRoPE only when the mode itself is within tolerance */
        if (cand[i].positions == KVQ_POSITIONS_WROPE && cand[i].selector != KVQ_SELECT_FULL &&
            !(cost(cand[0].ppl, *ppl_exact) <= p->positions_tolerance))
            continue;
        kvq_retrieval_params rp = kvq_retrieval_params_default();
        rp.selector = cand[i].selector;
        rp.positions = cand[i].positions;
        rp.score_pos = cand[i].score;
        /* every position predicted with retrieval (the harness's prefill_full = 0) */
        if ((s = kvq_eval_rows(ev, ss, &rp, NULL, 1, &ref, &res, err)))
            break;
        cand[i].ppl = res.ppl;
        kvq_log(&p->cb, KVQ_LOG_INFO, "calibrate: positions: %s: perplexity %.4f (%+.2f%%, "
                "%.1f s)", cand[i].name, cand[i].ppl, 100.0 * (cand[i].ppl / *ppl_exact - 1),
                res.seconds);
    }
    kvq_eval_free(ev);
    kvq_codebook_set_close(rt);
    return s;
}

static kvq_status meta_f(kvq_st_writer *w, const char *key, double v, kvq_err *err)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", v);
    return kvq_st_writer_set_meta(w, key, buf, err);
}

/* in_path's artifact again at out_path, with the positions.* keys of the choice. */
static kvq_status write_choice(const char *in_path, const char *out_path,
                               const kvq_calibrate_params *p, const kvq_position_candidate *cand,
                               int chosen, double ppl_exact, int64_t n_tokens, kvq_err *err)
{
    kvq_artifact *a = NULL;
    kvq_st_writer *w = NULL;
    kvq_status s = kvq_artifact_open(in_path, &a, err);
    if (!s && !(w = kvq_st_writer_new()))
        s = kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory");
    const kvq_st *st = s ? NULL : kvq_artifact_payload(a);
    for (size_t i = 0; !s && i < kvq_st_count(st); i++) {
        const kvq_tensor_view *t = kvq_st_tensor(st, i);
        s = kvq_st_writer_declare(w, t->name, t->dtype, t->ndim, t->shape, err);
    }
    for (size_t i = 0; !s && i < kvq_st_meta_count(st); i++)
        if (strncmp(kvq_st_meta_key(st, i), "positions.", 10))
            s = kvq_st_writer_set_meta(w, kvq_st_meta_key(st, i), kvq_st_meta_value(st, i), err);
    char key[96], bud[32];
    const kvq_retrieval_params d = kvq_retrieval_params_default();
    kvq_budget_format(&d.budget, bud, sizeof bud);
    if (!s && !(s = kvq_st_writer_set_meta(w, KVQ_META_POS_MODE,
                                           kvq_positions_name(cand[chosen].positions), err)) &&
        !(s = kvq_st_writer_set_meta(w, KVQ_META_POS_SCORE, kvq_score_pos_name(cand[chosen].score),
                                     err)) &&
        !(s = meta_f(w, KVQ_META_POS_TOLERANCE, p->positions_tolerance, err)) &&
        !(s = kvq_st_writer_set_meta(w, KVQ_META_POS_BUDGET, bud, err)) &&
        !(s = meta_f(w, KVQ_META_POS_N_TOKENS, (double)n_tokens, err)))
        s = meta_f(w, KVQ_META_POS_PPL_EXACT, ppl_exact, err);
    for (int i = 0; !s && i < KVQ_CALIB_POS_CANDIDATES; i++) {
        snprintf(key, sizeof key, KVQ_META_POS_PPL, cand[i].name);
        if (isfinite(cand[i].ppl))
            s = meta_f(w, key, cand[i].ppl, err);
    }
    if (!s)
        s = kvq_st_writer_begin_buffer(w, err);
    for (size_t i = 0; !s && i < kvq_st_count(st); i++)
        s = kvq_st_writer_write(w, kvq_st_tensor(st, i)->data, kvq_st_tensor(st, i)->nbytes, err);
    if (!s && !(s = kvq_st_writer_finish(w, err))) {
        size_t n;
        const void *buf = kvq_st_writer_buffer(w, &n);
        s = kvq_artifact_write(out_path, 1, buf, n, 0, err);
    }
    kvq_st_writer_free(w);
    kvq_artifact_close(a);
    return s;
}

kvq_status calib_run_positions(calib_ctx *c, const char *in_path, const char *out_path,
                               kvq_err *err)
{
    kvq_seq_set ss = {0};
    kvq_position_candidate cand[KVQ_CALIB_POS_CANDIDATES];
    kvq_calibrate_position_candidates(cand);
    double ppl_exact = NAN;
    kvq_status s = held_set(c, &ss, err);
    if (!s)
        s = measure(c, in_path, &ss, cand, &ppl_exact, err);
    if (!s) {
        int chosen = kvq_calibrate_choose_positions(ppl_exact, c->p->positions_tolerance, cand,
                                                    KVQ_CALIB_POS_CANDIDATES);
        if (chosen < 0)
            s = kvq_err_set(err, KVQ_E_INVALID_ARG, "calibrate: positions: no candidate measured");
        else {
            kvq_log(&c->p->cb, KVQ_LOG_INFO, "calibrate: positions: chose %s (full under wrope "
                    "%+.2f%%, tolerance %.2f%%)", cand[chosen].name,
                    100.0 * (cand[0].ppl / ppl_exact - 1), 100.0 * c->p->positions_tolerance);
            s = write_choice(in_path, out_path, c->p, cand, chosen, ppl_exact, ss.n_ids, err);
        }
    }
    kvq_seq_set_free(&ss);
    return s;
}
