/* rope.c — rotary position embedding (see kvq/rope.h for the conventions). */
#include "kvq/rope.h"

#include <math.h>
#include <string.h>

kvq_rope kvq_rope_default(int32_t head_dim)
{
    kvq_rope r = {
        .head_dim = head_dim,
        .base = 10000.0,
        .layout = KVQ_ROPE_INTERLEAVED,
        .scaling = KVQ_ROPE_SCALING_NONE,
        .factor = 1.0,
        .low_freq_factor = 1.0,
        .high_freq_factor = 4.0,
        .original_max_pos = 8192.0,
    };
    return r;
}

kvq_status kvq_rope_check(const kvq_rope *r, kvq_err *err)
{
    if (r->head_dim <= 0 || r->head_dim % 2 || r->head_dim > KVQ_ROPE_MAX_DIM)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "rope: head_dim %d must be even and in [2, %d]",
                           r->head_dim, KVQ_ROPE_MAX_DIM);
    if (!(r->base > 1.0) || !isfinite(r->base))
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "rope: base %g must be > 1", r->base);
    if (r->layout != KVQ_ROPE_INTERLEAVED && r->layout != KVQ_ROPE_HALF)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "rope: unknown layout %d", (int)r->layout);
    switch (r->scaling) {
    case KVQ_ROPE_SCALING_NONE:
        break;
    case KVQ_ROPE_SCALING_LINEAR:
        if (!(r->factor > 0) || !isfinite(r->factor))
            return kvq_err_set(err, KVQ_E_INVALID_ARG, "rope: scaling factor %g must be > 0",
                               r->factor);
        break;
    case KVQ_ROPE_SCALING_LLAMA3:
        if (!(r->factor > 0) || !(r->low_freq_factor > 0) ||
            !(r->high_freq_factor > r->low_freq_factor) || !(r->original_max_pos > 0))
            return kvq_err_set(err, KVQ_E_INVALID_ARG,
                               "rope: llama3 scaling needs factor > 0, 0 < low_freq_factor < "
                               "high_freq_factor, original_max_position_embeddings > 0");
        break;
    default:
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "rope: unknown scaling type %d",
                           (int)r->scaling);
    }
    return KVQ_OK;
}

const char *kvq_rope_layout_name(kvq_rope_layout l)
{
    return l == KVQ_ROPE_HALF ? "half" : "interleaved";
}

int kvq_rope_layout_parse(const char *s, kvq_rope_layout *l)
{
    if (!strcmp(s, "interleaved"))
        *l = KVQ_ROPE_INTERLEAVED;
    else if (!strcmp(s, "half"))
        *l = KVQ_ROPE_HALF;
    else
        return -1;
    return 0;
}

const char *kvq_rope_scaling_name(kvq_rope_scaling s)
{
    switch (s) {
    case KVQ_ROPE_SCALING_LINEAR: return "linear";
    case KVQ_ROPE_SCALING_LLAMA3: return "llama3";
    default: return "none";
    }
}

int kvq_rope_scaling_parse(const char *s, kvq_rope_scaling *out)
{
    if (!strcmp(s, "none"))
        *out = KVQ_ROPE_SCALING_NONE;
    else if (!strcmp(s, "linear"))
        *out = KVQ_ROPE_SCALING_LINEAR;
    else if (!strcmp(s, "llama3"))
        *out = KVQ_ROPE_SCALING_LLAMA3;
    else
        return -1;
    return 0;
}

void kvq_rope_freqs(const kvq_rope *r, double *theta)
{
    const int d = r->head_dim;
    for (int m = 0; m < d / 2; m++) {
        double t = pow(r->base, -2.0 * m / d);
        if (r->scaling == KVQ_ROPE_SCALING_LINEAR) {
            t /= r->factor;
        } else if (r->scaling == KVQ_ROPE_SCALING_LLAMA3) {
            double wavelen = 2.0 * M_PI / t;
            double low_wavelen = r->original_max_pos / r->low_freq_factor;
            double high_wavelen = r->original_max_pos / r->high_freq_factor;
            if (wavelen > low_wavelen) {
                t /= r->factor;
            } else if (wavelen >= high_wavelen) {
                double s = (r->original_max_pos / wavelen - r->low_freq_factor) /
                           (r->high_freq_factor - r->low_freq_factor);
                t = (1.0 - s) * t / r->factor + s * t;
            }
        }
        theta[m] = t;
    }
}

void kvq_rope_cossin(const kvq_rope *r, const double *theta, int64_t pos, float *c, float *s)
{
    /* Angles in double so long contexts keep their precision. */
    for (int m = 0; m < r->head_dim / 2; m++) {
        double a = (double)pos * theta[m];
        c[m] = (float)cos(a);
        s[m] = (float)sin(a);
    }
}

void kvq_rope_rotate(const kvq_rope *r, const float *c, const float *s, float *x, int n_heads)
{
    const int d = r->head_dim, half = d / 2;
    /* the rotation itself is in float like the models do */
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * d;
        for (int m = 0; m < half; m++) {
            int i0 = r->layout == KVQ_ROPE_INTERLEAVED ? 2 * m : m;
            int i1 = r->layout == KVQ_ROPE_INTERLEAVED ? 2 * m + 1 : m + half;
            float a = v[i0], b = v[i1];
            v[i0] = a * c[m] - b * s[m];
            v[i1] = a * s[m] + b * c[m];
        }
    }
}

void kvq_rope_apply(const kvq_rope *r, const double *theta, float *x, int n_heads, int64_t pos)
{
    /* One cos/sin per pair, shared by all heads. */
    float c[KVQ_ROPE_MAX_DIM / 2], s[KVQ_ROPE_MAX_DIM / 2];
    kvq_rope_cossin(r, theta, pos, c, s);
    kvq_rope_rotate(r, c, s, x, n_heads);
}

void kvq_rope_matrix(const kvq_rope *r, int64_t pos, double *R)
{
    const int d = r->head_dim, half = d / 2;
    double theta[KVQ_ROPE_MAX_DIM / 2];
    kvq_rope_freqs(r, theta);
    memset(R, 0, sizeof(double) * (size_t)d * d);
    for (int m = 0; m < half; m++) {
        int i0 = r->layout == KVQ_ROPE_INTERLEAVED ? 2 * m : m;
        int i1 = r->layout == KVQ_ROPE_INTERLEAVED ? 2 * m + 1 : m + half;
        double a = (double)pos * theta[m], c = cos(a), s = sin(a);
        /* Row vector: out[i0] = x[i0] c - x[i1] s, out[i1] = x[i0] s + x[i1] c. */
        R[(size_t)i0 * d + i0] = c;
        R[(size_t)i1 * d + i0] = -s;
        R[(size_t)i0 * d + i1] = s;
        R[(size_t)i1 * d + i1] = c;
    }
}

void kvq_rope_interleaved_to_half(const float *in, float *out, int d)
{
    for (int m = 0; m < d / 2; m++) {
        out[m] = in[2 * m];
        out[m + d / 2] = in[2 * m + 1];
    }
}

void kvq_rope_half_to_interleaved(const float *in, float *out, int d)
{
    for (int m = 0; m < d / 2; m++) {
        out[2 * m] = in[m];
        out[2 * m + 1] = in[m + d / 2];
    }
}

const char *kvq_positions_name(kvq_positions p)
{
    return p == KVQ_POSITIONS_ROPE ? "rope" : "wrope";
}

int kvq_positions_parse(const char *s, kvq_positions *p)
{
    if (!strcmp(s, "wrope"))
        *p = KVQ_POSITIONS_WROPE;
    else if (!strcmp(s, "rope"))
        *p = KVQ_POSITIONS_ROPE;
    else
        return -1;
    return 0;
}
