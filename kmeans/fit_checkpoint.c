/*
 * fit_checkpoint.c — the checkpoints of `kvq fit` (kmeans/fit_internal.h): each finished
 * (layer, KV head) job is saved as <out>.ckpt/layer.L.head.H.safetensors with a key of
 * every input and setting that changes its tensors; a rerun with the same key reads
 * the job back instead of refitting it.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvq/artifact.h"
#include "kvq/util.h"
#include "kmeans/fit_internal.h"

/* Bumped whenever a change in kvq fit (kmeans/fit.c or here) changes a job's result: old
 * checkpoints are then refitted instead of reused. */
#define FIT_CKPT_VERSION 1
#define FIT_KEY_META "kvq.fit.key"
#define FIT_BACKEND_META "kvq.fit.backend"

/* The checkpoint key: every input and parameter that changes the job's tensors. */
kvq_status fit_job_key(const fit_ctx *c, int32_t layer, int32_t head, char *buf, size_t cap,
                       kvq_err *err)
{
    const int32_t d = c->d;
    float *M = malloc((size_t)d * d * sizeof *M);
    kvq_status s = KVQ_OK;
    uint64_t hash = KVQ_FNV1A64_INIT;
    if (!M)
        return kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
    for (int w = 0; w < 2 && !s; w++) {
        s = kvq_moments_get_f32(c->m, layer, head, w ? KVQ_MOMENTS_MAT_LINV : KVQ_MOMENTS_MAT_L,
                                M, err);
        hash = kvq_fnv1a64(M, (size_t)d * d * sizeof *M, hash);
    }
    free(M);
    if (s)
        return s;
    const kvq_fit_params *p = c->p;
    const kvq_model_id *id = &c->ci->model;
    snprintf(buf, cap,
             "v%d;layer=%d;head=%d;method=%s;K=%d;G=%d;iters=%d;tol=%.17g;seed=%" PRIu64
             ";init=%s;holdout=%.17g;reference=%d;device=%s;wrope_b=%lld;model=%s/%d/%d/%d/%d/"
             "%.17g/%s;capture=%s/%lld/%lld/%s;L=%016" PRIx64,
             FIT_CKPT_VERSION, (int)layer, (int)head, kvq_codebook_method_name(p->method),
             (int)c->K, (int)c->G, (int)p->iters, p->tol, p->seed, kvq_kmeans_init_name(p->init),
             p->holdout, p->reference, c->device == KVQ_KMEANS_DEVICE_CUDA ? "cuda" : "cpu",
             (long long)c->wrope_b, id->architecture, (int)id->n_layers, (int)id->n_heads,
             (int)id->n_kv_heads, (int)d, id->rope.base, kvq_rope_layout_name(id->rope.layout),
             c->ci->corpus_hash, (long long)c->ci->n_tokens, (long long)c->ci->n_sequences,
             kvq_dtype_name(c->ci->dtype), hash);
    return KVQ_OK;
}

/* "layer.L.head.H.safetensors" or a temporary of one. */
static int ckpt_name(const char *n)
{
    int l, h, k = 0;
    return strstr(n, ".tmp.") || (sscanf(n, "layer.%d.head.%d.safetensors%n", &l, &h, &k) == 2 &&
                                  k > 0 && n[k] == 0);
}

void fit_ckpt_clean_finished(const char *out_path, const kvq_callbacks *cb)
{
    char dir[4096], path[4096 + 256];
    struct stat so, sf;
    if (snprintf(dir, sizeof dir, "%s.ckpt", out_path) >= (int)sizeof dir ||
        lstat(dir, &sf) != 0 || !S_ISDIR(sf.st_mode) || stat(out_path, &so) != 0 ||
        !kvq_artifact_is_artifact(out_path))
        return;
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0, ok = d != NULL;
    while (ok && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ok = ckpt_name(e->d_name) && lstat(path, &sf) == 0 && S_ISREG(sf.st_mode) &&
             (sf.st_mtim.tv_sec < so.st_mtim.tv_sec ||
              (sf.st_mtim.tv_sec == so.st_mtim.tv_sec && sf.st_mtim.tv_nsec <= so.st_mtim.tv_nsec));
        n++;
    }
    if (d)
        closedir(d);
    if (!ok)
        return;
    kvq_rmtree(dir);
    kvq_log(cb, KVQ_LOG_INFO, "fit: removed %s (%d checkpoints of a run that finished %s)", dir,
            n, out_path);
}

static void ckpt_path(const fit_ctx *c, int32_t layer, int32_t head, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/layer.%d.head.%d.safetensors", c->ckpt_dir, (int)layer, (int)head);
}

int fit_ckpt_exists(const fit_ctx *c, int32_t layer, int32_t head)
{
    char path[4096];
    if (!c->ckpt_dir)
        return 0;
    ckpt_path(c, layer, head, path, sizeof path);
    struct stat sb; /* only a file can be loaded (fit_ckpt_load refits anything else) */
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Loads the checkpoint of a job if it exists and its key matches: 1 loaded, 0 not. */
int fit_ckpt_load(const fit_ctx *c, fit_job *j, const char *key)
{
    char path[4096];
    kvq_st *st = NULL;
    kvq_err e = {0};
    int ok = 0;
    if (!c->ckpt_dir)
        return 0;
    ckpt_path(c, j->layer, j->head, path, sizeof path);
    if (access(path, F_OK) != 0)
        return 0;
    if (kvq_st_open(path, &st, &e) != KVQ_OK) {
        kvq_log(&c->cb, KVQ_LOG_WARN, "checkpoint %s is unreadable (%s); refitting", path, e.msg);
        return 0;
    }
    const char *k = kvq_st_meta_get(st, FIT_KEY_META);
    const char *b = kvq_st_meta_get(st, FIT_BACKEND_META);
    if (!k || strcmp(k, key) != 0) {
        kvq_log(&c->cb, KVQ_LOG_INFO, "checkpoint %s was made with other inputs or settings; "
                "refitting", path);
        goto done;
    }
    for (size_t i = 0; i < kvq_st_count(st); i++) {
        const kvq_tensor_view *v = kvq_st_tensor(st, i);
        if (fit_job_add(j, v->name, v->dtype, v->ndim, v->shape, v->data, &e) != KVQ_OK) {
            fit_job_clear(j);
            goto done;
        }
    }
    j->cuda = b && !strcmp(b, "cuda");
    j->resumed = 1;
    ok = 1;
done:
    kvq_st_close(st);
    return ok;
}

/* Writes a job's tensors to its checkpoint file (atomically). */
kvq_status fit_ckpt_save(const fit_ctx *c, const fit_job *j, const char *key, kvq_err *err)
{
    char path[4096];
    kvq_status s = KVQ_OK;
    kvq_st_writer *w = kvq_st_writer_new();
    if (!w)
        return kvq_err_set(err, KVQ_E_NOMEM, "checkpoint: out of memory");
    ckpt_path(c, j->layer, j->head, path, sizeof path);
    /* Created on the first finished job, so a run that fails early leaves nothing. */
    if (mkdir(c->ckpt_dir, 0777) != 0 && errno != EEXIST)
        s = kvq_err_set(err, KVQ_E_IO, "%s: cannot create the checkpoint directory: %s",
                        c->ckpt_dir, strerror(errno));
    for (size_t i = 0; i < j->n_t && !s; i++)
        s = kvq_st_writer_declare(w, j->t[i].name, j->t[i].dtype, j->t[i].ndim, j->t[i].shape,
                                  err);
    if (!s && !(s = kvq_st_writer_set_meta(w, FIT_KEY_META, key, err)) &&
        !(s = kvq_st_writer_set_meta(w, FIT_BACKEND_META, j->cuda ? "cuda" : "cpu", err)))
        s = kvq_st_writer_begin_file(w, path, 1, err);
    for (size_t i = 0; i < j->n_t && !s; i++)
        s = kvq_st_writer_write(w, j->t[i].data, j->t[i].nbytes, err);
    if (!s)
        s = kvq_st_writer_finish(w, err);
    kvq_st_writer_free(w);
    return s;
}
