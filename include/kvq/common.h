/*
 * kvq/common.h — status codes, error detail, logging and progress callbacks.
 *
 * Every fallible public function returns a kvq_status and, when given a non-NULL
 * kvq_err *, fills it with the same status and a one-line message that names the
 * file (where there is one) and the problem. The library never prints, exits or
 * reads the environment: diagnostics reach the caller through kvq_callbacks.
 */
#ifndef KVQ_COMMON_H
#define KVQ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_VERSION_MAJOR 0
#define KVQ_VERSION_MINOR 1
#define KVQ_VERSION_PATCH 0
#define KVQ_VERSION_STRING "0.1.0"

/* Status codes, grouped by kind in blocks of 100. The numeric values are stable:
 * they appear in test expectations and in JSON output. */
typedef enum kvq_status {
    KVQ_OK = 0,

    /* I/O */
    KVQ_E_IO = 100,            /* read/write/mmap failed (errno text in message) */
    KVQ_E_NOT_FOUND = 101,     /* file, tensor or key does not exist */
    KVQ_E_EXISTS = 102,        /* output exists and overwriting was not allowed */

    /* corrupt or malformed input */
    KVQ_E_BAD_MAGIC = 200,     /* the file does not start with the expected magic */
    KVQ_E_TRUNCATED_HEADER = 201, /* the file ends inside its header */
    KVQ_E_TRUNCATED_DATA = 202,   /* the file ends before the data the header promises */
    KVQ_E_TOO_LARGE = 203,     /* a length or count is absurd or would overflow */
    KVQ_E_OUT_OF_BOUNDS = 204, /* an offset points outside the data section */
    KVQ_E_OVERLAP = 205,       /* two tensors' byte ranges overlap */
    KVQ_E_SHAPE_MISMATCH = 206,/* shape x element size != byte length, or wrong shape */
    KVQ_E_BAD_JSON = 207,      /* a JSON header does not parse or has the wrong structure */
    KVQ_E_BAD_UTF8 = 208,      /* a string is not valid UTF-8 */
    KVQ_E_CHECKSUM = 209,      /* a checksum does not match the content */
    KVQ_E_CORRUPT = 210,       /* any other structural error */

    /* versions */
    KVQ_E_VERSION = 300,       /* unknown or future format version */

    /* unsupported but well-formed */
    KVQ_E_UNSUPPORTED = 400,   /* dtype, tensor type, architecture, rope type ... */

    /* caller errors */
    KVQ_E_INVALID_ARG = 500,   /* a bad argument or parameter value */
    KVQ_E_MISMATCH = 501,      /* two inputs that must agree do not (model vs artifact) */
    KVQ_E_NUMERIC = 502,       /* NaN/Inf in data, or a numeric failure */

    /* resources */
    KVQ_E_NOMEM = 600,

    /* backends */
    KVQ_E_BACKEND = 700,       /* BLAS/LAPACK/CUDA call failed */
    KVQ_E_NO_DEVICE = 701,     /* a GPU was asked for and none is available */

    KVQ_E_CANCELLED = 800      /* a progress callback asked to stop */
} kvq_status;

/* A static, human-readable name for a status ("truncated header"). Never NULL. */
const char *kvq_status_str(kvq_status s);

/* Error detail. Zero-initialize or leave NULL where detail is not wanted. */
typedef struct kvq_err {
    kvq_status status;
    char msg[512]; /* "FILE: problem", NUL-terminated, one line */
} kvq_err;

/* Sets err (if non-NULL) and returns s. The message is printf-formatted; a control
 * character in it (a byte below 0x20, or 0x7f: one quoted from a damaged file) becomes
 * '?', so that the message stays one printable line. */
kvq_status kvq_err_set(kvq_err *err, kvq_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Log levels and callbacks. A NULL function pointer means "ignore". */
typedef enum kvq_log_level {
    KVQ_LOG_DEBUG = 0,
    KVQ_LOG_INFO = 1,
    KVQ_LOG_WARN = 2,
    KVQ_LOG_ERROR = 3
} kvq_log_level;

typedef void (*kvq_log_fn)(void *user, kvq_log_level level, const char *msg);
/* Progress: `done` of `total` units (total 0 = unknown) in stage `what`.
 * Return non-zero to ask the library to stop with KVQ_E_CANCELLED. */
typedef int (*kvq_progress_fn)(void *user, const char *what, uint64_t done, uint64_t total);

typedef struct kvq_callbacks {
    kvq_log_fn log;
    kvq_progress_fn progress;
    void *user;
} kvq_callbacks;

/* Logs through cb (which may be NULL). printf-formatted. */
void kvq_log(const kvq_callbacks *cb, kvq_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Reports progress; returns non-zero if the callback asked to stop. */
int kvq_progress(const kvq_callbacks *cb, const char *what, uint64_t done, uint64_t total);

/* Library version string, e.g. "0.1.0". */
const char *kvq_version(void);

/* 1 when this build has the CUDA backend and a device is present, else 0.
 * Exists in every build; a build without CUDA always answers 0. When it
 * answers 0 and `why` is non-NULL, *why points to a static one-line reason. */
int kvq_cuda_available(const char **why);

/* Run-time CPU features, for choosing SIMD paths. */
int kvq_cpu_has_avx2(void);     /* AVX2, FMA and F16C */
int kvq_cpu_has_avx512(void);   /* all of the above and AVX-512 F, BW, VL and DQ */

#ifdef __cplusplus
}
#endif
#endif /* KVQ_COMMON_H */
