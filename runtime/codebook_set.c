/*
 * codebook_set.c — an artifact's codebooks loaded for decoding (kvq_codebook_set):
 * format validation, the model identity check (never a silent fallback), one codebook
 * and one LUT table per (layer, KV head).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/artifact.h"
#include "kvq/runtime.h"
#include "kvq/util.h"
#include "runtime/runtime_internal.h"

/* ==========================================================================
 * The artifact at run time
 * ========================================================================== */

struct kvq_codebook_set {
    kvq_model_id model; /* the artifact's identity */
    kvq_codebook_method method;
    int32_t K, G, wrope_w;
    int64_t wrope_b;
    int has_pos;             /* positions.mode / positions.score recorded */
    kvq_positions pos;
    kvq_score_pos score;
    int32_t n_layers, n_kv_heads;
    kvq_weights_check weights; /* how the weight fingerprints compared */
    char weights_note[512];    /* the message behind a check other than MATCH */
    kvq_codebook **cb;  /* [n_layers * n_kv_heads], NULL for layers without */
    kvq_rk_table **tab; /* same */
    uint64_t bytes;
};

/* Reads an integer metadata value (required; the artifact was validated). */
static kvq_status meta_int(const kvq_st *st, const char *path, const char *key, int64_t lo,
                           int64_t hi, int64_t *out, kvq_err *err)
{
    const char *v = kvq_st_meta_get(st, key);
    kvq_err e = {0};
    if (!v)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata key %s is missing", path, key);
    if (kvq_parse_i64(v, lo, hi, out, &e))
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata %s: %s", path, key, e.msg);
    return KVQ_OK;
}

static kvq_status meta_real(const kvq_st *st, const char *path, const char *key, double *out,
                            kvq_err *err)
{
    const char *v = kvq_st_meta_get(st, key);
    kvq_err e = {0};
    if (!v)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata key %s is missing", path, key);
    if (kvq_parse_f64(v, -1e300, 1e300, out, &e))
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata %s: %s", path, key, e.msg);
    return KVQ_OK;
}

/* The artifact's attention shape (the keys every artifact records), compared with
 * kvq_model_id_compare_attention; then the rest of the identity when recorded. */
static kvq_status check_identity(const kvq_st *st, const char *path, const kvq_model_id *m,
                                 const char *label, kvq_model_id *art, kvq_err *err)
{
    static const struct {
        const char *key;
        size_t off;
    } ints[] = {
        {KVQ_META_N_LAYERS, offsetof(kvq_model_id, n_layers)},
        {KVQ_META_N_HEADS, offsetof(kvq_model_id, n_heads)},
        {KVQ_META_N_KV_HEADS, offsetof(kvq_model_id, n_kv_heads)},
        {KVQ_META_HEAD_DIM, offsetof(kvq_model_id, head_dim)},
    };
    kvq_status s;
    memset(art, 0, sizeof *art);
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        int64_t v;
        if ((s = meta_int(st, path, ints[i].key, 1, INT32_MAX, &v, err)))
            return s;
        *(int32_t *)((char *)art + ints[i].off) = (int32_t)v;
    }
    art->rope = kvq_rope_default(art->head_dim);
    if ((s = meta_real(st, path, KVQ_META_ROPE_BASE, &art->rope.base, err)))
        return s;
    /* validate() checked that layout and scaling parse */
    kvq_rope_layout_parse(kvq_st_meta_get(st, KVQ_META_ROPE_LAYOUT), &art->rope.layout);
    kvq_rope_scaling_parse(kvq_st_meta_get(st, KVQ_META_ROPE_SCALING), &art->rope.scaling);
    if (art->rope.scaling != KVQ_ROPE_SCALING_NONE) {
        static const char *const keys[] = {KVQ_META_ROPE_FACTOR, KVQ_META_ROPE_LOW_FREQ,
                                           KVQ_META_ROPE_HIGH_FREQ, KVQ_META_ROPE_ORIG_MAX};
        double *av[] = {&art->rope.factor, &art->rope.low_freq_factor, &art->rope.high_freq_factor,
                        &art->rope.original_max_pos};
        const int n = art->rope.scaling == KVQ_ROPE_SCALING_LINEAR ? 1 : 4;
        for (int i = 0; i < n; i++)
            if ((s = meta_real(st, path, keys[i], av[i], err)))
                return s;
    }
    if ((s = kvq_model_id_compare_attention(art, path, m, label, err)))
        return s;
    /* The rest of the identity (architecture, widths, vocabulary ...) when the artifact
     * records all of it, as `kvq fit` does. */
    kvq_model_id full;
    kvq_err e = {0};
    if (kvq_model_id_from_meta(st, KVQ_META_MODEL_PREFIX, path, &full, &e) == KVQ_OK) {
        *art = full;
        char la[1100];
        snprintf(la, sizeof la, "%s", path);
        if ((s = kvq_model_id_compare(art, la, m, label, err)))
            return s;
    }
    /* The weights' fingerprint and name, also when the rest of the identity is absent. */
    const char *fp = kvq_st_meta_get(st, KVQ_META_MODEL_FINGERPRINT);
    const char *nm = kvq_st_meta_get(st, KVQ_META_MODEL_NAME);
    if (fp && !art->fingerprint[0])
        snprintf(art->fingerprint, sizeof art->fingerprint, "%s", fp);
    if (nm && !art->name[0])
        snprintf(art->name, sizeof art->name, "%s", nm);
    return KVQ_OK;
}

/* The weight fingerprints (docs/runtime.md "Weights"): an artifact that records one is
 * opened only for a model with the same one, unless flags accept the mismatch. */
static kvq_status check_weights(kvq_codebook_set *rt, const char *path, const kvq_model_id *m,
                                const char *label, unsigned flags, kvq_err *err)
{
    const kvq_model_id *a = &rt->model;
    const int accept = (flags & KVQ_OPEN_ACCEPT_MODEL_MISMATCH) != 0;
    kvq_err e = {0};
    rt->weights = KVQ_WEIGHTS_MATCH;
    if (!a->fingerprint[0]) {
        rt->weights = KVQ_WEIGHTS_UNRECORDED;
        snprintf(rt->weights_note, sizeof rt->weights_note,
                 "%s records no weight fingerprint: it cannot be checked against %s", path,
                 label);
        return KVQ_OK;
    }
    if (!m->fingerprint[0])
        kvq_err_set(&e, KVQ_E_MISMATCH,
                    "%s vs %s: the artifact was calibrated on the weights with fingerprint %s "
                    "(%s) and %s gives none to check it against",
                    path, label, a->fingerprint, a->name[0] ? a->name : a->path, label);
    else if (kvq_model_id_compare_weights(a, path, m, label, &e) == KVQ_OK)
        return KVQ_OK;
    snprintf(rt->weights_note, sizeof rt->weights_note, "%s", e.msg);
    if (!accept)
        return kvq_err_set(err, KVQ_E_MISMATCH, "%s", e.msg);
    rt->weights = KVQ_WEIGHTS_MISMATCH_ACCEPTED;
    return KVQ_OK;
}

void kvq_codebook_set_close(kvq_codebook_set *rt)
{
    if (!rt)
        return;
    const size_t n = (size_t)rt->n_layers * (size_t)rt->n_kv_heads;
    for (size_t i = 0; rt->cb && i < n; i++)
        kvq_codebook_free(rt->cb[i]);
    for (size_t i = 0; rt->tab && i < n; i++)
        kvq_rk_table_free(rt->tab[i]);
    free(rt->cb);
    free(rt->tab);
    free(rt);
}

kvq_status kvq_codebook_set_open(const char *path, const kvq_model_id *model, const char *label,
                                  kvq_codebook_set **out, kvq_err *err)
{
    return kvq_codebook_set_open_ex(path, model, label, 0, out, err);
}

kvq_status kvq_codebook_set_open_ex(const char *path, const kvq_model_id *model,
                                     const char *label, unsigned flags, kvq_codebook_set **out,
                                     kvq_err *err)
{
    kvq_artifact *a = NULL;
    kvq_codebook_set *rt = NULL;
    int32_t *layers = NULL;
    size_t n_layers_listed = 0;
    kvq_status s;
    *out = NULL;
    if (!path || !model || !label)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "runtime: NULL argument");
    if ((s = kvq_artifact_open(path, &a, err)) || (s = kvq_artifact_validate(a, err)))
        goto done;
    const kvq_st *st = kvq_artifact_payload(a);
    const char *method = kvq_st_meta_get(st, KVQ_META_METHOD);
    if (!method || !strcmp(method, KVQ_METHOD_NONE)) {
        s = kvq_err_set(err, KVQ_E_UNSUPPORTED,
                        "%s: the artifact has no codebooks (method \"%s\"): nothing to retrieve "
                        "with",
                        path, method ? method : "?");
        goto done;
    }
    if (!(rt = calloc(1, sizeof *rt))) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if ((s = check_identity(st, path, model, label, &rt->model, err)) ||
        (s = check_weights(rt, path, model, label, flags, err)))
        goto done;
    int64_t K, G, w, b;
    if ((s = meta_int(st, path, KVQ_META_CODEBOOK_SIZE, 2, 65536, &K, err)) ||
        (s = meta_int(st, path, KVQ_META_GROUPS, 1, model->head_dim, &G, err)) ||
        (s = meta_int(st, path, KVQ_META_WROPE_W, 0, INT32_MAX, &w, err)) ||
        (s = meta_int(st, path, KVQ_META_WROPE_B, 0, INT32_MAX, &b, err)) ||
        (s = kvq_codebook_method_from_format(method, (int32_t)G, &rt->method, err)))
        goto done;
    rt->K = (int32_t)K;
    rt->G = (int32_t)G;
    rt->wrope_w = (int32_t)w;
    rt->wrope_b = b;
    const char *pm = kvq_st_meta_get(st, KVQ_META_POS_MODE);
    const char *ps = kvq_st_meta_get(st, KVQ_META_POS_SCORE);
    if (pm || ps) {
        if (!pm || !ps || kvq_positions_parse(pm, &rt->pos) || kvq_score_pos_parse(ps, &rt->score)) {
            s = kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata %s / %s: '%s' / '%s' is not a "
                            "position mode (wrope, rope) and a scoring query (rb, mean, bands)",
                            path, KVQ_META_POS_MODE, KVQ_META_POS_SCORE, pm ? pm : "(missing)",
                            ps ? ps : "(missing)");
            goto done;
        }
        rt->has_pos = 1;
    }
    rt->n_layers = model->n_layers;
    rt->n_kv_heads = model->n_kv_heads;
    const size_t n = (size_t)rt->n_layers * (size_t)rt->n_kv_heads;
    rt->cb = calloc(n, sizeof *rt->cb);
    rt->tab = calloc(n, sizeof *rt->tab);
    if (!rt->cb || !rt->tab) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    const char *ls = kvq_st_meta_get(st, KVQ_META_LAYERS);
    if (ls) {
        kvq_err e = {0};
        if (kvq_parse_index_list(ls, rt->n_layers, &layers, &n_layers_listed, &e)) {
            s = kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata layers: %s", path, e.msg);
            goto done;
        }
    }
    for (int32_t l = 0; l < rt->n_layers; l++) {
        int listed = !ls;
        for (size_t i = 0; i < n_layers_listed && !listed; i++)
            listed = layers[i] == l;
        if (!listed)
            continue;
        for (int32_t h = 0; h < rt->n_kv_heads; h++) {
            const size_t i = (size_t)l * rt->n_kv_heads + h;
            kvq_err e = {0};
            if ((s = kvq_codebook_load(st, l, h, &rt->cb[i], &e))) {
                kvq_err_set(err, s, "%s: %s", path, e.msg);
                goto done;
            }
            if ((s = kvq_rk_table_create(rt->cb[i], &rt->tab[i], err)))
                goto done;
            rt->bytes += (uint64_t)K * model->head_dim * (sizeof(float) + sizeof(uint16_t));
        }
    }
    *out = rt;
    rt = NULL;
done:
    free(layers);
    kvq_codebook_set_close(rt);
    kvq_artifact_close(a);
    return s;
}

kvq_codebook_method kvq_codebook_set_method(const kvq_codebook_set *rt) { return rt->method; }
int32_t kvq_codebook_set_size(const kvq_codebook_set *rt) { return rt->K; }
int32_t kvq_codebook_set_groups(const kvq_codebook_set *rt) { return rt->G; }
int32_t kvq_codebook_set_wrope_w(const kvq_codebook_set *rt) { return rt->wrope_w; }
int64_t kvq_codebook_set_wrope_b(const kvq_codebook_set *rt) { return rt->wrope_b; }
int kvq_codebook_set_positions(const kvq_codebook_set *rt, kvq_positions *pos, kvq_score_pos *score)
{
    if (rt->has_pos) {
        *pos = rt->pos;
        *score = rt->score;
    }
    return rt->has_pos;
}
const kvq_model_id *kvq_codebook_set_model(const kvq_codebook_set *rt) { return &rt->model; }
uint64_t kvq_codebook_set_bytes(const kvq_codebook_set *rt) { return rt->bytes; }
kvq_weights_check kvq_codebook_set_weights(const kvq_codebook_set *rt) { return rt->weights; }
const char *kvq_codebook_set_weights_note(const kvq_codebook_set *rt)
{
    return rt->weights == KVQ_WEIGHTS_MATCH ? "" : rt->weights_note;
}

const kvq_codebook *kvq_codebook_set_at(const kvq_codebook_set *rt, int32_t layer, int32_t head)
{
    if (layer < 0 || layer >= rt->n_layers || head < 0 || head >= rt->n_kv_heads)
        return NULL;
    return rt->cb[(size_t)layer * rt->n_kv_heads + head];
}

const kvq_rk_table *kvq_codebook_set_table(const kvq_codebook_set *rt, int32_t layer, int32_t head)
{
    if (layer < 0 || layer >= rt->n_layers || head < 0 || head >= rt->n_kv_heads)
        return NULL;
    return rt->tab[(size_t)layer * rt->n_kv_heads + head];
}
