/* bench_model.c — prefill and decode rates of a real quantized model, against the same
 * model converted to F32 and against llama.cpp, on the same machine, tokens and thread
 * count, in one run.
 *
 * Per round (best of --rounds): the forward context is reset, a prompt of --prefill
 * token ids runs as one chunk with the logits of its last token (prefill tokens/s),
 * then --decode ids follow one at a time, each with its logits (decode tokens/s). The
 * ids are fixed pseudo-random ids (seed 1) of the vocabulary beyond its first 32.
 *
 *   kvq Q4_1   the file as it is: weights packed in the mapping; prefill dequantizes
 *              row tiles for SGEMM, decode runs kvq_quant_matvec on the packed blocks
 *   kvq F32    the same model written as an F32 GGUF (kvq's GGUF writer, every tensor
 *              dequantized) in a temporary directory: SGEMM / SGEMV in place
 *   llama.cpp  bench/llamacpp_peer.py (llama-cpp-python) on the original file, the
 *              same ids, n_threads = n_threads_batch = --threads
 *
 * usage: bench_model [--model PATH] [--threads N] [--prefill N] [--decode N]
 *                    [--rounds N] [--peer SCRIPT | --no-peer] [--no-f32]
 *        bench_model [--model PATH] --write-f32 OUT   (only writes the F32 copy to OUT:
 *                    bench/bench_load.sh runs `kvq run` on it)
 *   --model: default $KVQ_SMOLLM2, else .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
 *   (scripts/fetch-model.sh prints and fetches it). Defaults: 2 threads, prefill 128,
 *   decode 64, 3 rounds, peer bench/llamacpp_peer.py run with $PYTHON or python3.
 *   A peer that fails (not installed, crashes, an error record) fails the run (exit 1)
 *   rather than leaving kvq's figures alone; scripts/install-llamacpp-peer.sh installs
 *   the pinned llama-cpp-python the figures are taken with. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvq/gguf.h"
#include "kvq/model.h"
#include "kvq/util.h"

typedef struct opts {
    const char *model, *peer, *write_f32;
    int threads, prefill, decode, rounds, f32;
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

/* Best-of-rounds prefill and decode rates of the model at path. */
static int bench_kvq(const char *path, const opts *o, const int32_t *ids, rates *r,
                     uint64_t *mapped)
{
    kvq_err e = {0};
    kvq_model_params mp = kvq_model_params_default();
    mp.load_tokenizer = 0;
    kvq_model *m = NULL;
    if (kvq_model_open(path, &mp, &m, &e))
        return die(path, &e);
    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = o->threads;
    fp.act_q8 = getenv("Q8") ? 1 : 0;
    fp.chunk = o->prefill;
    fp.max_tokens = o->prefill + o->decode;
    kvq_forward *f = NULL;
    if (kvq_forward_create(m, &fp, &f, &e))
        return die("forward", &e);
    kvq_model_memory mem;
    kvq_model_memory_estimate(m, &fp, fp.max_tokens, &mem);
    *mapped = mem.mapped_bytes;
    float *logits = malloc(sizeof(float) * (size_t)kvq_model_config_get(m)->vocab_size);
    r->prefill = r->decode = 0;
    for (int round = 0; round < o->rounds; round++) {
        kvq_forward_reset(f);
        double t0 = now();
        if (kvq_forward_tokens(f, ids, o->prefill, KVQ_LOGITS_LAST, logits, &e))
            return die("prefill", &e);
        double t1 = now();
        for (int i = 0; i < o->decode; i++)
            if (kvq_forward_tokens(f, ids + o->prefill + i, 1, KVQ_LOGITS_LAST, logits, &e))
                return die("decode", &e);
        double t2 = now();
        r->prefill = fmax(r->prefill, o->prefill / (t1 - t0));
        r->decode = fmax(r->decode, o->decode / (t2 - t1));
    }
    free(logits);
    kvq_forward_free(f);
    kvq_model_close(m);
    return 0;
}

/* Runs the llama.cpp peer; 0 and *r filled, or -1 (with a line saying why). */
static int bench_peer(const opts *o, const char *ids_path, rates *r, char *version, size_t vn)
{
    const char *py = getenv("PYTHON");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s '%s' '%s' --threads %d --prefill %d --decode %d --rounds %d",
             py && *py ? py : "python3", o->peer, o->model, ids_path, o->threads, o->prefill,
             o->decode, o->rounds);
    FILE *p = popen(cmd, "r");
    char line[1024] = {0};
    const int got = p && fgets(line, sizeof line, p);
    const int status = p ? pclose(p) : -1;
    const char *a = strstr(line, "\"prefill_tps\":"), *b = strstr(line, "\"decode_tps\":"),
               *v = strstr(line, "\"llama_cpp_python\": \"");
    if (!got || status != 0 || !a || !b) { /* a crash (status), an error record, nothing */
        fprintf(stderr, "bench_model: the llama.cpp peer failed (exit status %d): %s%s"
                "bench_model: no comparison (scripts/install-llamacpp-peer.sh installs the "
                "pinned peer; --no-peer runs kvq alone)\n", status,
                got ? line : "no output from ", got ? "" : cmd);
        if (!got)
            fputc('\n', stderr);
        return -1;
    }
    r->prefill = atof(a + 14);
    r->decode = atof(b + 13);
    if (v) {
        v += 21;
        size_t k = strcspn(v, "\"");
        snprintf(version, vn, "%.*s", (int)(k < vn ? k : vn - 1), v);
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o = {.peer = "bench/llamacpp_peer.py", .threads = 2, .prefill = 128, .decode = 64,
              .rounds = 3, .f32 = 1};
    o.model = getenv("KVQ_SMOLLM2");
    if (!o.model || !*o.model)
        o.model = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) o.model = v, i++;
        else if (!strcmp(a, "--threads") && v) o.threads = atoi(v), i++;
        else if (!strcmp(a, "--prefill") && v) o.prefill = atoi(v), i++;
        else if (!strcmp(a, "--decode") && v) o.decode = atoi(v), i++;
        else if (!strcmp(a, "--rounds") && v) o.rounds = atoi(v), i++;
        else if (!strcmp(a, "--peer") && v) o.peer = v, i++;
        else if (!strcmp(a, "--no-peer")) o.peer = NULL;
        else if (!strcmp(a, "--no-f32")) o.f32 = 0;
        else if (!strcmp(a, "--write-f32") && v) o.write_f32 = v, i++;
        else {
            fprintf(stderr, "usage: bench_model [--model PATH] [--threads N] [--prefill N] "
                            "[--decode N] [--rounds N] [--peer SCRIPT | --no-peer] [--no-f32]\n");
            return 2;
        }
    }
    if (o.threads < 1 || o.prefill < 1 || o.decode < 1 || o.rounds < 1) {
        fprintf(stderr, "bench_model: --threads, --prefill, --decode, --rounds must be >= 1\n");
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

    printf("model %s, %d threads, prefill %d tokens (one chunk), decode %d tokens, best of "
           "%d rounds\n", o.model, o.threads, o.prefill, o.decode, o.rounds);
    rates q = {0}, f = {0}, l = {0};
    uint64_t qmap = 0, fmap = 0;
    int have_f = 0, have_l = 0;
    char version[64] = "?";
    if (bench_kvq(o.model, &o, ids, &q, &qmap))
        return 1;
    printf("%-10s prefill %8.1f tok/s   decode %7.1f tok/s   (weights %.0f MiB mapped)\n",
           "kvq Q4_1", q.prefill, q.decode, qmap / 1048576.0);
    if (o.f32) {
        if (write_f32_copy(o.model, f32_path, &e))
            return die("f32 copy", &e);
        if (bench_kvq(f32_path, &o, ids, &f, &fmap))
            return 1;
        have_f = 1;
        printf("%-10s prefill %8.1f tok/s   decode %7.1f tok/s   (weights %.0f MiB mapped)\n",
               "kvq F32", f.prefill, f.decode, fmap / 1048576.0);
    }
    if (o.peer) {
        if (bench_peer(&o, ids_path, &l, version, sizeof version) != 0) {
            free(ids);
            kvq_rmtree(dir);
            return 1;
        }
        have_l = 1;
        printf("%-10s prefill %8.1f tok/s   decode %7.1f tok/s   (llama-cpp-python %s)\n",
               "llama.cpp", l.prefill, l.decode, version);
    }
    if (have_f)
        printf("kvq Q4_1 / kvq F32:   prefill %.2fx, decode %.2fx\n", q.prefill / f.prefill,
               q.decode / f.decode);
    if (have_l)
        printf("kvq Q4_1 / llama.cpp: prefill %.2fx, decode %.2fx (llama.cpp is %.2fx / %.2fx "
               "faster)\n", q.prefill / l.prefill, q.decode / l.decode, l.prefill / q.prefill,
               l.decode / q.decode);
    free(ids);
    kvq_rmtree(dir);
    return 0;
}
