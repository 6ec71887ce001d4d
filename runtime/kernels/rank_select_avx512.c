/*
 * rank_select_avx512.c — kvq_rt_rank_select with AVX-512 (runtime/kernels/rk.h):
 * sixteen candidates at a time, those ranked below k compressed into sel in order. The
 * same list as the scalar loop (tests/test_mass.c).
 */
#include <immintrin.h>

#include "runtime/kernels/rk.h"

int64_t kvq_rt_rank_select_avx512(const int32_t *rank, int64_t n, int32_t k, int32_t *sel)
{
    const __m512i kv = _mm512_set1_epi32(k), step = _mm512_set1_epi32(16);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t c = 0;
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 live = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
        const __m512i r = _mm512_maskz_loadu_epi32(live, rank + j);
        const __mmask16 in = _mm512_mask_cmplt_epi32_mask(live, r, kv);
        /* compressed in a register, then a masked store of that many: a compress to
         * memory is microcoded on some CPUs (Zen 4: several times slower) */
        const int cnt = __builtin_popcount((unsigned)in);
        _mm512_mask_storeu_epi32(sel + c, (__mmask16)((1u << cnt) - 1),
                                 _mm512_maskz_compress_epi32(in, idx));
        c += cnt;
        idx = _mm512_add_epi32(idx, step);
    }
    return c;
}
