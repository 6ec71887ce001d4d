/* eval_kv.h — the compressed KV cache options (`--kv` and its parameters) of `kvq eval`
 * (cli/eval_kv.c) and their resolution against an artifact's profile. Public headers
 * only. */
#ifndef KVQ_CLI_EVAL_KV_H
#define KVQ_CLI_EVAL_KV_H

#include <stdio.h>

#include "kvq.h"

typedef struct cli_kv {
    kvq_kv_kind kind;       /* --kv (default f16: the exact cache); a list's first kind */
    int given;              /* --kv was given (f16 too) */
    int list;               /* --kv LIST (eval): several kinds or all, one table */
    int all;                /* --kv all: every kind the settings allow */
    int n_kinds;            /* kinds[0 .. n_kinds) of the list, in its order */
    kvq_kv_kind kinds[4];
    double alpha_h, alpha_l; /* --alpha-h, --alpha-l (NaN: the artifact's) */
    int64_t window;         /* --kv-window (-1: the artifact's, else 64) */
    int32_t schedule;       /* --pats-schedule (-1: the artifact's) */
    int64_t b_min, b_max;   /* --pats-b MIN:MAX (-1: the artifact's) */
    double prompt_fraction; /* --kv-prompt (NaN: the artifact's thresholds.prompt_fraction,
                               else 0.5) */
} cli_kv;

void cli_kv_init(cli_kv *o);
/* Consumes a --kv option at argv[*i] (0), a bad value (2, message printed), or -1 when
 * argv[*i] is not one. One kind (kvq run). */
int cli_kv_opt(const char *cmd, cli_kv *o, int argc, char **argv, int *i);
/* The same with `--kv LIST` (kvq eval): kinds separated by commas, or all. */
int cli_kv_opt_list(const char *cmd, cli_kv *o, int argc, char **argv, int *i);
void cli_kv_usage(FILE *f);      /* kvq run's --kv lines */
void cli_kv_usage_list(FILE *f); /* kvq eval's (--kv LIST and its rows) */

/* The cache parameters of o: the options, else the artifact's (NULL: none). Prints the
 * error and returns 1 (2 for a usage error) when one is missing or out of range, or
 * the kind has no compressed cache (f16). frac: the prompt share. */
int cli_kv_resolve(const cli_kv *o, const char *artifact, kvq_kvcache_params *p, double *frac);

/* The kind's settings as JSON members ("alpha_h": .., "schedule": ..; none for f16). */
void cli_kv_settings_json(const kvq_kvcache_params *p, char *out, size_t size);

/* ---- kvq eval --kv: the rows (cli/eval_kv.c, cli/eval_kv_retr.c) ------------------- */

/* One row: a cache kind attended in full (alone: the prompt and the rest in chunks,
 * against the reference "chunks") or by one selector and budget (retrieval: an exact
 * prefill, then one token per call, against the reference "decode"). */
struct cli_row;
typedef struct cli_kv_row {
    kvq_kvcache_params kp;   /* the kind and its settings (f16: the exact rows) */
    const struct cli_row *sel; /* NULL: full attention over the cache; else retrieval */
    double frac;             /* each sequence's prompt share */
    double ref, nll;         /* mean NLL of the reference and of the row */
    uint64_t n_pred;
    kvq_kvcache_memory mem;  /* what the cache held at the end of each sequence */
    double attended;         /* mean share of the visible tokens attended (full: 1) */
    double held;             /* bytes per token held for the KV with retrieval: the
                                compressed cache's plus the context's (NaN: not reported) */
    kvq_retrieval_held ctx;  /* the retrieval context's part (kvq_retrieval_held_get) */
    double seconds;
} cli_kv_row;

/* How a row prints: today's single-kind forms (alone: a text block or one JSON object;
 * retrieval: one line or one JSON object per row) or the table of a --kv LIST (a text
 * line, or one element of the JSON rows array, without a newline). */
enum { CLI_KV_ALONE = 0, CLI_KV_RETR = 1, CLI_KV_TABLE = 2 };
void cli_kv_row_print(const cli_kv_row *r, int32_t head_dim, int style, int json);

/* What every row runs over: the sequences, one forward pass and its scratch. */
typedef struct cli_kv_run {
    const kvq_model_config *c;
    kvq_seq_set sl;
    kvq_forward *f;
    float *logits;
    int32_t chunk, threads;
    int64_t seq_len;
    double frac;
    const kvq_callbacks *cb;
    char what[160];          /* the progress task of the row running */
    int decode;              /* progress counts one-token calls only */
    uint64_t done, total;
} cli_kv_run;

/* Starts the progress of one row (what; tokens run, or with decode the one-token calls
 * only, total of them), reported through x->cb with its ETA. */
void cli_kv_progress(cli_kv_run *x, const char *what, int decode, uint64_t total);

/* Mean NLL over x's sequences with the decode schedule (each sequence's prompt one exact
 * prefill, then one token per call; kc, or NULL, laid out per sequence), and the count;
 * cli_kv_decode_steps: the one-token calls it makes. */
kvq_status cli_kv_decode_ppl(cli_kv_run *x, kvq_kvcache *kc, double *nll, uint64_t *n_pred,
                             kvq_err *err);
uint64_t cli_kv_decode_steps(const cli_kv_run *x);
/* An f16 cache's bytes for x's sequences. */
void cli_kv_f16_memory(const cli_kv_run *x, kvq_kvcache_memory *mem);

/* The retrieval row r->sel over r->kp (a retrieval context over a fresh compressed
 * cache; f16: its own rows), ro's parameters and rt's codebooks: fills r's figures but
 * the reference. dry: only makes the context and the cache (checks them). Returns 0 or
 * prints the error and returns the exit code. */
struct cli_retrieval;
int cli_kv_retr_row(cli_kv_run *x, const struct cli_retrieval *ro, const kvq_codebook_set *rt,
                    cli_kv_row *r, int dry);

/* `kvq eval --kv KIND|LIST [--selectors S --budgets B]`: perplexity and memory of each
 * cache kind, alone (full attention over the compressed cache) and with each selector x
 * budget, against full attention over the exact rows (each reference computed once per
 * command). One kind prints today's single-kind rows (alone without selectors, else the
 * retrieval rows only); a list prints one table (or one JSON object with rows). ro: its
 * artifact supplies the settings not given. Returns the exit code. */
int cli_eval_kv(const cli_kv *o, struct cli_retrieval *ro, const kvq_model *m,
                const char *model_path, const char *spec, const kvq_corpus *corpus,
                const kvq_tokenizer *tok, int64_t seq_len, int64_t max_tokens, int32_t threads,
                int json, const kvq_callbacks *cb);

#endif /* KVQ_CLI_EVAL_KV_H */
