#!/usr/bin/env bash
# bench_load.sh — `kvq run` decode rate with --threads 2 against --threads 1 while CPU
# hogs run beside it (a loaded machine: other builds, other jobs), in the same minutes.
#
# Rounds alternate 1 and 2 threads so both see the same load; each prints the decode
# tokens/s `kvq run` reports; the summary is the median per thread count and the ratio
# 2 threads / 1 thread (below 1: more threads are slower). The hogs are busy shell
# loops started here and killed on exit (by their process ids).
#
#   bash bench/bench_load.sh [--model M] [--hogs N] [--rounds N] [-n TOKENS] [--f32]
#     --model   default: scripts/fetch-model.sh's SmolLM2-135M-Instruct Q4_1
#     --f32     run on an F32 copy of the model (written once by build/bench/bench_model
#               --write-f32 into /tmp; decode then goes through OpenBLAS sgemv)
#     --hogs    busy loops beside it (default 1), --rounds per thread count (default 3),
#     -n        tokens generated per run (default 32)
# Extra environment for kvq (e.g. OMP_WAIT_POLICY=active to see the old behaviour) is
# passed through as it is.
set -u
BUILD=${BUILD:-build}
model= hogs=1 rounds=3 n=32 f32=0
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift;; --hogs) hogs=$2; shift;; --rounds) rounds=$2; shift;;
    -n) n=$2; shift;; --f32) f32=1;;
    *) echo "usage: bench_load.sh [--model M] [--hogs N] [--rounds N] [-n TOKENS] [--f32]" >&2; exit 2;;
  esac; shift
done
[ -n "$model" ] || model=$(bash scripts/fetch-model.sh) || exit 1
if [ $f32 = 1 ]; then
  f=/tmp/kvq-bench-load-$(basename "$model" .gguf)-f32.gguf
  [ -s "$f" ] || "$BUILD/bench/bench_model" --model "$model" --write-f32 "$f" || exit 1
  model=$f
fi
pids=()
cleanup() { local p; for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT
for ((h = 0; h < hogs; h++)); do sh -c 'while :; do :; done' & pids+=($!); done
sleep 1
declare -A rates
for ((r = 0; r < rounds; r++)); do
  for t in 1 2; do
    x=$("$BUILD/kvq" run --model "$model" -n "$n" --temp 0 --threads $t --prompt "The history of" \
          2>&1 >/dev/null | sed -n 's/.*generated .* (\([0-9.]*\) tokens\/s).*/\1/p')
    echo "round $r threads $t: ${x:-?} tokens/s (load $(cut -d' ' -f1 /proc/loadavg))"
    rates[$t]="${rates[$t]:-} ${x:-0}"
  done
done
med() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m1=$(med "${rates[1]}"); m2=$(med "${rates[2]}")
echo "model $model, $hogs hog(s), median of $rounds: 1 thread $m1 tokens/s, 2 threads $m2 tokens/s," \
     "ratio 2/1 $(awk -v a="$m2" -v b="$m1" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')"
