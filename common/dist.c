/* dist.c — the process-group helpers of kvq/dist.h over the caller's operations:
 * agreeing on an error, sharing rank 0's status, balanced contiguous shares. */
#include "kvq/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int32_t kvq_dist_rank(const kvq_dist *d) { return d ? d->rank : 0; }
int32_t kvq_dist_size(const kvq_dist *d) { return d ? d->size : 1; }

/* What a rank says at a collective step: its status and message. */
typedef struct dist_note {
    int32_t status;
    char msg[sizeof(((kvq_err *)0)->msg)];
} dist_note;

kvq_status kvq_dist_bcast(const kvq_dist *d, void *buf, size_t n, kvq_err *err)
{
    if (kvq_dist_size(d) <= 1)
        return KVQ_OK;
    return d->bcast(d->impl, buf, n, err);
}

kvq_status kvq_dist_share(const kvq_dist *d, kvq_status st, kvq_err *err)
{
    if (kvq_dist_size(d) <= 1)
        return st;
    dist_note n;
    memset(&n, 0, sizeof n);
    n.status = (int32_t)st;
    if (st && err)
        snprintf(n.msg, sizeof n.msg, "%s", err->msg);
    kvq_status s = d->bcast(d->impl, &n, sizeof n, err);
    if (s)
        return s;
    if (n.status)
        return kvq_err_set(err, (kvq_status)n.status, "%s", n.msg);
    return KVQ_OK;
}

kvq_status kvq_dist_agree(const kvq_dist *d, kvq_status st, kvq_err *err)
{
    if (kvq_dist_size(d) <= 1)
        return st;
    dist_note mine, out;
    memset(&mine, 0, sizeof mine);
    memset(&out, 0, sizeof out);
    mine.status = (int32_t)st;
    if (st)
        snprintf(mine.msg, sizeof mine.msg, "%s",
                 err && err->msg[0] ? err->msg : kvq_status_str(st));
    uint8_t *all = NULL;
    size_t *sizes = calloc((size_t)d->size, sizeof *sizes);
    if (!sizes)
        return kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
    kvq_status s = d->gather(d->impl, &mine, sizeof mine, &all, sizes, err);
    if (!s && d->rank == 0) {
        for (int32_t r = 0; r < d->size; r++) {
            dist_note n;
            memcpy(&n, all + (size_t)r * sizeof n, sizeof n);
            if (n.status) {
                out.status = n.status;
                n.msg[sizeof n.msg - 1] = 0;
                /* Keep room for the prefix: the message is cut at its end. */
                snprintf(out.msg, sizeof out.msg, "rank %d of %d: %.*s", (int)r, (int)d->size,
                         (int)(sizeof out.msg - 32), n.msg);
                break;
            }
        }
    }
    free(all);
    free(sizes);
    if (s)
        return s;
    if ((s = d->bcast(d->impl, &out, sizeof out, err)))
        return s;
    if (out.status)
        return kvq_err_set(err, (kvq_status)out.status, "%s", out.msg);
    return KVQ_OK;
}

void kvq_dist_split(int64_t n, const double *cost, int32_t rank, int32_t size, int64_t *first,
                    int64_t *end)
{
    if (size <= 1 || n <= 0) {
        *first = 0;
        *end = n > 0 ? n : 0;
        return;
    }
    double total = 0;
    for (int64_t i = 0; i < n; i++)
        total += cost ? cost[i] : 1.0;
    /* Item i goes to the rank whose interval [total r / size, total (r+1) / size) holds
     * the middle of the item's cost: contiguous, and each share is within one item of
     * total / size. */
    int64_t f = n, e = n;
    double run = 0;
    for (int64_t i = 0; i < n; i++) {
        const double c = cost ? cost[i] : 1.0;
        const double mid = run + 0.5 * c;
        int64_t owner = total > 0 ? (int64_t)(mid * size / total) : i * size / n;
        if (owner >= size)
            owner = size - 1;
        if (owner == rank && f == n)
            f = i;
        if (owner > rank && e == n) {
            e = i;
            break;
        }
        run += c;
    }
    if (f == n)
        e = n;
    *first = f;
    *end = f == n ? n : e;
}

uint64_t kvq_dist_progress(const kvq_dist *d, uint64_t done, uint64_t n_share, uint64_t n_total)
{
    if (kvq_dist_size(d) <= 1 || n_share == n_total)
        return done;
    if (n_share == 0 || done >= n_share)
        return n_total;
    return (uint64_t)((double)done * (double)n_total / (double)n_share);
}
