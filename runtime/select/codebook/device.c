/*
 * device.c — where the decode step's selection runs: the device choice of
 * kvq_retrieval_params (kvq_rt_device_choose, for every selector) and the two rt_backend
 * tables of the codebook selector's first stage (codes.h).
 *
 *   cpu    LUT, score gather and top-k with the kvq_rk_* kernels (params.isa)
 *   cuda   the same three steps with the kernels of runtime/cuda/retrieval_cuda.cu over a
 *          device mirror of the LUT tables and codes (built only with KVQ_HAVE_CUDA)
 *
 * Only the codebook selector under KVQ_GROUP_SUM goes through the table's select; the
 * rest of the step (queries, sinks / window, exact attention, statistics) is the same
 * host code for both (step.c, codebook.c).
 */
#include <string.h>

#include "kvq/runtime.h"
#include "runtime/runtime_internal.h"
#include "runtime/select/codebook/codebook.h"

#ifdef KVQ_HAVE_CUDA
#include "runtime/cuda/retrieval_cuda.h"
#endif

/* ==========================================================================
 * The device choice
 * ========================================================================== */

static const char *const device_names[] = {"auto", "cpu", "cuda"};

const char *kvq_retrieval_device_name(kvq_retrieval_device dev)
{
    return (unsigned)dev <= KVQ_RETRIEVAL_DEVICE_CUDA ? device_names[dev] : "unknown";
}

kvq_status kvq_retrieval_device_parse(const char *s, kvq_retrieval_device *dev, kvq_err *err)
{
    for (int i = 0; i <= (int)KVQ_RETRIEVAL_DEVICE_CUDA; i++)
        if (s && !strcmp(s, device_names[i])) {
            *dev = (kvq_retrieval_device)i;
            return KVQ_OK;
        }
    return kvq_err_set(err, KVQ_E_INVALID_ARG, "device '%s': not auto, cpu or cuda",
                       s ? s : "(null)");
}

kvq_retrieval_device kvq_retrieval_device_resolve(kvq_retrieval_device want,
                                                  const kvq_callbacks *cb)
{
    if (want != KVQ_RETRIEVAL_DEVICE_AUTO && want != KVQ_RETRIEVAL_DEVICE_CUDA)
        return KVQ_RETRIEVAL_DEVICE_CPU;
    const char *why = NULL;
    if (kvq_cuda_available(&why)) {
#ifdef KVQ_HAVE_CUDA
        return KVQ_RETRIEVAL_DEVICE_CUDA;
#else
        why = "this build has no CUDA backend"; /* unreachable: the CPU build answers 0 */
#endif
    }
    if (want == KVQ_RETRIEVAL_DEVICE_CUDA) {
        if (!why)
            why = "no device";
        /* kvq_cuda_available's reason may already end in "; using the CPU" */
        kvq_log(cb, KVQ_LOG_WARN, "retrieval: CUDA requested but unavailable: %s%s", why,
                strstr(why, "using the CPU") ? "" : "; using the CPU");
    }
    return KVQ_RETRIEVAL_DEVICE_CPU;
}

kvq_retrieval_device kvq_retrieval_device_used(const kvq_retrieval *r) { return r->device; }

/* ==========================================================================
 * CPU
 * ========================================================================== */

static kvq_status cpu_select(const rt_step *st, const float *qs, int64_t k, int32_t *sel,
                             kvq_err *err)
{
    const kvq_retrieval *r = st->r;
    rt_scratch *S = st->S;
    const kvq_rk_table *tab = st->L->tab[st->head];
    const kvq_codebook_desc *D = kvq_codebook_get_desc(st->L->cb[st->head]);
    const rt_codes_head *C = kvq_rt_codes(st->H);
    rt_codes_scratch *X = kvq_rt_codes_scr(S);
    const uint16_t *codes = C->codes + (size_t)st->s_end * D->groups; /* [nc, G] */
    (void)err;
    kvq_rk_lut(r->p.isa, tab, qs, X->lut);
    int64_t n;
    if (D->groups == 1 && C->hist && kvq_rk_codes_select_pays(st->nc, D->k)) {
        /* one pass over the codes, no scores (same selection as below) */
        kvq_rk_code_counts(C->hist, D->k, C->codes, st->L->len, st->s_end, st->w_beg,
                           X->cwork);
        n = kvq_rk_topk_codes(r->p.isa, X->lut, D->k, X->cwork, codes, st->nc, k, sel,
                              X->cwork + D->k);
    } else {
        kvq_rk_score(r->p.isa, X->lut, D->groups, D->k, codes, st->nc, S->scores);
        n = kvq_rk_topk(r->p.isa, S->scores, st->nc, k, sel, S->work);
    }
    for (int64_t j = 0; j < n; j++)
        sel[j] += (int32_t)st->s_end;
    return KVQ_OK;
}

static const rt_backend backend_cpu = {.name = "cpu",
                                       .device = KVQ_RETRIEVAL_DEVICE_CPU,
                                       .init = NULL,
                                       .fini = NULL,
                                       .codes = NULL,
                                       .select = cpu_select};

/* ==========================================================================
 * CUDA
 * ========================================================================== */

#ifdef KVQ_HAVE_CUDA
static kvq_status cuda_init(kvq_retrieval *r, kvq_err *err)
{
    kvq_rt_cuda *c = NULL;
    kvq_status s = kvq_rt_cuda_create(r->n_layers, r->n_kv, r->n_scr, &c, err);
    for (int32_t l = 0; !s && l < r->n_layers; l++)
        for (int32_t h = 0; !s && h < r->n_kv; h++) {
            const kvq_rk_table *t = r->layer[l].tab[h];
            if (!t)
                continue;
            int32_t G, dg, K;
            const uint16_t *ct = kvq_rk_table_f16(t, &G, &dg, &K);
            s = kvq_rt_cuda_set_table(c, l, h, ct, G, dg, K, err);
        }
    if (s) {
        kvq_rt_cuda_free(c);
        return s;
    }
    kvq_rt_codes_ctx(r)->dev = c;
    return KVQ_OK;
}

static void cuda_fini(kvq_retrieval *r)
{
    kvq_rt_cuda_free(kvq_rt_codes_ctx(r)->dev);
    kvq_rt_codes_ctx(r)->dev = NULL;
}

static kvq_status cuda_codes(kvq_retrieval *r, const rt_layer *L, int32_t layer, int32_t head,
                             int64_t first, int64_t n, kvq_err *err)
{
    if (!L->tab[head])
        return KVQ_OK;
    return kvq_rt_cuda_put_codes(kvq_rt_codes_ctx(r)->dev, layer, head,
                                 kvq_rt_codes(&L->head[head])->codes, first, n,
                                 L->cap, err);
}

static kvq_status cuda_select(const rt_step *st, const float *qs, int64_t k, int32_t *sel,
                              kvq_err *err)
{
    float qp[KVQ_ROPE_MAX_DIM];
    kvq_rk_table_query(st->L->tab[st->head], qs, qp);
    return kvq_rt_cuda_select(kvq_rt_codes_ctx(st->r)->dev, st->S->slot, st->layer, st->head, qp,
                              st->s_end, st->nc, k, sel, err);
}

static const rt_backend backend_cuda = {.name = "cuda",
                                        .device = KVQ_RETRIEVAL_DEVICE_CUDA,
                                        .init = cuda_init,
                                        .fini = cuda_fini,
                                        .codes = cuda_codes,
                                        .select = cuda_select};
#endif

/* ==========================================================================
 * The choice for a context
 * ========================================================================== */

kvq_retrieval_device kvq_rt_device_choose(const kvq_retrieval_params *p,
                                          const kvq_codebook_set *rt)
{
    if (p->device == KVQ_RETRIEVAL_DEVICE_CPU)
        return KVQ_RETRIEVAL_DEVICE_CPU;
    if (kvq_retrieval_device_resolve(p->device, &p->cb) != KVQ_RETRIEVAL_DEVICE_CUDA)
        return KVQ_RETRIEVAL_DEVICE_CPU; /* warned when CUDA was asked for */
    /* what the CUDA step covers: the codebook selector's LUT, gather and top-k under
     * the group sum, with an artifact */
    const char *uncovered = NULL;
    if (p->selector != KVQ_SELECT_CODEBOOK)
        uncovered = "the CUDA step covers the codebook selector only";
    else if (p->group != KVQ_GROUP_SUM)
        uncovered = "the CUDA step covers --group sum only";
    else if (!rt)
        uncovered = "no artifact";
    if (uncovered) {
        /* full attention selects nothing: no selection to move, nothing to say */
        if (p->device == KVQ_RETRIEVAL_DEVICE_CUDA && p->selector != KVQ_SELECT_FULL)
            kvq_log(&p->cb, KVQ_LOG_WARN, "retrieval: CUDA requested for the %s selector but %s; "
                    "using the CPU", kvq_selector_name(p->selector), uncovered);
        return KVQ_RETRIEVAL_DEVICE_CPU;
    }
    return KVQ_RETRIEVAL_DEVICE_CUDA;
}

kvq_status kvq_rt_backend_open(kvq_retrieval *r, kvq_err *err)
{
    rt_codes_ctx *X = kvq_rt_codes_ctx(r);
    X->be = &backend_cpu;
    if (r->device != KVQ_RETRIEVAL_DEVICE_CUDA)
        return KVQ_OK;
#ifdef KVQ_HAVE_CUDA
    X->be = &backend_cuda;
    return backend_cuda.init(r, err);
#else
    (void)err;
    return KVQ_OK; /* not reached: the CPU build never resolves to CUDA */
#endif
}
