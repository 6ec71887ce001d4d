/*
 * runtime/local.h — the local layers of the decoding context: the sliding-window layers
 * of a model that also has global layers (gemma2, gemma3, qwen2 with max_window_layers).
 * They need no retrieval: each attends its window exactly, as kvq_model_layer_attn
 * describes the layer (its own RoPE base and scaling, score scale, softcap and window),
 * from a ring of the last rows. Not a public header.
 *
 * Window (transformers' sliding_window, llama.cpp's n_swa): a query at token index t
 * attends the tokens t - W + 1 .. t, itself included (W tokens): transformers masks
 * kv_idx <= q_idx - W (masking_utils.sliding_window_overlay), llama.cpp masks
 * p1 - p0 >= n_swa (is_masked_swa, LLAMA_SWA_TYPE_STANDARD). The index is the token's
 * place in the sequence, not its RoPE position.
 *
 * When every layer has a window (mistral, phi3) no layer is local: the retrieval runtime
 * selects within the window (kvq_rt_window_start), and fit fits their codebooks.
 */
#ifndef KVQ_RUNTIME_LOCAL_H
#define KVQ_RUNTIME_LOCAL_H

#include "kvq/model.h"

typedef struct rt_local rt_local;

/* 1 when layer `layer` of c is local: it has a window and some layer of c has none. */
int kvq_rt_layer_local(const kvq_model_config *c, int32_t layer);
/* Number of local layers of c. */
int32_t kvq_rt_local_count(const kvq_model_config *c);

/* The local layers of c (NULL in *out when c has none), for sequences of up to
 * max_tokens tokens, attending with up to `threads` OpenMP threads. Errors:
 * INVALID_ARG (a layer's RoPE), NOMEM. */
kvq_status kvq_rt_local_create(const kvq_model_config *c, int64_t max_tokens, int32_t threads,
                               rt_local **out, kvq_err *err);
void kvq_rt_local_free(rt_local *lc); /* NULL is fine */
void kvq_rt_local_reset(rt_local *lc);
int kvq_rt_local_has(const rt_local *lc, int32_t layer);
int64_t kvq_rt_local_length(const rt_local *lc, int32_t layer); /* tokens seen */
uint64_t kvq_rt_local_bytes(const rt_local *lc);                /* rows held */

/* Appends the chunk c (layer local) and, when c->q and c->out are set, writes each
 * query row's exact attention over its window into c->out. Errors: INVALID_ARG (more
 * than max_tokens, a position outside [0, 2^31)), NOMEM. */
kvq_status kvq_rt_local_attend(rt_local *lc, const kvq_attn_call *c, kvq_err *err);

#endif /* KVQ_RUNTIME_LOCAL_H */
