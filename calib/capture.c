/* capture.c — capture.json writer, the capture writer, and capture from a model
 * (kvq/capture.h, docs/capture.md). The merge lives in capture_merge.c. */
#include "kvq/capture.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kvq/corpus.h"
#include "kvq/half.h"
#include "kvq/util.h"

#define MIB (1024.0 * 1024.0)
#define COPY_CHUNK ((size_t)4 << 20) /* bytes per read when assembling a layer file */
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

/* A u64 as a JSON number when it survives a double, else as a decimal string (the
 * reader accepts both). */
static void json_u64(FILE *f, uint64_t x)
{
    if (x <= (1ull << 53))
        fprintf(f, "%" PRIu64, x);
    else
        fprintf(f, "\"%" PRIu64 "\"", x);
}

static const char *dtype_word(kvq_dtype t)
{
    return t == KVQ_DT_F32 ? "f32" : t == KVQ_DT_F16 ? "f16" : t == KVQ_DT_BF16 ? "bf16" : NULL;
}

kvq_status kvq_capture_info_write(const kvq_capture_info *ci, const uint64_t *sample_seed,
                                  const char *path, int overwrite, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_atomic_file af = {0};
    if (!ci || !path)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture.json writer: NULL argument");
    const char *dt = dtype_word(ci->dtype);
    if (!dt)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: dtype %s is not f32, f16 or bf16", path,
                           kvq_dtype_name(ci->dtype));
    if ((ci->n_sequences > 0 && !ci->sequences) || ci->n_files < 1 || !ci->layers || !ci->files)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: sequences, layers or files missing",
                           path);
    for (int32_t i = 0; i < ci->n_files; i++)
        if (!ci->files[i])
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: file name %d missing", path, i);
    if ((st = kvq_atomic_open(path, overwrite, &af, err)))
        return st;

    FILE *f = af.fp;
    const kvq_model_id *m = &ci->model;
    fprintf(f, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"tool\": \"kvq %s\",\n",
            KVQ_CAPTURE_FORMAT, KVQ_CAPTURE_VERSION, kvq_version());
    fputs("  \"model\": {\n    \"path\": ", f);
    kvq_json_write_str(f, m->path);
    fputs(",\n    \"source\": ", f);
    kvq_json_write_str(f, m->source);
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
    fputs("}\n  },\n", f);

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
    fputs("],\n  \"queries\": ", f);
    if (ci->n_queries > 0)
        fprintf(f, "%" PRId64, ci->n_queries);
    else
        fputs("\"all\"", f);
    if (sample_seed) {
        fputs(",\n  \"seed\": ", f);
        json_u64(f, *sample_seed);
    }
    fprintf(f, ",\n  \"has_values\": %s\n}\n", ci->has_values ? "true" : "false");
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
    if (!dtype_word(ci->dtype))
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
    size_t nl = (size_t)m->n_layers, d2, mom;
    if (!kvq_size_mul((size_t)m->head_dim, (size_t)m->head_dim, &d2) ||
        !kvq_size_mul(d2, (size_t)m->n_heads, &mom))
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: moment size overflows", dir);

    if (!(w = calloc(1, sizeof *w))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    w->p = p ? *p : kvq_capture_writer_params_default();
    w->info = *info;
    w->info.dir = NULL;
    w->info.sequences = NULL;
    w->info.layers = NULL;
    w->info.files = NULL;
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
        !w->rows) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    memcpy(w->info.sequences, info->sequences, (size_t)info->n_sequences * 2 * sizeof(int64_t));
    memcpy(w->tokens, tokens, nt * sizeof(int32_t));

    /* Layers: ascending, unique. */
    memcpy(w->info.layers, info->layers, (size_t)info->n_files * sizeof(int32_t));
    qsort(w->info.layers, (size_t)info->n_files, sizeof(int32_t), kvq_cmp_i32);
    for (int32_t i = 1; i < info->n_files; i++)
        if (w->info.layers[i] == w->info.layers[i - 1]) {
            st = kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: layer %d is listed twice", dir,
                             w->info.layers[i]);
            goto done;
        }
    w->info.n_files = info->n_files;
    for (size_t l = 0; l < nl; l++)
        w->slot[l] = -1;
    for (int32_t i = 0; i < info->n_files; i++)
        w->slot[w->info.layers[i]] = i;

    /* Query sample. */
    if (info->n_queries > 0 && info->n_queries < info->n_tokens) {
        w->n_q = info->n_queries;
        if (!(w->qrows = malloc((size_t)w->n_q * sizeof(int32_t)))) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
            goto done;
        }
        sample_rows(info->n_tokens, w->n_q, w->p.seed, w->qrows);
    } else {
        w->n_q = info->n_tokens;
        w->info.n_queries = 0;
    }

    w->mthreads = moment_threads(w->p.threads, m->n_heads);
    w->mscratch = malloc((size_t)w->mthreads * MOMENT_BLOCK * (size_t)m->head_dim * sizeof(double));
    if (!w->mscratch) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }

    if ((st = kvq_tmpdir_create(dir, w->p.overwrite, &w->tmp, err)))
        goto done;

    w->n_cap = info->n_files;
    if (!(w->cap = calloc((size_t)w->n_cap, sizeof *w->cap))) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    for (int32_t i = 0; i < w->n_cap; i++) {
        cap_layer *L = &w->cap[i];
        L->layer = w->info.layers[i];
        L->msum = calloc(mom, sizeof(double));
        L->macc = calloc(mom, sizeof(double));
        if (!L->msum || !L->macc) {
            st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory for the moments of layer %d",
                             dir, L->layer);
            goto done;
        }
        for (int r = 0; r < N_RAW; r++) {
            if (r == RAW_V && !info->has_values)
                continue;
            char name[64];
            snprintf(name, sizeof name, "layer_%03d.%s.raw", L->layer, raw_name[r]);
            if (!(L->raw_path[r] = kvq_path_join(w->tmp, name))) {
                st = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
                goto done;
            }
            if (!(L->raw[r] = fopen(L->raw_path[r], "w+b"))) {
                st = kvq_err_set(err, KVQ_E_IO, "%s: cannot create: %s", L->raw_path[r],
                                 strerror(errno));
                goto done;
            }
        }
    }
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
    if (st || (st = kvq_tmpdir_commit(w->tmp, w->info.dir, w->p.overwrite, err)))
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

/* ======================================================================================
 * Capture from a model
 * ====================================================================================== */

kvq_capture_params kvq_capture_params_default(void)
{
    kvq_capture_params p;
    memset(&p, 0, sizeof p);
    p.seq_len = 256;
    p.dtype = KVQ_DT_F16;
    p.values = 1;
    p.chunk = 256;
    return p;
}

typedef struct cap_run {
    kvq_capture_writer *w;
    const kvq_callbacks *cb;
    int32_t last_layer;       /* progress is reported after this layer's chunks */
    uint64_t done, total;     /* tokens through the last layer */
    int observer_failed;      /* the error came from the writer (message complete) */
} cap_run;

static kvq_status cap_observe(void *user, const kvq_attn_call *c, kvq_err *err)
{
    cap_run *r = user;
    kvq_status st = kvq_capture_writer_append(r->w, c->layer, c->n, c->q, c->k, c->v, err);
    if (st) {
        r->observer_failed = 1;
        return st;
    }
    if (c->layer == r->last_layer) {
        r->done += (uint64_t)c->n;
        if (kvq_progress(r->cb, "capture", r->done, r->total)) {
            r->observer_failed = 1;
            return kvq_err_set(err, KVQ_E_CANCELLED, "capture cancelled");
        }
    }
    return KVQ_OK;
}

/* Bytes of one layer file (approximate header) for the disk estimate. */
static double layer_file_bytes(const kvq_model_id *m, int64_t nt, int64_t nq, kvq_dtype dt,
                               int values)
{
    double es = (double)kvq_dtype_size(dt), d = m->head_dim;
    return (double)nt * m->n_kv_heads * d * es * (values ? 2 : 1) +
           (double)nq * m->n_heads * d * es + 4.0 * ((double)nq + 3.0 * (double)nt) +
           8.0 * m->n_heads * (d * d + 1) + 2048.0;
}

/* Free bytes on the file system that will hold dir, or -1 when unknown. */
static double free_bytes_for(const char *dir)
{
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/')
        parent[--n] = 0;
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == parent)
        parent[1] = 0;
    else
        *slash = 0;
    struct statvfs sv;
    if (statvfs(parent, &sv) != 0)
        return -1;
    return (double)sv.f_bavail * (double)sv.f_frsize;
}

kvq_status kvq_capture_tokens(const kvq_model *m, const int32_t *tokens, int64_t n_tokens,
                              const int64_t *sequences, int64_t n_sequences,
                              const kvq_capture_corpus *corpus, const kvq_capture_params *p_in,
                              const char *dir, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_capture_writer *w = NULL;
    kvq_forward *fw = NULL;
    int32_t *all_layers = NULL;
    kvq_capture_params p = p_in ? *p_in : kvq_capture_params_default();
    const kvq_callbacks *cb = &p.cb;
    if (!m || !dir || (n_tokens > 0 && (!tokens || !sequences)))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture: NULL argument");
    const kvq_model_config *cfg = kvq_model_config_get(m);
    if (n_tokens < 1 || n_sequences < 1)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: the corpus has no tokens to capture",
                           corpus && corpus->spec ? corpus->spec : dir);
    if (p.n_queries < 0 || p.chunk < 1 || p.seq_len < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: negative query count, seq_len or chunk",
                           dir);

    /* The capture description. */
    kvq_capture_info ci;
    memset(&ci, 0, sizeof ci);
    kvq_model_identity(m, &ci.model);
    if (corpus) {
        snprintf(ci.corpus_spec, sizeof ci.corpus_spec, "%s", corpus->spec ? corpus->spec : "");
        ci.corpus_seed = corpus->seed;
        snprintf(ci.corpus_hash, sizeof ci.corpus_hash, "%016" PRIx64, corpus->hash);
        ci.n_documents = corpus->n_documents;
    } else {
        snprintf(ci.corpus_hash, sizeof ci.corpus_hash, "%016" PRIx64,
                 kvq_fnv1a64(tokens, (size_t)n_tokens * sizeof *tokens, KVQ_FNV1A64_INIT));
    }
    ci.dtype = p.dtype;
    ci.seq_len = p.seq_len;
    ci.n_tokens = n_tokens;
    ci.n_sequences = n_sequences;
    ci.sequences = (int64_t *)sequences;
    ci.n_queries = p.n_queries;
    ci.has_values = p.values != 0;
    if (p.layers && p.n_layers) {
        if (p.n_layers > (size_t)cfg->n_layers)
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: %zu layers asked for, the model has %d",
                               dir, p.n_layers, cfg->n_layers);
        ci.layers = (int32_t *)p.layers;
        ci.n_files = (int32_t)p.n_layers;
    } else {
        if (!(all_layers = malloc((size_t)cfg->n_layers * sizeof *all_layers)))
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", dir);
        for (int32_t l = 0; l < cfg->n_layers; l++)
            all_layers[l] = l;
        ci.layers = all_layers;
        ci.n_files = cfg->n_layers;
    }
    int32_t last = 0;
    for (int32_t i = 0; i < ci.n_files; i++)
        if (ci.layers[i] > last)
            last = ci.layers[i];
    int64_t longest = 0;
    for (int64_t s = 0; s < n_sequences; s++)
        if (sequences[2 * s + 1] > longest)
            longest = sequences[2 * s + 1];
    int64_t ctx_need = longest > p.seq_len ? longest : p.seq_len;
    if (ctx_need > cfg->context_length)
        kvq_log(cb, KVQ_LOG_WARN,
                "capture: sequences of %" PRId64 " tokens exceed the model's context length %d: "
                "states past it are out of distribution", ctx_need, cfg->context_length);
    if (cfg->sliding_window > 0 && ctx_need > cfg->sliding_window)
        kvq_log(cb, KVQ_LOG_WARN,
                "capture: sequences of %" PRId64 " tokens exceed the model's sliding window of %d "
                "(layers %d and on): the capture applies it, but kvq moments and kvq profile "
                "treat every captured sequence as fully visible",
                ctx_need, cfg->sliding_window, cfg->sliding_from);

    kvq_capture_writer_params wp = kvq_capture_writer_params_default();
    wp.seed = p.seed;
    wp.threads = p.threads;
    wp.overwrite = p.overwrite;
    wp.cb = p.cb;
    if ((st = kvq_capture_writer_create(dir, &ci, tokens, &wp, &w, err)))
        goto done;

    kvq_forward_params fp = kvq_forward_params_default();
    fp.threads = p.threads;
    fp.chunk = p.chunk;
    fp.max_tokens = longest;
    fp.n_layers = last + 1; /* layers past the last captured one are not needed */
    fp.cb = p.cb;
    fp.cb.progress = NULL; /* the observer reports "capture" progress over the whole run */

    /* Say up front what the run needs. */
    {
        kvq_model_memory mm;
        kvq_model_memory_estimate(m, &fp, longest, &mm);
        int64_t nq = p.n_queries > 0 && p.n_queries < n_tokens ? p.n_queries : n_tokens;
        double mom = 2.0 * ci.n_files * cfg->n_heads * (double)cfg->head_dim * cfg->head_dim * 8;
        double cap_mem = mom + 4.0 * (double)(n_tokens + nq) + 16.0 * n_sequences +
                         (double)p.chunk * cfg->n_heads * cfg->head_dim * 4 + COPY_CHUNK;
        double layer = layer_file_bytes(&ci.model, n_tokens, nq, p.dtype, ci.has_values);
        double disk = layer * ci.n_files, peak = disk + layer;
        kvq_log(cb, KVQ_LOG_INFO,
                "capture: %" PRId64 " tokens in %" PRId64 " sequences, %d of %d layers, q at %s"
                " rows, %s%s",
                n_tokens, n_sequences, ci.n_files, cfg->n_layers, nq == n_tokens ? "all" : "sampled",
                dtype_word(p.dtype), ci.has_values ? "" : ", no values");
        kvq_log(cb, KVQ_LOG_INFO,
                "capture: needs %.1f MiB of memory (model %.1f MiB mapped, %.1f MiB working; "
                "capture %.1f MiB) and %.1f MiB of disk (%.1f MiB at the peak)",
                ((double)mm.total_bytes + cap_mem) / MIB, (double)mm.mapped_bytes / MIB,
                (double)(mm.total_bytes - mm.mapped_bytes) / MIB, cap_mem / MIB, disk / MIB,
                peak / MIB);
        double avail = free_bytes_for(dir);
        if (avail >= 0 && avail < peak)
            kvq_log(cb, KVQ_LOG_WARN, "capture: %s: only %.1f MiB free, %.1f MiB needed", dir,
                    avail / MIB, peak / MIB);
    }

    if ((st = kvq_forward_create(m, &fp, &fw, err)))
        goto done;
    cap_run run = {w, cb, last, 0, (uint64_t)n_tokens, 0};
    kvq_forward_set_observer(fw, cap_observe, &run);
    for (int64_t s = 0; s < n_sequences; s++) {
        kvq_err e = {0};
        kvq_forward_reset(fw);
        st = kvq_forward_tokens(fw, tokens + sequences[2 * s], sequences[2 * s + 1],
                                KVQ_LOGITS_NONE, NULL, &e);
        if (st) {
            if (run.observer_failed)
                kvq_err_set(err, st, "%s", e.msg);
            else
                kvq_err_set(err, st, "%s (sequence %" PRId64 ", rows %" PRId64 "..%" PRId64 ")",
                            e.msg, s, sequences[2 * s], sequences[2 * s] + sequences[2 * s + 1] - 1);
            goto done;
        }
    }
    kvq_forward_free(fw);
    fw = NULL;
    st = kvq_capture_writer_finish(w, err);
done:
    kvq_forward_free(fw);
    kvq_capture_writer_free(w); /* removes the temporary directory unless finished */
    free(all_layers);
    return st;
}

/* ---- from a corpus spec ------------------------------------------------------------- */

typedef struct tok_sink {
    int32_t *tokens;          /* [n, grows] */
    int64_t n, cap;
    int64_t *seqs;            /* [n_seqs, 2, grows] */
    int64_t n_seqs, cap_seqs;
} tok_sink;

static kvq_status sink_seq(void *user, const kvq_corpus_seq *seq, kvq_err *err)
{
    tok_sink *s = user;
    if (s->n + seq->n > INT32_MAX)
        return kvq_err_set(err, KVQ_E_TOO_LARGE,
                           "capture: more than 2^31 - 1 tokens (use --max-tokens)");
    if (s->n + seq->n > s->cap) {
        int64_t c = s->cap ? s->cap : 65536;
        while (c < s->n + seq->n)
            c *= 2;
        int32_t *t = realloc(s->tokens, (size_t)c * sizeof *t);
        if (!t)
            return kvq_err_set(err, KVQ_E_NOMEM, "capture: out of memory for the tokens");
        s->tokens = t;
        s->cap = c;
    }
    if (s->n_seqs == s->cap_seqs) {
        int64_t c = s->cap_seqs ? 2 * s->cap_seqs : 1024;
        int64_t *q = realloc(s->seqs, (size_t)c * 2 * sizeof *q);
        if (!q)
            return kvq_err_set(err, KVQ_E_NOMEM, "capture: out of memory for the sequences");
        s->seqs = q;
        s->cap_seqs = c;
    }
    memcpy(s->tokens + s->n, seq->ids, (size_t)seq->n * sizeof *seq->ids);
    s->seqs[2 * s->n_seqs] = s->n;
    s->seqs[2 * s->n_seqs + 1] = seq->n;
    s->n_seqs++;
    s->n += seq->n;
    return KVQ_OK;
}

kvq_status kvq_capture_run(const kvq_model *m, const char *spec, const kvq_corpus_params *cp,
                           const kvq_capture_params *p_in, const char *dir, kvq_err *err)
{
    kvq_status st = KVQ_OK;
    kvq_corpus *c = NULL;
    kvq_tokenizer *own_tok = NULL;
    tok_sink sink = {0};
    kvq_capture_params p = p_in ? *p_in : kvq_capture_params_default();
    if (!m || !spec || !dir)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture: NULL argument");
    if (p.seq_len < 2 || p.seq_len > INT32_MAX)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture: seq_len %" PRId64
                           " is not in [2, 2^31)", p.seq_len);
    if (p.max_tokens < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "capture: negative max_tokens");
    /* Refuse an existing output before reading the whole corpus (the writer checks
     * again, atomically, when it creates the temporary directory). */
    if (!p.overwrite && access(dir, F_OK) == 0)
        return kvq_err_set(err, KVQ_E_EXISTS, "%s: already exists (use --force to overwrite)",
                           dir);
    const kvq_model_config *cfg = kvq_model_config_get(m);
    const kvq_tokenizer *tok = kvq_model_tokenizer(m);
    if (!tok) {
        /* No vocabulary: only pre-tokenized (ids:) corpora can be read. */
        if ((st = kvq_tokenizer_new_ids((uint32_t)cfg->vocab_size, cfg->bos_id, cfg->eos_id,
                                        &own_tok, err)))
            goto done;
        tok = own_tok;
    }
    kvq_corpus_params cpar;
    if (cp)
        cpar = *cp;
    else
        kvq_corpus_params_default(&cpar);
    if ((st = kvq_corpus_open(spec, &cpar, &c, err)))
        goto done;

    kvq_seq_params sp;
    kvq_seq_params_default(&sp);
    sp.seq_len = (uint32_t)p.seq_len;
    sp.max_tokens = (uint64_t)p.max_tokens;
    sp.add_bos = kvq_tokenizer_bos(tok) >= 0;
    sp.sep = sp.add_bos ? KVQ_DOC_SEP_BOS
                        : kvq_tokenizer_eos(tok) >= 0 ? KVQ_DOC_SEP_EOS : KVQ_DOC_SEP_NONE;
    kvq_corpus_stats stats;
    memset(&stats, 0, sizeof stats);
    if ((st = kvq_corpus_tokenize(c, tok, &sp, &p.cb, sink_seq, &sink, &stats, err)))
        goto done;
    if (sink.n == 0) {
        st = kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: the corpus has no tokens", spec);
        goto done;
    }
    kvq_log(&p.cb, KVQ_LOG_INFO,
            "capture: corpus %s: %" PRIu64 " documents, %" PRIu64 " bytes, %" PRIu64
            " tokens in %" PRIu64 " sequences (%" PRIu64 " dropped)",
            spec, stats.n_docs, stats.n_bytes, stats.n_tokens, stats.n_seqs, stats.n_dropped);
    kvq_capture_corpus corpus = {spec, cpar.seed, stats.hash, (int64_t)stats.n_docs};
    st = kvq_capture_tokens(m, sink.tokens, sink.n, sink.seqs, sink.n_seqs, &corpus, &p, dir,
                            err);
done:
    free(sink.tokens);
    free(sink.seqs);
    kvq_corpus_free(c);
    kvq_tokenizer_free(own_tok);
    return st;
}
