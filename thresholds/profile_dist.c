/*
 * profile_dist.c — a pass of the profile over the capture's layers on several ranks
 * (kvq/dist.h, docs/mpi.md): which layers a rank runs, its per-layer records, and their
 * gather and replay in layer order on rank 0 (thresholds_internal.h, thr_split).
 *
 * Why the bytes equal one process's: one process adds each layer's per-job sums to its
 * totals after the layer, layer by layer. A rank keeps exactly what would have been
 * added after each of its layers (the record), and rank 0 adds the records in layer
 * order with the same code, so it performs the same floating-point additions in the
 * same order. Records are raw memory: the ranks must share one binary on one
 * architecture (as MPI jobs of kvq do).
 */
#include <stdlib.h>
#include <string.h>

#include "thresholds/thresholds_internal.h"

kvq_status thr_split_begin(thr_split *sp, const kvq_profile_params *p, const char *what,
                           int32_t n_files, size_t rec_bytes, kvq_err *err)
{
    memset(sp, 0, sizeof *sp);
    sp->n_files = n_files;
    sp->end = n_files;
    if (kvq_dist_size(p->dist) <= 1)
        return KVQ_OK;
    sp->d = p->dist;
    sp->rec_bytes = rec_bytes;
    int64_t first, end;
    kvq_dist_split(n_files, NULL, sp->d->rank, sp->d->size, &first, &end);
    sp->first = (int32_t)first;
    sp->end = (int32_t)end;
    kvq_log(&p->cb, KVQ_LOG_INFO, "%s: %d ranks split %d layers; rank 0 runs layers %d..%d; "
            "the progress is the whole pass's, estimated from rank 0's share (the shares "
            "are balanced)", what, (int)sp->d->size,
            (int)n_files, (int)sp->first, (int)sp->end - 1);
    const size_t n = (size_t)(sp->end - sp->first) * rec_bytes;
    sp->recs = malloc(n ? n : 1);
    if (!sp->recs)
        return kvq_err_set(err, KVQ_E_NOMEM, "profile: out of memory");
    return KVQ_OK;
}

int thr_split_mine(const thr_split *sp, int32_t f)
{
    return f >= sp->first && f < sp->end;
}

uint8_t *thr_split_rec(thr_split *sp, int32_t f)
{
    return sp->recs + (size_t)(f - sp->first) * sp->rec_bytes;
}

uint64_t thr_split_progress(const thr_split *sp, int32_t done)
{
    return kvq_dist_progress(sp->d, (uint64_t)done, (uint64_t)(sp->end - sp->first),
                             (uint64_t)sp->n_files);
}

kvq_status thr_split_end(thr_split *sp, kvq_status st,
                         void (*replay)(void *user, int32_t f, const uint8_t *rec), void *user,
                         kvq_err *err)
{
    if (!sp->d)
        return st;
    const kvq_dist *d = sp->d;
    uint8_t *all = NULL;
    /* agree first: a rank that failed has no records to send */
    if ((st = kvq_dist_agree(d, st, err))) {
        free(sp->recs);
        sp->recs = NULL;
        return st;
    }
    size_t *sizes = calloc((size_t)d->size, sizeof *sizes);
    if (!sizes) /* cannot take part in the gather: stop everyone rather than hang them */
        d->abort(d->impl, 1, "kvq: profile: out of memory");
    st = d->gather(d->impl, sp->recs, (size_t)(sp->end - sp->first) * sp->rec_bytes, &all,
                   sizes, err);
    if (!st && d->rank == 0) {
        size_t total = 0;
        for (int32_t r = 0; r < d->size; r++)
            total += sizes[r];
        if (total != (size_t)sp->n_files * sp->rec_bytes)
            st = kvq_err_set(err, KVQ_E_CORRUPT, "profile: the ranks sent %zu bytes of layer "
                             "records, not %zu", total, (size_t)sp->n_files * sp->rec_bytes);
        /* the shares are contiguous and in rank order: the records are in layer order */
        for (int32_t f = 0; !st && f < sp->n_files; f++)
            replay(user, f, all + (size_t)f * sp->rec_bytes);
    }
    free(all);
    free(sizes);
    free(sp->recs);
    sp->recs = NULL;
    return kvq_dist_agree(d, st, err);
}
