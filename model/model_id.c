/* model_id.c — the model identity: comparison and its __metadata__ form (kvq/model_id.h). */
#include "kvq/model_id.h"

#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/model.h"
#include "kvq/util.h"

/* ======================================================================================
 * Model identity: comparison and __metadata__ form
 * ====================================================================================== */

/* One table drives compare, set_meta and from_meta so the three cannot drift apart. */
typedef enum { F_STR, F_I32, F_F64, F_LAYOUT, F_SCALING } field_kind;
typedef struct field {
    const char *key; /* relative to the prefix */
    field_kind kind;
    size_t off;
    size_t cap;      /* F_STR buffer size */
    int identity;    /* compared by kvq_model_id_compare */
    int optional;    /* may be absent from metadata ("", or 0 for numbers) */
} field;

#define FS(k, m, id) {k, F_STR, offsetof(kvq_model_id, m), sizeof(((kvq_model_id *)0)->m), id, 0}
#define FO(k, m) {k, F_STR, offsetof(kvq_model_id, m), sizeof(((kvq_model_id *)0)->m), 0, 1}
#define FI(k, m) {k, F_I32, offsetof(kvq_model_id, m), 0, 1, 0}
#define FD(k, m) {k, F_F64, offsetof(kvq_model_id, m), 0, 1, 0}
/* The attention beyond the llama family (format 2): compared, written only when not 0,
 * 0 when absent (files of format 1, llama-family models). */
#define FIA(k, m) {k, F_I32, offsetof(kvq_model_id, m), 0, 1, 1}
#define FDA(k, m) {k, F_F64, offsetof(kvq_model_id, m), 0, 1, 1}
static const field fields[] = {
    FS("path", path, 0),
    FS("source", source, 0),
    FO("name", name),
    FO("fingerprint", fingerprint),
    FS("architecture", architecture, 1),
    FI("n_layers", n_layers),
    FI("dim", dim),
    FI("hidden_dim", hidden_dim),
    FI("n_heads", n_heads),
    FI("n_kv_heads", n_kv_heads),
    FI("head_dim", head_dim),
    FI("vocab_size", vocab_size),
    FI("context_length", context_length),
    FD("norm_eps", norm_eps),
    FD("rope.base", rope.base),
    {"rope.layout", F_LAYOUT, offsetof(kvq_model_id, rope.layout), 0, 1, 0},
    {"rope.scaling", F_SCALING, offsetof(kvq_model_id, rope.scaling), 0, 1, 0},
    FD("rope.factor", rope.factor),
    FD("rope.low_freq_factor", rope.low_freq_factor),
    FD("rope.high_freq_factor", rope.high_freq_factor),
    FD("rope.original_max_pos", rope.original_max_pos),
    FIA("attention.sliding_window", attn.sliding_window),
    FIA("attention.sliding_from", attn.sliding_from),
    FIA("attention.sliding_period", attn.sliding_period),
    FDA("attention.rope_local_base", attn.rope_local_base),
    FDA("attention.scale", attn.scale),
    FDA("attention.softcap", attn.softcap),
};
#undef FS
#undef FO
#undef FI
#undef FD
#undef FIA
#undef FDA
static const size_t n_fields = sizeof fields / sizeof fields[0];

/* The field as text: what metadata stores and what mismatch messages show. */
static void field_format(const field *f, const kvq_model_id *m, char *buf, size_t cap)
{
    const char *p = (const char *)m + f->off;
    switch (f->kind) {
    case F_STR: snprintf(buf, cap, "%s", p); break;
    case F_I32: snprintf(buf, cap, "%" PRId32, *(const int32_t *)p); break;
    case F_F64: snprintf(buf, cap, "%.17g", *(const double *)p); break;
    case F_LAYOUT:
        snprintf(buf, cap, "%s", kvq_rope_layout_name(*(const kvq_rope_layout *)p));
        break;
    case F_SCALING:
        snprintf(buf, cap, "%s", kvq_rope_scaling_name(*(const kvq_rope_scaling *)p));
        break;
    }
}

/* The F64 field at off equal in a and b once both are rounded to float32. */
static int f32_equal(const kvq_model_id *a, const kvq_model_id *b, size_t off)
{
    const double x = *(const double *)((const char *)a + off);
    const double y = *(const double *)((const char *)b + off);
    return (float)x == (float)y;
}

kvq_status kvq_model_id_compare(const kvq_model_id *a, const char *label_a,
                                const kvq_model_id *b, const char *label_b, kvq_err *err)
{
    for (size_t i = 0; i < n_fields; i++) {
        const field *f = &fields[i];
        if (!f->identity)
            continue;
        char va[1040], vb[1040];
        field_format(f, a, va, sizeof va);
        field_format(f, b, vb, sizeof vb);
        /* Text comparison: %.17g round-trips doubles, so equal text is equal value. A
         * number equal at float32 is the same: GGUF stores eps, RoPE bases and factors
         * as float32, HF's config.json as decimal text (1e-6 vs 9.9999999747524271e-07). */
        if (f->kind == F_F64 && f32_equal(a, b, f->off))
            continue;
        if (strcmp(va, vb))
            return kvq_err_set(err, KVQ_E_MISMATCH, "%s vs %s: model.%s differs (%s vs %s)",
                               label_a, label_b, f->key, va, vb);
    }
    return KVQ_OK;
}

static int has_attention(const kvq_model_attn *x)
{
    return x->sliding_window || x->sliding_from || x->sliding_period || x->rope_local_base ||
           x->scale || x->softcap;
}

/* Each layer's attention (kvq_model_layer_attn) under a and b, when both carry the
 * description (an artifact's attention-shape keys alone, files before format 1.1, do
 * not): the first layer whose RoPE, score scale, softcap or window differ is named.
 * The retrieval runtime attends each layer as described (runtime/local.h), so the two
 * must describe the same attention. */
static kvq_status check_layers(const kvq_model_id *a, const char *label_a, const kvq_model_id *b,
                               const char *label_b, kvq_err *err)
{
    if (!has_attention(&a->attn) || !has_attention(&b->attn))
        return KVQ_OK;
    return kvq_model_id_compare_layers(a, label_a, b, label_b, err);
}

kvq_status kvq_model_id_compare_layers(const kvq_model_id *a, const char *label_a,
                                       const kvq_model_id *b, const char *label_b, kvq_err *err)
{
    const int32_t n = a->n_layers < b->n_layers ? a->n_layers : b->n_layers;
    for (int32_t l = 0; l < n; l++) {
        kvq_layer_attn x, y;
        kvq_model_id_layer_attn(a, l, &x);
        kvq_model_id_layer_attn(b, l, &y);
        double va = 0, vb = 0;
        const char *what = kvq_layer_attn_diff(&x, &y, &va, &vb);
        if (what)
            return kvq_err_set(err, KVQ_E_MISMATCH,
                               "%s vs %s: layer %d's attention differs: %s %.9g vs %.9g", label_a,
                               label_b, (int)l, what, va, vb);
    }
    return KVQ_OK;
}

kvq_status kvq_model_id_compare_attention(const kvq_model_id *a, const char *label_a,
                                          const kvq_model_id *b, const char *label_b,
                                          kvq_err *err)
{
#define DIFFERS(field, fmt, va, vb)                                                                \
    kvq_err_set(err, KVQ_E_MISMATCH, "%s vs %s: model.%s differs (" fmt " vs " fmt ")", label_a,   \
                label_b, field, va, vb)
    const struct {
        const char *key;
        int32_t a, b;
    } ints[] = {{"n_layers", a->n_layers, b->n_layers},
                {"n_heads", a->n_heads, b->n_heads},
                {"n_kv_heads", a->n_kv_heads, b->n_kv_heads},
                {"head_dim", a->head_dim, b->head_dim}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].a != ints[i].b)
            return DIFFERS(ints[i].key, "%d", (int)ints[i].a, (int)ints[i].b);
    const kvq_rope *ra = &a->rope, *rb = &b->rope;
    if (ra->base != rb->base)
        return DIFFERS("rope.base", "%.17g", ra->base, rb->base);
    if (ra->layout != rb->layout)
        return DIFFERS("rope.layout", "%s", kvq_rope_layout_name(ra->layout),
                       kvq_rope_layout_name(rb->layout));
    if (ra->scaling != rb->scaling)
        return DIFFERS("rope.scaling", "%s", kvq_rope_scaling_name(ra->scaling),
                       kvq_rope_scaling_name(rb->scaling));
    const struct {
        const char *key;
        double a, b;
    } reals[] = {{"rope.factor", ra->factor, rb->factor},
                 {"rope.low_freq_factor", ra->low_freq_factor, rb->low_freq_factor},
                 {"rope.high_freq_factor", ra->high_freq_factor, rb->high_freq_factor},
                 {"rope.original_max_pos", ra->original_max_pos, rb->original_max_pos}};
    const size_t n_reals = ra->scaling == KVQ_ROPE_SCALING_NONE     ? 0
                           : ra->scaling == KVQ_ROPE_SCALING_LINEAR ? 1
                                                                    : 4;
    for (size_t i = 0; i < n_reals; i++)
        if (reals[i].a != reals[i].b)
            return DIFFERS(reals[i].key, "%.17g", reals[i].a, reals[i].b);
#undef DIFFERS
    return check_layers(a, label_a, b, label_b, err);
}

kvq_status kvq_model_id_compare_weights(const kvq_model_id *a, const char *label_a,
                                        const kvq_model_id *b, const char *label_b, kvq_err *err)
{
    if (!a->fingerprint[0] || !b->fingerprint[0] || !strcmp(a->fingerprint, b->fingerprint))
        return KVQ_OK;
    return kvq_err_set(err, KVQ_E_MISMATCH,
                       "%s vs %s: the weights differ (fingerprint %s (%s) vs %s (%s)): the "
                       "artifact was calibrated on another checkpoint",
                       label_a, label_b, a->fingerprint, a->name[0] ? a->name : a->path,
                       b->fingerprint, b->name[0] ? b->name : b->path);
}

void kvq_path_basename(const char *path, char *out, size_t cap)
{
    if (!cap)
        return;
    size_t n = path ? strlen(path) : 0;
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    if (n == 1 && path[0] == '/')
        b = 0; /* "/" stays "/" */
    const size_t len = n - b < cap - 1 ? n - b : cap - 1;
    if (len)
        memcpy(out, path + b, len);
    out[len] = '\0';
}

void kvq_spec_redact_paths(const char *spec, char *out, size_t cap)
{
    kvq_strbuf b = {0};
    const char *p = spec ? spec : "";
    for (;;) {
        const char *end = strchr(p, ',');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *slash = memchr(p, '/', n), *colon = memchr(p, ':', n);
        if (!slash) {
            kvq_sb_put(&b, p, n);
        } else {
            size_t keep = colon && colon < slash ? (size_t)(colon - p) + 1 : 0;
            char item[4096], base[1024];
            snprintf(item, sizeof item, "%.*s", (int)(n - keep), p + keep);
            kvq_path_basename(item, base, sizeof base);
            kvq_sb_put(&b, p, keep);
            kvq_sb_puts(&b, base);
        }
        if (!end)
            break;
        kvq_sb_puts(&b, ",");
        p = end + 1;
    }
    snprintf(out, cap, "%s", b.s && !b.oom ? b.s : "");
    kvq_sb_free(&b);
}

kvq_status kvq_model_id_set_meta(const kvq_model_id *m, const char *prefix, kvq_st_writer *w,
                                 kvq_err *err)
{
    for (size_t i = 0; i < n_fields; i++) {
        char key[128], val[1040];
        snprintf(key, sizeof key, "%s%s", prefix, fields[i].key);
        field_format(&fields[i], m, val, sizeof val);
        if (fields[i].optional && (!val[0] || (fields[i].kind != F_STR && !strcmp(val, "0"))))
            continue;
        kvq_status st = kvq_st_writer_set_meta(w, key, val, err);
        if (st)
            return st;
    }
    return KVQ_OK;
}

kvq_status kvq_model_id_from_meta(const kvq_st *st, const char *prefix, const char *label,
                                  kvq_model_id *out, kvq_err *err)
{
    /* Parsed into a local copy: *out is left alone on failure. */
    kvq_model_id id, *m = &id;
    memset(m, 0, sizeof *m);
    for (size_t i = 0; i < n_fields; i++) {
        const field *f = &fields[i];
        char key[128];
        snprintf(key, sizeof key, "%s%s", prefix, f->key);
        const char *v = kvq_st_meta_get(st, key);
        if (!v && f->optional)
            continue;
        if (!v)
            return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: metadata key %s is missing", label,
                               key);
        char *p = (char *)m + f->off;
        kvq_err pe = {0};
        switch (f->kind) {
        case F_STR:
            if (strlen(v) >= f->cap)
                return kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata %s is too long", label, key);
            strcpy(p, v);
            break;
        case F_I32: {
            int64_t x;
            if (kvq_parse_i64(v, 0, INT32_MAX, &x, &pe))
                return kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata %s: %s", label, key, pe.msg);
            *(int32_t *)p = (int32_t)x;
            break;
        }
        case F_F64:
            if (kvq_parse_f64(v, -KVQ_MODEL_ID_NUM_MAX, KVQ_MODEL_ID_NUM_MAX, (double *)p, &pe))
                return kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata %s: %s", label, key, pe.msg);
            break;
        case F_LAYOUT:
            if (kvq_rope_layout_parse(v, (kvq_rope_layout *)p))
                return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: metadata %s: unknown layout \"%s\"",
                                   label, key, v);
            break;
        case F_SCALING:
            if (kvq_rope_scaling_parse(v, (kvq_rope_scaling *)p))
                return kvq_err_set(err, KVQ_E_UNSUPPORTED,
                                   "%s: metadata %s: unknown scaling \"%s\"", label, key, v);
            break;
        }
    }
    m->rope.head_dim = m->head_dim;
    if (m->n_heads < 1 || m->n_kv_heads < 1 || m->n_heads % m->n_kv_heads || m->head_dim < 2 ||
        m->head_dim % 2 || m->head_dim > KVQ_ROPE_MAX_DIM || m->n_layers < 1)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata %s: inconsistent head counts or dims",
                           label, prefix);
    *out = id;
    return KVQ_OK;
}
