/*
 * kvq/model.h — decoder models (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3):
 * loading and forward pass (docs/models.md lists what each architecture brings).
 *
 * A kvq_model is an immutable, read-only view of a checkpoint: its configuration, its
 * tokenizer and its weights, which stay in the mapped files (nothing is converted at
 * open time except the small 1-D norm and bias vectors). A kvq_forward is a mutable
 * working context over one model: scratch buffers, the current sequence and the
 * attention backend. Several contexts may share one model; a context is used by one
 * thread at a time.
 *
 * Inputs (docs/models.md)
 *   GGUF file    architectures "llama" (RoPE pairs interleaved: the converter permuted
 *                the Q and K weight rows), "qwen2", "qwen3", "gemma2", "gemma3" and
 *                "phi3" (pairs half); weights F32, F16,
 *                BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K
 *                (kvq/quant.h), kept packed in the mapping. Llama-3 scaling
 *                is read back from the converter's rope_freqs.weight tensor.
 *   HF directory config.json plus model.safetensors, or shards listed in
 *                model.safetensors.index.json; model_type / architectures llama,
 *                mistral, qwen2, qwen3, gemma2, gemma3_text or phi3; weights F32,
 *                F16 or BF16; RoPE pairs half.
 *   Anything else (architecture, weight type, rope type, a partial rotary dimension)
 *   fails with KVQ_E_UNSUPPORTED naming it.
 *
 * The forward pass (pre-norm transformer, row vectors):
 *   x = embed(token) (* embed_scale: gemma)
 *   per layer: h = rmsnorm(x) ; q = h Wq^T (+bq) ; k = h Wk^T (+bk) ; v = h Wv^T (+bv)
 *              (qwen3, gemma3: q, k = per-head rmsnorm(q), rmsnorm(k))
 *              a = attention(q, k, v, positions) Wo^T  (the layer's own RoPE, scale,
 *                  softcap and window: kvq_model_layer_attn)
 *              x += a   (gemma: x += rmsnorm(a))
 *              h = rmsnorm(x) ; m = (act(h Wg^T) * (h Wu^T)) Wd^T  (act: silu or gelu_tanh)
 *              x += m   (gemma: x += rmsnorm(m))
 *   logits = rmsnorm(x) Wout^T            (Wout = the embedding when tied;
 *                                          gemma2: c tanh(logits / c))
 * Gemma's (1 + w) norm weights are kept as 1 + w (as llama.cpp's converter writes them).
 * Tokens go through in chunks (kvq_forward_params.chunk) so every projection is one
 * cblas_sgemm over the chunk. After each projection the states are checked: NaN or Inf
 * in q, k, v, the residual stream or the logits stops the pass with KVQ_E_NUMERIC,
 * "MODEL: layer L position P: non-finite STATE".
 *
 * The attention step is pluggable (kvq_attn_backend below): the forward pass hands
 * the backend pre-RoPE q, k and v, and the backend applies RoPE, keeps whatever cache
 * it wants and returns the attention output. kvq_full_attn is the exact default. An
 * observer (kvq_observe_fn) sees the same pre-RoPE q, k, v before the backend does;
 * kvq capture records them through it.
 */
#ifndef KVQ_MODEL_H
#define KVQ_MODEL_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/model.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include "kvq/model_id.h"
#include "kvq/common.h"
#include "kvq/rope.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tokenizer type of kvq/tokenizer.h (declared here so this header stands alone). */
typedef struct kvq_tokenizer kvq_tokenizer;
/* The seeded generator of kvq_sample_token (kvq/util.h, internal). */
typedef struct kvq_rng kvq_rng;

/* ==========================================================================
 * Configuration
 * ========================================================================== */

typedef enum kvq_arch {
    KVQ_ARCH_LLAMA = 0,   /* Llama 1/2/3, TinyStories (llama2.c) */
    KVQ_ARCH_MISTRAL = 1, /* as llama, with a sliding attention window when configured */
    KVQ_ARCH_QWEN2 = 2,   /* llama plus q/k/v projection biases */
    KVQ_ARCH_QWEN3 = 3,   /* llama plus per-head RMSNorm of q and k before RoPE */
    KVQ_ARCH_GEMMA2 = 4,  /* gemma: embedding scaled by sqrt(dim), post-attention and
                             post-MLP norms, GELU (tanh); gemma2: attention and final
                             logit softcap, sliding window on every other layer */
    KVQ_ARCH_GEMMA3 = 5,  /* gemma plus q/k norm, sliding-window layers with their own
                             RoPE base (5 of every 6), no softcap */
    KVQ_ARCH_PHI3 = 6     /* llama with fused qkv and gate/up projections */
} kvq_arch;

#define KVQ_ARCH_COUNT 7
/* The supported architectures, comma-separated (for --help and messages). */
#define KVQ_ARCH_LIST "llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3"

/* The MLP's gate activation: silu(g) * u or gelu_tanh(g) * u. */
typedef enum kvq_act { KVQ_ACT_SILU = 0, KVQ_ACT_GELU_TANH = 1 } kvq_act;

typedef enum kvq_model_source { KVQ_MODEL_GGUF = 0, KVQ_MODEL_HF = 1 } kvq_model_source;

const char *kvq_arch_name(kvq_arch a);   /* "llama" | "mistral" | "qwen2" | "qwen3" | ... */
int kvq_arch_parse(const char *s, kvq_arch *out);        /* 0 ok, -1 unknown */
const char *kvq_model_source_name(kvq_model_source s);   /* "gguf" | "hf" */

typedef struct kvq_model_config {
    kvq_arch arch;
    kvq_model_source source;
    int32_t n_layers;
    int32_t dim;              /* residual width */
    int32_t hidden_dim;       /* MLP width */
    int32_t n_heads;          /* query heads */
    int32_t n_kv_heads;       /* divides n_heads */
    int32_t head_dim;         /* even; n_heads * head_dim need not equal dim */
    int32_t vocab_size;
    int32_t context_length;   /* trained context (metadata; not enforced) */
    int32_t sliding_window;   /* W > 0: layers from sliding_from on attend only the last
                                 W tokens (the query's own included); 0 = none */
    int32_t sliding_from;     /* first layer with the window: 0 for mistral, qwen2's
                                 max_window_layers (HF); unused when sliding_period > 0 */
    int32_t sliding_period;   /* P > 0: layer l has the window iff (l + 1) % P != 0 (gemma2:
                                 2, gemma3: 6); 0: the layers from sliding_from on */
    double norm_eps;          /* RMSNorm epsilon */
    kvq_rope rope;            /* base, scaling and pair layout; rope.head_dim == head_dim */
    int tied_embeddings;      /* 1: the output matrix is the token embedding */
    int qkv_bias;             /* 1: q/k/v projections have biases (qwen2) */
    int32_t bos_id, eos_id;   /* -1 when unknown */
    /* Beyond the llama family (all zero for llama, mistral, qwen2): */
    double rope_local_base;   /* > 0: the RoPE base of the sliding-window layers, which
                                 also take no scaling (gemma3: 10000); 0: rope.base */
    double attn_scale;        /* > 0: scores are q.k * attn_scale (gemma:
                                 query_pre_attn_scalar^-1/2); 0: 1/sqrt(head_dim) */
    double attn_softcap;      /* > 0: scores become c tanh(s / c) (gemma2) */
    double final_softcap;     /* > 0: logits become c tanh(l / c) (gemma2) */
    double embed_scale;       /* > 0: embeddings are multiplied by it (gemma: sqrt(dim)) */
    int qk_norm;              /* 1: per-head RMSNorm of q and k before RoPE (qwen3, gemma3) */
    int post_norms;           /* 1: RMSNorm of the attention and MLP outputs before they
                                 join the residual (gemma) */
    kvq_act act;              /* the MLP's gate activation */
} kvq_model_config;

/* One layer's attention as the model computes it (kvq_model_layer_attn). */
typedef struct kvq_layer_attn {
    kvq_rope rope;            /* this layer's RoPE: base and scaling */
    int use_rope;             /* 1; 0 would be a no-RoPE layer (none of the supported
                                 architectures has one; carried in the formats) */
    double scale;             /* score scale (1/sqrt(head_dim) unless the model says) */
    double softcap;           /* > 0: scores become c tanh(s / c); 0: none */
    int32_t window;           /* > 0: the layer attends only the last `window` tokens
                                 (the query's own included); 0: every earlier token */
} kvq_layer_attn;

/* Layer `layer`'s attention under configuration c, or as an identity records it
 * (captures, moments, artifacts: kvq/model_id.h). */
void kvq_model_layer_attn(const kvq_model_config *c, int32_t layer, kvq_layer_attn *out);
void kvq_model_id_layer_attn(const kvq_model_id *id, int32_t layer, kvq_layer_attn *out);

/* The first difference between two layers' attention: "window", "use_rope",
 * "rope.base", "rope.scaling", "rope.factor" (under a scaling), "scale" or "softcap"
 * (these two within a relative 1e-6), with both values in *va, *vb; NULL when they
 * describe the same attention. */
const char *kvq_layer_attn_diff(const kvq_layer_attn *a, const kvq_layer_attn *b, double *va,
                                double *vb);

/* 1 when every layer attends as the llama family does: the same RoPE, the score scale
 * 1/sqrt(head_dim), no softcap and, if any, one window from a first layer on (what an
 * attention backend without per_layer implements: the KV caches of kvq/kvcache.h); else 0, and the first difference is written to
 * why[cap] ("layer 0: RoPE base 10000 (layer 5: 1e+06)", ...). */
int kvq_model_attn_uniform(const kvq_model_config *c, char *why, size_t cap);

/* The first cached token a query of `layer` sees when n tokens are visible to it
 * (itself the last): n - W under a sliding window of W tokens, else 0. */
static inline int kvq_model_layer_sliding(const kvq_model_config *c, int32_t layer)
{
    if (c->sliding_window <= 0)
        return 0;
    return c->sliding_period > 0 ? (layer + 1) % c->sliding_period != 0 : layer >= c->sliding_from;
}
static inline int64_t kvq_model_window_start(const kvq_model_config *c, int32_t layer, int64_t n)
{
    return kvq_model_layer_sliding(c, layer) && n > c->sliding_window ? n - c->sliding_window : 0;
}

/* The one conversion between a configuration and an identity (kvq/model_id.h):
 * from_config copies every identity field (path's last component, name and fingerprint
 * empty, source and architecture by
 * name); to_config gives the configuration an identity describes: the attention shape,
 * widths, vocabulary and RoPE, architecture and source parsed from their names (llama
 * and gguf when unknown), the attention description (kvq_model_attn), untied, no
 * biases, bos/eos -1. */
void kvq_model_id_from_config(const kvq_model_config *c, const char *path, kvq_model_id *id);
kvq_model_config kvq_model_config_from_id(const kvq_model_id *id);

/* ==========================================================================
 * Model
 * ========================================================================== */

typedef struct kvq_model kvq_model;

typedef struct kvq_model_params {
    int load_tokenizer;       /* 1 (default): load the tokenizer when the model has one */
    kvq_callbacks cb;         /* warnings (e.g. a tokenizer larger than the model); may be zero */
    int accept_approx_tokenizer; /* 0 (default): a tokenizer whose pre-tokenizer or normalizer
                                    kvq does not implement is refused; 1: approximated, and
                                    kvq_tokenizer_approx(kvq_model_tokenizer(m)) says how */
} kvq_model_params;

kvq_model_params kvq_model_params_default(void);

/* Opens a GGUF file or an HF directory (told apart by stat). The files stay mapped
 * until kvq_model_close. Every tensor the forward pass needs is looked up and its
 * shape and type checked here, so a model that opens also runs.
 * Cost: reads headers and the 1-D tensors only; memory O(n_layers + vocab for the
 * tokenizer). Errors (message "PATH: problem" or "PATH: TENSOR: problem"):
 *   NOT_FOUND, IO            missing path, config.json, shard or tensor (named)
 *   BAD_JSON                 config.json / index.json malformed or missing a key (named)
 *   UNSUPPORTED              architecture, weight type, rope type or feature (named)
 *   SHAPE_MISMATCH           a tensor whose shape disagrees with the config (named)
 *   CORRUPT                  inconsistent config (heads not dividing, odd head_dim ...)
 *   every error of the GGUF / safetensors readers and of the tokenizer loader; NOMEM. */
kvq_status kvq_model_open(const char *path, const kvq_model_params *p, kvq_model **out,
                          kvq_err *err);
void kvq_model_close(kvq_model *m); /* NULL is fine */

const kvq_model_config *kvq_model_config_get(const kvq_model *m);
const char *kvq_model_path(const kvq_model *m);
/* The weight fingerprint (docs/format.md "Weight fingerprint"), computed at open: 32 hex
 * digits of a hash over the f32 values of the token embedding and every layer's
 * attention norm, Wq, bq, Wk and bk, in the HF row order. A GGUF file and an HF
 * directory holding the same values (F32, F16, BF16 or a quantized type dequantizing to
 * them) give the same fingerprint; files whose values differ (a Q4_1 and an F16 export
 * of one checkpoint, a fine-tune) give different ones. Changes confined to Wv, Wo, the
 * MLP or the output matrix are not covered. Cost at open: one dequantizing pass over
 * those tensors (41 M values for SmolLM2-135M Q4_1: 0.41 s on one core of the 2-core
 * CI machine under load; OpenMP threads split it, the result does not depend on how). */
const char *kvq_model_fingerprint(const kvq_model *m);
/* GGUF general.name, else the file or directory name. */
const char *kvq_model_name(const kvq_model *m);
/* The model's tokenizer (GGUF tokenizer.ggml.* metadata, or tokenizer.json in the HF
 * directory), or NULL when it has none or params.load_tokenizer was 0. Owned by m. */
const kvq_tokenizer *kvq_model_tokenizer(const kvq_model *m);
/* The model identity recorded in captures and artifacts (kvq/model_id.h):
 * kvq_model_id_from_config of the model's configuration and path (its file name only),
 * plus its name and fingerprint. */
void kvq_model_identity(const kvq_model *m, kvq_model_id *id);

/* Number of parameters (tied output counted once). */
uint64_t kvq_model_n_params(const kvq_model *m);

/* ==========================================================================
 * Attention backend
 * ==========================================================================
 *
 * One call per layer and chunk. The chunk's n tokens are appended, in order, to the
 * sequence the backend has seen since its last reset: token i attends to every earlier
 * token of the sequence and to itself (causal). The backend owns its cache; positions
 * are only for RoPE (the forward pass gives consecutive positions starting at the
 * sequence length before the chunk). Every layer sees the same chunks in order, layer
 * 0 first. Inputs are pre-RoPE in the model's pair layout (kvq_model_config.rope),
 * and are only valid during the call.
 */
typedef struct kvq_attn_call {
    int32_t layer;            /* [0, n_layers) */
    int32_t n;                /* tokens in the chunk, >= 1 */
    const int64_t *pos;       /* [n] positions */
    const float *q;           /* [n, n_heads, head_dim] pre-RoPE */
    const float *k;           /* [n, n_kv_heads, head_dim] pre-RoPE */
    const float *v;           /* [n, n_kv_heads, head_dim] */
    float *out;               /* [n, n_heads, head_dim] attention output (before Wo);
                                 NULL in observer calls */
} kvq_attn_call;

typedef struct kvq_attn_backend {
    const char *name;         /* "full", ... (for messages) */
    void *user;
    /* Computes call->out. A non-OK status (with err set) stops the forward pass. */
    kvq_status (*attend)(void *user, const kvq_attn_call *call, kvq_err *err);
    /* Forget the sequence (kvq_forward_reset). May be NULL. */
    void (*reset)(void *user);
    /* 1: the backend attends each layer as kvq_model_layer_attn describes it (its own
     * RoPE, score scale, softcap and window). 0 (a zero-initialized backend): it attends
     * every layer alike, and a model whose layers differ (gemma2, gemma3:
     * kvq_model_attn_uniform) is refused by kvq_forward_tokens with KVQ_E_UNSUPPORTED. */
    int per_layer;
} kvq_attn_backend;

/* Exact causal attention with a KV cache of post-RoPE keys and values:
 * out_i = sum_j softmax_j(q_i R_{p_i} . k_j R_{p_j} / sqrt(d)) v_j over the group's KV
 * head. The cache grows (doubling) up to max_tokens per sequence; a longer sequence
 * fails with KVQ_E_INVALID_ARG. Memory: n_layers * tokens * n_kv_heads * head_dim * 8
 * bytes plus a score buffer of chunk * tokens floats. */
typedef struct kvq_full_attn kvq_full_attn;
kvq_status kvq_full_attn_create(const kvq_model_config *cfg, int64_t max_tokens,
                                kvq_full_attn **out, kvq_err *err);
void kvq_full_attn_free(kvq_full_attn *fa);            /* NULL is fine */
kvq_attn_backend kvq_full_attn_backend(kvq_full_attn *fa);
int64_t kvq_full_attn_length(const kvq_full_attn *fa); /* tokens cached in layer 0 */

/* Observer: called per layer and chunk with the pre-RoPE q, k, v (call->out is NULL),
 * after the non-finite check and before the attention backend. A non-OK status stops
 * the forward pass with that status. */
typedef kvq_status (*kvq_observe_fn)(void *user, const kvq_attn_call *call, kvq_err *err);

/* ==========================================================================
 * Forward pass
 * ========================================================================== */

typedef struct kvq_forward kvq_forward;

typedef struct kvq_forward_params {
    int32_t threads;          /* OpenMP threads of a pass (omp_set_num_threads, for the
                                 calling thread; 0 = leave as is): they split prefill's
                                 SGEMMs into fixed tiles (weight rows; attention head x
                                 64 queries) and decode's matvecs. OpenBLAS is set to
                                 one thread while a pass runs (process-wide) and put
                                 back after it (passes run at once from several
                                 threads of a process should all keep OpenBLAS at
                                 one: openblas_set_num_threads(1)). Results have the
                                 same bytes for any thread count. */
    int32_t chunk;            /* tokens per prefill chunk, >= 1 (default 256) */
    int64_t max_tokens;       /* longest sequence of the built-in full attention
                                 (default 0 = the model's context_length) */
    int32_t n_layers;         /* run only layers [0, n_layers) (0 = all); a partial run
                                 cannot produce logits (for capture of early layers) */
    uint64_t scratch_bytes;   /* bound of each thread's scratch into which prefill
                                 dequantizes row tiles of weights that are not f32 in
                                 the file (default 64 MiB, used: at most 1 MiB; at least
                                 one row). Such weights stay packed in the mapping:
                                 never copied whole. */
    kvq_callbacks cb;
    int32_t act_q8;           /* 1: products with Q4_1 and Q8_0 weights whose width is a
                                 multiple of 64 quantize the activations to 8 bits per
                                 32 values and multiply in integers (llama.cpp's scheme;
                                 AVX-512 VNNI / AVX2 / scalar, the same bytes; decision
                                 019): products of fewer than 4 tokens (decode) by
                                 integer dot kernels, longer chunks (prefill) by a
                                 tiled integer GEMM. Logits
                                 then differ from the f32 path's by the quantization
                                 (up to ~1 on SmolLM2, as llama.cpp's do). 0 (default):
                                 the f32 products over the dequantized weights, which
                                 capture, eval and the golden tests use. */
} kvq_forward_params;

kvq_forward_params kvq_forward_params_default(void);

/* Creates a context with the built-in full attention and no observer.
 * Errors: INVALID_ARG (bad params), NOMEM, and those of kvq_full_attn_create. */
kvq_status kvq_forward_create(const kvq_model *m, const kvq_forward_params *p,
                              kvq_forward **out, kvq_err *err);
void kvq_forward_free(kvq_forward *f); /* NULL is fine */

/* Replaces the attention backend (copied; backend->user must outlive its use);
 * NULL restores the built-in full attention. Resets the sequence. */
void kvq_forward_set_attention(kvq_forward *f, const kvq_attn_backend *backend);
/* Sets (or with fn NULL clears) the observer. */
void kvq_forward_set_observer(kvq_forward *f, kvq_observe_fn fn, void *user);

/* Starts a new sequence at position 0 (resets the backend). */
void kvq_forward_reset(kvq_forward *f);
/* Tokens in the current sequence. */
int64_t kvq_forward_length(const kvq_forward *f);
/* Continues the current sequence at position n: the attention backend (set with
 * kvq_forward_set_attention; not the built-in full attention) already holds tokens
 * [0, n) of every layer, appended by the caller (kvq_retrieval_append of keys and
 * values an observer recorded in an earlier pass over the same tokens). The next
 * kvq_forward_tokens runs its first token at position n. Errors: INVALID_ARG (n < 0,
 * the built-in full attention). */
kvq_status kvq_forward_resume(kvq_forward *f, int64_t n, kvq_err *err);

typedef enum kvq_logits_mode {
    KVQ_LOGITS_NONE = 0,      /* skip the output layer (capture) */
    KVQ_LOGITS_LAST = 1,      /* logits: [vocab_size] for the last token */
    KVQ_LOGITS_ALL = 2        /* logits: [n, vocab_size] for every token */
} kvq_logits_mode;

/* Appends tokens[0..n) to the current sequence and runs them through the model in
 * chunks. Token ids must lie in [0, vocab_size) (KVQ_E_INVALID_ARG). Errors: NUMERIC
 * (non-finite state, naming layer and position), INVALID_ARG, NOMEM, the conversion
 * errors of the weight readers, and whatever the backend or the observer returns.
 * n = 0 does nothing (no logits are written). After an error the sequence is in an
 * unspecified state: reset before reuse.
 * Cost: about 2 * n_params * n FLOPs plus attention. */
kvq_status kvq_forward_tokens(kvq_forward *f, const int32_t *tokens, int64_t n,
                              kvq_logits_mode mode, float *logits, kvq_err *err);

/* ==========================================================================
 * Memory estimate and sampling
 * ========================================================================== */

typedef struct kvq_model_memory {
    uint64_t mapped_bytes;    /* weights in the files (mapped; paged in as used) */
    uint64_t converted_bytes; /* f32 copies of weights: always 0 (weights stay packed in
                                 the mapping; kept for callers that print it) */
    uint64_t scratch_bytes;   /* activations, dequantization tiles, attention scores */
    uint64_t kv_cache_bytes;  /* full-attention cache for n_ctx tokens */
    uint64_t total_bytes;     /* sum of the above */
} kvq_model_memory;

/* What a kvq_forward with params p needs to run sequences of n_ctx tokens (n_ctx 0:
 * the model's context length). Cheap: arithmetic only. */
void kvq_model_memory_estimate(const kvq_model *m, const kvq_forward_params *p, int64_t n_ctx,
                               kvq_model_memory *out);

/* Picks a token from logits [n]. temp <= 0: argmax (lowest id on ties). Otherwise
 * softmax(logits / temp), restricted to the smallest set of most likely tokens whose
 * mass reaches top_p (top_p >= 1: all), sampled with rng. work: [n] floats and
 * [n] int32 of scratch (NULL allowed for greedy). */
int32_t kvq_sample_token(const float *logits, int32_t n, double temp, double top_p,
                         kvq_rng *rng, float *work_p, int32_t *work_idx);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_MODEL_H */
