/*
 * bench_decode.c — one decode step of one attention layer: full attention over an f16
 * KV cache against VQ retrieval attention, at long contexts. (The compressed caches'
 * step, LeanKV and PATS, against the f16 step and their bytes floors: bench_kvcache.c.)
 *
 *   bench_decode [--contexts 4096,16384,65536,131072] [--budget 0.06] [--codebook 4096]
 *                [--reps 5] [--threads 1|LIST] [--isa scalar|avx2|avx512] [--seed S]
 *                [--attn fused|twopass] [--select auto|codes|scores] [--order code|token]
 *                [--clock cpu|thread|wall] [--stat median|best] [--score rb|bands]
 *                [--rerank R] [--positions wrope|rope] [--resid-wide W]
 *                [--resid-path fast|exact] [--resid-group sum|max] [--groups pieces|all]
 *                [--pipeline off|on] [--preset smollm2]
 *
 * The issue 35 figures (docs/runtime.md "The step against its floors"):
 *   bench_decode --preset smollm2 --contexts 32768,131072 --threads 1,2 --clock thread
 *                --stat best --reps 5 [--order token]
 * --threads 1,2 runs the thread counts alternately within each repetition (full
 * attention, the retrieval step, the rows' plain loads, each at T threads), with the
 * bandwidths measured per T. --clock thread times a parallel region by the largest of
 * its threads' own CPU times (each up to the end of its share, before the barrier): on a
 * shared machine neither another process holding the core nor a thread's wait counts.
 * --stat best reports the best repetition instead of the median. Per thread count a
 * summary line: the step, its bytes floor (its bytes at the streaming rate of that T),
 * the ratio, the speedup over full attention; the residual stage's kernel at its
 * in-cache rate (stage_in_cache) times every candidate it scores, a compute bound its
 * bits fix; and every row the step reads by index (the rerank's key rows, the sinks'
 * and window's keys, the attended value rows) read alone with plain loads, so the bound
 * "the stage's work + those rows at their plain-load rate + the rest streamed".
 * --groups all makes the rows' (code, band) groups of the stage over every candidate in
 * one array first (the runtime before issue 35; pieces, the default, as it does now:
 * kvq_rk_bands_cursor, 1,024 rows at a time in L1). --pipeline on is an experiment, not
 * the runtime: each thread's heads in one pipeline, a head's stage prefetching the
 * previous head's rerank rows between pieces of its kernel (decision 022: slower). The
 * output's FNV-1a hash is printed: the same bits for every one of these options.
 *
 * Shape: 32 query heads, 8 KV heads (GQA groups of 4), head dim 128; synthetic keys,
 * values and queries (seeded, unit variance), random codes and a random 4096-entry codebook
 * per KV head (the speed does not depend on what the codes say).
 *
 * full       per KV head: logits of the group's 4 (post-RoPE) queries against every
 *            cached key, softmax, weighted sum of every value: K and V read once each
 *            (kvq_rk_logits / kvq_rk_softmax / kvq_rk_mix on all rows, f16).
 * retrieval  the runtime's decode step (runtime/step.c) with the same kernels:
 *            the group's scoring query (sum of q R_b), its LUT from the f16 table,
 *            the top-K (K = budget x n) of the candidates from their codes
 *            (kvq_rk_code_counts from the per-code counts the cache keeps, then
 *            kvq_rk_topk_codes: one pass over the codes), then exact attention over
 *            4 sinks + the K selected + the 64-token window (window keys rotated by
 *            their positions, the others scored with q R_b).
 * --select scores selects as multi-group codebooks must instead: score gather
 * (kvq_rk_score) then kvq_rk_topk over the scores; the same tokens either way. The
 * default (auto) chooses as the runtime does (kvq_rk_codes_select_pays: codes once
 * the candidates outnumber the codebook's entries four to one).
 * Row order: as the runtime keeps them after a long prompt (kvq/runtime.h "Row
 * order"), the candidates' rows are sorted by code (kvq_rk_code_order; K, V and codes
 * moved together), so a step's selected rows come in runs of one code; --order token
 * keeps them in token order (the scattered rows the selection gives without it).
 * --attn fused runs both with the one-pass kvq_rk_attend_rows kernel instead.
 * --score bands scores as the runtime's --score-pos bands does (runtime/select/codebook/score_pos.c): one
 * LUT per doubling band of distances [w, 2w), [2w, 4w), ..., each candidate scored with
 * its band's LUT, built from the group's summed query rotated by the band's mean
 * rotation (made before the timed step: the runtime makes them once per step for all
 * layers and heads). In code order (the runtime's path, runtime/select/codebook/score_pos.c
 * kvq_rt_banded_select: eight bands' LUTs per pass over the table, kvq_rk_lut_multi)
 * each code's run of rows
 * keeps token order and splits into one sub-run per band, and every row of one
 * (code, band) group has the same score: kvq_rk_topk_bands selects from the groups
 * (a weighted threshold over K x bands, then the rows emitted group by group) without
 * a score per row, where it pays (kvq_rk_bands_select_pays; --select codes forces
 * it). --select scores gives the path before it (and what the runtime does where the
 * groups do not pay): per band (nearest first) its LUT,
 * each run walked backwards from where the nearer band stopped, its rows' scores
 * filled with the LUT entry of its code, then kvq_rk_topk over the scores; the same
 * tokens. With --order token each band is a range of rows (one score gather per band,
 * then kvq_rk_topk).
 * --rerank R (or +E) selects as the runtime's two-stage codebook selector does
 * (runtime/select/codebook/rerank.c): the top ceil(R K) (or K + ceil(E n)) by code, then the exact q R_b . k of those candidates' f16 key rows
 * (kvq_rk_logits over their indices, per query head; the group's score their sum) and
 * kvq_rk_topk keep K (timed with the top-k); the kept rows' per-head
 * logits go to the attention (two-pass: it computes the sinks' and window's only; the
 * fused kernel recomputes them); their extra key rows (ceil(R K) - K) count in the retrieval
 * bytes.
 * --positions rope attends as the runtime's `--positions rope` (what calibrate records for
 * SmolLM2): the keys are held rotated by their tokens' positions in f16 (runtime/cache/keys.c:
 * rotated once when cached, then rounded, not rotated on every read), and every attended
 * or reranked row's logit is q R_i . k_j R_j read from them by index (the default wrope:
 * q R_b on the f16 pre-RoPE keys, the window rotated on read). Its K rows count 2 D
 * bytes, as under wrope.
 * --resid-group max scores the residual stage per query head (each head's own band LUTs
 * and sign table, the best head kept; runtime/select/codebook/resid.c under --resid-group max):
 * each row's (code, band) group written by the selection (kvq_rk_topk_bands_grouped),
 * its entry in every head's LUTs, and one pass over the rows for all the heads
 * (kvq_rk_resid_scores_max), as the runtime does. Where the stage takes every candidate
 * (--resid-share 1 and W k2 >= the candidates: the first cut selects nothing) no LUT of
 * the summed query is made and the groups come from the runs alone (every row, no
 * threshold), as the runtime's kvq_rt_banded_groups does.
 * --resid-wide W (default 4; 0 turns it off) runs the codebook selector's residual stage
 * (runtime/select/codebook/resid.c) in front of the rerank (only with the rerank on): the codebook
 * picks min(ceil(W k2), --resid-share of the candidates, default half) (k2 = the
 * rerank's count), each keeps its residual from its centroid at 1 bit per channel + an
 * f32 scale (made with the cache, not timed; rotated by its token's position under
 * --positions rope), and the residual scores keep k2 (timed apart, "resid"; D/8 + 4
 * bytes per candidate). --resid-path fast (default) scores as the runtime does now: the
 * codebook's own first-stage score of the row + scale (q . signs) through the sign table
 * (kvq_rk_resid_scores; AVX-512: the nibble tables, 16 candidates a vector), the
 * first-stage scores of the (code, band) groups' rows written by the selection itself
 * (kvq_rk_topk_bands_scored, as runtime/select/codebook/score_pos.c does); --resid-path exact as it did before (per candidate: dequantize
 * its d bytes of signs, add the centroid, rotate by the token's position from a position
 * table under rope, a double dot), for a before / after in one build.
 * --preset smollm2 selects as SmolLM2's artifact and the runtime's defaults do (the qavq
 * K 256 artifact of docs/QUALITY.md, positions rope and score bands as calibrate records
 * them, and the runtime's defaults since session 8: every candidate through the best
 * head's residual stage, the rerank of the budget plus 8% of the cache): --codebook 256
 * --score bands --rerank +0.08 --positions rope --resid-wide 64 --resid-share 1
 * --resid-group max (options after it override). Before session 8 it was the sum stage
 * of at most half the candidates and rerank 2: add --rerank 2 --resid-wide 4
 * --resid-share 0.5 --resid-group sum. The shape stays the one above, not SmolLM2's (9 query heads, 3 KV heads,
 * d 64).
 * Bytes moved per step, all KV heads: full = 2 n d 2 bytes x 8 heads; retrieval =
 * LUT tables (K_cb d 2 bytes) + codes (2 bytes per candidate) + the per-code counts
 * (4 K_cb bytes, --select codes) + the attended K and V rows (2 d 2 bytes each), per KV
 * head. Scratch (scores, indices, logits) stays in cache and is not counted.
 * --threads T runs the KV heads on T threads (both steps) and measures the reference
 * bandwidths with T threads too; the clock is then the wall clock (process CPU time
 * would add the threads up).
 *
 * The K and V arrays are allocated as the runtime's cache is (2 MiB aligned, advised for
 * transparent huge pages). Every timed step starts cold: a 256 MiB buffer is streamed through the caches
 * before each repetition (not timed). Two reference bandwidths are measured in the same
 * run: memcpy of 256 MiB (read + write bytes over time) and a streaming read (a sum
 * over 256 MiB), best of the repetitions; a step only reads, so its "floor" is its
 * bytes moved at the streaming read bandwidth. Times are medians, by
 * default of process CPU time (--clock wall for the wall clock): on a shared machine
 * the wall clock also counts time other processes held the core.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kvq.h"
#include "kvq/util.h"
#include "kvq/codebook.h"
#include "kvq/runtime.h"
#include "runtime/kernels/rk.h"

#include "bench/bench_common.h"

#define N_HEADS 32
#define N_KV 8
#define GS (N_HEADS / N_KV)
#define D 128
#define SINK 4
#define WINDOW 64
#define FLUSH_BYTES BENCH_FLUSH_BYTES

/* The clock used for every figure (--clock cpu | wall). */
static int g_cpu_clock = 1;
static double g_rerank = 0; /* --rerank R (0: one stage) */
static int g_rope = 0;      /* --positions rope */
static double g_rerank_extra = 0; /* --rerank +E (kvq_retrieval_params.rerank_extra) */
static double g_resid = 4;  /* --resid-wide W (0: off) */
static double g_resid_share = 0.5; /* --resid-share S (kvq_retrieval_params.resid_share) */
static int rerank_on(void) { return g_rerank > 1 || g_rerank_extra > 0; }
static int g_resid_exact = 0; /* --resid-path exact: the per-candidate reconstruction */
static int g_resid_max = 0;   /* --resid-group max: the stage scores by the best head */
static int g_thread_clock = 0; /* --clock thread: each thread's own CPU time */
static int g_pieces = 1;       /* --groups pieces: the stage over every candidate makes the
                                  rows' groups a piece at a time (all: in one array first) */
static int g_pipe = 0;         /* --pipeline: head h + 1's stage prefetches head h's rerank rows */
static int g_record = 0;       /* retrieval_step records the rerank's rows (untimed) */
static int g_best = 0;         /* --stat best: the best of the repetitions, not the median */
static double thread_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double clk(void)
{
    return g_thread_clock ? thread_now() : g_cpu_clock ? bench_cpu_now() : kvq_now();
}

/* A parallel region's time on T threads: under --clock thread the largest of the
 * threads' own CPU times (each measured up to the end of its share, before the barrier,
 * so spinning at it is not counted: on a shared machine neither the time other processes
 * held the core nor a thread waiting for another counts); else the clock's difference. */
#define MAX_T 16
static double g_tt[MAX_T];
static double region_time(int T, double t0)
{
    if (!g_thread_clock)
        return clk() - t0;
    double m = 0;
    for (int i = 0; i < T; i++)
        m = g_tt[i] > m ? g_tt[i] : m;
    return m;
}
static int thread_index(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

typedef struct args {
    int64_t contexts[16];
    int n_contexts;
    double budget;
    int64_t codebook, reps, threads, seed;
    int64_t tlist[4]; /* --threads LIST: thread counts run alternately, threads their max */
    int nt;
    kvq_isa isa;
    int fused;  /* attention of the step: fused kernel (1) or logits + softmax + mix (0) */
    int scores; /* selection through scores (1), from the codes (0), or as the runtime
                   chooses (-1: kvq_rk_codes_select_pays) */
    int token_order; /* candidates' rows in token order (1) or code order (0) */
    int bands;       /* --score bands: one LUT per distance band */
} args;

static int usage(void)
{
    fprintf(stderr, "usage: bench_decode [--contexts LIST] [--budget F] [--codebook K] "
                    "[--reps N] [--threads T] [--isa scalar|avx2|avx512] [--seed S] "
                    "[--attn fused|twopass] [--select auto|codes|scores] [--order code|token] "
                    "[--clock cpu|thread|wall] [--stat median|best] [--score rb|bands] [--rerank R|+E] "
                    "[--positions wrope|rope] [--resid-wide W] [--resid-path fast|exact] "
                    "[--resid-group sum|max] [--resid-share S] "
                    "[--preset smollm2]\n");
    return 2;
}

static int parse(int argc, char **argv, args *a)
{
    kvq_err e = {0};
    a->n_contexts = 4;
    a->contexts[0] = 4096;
    a->contexts[1] = 16384;
    a->contexts[2] = 65536;
    a->contexts[3] = 131072;
    a->budget = 0.06;
    a->codebook = 4096;
    a->reps = 5;
    a->threads = 1;
    a->tlist[0] = 1;
    a->nt = 1;
    a->seed = 1;
    a->isa = kvq_isa_best();
    a->fused = 0;
    a->scores = -1;
    int clock_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        i++;
        if (!strcmp(o, "--contexts")) {
            a->n_contexts = 0;
            char *buf = strdup(v), *p = buf, *tok;
            while ((tok = strsep(&p, ",")) && a->n_contexts < 16)
                if (kvq_parse_i64(tok, 256, (int64_t)1 << 24, &a->contexts[a->n_contexts++], &e)) {
                    fprintf(stderr, "bench_decode: %s\n", e.msg);
                    free(buf);
                    return 2;
                }
            free(buf);
        } else if (!strcmp(o, "--budget")) {
            if (kvq_parse_f64(v, 1e-6, 1, &a->budget, &e))
                return usage();
        } else if (!strcmp(o, "--codebook")) {
            if (kvq_parse_i64(v, 2, 65536, &a->codebook, &e))
                return usage();
        } else if (!strcmp(o, "--reps")) {
            if (kvq_parse_i64(v, 1, 1000, &a->reps, &e))
                return usage();
        } else if (!strcmp(o, "--threads")) { /* T, or a list run alternately: 1,2 */
            char *buf = strdup(v), *p = buf, *tok;
            a->nt = 0;
            a->threads = 1;
            while ((tok = strsep(&p, ",")) && a->nt < 4) {
                if (kvq_parse_i64(tok, 1, MAX_T, &a->tlist[a->nt], &e)) {
                    free(buf);
                    return usage();
                }
                a->threads = a->tlist[a->nt] > a->threads ? a->tlist[a->nt] : a->threads;
                a->nt++;
            }
            free(buf);
        } else if (!strcmp(o, "--seed")) {
            if (kvq_parse_i64(v, 0, INT64_MAX, &a->seed, &e))
                return usage();
        } else if (!strcmp(o, "--clock")) {
            if (!strcmp(v, "cpu"))
                g_cpu_clock = 1;
            else if (!strcmp(v, "thread"))
                g_thread_clock = 1;
            else if (!strcmp(v, "wall"))
                g_cpu_clock = 0;
            else
                return usage();
            clock_set = 1;
        } else if (!strcmp(o, "--groups")) {
            g_pieces = strcmp(v, "all") != 0;
        } else if (!strcmp(o, "--pipeline")) { /* an experiment: on or off */
            g_pipe = !strcmp(v, "on");
        } else if (!strcmp(o, "--stat")) {
            if (!strcmp(v, "best"))
                g_best = 1;
            else if (!strcmp(v, "median"))
                g_best = 0;
            else
                return usage();
        } else if (!strcmp(o, "--attn")) {
            if (!strcmp(v, "fused"))
                a->fused = 1;
            else if (!strcmp(v, "twopass"))
                a->fused = 0;
            else
                return usage();
        } else if (!strcmp(o, "--select")) {
            if (!strcmp(v, "codes"))
                a->scores = 0;
            else if (!strcmp(v, "scores"))
                a->scores = 1;
            else if (!strcmp(v, "auto"))
                a->scores = -1;
            else
                return usage();
        } else if (!strcmp(o, "--order")) {
            if (!strcmp(v, "code"))
                a->token_order = 0;
            else if (!strcmp(v, "token"))
                a->token_order = 1;
            else
                return usage();
        } else if (!strcmp(o, "--positions")) {
            if (!strcmp(v, "rope"))
                g_rope = 1;
            else if (!strcmp(v, "wrope"))
                g_rope = 0;
            else
                return usage();
        } else if (!strcmp(o, "--preset")) { /* what calibrate ships for SmolLM2 */
            if (strcmp(v, "smollm2"))
                return usage();
            a->codebook = 256;
            a->bands = 1;
            g_rerank = 0;
            g_rerank_extra = 0.08;
            g_resid = 64;
            g_resid_share = 1;
            g_resid_max = 1;
            g_rope = 1;
        } else if (!strcmp(o, "--resid-wide")) {
            if (kvq_parse_f64(v, 0, 64, &g_resid, &e))
                return usage();
        } else if (!strcmp(o, "--resid-group")) {
            if (!strcmp(v, "sum"))
                g_resid_max = 0;
            else if (!strcmp(v, "max"))
                g_resid_max = 1;
            else
                return usage();
        } else if (!strcmp(o, "--resid-path")) {
            if (!strcmp(v, "fast"))
                g_resid_exact = 0;
            else if (!strcmp(v, "exact"))
                g_resid_exact = 1;
            else
                return usage();
        } else if (!strcmp(o, "--rerank")) { /* R, or +E (a fraction of the cache) */
            g_rerank = g_rerank_extra = 0;
            if (v[0] == '+' ? kvq_parse_f64(v + 1, 1e-9, 0.99, &g_rerank_extra, &e)
                            : kvq_parse_f64(v, 0, 64, &g_rerank, &e))
                return usage();
        } else if (!strcmp(o, "--resid-share")) {
            if (kvq_parse_f64(v, 0.01, 1, &g_resid_share, &e))
                return usage();
        } else if (!strcmp(o, "--score")) {
            if (!strcmp(v, "bands"))
                a->bands = 1;
            else if (!strcmp(v, "rb"))
                a->bands = 0;
            else
                return usage();
        } else if (!strcmp(o, "--isa")) {
            if (!strcmp(v, "scalar"))
                a->isa = KVQ_ISA_SCALAR;
            else if (!strcmp(v, "avx2"))
                a->isa = KVQ_ISA_AVX2;
            else if (!strcmp(v, "avx512"))
                a->isa = KVQ_ISA_AVX512;
            else
                return usage();
            a->isa = kvq_isa_clamp(a->isa);
        } else {
            return usage();
        }
    }
    if (g_rope && a->fused) {
        fprintf(stderr, "bench_decode: --positions rope runs the two-pass attention only\n");
        return 2;
    }
    if (a->threads > 1 && !clock_set)
        g_cpu_clock = 0;
    if (a->threads > 1 && g_cpu_clock && !g_thread_clock)
        fprintf(stderr, "bench_decode: warning: process CPU time adds up the %lld threads\n",
                (long long)a->threads);
    return 0;
}

/* Uniform in [-sqrt 3, sqrt 3) (unit variance): cheap enough for 10^8 values. */
static float unit(kvq_rng *r)
{
    return (float)((double)(kvq_rng_u64(r) >> 40) * (3.4641016151377544 / 16777216.0) -
                   1.7320508075688772);
}

/* The runtime's row order after a prompt of n tokens (runtime/select/codebook/row_order.c sort_head):
 * rows [SINK, n - WINDOW) stably sorted by code, K, V and codes moved together. */
struct layer;
static int sort_candidates(struct layer *L, int h, int32_t K);

/* ---- timing helpers ------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double best_of(const double *v, int64_t n)
{
    double b = v[0];
    for (int64_t i = 1; i < n; i++)
        b = v[i] < b ? v[i] : b;
    return b;
}

static double median(double *v, int64_t n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* memcpy bandwidth (read + write bytes per second), best of reps; T threads copy
 * one slice each. */
static double memcpy_bandwidth(int64_t reps, int T)
{
    const size_t n = FLUSH_BYTES;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (!a || !b)
        goto done;
    memset(a, 1, n);
    memset(b, 2, n);
    for (int64_t r = 0; r < reps + 1; r++) {
        const double t0 = clk();
#pragma omp parallel num_threads(T)
        {
            const double s0 = clk();
#pragma omp for schedule(static) nowait
            for (int i = 0; i < T; i++)
                memcpy(b + n / T * i, a + n / T * i, i == T - 1 ? n - n / T * i : n / T);
            g_tt[thread_index()] = clk() - s0;
        }
        const double t = region_time(T, t0);
        bench_sink += (uint64_t)b[r % n];
        if (r > 0 && 2.0 * n / t > best)
            best = 2.0 * n / t;
    }
done:
    free(a);
    free(b);
    return best;
}

/* Streaming read bandwidth: a sum over 256 MiB (vectorized by the compiler; T threads
 * sum one slice each), best of reps, each from a cold cache. */
static double read_bandwidth(int64_t reps, int T, uint64_t *flush)
{
    const size_t n = FLUSH_BYTES / sizeof(uint64_t);
    uint64_t *a = malloc(FLUSH_BYTES);
    double best = 0;
    if (!a)
        return 0;
    for (size_t i = 0; i < n; i++)
        a[i] = i;
    for (int64_t r = 0; r < reps; r++) {
        bench_flush_caches(flush);
        const double t0 = clk();
        uint64_t s = 0;
#pragma omp parallel num_threads(T) reduction(+ : s)
        {
            const double s0 = clk();
#pragma omp for schedule(static) nowait
            for (size_t i = 0; i < n; i++)
                s += a[i];
            g_tt[thread_index()] = clk() - s0;
        }
        const double t = region_time(T, t0);
        bench_sink += s;
        if (FLUSH_BYTES / t > best)
            best = FLUSH_BYTES / t;
    }
    free(a);
    return best;
}

/* ---- one decode step -------------------------------------------------------------------- */

typedef struct scratch {
    double phase[10]; /* seconds in LUT, score gather, top-k, attention; the rerank and the
                        residual stage (both in top-k); within the stage its LUTs and sign
                        tables, its kernel, its top-k; the first selection */
    float *scores, *logits, *krot;
    uint32_t *work, *cwork;
    int32_t *att;
    kvq_rk_bands bands;      /* --score bands from the (code, band) groups */
    int64_t tb[64];          /* its bands' first tokens */
    float lut[65536];
    float qb[GS * D], qi[GS * D], qs[D], out[GS * D];
    float state[GS * (D + 2)];
    /* (last: the fields above keep their offsets, and the query arrays their alignment) */
    float *rlg;              /* --rerank: [GS, n] exact logits of the candidates */
    int32_t *rsel;           /* --rerank: [n] the kept candidates */
    int64_t rr_kept;         /* --rerank: kept rows whose logits are in logits already */
    /* --pipeline: the rows to prefetch while the stage's kernel runs (the previous head's
     * rerank candidates, their key rows), and the second attended-rows buffer */
    const char *pf_base;
    const int32_t *pf_rows;
    int64_t pf_n;
    int32_t *att2;
} scratch;

typedef struct layer {
    int64_t n;
    uint16_t *k[N_KV], *v[N_KV]; /* [n, D] f16 */
    uint16_t *codes[N_KV];       /* [n] */
    int32_t *tok[N_KV];          /* [n - SINK - WINDOW] token of each candidate row in code
                                    order (row SINK + i), NULL in token order */
    uint32_t *hist[N_KV];        /* [K] per-code counts of codes[0..n), as the cache keeps */
    int32_t *att[N_KV];          /* [n] the last retrieval step's attended rows, per head */
    int64_t n_att[N_KV];
    int32_t *rr[N_KV];           /* [n] the rows the rerank read (its candidates), recorded by
                                    an untimed step (g_record) */
    int64_t n_rr[N_KV];
    kvq_rk_table *tab[N_KV];
    float q[N_HEADS * D];                             /* the step's queries (pre-RoPE) */
    float *bq; /* [N_KV, bands, D] --score bands: each band's scoring query, the group's
                  summed query rotated by the band's mean rotation (made outside the step) */
    float *bqh; /* [N_KV, GS, bands, D] --resid-group max: the same of each query head */
    int32_t nb; /* bands */
    float wcos[WINDOW * D / 2], wsin[WINDOW * D / 2]; /* RoPE of the window positions */
    uint8_t *rq[N_KV];  /* --resid-wide: [n, D/8] residual signs packed, by row */
    float *rqs[N_KV];   /* [n] residual scales, by row */
    uint8_t *rqo[N_KV]; /* --resid-path exact: [n, D] one sign per byte, unrotated, by token
                           (as the runtime kept them before) */
    float *rqso[N_KV];  /* [n] scales by token */
    float *pcos, *psin; /* --resid-path exact under rope: [n, D/2] every position's rotation */
    uint16_t *kr[N_KV]; /* --positions rope: [n, D] f16 keys rotated by their tokens'
                           positions, rows as k (the runtime's cache under rope, keys.c) */
    float bcos[D / 2], bsin[D / 2], icos[D / 2], isin[D / 2];
} layer;

static int sort_candidates(layer *L, int h, int32_t K)
{
    const int64_t n = L->n, nc = n - SINK - WINDOW;
    const size_t row = sizeof(uint16_t) * D;
    int32_t *order = malloc(sizeof *order * (size_t)nc);
    uint32_t *count = malloc(sizeof *count * (size_t)K);
    uint16_t *tmp = malloc(sizeof *tmp * (size_t)nc);
    if (!order || !count || !tmp) {
        fprintf(stderr, "bench_decode: out of memory sorting rows\n");
        return 1;
    }
    kvq_rk_code_order(L->codes[h] + SINK, nc, K, count, order);
    for (int pass = 0; pass < 2; pass++) { /* into new arrays, as the runtime does */
        uint16_t **arr = pass ? &L->v[h] : &L->k[h];
        char *dst = bench_cache_alloc(row * (size_t)n);
        const char *src = (const char *)*arr;
        if (!dst) {
            fprintf(stderr, "bench_decode: out of memory sorting rows\n");
            return 1;
        }
        memcpy(dst, src, row * SINK);
        for (int64_t i = 0; i < nc; i++)
            memcpy(dst + (size_t)(SINK + i) * row, src + (size_t)(SINK + order[i]) * row, row);
        memcpy(dst + (size_t)(n - WINDOW) * row, src + (size_t)(n - WINDOW) * row, row * WINDOW);
        free(*arr);
        *arr = (uint16_t *)dst;
    }
    free(L->tok[h]);
    if (!(L->tok[h] = malloc(sizeof(int32_t) * (size_t)nc))) {
        fprintf(stderr, "bench_decode: out of memory sorting rows\n");
        return 1;
    }
    for (int64_t i = 0; i < nc; i++) {
        tmp[i] = L->codes[h][SINK + order[i]];
        L->tok[h][i] = SINK + order[i];
    }
    memcpy(L->codes[h] + SINK, tmp, sizeof *tmp * (size_t)nc);
    free(order);
    free(count);
    free(tmp);
    return 0;
}

static void rotate(const float *x, const float *c, const float *s, float *y)
{
    for (int m = 0; m < D / 2; m++) {
        const float a = x[2 * m], b = x[2 * m + 1];
        y[2 * m] = a * c[m] - b * s[m];
        y[2 * m + 1] = a * s[m] + b * c[m];
    }
}

static void full_step(const layer *L, int h, kvq_isa isa, int fused, scratch *S, float *out)
{
    const float scale = (float)(1.0 / sqrt((double)D));
    for (int g = 0; g < GS; g++) /* the full-attention cache holds post-RoPE keys */
        rotate(L->q + (size_t)(h * GS + g) * D, L->icos, L->isin, S->qi + g * D);
    if (fused) {
        kvq_rk_attend_init(S->state, GS, D);
        kvq_rk_attend_rows(isa, S->state, S->qi, GS, D, L->k[h], KVQ_DT_F16, D, NULL, L->v[h],
                           KVQ_DT_F16, D, NULL, L->n, scale);
        kvq_rk_attend_finish(S->state, GS, D, out);
        return;
    }
    kvq_rk_logits(isa, S->qi, GS, D, L->k[h], KVQ_DT_F16, D, NULL, L->n, scale, S->logits, L->n);
    kvq_rk_softmax(isa, S->logits, GS, L->n, L->n);
    kvq_rk_mix(isa, S->logits, GS, L->n, L->v[h], KVQ_DT_F16, D, NULL, L->n, D, out);
}

/* --score bands on rows in code order (as runtime/select/codebook/score_pos.c does): each code's run of
 * rows keeps token order, so it splits into one sub-run per band. The runs from the
 * per-code counts; then per band (nearest first) its LUT, and each run walked backwards
 * from where the nearer band stopped while its tokens are in the band, the rows' scores
 * filled with the LUT's entry for the code (the farthest band takes the rest). */
static void bands_code_order(const layer *L, int h, kvq_isa isa, int32_t K, scratch *S)
{
    const int64_t n = L->n, dmax = n - 1 - SINK;
    const int32_t *tok = L->tok[h];
    uint32_t *run = S->cwork, *cur = S->cwork + K, *cnt = S->cwork + 2 * K;
    double t0 = clk(), t1;
    kvq_rk_code_counts(L->hist[h], K, L->codes[h], n, SINK, n - WINDOW, cnt);
    uint32_t acc = 0;
    for (int32_t c = 0; c < K; c++) {
        run[c] = acc;
        cur[c] = acc += cnt[c];
    }
    S->phase[1] += clk() - t0;
    for (int64_t blo = WINDOW, bi = 0; blo <= dmax; blo *= 2, bi++) {
        const int64_t bhi = 2 * blo - 1 < dmax ? 2 * blo - 1 : dmax, first = n - 1 - bhi;
        t1 = clk();
        kvq_rk_lut(isa, L->tab[h], L->bq + ((size_t)h * L->nb + bi) * D, S->lut);
        t0 = clk();
        S->phase[0] += t0 - t1;
        for (int32_t c = 0; c < K; c++) {
            const int64_t rs = run[c];
            const float v = S->lut[c];
            int64_t j = cur[c];
            if (bhi == dmax) /* the farthest band: the rest of the run */
                for (; j > rs; j--)
                    S->scores[j - 1] = v;
            else
                for (; j > rs && tok[j - 1] >= first; j--)
                    S->scores[j - 1] = v;
            cur[c] = (uint32_t)j;
        }
        S->phase[1] += clk() - t0;
    }
}

/* Bands of distances [w, 2w), [2w, 4w), ... up to n - 1 - SINK. */
static int32_t band_count(int64_t n)
{
    int32_t nb = 0;
    for (int64_t lo = WINDOW; lo <= n - 1 - SINK; lo *= 2)
        nb++;
    return nb;
}

/* L->bq: per KV head and band [lo, hi] of distances, the group's summed pre-RoPE query
 * rotated by the mean rotation over the band (runtime/select/codebook/score_pos.c: per pair, the centre
 * distance's rotation damped by sin(N t / 2) / (N sin(t / 2))), as the runtime's scoring
 * queries are; the bands' LUTs then differ as they do there. */
static int band_queries(layer *L, int64_t n, const double *theta)
{
    const int64_t dmax = n - 1 - SINK;
    L->nb = band_count(n);
    free(L->bq);
    free(L->bqh);
    L->bqh = malloc(sizeof(float) * (size_t)N_KV * GS * L->nb * D);
    if (!(L->bq = malloc(sizeof(float) * (size_t)N_KV * L->nb * D)) || !L->bqh) {
        fprintf(stderr, "bench_decode: out of memory\n");
        return 1;
    }
    for (int h = 0; h < N_KV; h++) {
        float qsum[D] = {0};
        for (int g = 0; g < GS; g++)
            for (int t = 0; t < D; t++)
                qsum[t] += L->q[(size_t)(h * GS + g) * D + t];
        int32_t b = 0;
        for (int64_t lo = WINDOW; lo <= dmax; lo *= 2, b++) {
            const int64_t hi = 2 * lo - 1 < dmax ? 2 * lo - 1 : dmax;
            const double N = (double)(hi - lo + 1), c = 0.5 * (double)(lo + hi);
            float cs[D / 2], sn[D / 2];
            for (int m = 0; m < D / 2; m++) {
                const double s2 = sin(0.5 * theta[m]);
                const double damp = fabs(s2) < 1e-12 ? 1.0 : sin(0.5 * N * theta[m]) / (N * s2);
                cs[m] = (float)(damp * cos(c * theta[m]));
                sn[m] = (float)(damp * sin(c * theta[m]));
            }
            rotate(qsum, cs, sn, L->bq + ((size_t)h * L->nb + b) * D);
            for (int g = 0; g < GS; g++)
                rotate(L->q + (size_t)(h * GS + g) * D, cs, sn,
                       L->bqh + (((size_t)h * GS + g) * L->nb + b) * D);
        }
    }
    return 0;
}

/* --score bands selecting from the (code, band) groups (runtime/select/codebook/score_pos.c
 * kvq_rt_banded_select): the bands' LUTs side by side in S->lut, each band's first
 * token, the per-code counts; kvq_rk_topk_bands then selects. */
static void bands_groups(const layer *L, int h, kvq_isa isa, int32_t K, scratch *S)
{
    const int64_t n = L->n, dmax = n - 1 - SINK;
    double t0 = clk(), t1;
    int32_t nb = 0;
    for (int64_t blo = WINDOW; blo <= dmax; blo *= 2, nb++) {
        const int64_t bhi = 2 * blo - 1 < dmax ? 2 * blo - 1 : dmax;
        S->tb[nb] = n - 1 - bhi; /* tokens >= it are in this band or a nearer one */
    }
    for (int32_t k0 = 0; k0 < nb; k0 += 8) /* eight bands' LUTs per read of the table */
        kvq_rk_lut_multi(isa, L->tab[h], L->bq + ((size_t)h * nb + k0) * D,
                         nb - k0 < 8 ? nb - k0 : 8, S->lut + (size_t)k0 * K);
    t1 = clk();
    S->phase[0] += t1 - t0;
    kvq_rk_code_counts(L->hist[h], K, L->codes[h], n, SINK, n - WINDOW, S->cwork);
    S->phase[1] += clk() - t1;
    S->bands = (kvq_rk_bands){.K = K,
                              .nb = nb,
                              .lut = S->lut,
                              .n = n - SINK - WINDOW,
                              .cnt = S->cwork,
                              .tok = L->tok[h],
                              .tb = S->tb};
}


/* Whether the --resid-group max stage scores every candidate (--resid-share 1 with a wide
 * enough W: the first cut selects nothing, runtime/select/codebook/resid.c kvq_rt_banded_groups). */
static int64_t resid_count(int64_t k2, int64_t nc);
static int64_t rerank_count(int64_t k, int64_t nc);
static int resid_every(int64_t k_sel, int64_t nc)
{
    return g_resid_max && !g_resid_exact && rerank_on() && g_resid > 1 &&
           resid_count(rerank_count(k_sel, nc), nc) >= nc;
}

/* bands_groups for the stage over every candidate, as the runtime does it there: no
 * selection, so no LUT of the summed query; each band's first token and the per-code
 * counts, for each row's (code, band) group (kvq_rk_topk_bands_grouped with every row:
 * kvq_rk_bands_groups' work, the LUTs not read). */
static void bands_groups_every(const layer *L, int h, int32_t K, scratch *S)
{
    const int64_t n = L->n, dmax = n - 1 - SINK;
    const double t1 = clk();
    int32_t nb = 0;
    for (int64_t blo = WINDOW; blo <= dmax; blo *= 2, nb++) {
        const int64_t bhi = 2 * blo - 1 < dmax ? 2 * blo - 1 : dmax;
        S->tb[nb] = n - 1 - bhi;
    }
    kvq_rk_code_counts(L->hist[h], K, L->codes[h], n, SINK, n - WINDOW, S->cwork);
    S->phase[1] += clk() - t1;
    S->bands = (kvq_rk_bands){.K = K,
                              .nb = nb,
                              .lut = NULL,
                              .n = n - SINK - WINDOW,
                              .cnt = S->cwork,
                              .tok = L->tok[h],
                              .tb = S->tb};
}

/* --positions rope: the keys rotated by their tokens' positions, then rounded to f16
 * (row j holds the row's token under code order), made when the cache is built, as
 * runtime/cache/keys.c does at append. */
static int rotated_keys(layer *L, int h, const double *theta)
{
    if (!(L->kr[h] = bench_cache_alloc(sizeof(uint16_t) * (size_t)L->n * D)))
        return 1;
    for (int64_t j = 0; j < L->n; j++) {
        const int64_t t = L->tok[h] && j >= SINK && j < L->n - WINDOW ? L->tok[h][j - SINK] : j;
        float row[D], rot[D], c[D / 2], sn[D / 2];
        kvq_f16_to_f32(L->k[h] + (size_t)j * D, row, D);
        for (int m = 0; m < D / 2; m++) {
            c[m] = (float)cos((double)t * theta[m]);
            sn[m] = (float)sin((double)t * theta[m]);
        }
        rotate(row, c, sn, rot);
        kvq_f32_to_f16(rot, L->kr[h] + (size_t)j * D, D);
    }
    return 0;
}

/* --resid-wide: each token's residual from its centroid at 1 bit per channel (signs, +
 * for 0) and its scale mean |r|, made with the cache as runtime/select/codebook/resid.c does at
 * append: packed and rotated by the token's position under rope (rq), and for
 * --resid-path exact one sign per byte, unrotated (rqo). */
static int resid_build(layer *L, int h, const double *theta)
{
    const int64_t n = L->n;
    const float *W = kvq_codebook_key_codebook(kvq_rk_table_codebook(L->tab[h]));
    L->rq[h] = malloc((size_t)n * D / 8);
    L->rqo[h] = malloc((size_t)n * D);
    L->rqs[h] = malloc(sizeof(float) * (size_t)n);
    L->rqso[h] = malloc(sizeof(float) * (size_t)n);
    if (!L->rq[h] || !L->rqo[h] || !L->rqs[h] || !L->rqso[h])
        return 1;
    for (int64_t j = 0; j < n; j++) {
        const int64_t t = L->tok[h] && j >= SINK && j < n - WINDOW ? L->tok[h][j - SINK] : j;
        float x[D], c[D / 2], sn[D / 2];
        kvq_f16_to_f32(L->k[h] + (size_t)j * D, x, D);
        double a = 0;
        for (int i = 0; i < D; i++) {
            x[i] -= W[(size_t)L->codes[h][j] * D + i];
            a += fabs((double)x[i]) / D;
            L->rqo[h][(size_t)t * D + i] = x[i] >= 0;
        }
        L->rqs[h][j] = L->rqso[h][t] = (float)a;
        if (g_rope) {
            for (int m = 0; m < D / 2; m++) {
                c[m] = (float)cos((double)t * theta[m]);
                sn[m] = (float)sin((double)t * theta[m]);
            }
            rotate(x, c, sn, x);
        }
        memset(L->rq[h] + (size_t)j * D / 8, 0, D / 8);
        for (int i = 0; i < D; i++)
            L->rq[h][(size_t)j * D / 8 + i / 8] |= (uint8_t)((x[i] >= 0) << (i % 8));
    }
    return 0;
}

/* The stage's candidates: min(ceil(W k2), half the candidates), at least k2
 * (kvq_rt_resid_count). */
static int64_t resid_count(int64_t k2, int64_t nc)
{
    if (!(g_resid > 1) || !rerank_on() || k2 >= nc)
        return k2;
    double want = ceil(g_resid * (double)k2);
    const double cap = ceil(g_resid_share * (double)nc);
    want = want > cap ? (cap > (double)k2 ? cap : (double)k2) : want;
    return want >= (double)nc ? nc : (int64_t)want;
}

/* --resid-group max (runtime/select/codebook/resid.c fast_max_scores): per query head its bands'
 * LUTs side by side [GS, nb, K], each row's (code, band) group b K + code in S->rsel
 * (written by the selection, kvq_rk_topk_bands_grouped, as runtime/select/codebook/score_pos.c does
 * when the bands come from the groups; else found here from the row's token, linear as
 * score_pos.c's band_of), and one pass of kvq_rk_resid_scores_max over the rows for all
 * the heads (each row's signs and scale read once); sc the best head's. */
static void resid_max_scores(const layer *L, int h, kvq_isa isa, scratch *S,
                             const int32_t *rows, int64_t n, int have_grp, int every, float *sc)
{
    const int32_t K = S->bands.K, nb = S->bands.nb;
    const size_t tl = KVQ_RK_SIGN_TABLE_LEN(D);
    float *lut = S->lut + 32768; /* [GS, nb, K] (GS nb K <= 32768) */
    int32_t *grp = S->rsel;      /* [n] */
    if ((int64_t)GS * nb * K > 32768) {
        fprintf(stderr, "bench_decode: %d bands of %d codes do not fit\n", (int)nb, (int)K);
        exit(1);
    }
    for (int64_t a = 0; a < n && !have_grp; a++) {
        const int64_t j = rows[a];
        const int64_t t = L->tok[h] && j >= SINK && j < L->n - WINDOW ? L->tok[h][j - SINK] : j;
        int32_t b = 0;
        while (b + 1 < nb && t < S->tb[b])
            b++;
        grp[a] = b * K + L->codes[h][j];
    }
    const double t0 = clk();
    /* the heads' band queries [GS, nb, D] side by side, eight LUTs per read of the table */
    for (int32_t i0 = 0; i0 < GS * nb; i0 += 8)
        kvq_rk_lut_multi(isa, L->tab[h], L->bqh + ((size_t)h * GS * nb + i0) * D,
                         GS * nb - i0 < 8 ? GS * nb - i0 : 8, lut + (size_t)i0 * K);
    float tab[GS * KVQ_RK_SIGN_TABLE_LEN(D)];
    for (int g = 0; g < GS; g++)
        kvq_rk_sign_table((g_rope ? S->qi : S->qb) + g * D, D, tab + (size_t)g * tl);
    const double t1 = clk();
    /* every candidate (the runtime's resid.c): the groups from the runs a piece at a time
     * (kvq_rk_bands_cursor, in L1), else the selection's; --pipeline: pieces of the kernel,
     * each followed by its share of the prefetches */
    kvq_rk_bands_cursor cur;
    if (every)
        kvq_rk_bands_cursor_begin(&S->bands, S->work, &cur);
    const int64_t ch = every || S->pf_n > 0 ? 1024 : n;
    int64_t done = 0;
    for (int64_t a0 = 0; a0 < n; a0 += ch) {
        const int64_t c = n - a0 < ch ? n - a0 : ch;
        int32_t g[1024];
        if (every)
            kvq_rk_bands_cursor_next(&cur, c, g);
        kvq_rk_resid_scores_max(isa, tab, GS, D / 8, L->rq[h], L->rqs[h], rows + a0, lut,
                                (size_t)nb * K, every ? g : grp + a0, c, sc + a0);
        const int64_t upto = S->pf_n > 0 ? (a0 + c) * S->pf_n / n : 0;
        for (; done < upto; done++) {
            const char *row = S->pf_base + (size_t)S->pf_rows[done] * D * 2;
            for (int l = 0; l < D * 2; l += 64)
                __builtin_prefetch(row + l, 0, 2);
        }
    }
    S->phase[6] += t1 - t0;
    S->phase[7] += clk() - t1;
}

/* The residual stage over rows[0..n) (ascending), keeping k2 in place: the first-stage
 * score of each row (its code's LUT entry in its band, or its score), then
 * kvq_rk_resid_scores; or (--resid-path exact) the reconstruction rule. */
static int64_t resid_stage(const layer *L, int h, kvq_isa isa, int by_scores, int bands,
                           scratch *S, int32_t *rows, int64_t n, int64_t k2)
{
    float q[D] = {0};
    for (int g = 0; g < GS; g++)
        for (int t = 0; t < D; t++)
            q[t] += (g_rope ? S->qi : S->qb)[g * D + t];
    float *sc = S->rlg;
    int32_t *tok = S->rsel;
    const float *W = kvq_codebook_key_codebook(kvq_rk_table_codebook(L->tab[h]));
    for (int64_t a = 0; a < n && g_resid_exact; a++) {
        const int64_t j = rows[a];
        tok[a] = L->tok[h] && j >= SINK && j < L->n - WINDOW ? L->tok[h][j - SINK] : (int32_t)j;
    }
    if (g_resid_exact) {
        for (int64_t a = 0; a < n; a++) {
            const int64_t t = tok[a];
            const uint16_t code = L->codes[h][rows[a]];
            float y[D];
            for (int i = 0; i < D; i++)
                y[i] = (L->rqo[h][(size_t)t * D + i] ? L->rqso[h][t] : -L->rqso[h][t]) +
                       W[(size_t)code * D + i];
            if (g_rope)
                rotate(y, L->pcos + (size_t)t * (D / 2), L->psin + (size_t)t * (D / 2), y);
            double dot = 0;
            for (int i = 0; i < D; i++)
                dot += (double)q[i] * y[i];
            sc[a] = (float)dot;
        }
    } else if (g_resid_max && bands) {
        resid_max_scores(L, h, isa, S, rows, n, L->tok[h] && !by_scores,
                         g_pieces && L->tok[h] && !by_scores && n == L->n - SINK - WINDOW, sc);
    } else {
        /* (bands from the groups: kvq_rk_topk_bands_scored left each row's group score
         * in sc, as runtime/select/codebook/score_pos.c does for the runtime's stage) */
        for (int64_t a = 0; a < n && (by_scores || !bands); a++)
            sc[a] = by_scores ? S->scores[rows[a] - SINK] : S->lut[L->codes[h][rows[a]]];
        float tab[KVQ_RK_SIGN_TABLE_LEN(D)];
        kvq_rk_sign_table(q, D, tab);
        kvq_rk_resid_scores(isa, tab, D / 8, L->rq[h], L->rqs[h], rows, sc, n, sc);
    }
    const double t0 = clk();
    const int64_t m = kvq_rk_topk(isa, sc, n, k2, S->rsel, S->work);
    for (int64_t i = 0; i < m; i++)
        rows[i] = rows[S->rsel[i]];
    S->phase[8] += clk() - t0;
    return m;
}

/* Candidates for a budget of k out of nc: ceil(R k) with --rerank R > 1, else k. */
static int64_t rerank_count(int64_t k, int64_t nc)
{
    if (!rerank_on() || k >= nc)
        return k;
    double want = g_rerank > 1 ? ceil(g_rerank * (double)k) : (double)k;
    if (g_rerank_extra > 0 && (double)k + ceil(g_rerank_extra * (double)nc) > want)
        want = (double)k + ceil(g_rerank_extra * (double)nc);
    return want >= (double)nc ? nc : (int64_t)want;
}

/* --rerank: the exact q R_b . k of rows[0..n) (f16 keys) keep the best k, in place,
 * ascending (as runtime/select/codebook/rerank.c under wrope): the logits of each query head in one
 * read of the rows, the group's score their sum; the kept rows' logits, scaled, go
 * where the attention lays them out (after the SINK sinks, GS rows of SINK + k + WINDOW)
 * and are not computed again. */
static int64_t rerank_rows(const layer *L, int h, kvq_isa isa, scratch *S, int32_t *rows,
                           int64_t n, int64_t k)
{
    if (g_rope) { /* q R_i . k_j R_j from the rotated rows, as runtime/select/codebook/rerank.c */
        kvq_rk_logits(isa, S->qi, GS, D, L->kr[h], KVQ_DT_F16, D, rows, n, 1.0f, S->rlg, n);
    } else {
        kvq_rk_logits(isa, S->qb, GS, D, L->k[h], KVQ_DT_F16, D, rows, n, 1.0f, S->rlg, n);
    }
    float *sc = S->scores;
    memcpy(sc, S->rlg, sizeof(float) * (size_t)n);
    for (int g = 1; g < GS; g++)
        for (int64_t j = 0; j < n; j++)
            sc[j] += S->rlg[(size_t)g * n + j];
    const int64_t m = kvq_rk_topk(isa, sc, n, k, S->rsel, S->work);
    for (int64_t i = 0; i < m; i++)
        rows[i] = rows[S->rsel[i]];
    const float scale = (float)(1.0 / sqrt((double)D));
    const int64_t ma = SINK + m + WINDOW;
    for (int g = 0; g < GS; g++)
        for (int64_t i = 0; i < m; i++)
            S->logits[(size_t)g * ma + SINK + i] = S->rlg[(size_t)g * n + S->rsel[i]] * scale;
    S->rr_kept = m;
    return m;
}

/* The step up to the rerank: the queries, the selection, the residual stage; the
 * candidates in S->att [SINK + ns] (the sinks first); returns ns. */
static int64_t retrieval_front(const layer *L, int h, kvq_isa isa, int by_scores, int bands,
                               int64_t k_sel, scratch *S)
{
    const int64_t n = L->n, w_beg = n - WINDOW, nc = w_beg - SINK;
    double t0 = clk(), t1;
    memset(S->qs, 0, sizeof S->qs);
    for (int g = 0; g < GS; g++) {
        const float *q = L->q + (size_t)(h * GS + g) * D;
        rotate(q, L->bcos, L->bsin, S->qb + g * D);
        rotate(q, L->icos, L->isin, S->qi + g * D);
        for (int t = 0; t < D; t++)
            S->qs[t] += S->qb[g * D + t];
    }
    const kvq_codebook_desc *cd = kvq_codebook_get_desc(kvq_rk_table_codebook(L->tab[h]));
    if (bands && L->tok[h] && !by_scores) {
        if (resid_every(k_sel, nc))
            bands_groups_every(L, h, cd->k, S);
        else
            bands_groups(L, h, isa, cd->k, S);
        t0 = clk();
        goto select;
    }
    if (bands && L->tok[h]) {
        bands_code_order(L, h, isa, cd->k, S);
        t0 = clk();
        goto select;
    }
    if (bands) { /* distance n - 1 - j of row j: bands [w, 2w), [2w, 4w), ... up to n - 1 - SINK */
        const int64_t dmax = n - 1 - SINK;
        for (int64_t lo = WINDOW, bi = 0; lo <= dmax; lo *= 2, bi++) {
            const int64_t hi = 2 * lo - 1 < dmax ? 2 * lo - 1 : dmax;
            const int64_t j0 = n - 1 - hi, j1 = n - lo; /* rows [j0, j1) */
            t1 = clk();
            kvq_rk_lut(isa, L->tab[h], L->bq + ((size_t)h * L->nb + bi) * D, S->lut);
            t0 = clk();
            S->phase[0] += t0 - t1;
            kvq_rk_score(isa, S->lut, 1, cd->k, L->codes[h] + j0, j1 - j0, S->scores + (j0 - SINK));
            S->phase[1] += clk() - t0;
        }
        t0 = clk();
        goto select;
    }
    kvq_rk_lut(isa, L->tab[h], S->qs, S->lut);
    t1 = clk();
    S->phase[0] += t1 - t0;
    if (by_scores)
        kvq_rk_score(isa, S->lut, 1, cd->k, L->codes[h] + SINK, nc, S->scores);
    else
        kvq_rk_code_counts(L->hist[h], cd->k, L->codes[h], n, SINK, w_beg, S->cwork);
    t0 = clk();
    S->phase[1] += t0 - t1;
select:;
    int64_t m = 0;
    for (int64_t j = 0; j < SINK; j++)
        S->att[m++] = (int32_t)j;
    const int64_t k2 = rerank_count(k_sel, nc), k1 = resid_count(k2, nc);
    int64_t ns =
        by_scores ? kvq_rk_topk(isa, S->scores, nc, k1, S->att + m, S->work)
        : bands   ? kvq_rk_topk_bands_grouped(
                      &S->bands, k1, S->att + m,
                      k1 > k2 && !g_resid_exact && !g_resid_max ? S->rlg : NULL,
                      k1 > k2 && !g_resid_exact && g_resid_max && !(g_pieces && resid_every(k_sel, nc)) ? S->rsel
                                                                                          : NULL,
                      S->work)
                  : kvq_rk_topk_codes(isa, S->lut, cd->k, S->cwork, L->codes[h] + SINK, nc, k1,
                                      S->att + m, S->cwork + cd->k);
    for (int64_t a = 0; a < ns; a++)
        S->att[m + a] += SINK;
    S->rr_kept = 0;
    const double t_rs = clk();
    S->phase[9] += t_rs - t0;
    if (k1 > k2) {
        S->bands.K = cd->k;
        ns = resid_stage(L, h, isa, by_scores, bands, S, S->att + m, ns, k2);
    }
    const double t_rr = clk();
    S->phase[5] += t_rr - t_rs;
    S->phase[2] += t_rr - t0;
    return ns;
}
/* The rest of the step: the rerank of the ns candidates in S->att + SINK, then the
 * attention over sinks, the kept rows and the window into out. The queries of head h are
 * made again (a pipelined front of another head may have replaced them). */
static int64_t retrieval_back(const layer *L, int h, kvq_isa isa, int fused, int64_t k_sel,
                              int64_t ns, scratch *S, float *out)
{
    const float scale = (float)(1.0 / sqrt((double)D));
    const int64_t n = L->n, w_beg = n - WINDOW, nc = w_beg - SINK, k2 = rerank_count(k_sel, nc);
    const double t_rr = clk();
    int64_t m = SINK;
    for (int g = 0; g < GS; g++) {
        const float *q = L->q + (size_t)(h * GS + g) * D;
        rotate(q, L->bcos, L->bsin, S->qb + g * D);
        rotate(q, L->icos, L->isin, S->qi + g * D);
    }
    if (g_record) {
        ((layer *)L)->n_rr[h] = k2 > k_sel ? ns : 0;
        memcpy(L->rr[h], S->att + m, sizeof(int32_t) * (size_t)ns);
    }
    if (k2 > k_sel)
        ns = rerank_rows(L, h, isa, S, S->att + m, ns, k_sel);
    const double t1 = clk();
    S->phase[4] += t1 - t_rr;
    S->phase[2] += t1 - t_rr;
    m += ns;
    const int64_t m_far = m;
    for (int64_t j = w_beg; j < n; j++)
        S->att[m++] = (int32_t)j;
    for (int64_t a = 0; a < WINDOW && !g_rope; a++) {
        float row[D];
        const uint16_t *kr = L->k[h] + (size_t)(w_beg + a) * D;
        for (int t = 0; t < D; t++)
            row[t] = kvq_f16_to_f32_ref(kr[t]);
        rotate(row, L->wcos + a * (D / 2), L->wsin + a * (D / 2), S->krot + a * D);
    }
    if (fused) {
        kvq_rk_attend_init(S->state, GS, D);
        kvq_rk_attend_rows(isa, S->state, S->qb, GS, D, L->k[h], KVQ_DT_F16, D, S->att, L->v[h],
                           KVQ_DT_F16, D, S->att, m_far, scale);
        kvq_rk_attend_rows(isa, S->state, S->qi, GS, D, S->krot, KVQ_DT_F32, D, NULL, L->v[h],
                           KVQ_DT_F16, D, S->att + m_far, WINDOW, scale);
        kvq_rk_attend_finish(S->state, GS, D, out);
    } else if (g_rope) { /* rotated rows (the rerank's rows have their logits), window too */
        const int64_t mf = S->rr_kept ? m_far - S->rr_kept : m_far;
        kvq_rk_logits(isa, S->qi, GS, D, L->kr[h], KVQ_DT_F16, D, S->att, mf, scale, S->logits, m);
        kvq_rk_logits(isa, S->qi, GS, D, L->kr[h] + (size_t)w_beg * D, KVQ_DT_F16, D, NULL, WINDOW,
                      scale, S->logits + m_far, m);
    } else { /* the rerank's rows have their logits: the sinks' only */
        kvq_rk_logits(isa, S->qb, GS, D, L->k[h], KVQ_DT_F16, D, S->att,
                      S->rr_kept ? m_far - S->rr_kept : m_far, scale, S->logits, m);
    }
    if (!fused) {
        if (!g_rope)
            kvq_rk_logits(isa, S->qi, GS, D, S->krot, KVQ_DT_F32, D, NULL, WINDOW, scale,
                          S->logits + m_far, m);
        kvq_rk_softmax(isa, S->logits, GS, m, m);
        kvq_rk_mix(isa, S->logits, GS, m, L->v[h], KVQ_DT_F16, D, S->att, m, D, out);
    }
    S->phase[3] += clk() - t1;
    memcpy(L->att[h], S->att, sizeof(int32_t) * (size_t)m);
    ((layer *)L)->n_att[h] = m;
    return m;
}

static int64_t retrieval_step(const layer *L, int h, kvq_isa isa, int fused, int by_scores,
                              int bands, int64_t k_sel, scratch *S, float *out)
{
    const int64_t ns = retrieval_front(L, h, isa, by_scores, bands, k_sel, S);
    return retrieval_back(L, h, isa, fused, k_sel, ns, S, out);
}

/* --pipeline: thread's heads h0, h0 + 1, ... h1 - 1, each head's front run before the
 * previous head's back, its stage's kernel prefetching the previous head's rerank rows. */
static int64_t retrieval_pipeline(const layer *L, int h0, int h1, kvq_isa isa, int fused,
                                  int by_scores, int bands, int64_t k_sel, scratch *S,
                                  float *out)
{
    int64_t att = 0, prev_ns = 0;
    int prev = -1;
    for (int h = h0; h <= h1; h++) {
        int64_t ns = 0;
        if (h < h1) {
            S->pf_n = prev >= 0 ? prev_ns : 0;
            S->pf_base = prev >= 0 ? (const char *)(g_rope ? L->kr[prev] : L->k[prev]) : NULL;
            S->pf_rows = S->att2 + SINK;
            ns = retrieval_front(L, h, isa, by_scores, bands, k_sel, S);
            S->pf_n = 0;
        }
        int32_t *tmp = S->att; /* this head's candidates to att2, the previous head's to att */
        S->att = S->att2;
        S->att2 = tmp;
        if (prev >= 0)
            att += retrieval_back(L, prev, isa, fused, k_sel, prev_ns, S,
                                  out + (size_t)prev * GS * D);
        prev = h;
        prev_ns = ns;
    }
    return att;
}

/* The attended K and V rows of head h read with plain loads and nothing else (K rows,
 * then V rows, as the step reads them): what the memory system gives this access
 * pattern, the "rows" reference. */
static uint64_t gather_rows(const layer *L, int h)
{
    uint64_t s = 0;
    for (int pass = 0; pass < 2; pass++) {
        const int kb = 2; /* bytes per element (f16) */
        const char *base = pass ? (const char *)L->v[h] : g_rope ? (const char *)L->kr[h]
                                                                 : (const char *)L->k[h];
        for (int64_t a = 0; a < L->n_att[h]; a++) {
            const uint64_t *r = (const uint64_t *)(base + (size_t)L->att[h][a] * D * kb);
            for (int t = 0; t < D * kb / 8; t++)
                s += r[t];
        }
    }
    return s;
}

/* Every row the step reads by index with plain loads and nothing else, as it reads them:
 * the rerank's key rows (its candidates, L->rr), the sinks' and window's key rows, then
 * every attended value row (without a rerank: the attended key rows, then the value
 * rows, gather_rows). The bytes into *bytes. */
static uint64_t gather_step_rows(const layer *L, int h, double *bytes)
{
    if (!L->n_rr[h]) {
        *bytes += (double)L->n_att[h] * D * 4;
        return gather_rows(L, h);
    }
    uint64_t s = 0;
    const char *kb = g_rope ? (const char *)L->kr[h] : (const char *)L->k[h];
    const int64_t na = L->n_att[h];
    for (int pass = 0; pass < 3; pass++) {
        const char *base = pass == 2 ? (const char *)L->v[h] : kb;
        const int32_t *rows = pass == 0 ? L->rr[h] : L->att[h];
        for (int64_t a = 0; a < (pass == 0 ? L->n_rr[h] : na); a++) {
            if (pass == 1 && a == SINK) /* the sinks, then the window */
                a = na - WINDOW;
            const uint64_t *r = (const uint64_t *)(base + (size_t)rows[a] * D * 2);
            for (int t = 0; t < D * 2 / 8; t++)
                s += r[t];
            *bytes += D * 2;
        }
    }
    return s;
}

/* The residual stage's kernel (kvq_rk_resid_scores_max, all the group's heads) over m
 * consecutive candidate rows of head 0 whose records, groups and tables stay in cache:
 * its ns a candidate when memory is not what waits (a compute bound: the kernel's
 * operations are fixed by its bits). The groups are those the last step of thread 0
 * wrote (S->rsel, every candidate, --preset smollm2's path), else none (one first-stage
 * score per candidate). */
static double stage_in_cache(const layer *L, kvq_isa isa, scratch *S)
{
    const int64_t nc = L->n - SINK - WINDOW;
    int64_t m = nc / GS < 4096 ? nc / GS : 4096;
    m -= m % 64;
    if (m < 64 || !L->rq[0])
        return 0;
    const int64_t a0 = (nc / 2) & ~(int64_t)63; /* mid-cache rows */
    const int every = S->bands.nb > 0 && S->bands.K > 0 && L->tok[0];
    const int32_t nbk = every ? S->bands.nb * S->bands.K : 0;
    int32_t *tok = malloc(sizeof *tok * (size_t)m), *grp = malloc(sizeof *grp * (size_t)m);
    float *sc = malloc(sizeof *sc * (size_t)m), *first = S->lut + 32768;
    const size_t tl = KVQ_RK_SIGN_TABLE_LEN(D);
    float *tab = malloc(sizeof *tab * GS * tl);
    if (!tok || !grp || !sc || !tab) {
        free(tok);
        free(grp);
        free(sc);
        free(tab);
        return 0;
    }
    for (int64_t i = 0; i < m; i++) {
        tok[i] = (int32_t)(SINK + a0 + i);
        grp[i] = every ? S->rsel[a0 + i] % nbk : 0;
    }
    if (!every) /* one score per candidate: first [GS, m] */
        first = S->scores;
    for (int g = 0; g < GS; g++)
        kvq_rk_sign_table(S->qi + g * D, D, tab + (size_t)g * tl);
    const int reps = 64;
    double best = 0;
    for (int pass = 0; pass < 4; pass++) { /* the first warms the caches */
        const double t0 = clk();
        for (int r = 0; r < reps; r++)
            kvq_rk_resid_scores_max(isa, tab, GS, D / 8, L->rq[0], L->rqs[0], tok, first,
                                    every ? (size_t)nbk : (size_t)m, every ? grp : NULL, m, sc);
        const double t = (clk() - t0) / ((double)reps * (double)m);
        if (pass > 0 && (best == 0 || t < best))
            best = t;
        bench_sink += (uint64_t)(sc[0] > 0);
    }
    free(tok);
    free(grp);
    free(sc);
    free(tab);
    return 1e9 * best;
}

/* ---- main ------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    args a;
    if (parse(argc, argv, &a))
        return 2;
    int rc = 1;
    kvq_codebook *cb[N_KV] = {0};
    uint64_t *flush = malloc(FLUSH_BYTES);
    scratch *scr = calloc((size_t)a.threads, sizeof *scr);
    if (!flush || !scr)
        return 1;
    memset(flush, 0, FLUSH_BYTES);
    kvq_rng rng;
    kvq_rng_seed(&rng, (uint64_t)a.seed);

    /* one random codebook per KV head (vq, d 128) and its f16 LUT table */
    layer L;
    memset(&L, 0, sizeof L);
    float *W = malloc(sizeof(float) * (size_t)a.codebook * D);
    for (int h = 0; h < N_KV; h++) {
        for (int64_t i = 0; i < a.codebook * D; i++)
            W[i] = (float)kvq_rng_normal(&rng);
        kvq_codebook_desc desc = {.method = KVQ_CODEBOOK_VQ,
                                  .dim = D,
                                  .k = (int32_t)a.codebook,
                                  .groups = 1,
                                  .rope = kvq_rope_default(D),
                                  .wrope_b = 2048};
        kvq_err e = {0};
        if (kvq_codebook_create(&desc, W, NULL, NULL, &cb[h], &e) ||
            kvq_rk_table_create(cb[h], &L.tab[h], &e)) {
            fprintf(stderr, "bench_decode: %s\n", e.msg);
            return 1;
        }
    }
    free(W);
    double bwt[4], rbwt[4];
    for (int ti = 0; ti < a.nt; ti++) {
        bwt[ti] = memcpy_bandwidth(a.reps, (int)a.tlist[ti]);
        rbwt[ti] = read_bandwidth(a.reps, (int)a.tlist[ti], flush);
    }
    const double bw = bwt[0], rbw = rbwt[0];
    printf("bench_decode: %d query heads, %d KV heads, d %d, f16 cache, codebook %lld, budget "
           "%.4g, isa %s, threads %lld, attention %s, selection from %s, rows in %s order, "
           "score %s, rerank %g (+%g of the cache), residual stage %s (share %g, %s), "
           "positions %s, clock %s\n",
           N_HEADS, N_KV, D, (long long)a.codebook, a.budget, kvq_isa_name(a.isa),
           (long long)a.threads, a.fused ? "fused" : "twopass",
           a.scores == 1 ? "scores"
           : a.bands     ? "(code, band) groups in code order, else scores"
           : a.scores < 0 ? "codes or scores (auto)"
                          : "codes",
           a.token_order ? "token" : "code", a.bands ? "bands (one LUT per distance band)" : "rb",
           g_rerank, g_rerank_extra,
           g_resid > 1 && rerank_on() ? (g_resid_exact ? "on, exact (per-candidate rotation)"
                                                        : "on, sign table")
                                       : "off",
           g_resid_share, g_resid_max ? "max" : "sum",
           g_rope ? "rope (keys held rotated, f16)" : "wrope",
           g_thread_clock ? "thread CPU time (the largest of the threads')"
           : g_cpu_clock  ? "process CPU time"
                          : "wall");
    for (int ti = 0; ti < a.nt; ti++)
        printf("threads %lld: memcpy: %.2f GB/s (read + write bytes, 256 MiB, best of %lld); "
               "streaming read: %.2f GB/s (sum of 256 MiB, best of %lld)\n",
               (long long)a.tlist[ti], bwt[ti] / 1e9, (long long)a.reps, rbwt[ti] / 1e9,
               (long long)a.reps);
    printf("\n");
    (void)bw;
    (void)rbw;
    printf("%8s | %9s %7s %7s %6s %6s | %8s %6s %6s | %8s %7s | %7s %8s %7s | %7s\n", "context",
           "full ms", "MiB", "GB/s", "%cpy", "%read", "retr ms", "K", "MiB", "floor ms",
           "x floor", "rows GB/s", "rfloor ms", "x rfloor", "speedup");

    double theta[D / 2];
    kvq_rope r = kvq_rope_default(D);
    kvq_rope_freqs(&r, theta);
    for (int ci = 0; ci < a.n_contexts; ci++) {
        const int64_t n = a.contexts[ci];
        L.n = n;
        /* synthetic cache: keys and values ~ N(0, 1) in f16, random codes */
        double t_sort = 0; /* putting the candidates' rows in code order, all heads */
        float *tmp = malloc(sizeof(float) * (size_t)n * D);
        for (int h = 0; h < N_KV; h++) {
            L.k[h] = bench_cache_alloc(sizeof(uint16_t) * (size_t)n * D);
            L.v[h] = bench_cache_alloc(sizeof(uint16_t) * (size_t)n * D);
            L.codes[h] = malloc(sizeof(uint16_t) * (size_t)n);
            if (!tmp || !L.k[h] || !L.v[h] || !L.codes[h]) {
                fprintf(stderr, "bench_decode: out of memory at context %lld\n", (long long)n);
                return 1;
            }
            for (int pass = 0; pass < 2; pass++) {
                for (int64_t i = 0; i < n * D; i++)
                    tmp[i] = unit(&rng);
                kvq_f32_to_f16(tmp, pass ? L.v[h] : L.k[h], (size_t)n * D);
            }
            L.tok[h] = NULL;
            L.hist[h] = calloc((size_t)a.codebook, sizeof *L.hist[h]);
            L.att[h] = malloc(sizeof(int32_t) * (size_t)n);
            L.rr[h] = malloc(sizeof(int32_t) * (size_t)n);
            L.n_rr[h] = 0;
            if (!L.hist[h] || !L.att[h] || !L.rr[h])
                return 1;
            for (int64_t j = 0; j < n; j++) {
                L.codes[h][j] = (uint16_t)kvq_rng_below(&rng, (uint64_t)a.codebook);
                L.hist[h][L.codes[h][j]]++;
            }
            if (!a.token_order) {
                bench_flush_caches(flush);
                const double t0 = clk();
                if (sort_candidates(&L, h, (int32_t)a.codebook))
                    return 1;
                t_sort += clk() - t0;
            }
        }
        free(tmp);
        for (int i = 0; i < N_HEADS * D; i++)
            L.q[i] = (float)kvq_rng_normal(&rng);
        if (a.bands && band_queries(&L, n, theta))
            return 1;
        for (int h = 0; h < N_KV && g_rope; h++)
            if (rotated_keys(&L, h, theta))
                return 1;
        for (int h = 0; h < N_KV && g_resid > 1 && rerank_on(); h++)
            if (resid_build(&L, h, theta)) {
                fprintf(stderr, "bench_decode: out of memory at context %lld\n", (long long)n);
                return 1;
            }
        if (g_resid > 1 && rerank_on() && g_resid_exact && g_rope) {
            L.pcos = malloc(sizeof(float) * (size_t)n * (D / 2));
            L.psin = malloc(sizeof(float) * (size_t)n * (D / 2));
            if (!L.pcos || !L.psin)
                return 1;
            for (int64_t t = 0; t < n; t++)
                for (int m = 0; m < D / 2; m++) {
                    L.pcos[(size_t)t * (D / 2) + m] = (float)cos((double)t * theta[m]);
                    L.psin[(size_t)t * (D / 2) + m] = (float)sin((double)t * theta[m]);
                }
        }
        for (int m = 0; m < D / 2; m++) {
            L.bcos[m] = (float)cos(2048.0 * theta[m]);
            L.bsin[m] = (float)sin(2048.0 * theta[m]);
            L.icos[m] = (float)cos((double)(n - 1) * theta[m]);
            L.isin[m] = (float)sin((double)(n - 1) * theta[m]);
            for (int w = 0; w < WINDOW; w++) {
                const double ang = (double)(n - WINDOW + w) * theta[m];
                L.wcos[w * (D / 2) + m] = (float)cos(ang);
                L.wsin[w * (D / 2) + m] = (float)sin(ang);
            }
        }
        for (int t = 0; t < a.threads; t++) {
            scratch *S = &scr[t];
            S->scores = realloc(S->scores, sizeof(float) * (size_t)n);
            S->logits = realloc(S->logits, sizeof(float) * (size_t)n * GS);
            S->rlg = realloc(S->rlg, sizeof(float) * (size_t)n * GS);
            S->rsel = realloc(S->rsel, sizeof(int32_t) * (size_t)n);
            S->krot = realloc(S->krot, sizeof(float) * WINDOW * D);
            S->work = realloc(S->work, sizeof(uint32_t) * 2 * (size_t)n);
            S->att = realloc(S->att, sizeof(int32_t) * (size_t)n);
            S->att2 = realloc(S->att2, sizeof(int32_t) * (size_t)n);
            S->cwork = realloc(S->cwork, sizeof(uint32_t) * 4 * (size_t)a.codebook);
        }
        const int64_t k_sel = (int64_t)ceil(a.budget * (double)n);
        int by_scores =
            a.scores >= 0 ? a.scores : !kvq_rk_codes_select_pays(n - SINK - WINDOW, (int32_t)a.codebook);
        if (a.bands) { /* from the groups where the runtime does (kvq_rt_banded_select) */
            const int64_t nk = (int64_t)band_count(n) * a.codebook;
            by_scores = a.scores == 1 || a.token_order || 3 * nk > 2 * n || nk > 65536 ||
                        (a.scores < 0 && !kvq_rk_bands_select_pays(n - SINK - WINDOW,
                                                                   band_count(n),
                                                                   (int32_t)a.codebook));
        }
        float *out_full = malloc(sizeof(float) * N_HEADS * D),
              *out_ret = malloc(sizeof(float) * N_HEADS * D);
        const int64_t R = a.reps * a.nt; /* times [nt, reps]: thread counts alternate */
        double *tf = malloc(sizeof(double) * R), *tr = malloc(sizeof(double) * R),
               *tg = malloc(sizeof(double) * R), ph[4][10] = {{0}};
        int64_t attended = 0;
        for (int64_t rep = 0; rep < a.reps; rep++)
            for (int ti = 0; ti < a.nt; ti++) {
                const int T = (int)a.tlist[ti];
                const int64_t ri = ti * a.reps + rep;
                for (int t = 0; t < T; t++)
                    memset(scr[t].phase, 0, sizeof scr[t].phase);
                bench_flush_caches(flush);
                double t0 = clk();
#pragma omp parallel num_threads(T)
                {
                    const double s0 = clk();
                    scratch *S = &scr[thread_index()];
#pragma omp for schedule(static) nowait
                    for (int h = 0; h < N_KV; h++)
                        full_step(&L, h, a.isa, a.fused, S, out_full + (size_t)h * GS * D);
                    g_tt[thread_index()] = clk() - s0;
                }
                tf[ri] = region_time(T, t0);
                bench_flush_caches(flush);
                t0 = clk();
                int64_t att = 0;
#pragma omp parallel num_threads(T) reduction(+ : att)
                {
                    const double s0 = clk();
                    scratch *S = &scr[thread_index()];
                    if (g_pipe) { /* the heads of schedule(static), in one pipeline */
                        const int ti2 = thread_index();
                        att += retrieval_pipeline(&L, ti2 * N_KV / T, (ti2 + 1) * N_KV / T, a.isa,
                                                  a.fused, by_scores, a.bands, k_sel, S, out_ret);
                    } else {
#pragma omp for schedule(static) nowait
                        for (int h = 0; h < N_KV; h++)
                            att += retrieval_step(&L, h, a.isa, a.fused, by_scores, a.bands,
                                                  k_sel, S, out_ret + (size_t)h * GS * D);
                    }
                    g_tt[thread_index()] = clk() - s0;
                }
                tr[ri] = region_time(T, t0);
                attended = att;
                for (int t = 0; t < T; t++)
                    for (int i = 0; i < 10; i++)
                        ph[ti][i] += scr[t].phase[i] / (double)a.reps;
                bench_flush_caches(flush);
                t0 = clk();
                uint64_t gs = 0;
#pragma omp parallel num_threads(T) reduction(+ : gs)
                {
                    const double s0 = clk();
#pragma omp for schedule(static) nowait
                    for (int h = 0; h < N_KV; h++)
                        gs += gather_rows(&L, h);
                    g_tt[thread_index()] = clk() - s0;
                }
                tg[ri] = region_time(T, t0);
                bench_sink += gs;
            }
        const double b_full = (double)N_KV * n * D * 2 * 2;
        const int kb = 2; /* bytes per key element (f16, the rotated keys of rope too) */
        const double b_rows = (double)attended * D * (kb + 2);
        const int64_t n_luts = a.bands ? band_count(n) : 1; /* LUTs per step and head */
        const int64_t nc = n - SINK - WINDOW, k2 = rerank_count(k_sel, nc),
                      k1 = resid_count(k2, nc);
        const double b_stage = (double)N_KV * (D / 8 + 4) * (double)(k1 > k2 ? k1 : 0);
        const double b_ret = (double)N_KV * n_luts * (double)kvq_rk_table_bytes(L.tab[0]) +
                             (double)N_KV * nc * 2 +
                             (by_scores ? 0.0 : (double)N_KV * 4.0 * (double)a.codebook) + b_rows +
                             (double)N_KV * (double)(k2 - k_sel) * D * kb + b_stage;
        /* the stage's kernel in cache (a compute bound: its bits fix its work) */
        const double ns_stage = b_stage > 0 ? stage_in_cache(&L, a.isa, &scr[0]) : 0;
        /* every row the step reads by index, read with plain loads (cold, best of reps),
         * after one untimed step that records the rerank's rows */
        g_record = 1;
        for (int h = 0; h < N_KV; h++)
            retrieval_step(&L, h, a.isa, a.fused, by_scores, a.bands, k_sel, &scr[0],
                           out_ret + (size_t)h * GS * D);
        g_record = 0;
        uint64_t ck = 1469598103934665603ull; /* FNV-1a of the last step's outputs */
        for (size_t i = 0; i < sizeof(float) * N_HEADS * D; i++)
            ck = (ck ^ ((const unsigned char *)out_ret)[i]) * 1099511628211ull;
        printf("%8s   the retrieval step's output: FNV-1a %016llx (the same for every "
               "--pipeline, thread count and repetition)\n", "", (unsigned long long)ck);
        double t_srows[4], b_srows = 0;
        for (int ti = 0; ti < a.nt; ti++) {
            const int T = (int)a.tlist[ti];
            t_srows[ti] = 0;
            for (int64_t rep = 0; rep < a.reps; rep++) {
                bench_flush_caches(flush);
                const double t0 = clk();
                uint64_t gs = 0;
                double bb = 0;
#pragma omp parallel num_threads(T) reduction(+ : gs, bb)
                {
                    const double s0 = clk();
#pragma omp for schedule(static) nowait
                    for (int h = 0; h < N_KV; h++)
                        gs += gather_step_rows(&L, h, &bb);
                    g_tt[thread_index()] = clk() - s0;
                }
                const double tt = region_time(T, t0);
                t_srows[ti] = rep == 0 || tt < t_srows[ti] ? tt : t_srows[ti];
                b_srows = bb;
                bench_sink += gs;
            }
        }
        for (int ti = 0; ti < a.nt; ti++) {
            const int T = (int)a.tlist[ti];
            double *f = tf + ti * a.reps, *rr = tr + ti * a.reps, *g = tg + ti * a.reps;
            const double t_full = g_best ? best_of(f, a.reps) : median(f, a.reps),
                         t_ret = g_best ? best_of(rr, a.reps) : median(rr, a.reps),
                         t_rows = g_best ? best_of(g, a.reps) : median(g, a.reps);
            const double bwi = bwt[ti], rbwi = rbwt[ti];
            char tlabel[32];
            snprintf(tlabel, sizeof tlabel, "  (%d thread%s)", T, T > 1 ? "s" : "");
            /* floors: every byte at the streaming read rate; and the attended rows at the
             * rate plain loads of exactly those rows achieved (t_rows), the rest streaming */
            const double f_stream = b_ret / rbwi, f_rows = t_rows + (b_ret - b_rows) / rbwi;
            printf("%8lld | %9.3f %7.1f %7.2f %5.0f%% %5.0f%% | %8.3f %6lld %6.1f | %8.3f %7.2f | "
                   "%7.2f %8.3f %7.2f | %6.1fx%s\n",
                   (long long)n, 1e3 * t_full, b_full / 1048576.0, b_full / t_full / 1e9,
                   100.0 * (b_full / t_full) / bwi, 100.0 * (b_full / t_full) / rbwi,
                   1e3 * t_ret, (long long)k_sel, b_ret / 1048576.0, 1e3 * f_stream,
                   t_ret / f_stream, b_rows / t_rows / 1e9, 1e3 * f_rows, t_ret / f_rows,
                   t_full / t_ret, a.nt > 1 ? tlabel : "");
            printf("%8s   retrieval per step, summed over KV heads: LUT %.3f ms, %s %.3f ms, "
                   "top-k %.3f ms (first selection %.3f, residual stage %.3f: its LUTs and "
                   "sign tables %.3f, kernel %.3f, top-k %.3f; rerank %.3f), attention %.3f ms\n",
                   "", 1e3 * ph[ti][0], by_scores ? "score" : "counts", 1e3 * ph[ti][1],
                   1e3 * ph[ti][2], 1e3 * ph[ti][9], 1e3 * ph[ti][5], 1e3 * ph[ti][6],
                   1e3 * ph[ti][7], 1e3 * ph[ti][8], 1e3 * ph[ti][4], 1e3 * ph[ti][3]);
            /* the bound the stage's work sets: its kernel at its in-cache rate over every
             * candidate it scores (T threads share the heads), the other bytes streamed */
            const double t_stage = ns_stage * 1e-9 * (double)N_KV * (double)k1 / T,
                         f_comp = t_stage > b_stage / rbwi ? t_stage + (b_ret - b_stage) / rbwi
                                                           : f_stream;
            printf("%8s   summary, %d thread%s: step %.3f ms, bytes floor %.3f ms (%.1f MiB at "
                   "%.2f GB/s), %.2fx the floor, %.2fx faster than full attention (%.3f ms)",
                   "", T, T > 1 ? "s" : "", 1e3 * t_ret, 1e3 * f_stream, b_ret / 1048576.0,
                   rbwi / 1e9, t_ret / f_stream, t_full / t_ret, 1e3 * t_full);
            if (b_stage > 0)
                printf("; the stage's kernel in cache %.2f ns a candidate: %.3f ms of work for "
                       "its %lld candidates x %d heads, so at least %.3f ms (%.2fx the bytes "
                       "floor; the step is %.2fx that)",
                       ns_stage, 1e3 * t_stage, (long long)k1, N_KV, 1e3 * f_comp,
                       f_comp / f_stream, t_ret / f_comp);
            /* and the rows it reads by index at the rate plain loads of them reach */
            const double f_rc = t_stage + t_srows[ti] + (b_ret - b_stage - b_srows) / rbwi;
            printf("\n%8s   rows read by index (the rerank's key rows, the sinks' and window's "
                   "keys, the attended value rows): %.1f MiB, plain loads of them alone %.3f ms "
                   "(%.2f GB/s, best of %lld); with the stage's work and the other bytes "
                   "streamed: %.3f ms (%.2fx the bytes floor; the step is %.2fx that)\n",
                   "", b_srows / 1048576.0, 1e3 * t_srows[ti], b_srows / t_srows[ti] / 1e9,
                   (long long)a.reps, 1e3 * f_rc, f_rc / f_stream, t_ret / f_rc);
        }
        if (!a.token_order)
            printf("%8s   code order: sorting the candidates' rows took %.1f ms for the %d "
                   "heads (once per prompt, then at growing lengths; not in the step)\n",
                   "", 1e3 * t_sort, N_KV);
        fflush(stdout);
        for (int h = 0; h < N_KV; h++) {
            free(L.k[h]);
            free(L.v[h]);
            free(L.codes[h]);
            free(L.hist[h]);
            free(L.att[h]);
            free(L.rr[h]);
            free(L.tok[h]);
            free(L.kr[h]);
            L.kr[h] = NULL;
            free(L.rq[h]);
            free(L.rqo[h]);
            free(L.rqs[h]);
            free(L.rqso[h]);
            L.rq[h] = L.rqo[h] = NULL;
            L.rqs[h] = L.rqso[h] = NULL;
        }
        free(L.pcos);
        free(L.psin);
        L.pcos = L.psin = NULL;
        free(out_full);
        free(out_ret);
        free(tf);
        free(tr);
        free(tg);
    }
    rc = 0;
    for (int h = 0; h < N_KV; h++) {
        kvq_rk_table_free(L.tab[h]);
        kvq_codebook_free(cb[h]);
    }
    free(L.bq);
    free(L.bqh);
    for (int t = 0; t < a.threads; t++) {
        free(scr[t].scores);
        free(scr[t].logits);
        free(scr[t].krot);
        free(scr[t].rlg);
        free(scr[t].rsel);
        free(scr[t].work);
        free(scr[t].att);
        free(scr[t].att2);
        free(scr[t].cwork);
    }
    free(scr);
    free(flush);
    printf("\nbytes: full = K + V of every token; retrieval = LUT tables + codes + code counts + "
           "attended K, V rows. floor = bytes / streaming read bandwidth; rows GB/s = plain "
           "loads of the attended rows alone (cold, same threads); rfloor = those loads' time + "
           "the other bytes at the streaming rate.\n");
    return rc;
}
