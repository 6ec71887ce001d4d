/*
 * tokenizer_hf.c — a tokenizer from a Hugging Face tokenizer.json (model type BPE,
 * byte-level or metaspace) and the optional tokenizer_config.json beside it.
 */
#include "model/tokenizer_internal.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/util.h"

static const char *json_str(const cJSON *obj, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* A special-token entry of tokenizer_config.json: "text" or {"content": "text"}. */
static const char *json_token_text(const cJSON *obj, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsString(it))
        return it->valuestring;
    if (cJSON_IsObject(it))
        return json_str(it, "content");
    return NULL;
}

/* Does the JSON tree of a normalizer/pre-tokenizer/decoder mention a component of
 * type `type`? Looks through "Sequence" lists (any nesting). */
static const cJSON *json_find_type(const cJSON *node, const char *type)
{
    if (!node || cJSON_IsNull(node))
        return NULL;
    if (cJSON_IsObject(node)) {
        const char *t = json_str(node, "type");
        if (t && strcmp(t, type) == 0)
            return node;
        static const char *const lists[] = {"pretokenizers", "normalizers", "decoders",
                                            "processors"};
        for (size_t k = 0; k < sizeof lists / sizeof *lists; k++) {
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(node, lists[k]);
            const cJSON *e;
            cJSON_ArrayForEach(e, l) {
                const cJSON *f = json_find_type(e, type);
                if (f)
                    return f;
            }
        }
    }
    return NULL;
}

/* tokenizer.json ids must stay below 2 x (vocab + added_tokens entries) + this. */
#define HF_SPARSE_SLACK 1024

static int is_int_id(const cJSON *it, uint32_t limit)
{
    if (!cJSON_IsNumber(it))
        return 0;
    double d = it->valuedouble;
    return d >= 0 && d < (double)limit && d == (double)(int64_t)d;
}

/* The components of a pre-tokenizer, Sequences flattened: up to max into items. */
static int flatten(const cJSON *node, const cJSON **items, int max, int n)
{
    if (!node || cJSON_IsNull(node))
        return n;
    const char *t = json_str(node, "type");
    if (t && strcmp(t, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(node, "pretokenizers"))
            n = flatten(e, items, max, n);
        return n;
    }
    if (n < max)
        items[n] = node;
    return n + 1;
}

static int is_type(const cJSON *node, const char *type)
{
    const char *t = json_str(node, "type");
    return t && strcmp(t, type) == 0;
}

/* A Split that isolates the matches of a regex: the regex, else NULL. */
static const char *isolated_split(const cJSON *node)
{
    if (!is_type(node, "Split"))
        return NULL;
    const char *beh = json_str(node, "behavior");
    if (!beh || strcmp(beh, "Isolated") != 0 ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(node, "invert")))
        return NULL;
    return json_str(cJSON_GetObjectItemCaseSensitive(node, "pattern"), "Regex");
}

static int is_individual_digits(const cJSON *node)
{
    return is_type(node, "Digits") &&
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(node, "individual_digits"));
}

/* Writes "type(regex), type, ..." of the components into d. */
static void describe(const cJSON *const *items, int n, char *d, size_t size)
{
    size_t w = 0;
    d[0] = '\0';
    for (int k = 0; k < n && w + 1 < size; k++) {
        const char *t = json_str(items[k], "type");
        const char *re = json_str(cJSON_GetObjectItemCaseSensitive(items[k], "pattern"), "Regex");
        int m = re ? snprintf(d + w, size - w, "%s%s /%.48s%s/", k ? ", " : "", t ? t : "?", re,
                              strlen(re) > 48 ? "..." : "")
                   : snprintf(d + w, size - w, "%s%s", k ? ", " : "", t ? t : "?");
        if (m < 0)
            break;
        w += (size_t)m;
    }
}

/* The byte-level split of a pre_tokenizer (see kvq/tokenizer.h): 1, or 0 with a
 * description of what kvq does not know in desc. */
static int hf_split(const cJSON *pre, kvq_vocab *v, char *desc, size_t size)
{
    const cJSON *items[16];
    int n = flatten(pre, items, 16, 0);
    v->pretok = KVQ_PRETOK_GPT2;
    v->max_digits = 0;
    if (n == 0) /* no pre_tokenizer, a ByteLevel decoder: the GPT-2 split, as always */
        return 1;
    if (n > 16) {
        snprintf(desc, size, "a sequence of %d pre-tokenizers", n);
        return 0;
    }
    const cJSON *bl = items[n - 1];
    if (is_type(bl, "ByteLevel")) {
        const int use_regex = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(bl, "use_regex"));
        const char *re = n == 2 ? isolated_split(items[0]) : NULL;
        if (use_regex && n == 1)
            return 1;
        if (use_regex && n == 2 && is_individual_digits(items[0])) {
            v->pretok = KVQ_PRETOK_SMOLLM;
            return 1;
        }
        if (!use_regex && n == 1) {
            v->pretok = KVQ_PRETOK_NONE;
            return 1;
        }
        if (!use_regex && re && tok_pretok_from_regex(re, &v->pretok, &v->max_digits))
            return 1;
        if (!use_regex && n == 7 && is_individual_digits(items[5])) {
            int k = 0;
            while (k < 5 && isolated_split(items[k]) &&
                   tok_pretok_deepseek_stage(k, isolated_split(items[k])))
                k++;
            if (k == 5) {
                v->pretok = KVQ_PRETOK_DEEPSEEK_LLM;
                v->max_digits = 1;
                return 1;
            }
        }
    }
    v->pretok = KVQ_PRETOK_GPT2;
    v->max_digits = 0;
    int m = snprintf(desc, size, "pre-tokenizer ");
    describe(items, n, desc + m, size - (size_t)m);
    return 0;
}

/* The normalizer of a byte-level tokenizer: 1 and *norm, or 0 (desc says which). */
static int hf_normalizer(const cJSON *norm, kvq_normalizer *out, char *desc, size_t size)
{
    *out = KVQ_NORM_NONE;
    if (!norm || cJSON_IsNull(norm))
        return 1;
    const cJSON *one = norm;
    if (is_type(norm, "Sequence")) {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
        int c = cJSON_GetArraySize(l);
        if (c == 0)
            return 1;
        if (c == 1)
            one = cJSON_GetArrayItem(l, 0);
    }
    if (is_type(one, "NFC")) {
        *out = KVQ_NORM_NFC;
        return 1;
    }
    if (is_type(one, "NFKC")) {
        *out = KVQ_NORM_NFKC;
        return 1;
    }
    const char *t = json_str(one, "type");
    snprintf(desc, size, "normalizer %s", t ? t : "?");
    return 0;
}

/* The "model" object of a BPE tokenizer.json (no subword prefix/suffix) and its vocab,
 * merges and the root's added_tokens, checked for their JSON types. */
static kvq_status hf_model(const cJSON *root, const char *label, const cJSON **model,
                           const cJSON **vocab, const cJSON **mlist, const cJSON **added,
                           kvq_err *err)
{
    *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(*model))
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: no \"model\" object", label);
    const char *mtype = json_str(*model, "type");
    if (mtype && strcmp(mtype, "BPE") != 0)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: tokenizer model type '%s' is not "
                           "supported (supported: BPE)", label, mtype);
    const char *cwp = json_str(*model, "continuing_subword_prefix");
    const char *ews = json_str(*model, "end_of_word_suffix");
    if ((cwp && *cwp) || (ews && *ews))
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: BPE with a subword prefix/suffix is not "
                           "supported (tokenizer model 'BPE')", label);
    *vocab = cJSON_GetObjectItemCaseSensitive(*model, "vocab");
    *mlist = cJSON_GetObjectItemCaseSensitive(*model, "merges");
    *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(*vocab) || (*mlist && !cJSON_IsArray(*mlist)) ||
        (*added && !cJSON_IsNull(*added) && !cJSON_IsArray(*added)))
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: model.vocab must be an object, model.merges "
                           "and added_tokens arrays (tokenizer model 'BPE')", label);
    return KVQ_OK;
}

/* The vocabulary size: the largest id + 1 over vocab and added_tokens, which must not
 * leave the id space much sparser than the entries. */
static kvq_status hf_vocab_size(const cJSON *vocab, const cJSON *added, const char *label,
                                uint32_t *n_out, kvq_err *err)
{
    uint32_t n = 0;
    uint64_t entries = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        entries++;
        if (!is_int_id(e, KVQ_TOKENIZER_MAX_VOCAB))
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: vocab entry '%.40s' does not have an id "
                               "in [0, %u) (tokenizer model 'BPE')", label, e->string,
                               KVQ_TOKENIZER_MAX_VOCAB);
        if ((uint32_t)e->valuedouble + 1 > n)
            n = (uint32_t)e->valuedouble + 1;
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        entries++;
        if (!cJSON_IsObject(e) || !is_int_id(id, KVQ_TOKENIZER_MAX_VOCAB) ||
            !json_str(e, "content"))
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: an added_tokens entry lacks an id or "
                               "content (tokenizer model 'BPE')", label);
        if ((uint32_t)id->valuedouble + 1 > n)
            n = (uint32_t)id->valuedouble + 1;
    }
    if (n == 0)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: empty vocabulary (tokenizer model 'BPE')",
                           label);
    /* Ids index dense arrays: a few entries with a huge id would cost memory and time
     * in proportion to the id, not to the file. Real vocabularies have few holes. */
    if ((uint64_t)n - 1 >= 2 * entries + HF_SPARSE_SLACK)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: sparse vocabulary: largest id %u for %llu "
                           "entries (it must be below 2 x entries + %d; tokenizer model 'BPE')",
                           label, n - 1, (unsigned long long)entries, HF_SPARSE_SLACK);
    *n_out = n;
    return KVQ_OK;
}

/* tokens[id] and types[id] (calloc'd [n]) from vocab (first entry of an id wins), then
 * added_tokens (which override); holes become empty unused tokens. */
static kvq_status hf_tokens(const cJSON *vocab, const cJSON *added, uint32_t n,
                            const char ***tokens_out, int32_t **types_out, const char *label,
                            kvq_err *err)
{
    const char **tokens = *tokens_out = calloc(n, sizeof *tokens);
    int32_t *types = *types_out = calloc(n, sizeof *types);
    if (!tokens || !types)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        uint32_t id = (uint32_t)e->valuedouble;
        if (!tokens[id]) {
            tokens[id] = e->string;
            types[id] = KVQ_TOKEN_NORMAL;
        }
    }
    cJSON_ArrayForEach(e, added) {
        uint32_t id = (uint32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        tokens[id] = json_str(e, "content");
        types[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"))
                        ? KVQ_TOKEN_CONTROL : KVQ_TOKEN_USER_DEFINED;
    }
    for (uint32_t i = 0; i < n; i++)
        if (!tokens[i]) { /* a hole in the id space */
            tokens[i] = "";
            types[i] = KVQ_TOKEN_UNUSED;
        }
    return KVQ_OK;
}

/* v->merges or v->merge_pairs (malloc'd *merges_out) from model.merges: "a b" strings
 * or [a, b] pairs, one form throughout. */
static kvq_status hf_merges(const cJSON *mlist, kvq_vocab *v, const char ***merges_out,
                            const char *label, kvq_err *err)
{
    uint32_t nm = (uint32_t)cJSON_GetArraySize(mlist);
    if (nm == 0)
        return KVQ_OK;
    const char **merges = *merges_out = malloc(2 * (size_t)nm * sizeof *merges);
    if (!merges)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    uint32_t m = 0;
    int as_strings = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, mlist) {
        if (cJSON_IsString(e) && as_strings != 0) {
            as_strings = 1;
            merges[m] = e->valuestring;
            if (!strchr(e->valuestring, ' '))
                return kvq_err_set(err, KVQ_E_CORRUPT, "%s: merge %u '%.40s' is not \"left "
                                   "right\" (tokenizer model 'BPE')", label, m, e->valuestring);
        } else if (cJSON_IsArray(e) && as_strings != 1 && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            as_strings = 0;
            merges[2 * (size_t)m] = cJSON_GetArrayItem(e, 0)->valuestring;
            merges[2 * (size_t)m + 1] = cJSON_GetArrayItem(e, 1)->valuestring;
        } else {
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: merge %u is neither \"left right\" nor "
                               "[left, right] (tokenizer model 'BPE')", label, m);
        }
        m++;
    }
    v->n_merges = nm;
    if (as_strings == 1)
        v->merges = merges;
    else
        v->merge_pairs = merges;
    return KVQ_OK;
}

/* The flavour, byte-level or metaspace, from the normalizer, pre-tokenizer and decoder;
 * metaspace vocabularies get their <0xHH> byte tokens typed. */
static kvq_status hf_flavour(const cJSON *root, const cJSON *model, kvq_vocab *v,
                             const char **tokens, int32_t *types, uint32_t n,
                             const char *label, const kvq_tokenizer_params *p, char *approx,
                             size_t approx_size, kvq_err *err)
{
    const kvq_callbacks *cb = &p->cb;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *bl = json_find_type(pre, "ByteLevel");
    if (!bl)
        bl = json_find_type(dec, "ByteLevel");
    const cJSON *meta = json_find_type(pre, "Metaspace");
    int metaspace_norm = json_find_type(norm, "Replace") || json_find_type(norm, "Prepend");
    if (bl) {
        v->byte_level = 1;
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(bl, "add_prefix_space");
        v->add_space_prefix = cJSON_IsTrue(aps) && json_find_type(pre, "ByteLevel") != NULL;
        char d1[128] = "", d2[64] = "";
        int ok_split = hf_split(pre, v, d1, sizeof d1);
        int ok_norm = hf_normalizer(norm, &v->normalizer, d2, sizeof d2);
        if (!ok_split || !ok_norm) {
            if (!p->accept_approx)
                return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: %s%s%s is not implemented; kvq "
                                   "would approximate it by the GPT-2 split only if asked to "
                                   "accept the approximation", label, d1,
                                   (!ok_split && !ok_norm) ? " and " : "", d2);
            snprintf(approx, approx_size, "%s%s%s approximated by the GPT-2 split%s", d1,
                     (!ok_split && !ok_norm) ? " and " : "", d2,
                     ok_norm ? "" : " without normalizer");
            v->approx = approx;
            if (!ok_split)
                v->pretok = KVQ_PRETOK_GPT2;
            kvq_log(cb, KVQ_LOG_WARN, "%s: %s", label, approx);
        }
        v->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
        /* HF's BPE without unk_token (and without byte_fallback) drops unknown symbols */
        v->drop_unknown = !json_str(model, "unk_token") &&
                          !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    } else if (meta || metaspace_norm) {
        v->byte_level = 0;
        v->add_space_prefix = json_find_type(norm, "Prepend") != NULL;
        if (meta) {
            const char *scheme = json_str(meta, "prepend_scheme");
            const cJSON *aps = cJSON_GetObjectItemCaseSensitive(meta, "add_prefix_space");
            v->add_space_prefix = scheme ? strcmp(scheme, "never") != 0 : !cJSON_IsFalse(aps);
        }
    } else {
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: BPE without ByteLevel or Metaspace ('▁') "
                           "handling is not supported (tokenizer model 'BPE')", label);
    }
    if (!v->byte_level) /* byte fallback tokens are ordinary vocab entries in tokenizer.json */
        for (uint32_t i = 0; i < n; i++)
            if (types[i] == KVQ_TOKEN_NORMAL &&
                tok_parse_byte_token(tokens[i], strlen(tokens[i])) >= 0)
                types[i] = KVQ_TOKEN_BYTE;
    if (!v->byte_level && json_find_type(norm, "NFC"))
        kvq_log(cb, KVQ_LOG_WARN, "%s: the NFC normalizer is not applied", label);
    return KVQ_OK;
}

/* v->unk, v->bos, v->eos and v->add_bos: model.unk_token, tokenizer_config.json (when
 * given), the post-processor's template, then the usual names. */
static kvq_status hf_special(const cJSON *root, const cJSON *model, const char *config,
                             const char **tokens, uint32_t n, kvq_vocab *v, const char *label,
                             kvq_err *err)
{
    const char *unk = json_str(model, "unk_token");
    if (unk) {
        for (uint32_t i = 0; i < n && v->unk < 0; i++)
            if (strcmp(tokens[i], unk) == 0)
                v->unk = (int32_t)i;
    }
    const char *bos = NULL, *eos = NULL;
    int add_bos = -1;
    cJSON *cfg = NULL;
    if (config) {
        cfg = cJSON_Parse(config);
        if (!cJSON_IsObject(cfg)) {
            cJSON_Delete(cfg);
            return kvq_err_set(err, KVQ_E_BAD_JSON, "%s: tokenizer_config.json is not a JSON "
                               "object", label);
        }
        bos = json_token_text(cfg, "bos_token");
        eos = json_token_text(cfg, "eos_token");
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
        if (cJSON_IsBool(ab))
            add_bos = cJSON_IsTrue(ab);
    }
    int add_eos = -1;
    if (cfg) {
        const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
        if (cJSON_IsBool(ae))
            add_eos = cJSON_IsTrue(ae);
    }
    /* the post-processor's template: a leading special token is BOS, a trailing one EOS */
    const cJSON *tp = json_find_type(cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                                     "TemplateProcessing");
    const cJSON *single = tp ? cJSON_GetObjectItemCaseSensitive(tp, "single") : NULL;
    const cJSON *first = cJSON_GetArrayItem(single, 0);
    const cJSON *last = cJSON_GetArrayItem(single, cJSON_GetArraySize(single) - 1);
    const cJSON *sp = first ? cJSON_GetObjectItemCaseSensitive(first, "SpecialToken") : NULL;
    const cJSON *ep = last && last != first ? cJSON_GetObjectItemCaseSensitive(last, "SpecialToken")
                                            : NULL;
    const char *tbos = sp ? json_str(sp, "id") : NULL;
    const char *teos = ep ? json_str(ep, "id") : NULL;
    if (!bos && tbos)
        bos = tbos;
    if (cJSON_IsArray(single) && cJSON_GetArraySize(single) > 0) {
        if (add_bos < 0)
            add_bos = tbos != NULL;
        if (add_eos < 0)
            add_eos = teos != NULL;
    }
    static const char *const bos_names[] = {"<|begin_of_text|>", "<s>", "<|endoftext|>"};
    static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>"};
    for (size_t k = 0; !bos && k < 3; k++)
        for (uint32_t i = 0; i < n && !bos; i++)
            if (strcmp(tokens[i], bos_names[k]) == 0)
                bos = bos_names[k];
    for (size_t k = 0; !eos && k < 3; k++)
        for (uint32_t i = 0; i < n && !eos; i++)
            if (strcmp(tokens[i], eos_names[k]) == 0)
                eos = eos_names[k];
    for (uint32_t i = 0; i < n; i++) {
        if (bos && v->bos < 0 && strcmp(tokens[i], bos) == 0)
            v->bos = (int32_t)i;
        if (eos && v->eos < 0 && strcmp(tokens[i], eos) == 0)
            v->eos = (int32_t)i;
    }
    v->add_bos = add_bos >= 0 ? add_bos : v->bos >= 0 && strcmp(tokens[v->bos], "<|endoftext|>");
    v->add_eos = add_eos > 0;
    cJSON_Delete(cfg);
    return KVQ_OK;
}

kvq_status kvq_tokenizer_from_hf_json_memory(const char *json, size_t len, const char *config,
                                             const char *label, const kvq_callbacks *cb,
                                             kvq_tokenizer **out, kvq_err *err)
{
    kvq_tokenizer_params p = kvq_tokenizer_params_default();
    if (cb)
        p.cb = *cb;
    return kvq_tokenizer_from_hf_json_memory_p(json, len, config, label, &p, out, err);
}

kvq_status kvq_tokenizer_from_hf_json_memory_p(const char *json, size_t len,
                                               const char *config, const char *label,
                                               const kvq_tokenizer_params *prm,
                                               kvq_tokenizer **out, kvq_err *err)
{
    const kvq_callbacks *cb = &prm->cb;
    char approx[192];
    kvq_status st = KVQ_OK;
    cJSON *root = NULL;
    const char **tokens = NULL, **merges = NULL;
    int32_t *types = NULL;
    *out = NULL;
    if (!label)
        label = "tokenizer.json";

    root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        st = kvq_err_set(err, KVQ_E_BAD_JSON, "%s: not a JSON object", label);
        goto done;
    }
    const cJSON *model = NULL, *vocab = NULL, *mlist = NULL, *added = NULL;
    uint32_t n = 0;
    st = hf_model(root, label, &model, &vocab, &mlist, &added, err);
    if (st == KVQ_OK)
        st = hf_vocab_size(vocab, added, label, &n, err);
    if (st == KVQ_OK)
        st = hf_tokens(vocab, added, n, &tokens, &types, label, err);
    if (st)
        goto done;

    kvq_vocab v;
    kvq_vocab_default(&v);
    v.model = "hf-bpe";
    v.n_tokens = n;
    v.tokens = tokens;
    v.types = types;
    st = hf_merges(mlist, &v, &merges, label, err);
    if (st == KVQ_OK)
        st = hf_flavour(root, model, &v, tokens, types, n, label, prm, approx, sizeof approx, err);
    if (st == KVQ_OK)
        st = hf_special(root, model, config, tokens, n, &v, label, err);
    if (st == KVQ_OK)
        st = kvq_tokenizer_new(KVQ_TOKENIZER_BPE, &v, label, cb, out, err);
done:
    free(tokens);
    free(types);
    free(merges);
    cJSON_Delete(root);
    return st;
}

kvq_status kvq_tokenizer_from_hf_json(const char *path, const kvq_callbacks *cb,
                                      kvq_tokenizer **out, kvq_err *err)
{
    kvq_tokenizer_params p = kvq_tokenizer_params_default();
    if (cb)
        p.cb = *cb;
    return kvq_tokenizer_from_hf_json_p(path, &p, out, err);
}

kvq_status kvq_tokenizer_from_hf_json_p(const char *path, const kvq_tokenizer_params *prm,
                                        kvq_tokenizer **out, kvq_err *err)
{
    uint8_t *json = NULL, *config = NULL;
    size_t n = 0, cn = 0;
    char *cfg_path = NULL;
    *out = NULL;
    kvq_status st = kvq_read_file(path, &json, &n, err);
    if (st)
        return st;
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    cfg_path = malloc(dir + sizeof "tokenizer_config.json");
    if (!cfg_path) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    memcpy(cfg_path, path, dir);
    memcpy(cfg_path + dir, "tokenizer_config.json", sizeof "tokenizer_config.json");
    kvq_err cerr = {0};
    kvq_status cst = kvq_read_file(cfg_path, &config, &cn, &cerr);
    if (cst != KVQ_OK && cst != KVQ_E_NOT_FOUND) {
        st = kvq_err_set(err, cst, "%s", cerr.msg);
        goto done;
    }
    st = kvq_tokenizer_from_hf_json_memory_p((const char *)json, n, (const char *)config, path,
                                             prm, out, err);
done:
    free(json);
    free(config);
    free(cfg_path);
    return st;
}
