/*
 * runtime/cuda/retrieval_cuda.h — internal: the CUDA decode step of retrieval
 * attention (built only with `make CUDA=1`). Not a public header.
 *
 * One call runs, for every KV head of one layer and one query row, the same step as
 * the CPU runtime (runtime/retrieval.c, WROPE positions): the LUT of the group's summed
 * scoring query from the f16 table, the score gather over the candidates' codes, the
 * radix top-k (the CPU's selection rule: ties to the lower index, ascending output),
 * the rotation of the window keys, and exact attention over sinks + selection + window.
 * Every per-element step is a KVQ_HD function of runtime/kernels.h, shared with the
 * CPU kernels that the tests check. All pointers are device memory.
 *
 * Status: compiled in the CUDA build; no GPU was available to run it, so it is not
 * wired into kvq_retrieval yet and nothing calls it.
 */
#ifndef KVQ_RUNTIME_RETRIEVAL_CUDA_H
#define KVQ_RUNTIME_RETRIEVAL_CUDA_H

#include <stdint.h>

#include "kvq/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvq_rt_cuda_step {
    int32_t n_kv, gs, d;      /* KV heads, query heads per KV head, head dim (<= 256) */
    int32_t K, G;             /* codebook size and groups */
    int64_t n;                /* visible tokens */
    int32_t sink, window;     /* S and w */
    int64_t k_sel;            /* top-K budget */
    int layout;               /* kvq_rope_layout of the head */
    const uint16_t *k, *v;    /* [n_kv, ld, d] f16 pre-RoPE keys and values */
    int64_t ld;               /* rows allocated per head */
    const uint16_t *codes;    /* [n_kv, ld, G] */
    const uint16_t *table;    /* [n_kv, G, d/G, K] f16 LUT tables (kvq_rk_table layout) */
    const float *qs;          /* [n_kv, d] summed scoring queries (q' for grouped
                                     query-aware codebooks), computed by the host */
    const float *qb, *qi;     /* [n_kv, gs, d] queries rotated by R_b and R_i */
    const float *wcos, *wsin; /* [window, d/2] cos / sin of the window positions */
    float *out;               /* [n_kv, gs, d] */
    /* device scratch, per KV head: lut [G K], scores [n], keys [n] u32, idx [n] i32,
     * krot [window, d], logits [gs, n] */
    float *lut, *scores, *krot, *logits;
    uint32_t *keys;
    int32_t *idx;
} kvq_rt_cuda_step;

/* Runs the step on the current device (default stream) and waits for it.
 * Errors: KVQ_E_INVALID_ARG (d > 256, sizes), KVQ_E_BACKEND (a CUDA error, named). */
kvq_status kvq_rt_cuda_decode(const kvq_rt_cuda_step *s, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif
