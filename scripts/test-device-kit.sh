#!/usr/bin/env bash
# test-device-kit.sh — the kit for a bare GPU machine, checked here without a GPU
# (`make test-device-kit`; .ci/run runs it after the CUDA build):
#
#   1. scripts/device-kit.sh builds the kit (.device-kit/, under 60 MiB)
#   2. every binary and library in the kit resolves every library it loads inside the kit,
#      except glibc and the CUDA toolkit, with the system's copies HIDDEN: in a private
#      mount namespace an empty tmpfs covers /usr/lib/x86_64-linux-gnu, /usr/local/lib and
#      the CUDA toolkit's library folder, and the loader sees only the kit and links to
#      the allowed system libraries (glibc, CUDA). Where no mount namespace can be made
#      (no privilege), the weaker check: ldd with the kit first on the path resolves every
#      library either in the kit or to an allowed one
#   3. scripts/device-run.sh on this machine (no GPU) runs to the end, exits 0, reports
#      every GPU case as "skip ...: no CUDA device ..." and writes at most 8 files
#   4. device-run.sh made to take its GPU branches here (DEVICE_RUN_ASSUME_GPU=1) fails
#      loudly: exit 1, every CUDA case a FAIL (the torch back end's step too, where torch
#      sees no GPU), no skip but the faiss peer it names
#      (about 2 minutes on 2 cores: it runs the CLI suites)
#
# Prints "ok NAME" / "FAIL NAME" lines and the closing "test-device-kit: N passed, N failed".
# KIT_REUSE=1 skips step 1 when .device-kit/MANIFEST exists (a kit just made).
set -uo pipefail
cd "$(dirname "$0")/.."
KIT=${KIT:-.device-kit}
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; shift; printf '  %s\n' "$@"; }
T=$(mktemp -d /tmp/test-device-kit.XXXXXX)
trap 'rm -rf "$T"' EXIT
# The libraries the machine brings (glibc, the CUDA toolkit): device-kit.sh's SYSTEM_RE.
SYSTEM_RE=$(sed -n "s/^SYSTEM_RE='\(.*\)'$/\1/p" scripts/device-kit.sh)
[ -n "$SYSTEM_RE" ] || { echo "test-device-kit: no SYSTEM_RE in scripts/device-kit.sh" >&2; exit 1; }

if [ "${KIT_REUSE:-0}" = 1 ] && [ -f "$KIT/MANIFEST" ]; then
  ok "device_kit_build (reused $KIT)"
elif bash scripts/device-kit.sh >"$T/kit.log" 2>&1; then
  ok "device_kit_build ($(tail -1 "$T/kit.log"))"
else
  bad device_kit_build "$(tail -5 "$T/kit.log")"
  echo "test-device-kit: $pass passed, $fail failed"; exit 1
fi
# the libraries as they travel: packed; unpacked here the way device-run.sh does
mkdir -p "$T/kit" && tar -C "$T/kit" -xJf "$KIT/lib.tar.xz" ||
  { bad device_kit_unpack "$KIT/lib.tar.xz"; echo "test-device-kit: $pass passed, $fail failed"; exit 1; }
KITLIB=$T/kit/lib
files=$(ls -d "$KIT"/bin/* "$KITLIB"/*)

# Every allowed system library any kit file loads, and the folders they live in.
mkdir -p "$T/sys"
dirs=""
for f in $files; do ldd "$f"; done | awk '/=>/ && $3 ~ /^\// { print $1, $3 }' | sort -u >"$T/all"
while read -r so path; do
  printf '%s\n' "$so" | grep -Eq "$SYSTEM_RE" || continue
  real=$(readlink -f "$path")
  printf '%s %s\n' "$so" "$real"
done <"$T/all" >"$T/allowed"
ldso=$(readlink -f /lib64/ld-linux-x86-64.so.2)
echo "ld-linux-x86-64.so.2 $ldso" >>"$T/allowed"
dirs=$(awk '{ print $2 }' "$T/allowed" | xargs -n1 dirname | sort -u)

# 2a. hidden system: bind each allowed folder elsewhere, cover the system folders
n=0; binds=""; : >"$T/links"
for d in $dirs; do
  mkdir -p "$T/real$n"; binds="$binds mount --bind $d $T/real$n;"
  awk -v d="$d" -v r="$T/real$n" '{ if (substr($2, 1, length(d) + 1) == d "/") print $1, r substr($2, length(d) + 1) }' \
    "$T/allowed" >>"$T/links"
  n=$((n + 1))
done
while read -r so target; do ln -sf "$target" "$T/sys/$so"; done <"$T/links"
# /usr/lib/x86_64-linux-gnu last: mount itself loads its libraries from there
hide=""
for d in /usr/local/lib $(printf '%s\n' $dirs | grep -vx /usr/lib/x86_64-linux-gnu) /usr/lib/x86_64-linux-gnu; do
  [ -d "$d" ] && hide="$hide mount -t tmpfs none $d || echo 'rc mount-failed';"
done
cat >"$T/inner.sh" <<EOF
$binds
$hide
for f in \$*; do echo "== \$f"; "$T/sys/ld-linux-x86-64.so.2" --inhibit-cache --library-path "$KITLIB:$T/sys" --list "\$f"; echo "rc \$?"; done
EOF
abs_files=$(for f in $files; do printf '%s/%s ' "$(cd "$(dirname "$f")" && pwd)" "$(basename "$f")"; done)
if unshare -m true 2>/dev/null; then
  unshare -m sh "$T/inner.sh" $abs_files >"$T/hidden.txt" 2>&1
  how="system libraries hidden (mount namespace)"
  out=$T/hidden.txt
else
  for f in $abs_files; do echo "== $f"; LD_LIBRARY_PATH="$KITLIB" ldd "$f"; echo "rc $?"; done >"$T/ldd.txt" 2>&1
  how="ldd with the kit first (no mount namespace here: the weaker check)"
  out=$T/ldd.txt
fi
# every resolution: in the kit, or an allowed system library; nothing not found; rc 0
bad_lines=$(awk -v kit="$KITLIB/" -v sys="$T/sys/" -v re="$SYSTEM_RE" '
  /^== / { f = $2; next }
  /^rc / { if ($2 != 0) print f ": loader exit " $2; next }
  /not found/ { print f ": " $1 " not found"; next }
  /=>/ { p = $3; if (index(p, kit) == 1) next; if (index(p, sys) == 1) next;
         if ($1 ~ re) next; print f ": " $1 " => " p " (outside the kit)" }' "$out")
nres=$(grep -c '=>' "$out")
if [ -z "$bad_lines" ] && [ "$nres" -gt 0 ]; then
  ok "device_kit_resolves ($(echo $files | wc -w) files, $nres resolutions, $how)"
else
  bad device_kit_resolves "$how" "${bad_lines:-no resolution listed}" "$(head -20 "$out")"
fi
# the kit holds the libraries the issue names (the build links each of them)
for l in libopenblas libzstd libcjson libcmocka libgomp liblapacke libgfortran; do
  if ls "$KITLIB/$l".so* >/dev/null 2>&1; then ok "device_kit_has_$l"
  else bad "device_kit_has_$l" "$(ls "$KITLIB" | tr '\n' ' ')"; fi
done

# 3. the device run on a machine without a GPU
mkdir -p "$T/out"
if OUT=$T/out bash scripts/device-run.sh >"$T/run.log" 2>&1; then rc=0; else rc=$?; fi
nfiles=$(find "$T/out" -type f | wc -l)
last=$(grep '^device-run: [0-9]* passed' "$T/out/summary.txt" | tail -1)
nskip_nodev=$(grep -c '^skip .*: no CUDA device' "$T/out/summary.txt")
nskip=$(grep -c '^skip ' "$T/out/summary.txt")
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  if [ $rc = 0 ] && [ "$(grep '^skip ' "$T/out/summary.txt" | grep -vc '^skip peer_faiss-gpu:')" = 0 ]; then
    ok "device_run_gpu ($last)"
  else bad device_run_gpu "exit $rc" "$(grep -E '^(FAIL|skip) ' "$T/out/summary.txt" | head)"; fi
elif [ $rc = 0 ] && [ -n "$last" ] && [ "$nskip" -gt 0 ] && [ "$nskip" = "$nskip_nodev" ] &&
     grep -q '^skip test_cuda_paths\.test_kmeans_fit: no CUDA device' "$T/out/summary.txt" &&
     grep -q '^skip suite: no CUDA device' "$T/out/summary.txt" &&
     grep -q '^skip bench_kmeans_cuda: no CUDA device' "$T/out/summary.txt" &&
     grep -q '^skip torch_backend_gpu: no CUDA device' "$T/out/summary.txt"; then
  ok "device_run_without_gpu ($last; every GPU case skipped: no CUDA device)"
else
  bad device_run_without_gpu "exit $rc, $nskip skips ($nskip_nodev for no device)" \
    "$(cat "$T/out/summary.txt" 2>/dev/null | head -30)" "$(tail -5 "$T/run.log")"
fi
# 4. the GPU branches taken on this machine (DEVICE_RUN_ASSUME_GPU=1, small shapes): the
#    script must fail loudly, case by case, and skip nothing but the faiss peer it names
mkdir -p "$T/out2"
if DEVICE_RUN_ASSUME_GPU=1 DEVICE_RUN_SMALL=1 OUT=$T/out2 bash scripts/device-run.sh >"$T/run2.log" 2>&1
then rc2=0; else rc2=$?; fi
s2=$T/out2/summary.txt
ncases=$(grep -c '^skip test_cuda_paths\.' "$T/out/summary.txt")
nloud=$(grep -c '^FAIL test_cuda_paths\..*: skipped on a GPU machine' "$s2")
# (the torch back end's step may skip only where torch itself is missing, saying so)
other_skips=$(grep '^skip ' "$s2" | grep -v '^skip peer_faiss-gpu:' | grep -v '^skip torch_backend_gpu: torch is not importable')
torch_loud=1
python3 -c 'import torch' 2>/dev/null && ! grep -q '^FAIL torch_backend_gpu' "$s2" && torch_loud=0
if [ "$rc2" = 1 ] && [ "$ncases" -gt 0 ] && [ "$nloud" = "$ncases" ] && [ -z "$other_skips" ] &&
   grep -q '^FAIL kvq_cuda_available' "$s2" && grep -q '^FAIL bench_kmeans_cuda' "$s2" &&
   grep -q '^FAIL bench_lloyd_batched:' "$s2" && grep -q '^FAIL gpu_branch: fit_device_cuda' "$s2" &&
   [ $torch_loud = 1 ]; then
  ok "device_run_fails_loudly_on_a_gpu ($(tail -1 "$s2"))"
else
  bad device_run_fails_loudly_on_a_gpu "exit $rc2, $nloud of $ncases CUDA cases failed loudly" \
    "${other_skips:-}" "$(head -40 "$s2" 2>/dev/null)"
fi

if [ "$nfiles" -ge 5 ] && [ "$nfiles" -le 8 ] && [ -z "$(find "$T/out" -mindepth 1 -type d)" ]; then
  ok "device_run_out_files ($nfiles files: $(cd "$T/out" && ls | tr '\n' ' '))"
else
  bad device_run_out_files "$nfiles files" "$(find "$T/out")"
fi
echo "test-device-kit: $pass passed, $fail failed"
[ $fail = 0 ]
