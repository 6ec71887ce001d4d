/* write_artifact.c — writes a small, complete .kvq artifact with kvq's safetensors
 * writer and artifact encoder. The writer is in kvq's unstable tier (docs/api.md): this
 * example defines KVQ_UNSTABLE_API (headers of `make install-unstable`).
 *
 *   write_artifact OUT.kvq [ZSTD_LEVEL]
 *
 * The artifact describes a made-up model (2 layers, 4 query heads, 2 KV heads,
 * head dim 4) with a query-aware VQ codebook of 4 entries per KV head, so every
 * value is easy to recompute elsewhere (tests/py/test_artifact_reader.py does):
 *   layer.L.head.H.codebook[c][j] = L + H/2 + c/4 + j/8      [K, d]
 *   layer.L.head.H.L              = 2 I                      [d, d]
 *   layer.L.head.H.Linv           = I / 2                    [d, d]
 *   layer.L.head.H.Cz             = codebook L = 2 codebook  [K, d]
 *   thresholds.leankv.alpha_h     = 1 + L + H/2              [n_layers, n_kv_heads]
 *   thresholds.leankv.alpha_l     = 0.02 (f32)               []
 * The steps are the ones every stage uses: declare the tensors, set the metadata,
 * serialize to a buffer, compress it into the artifact atomically, then reopen it
 * and check it against the format's rules. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVQ_UNSTABLE_API /* the safetensors writer */
#include <kvq.h>

enum { N_LAYERS = 2, N_KV = 2, D = 4, K = 4 };

/* Declares (pass 0) or writes (pass 1) every tensor, in the same order. */
static kvq_status tensors(kvq_st_writer *w, int pass, kvq_err *err)
{
    static const char *const kinds[] = {"codebook", "Cz", "L", "Linv"};
    kvq_status s = KVQ_OK;
    for (int l = 0; l < N_LAYERS; l++)
        for (int h = 0; h < N_KV; h++)
            for (int k = 0; k < 4 && !s; k++) {
                int square = k >= 2;
                int64_t shape[2] = {square ? D : K, D};
                float m[K * D]; // [K, d] or [d, d]
                for (int r = 0; r < shape[0]; r++)
                    for (int j = 0; j < D; j++) {
                        float c = (float)l + h / 2.0f + r / 4.0f + j / 8.0f;
                        float diag = (r == j) ? (k == 2 ? 2.0f : 0.5f) : 0.0f;
                        m[r * D + j] = k == 0 ? c : k == 1 ? 2.0f * c : diag;
                    }
                char name[64];
                snprintf(name, sizeof name, "layer.%d.head.%d.%s", l, h, kinds[k]);
                s = pass == 0 ? kvq_st_writer_declare(w, name, KVQ_DT_F32, 2, shape, err)
                              : kvq_st_writer_write(w, m, sizeof(float) * (size_t)(shape[0] * D),
                                                    err);
            }
    float alpha_h[N_LAYERS][N_KV]; // [n_layers, n_kv_heads]
    for (int l = 0; l < N_LAYERS; l++)
        for (int h = 0; h < N_KV; h++)
            alpha_h[l][h] = 1.0f + (float)l + h / 2.0f;
    float alpha_l = 0.02f;
    const int64_t shape_h[2] = {N_LAYERS, N_KV};
    if (s)
        return s;
    if (pass == 0) {
        if ((s = kvq_st_writer_declare(w, KVQ_TENSOR_LEANKV_ALPHA_H, KVQ_DT_F32, 2, shape_h, err)))
            return s;
        return kvq_st_writer_declare(w, KVQ_TENSOR_LEANKV_ALPHA_L, KVQ_DT_F32, 0, NULL, err);
    }
    if ((s = kvq_st_writer_write(w, alpha_h, sizeof alpha_h, err)))
        return s;
    return kvq_st_writer_write(w, &alpha_l, sizeof alpha_l, err);
}

static const char *const metadata[] = {
    KVQ_META_ARCH, "llama",
    KVQ_META_N_LAYERS, "2",
    KVQ_META_N_HEADS, "4",
    KVQ_META_N_KV_HEADS, "2",
    KVQ_META_HEAD_DIM, "4",
    KVQ_META_ROPE_BASE, "10000",
    KVQ_META_ROPE_LAYOUT, "interleaved",
    KVQ_META_ROPE_SCALING, "none",
    KVQ_META_METHOD, KVQ_METHOD_QAVQ,
    KVQ_META_CODEBOOK_SIZE, "4",
    KVQ_META_GROUPS, "1",
    KVQ_META_WROPE_W, "64",
    KVQ_META_WROPE_B, "2048",
    KVQ_META_SEED, "1234",
    KVQ_META_CORPUS_HASH, "0123456789abcdef",
    KVQ_META_N_TOKENS, "4096",
    KVQ_META_TOOL_VERSION, "kvq example",
    KVQ_META_BACKEND, "cpu",
    NULL,
};

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: write_artifact OUT.kvq [ZSTD_LEVEL]\n");
        return 2;
    }
    int level = argc == 3 ? atoi(argv[2]) : 0;
    kvq_err err = {0};
    kvq_artifact *a = NULL;
    kvq_st_writer *w = kvq_st_writer_new();
    kvq_status s = w ? KVQ_OK : kvq_err_set(&err, KVQ_E_NOMEM, "out of memory");
    for (int i = 0; !s && metadata[i]; i += 2)
        s = kvq_st_writer_set_meta(w, metadata[i], metadata[i + 1], &err);
    if (!s)
        s = tensors(w, 0, &err);
    if (!s)
        s = kvq_st_writer_begin_buffer(w, &err);
    if (!s)
        s = tensors(w, 1, &err);
    if (!s)
        s = kvq_st_writer_finish(w, &err);
    if (!s) {
        size_t n = 0;
        const void *payload = kvq_st_writer_buffer(w, &n);
        s = kvq_artifact_write(argv[1], 1, payload, n, level, &err);
    }
    if (!s)
        s = kvq_artifact_open(argv[1], &a, &err);
    if (!s)
        s = kvq_artifact_validate(a, &err);
    if (!s)
        printf("wrote %s: version %u.%u, %zu tensors, %zu metadata keys, payload %zu bytes\n",
               argv[1], kvq_artifact_major(a), kvq_artifact_minor(a),
               kvq_st_count(kvq_artifact_payload(a)), kvq_st_meta_count(kvq_artifact_payload(a)),
               kvq_artifact_payload_size(a));
    kvq_artifact_close(a);
    kvq_st_writer_free(w);
    if (s) {
        fprintf(stderr, "write_artifact: %s\n", err.msg);
        return 1;
    }
    return 0;
}
