#!/usr/bin/env bash
# Runs every kind of test and prints one summary line:
#   tests: N passed, N failed, N skipped
# - C unit tests (cmocka), build/tests/test_*: counts come from cmocka's own summary
# - CLI tests, tests/cli/*.sh: each script prints "ok NAME", "FAIL NAME" or "skip NAME: why"
# - Python checks, tests/py/test_*.py: exit 0 pass, 77 skip, anything else fail
# - fuzz corpus replays, build/fuzz/replay_*: one test each
# A skip is only for a missing optional input (a model file, a Python module, a GPU, an
# instruction set): a skip whose reason does not say so (e.g. "capture failed") is
# counted as a failure, so a crash of kvq can never pass as a skip. SKIP_OK is the list
# of reasons that say so. KVQ_TESTS_DIR (default tests) is for tests/cli/runner.sh.
set -u
BUILD=${BUILD:-build}
TESTS=${KVQ_TESTS_DIR:-tests}
SKIP_OK="not found|absent|not installed|make deps installs|no AVX2 on this CPU|no AVX-512 on this CPU|not an x86-64 build"
# the CUDA cases (tests/cuda/, a CUDA build): "no CUDA device ..." is kvq_cuda_available's
# reason (no driver, no device, or none this build has code for). With a GPU nothing skips.
SKIP_OK+="|no CUDA device"
PYTHON=${PYTHON:-python3}
export KVQ="$PWD/$BUILD/kvq" KVQ_BUILD="$PWD/$BUILD" PYTHON
# artifacts record provenance.date: one fixed date keeps two runs byte-identical
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
export KVQ_TEST_MODEL=${KVQ_TEST_MODEL:-../shared/models/stories260K.gguf}
# SmolLM2 Q4_1 for tests/test_smollm2.c (`make test` fetches it first, see Makefile)
export KVQ_SMOLLM2=${KVQ_SMOLLM2:-.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
pass=0; fail=0; skip=0; failed_names=()

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# skip_policy SUITE REASON...: each reason that is not a missing optional input fails.
skip_policy() {
  local suite=$1 r; shift
  for r in "$@"; do
    if ! printf '%s\n' "$r" | grep -Eq -- "$SKIP_OK"; then
      echo "FAIL $suite: a skip that is not a missing optional input: $r"
      fail=$((fail + 1)); failed_names+=("$suite")
    fi
  done
}
# reasons FILE SEDEXPR: the skip reasons in FILE, one per line, into the array R
reasons() { mapfile -t R < <(sed -n "$2" "$1"); }

for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  "$t" >"$tmp/out" 2>&1; rc=$?
  cat "$tmp/out"
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$tmp/out" | tail -1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$tmp/out" | tail -1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$tmp/out" | tail -1)
  pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0})); skip=$((skip + ${s:-0}))
  if [ $rc -ne 0 ] && [ -z "$f" ]; then fail=$((fail + 1)); fi   # crashed before its summary
  if [ $rc -ne 0 ]; then failed_names+=("$name"); fi
  reasons "$tmp/out" 's/^\[  SKIP    \] //p'; skip_policy "$name" ${R[@]+"${R[@]}"}
done

for t in "$TESTS"/cli/*.sh; do
  [ -f "$t" ] || continue
  bash "$t" >"$tmp/out" 2>&1; rc=$?
  cat "$tmp/out"
  p=$(grep -c '^ok ' "$tmp/out"); f=$(grep -c '^FAIL ' "$tmp/out"); s=$(grep -c '^skip ' "$tmp/out")
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then fail=$((fail + 1)); fi
  if [ $rc -ne 0 ] || [ "$f" -ne 0 ]; then failed_names+=("$(basename "$t")"); fi
  reasons "$tmp/out" 's/^skip [^:]*: //p'; skip_policy "$(basename "$t")" ${R[@]+"${R[@]}"}
done

for t in "$TESTS"/py/test_*.py; do
  [ -f "$t" ] || continue
  name=$(basename "$t")
  "$PYTHON" "$t" >"$tmp/out" 2>&1; rc=$?
  sed 's/^/  /' "$tmp/out"
  case $rc in
    0) echo "ok $name"; pass=$((pass + 1));;
    77) echo "skip $name: $(tail -1 "$tmp/out")"; skip=$((skip + 1))
        skip_policy "$name" "$(tail -1 "$tmp/out")";;
    *) echo "FAIL $name (exit $rc)"; fail=$((fail + 1)); failed_names+=("$name");;
  esac
done

for r in "$BUILD"/fuzz/replay_*; do
  [ -x "$r" ] || continue
  n=${r##*/replay_}
  if "$r" "$TESTS/fuzz/corpus/$n" >"$tmp/out" 2>&1; then
    echo "ok fuzz-replay $n ($(tail -1 "$tmp/out"))"; pass=$((pass + 1))
  else
    cat "$tmp/out"; echo "FAIL fuzz-replay $n"; fail=$((fail + 1)); failed_names+=("replay_$n")
  fi
done

[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "tests: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
