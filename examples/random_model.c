/* random_model.c — writes a small llama-family GGUF model with random weights through
 * kvq's GGUF writer, so kvq can be tried without a trained model. The GGUF writer is
 * in kvq's unstable tier (docs/api.md): this example defines KVQ_UNSTABLE_API and builds
 * against headers installed by `make install-unstable` (or the source tree):
 *
 *   cc random_model.c $(pkg-config --cflags --libs kvq) -lm -o random_model
 *
 * (with a PREFIX outside the loader's path, add -Wl,-rpath,PREFIX/lib or set
 * LD_LIBRARY_PATH=PREFIX/lib to run it).
 *
 *   random_model OUT.gguf [SEED]
 *
 * An existing OUT.gguf is replaced only when it is a GGUF file (any other file is
 * refused).
 *
 * The model has the shape of stories260K (dim 64, 5 layers, 8 query heads, 4 KV heads,
 * head dim 8, context 2048) and a character-level SentencePiece vocabulary: <unk>,
 * <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, then "▁" (space) and the 94 printable
 * ASCII characters. Weights are seeded normal draws scaled by 1/sqrt(fan-in); norms are
 * 1. Its output is noise: it exists to exercise the pipeline, not to be measured.
 * `make demo` uses it when ../shared/models/stories260K.gguf is absent. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

#define KVQ_UNSTABLE_API /* the GGUF writer */
#include <kvq.h>

/* The weights' generator (this example's own: splitmix64 and Box-Muller). */
typedef struct wrng {
    uint64_t x;
} wrng;

static uint64_t rng_u64(wrng *r)
{
    uint64_t z = (r->x += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static double rng_normal(wrng *r)
{
    const double u1 = ((double)(rng_u64(r) >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
    const double u2 = (double)(rng_u64(r) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

enum { DIM = 64, HIDDEN = 176, LAYERS = 5, HEADS = 8, KV_HEADS = 4, HEAD_DIM = 8, CTX = 2048 };
enum { N_BYTES = 256, N_CHARS = 95, VOCAB = 3 + N_BYTES + N_CHARS };

static kvq_status set_u32(kvq_gguf_writer *w, const char *key, uint64_t v, kvq_err *err)
{
    kvq_gguf_value x = {.type = KVQ_GGUF_UINT32, .v.u = v};
    return kvq_gguf_writer_set(w, key, &x, err);
}

static kvq_status set_f32(kvq_gguf_writer *w, const char *key, double v, kvq_err *err)
{
    kvq_gguf_value x = {.type = KVQ_GGUF_FLOAT32, .v.f = v};
    return kvq_gguf_writer_set(w, key, &x, err);
}

static kvq_status set_str(kvq_gguf_writer *w, const char *key, const char *s, kvq_err *err)
{
    kvq_gguf_value x = {.type = KVQ_GGUF_STRING, .v.str = {s, strlen(s)}};
    return kvq_gguf_writer_set(w, key, &x, err);
}

/* The vocabulary: tokens, scores and types as three GGUF arrays. */
static kvq_status vocab(kvq_gguf_writer *w, kvq_err *err)
{
    static char text[VOCAB][8];                 // token strings
    kvq_gguf_value tok[VOCAB], score[VOCAB], type[VOCAB];
    for (int i = 0; i < VOCAB; i++) {
        int t = KVQ_TOKEN_NORMAL;
        if (i == 0)
            snprintf(text[i], sizeof text[i], "<unk>"), t = KVQ_TOKEN_UNKNOWN;
        else if (i < 3)
            snprintf(text[i], sizeof text[i], i == 1 ? "<s>" : "</s>"), t = KVQ_TOKEN_CONTROL;
        else if (i < 3 + N_BYTES)
            snprintf(text[i], sizeof text[i], "<0x%02X>", i - 3), t = KVQ_TOKEN_BYTE;
        else if (i == 3 + N_BYTES)
            snprintf(text[i], sizeof text[i], "\xe2\x96\x81"); /* U+2581, the SPM space */
        else
            snprintf(text[i], sizeof text[i], "%c", (char)('!' + i - 4 - N_BYTES));
        tok[i] = (kvq_gguf_value){.type = KVQ_GGUF_STRING, .v.str = {text[i], strlen(text[i])}};
        score[i] = (kvq_gguf_value){.type = KVQ_GGUF_FLOAT32, .v.f = -(double)i};
        type[i] = (kvq_gguf_value){.type = KVQ_GGUF_INT32, .v.i = t};
    }
    const kvq_gguf_value arrays[3] = {
        {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_STRING, VOCAB, tok}},
        {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_FLOAT32, VOCAB, score}},
        {.type = KVQ_GGUF_ARRAY, .v.arr = {KVQ_GGUF_INT32, VOCAB, type}}};
    kvq_status s;
    if ((s = set_str(w, "tokenizer.ggml.model", "llama", err)) ||
        (s = kvq_gguf_writer_set(w, "tokenizer.ggml.tokens", &arrays[0], err)) ||
        (s = kvq_gguf_writer_set(w, "tokenizer.ggml.scores", &arrays[1], err)) ||
        (s = kvq_gguf_writer_set(w, "tokenizer.ggml.token_type", &arrays[2], err)) ||
        (s = set_u32(w, "tokenizer.ggml.bos_token_id", 1, err)) ||
        (s = set_u32(w, "tokenizer.ggml.eos_token_id", 2, err)) ||
        (s = set_u32(w, "tokenizer.ggml.unknown_token_id", 0, err)))
        return s;
    return KVQ_OK;
}

/* An F32 tensor of rows x cols (GGUF ne = {cols, rows}): seeded normal / sqrt(cols),
 * or all ones when `ones`. */
static kvq_status tensor(kvq_gguf_writer *w, wrng *rng, const char *name, int64_t rows,
                         int64_t cols, int ones, kvq_err *err)
{
    const size_t n = (size_t)(rows * cols);
    float *x = malloc(n * sizeof *x); // [rows, cols]
    if (!x)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", name);
    const double scale = 1.0 / sqrt((double)cols);
    for (size_t i = 0; i < n; i++)
        x[i] = ones ? 1.0f : (float)(rng_normal(rng) * scale);
    const int64_t ne[2] = {cols, rows};
    kvq_status s = kvq_gguf_writer_add_tensor(w, name, KVQ_GGML_F32, rows > 1 ? 2 : 1, ne, x,
                                              n * sizeof *x, err);
    free(x);
    return s;
}

/* 1 when path begins with the GGUF magic: the only files this program replaces. */
static int is_gguf(const char *path)
{
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    const size_t n = f ? fread(magic, 1, 4, f) : 0;
    if (f)
        fclose(f);
    return n == 4 && !memcmp(magic, "GGUF", 4);
}

int main(int argc, char **argv)
{
    static const char usage[] =
        "usage: random_model OUT.gguf [SEED]\n"
        "Writes a small llama-family GGUF model (the shape of stories260K) with random\n"
        "weights drawn from SEED (default 1). An existing OUT.gguf is replaced only when it\n"
        "is a GGUF file.\n";
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc < 2 || argc > 3 || argv[1][0] == '-') {
        if (argc >= 2 && argv[1][0] == '-')
            fprintf(stderr, "random_model: unknown option '%s'\n", argv[1]);
        fputs(usage, stderr);
        return 2;
    }
    kvq_err err = {0};
    int64_t seed = 1;
    if (argc == 3) {
        char *end = NULL;
        errno = 0;
        const long long v = strtoll(argv[2], &end, 10);
        if (errno || end == argv[2] || *end || v < 0) {
            fprintf(stderr, "random_model: seed '%s' is not an integer in [0, %lld]\n", argv[2],
                    (long long)INT64_MAX);
            return 2;
        }
        seed = v;
    }
    struct stat sb;
    if (stat(argv[1], &sb) == 0 && (!S_ISREG(sb.st_mode) || !is_gguf(argv[1]))) {
        fprintf(stderr, "random_model: %s: exists and is not a GGUF file\n", argv[1]);
        return 1;
    }
    kvq_gguf_writer *w = kvq_gguf_writer_new();
    if (!w) {
        fprintf(stderr, "random_model: out of memory\n");
        return 1;
    }
    wrng rng = {(uint64_t)seed};
    kvq_status s;
    char name[64];
    if ((s = set_str(w, "general.architecture", "llama", &err)) ||
        (s = set_str(w, "general.name", "kvq random model (untrained)", &err)) ||
        (s = set_u32(w, "llama.embedding_length", DIM, &err)) ||
        (s = set_u32(w, "llama.feed_forward_length", HIDDEN, &err)) ||
        (s = set_u32(w, "llama.block_count", LAYERS, &err)) ||
        (s = set_u32(w, "llama.attention.head_count", HEADS, &err)) ||
        (s = set_u32(w, "llama.attention.head_count_kv", KV_HEADS, &err)) ||
        (s = set_u32(w, "llama.context_length", CTX, &err)) ||
        (s = set_u32(w, "llama.rope.dimension_count", HEAD_DIM, &err)) ||
        (s = set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5, &err)) ||
        (s = set_f32(w, "llama.rope.freq_base", 10000, &err)) || (s = vocab(w, &err)) ||
        (s = tensor(w, &rng, "token_embd.weight", VOCAB, DIM, 0, &err)))
        goto done;
    for (int l = 0; l < LAYERS && !s; l++) {
        static const struct { const char *name; int64_t rows, cols; int ones; } t[] = {
            {"attn_norm", 1, DIM, 1},
            {"attn_q", HEADS * HEAD_DIM, DIM, 0},
            {"attn_k", KV_HEADS * HEAD_DIM, DIM, 0},
            {"attn_v", KV_HEADS * HEAD_DIM, DIM, 0},
            {"attn_output", DIM, HEADS * HEAD_DIM, 0},
            {"ffn_norm", 1, DIM, 1},
            {"ffn_gate", HIDDEN, DIM, 0},
            {"ffn_up", HIDDEN, DIM, 0},
            {"ffn_down", DIM, HIDDEN, 0}};
        for (size_t i = 0; i < sizeof t / sizeof t[0] && !s; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, t[i].name);
            s = tensor(w, &rng, name, t[i].rows, t[i].cols, t[i].ones, &err);
        }
    }
    if (s || (s = tensor(w, &rng, "output_norm.weight", 1, DIM, 1, &err)) ||
        (s = tensor(w, &rng, "output.weight", VOCAB, DIM, 0, &err)))
        goto done;
    s = kvq_gguf_writer_write(w, argv[1], 1, &err);
done:
    kvq_gguf_writer_free(w);
    if (s) {
        fprintf(stderr, "random_model: %s\n", err.msg);
        return 1;
    }
    printf("random_model: wrote %s (random weights, seed %lld)\n", argv[1], (long long)seed);
    return 0;
}
