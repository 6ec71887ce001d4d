/*
 * kvq/dist.h — running a stage on several processes (docs/mpi.md).
 *
 * A kvq_dist is a group of `size` processes (ranks 0 .. size-1) that run the same
 * stage with the same arguments and split its work: capture by sequences, fit by
 * (layer, KV head) jobs, the profile (but its perplexity) by layers. Rank 0 gathers the
 * pieces and writes every output once, through the usual temporary-name-and-rename
 * path, so the outputs are byte-identical to one process whatever the number of ranks.
 * The file system that holds the outputs must be shared by the ranks (captures are
 * assembled from per-rank pieces on it, and fit checkpoints are found there on resume).
 *
 * The library holds no message-passing code and never initializes MPI: the caller
 * provides the four operations (the kvq binary's MPI implementation is cli/dist_mpi.c;
 * it is used only when kvq is launched by mpirun or srun). A NULL kvq_dist *, or one of
 * size 1, is one process: every function below then works without communication.
 *
 * Every rank must call the distributed entry points (kvq_capture_tokens, kvq_fit_run,
 * kvq_calibrate_run with the same dist) in the same order with the same arguments: the
 * operations are collective. An error on any rank is agreed on at the next collective
 * step: every rank returns the status and the message of the lowest failing rank,
 * prefixed "rank R of N: ", and no output is committed.
 */
#ifndef KVQ_DIST_H
#define KVQ_DIST_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/dist.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kvq/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvq_dist {
    int32_t rank, size;   /* this process, and how many there are */
    void *impl;           /* passed to the operations */
    /* Every operation is collective (all ranks call it) and returns KVQ_OK or an error
     * with a message (the transport's). */
    kvq_status (*barrier)(void *impl, kvq_err *err);
    /* Copies rank 0's buf[0..n) to every rank's buf (n is the same on every rank). */
    kvq_status (*bcast)(void *impl, void *buf, size_t n, kvq_err *err);
    /* Rank r sends buf[0..n_r); on rank 0, *all receives malloc'd blobs concatenated
     * in rank order and sizes[r] (size entries, caller's array) each rank's n_r. Other
     * ranks get *all = NULL. */
    kvq_status (*gather)(void *impl, const void *buf, size_t n, uint8_t **all, size_t *sizes,
                         kvq_err *err);
    /* Stops every rank at once (a last resort for the caller: the library never calls
     * it); does not return. */
    void (*abort)(void *impl, int code, const char *msg);
} kvq_dist;

/* rank / size of d; 0 / 1 when d is NULL. */
int32_t kvq_dist_rank(const kvq_dist *d);
int32_t kvq_dist_size(const kvq_dist *d);

/* Collective: every rank passes its status (and err holding its message when not OK);
 * every rank gets back KVQ_OK when all were OK, else the status of the lowest failing
 * rank with its message prefixed "rank R of N: " (in err). One process: st unchanged. */
kvq_status kvq_dist_agree(const kvq_dist *d, kvq_status st, kvq_err *err);

/* Collective: rank 0's status and message to every rank (which returns it). */
kvq_status kvq_dist_share(const kvq_dist *d, kvq_status st, kvq_err *err);

/* Collective: rank 0's n bytes at buf to every rank. */
kvq_status kvq_dist_bcast(const kvq_dist *d, void *buf, size_t n, kvq_err *err);

/* The balanced contiguous share of `rank` among `size` ranks of n items with costs
 * cost[0..n) (NULL: all 1): items [*first, *end). Shares are cut where the running cost
 * crosses total * r / size, so each rank gets about total / size; deterministic. */
void kvq_dist_split(int64_t n, const double *cost, int32_t rank, int32_t size,
                          int64_t *first, int64_t *end);

/* The whole job's progress that rank 0 shows: `done` of its share of n_share items,
 * scaled to the job's n_total items (the shares are balanced, so rank 0's fraction of
 * its share estimates the job's; it reaches n_total when rank 0's share is done). One
 * process (or n_share = n_total): done. */
uint64_t kvq_dist_progress(const kvq_dist *d, uint64_t done, uint64_t n_share, uint64_t n_total);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_DIST_H */
