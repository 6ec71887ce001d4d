/*
 * bench/bench_kvcache.c — the decode step of full attention over each compressed cache
 * kind (runtime/cache/kvc.h: LeanKV, PATS) against full attention over an f16 cache,
 * run in the same command: one layer, N cached tokens, the step of one new token per KV
 * head (append, attention of the group's queries, LeanKV's policy step), the KV heads
 * on T threads as the runtime's backend runs them (kvq/kvcache.h: one head per thread
 * at a time).
 *
 *   build/bench/bench_kvcache [--contexts 2048,32768,131072] [--shape smollm2|7b|both]
 *                             [--threads 1,2] [--reps 5] [--isa scalar|avx2|avx512]
 *                             [--stages]
 *   build/bench/bench_kvcache N [R]       (the earlier form: --contexts N --reps R
 *                                          --shape smollm2 --threads 1)
 *
 * Shapes: smollm2 (9 query heads, 3 KV heads, head_dim 64: SmolLM2-135M) and 7b (32
 * query heads, 8 KV heads, head_dim 128: a 7B-like GQA model).
 *
 * Kinds:
 *   f16      f16 K and V rows, the runtime's full-attention kernels (kvq_rk_logits,
 *            kvq_rk_softmax, kvq_rk_mix over every row; runtime/retrieval.c's full path)
 *   leankv   alpha 0/0 (every token K8V4) and alpha 1/0.02 (the paper's: K8V4, K4V2 and
 *            pruned tokens), window 64
 *   pats     middle-heavy 2..8 (the profile's) and 8..8 (every row in one block at d 64)
 *
 * The caches are filled directly, in O(N): every kind's rows from the same seeded keys
 * and values, PATS by appending, LeanKV as a prompt of N tokens ended by its prompt rule
 * (kvq_rt_lk_end_prompt) over synthetic significances: sig_j = c_j / (j + 1) with
 * c_j = exp(2.08 z), z standard normal, so that alpha 1/0.02 gives about the class mix
 * measured on SmolLM2 at 2K (half the tokens HIGH, 3% pruned; docs/kvcache.md), instead
 * of attending the prompt (O(N^2)).
 *
 * Per repetition (kinds and thread counts alternated, caches flushed before each step:
 * a decode step meets each layer's cache cold): the step's time is the largest of the
 * threads' own CPU times (CLOCK_THREAD_CPUTIME_ID, each up to the end of its share), so
 * on a shared machine neither another process holding the core nor a thread waiting
 * counts; the best repetition is printed. Bytes read: the rows the step reads (K and V
 * of every kept token) and the per-token state it walks (LeanKV: the kept tokens' row
 * list, attention sums, query counts, significances and classes, the pruned tokens' list,
 * sums, query counts and significances; PATS: the row lists and widths); the floor is those bytes at the streaming read rate of T threads (a sum over
 * 256 MiB, measured in the same run, best of the repetitions).
 *
 * --stages times the readers alone on the step's rows, one thread, every head, caches
 * flushed before the logits (keys) and the mix (values), softmax between; and for
 * LeanKV the best one-thread step's parts (when the first thread count is 1): append
 * (a K8V4 row), attend (logits, softmax, the attention sums with the kept tokens'
 * significance and Algorithm 1's candidates, mix) and the policy step (the pruned tokens'
 * significance, Algorithm 1's choice, the downgrade with its row list update).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_common.h"
#include "kvq.h"
#include "kvq/half.h"
#include "kvq/util.h"
#include "runtime/cache/kvc.h"
#include "runtime/kernels/rk.h"

#define MAX_T 16
#define MAX_KV 8
#define N_KINDS 5
#define STREAM_BYTES ((size_t)256 << 20)

typedef struct shape {
    const char *name;
    int32_t nh, nkv, d;
} shape;

static const shape shapes[] = {{"smollm2", 9, 3, 64}, {"7b", 32, 8, 128}};

static const char *const kind_names[N_KINDS] = {
    "f16", "leankv 0/0", "leankv 1/0.02", "pats mid 2..8", "pats mid 8..8",
};

typedef struct bench {
    shape s;
    int64_t N, cap;   /* cached tokens, room for N + reps */
    int gs;
    kvq_isa isa;
    uint16_t *k16[MAX_KV], *v16[MAX_KV]; /* f16 [cap, d] */
    float *p16[MAX_KV];                  /* [gs, cap] */
    kvq_rt_lk_head lk[2][MAX_KV];
    kvq_rt_pats_head pt[2][MAX_KV];
    int64_t n16;                         /* tokens in the f16 cache */
    float *q, *k, *v, *o;                /* the step's token: [nh d], [nkv d], [nkv d], [nh d] */
} bench;

static double g_tt[MAX_T];
static double g_part[MAX_KV][3]; /* per head: LeanKV append, attend, policy step (seconds) */

static double thread_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double region_time(int T)
{
    double m = 0;
    for (int i = 0; i < T; i++)
        m = g_tt[i] > m ? g_tt[i] : m;
    return m;
}

static void die(const char *what, const kvq_err *e)
{
    fprintf(stderr, "bench_kvcache: %s: %s\n", what, e->msg);
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "bench_kvcache: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* Uniform in about [-sqrt 3, sqrt 3) (unit variance), cheap. */
static float unit(kvq_rng *r)
{
    return (float)((double)(kvq_rng_u64(r) >> 40) * (3.4641016151377544 / 16777216.0) -
                   1.7320508075688772);
}

/* ---- filling ------------------------------------------------------------------------- */

static void fill(bench *B, uint64_t seed)
{
    const int32_t d = B->s.d, gs = B->gs;
    kvq_err e = {0};
    kvq_rt_lk_params lp[2];
    for (int i = 0; i < 2; i++) {
        lp[i] = kvq_rt_lk_params_default();
        lp[i].window = 64;
        lp[i].alpha_h = i ? 1.0 : 0.0;
        lp[i].alpha_l = i ? 0.02 : 0.0;
    }
    const kvq_rt_pats_params pp[2] = {{KVQ_RT_PATS_MIDDLE_HEAVY, 2, 8},
                                      {KVQ_RT_PATS_MIDDLE_HEAVY, 8, 8}};
    float *k = xmalloc(sizeof(float) * (size_t)d), *v = xmalloc(sizeof(float) * (size_t)d);
    for (int h = 0; h < B->s.nkv; h++) {
        kvq_rng r;
        kvq_rng_seed(&r, seed * 1000 + (uint64_t)h);
        B->k16[h] = bench_cache_alloc(sizeof(uint16_t) * (size_t)B->cap * d);
        B->v16[h] = bench_cache_alloc(sizeof(uint16_t) * (size_t)B->cap * d);
        B->p16[h] = xmalloc(sizeof(float) * (size_t)B->cap * gs);
        for (int i = 0; i < 2; i++) {
            if (kvq_rt_lk_head_init(&B->lk[i][h], d, gs, &lp[i], &e) ||
                kvq_rt_pats_head_init(&B->pt[i][h], d, gs, B->cap, &pp[i], &e))
                die("init", &e);
        }
        for (int64_t j = 0; j < B->N; j++) {
            for (int32_t t = 0; t < d; t++) {
                k[t] = unit(&r);
                v[t] = unit(&r);
            }
            kvq_f32_to_f16(k, B->k16[h] + (size_t)j * d, (size_t)d);
            kvq_f32_to_f16(v, B->v16[h] + (size_t)j * d, (size_t)d);
            for (int i = 0; i < 2; i++)
                if (kvq_rt_lk_append(&B->lk[i][h], k, v, &e) ||
                    kvq_rt_pats_append(&B->pt[i][h], k, v, &e))
                    die("append", &e);
        }
        for (int i = 0; i < 2; i++) { /* the prompt rule over synthetic significances */
            kvq_rt_lk_head *H = &B->lk[i][h];
            kvq_rng rs;
            kvq_rng_seed(&rs, seed * 1000 + 500 + (uint64_t)h);
            for (int64_t j = 0; j < H->n; j++) {
                const double c = exp(2.08 * kvq_rng_normal(&rs));
                for (int g = 0; g < gs; g++)
                    H->acc[(size_t)j * gs + g] = g ? 0 : c / (double)(j + 1);
                H->qcum[j] = 0;
            }
            H->nq = 2; /* one query counted after each token: sig_j = acc[j, 0] */
            if (kvq_rt_lk_end_prompt(H, &e))
                die("end of prompt", &e);
        }
    }
    B->n16 = B->N;
    free(k);
    free(v);
}

static void release(bench *B)
{
    for (int h = 0; h < B->s.nkv; h++) {
        free(B->k16[h]);
        free(B->v16[h]);
        free(B->p16[h]);
        for (int i = 0; i < 2; i++) {
            kvq_rt_lk_head_free(&B->lk[i][h]);
            kvq_rt_pats_head_free(&B->pt[i][h]);
        }
    }
}

/* ---- one step ------------------------------------------------------------------------ */

static void f16_head(bench *B, int h, int64_t n)
{
    const int32_t d = B->s.d, gs = B->gs;
    const float scale = 1.0f / sqrtf((float)d);
    kvq_f32_to_f16(B->k + (size_t)h * d, B->k16[h] + (size_t)n * d, (size_t)d);
    kvq_f32_to_f16(B->v + (size_t)h * d, B->v16[h] + (size_t)n * d, (size_t)d);
    const float *q = B->q + (size_t)h * gs * d;
    float *p = B->p16[h], *o = B->o + (size_t)h * gs * d;
    kvq_rk_logits(B->isa, q, gs, d, B->k16[h], KVQ_DT_F16, d, NULL, n + 1, scale, p, B->cap);
    kvq_rk_softmax(B->isa, p, gs, n + 1, B->cap);
    kvq_rk_mix(B->isa, p, gs, B->cap, B->v16[h], KVQ_DT_F16, d, NULL, n + 1, d, o);
}

static void kind_head(bench *B, int kind, int h)
{
    const int32_t d = B->s.d, gs = B->gs;
    const float scale = 1.0f / sqrtf((float)d);
    const float *k = B->k + (size_t)h * d, *v = B->v + (size_t)h * d;
    const float *q = B->q + (size_t)h * gs * d;
    float *o = B->o + (size_t)h * gs * d;
    kvq_err e = {0};
    if (kind == 0) {
        f16_head(B, h, B->n16);
        return;
    }
    if (kind <= 2) {
        kvq_rt_lk_head *H = &B->lk[kind - 1][h];
        H->isa = B->isa;
        const double t0 = thread_now();
        if (kvq_rt_lk_append(H, k, v, &e))
            die("leankv append", &e);
        const double t1 = thread_now();
        kvq_rt_lk_attend(H, q, scale, o);
        const double t2 = thread_now();
        if (kvq_rt_lk_step(H, &e))
            die("leankv step", &e);
        g_part[h][0] = t1 - t0, g_part[h][1] = t2 - t1, g_part[h][2] = thread_now() - t2;
        return;
    }
    kvq_rt_pats_head *P = &B->pt[kind - 3][h];
    P->isa = B->isa;
    if (kvq_rt_pats_append(P, k, v, &e))
        die("pats append", &e);
    kvq_rt_pats_attend(P, q, scale, o);
}

/* One step of `kind` on T threads: the largest thread time. */
static double step(bench *B, int kind, int T)
{
    const int nkv = B->s.nkv;
#pragma omp parallel num_threads(T)
    {
        const double t0 = thread_now();
#pragma omp for schedule(dynamic, 1) nowait
        for (int h = 0; h < nkv; h++)
            kind_head(B, kind, h);
        g_tt[omp_get_thread_num()] = thread_now() - t0;
    }
    if (kind == 0)
        B->n16++;
    return region_time(T);
}

/* ---- bytes --------------------------------------------------------------------------- */

/* Bytes a step of `kind` reads: rows (*rows) and in all (rows + per-token state). */
static double step_bytes(const bench *B, int kind, double *rows)
{
    const int32_t d = B->s.d, gs = B->gs;
    double r = 0, st = 0;
    for (int h = 0; h < B->s.nkv; h++) {
        if (kind == 0) {
            r += (double)B->n16 * 4.0 * d;
        } else if (kind <= 2) {
            const kvq_rt_lk_head *H = &B->lk[kind - 1][h];
            double lo, hi, ex;
            kvq_rt_lk_bytes(H, &lo, &hi, &ex);
            r += lo + hi;
            /* kept tokens: the list (col, kr, vr, kb, vb), acc, qcum, sig, cls; pruned
             * tokens: their list, acc, qcum, sig */
            st += (double)H->m * (4 + 8 + 8 + 1 + 1 + 8.0 * gs + 4 + 8 + 1) +
                  (double)H->npruned * (4 + 8.0 * gs + 4 + 8);
        } else {
            const kvq_rt_pats_head *P = &B->pt[kind - 3][h];
            r += (double)P->bytes;
            st += (double)P->n * (8 + 8 + 1); /* kr, vr, b */
        }
    }
    *rows = r;
    return r + st;
}

/* ---- streaming rate ------------------------------------------------------------------ */

static double read_rate(int T, uint64_t *buf)
{
    const size_t n = STREAM_BYTES / sizeof(uint64_t);
    uint64_t s = 0;
#pragma omp parallel num_threads(T) reduction(+ : s)
    {
        const double t0 = thread_now();
#pragma omp for schedule(static) nowait
        for (size_t i = 0; i < n; i++)
            s += buf[i];
        g_tt[omp_get_thread_num()] = thread_now() - t0;
    }
    bench_sink += s;
    return (double)STREAM_BYTES / region_time(T);
}

/* ---- stages -------------------------------------------------------------------------- */

/* The readers alone on one thread, every head: logits over the keys (lt), mix over the
 * values (mt), softmax (st), each from a cold cache, best of reps. */
static void stages(bench *B, int kind, int reps, uint64_t *flush, double *lt, double *st,
                   double *mt)
{
    const int32_t d = B->s.d, gs = B->gs;
    const float scale = 1.0f / sqrtf((float)d);
    *lt = *st = *mt = INFINITY;
    for (int r = 0; r < reps; r++) {
        double t[3] = {0, 0, 0};
        for (int h = 0; h < B->s.nkv; h++) {
            const float *q = B->q + (size_t)h * gs * d;
            float *o = B->o + (size_t)h * gs * d, *p;
            int64_t m = 0, ld;
            kvq_rt_lk_head *H = kind >= 1 && kind <= 2 ? &B->lk[kind - 1][h] : NULL;
            kvq_rt_pats_head *P = kind >= 3 ? &B->pt[kind - 3][h] : NULL;
            float qs[64];
            if (H) { /* the kept rows: the step's list */
                if (H->list_stale) /* a pool moved since the last step: made at the next */
                    for (int64_t j = 0; j < H->n; j++) {
                        const int c = H->cls[j];
                        if (c == KVQ_RT_LK_PRUNED)
                            continue;
                        H->kr[m] = H->pool[c].data + (size_t)H->slot[j] * H->pool[c].row;
                        H->vr[m] = H->kr[m] + H->pool[c].krow;
                        H->kb[m] = (int8_t)H->pool[c].kb;
                        H->vb[m] = (int8_t)H->pool[c].vb;
                        H->col[m++] = (int32_t)j;
                    }
                else
                    m = H->m;
                for (int g = 0; g < gs; g++)
                    qs[g] = kvq_rk_qsum(q + (size_t)g * d, d);
                p = H->p_, ld = H->cap;
            } else if (P) {
                m = P->n, p = P->p_, ld = P->T;
            } else {
                m = B->n16, p = B->p16[h], ld = B->cap;
            }
            bench_flush_caches(flush);
            double t0 = thread_now();
            if (H)
                kvq_rk_lkq_logits(B->isa, q, gs, d, qs, H->kr, H->kb, m, d, scale, p, ld);
            else if (P)
                kvq_rk_pats_logits(B->isa, q, gs, d, P->kr, P->b, m, d, scale, p, ld);
            else
                kvq_rk_logits(B->isa, q, gs, d, B->k16[h], KVQ_DT_F16, d, NULL, m, scale, p, ld);
            t[0] += thread_now() - t0;
            t0 = thread_now();
            kvq_rk_softmax(B->isa, p, gs, m, ld);
            t[1] += thread_now() - t0;
            bench_flush_caches(flush);
            memset(o, 0, sizeof(float) * (size_t)gs * d);
            t0 = thread_now();
            if (H)
                kvq_rk_lkq_mix(B->isa, p, gs, ld, H->vr, H->vb, m, d, o, d);
            else if (P)
                kvq_rk_pats_mix(B->isa, p, gs, ld, P->vr, P->b, m, d, o, d);
            else
                kvq_rk_mix(B->isa, p, gs, ld, B->v16[h], KVQ_DT_F16, d, NULL, m, d, o);
            t[2] += thread_now() - t0;
        }
        *lt = t[0] < *lt ? t[0] : *lt;
        *st = t[1] < *st ? t[1] : *st;
        *mt = t[2] < *mt ? t[2] : *mt;
    }
}

/* ---- main ---------------------------------------------------------------------------- */

typedef struct args {
    int64_t ctx[8];
    int nctx;
    int64_t tl[MAX_T];
    int nt;
    int shape_mask; /* 1 smollm2, 2 7b */
    int64_t reps;
    int stages;
    kvq_isa isa;
} args;

static int parse_list(const char *v, int64_t lo, int64_t hi, int64_t *out, int max, int *n)
{
    char buf[256];
    kvq_err e = {0};
    snprintf(buf, sizeof buf, "%s", v);
    *n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == max || kvq_parse_i64(tok, lo, hi, &out[*n], &e))
            return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_kvcache [--contexts N,...] [--shape smollm2|7b|both] "
                    "[--threads T,...] [--reps R] [--isa scalar|avx2|avx512] [--stages]\n");
    return 2;
}

static int parse(int argc, char **argv, args *a)
{
    kvq_err e = {0};
    a->ctx[0] = 2048, a->ctx[1] = 32768, a->ctx[2] = 131072, a->nctx = 3;
    a->tl[0] = 1, a->tl[1] = 2, a->nt = 2;
    a->shape_mask = 3, a->reps = 5, a->stages = 0, a->isa = kvq_isa_best();
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--stages")) {
            a->stages = 1;
            continue;
        }
        if (!v)
            return -1;
        i++;
        if (!strcmp(o, "--contexts") ? parse_list(v, 128, (int64_t)1 << 22, a->ctx, 8, &a->nctx)
            : !strcmp(o, "--threads") ? parse_list(v, 1, MAX_T, a->tl, MAX_T, &a->nt)
            : !strcmp(o, "--reps")    ? (kvq_parse_i64(v, 1, 1000, &a->reps, &e) ? -1 : 0)
                                      : 1) {
            if (strcmp(o, "--shape") && strcmp(o, "--isa"))
                return -1;
            if (!strcmp(o, "--shape"))
                a->shape_mask = !strcmp(v, "smollm2") ? 1 : !strcmp(v, "7b") ? 2
                                : !strcmp(v, "both") ? 3 : 0;
            else
                a->isa = !strcmp(v, "scalar") ? KVQ_ISA_SCALAR : !strcmp(v, "avx2") ? KVQ_ISA_AVX2
                         : !strcmp(v, "avx512") ? KVQ_ISA_AVX512 : (kvq_isa)-1;
            if (!a->shape_mask || (int)a->isa < 0)
                return -1;
        }
    }
    a->isa = kvq_isa_clamp(a->isa);
    return 0;
}

/* The earlier form, bench_kvcache [N [R]]: SmolLM2's shape at N tokens, one thread. */
static int parse_old(int argc, char **argv, args *a)
{
    kvq_err e = {0};
    if (parse(1, argv, a))
        return -1;
    a->shape_mask = 1, a->nt = 1, a->nctx = 1;
    if (kvq_parse_i64(argv[1], 128, (int64_t)1 << 22, &a->ctx[0], &e))
        return -1;
    return argc > 2 && kvq_parse_i64(argv[2], 1, 1000, &a->reps, &e) ? -1 : 0;
}

/* One shape at one context: fill, then the repetitions alternated, then the table. */
static void run(const args *a, const shape *s, int64_t N, uint64_t *flush, uint64_t *stream)
{
    static bench B;
    memset(&B, 0, sizeof B);
    B.s = *s, B.N = N, B.gs = s->nh / s->nkv, B.isa = a->isa;
    B.cap = N + a->reps * a->nt + 8;
    B.q = xmalloc(sizeof(float) * (size_t)s->nh * s->d);
    B.o = xmalloc(sizeof(float) * (size_t)s->nh * s->d);
    B.k = xmalloc(sizeof(float) * (size_t)s->nkv * s->d);
    B.v = xmalloc(sizeof(float) * (size_t)s->nkv * s->d);
    fill(&B, (uint64_t)N);
    kvq_rng r;
    kvq_rng_seed(&r, 99);
    double best[N_KINDS][MAX_T], rate[MAX_T], part[N_KINDS][3] = {{0}};
    for (int k = 0; k < N_KINDS; k++)
        for (int t = 0; t < a->nt; t++)
            best[k][t] = INFINITY;
    for (int t = 0; t < a->nt; t++)
        rate[t] = 0;
    for (int64_t rep = 0; rep < a->reps; rep++) {
        for (int t = 0; t < a->nt; t++) {
            const double x = read_rate((int)a->tl[t], stream);
            rate[t] = x > rate[t] ? x : rate[t];
        }
        for (int t = 0; t < a->nt; t++) {
            for (int64_t i = 0; i < (int64_t)s->nh * s->d; i++)
                B.q[i] = unit(&r);
            for (int64_t i = 0; i < (int64_t)s->nkv * s->d; i++)
                B.k[i] = unit(&r), B.v[i] = unit(&r);
            for (int k = 0; k < N_KINDS; k++) {
                bench_flush_caches(flush);
                const double x = step(&B, k, (int)a->tl[t]);
                if (x < best[k][t] && a->tl[t] == 1) /* the best one-thread step's parts */
                    for (int j = 0; j < 3; j++) {
                        part[k][j] = 0;
                        for (int h = 0; h < s->nkv; h++)
                            part[k][j] += g_part[h][j];
                    }
                best[k][t] = x < best[k][t] ? x : best[k][t];
            }
        }
    }
    for (int t = 0; t < a->nt; t++)
        for (int k = 0; k < N_KINDS; k++) {
            double rows, r0;
            const double by = step_bytes(&B, k, &rows), fl = by / rate[t];
            const double by0 = step_bytes(&B, 0, &r0);
            printf("%-8s %7lld %2lld  %-14s %9.1f %6.2f %9.2f %9.2f %6.3f %9.1f %6.2f\n", s->name,
                   (long long)N, (long long)a->tl[t], kind_names[k], 1e6 * best[k][t],
                   best[k][t] / best[0][t], rows / 1048576.0, by / 1048576.0,
                   by / by0, 1e6 * fl, best[k][t] / fl);
        }
    for (int t = 0; t < a->nt; t++)
        printf("#  %s N %lld T %lld: streaming read %.2f GB/s\n", s->name, (long long)N,
               (long long)a->tl[t], rate[t] / 1e9);
    for (int k = 0; a->stages && k < N_KINDS; k++) {
        double lt, st, mt;
        stages(&B, k, (int)a->reps, flush, &lt, &st, &mt);
        printf("#  stages %s N %lld %-14s logits %9.1f us  softmax %8.1f us  mix %9.1f us  "
               "(1 thread, step %9.1f us", s->name, (long long)N, kind_names[k], 1e6 * lt,
               1e6 * st, 1e6 * mt, 1e6 * best[k][0]);
        if (k >= 1 && k <= 2 && a->tl[0] == 1)
            printf(": append %.1f, attend %.1f, policy %.1f", 1e6 * part[k][0], 1e6 * part[k][1],
                   1e6 * part[k][2]);
        printf(")\n");
    }
    release(&B);
    free(B.q), free(B.o), free(B.k), free(B.v);
}

int main(int argc, char **argv)
{
    args a;
    if (argc > 1 && argv[1][0] != '-' ? parse_old(argc, argv, &a) : parse(argc, argv, &a))
        return usage();
    uint64_t *flush = bench_cache_alloc(BENCH_FLUSH_BYTES);
    uint64_t *stream = bench_cache_alloc(STREAM_BYTES);
    if (!flush || !stream)
        return 1;
    memset(flush, 1, BENCH_FLUSH_BYTES);
    for (size_t i = 0; i < STREAM_BYTES / 8; i++)
        stream[i] = i;
    printf("bench_kvcache: one layer's decode step, best of %lld (kinds and threads "
           "alternated, cold caches), thread CPU time; isa %s\n", (long long)a.reps,
           a.isa == KVQ_ISA_AVX512 ? "avx512" : a.isa == KVQ_ISA_AVX2 ? "avx2" : "scalar");
    printf("%-8s %7s %2s  %-14s %9s %6s %9s %9s %6s %9s %6s\n", "shape", "N", "T", "kind",
           "step us", "x f16", "rows MiB", "read MiB", "x f16", "floor us", "x flr");
    for (int si = 0; si < 2; si++)
        for (int c = 0; c < a.nctx && (a.shape_mask >> si & 1); c++)
            run(&a, &shapes[si], a.ctx[c], flush, stream);
    free(flush);
    free(stream);
    return 0;
}
