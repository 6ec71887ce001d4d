/* status.c — status names, error detail, logging and progress helpers. */
#include "kvq/common.h"

#include <stdarg.h>
#include <stdio.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

const char *kvq_status_str(kvq_status s)
{
    switch (s) {
    case KVQ_OK: return "ok";
    case KVQ_E_IO: return "I/O error";
    case KVQ_E_NOT_FOUND: return "not found";
    case KVQ_E_EXISTS: return "already exists";
    case KVQ_E_BAD_MAGIC: return "bad magic";
    case KVQ_E_TRUNCATED_HEADER: return "truncated header";
    case KVQ_E_TRUNCATED_DATA: return "truncated data";
    case KVQ_E_TOO_LARGE: return "size too large";
    case KVQ_E_OUT_OF_BOUNDS: return "offset out of bounds";
    case KVQ_E_OVERLAP: return "overlapping data";
    case KVQ_E_SHAPE_MISMATCH: return "shape mismatch";
    case KVQ_E_BAD_JSON: return "bad JSON";
    case KVQ_E_BAD_UTF8: return "bad UTF-8";
    case KVQ_E_CHECKSUM: return "checksum mismatch";
    case KVQ_E_CORRUPT: return "corrupt file";
    case KVQ_E_VERSION: return "unsupported version";
    case KVQ_E_UNSUPPORTED: return "unsupported";
    case KVQ_E_INVALID_ARG: return "invalid argument";
    case KVQ_E_MISMATCH: return "mismatch";
    case KVQ_E_NUMERIC: return "numeric error";
    case KVQ_E_NOMEM: return "out of memory";
    case KVQ_E_BACKEND: return "backend error";
    case KVQ_E_NO_DEVICE: return "no device";
    case KVQ_E_CANCELLED: return "cancelled";
    }
    return "unknown status";
}

kvq_status kvq_err_set(kvq_err *err, kvq_status s, const char *fmt, ...)
{
    if (err) {
        err->status = s;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        for (char *c = err->msg; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
    }
    return s;
}

void kvq_log(const kvq_callbacks *cb, kvq_log_level level, const char *fmt, ...)
{
    if (!cb || !cb->log)
        return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cb->log(cb->user, level, buf);
}

int kvq_progress(const kvq_callbacks *cb, const char *what, uint64_t done, uint64_t total)
{
    if (!cb || !cb->progress)
        return 0;
    return cb->progress(cb->user, what, done, total);
}

const char *kvq_version(void) { return KVQ_VERSION_STRING; }

#if defined(__x86_64__) && defined(__GNUC__)
/* F16C by cpuid: clang's __builtin_cpu_supports does not know "f16c". */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

int kvq_cpu_has_avx2(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
#else
    return 0;
#endif
}

int kvq_cpu_has_avx512(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return kvq_cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

#ifndef KVQ_HAVE_CUDA
int kvq_cuda_available(const char **why)
{
    if (why)
        *why = "this build has no CUDA backend (build with make CUDA=1)";
    return 0;
}
#endif
