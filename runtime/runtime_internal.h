/*
 * runtime/runtime_internal.h — internal structures of the decoding context, shared by
 * runtime/retrieval.c (cache, attention step, backend), runtime/select/codebook/row_order.c (code
 * order of the cached rows) and runtime/select/select.c (the selectors). Not a public header.
 */
#ifndef KVQ_RUNTIME_INTERNAL_H
#define KVQ_RUNTIME_INTERNAL_H

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kvq/runtime.h"
#include "runtime/kernels/rk.h"

/* The calling thread's number in its OpenMP team (0 without OpenMP): the index of its
 * rt_scratch in kvq_retrieval.scr. */
static inline int kvq_rt_thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The LUT table of (layer, KV head), or NULL (codebook_set.c). */
const kvq_rk_table *kvq_codebook_set_table(const kvq_codebook_set *rt, int32_t layer, int32_t head);

typedef struct rt_step rt_step;
typedef struct rt_layer rt_layer;

/* Where a context of p (and the artifact rt) runs its selection (runtime/select/codebook/
 * device.c): CUDA when it was asked for (or auto), is usable and covers the selector (the
 * codebook selector under the group sum, with an artifact); else the CPU, logging one
 * warning when CUDA was asked for. */
kvq_retrieval_device kvq_rt_device_choose(const kvq_retrieval_params *p,
                                          const kvq_codebook_set *rt);

/* One (layer, KV head) of the cache. Row j holds token j, except that rows
 * [sink, sorted_end) are in code order when tok is set (kvq/runtime.h "Row order"):
 * row j then holds token tok[j]. Rows [sorted_end, len) are always tokens in order.
 * What the context's selector keeps for the head (codes, fier bits, quest page bounds:
 * runtime/select/) is its own, behind sdata. */
typedef struct rt_head {
    void *k, *v;      /* [cap, d] keys and values, cache dtype; under ROPE the keys
                         rotated by their positions (keys.c) */
    void *sdata;      /* the selector's data of this head (rt_selector.reserve), or NULL */
    int32_t *sel;     /* [sel_cap] last selection (candidate rows) */
    int32_t *sel_tok; /* [sel_cap] the same as token indices, ascending (filled on request) */
    int64_t n_sel, sel_cap;
    int32_t *tok;       /* [cap] token of each row, or NULL (rows in token order) */
    int64_t sorted_end; /* rows [sink, sorted_end) are in code order (with tok) */
} rt_head;

struct rt_layer {
    int64_t len, cap;         /* tokens cached / rows allocated */
    int64_t *pos;             /* [cap] positions */
    int pos_unordered;        /* some cached position is not above the one before */
    rt_head *head;            /* [n_kv_heads] */
    const kvq_codebook **cb;  /* [n_kv_heads] the artifact's, NULL without */
    const kvq_rk_table **tab; /* [n_kv_heads] */
};

/* Sums of kvq_retrieval_stats, per thread until merged (kvq_retrieval_stats_add). */
typedef kvq_retrieval_stats rt_sums;

/* The logits kvq_retrieval_probe's steps of one (row, head) share (probe.c, read by
 * rerank.c): the kernels' values of every visible row [lo, lo + nv), by row, so a step
 * gathers the same bits it would compute.
 *   lgi  [gs, nv]   q R_i . (k_j rotated), scaled by 1/sqrt(d) (the exact row's logits)
 *   lgb  [nqb, nv]  q R_b . k_j (stored keys), unscaled: the group's query heads, then
 *                   (nqb = gs + 1) their sum in head order (rerank.c's summed query) */
typedef struct rt_logit_memo {
    int64_t lo, nv;
    int32_t nqb;
    const float *lgi, *lgb;
    struct rt_sign_memo *sign; /* NULL, or the residual stage's sign table of the last
                                  query it was built for (select/codebook/resid.c) */
    struct rt_rank_memo *rank; /* NULL, or the rows ranked by the rerank's score of lgb
                                  (mass.h; its top k for the steps, rerank.c) */
} rt_logit_memo;

/* kvq_rk_sign_table of q [d], kept while the steps' summed query stays the same (the
 * probe's steps of one (row, head) share it): `have` and the bits of q are its key. */
typedef struct rt_sign_memo {
    int have;
    float q[KVQ_ROPE_MAX_DIM];
    float tab[KVQ_RK_SIGN_TABLE_LEN(KVQ_ROPE_MAX_DIM)];
} rt_sign_memo;

/* Per-thread scratch, sized for T visible tokens. */
typedef struct rt_scratch {
    int64_t cap;         /* T it holds */
    int64_t krot_rows;   /* rows of krot */
    float *scores;       /* [T] candidate scores */
    float *tmp;          /* [T] per-head scores (group max) */
    uint32_t *work;      /* [2T] selection keys */
    double *mwork;       /* [T] mass selection weights */
    int32_t *sel;        /* [T] selected candidates (token indices) */
    int32_t *osel;       /* [T] the oracle's selection (measure) */
    int32_t *att;        /* [T] attended tokens */
    int32_t *msel;       /* [T] the step's selection kept for the measurement (measure,
                            over a compressed cache: att loses its pruned tokens) */
    float *logits;       /* [gs, T] */
    float *pfull;        /* [gs, T] exact probabilities (measure) */
    float *krot;         /* [krot_rows, d] rotated keys */
    float *qb, *qi, *qx; /* [gs, d] q R_b, q R_i, selector queries */
    float *o, *ofull;    /* [gs, d] */
    float *pre;          /* [n, T] prefill scores (pre_bytes) */
    float *vbuf, *qpre;  /* [T, d] prefill values in f32, [n, d] rotated queries
                            (both vbuf_bytes: n <= T) */
    size_t pre_bytes, vbuf_bytes;
    rt_sums sums;
    void *sscr;          /* the selector's scratch (rt_selector.scratch), or NULL */
    int64_t rr_kept;     /* > 0: rerank.c wrote the logits (scaled) of the kept rows into
                            S->logits as the step's attention lays them out (columns
                            [s_end - lo, + rr_kept) of [gs, m]); 0: it did not */
    const float *ktok;   /* NULL, or the step's head's keys rotated, by token [nvis, d]
                            (set by kvq_retrieval_probe for its steps) */
    const rt_logit_memo *lg_memo; /* NULL, or the probe's logits of the step's row */
    struct rt_mass_memo *mass_memo; /* NULL, or what the mass selector's steps of one
                            (row, head) share (mass.h; set by kvq_retrieval_probe) */
    int32_t slot;        /* index of this scratch (the device backend's slot) */
    kvq_status status;   /* first backend failure of the current attend call */
    kvq_err err;         /* its message */
    float *kvrows;       /* [kvrows_cap, 2d] rows decoded from r->kvc (kvc_retr.c) */
    int64_t kvrows_cap;
} rt_scratch;

struct kvq_retrieval {
    kvq_retrieval_params p;
    const kvq_codebook_set *rt;
    int32_t n_layers, n_heads, n_kv, d, gs; /* gs: query heads per KV head */
    int32_t window;                         /* w used */
    int32_t sliding_window, sliding_from;   /* the model's (kvq_model_window_start) */
    int64_t wrope_b;                        /* b used by the exact step */
    kvq_rope rope;
    size_t es;  /* cache element size */
    int keys_rotated; /* ROPE: rt_head.k holds the keys rotated by position, in the
                         cache dtype (keys.c) */
    double theta[KVQ_ROPE_MAX_DIM / 2];
    float bcos[KVQ_ROPE_MAX_DIM / 2], bsin[KVQ_ROPE_MAX_DIM / 2]; /* R_b */
    float *rcos, *rsin; /* [rcap, d/2] cos / sin of every position seen */
    int64_t rcap;
    rt_layer *layer; /* [n_layers] */
    rt_scratch *scr; /* [threads] */
    int32_t n_scr;
    rt_sums sums;
    uint64_t seq_gen;     /* sequences begun (kvq_retrieval_reset) */
    struct rt_probe *probe; /* kvq_retrieval_probe's keys by token (probe.c), or NULL */
    kvq_retrieval_device device; /* where the selection runs (kvq_rt_device_choose) */
    void *sstate;         /* the selector's state of the context (rt_selector.open), or NULL */
    /* Per-layer attention (archs-rt): the retrieval layers' score scale and softcap
     * (kvq_model_layer_attn: the same on every one of them, checked at create), and
     * the local layers, attended exactly over their window (runtime/local.h), or NULL. */
    float scale, softcap;
    struct rt_local *local;
    struct kvq_kvcache *kvc; /* NULL, or the compressed cache the steps read (kvc_retr.c);
                                while set, rt_head.k / .v are NULL: the context holds no
                                rows (the compressed cache's are read instead) */
    int kvc_inflight;        /* steps of LeanKV's prompt: the chunk's own rows read from
                                the call (akey, aval), as a prefill reads them, and the
                                probabilities not counted (the cache's own exact
                                attention of the prompt counts them) */
    float *akey, *aval;      /* without rows (kvc): the appended chunk's keys and values
                                [n_kv, n, d], the keys rotated, both rounded as the cache
                                dtype holds them (kvq_rt_append_key reads the keys) */
    size_t akey_bytes;
    int64_t akey_past, akey_n; /* the chunk's rows [akey_past, + akey_n) */
};

/* One attention step: query row at position pos over nvis tokens of (layer, head). */
struct rt_step {
    const kvq_retrieval *r;
    const rt_layer *L;
    const rt_head *H;
    int32_t layer, head;
    const float *q; /* [gs, d] pre-RoPE queries of the group */
    int64_t pos;    /* the query's position */
    int64_t nvis;   /* tokens [0, nvis) precede the query (itself included) */
    int64_t lo;     /* the first it sees: 0, or nvis - W under a sliding window */
    int64_t s_end;  /* sinks [lo, s_end) */
    int64_t w_beg;  /* window [w_beg, nvis) */
    int64_t nc;     /* candidates [s_end, w_beg) */
    rt_scratch *S;
};

/* The token row j of head H holds. */
static inline int64_t kvq_rt_row_token(const rt_head *H, int64_t j) { return H->tok ? H->tok[j] : j; }

/* Keys (keys.c).
 *   key_rotated  cached key row j of the head rotated by its token's position into y [d]
 *                (f32): the stored row converted when r->keys_rotated, else rotated
 *                on read
 *   rotate       x [d] rotated by position p into y (may alias)
 *   key_pre      the pre-RoPE key k [d] as the cache dtype holds it (f16-rounded in an
 *                f16 cache), in f32, into out
 *   store_key    stores key k [d] (pre-RoPE, f32) of the token at position pos as row j
 *                of H in the cache dtype: when r->keys_rotated rotated in f32 first,
 *                then rounded (llama.cpp's order) */
void kvq_rt_key_rotated(const kvq_retrieval *r, const rt_layer *L, const rt_head *H, int64_t j,
                        float *y);
void kvq_rt_rotate(const kvq_retrieval *r, const float *x, int64_t p, float *y);
void kvq_rt_key_pre(const kvq_retrieval *r, const float *k, float *out);
void kvq_rt_store_key(const kvq_retrieval *r, rt_head *H, int64_t j, int64_t pos, const float *k);
/*   key_held     the key k [d] (pre-RoPE, f32) of a token at position pos rotated and
 *                rounded as the cache dtype holds it (what key_rotated reads back after
 *                store_key under ROPE), into y [d]
 *   append_key   the rotated key of row j of H while its chunk is appended (the
 *                selectors' append: Quest's pages, FIER's bits): the stored row, or
 *                without rows (r->kvc) the chunk's r->akey */
void kvq_rt_key_held(const kvq_retrieval *r, const float *k, int64_t pos, float *y);
void kvq_rt_append_key(const kvq_retrieval *r, const rt_layer *L, const rt_head *H, int64_t j,
                       float *y);

/* The cache (runtime/cache/cache.c).
 *   cache_alloc    a K or V array of `bytes`: 2 MiB aligned and advised for huge pages
 *                  from 4 MiB on; free() releases it. NULL when out of memory.
 *   grow           *p resized to bytes (contents kept); 0 when out of memory
 *   grow_cache     a K or V array grown from old to bytes bytes (cache_alloc's rule)
 *   layer_reserve  layer L grown to hold `need` rows (doubling, capped at max_tokens),
 *                  the selector's data with it
 *   rope_reserve   cos / sin of every position up to max_pos
 *   append         the chunk c onto layer c->layer (rows reserved): K, V, positions, the
 *                  selector's data and row order
 *   head_free      what head H holds, the selector's data included */
void *kvq_rt_cache_alloc(size_t bytes);
int kvq_rt_grow(void **p, size_t bytes);
int kvq_rt_grow_cache(void **p, size_t old, size_t bytes);
kvq_status kvq_rt_layer_reserve(kvq_retrieval *r, rt_layer *L, int64_t need, kvq_err *err);
kvq_status kvq_rt_rope_reserve(kvq_retrieval *r, int64_t max_pos, kvq_err *err);
kvq_status kvq_rt_append(kvq_retrieval *r, const kvq_attn_call *c, kvq_err *err);
void kvq_rt_head_free(const kvq_retrieval *r, rt_head *H);

/* Selection for the step (runtime/select/select.c: the selector's table): writes the
 * chosen candidates (ascending token indices) to sel and returns the count, at most k
 * for the budgeted selectors.
 * sel_bytes receives the selector's metadata bytes read, codebook_bytes the LUT table
 * bytes read. `selector` is the context's, or KVQ_SELECT_ORACLE for the measurement. */
int64_t kvq_rt_select(const rt_step *st, kvq_selector selector, int64_t k, int32_t *sel,
                      double *sel_bytes, double *codebook_bytes);

/* The decode step (step.c).
 *   window_start  the first token a query of `layer` with n tokens before it (itself
 *                 included) sees
 *   step_key      the rotated key of row j (ROPE): from S->ktok (by token) when the
 *                 probe set it, else kvq_rt_key_rotated
 *   prefill_head  exact attention of a prefill chunk for KV head h (matrix products)
 *   attend_union  below */
int64_t kvq_rt_window_start(const kvq_retrieval *r, int32_t layer, int64_t n);
void kvq_rt_step_key(const rt_step *st, int64_t j, float *y);
void kvq_rt_prefill_head(const kvq_retrieval *r, const rt_layer *L, int32_t h,
                         const kvq_attn_call *c, int64_t past, rt_scratch *S);
/* The prefill's attention of the chunk's queries for KV head h over the rows K, V [T, d]
 * (f32, rotated keys), the chunk's own n rows last: row i sees [lo, pe + i + 1) (step.c). */
void kvq_rt_prefill_rows(const kvq_retrieval *r, const kvq_attn_call *c, int32_t h,
                         const float *K, const float *V, int64_t pe, rt_scratch *S);

/* The step's attention over att[0..m) (step.c): logits of the group's queries (scaled
 * by 1/sqrt(d); q R_i on rotated keys under ROPE, q R_b on the stored keys of the far
 * rows att[0..m_far) under WROPE), softmax, values mixed into S->o. The columns the
 * rerank filled (S->rr_kept) are not computed again; the same logits either way. */
void kvq_rt_attend_union(const rt_step *st, const int32_t *att, int64_t m, int64_t m_far);

/* One retrieval step (step.c): query row q [gs, d] (pre-RoPE, the group of KV head
 * h) at position pos over the nvis tokens [0, nvis) cached in layer, with r's selector,
 * budget and tau; the group's outputs into out (row g at out + g ld_out), the step's
 * statistics into S->sums (the measurement too when r->p.measure), the attended tokens
 * in S->att. record: keep the selection for kvq_retrieval_last_selection. */
void kvq_rt_step(const kvq_retrieval *r, int32_t layer, int32_t h, const float *q, int64_t pos,
                 int64_t nvis, int record, rt_scratch *S, float *out, int64_t ld_out);

/* Gemma 2's attention logit softcap (step.c): x = c tanh(x / c) over the rows [rows, n]
 * (stride ld) when c > 0 (r->softcap), after the scale, before the softmax. */
void kvq_rt_softcap(float *x, int32_t rows, int64_t n, int64_t ld, float c);

/* The measurement of one step against exact attention (step.c), the one computation of
 * the per-step figures that a measured context (measure = 1) and kvq_retrieval_probe
 * share (adding a metric: CONTRIBUTING.md "Adding a metric"): S->pfull [gs, nv] the exact
 * probabilities of the visible rows [lo, lo + nv), S->ofull [gs, d] the exact outputs,
 * att [m] the attended rows, o [gs, d] the step's outputs; f2 [gs] the exact outputs'
 * norms squared (kvq_rt_exact_norms; NULL: computed here). Adds one measured step to z:
 * the attention mass on att and the relative output error, each the mean over the
 * group's heads. */
void kvq_rt_exact_norms(const rt_scratch *S, int32_t gs, int32_t d, double *f2);
void kvq_rt_measure_output(const rt_scratch *S, int32_t gs, int32_t d, int64_t lo, int64_t nv,
                           const int32_t *att, int64_t m, const float *o, const double *f2,
                           rt_sums *z);

/* Retrieval over a compressed cache r->kvc (runtime/cache/kvc_retr.c, kvq/kvcache.h):
 *   kvc_call    retrieval_attend's work for a call once r->kvc is set (the rows put into
 *               the compressed cache, the steps, Algorithm 1)
 *   kvc_key     the rotated key of row j as r->kvc holds it (zeros when pruned)
 *   kvc_filter  rows[0..n) without the pruned tokens (order kept); the new count
 *   kvc_attend  the step's attention over att[0..m) read from r->kvc's rows (decoded
 *               into S->kvrows), its probabilities counted into LeanKV's significance */
kvq_status kvq_rt_kvc_call(kvq_retrieval *r, const kvq_attn_call *c, kvq_err *err);
int kvq_rt_kvc_key(const rt_step *st, int64_t j, float *y);
int64_t kvq_rt_kvc_filter(const rt_step *st, int32_t *rows, int64_t n);
void kvq_rt_kvc_attend(const rt_step *st, const int32_t *att, int64_t m);
/*   kvc_exact   the measurement's exact attention over every visible row as r->kvc holds
 *               it (pruned rows get probability 0): S->pfull [gs, nv] by row, S->ofull
 *   kvc_prefill the exact prefill of a chunk for KV head h: earlier tokens' rows from
 *               r->kvc (pruned ones left out), the chunk's own as the cache dtype rounds
 *               them (r->akey, its values rounded here) */
void kvq_rt_kvc_exact(const rt_step *st);
void kvq_rt_kvc_prefill(const kvq_retrieval *r, int32_t h, const kvq_attn_call *c, int64_t past,
                        rt_scratch *S);

/* Frees kvq_retrieval_probe's state (probe.c); NULL is fine. */
void kvq_rt_probe_free(struct rt_probe *p);

/* The best of nq query rows q [nq, d] against one key y [d]: each dot in double, rounded
 * to float, the first row's on ties (the exact scorer's rule: select/oracle.c,
 * select/codebook/resid.c). */
static inline float kvq_rt_group_best_dot(const float *q, int32_t nq, int32_t d, const float *y)
{
    float best = 0;
    for (int32_t g = 0; g < nq; g++) {
        double s = 0;
        for (int32_t t = 0; t < d; t++)
            s += (double)q[(size_t)g * d + t] * y[t];
        if (g == 0 || (float)s > best)
            best = (float)s;
    }
    return best;
}

#ifdef KVQ_RT_DIAG_NEEDLE /* diag_needle.c: a diagnostic build only (docs/QUALITY.md
                            "Why the passkey prompt is missed") */
void kvq_rt_diag_needle_pre(const rt_step *st, int64_t k, int64_t k1, int64_t k2);
void kvq_rt_diag_needle_stage(const rt_step *st, int stage, const int32_t *sel, int64_t n);
void kvq_rt_diag_needle_post(const rt_step *st);
#endif

#endif /* KVQ_RUNTIME_INTERNAL_H */
