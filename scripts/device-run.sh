#!/usr/bin/env bash
# device-run.sh — run THERE, on the GPU machine, in the repository root, as one command of
# at most 10 minutes, with .device-kit/ (made here by scripts/device-kit.sh) carried along
# with the tree. docs/cuda.md gives the exact device call. Steps, each logged under $OUT:
#
#   env.txt       C library and compilers found, the kit's MANIFEST and its glibc check,
#                 nvidia-smi, the driver, python3 / torch, `kvq version`
#   cuda.txt      tests/cuda/test_cuda_paths, every case (k-means assign/update/seed/fit,
#                 the batched device Lloyd, the batched Cholesky, retrieval LUT/score/top-k)
#   suite.txt     the CPU suite's tests with device branches, on the kit's CUDA build:
#                 test_kmeans, test_moments, test_runtime, tests/cli/{fit,moments,runtime}.sh
#   torch.txt     the torch back end (kvq.torch_engine) on cuda against the C engine on the
#                 CPU, every codebook kind, and generate() at 6% on cuda: PASS / FAIL line
#                 (python/tests/test_torch_backend.py; skipped, saying so, without torch)
#   bench.txt     bench_kmeans (one 7B head: n 81920, d 128, K 4096, 25 iterations) on the
#                 GPU and on the CPU (16 threads, 3 iterations), the batched device Lloyd
#                 over a 7B-shaped fit (bench_lloyd_batched), then the peers on the same
#                 data (bench/kmeans_gpu_peers.py): PyTorch cdist + argmin + index_add (the
#                 A2ATS way), the cuBLAS SGEMM floor, flash-kmeans and faiss-gpu when present
#   summary.txt   one line per case: ok NAME / FAIL NAME: why / skip NAME: why, then
#                 device-run: N passed, N failed, N skipped
#
# On a GPU machine nothing may skip: a case that does not run on the GPU is a FAILURE
# (exit 1). On a machine without a GPU (here) every GPU case is reported as
# "skip NAME: no CUDA device (...)" with kvq's reason, the script runs to the end and
# exits 0 unless something else failed. OUT defaults to a new folder in /tmp.
# Knobs: KIT (.device-kit), DEVICE_RUN_LAYERS (32: the 7B-shaped batched fit's layers).
# For checking this script without a GPU only: DEVICE_RUN_ASSUME_GPU=1 takes the GPU
# branches anyway (every case must then fail loudly), DEVICE_RUN_SMALL=1 shrinks the
# benchmarks' shapes (n 4096, K 64, one layer), DEVICE_RUN_TORCH_CPU=1 runs the torch back
# end's step on the CPU where torch sees no GPU (its plumbing checked here).
set -uo pipefail
cd "$(dirname "$0")/.."
KIT=${KIT:-.device-kit}
OUT=${OUT:-$(mktemp -d /tmp/device-run.XXXXXX)}
mkdir -p "$OUT"
T=$(mktemp -d /tmp/device-run-tmp.XXXXXX)
trap 'rm -rf "$T"' EXIT
SUM=$OUT/summary.txt
: >"$SUM"
pass=0; fail=0; skip=0
START=$(date +%s)

res() { # res ok|FAIL|skip NAME [WHY]
  local r=$1 n=$2 why=${3:-}
  case $r in
    ok) pass=$((pass + 1)); echo "ok $n${why:+ ($why)}" ;;
    FAIL) fail=$((fail + 1)); echo "FAIL $n: $why" ;;
    skip) skip=$((skip + 1)); echo "skip $n: $why" ;;
  esac >>"$SUM"
  tail -1 "$SUM"
}
section() { echo; echo "== $* ($(($(date +%s) - START)) s)"; }
# every step's time limit is also cut to what is left of DEVICE_RUN_BUDGET (570 s: the
# device tool's command limit is 600), so the summary is always written
DEADLINE=$((START + ${DEVICE_RUN_BUDGET:-570}))
tmo() { local left=$((DEADLINE - $(date +%s))); [ "$left" -lt "$1" ] && echo $((left > 5 ? left : 5)) || echo "$1"; }
ver_ge() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$2" ]; }

# ---- env ------------------------------------------------------------------------------
exec 3>&1
exec >"$OUT/env.txt" 2>&1
section "the machine"
have_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
echo "glibc: ${have_glibc:-unknown}"
echo "cc: $(cc --version 2>/dev/null | head -1 || echo none)"
echo "nvcc: $(nvcc --version 2>/dev/null | tail -2 | head -1 || echo none)"
echo "python3: $(python3 --version 2>&1) at $(command -v python3)"
echo "uname: $(uname -srm); cores: $(nproc)"
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then gpu=1; fi
[ "${DEVICE_RUN_ASSUME_GPU:-0}" = 1 ] && gpu=1 && echo "DEVICE_RUN_ASSUME_GPU=1: the GPU branches run"
if [ "${DEVICE_RUN_SMALL:-0}" = 1 ]; then BN=4096 BK=64 BL=1; else BN=81920 BK=4096 BL=${DEVICE_RUN_LAYERS:-32}; fi
section "nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi || true
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm --format=csv || true
else
  echo "nvidia-smi: not found"
fi
python3 - <<'EOF' || true
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print("device", p.name, "sm_%d%d" % (p.major, p.minor), p.multi_processor_count, "SMs",
              round(p.total_memory / 2**30, 1), "GiB")
except Exception as e:  # the machine's torch is only information here
    print("torch: not importable:", e)
EOF

section "the kit ($KIT)"
kit_ok=1
if [ ! -f "$KIT/MANIFEST" ]; then
  kit_ok=0
  res FAIL kit "no $KIT/MANIFEST: run scripts/device-kit.sh on the development machine and carry $KIT (docs/cuda.md)"
else
  cat "$KIT/MANIFEST"
  # the libraries travel packed (lib.tar.xz: lib/); unpacked for this run only
  mkdir -p "$T/kit"
  if tar -C "$T/kit" -xJf "$KIT/lib.tar.xz" 2>/dev/null ||
     python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
       "$KIT/lib.tar.xz" "$T/kit"; then
    echo "unpacked $KIT/lib.tar.xz: $(ls "$T/kit/lib" | tr '\n' ' ')"
  else
    kit_ok=0
    res FAIL kit_unpack "could not unpack $KIT/lib.tar.xz (neither tar -J nor python3's tarfile)"
  fi
  # each carried file against this C library: a library that needs a newer one gives way
  # to the machine's own copy where it has one (libstdc++, libgcc_s); anything else fails
  unmet=""; need=0
  for e in $(sed -n 's/^glibc_per_file: //p' "$KIT/MANIFEST"); do
    f=${e%%=*}; v=${e#*=}
    [ -n "$v" ] || continue
    if [ -n "$have_glibc" ] && ver_ge "$have_glibc" "$v"; then
      ver_ge "$need" "$v" || need=$v
    elif [ -f "$T/kit/lib/$f" ] && ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$f "; then
      rm -f "$T/kit/lib/$f"; echo "kit: $f needs glibc $v; using the machine's $f"
    else
      unmet="$unmet $f (glibc $v)"
    fi
  done
  if [ -n "$unmet" ]; then
    kit_ok=0
    res FAIL kit_glibc "this machine's glibc ${have_glibc:-unknown} is older than the kit needs:$unmet; the Debian 12 libraries need 2.34 (scripts/device-kit.sh)"
  else
    res ok kit_glibc "the kit needs glibc $need, the machine has $have_glibc"
  fi
fi

# CUDA's own libraries come from the machine; where the binaries' RUNPATH
# (/usr/local/cuda/lib64) does not hold them, look for them in the toolkit and PyTorch's wheels.
CUDA_EXTRA=
if [ $kit_ok = 1 ]; then
  miss=$(LD_LIBRARY_PATH="$T/kit/lib" ldd "$KIT/bin/test_cuda_paths" 2>&1 | awk '/not found/ {print $1}')
  for so in $miss; do
    d=$(find /usr/local/cuda/lib64 /usr/local/cuda*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
          $(python3 -c 'import sys; print(" ".join(p for p in sys.path if "site-packages" in p))' 2>/dev/null) \
          -maxdepth 4 -name "$so" 2>/dev/null | head -1)
    [ -n "$d" ] && CUDA_EXTRA=${CUDA_EXTRA:+$CUDA_EXTRA:}$(dirname "$d")
  done
  echo "CUDA libraries from outside the RUNPATH: ${CUDA_EXTRA:-none needed}"
  LIBPATH="$T/kit/lib${CUDA_EXTRA:+:$CUDA_EXTRA}"
  for f in "$KIT"/bin/*; do
    nf=$(LD_LIBRARY_PATH="$LIBPATH" ldd "$f" 2>&1 | grep -c 'not found')
    if [ "$nf" != 0 ]; then
      kit_ok=0
      res FAIL "kit_ldd_$(basename "$f")" "$(LD_LIBRARY_PATH="$LIBPATH" ldd "$f" 2>&1 | grep 'not found' | tr -s ' \t' ' ' | head -3 | tr '\n' ';')"
    fi
  done
  [ $kit_ok = 1 ] && res ok kit_ldd "every binary resolves every library"
fi
# Wrappers: the kit's libraries (an older libstdc++ among them) for kvq's binaries only,
# never for python3 and its torch.
mkdir -p "$T/bin"
for f in "$KIT"/bin/*; do
  [ -f "$f" ] || continue
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
    "${LIBPATH:-}" "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" >"$T/bin/$(basename "$f")"
  chmod +x "$T/bin/$(basename "$f")"
done
B=$T/bin

# Python wheels the machine lacks: installed into a folder of this run only.
SITE=$T/site
for w in "$KIT"/whl/*.whl; do
  [ -f "$w" ] || continue
  mod=$(basename "$w" | cut -d- -f1)
  if python3 -c "import $mod" 2>/dev/null; then echo "python: $mod already there"; continue; fi
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$w"; then
    echo "python: installed $(basename "$w")"
  else
    echo "python: could not install $(basename "$w") for $(python3 --version 2>&1)"
  fi
done
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}

cuda_why=
if [ $kit_ok = 1 ]; then
  section "kvq version"
  "$B/kvq" version; rc=$?
  cuda_line=$("$B/kvq" version 2>&1 | grep '^cuda:' | head -1)
  echo "kvq version: exit $rc"
  if [ $gpu = 1 ]; then
    if printf '%s\n' "$cuda_line" | grep -q '^cuda: available'; then res ok kvq_cuda_available "$cuda_line"
    else res FAIL kvq_cuda_available "nvidia-smi lists a GPU but kvq says: $cuda_line"; fi
  fi
  cuda_why=${cuda_line#cuda: }
fi
case $cuda_why in *"no CUDA device"*) no_dev=$cuda_why ;; *) no_dev="no CUDA device (${cuda_why:-nvidia-smi lists none})" ;; esac
exec >&3

# gpu_case NAME: 0 when the GPU case should run; else records it and returns 1
gpu_case() {
  if [ $kit_ok != 1 ]; then res FAIL "$1" "not run: the kit cannot run here (env.txt)"; return 1; fi
  if [ $gpu != 1 ]; then res skip "$1" "$no_dev"; return 1; fi
  return 0
}

# ---- the CUDA test program -------------------------------------------------------------
# cmocka_cases NAME LOG: one summary line per case of a cmocka log
cmocka_cases() {
  local name=$1 log=$2 c why
  while read -r c; do res ok "$name.$c"; done < <(sed -n 's/^\[       OK \] //p' "$log")
  while read -r c; do res FAIL "$name.$c" "failed (see $(basename "$log"))"; done \
    < <(sed -n 's/^\[  FAILED  \] //p' "$log" | grep -v 'test(s)' | sort -u)
  # a skipped case: its reason is the [  SKIP    ] line before it
  while read -r c; do
    why=$(grep -B3 -F "[  SKIPPED ] $c" "$log" | sed -n 's/^\[  SKIP    \] //p' | head -1)
    if [ $gpu = 1 ]; then res FAIL "$name.$c" "skipped on a GPU machine: $why"
    elif printf '%s' "$why" | grep -q 'no CUDA device'; then res skip "$name.$c" "$why"
    else res FAIL "$name.$c" "skipped for another reason than a missing GPU: $why"; fi
  done < <(sed -n 's/^\[  SKIPPED \] //p' "$log" | grep -v 'test(s)' | sort -u)
}

exec >"$OUT/cuda.txt" 2>&1
section "tests/cuda/test_cuda_paths"
if [ $kit_ok = 1 ]; then
  timeout "$(tmo 240)" "$B/test_cuda_paths"; rc=$?
  echo "test_cuda_paths: exit $rc"
  exec >&3
  cmocka_cases test_cuda_paths "$OUT/cuda.txt"
  [ $rc = 0 ] || res FAIL test_cuda_paths "exit $rc$([ $rc = 124 ] && echo ' (timed out after 240 s)')"
else
  exec >&3
  res FAIL test_cuda_paths "not run: the kit cannot run here (env.txt)"
fi

# ---- the CPU suite's device branches ----------------------------------------------------
exec >"$OUT/suite.txt" 2>&1
section "the CPU suite's tests with device branches"
if gpu_case suite >&3; then
  export KVQ=$B/kvq KVQ_BUILD=$PWD/$KIT KVQ_TEST_MODEL=$PWD/$KIT/models/stories260K.gguf PYTHON=python3
  export SOURCE_DATE_EPOCH=1700000000
  for t in test_kmeans test_moments test_runtime; do
    section "$t"
    timeout "$(tmo 180)" "$B/$t" >"$T/$t.log" 2>&1; rc=$?
    cat "$T/$t.log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$T/$t.log" | tail -1)
    if [ $rc = 0 ]; then res ok "$t" "${p:-0} cases" >&3; else res FAIL "$t" "exit $rc (suite.txt)" >&3; fi
    grep -q '^\[  SKIPPED \] [a-z]' "$T/$t.log" && res FAIL "$t.skips" "a case skipped on a GPU machine (suite.txt)" >&3
  done
  for s in fit moments runtime; do
    section "tests/cli/$s.sh"
    timeout "$(tmo 240)" bash "tests/cli/$s.sh" >"$T/$s.log" 2>&1; rc=$?
    cat "$T/$s.log"
    nf=$(grep -c '^FAIL ' "$T/$s.log"); ns=$(grep -c '^skip ' "$T/$s.log"); np=$(grep -c '^ok ' "$T/$s.log")
    if [ $rc = 0 ] && [ "$nf" = 0 ] && [ "$ns" = 0 ]; then res ok "cli_$s" "$np checks" >&3
    else res FAIL "cli_$s" "exit $rc, $nf failed, $ns skipped: $(grep -E '^(FAIL|skip) ' "$T/$s.log" | head -3 | tr '\n' ';')" >&3; fi
  done
  # the device cases themselves must have taken the GPU branch
  for c in fit_device_cuda runtime_device_cuda_ran runtime_eval_device_cuda_ran "--device cuda"; do
    if grep -qx -- "ok $c" "$T"/fit.log "$T"/moments.log "$T"/runtime.log 2>/dev/null; then res ok "gpu_branch: $c" >&3
    else res FAIL "gpu_branch: $c" "the case did not pass on its GPU branch (suite.txt)" >&3; fi
  done
fi

# ---- the torch back end on the GPU ----------------------------------------------------------
# python/tests/test_torch_backend.py with the GPU: kvq.torch_engine on cuda against the C
# engine (the kit's libkvq.so, on the CPU) for every codebook kind, the same selected
# indices; generate() at 6% with the torch back end on cuda, shadowed step by step by the
# C engine, against the C engine back end's tokens. torch comes from the machine; the kit's
# libraries are loaded into python3 after torch, by path (never on its LD_LIBRARY_PATH).
exec >"$OUT/torch.txt" 2>&1
section "the torch back end on the GPU against the C engine (python/tests/test_torch_backend.py)"
if gpu_case torch_backend_gpu >&3; then
  tv=$(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -1)
  echo "torch: $tv"
  if ! python3 -c 'import torch, numpy' 2>/dev/null; then
    res skip torch_backend_gpu "torch is not importable here ($tv): the torch back end's GPU check did not run" >&3
  elif [ "${tv##* }" != True ] && [ "${DEVICE_RUN_TORCH_CPU:-0}" != 1 ]; then
    res FAIL torch_backend_gpu "torch sees no CUDA device ($tv) on a GPU machine" >&3
  else
    # libkvq.so's own libraries as this run resolves them (kit, CUDA), less the C and C++
    # runtimes the python process already has
    LIBPATH_T=${LIBPATH:-$T/kit/lib}
    pre=$(LD_LIBRARY_PATH="$LIBPATH_T" ldd "$KIT/bin/libkvq.so" | awk '/=> \// { print $3 }' |
          grep -Ev '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s)\.so')
    cat >"$T/torch_run.py" <<'EOF_PY'
import ctypes, os, runpy, sys
import torch  # noqa: F401  first: the C++ runtime and OpenMP torch brings
left = [p for p in sys.argv[3:] if p]
while left:
    nxt = []
    for p in left:
        try:
            ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            nxt.append(p)
    if len(nxt) == len(left):
        break
    left = nxt
print("torch_run: preloaded", len(sys.argv) - 3 - len(left), "libraries; not loaded:", left, flush=True)
os.environ["LD_LIBRARY_PATH"] = sys.argv[1]  # for the helper and kvq that the test runs
sys.argv = [sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
EOF_PY
    KVQ_LIB=$PWD/$KIT/bin/libkvq.so KVQ_BUILD=$PWD/$KIT/bin KVQ=$B/kvq \
      KVQ_TEST_MODEL=$PWD/$KIT/models/stories260K.gguf LDFLAGS="-Wl,-rpath-link,$LIBPATH_T" \
      PYTHONUNBUFFERED=1 timeout "$(tmo 240)" python3 "$T/torch_run.py" "$LIBPATH_T" \
      python/tests/test_torch_backend.py $pre >"$T/torch.log" 2>&1; rc=$?
    cat "$T/torch.log"
    nok=$(grep -c '^ok ' "$T/torch.log"); nf=$(grep -c '^FAIL ' "$T/torch.log")
    ncuda=$(grep -c '^ok   cuda: ' "$T/torch.log")
    if [ $rc = 0 ] && [ "$nf" = 0 ] && { [ "$ncuda" -ge 5 ] || [ "${DEVICE_RUN_TORCH_CPU:-0}" = 1 ]; }; then
      echo "torch back end on the GPU: PASS ($nok checks, $ncuda on cuda)"
      res ok torch_backend_gpu "$nok checks, $ncuda on cuda: the C engine's selections, generate() tokens" >&3
    else
      echo "torch back end on the GPU: FAIL (exit $rc, $nf failed, $ncuda cuda checks passed of 5)"
      res FAIL torch_backend_gpu "exit $rc$([ $rc = 124 ] && echo ' (timed out)'), $nf failed, $ncuda of 5 cuda checks passed: $(grep -E '^FAIL ' "$T/torch.log" | head -2 | tr '\n' ';') (torch.txt)" >&3
    fi
  fi
fi

# ---- benchmarks ------------------------------------------------------------------------------
exec >"$OUT/bench.txt" 2>&1
section "benchmarks"
if gpu_case bench_kmeans_cuda >&3; then
  KM=$T/km; mkdir -p "$KM"
  section "bench_kmeans --device cuda: n $BN d 128 K $BK, 25 iterations"
  timeout "$(tmo 240)" "$B/bench_kmeans" --case big --n $BN --d 128 --k $BK --iters 25 --device cuda \
    --dump "$KM" | tee "$T/gpu.txt"; rc=$?
  if [ $rc = 0 ] && grep -q '^  backend: cuda' "$T/gpu.txt"; then res ok bench_kmeans_cuda >&3
  else res FAIL bench_kmeans_cuda "exit $rc or not on the GPU (bench.txt)" >&3; fi
  section "bench_kmeans --device cpu: $(nproc) threads, 3 iterations"
  timeout "$(tmo 120)" "$B/bench_kmeans" --case big --n $BN --d 128 --k $BK --iters 3 --device cpu \
    --threads "$(nproc)"; rc=$?
  [ $rc = 0 ] && res ok bench_kmeans_cpu >&3 || res FAIL bench_kmeans_cpu "exit $rc (bench.txt)" >&3
  section "bench_lloyd_batched: one head (n $BN d 128 K $BK, 25 iterations)"
  timeout "$(tmo 60)" "$B/bench_lloyd_batched" --layers 1 --heads 1 --n $BN --d 128 --k $BK --iters 25
  rc=$?
  [ $rc = 0 ] && res ok bench_lloyd_batched_head >&3 || res FAIL bench_lloyd_batched_head "exit $rc (bench.txt)" >&3
  section "bench_lloyd_batched: a 7B-shaped fit, $BL layers x 8 heads"
  timeout "$(tmo 180)" "$B/bench_lloyd_batched" --layers $BL --heads 8 --n $BN --d 128 --k $BK --iters 25
  rc=$?
  [ $rc = 0 ] && res ok bench_lloyd_batched >&3 || res FAIL bench_lloyd_batched "exit $rc (bench.txt)" >&3
  section "peers on the same data and start (bench/kmeans_gpu_peers.py)"
  PYTHONUNBUFFERED=1 timeout "$(tmo 180)" python3 bench/kmeans_gpu_peers.py --dir "$KM" --case big --iters 25 \
    | tee "$T/peers.txt"; rc=$?
  [ $rc = 0 ] && res ok bench_peers >&3 || res FAIL bench_peers "exit $rc (bench.txt)" >&3
  for p in torch sgemm flash-kmeans faiss-gpu; do
    if grep -q "^skip $p" "$T/peers.txt"; then
      if [ "$p" = faiss-gpu ]; then res skip "peer_$p" "$(sed -n "s/^skip $p: //p" "$T/peers.txt") (not carried: docs/cuda.md)" >&3
      else res FAIL "peer_$p" "$(sed -n "s/^skip $p: //p" "$T/peers.txt")" >&3; fi
    fi
  done
else
  for c in bench_kmeans_cpu bench_lloyd_batched_head bench_lloyd_batched bench_peers; do
    res skip "$c" "$no_dev" >&3
  done
fi
exec >&3

echo "device-run: $pass passed, $fail failed, $skip skipped ($(($(date +%s) - START)) s)" | tee -a "$SUM"
echo "device-run: logs in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
[ $fail = 0 ]
