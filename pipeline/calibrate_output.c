/* calibrate_output.c — the end of a `kvq calibrate` run: the output path checked before
 * the run, the final artifact published, and the summary read back from the outputs. */
#include "kvq/calibrate.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq/artifact.h"
#include "kvq/artifact_summary.h"
#include "kvq/corpus.h"
#include "kvq/kmeans.h"
#include "kvq/model.h"
#include "kvq/runtime.h"
#include "kvq/tokenizer.h"
#include "kvq/util.h"
#include "pipeline/calibrate_ctx.h"

/* ==========================================================================
 * Output and summary
 * ========================================================================== */

/* Refuses an out_path that exists and is not a .kvq artifact, or cannot be created. */
kvq_status calib_check_out(const char *path, kvq_err *err)
{
    return kvq_output_check(path, 1, kvq_artifact_is_artifact, "a .kvq artifact", err);
}

/* Copies the final artifact to out_path unless it holds the same bytes already. */
kvq_status calib_publish(const char *from, const char *to, int *replaced, kvq_err *err)
{
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    kvq_status st = kvq_read_file(from, &a, &na, err);
    *replaced = 0;
    if (st)
        goto done;
    if (kvq_read_file(to, &b, &nb, NULL) == KVQ_OK && na == nb && !memcmp(a, b, na))
        goto done;
    kvq_atomic_file af;
    if ((st = kvq_atomic_open(to, 1, &af, err)))
        goto done;
    if (fwrite(a, 1, na, af.fp) != na) {
        kvq_atomic_abort(&af);
        st = kvq_err_set(err, KVQ_E_IO, "%s: write failed: %s", to, strerror(errno));
        goto done;
    }
    if (!(st = kvq_atomic_commit(&af, err)))
        *replaced = 1;
done:
    free(a);
    free(b);
    return st;
}

void calib_summary_reset(kvq_calibrate_summary *s)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < KVQ_CALIB_N_STAGES; i++)
        s->ran[i] = -1;
    s->codebook_size = s->groups = s->n_heads = -1;
    s->score_mse = s->score_mse_ref = s->score_power = NAN;
    s->tolerance = NAN;
    s->leankv_alpha_h = s->leankv_alpha_l = s->leankv_memory = s->leankv_err = NAN;
    s->pats_memory = s->pats_bits = s->pats_err = NAN;
    s->pats_b_min = s->pats_b_max = -1;
    s->budget_fraction = s->budget_attended = s->budget_err = NAN;
    s->mass_tau = s->mass_attended = s->mass_err = NAN;
    s->leankv_met = s->pats_met = s->budget_met = s->mass_met = -1;
    s->positions_ppl_exact = s->positions_ppl_full_wrope = s->positions_ppl = NAN;
}

/* The positions stage's choice and figures (KVQ_META_POS_*), when recorded. */
static void read_positions(const kvq_st *st, kvq_calibrate_summary *s)
{
    const char *m = kvq_st_meta_get(st, KVQ_META_POS_MODE), *sc = kvq_st_meta_get(st, KVQ_META_POS_SCORE);
    if (!m || !sc)
        return;
    snprintf(s->positions, sizeof s->positions, "%s", m);
    snprintf(s->score_pos, sizeof s->score_pos, "%s", sc);
    char key[96];
    const char *v = kvq_st_meta_get(st, KVQ_META_POS_PPL_EXACT);
    s->positions_ppl_exact = v ? atof(v) : NAN;
    snprintf(key, sizeof key, KVQ_META_POS_PPL, "full-wrope");
    s->positions_ppl_full_wrope = (v = kvq_st_meta_get(st, key)) ? atof(v) : NAN;
    char name[48]; /* the chosen candidate's name: "codebook-MODE-SCORE" */
    snprintf(name, sizeof name, "codebook-%s-%s", m, sc);
    snprintf(key, sizeof key, KVQ_META_POS_PPL, name);
    s->positions_ppl = (v = kvq_st_meta_get(st, key)) ? atof(v) : NAN;
}

/* The chosen row's value in column col of knob k (diag.profile.KNOB.COL), else NaN. */
static double knob_value(const kvq_artifact_knob *k, const char *col)
{
    for (int c = 0; c < k->n_cols; c++)
        if (!strcmp(k->cols[c], col))
            return k->chosen_value[c];
    return NAN;
}

kvq_status calib_read_summary(calib_ctx *c, const char *final, kvq_err *err)
{
    kvq_calibrate_summary *s = c->sum;
    kvq_capture_info *ci = NULL;
    kvq_artifact *a = NULL;
    kvq_artifact_summary as = {0};
    kvq_status st = kvq_capture_info_read(c->out_path[KVQ_CALIB_CAPTURE], &ci, err);
    if (st)
        goto done;
    s->n_tokens = ci->n_tokens;
    s->n_sequences = ci->n_sequences;
    kvq_capture_info_free(ci);
    ci = NULL;
    if (c->active[KVQ_CALIB_HELDOUT] &&
        calib_profile_capture(c) == c->out_path[KVQ_CALIB_HELDOUT]) {
        if ((st = kvq_capture_info_read(c->out_path[KVQ_CALIB_HELDOUT], &ci, err)))
            goto done;
        s->n_heldout_tokens = ci->n_tokens;
        s->n_heldout_sequences = ci->n_sequences;
    }
    if ((st = kvq_artifact_open(final, &a, err)) ||
        (st = kvq_artifact_summary_read(kvq_artifact_payload(a), &as, err)))
        goto done;
    read_positions(kvq_artifact_payload(a), s);
    const kvq_artifact_fit *f = &as.fit;
    snprintf(s->method, sizeof s->method, "%s", f->method ? f->method : "");
    s->codebook_size = (int32_t)f->codebook_size;
    s->groups = (int32_t)f->groups;
    if (f->n_fit)
        s->n_heads = (int32_t)(f->n_kv * (int64_t)f->n_fit);
    s->score_mse = f->mean[KVQ_FIT_SCORE_MSE];
    s->score_mse_ref = f->mean[KVQ_FIT_SCORE_MSE_REF];
    s->score_power = f->mean[KVQ_FIT_SCORE_POWER];

    const kvq_artifact_profile *pr = &as.profile;
    s->profiled = pr->present;
    if (!s->profiled)
        goto done;
    snprintf(s->metric, sizeof s->metric, "%s", pr->metric);
    s->tolerance = pr->tolerance;
    const kvq_artifact_knob *lk = &pr->knob[KVQ_SUMMARY_LEANKV];
    const kvq_artifact_knob *pt = &pr->knob[KVQ_SUMMARY_PATS];
    const kvq_artifact_knob *bu = &pr->knob[KVQ_SUMMARY_BUDGET];
    const kvq_artifact_knob *ma = &pr->knob[KVQ_SUMMARY_MASS];
    s->leankv_met = lk->met;
    s->leankv_alpha_h = lk->setting_num[0];
    s->leankv_alpha_l = lk->setting_num[1];
    s->leankv_memory = knob_value(lk, "memory");
    s->leankv_err = knob_value(lk, "err");
    s->pats_met = pt->met;
    snprintf(s->pats_schedule, sizeof s->pats_schedule, "%s", pt->setting[0] ? pt->setting[0] : "");
    s->pats_b_min = isfinite(pt->setting_num[1]) ? (int32_t)pt->setting_num[1] : -1;
    s->pats_b_max = isfinite(pt->setting_num[2]) ? (int32_t)pt->setting_num[2] : -1;
    s->pats_memory = knob_value(pt, "memory");
    s->pats_bits = knob_value(pt, "bits");
    s->pats_err = knob_value(pt, "err");
    s->budget_met = bu->met;
    s->budget_fraction = bu->setting_num[0];
    s->budget_attended = knob_value(bu, "attended");
    s->budget_err = knob_value(bu, "err");
    s->mass_met = ma->met;
    s->mass_tau = ma->setting_num[0];
    s->mass_attended = knob_value(ma, "attended");
    s->mass_err = knob_value(ma, "err");
done:
    kvq_artifact_summary_free(&as);
    kvq_artifact_close(a);
    kvq_capture_info_free(ci);
    return st;
}
