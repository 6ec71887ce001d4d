/* tinyllama.h — writes a small random llama-family model in both checkpoint forms, for
 * tests: an HF directory (config.json + safetensors, RoPE pairs "half") and a GGUF
 * file (llama: Q/K rows permuted as llama.cpp's converter does, RoPE "interleaved";
 * qwen2: unpermuted, "half"). Both forms hold exactly the same values, so a correct
 * loader gives the same logits from either.
 *
 * Weights are drawn from a seeded kvq_rng and then rounded through the storage type
 * (wtype), so that e.g. a GGUF Q8_0 tensor and the HF F32 tensor of its dequantized
 * values agree bit for bit. The arrays are exposed (HF layout, [out, in] row-major)
 * so tests can compute things independently. */
#ifndef KVQ_TEST_TINYLLAMA_H
#define KVQ_TEST_TINYLLAMA_H

#include <stdint.h>

#include "kvq/rope.h"

typedef enum tinyllama_wtype {
    TINYLLAMA_F32 = 0,   /* HF F32,  GGUF F32 */
    TINYLLAMA_F16 = 1,   /* HF F16,  GGUF F16 */
    TINYLLAMA_BF16 = 2,  /* HF BF16, GGUF BF16 */
    TINYLLAMA_Q8_0 = 3   /* HF F32 (dequantized values), GGUF Q8_0; cols % 32 == 0 */
} tinyllama_wtype;

typedef struct tinyllama_spec {
    const char *arch;        /* "llama" (default), "mistral" (HF only) or "qwen2" (biases) */
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab;
    int context_length;
    double norm_eps, rope_base;
    kvq_rope_scaling scaling;                /* none, linear or llama3 */
    double factor, low_freq_factor, high_freq_factor, original_max_pos;
    int tied;                /* 1: no separate output matrix */
    tinyllama_wtype wtype;   /* storage of the 2-D weights (1-D ones are always F32) */
    int n_shards;            /* HF: > 1 writes model-0000i-of-0000n + index.json */
    uint64_t seed;
    const char *tokenizer_from; /* GGUF: copy the tokenizer.* metadata of this GGUF file
                                   (e.g. stories260K.gguf with vocab 512), or NULL */
    const char *hf_extra;    /* HF: JSON members added to config.json, e.g.
                                "\"sliding_window\": 8", or NULL */

    /* Deliberate defects, for error-path tests (NULL = none). Names are in the form
     * being written (HF "model.layers.0.mlp.down_proj.weight", GGUF "blk.0.ffn_down.weight"). */
    const char *edit_arch;        /* architecture string written instead of `arch` */
    const char *edit_drop;        /* tensor left out */
    const char *edit_bad_type;    /* written as GGUF IQ2_XXS (cols % 256 == 0) / HF I8 */
    const char *edit_short;       /* written with one row fewer */
    const char *edit_rope_type;   /* GGUF rope.scaling.type / HF rope_scaling.rope_type */
} tinyllama_spec;

/* dim 64, hidden 128, 2 layers, 4 heads, 2 KV heads, head_dim 16, vocab 96, context
 * 256, eps 1e-5, base 10000, untied, F32, one shard, seed 1. */
tinyllama_spec tinyllama_default(void);

typedef struct tinyllama_layer {
    float *wq, *wk, *wv, *wo;   /* [n_heads*hd, dim], [n_kv*hd, dim] x2, [dim, n_heads*hd] */
    float *wg, *wu, *wd;        /* [hidden, dim] x2, [dim, hidden] */
    float *attn_norm, *ffn_norm;/* [dim] */
    float *bq, *bk, *bv;        /* qwen2 only, else NULL */
} tinyllama_layer;

typedef struct tinyllama {
    tinyllama_spec s;
    float *embed;               /* [vocab, dim] */
    float *output;              /* [vocab, dim], NULL when tied */
    float *norm;                /* [dim] */
    tinyllama_layer *layers;    /* [n_layers] */
} tinyllama;

/* NULL on out of memory or a spec the writer cannot honour. */
tinyllama *tinyllama_new(const tinyllama_spec *s);
void tinyllama_free(tinyllama *t);

/* Return 0 on success, -1 with a message on stderr. The directory is created. */
int tinyllama_write_hf(const tinyllama *t, const char *dir);
int tinyllama_write_gguf(const tinyllama *t, const char *path);

#endif
