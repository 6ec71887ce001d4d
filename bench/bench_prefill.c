/* bench_prefill.c — capture-style prefill throughput of the forward pass.
 *
 * "Capture-style": sequences of --seq-len tokens in chunks of --chunk, an observer
 * that reads every pre-RoPE q/k/v (as kvq capture does), no output layer. Reports
 * tokens/s and the achieved FLOP rate as a fraction of the cblas_sgemm rate measured
 * in the same run on the model's largest projection shape ([chunk, dim] x [dim, hidden]).
 *
 * FLOPs counted per token: 2 x (projection and MLP weights) per layer, plus causal
 * attention 4 x n_heads x head_dim x (position + 1) per layer.
 *
 * usage: bench_prefill [--model PATH] [--seq-len N] [--seqs N] [--chunk N] [--threads N]
 *   Without --model: stories260K ($KVQ_TEST_MODEL or ../shared/models/stories260K.gguf)
 *   and a random f16 model of dim 1024, 8 layers, 16 heads, 4 KV heads, hidden 2816
 *   written to a temporary GGUF file. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvq/gguf.h"
#include "kvq/half.h"
#include "kvq/model.h"
#include "kvq/util.h"

typedef struct bench_opts {
    int seq_len, seqs, chunk, threads;
} bench_opts;

/* ---- a random GGUF llama ------------------------------------------------------ */

static int add_f16(kvq_gguf_writer *w, const char *name, int64_t rows, int64_t cols,
                   kvq_rng *r, kvq_err *e)
{
    size_t n = (size_t)(rows * cols);
    float *x = malloc(n * sizeof(float));
    uint16_t *h = malloc(n * sizeof(uint16_t));
    int rc = -1;
    if (x && h) {
        const double a = 1.0 / sqrt((double)cols);
        for (size_t i = 0; i < n; i++)
            x[i] = (float)((2 * kvq_rng_uniform(r) - 1) * a);
        kvq_f32_to_f16(x, h, n);
        int64_t ne[2] = {cols, rows};
        rc = kvq_gguf_writer_add_tensor(w, name, KVQ_GGML_F16, 2, ne, h, n * 2, e) ? -1 : 0;
    }
    free(x);
    free(h);
    return rc;
}

static int add_ones(kvq_gguf_writer *w, const char *name, int64_t n, kvq_err *e)
{
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; x && i < n; i++)
        x[i] = 1.0f;
    int64_t ne[1] = {n};
    int rc = x && !kvq_gguf_writer_add_tensor(w, name, KVQ_GGML_F32, 1, ne, x,
                                              (size_t)n * sizeof(float), e) ? 0 : -1;
    free(x);
    return rc;
}

static int set_u32(kvq_gguf_writer *w, const char *key, uint64_t v, kvq_err *e)
{
    kvq_gguf_value val = {.type = KVQ_GGUF_UINT32};
    val.v.u = v;
    return kvq_gguf_writer_set(w, key, &val, e) ? -1 : 0;
}

static int write_random_model(const char *path, kvq_err *e)
{
    const int dim = 1024, layers = 8, heads = 16, kv_heads = 4, hidden = 2816, vocab = 1024;
    const int hd = dim / heads;
    kvq_rng r;
    kvq_rng_seed(&r, 1);
    kvq_gguf_writer *w = kvq_gguf_writer_new();
    kvq_gguf_value arch = {.type = KVQ_GGUF_STRING};
    arch.v.str.s = "llama";
    arch.v.str.len = 5;
    kvq_gguf_value eps = {.type = KVQ_GGUF_FLOAT32};
    eps.v.f = 1e-5;
    int rc = -1;
    if (!w || kvq_gguf_writer_set(w, "general.architecture", &arch, e) ||
        set_u32(w, "llama.context_length", 4096, e) || set_u32(w, "llama.embedding_length", dim, e) ||
        set_u32(w, "llama.feed_forward_length", hidden, e) || set_u32(w, "llama.block_count", layers, e) ||
        set_u32(w, "llama.attention.head_count", heads, e) ||
        set_u32(w, "llama.attention.head_count_kv", kv_heads, e) ||
        kvq_gguf_writer_set(w, "llama.attention.layer_norm_rms_epsilon", &eps, e) ||
        add_f16(w, "token_embd.weight", vocab, dim, &r, e) || add_ones(w, "output_norm.weight", dim, e))
        goto done;
    for (int l = 0; l < layers; l++) {
        char n[9][64];
        static const char *const sfx[9] = {"attn_q.weight", "attn_k.weight", "attn_v.weight",
                                           "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                                           "ffn_down.weight", "attn_norm.weight", "ffn_norm.weight"};
        for (int i = 0; i < 9; i++)
            snprintf(n[i], sizeof n[i], "blk.%d.%s", l, sfx[i]);
        if (add_f16(w, n[0], heads * hd, dim, &r, e) || add_f16(w, n[1], kv_heads * hd, dim, &r, e) ||
            add_f16(w, n[2], kv_heads * hd, dim, &r, e) || add_f16(w, n[3], dim, heads * hd, &r, e) ||
            add_f16(w, n[4], hidden, dim, &r, e) || add_f16(w, n[5], hidden, dim, &r, e) ||
            add_f16(w, n[6], dim, hidden, &r, e) || add_ones(w, n[7], dim, e) ||
            add_ones(w, n[8], dim, e))
            goto done;
    }
    rc = kvq_gguf_writer_write(w, path, 1, e) ? -1 : 0;
done:
    kvq_gguf_writer_free(w);
    return rc;
}

/* ---- measurement ----------------------------------------------------------------- */

/* An observer that reads q, k, v as capture does (a checksum keeps it from being
 * optimized away). */
static kvq_status observe(void *user, const kvq_attn_call *c, kvq_err *err)
{
    double *sum = user;
    (void)err;
    *sum += c->q[0] + c->k[0] + c->v[0];
    return KVQ_OK;
}

/* Best-of-5 GFLOP/s of C [m, n] = A [m, k] B^T, as the forward pass calls it. */
static double sgemm_gflops(int m, int n, int k)
{
    float *a = calloc((size_t)m * k, sizeof(float)), *b = calloc((size_t)n * k, sizeof(float));
    float *c = calloc((size_t)m * n, sizeof(float));
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)n * k; i++)
        b[i] = (float)(i % 5) * 0.1f;
    double best = 0;
    for (int rep = 0; rep < 6; rep++) {
        double t = kvq_now();
        int inner = 0;
        do {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f,
                        c, n);
            inner++;
        } while (kvq_now() - t < 0.1);
        double rate = 2.0 * m * n * k * inner / (kvq_now() - t) / 1e9;
        if (rep > 0 && rate > best) /* the first round warms up */
            best = rate;
    }
    free(a), free(b), free(c);
    return best;
}

static int bench_model(const char *path, const char *label, const bench_opts *o)
{
    kvq_err e = {0};
    kvq_model *m = NULL;
    kvq_forward *f = NULL;
    int rc = 1;
    if (kvq_model_open(path, NULL, &m, &e)) {
        fprintf(stderr, "bench_prefill: %s\n", e.msg);
        return 1;
    }
    const kvq_model_config *c = kvq_model_config_get(m);
    kvq_forward_params p = kvq_forward_params_default();
    p.chunk = o->chunk;
    p.threads = o->threads;
    p.max_tokens = o->seq_len;
    double t_load = kvq_now();
    if (kvq_forward_create(m, &p, &f, &e)) {
        fprintf(stderr, "bench_prefill: %s\n", e.msg);
        goto done;
    }
    t_load = kvq_now() - t_load;
    double checksum = 0;
    kvq_forward_set_observer(f, observe, &checksum);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)o->seq_len);
    kvq_rng r;
    kvq_rng_seed(&r, 3);
    for (int i = 0; i < o->seq_len; i++)
        toks[i] = (int32_t)kvq_rng_below(&r, (uint64_t)c->vocab_size);

    /* The sgemm reference is measured just before and just after the timed runs and
     * averaged, so that a change in machine load affects both sides alike. */
    const double ref_before = sgemm_gflops(o->chunk, c->hidden_dim, c->dim);

    /* one warm-up sequence (page-in, allocations), then the timed ones */
    double elapsed = 0;
    for (int s = 0; s <= o->seqs; s++) {
        kvq_forward_reset(f);
        double t = kvq_now();
        if (kvq_forward_tokens(f, toks, o->seq_len, KVQ_LOGITS_NONE, NULL, &e)) {
            fprintf(stderr, "bench_prefill: %s\n", e.msg);
            free(toks);
            goto done;
        }
        if (s > 0)
            elapsed += kvq_now() - t;
    }
    free(toks);

    const double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    const double w_per_layer = qd * c->dim * 2 + kvd * c->dim * 2 + 3.0 * c->hidden_dim * c->dim;
    const double L = o->seq_len;
    const double flops_seq = c->n_layers * (2.0 * w_per_layer * L + 4.0 * qd * L * (L + 1) / 2);
    const double tokens = (double)o->seq_len * o->seqs;
    const double gflops = flops_seq * o->seqs / elapsed / 1e9;
    const double ref_after = sgemm_gflops(o->chunk, c->hidden_dim, c->dim);
    const double ref = (ref_before + ref_after) / 2;
    printf("%-12s dim %d, %d layers, %d/%d heads, hidden %d; seq %d x %d, chunk %d\n", label,
           c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->hidden_dim, o->seqs, o->seq_len,
           o->chunk);
    printf("%-12s %.0f tokens/s, %.2f GFLOP/s; sgemm [%d x %d x %d] %.2f GFLOP/s (%.2f before,"
           " %.2f after); ratio %.0f%% (f32 setup %.2f s)\n",
           label, tokens / elapsed, gflops, o->chunk, c->hidden_dim, c->dim, ref, ref_before,
           ref_after, 100.0 * gflops / ref, t_load);
    rc = checksum == checksum ? 0 : 1;
done:
    kvq_forward_free(f);
    kvq_model_close(m);
    return rc;
}

int main(int argc, char **argv)
{
    bench_opts o = {.seq_len = 512, .seqs = 2, .chunk = 256, .threads = 0};
    const char *model = NULL;
    for (int i = 1; i < argc; i += 2) { /* option, value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x = 0;
        if (!v) {
            fprintf(stderr, "usage: bench_prefill [--model PATH] [--seq-len N] [--seqs N] "
                            "[--chunk N] [--threads N]\n");
            return 2;
        }
        if (!strcmp(a, "--model")) {
            model = v;
        } else if (kvq_parse_i64(v, 1, 1 << 20, &x, NULL)) {
            fprintf(stderr, "bench_prefill: %s: bad value '%s'\n", a, v);
            return 2;
        } else if (!strcmp(a, "--seq-len")) {
            o.seq_len = (int)x;
        } else if (!strcmp(a, "--seqs")) {
            o.seqs = (int)x;
        } else if (!strcmp(a, "--chunk")) {
            o.chunk = (int)x;
        } else if (!strcmp(a, "--threads")) {
            o.threads = (int)x;
        } else {
            fprintf(stderr, "bench_prefill: unknown option %s\n", a);
            return 2;
        }
    }
    if (o.threads > 0)
        openblas_set_num_threads(o.threads);
    printf("bench_prefill: BLAS threads %d\n", openblas_get_num_threads());
    if (model)
        return bench_model(model, "model", &o);

    int rc = 0;
    const char *stories = getenv("KVQ_TEST_MODEL");
    if (!stories || !*stories)
        stories = "../shared/models/stories260K.gguf";
    if (access(stories, R_OK) == 0)
        rc |= bench_model(stories, "stories260K", &o);
    else
        printf("stories260K  skipped: %s not found\n", stories);

    char path[] = "/tmp/kvq-bench-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    close(fd);
    kvq_err e = {0};
    if (write_random_model(path, &e)) {
        fprintf(stderr, "bench_prefill: %s\n", e.msg);
        unlink(path);
        return 1;
    }
    rc |= bench_model(path, "random-1024", &o);
    unlink(path);
    return rc;
}
