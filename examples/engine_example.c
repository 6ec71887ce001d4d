/* engine_example.c — how an inference engine embeds kvq's retrieval attention through
 * kvq/engine.h alone (no other kvq header, no kvq forward pass). Built against an
 * installed kvq with
 *
 *   cc engine_example.c $(pkg-config --cflags --libs kvq) -lm -o engine_example
 *
 * (kvq/engine.h is in the stable tier, docs/api.md; with a PREFIX outside the loader's
 * path, add -Wl,-rpath,PREFIX/lib or set LD_LIBRARY_PATH=PREFIX/lib to run it)
 * and run as
 *
 *   engine_example ARTIFACT.kvq N_LAYERS N_HEADS N_KV_HEADS HEAD_DIM ROPE_BASE
 *                  interleaved|half FINGERPRINT|- [TOKENS]
 *
 * It stands in for an engine's forward pass with seeded pseudo-random pre-RoPE rows:
 * the first TOKENS - 8 (default 256) go in as a prompt (kvq_engine_seq_append, f16
 * rows, as an engine with an f16 KV cache has them), the last 8 as decode steps
 * (kvq_engine_seq_decode) whose outputs it sums. It prints the artifact's weights, the
 * memory kvq holds and the checksum; a wrong fingerprint is refused (exit 1) with
 * kvq's message. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvq/engine.h>

static uint64_t state = 0x853c49e6748fea9bULL;

static float next_normal(void) /* a xorshift and Irwin-Hall: the engine's "activations" */
{
    double s = 0;
    for (int i = 0; i < 4; i++) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        s += (double)(state >> 11) / 9007199254740992.0;
    }
    return (float)((s - 2.0) * 1.7320508);
}

static uint16_t to_f16(float f) /* round to nearest even, finite normal range only */
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (exp <= 0)
        return (uint16_t)sign;
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    const uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)h;
}

int main(int argc, char **argv)
{
    if (argc < 9) {
        fprintf(stderr, "usage: %s ARTIFACT.kvq N_LAYERS N_HEADS N_KV_HEADS HEAD_DIM ROPE_BASE "
                        "interleaved|half FINGERPRINT|- [TOKENS]\n", argv[0]);
        return 2;
    }
    kvq_engine_model m = {0};
    m.n_layers = atoi(argv[2]);
    m.n_heads = atoi(argv[3]);
    m.n_kv_heads = atoi(argv[4]);
    m.head_dim = atoi(argv[5]);
    m.rope_base = atof(argv[6]);
    m.rope_interleaved = !strcmp(argv[7], "interleaved");
    m.fingerprint = strcmp(argv[8], "-") ? argv[8] : NULL;
    const int tokens = argc > 9 ? atoi(argv[9]) : 256, steps = 8;
    if (tokens <= steps) {
        fprintf(stderr, "engine_example: TOKENS must be more than %d\n", steps);
        return 2;
    }

    kvq_err err = {0};
    kvq_engine *eng = NULL;
    if (kvq_engine_open(argv[1], &m, 0, &eng, &err) != KVQ_OK) {
        fprintf(stderr, "engine_example: %s\n", err.msg);
        return 1;
    }
    kvq_engine_seq_params sp = kvq_engine_seq_params_default();
    sp.budget_tokens = 32;
    kvq_engine_seq *seq = NULL;
    if (kvq_engine_seq_create(eng, &sp, &seq, &err) != KVQ_OK) {
        fprintf(stderr, "engine_example: %s\n", err.msg);
        kvq_engine_close(eng);
        return 1;
    }
    const size_t nq = (size_t)m.n_heads * m.head_dim, nkv = (size_t)m.n_kv_heads * m.head_dim;
    const int prompt = tokens - steps;
    uint16_t *k = malloc(sizeof *k * nkv * prompt), *v = malloc(sizeof *v * nkv * prompt);
    int64_t *pos = malloc(sizeof *pos * prompt);
    float *q = malloc(sizeof *q * nq), *out = malloc(sizeof *out * nq);
    float *kf = malloc(sizeof *kf * nkv), *vf = malloc(sizeof *vf * nkv);
    double checksum = 0;
    int rc = 0;
    for (int t = 0; t < prompt; t++)
        pos[t] = t;
    for (int32_t l = 0; l < m.n_layers && !rc; l++) {
        for (size_t i = 0; i < nkv * prompt; i++) {
            k[i] = to_f16(next_normal());
            v[i] = to_f16(next_normal());
        }
        if (kvq_engine_seq_append(seq, l, prompt, pos, k, v, KVQ_ENGINE_F16, &err) != KVQ_OK)
            rc = 1;
    }
    for (int t = prompt; t < tokens && !rc; t++)
        for (int32_t l = 0; l < m.n_layers && !rc; l++) {
            for (size_t i = 0; i < nq; i++)
                q[i] = next_normal();
            for (size_t i = 0; i < nkv; i++) {
                kf[i] = next_normal();
                vf[i] = next_normal();
            }
            if (kvq_engine_seq_decode(seq, l, t, q, kf, vf, KVQ_ENGINE_F32, out, &err) != KVQ_OK)
                rc = 1;
            for (size_t i = 0; i < nq && !rc; i++)
                checksum += out[i];
        }
    if (rc) {
        fprintf(stderr, "engine_example: %s\n", err.msg);
    } else {
        const char *note = kvq_engine_weights_note(eng);
        printf("artifact weights: %s (%s)%s%s\n", kvq_engine_artifact_fingerprint(eng),
               kvq_engine_artifact_model_name(eng), note[0] ? "; " : "", note);
        printf("tokens: %lld, codebooks: %llu bytes, sequence: %llu bytes\n",
               (long long)kvq_engine_seq_length(seq, 0), (unsigned long long)kvq_engine_bytes(eng),
               (unsigned long long)kvq_engine_seq_bytes(seq));
        printf("decode checksum: %.6f (%s)\n", checksum, isfinite(checksum) ? "finite" : "NOT FINITE");
    }
    free(k);
    free(v);
    free(pos);
    free(q);
    free(out);
    free(kf);
    free(vf);
    kvq_engine_seq_free(seq);
    kvq_engine_close(eng);
    return rc;
}
