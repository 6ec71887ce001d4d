/*
 * kvq/artifact_summary.h — what `kvq fit` and `kvq profile` recorded in a .kvq
 * artifact (docs/format.md, sections 9 and 10), read back as one summary
 * (formats/artifact_summary.c). `kvq inspect` prints it; `kvq calibrate` reports it.
 *
 * Everything here is optional in an artifact: a piece that is missing or malformed
 * reads as absent (NULL, NaN, -1 or an empty table), never as an error. Strings and
 * tensor views point into the payload the summary was read from and live as long as
 * it stays open; the arrays are the summary's own (kvq_artifact_summary_free).
 */
#ifndef KVQ_ARTIFACT_SUMMARY_H
#define KVQ_ARTIFACT_SUMMARY_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/artifact_summary.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"
#include "kvq/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The per-(layer, KV head) held-out figures of the fit. */
typedef enum kvq_fit_figure {
    KVQ_FIT_SCORE_MSE = 0,      /* score MSE of the method */
    KVQ_FIT_SCORE_MSE_REF = 1,  /* the same for the reference method */
    KVQ_FIT_SCORE_POWER = 2,    /* E[score^2] */
    KVQ_FIT_N_FIGURES = 3
} kvq_fit_figure;

typedef struct kvq_artifact_fit {
    const char *method;       /* fit.method; NULL: not written by `kvq fit` (all else empty) */
    const char *reference;    /* fit.reference, "none" when absent */
    int64_t codebook_size;    /* codebook_size, -1 when absent or not an integer */
    int64_t groups;           /* groups, -1 likewise */
    int bits_per_token;       /* code bits per token per KV head: groups x
                                 ceil(log2 codebook_size); 0 if unknown */
    int64_t n_layers, n_kv;   /* model.n_layers, model.n_kv_heads (0 if malformed) */
    int32_t *layers;          /* [n_fit] model layers with codebooks (`layers`, default all) */
    size_t n_fit;             /* 0: no per-layer table */
    double *head[KVQ_FIT_N_FIGURES]; /* [n_fit, n_kv] per (fit layer, KV head), NaN = absent:
                                        the diag.fit.* grids, else diag.layer.L.head.H.* */
    double mean[KVQ_FIT_N_FIGURES];  /* the writer's means over heads (metadata diag.fit.*),
                                        NaN when absent */
} kvq_artifact_fit;

/* Mean of the finite values of figure q over the KV heads of fit layer i (i < n_fit),
 * or over every (layer, head) with i = -1; NaN when there is none. */
double kvq_artifact_fit_mean(const kvq_artifact_fit *f, kvq_fit_figure q, int64_t i);

/* The profile's knobs, in the order of its tables. */
typedef enum kvq_summary_knob {
    KVQ_SUMMARY_LEANKV = 0,
    KVQ_SUMMARY_PATS = 1,
    KVQ_SUMMARY_BUDGET = 2,
    KVQ_SUMMARY_MASS = 3,
    KVQ_SUMMARY_N_KNOBS = 4
} kvq_summary_knob;

#define KVQ_KNOB_MAX_COLS 16
#define KVQ_KNOB_MAX_SETTINGS 4

/* One knob: its chosen setting and its table profile.NAME [n_rows, n_cols]. */
typedef struct kvq_artifact_knob {
    const char *name;           /* "leankv", "pats", "budget", "mass" */
    const char *skipped;        /* profile.NAME.skipped (why), or NULL */
    int met;                    /* thresholds.NAME.met: 1, 0, or -1 if absent */
    int n_settings;
    const char *setting_key[KVQ_KNOB_MAX_SETTINGS]; /* the chosen setting's keys
                                                       ("leankv.alpha_h", ...) */
    const char *setting[KVQ_KNOB_MAX_SETTINGS];     /* their values, NULL when absent */
    double setting_num[KVQ_KNOB_MAX_SETTINGS];      /* as numbers; NaN when absent or
                                                       not a number */
    const kvq_tensor_view *rows;/* [n_rows, n_cols] F64, or NULL (absent, malformed) */
    int64_t n_rows;
    int n_cols;                 /* columns named in profile.NAME.columns */
    const char *cols[KVQ_KNOB_MAX_COLS];
    double chosen_value[KVQ_KNOB_MAX_COLS]; /* diag.profile.NAME.COLUMN: the chosen row's
                                               values (NaN when absent) */
    int64_t chosen;             /* the first row equal to chosen_value, or -1 */
    char col_buf[256];          /* private: holds cols */
} kvq_artifact_knob;

typedef struct kvq_artifact_profile {
    int present;                /* written by `kvq profile` (it has thresholds.metric) */
    const char *metric;         /* thresholds.metric, or NULL */
    double tolerance;           /* thresholds.tolerance, NaN when absent */
    double prompt_fraction;     /* thresholds.prompt_fraction */
    double ppl_full;            /* diag.profile.ppl_full */
    kvq_artifact_knob knob[KVQ_SUMMARY_N_KNOBS];
} kvq_artifact_profile;

typedef struct kvq_artifact_summary {
    kvq_artifact_fit fit;
    kvq_artifact_profile profile;
} kvq_artifact_summary;

/* Reads the summary of an artifact's payload st into *out (free with
 * kvq_artifact_summary_free, also after an error). Errors: NOMEM only. */
kvq_status kvq_artifact_summary_read(const kvq_st *st, kvq_artifact_summary *out,
                                     kvq_err *err);
void kvq_artifact_summary_free(kvq_artifact_summary *s);

/* Element i of an F64 or F32 tensor as a double (views may be unaligned), else NaN. */
double kvq_tensor_f64_at(const kvq_tensor_view *t, size_t i);

/* A metadata value as a number: NaN when absent or not entirely a number. */
double kvq_st_meta_num(const kvq_st *st, const char *key);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_ARTIFACT_SUMMARY_H */
