/* eval_replay.h — one exact prefill for every selector x budget row of `kvq eval`:
 * the prefill runs once under a retrieval context (prefill_full) while an observer
 * records every layer's pre-RoPE keys and values; each row's fresh context gets them
 * appended in the same chunks (kvq_retrieval_append) and the forward resumes after
 * them (kvq_forward_resume). An exact prefill depends on the position mode, cache
 * dtype and window but not on the selector or budget (test_forward_resume), so each
 * row then computes what a prefill of its own would have given. */
#ifndef KVQ_CLI_EVAL_REPLAY_H
#define KVQ_CLI_EVAL_REPLAY_H

#include "cli/retrieval_opts.h"

typedef struct eval_replay {
    int32_t n_layers;
    size_t kvd;          /* n_kv_heads x head_dim */
    int64_t cap;         /* tokens per layer allocated */
    int64_t m;           /* tokens recorded per layer */
    int64_t *n;          /* [n_layers] recorded so far */
    float **k, **v;      /* [n_layers][cap x kvd] */
    int64_t *pos;        /* [cap]: 0 .. cap-1 */
    int32_t *chunks;     /* the prefill's chunk sizes (layer 0's calls) */
    size_t n_chunks;
} eval_replay;

/* Memory for prompts of up to cap tokens: 8 x layers x cap x kvd bytes. */
kvq_status eval_replay_init(eval_replay *x, const kvq_model_config *c, int64_t cap,
                            kvq_err *err);
void eval_replay_free(eval_replay *x);

/* From a reset: ids[0, m) through f under a retrieval context of p (prefill_full set
 * here), in two calls [0, cut) and [cut, m) (cut = m: one), recorded; logits (NULL:
 * none) of token m - 1 from the last call. f's attention is the built-in one after. */
kvq_status eval_replay_record(eval_replay *x, kvq_forward *f, const kvq_model_config *c,
                              const kvq_codebook_set *rt, const kvq_retrieval_params *p,
                              const int32_t *ids, int64_t m, int64_t cut, float *logits,
                              kvq_err *err);

/* Appends the recorded tokens to r (f's attention backend, just set: empty) in the
 * recorded chunks and resumes f after them. */
kvq_status eval_replay_apply(const eval_replay *x, kvq_forward *f, kvq_retrieval *r,
                             kvq_err *err);

#endif
