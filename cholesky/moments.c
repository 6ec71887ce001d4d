/* moments.c — the moments stage: capture directory in, moments file out, and the
 * reader `kvq fit` uses (kvq/moments.h). The math lives in cholesky.c. */
#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cholesky/cholesky_internal.h"
#include "kvq/half.h"
#include "kvq/moments.h"
#include "kvq/model.h"
#include "kvq/rope.h"
#include "kvq/safetensors.h"
#include "kvq/util.h"

/* The per-layer tensors in file order. The first five are [n_kv_heads, d, d], the
 * rest [n_kv_heads]. */
enum {
    T_H, T_L, T_LINV, T_L_F32, T_LINV_F32,
    T_LAMBDA, T_EIG_MIN, T_EIG_MAX, T_COND, T_ANISO, T_COUNT,
    T_COUNT_ALL
};
static const char *const tensor_suffix[T_COUNT_ALL] = {
    "H", "L", "Linv", "L_f32", "Linv_f32",
    "lambda", "eig_min", "eig_max", "cond", "anisotropy", "count",
};
static kvq_dtype tensor_dtype(int t)
{
    return t == T_L_F32 || t == T_LINV_F32 ? KVQ_DT_F32 : KVQ_DT_F64;
}
static int tensor_is_matrix(int t) { return t <= T_LINV_F32; }

static void tensor_name(char *buf, size_t cap, int32_t layer, int t)
{
    snprintf(buf, cap, "layer.%" PRId32 ".%s", layer, tensor_suffix[t]);
}

/* The view `name` of a moments file with the given dtype and shape, or NOT_FOUND /
 * SHAPE_MISMATCH. */
static kvq_status need_tensor(const kvq_st *st, const char *file, const char *name,
                              kvq_dtype dtype, int ndim, const int64_t *shape,
                              const kvq_tensor_view **out, kvq_err *err)
{
    const kvq_tensor_view *v = kvq_st_find(st, name);
    if (!v)
        return kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: tensor %s is missing", file, name);
    int ok = v->dtype == dtype && v->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = shape[i] < 0 || v->shape[i] == shape[i]; /* < 0: any length */
    if (!ok) {
        char want[128] = "", got[128] = "";
        size_t a = 0, b = 0;
        for (int i = 0; i < ndim && a < sizeof want; i++)
            a += (size_t)snprintf(want + a, sizeof want - a, "%s%" PRId64, i ? ", " : "",
                                  shape[i]);
        for (int i = 0; i < v->ndim && b < sizeof got; i++)
            b += (size_t)snprintf(got + b, sizeof got - b, "%s%" PRId64, i ? ", " : "",
                                  v->shape[i]);
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH,
                           "%s: tensor %s is %s [%s], expected %s [%s]",
                           file, name, kvq_dtype_name(v->dtype), got, kvq_dtype_name(dtype),
                           want);
    }
    *out = v;
    return KVQ_OK;
}

/* ======================================================================================
 * Reading the inputs of one layer (kvq_capture_layer)
 * ====================================================================================== */

/* Mean of the pre-RoPE sums, grouped (wrope: rotated by R_b afterwards).
 *   H: [n_kv, d, d]   count: [n_kv]   S: [n_heads, d, d] scratch   counts: [n_heads] scratch */
static kvq_status layer_from_sums(const kvq_capture_layer *L, const kvq_model_id *m,
                                  double *S, double *counts, double *H, double *count,
                                  kvq_err *err)
{
    kvq_status s;
    const int nh = m->n_heads;
    const kvq_tensor_view *vs, *vc;
    if ((s = kvq_capture_layer_tensor(L, "q_moment_sum", &vs, err)) ||
        (s = kvq_capture_layer_tensor(L, "q_moment_count", &vc, err)))
        return s;
    memcpy(S, vs->data, vs->nbytes); /* the view may be unaligned */
    memcpy(counts, vc->data, vc->nbytes);
    kvq_err ge = {0};
    if ((s = kvq_moments_group(S, counts, nh, m->n_kv_heads, m->head_dim, H, count, &ge)))
        return kvq_err_set(err, s, "%s: %s", L->path, ge.msg);
    return KVQ_OK;
}

/* Rotates each row of x by R_pos in double (the rope.h convention).  x: [d] */
static void rope_rotate_f64(const kvq_rope *r, const double *theta, double *x, int64_t pos)
{
    const int d = r->head_dim, half = d / 2;
    for (int m = 0; m < half; m++) {
        int i = r->layout == KVQ_ROPE_INTERLEAVED ? 2 * m : m;
        int j = r->layout == KVQ_ROPE_INTERLEAVED ? 2 * m + 1 : m + half;
        double a = x[i], b = x[j], c = cos((double)pos * theta[m]),
               s = sin((double)pos * theta[m]);
        x[i] = a * c - b * s;
        x[j] = a * s + b * c;
    }
}

/* Post-RoPE mean over the stored queries: H[h] = mean over rows i and g in G(h) of
 * (q R_pos)^T (q R_pos).   H: [n_kv, d, d]   count: [n_kv] */
static kvq_status layer_from_queries(const kvq_capture_layer *L, const kvq_capture_info *ci,
                                     const kvq_rope *rope, double *H, double *count, kvq_err *err)
{
    enum { CHUNK = 512 };
    kvq_status s = KVQ_OK;
    const char *file = L->path;
    const kvq_model_id *m = &ci->model;
    const int nh = m->n_heads, nkv = m->n_kv_heads, d = m->head_dim, r = nh / nkv;
    const size_t dd = (size_t)d * d;
    const kvq_tensor_view *vq;
    int32_t *pos = NULL, *rows = NULL;
    float *qf = NULL;   // [CHUNK, nh, d]
    double *X = NULL;   // [r * CHUNK, d] rotated rows of one group
    double theta[KVQ_ROPE_MAX_DIM / 2];

    if ((s = kvq_capture_layer_tensor(L, "q", &vq, err)) ||
        (s = kvq_capture_layer_column(L, "q_rows", &rows, err)) ||
        (s = kvq_capture_layer_column(L, "pos", &pos, err)))
        goto done;
    const int64_t n_q = vq->shape[0];
    if (n_q == 0) {
        s = kvq_err_set(err, KVQ_E_NUMERIC, "%s: no stored queries (q has 0 rows)", file);
        goto done;
    }

    const size_t row_elems = (size_t)nh * d;
    qf = malloc(CHUNK * row_elems * sizeof *qf);
    X = malloc((size_t)r * CHUNK * d * sizeof *X);
    if (!qf || !X) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", file);
        goto done;
    }
    kvq_rope_freqs(rope, theta);
    memset(H, 0, (size_t)nkv * dd * sizeof *H);
    for (int64_t c0 = 0; c0 < n_q; c0 += CHUNK) {
        const int nc = (int)(n_q - c0 < CHUNK ? n_q - c0 : CHUNK);
        const size_t ne = (size_t)nc * row_elems;
        kvq_capture_read_f32(vq, (size_t)c0 * row_elems, ne, qf);
        for (int h = 0; h < nkv; h++) {
            /* X = the group's rows, rotated: [r * nc, d]; H[h] += X^T X (lower part). */
            for (int gi = 0; gi < r; gi++)
                for (int i = 0; i < nc; i++) {
                    double *x = X + ((size_t)gi * nc + i) * d;
                    const float *q = qf + (size_t)i * row_elems + (size_t)(h * r + gi) * d;
                    for (int k = 0; k < d; k++)
                        x[k] = q[k];
                    rope_rotate_f64(rope, theta, x, pos[rows[c0 + i]]);
                }
            cblas_dsyrk(CblasRowMajor, CblasLower, CblasTrans, d, r * nc, 1.0, X, d, 1.0,
                        H + h * dd, d);
        }
    }
    for (int h = 0; h < nkv; h++) {
        double *Hh = H + h * dd;
        const double c = (double)n_q * r;
        for (int i = 0; i < d; i++)
            for (int j = 0; j <= i; j++) {
                double v = Hh[i * d + j] / c;
                if (!isfinite(v)) {
                    s = kvq_err_set(err, KVQ_E_NUMERIC, "%s: NaN/Inf in q (KV head %d)", file, h);
                    goto done;
                }
                Hh[i * d + j] = Hh[j * d + i] = v;
            }
        count[h] = c;
    }
done:
    free(pos);
    free(rows);
    free(qf);
    free(X);
    return s;
}

/* ======================================================================================
 * Factoring one layer (CPU, or cuSOLVER with the CPU finishing)
 * ====================================================================================== */

typedef struct layer_out {
    double *H, *L, *Linv;        // [n_kv, d, d]
    float *Lf, *Linvf;           // [n_kv, d, d]
    double *vec[T_COUNT_ALL];    // T_LAMBDA .. T_COUNT: [n_kv]
    double *count;               // [n_kv] (alias of vec[T_COUNT])
} layer_out;

#ifdef KVQ_HAVE_CUDA
/* GPU pass: factor every head with its first admissible lambda in one batch. Heads the
 * batch could not factor are left to the CPU loop (done[h] = 0). A failed batch is not
 * an error: the caller falls back to the CPU for the whole layer. */
static kvq_status factor_layer_cuda(const kvq_moments_params *p, int32_t layer, int nkv, int d,
                                    layer_out *o, kvq_moments_head_stats *hs, int *done,
                                    kvq_err *err)
{
    kvq_status s = KVQ_OK;
    const size_t dd = (size_t)d * d;
    double *A = malloc((size_t)nkv * dd * sizeof *A);
    int *info = malloc((size_t)nkv * sizeof *info);
    double *lam = malloc((size_t)nkv * sizeof *lam), *eps = malloc((size_t)nkv * sizeof *eps);
    if (!A || !info || !lam || !eps) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "moments: out of memory");
        goto done;
    }
    for (int h = 0; h < nkv; h++) {
        const double *Hh = o->H + h * dd;
        double tr = kvq_chol_trace(Hh, d);
        lam[h] = -1;
        for (int k = 0;; k++) {
            double l = kvq_chol_schedule(tr, d, p, k, &eps[h]);
            if (l < 0 || kvq_chol_eig_ok(&hs[h], d, l)) {
                lam[h] = l;
                break;
            }
        }
        memcpy(A + h * dd, Hh, dd * sizeof *A);
        for (int i = 0; i < d; i++)
            A[h * dd + i * d + i] += lam[h] > 0 ? lam[h] : 0;
    }
    if ((s = kvq_moments_cuda_potrf_batched(A, nkv, d, o->L, info, err)))
        goto done;
    for (int h = 0; h < nkv; h++) {
        if (lam[h] < 0 || info[h] != 0)
            continue;
        char label[64];
        snprintf(label, sizeof label, "layer %d head %d", (int)layer, h);
        if ((s = kvq_chol_finish(o->L + h * dd, d, o->Linv + h * dd, label, err)))
            goto done;
        hs[h].lambda = lam[h];
        hs[h].eps = eps[h];
        hs[h].cond = (hs[h].eig_max + lam[h]) / (hs[h].eig_min + lam[h]);
        done[h] = 1;
    }
done:
    free(A);
    free(info);
    free(lam);
    free(eps);
    return s;
}
#endif

static kvq_status factor_layer(const kvq_moments_params *p, int use_cuda, int32_t layer,
                               int nkv, int d, layer_out *o, const kvq_callbacks *cb,
                               kvq_err *err)
{
    kvq_status s = KVQ_OK;
    const size_t dd = (size_t)d * d;
    kvq_moments_head_stats *hs = calloc((size_t)nkv, sizeof *hs);
    int *done = calloc((size_t)nkv, sizeof *done);
    if (!hs || !done) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "moments: out of memory");
        goto out;
    }
#ifdef KVQ_HAVE_CUDA
    if (use_cuda) {
        for (int h = 0; h < nkv && !s; h++)
            s = kvq_moments_diagnose(o->H + h * dd, d, 0, &hs[h], err);
        if (s) {
            /* Let the CPU path below report the error with its head label. */
            s = KVQ_OK;
        } else {
            kvq_err ge = {0};
            if (factor_layer_cuda(p, layer, nkv, d, o, hs, done, &ge) != KVQ_OK) {
                kvq_log(cb, KVQ_LOG_WARN, "%s; factoring layer %d on the CPU", ge.msg,
                        (int)layer);
                memset(done, 0, (size_t)nkv * sizeof *done);
            }
        }
    }
#else
    (void)use_cuda;
#endif
    for (int h = 0; h < nkv; h++) {
        if (done[h])
            continue;
        char label[64];
        snprintf(label, sizeof label, "layer %d head %d", (int)layer, h);
        if ((s = kvq_cholesky_regularized(o->H + h * dd, d, p, label, o->L + h * dd,
                                          o->Linv + h * dd, &hs[h], err)))
            goto out;
    }
    for (int h = 0; h < nkv; h++) {
        if (hs[h].lambda > 0)
            kvq_log(cb, KVQ_LOG_INFO,
                    "layer %d head %d: H is not positive definite (eigenvalues %.3g .. %.3g); "
                    "added lambda = %.6g (eps %g)", (int)layer, h, hs[h].eig_min,
                    hs[h].eig_max, hs[h].lambda, hs[h].eps);
        o->vec[T_LAMBDA][h] = hs[h].lambda;
        o->vec[T_EIG_MIN][h] = hs[h].eig_min;
        o->vec[T_EIG_MAX][h] = hs[h].eig_max;
        o->vec[T_COND][h] = hs[h].cond;
        o->vec[T_ANISO][h] = hs[h].anisotropy;
    }
    for (size_t i = 0; i < (size_t)nkv * dd; i++) {
        o->Lf[i] = (float)o->L[i];
        o->Linvf[i] = (float)o->Linv[i];
    }
out:
    free(hs);
    free(done);
    return s;
}

/* ======================================================================================
 * The stage
 * ====================================================================================== */

static kvq_status declare_outputs(kvq_st_writer *w, const kvq_capture_info *ci,
                                  const kvq_moments_params *p, kvq_err *err)
{
    kvq_status s;
    const kvq_model_id *m = &ci->model;
    char name[96], buf[64];
    for (int32_t i = 0; i < ci->n_files; i++)
        for (int t = 0; t < T_COUNT_ALL; t++) {
            int64_t shape[3] = {m->n_kv_heads, m->head_dim, m->head_dim};
            tensor_name(name, sizeof name, ci->layers[i], t);
            if ((s = kvq_st_writer_declare(w, name, tensor_dtype(t), tensor_is_matrix(t) ? 3 : 1,
                                           shape, err)))
                return s;
        }
    /* "0,1,2": the captured layers, in file order. */
    size_t cap = (size_t)ci->n_files * 12 + 1, len = 0;
    char *layers = malloc(cap);
    if (!layers)
        return kvq_err_set(err, KVQ_E_NOMEM, "moments: out of memory");
    layers[0] = 0;
    for (int32_t i = 0; i < ci->n_files; i++)
        len += (size_t)snprintf(layers + len, cap - len, "%s%" PRId32, i ? "," : "",
                                ci->layers[i]);
    s = kvq_st_writer_set_meta(w, "layers", layers, err);
    free(layers);
    if (s)
        return s;
    char n_tokens[32], wb[32], ww[32], ver[16];
    snprintf(n_tokens, sizeof n_tokens, "%" PRId64, ci->n_tokens);
    snprintf(wb, sizeof wb, "%" PRId64, p->wrope_b);
    snprintf(ww, sizeof ww, "%" PRId32, p->wrope_w);
    snprintf(ver, sizeof ver, "%d", KVQ_MOMENTS_VERSION);
    snprintf(buf, sizeof buf, "kvq %s", kvq_version());
    if ((s = kvq_st_writer_set_meta(w, "format", KVQ_MOMENTS_FORMAT, err)) ||
        (s = kvq_st_writer_set_meta(w, "version", ver, err)) ||
        (s = kvq_st_writer_set_meta(w, "tool", buf, err)) ||
        (s = kvq_st_writer_set_meta(w, "positions", kvq_positions_name(p->positions), err)) ||
        (s = kvq_st_writer_set_meta(w, "wrope_b", wb, err)) ||
        (s = kvq_st_writer_set_meta(w, "wrope_w", ww, err)) ||
        (s = kvq_st_writer_set_meta(w, "capture", ci->dir, err)) ||
        (s = kvq_st_writer_set_meta(w, "corpus.hash", ci->corpus_hash, err)) ||
        (s = kvq_st_writer_set_meta(w, "n_tokens", n_tokens, err)) ||
        (s = kvq_model_id_set_meta(m, "model.", w, err)))
        return s;
    return KVQ_OK;
}

static kvq_status write_layer(kvq_st_writer *w, const layer_out *o, int nkv, int d,
                              kvq_err *err)
{
    kvq_status s;
    const size_t nm = (size_t)nkv * d * d;
    const void *src[T_COUNT_ALL] = {o->H, o->L, o->Linv, o->Lf, o->Linvf};
    for (int t = T_LAMBDA; t < T_COUNT_ALL; t++)
        src[t] = o->vec[t];
    for (int t = 0; t < T_COUNT_ALL; t++) {
        size_t n = (tensor_is_matrix(t) ? nm : (size_t)nkv) * kvq_dtype_size(tensor_dtype(t));
        if ((s = kvq_st_writer_write(w, src[t], n, err)))
            return s;
    }
    return KVQ_OK;
}

/* Decides CPU or CUDA once per run; the fallback is said once. */
static int resolve_device(const kvq_moments_params *p, const kvq_callbacks *cb)
{
    if (p->device != KVQ_MOMENTS_CUDA)
        return 0;
    const char *why = NULL;
#ifdef KVQ_HAVE_CUDA
    if (kvq_cuda_available(&why))
        return 1;
#else
    kvq_cuda_available(&why);
#endif
    if (!why)
        why = "no CUDA device";
    kvq_log(cb, KVQ_LOG_WARN, "moments: device cuda: %s%s", why,
            strstr(why, "CPU") ? "" : "; using the CPU");
    return 0;
}

kvq_status kvq_moments_compute(const char *capture_dir, const char *out_path, int overwrite,
                               const kvq_moments_params *p, const kvq_callbacks *cb,
                               kvq_err *err)
{
    kvq_status s;
    kvq_capture_info *ci = NULL;
    kvq_st_writer *w = NULL;
    kvq_capture_layer in = {0};
    double *S = NULL, *counts = NULL, *R = NULL, *work = NULL;
    layer_out o = {0};

    if ((s = kvq_moments_params_check(p, err)) ||
        (s = kvq_output_check(out_path, overwrite, kvq_moments_is_moments, "a kvq moments file",
                              err)) ||
        (s = kvq_capture_info_read(capture_dir, &ci, err)))
        goto done;
    const kvq_model_id *m = &ci->model;
    const int nh = m->n_heads, nkv = m->n_kv_heads, d = m->head_dim;
    const size_t dd = (size_t)d * d;
    const int use_cuda = resolve_device(p, cb);

    S = malloc((size_t)nh * dd * sizeof *S);
    counts = malloc((size_t)nh * sizeof *counts);
    R = malloc(dd * sizeof *R);
    work = malloc(dd * sizeof *work);
    o.H = malloc((size_t)nkv * dd * sizeof *o.H);
    o.L = malloc((size_t)nkv * dd * sizeof *o.L);
    o.Linv = malloc((size_t)nkv * dd * sizeof *o.Linv);
    o.Lf = malloc((size_t)nkv * dd * sizeof *o.Lf);
    o.Linvf = malloc((size_t)nkv * dd * sizeof *o.Linvf);
    int vec_ok = 1;
    for (int t = T_LAMBDA; t < T_COUNT_ALL; t++)
        vec_ok &= (o.vec[t] = calloc((size_t)nkv, sizeof(double))) != NULL;
    o.count = o.vec[T_COUNT];
    if (!S || !counts || !R || !work || !o.H || !o.L || !o.Linv || !o.Lf || !o.Linvf || !vec_ok) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", capture_dir);
        goto done;
    }

    if (!(w = kvq_st_writer_new())) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", out_path);
        goto done;
    }
    if ((s = declare_outputs(w, ci, p, err)) ||
        (s = kvq_st_writer_checksum(w, err)) || /* verified by every reader */
        (s = kvq_st_writer_begin_file(w, out_path, overwrite, err)))
        goto done;

    for (int32_t i = 0; i < ci->n_files; i++) {
        const int32_t layer = ci->layers[i];
        if ((s = kvq_capture_layer_open(ci, i, &in, err)))
            goto done;
        /* Each layer's own RoPE (gemma3: base 10000 on its sliding-window layers, 1e6
         * and the scaling on the global ones); a no-RoPE layer rotates by nothing. */
        kvq_layer_attn la;
        kvq_model_id_layer_attn(m, layer, &la);
        if (la.use_rope) {
            kvq_rope_matrix(&la.rope, p->wrope_b, R); // [d, d]: q~ = q R_b
        } else {
            memset(R, 0, dd * sizeof *R);
            for (int k = 0; k < d; k++)
                R[(size_t)k * d + k] = 1.0;
        }
        if (p->positions == KVQ_POSITIONS_WROPE) {
            if ((s = layer_from_sums(&in, m, S, counts, o.H, o.count, err)))
                goto done;
            for (int h = 0; h < nkv; h++)
                kvq_moments_rotate(o.H + h * dd, R, d, work); // H = R_b^T H_pre R_b
        } else {
            if ((s = layer_from_queries(&in, ci, &la.rope, o.H, o.count, err)))
                goto done;
        }
        for (int h = 0; h < nkv; h++)
            kvq_moments_symmetrize(o.H + h * dd, d);
        kvq_err fe = {0};
        if ((s = factor_layer(p, use_cuda, layer, nkv, d, &o, cb, &fe))) {
            kvq_err_set(err, s, "%s: %s", in.path, fe.msg);
            goto done;
        }
        if ((s = write_layer(w, &o, nkv, d, err)))
            goto done;
        kvq_capture_layer_close(&in);
        if (kvq_progress(cb, "moments", (uint64_t)i + 1, (uint64_t)ci->n_files)) {
            s = kvq_err_set(err, KVQ_E_CANCELLED, "%s: cancelled", out_path);
            goto done;
        }
    }
    s = kvq_st_writer_finish(w, err);
done:
    kvq_st_writer_free(w); /* removes the temporary unless finished */
    kvq_capture_layer_close(&in);
    kvq_capture_info_free(ci);
    free(S);
    free(counts);
    free(R);
    free(work);
    free(o.H);
    free(o.L);
    free(o.Linv);
    free(o.Lf);
    free(o.Linvf);
    for (int t = T_LAMBDA; t < T_COUNT_ALL; t++)
        free(o.vec[t]);
    return s;
}

/* ======================================================================================
 * Reading a moments file
 * ====================================================================================== */

struct kvq_moments {
    kvq_st *st;
    char *path;
    kvq_model_id model;
    kvq_positions positions;
    int64_t wrope_b;
    int32_t wrope_w;
    int32_t n_layers;
    int32_t *layers;                         // [n_layers]
    const kvq_tensor_view *(*views)[T_COUNT_ALL]; // [n_layers][T_COUNT_ALL]
};

kvq_status kvq_moments_open(const char *path, kvq_moments **out, kvq_err *err)
{
    kvq_status s;
    kvq_moments *m = calloc(1, sizeof *m);
    int64_t v = 0;
    kvq_err pe = {0};
    *out = NULL;
    if (!m || !(m->path = strdup(path))) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if ((s = kvq_st_open(path, &m->st, err)))
        goto done;
    const char *fmt = kvq_st_meta_get(m->st, "format");
    if (!fmt || strcmp(fmt, KVQ_MOMENTS_FORMAT)) {
        s = kvq_err_set(err, KVQ_E_BAD_MAGIC, "%s: not a moments file (format \"%s\")", path,
                        fmt ? fmt : "");
        goto done;
    }
    const char *ver = kvq_st_meta_get(m->st, "version");
    if (!ver || kvq_parse_i64(ver, 0, INT32_MAX, &v, NULL) || v != KVQ_MOMENTS_VERSION) {
        s = kvq_err_set(err, KVQ_E_VERSION, "%s: moments version \"%s\" is not supported "
                        "(this kvq reads version %d)", path, ver ? ver : "", KVQ_MOMENTS_VERSION);
        goto done;
    }
    if ((s = kvq_model_id_from_meta(m->st, "model.", path, &m->model, err)))
        goto done;
    const char *pos = kvq_st_meta_get(m->st, "positions");
    const char *wb = kvq_st_meta_get(m->st, "wrope_b");
    const char *ww = kvq_st_meta_get(m->st, "wrope_w");
    const char *layers = kvq_st_meta_get(m->st, "layers");
    if (!pos || !wb || !ww || !layers) {
        s = kvq_err_set(err, KVQ_E_NOT_FOUND, "%s: metadata %s is missing", path,
                        !pos ? "positions" : !wb ? "wrope_b" : !ww ? "wrope_w" : "layers");
        goto done;
    }
    if (kvq_positions_parse(pos, &m->positions) ||
        kvq_parse_i64(wb, 0, INT32_MAX, &m->wrope_b, &pe) ||
        kvq_parse_i64(ww, 1, INT32_MAX, &v, &pe)) {
        s = kvq_err_set(err, KVQ_E_CORRUPT, "%s: bad positions/wrope_b/wrope_w metadata", path);
        goto done;
    }
    m->wrope_w = (int32_t)v;
    size_t nl = 0;
    if (kvq_parse_index_list(layers, m->model.n_layers, &m->layers, &nl, &pe) || nl == 0) {
        s = kvq_err_set(err, KVQ_E_CORRUPT, "%s: metadata layers \"%s\" is not a list of layers "
                        "below %d", path, layers, (int)m->model.n_layers);
        goto done;
    }
    m->n_layers = (int32_t)nl;
    m->views = calloc(nl, sizeof *m->views);
    if (!m->views) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    const int64_t nkv = m->model.n_kv_heads, d = m->model.head_dim;
    for (size_t i = 0; i < nl; i++)
        for (int t = 0; t < T_COUNT_ALL; t++) {
            char name[96];
            int64_t shape[3] = {nkv, d, d};
            tensor_name(name, sizeof name, m->layers[i], t);
            if ((s = need_tensor(m->st, path, name, tensor_dtype(t), tensor_is_matrix(t) ? 3 : 1,
                                 shape, &m->views[i][t], err)))
                goto done;
        }
    *out = m;
    m = NULL;
done:
    kvq_moments_close(m);
    return s;
}

void kvq_moments_close(kvq_moments *m)
{
    if (!m)
        return;
    kvq_st_close(m->st);
    free(m->path);
    free(m->layers);
    free(m->views);
    free(m);
}

const kvq_model_id *kvq_moments_model(const kvq_moments *m) { return &m->model; }
int32_t kvq_moments_n_layers(const kvq_moments *m) { return m->n_layers; }
int32_t kvq_moments_layer(const kvq_moments *m, int32_t i) { return m->layers[i]; }
kvq_positions kvq_moments_positions(const kvq_moments *m) { return m->positions; }
int64_t kvq_moments_wrope_b(const kvq_moments *m) { return m->wrope_b; }
int32_t kvq_moments_wrope_w(const kvq_moments *m) { return m->wrope_w; }
const char *kvq_moments_meta(const kvq_moments *m, const char *key)
{
    return kvq_st_meta_get(m->st, key);
}

static int32_t layer_index(const kvq_moments *m, int32_t layer)
{
    for (int32_t i = 0; i < m->n_layers; i++)
        if (m->layers[i] == layer)
            return i;
    return -1;
}

int kvq_moments_has_layer(const kvq_moments *m, int32_t layer)
{
    return layer_index(m, layer) >= 0;
}

static kvq_status locate(const kvq_moments *m, int32_t layer, int32_t head, int32_t *li,
                         kvq_err *err)
{
    *li = layer_index(m, layer);
    if (*li < 0)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: layer %d is not in the moments file",
                           m->path, (int)layer);
    if (head < 0 || head >= m->model.n_kv_heads)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: KV head %d is outside [0, %d)", m->path,
                           (int)head, (int)m->model.n_kv_heads);
    return KVQ_OK;
}

kvq_status kvq_moments_get_f64(const kvq_moments *m, int32_t layer, int32_t head,
                               kvq_moments_matrix which, double *out, kvq_err *err)
{
    int32_t li;
    kvq_status s = locate(m, layer, head, &li, err);
    if (s)
        return s;
    if (which != KVQ_MOMENTS_MAT_H && which != KVQ_MOMENTS_MAT_L &&
        which != KVQ_MOMENTS_MAT_LINV)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: unknown matrix %d", m->path, (int)which);
    const int t = which == KVQ_MOMENTS_MAT_H   ? T_H
                  : which == KVQ_MOMENTS_MAT_L ? T_L
                                               : T_LINV;
    const size_t dd = (size_t)m->model.head_dim * m->model.head_dim;
    memcpy(out, (const uint8_t *)m->views[li][t]->data + (size_t)head * dd * sizeof *out,
           dd * sizeof *out);
    return KVQ_OK;
}

kvq_status kvq_moments_get_f32(const kvq_moments *m, int32_t layer, int32_t head,
                               kvq_moments_matrix which, float *out, kvq_err *err)
{
    int32_t li;
    kvq_status s = locate(m, layer, head, &li, err);
    if (s)
        return s;
    if (which != KVQ_MOMENTS_MAT_L && which != KVQ_MOMENTS_MAT_LINV)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: only L and L^-1 are stored as f32",
                           m->path);
    const int t = which == KVQ_MOMENTS_MAT_L ? T_L_F32 : T_LINV_F32;
    const size_t dd = (size_t)m->model.head_dim * m->model.head_dim;
    memcpy(out, (const uint8_t *)m->views[li][t]->data + (size_t)head * dd * sizeof *out,
           dd * sizeof *out);
    return KVQ_OK;
}

kvq_status kvq_moments_get_stats(const kvq_moments *m, int32_t layer, int32_t head,
                                 kvq_moments_head_stats *out, kvq_err *err)
{
    int32_t li;
    kvq_status s = locate(m, layer, head, &li, err);
    if (s)
        return s;
    double *dst[T_COUNT_ALL] = {0};
    dst[T_LAMBDA] = &out->lambda;
    dst[T_EIG_MIN] = &out->eig_min;
    dst[T_EIG_MAX] = &out->eig_max;
    dst[T_COND] = &out->cond;
    dst[T_ANISO] = &out->anisotropy;
    dst[T_COUNT] = &out->count;
    for (int t = T_LAMBDA; t < T_COUNT_ALL; t++)
        memcpy(dst[t], (const uint8_t *)m->views[li][t]->data + (size_t)head * sizeof(double),
               sizeof(double));
    /* eps is not stored: lambda relative to the mean eigenvalue, from the diagonal of H. */
    const int d = m->model.head_dim;
    const size_t dd = (size_t)d * d;
    double tr = 0, x;
    for (int i = 0; i < d; i++) {
        size_t at = (size_t)head * dd + (size_t)i * d + i;
        memcpy(&x, (const uint8_t *)m->views[li][T_H]->data + at * sizeof x, sizeof x);
        tr += x;
    }
    out->eps = out->lambda > 0 && tr > 0 ? out->lambda / (tr / d) : 0;
    return KVQ_OK;
}

kvq_status kvq_moments_check_capture(const kvq_moments *m, const kvq_capture_info *ci,
                                     kvq_err *err)
{
    char label[1100];
    snprintf(label, sizeof label, "%s/%s", ci->dir, KVQ_CAPTURE_JSON);
    kvq_status s = kvq_model_id_compare(&m->model, m->path, &ci->model, label, err);
    if (s)
        return s;
    const char *hash = kvq_st_meta_get(m->st, "corpus.hash");
    const char *ntok = kvq_st_meta_get(m->st, "n_tokens");
    char want[32];
    snprintf(want, sizeof want, "%" PRId64, ci->n_tokens);
    if (!hash || !ntok)
        return kvq_err_set(err, KVQ_E_MISMATCH, "%s vs %s: the moments file records no capture "
                           "(corpus.hash, n_tokens); recompute it with kvq moments", m->path,
                           label);
    if (strcmp(hash, ci->corpus_hash))
        return kvq_err_set(err, KVQ_E_MISMATCH, "%s vs %s: computed from another capture "
                           "(corpus.hash %s vs %s); recompute the moments from this capture",
                           m->path, label, hash, ci->corpus_hash);
    if (strcmp(ntok, want))
        return kvq_err_set(err, KVQ_E_MISMATCH, "%s vs %s: computed from another capture "
                           "(n_tokens %s vs %s); recompute the moments from this capture",
                           m->path, label, ntok, want);
    return KVQ_OK;
}

int kvq_moments_is_moments(const char *path)
{
    struct stat sb;
    kvq_st *st = NULL;
    if (!path || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        kvq_st_open(path, &st, NULL) != KVQ_OK)
        return 0;
    const char *fmt = kvq_st_meta_get(st, "format");
    const int own = fmt && !strcmp(fmt, KVQ_MOMENTS_FORMAT);
    kvq_st_close(st);
    return own;
}
