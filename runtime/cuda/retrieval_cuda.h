/*
 * runtime/cuda/retrieval_cuda.h — internal: the CUDA decode step of retrieval
 * attention (built only with `make CUDA=1`). Not a public header.
 *
 * One call runs, for every KV head of one layer and one query row, the same step as
 * the CPU runtime (runtime/step.c, WROPE positions): the LUT of the group's summed
 * scoring query from the f16 table, the score gather over the candidates' codes, the
 * radix top-k (the CPU's selection rule: ties to the lower index, ascending output),
 * the rotation of the window keys, and exact attention over sinks + selection + window.
 * Every per-element step is a KVQ_HD function of runtime/kernels/kernels.h, shared with the
 * CPU kernels that the tests check. All pointers are device memory.
 *
 * Two entry points:
 *   kvq_rt_cuda_decode   the whole step for every KV head of a layer (LUT, scores, top-k,
 *                        window rotation, attention). Compiled, not called by
 *                        kvq_retrieval (its cache lives in host memory).
 *   kvq_rt_cuda_select   the selection of one (layer, KV head) step: LUT, score gather
 *                        and top-k on the device over a device mirror of the codes, the
 *                        selected token indices copied back. This is what kvq_retrieval
 *                        calls with device CUDA (runtime/select/codebook/device.c).
 *
 * Status: compiled and linked in the CUDA build; no GPU was available to run either,
 * so neither has been executed (docs/runtime.md, docs/cuda.md); make test-cuda checks
 * them against the CPU wherever a GPU exists.
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

/* ---- selection on the device, one (layer, KV head) at a time ---------------------------- */

/* Device state of one decoding context: the f16 LUT table and a mirror of the codes of
 * every (layer, KV head), and per-slot scratch (one slot per host thread that may call
 * kvq_rt_cuda_select concurrently). Host memory for the bookkeeping, device memory for
 * the rest. Each slot has its own stream and scratch that grows geometrically; a
 * selection's copies and kernels are queued on it and the call waits for that stream
 * only. Tables and codes are copied on the default stream, which the slot streams wait
 * for. */
typedef struct kvq_rt_cuda kvq_rt_cuda;

/* Errors: KVQ_E_INVALID_ARG (sizes), KVQ_E_NOMEM (host). Allocates no device memory. */
kvq_status kvq_rt_cuda_create(int32_t n_layers, int32_t n_kv, int32_t n_slots, kvq_rt_cuda **out,
                              kvq_err *err);
void kvq_rt_cuda_free(kvq_rt_cuda *c); /* NULL is fine */

/* Uploads the LUT table of (layer, head): ct [G, dg, K] f16 (kvq_rk_table layout).
 * Errors: KVQ_E_INVALID_ARG, KVQ_E_BACKEND (allocation or copy, named). */
kvq_status kvq_rt_cuda_set_table(kvq_rt_cuda *c, int32_t layer, int32_t head, const uint16_t *ct,
                                 int32_t G, int32_t dg, int32_t K, kvq_err *err);

/* Copies the codes of rows [first, first + n) of (layer, head) to the device: codes is
 * the host array [cap, G] of all rows (the table's G). The mirror grows to cap rows,
 * keeping the rows already there. Errors: KVQ_E_INVALID_ARG (no table, rows beyond cap),
 * KVQ_E_BACKEND. */
kvq_status kvq_rt_cuda_put_codes(kvq_rt_cuda *c, int32_t layer, int32_t head,
                                 const uint16_t *codes, int64_t first, int64_t n, int64_t cap,
                                 kvq_err *err);

/* Selection of one step on the device: the LUT of qp [G dg] (the scoring query, q' for
 * grouped query-aware codebooks) from the table, the scores of candidate rows
 * [first, first + nc) from their codes (kvq_rk_score_one), and the top k of them
 * (1 <= k < nc; kvq_rk_topk's rule: ties to the lower index). Writes the k selected
 * token indices (first + j), ascending, to the host array sel [k]. slot < n_slots: the
 * calling thread's scratch. Errors: KVQ_E_INVALID_ARG, KVQ_E_BACKEND.
 * Cost on the device: K d multiply-adds, nc G lookups, three radix passes over nc keys;
 * 4 k bytes copied back. */
kvq_status kvq_rt_cuda_select(kvq_rt_cuda *c, int32_t slot, int32_t layer, int32_t head,
                              const float *qp, int64_t first, int64_t nc, int64_t k, int32_t *sel,
                              kvq_err *err);

/* ---- for tests/cuda/test_cuda_paths.c: the kernels one at a time ------------------------ */

/* Copies back the device LUT (lut_n floats) and scores (nc floats) of the last successful
 * kvq_rt_cuda_select on this slot. Errors: KVQ_E_INVALID_ARG, KVQ_E_BACKEND. */
kvq_status kvq_rt_cuda_peek(kvq_rt_cuda *c, int32_t slot, float *lut, int64_t lut_n,
                            float *scores, int64_t nc, kvq_err *err);

/* The top-k kernel alone: uploads scores [nc] (host), runs k_topk on them and writes the k
 * selected indices (first + j, ascending; 1 <= k < nc) to the host array sel [k].
 * Errors: KVQ_E_INVALID_ARG, KVQ_E_BACKEND. */
kvq_status kvq_rt_cuda_topk(kvq_rt_cuda *c, int32_t slot, const float *scores, int64_t nc,
                            int64_t k, int64_t first, int32_t *sel, kvq_err *err);

#ifdef __cplusplus
}
#endif
#endif
