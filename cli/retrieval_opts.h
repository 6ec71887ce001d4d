/* retrieval_opts.h — the retrieval-attention options shared by `kvq run` and `kvq eval`
 * (cli/retrieval_opts.c): parsing, help text, opening the artifact for a model, and the
 * selector / budget lists of eval. Uses the public headers only. */
#ifndef KVQ_CLI_RETRIEVAL_OPTS_H
#define KVQ_CLI_RETRIEVAL_OPTS_H

#include <stdio.h>

#include "kvq.h"
#include "kvq/model.h"
#include "kvq/runtime.h"

typedef struct cli_retrieval {
    const char *artifact;   /* --artifact, or NULL */
    const char *selectors;  /* --selector (run) / --selectors (eval), or NULL */
    const char *budgets;    /* --budget (run) / --budgets (eval), or NULL */
    kvq_retrieval_params p; /* --sink --window --positions --cache --group --tau
                                  --rows --attn-threads --device; selector and budget
                                  per row */
    int given;              /* some retrieval option was given */
    int pos_given;          /* --positions given: the artifact's recorded mode is not used */
    int score_given;        /* --score-pos given: the artifact's recorded query is not used */
    int accept_mismatch;    /* --accept-model-mismatch: other weights only warn */
} cli_retrieval;

void cli_retrieval_init(cli_retrieval *o);

/* If argv[*i] is a retrieval option, consumes it (and its value: *i advances) and
 * returns 0, or prints "kvq CMD: ..." and returns 2 for a bad value. Returns -1 when
 * argv[*i] is not a retrieval option. eval = 1 takes the list forms --selectors and
 * --budgets, eval = 0 the single --selector and --budget. */
int cli_retrieval_opt(const char *cmd, cli_retrieval *o, int argc, char **argv, int *i, int eval);

/* The option lines of the help text. */
void cli_retrieval_usage(FILE *f, int eval);

/* Resolves o->p.device (kvq_retrieval_device_resolve: one warning through cb when CUDA
 * was asked for and cannot run) and opens o->artifact for model m (NULL in *rt when none
 * was given). Prints the error and returns 1 on failure. */
int cli_retrieval_open(cli_retrieval *o, const kvq_model *m, const char *model_path,
                       const kvq_callbacks *cb, kvq_codebook_set **rt);

/* One row of a selector x budget table. */
typedef struct cli_row {
    kvq_selector selector;
    kvq_budget budget;
    char name[32]; /* selector as printed: the artifact's method for codebook */
    char budget_str[32];
} cli_row;

/* Expands the selector list (default: full, oracle, the artifact's method (with an
 * artifact), fier, quest, mass (with an artifact)) times the budget list (default
 * "6%"); "full" gets one row (budget "all"). Checks that a method name matches the
 * artifact and that codebook / mass have one. *rows is malloc'd. Prints the error and
 * returns 2 on a bad list, 1 on a mismatch. */
int cli_retrieval_rows(const char *cmd, const cli_retrieval *o, const kvq_codebook_set *rt,
                       cli_row **rows, size_t *n_rows);

/* `kvq eval` with retrieval (cli/eval_table.c, the harness of kvq/eval.h): perplexity with full attention
 * (the reference) and for every selector x budget row with retrieval at every
 * evaluated position, the rows' attention figures, and passkey / kv-recall accuracy
 * over the corpus's task documents (prompt attended exactly, answer decoded greedily
 * with retrieval). score_last > 0 (--score last:N): per sequence only the last N
 * predictions, the prompt before them prefilled exactly and each of them a one-token
 * decode step (kvq_perplexity_seq_last). Prints the table (or JSON) and returns the
 * exit code. */
int cli_eval_retrieval(cli_retrieval *o, const kvq_model *m, const char *model_path,
                       const char *spec, const kvq_corpus *corpus, const kvq_tokenizer *tok,
                       int64_t seq_len, int64_t max_tokens, int64_t score_last,
                       int32_t threads, int json, const kvq_callbacks *cb);

#endif
