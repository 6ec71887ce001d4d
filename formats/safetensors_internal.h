/* safetensors_internal.h — what the safetensors reader (safetensors.c) and writer
 * (safetensors_write.c) share. */
#ifndef KVQ_FORMATS_SAFETENSORS_INTERNAL_H
#define KVQ_FORMATS_SAFETENSORS_INTERNAL_H

#include <stdint.h>

#include "kvq/safetensors.h"
#include "kvq/util.h"

/* Largest integer every JSON reader represents exactly (doubles): dims and offsets
 * must stay below it, so the writer never emits one the reader would refuse. */
#define ST_JSON_INT_LIMIT (UINT64_C(1) << 53)

static inline int dtype_ok(kvq_dtype t) { return (unsigned)t < (unsigned)KVQ_DT_COUNT; }

/* Bytes of a tensor: product of dims times the element size. A zero dim gives 0
 * whatever the others are. Returns 0 on overflow of size_t. */
static inline int tensor_nbytes(kvq_dtype t, int ndim, const int64_t *shape, size_t *out)
{
    size_t n = kvq_dtype_size(t);
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) {
            *out = 0;
            return 1;
        }
    for (int i = 0; i < ndim; i++)
        if (!kvq_size_mul(n, (size_t)shape[i], &n))
            return 0;
    *out = n;
    return 1;
}

#endif
