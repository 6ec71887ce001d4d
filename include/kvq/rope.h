/*
 * kvq/rope.h — rotary position embedding with the model's base, scaling and pair layout.
 *
 * Row-vector convention (docs/design.md): rope(x, p) = x R_p. Pair m rotates by the angle
 * p * theta_m with theta_m = base^(-2m/d), after scaling:
 *   linear:  theta_m / factor
 *   llama3:  wavelength 2*pi/theta_m below orig/high_freq_factor: unchanged; above
 *            orig/low_freq_factor: theta_m / factor; in between a linear blend in
 *            s = (orig/wavelength - low) / (high - low): (1-s) theta_m/factor + s theta_m.
 * Layouts:
 *   KVQ_ROPE_INTERLEAVED  pair m is dims (2m, 2m+1)      (GGUF llama, llama2.c)
 *   KVQ_ROPE_HALF         pair m is dims (m, m + d/2)     (HF checkpoints, GGUF qwen2)
 * A pair (a, b) becomes (a cos - b sin, a sin + b cos).
 */
#ifndef KVQ_ROPE_H
#define KVQ_ROPE_H

#ifndef KVQ_UNSTABLE_API
#error "kvq/rope.h is in kvq's unstable tier (docs/api.md): define KVQ_UNSTABLE_API; make install-unstable installs it"
#endif

#include "kvq/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvq_rope_layout { KVQ_ROPE_INTERLEAVED = 0, KVQ_ROPE_HALF = 1 } kvq_rope_layout;
typedef enum kvq_rope_scaling {
    KVQ_ROPE_SCALING_NONE = 0,
    KVQ_ROPE_SCALING_LINEAR = 1,
    KVQ_ROPE_SCALING_LLAMA3 = 2
} kvq_rope_scaling;

#define KVQ_ROPE_MAX_DIM 512

typedef struct kvq_rope {
    int32_t head_dim;            /* d, even, <= KVQ_ROPE_MAX_DIM */
    double base;                 /* default 10000 */
    kvq_rope_layout layout;
    kvq_rope_scaling scaling;
    double factor;               /* linear and llama3 (default 1) */
    double low_freq_factor;      /* llama3 (default 1) */
    double high_freq_factor;     /* llama3 (default 4) */
    double original_max_pos;     /* llama3 original_max_position_embeddings (default 8192) */
} kvq_rope;

kvq_rope kvq_rope_default(int32_t head_dim); /* base 10000, interleaved, no scaling */
/* KVQ_E_INVALID_ARG for an odd/too large head_dim, base <= 1, factor <= 0, ... */
kvq_status kvq_rope_check(const kvq_rope *r, kvq_err *err);

const char *kvq_rope_layout_name(kvq_rope_layout l);   /* "interleaved" | "half" */
int kvq_rope_layout_parse(const char *s, kvq_rope_layout *l); /* 0 ok, -1 unknown */
const char *kvq_rope_scaling_name(kvq_rope_scaling s); /* "none" | "linear" | "llama3" */
int kvq_rope_scaling_parse(const char *s, kvq_rope_scaling *out);

/* theta[m] for m in [0, d/2), scaling applied.                    // [d/2] */
void kvq_rope_freqs(const kvq_rope *r, double *theta);

/* Rotates n_heads vectors of head_dim in place by position pos.  // x: [n_heads, d] */
void kvq_rope_apply(const kvq_rope *r, const double *theta, float *x, int n_heads, int64_t pos);
/* kvq_rope_apply in two steps, for callers that rotate many rows at few positions:
 * the cos and sin of every pair at pos (float, from double angles), then the rotation
 * by them; the two give kvq_rope_apply's bits.            // c, s: [d/2] */
void kvq_rope_cossin(const kvq_rope *r, const double *theta, int64_t pos, float *c, float *s);
void kvq_rope_rotate(const kvq_rope *r, const float *c, const float *s, float *x, int n_heads);

/* The d x d matrix R_p (row-major, double) with rope(x, p) = x R_p.  // R: [d, d] */
void kvq_rope_matrix(const kvq_rope *r, int64_t pos, double *R);

/* Index of the partner dimension and the pair of a dimension under a layout. */
static inline int kvq_rope_pair_of(kvq_rope_layout l, int d, int dim)
{
    return l == KVQ_ROPE_INTERLEAVED ? dim / 2 : dim % (d / 2);
}

/* Converts a pre-RoPE vector between layouts: an interleaved vector x_i and a half
 * vector x_h describe the same head when x_i[2m] = x_h[m], x_i[2m+1] = x_h[m + d/2]
 * (the permutation GGUF converters apply to the Q and K weight rows).   // [d] */
void kvq_rope_interleaved_to_half(const float *in, float *out, int d);
void kvq_rope_half_to_interleaved(const float *in, float *out, int d);

/* How positions enter a score: WROPE rotates queries by R_b for every token beyond the
 * window (the moments H = R_b^T H_pre R_b and the runtime's default exact step); ROPE
 * rotates each attended token by its true distance (H from post-RoPE stored queries in
 * the moments ablation; exact RoPE in the runtime). */
typedef enum kvq_positions {
    KVQ_POSITIONS_WROPE = 0,
    KVQ_POSITIONS_ROPE = 1
} kvq_positions;
const char *kvq_positions_name(kvq_positions p);         /* "wrope" | "rope" */
int kvq_positions_parse(const char *s, kvq_positions *p); /* 0 ok, -1 unknown */

#ifdef __cplusplus
}
#endif
#endif
