/*
 * fit_dist.c — `kvq fit` on several ranks (kvq/dist.h): the (layer, KV head) jobs are
 * dealt to the ranks in turn, the jobs to fit and those whose checkpoint file exists
 * (loaded, almost free) each dealt on their own, so every rank gets an equal count of
 * each within one, and a cost that drifts along the layers is shared too (contiguous
 * shares left the later, slower layers to the last rank: 6.6 against 7.3 CPU s on
 * SmolLM2, docs/BENCHMARKS.md "MPI"). Each rank runs its jobs through fit_run_jobs
 * (checkpointing as one process does), and rank 0 gathers every job's tensors into job
 * order. A job's tensors are the same bytes whichever rank made them, so rank 0 writes
 * the artifact one process would.
 */
#include <stdlib.h>
#include <string.h>

#include "kvq/dist.h"
#include "kmeans/fit_internal.h"

/* ---- a share of jobs as one blob ----------------------------------------------------
 * per job:    i32 index, i32 cuda, i32 resumed, i32 n_tensors
 * per tensor: name[128], i32 dtype, i32 ndim, i64 shape[KVQ_MAX_DIMS], u64 nbytes, data */

typedef struct blob {
    uint8_t *b;
    size_t n, cap;
    int oom;
} blob;

static void put(blob *w, const void *p, size_t n)
{
    if (w->oom)
        return;
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->n + n)
            cap *= 2;
        uint8_t *b = realloc(w->b, cap);
        if (!b) {
            w->oom = 1;
            return;
        }
        w->b = b;
        w->cap = cap;
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}

static void put_job(blob *w, int32_t index, const fit_job *j)
{
    const int32_t head[4] = {index, j->cuda, j->resumed, (int32_t)j->n_t};
    put(w, head, sizeof head);
    for (size_t t = 0; t < j->n_t; t++) {
        const fit_tensor *x = &j->t[t];
        int32_t dt[2] = {(int32_t)x->dtype, x->ndim};
        uint64_t nb = x->nbytes;
        put(w, x->name, sizeof x->name);
        put(w, dt, sizeof dt);
        put(w, x->shape, sizeof x->shape);
        put(w, &nb, sizeof nb);
        put(w, x->data, x->nbytes);
    }
}

/* Reads n bytes at *at of b[0..end) into p; 0 when the blob is too short. */
static int get(const uint8_t *b, size_t end, size_t *at, void *p, size_t n)
{
    if (end - *at < n)
        return 0;
    memcpy(p, b + *at, n);
    *at += n;
    return 1;
}

/* Adds the jobs of one rank's blob to c->jobs. */
static kvq_status take_blob(fit_ctx *c, const uint8_t *b, size_t n, int32_t rank, kvq_err *err)
{
    size_t at = 0;
    while (at < n) {
        int32_t h[4];
        if (!get(b, n, &at, h, sizeof h) || h[0] < 0 || h[0] >= c->jobs_total || h[3] < 0)
            goto bad;
        fit_job *j = &c->jobs[h[0]];
        fit_job_clear(j);
        j->layer = c->layers[h[0] / c->n_kv];
        j->head = h[0] % c->n_kv;
        j->cuda = h[1];
        j->resumed = h[2];
        for (int32_t t = 0; t < h[3]; t++) {
            char name[sizeof ((fit_tensor *)0)->name];
            int32_t dt[2];
            int64_t shape[KVQ_MAX_DIMS];
            uint64_t nb;
            if (!get(b, n, &at, name, sizeof name) || !get(b, n, &at, dt, sizeof dt) ||
                !get(b, n, &at, shape, sizeof shape) || !get(b, n, &at, &nb, sizeof nb) ||
                n - at < nb || dt[1] < 0 || dt[1] > KVQ_MAX_DIMS)
                goto bad;
            name[sizeof name - 1] = 0;
            kvq_status s = fit_job_add(j, name, (kvq_dtype)dt[0], dt[1], shape, b + at, err);
            if (s)
                return s;
            if (j->t[j->n_t - 1].nbytes != nb)
                goto bad;
            at += nb;
        }
    }
    return KVQ_OK;
bad:
    return kvq_err_set(err, KVQ_E_CORRUPT, "fit: the jobs received from rank %d are malformed",
                       (int)rank);
}

/* ---- the split ------------------------------------------------------------------------ */

/* Deals the n jobs to `size` ranks in turn, those with ck[i] (resumed) and the others
 * each in job order; mine[i] = 1 for rank's jobs. Returns their count. */
static int32_t deal_jobs(const uint8_t *ck, int32_t n, int32_t rank, int32_t size,
                         uint8_t *mine)
{
    int32_t dealt[2] = {0, 0}, m = 0;
    for (int32_t i = 0; i < n; i++) {
        mine[i] = dealt[ck[i] != 0]++ % size == rank;
        m += mine[i];
    }
    return m;
}

/* sizes: [d->size] scratch. */
static kvq_status gather_jobs(fit_ctx *c, const uint8_t *mine, size_t *sizes, kvq_err *err)
{
    const kvq_dist *d = c->p->dist;
    blob w = {0};
    uint8_t *all = NULL;
    kvq_status s = KVQ_OK;
    if (d->rank != 0)
        for (int32_t i = 0; i < c->jobs_total; i++)
            if (mine[i])
                put_job(&w, i, &c->jobs[i]);
    if (w.oom)
        s = kvq_err_set(err, KVQ_E_NOMEM, "fit: out of memory for the jobs to send");
    /* Everyone takes part in the gather even after an error here, then agrees. */
    kvq_status g = d->gather(d->impl, w.b, s ? 0 : w.n, &all, sizes, s ? NULL : err);
    if (!s)
        s = g;
    size_t at = 0;
    for (int32_t r = 0; !s && d->rank == 0 && r < d->size; r++) {
        s = take_blob(c, all + at, sizes[r], r, err);
        at += sizes[r];
    }
    free(all);
    free(w.b);
    return kvq_dist_agree(d, s, err);
}

kvq_status fit_dist_jobs(fit_ctx *c, kvq_fit_summary *sum, kvq_err *err)
{
    const kvq_dist *d = c->p->dist;
    const int32_t n = c->jobs_total;
    uint8_t *ck = calloc((size_t)n, 1), *mine = calloc((size_t)n, 1);
    size_t *sizes = calloc((size_t)d->size, sizeof *sizes);
    kvq_status s = KVQ_OK;
    if (!ck || !mine || !sizes)
        s = kvq_err_set(err, KVQ_E_NOMEM, "fit: out of memory");
    /* Rank 0 looks for checkpoints, so every rank splits the same costs. */
    for (int32_t i = 0; !s && d->rank == 0 && i < n; i++)
        ck[i] = (uint8_t)fit_ckpt_exists(c, c->layers[i / c->n_kv], i % c->n_kv);
    if ((s = kvq_dist_agree(d, s, err)) || (s = kvq_dist_bcast(d, ck, (size_t)n, err)))
        goto done;
    int32_t n_ck = 0;
    for (int32_t i = 0; i < n; i++)
        n_ck += ck[i];
    const int32_t m = deal_jobs(ck, n, d->rank, d->size, mine);
    if (d->rank == 0)
        kvq_log(&c->cb, KVQ_LOG_INFO, "fit: %d ranks split %d heads (%d with checkpoints), "
                "dealt in turn; rank 0 runs %d; the progress is the whole job's, estimated "
                "from rank 0's share (the shares are balanced)", (int)d->size, (int)n,
                (int)n_ck, (int)m);
    s = kvq_dist_agree(d, fit_run_jobs(c, mine, sum, err), err);
    if (!s)
        s = gather_jobs(c, mine, sizes, err);
    if (!s && d->rank == 0) {
        sum->n_resumed = 0;
        for (int32_t i = 0; i < n; i++)
            sum->n_resumed += c->jobs[i].resumed;
    }
done:
    free(ck);
    free(mine);
    free(sizes);
    return s;
}
