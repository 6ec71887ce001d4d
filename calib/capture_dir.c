/* capture_dir.c — the capture.json reader (kvq/capture_dir.h). */
#include "kvq/capture_dir.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvq/model.h"
#include "kvq/util.h"

/* ======================================================================================
 * JSON field helpers. Each names the file and the dotted key on failure.
 * ====================================================================================== */

typedef struct jctx {
    const char *label; /* "DIR/capture.json" */
    kvq_err *err;
} jctx;

/* The member `key` of obj, or NULL. Missing + required -> BAD_JSON. */
static const cJSON *j_member(const jctx *j, const cJSON *obj, const char *path, const char *key,
                             int required, kvq_status *st)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v && required)
        *st = kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: missing key %s%s", j->label, path, key);
    return v;
}

/* An integer in [min, max]. JSON numbers are doubles: integral values up to 2^53. */
static kvq_status j_int(const jctx *j, const cJSON *obj, const char *path, const char *key,
                        int required, int64_t min, int64_t max, int64_t *out)
{
    kvq_status st = KVQ_OK;
    const cJSON *v = j_member(j, obj, path, key, required, &st);
    if (!v)
        return st;
    if (!cJSON_IsNumber(v))
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: %s%s must be a number", j->label, path,
                           key);
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0)
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: %s%s must be an integer (got %g)",
                           j->label, path, key, d);
    if (d < (double)min || d > (double)max)
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: %s%s = %.0f is outside [%" PRId64
                           ", %" PRId64 "]", j->label, path, key, d, min, max);
    *out = (int64_t)d;
    return KVQ_OK;
}

static kvq_status j_i32(const jctx *j, const cJSON *obj, const char *path, const char *key,
                        int32_t min, int32_t max, int32_t *out)
{
    int64_t v = 0;
    kvq_status st = j_int(j, obj, path, key, 1, min, max, &v);
    if (st == KVQ_OK)
        *out = (int32_t)v;
    return st;
}

static kvq_status j_num(const jctx *j, const cJSON *obj, const char *path, const char *key,
                        int required, double *out)
{
    kvq_status st = KVQ_OK;
    const cJSON *v = j_member(j, obj, path, key, required, &st);
    if (!v)
        return st;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: %s%s must be a finite number", j->label,
                           path, key);
    if (fabs(v->valuedouble) > KVQ_MODEL_ID_NUM_MAX) /* as the artifact's metadata reads it */
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: %s%s %g is out of range [-%g, %g]",
                           j->label, path, key, v->valuedouble, KVQ_MODEL_ID_NUM_MAX,
                           KVQ_MODEL_ID_NUM_MAX);
    *out = v->valuedouble;
    return KVQ_OK;
}

/* A string copied into buf[cap]; too long -> CORRUPT. */
static kvq_status j_str(const jctx *j, const cJSON *obj, const char *path, const char *key,
                        int required, char *buf, size_t cap)
{
    kvq_status st = KVQ_OK;
    const cJSON *v = j_member(j, obj, path, key, required, &st);
    if (!v)
        return st;
    if (!cJSON_IsString(v))
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: %s%s must be a string", j->label, path,
                           key);
    size_t n = strlen(v->valuestring);
    if (n >= cap)
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: %s%s is longer than %zu bytes", j->label,
                           path, key, cap - 1);
    memcpy(buf, v->valuestring, n + 1);
    return KVQ_OK;
}

/* ======================================================================================
 * capture.json
 * ====================================================================================== */

/* One entry of model.attention.layers against what the fields derive for layer l. */
static kvq_status check_layer_entry(const jctx *j, const cJSON *e, const kvq_model_id *id,
                                    int32_t l)
{
    kvq_layer_attn la;
    kvq_model_id_layer_attn(id, l, &la);
    const struct {
        const char *key;
        double want;
    } f[] = {{"rope_base", la.rope.base}, {"rope_factor", la.rope.factor},
             {"scale", la.scale},         {"softcap", la.softcap},
             {"window", la.window}};
    char path[64];
    snprintf(path, sizeof path, "model.attention.layers[%d].", (int)l);
    if (!cJSON_IsObject(e))
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: %s is not an object", j->label, path);
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        double v;
        kvq_status st = j_num(j, e, path, f[i].key, 1, &v);
        if (st)
            return st;
        if (!(fabs(v - f[i].want) <= 1e-12 * fabs(f[i].want)))
            return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: %s%s = %.17g contradicts "
                               "model.attention (which gives %.17g)", j->label, path, f[i].key,
                               v, f[i].want);
    }
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(e, "rope_scaling");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(e, "rope");
    kvq_rope_scaling s;
    if (!cJSON_IsString(sc) || kvq_rope_scaling_parse(sc->valuestring, &s) ||
        s != la.rope.scaling || !cJSON_IsBool(r) || cJSON_IsTrue(r) != la.use_rope)
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: %srope_scaling / rope contradict "
                           "model.attention", j->label, path);
    return KVQ_OK;
}

/* model.attention (capture version 2; absent in version 1: the llama family's zeros). */
static kvq_status parse_attention(const jctx *j, const cJSON *m, kvq_model_id *id)
{
    kvq_status st;
    memset(&id->attn, 0, sizeof id->attn);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(m, "attention");
    if (!a)
        return KVQ_OK;
    if (!cJSON_IsObject(a))
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: model.attention must be an object",
                           j->label);
    const char *p = "model.attention.";
    kvq_model_attn *x = &id->attn;
    if ((st = j_i32(j, a, p, "sliding_window", 0, INT32_MAX, &x->sliding_window)) ||
        (st = j_i32(j, a, p, "sliding_from", 0, INT32_MAX, &x->sliding_from)) ||
        (st = j_i32(j, a, p, "sliding_period", 0, INT32_MAX, &x->sliding_period)) ||
        (st = j_num(j, a, p, "rope_local_base", 1, &x->rope_local_base)) ||
        (st = j_num(j, a, p, "scale", 1, &x->scale)) ||
        (st = j_num(j, a, p, "softcap", 1, &x->softcap)))
        return st;
    if (!(x->rope_local_base >= 0) || !(x->scale >= 0) || !(x->softcap >= 0) ||
        (x->rope_local_base > 0 && !(x->rope_local_base > 1)))
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: model.attention: a negative scale, "
                           "softcap or local RoPE base (or one <= 1)", j->label);
    if (x->rope_local_base > 0 && x->sliding_window == 0)
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: model.attention.rope_local_base %g "
                           "without a sliding window", j->label, x->rope_local_base);
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(a, "layers");
    if (!layers)
        return KVQ_OK;
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) != id->n_layers)
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: model.attention.layers is not a list of "
                           "model.n_layers (%d) entries", j->label, id->n_layers);
    for (int32_t l = 0; l < id->n_layers; l++)
        if ((st = check_layer_entry(j, cJSON_GetArrayItem(layers, l), id, l)))
            return st;
    return KVQ_OK;
}

static kvq_status parse_model(const jctx *j, const cJSON *m, kvq_model_id *id)
{
    kvq_status st;
    const char *p = "model.";
    char buf[32];
    if (!cJSON_IsObject(m))
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: model must be an object", j->label);
    if ((st = j_str(j, m, p, "path", 0, id->path, sizeof id->path)) ||
        (st = j_str(j, m, p, "source", 1, id->source, sizeof id->source)) ||
        (st = j_str(j, m, p, "name", 0, id->name, sizeof id->name)) ||
        (st = j_str(j, m, p, "fingerprint", 0, id->fingerprint, sizeof id->fingerprint)) ||
        (st = j_str(j, m, p, "architecture", 1, id->architecture, sizeof id->architecture)) ||
        (st = j_i32(j, m, p, "n_layers", 1, INT32_MAX, &id->n_layers)) ||
        (st = j_i32(j, m, p, "dim", 1, INT32_MAX, &id->dim)) ||
        (st = j_i32(j, m, p, "hidden_dim", 1, INT32_MAX, &id->hidden_dim)) ||
        (st = j_i32(j, m, p, "n_heads", 1, 1 << 16, &id->n_heads)) ||
        (st = j_i32(j, m, p, "n_kv_heads", 1, 1 << 16, &id->n_kv_heads)) ||
        (st = j_i32(j, m, p, "head_dim", 2, KVQ_ROPE_MAX_DIM, &id->head_dim)) ||
        (st = j_i32(j, m, p, "vocab_size", 1, INT32_MAX, &id->vocab_size)) ||
        (st = j_i32(j, m, p, "context_length", 1, INT32_MAX, &id->context_length)) ||
        (st = j_num(j, m, p, "norm_eps", 1, &id->norm_eps)))
        return st;
    if (id->n_layers > KVQ_CAPTURE_MAX_LAYERS)
        return kvq_err_set(j->err, KVQ_E_TOO_LARGE, "%s: model.n_layers %d is more than %d",
                           j->label, id->n_layers, KVQ_CAPTURE_MAX_LAYERS);
    if (id->n_heads % id->n_kv_heads)
        return kvq_err_set(j->err, KVQ_E_CORRUPT,
                           "%s: model.n_heads %d is not a multiple of model.n_kv_heads %d",
                           j->label, id->n_heads, id->n_kv_heads);
    if (id->head_dim % 2)
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: model.head_dim %d is odd", j->label,
                           id->head_dim);

    const cJSON *r = j_member(j, m, p, "rope", 1, &st);
    if (!r)
        return st;
    if (!cJSON_IsObject(r))
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: model.rope must be an object", j->label);
    const char *rp = "model.rope.";
    id->rope = kvq_rope_default(id->head_dim);
    if ((st = j_num(j, r, rp, "base", 1, &id->rope.base)))
        return st;
    if ((st = j_str(j, r, rp, "layout", 1, buf, sizeof buf)))
        return st == KVQ_E_CORRUPT ? kvq_err_set(j->err, KVQ_E_UNSUPPORTED,
                                                 "%s: unknown model.rope.layout", j->label)
                                   : st;
    if (kvq_rope_layout_parse(buf, &id->rope.layout))
        return kvq_err_set(j->err, KVQ_E_UNSUPPORTED, "%s: unknown model.rope.layout \"%s\"",
                           j->label, buf);
    if ((st = j_str(j, r, rp, "scaling", 1, buf, sizeof buf)))
        return st == KVQ_E_CORRUPT ? kvq_err_set(j->err, KVQ_E_UNSUPPORTED,
                                                 "%s: unknown model.rope.scaling", j->label)
                                   : st;
    if (kvq_rope_scaling_parse(buf, &id->rope.scaling))
        return kvq_err_set(j->err, KVQ_E_UNSUPPORTED, "%s: unknown model.rope.scaling \"%s\"",
                           j->label, buf);
    if ((st = j_num(j, r, rp, "factor", 0, &id->rope.factor)) ||
        (st = j_num(j, r, rp, "low_freq_factor", 0, &id->rope.low_freq_factor)) ||
        (st = j_num(j, r, rp, "high_freq_factor", 0, &id->rope.high_freq_factor)) ||
        (st = j_num(j, r, rp, "original_max_pos", 0, &id->rope.original_max_pos)))
        return st;
    kvq_err re = {0};
    if (kvq_rope_check(&id->rope, &re) != KVQ_OK)
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: model.%s", j->label, re.msg);
    return parse_attention(j, m, id);
}

/* Fills ci->layers and ci->files (allocated, ci->n_files entries) from the parallel
 * JSON lists starting at x and f. One pass, O(n_files + n_layers): a flag per model
 * layer (n_layers <= KVQ_CAPTURE_MAX_LAYERS) finds repeats. */
static kvq_status parse_layer_files(const jctx *j, const cJSON *x, const cJSON *f,
                                    kvq_capture_info *ci)
{
    kvq_status st = KVQ_OK;
    uint8_t *seen = calloc((size_t)ci->model.n_layers, 1); // [n_layers] 1 = listed
    if (!seen)
        return kvq_err_set(j->err, KVQ_E_NOMEM, "%s: out of memory", j->label);
    for (int32_t i = 0; i < ci->n_files; i++, x = x->next, f = f->next) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
            x->valuedouble < 0 || x->valuedouble >= ci->model.n_layers) {
            st = kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: layers[%d] is not a layer index "
                             "below %d", j->label, i, ci->model.n_layers);
            break;
        }
        ci->layers[i] = (int32_t)x->valuedouble;
        if (seen[ci->layers[i]]++) {
            st = kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: layer %d is listed twice", j->label,
                             ci->layers[i]);
            break;
        }
        if (!cJSON_IsString(f)) {
            st = kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: files[%d] must be a string",
                             j->label, i);
            break;
        }
        const char *name = f->valuestring;
        /* Plain names only: a capture must not point outside its directory. */
        if (!name[0] || strchr(name, '/') || strchr(name, '\\') || !strcmp(name, ".") ||
            !strcmp(name, "..")) {
            st = kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: files[%d] \"%s\" is not a plain "
                             "file name", j->label, i, name);
            break;
        }
        ci->files[i] = strdup(name);
        if (!ci->files[i]) {
            st = kvq_err_set(j->err, KVQ_E_NOMEM, "%s: out of memory", j->label);
            break;
        }
    }
    free(seen);
    return st;
}

/* format, version, tool. */
static kvq_status parse_header(const jctx *j, const cJSON *root, kvq_capture_info *ci)
{
    kvq_status st = KVQ_OK;
    char buf[64];
    int64_t v = 0;
    if ((st = j_str(j, root, "", "format", 1, buf, sizeof buf)) && st != KVQ_E_CORRUPT)
        return st;
    if (st || strcmp(buf, KVQ_CAPTURE_FORMAT))
        return kvq_err_set(j->err, KVQ_E_BAD_MAGIC, "%s: format is not \"%s\"", j->label,
                           KVQ_CAPTURE_FORMAT);
    if ((st = j_int(j, root, "", "version", 1, INT32_MIN, INT32_MAX, &v)))
        return st;
    if (v != KVQ_CAPTURE_VERSION && v != 1)
        return kvq_err_set(j->err, KVQ_E_VERSION, "%s: capture version %" PRId64
                           " is not supported (this kvq reads versions 1 to %d)", j->label, v,
                           KVQ_CAPTURE_VERSION);
    ci->version = (int32_t)v;
    if ((st = j_str(j, root, "", "tool", 0, ci->tool, sizeof ci->tool)))
        return st;
    return KVQ_OK;
}

/* corpus. Provenance: optional apart from the hash, which every later file repeats. */
static kvq_status parse_corpus(const jctx *j, const cJSON *root, kvq_capture_info *ci)
{
    kvq_status st = KVQ_OK;
    int64_t v = 0;
    const cJSON *c = j_member(j, root, "", "corpus", 1, &st);
    if (!c)
        return st;
    if (!cJSON_IsObject(c))
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: corpus must be an object", j->label);
    if ((st = j_str(j, c, "corpus.", "spec", 0, ci->corpus_spec, sizeof ci->corpus_spec)) ||
        (st = j_str(j, c, "corpus.", "hash", 1, ci->corpus_hash, sizeof ci->corpus_hash)) ||
        (st = j_int(j, c, "corpus.", "n_documents", 0, 0, INT64_MAX, &ci->n_documents)))
        return st;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(c, "seed");
    if (seed && cJSON_IsString(seed)) {
        /* u64 seeds above 2^53 do not survive a JSON number: accept a decimal string. */
        char *end = NULL;
        errno = 0;
        unsigned long long s = strtoull(seed->valuestring, &end, 10);
        if (errno || end == seed->valuestring || *end || seed->valuestring[0] == '-')
            return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: corpus.seed \"%s\" is not a u64",
                               j->label, seed->valuestring);
        ci->corpus_seed = s;
    } else if (seed) {
        if ((st = j_int(j, c, "corpus.", "seed", 1, 0, INT64_MAX, &v)))
            return st;
        ci->corpus_seed = (uint64_t)v;
    }
    return KVQ_OK;
}

/* dtype, token counts, queries, has_values. */
static kvq_status parse_rows(const jctx *j, const cJSON *root, kvq_capture_info *ci)
{
    kvq_status st = KVQ_OK;
    char buf[64];
    if ((st = j_str(j, root, "", "dtype", 1, buf, sizeof buf)) && st != KVQ_E_CORRUPT)
        return st;
    if (st == KVQ_E_CORRUPT || (strcmp(buf, "f32") && strcmp(buf, "f16") && strcmp(buf, "bf16")))
        return kvq_err_set(j->err, KVQ_E_UNSUPPORTED, "%s: dtype \"%s\" is not f32, f16 or bf16",
                           j->label, st ? "?" : buf);
    ci->dtype = !strcmp(buf, "f32") ? KVQ_DT_F32 : !strcmp(buf, "f16") ? KVQ_DT_F16 : KVQ_DT_BF16;

    if ((st = j_int(j, root, "", "n_tokens", 1, 1, INT32_MAX, &ci->n_tokens)) ||
        (st = j_int(j, root, "", "seq_len", 0, 0, INT32_MAX, &ci->seq_len)))
        return st;

    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "queries");
    if (q && cJSON_IsString(q)) {
        if (strcmp(q->valuestring, "all"))
            return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: queries must be \"all\" or a count",
                               j->label);
        ci->n_queries = 0;
    } else if (q && (st = j_int(j, root, "", "queries", 1, 1, INT32_MAX, &ci->n_queries))) {
        return st;
    }
    ci->has_values = 1;
    const cJSON *hv = cJSON_GetObjectItemCaseSensitive(root, "has_values");
    if (hv) {
        if (!cJSON_IsBool(hv))
            return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: has_values must be true or false",
                               j->label);
        ci->has_values = cJSON_IsTrue(hv);
    }
    return KVQ_OK;
}

/* sequences: [[first, length], ...] inside [0, n_tokens). */
static kvq_status parse_sequences(const jctx *j, const cJSON *root, kvq_capture_info *ci)
{
    kvq_status st = KVQ_OK;
    const cJSON *seqs = cJSON_GetObjectItemCaseSensitive(root, "sequences");
    if (seqs) {
        if (!cJSON_IsArray(seqs))
            return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: sequences must be an array",
                               j->label);
        int n = cJSON_GetArraySize(seqs);
        if (n > ci->n_tokens)
            return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: %d sequences for %" PRId64 " tokens",
                               j->label, n, ci->n_tokens);
        ci->n_sequences = n;
        ci->sequences = calloc((size_t)n * 2 + 1, sizeof *ci->sequences);
        if (!ci->sequences)
            return kvq_err_set(j->err, KVQ_E_NOMEM, "%s: out of memory", j->label);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, seqs) {
            if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2)
                return kvq_err_set(j->err, KVQ_E_BAD_JSON,
                                   "%s: sequences[%d] must be [first, length]", j->label, i);
            int64_t fl[2];
            for (int k = 0; k < 2; k++) {
                const cJSON *x = cJSON_GetArrayItem(e, k);
                if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
                    x->valuedouble < 0 || x->valuedouble > (double)ci->n_tokens)
                    return kvq_err_set(j->err, KVQ_E_CORRUPT,
                                       "%s: sequences[%d] is outside [0, n_tokens]", j->label, i);
                fl[k] = (int64_t)x->valuedouble;
            }
            if (fl[0] + fl[1] > ci->n_tokens)
                return kvq_err_set(j->err, KVQ_E_CORRUPT,
                                   "%s: sequences[%d] ends past n_tokens %" PRId64, j->label, i,
                                   ci->n_tokens);
            ci->sequences[2 * i] = fl[0];
            ci->sequences[2 * i + 1] = fl[1];
            i++;
        }
        int64_t ns = n;
        if ((st = j_int(j, root, "", "n_sequences", 0, 0, INT32_MAX, &ns)))
            return st;
        if (ns != n)
            return kvq_err_set(j->err, KVQ_E_CORRUPT,
                               "%s: n_sequences %" PRId64 " but %d sequences listed", j->label, ns,
                               n);
    }
    return KVQ_OK;
}

/* "checksums" (optional): one "xxh64:<16 hex>" per file, in the order of "files". */
static kvq_status parse_checksums(const jctx *j, const cJSON *root, kvq_capture_info *ci)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "checksums");
    if (!c)
        return KVQ_OK; /* a capture from before checksums */
    if (!cJSON_IsArray(c) || cJSON_GetArraySize(c) != ci->n_files)
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: checksums must be an array of %d "
                           "strings, one per file", j->label, ci->n_files);
    if (!(ci->checksums = calloc((size_t)ci->n_files, sizeof *ci->checksums)))
        return kvq_err_set(j->err, KVQ_E_NOMEM, "%s: out of memory", j->label);
    const cJSON *x = c->child;
    for (int32_t i = 0; i < ci->n_files; i++, x = x->next) {
        const char *s = cJSON_IsString(x) ? x->valuestring : "";
        int k = 0;
        if (strncmp(s, "xxh64:", 6) || strspn(s + 6, "0123456789abcdef") != 16 || s[22] ||
            sscanf(s + 6, "%16" SCNx64 "%n", &ci->checksums[i], &k) != 1 || k != 16)
            return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: checksums[%d] is not \"xxh64:\" "
                               "and 16 hex digits", j->label, i);
    }
    return KVQ_OK;
}

/* layers and files: parallel arrays. */
static kvq_status parse_layers(const jctx *j, const cJSON *root, kvq_capture_info *ci)
{
    kvq_status st = KVQ_OK;
    const cJSON *layers = j_member(j, root, "", "layers", 1, &st);
    if (!layers)
        return st;
    const cJSON *files = j_member(j, root, "", "files", 1, &st);
    if (!files)
        return st;
    if (!cJSON_IsArray(layers) || !cJSON_IsArray(files))
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: layers and files must be arrays",
                           j->label);
    int nl = cJSON_GetArraySize(layers), nf = cJSON_GetArraySize(files);
    if (nl != nf || nl == 0)
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: %d layers but %d files", j->label, nl, nf);
    if (nl > ci->model.n_layers)
        return kvq_err_set(j->err, KVQ_E_CORRUPT, "%s: %d layers listed, model has %d", j->label,
                           nl, ci->model.n_layers);
    ci->layers = calloc((size_t)nl, sizeof *ci->layers);
    ci->files = calloc((size_t)nl, sizeof *ci->files);
    if (!ci->layers || !ci->files)
        return kvq_err_set(j->err, KVQ_E_NOMEM, "%s: out of memory", j->label);
    ci->n_files = nl;
    if ((st = parse_layer_files(j, layers->child, files->child, ci)))
        return st;
    return parse_checksums(j, root, ci);
}

static kvq_status parse_capture(const jctx *j, const cJSON *root, kvq_capture_info *ci)
{
    kvq_status st = KVQ_OK;
    if (!cJSON_IsObject(root))
        return kvq_err_set(j->err, KVQ_E_BAD_JSON, "%s: not a JSON object", j->label);
    if ((st = parse_header(j, root, ci)))
        return st;
    const cJSON *m = j_member(j, root, "", "model", 1, &st);
    if (!m || (st = parse_model(j, m, &ci->model)))
        return st;
    if ((st = parse_corpus(j, root, ci)) || (st = parse_rows(j, root, ci)) ||
        (st = j_str(j, root, "", "tokenizer_approx", 0, ci->tokenizer_approx,
                    sizeof ci->tokenizer_approx)) ||
        (st = parse_sequences(j, root, ci)))
        return st;
    return parse_layers(j, root, ci);
}

/* Parses text[0..size) as the capture.json of dir; label names it in messages. */
static kvq_status parse_text(const char *dir, const char *label, const char *text, size_t size,
                             kvq_capture_info **out, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_capture_info *ci = calloc(1, sizeof *ci);
    cJSON *root = NULL;
    if (!ci || !(ci->dir = strdup(dir))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
        goto done;
    }
    if (size > KVQ_CAPTURE_MAX_JSON) {
        st = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %zu bytes is larger than %u", label, size,
                         KVQ_CAPTURE_MAX_JSON);
        goto done;
    }
    if (!kvq_utf8_valid(text, size)) {
        st = kvq_err_set(err, KVQ_E_BAD_JSON, "%s: not valid UTF-8", label);
        goto done;
    }
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(text, size, &end, 0);
    if (!root) {
        long off = end ? (long)(end - text) : -1;
        st = kvq_err_set(err, KVQ_E_BAD_JSON, "%s: not valid JSON (near byte %ld)", label, off);
        goto done;
    }
    for (const char *p = end; p && p < text + size; p++)
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') {
            st = kvq_err_set(err, KVQ_E_BAD_JSON, "%s: text after the JSON object", label);
            goto done;
        }
    jctx j = {label, err};
    if ((st = parse_capture(&j, root, ci)))
        goto done;
    *out = ci;
    ci = NULL;
done:
    cJSON_Delete(root);
    kvq_capture_info_free(ci);
    return st;
}

/* "DIR/capture.json", malloc'd, or NULL. */
static char *json_path(const char *dir)
{
    size_t nd = strlen(dir);
    char *label = malloc(nd + sizeof "/" KVQ_CAPTURE_JSON);
    if (label) {
        memcpy(label, dir, nd);
        memcpy(label + nd, "/" KVQ_CAPTURE_JSON, sizeof "/" KVQ_CAPTURE_JSON);
    }
    return label;
}

/* 1 for a name kvq writes in a capture directory: capture.json, "layer_N.safetensors",
 * a temporary "NAME.tmp.<pid>.<hex>". */
static int own_name(const char *n)
{
    if (!strcmp(n, KVQ_CAPTURE_JSON) || strstr(n, ".tmp."))
        return 1;
    if (strncmp(n, "layer_", 6) || n[6] < '0' || n[6] > '9')
        return 0;
    const char *p = n + 6;
    while (*p >= '0' && *p <= '9')
        p++;
    return !strcmp(p, ".safetensors");
}

kvq_status kvq_capture_dir_check_own(const char *dir, kvq_err *err)
{
    struct stat st;
    if (!dir || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return KVQ_OK;
    DIR *d = opendir(dir);
    if (!d)
        return kvq_err_set(err, KVQ_E_IO, "%s: cannot list: %s", dir, strerror(errno));
    kvq_status s = KVQ_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || own_name(e->d_name))
            continue;
        s = kvq_err_set(err, KVQ_E_EXISTS, "%s/%s: not written by kvq; kvq does not delete "
                        "files it did not write (move it out of %s, or choose another output)",
                        dir, e->d_name, dir);
    }
    closedir(d);
    return s;
}

int kvq_capture_dir_is_capture(const char *dir)
{
    struct stat st;
    kvq_capture_info *ci = NULL;
    if (!dir || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
        kvq_capture_info_read(dir, &ci, NULL) != KVQ_OK)
        return 0;
    kvq_capture_info_free(ci);
    return kvq_capture_dir_check_own(dir, NULL) == KVQ_OK;
}

kvq_status kvq_capture_output_check(const char *dir, int overwrite, kvq_err *err)
{
    kvq_status s = overwrite ? kvq_capture_dir_check_own(dir, err) : KVQ_OK;
    return s ? s : kvq_output_check(dir, overwrite, kvq_capture_dir_is_capture,
                                    "a kvq capture directory", err);
}

kvq_status kvq_capture_info_read(const char *dir, kvq_capture_info **out, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    uint8_t *text = NULL;
    size_t size = 0;
    char *label = json_path(dir);
    *out = NULL;
    if (!label) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    /* Size first, so a huge file is refused before it is read; a stat failure falls
     * through to kvq_read_file, which names the error. */
    struct stat sb;
    if (stat(label, &sb) == 0 && (uint64_t)sb.st_size > KVQ_CAPTURE_MAX_JSON) {
        st = kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %llu bytes is larger than %u", label,
                         (unsigned long long)sb.st_size, KVQ_CAPTURE_MAX_JSON);
        goto done;
    }
    if ((st = kvq_read_file(label, &text, &size, err)))
        goto done;
    st = parse_text(dir, label, (const char *)text, size, out, err);
done:
    free(text);
    free(label);
    return st;
}

kvq_status kvq_capture_info_read_memory(const char *dir, const void *json, size_t size,
                                        kvq_capture_info **out, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    char *label = json_path(dir);
    *out = NULL;
    if (!label)
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
    else
        st = parse_text(dir, label, size ? json : "", size, out, err);
    free(label);
    return st;
}

void kvq_capture_info_free(kvq_capture_info *ci)
{
    if (!ci)
        return;
    if (ci->files)
        for (int32_t i = 0; i < ci->n_files; i++)
            free(ci->files[i]);
    free(ci->files);
    free(ci->layers);
    free(ci->sequences);
    free(ci->checksums);
    free(ci->dir);
    free(ci);
}

int32_t kvq_capture_info_find_layer(const kvq_capture_info *ci, int32_t layer)
{
    for (int32_t i = 0; i < ci->n_files; i++)
        if (ci->layers[i] == layer)
            return i;
    return -1;
}

kvq_status kvq_capture_info_file_path(const kvq_capture_info *ci, int32_t i, char **path,
                                      kvq_err *err)
{
    if (!(*path = kvq_path_join(ci->dir, ci->files[i])))
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", ci->dir);
    return KVQ_OK;
}
