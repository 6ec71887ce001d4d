/* calibrate_ctx.h — the pieces of the `kvq calibrate` driver (kvq/calibrate.h), shared
 * by pipeline/calibrate.c (the driver and its context), calibrate_records.c (the
 * parameter records and file identities), calibrate_stages.c (the corpus tokens and
 * the stage runner) and calibrate_output.c (publishing the artifact, the summary). */
#ifndef KVQ_PIPELINE_CALIBRATE_CTX_H
#define KVQ_PIPELINE_CALIBRATE_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/calibrate.h"
#include "kvq/util.h"
#include "kvq/corpus.h"
#include "kvq/model.h"

#define CALIB_RECORD_VERSION 1
#define CALIB_IDENT_DEPTH 8 /* directory levels hashed into a file identity */
#define CALIB_HELDOUT_SHARE 8 /* a corpus short of held-out tokens: at most 1/8 held out */
#define CALIB_WORK_MARKER ".kvq-work"           /* the mark of a kvq work directory */
#define CALIB_WORK_FORMAT "kvq work directory 1" /* its first line */
#define CALIB_WORK_LOCK ".kvq-lock"             /* the work directory's lock file */
#define CALIB_PUBLISHED "published.hash"        /* FNV-1a of the artifact last published */

/* The run's context. */
typedef struct calib_ctx {
    const kvq_calibrate_params *p;
    const char *model_path;
    const char *spec;               /* corpus spec */
    kvq_corpus *corpus;
    char *work;                     /* work directory */
    int created_work;               /* this run created it */
    kvq_lock out_lock, work_lock;   /* held by rank 0 for the whole run */
    int stage_done;                 /* some stage finished in this run */
    char *out_path[KVQ_CALIB_N_STAGES];    /* outputs */
    char *rec_path[KVQ_CALIB_N_STAGES];    /* parameter records */
    char *none_path;                /* heldout.none */
    kvq_strbuf rec[KVQ_CALIB_N_STAGES];   /* this run's records */
    int active[KVQ_CALIB_N_STAGES]; /* stage is part of this run */
    int32_t index[KVQ_CALIB_N_STAGES], count;
    kvq_calibrate_summary *sum;

    /* Opened and tokenized only when a capture stage has to run. */
    kvq_model *model;
    int tokenized;
    int32_t *ids;                   /* [n_ids] calibration then held-out tokens */
    size_t n_ids, cap_ids;
    int64_t *seqs;                  /* [n_seqs, 2] first index into ids, length */
    size_t n_seqs, cap_seqs;
    size_t n_cal_seqs;              /* the first n_cal_seqs sequences are calibration */
    int64_t n_cal_tokens, n_held_tokens;
    int phase;                      /* 0 calibration, 1 held-out, 2 done */
    kvq_corpus_stats stats;
} calib_ctx;

/* ---- calibrate.c */


/* The capture directory the profile reads: heldout/ when it holds a capture. */
const char *calib_profile_capture(const calib_ctx *c);

/* ---- calibrate_records.c */

/* Why the record `old` differs from `new_text`, in words (the first differing key). */
void calib_record_diff(const char *old, const char *new_text, char *why, size_t cap);
/* This run's parameter record of every active stage, into c->rec. */
kvq_status calib_build_records(calib_ctx *c, kvq_err *err);

/* ---- calibrate_stages.c */

/* Runs stage s unless its output is up to date with its record (skip), reporting both. */
kvq_status calib_do_stage(calib_ctx *c, kvq_calibrate_stage s, kvq_err *err);

/* ---- calibrate_positions.c */

/* The positions stage: measures the candidates with in_path's codebooks on the
 * held-out tokens (c must be tokenized) and writes in_path plus the choice to out_path. */
kvq_status calib_run_positions(calib_ctx *c, const char *in_path, const char *out_path,
                               kvq_err *err);

/* ---- calibrate_work.c */

/* Rank 0, before anything changes: locks out_path and the work directory (creating and
 * marking it when missing), refuses a work directory that is neither marked nor empty
 * and an existing out_path that is neither what this work directory last published
 * nor the bytes of `final` (without force). */
kvq_status calib_claim(calib_ctx *c, const char *out_path, const char *final, kvq_err *err);
/* Records the published out_path's hash in the work directory. */
kvq_status calib_note_published(const calib_ctx *c, const char *out_path, kvq_err *err);
/* Releases the locks; remove_work: the work directory too (its mark; rmdir when empty). */
void calib_release(calib_ctx *c, int remove_work);

/* ---- calibrate_output.c */

/* Refuses an out_path that exists and is not a .kvq artifact. */
kvq_status calib_check_out(const char *path, kvq_err *err);
/* Copies the final artifact to out_path unless it holds the same bytes already. */
kvq_status calib_publish(const char *from, const char *to, int *replaced, kvq_err *err);
void calib_summary_reset(kvq_calibrate_summary *s);
/* The summary of the run: the captures' sizes and the final artifact's fit and profile
 * (kvq_artifact_summary). */
kvq_status calib_read_summary(calib_ctx *c, const char *final, kvq_err *err);

#endif
