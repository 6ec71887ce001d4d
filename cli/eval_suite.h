/* eval_suite.h — `kvq eval --suite` (cli/eval_suite.c): the RULER-style task suite. */
#ifndef KVQ_CLI_EVAL_SUITE_H
#define KVQ_CLI_EVAL_SUITE_H

#include "cli/retrieval_opts.h"
#include "kvq/corpus.h"
#include "kvq/tokenizer.h"

typedef struct cli_suite {
    const char *suite;       /* --suite, or NULL */
    int64_t lengths[16];     /* --lengths */
    size_t n_lengths;
    uint32_t samples;        /* --samples */
    uint64_t seed;           /* --seed */
} cli_suite;

/* Parses --lengths' value into lengths[16] (exit code, 0 when fine). */
int cli_suite_lengths(const char *val, int64_t *lengths, size_t *n);

/* Runs the suite and prints its table or JSON: the exit code. */
int cli_eval_suite(cli_retrieval *o, const kvq_model *m, const char *model_path,
                   const char *spec, const kvq_corpus *corpus, const kvq_tokenizer *tok,
                   const cli_suite *su, int32_t threads, int json, const kvq_callbacks *cb);

#endif
