/* capture.c — capture.json writer and the capture writer: per-layer temporary raw files,
 * the moment sums, assembling the layer files and the atomic rename (kvq/capture.h,
 * docs/capture.md). Capture from a model is in capture_run.c, the merge in
 * capture_merge.c. */
#include "kvq/capture.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kvq/half.h"
#include "kvq/model.h"
#include "kvq/util.h"

#include "calib/capture_internal.h"

#define INT_CHUNK 16384              /* int32 values per write of q_rows/pos/seq/tokens */

/* ======================================================================================
 * capture.json writer
 * ====================================================================================== */

/* Shortest decimal that reads back as the same double. */
static void json_num(FILE *f, double x)
{
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    fputs(buf, f);
}

/* model.attention (version 2): what decides each layer's attention (kvq_model_attn),
 * then "layers", each layer's description as kvq_model_id_layer_attn derives it (RoPE
 * base, scaling and factor, whether it rotates at all, score scale, softcap, window):
 * written for readers, checked against the fields by kvq's. */
static void write_attention(FILE *f, const kvq_model_id *m)
{
    const kvq_model_attn *a = &m->attn;
    fprintf(f, ",\n    \"attention\": {\"sliding_window\": %d, \"sliding_from\": %d, "
               "\"sliding_period\": %d,\n                  \"rope_local_base\": ",
            a->sliding_window, a->sliding_from, a->sliding_period);
    json_num(f, a->rope_local_base);
    fputs(", \"scale\": ", f);
    json_num(f, a->scale);
    fputs(", \"softcap\": ", f);
    json_num(f, a->softcap);
    fputs(",\n      \"layers\": [", f);
    for (int32_t l = 0; l < m->n_layers; l++) {
        kvq_layer_attn la;
        kvq_model_id_layer_attn(m, l, &la);
        fputs(l ? ",\n        {\"rope_base\": " : "\n        {\"rope_base\": ", f);
        json_num(f, la.rope.base);
        fprintf(f, ", \"rope_scaling\": \"%s\", \"rope_factor\": ",
                kvq_rope_scaling_name(la.rope.scaling));
        json_num(f, la.rope.factor);
        fprintf(f, ", \"rope\": %s, \"scale\": ", la.use_rope ? "true" : "false");
        json_num(f, la.scale);
        fputs(", \"softcap\": ", f);
        json_num(f, la.softcap);
        fprintf(f, ", \"window\": %d}", la.window);
    }
    fputs("]}", f);
}

/* A u64 as a JSON number when it survives a double, else as a decimal string (the
 * reader accepts both). */
static void json_u64(FILE *f, uint64_t x)
{
    if (x <= (1ull << 53))
        fprintf(f, "%" PRIu64, x);
    else
        fprintf(f, "\"%" PRIu64 "\"", x);
}

const char *kvq_capture_dtype_word(kvq_dtype t)
{
    return t == KVQ_DT_F32 ? "f32" : t == KVQ_DT_F16 ? "f16" : t == KVQ_DT_BF16 ? "bf16" : NULL;
}

/* XXH64 of each of ci's files in the folder of json_path, into *out ([n_files]). */
static kvq_status file_checksums(const kvq_capture_info *ci, const char *json_path,
                                 uint64_t **out, kvq_err *err)
{
    const char *slash = strrchr(json_path, '/');
    char *dir = slash ? strndup(json_path, (size_t)(slash - json_path) + (slash == json_path))
                      : strdup(".");
    uint64_t *sums = calloc((size_t)ci->n_files, sizeof *sums);
    kvq_status st = dir && sums ? KVQ_OK : kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory",
                                                        json_path);
    for (int32_t i = 0; !st && i < ci->n_files; i++) {
        char *p = kvq_path_join(dir, ci->files[i]);
        if (!p)
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", json_path);
        else
            st = kvq_xxh64_file(p, &sums[i], err);
        free(p);
    }
    free(dir);
    if (st)
        free(sums);
    else
        *out = sums;
    return st;
}

kvq_status kvq_capture_info_write(const kvq_capture_info *ci, const uint64_t *sample_seed,
                                  const char *path, int overwrite, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_atomic_file af = {0};
    if (!ci || !path)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture.json writer: NULL argument");
    const char *dt = kvq_capture_dtype_word(ci->dtype);
    if (!dt)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: dtype %s is not f32, f16 or bf16", path,
                           kvq_dtype_name(ci->dtype));
    if ((ci->n_sequences > 0 && !ci->sequences) || ci->n_files < 1 || !ci->layers || !ci->files)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: sequences, layers or files missing",
                           path);
    for (int32_t i = 0; i < ci->n_files; i++)
        if (!ci->files[i])
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: file name %d missing", path, i);
    uint64_t *sums = NULL; /* of the files next to path: the ones this describes */
    if ((st = file_checksums(ci, path, &sums, err)) ||
        (st = kvq_atomic_open(path, overwrite, &af, err))) {
        free(sums);
        return st;
    }

    FILE *f = af.fp;
    const kvq_model_id *m = &ci->model;
    fprintf(f, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"tool\": \"kvq %s\",\n",
            KVQ_CAPTURE_FORMAT, KVQ_CAPTURE_VERSION, kvq_version());
    fputs("  \"model\": {\n    \"path\": ", f);
    kvq_json_write_str(f, m->path);
    fputs(",\n    \"source\": ", f);
    kvq_json_write_str(f, m->source);
    if (m->name[0]) {
        fputs(",\n    \"name\": ", f);
        kvq_json_write_str(f, m->name);
    }
    if (m->fingerprint[0]) {
        fputs(",\n    \"fingerprint\": ", f);
        kvq_json_write_str(f, m->fingerprint);
    }
    fputs(",\n    \"architecture\": ", f);
    kvq_json_write_str(f, m->architecture);
    fprintf(f, ",\n    \"n_layers\": %d, \"dim\": %d, \"hidden_dim\": %d,\n", m->n_layers, m->dim,
            m->hidden_dim);
    fprintf(f, "    \"n_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d,\n", m->n_heads,
            m->n_kv_heads, m->head_dim);
    fprintf(f, "    \"vocab_size\": %d, \"context_length\": %d, \"norm_eps\": ", m->vocab_size,
            m->context_length);
    json_num(f, m->norm_eps);
    fputs(",\n    \"rope\": {\"base\": ", f);
    json_num(f, m->rope.base);
    fprintf(f, ", \"layout\": \"%s\", \"scaling\": \"%s\",\n             \"factor\": ",
            kvq_rope_layout_name(m->rope.layout), kvq_rope_scaling_name(m->rope.scaling));
    json_num(f, m->rope.factor);
    fputs(", \"low_freq_factor\": ", f);
    json_num(f, m->rope.low_freq_factor);
    fputs(", \"high_freq_factor\": ", f);
    json_num(f, m->rope.high_freq_factor);
    fputs(",\n             \"original_max_pos\": ", f);
    json_num(f, m->rope.original_max_pos);
    fputs("}", f);
    write_attention(f, m);
    fputs("\n  },\n", f);

    fputs("  \"corpus\": {\"spec\": ", f);
    kvq_json_write_str(f, ci->corpus_spec);
    fputs(", \"seed\": ", f);
    json_u64(f, ci->corpus_seed);
    fputs(", \"hash\": ", f);
    kvq_json_write_str(f, ci->corpus_hash);
    fprintf(f, ", \"n_documents\": %" PRId64 "},\n", ci->n_documents);

    fprintf(f, "  \"dtype\": \"%s\",\n  \"seq_len\": %" PRId64 ",\n  \"n_tokens\": %" PRId64
               ",\n  \"n_sequences\": %" PRId64 ",\n  \"sequences\": [",
            dt, ci->seq_len, ci->n_tokens, ci->n_sequences);
    for (int64_t i = 0; i < ci->n_sequences; i++)
        fprintf(f, "%s[%" PRId64 ", %" PRId64 "]", i == 0 ? "" : i % 8 ? ", " : ",\n    ",
                ci->sequences[2 * i], ci->sequences[2 * i + 1]);
    fputs("],\n  \"layers\": [", f);
    for (int32_t i = 0; i < ci->n_files; i++)
        fprintf(f, "%s%d", i ? ", " : "", ci->layers[i]);
    fputs("],\n  \"files\": [", f);
    for (int32_t i = 0; i < ci->n_files; i++) {
        fputs(i == 0 ? "" : i % 4 ? ", " : ",\n    ", f);
        kvq_json_write_str(f, ci->files[i]);
    }
    fputs("],\n  \"checksums\": [", f);
    for (int32_t i = 0; i < ci->n_files; i++)
        fprintf(f, "%s\"xxh64:%016" PRIx64 "\"", i == 0 ? "" : i % 4 ? ", " : ",\n    ", sums[i]);
    fputs("],\n  \"queries\": ", f);
    if (ci->n_queries > 0)
        fprintf(f, "%" PRId64, ci->n_queries);
    else
        fputs("\"all\"", f);
    if (sample_seed) {
        fputs(",\n  \"seed\": ", f);
        json_u64(f, *sample_seed);
    }
    if (ci->tokenizer_approx[0]) {
        fputs(",\n  \"tokenizer_approx\": ", f);
        kvq_json_write_str(f, ci->tokenizer_approx);
    }
    fprintf(f, ",\n  \"has_values\": %s\n}\n", ci->has_values ? "true" : "false");
    free(sums);
    return kvq_atomic_commit(&af, err); /* checks every write above (ferror, fsync) */
}

/* ======================================================================================
 * Writer
 * ====================================================================================== */

enum { RAW_K = 0, RAW_V = 1, RAW_Q = 2, N_RAW = 3 };
static const char *const raw_name[N_RAW] = {"k", "v", "q"};

typedef struct cap_layer {
    int32_t layer;            /* model layer index */
    FILE *raw[N_RAW];         /* temporary rows in the storage dtype, NULL when unused */
    char *raw_path[N_RAW];
    int64_t seq;              /* current sequence of the moment accumulation */
    int64_t q_next;           /* next index into the query sample */
    double *msum;             /* [n_heads, d, d] total over finished sequences (a <= b) */
    double *macc;             /* [n_heads, d, d] the current sequence (a <= b) */
} cap_layer;

struct kvq_capture_writer {
    kvq_capture_info info;    /* copy; info.dir = the final directory, layers sorted */
    char *tmp;                /* "<dir>.tmp.<random>" */
    kvq_capture_writer_params p;
    int32_t *tokens;          /* [n_tokens] */
    int32_t *qrows;           /* [n_q] ascending sample, NULL when every row is stored */
    int64_t n_q;              /* rows with a stored query */
    int32_t n_cap;            /* captured layers */
    cap_layer *cap;           /* [n_cap], ascending layer */
    int32_t *slot;            /* [model.n_layers] index into cap, or -1 */
    int64_t *rows;            /* [model.n_layers] rows appended so far */
    int mthreads;             /* moment accumulation threads */
    double *mscratch;         /* [mthreads, MOMENT_BLOCK, head_dim] */
    void *conv;               /* conversion scratch */
    size_t conv_cap;          /* bytes */
    kvq_status failed;        /* sticky: after an error only free is allowed */
    int finished;
};

/* ---- moment accumulation ------------------------------------------------------ */

/* C[a][b] += sum over the rows r of X[r][a] X[r][b], for b >= a (the rest of C is not
 * touched). Each tile of 4 x 4 entries is summed over every row in order, starting from
 * zero, then added to C once: every entry gets the same sequence of roundings whichever
 * path computes it, so the result depends only on X, never on threads or the CPU (no
 * reassociation, and no FMA contraction: GCC does not contract in ISO C mode, clang is
 * told so below).                                               X: [n, d]   C: [d, d]
 * The 2-wide vectors are the GNU C vector extension (SSE2 on x86-64). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
typedef double v2d __attribute__((vector_size(16)));

static inline v2d v2d_load(const double *p)
{
    v2d v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void tile_add(double *C, int d, int a0, int b0, int na, int nb, const double t[4][4])
{
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++)
            if (b0 + j >= a0 + i)
                C[(size_t)(a0 + i) * d + b0 + j] += t[i][j];
}

static void syrk_upper(double *C, const double *X, int64_t n, int d)
{
    for (int a0 = 0; a0 < d; a0 += 4)
        for (int b0 = a0; b0 < d; b0 += 4) {
            const int na = d - a0 < 4 ? d - a0 : 4, nb = d - b0 < 4 ? d - b0 : 4;
            double t[4][4] = {{0}};
            if (na == 4 && nb == 4) {
                v2d c00 = {0, 0}, c01 = {0, 0}, c10 = {0, 0}, c11 = {0, 0};
                v2d c20 = {0, 0}, c21 = {0, 0}, c30 = {0, 0}, c31 = {0, 0};
                for (int64_t r = 0; r < n; r++) {
                    const double *x = X + (size_t)r * d;
                    const v2d y0 = v2d_load(x + b0), y1 = v2d_load(x + b0 + 2);
                    const v2d x0 = {x[a0], x[a0]}, x1 = {x[a0 + 1], x[a0 + 1]};
                    const v2d x2 = {x[a0 + 2], x[a0 + 2]}, x3 = {x[a0 + 3], x[a0 + 3]};
                    c00 += x0 * y0, c01 += x0 * y1, c10 += x1 * y0, c11 += x1 * y1;
                    c20 += x2 * y0, c21 += x2 * y1, c30 += x3 * y0, c31 += x3 * y1;
                }
                const v2d *c[4][2] = {{&c00, &c01}, {&c10, &c11}, {&c20, &c21}, {&c30, &c31}};
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 2; j++)
                        memcpy(&t[i][2 * j], c[i][j], sizeof(v2d));
            } else {
                for (int64_t r = 0; r < n; r++) {
                    const double *x = X + (size_t)r * d;
                    for (int i = 0; i < na; i++)
                        for (int j = 0; j < nb; j++)
                            t[i][j] += x[a0 + i] * x[b0 + j];
                }
            }
            tile_add(C, d, a0, b0, na, nb, t);
        }
}

/* Rows per syrk_upper call: bounds the scratch, and fixes how the rows of one append
 * are grouped (the sums depend on the grouping, so it must not depend on threads). */
#define MOMENT_BLOCK 256

/* acc[h] += q_h^T q_h over the n rows, upper triangle. Heads are independent, so the
 * thread count does not change the result.     q: [n, n_heads, d]   acc: [n_heads, d, d]
 * scratch: [n_threads, MOMENT_BLOCK, d] doubles, n_threads = moment_threads(). */
static int moment_threads(int threads, int n_heads)
{
#ifdef _OPENMP
    int nt = threads > 0 ? threads : omp_get_max_threads();
    return nt < 1 ? 1 : nt > n_heads ? n_heads : nt;
#else
    (void)threads;
    (void)n_heads;
    return 1;
#endif
}

static void moments_add(double *acc, const float *q, int64_t n, int n_heads, int d, int nt,
                        double *scratch)
{
    if ((double)n * n_heads * d * d < 1e6)
        nt = 1; /* not worth waking threads */
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int h = 0; h < n_heads; h++) {
#ifdef _OPENMP
        double *X = scratch + (size_t)omp_get_thread_num() * MOMENT_BLOCK * d;
#else
        double *X = scratch;
#endif
        for (int64_t r0 = 0; r0 < n; r0 += MOMENT_BLOCK) {
            const int64_t m = n - r0 < MOMENT_BLOCK ? n - r0 : MOMENT_BLOCK;
            for (int64_t r = 0; r < m; r++) {
                const float *qr = q + ((size_t)(r0 + r) * n_heads + h) * d;
                for (int a = 0; a < d; a++)
                    X[r * d + a] = qr[a];
            }
            syrk_upper(acc + (size_t)h * d * d, X, m, d);
        }
    }
    (void)nt;
}

kvq_capture_writer_params kvq_capture_writer_params_default(void)
{
    kvq_capture_writer_params p;
    memset(&p, 0, sizeof p);
    return p;
}

/* Selection sampling (Knuth's algorithm S): row i is taken with probability
 * (still needed) / (rows left), which draws a uniform n-subset of [0, total) and yields
 * it in ascending order in one pass.                                      // rows: [n] */
static void sample_rows(int64_t total, int64_t n, uint64_t seed, int32_t *rows)
{
    kvq_rng r;
    kvq_rng_seed(&r, seed);
    int64_t got = 0;
    for (int64_t i = 0; i < total && got < n; i++)
        if ((int64_t)kvq_rng_below(&r, (uint64_t)(total - i)) < n - got)
            rows[got++] = (int32_t)i;
}

/* The sequence holding `row` (sequences tile the rows in order). */
static int64_t seq_of_row(const kvq_capture_info *ci, int64_t row)
{
    int64_t lo = 0, hi = ci->n_sequences - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (ci->sequences[2 * mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static kvq_status check_info(const kvq_capture_info *ci, const char *dir, kvq_err *err)
{
    const kvq_model_id *m = &ci->model;
    if (!kvq_capture_dtype_word(ci->dtype))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: dtype %s is not f32, f16 or bf16", dir,
                           kvq_dtype_name(ci->dtype));
    if (m->n_layers < 1 || m->n_heads < 1 || m->n_kv_heads < 1 || m->n_heads % m->n_kv_heads ||
        m->head_dim < 2 || m->head_dim % 2 || m->head_dim > KVQ_ROPE_MAX_DIM)
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "%s: model shape %d layers, %d heads, %d KV heads, head_dim %d is "
                           "not valid", dir, m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim);
    if (ci->n_tokens < 1 || ci->n_tokens > INT32_MAX)
        return kvq_err_set(err, ci->n_tokens < 1 ? KVQ_E_INVALID_ARG : KVQ_E_TOO_LARGE,
                           "%s: %" PRId64 " tokens (1 to 2^31 - 1 can be captured)", dir,
                           ci->n_tokens);
    if (ci->n_sequences < 1 || !ci->sequences)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: no sequences", dir);
    int64_t next = 0;
    for (int64_t i = 0; i < ci->n_sequences; i++) {
        if (ci->sequences[2 * i] != next || ci->sequences[2 * i + 1] < 1 ||
            ci->sequences[2 * i + 1] > ci->n_tokens - next)
            return kvq_err_set(err, KVQ_E_INVALID_ARG,
                               "%s: sequence %" PRId64 " [%" PRId64 ", %" PRId64
                               "] does not continue at row %" PRId64 " inside %" PRId64 " rows",
                               dir, i, ci->sequences[2 * i], ci->sequences[2 * i + 1], next,
                               ci->n_tokens);
        next += ci->sequences[2 * i + 1];
    }
    if (next != ci->n_tokens)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: sequences cover %" PRId64 " of %" PRId64
                           " rows", dir, next, ci->n_tokens);
    if (ci->n_files < 1 || !ci->layers)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: no layers to capture", dir);
    for (int32_t i = 0; i < ci->n_files; i++)
        if (ci->layers[i] < 0 || ci->layers[i] >= m->n_layers)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: layer %d is not in [0, %d)", dir,
                               ci->layers[i], m->n_layers);
    if (ci->n_queries < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: negative query count", dir);
    return KVQ_OK;
}

/* The writer's copy of info and tokens: layers sorted and checked unique, the slot of
 * each model layer. */
static kvq_status writer_copy_info(kvq_capture_writer *w, const char *dir,
                                   const kvq_capture_info *info, const int32_t *tokens,
                                   kvq_err *err)
{
    size_t nl = (size_t)info->model.n_layers;
    w->info = *info;
    w->info.dir = NULL;
    w->info.sequences = NULL;
    w->info.layers = NULL;
    w->info.files = NULL;
    w->info.checksums = NULL;
    w->info.n_files = 0;
    snprintf(w->info.tool, sizeof w->info.tool, "kvq %s", kvq_version());
    size_t nt = (size_t)info->n_tokens;
    w->info.dir = strdup(dir);
    w->info.sequences = malloc((size_t)info->n_sequences * 2 * sizeof(int64_t));
    w->info.layers = malloc((size_t)info->n_files * sizeof(int32_t));
    w->tokens = malloc(nt * sizeof(int32_t));
    w->slot = malloc(nl * sizeof(int32_t));
    w->rows = calloc(nl, sizeof(int64_t));
    if (!w->info.dir || !w->info.sequences || !w->info.layers || !w->tokens || !w->slot ||
        !w->rows)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
    memcpy(w->info.sequences, info->sequences, (size_t)info->n_sequences * 2 * sizeof(int64_t));
    memcpy(w->tokens, tokens, nt * sizeof(int32_t));

    /* Layers: ascending, unique. */
    memcpy(w->info.layers, info->layers, (size_t)info->n_files * sizeof(int32_t));
    qsort(w->info.layers, (size_t)info->n_files, sizeof(int32_t), kvq_cmp_i32);
    for (int32_t i = 1; i < info->n_files; i++)
        if (w->info.layers[i] == w->info.layers[i - 1])
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: layer %d is listed twice", dir,
                               w->info.layers[i]);
    w->info.n_files = info->n_files;
    for (size_t l = 0; l < nl; l++)
        w->slot[l] = -1;
    for (int32_t i = 0; i < info->n_files; i++)
        w->slot[w->info.layers[i]] = i;
    return KVQ_OK;
}

/* The query sample (or every row) and the moment scratch. */
static kvq_status writer_sample_queries(kvq_capture_writer *w, const char *dir,
                                        const kvq_capture_info *info, kvq_err *err)
{
    const kvq_model_id *m = &info->model;
    if (info->n_queries > 0 && info->n_queries < info->n_tokens) {
        w->n_q = info->n_queries;
        if (!(w->qrows = malloc((size_t)w->n_q * sizeof(int32_t))))
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        sample_rows(info->n_tokens, w->n_q, w->p.seed, w->qrows);
    } else {
        w->n_q = info->n_tokens;
        w->info.n_queries = 0;
    }

    w->mthreads = moment_threads(w->p.threads, m->n_heads);
    w->mscratch = malloc((size_t)w->mthreads * MOMENT_BLOCK * (size_t)m->head_dim * sizeof(double));
    if (!w->mscratch)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
    return KVQ_OK;
}

/* The temporary directory, and per captured layer its moment accumulators (mom doubles
 * each) and its temporary raw files. */
static kvq_status writer_open_layers(kvq_capture_writer *w, const char *dir,
                                     const kvq_capture_info *info, size_t mom, kvq_err *err)
{
    kvq_status st;
    if ((w->p.overwrite && (st = kvq_capture_dir_check_own(dir, err))) ||
        (st = kvq_tmpdir_create(dir, w->p.overwrite, kvq_capture_dir_is_capture,
                                 "a kvq capture directory", &w->tmp, err)))
        return st;

    w->n_cap = info->n_files;
    if (!(w->cap = calloc((size_t)w->n_cap, sizeof *w->cap)))
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
    for (int32_t i = 0; i < w->n_cap; i++) {
        cap_layer *L = &w->cap[i];
        L->layer = w->info.layers[i];
        L->msum = calloc(mom, sizeof(double));
        L->macc = calloc(mom, sizeof(double));
        if (!L->msum || !L->macc)
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory for the moments of layer %d",
                               dir, L->layer);
        for (int r = 0; r < N_RAW; r++) {
            if (r == RAW_V && !info->has_values)
                continue;
            char name[64];
            snprintf(name, sizeof name, "layer_%03d.%s.raw", L->layer, raw_name[r]);
            if (!(L->raw_path[r] = kvq_path_join(w->tmp, name)))
                return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
            if (!(L->raw[r] = fopen(L->raw_path[r], "w+b")))
                return kvq_err_set(err, KVQ_E_IO, "%s: cannot create: %s", L->raw_path[r],
                                   strerror(errno));
        }
    }
    return KVQ_OK;
}

kvq_status kvq_capture_writer_create(const char *dir, const kvq_capture_info *info,
                                     const int32_t *tokens,
                                     const kvq_capture_writer_params *p,
                                     kvq_capture_writer **out, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_capture_writer *w = NULL;
    *out = NULL;
    if (!dir || !info || !tokens)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture writer: NULL argument");
    if ((st = check_info(info, dir, err)))
        return st;

    const kvq_model_id *m = &info->model;
    size_t d2, mom;
    if (!kvq_size_mul((size_t)m->head_dim, (size_t)m->head_dim, &d2) ||
        !kvq_size_mul(d2, (size_t)m->n_heads, &mom))
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: moment size overflows", dir);

    if (!(w = calloc(1, sizeof *w))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    w->p = p ? *p : kvq_capture_writer_params_default();
    if ((st = writer_copy_info(w, dir, info, tokens, err)) ||
        (st = writer_sample_queries(w, dir, info, err)) ||
        (st = writer_open_layers(w, dir, info, mom, err)))
        goto done;
    *out = w;
    w = NULL;
done:
    kvq_capture_writer_free(w);
    return st;
}

void kvq_capture_writer_free(kvq_capture_writer *w)
{
    if (!w)
        return;
    for (int32_t i = 0; w->cap && i < w->n_cap; i++) {
        cap_layer *L = &w->cap[i];
        for (int r = 0; r < N_RAW; r++) {
            if (L->raw[r])
                fclose(L->raw[r]);
            free(L->raw_path[r]);
        }
        free(L->msum);
        free(L->macc);
    }
    if (w->tmp && !w->finished)
        kvq_rmtree(w->tmp);
    free(w->tmp);
    free(w->cap);
    free(w->info.dir);
    free(w->info.sequences);
    free(w->info.layers);
    free(w->tokens);
    free(w->qrows);
    free(w->slot);
    free(w->rows);
    free(w->conv);
    free(w->mscratch);
    free(w);
}

int64_t kvq_capture_writer_rows(const kvq_capture_writer *w, int32_t layer)
{
    if (!w || layer < 0 || layer >= w->info.model.n_layers || w->slot[layer] < 0)
        return 0;
    return w->rows[layer];
}

/* ---- append ---------------------------------------------------------------------- */

/* Index of the first non-finite value in a[0..n), or -1. */
static int64_t first_nonfinite(const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i]))
            return (int64_t)i;
    return -1;
}

static kvq_status check_finite(kvq_capture_writer *w, int32_t layer, const char *what,
                               const float *a, int64_t n, int width, kvq_err *err)
{
    int64_t bad = first_nonfinite(a, (size_t)n * (size_t)width);
    if (bad < 0)
        return KVQ_OK;
    int64_t row = w->rows[layer] + bad / width;
    int64_t s = seq_of_row(&w->info, row);
    return kvq_err_set(err, KVQ_E_NUMERIC,
                       "%s: layer %d sequence %" PRId64 " position %" PRId64 " (row %" PRId64
                       "): non-finite %s (%g)",
                       w->info.dir, layer, s, row - w->info.sequences[2 * s], row, what,
                       (double)a[bad]);
}

static kvq_status conv_reserve(kvq_capture_writer *w, size_t bytes, kvq_err *err)
{
    if (bytes <= w->conv_cap)
        return KVQ_OK;
    void *c = realloc(w->conv, bytes);
    if (!c)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory (%zu bytes)", w->info.dir, bytes);
    w->conv = c;
    w->conv_cap = bytes;
    return KVQ_OK;
}

/* Appends count floats to a raw file in the storage dtype. */
static kvq_status raw_put(kvq_capture_writer *w, cap_layer *L, int r, const float *x,
                          size_t count, kvq_err *err)
{
    kvq_status st;
    const void *src = x;
    size_t es = kvq_dtype_size(w->info.dtype);
    if (w->info.dtype != KVQ_DT_F32) {
        if ((st = conv_reserve(w, count * es, err)))
            return st;
        if (w->info.dtype == KVQ_DT_F16)
            kvq_f32_to_f16(x, w->conv, count);
        else
            kvq_f32_to_bf16(x, w->conv, count);
        src = w->conv;
    }
    if (fwrite(src, es, count, L->raw[r]) != count)
        return kvq_err_set(err, KVQ_E_IO, "%s: write failed: %s", L->raw_path[r],
                           strerror(errno));
    return KVQ_OK;
}

kvq_status kvq_capture_writer_append(kvq_capture_writer *w, int32_t layer, int64_t n,
                                     const float *q, const float *k, const float *v,
                                     kvq_err *err)
{
    kvq_status st = KVQ_OK;
    if (!w)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture writer: NULL writer");
    if (w->failed)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: an earlier error stopped the capture",
                           w->info.dir);
    if (w->finished)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: append after finish", w->info.dir);
    const kvq_model_id *m = &w->info.model;
    if (layer < 0 || layer >= m->n_layers)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: layer %d is not in [0, %d)",
                           w->info.dir, layer, m->n_layers);
    if (n < 1 || !q || !k)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: layer %d: empty or NULL rows",
                           w->info.dir, layer);
    if (n > w->info.n_tokens - w->rows[layer])
        return kvq_err_set(err, KVQ_E_INVALID_ARG,
                           "%s: layer %d: %" PRId64 " more rows after %" PRId64
                           " exceed the %" PRId64 " tokens",
                           w->info.dir, layer, n, w->rows[layer], w->info.n_tokens);
    int32_t s = w->slot[layer];
    if (s >= 0 && w->info.has_values && !v)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: layer %d: values missing", w->info.dir,
                           layer);
    const int d = m->head_dim, qw = m->n_heads * d, kw = m->n_kv_heads * d;
    if ((st = check_finite(w, layer, "q", q, n, qw, err)) ||
        (st = check_finite(w, layer, "k", k, n, kw, err)) ||
        (v && (st = check_finite(w, layer, "v", v, n, kw, err))))
        goto done;
    if (s < 0) {
        w->rows[layer] += n;
        return KVQ_OK;
    }

    cap_layer *L = &w->cap[s];
    const int64_t r0 = w->rows[layer];
    if ((st = raw_put(w, L, RAW_K, k, (size_t)n * kw, err)))
        goto done;
    if (w->info.has_values && (st = raw_put(w, L, RAW_V, v, (size_t)n * kw, err)))
        goto done;
    if (!w->qrows) {
        if ((st = raw_put(w, L, RAW_Q, q, (size_t)n * qw, err)))
            goto done;
    } else {
        /* Sampled rows of this chunk, one at a time (they are sparse). */
        while (L->q_next < w->n_q && w->qrows[L->q_next] < r0 + n) {
            const float *row = q + (size_t)(w->qrows[L->q_next] - r0) * qw;
            if ((st = raw_put(w, L, RAW_Q, row, (size_t)qw, err)))
                goto done;
            L->q_next++;
        }
    }

    /* Moments: accumulate per sequence, fold each finished sequence into the total. */
    size_t mom = (size_t)m->n_heads * d * d;
    int64_t r = r0;
    while (r < r0 + n) {
        int64_t end = w->info.sequences[2 * L->seq] + w->info.sequences[2 * L->seq + 1];
        int64_t take = (end < r0 + n ? end : r0 + n) - r;
        moments_add(L->macc, q + (size_t)(r - r0) * qw, take, m->n_heads, d, w->mthreads,
                    w->mscratch);
        r += take;
        if (r == end) {
            for (size_t i = 0; i < mom; i++)
                L->msum[i] += L->macc[i];
            memset(L->macc, 0, mom * sizeof(double));
            L->seq++;
        }
    }
    w->rows[layer] += n;
done:
    if (st)
        w->failed = st;
    return st;
}

/* ---- finish ---------------------------------------------------------------------- */

/* Copies a raw temporary file (expected `bytes` long) into the safetensors writer. */
static kvq_status copy_raw(kvq_st_writer *sw, FILE *f, const char *path, uint64_t bytes,
                           void *buf, kvq_err *err)
{
    if (fflush(f) != 0 || fseeko(f, 0, SEEK_SET) != 0)
        return kvq_err_set(err, KVQ_E_IO, "%s: %s", path, strerror(errno));
    uint64_t left = bytes;
    while (left > 0) {
        size_t want = left < COPY_CHUNK ? (size_t)left : COPY_CHUNK;
        size_t got = fread(buf, 1, want, f);
        if (got != want)
            return kvq_err_set(err, KVQ_E_IO, "%s: %s", path,
                               ferror(f) ? strerror(errno) : "shorter than the rows written");
        kvq_status st = kvq_st_writer_write(sw, buf, got, err);
        if (st)
            return st;
        left -= got;
    }
    return KVQ_OK;
}

/* Which int32 column put_ints generates. */
enum { COL_QROWS, COL_POS, COL_SEQ, COL_TOKENS };

static kvq_status put_ints(kvq_capture_writer *w, kvq_st_writer *sw, int col, int32_t *buf,
                           kvq_err *err)
{
    const int64_t n = col == COL_QROWS ? w->n_q : w->info.n_tokens;
    int64_t s = 0;
    for (int64_t i0 = 0; i0 < n; i0 += INT_CHUNK) {
        int64_t m = n - i0 < INT_CHUNK ? n - i0 : INT_CHUNK;
        for (int64_t j = 0; j < m; j++) {
            int64_t i = i0 + j;
            switch (col) {
            case COL_QROWS: buf[j] = w->qrows ? w->qrows[i] : (int32_t)i; break;
            case COL_TOKENS: buf[j] = w->tokens[i]; break;
            default:
                while (i >= w->info.sequences[2 * s] + w->info.sequences[2 * s + 1])
                    s++;
                buf[j] = (int32_t)(col == COL_SEQ ? s : i - w->info.sequences[2 * s]);
            }
        }
        kvq_status st = kvq_st_writer_write(sw, buf, (size_t)m * sizeof(int32_t), err);
        if (st)
            return st;
    }
    return KVQ_OK;
}

static kvq_status assemble_layer(kvq_capture_writer *w, cap_layer *L, const char *path,
                                 void *buf, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    const kvq_model_id *m = &w->info.model;
    const int64_t nt = w->info.n_tokens, d = m->head_dim;
    const kvq_dtype dt = w->info.dtype;
    const size_t es = kvq_dtype_size(dt);
    kvq_st_writer *sw = kvq_st_writer_new();
    if (!sw)
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);

    const int64_t kshape[3] = {nt, m->n_kv_heads, d};
    const int64_t qshape[3] = {w->n_q, m->n_heads, d};
    const int64_t mshape[3] = {m->n_heads, d, d};
    const int64_t nq1[1] = {w->n_q}, nt1[1] = {nt}, nh1[1] = {m->n_heads};
    char layer_str[16];
    snprintf(layer_str, sizeof layer_str, "%d", L->layer);
    if ((st = kvq_st_writer_declare(sw, "k", dt, 3, kshape, err)) ||
        (w->info.has_values && (st = kvq_st_writer_declare(sw, "v", dt, 3, kshape, err))) ||
        (st = kvq_st_writer_declare(sw, "q", dt, 3, qshape, err)) ||
        (st = kvq_st_writer_declare(sw, "q_rows", KVQ_DT_I32, 1, nq1, err)) ||
        (st = kvq_st_writer_declare(sw, "pos", KVQ_DT_I32, 1, nt1, err)) ||
        (st = kvq_st_writer_declare(sw, "seq", KVQ_DT_I32, 1, nt1, err)) ||
        (st = kvq_st_writer_declare(sw, "tokens", KVQ_DT_I32, 1, nt1, err)) ||
        (st = kvq_st_writer_declare(sw, "q_moment_sum", KVQ_DT_F64, 3, mshape, err)) ||
        (st = kvq_st_writer_declare(sw, "q_moment_count", KVQ_DT_F64, 1, nh1, err)) ||
        (st = kvq_st_writer_set_meta(sw, "format", KVQ_CAPTURE_FORMAT, err)) ||
        (st = kvq_st_writer_set_meta(sw, "version", "1", err)) ||
        (st = kvq_st_writer_set_meta(sw, "layer", layer_str, err)) ||
        (st = kvq_model_id_set_meta(m, "model.", sw, err)) ||
        (st = kvq_st_writer_begin_file(sw, path, 0, err)))
        goto done;

    const uint64_t kbytes = (uint64_t)nt * m->n_kv_heads * d * es;
    const uint64_t qbytes = (uint64_t)w->n_q * m->n_heads * d * es;
    if ((st = copy_raw(sw, L->raw[RAW_K], L->raw_path[RAW_K], kbytes, buf, err)) ||
        (w->info.has_values &&
         (st = copy_raw(sw, L->raw[RAW_V], L->raw_path[RAW_V], kbytes, buf, err))) ||
        (st = copy_raw(sw, L->raw[RAW_Q], L->raw_path[RAW_Q], qbytes, buf, err)) ||
        (st = put_ints(w, sw, COL_QROWS, buf, err)) || (st = put_ints(w, sw, COL_POS, buf, err)) ||
        (st = put_ints(w, sw, COL_SEQ, buf, err)) || (st = put_ints(w, sw, COL_TOKENS, buf, err)))
        goto done;

    /* Moments were accumulated on the upper triangle: mirror it. */
    for (int64_t h = 0; h < m->n_heads; h++) {
        double *A = L->msum + (size_t)(h * d * d);
        for (int64_t a = 0; a < d; a++)
            for (int64_t b = 0; b < a; b++)
                A[a * d + b] = A[b * d + a];
    }
    if ((st = kvq_st_writer_write(sw, L->msum, (size_t)(m->n_heads * d * d) * sizeof(double),
                                  err)))
        goto done;
    for (int64_t h = 0; h < m->n_heads; h++) {
        double c = (double)nt;
        if ((st = kvq_st_writer_write(sw, &c, sizeof c, err)))
            goto done;
    }
    st = kvq_st_writer_finish(sw, err);
done:
    kvq_st_writer_free(sw); /* removes the partial file on error */
    return st;
}

kvq_status kvq_capture_writer_finish(kvq_capture_writer *w, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    void *buf = NULL;
    char **files = NULL;
    char *json = NULL;
    if (!w)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture writer: NULL writer");
    if (w->failed || w->finished)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: finish %s", w->info.dir,
                           w->finished ? "called twice" : "after an error");
    for (int32_t i = 0; i < w->n_cap; i++)
        if (w->rows[w->cap[i].layer] != w->info.n_tokens) {
            st = kvq_err_set(err, KVQ_E_INVALID_ARG,
                             "%s: layer %d has %" PRId64 " of %" PRId64 " rows", w->info.dir,
                             w->cap[i].layer, w->rows[w->cap[i].layer], w->info.n_tokens);
            goto done;
        }
    buf = malloc(COPY_CHUNK);
    files = calloc(w->n_cap > 0 ? (size_t)w->n_cap : 1, sizeof *files);
    if (!buf || !files) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", w->info.dir);
        goto done;
    }
    for (int32_t i = 0; i < w->n_cap; i++) {
        cap_layer *L = &w->cap[i];
        char name[64];
        snprintf(name, sizeof name, "layer_%03d.safetensors", L->layer);
        char *path = kvq_path_join(w->tmp, name);
        files[i] = strdup(name);
        if (!path || !files[i]) {
            free(path);
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", w->info.dir);
            goto done;
        }
        st = assemble_layer(w, L, path, buf, err);
        free(path);
        if (st)
            goto done;
        /* The raw rows are in the layer file now: give the disk space back at once. */
        for (int r = 0; r < N_RAW; r++)
            if (L->raw[r]) {
                fclose(L->raw[r]);
                L->raw[r] = NULL;
                unlink(L->raw_path[r]);
            }
        if (kvq_progress(&w->p.cb, "capture: assemble", (uint64_t)i + 1, (uint64_t)w->n_cap)) {
            st = kvq_err_set(err, KVQ_E_CANCELLED, "%s: cancelled", w->info.dir);
            goto done;
        }
    }
    w->info.files = files;
    if (!(json = kvq_path_join(w->tmp, KVQ_CAPTURE_JSON))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", w->info.dir);
        goto done;
    }
    int64_t nq_saved = w->info.n_queries;
    w->info.n_queries = w->qrows ? w->n_q : 0;
    st = kvq_capture_info_write(&w->info, w->qrows ? &w->p.seed : NULL, json, 0, err);
    w->info.n_queries = nq_saved;
    if (st || (st = kvq_tmpdir_commit(w->tmp, w->info.dir, w->p.overwrite,
                                              kvq_capture_dir_is_capture,
                                              "a kvq capture directory", err)))
        goto done;
    w->finished = 1;
done:
    w->info.files = NULL;
    for (int32_t i = 0; files && i < w->n_cap; i++)
        free(files[i]);
    free(files);
    free(json);
    free(buf);
    if (st && !w->finished) {
        w->failed = st;
        kvq_rmtree(w->tmp);
    }
    return st;
}
