/*
 * codebook_fit.c — kvq_codebook_fit: the fit-space keys (kvq_codebook_fit_space), one
 * k-means run per group, then kvq_codebook_create on the centroids. The codebook
 * itself (encode, LUT, load, save) lives in codebook/codebook.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/codebook.h"
#include "kvq/fit.h"
#include "kvq/util.h"

/* ==========================================================================
 * Fit
 * ========================================================================== */

uint64_t kvq_codebook_group_seed(uint64_t seed, int64_t g)
{
    /* SplitMix64 finalizer of seed + (g + 1) * golden ratio. */
    uint64_t z = seed + (uint64_t)(g + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void kvq_codebook_fit_stats_free(kvq_codebook_fit_stats *s)
{
    if (!s)
        return;
    for (int32_t g = 0; s->group && g < s->groups; g++)
        kvq_kmeans_stats_free(&s->group[g]);
    free(s->group);
    s->group = NULL;
    s->groups = 0;
}

kvq_status kvq_codebook_fit(const kvq_codebook_desc *desc, const kvq_codebook_data *data,
                            const kvq_kmeans_params *km, kvq_codebook **out,
                            kvq_codebook_fit_stats *stats, kvq_err *err)
{
    float *x = NULL, *sub = NULL, *W = NULL;
    kvq_codebook_fit_stats st = {0};
    kvq_status s;
    size_t bytes;
    char label[96];
    if (!out)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "fit: NULL output");
    *out = NULL;
    if (stats)
        memset(stats, 0, sizeof *stats);
    if ((s = kvq_codebook_desc_check(desc, err)))
        return s;
    kvq_kmeans_params kp = km ? *km : kvq_kmeans_params_default();
    const char *base = kp.label ? kp.label : "codebook";
    const int32_t d = desc->dim, G = desc->groups, K = desc->k, dg = d / G;
    const int qa = kvq_codebook_method_is_query_aware(desc->method);
    if (!data || !data->keys || kp.threads < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: no keys", base);
    if (data->n < K)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: codebook size %d is larger than the "
                           "%lld training keys", base, (int)K, (long long)data->n);
    if (qa && (!data->L || !data->Linv))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: %s needs L and L^-1", base,
                           kvq_codebook_method_name(desc->method));
    int64_t bad = kvq_codebook_first_bad_row(data->keys, data->n, d);
    if (bad >= 0)
        return kvq_err_set(err, KVQ_E_NUMERIC, "%s: key row %lld is not finite", base,
                           (long long)bad);
    if (!kvq_size_mul((size_t)data->n, (size_t)d * sizeof(float), &bytes) ||
        !(x = malloc(bytes)) || (G > 1 && !(sub = malloc(bytes / G))) ||
        !(W = malloc((size_t)K * d * sizeof *W)) ||
        !(st.group = calloc((size_t)G, sizeof *st.group))) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory for %lld keys", base,
                        (long long)data->n);
        goto done;
    }
    st.groups = G;
    if ((s = kvq_codebook_fit_space(desc, data->L, data->keys, data->pos, data->n, kp.threads,
                                    x, err)))
        goto done;
    const uint64_t seed = kp.seed;
    for (int32_t g = 0; g < G; g++) {
        kp.k = K;
        kp.seed = kvq_codebook_group_seed(seed, g);
        if (G > 1)
            snprintf(label, sizeof label, "%s g%d", base, (int)g);
        else
            snprintf(label, sizeof label, "%s", base);
        kp.label = label;
        if (G > 1)
            kvq_codebook_take_group(x, data->n, d, g, dg, sub);
        s = kvq_kmeans_fit(G > 1 ? sub : x, data->n, dg, NULL, &kp, W + (size_t)g * K * dg,
                           NULL, &st.group[g], err);
        if (s)
            goto done;
    }
    s = kvq_codebook_create(desc, W, data->L, data->Linv, out, err);
done:
    if (s == KVQ_OK && stats)
        *stats = st;
    else
        kvq_codebook_fit_stats_free(&st);
    free(x);
    free(sub);
    free(W);
    return s;
}
