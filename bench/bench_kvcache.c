/*
 * bench/bench_kvcache.c — the decode step of full attention over each cache kind
 * (kvq/kvcache.h: LeanKV, PATS) against the runtime's f16 full-attention step
 * (kvq_retrieval, selector full, f16 cache) run in the same command: one layer shaped
 * as SmolLM2-135M's (9 query heads, 3 KV heads, head_dim 64), N cached tokens, the
 * step of one new token (append, attention of its 9 queries, LeanKV's policy step).
 * Prints per kind: the step's CPU time (best of R, process CPU time: the machine may be
 * shared), its ratio to the f16 step, the bytes the cache held per token and their
 * ratio to f16, and the bytes floor: the time to stream the bytes the cache holds (a
 * plain read of a buffer of that size, measured in the same run), with the step's ratio
 * to it.
 *
 *   build/bench/bench_kvcache [N [R]]     (defaults 2048, 20)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_common.h"
#include "kvq.h"
#include "kvq/util.h"

enum { NH = 9, NKV = 3, D = 64 };

static kvq_model_config config(void)
{
    kvq_model_id id;
    memset(&id, 0, sizeof id);
    snprintf(id.path, sizeof id.path, "synthetic");
    snprintf(id.source, sizeof id.source, "gguf");
    snprintf(id.architecture, sizeof id.architecture, "llama");
    id.n_layers = 1;
    id.dim = NH * D;
    id.hidden_dim = 4 * NH * D;
    id.n_heads = NH;
    id.n_kv_heads = NKV;
    id.head_dim = D;
    id.vocab_size = 512;
    id.context_length = 1 << 20;
    id.norm_eps = 1e-5;
    id.rope = kvq_rope_default(D);
    return kvq_model_config_from_id(&id);
}

typedef struct seq {
    int64_t n;
    float *q, *k, *v, *out;
    int64_t *pos;
} seq;

static void die(const char *what, const kvq_err *e)
{
    fprintf(stderr, "bench_kvcache: %s: %s\n", what, e->msg);
    exit(1);
}

/* Prefills tokens [0, N) in one call, then times steps N, N+1, ...: the best of R. */
static double time_steps(const kvq_attn_backend *b, const seq *s, int64_t N, int R)
{
    kvq_err e = {0};
    b->reset(b->user);
    kvq_attn_call c = {.layer = 0, .n = (int32_t)N, .pos = s->pos, .q = s->q, .k = s->k,
                       .v = s->v, .out = s->out};
    if (b->attend(b->user, &c, &e))
        die("prefill", &e);
    double best = INFINITY;
    for (int r = 0; r < R; r++) {
        const int64_t t = N + r;
        kvq_attn_call d = {.layer = 0, .n = 1, .pos = s->pos + t, .q = s->q + t * NH * D,
                           .k = s->k + t * NKV * D, .v = s->v + t * NKV * D,
                           .out = s->out + t * NH * D};
        const double t0 = bench_cpu_now();
        if (b->attend(b->user, &d, &e))
            die("step", &e);
        const double dt = bench_cpu_now() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

/* The bytes floor: the best of R streaming reads of `bytes` bytes (a sum of 64-bit
 * words, so that nothing is skipped), in seconds. */
static double time_floor(size_t bytes, int R)
{
    const size_t nw = bytes / 8 + 1;
    uint64_t *buf = malloc(nw * 8), sink = 0;
    for (size_t i = 0; i < nw; i++)
        buf[i] = i * 0x9e3779b97f4a7c15ull;
    double best = INFINITY;
    for (int r = 0; r < R; r++) {
        const double t0 = bench_cpu_now();
        uint64_t s = 0;
        for (size_t i = 0; i < nw; i++)
            s += buf[i];
        const double dt = bench_cpu_now() - t0;
        sink ^= s;
        best = dt < best ? dt : best;
    }
    free(buf);
    return sink == 42 ? best * 1.0000001 : best; /* sink used */
}

int main(int argc, char **argv)
{
    const int64_t N = argc > 1 ? atoll(argv[1]) : 2048;
    const int R = argc > 2 ? atoi(argv[2]) : 20;
    if (N < 2 || R < 1) {
        fprintf(stderr, "usage: bench_kvcache [N >= 2 [R >= 1]]\n");
        return 2;
    }
    const kvq_model_config cfg = config();
    seq s = {.n = N + R};
    kvq_rng rng;
    kvq_rng_seed(&rng, 7);
    s.q = malloc(sizeof(float) * (size_t)s.n * NH * D);
    s.k = malloc(sizeof(float) * (size_t)s.n * NKV * D);
    s.v = malloc(sizeof(float) * (size_t)s.n * NKV * D);
    s.out = malloc(sizeof(float) * (size_t)s.n * NH * D);
    s.pos = malloc(sizeof(int64_t) * (size_t)s.n);
    for (int64_t i = 0; i < s.n * NH * D; i++)
        s.q[i] = (float)kvq_rng_normal(&rng);
    for (int64_t i = 0; i < s.n * NKV * D; i++) {
        s.k[i] = (float)kvq_rng_normal(&rng);
        s.v[i] = (float)kvq_rng_normal(&rng);
    }
    for (int64_t i = 0; i < s.n; i++)
        s.pos[i] = i;
    kvq_err e = {0};

    /* the f16 baseline: the runtime's full-attention step over an f16 cache */
    kvq_retrieval_params rp = kvq_retrieval_params_default();
    rp.selector = KVQ_SELECT_FULL;
    rp.cache_dtype = KVQ_DT_F16;
    rp.max_tokens = s.n;
    rp.threads = 1;
    kvq_retrieval *ret = NULL;
    if (kvq_retrieval_create(&cfg, NULL, &rp, &ret, &e))
        die("f16 baseline", &e);
    const kvq_attn_backend fb = kvq_retrieval_backend(ret);
    const double t_f16 = time_steps(&fb, &s, N, R);
    const double f16_bytes = 2.0 * 2 * D * NKV; /* per token */
    printf("bench_kvcache: N %lld cached tokens, one layer of 9 query / 3 KV heads, d 64, "
           "best of %d steps, CPU time\n", (long long)N, R);
    const double fl_f16 = time_floor((size_t)(f16_bytes * (double)N), 4 * R);
    printf("%-34s %10s %8s %12s %8s %9s %8s\n", "cache", "step us", "x f16", "bytes/token",
           "x f16", "floor us", "x floor");
    printf("%-34s %10.1f %8.2f %12.1f %8.3f %9.1f %8.2f\n", "f16 (runtime, selector full)",
           1e6 * t_f16, 1.0, f16_bytes, 1.0, 1e6 * fl_f16, t_f16 / fl_f16);

    static const struct { const char *name; kvq_kv_kind kind; double ah, al; int32_t b0, b1; } rows[] = {
        {"leankv alpha 0/0 (all K8V4)", KVQ_KV_LEANKV, 0, 0, 0, 0},
        {"leankv alpha 1/0.02", KVQ_KV_LEANKV, 1, 0.02, 0, 0},
        {"pats middle-heavy 2..8", KVQ_KV_PATS, 0, 0, 2, 8},
        {"pats middle-heavy 8..8", KVQ_KV_PATS, 0, 0, 8, 8},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        kvq_kvcache_params p = kvq_kvcache_params_default();
        p.kind = rows[i].kind;
        p.alpha_h = rows[i].ah, p.alpha_l = rows[i].al, p.window = 64;
        p.b_min = rows[i].b0, p.b_max = rows[i].b1;
        p.prompt_tokens = N; /* the prefill is the prompt; the timed steps generate */
        p.max_tokens = s.n;
        p.threads = 1;
        kvq_kvcache *kc = NULL;
        if (kvq_kvcache_create(&cfg, &p, &kc, &e))
            die(rows[i].name, &e);
        const kvq_attn_backend b = kvq_kvcache_backend(kc);
        const double t = time_steps(&b, &s, N, R);
        kvq_kvcache_memory m;
        kvq_kvcache_memory_get(kc, &m);
        const double bpt = m.bytes / m.tokens;
        const double fl = time_floor((size_t)m.bytes, 4 * R);
        printf("%-34s %10.1f %8.2f %12.1f %8.3f %9.1f %8.2f\n", rows[i].name, 1e6 * t, t / t_f16,
               bpt, bpt / f16_bytes, 1e6 * fl, t / fl);
        kvq_kvcache_free(kc);
    }
    kvq_retrieval_free(ret);
    free(s.q), free(s.k), free(s.v), free(s.out), free(s.pos);
    return 0;
}
