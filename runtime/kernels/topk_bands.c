/*
 * topk_bands.c — top-k of candidates scored per (code, distance band), the selection of
 * --score-pos bands on rows in code order (kvq_rk_topk_bands, runtime/kernels/rk.h).
 *
 * Every row of one (code, band) group has the same score, the band's LUT entry for the
 * code. So the k-th largest score is a weighted k-th over the K x bands groups (each
 * weighted by its row count, kvq_rk_kth_key_weighted) rather than a radix select over
 * every row's score, and the selection is emitted group by group: a group above the
 * threshold as a range of rows, a group at it in part (its lowest rows, while ties
 * last), in row order. The groups' row ranges: each code's run of rows keeps token
 * order, so a band is a sub-run, found by searching the run from its end (nearest band
 * first: a galloping search, then halving).
 */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "runtime/kernels/rk.h"
#include "runtime/kernels/kernels.h"

/* The first row of [lo, hi) whose token is >= t (tokens increasing over the rows; hi if
 * none), searched from the row g in [lo, hi): by doubling steps away from g, then by
 * halves. */
static int64_t lower_from(const int32_t *tok, int64_t lo, int64_t hi, int64_t t, int64_t g)
{
    int64_t good, bad; /* tok[good] >= t or good = hi; tok[bad] < t or bad = lo - 1 */
    if (tok[g] >= t) {
        good = g;
        int64_t step = 1;
        while (good - step >= lo && tok[good - step] >= t) {
            good -= step;
            step *= 2;
        }
        bad = good - step < lo ? lo - 1 : good - step;
    } else {
        bad = g;
        int64_t step = 1;
        while (bad + step < hi && tok[bad + step] < t) {
            bad += step;
            step *= 2;
        }
        good = bad + step < hi ? bad + step : hi;
    }
    while (good - bad > 1) {
        const int64_t mid = bad + (good - bad) / 2;
        if (tok[mid] >= t)
            good = mid;
        else
            bad = mid;
    }
    return good;
}

/* Rows of a guess's window: the rows whose tokens are compared with the band's first
 * token all at once (no branch on the data) when the window brackets the answer. */
#define WIN 32

/* Of rows [lo, hi) (tokens increasing), the first whose token is >= t, from the guess
 * g: counted in the window of WIN rows around g when it holds the answer (the usual
 * case: the guesses' error is a few rows), else searched from g (lower_from). */
static int64_t split_at(const int32_t *tok, int64_t lo, int64_t hi, int64_t t, int64_t g, int64_t n)
{
    const int32_t t32 = t > INT32_MAX ? INT32_MAX : (int32_t)t;
    if (hi - lo <= WIN && lo + WIN <= n) { /* the whole run, in a window of rows [0, n) */
        const int32_t len = (int32_t)(hi - lo);
        int32_t below = 0;
        for (int32_t i = 0; i < WIN; i++)
            below += (tok[lo + i] < t32) & (i < len);
        return lo + below;
    }
    if (hi - lo <= WIN)
        return lower_from(tok, lo, hi, t, g);
    int64_t a = g - WIN / 2;
    a = a < lo ? lo : a > hi - WIN ? hi - WIN : a;
    if ((a == lo || tok[a - 1] < t32) && (a + WIN == hi || tok[a + WIN] >= t32)) {
        int32_t below = 0;
        for (int32_t i = 0; i < WIN; i++)
            below += tok[a + i] < t32;
        return a + below;
    }
    return lower_from(tok, lo, hi, t, g);
}

/* The search's starting rows g[b] (b < nb - 1) in the run [lo, hi) of code c: where
 * band b's first token would sit if the run's tokens were spread evenly from its first
 * to its last (codes recur over time); each row's line is fetched (the runs are read
 * in code order, one ahead of their search, so the fetches overlap). */
static void guesses(const kvq_rk_bands *B, int64_t lo, int64_t hi, int64_t *g)
{
    if (hi <= lo)
        return;
    const int64_t t0 = B->tok[lo], t1 = B->tok[hi - 1];
    const double per = (double)(hi - lo) / (double)(t1 - t0 + 1);
    for (int32_t b = 0; b + 1 < B->nb; b++) {
        const int64_t t = B->tb[b];
        int64_t r = t <= t0 ? lo : t > t1 ? hi - 1 : lo + (int64_t)((double)(t - t0) * per);
        r = r < lo ? lo : r >= hi ? hi - 1 : r;
        g[b] = r;
        __builtin_prefetch(B->tok + r);
    }
}

/* First tail row (relative) of band b: band b < nb - 1 holds the tokens >= tb[b]. */
static int64_t tail_cut(const kvq_rk_bands *B, int32_t b)
{
    if (b + 1 >= B->nb)
        return 0;
    const int64_t c = B->tb[b] - B->utok0;
    return c < 0 ? 0 : c > B->nu ? B->nu : c;
}

int64_t kvq_rk_topk_bands(const kvq_rk_bands *B, int64_t k, int32_t *idx, uint32_t *work)
{
    return kvq_rk_topk_bands_scored(B, k, idx, NULL, work);
}

int64_t kvq_rk_topk_bands_scored(const kvq_rk_bands *B, int64_t k, int32_t *idx, float *val,
                                 uint32_t *work)
{
    return kvq_rk_topk_bands_grouped(B, k, idx, val, NULL, work);
}

/* The tail's rows counted per (code, band) group into w [nb K] (zeroed here), and the
 * sub-runs: start[c nb + b] = the first row of code c's run in band b (band b ends where
 * band b - 1 starts, band 0 at the run's end); w[b K + c] += its rows. Runs in code
 * order, each one's guesses made (and fetched) while the one before it is searched. */
static void split_runs(const kvq_rk_bands *B, uint32_t *start, uint32_t *w)
{
    const int32_t K = B->K, nb = B->nb;
    memset(w, 0, sizeof *w * (size_t)nb * (size_t)K);
    for (int32_t b = 0; b < nb; b++) {
        const int64_t e = b ? tail_cut(B, b - 1) : B->nu;
        uint32_t *wb = w + (size_t)b * K;
        for (int64_t i = tail_cut(B, b); i < e; i++)
            wb[B->ucodes[i]]++;
    }
    int64_t gb[2][64], rs = 0;
    guesses(B, 0, B->cnt[0], gb[0]);
    for (int32_t c = 0; c < K; c++) {
        const int64_t re = rs + B->cnt[c];
        if (c + 1 < K)
            guesses(B, re, re + B->cnt[c + 1], gb[(c + 1) & 1]);
        uint32_t *st = start + (size_t)c * nb;
        const int64_t *g = gb[c & 1];
        int64_t j = re;
        for (int32_t b = 0; b + 1 < nb; b++) {
            const int64_t s = re > rs ? split_at(B->tok, rs, re, B->tb[b], g[b], B->n) : rs;
            st[b] = (uint32_t)s;
            w[(size_t)b * K + c] += (uint32_t)(j - s);
            j = s;
        }
        st[nb - 1] = (uint32_t)rs;
        w[(size_t)(nb - 1) * K + c] += (uint32_t)(j - rs);
        rs = re;
    }
    assert(rs == B->n);
}

/* Every row in row order, as the emission below takes them when all are selected
 * (each run from its farthest band to its nearest, then the tail by band), each when
 * not NULL: grp[j] = row j's group b K + code, val[j] its LUT entry; no threshold. */
static void all_rows(const kvq_rk_bands *B, const uint32_t *start, float *val, int32_t *grp)
{
    const int32_t K = B->K, nb = B->nb;
    int64_t rs = 0;
    for (int32_t c = 0; c < K; c++) {
        const uint32_t *st = start + (size_t)c * nb;
        const int64_t re = rs + B->cnt[c];
        for (int32_t b = nb - 1; b >= 0; b--) {
            const int64_t s = st[b], e = b ? st[b - 1] : re;
            const int32_t gi = b * K + c;
            for (int64_t j = s; grp && j < e; j++)
                grp[j] = gi;
            for (int64_t j = s; val && j < e; j++)
                val[j] = B->lut[gi];
        }
        rs = re;
    }
    for (int32_t b = nb - 1; b >= 0; b--) {
        const int64_t e = b ? tail_cut(B, b - 1) : B->nu;
        for (int64_t i = tail_cut(B, b); i < e; i++) {
            if (grp)
                grp[B->n + i] = b * K + B->ucodes[i];
            if (val)
                val[B->n + i] = B->lut[(size_t)b * K + B->ucodes[i]];
        }
    }
}

void kvq_rk_bands_groups(const kvq_rk_bands *B, int32_t *grp, uint32_t *work)
{
    if (B->n + B->nu <= 0)
        return;
    split_runs(B, work, work + (size_t)B->nb * (size_t)B->K);
    all_rows(B, work, NULL, grp);
}

void kvq_rk_bands_cursor_begin(const kvq_rk_bands *B, uint32_t *work, kvq_rk_bands_cursor *cur)
{
    *cur = (kvq_rk_bands_cursor){.B = B, .start = work, .row = 0, .rs = 0, .c = 0, .b = B->nb - 1};
    if (B->n + B->nu > 0)
        split_runs(B, work, work + (size_t)B->nb * (size_t)B->K);
    if (B->n == 0)
        cur->c = B->K;
}

/* The rows of all_rows' order, m at a time: code c's sub-run of band b is rows [st[b],
 * b ? st[b - 1] : the run's end), bands from the farthest; then the tail by band. */
void kvq_rk_bands_cursor_next(kvq_rk_bands_cursor *cur, int64_t m, int32_t *grp)
{
    const kvq_rk_bands *B = cur->B;
    const int32_t K = B->K, nb = B->nb;
    int64_t j = cur->row;
    const int64_t end = j + m;
    while (j < end && cur->c < K) { /* the runs in code order */
        const uint32_t *st = cur->start + (size_t)cur->c * nb;
        const int64_t re = cur->rs + B->cnt[cur->c];
        const int64_t e = cur->b ? st[cur->b - 1] : re;
        const int32_t gi = cur->b * K + cur->c;
        const int64_t stop = e < end ? e : end;
        for (; j < stop; j++)
            grp[j - cur->row] = gi;
        if (j == e) { /* the next sub-run */
            if (cur->b > 0) {
                cur->b--;
            } else {
                cur->rs = re;
                cur->b = nb - 1;
                cur->c++;
            }
        }
    }
    while (j < end) { /* the tail, band b's rows from tail_cut(b) */
        const int64_t i = j - B->n;
        while (cur->b > 0 && i >= tail_cut(B, cur->b - 1))
            cur->b--;
        grp[j - cur->row] = cur->b * K + B->ucodes[i];
        j++;
    }
    cur->row = end;
}

int64_t kvq_rk_topk_bands_grouped(const kvq_rk_bands *B, int64_t k, int32_t *idx, float *val,
                                  int32_t *grp, uint32_t *work)
{
    const int32_t K = B->K, nb = B->nb;
    const size_t nk = (size_t)nb * (size_t)K;
    const int64_t total = B->n + B->nu;
    if (total <= 0 || k <= 0)
        return 0;
    if (k >= total) {
        for (int64_t j = 0; j < total; j++)
            idx[j] = (int32_t)j;
        if (!val && !grp)
            return total;
    }
    uint32_t *start = work, *w = work + nk, *keys = work + 2 * nk;
    split_runs(B, start, w);
    if (k >= total) { /* every row (the residual stage over every candidate): no threshold */
        all_rows(B, start, val, grp);
        return total;
    }
    /* the threshold: the weighted k-th over the groups that hold rows */
    int64_t m = 0, ties;
    for (size_t i = 0; i < nk; i++) { /* compacted in place (m <= i), without a branch */
        const uint32_t wi = w[i];
        keys[m] = kvq_rk_key(B->lut[i]);
        w[m] = wi;
        m += wi != 0;
    }
    const uint32_t T = kvq_rk_kth_key_weighted(keys, w, m, k, &ties);
    /* the rows, in row order: runs by code, each from its farthest band to its nearest */
    int64_t out = 0, rs = 0;
    for (int32_t c = 0; c < K; c++) {
        const uint32_t *st = start + (size_t)c * nb;
        const int64_t re = rs + B->cnt[c];
        for (int32_t b = nb - 1; b >= 0; b--) {
            const int64_t s = st[b], e = b ? st[b - 1] : re;
            const uint32_t key = kvq_rk_key(B->lut[(size_t)b * K + c]);
            int64_t take = key > T ? e - s : 0;
            if (key == T && e > s) { /* rare: the group at the threshold */
                take = ties < e - s ? ties : e - s;
                ties -= take;
            }
            const float v = B->lut[(size_t)b * K + c];
            for (int64_t j = s; j < s + take; j++) {
                if (val)
                    val[out] = v;
                if (grp)
                    grp[out] = b * K + c;
                idx[out++] = (int32_t)j;
            }
        }
        rs = re;
    }
    for (int32_t b = nb - 1; b >= 0; b--) {
        const int64_t e = b ? tail_cut(B, b - 1) : B->nu;
        const float *lut = B->lut + (size_t)b * K;
        for (int64_t i = tail_cut(B, b); i < e; i++) {
            const uint32_t key = kvq_rk_key(lut[B->ucodes[i]]);
            if (key > T || (key == T && ties-- > 0)) {
                if (val)
                    val[out] = lut[B->ucodes[i]];
                if (grp)
                    grp[out] = b * K + B->ucodes[i];
                idx[out++] = (int32_t)(B->n + i);
            }
        }
    }
    assert(out == k);
    return out;
}
