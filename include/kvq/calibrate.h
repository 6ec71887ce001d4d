/*
 * kvq/calibrate.h — the whole pipeline in one call (`kvq calibrate`): capture, moments,
 * fit, a held-out capture and profile, with defaults sized for a quick run, each
 * stage's output kept in a work directory so that a run started again resumes.
 *
 * Data. The corpus is tokenized once into packed sequences of capture.seq_len tokens
 * (BOS first, documents packed, as kvq_capture_run does). The first
 * capture.max_tokens tokens are the calibration set (the last sequence is cut there);
 * the following heldout_tokens tokens, starting at the next sequence, are the held-out
 * set the profile stage measures on, so thresholds and budgets are chosen on text the
 * codebooks were not fitted on. When the corpus ends first (or heldout_tokens is 0),
 * the profile runs on the calibration capture and a warning says so.
 *
 * Work directory (default "<out>.work"), one output and one parameter record per
 * stage, in the order the stages run:
 *   capture/              capture.params.json    calibration capture (docs/capture.md)
 *   moments.safetensors   moments.params.json    H and its Cholesky factors
 *   fit.kvq               fit.params.json        codebooks (fit.kvq.ckpt/ while running)
 *   heldout/              heldout.params.json    held-out capture (or heldout.none, a
 *                                                one-line note, when there is none)
 *   profile.kvq           profile.params.json    fit.kvq plus thresholds and budgets
 *   positions.kvq         positions.params.json  the last of those plus the position
 *                                                mode measured and chosen (below)
 * out_path receives a copy of the last artifact (positions.kvq, or profile.kvq / fit.kvq
 * when the positions stage / the profile is off); it is replaced only when its bytes
 * differ.
 *
 * Resume rule. A stage's parameter record is canonical JSON text, one key per line,
 * of everything that changes its output: the stage parameters (thread counts
 * excluded: no stage's output depends on them), the tool version, the identity of
 * the model and corpus files (path, size and modification time, recursively for
 * directories) and, for a stage that reads another stage's output, the FNV-1a hash of
 * that stage's record — so changing a parameter reruns that stage and every stage
 * after it, and nothing before it. A stage is skipped when its output exists and its
 * record holds exactly the text this run would write. Before a stage runs its record
 * is removed; it is written (atomically) only after the stage's output was committed,
 * so a run killed at any point resumes at the stage it was in (and the fit stage at
 * its last finished head, through its own checkpoint). force = 1 reruns every stage.
 *
 * The library prints nothing: stage changes reach the caller through on_stage (or,
 * when it is NULL, as KVQ_LOG_INFO lines "calibrate: STAGE: ..."), and each stage's
 * own logs and progress through cb.
 *
 * Two runs of one work directory at the same time are not supported.
 */
#ifndef KVQ_CALIBRATE_H
#define KVQ_CALIBRATE_H

#include <stdint.h>

#include "kvq/common.h"
#ifdef KVQ_UNSTABLE_API
#include "kvq/capture.h"
#include "kvq/fit.h"
#include "kvq/moments.h"
#include "kvq/runtime.h"
#include "kvq/thresholds.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The default corpus: the synthetic sets of kvq/corpus.h, about 20,000 tokens with
 * the stories260K tokenizer, read in this order (uuid lines as in a2ats's calibration
 * mix, then passkey prompts with their filler text, then key-value recall prompts,
 * which end up in the held-out set). kvq has no built-in natural-text source: pass
 * --corpus with text files for a real model. */
#define KVQ_CALIBRATE_CORPUS "uuid:2,passkey:3,kv-recall:12"

typedef enum kvq_calibrate_stage {
    KVQ_CALIB_CAPTURE = 0,
    KVQ_CALIB_MOMENTS = 1,
    KVQ_CALIB_FIT = 2,
    KVQ_CALIB_HELDOUT = 3,
    KVQ_CALIB_PROFILE = 4,
    KVQ_CALIB_POSITIONS = 5
} kvq_calibrate_stage;
#define KVQ_CALIB_N_STAGES 6

/* "capture", "moments", "fit", "heldout", "profile", "positions"; "unknown" otherwise. */
const char *kvq_calibrate_stage_name(kvq_calibrate_stage s);

typedef enum kvq_calibrate_event {
    KVQ_CALIB_EVENT_SKIP = 0,  /* up to date: output and parameter record match */
    KVQ_CALIB_EVENT_RUN = 1,   /* about to run (why says why) */
    KVQ_CALIB_EVENT_DONE = 2   /* finished (seconds is set) */
} kvq_calibrate_event;

typedef struct kvq_calibrate_stage_info {
    kvq_calibrate_stage stage;
    kvq_calibrate_event event;
    int32_t index;            /* 1-based position among the stages of this run */
    int32_t count;            /* stages in this run (3 without profile, 4 without a
                                 held-out capture, else 5; one more with positions) */
    const char *output;       /* the stage's output path */
    const char *what;         /* one line: what the stage does with which settings */
    const char *why;          /* SKIP: "up to date"; RUN: "no previous output",
                                 "forced", "no parameter record (interrupted?)" or
                                 "KEY changed: OLD -> NEW"; DONE: "" */
    double seconds;           /* DONE: wall time of the stage */
} kvq_calibrate_stage_info;

typedef void (*kvq_calibrate_stage_fn)(void *user, const kvq_calibrate_stage_info *info);

/* What the outputs hold, read back from them (so the same whether a stage ran or was
 * skipped). Values that do not apply are NaN (doubles), -1 (integers) or "". */
typedef struct kvq_calibrate_summary {
    char work_dir[1024];
    char final_artifact[1024];  /* the work-directory artifact copied to out_path */
    int ran[KVQ_CALIB_N_STAGES];/* 1 ran, 0 skipped (up to date), -1 not in this run */
    double seconds[KVQ_CALIB_N_STAGES]; /* wall time of the stages that ran, else 0 */
    int out_replaced;           /* 1: out_path was written, 0: it already held the bytes */

    int64_t n_tokens;           /* calibration capture: tokens and sequences */
    int64_t n_sequences;
    int64_t n_heldout_tokens;   /* held-out capture (0: the profile used the capture) */
    int64_t n_heldout_sequences;

    char method[16];            /* fit method name ("qavq") */
    int32_t codebook_size, groups;
    int32_t n_heads;            /* (layer, KV head) codebooks fitted */
    double score_mse;           /* held-out score MSE of the method (diag.fit.score_mse) */
    double score_mse_ref;       /* the same for plain VQ/PQ (diag.fit.score_mse_ref) */
    double score_power;         /* E[(q~.k)^2] on held-out data */

    int profiled;               /* 1: the final artifact carries a profile */
    char metric[16];            /* "attn_rel_err" or "perplexity" */
    double tolerance;
    /* chosen values; *_met: 1 within tolerance, 0 best found, -1 not profiled */
    double leankv_alpha_h, leankv_alpha_l, leankv_memory, leankv_err;
    int leankv_met;
    char pats_schedule[16];
    int32_t pats_b_min, pats_b_max;
    double pats_memory;         /* packed (64-byte blocks), fraction of the f16 cache */
    double pats_bits;           /* unpacked bits, fraction of 16 */
    double pats_err;
    int pats_met;
    double budget_fraction, budget_attended, budget_err;
    int budget_met;
    double mass_tau, mass_attended, mass_err;
    int mass_met;
    char positions[8];          /* the positions stage's choice ("" without one) */
    char score_pos[8];
    double positions_ppl_exact, positions_ppl_full_wrope, positions_ppl; /* of the choice */
} kvq_calibrate_summary;

/* ---- stable: calibrate with plain options (pipeline/calibrate_api.c) ------------------
 * The common settings of `kvq calibrate`; everything else at kvq_calibrate_params'
 * defaults. Zero / NULL fields take the default. */
typedef struct kvq_calibrate_options {
    const char *corpus;         /* corpus spec (docs/corpus.md); NULL: KVQ_CALIBRATE_CORPUS */
    const char *work_dir;       /* NULL: "<out_path>.work" */
    uint64_t seed;              /* 0: 1234 */
    int32_t threads;            /* 0: 1 */
    int force;                  /* 1: rerun every stage and replace out_path */
    int64_t seq_len;            /* tokens per sequence (0: 512) */
    int64_t max_tokens;         /* calibration tokens (0: 16384) */
    int64_t heldout_tokens;     /* held-out tokens (0: 2048; -1: profile on the capture) */
    int64_t positions_tokens;   /* positions stage tokens (0: 1024) */
    int32_t codebook_size;      /* centroids per codebook (0: from the data) */
    int32_t iters;              /* k-means iterations (0: 25) */
    int no_profile;             /* 1: stop after the fit */
    int no_positions;           /* 1: no positions stage */
    kvq_callbacks cb;           /* logs and progress; {0}: silent */
} kvq_calibrate_options;

/* Runs kvq_calibrate_run with these options (model_path: GGUF file or HF directory).
 * summary may be NULL. Errors: those of kvq_calibrate_run. */
kvq_status kvq_calibrate_files(const char *model_path, const char *out_path,
                               const kvq_calibrate_options *o, kvq_calibrate_summary *summary,
                               kvq_err *err);

#ifdef KVQ_UNSTABLE_API
/* ---- unstable: every parameter of every stage ------------------------------------- */

typedef struct kvq_calibrate_params {
    const char *corpus;         /* corpus spec (kvq/corpus.h); NULL = KVQ_CALIBRATE_CORPUS */
    kvq_corpus_params corpus_params; /* generator sizes; its seed is replaced by `seed` */
    const char *work_dir;       /* NULL = "<out_path>.work" */
    uint64_t seed;              /* every random choice: corpus generators, query sample,
                                   k-means (replaces capture.seed and fit.seed).
                                   Default 1234 */
    int32_t threads;            /* >= 1 (default 1): capture, fit and profile threads */
    int force;                  /* 1: rerun every stage (and replace out_path) */
    int accept_approx_tokenizer; /* kvq_model_params.accept_approx_tokenizer (default 0);
                                   the approximation is recorded in the capture and the
                                   artifact (KVQ_META_TOKENIZER_APPROX) */

    /* Stage parameters, as the stages define them, with calibrate's defaults: */
    kvq_capture_params capture; /* seq_len 512, max_tokens 16384 (>= 1: the calibration
                                   set), f16, values, all queries. threads, seed,
                                   overwrite and cb are set by the driver */
    int64_t heldout_tokens;     /* held-out tokens for the profile, >= 0 (default 2048;
                                   0 = profile on the calibration capture) */
    kvq_moments_params moments; /* kvq_moments_params_default() */
    kvq_fit_params fit;         /* kvq_fit_params_default(): qavq, codebook size from the
                                   data (256 for 16384 tokens), 25 iterations. seed,
                                   threads, overwrite and cb are set by the driver */
    int profile;                /* 1 (default): run the held-out capture and profile */
    kvq_profile_params prof;    /* kvq_profile_params_default(); threads and cb are set
                                   by the driver */
    int positions;              /* 1 (default): run the positions stage (below) */
    int64_t positions_tokens;   /* held-out tokens it measures on, >= 2 (default 1024) */
    double positions_tolerance; /* |relative perplexity change| a position mode (its `full`
                                   selector) may cost against exact attention, >= 0
                                   (default 0.01, the profile's perplexity tolerance) */

    kvq_callbacks cb;           /* every stage's logs and progress */
    kvq_calibrate_stage_fn on_stage; /* stage events (may be NULL: INFO log lines) */
    void *stage_user;           /* passed to on_stage */
    const kvq_dist *dist;       /* NULL (default): one process; else every rank runs
                                   kvq_calibrate_run with the same arguments: capture,
                                   held-out capture and fit are split among the ranks,
                                   rank 0 runs moments and profile and writes every
                                   output and record (kvq/dist.h) */
} kvq_calibrate_params;

kvq_calibrate_params kvq_calibrate_params_default(void);

/* The positions stage (the last; output positions.kvq, the final artifact). On the
 * first positions_tokens held-out tokens (the last calibration sequence when there are
 * none) it measures the perplexity of exact attention and of each candidate, every
 * position predicted with retrieval (prefill_full = 0) at the default budget
 * (kvq_retrieval_params_default), and records the choice (KVQ_META_POS_MODE,
 * KVQ_META_POS_SCORE) and every figure (KVQ_META_POS_*) in the artifact; kvq run and
 * kvq eval use the choice unless --positions / --score-pos are given. */
#define KVQ_CALIB_POS_CANDIDATES 5
typedef struct kvq_position_candidate {
    const char *name;        /* "full-wrope", "codebook-wrope-rb", "codebook-rope-rb",
                                "codebook-rope-mean", "codebook-rope-bands" */
    kvq_selector selector;   /* FULL (the position mode alone) or CODEBOOK */
    kvq_positions positions;
    kvq_score_pos score;
    double ppl;              /* measured perplexity; NaN: not measured (the codebook
                                under WRoPE is not run when full-wrope costs more than
                                the tolerance) */
} kvq_position_candidate;
void kvq_calibrate_position_candidates(kvq_position_candidate out[KVQ_CALIB_POS_CANDIDATES]);
/* The rule, with cost(ppl) = |ppl / ppl_exact - 1| (a change of the model's predictions
 * either way: a mode that lowers the perplexity of the held-out text is no more exact):
 * among the codebook candidates with a measured perplexity whose position mode costs at
 * most tol (ROPE always, being exact; WROPE when the FULL/WROPE candidate's cost <= tol),
 * the least cost (the first on a tie). Returns its index, or -1 when none qualifies. */
int kvq_calibrate_choose_positions(double ppl_exact, double tol, const kvq_position_candidate *c,
                                   int n);

/*
 * Runs the pipeline for the model at model_path (GGUF file or HF directory) into
 * out_path (see the top of this file). summary may be NULL.
 *
 * Checked before anything is created, in this order: the parameters
 * (KVQ_E_INVALID_ARG naming the field; capture.values must be 1 with the profile on),
 * out_path (KVQ_E_EXISTS when it exists and is not a .kvq artifact — calibrate never
 * replaces another kind of file — or is a directory), the model path
 * (KVQ_E_NOT_FOUND "PATH: no such file or directory"), the corpus spec (the errors of
 * kvq_corpus_open). The work directory is created just before the first stage
 * output is written, after the model was opened and the corpus tokenized, so a
 * missing or unreadable model or an empty corpus ("corpus 'SPEC' contains no text")
 * leaves nothing behind; if a run that created the work directory fails before any
 * stage finished, the directory is removed again.
 *
 * Errors: those above, of kvq_model_open, kvq_corpus_tokenize, kvq_capture_tokens,
 * kvq_moments_compute, kvq_fit_run, kvq_profile_run, kvq_artifact_open (reading the
 * summary) and KVQ_E_IO / KVQ_E_NOMEM; KVQ_E_CANCELLED when a progress callback asks
 * to stop (finished stages stay done). Cost: the stages' own; the token ids of the
 * calibration and held-out sets are held in memory (4 bytes each).
 */
kvq_status kvq_calibrate_run(const char *model_path, const char *out_path,
                             const kvq_calibrate_params *p, kvq_calibrate_summary *summary,
                             kvq_err *err);
#endif /* KVQ_UNSTABLE_API */

#ifdef __cplusplus
}
#endif
#endif /* KVQ_CALIBRATE_H */
