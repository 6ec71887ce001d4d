/*
 * kvq/kvcache.h — full attention over a compressed KV cache: LeanKV (leankv paper:
 * keys and values quantized per vector, K8V4 for significant tokens and the recent
 * window, K4V2 for less significant ones, the least significant pruned, per KV head)
 * or PATS (pats paper: each token's K and V truncated by b(t) low mantissa bits and
 * packed in 64-byte blocks). An attention backend for kvq_forward
 * (kvq_forward_set_attention): each query attends over every kept token, reading the
 * stored rows in place (no dequantized copy of the cache). runtime/cache/kvc.h states
 * the formats and policies; the profile (kvq/thresholds.h) chooses the parameters and
 * stores them in the artifact (leankv.alpha_h, leankv.alpha_l, leankv.window,
 * pats.schedule, pats.b_min, pats.b_max).
 *
 * A sequence (from kvq_forward_reset) is a prompt, its first `prompt_tokens` tokens,
 * attended exactly and then compressed by LeanKV's prompt rule, and a generation
 * phase: each later token is appended (K8V4, in the window), attends, and runs one
 * step of Algorithm 1, whether the tokens come one per call or several in a chunk (the
 * outputs are the same). PATS truncates every token as it is appended, by b(t) for
 * t = 1..max_tokens (the schedule is laid over max_tokens).
 *
 * Layout: a model with a sliding attention window is refused (KVQ_E_UNSUPPORTED).
 * Same inputs -> same bytes for any thread count.
 */
#ifndef KVQ_KVCACHE_H
#define KVQ_KVCACHE_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/kvcache.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stdint.h>

#include "kvq/common.h"
#include "kvq/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvq_kv_kind {
    KVQ_KV_F16 = 0,    /* the exact cache (kvq_full_attn): not made here */
    KVQ_KV_LEANKV = 1,
    KVQ_KV_PATS = 2,
    KVQ_KV_LEANKV_PATS = 3 /* LeanKV over PATS-truncated values (docs/kvcache.md) */
} kvq_kv_kind;

/* "f16", "leankv", "pats", "leankv+pats"; "unknown" otherwise. */
const char *kvq_kv_kind_name(kvq_kv_kind k);
/* 0 and *k set, or -1 for an unknown name. */
int kvq_kv_kind_parse(const char *name, kvq_kv_kind *k);
/* A PATS schedule's name ("old-heavy", "new-heavy", "middle-heavy"): 0 and *s set, or -1. */
int kvq_kvcache_schedule_parse(const char *name, int32_t *s);

typedef struct kvq_kvcache_params {
    kvq_kv_kind kind;
    double alpha_h, alpha_l;  /* LeanKV thresholds (>= 0, alpha_l <= alpha_h; 1, 0.02) */
    int32_t window;           /* LeanKV recent window (>= 0; 64) */
    int32_t schedule;         /* PATS: 0 old-heavy, 1 new-heavy, 2 middle-heavy (2) */
    int32_t b_min, b_max;     /* PATS: 0 <= b_min <= b_max <= 10 (2, 8) */
    int64_t prompt_tokens;    /* LeanKV: tokens of each sequence's prompt (>= 0; 0) */
    int64_t max_tokens;       /* longest sequence, >= 1 (PATS lays b(t) over it) */
    int32_t threads;          /* 0 = OpenMP's default */
} kvq_kvcache_params;

kvq_kvcache_params kvq_kvcache_params_default(void);

typedef struct kvq_kvcache kvq_kvcache;

/* Errors: KVQ_E_INVALID_ARG naming the parameter out of range (or f16, which has no
 * cache here; leankv+pats checks both LeanKV's and PATS's settings), KVQ_E_UNSUPPORTED
 * (sliding window), KVQ_E_NOMEM. */
kvq_status kvq_kvcache_create(const kvq_model_config *cfg, const kvq_kvcache_params *p,
                              kvq_kvcache **out, kvq_err *err);
void kvq_kvcache_free(kvq_kvcache *c); /* NULL is fine */
kvq_attn_backend kvq_kvcache_backend(kvq_kvcache *c);
/* Lays the next sequence out before its first token (after kvq_forward_reset): a
 * prompt of prompt_tokens (>= 0) tokens and n_tokens (>= 1) in all (PATS lays b(t)
 * over them). Errors: KVQ_E_INVALID_ARG, KVQ_E_NOMEM. */
kvq_status kvq_kvcache_begin(kvq_kvcache *c, int64_t prompt_tokens, int64_t n_tokens,
                             kvq_err *err);

/* Rows without queries (an engine that attends its prompt itself, kvq/engine.h): n
 * tokens of `layer` at positions pos [n], k and v [n, n_kv_heads, head_dim] (pre-RoPE),
 * appended as generated tokens are (LeanKV: K8V4 in the window, then Algorithm 1 with
 * the significance the queries of later calls give them; PATS: truncated by b(t)).
 * Errors: KVQ_E_INVALID_ARG, KVQ_E_NOMEM, KVQ_E_NUMERIC. */
kvq_status kvq_kvcache_append(kvq_kvcache *c, int32_t layer, int64_t n, const int64_t *pos,
                              const float *k, const float *v, kvq_err *err);
/* Tokens held by a layer (0 for a layer out of range), and the bytes the current
 * sequence holds (every layer and KV head). */
int64_t kvq_kvcache_length(const kvq_kvcache *c, int32_t layer);
double kvq_kvcache_bytes(const kvq_kvcache *c);

/* Memory the cache held at the end of each sequence, summed over the sequences (the
 * current one included) and every layer and KV head: tokens, bytes in total and per
 * precision section (LeanKV HIGH and LOW rows; PATS rows count as high), and the
 * bytes an f16 cache of the same tokens holds (4 head_dim per token, layer, KV head).
 * LeanKV's prompt rows held exactly (a sequence that ended inside its prompt) are
 * counted in bytes_exact, at 8 head_dim. Pruned tokens hold nothing. */
typedef struct kvq_kvcache_memory {
    double tokens;
    double bytes, bytes_high, bytes_low, bytes_exact, bytes_f16;
    double pruned;            /* tokens x layers x KV heads pruned */
} kvq_kvcache_memory;
void kvq_kvcache_memory_get(const kvq_kvcache *c, kvq_kvcache_memory *out);

/* ---- Retrieval over a compressed cache (docs/kvcache.md "With retrieval") ----------
 * kvq_retrieval_set_kvcache attaches c to a retrieval context r (kvq/runtime.h) made
 * for the same model with positions KVQ_POSITIONS_ROPE. While c is attached r holds no
 * K / V rows of its own (it frees them and allocates none): it keeps its selector's
 * data (codes, residual bits and scales, Quest's pages, FIER's bits: built at append
 * from the call's exact keys, as without c), the positions and the row order, and
 * reads every row from c (kvq_kvcache_row, decoded one row at a time into the step's
 * scratch):
 *  - a decode step's rerank and attention (a pruned LeanKV token is never reranked or
 *    attended); the step's probabilities count into LeanKV's significance and
 *    Algorithm 1 runs after each token;
 *  - the oracle selector scores the keys c holds (pruned: never chosen before a held one);
 *  - an exact prefill (prefill_full, a call of 2+ rows) attends the earlier calls'
 *    tokens as c holds them before the call, and the call's own tokens from the call
 *    (rounded to the cache dtype, as r's rows held them): a prompt in one call gives
 *    what it gave with r's own rows, bit for bit;
 *  - the measurement (measure: recall, mass, output error) is against full attention
 *    over the rows c holds (not the exact rows).
 * LeanKV's prompt (while c is in it) is attended by c exactly, as without retrieval, to
 * classify it; r's outputs for those tokens are its prefill's (or, one row per call,
 * steps over c's rows with the call's own from the call). kvq_retrieval_held_get gives
 * what r holds per token. c: NULL detaches; attach or detach between sequences only (no
 * token held: after kvq_forward_reset / kvq_retrieval_reset); c must outlive r or be
 * detached first. Lay each sequence out with kvq_kvcache_begin after kvq_forward_reset.
 * kvq_retrieval_probe is refused while c is attached (KVQ_E_UNSUPPORTED).
 * Errors: KVQ_E_INVALID_ARG (positions not ROPE, a sequence under way), KVQ_E_UNSUPPORTED
 * (local or sliding-window layers). */
typedef struct kvq_retrieval kvq_retrieval;
kvq_status kvq_retrieval_set_kvcache(kvq_retrieval *r, kvq_kvcache *c, kvq_err *err);

/* The row reader: token tok's key (rotated by its position) and value [head_dim] as c
 * holds them, decoded to f32 (k or v NULL: not read); 1, or 0 for a pruned token or
 * one not held. */
int kvq_kvcache_row(const kvq_kvcache *c, int32_t layer, int32_t head, int64_t tok, float *k,
                    float *v);
/* 1 while the LeanKV cache's layer is in the sequence's prompt (held exactly). */
int kvq_kvcache_in_prompt(const kvq_kvcache *c, int32_t layer);
/* Token i of rows k, v [.., n_kv_heads, head_dim] (pre-RoPE) at pos[i] appended to every
 * KV head of layer, without Algorithm 1 (kvq_kvcache_policy runs it). */
kvq_status kvq_kvcache_put(kvq_kvcache *c, int32_t layer, int64_t i, const int64_t *pos,
                           const float *k, const float *v, kvq_err *err);
/* One query's probabilities p [gs, ld] over the tokens tok [m] counted into LeanKV's
 * significance (the last token held is the query's own); nothing for PATS. */
void kvq_kvcache_count(kvq_kvcache *c, int32_t layer, int32_t head, const int32_t *tok,
                       int64_t m, const float *p, int64_t ld);
/* Algorithm 1's step for (layer, head) after its last token was attended (LeanKV). */
kvq_status kvq_kvcache_policy(kvq_kvcache *c, int32_t layer, int32_t head, kvq_err *err);
/* The backend's attend on call with its outputs kept aside (call->out untouched). */
kvq_status kvq_kvcache_attend_aside(kvq_kvcache *c, const kvq_attn_call *call, kvq_err *err);

#ifdef __cplusplus
}
#endif

#endif /* KVQ_KVCACHE_H */
