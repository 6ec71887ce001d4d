/*
 * calibrate.c — `kvq calibrate`: the pipeline driver (kvq/calibrate.h).
 *
 *   calibrate.c          parameters, the run's context and the driver
 *   calibrate_records.c  each stage's parameter record; identity of the input files
 *   calibrate_stages.c   tokens (calibration and held-out sets); the stages: skip or run
 *   calibrate_output.c   the output check, publishing, the summary read back
 *
 * The driver only sequences the public stage functions; it adds no numerics of its
 * own, and uses the stages (calib, cholesky, kmeans, thresholds) as a client would.
 */
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

static const char *const stage_names[KVQ_CALIB_N_STAGES] = {"capture", "moments", "fit",
                                                            "heldout", "profile",
                                                            "positions"};

const char *kvq_calibrate_stage_name(kvq_calibrate_stage s)
{
    return (unsigned)s < KVQ_CALIB_N_STAGES ? stage_names[s] : "unknown";
}

kvq_calibrate_params kvq_calibrate_params_default(void)
{
    kvq_calibrate_params p;
    memset(&p, 0, sizeof p);
    kvq_corpus_params_default(&p.corpus_params);
    p.seed = 1234;
    p.threads = 1;
    p.capture = kvq_capture_params_default();
    p.capture.seq_len = 512;
    p.capture.max_tokens = 16384;
    p.heldout_tokens = 2048;
    p.moments = kvq_moments_params_default();
    p.fit = kvq_fit_params_default();
    p.profile = 1;
    p.prof = kvq_profile_params_default();
    p.positions = 1;
    p.positions_tokens = 1024;
    p.positions_tolerance = 0.01;
    return p;
}

/* ==========================================================================
 * The run's context
 * ========================================================================== */

/* The capture directory the profile reads: heldout/ when it holds a capture. */
const char *calib_profile_capture(const calib_ctx *c)
{
    char *cj = kvq_path_join(c->out_path[KVQ_CALIB_HELDOUT], KVQ_CAPTURE_JSON);
    const int held = c->active[KVQ_CALIB_HELDOUT] && cj && access(cj, F_OK) == 0;
    free(cj);
    return held ? c->out_path[KVQ_CALIB_HELDOUT] : c->out_path[KVQ_CALIB_CAPTURE];
}

/* ==========================================================================
 * The driver
 * ========================================================================== */

static kvq_status check_params(const kvq_calibrate_params *p, kvq_err *err)
{
    const char *bad = NULL;
    if (p->threads < 1)
        bad = "threads must be >= 1";
    else if (p->capture.seq_len < 2 || p->capture.seq_len > INT32_MAX)
        bad = "capture.seq_len must be in [2, 2^31)";
    else if (p->capture.max_tokens < 2 || p->capture.max_tokens > INT32_MAX)
        bad = "capture.max_tokens must be in [2, 2^31): a sequence needs 2 tokens";
    else if (p->heldout_tokens < 0 || p->heldout_tokens > INT32_MAX)
        bad = "heldout_tokens must be in [0, 2^31)";
    else if (p->profile && !p->capture.values)
        bad = "the profile needs captured values (capture.values = 1)";
    else if (p->positions && p->positions_tokens < 2)
        bad = "positions_tokens must be >= 2";
    else if (!(p->positions_tolerance >= 0))
        bad = "positions_tolerance must be >= 0";
    if (bad)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "calibrate: %s", bad);
    return kvq_moments_params_check(&p->moments, err);
}

static void ctx_free(calib_ctx *c)
{
    for (int s = 0; s < KVQ_CALIB_N_STAGES; s++) {
        free(c->out_path[s]);
        free(c->rec_path[s]);
        kvq_sb_free(&c->rec[s]);
    }
    free(c->none_path);
    free(c->work);
    free(c->ids);
    free(c->seqs);
    kvq_model_close(c->model);
    kvq_corpus_free(c->corpus);
}

kvq_status kvq_calibrate_run(const char *model_path, const char *out_path,
                             const kvq_calibrate_params *p_in, kvq_calibrate_summary *summary,
                             kvq_err *err)
{
    kvq_status st = KVQ_OK;
    calib_ctx c;
    kvq_calibrate_summary local;
    memset(&c, 0, sizeof c);
    c.out_lock.fd = c.work_lock.fd = -1;
    kvq_calibrate_params p = p_in ? *p_in : kvq_calibrate_params_default();
    c.p = &p;
    c.model_path = model_path;
    c.sum = summary ? summary : &local;
    calib_summary_reset(c.sum);
    if (!model_path || !out_path || !*model_path || !*out_path)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "calibrate: a model and an output are required");
    if ((st = check_params(&p, err)) || (st = calib_check_out(out_path, err)))
        goto done;
    struct stat mst;
    if (stat(model_path, &mst) != 0) {
        st = kvq_err_set(err, errno == ENOENT ? KVQ_E_NOT_FOUND : KVQ_E_IO, "%s: %s", model_path,
                         strerror(errno));
        goto done;
    }
    c.spec = p.corpus ? p.corpus : KVQ_CALIBRATE_CORPUS;
    kvq_corpus_params cpar = p.corpus_params;
    cpar.seed = p.seed;
    p.corpus_params = cpar;
    if ((st = kvq_corpus_open(c.spec, &cpar, &c.corpus, err)))
        goto done;

    /* Paths. */
    if (p.work_dir) {
        c.work = strdup(p.work_dir);
    } else if ((c.work = malloc(strlen(out_path) + 6))) {
        sprintf(c.work, "%s.work", out_path);
    }
    static const char *const outs[KVQ_CALIB_N_STAGES] = {"capture", "moments.safetensors",
                                                          "fit.kvq", "heldout", "profile.kvq",
                                                          "positions.kvq"};
    int oom = !c.work;
    for (int s = 0; s < KVQ_CALIB_N_STAGES && !oom; s++) {
        char rec[64];
        snprintf(rec, sizeof rec, "%s.params.json", stage_names[s]);
        c.out_path[s] = kvq_path_join(c.work, outs[s]);
        c.rec_path[s] = kvq_path_join(c.work, rec);
        oom = !c.out_path[s] || !c.rec_path[s];
    }
    if (oom || !(c.none_path = kvq_path_join(c.work, "heldout.none"))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "calibrate: out of memory");
        goto done;
    }
    snprintf(c.sum->work_dir, sizeof c.sum->work_dir, "%s", c.work);
    const char *final = c.out_path[p.positions ? KVQ_CALIB_POSITIONS
                                   : p.profile ? KVQ_CALIB_PROFILE : KVQ_CALIB_FIT];
    /* One run at a time on the output and the work directory (rank 0 holds them). */
    st = kvq_dist_rank(p.dist) == 0 ? calib_claim(&c, out_path, final, err) : KVQ_OK;
    if ((st = kvq_dist_agree(p.dist, st, err)))
        goto done;

    /* The stages of this run, in order. */
    static const kvq_calibrate_stage order[KVQ_CALIB_N_STAGES] = {
        KVQ_CALIB_CAPTURE, KVQ_CALIB_MOMENTS, KVQ_CALIB_FIT, KVQ_CALIB_HELDOUT, KVQ_CALIB_PROFILE,
        KVQ_CALIB_POSITIONS};
    c.active[KVQ_CALIB_CAPTURE] = c.active[KVQ_CALIB_MOMENTS] = c.active[KVQ_CALIB_FIT] = 1;
    c.active[KVQ_CALIB_HELDOUT] = p.profile && p.heldout_tokens > 0;
    c.active[KVQ_CALIB_PROFILE] = p.profile;
    c.active[KVQ_CALIB_POSITIONS] = p.positions;
    for (int i = 0; i < KVQ_CALIB_N_STAGES; i++)
        if (c.active[order[i]])
            c.index[order[i]] = ++c.count;
    if ((st = calib_build_records(&c, err)))
        goto done;

    for (int i = 0; i < KVQ_CALIB_N_STAGES; i++)
        if (c.active[order[i]] && (st = calib_do_stage(&c, order[i], err)))
            goto done;

    snprintf(c.sum->final_artifact, sizeof c.sum->final_artifact, "%s", final);
    if (kvq_dist_rank(p.dist) == 0 && !(st = calib_publish(final, out_path, &c.sum->out_replaced,
                                                          err)) &&
        !(st = calib_note_published(&c, out_path, err)))
        st = calib_read_summary(&c, final, err); /* rank 0 publishes; its summary is whole */
    st = kvq_dist_share(p.dist, st, err);
done:
    /* A run that created the work directory and finished nothing leaves nothing. */
    calib_release(&c, st && c.created_work && !c.stage_done);
    ctx_free(&c);
    return st;
}
