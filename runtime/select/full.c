/*
 * full.c — the full selector: every candidate is attended (exact attention over the
 * visible tokens; also what a layer without codebooks does under the codebook and mass
 * selectors). Keeps nothing per key and reads nothing to select.
 */
#include "runtime/select/selector.h"

static int64_t full_select(const rt_step *st, int64_t k, int32_t *sel, double *sel_bytes,
                           double *cb_bytes)
{
    (void)k, (void)sel_bytes, (void)cb_bytes;
    return st->nc > 0 ? kvq_rt_select_all(st, sel) : 0;
}

const rt_selector kvq_rt_selector_full = {
    .id = KVQ_SELECT_FULL, .name = "full", .select = full_select,
};
