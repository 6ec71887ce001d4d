/*
 * tokenizer_gguf.c — a tokenizer from GGUF metadata (tokenizer.ggml.*): llama.cpp's
 * "llama" (SentencePiece) and "gpt2" (byte-level BPE) vocabularies.
 */
#include "model/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An array of `type` items with n entries, or NULL. */
static const kvq_gguf_value *gguf_array(const kvq_gguf *g, const char *key, kvq_gguf_type type)
{
    const kvq_gguf_value *v = kvq_gguf_get(g, key);
    if (!v || v->type != KVQ_GGUF_ARRAY || v->v.arr.type != type)
        return NULL;
    return v;
}

/* Reads an optional token id key: *id stays as given when absent; UINT32_MAX and
 * larger mean "none". 0 ok, -1 out of range, -2 wrong type. */
static int gguf_token_id(const kvq_gguf *g, const char *key, uint32_t n, int32_t *id)
{
    const kvq_gguf_value *v = kvq_gguf_get(g, key);
    if (!v)
        return 0;
    uint64_t u;
    if (kvq_gguf_get_u64(g, key, &u) != 0)
        return -2;
    if (u >= UINT32_MAX) {
        *id = -1;
        return 0;
    }
    if (u >= n)
        return -1;
    *id = (int32_t)u;
    return 0;
}

static int gguf_bool(const kvq_gguf *g, const char *key, int dflt)
{
    const kvq_gguf_value *v = kvq_gguf_get(g, key);
    if (!v)
        return dflt;
    if (v->type == KVQ_GGUF_BOOL)
        return v->v.u != 0;
    uint64_t u;
    return kvq_gguf_get_u64(g, key, &u) == 0 ? u != 0 : dflt;
}

/* The vocabulary kind from tokenizer.ggml.model: "llama" (SPM) or "gpt2" (BPE). */
static kvq_status gguf_kind(const kvq_gguf *g, const char *label, const char **model,
                            kvq_tokenizer_kind *kind, kvq_err *err)
{
    *model = kvq_gguf_get_str(g, "tokenizer.ggml.model");
    if (!*model)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: no tokenizer (tokenizer.ggml.model is "
                           "missing)", label);
    if (strcmp(*model, "llama") == 0)
        *kind = KVQ_TOKENIZER_SPM;
    else if (strcmp(*model, "gpt2") == 0)
        *kind = KVQ_TOKENIZER_BPE;
    else
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: tokenizer model '%s' is not supported "
                           "(supported: llama, gpt2)", label, *model);
    return KVQ_OK;
}

/* v->tokens / v->token_lens (malloc'd *tokens, *lens) point into tokenizer.ggml.tokens. */
static kvq_status gguf_tokens(const kvq_gguf_value *tv, kvq_vocab *v, const char ***tokens,
                              uint32_t **lens, const char *label, const char *model,
                              kvq_err *err)
{
    const uint32_t n = v->n_tokens;
    *tokens = malloc(n * sizeof **tokens);
    *lens = malloc(n * sizeof **lens);
    if (!*tokens || !*lens)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    for (uint32_t i = 0; i < n; i++) {
        const kvq_gguf_value *it = &tv->v.arr.items[i];
        if (it->v.str.len > UINT32_MAX / 2)
            return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: token %u is too long (tokenizer "
                               "model '%s')", label, i, model);
        (*tokens)[i] = it->v.str.s;
        (*lens)[i] = (uint32_t)it->v.str.len;
    }
    v->tokens = *tokens;
    v->token_lens = *lens;
    return KVQ_OK;
}

/* v->scores (malloc'd *scores) from tokenizer.ggml.scores, which SPM requires. */
static kvq_status gguf_scores(const kvq_gguf *g, kvq_tokenizer_kind kind, kvq_vocab *v,
                              float **scores, const char *label, const char *model,
                              kvq_err *err)
{
    const uint32_t n = v->n_tokens;
    const kvq_gguf_value *sv = kvq_gguf_get(g, "tokenizer.ggml.scores");
    if (!sv) {
        if (kind == KVQ_TOKENIZER_SPM)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: tokenizer.ggml.scores is missing "
                               "(tokenizer model '%s')", label, model);
        return KVQ_OK;
    }
    if (sv->type != KVQ_GGUF_ARRAY || sv->v.arr.type != KVQ_GGUF_FLOAT32 || sv->v.arr.n != n)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: tokenizer.ggml.scores is not %u f32 values "
                           "(tokenizer model '%s')", label, n, model);
    *scores = malloc(n * sizeof **scores);
    if (!*scores)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    for (uint32_t i = 0; i < n; i++)
        (*scores)[i] = (float)sv->v.arr.items[i].v.f;
    v->scores = *scores;
    return KVQ_OK;
}

/* v->types (malloc'd *types) from the optional tokenizer.ggml.token_type. */
static kvq_status gguf_types(const kvq_gguf *g, kvq_vocab *v, int32_t **types,
                             const char *label, const char *model, kvq_err *err)
{
    const uint32_t n = v->n_tokens;
    const kvq_gguf_value *yv = kvq_gguf_get(g, "tokenizer.ggml.token_type");
    if (!yv)
        return KVQ_OK;
    if (yv->type != KVQ_GGUF_ARRAY || yv->v.arr.n != n ||
        (yv->v.arr.type != KVQ_GGUF_INT32 && yv->v.arr.type != KVQ_GGUF_UINT32))
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: tokenizer.ggml.token_type is not %u int32 "
                           "values (tokenizer model '%s')", label, n, model);
    *types = malloc(n * sizeof **types);
    if (!*types)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    for (uint32_t i = 0; i < n; i++) {
        const kvq_gguf_value *it = &yv->v.arr.items[i];
        int64_t x = it->type == KVQ_GGUF_INT32 ? it->v.i : (int64_t)it->v.u;
        (*types)[i] = (x < INT32_MIN || x > INT32_MAX) ? INT32_MAX : (int32_t)x; /* _new checks */
    }
    v->types = *types;
    return KVQ_OK;
}

/* v->bos, v->eos, v->unk from their keys, with llama.cpp's SPM defaults. */
static kvq_status gguf_special_ids(const kvq_gguf *g, kvq_tokenizer_kind kind, kvq_vocab *v,
                                   const char *label, const char *model, kvq_err *err)
{
    const uint32_t n = v->n_tokens;
    static const char *const id_keys[3] = {"tokenizer.ggml.bos_token_id",
                                           "tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.unknown_token_id"};
    int32_t ids[3] = {-1, -1, -1};
    if (kind == KVQ_TOKENIZER_SPM) { /* llama.cpp's defaults for SentencePiece vocabularies */
        ids[0] = n > 1 ? 1 : -1;
        ids[1] = n > 2 ? 2 : -1;
        ids[2] = 0;
    }
    for (int k = 0; k < 3; k++) {
        int rc = gguf_token_id(g, id_keys[k], n, &ids[k]);
        if (rc)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: %s is %s (tokenizer model '%s')", label,
                               id_keys[k], rc == -1 ? "outside the vocabulary" : "not an integer",
                               model);
    }
    v->bos = ids[0];
    v->eos = ids[1];
    v->unk = ids[2];
    return KVQ_OK;
}

static int name_in(const char *s, const char *const *names)
{
    for (; *names; names++)
        if (strcmp(s, *names) == 0)
            return 1;
    return 0;
}

/* The split llama.cpp (src/llama-vocab.cpp) gives a tokenizer.ggml.pre name, with its
 * ignore_merges and default add_bos: 1, or 0 for a name kvq does not implement. */
static int gguf_pre_split(const char *pre, kvq_vocab *v, int *dflt_bos)
{
    static const char *const llama3[] = {"llama3", "llama-bpe", "llama-v3", "falcon3", "pixtral",
                                         NULL};
    static const char *const qwen2[] = {"qwen2", "deepseek-r1-qwen", "megrez", NULL};
    static const char *const smollm[] = {"smollm", "starcoder", "refact", "command-r",
                                         "codeshell", "exaone", "minerva-7b", NULL};
    static const char *const gpt2[] = {"gpt-2", "gpt2", "phi-2", "jina-es", "jina-de",
                                       "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code",
                                       "roberta-bpe", "mpt", "olmo", "jais", NULL};
    static const char *const gpt4o[] = {"gpt-4o", "llama4", NULL};
    v->max_digits = 0;
    v->ignore_merges = 0;
    *dflt_bos = 0;
    if (name_in(pre, llama3)) {
        v->pretok = KVQ_PRETOK_LLAMA3;
        v->max_digits = 3;
        v->ignore_merges = 1;
        *dflt_bos = 1;
    } else if (name_in(pre, qwen2)) {
        v->pretok = KVQ_PRETOK_LLAMA3;
        v->max_digits = 1;
    } else if (name_in(pre, smollm)) {
        v->pretok = KVQ_PRETOK_SMOLLM;
    } else if (name_in(pre, gpt2)) {
        v->pretok = KVQ_PRETOK_GPT2;
    } else if (name_in(pre, gpt4o)) {
        v->pretok = KVQ_PRETOK_GPT4O;
        v->max_digits = 3;
    } else if (strcmp(pre, "tekken") == 0) {
        v->pretok = KVQ_PRETOK_TEKKEN;
        v->max_digits = 1;
        v->ignore_merges = 1;
        *dflt_bos = 1;
    } else if (strcmp(pre, "deepseek-llm") == 0) {
        v->pretok = KVQ_PRETOK_DEEPSEEK_LLM; /* llama.cpp ends with \p{N}+ */
    } else if (strcmp(pre, "default") == 0) {
        v->pretok = KVQ_PRETOK_DEFAULT;
    } else {
        v->pretok = KVQ_PRETOK_GPT2;
        return 0;
    }
    return 1;
}

/* The byte-level BPE settings: v->merges (malloc'd *merges) from tokenizer.ggml.merges,
 * the pre-tokenizer from tokenizer.ggml.pre, the prefix and BOS flags. */
static kvq_status gguf_bpe(const kvq_gguf *g, kvq_vocab *v, const char ***merges,
                           const char *label, const char *model, const kvq_tokenizer_params *p,
                           char *approx, size_t approx_size, kvq_err *err)
{
    const kvq_gguf_value *mv = gguf_array(g, "tokenizer.ggml.merges", KVQ_GGUF_STRING);
    if (!mv)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: tokenizer.ggml.merges is missing or not "
                           "an array of strings (tokenizer model '%s')", label, model);
    if (mv->v.arr.n > INT32_MAX / 4)
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %llu merges (tokenizer model '%s')",
                           label, (unsigned long long)mv->v.arr.n, model);
    v->n_merges = (uint32_t)mv->v.arr.n;
    *merges = malloc((v->n_merges ? v->n_merges : 1) * sizeof **merges);
    if (!*merges)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", label);
    for (uint32_t i = 0; i < v->n_merges; i++)
        (*merges)[i] = mv->v.arr.items[i].v.str.s;
    v->merges = *merges;
    v->byte_level = 1;
    v->drop_unknown = 1; /* llama.cpp's BPE session drops what has no token */
    v->add_space_prefix = gguf_bool(g, "tokenizer.ggml.add_space_prefix", 0);
    const char *pre = kvq_gguf_get_str(g, "tokenizer.ggml.pre");
    int dflt_bos = 0;
    v->pretok = KVQ_PRETOK_GPT2; /* also when the key is absent (files from before it) */
    if (pre && !gguf_pre_split(pre, v, &dflt_bos)) {
        if (!p->accept_approx)
            return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: pre-tokenizer '%s' "
                               "(tokenizer.ggml.pre) is not implemented; kvq would approximate "
                               "it by the GPT-2 split only if asked to accept the "
                               "approximation", label, pre);
        snprintf(approx, approx_size, "pre-tokenizer '%s' approximated by the GPT-2 split", pre);
        v->approx = approx;
        kvq_log(&p->cb, KVQ_LOG_WARN, "%s: %s", label, approx);
    }
    v->add_bos = gguf_bool(g, "tokenizer.ggml.add_bos_token", dflt_bos);
    v->add_eos = gguf_bool(g, "tokenizer.ggml.add_eos_token", 0);
    return KVQ_OK;
}

kvq_status kvq_tokenizer_from_gguf(const kvq_gguf *g, const char *label,
                                   const kvq_callbacks *cb, kvq_tokenizer **out, kvq_err *err)
{
    kvq_tokenizer_params p = kvq_tokenizer_params_default();
    if (cb)
        p.cb = *cb;
    return kvq_tokenizer_from_gguf_p(g, label, &p, out, err);
}

kvq_status kvq_tokenizer_from_gguf_p(const kvq_gguf *g, const char *label,
                                     const kvq_tokenizer_params *p, kvq_tokenizer **out,
                                     kvq_err *err)
{
    const kvq_callbacks *cb = &p->cb;
    char approx[192];
    const char **tokens = NULL, **merges = NULL;
    uint32_t *lens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    *out = NULL;
    if (!label)
        label = "gguf";

    const char *model = NULL;
    kvq_tokenizer_kind kind = KVQ_TOKENIZER_SPM;
    kvq_status st = gguf_kind(g, label, &model, &kind, err);
    if (st)
        return st;
    const kvq_gguf_value *tv = gguf_array(g, "tokenizer.ggml.tokens", KVQ_GGUF_STRING);
    if (!tv || tv->v.arr.n == 0)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: tokenizer.ggml.tokens is missing or not a "
                           "non-empty array of strings (tokenizer model '%s')", label, model);
    if (tv->v.arr.n > KVQ_TOKENIZER_MAX_VOCAB)
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: %llu tokens (tokenizer model '%s')",
                           label, (unsigned long long)tv->v.arr.n, model);

    kvq_vocab v;
    kvq_vocab_default(&v);
    v.model = model;
    v.n_tokens = (uint32_t)tv->v.arr.n;
    st = gguf_tokens(tv, &v, &tokens, &lens, label, model, err);
    if (st == KVQ_OK)
        st = gguf_scores(g, kind, &v, &scores, label, model, err);
    if (st == KVQ_OK)
        st = gguf_types(g, &v, &types, label, model, err);
    if (st == KVQ_OK)
        st = gguf_special_ids(g, kind, &v, label, model, err);
    if (st == KVQ_OK && kind == KVQ_TOKENIZER_SPM) {
        v.add_space_prefix = gguf_bool(g, "tokenizer.ggml.add_space_prefix", 1);
        v.add_bos = gguf_bool(g, "tokenizer.ggml.add_bos_token", 1);
        v.add_eos = gguf_bool(g, "tokenizer.ggml.add_eos_token", 0);
    } else if (st == KVQ_OK) {
        st = gguf_bpe(g, &v, &merges, label, model, p, approx, sizeof approx, err);
    }
    if (st == KVQ_OK)
        st = kvq_tokenizer_new(kind, &v, label, cb, out, err);
    free(tokens);
    free(lens);
    free(scores);
    free(types);
    free(merges);
    return st;
}
