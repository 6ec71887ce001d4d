/* util.c — checked parsing, growable arrays and strings, JSON strings, file mapping,
 * hashing, RNG, time. */
#include "kvq/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ==========================================================================
 * checked parsing
 * ========================================================================== */

kvq_status kvq_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out, kvq_err *err)
{
    if (!s || !*s)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "empty number");
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0')
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "'%s' is not an integer", s);
    if (errno == ERANGE || v < min || v > max)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "'%s' is out of range [%lld, %lld]", s,
                           (long long)min, (long long)max);
    *out = (int64_t)v;
    return KVQ_OK;
}

kvq_status kvq_parse_f64(const char *s, double min, double max, double *out, kvq_err *err)
{
    if (!s || !*s)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "empty number");
    errno = 0;
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || *end != '\0')
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "'%s' is not a number", s);
    if (errno == ERANGE || !isfinite(v) || v < min || v > max)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "'%s' is out of range [%g, %g]", s, min, max);
    *out = v;
    return KVQ_OK;
}

int kvq_cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int kvq_cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

kvq_status kvq_parse_index_list(const char *s, int64_t limit, int32_t **out, size_t *n,
                                kvq_err *err)
{
    *out = NULL;
    *n = 0;
    if (!s || !*s)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "empty list");
    if (limit <= 0 || limit > INT32_MAX)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "list limit %lld out of range",
                           (long long)limit);
    uint8_t *seen = calloc((size_t)limit, 1);
    if (!seen)
        return kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
    char *copy = strdup(s);
    if (!copy) {
        free(seen);
        return kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
    }
    kvq_status st = KVQ_OK;
    size_t count = 0;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t a, b;
        char *dash = strchr(tok + 1, '-'); /* tok+1: allow no leading '-' anyway */
        if (dash) {
            *dash = '\0';
            if ((st = kvq_parse_i64(tok, 0, limit - 1, &a, err)) ||
                (st = kvq_parse_i64(dash + 1, 0, limit - 1, &b, err)))
                goto done;
            if (b < a) {
                st = kvq_err_set(err, KVQ_E_INVALID_ARG, "range %lld-%lld is reversed",
                                 (long long)a, (long long)b);
                goto done;
            }
        } else {
            if ((st = kvq_parse_i64(tok, 0, limit - 1, &a, err)))
                goto done;
            b = a;
        }
        for (int64_t i = a; i <= b; i++)
            if (!seen[i]) {
                seen[i] = 1;
                count++;
            }
    }
    if (count == 0) {
        st = kvq_err_set(err, KVQ_E_INVALID_ARG, "list '%s' selects nothing", s);
        goto done;
    }
    *out = malloc(count * sizeof **out);
    if (!*out) {
        st = kvq_err_set(err, KVQ_E_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0, k = 0; i < limit; i++)
        if (seen[i])
            (*out)[k++] = (int32_t)i;
    qsort(*out, count, sizeof **out, kvq_cmp_i32);
    *n = count;
done:
    free(copy);
    free(seen);
    return st;
}

/* ==========================================================================
 * growable arrays and strings
 * ========================================================================== */

int kvq_resize(void **p, size_t n, size_t size)
{
    size_t bytes;
    if (!kvq_size_mul(n, size, &bytes))
        return -1;
    void *q = realloc(*p, bytes ? bytes : 1);
    if (!q)
        return -1;
    *p = q;
    return 0;
}

int kvq_grow(void **items, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap && *items)
        return 0;
    size_t c = *cap < 16 ? 16 : *cap;
    while (c < need) {
        if (c > SIZE_MAX / 2)
            return -1;
        c *= 2;
    }
    if (kvq_resize(items, c, size))
        return -1;
    *cap = c;
    return 0;
}

/* Room for n more bytes and the NUL. */
static int sb_reserve(kvq_strbuf *b, size_t n)
{
    if (b->oom)
        return 0;
    size_t need;
    if (!kvq_size_add(b->len, n, &need) || !kvq_size_add(need, 1, &need) ||
        kvq_grow((void **)&b->s, &b->cap, need, 1)) {
        b->oom = 1;
        return 0;
    }
    return 1;
}

void kvq_sb_put(kvq_strbuf *b, const void *p, size_t n)
{
    if (!sb_reserve(b, n))
        return;
    memcpy(b->s + b->len, p, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void kvq_sb_puts(kvq_strbuf *b, const char *s) { kvq_sb_put(b, s, strlen(s)); }

void kvq_sb_printf(kvq_strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if (!sb_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void kvq_sb_free(kvq_strbuf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

/* ==========================================================================
 * JSON strings
 * ========================================================================== */

/* The text that stands for byte c inside a JSON string: its escape, '?' for a byte
 * >= 0x80 when ascii_only, else c itself. Returns its length (at most 6). */
static size_t json_escape(unsigned char c, int ascii_only, char out[8])
{
    static const char hex[] = "0123456789abcdef";
    const char *e = NULL;
    switch (c) {
    case '"': e = "\\\""; break;
    case '\\': e = "\\\\"; break;
    case '\b': e = "\\b"; break;
    case '\f': e = "\\f"; break;
    case '\n': e = "\\n"; break;
    case '\r': e = "\\r"; break;
    case '\t': e = "\\t"; break;
    default: break;
    }
    if (e) {
        memcpy(out, e, 2);
        return 2;
    }
    if (c < 0x20 || c == 0x7f) {
        memcpy(out, "\\u00", 4);
        out[4] = hex[c >> 4];
        out[5] = hex[c & 15];
        return 6;
    }
    out[0] = c >= 0x80 && ascii_only ? '?' : (char)c;
    return 1;
}

void kvq_json_write_str(FILE *f, const char *s)
{
    if (!s) {
        fputs("null", f);
        return;
    }
    const size_t n = strlen(s);
    const int ascii_only = !kvq_utf8_valid(s, n);
    char t[8];
    fputc('"', f);
    for (size_t i = 0; i < n; i++)
        fwrite(t, 1, json_escape((unsigned char)s[i], ascii_only, t), f);
    fputc('"', f);
}

void kvq_sb_json_str(kvq_strbuf *b, const char *s)
{
    if (!s) {
        kvq_sb_puts(b, "null");
        return;
    }
    const size_t n = strlen(s);
    const int ascii_only = !kvq_utf8_valid(s, n);
    char t[8];
    kvq_sb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++)
        kvq_sb_put(b, t, json_escape((unsigned char)s[i], ascii_only, t));
    kvq_sb_put(b, "\"", 1);
}

/* ==========================================================================
 * path joins
 * ========================================================================== */

int kvq_has_prefix(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

char *kvq_path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", dir, name);
    return s;
}

/* ==========================================================================
 * UTF-8
 * ========================================================================== */

int kvq_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) {
            len = 2; cp = c & 0x1F; min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3; cp = c & 0x0F; min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4; cp = c & 0x07; min = 0x10000;
        } else {
            return 0;
        }
        if (n - i < len)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

/* ==========================================================================
 * files
 * ========================================================================== */

/* What a file that is not a regular one is, for messages. */
static const char *file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a plain file";
}

kvq_status kvq_open_regular(const char *path, int *fd_out, struct stat *st, kvq_err *err)
{
    *fd_out = -1;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return kvq_err_set(err, errno == ENOENT ? KVQ_E_NOT_FOUND : KVQ_E_IO, "%s: %s", path,
                           strerror(errno));
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return kvq_err_set(err, KVQ_E_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return kvq_err_set(err, KVQ_E_IO, "%s: not a regular file (%s)", path,
                           file_kind(st->st_mode));
    }
    const int fl = fcntl(fd, F_GETFL);
    if (fl == -1 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == -1) {
        int e = errno;
        close(fd);
        return kvq_err_set(err, KVQ_E_IO, "%s: %s", path, strerror(e));
    }
    *fd_out = fd;
    return KVQ_OK;
}

kvq_status kvq_map_file(const char *path, kvq_map *m, kvq_err *err)
{
    m->data = NULL;
    m->size = 0;
    int fd;
    struct stat st;
    kvq_status s0 = kvq_open_regular(path, &fd, &st, err);
    if (s0)
        return s0;
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return kvq_err_set(err, KVQ_E_IO, "%s: mmap: %s", path, strerror(e));
        }
        m->data = p;
        m->size = (size_t)st.st_size;
    }
    close(fd);
    return KVQ_OK;
}

void kvq_unmap(kvq_map *m)
{
    if (m && m->data)
        munmap((void *)m->data, m->size);
    if (m) {
        m->data = NULL;
        m->size = 0;
    }
}

kvq_status kvq_read_file(const char *path, uint8_t **data, size_t *size, kvq_err *err)
{
    *data = NULL;
    *size = 0;
    int fd;
    struct stat st;
    kvq_status s0 = kvq_open_regular(path, &fd, &st, err);
    if (s0)
        return s0;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return kvq_err_set(err, KVQ_E_IO, "%s: %s", path, strerror(errno));
    }
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (len < cap) {
            if (ferror(f)) {
                free(buf);
                fclose(f);
                return kvq_err_set(err, KVQ_E_IO, "%s: read error", path);
            }
            break;
        }
        uint8_t *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            fclose(f);
            return kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory", path);
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    buf[len] = 0;
    *data = buf;
    *size = len;
    return KVQ_OK;
}

/* ==========================================================================
 * hashing, random numbers, time
 * ========================================================================== */

uint64_t kvq_fnv1a64(const void *data, size_t n, uint64_t h)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void kvq_rng_seed(kvq_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kvq_rng_u64(kvq_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double kvq_rng_uniform(kvq_rng *r) { return (double)(kvq_rng_u64(r) >> 11) * 0x1.0p-53; }

uint64_t kvq_rng_below(kvq_rng *r, uint64_t n)
{
    /* Rejection sampling: drop the top partial block so every value is equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = kvq_rng_u64(r);
    while (x >= limit);
    return x % n;
}

double kvq_rng_normal(kvq_rng *r)
{
    double u1 = kvq_rng_uniform(r), u2 = kvq_rng_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double kvq_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
