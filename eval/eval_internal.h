/* eval_internal.h — the harness's internals (eval/): one exact prefill for every row,
 * the task documents, and the harness object. Uses the installed headers plus
 * kvq/util.h. */
#ifndef KVQ_EVAL_INTERNAL_H
#define KVQ_EVAL_INTERNAL_H

#include "kvq/eval.h"
#include "kvq/util.h"

/* ---- one exact prefill for every selector x budget row (eval/replay.c) ------------
 * The prompt's K and V rows are recorded by a forward observer during one exact
 * prefill; each row's fresh retrieval context then gets them appended in the prefill's
 * chunks, and the forward resumes after them (kvq_forward_resume): the figures of a
 * prefill per row at one prefill. */
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
 * here, so exact), in two calls split at cut (cut = m: one), recording the K and V
 * rows; the logits of the last token into logits when it is not NULL. */
kvq_status eval_replay_record(eval_replay *x, kvq_forward *f, const kvq_model_config *c,
                              const kvq_codebook_set *rt, const kvq_retrieval_params *p,
                              const int32_t *ids, int64_t m, int64_t cut, float *logits,
                              kvq_err *err);

/* Appends the recorded tokens to r (f's attention backend, just set: empty) in the
 * recorded chunks and resumes f after them. */
kvq_status eval_replay_apply(const eval_replay *x, kvq_forward *f, kvq_retrieval *r,
                             kvq_err *err);

/* ---- the task documents (eval/tasks.c) --------------------------------------------- */

typedef struct task {
    kvq_corpus_task kind;
    int32_t *ids; /* prompt, BOS first */
    size_t n;
    char *answer;
    int32_t n_gen; /* tokens to generate */
} task;

struct kvq_eval_tasks {
    task *t;
    size_t n;
    int64_t longest; /* prompt + generated */
};

/* ---- the harness (eval/harness.c) --------------------------------------------------- */

struct kvq_eval {
    const kvq_model_config *c;
    const kvq_codebook_set *rt;
    kvq_eval_params p;
    int32_t chunk;
    kvq_forward *f;
    float *logits;           /* [chunk, vocab] */
    int32_t *ids;            /* [max_tokens] */
    uint64_t done, total;    /* progress, in tokens run */
};

/* Reports n more tokens run ("eval"). */
void eval_progress(kvq_eval *ev, uint64_t n);

#endif
