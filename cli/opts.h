/* opts.h — option groups that several subcommands share, parsed in one place
 * (cli/opts.c): the model group of `kvq run` and `kvq eval`, the codebook-fit group of
 * `kvq fit` and `kvq calibrate`. (The retrieval group of run and eval:
 * cli/retrieval_opts.h.) Each *_opt function looks at argv[*i]: it returns -1 when
 * that is not an option of its group; else it consumes it (and its value: *i
 * advances) and returns 0, or prints "kvq: CMD: ..." and returns the exit code 2. */
#ifndef KVQ_CLI_OPTS_H
#define KVQ_CLI_OPTS_H

#include <stdint.h>

#include "kvq.h"

/* --model M, --seed S, --threads T, -q/--quiet, -v/--verbose, --accept-approx-tokenizer */
typedef struct cli_model_opts {
    const char *model;   /* NULL until given */
    int approx_tokenizer; /* kvq_model_params.accept_approx_tokenizer */
    int64_t seed;        /* 0 .. INT64_MAX (default 0) */
    int64_t threads;     /* 1 .. 1024; 0 (default) = OpenBLAS's choice */
    int quiet, verbose;
} cli_model_opts;

int cli_model_opt(const char *cmd, cli_model_opts *o, int argc, char **argv, int *i);

/* --method M, --codebook K, --groups G, --iters N, --init NAME, into p. The caller
 * has checked that the option has a value (its "needs a value" message). */
int cli_fit_opt(const char *cmd, kvq_fit_params *p, int argc, char **argv, int *i);

/* A comma-separated list of profile knobs (leankv, pats, budget, mass, all) into the
 * KVQ_KNOB_* bit set *knobs; 0, or the exit code 2 with "kvq: CMD: --knobs: ..." printed. */
int cli_parse_knobs(const char *cmd, const char *s, unsigned *knobs);

#endif
