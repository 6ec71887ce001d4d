#!/usr/bin/env bash
# prefetch.sh — the SIMD kernels that read scattered rows keep their software prefetches
# in the built objects. A prefetch changes no result, so no output test can see one go
# missing; GCC 12 once deleted every prefetch of kvq_rk_mix_avx512 (a helper holding
# only __builtin_prefetch was judged free of side effects and its calls dropped as
# dead), and the weighted sum over the kept value rows of the 128K decode step took
# twice as long (docs/BENCHMARKS.md, "The two-stage step against its floor"). Reads the
# disassembly of build/obj/runtime/kernels/{kernels,resid}_avx512.o and kernels_avx2.o (objdump,
# binutils).
# Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

OBJ=$KVQ_BUILD/obj/runtime/kernels
case $(uname -m) in
  x86_64) ;;
  *) skip prefetch_kernels "not an x86-64 build"; cli_done; exit $?;;
esac
if ! command -v objdump >/dev/null 2>&1; then
  skip prefetch_kernels "objdump not installed"; cli_done; exit $?
fi

# counts FILE FUNC: "T0 T1" = the prefetcht0 and prefetcht1 instructions of FUNC in FILE
counts() {
  objdump -d --no-show-raw-insn "$1" 2>/dev/null | awk -v f="<$2>:" '
    /^[0-9a-f]+ <.*>:$/ { on = ($2 == f) }
    on && /prefetcht0/ { t0++ }
    on && /prefetcht1/ { t1++ }
    END { printf "%d %d\n", t0, t1 }'
}

# check FILE FUNC MIN_T0 MIN_T1
check() {
  local obj=$OBJ/$1.o name="prefetch_$2" c t0 t1
  if [ ! -f "$obj" ]; then fail "$name" "$obj: not built"; return; fi
  c=$(counts "$obj" "$2"); t0=${c% *}; t1=${c#* }
  if [ "$t0" -ge "$3" ] && [ "$t1" -ge "$4" ]; then
    ok "$name"
  else
    fail "$name" "$obj: $2 has $t0 prefetcht0 and $t1 prefetcht1, expected at least $3 and $4"
  fi
}

# the logits (the rerank's candidates), the weighted sum (the kept value rows), the fused
# attention and the residual stage's sign rows: near (L1) and far (L2) prefetches
check kernels_avx512 kvq_rk_logits_avx512 1 1
check kernels_avx512 kvq_rk_mix_avx512 1 1
check kernels_avx512 kvq_rk_attend_avx512 1 0
check kernels_avx512 kvq_rk_resid_scores_avx512 1 0
check resid_avx512 kvq_rk_resid_scores_max_avx512 1 0
check kernels_avx2 kvq_rk_logits_avx2 1 1
check kernels_avx2 kvq_rk_mix_avx2 0 1
check kernels_avx2 kvq_rk_attend_avx2 1 0
cli_done
