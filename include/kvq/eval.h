/*
 * kvq/eval.h — the evaluation harness (eval/): selector settings x documents -> a table
 * of perplexity, recall, attention mass, output error, KV bytes read and task answers,
 * measured against full attention. `kvq eval` prints its table, the positions stage of
 * `kvq calibrate` chooses from its perplexities, and the budget profile
 * (thresholds/budget.c) measures a capture's rows through kvq_eval_seq_probe /
 * kvq_eval_seq_attend and takes its figures through kvq_eval_metric_value.
 *
 * A row is one kvq_retrieval_params (selector, budget, positions, scoring query, ...);
 * the harness sets max_tokens, cb, prefill_full and measure of each. Per row:
 *   perplexity   every token of every sequence predicted with retrieval attention at
 *                its position (prefill_full = 0); with last = N only the last N of each
 *                sequence, each a one-token decode step after an exact prefill of the
 *                tokens before it (recorded once per sequence, replayed into each row)
 *   metrics      kvq_eval_metric_value over the row's kvq_retrieval_stats (measure = 1):
 *                the one list of per-step figures (adding a metric: one entry in
 *                eval/metrics.c and, when new, one field in kvq_retrieval_stats:
 *                CONTRIBUTING.md "Adding a metric")
 *   tasks        passkey / kv-recall documents of the corpus: the prompt attended
 *                exactly (prefilled once for every row), the answer decoded greedily
 *                with retrieval; correct when the continuation starts with the answer
 * A retrieval step is one (query position, layer, KV head) with at least one candidate
 * (more tokens than sinks + window).
 *
 * Tiers (docs/api.md): the top part is stable (plain structs, paths in, a table out:
 * kvq_eval_files); the harness itself, on the library's model, corpus and runtime
 * types, is in the unstable tier (KVQ_UNSTABLE_API).
 */
#ifndef KVQ_EVAL_H
#define KVQ_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"
#ifdef KVQ_UNSTABLE_API
#include "kvq/corpus.h"
#include "kvq/model.h"
#include "kvq/perplexity.h"
#include "kvq/runtime.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- metrics: the figures of a row's retrieval statistics ------------------------ */

typedef enum kvq_eval_metric {
    KVQ_EVAL_RECALL_TOPK = 0, /* mean |selected ∩ oracle's top-K| / K */
    KVQ_EVAL_RECALL_MASS,     /* mean exact attention mass on the attended tokens */
    KVQ_EVAL_OUT_REL_ERR,     /* mean ||o - o_exact|| / ||o_exact|| */
    KVQ_EVAL_KV_READ,         /* bytes read per step over those of full attention */
    KVQ_EVAL_ATTENDED,        /* attended tokens over visible tokens */
    KVQ_EVAL_N_METRICS
} kvq_eval_metric;

/* How a metric is named and printed: JSON key, text column (NULL: not in the text
 * table), its width and precision, and whether the text shows it as a percentage. */
typedef struct kvq_eval_metric_info {
    const char *key;
    const char *column;
    int width, precision, percent;
} kvq_eval_metric_info;

const kvq_eval_metric_info *kvq_eval_metric_get(kvq_eval_metric m);

/* ---- stable: evaluate files (eval/files.c) ---------------------------------------- */

typedef struct kvq_eval_options {
    const char *selectors;   /* comma-separated: full, oracle, codebook (or the artifact's
                                method), fier, quest, mass; NULL: all that apply */
    const char *budgets;     /* comma-separated: a count, a fraction, a percentage or
                                "all"; NULL: "6%" */
    int64_t seq_len;         /* tokens per sequence (0: 512) */
    int64_t max_tokens;      /* 0: the whole corpus */
    int64_t score_last;      /* 0: every prediction; N: the last N of each sequence */
    uint64_t seed;           /* seed of the synthetic corpus sources */
    int32_t threads;         /* 0: 1 */
    int32_t window;          /* recent tokens always attended (0: the artifact's WRoPE
                                window, else 64) */
    int accept_model_mismatch; /* 1: use an artifact made for other weights */
    kvq_callbacks cb;        /* logs and progress; {0}: silent */
} kvq_eval_options;

#define KVQ_EVAL_MAX_ROWS 128

typedef struct kvq_eval_row_result {
    char selector[32];       /* as printed: the artifact's method for codebook */
    char budget[32];
    double bits_per_key;     /* selector metadata bits per cached key */
    double nll, perplexity;  /* mean NLL over the reference's predicted tokens */
    uint64_t steps;          /* retrieval steps (0: the metrics are NaN) */
    double metric[KVQ_EVAL_N_METRICS];
    int passkey[2], kv_recall[2]; /* correct, total */
} kvq_eval_row_result;

/* The whole table, in the caller's memory (about 27 KB): no pointer to free. */
typedef struct kvq_eval_report {
    uint64_t corpus_hash, tokens, predicted;
    uint64_t sequences;
    double nll, perplexity;  /* full attention, the reference */
    int passkey[2], kv_recall[2];
    uint32_t n_rows;
    kvq_eval_row_result rows[KVQ_EVAL_MAX_ROWS];
} kvq_eval_report;

/* `kvq eval` with retrieval: the model (GGUF file or HF directory), the artifact (NULL:
 * the selectors without codebooks; its recorded positions mode and scoring query are
 * used) and the corpus spec, into *out. Errors: those of opening the three, bad lists
 * (INVALID_ARG), more than KVQ_EVAL_MAX_ROWS rows (TOO_LARGE), the harness's. */
kvq_status kvq_eval_files(const char *model_path, const char *artifact_path,
                          const char *corpus, const kvq_eval_options *o, kvq_eval_report *out,
                          kvq_err *err);

#ifdef KVQ_UNSTABLE_API
/* ---- unstable: the harness ------------------------------------------------------------ */

/* Metric m of the summed statistics st: NaN when it has no step (or, for the measured
 * figures, no measured step). */
double kvq_eval_metric_value(const kvq_retrieval_stats *st, kvq_eval_metric m);

/* a += b, field by field. */
void kvq_eval_stats_add(kvq_retrieval_stats *a, const kvq_retrieval_stats *b);

/* The selector x budget rows of the lists (the defaults as kvq_eval_options says) over
 * base: *rows malloc'd (free()), names filled. "full" gets one row (budget "all").
 * Errors: INVALID_ARG (a bad name or budget, a selector that needs the missing
 * artifact: "the S selector needs --artifact"), MISMATCH ("selector S: the artifact's
 * method is M"), NOMEM. */
typedef struct kvq_eval_row {
    kvq_retrieval_params rp;
    char name[32];    /* selector as printed: the artifact's method for codebook */
    char budget[32];
} kvq_eval_row;
/* The positions mode and scoring query recorded by kvq calibrate in rt (KVQ_META_POS_*)
 * into p, each unless keep_*; 1 when rt has them and one was not kept. */
int kvq_eval_artifact_positions(const kvq_codebook_set *rt, kvq_retrieval_params *p,
                                int keep_positions, int keep_score);
kvq_status kvq_eval_rows_expand(const char *selectors, const char *budgets,
                                const kvq_codebook_set *rt, const kvq_retrieval_params *base,
                                kvq_eval_row **rows, size_t *n_rows, kvq_err *err);

/* ---- one harness: a model, an artifact, a forward pass ---------------------------- */

typedef struct kvq_eval_params {
    int64_t max_tokens; /* longest sequence or task (prompt + answer), >= 2 */
    int64_t last;       /* 0: every prediction; N > 0: the last N of each sequence */
    int32_t threads;    /* forward threads (default 1) */
    int measure;        /* 1 (default): rows collect the per-step figures */
    const char *name;   /* names the corpus in messages (default "eval") */
    kvq_callbacks cb;   /* logs and progress ("eval", in tokens run) */
} kvq_eval_params;

kvq_eval_params kvq_eval_params_default(void);

/* One row's result. nll is the mean over the reference's predicted tokens. */
typedef struct kvq_eval_result {
    double nll, ppl;
    uint64_t n_pred;
    kvq_retrieval_stats st;
    int correct[3];     /* correct task answers per kvq_corpus_task */
    double seconds;
} kvq_eval_result;

typedef struct kvq_eval kvq_eval;

/* A harness over model m and the artifact's codebooks rt (NULL: selectors without
 * codebooks only). Errors: NOMEM, the forward's. */
kvq_status kvq_eval_create(const kvq_model *m, const kvq_codebook_set *rt,
                           const kvq_eval_params *p, kvq_eval **out, kvq_err *err);
void kvq_eval_free(kvq_eval *ev);

/* Sets the progress total (tokens the coming calls run) and the count so far. */
void kvq_eval_progress_plan(kvq_eval *ev, uint64_t total);

/* Perplexity of the sequences with full attention (the reference the rows divide by).
 * INVALID_ARG when no token is predicted. */
kvq_status kvq_eval_reference(kvq_eval *ev, const kvq_seq_set *ss, kvq_eval_result *out,
                              kvq_err *err);

/* Perplexity and statistics of every row (out[n_rows]; ref: the reference's result) */
kvq_status kvq_eval_rows(kvq_eval *ev, const kvq_seq_set *ss, const kvq_retrieval_params *rows,
                         const char *const *names, size_t n_rows, const kvq_eval_result *ref,
                         kvq_eval_result *out, kvq_err *err);

/* ---- task documents ----------------------------------------------------------------- */

typedef struct kvq_eval_tasks kvq_eval_tasks;

/* The corpus's task documents (passkey, kv-recall) as prompts and answers. */
kvq_status kvq_eval_tasks_read(const kvq_corpus *corpus, const kvq_tokenizer *tok,
                               kvq_eval_tasks **out, kvq_err *err);
void kvq_eval_tasks_free(kvq_eval_tasks *t);
size_t kvq_eval_tasks_count(const kvq_eval_tasks *t, int kind); /* kind < 0: all */
int64_t kvq_eval_tasks_longest(const kvq_eval_tasks *t);       /* prompt + answer */

/* Answers with full attention: correct[3] per kind, answers[count + 1] '1' / '0' per
 * task, NUL-terminated. */
kvq_status kvq_eval_tasks_reference(kvq_eval *ev, const kvq_eval_tasks *t,
                                    const kvq_tokenizer *tok, int correct[3], char *answers,
                                    kvq_err *err);

/* Every row's answers: out[i].correct, and answers + i * (count + 1) as above. */
kvq_status kvq_eval_tasks_rows(kvq_eval *ev, const kvq_eval_tasks *t, const kvq_tokenizer *tok,
                               const kvq_retrieval_params *rows, size_t n_rows,
                               kvq_eval_result *out, char *answers, kvq_err *err);

/* ---- full attention alone (eval/full.c) ------------------------------------------------ */

typedef struct kvq_eval_full_result {
    kvq_corpus_stats stats;   /* the corpus as read (second half: n_tokens of the stream) */
    uint64_t n_seq;           /* sequences (second half: chunks) scored */
    uint64_t n_pred;
    double nll, ppl;          /* mean NLL over n_pred, exp of it */
    double seconds;           /* tokenizing and scoring */
} kvq_eval_full_result;

/* Perplexity with full attention, streamed as the corpus is tokenized (progress: the
 * corpus reader's, per token). second_half = 1: llama.cpp's perplexity tool (the token
 * stream, BOS first when the model adds one, cut into chunks of seq_len, each from an
 * empty cache with its first token replaced by BOS, the second half scored); else
 * sequences of seq_len, every prediction (p->last 0) or the last p->last of each.
 * INVALID_ARG when nothing is scored. */
kvq_status kvq_eval_full(const kvq_model *m, const kvq_corpus *corpus, const kvq_tokenizer *tok,
                         int64_t seq_len, int64_t max_tokens, int second_half,
                         const kvq_eval_params *p, kvq_eval_full_result *out, kvq_err *err);

/* ---- the whole table ---------------------------------------------------------------- */

typedef struct kvq_eval_table {
    kvq_corpus_stats stats;   /* the corpus as read */
    size_t n_sequences;
    uint64_t n_pred;          /* predicted tokens per row */
    kvq_eval_result reference;
    size_t n_tasks;
    int n_task[3];            /* task documents per kvq_corpus_task */
    size_t n_rows;
    kvq_eval_result *rows;    /* [n_rows] */
    char *answers;            /* [1 + n_rows][n_tasks + 1]: the reference's task answers,
                                 then each row's ('1' correct, '0' not), NUL-terminated */
} kvq_eval_table;

/* Reads the corpus (sequences of seq_len tokens, at most max_tokens, 0 = all; BOS as
 * the model adds it), measures the reference and every row, and answers the tasks.
 * p->max_tokens is raised to the longest sequence or task. *out is zeroed first. */
kvq_status kvq_eval_table_run(const kvq_model *m, const kvq_codebook_set *rt,
                              const kvq_corpus *corpus, const kvq_tokenizer *tok,
                              int64_t seq_len, int64_t max_tokens, const kvq_eval_params *p,
                              const kvq_retrieval_params *rows, const char *const *names,
                              size_t n_rows, kvq_eval_table *out, kvq_err *err);
void kvq_eval_table_free(kvq_eval_table *t);

/* Answers of row i (-1: the reference). */
const char *kvq_eval_table_answers(const kvq_eval_table *t, long i);
/* ---- captured rows (eval/seq.c) ------------------------------------------------------
 * One sequence of a capture (no model forward): its rows' queries, keys and values,
 * measured under selector settings. The budget profile's figures come from here. */
typedef struct kvq_eval_seq {
    int32_t layer;
    int64_t n, P;             /* rows; the first P are the prompt */
    const float *q, *k, *v;   /* [n, nh, d] (the sampled path reads the measured rows'
                                 only), [n, nkv, d] x 2 */
    const int64_t *pos;       /* [n] positions */
    const int64_t *mrow;      /* [nm] the measured rows, ascending, in [P, n) */
    int64_t nm;
    int32_t nh, nkv, d;
} kvq_eval_seq;

/* The sampled path, every setting at once: from a reset, the rows up to each measured
 * one appended to ctx (created with measure = 1, prefill_full = 0) in chunks, each
 * measured row appended alone and measured by kvq_retrieval_probe: z[i n_set + c] its
 * figures under set[c] (kvq_eval_metric_value reads them). Rows after the last measured
 * one are not read. Errors: the probe's and the append's. */
kvq_status kvq_eval_seq_probe(kvq_retrieval *ctx, const kvq_eval_seq *S,
                              const kvq_retrieval_setting *set, int32_t n_set,
                              kvq_retrieval_stats *z, kvq_err *err);

/* The reference path of one setting: from a reset, ctx (its setting, measure = 1,
 * prefill_full = 0) attends the prompt, then the continuation rows by retrieval;
 * *z the continuation's statistics, o [n, nh, d] the outputs. */
kvq_status kvq_eval_seq_attend(kvq_retrieval *ctx, const kvq_eval_seq *S, float *o,
                               kvq_retrieval_stats *z, kvq_err *err);

/* A figure sampled over n units (sum and sum of squares of the units' values): its mean
 * and standard error (NaN when n = 0; se 0 when n = 1). The 95% half-width is 1.96 se. */
void kvq_eval_sample_interval(double sum, double sq, double n, double *mean, double *se);

#endif /* KVQ_UNSTABLE_API */


#ifdef KVQ_UNSTABLE_API
/* ---- RULER-style task suite (eval/ruler_gen.c, eval/ruler_run.c) ----------------------
 * The synthetic long-context tasks of RULER (Hsieh et al., "RULER: What's the Real
 * Context Size of Your Long-Context Language Models?", arXiv 2404.06654; docs/ruler.md):
 * needles in a haystack of the user's filler text (one needle with a 7-digit number or
 * a UUID value; several keys with one asked; one key with several values; several keys
 * all asked), variable tracking (a chain of "VAR X = VAR Y" assignments) and common-word
 * extraction (a numbered word list). A prompt is sized in the model's own tokens: its
 * tokens plus the answer budget n_gen come to the asked length (RULER's convention)
 * within 2%, never over it. Same filler, seed and sample: the same bytes. */
typedef enum kvq_ruler_task {
    KVQ_RULER_NIAH_SINGLE_NUMBER = 0, /* one needle, a 7-digit number */
    KVQ_RULER_NIAH_SINGLE_UUID,       /* one needle, a UUID */
    KVQ_RULER_NIAH_MULTIKEY,          /* 4 needles of different keys, one asked */
    KVQ_RULER_NIAH_MULTIVALUE,        /* 4 values of one key, all asked */
    KVQ_RULER_NIAH_MULTIQUERY,        /* 4 needles of different keys, all asked */
    KVQ_RULER_VT,                     /* variable tracking: 1 chain of 4 hops */
    KVQ_RULER_CWE,                    /* the 10 most common words of a list */
    KVQ_RULER_N_TASKS
} kvq_ruler_task;

const char *kvq_ruler_task_name(kvq_ruler_task t); /* "niah_single_number", ... */
/* 1: scored by RULER's string_match_all (every task here), 0: string_match_part. */
int kvq_ruler_task_match_all(kvq_ruler_task t);
/* "ruler" (every task) or "ruler:NAME,NAME" into *mask (bit t per task). INVALID_ARG
 * naming the bad word and listing the tasks. */
kvq_status kvq_ruler_tasks_parse(const char *spec, unsigned *mask, kvq_err *err);

/* RULER's string match over one prediction, case-insensitive: all = 1 (match_all) the
 * share of the answers found in pred, all = 0 (match_part) 1 when any is, else 0. */
double kvq_ruler_score(const char *pred, const char *const *answers, size_t n, int all);

/* Where an answer sits: text[char_begin, char_end) is answers[answer] and the prompt's
 * tokens [tok_begin, tok_end) cover it. */
typedef struct kvq_ruler_span {
    uint32_t answer;
    size_t char_begin, char_end;
    int64_t tok_begin, tok_end;
} kvq_ruler_span;

typedef struct kvq_ruler_prompt {
    kvq_ruler_task task;
    int64_t length;          /* asked: n_ids + n_gen <= length, within 2% of it */
    uint32_t sample;
    char *text;              /* [len], NUL-terminated: context, then question */
    size_t len;
    size_t ctx_chars;        /* text[0, ctx_chars) is the context */
    int32_t *ids;            /* the text's tokens, BOS first when the model adds one */
    size_t n_ids;
    size_t n_ctx;            /* ids[0, n_ctx) are the context's (prefilled densely) */
    int32_t n_gen;           /* tokens decoded for the answer */
    char **answers;          /* [n_answers] */
    size_t n_answers;
    kvq_ruler_span *spans;   /* [n_spans]: every place an answer sits */
    size_t n_spans;
} kvq_ruler_prompt;

typedef struct kvq_ruler_filler kvq_ruler_filler;

/* The filler text: the corpus's text documents (no task or ids documents) joined,
 * whitespace folded to one space, cut into sentences, at most 16 MB; its words (3-12
 * letters, lower case, in order of first use) give the needles' keys and the word
 * list. INVALID_ARG when it has no sentence or fewer than 64 distinct words. */
kvq_status kvq_ruler_filler_read(const kvq_corpus *corpus, const kvq_tokenizer *tok,
                                 kvq_ruler_filler **out, kvq_err *err);
void kvq_ruler_filler_free(kvq_ruler_filler *f);

/* Sample `sample` of task t at `length` tokens, seeded by (seed + sample, t, length):
 * sample k of seed s is sample 0 of seed s + k.
 * INVALID_ARG: a length too short for the task's fixed text (or its answer), a filler
 * with too few distinct words for the word list. */
kvq_status kvq_ruler_generate(const kvq_ruler_filler *f, const kvq_tokenizer *tok,
                              kvq_ruler_task t, int64_t length, uint64_t seed, uint32_t sample,
                              kvq_ruler_prompt *out, kvq_err *err);
void kvq_ruler_prompt_free(kvq_ruler_prompt *p);

/* The suite through the harness: per prompt the context prefilled once with full
 * attention (recorded and replayed into every row), then per row the question run and
 * n_gen tokens decoded greedily with the row's retrieval (stopping at EOS), the
 * continuation scored (kvq_ruler_score). Rows are the caller's (put a full-attention
 * row in them for the dense score). Progress ("eval", tokens run: the context once,
 * the question and answer per row). */
typedef struct kvq_ruler_params {
    unsigned tasks;          /* bit per kvq_ruler_task */
    const int64_t *lengths;
    size_t n_lengths;
    uint32_t samples;        /* per task and length */
    uint64_t seed;
} kvq_ruler_params;

typedef struct kvq_ruler_result {
    size_t n_cells;          /* task x length, tasks in enum order, then lengths */
    kvq_ruler_task *task;    /* [n_cells] */
    int64_t *length;         /* [n_cells] */
    uint32_t samples;
    size_t n_rows;
    double *score;           /* [n_rows][n_cells][samples]: each sample's score in [0, 1] */
    char **pred;             /* [n_rows][n_cells][samples]: the decoded continuations */
    double seconds;
} kvq_ruler_result;

kvq_status kvq_eval_ruler_run(const kvq_model *m, const kvq_codebook_set *rt,
                              const kvq_ruler_filler *f, const kvq_tokenizer *tok,
                              const kvq_ruler_params *rp, const kvq_eval_params *p,
                              const kvq_retrieval_params *rows, size_t n_rows,
                              kvq_ruler_result *out, kvq_err *err);
/* Mean score of row i in cell c, in [0, 1]. */
double kvq_ruler_result_mean(const kvq_ruler_result *r, size_t i, size_t c);
void kvq_ruler_result_free(kvq_ruler_result *r);
#endif /* KVQ_UNSTABLE_API */

#ifdef __cplusplus
}
#endif
#endif /* KVQ_EVAL_H */
