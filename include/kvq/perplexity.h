/*
 * kvq/perplexity.h — perplexity of a model on token sequences: the per-token loss, the
 * loop that runs sequences through a forward pass and sums it, and the set of
 * sequences it runs over (model/perplexity.c; kvq_seq_set_collect in kvq/corpus.h
 * cuts a corpus into one).
 *
 * Every perplexity kvq reports (`kvq eval` with full attention and per retrieval row,
 * `kvq profile` per knob setting) is exp(nll / n_pred) of the sums below, taken with
 * whatever attention backend the kvq_forward has at the time.
 */
#ifndef KVQ_PERPLEXITY_H
#define KVQ_PERPLEXITY_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/perplexity.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"
#include "kvq/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* -log softmax(logits)[target] in nats, computed stably in double (the per-token
 * loss behind every perplexity kvq reports).   // logits: [vocab] */
double kvq_token_nll(const float *logits, int32_t vocab, int32_t target);

/* ==========================================================================
 * Sequences held in memory
 * ========================================================================== */

/* The sequences of a corpus, concatenated: sequence i is ids[off[i] .. off[i + 1]).
 * Zero-initialise; free with kvq_seq_set_free. */
typedef struct kvq_seq_set {
    int32_t *ids;        /* [n_ids] all sequences, concatenated */
    int64_t *off;        /* [n + 1] (NULL while n = 0) */
    size_t n;            /* sequences */
    int64_t n_ids;       /* tokens */
    size_t cap;          /* private: capacity of off */
    int64_t ids_cap;     /* private: capacity of ids */
} kvq_seq_set;

/* Appends the sequence ids[0..n) to s. Errors: NOMEM. (A corpus is cut into a set by
 * kvq_seq_set_collect, kvq/corpus.h.) */
kvq_status kvq_seq_set_push(kvq_seq_set *s, const int32_t *ids, int64_t n, kvq_err *err);

void kvq_seq_set_free(kvq_seq_set *s); /* frees the arrays and zeroes *s; NULL is fine */

/* ==========================================================================
 * The perplexity loop
 * ========================================================================== */

/* Summed negative log-likelihood (nats) and the number of predicted tokens. */
typedef struct kvq_nll_sum {
    double nll;
    uint64_t n_pred;
} kvq_nll_sum;

/* Runs ids[0..n) through f from a reset (kvq_forward_reset) in chunks of `chunk`
 * tokens with all logits, and adds kvq_token_nll of every next token ids[t + 1] for
 * t in [from, n - 1) to *acc, in position order. logits: [chunk, vocab] scratch; the
 * forward's attention backend is used as set. Errors: those of kvq_forward_tokens
 * (*acc then holds the tokens summed before the error). */
kvq_status kvq_perplexity_seq(kvq_forward *f, const int32_t *ids, int64_t n, int64_t from,
                              int32_t chunk, int32_t vocab, float *logits, kvq_nll_sum *acc,
                              kvq_err *err);

/* One chunk of llama.cpp's perplexity tool (llama-perplexity, its default mode):
 * ids[0..n_ctx) are the next n_ctx tokens of the text's token stream (which starts
 * with BOS when the model adds one); when bos >= 0 the chunk's first token is replaced
 * by BOS (ids[0] is restored before returning), the chunk runs through f from a reset,
 * and only the second half is scored: the next tokens ids[t + 1] for t in
 * [n_ctx / 2, n_ctx - 1), n_ctx - n_ctx / 2 - 1 of them, are added to *acc. The text's
 * tokens after its last whole chunk are the caller's to drop. n_ctx >= 2. Errors:
 * those of kvq_perplexity_seq. */
kvq_status kvq_perplexity_chunk_llama(kvq_forward *f, int32_t *ids, int64_t n_ctx, int32_t bos,
                                      int32_t chunk, int32_t vocab, float *logits,
                                      kvq_nll_sum *acc, kvq_err *err);

/* The long-context way to score a sequence (a server's prefill, then decoding): the
 * last n_last next-token predictions of ids[0..n) only, each from its own one-token
 * step. From a reset, the prompt ids[0..n - n_last - 1) goes through f with no logits
 * in calls of more than one token (so that an attention backend attends it as a
 * prefill: when the forward's chunk would leave a last chunk of one token, the prompt
 * is cut in two calls; `chunk` is kvq_forward_params.chunk), then ids[n - n_last - 1
 * .. n - 2] one token per call, and kvq_token_nll of each next token is added to *acc
 * (min(n_last, n - 1) of them). With full attention the sum equals kvq_perplexity_seq's
 * with from = n - n_last - 1 up to rounding. n_last >= 1, chunk >= 3. Errors: those of
 * kvq_forward_tokens. */
kvq_status kvq_perplexity_seq_last(kvq_forward *f, const int32_t *ids, int64_t n, int64_t n_last,
                                   int32_t chunk, int32_t vocab, float *logits, kvq_nll_sum *acc,
                                   kvq_err *err);

/* Called for each sequence of kvq_perplexity_set with its length n, after the forward
 * was reset and before its first token (so it may prepare the attention backend);
 * returns the position from which tokens are predicted (the prompt before it is only
 * attended). */
typedef int64_t (*kvq_ppl_begin_fn)(void *user, int64_t n);

/* kvq_perplexity_seq over every sequence of s in order, all into *acc (not cleared
 * first), with from = begin(user, n) (begin NULL: from 0). Stops at the first error. */
kvq_status kvq_perplexity_set(kvq_forward *f, const kvq_seq_set *s, int32_t chunk,
                              int32_t vocab, float *logits, kvq_ppl_begin_fn begin, void *user,
                              kvq_nll_sum *acc, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_PERPLEXITY_H */
