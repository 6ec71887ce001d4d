/*
 * runtime/select/selector.h — the interface of a retrieval selector: which candidates of
 * one decode step (query row, layer, KV head) are attended. Not a public header.
 *
 * A selector is one table of functions (rt_selector) in a file of its own under
 * runtime/select/ (the codebook selector, with its stages, in runtime/select/codebook/),
 * registered by one line in runtime/select/select.c. The context (runtime/retrieval.c)
 * and the cache (runtime/cache/) call a selector only through this table: they hold no
 * selector's data but the opaque pointers it keeps per context (kvq_retrieval.sstate),
 * per thread (rt_scratch.sscr) and per head (rt_head.sdata).
 *
 *   open         the context was built (layers, codebooks, r->device): what the selector
 *                keeps per context (buffers, a device backend) into kvq_retrieval.sstate
 *                (NULL: nothing). Errors as kvq_status.
 *   close        frees kvq_retrieval.sstate (NULL: nothing to free)
 *   scratch      a thread's scratch grows to `cap` visible tokens: what the selector needs
 *                per step into rt_scratch.sscr, made on the first call (NULL: nothing).
 *                0 when out of memory.
 *   scratch_free frees rt_scratch.sscr (NULL: nothing to free)
 *   reserve      the head's rows grow to `cap` (from L->cap): grow what the selector keeps
 *                per row / per group of rows, making rt_head.sdata on the first call
 *                (NULL: the selector keeps nothing). 0 when out of memory.
 *   free_head    frees rt_head.sdata (NULL: nothing to free)
 *   reset_head   a new sequence begins (kvq_retrieval_reset; NULL: nothing to do)
 *   append       the chunk c of n rows was stored at rows [past, past + n) of layer L (K,
 *                V and positions; the rows' tokens and L->len not yet): the selector's
 *                data of those rows (NULL: nothing)
 *   appended     after L->len and the rows' tokens were updated (the codebook selector
 *                puts the far rows in code order here; NULL: nothing)
 *   select       the candidates of step st [s_end, w_beg) to attend for a budget of k
 *                (the mass selector chooses fewer): their rows, ascending, into sel;
 *                returns their count. Adds the bytes it reads to *sel_bytes (its per-key
 *                data, key rows) and the codebook tables' bytes to *cb_bytes. Writes
 *                st->S's scratch.
 *   bits_per_key the bits it holds per cached key (KV head), for reports
 *                (kvq_selector_bits_per_key); NULL: 0
 *   row_bytes    the bytes it stores per cached row of a head, as allocated (uint16 codes,
 *                packed residuals and their scales, page / group data per row): the
 *                context's held memory (kvq_retrieval_held_get); NULL: 0
 */
#ifndef KVQ_RUNTIME_SELECTOR_H
#define KVQ_RUNTIME_SELECTOR_H

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"

typedef struct rt_selector {
    kvq_selector id;
    const char *name;   /* kvq_selector_name, kvq_selector_parse */
    int needs_artifact; /* refused without codebooks; a layer without them attends fully */
    kvq_status (*open)(kvq_retrieval *r, kvq_err *err);
    void (*close)(kvq_retrieval *r);
    int (*scratch)(const kvq_retrieval *r, rt_scratch *S, int64_t cap);
    void (*scratch_free)(rt_scratch *S);
    int (*reserve)(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int64_t cap);
    void (*free_head)(rt_head *H);
    void (*reset_head)(const kvq_retrieval *r, const rt_layer *L, int32_t h, rt_head *H);
    kvq_status (*append)(kvq_retrieval *r, rt_layer *L, const kvq_attn_call *c, int64_t past,
                         kvq_err *err);
    kvq_status (*appended)(kvq_retrieval *r, rt_layer *L, int64_t past, kvq_err *err);
    int64_t (*select)(const rt_step *st, int64_t k, int32_t *sel, double *sel_bytes,
                      double *cb_bytes);
    double (*bits_per_key)(const kvq_retrieval_params *p, const kvq_codebook_set *rt, int32_t d);
    /* bytes it holds per cached row of head H of L (per-page or per-group data shared
     * over the rows; kvq_retrieval_held_get); NULL: 0 */
    double (*row_bytes)(const kvq_retrieval *r, const rt_layer *L, const rt_head *H);
} rt_selector;

/* The table of selector id (select.c's registry, one line per selector; each table is
 * defined in its selector's file), or NULL for an id out of range. */
const rt_selector *kvq_rt_selector(kvq_selector id);

/* What selectors share (select.c).
 *   group_sum   out [d] = the sum of the group's query rows q [gs, d], in head order
 *   select_all  every candidate of the step, ascending, into sel; returns nc
 *   select_top  the top k of the step's candidate scores S->scores [nc] (kvq_rk_topk:
 *               ties to the lower index), as rows, ascending, into sel; returns the count
 *   select_scored  a selector that scores every candidate: none when there are none,
 *               all when k >= nc, else score (the candidates' scores into S->scores
 *               [nc], adding the bytes it reads to *bytes) and select_top
 *   append_rows a selector that keeps data per row: row (the head's row j just stored)
 *               for each head and each row of the chunk, heads outermost */
void kvq_rt_group_sum(const float *q, int32_t gs, int32_t d, float *out);
int64_t kvq_rt_select_all(const rt_step *st, int32_t *sel);
int64_t kvq_rt_select_top(const rt_step *st, int64_t k, int32_t *sel);
int64_t kvq_rt_select_scored(const rt_step *st, int64_t k, int32_t *sel,
                             void (*score)(const rt_step *st, float *scores, double *bytes),
                             double *bytes);
void kvq_rt_append_rows(const kvq_retrieval *r, const rt_layer *L, int64_t past, int64_t n,
                        void (*row)(const kvq_retrieval *r, const rt_layer *L, rt_head *H,
                                    int64_t j));

#endif /* KVQ_RUNTIME_SELECTOR_H */
