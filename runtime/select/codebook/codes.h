/*
 * runtime/select/codebook/codes.h — the piece the codebook selector (codebook.c) and the
 * mass selector (runtime/select/mass.c) share: their first stage scores the cached keys'
 * codes through the artifact's LUTs. Not a public header.
 *
 *   per head     rt_codes_head: the keys' codes by row and the per-code counts
 *   per context  rt_codes_ctx: the encoder's buffers of a chunk and the first stage's
 *                device backend (device.c), behind kvq_retrieval.sstate
 *   per thread   rt_codes_scratch: the LUT, the code-selection scratch and the rotations
 *                score_pos.c keeps for a step, behind rt_scratch.sscr
 *
 * Each selector's own data begins with the shared piece as its first member (the codebook
 * selector's rt_cb_head and rt_cb_scratch, codebook.h), so code written for the first
 * stage (codes.c, device.c, score_pos.c, row_order.c) reads it through kvq_rt_codes,
 * kvq_rt_codes_ctx and kvq_rt_codes_scr under either selector. The mass selector keeps
 * nothing else. The cache (runtime/cache/) and the step (runtime/step.c) see none of it.
 */
#ifndef KVQ_RUNTIME_SELECT_CODES_H
#define KVQ_RUNTIME_SELECT_CODES_H

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"

/* Per head: rt_head.sdata begins with it. */
typedef struct rt_codes_head {
    uint16_t *codes; /* [cap, G] the keys' codes, by row */
    uint32_t *hist;  /* [K] single-group codebooks: how many of rows [0, len) have each code */
} rt_codes_head;

/* The first stage's selection kernels (device.c): the steps that run on the chosen
 * device, so that step.c and the codebook selector are written once.
 *   init     after the context is built: device copies of the LUT tables
 *   fini     releases what init made (the context is being freed)
 *   codes    rows [first, first + n) of (layer, head)'s codes were written (the cache
 *            holds L->cap rows)
 *   select   the codebook selector under KVQ_GROUP_SUM: LUT of the scoring query qs
 *            [d], then the top k (1 <= k < st->nc) of the candidates' scores (the CPU
 *            selects from the codes and their counts when G = 1 and
 *            kvq_rk_codes_select_pays, kvq_rk_topk_codes; otherwise score gather +
 *            top-k); the k selected rows, ascending, into sel
 * NULL entries do nothing. Errors as kvq_status (BACKEND for a device failure). */
typedef struct rt_backend {
    const char *name;
    kvq_retrieval_device device;
    kvq_status (*init)(kvq_retrieval *r, kvq_err *err);
    void (*fini)(kvq_retrieval *r);
    kvq_status (*codes)(kvq_retrieval *r, const rt_layer *L, int32_t layer, int32_t head,
                        int64_t first, int64_t n, kvq_err *err);
    kvq_status (*select)(const rt_step *st, const float *qs, int64_t k, int32_t *sel,
                         kvq_err *err);
} rt_backend;

/* Per context: kvq_retrieval.sstate. */
typedef struct rt_codes_ctx {
    float *kbuf;   /* [n, d] one head's keys of a chunk (the codebook's encoding) */
    int32_t *cbuf; /* [n, G] codes of a chunk */
    int32_t *pbuf; /* [n] positions as int32 */
    int64_t buf_rows;
    const rt_backend *be; /* selection kernels (device.c) */
    void *dev;            /* the backend's state (kvq_rt_cuda with CUDA), or NULL */
} rt_codes_ctx;

/* Bands whose mean rotations a scratch keeps (score bands; farther bands are computed
 * each time). */
#define KVQ_RT_BAND_ROTATIONS 32

/* Per thread: rt_scratch.sscr begins with it. */
typedef struct rt_codes_scratch {
    float *lut;      /* [G K] */
    uint32_t *cwork; /* [4 G K] code counts and kvq_rk_topk_codes scratch */
    int64_t mr_a, mr_b; /* distances of the mean rotation held in mr_cs / mr_sn (score
                           mean: computed once per step, not per layer and head) */
    float mr_cs[KVQ_ROPE_MAX_DIM / 2], mr_sn[KVQ_ROPE_MAX_DIM / 2];
    int64_t br_a, br_b; /* candidate distances of the band rotations held in br (score
                           bands: per band, computed once per step, not per layer and head) */
    uint32_t br_have;   /* bit k: band k's rotation is held */
    float br[KVQ_RT_BAND_ROTATIONS][KVQ_ROPE_MAX_DIM]; /* band k: cos [d/2], then sin [d/2] */
} rt_codes_scratch;

/* Bytes of one row's codes (uint16 a group; kvq_retrieval_held_get). */
double kvq_rt_codes_row_bytes(const kvq_retrieval *r, const rt_layer *L);
static inline rt_codes_head *kvq_rt_codes(const rt_head *H) { return (rt_codes_head *)H->sdata; }
static inline rt_codes_ctx *kvq_rt_codes_ctx(const kvq_retrieval *r)
{
    return (rt_codes_ctx *)r->sstate;
}
static inline rt_codes_scratch *kvq_rt_codes_scr(const rt_scratch *S)
{
    return (rt_codes_scratch *)S->sscr;
}

/* The shared piece's parts of rt_selector's functions (codes.c), called by each
 * selector's own:
 *   reserve        codes grown to cap rows; 0 when out of memory
 *   free           frees what C holds (not C)
 *   reset_head     a new sequence: the code counts to 0
 *   append         the chunk's codes (kvq_codebook_encode of each head's pre-RoPE keys as
 *                  the cache dtype holds them), code counts and the device's copy; after
 *                  each head's codes, head (when not NULL) with that head's keys [n, d],
 *                  codes [n, G] and positions (the codebook's residuals)
 *   open / close   the context's rt_codes_ctx (into r->sstate): the backend of r->device
 *                  (device.c; its init), the encoder's buffers
 *   scratch        the LUT and code-selection scratch of X for the context's codebooks;
 *                  0 when out of memory
 *   scratch_free   frees what X holds (not X) */
int kvq_rt_codes_reserve(const kvq_retrieval *r, const rt_layer *L, rt_codes_head *C, int64_t cap);
void kvq_rt_codes_free(rt_codes_head *C);
void kvq_rt_codes_reset_head(const kvq_retrieval *r, const rt_layer *L, int32_t h, rt_head *H);
kvq_status kvq_rt_codes_append(kvq_retrieval *r, rt_layer *L, const kvq_attn_call *c, int64_t past,
                               void (*head)(const kvq_retrieval *r, const rt_layer *L, int32_t h,
                                            const float *keys, const int32_t *codes,
                                            const int64_t *pos, int64_t past, int64_t n),
                               kvq_err *err);
kvq_status kvq_rt_codes_open(kvq_retrieval *r, kvq_err *err);
void kvq_rt_codes_close(kvq_retrieval *r);
int kvq_rt_codes_scratch(const kvq_retrieval *r, rt_codes_scratch *X);
void kvq_rt_codes_scratch_free(rt_codes_scratch *X);

/* The candidates' first-stage scores [nc] (sum or max over the group, as the
 * selector's group rule), adding the LUT tables' bytes to *cb_bytes (codes.c). */
void kvq_rt_codebook_scores(const rt_step *st, float *scores, double *cb_bytes);

/* The backend of r->device into the context's rt_codes_ctx, and its init (device.c). */
kvq_status kvq_rt_backend_open(kvq_retrieval *r, kvq_err *err);

/* After a chunk starting at token `past` was appended to L: puts each head's far rows
 * in code order when the rule of kvq/runtime.h "Row order" says so (row_order.c), the
 * residuals with them when `resid` (the codebook selector's rt_cb_head). Errors:
 * KVQ_E_NOMEM naming the rows. */
kvq_status kvq_rt_sort_rows(kvq_retrieval *r, rt_layer *L, int64_t past, int resid, kvq_err *err);

#endif /* KVQ_RUNTIME_SELECT_CODES_H */
