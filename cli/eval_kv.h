/* eval_kv.h — the compressed KV cache options (`--kv` and its parameters) of `kvq eval`
 * (cli/eval_kv.c) and their resolution against an artifact's profile. Public headers
 * only. */
#ifndef KVQ_CLI_EVAL_KV_H
#define KVQ_CLI_EVAL_KV_H

#include <stdio.h>

#include "kvq.h"

typedef struct cli_kv {
    kvq_kv_kind kind;       /* --kv (default f16: the exact cache) */
    int given;              /* --kv was given (f16 too) */
    double alpha_h, alpha_l; /* --alpha-h, --alpha-l (NaN: the artifact's) */
    int64_t window;         /* --kv-window (-1: the artifact's, else 64) */
    int32_t schedule;       /* --pats-schedule (-1: the artifact's) */
    int64_t b_min, b_max;   /* --pats-b MIN:MAX (-1: the artifact's) */
    double prompt_fraction; /* --kv-prompt (NaN: the artifact's thresholds.prompt_fraction,
                               else 0.5) */
} cli_kv;

void cli_kv_init(cli_kv *o);
/* Consumes a --kv option at argv[*i] (0), a bad value (2, message printed), or -1 when
 * argv[*i] is not one. */
int cli_kv_opt(const char *cmd, cli_kv *o, int argc, char **argv, int *i);
void cli_kv_usage(FILE *f);

/* The cache parameters of o: the options, else the artifact's (NULL: none). Prints the
 * error and returns 1 (2 for a usage error) when one is missing or out of range, or
 * the kind has no compressed cache (f16). frac: the prompt share. */
int cli_kv_resolve(const cli_kv *o, const char *artifact, kvq_kvcache_params *p, double *frac);

/* `kvq eval --kv KIND` without retrieval: perplexity with full attention over the exact
 * cache and over the compressed one, each sequence's first floor(prompt_fraction n)
 * tokens its prompt and the rest predicted, and the memory the cache held. artifact
 * (or NULL) supplies the parameters not given. Returns the exit code. */
int cli_eval_kv(const cli_kv *o, const char *artifact, const kvq_model *m,
                const char *model_path, const char *spec, const kvq_corpus *corpus,
                const kvq_tokenizer *tok, int64_t seq_len, int64_t max_tokens, int32_t threads,
                int json, const kvq_callbacks *cb);

/* What both evaluations over a cache start with: corpus's sequences (seq_len tokens
 * each, max_tokens in all, the tokenizer's BOS) into *sl, a forward pass over m (threads,
 * max_tokens seq_len, cb without progress) into *f, its chunk into *chunk and logits for
 * one chunk ([chunk, vocab_size] floats) into *logits. Returns 0, else prints the error
 * and returns the exit code; what was made is left for the caller to free either way. */
int cli_kv_seq_forward(const kvq_model *m, const char *model_path, const kvq_corpus *corpus,
                       const kvq_tokenizer *tok, int64_t seq_len, int64_t max_tokens,
                       int32_t threads, const kvq_callbacks *cb, kvq_seq_set *sl,
                       kvq_forward **f, int32_t *chunk, float **logits);

/* The full-attention reference's outcome (mean NLL ref over n_ref predicted tokens, begun
 * at kvq_now() t0): no token predicted prints the error naming spec and returns 1; else
 * its perplexity and time are logged (cb) and 0 returned. */
int cli_kv_reference_done(double ref, uint64_t n_ref, double t0, const char *spec,
                          const kvq_callbacks *cb);

/* The kind's settings as JSON members ("alpha_h": .., "schedule": ..; none for f16). */
void cli_kv_settings_json(const kvq_kvcache_params *p, char *out, size_t size);

/* `kvq eval --kv KIND --selectors S --budgets B`: retrieval over the compressed cache
 * (cli/eval_kv_retr.c; f16: r's own rows). Each sequence's first floor(prompt_fraction
 * n) tokens are its prompt (one exact prefill), the rest decoded one token per call and
 * predicted (kvq_perplexity_seq_last), full attention the same way as the reference;
 * one row per selector x budget with the memory the compressed cache held. */
struct cli_retrieval;
int cli_eval_kv_retrieval(const cli_kv *o, struct cli_retrieval *ro, const kvq_model *m,
                          const char *model_path, const char *spec, const kvq_corpus *corpus,
                          const kvq_tokenizer *tok, int64_t seq_len, int64_t max_tokens,
                          int32_t threads, int json, const kvq_callbacks *cb);

#endif /* KVQ_CLI_EVAL_KV_H */
