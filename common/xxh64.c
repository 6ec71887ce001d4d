/* xxh64.c — XXH64 (the xxHash 64-bit hash, spec: github.com/Cyan4973/xxHash
 * doc/xxhash_spec.md), one-shot and streaming (kvq/util.h "hashing"). Checksums of
 * intermediates (capture layer files, moments files): fast enough that verifying a file
 * costs well under reading it (bench figures in docs/capture.md). Expected values in
 * tests/test_common.c come from the Python xxhash package (scripts/gen_xxh64_golden.py). */
#include "kvq/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t round1(uint64_t acc, uint64_t in)
{
    acc += in * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

static inline uint64_t merge(uint64_t acc, uint64_t v)
{
    acc ^= round1(0, v);
    return acc * P1 + P4;
}

void kvq_xxh64_init(kvq_xxh64_state *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->v[0] = seed + P1 + P2;
    s->v[1] = seed + P2;
    s->v[2] = seed;
    s->v[3] = seed - P1;
    s->seed = seed;
}

/* Consumes whole 32-byte stripes of p[0..n); returns the bytes consumed. */
static size_t stripes(uint64_t v[4], const uint8_t *p, size_t n)
{
    size_t i = 0;
    uint64_t a = v[0], b = v[1], c = v[2], d = v[3];
    for (; i + 32 <= n; i += 32) {
        a = round1(a, rd64(p + i));
        b = round1(b, rd64(p + i + 8));
        c = round1(c, rd64(p + i + 16));
        d = round1(d, rd64(p + i + 24));
    }
    v[0] = a, v[1] = b, v[2] = c, v[3] = d;
    return i;
}

void kvq_xxh64_update(kvq_xxh64_state *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    s->total += n;
    if (s->n_buf) {
        size_t take = 32 - s->n_buf < n ? 32 - s->n_buf : n;
        memcpy(s->buf + s->n_buf, p, take);
        s->n_buf += (uint32_t)take;
        p += take;
        n -= take;
        if (s->n_buf < 32)
            return;
        stripes(s->v, s->buf, 32);
        s->n_buf = 0;
    }
    size_t done = stripes(s->v, p, n);
    memcpy(s->buf, p + done, n - done);
    s->n_buf = (uint32_t)(n - done);
}

uint64_t kvq_xxh64_digest(const kvq_xxh64_state *s)
{
    uint64_t h;
    if (s->total >= 32) {
        h = rotl(s->v[0], 1) + rotl(s->v[1], 7) + rotl(s->v[2], 12) + rotl(s->v[3], 18);
        for (int i = 0; i < 4; i++)
            h = merge(h, s->v[i]);
    } else {
        h = s->seed + P5;
    }
    h += s->total;
    const uint8_t *p = s->buf;
    size_t n = s->n_buf;
    for (; n >= 8; p += 8, n -= 8) {
        h ^= round1(0, rd64(p));
        h = rotl(h, 27) * P1 + P4;
    }
    if (n >= 4) {
        h ^= (uint64_t)rd32(p) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4;
        n -= 4;
    }
    for (; n; p++, n--) {
        h ^= (*p) * P5;
        h = rotl(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

kvq_status kvq_xxh64_file(const char *path, uint64_t *out, kvq_err *err)
{
    /* read(2) in pieces rather than a map: no page fault per 4 KiB page, and the pages a
     * stage then maps are in the page cache already */
    enum { CHUNK = 1 << 20 };
    int fd;
    struct stat st;
    kvq_status s = kvq_open_regular(path, &fd, &st, err);
    if (s)
        return s;
    uint8_t *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
    }
    kvq_xxh64_state x;
    kvq_xxh64_init(&x, 0);
    ssize_t r;
    while ((r = read(fd, buf, CHUNK)) > 0)
        kvq_xxh64_update(&x, buf, (size_t)r);
    if (r < 0)
        s = kvq_err_set(err, KVQ_E_IO, "%s: read failed: %s", path, strerror(errno));
    free(buf);
    close(fd);
    *out = kvq_xxh64_digest(&x);
    return s;
}

uint64_t kvq_xxh64(const void *data, size_t n, uint64_t seed)
{
    kvq_xxh64_state s;
    kvq_xxh64_init(&s, seed);
    kvq_xxh64_update(&s, data, n);
    return kvq_xxh64_digest(&s);
}
