/* bench_model.c — prefill and decode rates of a real quantized model: kvq with 8-bit
 * activations (kvq_forward_params.act_q8, decision 019), kvq with f32 activations, the
 * same model converted to F32, and llama.cpp, on the same machine, tokens and thread
 * counts, in one run.
 *
 * Per round (best of --rounds), every thread count (--threads 1,2 by default) and at
 * each every configuration in turn (alternated, so a burst of load on the shared
 * machine falls on all of them alike; the 1-minute load average's range over the
 * rounds is printed with each thread count's figures): the forward context is reset, a prompt of --prefill token ids
 * runs as one chunk with the logits of its last token (prefill tokens/s), then
 * --decode ids follow one at a time, each with its logits (decode tokens/s). The ids
 * are fixed pseudo-random ids (seed 1) of the vocabulary beyond its first 32.
 *
 *   kvq Q4_1 q8-act   the file as it is, weights packed in the mapping; single-token
 *                     products quantize the activations to 8 bits per 32 values and
 *                     multiply in integers (model/q8dot.c); prefill chunks in the
 *                     tiled integer GEMM (model/q8gemm.c)
 *   kvq Q4_1 f32-act  the same with f32 activations: decode runs kvq_quant_matvec,
 *                     prefill dequantized row tiles and SGEMM
 *   kvq F32           the same model written as an F32 GGUF (kvq's GGUF writer, every
 *                     tensor dequantized) in a temporary directory (--no-f32: skipped)
 *   llama.cpp         bench/llamacpp_peer.py (llama-cpp-python) on the original file,
 *                     the same ids, n_threads = n_threads_batch = the thread count, one
 *                     round per call (its model load is outside the timing)
 *
 * usage: bench_model [--model PATH] [--threads N[,N...]] [--prefill N] [--decode N]
 *                    [--rounds N] [--peer SCRIPT | --no-peer] [--no-f32]
 *        bench_model [--model PATH] --write-f32 OUT   (only writes the F32 copy to OUT:
 *                    bench/bench_load.sh runs `kvq run` on it)
 *   --model: default $KVQ_SMOLLM2, else .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
 *   (scripts/fetch-model.sh prints and fetches it). Defaults: threads 1,2, prefill 128,
 *   decode 64, 3 rounds, peer bench/llamacpp_peer.py run with $PYTHON or python3.
 *   A peer that fails (not installed, crashes, an error record) fails the run (exit 1)
 *   rather than leaving kvq's figures alone; scripts/install-llamacpp-peer.sh installs
 *   the pinned llama-cpp-python the figures are taken with. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvq/gguf.h"
#include "kvq/model.h"
#include "kvq/util.h"

typedef struct opts {
    const char *model, *peer, *write_f32;
    int threads[8], n_threads, prefill, decode, rounds, f32;
} opts;

typedef struct rates {
    double prefill, decode; /* tokens per second, best round */
} rates;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int die(const char *what, const kvq_err *e)
{
    fprintf(stderr, "bench_model: %s: %s\n", what, e->msg);
    return 1;
}

/* Every tensor of src as F32, every metadata key copied: the same model in f32. */
static int write_f32_copy(const char *src, const char *dst, kvq_err *e)
{
    kvq_gguf *g = NULL;
    if (kvq_gguf_open(src, &g, e))
        return -1;
    kvq_gguf_writer *w = kvq_gguf_writer_new();
    int rc = w ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < kvq_gguf_kv_count(g); i++) {
        const kvq_gguf_kv *kv = kvq_gguf_kv_at(g, i);
        rc = kvq_gguf_writer_set(w, kv->key, &kv->value, e) ? -1 : 0;
    }
    for (size_t i = 0; rc == 0 && i < kvq_gguf_tensor_count(g); i++) {
        const kvq_gguf_tensor *t = kvq_gguf_tensor_at(g, i);
        const int64_t rows = kvq_gguf_tensor_rows(t);
        const size_t n = (size_t)rows * (size_t)t->ne[0];
        float *x = malloc(n * sizeof(float));
        rc = x && !kvq_gguf_rows_to_f32(t, 0, rows, x, e) &&
                     !kvq_gguf_writer_add_tensor(w, t->name, KVQ_GGML_F32, t->ndim, t->ne, x,
                                                 n * sizeof(float), e)
                 ? 0 : -1;
        free(x);
    }
    if (rc == 0)
        rc = kvq_gguf_writer_write(w, dst, 1, e) ? -1 : 0;
    kvq_gguf_writer_free(w);
    kvq_gguf_close(g);
    return rc;
}

/* One kvq configuration: a model, its forward context and its best rates so far. */
typedef struct kvq_cfg {
    const char *label;
    kvq_model *m;
    kvq_forward *f;
    float *logits;
    uint64_t mapped;
    rates best;
} kvq_cfg;

static int cfg_open(kvq_cfg *c, const char *label, const char *path, const opts *o, int threads,
                    int act_q8)
{
    kvq_err e = {0};
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    memset(c, 0, sizeof *c);
    c->label = label;
    if (kvq_model_open(path, &mp, &c->m, &e))
        return die(path, &e);
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = threads;
    fp.chunk = o->prefill;
    fp.max_tokens = o->prefill + o->decode;
    fp.act_q8 = act_q8;
    if (kvq_forward_create(c->m, &fp, &c->f, &e))
        return die("forward", &e);
    kvq_model_memory mem;
    kvq_model_memory_estimate(c->m, &fp, fp.max_tokens, &mem);
    c->mapped = mem.mapped_bytes;
    c->logits = malloc(sizeof(float) * (size_t)kvq_model_config_get(c->m)->vocab_size);
    return c->logits ? 0 : 1;
}

static void cfg_close(kvq_cfg *c)
{
    free(c->logits);
    kvq_forward_free(c->f);
    kvq_model_close(c->m);
}

/* One round: reset, the prompt as one chunk (prefill rate), then one token at a time
 * (decode rate); keeps the best of each. */
static int cfg_round(kvq_cfg *c, const opts *o, const int32_t *ids)
{
    kvq_err e = {0};
    kvq_forward_reset(c->f);
    double t0 = now();
    if (kvq_forward_tokens(c->f, ids, o->prefill, KVQ_LOGITS_LAST, c->logits, &e))
        return die("prefill", &e);
    double t1 = now();
    for (int i = 0; i < o->decode; i++)
        if (kvq_forward_tokens(c->f, ids + o->prefill + i, 1, KVQ_LOGITS_LAST, c->logits, &e))
            return die("decode", &e);
    double t2 = now();
    c->best.prefill = fmax(c->best.prefill, o->prefill / (t1 - t0));
    c->best.decode = fmax(c->best.decode, o->decode / (t2 - t1));
    return 0;
}

/* Runs the llama.cpp peer; 0 and *r filled, or -1 (with a line saying why). */
static int bench_peer(const opts *o, int threads, const char *ids_path, rates *r, char *version,
                      size_t vn)
{
    const char *py = getenv("PYTHON");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s '%s' '%s' --threads %d --prefill %d --decode %d --rounds 1",
             py && *py ? py : "python3", o->peer, o->model, ids_path, threads, o->prefill,
             o->decode);
    FILE *p = popen(cmd, "r");
    char line[1024] = {0};
    const int got = p && fgets(line, sizeof line, p);
    const int status = p ? pclose(p) : -1;
    const char *a = strstr(line, "\"prefill_tps\":"), *b = strstr(line, "\"decode_tps\":"),
               *v = strstr(line, "\"llama_cpp_python\": \"");
    if (!got || status != 0 || !a || !b) { /* a crash (status), an error record, nothing */
        fprintf(stderr, "bench_model: the llama.cpp peer failed (exit status %d): %s%s%s"
                "bench_model: no comparison (scripts/install-llamacpp-peer.sh installs the "
                "pinned peer; --no-peer runs kvq alone)\n",
                status > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : status,
                got ? line : "no output from ", got ? "" : cmd,
                got && strchr(line, '\n') ? "" : "\n");
        return -1;
    }
    r->prefill = fmax(r->prefill, atof(a + 14));
    r->decode = fmax(r->decode, atof(b + 13));
    if (v) {
        v += 21;
        size_t k = strcspn(v, "\"");
        snprintf(version, vn, "%.*s", (int)(k < vn ? k : vn - 1), v);
    }
    return 0;
}

/* Parses "1,2" into o->threads. */
static int parse_threads(opts *o, const char *v)
{
    o->n_threads = 0;
    for (const char *p = v; *p && o->n_threads < 8; p += strspn(p, ",")) {
        char *end;
        long t = strtol(p, &end, 10);
        if (end == p || t < 1 || t > 1024)
            return -1;
        o->threads[o->n_threads++] = (int)t;
        p = end;
    }
    return o->n_threads > 0 ? 0 : -1;
}

static void print_row(const char *label, rates r, const char *note)
{
    printf("  %-18s prefill %8.1f tok/s   decode %7.1f tok/s   %s\n", label, r.prefill, r.decode,
           note);
}

/* The configurations of one thread count: kvq with 8-bit activations, kvq with f32
 * ones, kvq on the F32 copy; llama.cpp's best rates beside them. */
typedef struct tgroup {
    int threads, nc;
    kvq_cfg c[3];
    rates peer;
    char version[64];
} tgroup;

/* The 1-minute load average now (the machine is shared: every figure is printed with
 * the range seen over its rounds). */
static double load1(void)
{
    double l[1] = {-1};
    return getloadavg(l, 1) == 1 ? l[0] : -1;
}

static void print_group(const opts *o, const tgroup *g, double lo, double hi)
{
    printf("%d thread%s (best of %d rounds; thread counts and configurations alternated in "
           "each round; load average %.1f-%.1f):\n",
           g->threads, g->threads > 1 ? "s" : "", o->rounds, lo, hi);
    for (int i = 0; i < g->nc; i++) {
        char note[96];
        snprintf(note, sizeof note, "(weights %.0f MiB mapped)", g->c[i].mapped / 1048576.0);
        print_row(g->c[i].label, g->c[i].best, note);
    }
    if (o->peer) {
        char note[96];
        snprintf(note, sizeof note, "(llama-cpp-python %s)", g->version);
        print_row("llama.cpp", g->peer, note);
        for (int i = 0; i < g->nc; i++)
            printf("  %-18s / llama.cpp: prefill %.2fx, decode %.2fx\n", g->c[i].label,
                   g->c[i].best.prefill / g->peer.prefill, g->c[i].best.decode / g->peer.decode);
    }
    printf("  q8-act / f32-act:  prefill %.2fx, decode %.2fx\n",
           g->c[0].best.prefill / g->c[1].best.prefill, g->c[0].best.decode / g->c[1].best.decode);
}

/* Every thread count and configuration in each round (alternated, so a burst of load
 * falls on all alike), best of the rounds; then the rates and ratios per thread count. */
static int bench_all(const opts *o, const int32_t *ids, const char *ids_path,
                     const char *f32_path)
{
    tgroup *g = calloc((size_t)o->n_threads, sizeof *g);
    int rc = g ? 0 : 1;
    for (int t = 0; rc == 0 && t < o->n_threads; t++) {
        g[t].threads = o->threads[t];
        snprintf(g[t].version, sizeof g[t].version, "?");
        rc = cfg_open(&g[t].c[g[t].nc++], "kvq Q4_1 q8-act", o->model, o, g[t].threads, 1) ||
             cfg_open(&g[t].c[g[t].nc++], "kvq Q4_1 f32-act", o->model, o, g[t].threads, 0) ||
             (o->f32 && cfg_open(&g[t].c[g[t].nc++], "kvq F32", f32_path, o, g[t].threads, 0));
    }
    double lo = 1e30, hi = -1;
    for (int round = 0; rc == 0 && round < o->rounds; round++)
        for (int t = 0; rc == 0 && t < o->n_threads; t++) {
            const double l = load1();
            lo = fmin(lo, l);
            hi = fmax(hi, l);
            for (int i = 0; rc == 0 && i < g[t].nc; i++)
                rc = cfg_round(&g[t].c[i], o, ids);
            if (rc == 0 && o->peer)
                rc = bench_peer(o, g[t].threads, ids_path, &g[t].peer, g[t].version,
                                sizeof g[t].version) != 0;
        }
    const double l = load1();
    for (int t = 0; rc == 0 && t < o->n_threads; t++)
        print_group(o, &g[t], fmin(lo, l), fmax(hi, l));
    for (int t = 0; g && t < o->n_threads; t++)
        for (int i = 0; i < g[t].nc; i++)
            cfg_close(&g[t].c[i]);
    free(g);
    return rc;
}

int main(int argc, char **argv)
{
    opts o = {.peer = "bench/llamacpp_peer.py", .threads = {1, 2}, .n_threads = 2,
              .prefill = 128, .decode = 64, .rounds = 3, .f32 = 1};
    o.model = getenv("KVQ_SMOLLM2");
    if (!o.model || !*o.model)
        o.model = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) o.model = v, i++;
        else if (!strcmp(a, "--threads") && v) bad |= parse_threads(&o, v), i++;
        else if (!strcmp(a, "--prefill") && v) o.prefill = atoi(v), i++;
        else if (!strcmp(a, "--decode") && v) o.decode = atoi(v), i++;
        else if (!strcmp(a, "--rounds") && v) o.rounds = atoi(v), i++;
        else if (!strcmp(a, "--peer") && v) o.peer = v, i++;
        else if (!strcmp(a, "--no-peer")) o.peer = NULL;
        else if (!strcmp(a, "--no-f32")) o.f32 = 0;
        else if (!strcmp(a, "--write-f32") && v) o.write_f32 = v, i++;
        else bad = 1;
    }
    if (bad) {
        fprintf(stderr, "usage: bench_model [--model PATH] [--threads N[,N...]] [--prefill N] "
                        "[--decode N] [--rounds N] [--peer SCRIPT | --no-peer] [--no-f32]\n");
        return 2;
    }
    if (o.prefill < 1 || o.decode < 1 || o.rounds < 1) {
        fprintf(stderr, "bench_model: --prefill, --decode, --rounds must be >= 1\n");
        return 2;
    }
    if (access(o.model, R_OK) != 0) {
        fprintf(stderr, "bench_model: %s not found (run scripts/fetch-model.sh, or --model)\n",
                o.model);
        return 1;
    }

    if (o.write_f32) {
        kvq_err we = {0};
        return write_f32_copy(o.model, o.write_f32, &we) ? die("f32 copy", &we) : 0;
    }
    /* token ids: fixed pseudo-random ids, shared with the peer through a file */
    char dir[] = "/tmp/kvq-bench-model-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char ids_path[256], f32_path[256];
    snprintf(ids_path, sizeof ids_path, "%s/ids.txt", dir);
    snprintf(f32_path, sizeof f32_path, "%s/model-f32.gguf", dir);
    const int n = o.prefill + o.decode;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    kvq_rng rng;
    kvq_rng_seed(&rng, 1);
    kvq_err e = {0};
    kvq_gguf *g = NULL;
    if (kvq_gguf_open(o.model, &g, &e))
        return die(o.model, &e);
    const kvq_gguf_tensor *emb = kvq_gguf_find_tensor(g, "token_embd.weight");
    const int64_t vocab = emb ? emb->ne[1] : 32000;
    kvq_gguf_close(g);
    FILE *fp = fopen(ids_path, "w");
    for (int i = 0; i < n; i++) {
        ids[i] = 32 + (int32_t)(kvq_rng_u64(&rng) % (uint64_t)(vocab - 32));
        fprintf(fp, "%d\n", ids[i]);
    }
    fclose(fp);

    printf("model %s, prefill %d tokens (one chunk), decode %d tokens\n", o.model, o.prefill,
           o.decode);
    int rc = 0;
    if (o.f32 && write_f32_copy(o.model, f32_path, &e))
        rc = die("f32 copy", &e);
    if (rc == 0)
        rc = bench_all(&o, ids, ids_path, f32_path);
    free(ids);
    kvq_rmtree(dir);
    return rc;
}
