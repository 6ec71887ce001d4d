/*
 * row_order.c — the row order of kvq/runtime.h "Row order": the far rows of a head with
 * a single-group codebook are kept in code order (a stable counting sort of their codes,
 * K, V, codes and tokens moved together), so a selection reads runs of rows.
 * Called after each appended chunk (the appended of the codebook and mass selectors),
 * with the codebook selector's residuals moved too. Over a compressed cache the context
 * holds no K / V rows: only the codes, residuals and tokens move (the rows are read by
 * token from the compressed cache).
 */
#include <stdlib.h>
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"
#include "runtime/select/codebook/codebook.h"
#include "runtime/kernels/kernels.h"

/* ==========================================================================
 * Row order (kvq/runtime.h): the far rows of single-group codebooks in code order
 * ========================================================================== */

/* A sort waits until the unsorted far rows number 4 K (K the codebook size: fewer rows
 * per code would make runs too short to read faster) and a quarter of the sorted ones
 * (so each row is moved a bounded number of times as the cache grows). */
#define SORT_ROWS_PER_CODE 4

/* Puts rows [S, e) of H in code order: one stable counting sort of their codes, then
 * K and V copied row by row into new arrays (which replace the old ones: no copy back)
 * and codes and tokens through a small copy. */
static kvq_status sort_head(const kvq_retrieval *r, const rt_layer *L, rt_head *H, int32_t K,
                            int64_t e, int resid, kvq_err *err)
{
    const int64_t S = r->p.sink, n = e - S, len = L->len;
    const size_t row = (size_t)r->d * r->es, all = row * (size_t)L->cap;
    int32_t *order = malloc(sizeof *order * (size_t)n);
    uint32_t *count = malloc(sizeof *count * (size_t)K);
    int32_t *t32 = malloc(sizeof *t32 * (size_t)n);
    const int rows = H->k != NULL; /* over a compressed cache: no rows to move */
    void *dst[2] = {rows ? kvq_rt_cache_alloc(all) : NULL, rows ? kvq_rt_cache_alloc(all) : NULL};
    if (!H->tok && (H->tok = malloc(sizeof *H->tok * (size_t)L->cap)))
        for (int64_t j = 0; j < len; j++)
            H->tok[j] = (int32_t)j;
    if (!order || !count || !t32 || (rows && (!dst[0] || !dst[1])) || !H->tok) {
        free(order);
        free(count);
        free(t32);
        free(dst[0]);
        free(dst[1]);
        return kvq_err_set(err, KVQ_E_NOMEM,
                           "retrieval: out of memory sorting %lld rows by code (%.1f MiB)",
                           (long long)n, 2.0 * (double)all / 1048576.0);
    }
    kvq_rk_code_order(kvq_rt_codes(H)->codes + S, n, K, count, order);
    /* the codebook selector's residuals by row too */
    if (resid && kvq_rt_cb(H)->rq && kvq_rt_resid_permute(r, H, S, order, n)) {
        free(order);
        free(count);
        free(t32);
        free(dst[0]);
        free(dst[1]);
        return kvq_err_set(err, KVQ_E_NOMEM, "retrieval: out of memory sorting %lld residuals",
                           (long long)n);
    }
    for (int pass = 0; rows && pass < 2; pass++) {
        const char *src = pass ? H->v : H->k;
        char *out = dst[pass];
        memcpy(out, src, row * (size_t)S);
        for (int64_t i = 0; i < n; i++)
            memcpy(out + (size_t)(S + i) * row, src + (size_t)(S + order[i]) * row, row);
        memcpy(out + (size_t)e * row, src + (size_t)e * row, row * (size_t)(len - e));
    }
    if (rows) {
        free(H->k);
        free(H->v);
        H->k = dst[0];
        H->v = dst[1];
    }
    for (int64_t i = 0; i < n; i++)
        t32[i] = H->tok[S + order[i]];
    memcpy(H->tok + S, t32, sizeof *t32 * (size_t)n);
    uint16_t *c16 = (uint16_t *)t32; /* n codes fit in the n tokens' bytes */
    for (int64_t i = 0; i < n; i++)
        c16[i] = kvq_rt_codes(H)->codes[S + order[i]];
    memcpy(kvq_rt_codes(H)->codes + S, c16, sizeof *c16 * (size_t)n);
    H->sorted_end = e;
    free(order);
    free(count);
    free(t32);
    return KVQ_OK;
}

/* Rows before e = past + 1 - w can enter no later window (every later query sees at
 * least past + 1 tokens), and no later query sees fewer than e tokens, so the visible
 * rows stay the visible tokens. */
kvq_status kvq_rt_sort_rows(kvq_retrieval *r, rt_layer *L, int64_t past, int resid, kvq_err *err)
{
    const int32_t layer = (int32_t)(L - r->layer);
    /* under a sliding window the visible tokens are a range that moves past the sinks:
     * rows must stay in token order */
    if (!r->p.code_order || kvq_rt_codes_ctx(r)->be->codes || !L->cb[0] ||
        (r->sliding_window > 0 && layer >= r->sliding_from) ||
        kvq_codebook_get_desc(L->cb[0])->groups != 1)
        return KVQ_OK;
    const int64_t S = r->p.sink, e = past + 1 - r->window;
    kvq_status status = KVQ_OK;
    kvq_err first = {0};
    /* heads in parallel, as the step runs them (each sort holds its own copies) */
#pragma omp parallel for num_threads(r->n_scr) schedule(dynamic, 1)
    for (int32_t h = 0; h < r->n_kv; h++) {
        rt_head *H = &L->head[h];
        const int64_t done = H->sorted_end > S ? H->sorted_end - S : 0;
        const int64_t fresh = e - S - done;
        const int32_t K = L->cb[h] ? kvq_codebook_get_desc(L->cb[h])->k : 0;
        if (!K || fresh < SORT_ROWS_PER_CODE * (int64_t)K || fresh < done / 4)
            continue;
        kvq_err he = {0};
        const kvq_status s = sort_head(r, L, H, K, e, resid, &he);
        if (s) {
#pragma omp critical(kvq_sort_rows)
            if (!status) {
                status = s;
                first = he;
            }
        }
    }
    if (status)
        *err = first;
    return status;
}
