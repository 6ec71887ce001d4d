/* random_model.c — writes a small llama-family GGUF model with random weights, using
#include "kvq/util.h"
 * the public API only (the GGUF writer), so kvq can be tried without a trained model.
#include "kvq/util.h"
 *
#include "kvq/util.h"
 *   random_model OUT.gguf [SEED]
#include "kvq/util.h"
 *
#include "kvq/util.h"
 * The model has the shape of stories260K (dim 64, 5 layers, 8 query heads, 4 KV heads,
#include "kvq/util.h"
 * head dim 8, context 2048) and a character-level SentencePiece vocabulary: <unk>,
#include "kvq/util.h"
 * <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, then "▁" (space) and the 94 printable
#include "kvq/util.h"
 * ASCII characters. Weights are seeded normal draws scaled by 1/sqrt(fan-in); norms are
#include "kvq/util.h"
 * 1. Its output is noise: it exists to exercise the pipeline, not to be measured.
#include "kvq/util.h"
 * `make demo` uses it when ../shared/models/stories260K.gguf is absent. */
#include "kvq/util.h"
#include <math.h>
#include "kvq/util.h"
#include <stdio.h>
#include "kvq/util.h"
#include <stdlib.h>
#include "kvq/util.h"
#include <string.h>
#include "kvq/util.h"

#include "kvq/util.h"
#include <kvq.h>
#include "kvq/util.h"

#include "kvq/util.h"
enum { DIM = 64, HIDDEN = 176, LAYERS = 5, HEADS = 8, KV_HEADS = 4, HEAD_DIM = 8, CTX = 2048 };
#include "kvq/util.h"
enum { N_BYTES = 256, N_CHARS = 95, VOCAB = 3 + N_BYTES + N_CHARS };
#include "kvq/util.h"

#include "kvq/util.h"
static kvq_status set_u32(kvq_gguf_writer *w, const char *key, uint64_t v, kvq_err *err)
#include "kvq/util.h"
{
#include "kvq/util.h"
    kvq_gguf_value x = {.type = KVQ_GGUF_UINT32, .v.u = v};
#include "kvq/util.h"
    return kvq_gguf_writer_set(w, key, &x, err);
#include "kvq/util.h"
}
#include "kvq/util.h"

#include "kvq/util.h"
static kvq_status set_f32(kvq_gguf_writer *w, const char *key, double v, kvq_err *err)
#include "kvq/util.h"
{
#include "kvq/util.h"
    kvq_gguf_value x = {.type = KVQ_GGUF_FLOAT32, .v.f = v};
#include "kvq/util.h"
    return kvq_gguf_writer_set(w, key, &x, err);
#include "kvq/util.h"
}
#include "kvq/util.h"

#include "kvq/util.h"
static kvq_status set_str(kvq_gguf_writer *w, const char *key, const char *s, kvq_err *err)
#include "kvq/util.h"
{
#include "kvq/util.h"
    kvq_gguf_value x = {.type = KVQ_GGUF_STRING, .v.str = {s, strlen(s)}};
#include "kvq/util.h"
    return kvq_gguf_writer_set(w, key, &x, err);
#include "kvq/util.h"
}
#include "kvq/util.h"

#include "kvq/util.h"
/* The vocabulary: tokens, scores and types as three GGUF arrays. */
#include "kvq/util.h"
static kvq_status vocab(kvq_gguf_writer *w, kvq_err *err)
#include "kvq/util.h"
{
#include "kvq/util.h"
    static char text[VOCAB][8];                 // token strings
#include "kvq/util.h"
    kvq_gguf_value tok[VOCAB], score[VOCAB], type[VOCAB];
#include "kvq/util.h"
    for (int i = 0; i < VOCAB; i++) {
#include "kvq/util.h"
        int t = KVQ_TOKEN_NORMAL;
#include "kvq/util.h"
        if (i == 0)
#include "kvq/util.h"
            snprintf(text[i], sizeof text[i], "<unk>"), t = KVQ_TOKEN_UNKNOWN;
#include "kvq/util.h"
        else if (i < 3)
#include "kvq/util.h"
            snprintf(text[i], sizeof text[i], i == 1 ? "<s>" : "</s>"), t = KVQ_TOKEN_CONTROL;
#include "kvq/util.h"
        else if (i < 3 + N_BYTES)
#include "kvq/util.h"
            snprintf(text[i], sizeof text[i], "<0x%02X>", i - 3), t = KVQ_TOKEN_BYTE;
#include "kvq/util.h"
        else if (i == 3 + N_BYTES)
#include "kvq/util.h"
            snprintf(text[i], sizeof text[i], "\xe2\x96\x81"); /* U+2581, the SPM space */
#include "kvq/util.h"
        else
#include "kvq/util.h"
            snprintf(text[i], sizeof text[i], "%c", (char)('!' + i - 4 - N_BYTES));
#include "kvq/util.h"
        tok[i] = (kvq_gguf_value){.type = KVQ_GGUF_STRING, .v.str = {text[i], strlen(text[i])}};
#include "kvq/util.h"
        score[i] = (kvq_gguf_value){.type = KVQ_GGUF_FLOAT32, .v.f = -(double)i};
#include "kvq/util.h"
        type[i] = (kvq_gguf_value){.type = KVQ_GGUF_INT32, .v.i = t};
#include "kvq/util.h"
    }
#include "kvq/util.h"
    const kvq_gguf_value arrays[3] = {
#include "kvq/util.h"
        {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_STRING, VOCAB, tok}},
#include "kvq/util.h"
        {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_FLOAT32, VOCAB, score}},
#include "kvq/util.h"
        {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_INT32, VOCAB, type}}};
#include "kvq/util.h"
    kvq_status s;
#include "kvq/util.h"
    if ((s = set_str(w, "tokenizer.ggml.model", "llama", err)) ||
#include "kvq/util.h"
        (s = kvq_gguf_writer_set(w, "tokenizer.ggml.tokens", &arrays[0], err)) ||
#include "kvq/util.h"
        (s = kvq_gguf_writer_set(w, "tokenizer.ggml.scores", &arrays[1], err)) ||
#include "kvq/util.h"
        (s = kvq_gguf_writer_set(w, "tokenizer.ggml.token_type", &arrays[2], err)) ||
#include "kvq/util.h"
        (s = set_u32(w, "tokenizer.ggml.bos_token_id", 1, err)) ||
#include "kvq/util.h"
        (s = set_u32(w, "tokenizer.ggml.eos_token_id", 2, err)) ||
#include "kvq/util.h"
        (s = set_u32(w, "tokenizer.ggml.unknown_token_id", 0, err)))
#include "kvq/util.h"
        return s;
#include "kvq/util.h"
    return KVQ_OK;
#include "kvq/util.h"
}
#include "kvq/util.h"

#include "kvq/util.h"
/* An F32 tensor of rows x cols (GGUF ne = {cols, rows}): seeded normal / sqrt(cols),
#include "kvq/util.h"
 * or all ones when `ones`. */
#include "kvq/util.h"
static kvq_status tensor(kvq_gguf_writer *w, kvq_rng *rng, const char *name, int64_t rows,
#include "kvq/util.h"
                         int64_t cols, int ones, kvq_err *err)
#include "kvq/util.h"
{
#include "kvq/util.h"
    const size_t n = (size_t)(rows * cols);
#include "kvq/util.h"
    float *x = malloc(n * sizeof *x); // [rows, cols]
#include "kvq/util.h"
    if (!x)
#include "kvq/util.h"
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", name);
#include "kvq/util.h"
    const double scale = 1.0 / sqrt((double)cols);
#include "kvq/util.h"
    for (size_t i = 0; i < n; i++)
#include "kvq/util.h"
        x[i] = ones ? 1.0f : (float)(kvq_rng_normal(rng) * scale);
#include "kvq/util.h"
    const int64_t ne[2] = {cols, rows};
#include "kvq/util.h"
    kvq_status s = kvq_gguf_writer_add_tensor(w, name, KVQ_GGML_F32, rows > 1 ? 2 : 1, ne, x,
#include "kvq/util.h"
                                              n * sizeof *x, err);
#include "kvq/util.h"
    free(x);
#include "kvq/util.h"
    return s;
#include "kvq/util.h"
}
#include "kvq/util.h"

#include "kvq/util.h"
int main(int argc, char **argv)
#include "kvq/util.h"
{
#include "kvq/util.h"
    if (argc < 2 || argc > 3) {
#include "kvq/util.h"
        fprintf(stderr, "usage: random_model OUT.gguf [SEED]\n");
#include "kvq/util.h"
        return 2;
#include "kvq/util.h"
    }
#include "kvq/util.h"
    kvq_err err = {0};
#include "kvq/util.h"
    int64_t seed = 1;
#include "kvq/util.h"
    if (argc == 3 && kvq_parse_i64(argv[2], 0, INT64_MAX, &seed, &err) != KVQ_OK) {
#include "kvq/util.h"
        fprintf(stderr, "random_model: %s\n", err.msg);
#include "kvq/util.h"
        return 2;
#include "kvq/util.h"
    }
#include "kvq/util.h"
    kvq_gguf_writer *w = kvq_gguf_writer_new();
#include "kvq/util.h"
    if (!w) {
#include "kvq/util.h"
        fprintf(stderr, "random_model: out of memory\n");
#include "kvq/util.h"
        return 1;
#include "kvq/util.h"
    }
#include "kvq/util.h"
    kvq_rng rng;
#include "kvq/util.h"
    kvq_rng_seed(&rng, (uint64_t)seed);
#include "kvq/util.h"
    kvq_status s;
#include "kvq/util.h"
    char name[64];
#include "kvq/util.h"
    if ((s = set_str(w, "general.architecture", "llama", &err)) ||
#include "kvq/util.h"
        (s = set_str(w, "general.name", "kvq random model (untrained)", &err)) ||
#include "kvq/util.h"
        (s = set_u32(w, "llama.embedding_length", DIM, &err)) ||
#include "kvq/util.h"
        (s = set_u32(w, "llama.feed_forward_length", HIDDEN, &err)) ||
#include "kvq/util.h"
        (s = set_u32(w, "llama.block_count", LAYERS, &err)) ||
#include "kvq/util.h"
        (s = set_u32(w, "llama.attention.head_count", HEADS, &err)) ||
#include "kvq/util.h"
        (s = set_u32(w, "llama.attention.head_count_kv", KV_HEADS, &err)) ||
#include "kvq/util.h"
        (s = set_u32(w, "llama.context_length", CTX, &err)) ||
#include "kvq/util.h"
        (s = set_u32(w, "llama.rope.dimension_count", HEAD_DIM, &err)) ||
#include "kvq/util.h"
        (s = set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5, &err)) ||
#include "kvq/util.h"
        (s = set_f32(w, "llama.rope.freq_base", 10000, &err)) || (s = vocab(w, &err)) ||
#include "kvq/util.h"
        (s = tensor(w, &rng, "token_embd.weight", VOCAB, DIM, 0, &err)))
#include "kvq/util.h"
        goto done;
#include "kvq/util.h"
    for (int l = 0; l < LAYERS && !s; l++) {
#include "kvq/util.h"
        static const struct { const char *name; int64_t rows, cols; int ones; } t[] = {
#include "kvq/util.h"
            {"attn_norm", 1, DIM, 1},
#include "kvq/util.h"
            {"attn_q", HEADS * HEAD_DIM, DIM, 0},
#include "kvq/util.h"
            {"attn_k", KV_HEADS * HEAD_DIM, DIM, 0},
#include "kvq/util.h"
            {"attn_v", KV_HEADS * HEAD_DIM, DIM, 0},
#include "kvq/util.h"
            {"attn_output", DIM, HEADS * HEAD_DIM, 0},
#include "kvq/util.h"
            {"ffn_norm", 1, DIM, 1},
#include "kvq/util.h"
            {"ffn_gate", HIDDEN, DIM, 0},
#include "kvq/util.h"
            {"ffn_up", HIDDEN, DIM, 0},
#include "kvq/util.h"
            {"ffn_down", DIM, HIDDEN, 0}};
#include "kvq/util.h"
        for (size_t i = 0; i < sizeof t / sizeof t[0] && !s; i++) {
#include "kvq/util.h"
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, t[i].name);
#include "kvq/util.h"
            s = tensor(w, &rng, name, t[i].rows, t[i].cols, t[i].ones, &err);
#include "kvq/util.h"
        }
#include "kvq/util.h"
    }
#include "kvq/util.h"
    if (s || (s = tensor(w, &rng, "output_norm.weight", 1, DIM, 1, &err)) ||
#include "kvq/util.h"
        (s = tensor(w, &rng, "output.weight", VOCAB, DIM, 0, &err)))
#include "kvq/util.h"
        goto done;
#include "kvq/util.h"
    s = kvq_gguf_writer_write(w, argv[1], 1, &err);
#include "kvq/util.h"
done:
#include "kvq/util.h"
    kvq_gguf_writer_free(w);
#include "kvq/util.h"
    if (s) {
#include "kvq/util.h"
        fprintf(stderr, "random_model: %s\n", err.msg);
#include "kvq/util.h"
        return 1;
#include "kvq/util.h"
    }
#include "kvq/util.h"
    printf("random_model: wrote %s (random weights, seed %lld)\n", argv[1], (long long)seed);
#include "kvq/util.h"
    return 0;
#include "kvq/util.h"
}
#include "kvq/util.h"
