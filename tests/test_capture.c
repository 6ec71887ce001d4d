/* test_capture.c — kvq capture: the writer, capture from a model (stories260K and
 * random tiny llamas), the merge property, and the error paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers/testutil.h"
#include "kvq/util.h"
#include "helpers/tinyllama.h"
#include "kvq.h"
#include "kvq/capture.h"
#include "kvq/gguf.h"
#include "kvq/half.h"
#include "kvq/model.h"
#include "kvq/safetensors.h"

/* ======================================================================================
 * Helpers
 * ====================================================================================== */

/* A tensor copied out of a layer file. */
typedef struct tensor {
    kvq_dtype dt;
    int ndim;
    int64_t shape[KVQ_MAX_DIMS];
    size_t n;                 /* elements */
    size_t nbytes;
    void *data;               /* malloc'd copy (NULL when absent) */
} tensor;

static char *layer_path(const char *dir, int layer)
{
    static char buf[4][4096];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/layer_%03d.safetensors", dir, layer);
    return b;
}

/* Loads `name` from dir's layer file; t.data is NULL when the tensor is absent. */
static tensor load(const char *dir, int layer, const char *name)
{
    tensor t;
    memset(&t, 0, sizeof t);
    kvq_st *st = NULL;
    kvq_err e = {0};
    if (kvq_st_open(layer_path(dir, layer), &st, &e) != KVQ_OK)
        fail_msg("%s", e.msg);
    const kvq_tensor_view *v = kvq_st_find(st, name);
    if (v) {
        t.dt = v->dtype;
        t.ndim = v->ndim;
        memcpy(t.shape, v->shape, sizeof t.shape);
        t.nbytes = v->nbytes;
        t.n = v->nbytes / kvq_dtype_size(v->dtype);
        t.data = malloc(v->nbytes + 1);
        memcpy(t.data, v->data, v->nbytes);
    }
    kvq_st_close(st);
    return t;
}

static void tensor_free(tensor *t)
{
    free(t->data);
    t->data = NULL;
}

/* Entries of dirname(path) whose name starts with basename(path): the output itself and
 * any "<name>.tmp.*" left over. */
static int entries_named(const char *path)
{
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    const char *base = path;
    if (slash) {
        *slash = 0;
        base = path + (slash - parent) + 1;
    } else {
        snprintf(parent, sizeof parent, ".");
    }
    DIR *d = opendir(parent);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, base, strlen(base)))
            n++;
    closedir(d);
    return n;
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

/* 1 when the two files have the same bytes. */
static int same_file(const char *a, const char *b)
{
    uint8_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    kvq_err e = {0};
    if (kvq_read_file(a, &x, &nx, &e) || kvq_read_file(b, &y, &ny, &e)) {
        free(x);
        return 0;
    }
    int same = nx == ny && !memcmp(x, y, nx);
    free(x);
    free(y);
    return same;
}

/* Every file of capture a equals its namesake in b, byte for byte. */
static void assert_same_dir(const char *a, const char *b)
{
    DIR *d = opendir(a);
    assert_non_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char pa[4096], pb[4096];
        snprintf(pa, sizeof pa, "%s/%s", a, de->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, de->d_name);
        if (!same_file(pa, pb))
            fail_msg("%s and %s differ", pa, pb);
        n++;
    }
    closedir(d);
    assert_true(n >= 2);
}

typedef struct logbuf {
    char text[16384];
    int warns;
} logbuf;

static void log_to_buf(void *user, kvq_log_level level, const char *msg)
{
    logbuf *b = user;
    size_t n = strlen(b->text);
    snprintf(b->text + n, sizeof b->text - n, "%s\n", msg);
    b->warns += level == KVQ_LOG_WARN;
}

static int cancel_after_first(void *user, const char *what, uint64_t done, uint64_t total)
{
    (void)user;
    (void)total;
    return !strcmp(what, "capture") && done > 0;
}

static void write_ids(const char *path, const int32_t *ids, size_t n)
{
    assert_int_equal(test_write_file(path, ids, n * sizeof *ids), 0);
}

/* q^T q summed per head over rows [r0, r1) in row order, upper triangle, added to acc
 * (the writer's contract, written out plainly).  q: [rows, H, d]  acc: [H, d, d] */
static void ref_moments(double *acc, const float *q, int64_t r0, int64_t r1, int H, int d)
{
    for (int h = 0; h < H; h++)
        for (int64_t r = r0; r < r1; r++) {
            const float *x = q + ((size_t)r * H + h) * d;
            for (int a = 0; a < d; a++)
                for (int b = a; b < d; b++)
                    acc[((size_t)h * d + a) * d + b] += (double)x[a] * (double)x[b];
        }
}

/* What the file must hold, summed as the writer's contract says: rows are grouped into
 * pieces (an append call, split at sequence starts), each piece is summed from zero and
 * added to its sequence's sum, each finished sequence is added to the total, and the
 * result is mirrored. cuts [n_cuts]: the first row of every append call. */
static double *ref_moment_file(const float *q, const int64_t *seqs, int64_t n_seqs,
                               const int64_t *cuts, int n_cuts, int H, int d)
{
    size_t m = (size_t)H * d * d;
    double *tot = calloc(m, sizeof *tot), *acc = calloc(m, sizeof *acc),
           *piece = calloc(m, sizeof *piece);
    for (int64_t s = 0; s < n_seqs; s++) {
        memset(acc, 0, m * sizeof *acc);
        const int64_t first = seqs[2 * s], end = first + seqs[2 * s + 1];
        for (int64_t r = first; r < end;) {
            int64_t next = end;
            for (int c = 0; c < n_cuts; c++)
                if (cuts[c] > r && cuts[c] < next)
                    next = cuts[c];
            memset(piece, 0, m * sizeof *piece);
            ref_moments(piece, q, r, next, H, d);
            for (size_t i = 0; i < m; i++)
                acc[i] += piece[i];
            r = next;
        }
        for (size_t i = 0; i < m; i++)
            tot[i] += acc[i];
    }
    for (int h = 0; h < H; h++)
        for (int a = 0; a < d; a++)
            for (int b = 0; b < a; b++)
                tot[((size_t)h * d + a) * d + b] = tot[((size_t)h * d + b) * d + a];
    free(acc);
    free(piece);
    return tot;
}

/* ======================================================================================
 * Writer (no model needed)
 * ====================================================================================== */

enum { W_LAYERS = 3, W_H = 2, W_KH = 1, W_D = 4, W_T = 7 };
static const int64_t w_seqs[4] = {0, 4, 4, 3};
static const int32_t w_tokens[W_T] = {1, 7, 8, 9, 1, 11, 12};

static kvq_capture_info writer_info(int32_t *layers, int n_layers)
{
    kvq_capture_info ci;
    memset(&ci, 0, sizeof ci);
    kvq_model_id *m = &ci.model;
    snprintf(m->path, sizeof m->path, "fake/model \"quoted\"");
    snprintf(m->source, sizeof m->source, "gguf");
    snprintf(m->architecture, sizeof m->architecture, "llama");
    m->n_layers = W_LAYERS;
    m->dim = 8;
    m->hidden_dim = 16;
    m->n_heads = W_H;
    m->n_kv_heads = W_KH;
    m->head_dim = W_D;
    m->vocab_size = 50;
    m->context_length = 64;
    m->norm_eps = 1e-5;
    m->rope = kvq_rope_default(W_D);
    m->rope.base = 500000.0;
    snprintf(ci.corpus_spec, sizeof ci.corpus_spec, "uuid:2");
    ci.corpus_seed = 9;
    snprintf(ci.corpus_hash, sizeof ci.corpus_hash, "00000000000000ff");
    ci.n_documents = 2;
    ci.dtype = KVQ_DT_F32;
    ci.seq_len = 4;
    ci.n_tokens = W_T;
    ci.n_sequences = 2;
    ci.sequences = (int64_t *)w_seqs;
    ci.layers = layers;
    ci.n_files = n_layers;
    ci.has_values = 1;
    return ci;
}

/* Random rows for every layer: q [L, T, H, d], k/v [L, T, KH, d]. */
static void writer_rows(float *q, float *k, float *v)
{
    test_random_qkv(42, q, W_LAYERS * W_T * W_H * W_D, k, v, W_LAYERS * W_T * W_KH * W_D);
}

#define QOFF(l, t) (((size_t)(l) * W_T + (t)) * W_H * W_D)
#define KOFF(l, t) (((size_t)(l) * W_T + (t)) * W_KH * W_D)

/* Appends every layer's rows in interleaved chunks that cross the sequence boundary. */
static void writer_feed(kvq_capture_writer *w, const float *q, const float *k, const float *v)
{
    kvq_err e = {0};
    static const int cuts[][3] = {{0, 0, 3}, {1, 0, 7}, {2, 0, 5}, {0, 3, 4}, {2, 5, 2}};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        int l = cuts[i][0], t0 = cuts[i][1], n = cuts[i][2];
        if (kvq_capture_writer_append(w, l, n, q + QOFF(l, t0), k + KOFF(l, t0),
                                      v + KOFF(l, t0), &e) != KVQ_OK)
            fail_msg("%s", e.msg);
    }
}

static void test_writer_roundtrip(void **state)
{
    (void)state;
    float q[W_LAYERS * W_T * W_H * W_D], k[W_LAYERS * W_T * W_KH * W_D],
        v[W_LAYERS * W_T * W_KH * W_D];
    writer_rows(q, k, v);
    int32_t layers[2] = {2, 0};
    kvq_capture_info ci = writer_info(layers, 2);
    const char *dir = test_path("w_all");
    kvq_capture_writer *w = NULL;
    kvq_err e = {0};
    kvq_capture_writer_params wp = kvq_capture_writer_params_default();
    assert_int_equal(kvq_capture_writer_create(dir, &ci, w_tokens, &wp, &w, &e), KVQ_OK);
    assert_false(exists(dir)); /* only the temporary directory so far */
    assert_int_equal(entries_named(dir), 1);
    writer_feed(w, q, k, v);
    assert_int_equal(kvq_capture_writer_rows(w, 0), W_T);
    assert_int_equal(kvq_capture_writer_rows(w, 1), 0); /* not captured */
    assert_int_equal(kvq_capture_writer_finish(w, &e), KVQ_OK);
    kvq_capture_writer_free(w);
    assert_int_equal(entries_named(dir), 1);

    /* Exactly capture.json and the two layer files: no raw files left. */
    DIR *d = opendir(dir);
    int n_files = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') {
            n_files++;
            assert_true(!strcmp(de->d_name, "capture.json") ||
                        !strcmp(de->d_name, "layer_000.safetensors") ||
                        !strcmp(de->d_name, "layer_002.safetensors"));
        }
    closedir(d);
    assert_int_equal(n_files, 3);

    /* capture.json reads back as written. */
    kvq_capture_info *rd = NULL;
    assert_int_equal(kvq_capture_info_read(dir, &rd, &e), KVQ_OK);
    assert_string_equal(rd->tool, "kvq " KVQ_VERSION_STRING);
    assert_string_equal(rd->model.path, "fake/model \"quoted\"");
    assert_int_equal(kvq_model_id_compare(&rd->model, "read", &ci.model, "written", &e), KVQ_OK);
    assert_true(rd->model.rope.base == 500000.0);
    assert_string_equal(rd->corpus_spec, "uuid:2");
    assert_string_equal(rd->corpus_hash, "00000000000000ff");
    assert_int_equal(rd->corpus_seed, 9);
    assert_int_equal(rd->n_documents, 2);
    assert_int_equal(rd->dtype, KVQ_DT_F32);
    assert_int_equal(rd->seq_len, 4);
    assert_int_equal(rd->n_tokens, W_T);
    assert_int_equal(rd->n_sequences, 2);
    assert_memory_equal(rd->sequences, w_seqs, sizeof w_seqs);
    assert_int_equal(rd->n_files, 2);
    assert_int_equal(rd->layers[0], 0); /* ascending */
    assert_int_equal(rd->layers[1], 2);
    assert_string_equal(rd->files[1], "layer_002.safetensors");
    assert_int_equal(rd->n_queries, 0);
    assert_int_equal(rd->has_values, 1);
    kvq_capture_info_free(rd);

    for (int li = 0; li < 2; li++) {
        int l = li ? 2 : 0;
        tensor tk = load(dir, l, "k"), tv = load(dir, l, "v"), tq = load(dir, l, "q");
        tensor tr = load(dir, l, "q_rows"), tp = load(dir, l, "pos"), ts = load(dir, l, "seq");
        tensor tt = load(dir, l, "tokens"), tm = load(dir, l, "q_moment_sum");
        tensor tc = load(dir, l, "q_moment_count");
        assert_int_equal(tk.dt, KVQ_DT_F32);
        assert_int_equal(tk.ndim, 3);
        assert_int_equal(tk.shape[0], W_T);
        assert_int_equal(tk.shape[1], W_KH);
        assert_int_equal(tk.shape[2], W_D);
        assert_memory_equal(tk.data, k + KOFF(l, 0), tk.nbytes);
        assert_memory_equal(tv.data, v + KOFF(l, 0), tv.nbytes);
        assert_int_equal(tq.shape[0], W_T);
        assert_memory_equal(tq.data, q + QOFF(l, 0), tq.nbytes);
        static const int32_t rows[W_T] = {0, 1, 2, 3, 4, 5, 6}, pos[W_T] = {0, 1, 2, 3, 0, 1, 2},
                             seq[W_T] = {0, 0, 0, 0, 1, 1, 1};
        assert_memory_equal(tr.data, rows, sizeof rows);
        assert_memory_equal(tp.data, pos, sizeof pos);
        assert_memory_equal(ts.data, seq, sizeof seq);
        assert_memory_equal(tt.data, w_tokens, sizeof w_tokens);
        static const int64_t cuts[2][2] = {{0, 3}, {0, 5}}; /* as writer_feed appends */
        double *ref = ref_moment_file(q + QOFF(l, 0), w_seqs, 2, cuts[li], 2, W_H, W_D);
        assert_int_equal(tm.n, W_H * W_D * W_D);
        assert_memory_equal(tm.data, ref, tm.nbytes); /* bit for bit */
        free(ref);
        for (int h = 0; h < W_H; h++)
            assert_true(((double *)tc.data)[h] == W_T);
        tensor *all[] = {&tk, &tv, &tq, &tr, &tp, &ts, &tt, &tm, &tc};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            tensor_free(all[i]);
    }

    /* Layer metadata repeats format, version, layer and the model identity. */
    kvq_st *st = NULL;
    assert_int_equal(kvq_st_open(layer_path(dir, 2), &st, &e), KVQ_OK);
    assert_string_equal(kvq_st_meta_get(st, "format"), "kvq-capture");
    assert_string_equal(kvq_st_meta_get(st, "version"), "1");
    assert_string_equal(kvq_st_meta_get(st, "layer"), "2");
    kvq_model_id mid;
    assert_int_equal(kvq_model_id_from_meta(st, "model.", "layer 2", &mid, &e), KVQ_OK);
    assert_int_equal(kvq_model_id_compare(&mid, "meta", &ci.model, "written", &e), KVQ_OK);
    kvq_st_close(st);
}

static void test_writer_sample_f16_no_values(void **state)
{
    (void)state;
    float q[W_LAYERS * W_T * W_H * W_D], k[W_LAYERS * W_T * W_KH * W_D],
        v[W_LAYERS * W_T * W_KH * W_D];
    writer_rows(q, k, v);
    int32_t layers[1] = {0};
    kvq_capture_info ci = writer_info(layers, 1);
    ci.dtype = KVQ_DT_F16;
    ci.has_values = 0;
    ci.n_queries = 3;
    kvq_err e = {0};
    kvq_capture_writer_params wp = kvq_capture_writer_params_default();
    int32_t first_rows[3] = {0};
    int differs = 0;
    for (uint64_t seed = 5; seed < 13; seed++) {
        char name[64];
        snprintf(name, sizeof name, "w_s%d", (int)seed);
        const char *dir = test_path(name);
        kvq_capture_writer *w = NULL;
        wp.seed = seed;
        assert_int_equal(kvq_capture_writer_create(dir, &ci, w_tokens, &wp, &w, &e), KVQ_OK);
        writer_feed(w, q, k, v);
        assert_int_equal(kvq_capture_writer_finish(w, &e), KVQ_OK);
        kvq_capture_writer_free(w);

        tensor tr = load(dir, 0, "q_rows"), tq = load(dir, 0, "q"), tv = load(dir, 0, "v");
        tensor tk = load(dir, 0, "k"), tm = load(dir, 0, "q_moment_sum");
        assert_null(tv.data); /* --no-values */
        assert_int_equal(tr.n, 3);
        const int32_t *rows = tr.data;
        for (int i = 0; i < 3; i++) {
            assert_true(rows[i] >= 0 && rows[i] < W_T);
            if (i)
                assert_true(rows[i] > rows[i - 1]); /* sorted, unique */
            for (int j = 0; j < W_H * W_D; j++)     /* f16 of the row's f32 query */
                assert_int_equal(((uint16_t *)tq.data)[i * W_H * W_D + j],
                                 kvq_f32_to_f16_ref(q[QOFF(0, rows[i]) + j]));
        }
        for (size_t j = 0; j < tk.n; j++)
            assert_int_equal(((uint16_t *)tk.data)[j], kvq_f32_to_f16_ref(k[j]));
        if (seed == 5)
            memcpy(first_rows, rows, sizeof first_rows);
        else
            differs |= memcmp(first_rows, rows, sizeof first_rows) != 0;
        /* The moments cover every row, not the sample. */
        static const int64_t cuts[2] = {0, 3};
        double *ref = ref_moment_file(q, w_seqs, 2, cuts, 2, W_H, W_D);
        assert_memory_equal(tm.data, ref, tm.nbytes);
        free(ref);
        kvq_capture_info *rd = NULL;
        assert_int_equal(kvq_capture_info_read(dir, &rd, &e), KVQ_OK);
        assert_int_equal(rd->n_queries, 3);
        assert_int_equal(rd->has_values, 0);
        assert_int_equal(rd->dtype, KVQ_DT_F16);
        kvq_capture_info_free(rd);
        tensor *all[] = {&tr, &tq, &tk, &tm};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            tensor_free(all[i]);
    }
    assert_true(differs); /* the seed matters */

    /* Same seed, same bytes. */
    kvq_capture_writer *w = NULL;
    wp.seed = 5;
    assert_int_equal(kvq_capture_writer_create(test_path("w_s5b"), &ci, w_tokens, &wp, &w, &e),
                     KVQ_OK);
    writer_feed(w, q, k, v);
    assert_int_equal(kvq_capture_writer_finish(w, &e), KVQ_OK);
    kvq_capture_writer_free(w);
    assert_same_dir(test_path("w_s5"), test_path("w_s5b"));

    /* A sample as large as the corpus stores every row and says "all". */
    ci.n_queries = W_T;
    assert_int_equal(kvq_capture_writer_create(test_path("w_big"), &ci, w_tokens, &wp, &w, &e),
                     KVQ_OK);
    writer_feed(w, q, k, v);
    assert_int_equal(kvq_capture_writer_finish(w, &e), KVQ_OK);
    kvq_capture_writer_free(w);
    kvq_capture_info *rd = NULL;
    assert_int_equal(kvq_capture_info_read(test_path("w_big"), &rd, &e), KVQ_OK);
    assert_int_equal(rd->n_queries, 0);
    kvq_capture_info_free(rd);
}

static void test_writer_errors(void **state)
{
    (void)state;
    float q[W_LAYERS * W_T * W_H * W_D], k[W_LAYERS * W_T * W_KH * W_D],
        v[W_LAYERS * W_T * W_KH * W_D];
    writer_rows(q, k, v);
    int32_t layers[1] = {0};
    kvq_capture_info ci = writer_info(layers, 1);
    kvq_err e = {0};
    kvq_capture_writer *w = NULL;
    const char *dir = test_path("w_err");

    /* NaN in v at row 5: layer, sequence and position named; nothing left behind. */
    v[KOFF(0, 5) + 2] = NAN;
    assert_int_equal(kvq_capture_writer_create(dir, &ci, w_tokens, NULL, &w, &e), KVQ_OK);
    assert_int_equal(kvq_capture_writer_append(w, 0, 3, q, k, v, &e), KVQ_OK);
    assert_int_equal(kvq_capture_writer_append(w, 0, 4, q + QOFF(0, 3), k + KOFF(0, 3),
                                               v + KOFF(0, 3), &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "layer 0 sequence 1 position 1 (row 5): non-finite v"));
    /* after an error, only free */
    assert_int_equal(kvq_capture_writer_finish(w, &e), KVQ_E_INVALID_ARG);
    kvq_capture_writer_free(w);
    assert_int_equal(entries_named(dir), 0);
    v[KOFF(0, 5) + 2] = 0;

    /* Inf in a layer that is not captured is an error too. */
    q[QOFF(1, 2)] = INFINITY;
    assert_int_equal(kvq_capture_writer_create(dir, &ci, w_tokens, NULL, &w, &e), KVQ_OK);
    assert_int_equal(kvq_capture_writer_append(w, 1, 7, q + QOFF(1, 0), k, v, &e),
                     KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "layer 1 sequence 0 position 2 (row 2): non-finite q"));
    kvq_capture_writer_free(w);
    assert_int_equal(entries_named(dir), 0);
    q[QOFF(1, 2)] = 0;

    /* Too many rows; finishing with missing rows. */
    assert_int_equal(kvq_capture_writer_create(dir, &ci, w_tokens, NULL, &w, &e), KVQ_OK);
    assert_int_equal(kvq_capture_writer_append(w, 0, 8, q, k, v, &e), KVQ_E_INVALID_ARG);
    kvq_capture_writer_free(w);
    assert_int_equal(kvq_capture_writer_create(dir, &ci, w_tokens, NULL, &w, &e), KVQ_OK);
    assert_int_equal(kvq_capture_writer_append(w, 0, 6, q, k, v, &e), KVQ_OK);
    assert_int_equal(kvq_capture_writer_append(w, 3, 1, q, k, v, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(kvq_capture_writer_finish(w, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "layer 0 has 6 of 7 rows"));
    kvq_capture_writer_free(w);
    assert_int_equal(entries_named(dir), 0);

    /* Inconsistent descriptions. */
    int64_t bad_seqs[4] = {0, 4, 5, 2};
    ci.sequences = bad_seqs;
    assert_int_equal(kvq_capture_writer_create(dir, &ci, w_tokens, NULL, &w, &e),
                     KVQ_E_INVALID_ARG);
    ci.sequences = (int64_t *)w_seqs;
    layers[0] = 3;
    assert_int_equal(kvq_capture_writer_create(dir, &ci, w_tokens, NULL, &w, &e),
                     KVQ_E_INVALID_ARG);
    layers[0] = 0;
    ci.dtype = KVQ_DT_I32;
    assert_int_equal(kvq_capture_writer_create(dir, &ci, w_tokens, NULL, &w, &e),
                     KVQ_E_INVALID_ARG);
    assert_null(w);
    assert_int_equal(entries_named(dir), 0);
}

/* Head dims that are not a multiple of the 4 x 4 tile, appends longer than the 256-row
 * block, and 1 or 2 threads: the sums are the reference's, bit for bit. */
static void test_writer_moment_kernel(void **state)
{
    (void)state;
    enum { H = 8, T = 1300 };
    static const int dims[3] = {10, 6, 12};
    kvq_err e = {0};
    for (int di = 0; di < 3; di++) {
        const int d = dims[di];
        float *q = malloc(sizeof(float) * T * H * d), *k = malloc(sizeof(float) * T * d);
        int32_t *tok = calloc(T, sizeof *tok);
        kvq_rng r;
        kvq_rng_seed(&r, 100 + di);
        for (int i = 0; i < T * H * d; i++)
            q[i] = (float)(kvq_rng_normal(&r) * (1 + i % d));
        for (int i = 0; i < T * d; i++)
            k[i] = (float)kvq_rng_normal(&r);
        int32_t layers[1] = {0};
        int64_t seqs[4] = {0, 1000, 1000, 300};
        kvq_capture_info ci = writer_info(layers, 1);
        ci.model.n_heads = H;
        ci.model.head_dim = d;
        ci.model.rope = kvq_rope_default(d);
        ci.n_tokens = T;
        ci.sequences = seqs;
        ci.has_values = 0;
        /* appends of 1100 and 200 rows: pieces [0,256) .. [768,1000) | [1000,1100) [1100,1300) */
        const int64_t cuts[8] = {0, 256, 512, 768, 1000, 1100};
        double *ref = ref_moment_file(q, seqs, 2, cuts, 6, H, d);
        for (int threads = 1; threads <= 2; threads++) {
            char name[64];
            snprintf(name, sizeof name, "w_kern_%d_%d", d, threads);
            const char *dir = test_path(name);
            kvq_capture_writer_params wp = kvq_capture_writer_params_default();
            wp.threads = threads;
            kvq_capture_writer *w = NULL;
            assert_int_equal(kvq_capture_writer_create(dir, &ci, tok, &wp, &w, &e), KVQ_OK);
            assert_int_equal(kvq_capture_writer_append(w, 0, 1100, q, k, NULL, &e), KVQ_OK);
            assert_int_equal(kvq_capture_writer_append(w, 0, 200, q + (size_t)1100 * H * d,
                                                       k + (size_t)1100 * d, NULL, &e), KVQ_OK);
            assert_int_equal(kvq_capture_writer_finish(w, &e), KVQ_OK);
            kvq_capture_writer_free(w);
            tensor tm = load(dir, 0, "q_moment_sum");
            assert_int_equal(tm.n, (size_t)H * d * d);
            assert_memory_equal(tm.data, ref, tm.nbytes);
            tensor_free(&tm);
        }
        free(ref);
        free(q);
        free(k);
        free(tok);
    }
}

/* ======================================================================================
 * stories260K
 * ====================================================================================== */

/* stories260K, else SmolLM2 (its layers 0-4): the same properties. RM holds the shape
 * of the model in use, from its GGUF metadata (testutil.h), not from kvq. */
static kvq_model *stories;
static const char *S_F32 = "s_f32"; /* uuid:2, 3 sequences of 32 tokens at most, f32 */
static struct {
    int is_stories, heads, kv_heads, head_dim, dim, bos;
} RM;
static const int32_t SMOL_LAYERS[5] = {0, 1, 2, 3, 4};

static kvq_capture_params small_params(void)
{
    kvq_capture_params p = kvq_capture_params_default();
    p.seq_len = 32;
    p.max_tokens = 80;
    p.threads = 1;
    p.chunk = 7; /* several chunks per sequence */
    if (!RM.is_stories) {
        p.layers = SMOL_LAYERS;
        p.n_layers = 5;
    }
    return p;
}

/* Opens the real model once; skips the test when neither is present. */
static kvq_model *need_stories(void)
{
    int is_stories;
    const char *path = test_real_model(&is_stories);
    if (!path)
        TEST_SKIP("neither stories260K (KVQ_TEST_MODEL) nor SmolLM2 (KVQ_SMOLLM2) found");
    RM.is_stories = is_stories;
    if (is_stories) { /* 5 layers, 8 heads, 4 KV heads, head dim 8, BOS */
        RM.heads = 8, RM.kv_heads = 4, RM.head_dim = 8, RM.dim = 64, RM.bos = 1;
    } else { /* 30 layers, 9 heads, 3 KV heads, head dim 64, no BOS */
        RM.heads = 9, RM.kv_heads = 3, RM.head_dim = 64, RM.dim = 576, RM.bos = 0;
    }
    if (!stories) {
        kvq_err e = {0};
        kvq_model_params mp = kvq_model_params_default();
        if (kvq_model_open(path, &mp, &stories, &e) != KVQ_OK)
            fail_msg("%s", e.msg);
    }
    return stories;
}

static void capture_ok(const kvq_model *m, const char *spec, const kvq_capture_params *p,
                       const char *dir)
{
    kvq_err e = {0};
    kvq_corpus_params cp;
    kvq_corpus_params_default(&cp);
    if (kvq_capture_run(m, spec, &cp, p, dir, &e) != KVQ_OK)
        fail_msg("capture %s: %s", spec, e.msg);
}

/* The shared f32 capture (made once). */
static const char *stories_f32(void)
{
    static char dir[4096]; /* test_path() buffers rotate: keep a copy */
    snprintf(dir, sizeof dir, "%s", test_path(S_F32));
    if (!exists(dir)) {
        kvq_capture_params p = small_params();
        p.dtype = KVQ_DT_F32;
        capture_ok(need_stories(), "uuid:2", &p, dir);
    }
    return dir;
}

/* Layer 0 states recomputed from the GGUF weights: rmsnorm, then the projection. */
static void test_stories_layer0_independent(void **state)
{
    (void)state;
    kvq_model *m = need_stories();
    const char *dir = stories_f32();
    kvq_err e = {0};
    kvq_capture_info *ci = NULL;
    assert_int_equal(kvq_capture_info_read(dir, &ci, &e), KVQ_OK);
    assert_int_equal(ci->n_tokens, 80);
    assert_int_equal(ci->n_sequences, 3); /* 32 + 32 + 16 */
    assert_int_equal(ci->sequences[5], 16);
    assert_int_equal(ci->n_files, 5);
    assert_string_equal(ci->model.architecture, "llama");
    assert_int_equal(ci->model.rope.layout, KVQ_ROPE_INTERLEAVED);
    assert_string_equal(ci->corpus_spec, "uuid:2");

    /* The tokens are the corpus's: BOS (when the model adds one), then the first
     * document's tokens. */
    tensor tt = load(dir, 0, "tokens");
    const int32_t *tok = tt.data;
    for (int s = 0; s < 3 && RM.bos; s++)
        assert_int_equal(tok[32 * s], 1);
    kvq_corpus *c = NULL;
    kvq_corpus_iter *it = NULL;
    const kvq_corpus_doc *doc = NULL;
    assert_int_equal(kvq_corpus_open("uuid:2", NULL, &c, &e), KVQ_OK);
    assert_int_equal(kvq_corpus_iter_new(c, &it, &e), KVQ_OK);
    assert_int_equal(kvq_corpus_iter_next(it, &doc, &e), KVQ_OK);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(kvq_tokenizer_encode(kvq_model_tokenizer(m), doc->text, doc->len, 0, &ids,
                                          &n_ids, &e), KVQ_OK);
    assert_true(n_ids > 32);
    assert_memory_equal(tok + RM.bos, ids, (size_t)(32 - RM.bos) * sizeof *ids);
    free(ids);
    kvq_corpus_iter_free(it);
    kvq_corpus_free(c);

    /* Weights straight from the GGUF file. */
    kvq_gguf *g = NULL;
    int is_stories;
    assert_int_equal(kvq_gguf_open(test_real_model(&is_stories), &g, &e), KVQ_OK);
    const kvq_gguf_tensor *emb = kvq_gguf_find_tensor(g, "token_embd.weight");
    const kvq_gguf_tensor *nrm = kvq_gguf_find_tensor(g, "blk.0.attn_norm.weight");
    const kvq_gguf_tensor *wk = kvq_gguf_find_tensor(g, "blk.0.attn_k.weight");
    const kvq_gguf_tensor *wq = kvq_gguf_find_tensor(g, "blk.0.attn_q.weight");
    const kvq_gguf_tensor *wv = kvq_gguf_find_tensor(g, "blk.0.attn_v.weight");
    assert_true(emb && nrm && wk && wq && wv);
    double eps = 0;
    assert_int_equal(kvq_gguf_get_f64(g, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
    const int DIM = RM.dim, KVD = RM.kv_heads * RM.head_dim, QD = RM.heads * RM.head_dim;
    float *norm = malloc(sizeof(float) * (size_t)DIM), *x = malloc(sizeof(float) * (size_t)DIM);
    float *WK = malloc(sizeof(float) * (size_t)(KVD * DIM));
    float *WQ = malloc(sizeof(float) * (size_t)(QD * DIM));
    float *WV = malloc(sizeof(float) * (size_t)(KVD * DIM));
    double *h = malloc(sizeof(double) * (size_t)DIM);
    assert_true(norm && x && WK && WQ && WV && h);
    assert_int_equal(kvq_gguf_rows_to_f32(nrm, 0, 1, norm, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_rows_to_f32(wk, 0, KVD, WK, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_rows_to_f32(wq, 0, QD, WQ, &e), KVQ_OK);
    assert_int_equal(kvq_gguf_rows_to_f32(wv, 0, KVD, WV, &e), KVQ_OK);

    tensor tk = load(dir, 0, "k"), tq = load(dir, 0, "q"), tv = load(dir, 0, "v");
    assert_int_equal(tk.dt, KVQ_DT_F32);
    const float *K = tk.data, *Q = tq.data, *V = tv.data;
    double worst = 0;
    for (int r = 0; r < 80; r++) {
        assert_int_equal(kvq_gguf_rows_to_f32(emb, tok[r], 1, x, &e), KVQ_OK);
        double ss = 0;
        for (int i = 0; i < DIM; i++)
            ss += (double)x[i] * x[i];
        double scale = 1.0 / sqrt(ss / DIM + eps);
        for (int i = 0; i < DIM; i++)
            h[i] = x[i] * scale * norm[i];
        for (int o = 0; o < QD; o++) {
            double sk = 0, sq = 0, sv = 0;
            for (int i = 0; i < DIM; i++) {
                sq += h[i] * WQ[o * DIM + i];
                if (o < KVD) {
                    sk += h[i] * WK[o * DIM + i];
                    sv += h[i] * WV[o * DIM + i];
                }
            }
            double dq = fabs(sq - Q[r * QD + o]) / (1 + fabs(sq));
            worst = fmax(worst, dq);
            if (o < KVD) {
                worst = fmax(worst, fabs(sk - K[r * KVD + o]) / (1 + fabs(sk)));
                worst = fmax(worst, fabs(sv - V[r * KVD + o]) / (1 + fabs(sv)));
            }
        }
    }
    assert_true(worst < 1e-5); /* f32 GEMM against a double reference */
    free(norm), free(x), free(WK), free(WQ), free(WV), free(h);
    kvq_gguf_close(g);
    tensor *all[] = {&tt, &tk, &tq, &tv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tensor_free(all[i]);
    kvq_capture_info_free(ci);
}

/* q_moment_sum is the sum of q^T q over the stored (all) queries, per sequence then folded. */
static void test_stories_moments(void **state)
{
    (void)state;
    need_stories();
    const char *dir = stories_f32();
    kvq_err e = {0};
    kvq_capture_info *ci = NULL;
    assert_int_equal(kvq_capture_info_read(dir, &ci, &e), KVQ_OK);
    for (int l = 0; l < 5; l++) {
        tensor tq = load(dir, l, "q"), tm = load(dir, l, "q_moment_sum");
        tensor tc = load(dir, l, "q_moment_count");
        const int H = RM.heads, D = RM.head_dim;
        assert_int_equal(tm.shape[0], H);
        assert_int_equal(tm.shape[1], D);
        /* the forward pass appends chunks of 7 rows from each sequence start */
        int64_t cuts[64];
        int n_cuts = 0;
        for (int64_t s = 0; s < ci->n_sequences; s++)
            for (int64_t r = 0; r < ci->sequences[2 * s + 1]; r += 7)
                cuts[n_cuts++] = ci->sequences[2 * s] + r;
        double *ref = ref_moment_file(tq.data, ci->sequences, ci->n_sequences, cuts, n_cuts, H, D);
        assert_memory_equal(tm.data, ref, tm.nbytes);
        /* and a plain sum over all rows agrees to rounding */
        double *plain = calloc((size_t)(H * D * D), sizeof(double));
        assert_non_null(plain);
        ref_moments(plain, tq.data, 0, 80, H, D);
        const double *got = tm.data;
        for (int h = 0; h < H; h++)
            for (int a = 0; a < D; a++)
                for (int b = a; b < D; b++) {
                    double x = plain[(h * D + a) * D + b], y = got[(h * D + a) * D + b];
                    assert_true(fabs(x - y) <= 1e-12 * (1 + fabs(x)));
                    assert_true(got[(h * D + b) * D + a] == y); /* symmetric */
                }
        for (int h = 0; h < H; h++)
            assert_true(((double *)tc.data)[h] == 80.0);
        free(ref);
        free(plain);
        tensor_free(&tq);
        tensor_free(&tm);
        tensor_free(&tc);
    }
    kvq_capture_info_free(ci);
}

/* f16 and bf16 captures hold the rounding of the f32 capture, bit for bit. */
static void test_stories_dtypes(void **state)
{
    (void)state;
    kvq_model *m = need_stories();
    const char *f32 = stories_f32();
    const kvq_dtype dts[2] = {KVQ_DT_F16, KVQ_DT_BF16};
    const char *names[3] = {"k", "v", "q"};
    for (int i = 0; i < 2; i++) {
        const char *dir = test_path(i ? "s_bf16" : "s_f16");
        kvq_capture_params p = small_params();
        p.dtype = dts[i];
        capture_ok(m, "uuid:2", &p, dir);
        for (int l = 0; l < 5; l += 2)
            for (int t = 0; t < 3; t++) {
                tensor a = load(f32, l, names[t]), b = load(dir, l, names[t]);
                assert_int_equal(b.dt, dts[i]);
                assert_int_equal(a.n, b.n);
                const float *x = a.data;
                const uint16_t *y = b.data;
                for (size_t j = 0; j < a.n; j++)
                    assert_int_equal(y[j], i ? kvq_f32_to_bf16_ref(x[j]) : kvq_f32_to_f16_ref(x[j]));
                tensor_free(&a);
                tensor_free(&b);
            }
        /* the moments are over the f32 states whatever the storage */
        tensor a = load(f32, 3, "q_moment_sum"), b = load(dir, 3, "q_moment_sum");
        assert_memory_equal(a.data, b.data, a.nbytes);
        tensor_free(&a);
        tensor_free(&b);
    }
}

/* --queries N: a seeded, reproducible, sorted sample of the f32 rows. */
static void test_stories_query_sample(void **state)
{
    (void)state;
    kvq_model *m = need_stories();
    const char *f32 = stories_f32();
    kvq_capture_params p = small_params();
    p.dtype = KVQ_DT_F32;
    p.n_queries = 20;
    p.seed = 3;
    capture_ok(m, "uuid:2", &p, test_path("s_q3"));
    capture_ok(m, "uuid:2", &p, test_path("s_q3b"));
    p.seed = 4;
    capture_ok(m, "uuid:2", &p, test_path("s_q4"));
    assert_same_dir(test_path("s_q3"), test_path("s_q3b"));

    tensor r3 = load(test_path("s_q3"), 2, "q_rows"), r4 = load(test_path("s_q4"), 2, "q_rows");
    tensor q3 = load(test_path("s_q3"), 2, "q"), qa = load(f32, 2, "q");
    assert_int_equal(r3.n, 20);
    assert_int_equal(q3.shape[0], 20);
    assert_true(memcmp(r3.data, r4.data, r3.nbytes) != 0);
    const int32_t *rows = r3.data;
    for (int i = 0; i < 20; i++) {
        assert_true(rows[i] >= 0 && rows[i] < 80);
        if (i)
            assert_true(rows[i] > rows[i - 1]);
        const int qd = RM.heads * RM.head_dim;
        assert_memory_equal((float *)q3.data + i * qd, (float *)qa.data + rows[i] * qd,
                            (size_t)qd * sizeof(float));
    }
    /* every layer samples the same rows */
    tensor r3l0 = load(test_path("s_q3"), 0, "q_rows");
    assert_memory_equal(r3l0.data, r3.data, r3.nbytes);
    /* moments and keys do not depend on the sample */
    tensor ma = load(f32, 2, "q_moment_sum"), m3 = load(test_path("s_q3"), 2, "q_moment_sum");
    tensor ka = load(f32, 2, "k"), k3 = load(test_path("s_q3"), 2, "k");
    assert_memory_equal(ma.data, m3.data, ma.nbytes);
    assert_memory_equal(ka.data, k3.data, ka.nbytes);
    kvq_err e = {0};
    kvq_capture_info *ci = NULL;
    assert_int_equal(kvq_capture_info_read(test_path("s_q3"), &ci, &e), KVQ_OK);
    assert_int_equal(ci->n_queries, 20);
    kvq_capture_info_free(ci);
    tensor *all[] = {&r3, &r4, &q3, &qa, &r3l0, &ma, &m3, &ka, &k3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tensor_free(all[i]);
}

/* Same inputs and seed: byte-identical directories, whatever the thread count. */
static void test_stories_determinism(void **state)
{
    (void)state;
    kvq_model *m = need_stories();
    kvq_capture_params p = small_params();
    p.layers = (const int32_t[]){1, 3};
    p.n_layers = 2;
    capture_ok(m, "uuid:2", &p, test_path("s_det1"));
    p.threads = 2;
    capture_ok(m, "uuid:2", &p, test_path("s_det2"));
    assert_same_dir(test_path("s_det1"), test_path("s_det2"));
    assert_false(exists(layer_path(test_path("s_det1"), 0)));
    assert_true(exists(layer_path(test_path("s_det1"), 3)));
}

/* The merge property: capture(X), capture(Y), capture(Z) merged equal capture(X, Y, Z).
 * "Concatenated corpus" is the spec "ids:X,ids:Y,ids:Z": the documents are packed into
 * one token stream cut into sequences of seq_len tokens, each starting with BOS, with a
 * separator between documents that is dropped at a sequence start. So the concatenation
 * splits like the parts exactly when every part but the last fills whole sequences:
 * X and Y hold a multiple of seq_len - 1 ids. The moment sums are folded per sequence,
 * so they match bit for bit when each later part is one sequence (Y, Z); a later part
 * of several sequences (W) matches to float64 rounding. */
static void test_stories_merge_property(void **state)
{
    (void)state;
    kvq_model *m = need_stories();
    enum { SEQ = 16 };
    int32_t ids[200];
    kvq_rng r;
    kvq_rng_seed(&r, 11);
    for (int i = 0; i < 200; i++)
        ids[i] = 3 + (int32_t)kvq_rng_below(&r, 509);
    char px[4096], py[4096], pz[4096], pw[4096];
    snprintf(px, sizeof px, "%s", test_path("x.ids"));
    snprintf(py, sizeof py, "%s", test_path("y.ids"));
    snprintf(pz, sizeof pz, "%s", test_path("z.ids"));
    snprintf(pw, sizeof pw, "%s", test_path("w.ids"));
    const int nb = RM.bos;                        /* a model without BOS: SEQ ids fill one */
    write_ids(px, ids, 2 * (SEQ - nb));            /* two full sequences */
    write_ids(py, ids + 40, SEQ - nb);            /* one full sequence */
    write_ids(pz, ids + 60, 9);                   /* one partial sequence */
    write_ids(pw, ids + 100, 2 * (SEQ - nb) + 4); /* three sequences */

    kvq_capture_params p = kvq_capture_params_default();
    if (!RM.is_stories) {
        p.layers = SMOL_LAYERS;
        p.n_layers = 5;
    }
    p.seq_len = SEQ;
    p.dtype = KVQ_DT_F32;
    p.threads = 1;
    char spec[3 * 4096 + 64];
    const char *parts[4] = {px, py, pz, pw};
    const char *cdir[4] = {"m_x", "m_y", "m_z", "m_w"};
    for (int i = 0; i < 4; i++) {
        snprintf(spec, sizeof spec, "ids:%s", parts[i]);
        capture_ok(m, spec, &p, test_path(cdir[i]));
    }
    snprintf(spec, sizeof spec, "ids:%s,ids:%s,ids:%s", px, py, pz);
    capture_ok(m, spec, &p, test_path("m_xyz"));
    snprintf(spec, sizeof spec, "ids:%s,ids:%s", px, pw);
    capture_ok(m, spec, &p, test_path("m_xw"));

    kvq_err e = {0};
    char in_x[4096], in_y[4096], in_z[4096], in_w[4096];
    snprintf(in_x, sizeof in_x, "%s", test_path("m_x"));
    snprintf(in_y, sizeof in_y, "%s", test_path("m_y"));
    snprintf(in_z, sizeof in_z, "%s", test_path("m_z"));
    snprintf(in_w, sizeof in_w, "%s", test_path("m_w"));
    const char *xyz[3] = {in_x, in_y, in_z}, *xw[2] = {in_x, in_w};
    assert_int_equal(kvq_capture_merge(xyz, 3, test_path("m_merged"), 0, NULL, &e), KVQ_OK);
    assert_int_equal(kvq_capture_merge(xw, 2, test_path("m_merged_xw"), 0, NULL, &e), KVQ_OK);

    kvq_capture_info *a = NULL, *b = NULL;
    assert_int_equal(kvq_capture_info_read(test_path("m_merged"), &a, &e), KVQ_OK);
    assert_int_equal(kvq_capture_info_read(test_path("m_xyz"), &b, &e), KVQ_OK);
    assert_int_equal(a->n_tokens, 2 * SEQ + SEQ + 9 + nb);
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_int_equal(a->n_sequences, 4);
    assert_int_equal(a->n_sequences, b->n_sequences);
    assert_memory_equal(a->sequences, b->sequences, (size_t)a->n_sequences * 2 * sizeof(int64_t));
    assert_int_equal(a->n_documents, 3);
    assert_int_equal(a->n_queries, 0);
    assert_string_equal(a->model.path, b->model.path);
    assert_non_null(strstr(a->corpus_spec, " + "));
    kvq_capture_info_free(a);
    kvq_capture_info_free(b);

    const char *names[9] = {"k", "v", "q", "q_rows", "pos", "seq", "tokens", "q_moment_sum",
                            "q_moment_count"};
    for (int l = 0; l < 5; l++)
        for (int t = 0; t < 9; t++) {
            tensor x = load(test_path("m_merged"), l, names[t]);
            tensor y = load(test_path("m_xyz"), l, names[t]);
            assert_non_null(x.data);
            assert_int_equal(x.dt, y.dt);
            assert_int_equal(x.ndim, y.ndim);
            assert_memory_equal(x.shape, y.shape, sizeof x.shape);
            if (memcmp(x.data, y.data, x.nbytes))
                fail_msg("layer %d tensor %s differs", l, names[t]);
            tensor_free(&x);
            tensor_free(&y);
            /* X + W: equal except the moment sums, which agree to rounding */
            x = load(test_path("m_merged_xw"), l, names[t]);
            y = load(test_path("m_xw"), l, names[t]);
            assert_int_equal(x.nbytes, y.nbytes);
            if (t != 7) {
                if (memcmp(x.data, y.data, x.nbytes))
                    fail_msg("X+W layer %d tensor %s differs", l, names[t]);
            } else {
                for (size_t j = 0; j < x.n; j++) {
                    double u = ((double *)x.data)[j], w = ((double *)y.data)[j];
                    assert_true(fabs(u - w) <= 1e-13 * (1 + fabs(u)));
                }
            }
            tensor_free(&x);
            tensor_free(&y);
        }
}

/* ======================================================================================
 * Random tiny llamas: errors, warnings, mismatches (no real model needed)
 * ====================================================================================== */

/* Writes a tiny llama GGUF; `inf_layer` >= 0 puts an Inf into that layer's Wk. */
static const char *tiny_gguf(const char *name, int n_layers, int inf_layer, int context)
{
    const char *path = test_path(name);
    if (exists(path))
        return path;
    tinyllama_spec s = tinyllama_default();
    s.n_layers = n_layers;
    if (context)
        s.context_length = context;
    tinyllama *t = tinyllama_new(&s);
    assert_non_null(t);
    if (inf_layer >= 0)
        t->layers[inf_layer].wk[5] = INFINITY;
    assert_int_equal(tinyllama_write_gguf(t, path), 0);
    tinyllama_free(t);
    return path;
}

static kvq_model *open_model(const char *path)
{
    kvq_model *m = NULL;
    kvq_err e = {0};
    kvq_model_params mp = kvq_model_params_default();
    if (kvq_model_open(path, &mp, &m, &e) != KVQ_OK)
        fail_msg("%s", e.msg);
    return m;
}

/* An ids corpus for the tiny models (vocab 96). */
static const char *tiny_ids(void)
{
    static char spec[4200];
    const char *path = test_path("tiny.ids");
    if (!exists(path)) {
        int32_t ids[40];
        for (int i = 0; i < 40; i++)
            ids[i] = 3 + (i * 37) % 90;
        write_ids(path, ids, 40);
    }
    snprintf(spec, sizeof spec, "ids:%s", path);
    return spec;
}

static void test_tiny_errors(void **state)
{
    (void)state;
    kvq_err e = {0};
    kvq_model *m = open_model(tiny_gguf("tiny2.gguf", 2, -1, 0));
    kvq_capture_params p = kvq_capture_params_default();
    p.seq_len = 16;
    p.threads = 1;

    /* An empty corpus: a clear error, nothing written. */
    const char *empty = test_path("empty.ids");
    assert_int_equal(test_write_file(empty, "", 0), 0);
    char spec[4200];
    snprintf(spec, sizeof spec, "ids:%s", empty);
    const char *out = test_path("t_empty");
    assert_int_equal(kvq_capture_run(m, spec, NULL, &p, out, &e), KVQ_E_INVALID_ARG);
    assert_non_null(strstr(e.msg, "no text"));
    assert_int_equal(entries_named(out), 0);

    /* An existing directory is kept without --force; with it, a directory that is not
     * a capture is still kept (refused), and a capture is replaced. */
    out = test_path("t_exists");
    assert_int_equal(mkdir(out, 0755), 0);
    char marker[4200];
    snprintf(marker, sizeof marker, "%s/keep", out);
    assert_int_equal(test_write_file(marker, "x", 1), 0);
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, out, &e), KVQ_E_EXISTS);
    assert_true(exists(marker));
    assert_int_equal(entries_named(out), 1);
    p.overwrite = 1; /* the file kvq did not write is named, and kept */
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, out, &e), KVQ_E_EXISTS);
    assert_non_null(strstr(e.msg, "/keep: not written by kvq"));
    assert_true(exists(marker));
    assert_int_equal(unlink(marker), 0);
    assert_int_equal(rmdir(out), 0);
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, out, &e), KVQ_OK);
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, out, &e), KVQ_OK);
    assert_true(exists(layer_path(out, 1)));
    assert_int_equal(entries_named(out), 1);
    p.overwrite = 0;

    /* An output whose parent is a file: the error names it, nothing is created. */
    const char *file = test_path("plainfile");
    assert_int_equal(test_write_file(file, "x", 1), 0);
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/cap", file);
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, bad, &e), KVQ_E_IO);
    assert_non_null(strstr(e.msg, bad));
    assert_int_equal(entries_named(test_path("plainfile")), 1);

    /* Cancelled through the progress callback: nothing left. */
    out = test_path("t_cancel");
    p.cb.progress = cancel_after_first;
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, out, &e), KVQ_E_CANCELLED);
    assert_int_equal(entries_named(out), 0);
    p.cb.progress = NULL;

    /* Bad parameters. */
    p.seq_len = 1;
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, out, &e), KVQ_E_INVALID_ARG);
    p.seq_len = 16;
    p.layers = (const int32_t[]){2};
    p.n_layers = 1;
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, out, &e), KVQ_E_INVALID_ARG);
    p.layers = NULL;
    p.n_layers = 0;
    p.dtype = KVQ_DT_F64;
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, out, &e), KVQ_E_INVALID_ARG);
    assert_int_equal(entries_named(out), 0);
    kvq_model_close(m);
}

/* An Inf weight makes the states non-finite: the capture stops naming layer and
 * position, and leaves nothing behind. */
static void test_tiny_nan_abort(void **state)
{
    (void)state;
    kvq_err e = {0};
    kvq_model *m = open_model(tiny_gguf("tiny_inf.gguf", 2, 1, 0));
    kvq_capture_params p = kvq_capture_params_default();
    p.seq_len = 16;
    p.threads = 1;
    const char *out = test_path("t_nan");
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, out, &e), KVQ_E_NUMERIC);
    assert_non_null(strstr(e.msg, "layer 1"));
    assert_non_null(strstr(e.msg, "position 0"));
    assert_non_null(strstr(e.msg, "sequence 0"));
    assert_int_equal(entries_named(out), 0);
    /* capturing only layer 0 never runs layer 1 */
    p.layers = (const int32_t[]){0};
    p.n_layers = 1;
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, out, &e), KVQ_OK);
    kvq_model_close(m);
}

static void test_tiny_context_warning(void **state)
{
    (void)state;
    kvq_err e = {0};
    kvq_model *m = open_model(tiny_gguf("tiny_ctx.gguf", 2, -1, 8));
    logbuf lb;
    memset(&lb, 0, sizeof lb);
    kvq_capture_params p = kvq_capture_params_default();
    p.threads = 1;
    p.cb.log = log_to_buf;
    p.cb.user = &lb;
    p.seq_len = 8;
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, test_path("t_ctx8"), &e), KVQ_OK);
    assert_int_equal(lb.warns, 0);
    /* the run says up front what it needs */
    assert_non_null(strstr(lb.text, "MiB of memory"));
    assert_non_null(strstr(lb.text, "MiB of disk"));
    p.seq_len = 12;
    assert_int_equal(kvq_capture_run(m, tiny_ids(), NULL, &p, test_path("t_ctx12"), &e), KVQ_OK);
    assert_int_equal(lb.warns, 1);
    assert_non_null(strstr(lb.text, "context length 8"));
    kvq_model_close(m);
}

static void test_merge_mismatch(void **state)
{
    (void)state;
    kvq_err e = {0};
    kvq_model *m2 = open_model(tiny_gguf("tiny2.gguf", 2, -1, 0));
    kvq_model *m3 = open_model(tiny_gguf("tiny3.gguf", 3, -1, 0));
    kvq_capture_params p = kvq_capture_params_default();
    p.seq_len = 16;
    p.threads = 1;
    p.layers = (const int32_t[]){0, 1};
    p.n_layers = 2;
    assert_int_equal(kvq_capture_run(m2, tiny_ids(), NULL, &p, test_path("mm_a"), &e), KVQ_OK);
    assert_int_equal(kvq_capture_run(m3, tiny_ids(), NULL, &p, test_path("mm_b"), &e), KVQ_OK);
    p.dtype = KVQ_DT_F32;
    assert_int_equal(kvq_capture_run(m2, tiny_ids(), NULL, &p, test_path("mm_c"), &e), KVQ_OK);
    p.dtype = KVQ_DT_F16;
    p.layers = (const int32_t[]){1};
    p.n_layers = 1;
    assert_int_equal(kvq_capture_run(m2, tiny_ids(), NULL, &p, test_path("mm_d"), &e), KVQ_OK);
    p.layers = (const int32_t[]){0, 1};
    p.n_layers = 2;
    p.values = 0;
    assert_int_equal(kvq_capture_run(m2, tiny_ids(), NULL, &p, test_path("mm_e"), &e), KVQ_OK);

    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s", test_path("mm_a"));
    const char *out = test_path("mm_out");
    struct { const char *other, *field; } cases[] = {
        {"mm_b", "model.n_layers"}, {"mm_c", "dtype"}, {"mm_d", "layers"},
        {"mm_e", "has_values"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(b, sizeof b, "%s", test_path(cases[i].other));
        const char *in[2] = {a, b};
        assert_int_equal(kvq_capture_merge(in, 2, out, 0, NULL, &e), KVQ_E_MISMATCH);
        if (!strstr(e.msg, cases[i].field))
            fail_msg("'%s' does not name %s", e.msg, cases[i].field);
        assert_int_equal(entries_named(out), 0);
    }

    /* Merging a capture with itself doubles it; the output is not overwritten unasked. */
    const char *in[2] = {a, a};
    assert_int_equal(kvq_capture_merge(in, 2, out, 0, NULL, &e), KVQ_OK);
    assert_int_equal(kvq_capture_merge(in, 2, out, 0, NULL, &e), KVQ_E_EXISTS);
    kvq_capture_info *ci = NULL, *c1 = NULL;
    assert_int_equal(kvq_capture_info_read(out, &ci, &e), KVQ_OK);
    assert_int_equal(kvq_capture_info_read(a, &c1, &e), KVQ_OK);
    assert_int_equal(ci->n_tokens, 2 * c1->n_tokens);
    assert_int_equal(ci->n_sequences, 2 * c1->n_sequences);
    tensor s1 = load(a, 1, "seq"), s2 = load(out, 1, "seq"), m1 = load(a, 1, "q_moment_sum");
    tensor m2s = load(out, 1, "q_moment_sum"), r2 = load(out, 1, "q_rows");
    const int32_t *sa = s1.data, *sb = s2.data, *rb = r2.data;
    for (int64_t i = 0; i < c1->n_tokens; i++) {
        assert_int_equal(sb[i], sa[i]);
        assert_int_equal(sb[c1->n_tokens + i], sa[i] + c1->n_sequences); /* renumbered */
        assert_int_equal(rb[c1->n_tokens + i], c1->n_tokens + i);        /* offset */
    }
    for (size_t j = 0; j < m1.n; j++)
        assert_true(((double *)m2s.data)[j] == 2 * ((double *)m1.data)[j]);
    tensor *all[] = {&s1, &s2, &m1, &m2s, &r2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tensor_free(all[i]);
    kvq_capture_info_free(ci);
    kvq_capture_info_free(c1);

    /* A missing input. */
    const char *gone[2] = {a, test_path("mm_nothing")};
    assert_int_equal(kvq_capture_merge(gone, 2, test_path("mm_out2"), 0, NULL, &e),
                     KVQ_E_NOT_FOUND);
    assert_int_equal(entries_named(test_path("mm_out2")), 0);
    kvq_model_close(m2);
    kvq_model_close(m3);
}

static int teardown(void **state)
{
    (void)state;
    kvq_model_close(stories);
    stories = NULL;
    test_tmpdir_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_writer_sample_f16_no_values),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_writer_moment_kernel),
        cmocka_unit_test(test_stories_layer0_independent),
        cmocka_unit_test(test_stories_moments),
        cmocka_unit_test(test_stories_dtypes),
        cmocka_unit_test(test_stories_query_sample),
        cmocka_unit_test(test_stories_determinism),
        cmocka_unit_test(test_stories_merge_property),
        cmocka_unit_test(test_tiny_errors),
        cmocka_unit_test(test_tiny_nan_abort),
        cmocka_unit_test(test_tiny_context_warning),
        cmocka_unit_test(test_merge_mismatch),
    };
    return cmocka_run_group_tests_name("capture", tests, NULL, teardown);
}
