/*
 * runtime/select/mass.h — the count k* of the mass selector (runtime/select/mass_count.c),
 * for mass.c and probe.c, and the memos of the probe's steps. Not a public header.
 */
#ifndef KVQ_RUNTIME_MASS_H
#define KVQ_RUNTIME_MASS_H

#include <stdint.h>

/* k* of hcattention's rule: the smallest k such that the k largest of lg [n] (n >= 1;
 * ties to the lower index) hold at least tau of softmax(lg). keys: [n], w: [n] scratch. */
int64_t kvq_rt_mass_count(const float *lg, int64_t n, double tau, uint32_t *keys, double *w);

/* What the mass-selector steps of one (row, head) share under several taus
 * (kvq_retrieval_probe): the candidates' scores and the tau-independent part of k*.
 *   new / free     (free takes NULL)
 *   next           a new (row, head): what the memo holds is no longer valid
 *   scores         when the memo holds n candidates' scores: copies them into scores,
 *                  adds their codebook bytes to *cb_bytes, returns 1; else 0
 *   count_memo     k* as kvq_rt_mass_count (the same value), keeping scores [n] (with
 *                  their cb_bytes) and the prepared state on the first call of a (row,
 *                  head) and reading it on the others; m NULL or out of memory: plain */
typedef struct rt_mass_memo rt_mass_memo;
rt_mass_memo *kvq_rt_mass_memo_new(void);
void kvq_rt_mass_memo_free(rt_mass_memo *m);
void kvq_rt_mass_memo_next(rt_mass_memo *m);
int kvq_rt_mass_memo_scores(rt_mass_memo *m, int64_t n, float *scores, double *cb_bytes);
/*   put            the memo holds scores [n] with their cb_bytes from here on (kept
 *                  when it holds n candidates' already); 0 when m is NULL or out of
 *                  memory
 *   topk           when the memo holds n candidates' scores: the top k of them as
 *                  kvq_rk_topk selects them (the same set: ties to the lower index),
 *                  ascending, into sel, from one order of the candidates made on the
 *                  first call (nested selections share it); returns the count; else -1 */
int kvq_rt_mass_memo_put(rt_mass_memo *m, const float *scores, int64_t n, double cb_bytes);
int64_t kvq_rt_mass_memo_topk(rt_mass_memo *m, int64_t n, int64_t k, int32_t *sel);
int64_t kvq_rt_mass_count_memo(rt_mass_memo *m, const float *scores, double cb_bytes,
                               const float *lg, int64_t n, double tau, uint32_t *keys, double *w);

/* kvq_rt_rank_select and its AVX-512 path: runtime/kernels/rk.h. */

/* The rerank's top k for the probe's steps of one (row, head)
 * (runtime/select/codebook/rank_memo.c):
 *   score_order  a [n] = 0 .. n-1 ordered by scores: kvq_rk_key descending, then index
 *                (a stable LSD radix sort; v [2 n] scratch)
 *   build        ranks the rows [0, nv) by rerank.c's score of lgb [nq, nv] (the summed
 *                query's row gs when nq > gs, else the gs heads' sum in head order or,
 *                max, their maximum); 0 when out of memory (the memo then holds none)
 *   topk         of candidates rows [n] (ascending, in [lo, lo + nv)), the k of least
 *                rank, ascending indices into sel [n]: kvq_rk_topk's set on their
 *                scores; returns the count */
typedef struct rt_rank_memo rt_rank_memo;
void kvq_rt_score_order(const float *scores, int64_t n, uint64_t *v, int32_t *a);
rt_rank_memo *kvq_rt_rank_memo_new(void);
void kvq_rt_rank_memo_free(rt_rank_memo *R);
int kvq_rt_rank_memo_build(rt_rank_memo *R, const float *lgb, int64_t nv, int32_t nq, int32_t gs,
                           int max);
int64_t kvq_rt_rank_memo_topk(rt_rank_memo *R, int64_t lo, const int32_t *rows, int64_t n,
                              int64_t k, int32_t *sel);

#endif /* KVQ_RUNTIME_MASS_H */
