/* artifact.c — the .kvq artifact: a zstd skippable frame with the magic and version,
 * then one checksummed zstd frame holding a safetensors payload.
 *
 * docs/format.md is the specification; the reader checks the fields in the order it
 * lists them, so every kind of damage has one status (see kvq/artifact.h). */
#include "kvq/artifact.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "kvq/util.h"

/* ==========================================================================
 * layout
 * ========================================================================== */

enum {
    SKIP_PREFIX = 8,      /* skippable magic (u32) + frame size (u32) */
    KVQA_FIELDS = 24,     /* tag, major, minor, flags (4 x 4 bytes), payload size (u64) */
    HEADER_SIZE = SKIP_PREFIX + KVQA_FIELDS,
    DEFAULT_LEVEL = 3, /* kvq/artifact.h: float codebooks hardly compress at any level */
};

#define ZSTD_FRAME_MAGIC 0xFD2FB528u
/* A zstd block holds at most 128 KiB of content and costs at least 3 bytes (its
 * header), so a frame of C bytes cannot decode to more than C / 3 * 128 KiB. */
#define ZSTD_BLOCK_CONTENT_MAX ((uint64_t)128 << 10)
#define ZSTD_BLOCK_HEADER_MIN 3u

struct kvq_artifact {
    uint32_t major, minor;
    uint8_t *payload;     /* [payload_size] decompressed safetensors bytes, owned */
    size_t payload_size;
    kvq_st *st;           /* views into payload */
    char label[256];      /* the path (or label) it was opened from, for messages */
};

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd_u64(const uint8_t *p) { return rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32; }

static void wr_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void wr_u64(uint8_t *p, uint64_t v)
{
    wr_u32(p, (uint32_t)v);
    wr_u32(p + 4, (uint32_t)(v >> 32));
}

/* zstd error code -> kvq status. `truncation_possible` is 0 once the frame is known
 * to be complete: a size error inside a complete frame is corruption. */
static kvq_status zstd_status(size_t code, int truncation_possible)
{
    switch (ZSTD_getErrorCode(code)) {
    case ZSTD_error_checksum_wrong:
        return KVQ_E_CHECKSUM;
    case ZSTD_error_srcSize_wrong:
        return truncation_possible ? KVQ_E_TRUNCATED_DATA : KVQ_E_CORRUPT;
    case ZSTD_error_memory_allocation:
        return KVQ_E_NOMEM;
    default:
        return KVQ_E_CORRUPT;
    }
}

/* ==========================================================================
 * reader
 * ========================================================================== */

/* The fields of the skippable header frame. */
typedef struct header {
    uint32_t frame_size, major, minor, flags;
    uint64_t payload_size;
} header;

/* Compares the n < 4 bytes present with the start of `want`: a prefix that already
 * differs is the wrong magic, one that matches is just short. */
static kvq_status short_field(const uint8_t *p, size_t n, const uint8_t want[4], const char *label,
                              const char *what, kvq_err *err)
{
    if (n && memcmp(p, want, n) != 0) /* n == 0: p may be NULL (an empty file) */
        return kvq_err_set(err, KVQ_E_BAD_MAGIC, "%s: not a .kvq artifact (bad %s)", label, what);
    return kvq_err_set(err, KVQ_E_TRUNCATED_HEADER, "%s: file ends inside the artifact header "
                       "(%zu bytes)", label, n);
}

/* Parses and checks the skippable header frame (docs/format.md, "Header frame"). */
static kvq_status parse_header(const uint8_t *p, size_t n, const char *label, header *h,
                               kvq_err *err)
{
    uint8_t magic[4];
    wr_u32(magic, KVQ_ARTIFACT_SKIPPABLE_MAGIC);
    if (n < 4)
        return short_field(p, n, magic, label, "magic", err);
    if (memcmp(p, magic, 4) != 0)
        return kvq_err_set(err, KVQ_E_BAD_MAGIC, "%s: not a .kvq artifact (magic %08x, "
                           "expected %08x)", label, rd_u32(p), KVQ_ARTIFACT_SKIPPABLE_MAGIC);
    if (n < SKIP_PREFIX + 4) {
        size_t have = n > SKIP_PREFIX ? n - SKIP_PREFIX : 0;
        return short_field(p + SKIP_PREFIX, have, (const uint8_t *)KVQ_ARTIFACT_TAG, label,
                           "tag", err);
    }
    if (memcmp(p + SKIP_PREFIX, KVQ_ARTIFACT_TAG, 4) != 0)
        return kvq_err_set(err, KVQ_E_BAD_MAGIC, "%s: skippable frame is not a kvq header "
                           "(tag is not \"%s\")", label, KVQ_ARTIFACT_TAG);
    if (n < SKIP_PREFIX + 12)
        return kvq_err_set(err, KVQ_E_TRUNCATED_HEADER, "%s: file ends inside the artifact "
                           "header (%zu bytes)", label, n);
    h->frame_size = rd_u32(p + 4);
    h->major = rd_u32(p + 12);
    h->minor = rd_u32(p + 16);
    /* The major version comes before every other field: a future major version may
     * lay the rest out differently, and the user should hear "version", not "corrupt". */
    if (h->major != KVQ_ARTIFACT_MAJOR)
        return kvq_err_set(err, KVQ_E_VERSION, "%s: artifact format version %u.%u is not "
                           "supported (this reader knows major version %d)", label, h->major,
                           h->minor, KVQ_ARTIFACT_MAJOR);
    if (h->frame_size < KVQA_FIELDS)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: header frame size %u is below %d", label,
                           h->frame_size, KVQA_FIELDS);
    if ((uint64_t)n < (uint64_t)SKIP_PREFIX + h->frame_size)
        return kvq_err_set(err, KVQ_E_TRUNCATED_HEADER, "%s: file ends inside the artifact "
                           "header (%zu of %llu bytes)", label, n,
                           (unsigned long long)SKIP_PREFIX + h->frame_size);
    h->flags = rd_u32(p + 20);
    h->payload_size = rd_u64(p + 24);
    if (h->flags != 0)
        return kvq_err_set(err, KVQ_E_UNSUPPORTED, "%s: header flags 0x%08x are not supported "
                           "(version %u.%u defines none)", label, h->flags, h->major, h->minor);
    if (h->payload_size > KVQ_ARTIFACT_MAX_PAYLOAD || h->payload_size > SIZE_MAX)
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "%s: payload size %llu exceeds the limit of "
                           "%llu bytes", label, (unsigned long long)h->payload_size,
                           (unsigned long long)KVQ_ARTIFACT_MAX_PAYLOAD);
    return KVQ_OK;
}

/* Checks the zstd frame that follows the header (complete, alone, checksummed, its
 * content size equal to the header's payload size) before anything is allocated. */
static kvq_status check_frame(const uint8_t *z, size_t n, const header *h, const char *label,
                              kvq_err *err)
{
    if (n < 4) {
        uint8_t magic[4];
        wr_u32(magic, ZSTD_FRAME_MAGIC);
        if (memcmp(z, magic, n) != 0)
            return kvq_err_set(err, KVQ_E_CORRUPT, "%s: no zstd frame after the header", label);
        return kvq_err_set(err, KVQ_E_TRUNCATED_DATA, "%s: file ends before the compressed "
                           "payload", label);
    }
    if (rd_u32(z) != ZSTD_FRAME_MAGIC)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: no zstd frame after the header (magic "
                           "%08x)", label, rd_u32(z));
    size_t csize = ZSTD_findFrameCompressedSize(z, n);
    if (ZSTD_isError(csize)) {
        kvq_status s = zstd_status(csize, 1);
        if (s == KVQ_E_TRUNCATED_DATA)
            return kvq_err_set(err, s, "%s: file ends inside the compressed payload", label);
        return kvq_err_set(err, s, "%s: compressed payload: %s", label, ZSTD_getErrorName(csize));
    }
    if (csize < n)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: %zu unexpected byte(s) after the compressed "
                           "payload", label, n - csize);
    /* Frame header descriptor, byte 4: bit 2 is the content checksum flag. The
     * frame is complete here, so byte 4 exists. */
    if (!(z[4] & 0x04))
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: compressed payload has no content "
                           "checksum", label);
    unsigned long long fcs = ZSTD_getFrameContentSize(z, n);
    if (fcs == ZSTD_CONTENTSIZE_UNKNOWN || fcs == ZSTD_CONTENTSIZE_ERROR)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: compressed payload does not record its "
                           "size", label);
    if (fcs != h->payload_size)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: header payload size %llu != compressed "
                           "frame content size %llu", label,
                           (unsigned long long)h->payload_size, fcs);
    if (h->payload_size > (uint64_t)csize / ZSTD_BLOCK_HEADER_MIN * ZSTD_BLOCK_CONTENT_MAX)
        return kvq_err_set(err, KVQ_E_CORRUPT, "%s: payload size %llu cannot come from %zu "
                           "compressed bytes", label, (unsigned long long)h->payload_size,
                           csize);
    return KVQ_OK;
}

kvq_status kvq_artifact_open_memory(const void *data, size_t size, const char *label,
                                    kvq_artifact **out, kvq_err *err)
{
    const uint8_t *p = data;
    kvq_artifact *a = NULL;
    ZSTD_DCtx *dctx = NULL;
    header h = {0};
    kvq_status s;
    *out = NULL;
    if (!label)
        label = "<memory>";
    if (!p && size)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "%s: NULL data", label);
    if ((s = parse_header(p, size, label, &h, err)))
        goto done;
    const uint8_t *z = p + SKIP_PREFIX + h.frame_size;
    size_t zn = size - SKIP_PREFIX - h.frame_size;
    if ((s = check_frame(z, zn, &h, label, err)))
        goto done;

    a = calloc(1, sizeof *a);
    dctx = ZSTD_createDCtx();
    /* +1: malloc(0) may return NULL; the payload is never empty in a valid file
     * anyway (a safetensors file has at least 8 bytes). */
    if (a)
        a->payload = malloc((size_t)h.payload_size + 1);
    if (!a || !dctx || !a->payload) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "%s: out of memory for a %llu-byte payload", label,
                        (unsigned long long)h.payload_size);
        goto done;
    }
    a->major = h.major;
    a->minor = h.minor;
    snprintf(a->label, sizeof a->label, "%s", label ? label : "artifact");
    a->payload_size = (size_t)h.payload_size;
    size_t got = ZSTD_decompressDCtx(dctx, a->payload, a->payload_size, z, zn);
    if (ZSTD_isError(got)) {
        s = zstd_status(got, 0);
        s = kvq_err_set(err, s, "%s: compressed payload: %s", label,
                        s == KVQ_E_CHECKSUM ? "content checksum mismatch" : ZSTD_getErrorName(got));
        goto done;
    }
    if (got != a->payload_size) {
        s = kvq_err_set(err, KVQ_E_CORRUPT, "%s: payload decompressed to %zu bytes, header "
                        "says %zu", label, got, a->payload_size);
        goto done;
    }
    if ((s = kvq_st_open_memory(a->payload, a->payload_size, label, &a->st, err)))
        goto done;
    *out = a;
    a = NULL;
done:
    ZSTD_freeDCtx(dctx);
    kvq_artifact_close(a);
    return s;
}

kvq_status kvq_artifact_open(const char *path, kvq_artifact **out, kvq_err *err)
{
    kvq_map m;
    *out = NULL;
    kvq_status s = kvq_map_file(path, &m, err);
    if (s)
        return s;
    /* The payload is decompressed into its own buffer, so the mapping can go. */
    s = kvq_artifact_open_memory(m.data, m.size, path, out, err);
    kvq_unmap(&m);
    return s;
}

void kvq_artifact_close(kvq_artifact *a)
{
    if (!a)
        return;
    kvq_st_close(a->st);
    free(a->payload);
    free(a);
}

uint32_t kvq_artifact_major(const kvq_artifact *a) { return a->major; }
uint32_t kvq_artifact_minor(const kvq_artifact *a) { return a->minor; }
const kvq_st *kvq_artifact_payload(const kvq_artifact *a) { return a->st; }
const void *kvq_artifact_payload_data(const kvq_artifact *a) { return a->payload; }
size_t kvq_artifact_payload_size(const kvq_artifact *a) { return a->payload_size; }

/* ==========================================================================
 * writer
 * ========================================================================== */

kvq_status kvq_artifact_encode(const void *payload, size_t payload_size, int zstd_level,
                               void **out, size_t *out_size, kvq_err *err)
{
    kvq_st *st = NULL;
    ZSTD_CCtx *cctx = NULL;
    uint8_t *buf = NULL;
    kvq_err e = {0};
    kvq_status s = KVQ_OK;
    *out = NULL;
    *out_size = 0;
    int level = zstd_level ? zstd_level : DEFAULT_LEVEL;
    if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "zstd level %d is outside [%d, %d]",
                           zstd_level, ZSTD_minCLevel(), ZSTD_maxCLevel());
    if (!payload)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "artifact payload is NULL");
    if ((uint64_t)payload_size > KVQ_ARTIFACT_MAX_PAYLOAD)
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "artifact payload of %zu bytes exceeds the "
                           "limit of %llu", payload_size,
                           (unsigned long long)KVQ_ARTIFACT_MAX_PAYLOAD);
    /* Never write what the reader would refuse: the payload must be safetensors. */
    if (kvq_st_open_memory(payload, payload_size, "payload", &st, &e) != KVQ_OK)
        return kvq_err_set(err, KVQ_E_INVALID_ARG, "artifact payload is not a valid "
                           "safetensors file: %s", e.msg);
    kvq_st_close(st);

    size_t bound = ZSTD_compressBound(payload_size), cap;
    if (ZSTD_isError(bound) || !kvq_size_add(bound, HEADER_SIZE, &cap))
        return kvq_err_set(err, KVQ_E_TOO_LARGE, "artifact payload of %zu bytes is too large "
                           "to compress", payload_size);
    buf = malloc(cap);
    cctx = ZSTD_createCCtx();
    if (!buf || !cctx) {
        s = kvq_err_set(err, KVQ_E_NOMEM, "out of memory compressing a %zu-byte payload",
                        payload_size);
        goto done;
    }
    /* Single-threaded, fixed parameters: the output depends only on payload and level. */
    size_t r;
    if (ZSTD_isError(r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1)) ||
        ZSTD_isError(r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1)) ||
        ZSTD_isError(r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_nbWorkers, 0)) ||
        ZSTD_isError(r = ZSTD_compress2(cctx, buf + HEADER_SIZE, bound, payload, payload_size))) {
        s = kvq_err_set(err, ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation ? KVQ_E_NOMEM
                                                                                  : KVQ_E_BACKEND,
                        "zstd compression failed: %s", ZSTD_getErrorName(r));
        goto done;
    }
    wr_u32(buf, KVQ_ARTIFACT_SKIPPABLE_MAGIC);
    wr_u32(buf + 4, KVQA_FIELDS);
    memcpy(buf + 8, KVQ_ARTIFACT_TAG, 4);
    wr_u32(buf + 12, KVQ_ARTIFACT_MAJOR);
    wr_u32(buf + 16, KVQ_ARTIFACT_MINOR);
    wr_u32(buf + 20, 0);
    wr_u64(buf + 24, payload_size);
    size_t total = HEADER_SIZE + r;
    uint8_t *shrunk = realloc(buf, total);
    *out = shrunk ? shrunk : buf;
    *out_size = total;
    buf = NULL;
done:
    ZSTD_freeCCtx(cctx);
    free(buf);
    return s;
}

int kvq_artifact_is_artifact(const char *path)
{
    struct stat st;
    uint8_t b[12] = {0};
    if (!path || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    FILE *f = fopen(path, "rb");
    const size_t n = f ? fread(b, 1, sizeof b, f) : 0;
    if (f)
        fclose(f);
    return n == sizeof b && rd_u32(b) == KVQ_ARTIFACT_SKIPPABLE_MAGIC && !memcmp(b + 8, "KVQA", 4);
}

kvq_status kvq_artifact_write(const char *path, int overwrite, const void *payload,
                              size_t payload_size, int zstd_level, kvq_err *err)
{
    void *bytes = NULL;
    size_t n = 0;
    kvq_atomic_file af = {0};
    kvq_status s = kvq_artifact_encode(payload, payload_size, zstd_level, &bytes, &n, err);
    if (s)
        goto done;
    if ((s = kvq_atomic_open(path, overwrite, &af, err)))
        goto done;
    if (fwrite(bytes, 1, n, af.fp) != n) {
        s = kvq_err_set(err, KVQ_E_IO, "%s: write failed (%zu bytes): %s", path, n,
                        strerror(errno));
        kvq_atomic_abort(&af);
        goto done;
    }
    s = kvq_atomic_commit(&af, err); /* removes the temporary itself on failure */
done:
    free(bytes);
    return s;
}

/* ==========================================================================
 * content rules (docs/format.md, "Metadata" and "Tensors")
 * ========================================================================== */

/* A required key: present, non-empty. */
static kvq_status meta_str(const kvq_st *st, const char *key, const char **out, kvq_err *err)
{
    const char *v = kvq_st_meta_get(st, key);
    if (!v || !*v)
        return kvq_err_set(err, KVQ_E_CORRUPT, "missing required metadata key \"%s\"", key);
    *out = v;
    return KVQ_OK;
}

static kvq_status meta_int(const kvq_st *st, const char *key, int64_t min, int64_t max,
                           int64_t *out, kvq_err *err)
{
    const char *v = NULL;
    kvq_err e = {0};
    kvq_status s = meta_str(st, key, &v, err);
    if (s)
        return s;
    if (kvq_parse_i64(v, min, max, out, &e))
        return kvq_err_set(err, KVQ_E_CORRUPT, "metadata \"%s\": %s", key, e.msg);
    return KVQ_OK;
}

/* A u64 in plain decimal (digits only), e.g. the seed. */
static kvq_status meta_u64(const kvq_st *st, const char *key, kvq_err *err)
{
    const char *v = NULL;
    kvq_status s = meta_str(st, key, &v, err);
    if (s)
        return s;
    uint64_t x = 0;
    for (const char *c = v; *c; c++) {
        unsigned digit = (unsigned)(*c - '0');
        if (digit > 9 || x > (UINT64_MAX - digit) / 10)
            return kvq_err_set(err, KVQ_E_CORRUPT, "metadata \"%s\": '%s' is not a u64", key, v);
        x = x * 10 + digit;
    }
    return KVQ_OK;
}

static kvq_status meta_float(const kvq_st *st, const char *key, double min, double max,
                             kvq_err *err)
{
    const char *v = NULL;
    double d;
    kvq_err e = {0};
    kvq_status s = meta_str(st, key, &v, err);
    if (s)
        return s;
    if (kvq_parse_f64(v, min, max, &d, &e))
        return kvq_err_set(err, KVQ_E_CORRUPT, "metadata \"%s\": %s", key, e.msg);
    return KVQ_OK;
}

/* One of a NULL-terminated list of names. */
static kvq_status meta_enum(const kvq_st *st, const char *key, const char *const *names,
                            int *index, kvq_err *err)
{
    const char *v = NULL;
    kvq_status s = meta_str(st, key, &v, err);
    if (s)
        return s;
    for (int i = 0; names[i]; i++)
        if (!strcmp(v, names[i])) {
            *index = i;
            return KVQ_OK;
        }
    return kvq_err_set(err, KVQ_E_UNSUPPORTED, "metadata \"%s\": unknown value \"%s\"", key, v);
}

/* The tensor printf(fmt, l, h, g) exists with dtype F32 and shape [d0, d1]. */
static kvq_status need_f32(const kvq_st *st, const char *fmt, int l, int h, int g, int64_t d0,
                           int64_t d1, kvq_err *err)
{
    char name[128];
    snprintf(name, sizeof name, fmt, l, h, g);
    const kvq_tensor_view *t = kvq_st_find(st, name);
    if (!t)
        return kvq_err_set(err, KVQ_E_CORRUPT, "missing tensor \"%s\"", name);
    if (t->dtype != KVQ_DT_F32 || t->ndim != 2 || t->shape[0] != d0 || t->shape[1] != d1)
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH, "tensor \"%s\" must be F32 [%lld, %lld]",
                           name, (long long)d0, (long long)d1);
    return KVQ_OK;
}

/* An optional per-head threshold: F32, [] or [n_layers, n_kv_heads]. */
static kvq_status check_threshold(const kvq_st *st, const char *name, int64_t n_layers,
                                  int64_t n_kv, kvq_err *err)
{
    const kvq_tensor_view *t = kvq_st_find(st, name);
    if (!t)
        return KVQ_OK;
    int ok = t->dtype == KVQ_DT_F32 &&
             (t->ndim == 0 || (t->ndim == 2 && t->shape[0] == n_layers && t->shape[1] == n_kv));
    if (!ok)
        return kvq_err_set(err, KVQ_E_SHAPE_MISMATCH, "tensor \"%s\" must be F32 [] or "
                           "[%lld, %lld]", name, (long long)n_layers, (long long)n_kv);
    return KVQ_OK;
}

/* The tensors one (layer, KV head) needs for the method (see the table in
 * docs/format.md). method: 1 vq, 2 qavq, 3 vq-postrope. */
static kvq_status check_head(const kvq_st *st, int method, int l, int h, int64_t K, int64_t G,
                             int64_t d, kvq_err *err)
{
    kvq_status s = KVQ_OK;
    if (method == 2) {
        if ((s = need_f32(st, KVQ_TENSOR_L, l, h, 0, d, d, err)) ||
            (s = need_f32(st, KVQ_TENSOR_LINV, l, h, 0, d, d, err)))
            return s;
        if (G == 1)
            return (s = need_f32(st, KVQ_TENSOR_CZ, l, h, 0, K, d, err)) ? s
                   : need_f32(st, KVQ_TENSOR_CODEBOOK, l, h, 0, K, d, err);
        for (int g = 0; g < G && !s; g++)
            s = need_f32(st, KVQ_TENSOR_GROUP_CZ, l, h, g, K, d / G, err);
        return s;
    }
    if (G == 1)
        return need_f32(st, KVQ_TENSOR_CODEBOOK, l, h, 0, K, d, err);
    for (int g = 0; g < G && !s; g++)
        s = need_f32(st, KVQ_TENSOR_GROUP_CODEBOOK, l, h, g, K, d / G, err);
    return s;
}

static kvq_status validate(const kvq_artifact *a, kvq_err *err);

/* Every message names the artifact ("PATH: missing required metadata key ..."). */
kvq_status kvq_artifact_validate(const kvq_artifact *a, kvq_err *err)
{
    kvq_err e = {0};
    kvq_status s = validate(a, &e);
    if (s)
        kvq_err_set(err, s, "%s: %s", a->label, e.msg);
    return s;
}

static kvq_status validate(const kvq_artifact *a, kvq_err *err)
{
    static const char *const layouts[] = {"interleaved", "half", NULL};
    static const char *const scalings[] = {"none", "linear", "llama3", NULL};
    /* The old spellings last; method_of maps them to their index among the first four. */
    static const char *const methods[] = {KVQ_METHOD_NONE, KVQ_METHOD_VQ, KVQ_METHOD_QAVQ,
                                          KVQ_METHOD_VQ_POSTROPE, KVQ_METHOD_QAVQ_OLD,
                                          KVQ_METHOD_VQ_POSTROPE_OLD, NULL};
    static const int method_of[] = {0, 1, 2, 3, 2, 3};
    const kvq_st *st = a->st;
    const char *str = NULL;
    int64_t n_layers, n_heads, n_kv, d, K = 0, G = 1, tmp;
    int layout, scaling, method;
    int32_t *layers = NULL;
    size_t n_sel = 0;
    kvq_err e = {0};
    kvq_status s;
    if ((s = meta_str(st, KVQ_META_ARCH, &str, err)) ||
        (s = meta_int(st, KVQ_META_N_LAYERS, 1, 1 << 20, &n_layers, err)) ||
        (s = meta_int(st, KVQ_META_N_HEADS, 1, 1 << 20, &n_heads, err)) ||
        (s = meta_int(st, KVQ_META_N_KV_HEADS, 1, n_heads, &n_kv, err)) ||
        (s = meta_int(st, KVQ_META_HEAD_DIM, 2, 1 << 16, &d, err)))
        goto done;
    if (n_heads % n_kv != 0 || d % 2 != 0) {
        s = kvq_err_set(err, KVQ_E_CORRUPT, "model: %lld heads over %lld KV heads, head dim "
                        "%lld: heads must be a multiple of KV heads and head dim even",
                        (long long)n_heads, (long long)n_kv, (long long)d);
        goto done;
    }
    if ((s = meta_float(st, KVQ_META_ROPE_BASE, 1.0 + 1e-12, 1e300, err)) ||
        (s = meta_enum(st, KVQ_META_ROPE_LAYOUT, layouts, &layout, err)) ||
        (s = meta_enum(st, KVQ_META_ROPE_SCALING, scalings, &scaling, err)))
        goto done;
    /* the scaling's keys are required; any of them present must hold a valid value
     * whatever the scaling (kvq run reads the whole recorded identity) */
    static const char *const rope_keys[] = {KVQ_META_ROPE_FACTOR, KVQ_META_ROPE_LOW_FREQ,
                                            KVQ_META_ROPE_HIGH_FREQ, KVQ_META_ROPE_ORIG_MAX};
    for (int i = 0; i < 4; i++)
        if ((scaling == 2 || (scaling == 1 && i == 0) || kvq_st_meta_get(st, rope_keys[i])) &&
            (s = meta_float(st, rope_keys[i], 1e-300, 1e300, err)))
            goto done;
    if ((s = meta_enum(st, KVQ_META_METHOD, methods, &method, err)) ||
        (s = meta_str(st, KVQ_META_TOOL_VERSION, &str, err)))
        goto done;
    method = method_of[method];
    if (method != 0) {
        if ((s = meta_int(st, KVQ_META_CODEBOOK_SIZE, 2, 1 << 16, &K, err)) ||
            (s = meta_int(st, KVQ_META_GROUPS, 1, d, &G, err)) ||
            (s = meta_int(st, KVQ_META_WROPE_W, 0, INT32_MAX, &tmp, err)) ||
            (s = meta_int(st, KVQ_META_WROPE_B, 0, INT32_MAX, &tmp, err)) ||
            (s = meta_u64(st, KVQ_META_SEED, err)))
            goto done;
        if (d % G != 0) {
            s = kvq_err_set(err, KVQ_E_CORRUPT, "metadata \"groups\": %lld does not divide "
                            "head dim %lld", (long long)G, (long long)d);
            goto done;
        }
    }
    const char *sel = kvq_st_meta_get(st, KVQ_META_LAYERS);
    if (sel && kvq_parse_index_list(sel, n_layers, &layers, &n_sel, &e)) {
        s = kvq_err_set(err, KVQ_E_CORRUPT, "metadata \"layers\": %s", e.msg);
        goto done;
    }
    for (int64_t i = 0; method != 0 && i < (sel ? (int64_t)n_sel : n_layers); i++)
        for (int h = 0; h < n_kv; h++)
            if ((s = check_head(st, method, sel ? layers[i] : (int)i, h, K, G, d, err)))
                goto done;
    if ((s = check_threshold(st, KVQ_TENSOR_LEANKV_ALPHA_H, n_layers, n_kv, err)) ||
        (s = check_threshold(st, KVQ_TENSOR_LEANKV_ALPHA_L, n_layers, n_kv, err)))
        goto done;
    if (!kvq_st_find(st, KVQ_TENSOR_LEANKV_ALPHA_H) != !kvq_st_find(st, KVQ_TENSOR_LEANKV_ALPHA_L))
        s = kvq_err_set(err, KVQ_E_CORRUPT, "tensors \"%s\" and \"%s\" come together",
                        KVQ_TENSOR_LEANKV_ALPHA_H, KVQ_TENSOR_LEANKV_ALPHA_L);
done:
    free(layers);
    return s;
}
