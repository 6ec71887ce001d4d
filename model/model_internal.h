/*
 * model_internal.h — the kvq_model structure shared by model.c (common loading),
 * model_gguf.c, model_hf.c (the two sources) and forward.c. Not a public header.
 */
#ifndef KVQ_MODEL_INTERNAL_H
#define KVQ_MODEL_INTERNAL_H

#include "kvq/gguf.h"
#include "kvq/model.h"
#include "kvq/safetensors.h"

/* Storage type of a weight matrix as it sits in the mapping: the ggml type id, one of
 * those kvq/quant.h computes with (F32, F16, BF16 and the ggml block quantizations).
 * Quantized weights stay packed in the mapping; the forward pass dequantizes row tiles
 * for prefill and multiplies the packed blocks directly for single-token decode. */
typedef enum wt_type {
    WT_F32 = KVQ_GGML_F32, WT_F16 = KVQ_GGML_F16, WT_BF16 = KVQ_GGML_BF16,
    WT_Q4_0 = KVQ_GGML_Q4_0, WT_Q4_1 = KVQ_GGML_Q4_1, WT_Q5_0 = KVQ_GGML_Q5_0,
    WT_Q5_1 = KVQ_GGML_Q5_1, WT_Q8_0 = KVQ_GGML_Q8_0, WT_Q2_K = KVQ_GGML_Q2_K,
    WT_Q3_K = KVQ_GGML_Q3_K, WT_Q4_K = KVQ_GGML_Q4_K, WT_Q5_K = KVQ_GGML_Q5_K,
    WT_Q6_K = KVQ_GGML_Q6_K
} wt_type;

/* A weight matrix [rows, cols] (row-major, cols contiguous) left in the mapping.
 * A 1-D tensor is one row. */
typedef struct kvq_wt {
    const char *name;              /* tensor name in the file (owned by the reader) */
    int64_t rows, cols;
    wt_type type;
    const void *data;              /* first byte of row 0, in the mapping (any alignment) */
    size_t row_bytes;              /* packed bytes of one row (kvq_quant_check) */
    const kvq_gguf_tensor *gguf;   /* GGUF source, or NULL (HF) */
} kvq_wt;

typedef struct kvq_layer_weights {
    kvq_wt wq, wk, wv, wo;         /* [n_heads*d, dim], [n_kv*d, dim] x2, [dim, n_heads*d] */
    kvq_wt w_gate, w_up, w_down;   /* [hidden, dim] x2, [dim, hidden] */
    float *attn_norm, *ffn_norm;   /* [dim] each, f32 copies */
    float *bq, *bk, *bv;           /* [n_heads*d], [n_kv*d] x2 when cfg.qkv_bias, else NULL */
    float *q_norm, *k_norm;        /* [head_dim] each when cfg.qk_norm, else NULL */
    float *post_attn_norm, *post_ffn_norm; /* [dim] each when cfg.post_norms, else NULL */
} kvq_layer_weights;

/* Weights bound as row ranges of one fused tensor (phi3's qkv and gate_up): rows
 * [r0, r0 + rows) of `src`, same type and width. */
void kvq_wt_slice(const kvq_wt *src, int64_t r0, int64_t rows, kvq_wt *out);

/* Adds `offset` to every value of v[n] (gemma's HF norms are (1 + w): kvq keeps
 * 1 + w, as llama.cpp's converter writes them). */
void kvq_vec_add_scalar(float *v, int64_t n, float offset);

struct kvq_model {
    char *path;
    kvq_model_config cfg;
    kvq_wt tok_embd;               /* [vocab, dim] */
    kvq_wt output;                 /* [vocab, dim]; == tok_embd when tied */
    float *out_norm;               /* [dim] */
    kvq_layer_weights *layers;     /* [n_layers] */
    kvq_gguf *gguf;                /* GGUF source, or NULL */
    kvq_st **shards;               /* HF source: open safetensors files */
    size_t n_shards;
    kvq_tokenizer *tok;            /* NULL when absent */
    uint64_t mapped_bytes;         /* bytes of all weight tensors used */
    char fingerprint[KVQ_FINGERPRINT_CAP]; /* kvq_model_compute_fingerprint, at open */
    char name[128];                /* GGUF general.name, else the file or directory name */
};

/* Filled by the source loaders: config and tensor lookup. */
kvq_status kvq_model_load_gguf(kvq_model *m, const kvq_model_params *p, kvq_err *err);
kvq_status kvq_model_load_hf(kvq_model *m, const kvq_model_params *p, kvq_err *err);

/* Checks cfg for internal consistency (KVQ_E_CORRUPT / UNSUPPORTED naming the field). */
kvq_status kvq_model_check_config(const kvq_model_config *c, const char *path, kvq_err *err);

/* Rows [r0, r0+n) of w as f32 into out [n, cols] (kvq_dequantize_rows: only those
 * rows are read). */
kvq_status kvq_wt_rows_f32(const kvq_wt *w, int64_t r0, int64_t n, float *out, kvq_err *err);
/* The weight as f32 in place (f32, 4-byte aligned) or NULL when it needs converting. */
const float *kvq_wt_direct(const kvq_wt *w);
/* A malloc'd f32 copy of a 1-D weight of `n` values into *out. */
kvq_status kvq_wt_vector(const kvq_wt *w, int64_t n, float **out, const char *path,
                         kvq_err *err);
/* The weight fingerprint (model/fingerprint.c) as 32 hex digits into out[cap].
 * Errors: NOMEM and the conversion errors of kvq_wt_rows_f32. */
kvq_status kvq_model_compute_fingerprint(const kvq_model *m, char *out, size_t cap, kvq_err *err);
/* Byte size of the weight in the file. */
size_t kvq_wt_bytes(const kvq_wt *w);

/* Queries per full-attention task (attn_full.c; a fixed tiling: the bytes do not depend
 * on threads). */
#define KVQ_FULL_ATTN_QBLOCK 64

/* Prefill products over kvq's OpenMP threads (forward_gemm.c). */

/* Enters a forward pass: OpenBLAS at one thread (process-wide), OpenMP at `threads`
 * for this thread's regions (0: as it is). Returns OpenBLAS's count before, for
 * kvq_fwd_blas_leave, which puts it back (and keeps OpenMP's count as entered). */
int kvq_fwd_blas_enter(int32_t threads);
void kvq_fwd_blas_leave(int prev);

/* Rows of W per tile: from the shapes and the per-thread scratch of tile_floats only
 * (SIZE_MAX: no scratch, f32 in place), never from the thread count (so the bytes of
 * the product do not depend on it). */
int64_t kvq_fwd_tile_rows(int64_t rows, int64_t cols, size_t tile_floats);

/* y [n, w.rows] = x [n, w.cols] W^T (+ y when beta is 1), one single-threaded sgemm per
 * tile of W's rows, tiles shared by this thread's OpenMP team. W is wf when the weight
 * is f32 in place, else each tile is dequantized into bufs + thread * tile_floats
 * (bufs: omp_get_max_threads() slots). */
kvq_status kvq_fwd_gemm_wt(const kvq_wt *w, const float *wf, const float *x, int64_t n,
                           float *y, float beta, float *bufs, size_t tile_floats, kvq_err *err);

#endif
