#!/usr/bin/env bash
# bench_load.sh — `kvq run` decode (or prefill) rate with --threads 2 against --threads 1
# while CPU hogs run beside it (a loaded machine: other builds, other jobs), in the same
# minutes.
#
# Rounds alternate 1 and 2 threads so both see the same load; each prints the decode
# tokens/s `kvq run` reports (with --prefill: the prompt's tokens / its time); the
# summary is the median per thread count and the ratio 2 threads / 1 thread (below 1:
# more threads are slower). The hogs are busy shell loops started here and killed on
# exit (by their process ids).
#
#   bash bench/bench_load.sh [--model M] [--hogs N] [--rounds N] [-n TOKENS] [--f32]
#                            [--prefill [CHARS]] [--kvq CMD]...
#     --model   default: scripts/fetch-model.sh's SmolLM2-135M-Instruct Q4_1
#     --f32     run on an F32 copy of the model (written once by build/bench/bench_model
#               --write-f32 into /tmp; weights are then used in place)
#     --hogs    busy loops beside it (default 1), --rounds per thread count (default 3),
#     -n        tokens generated per run (default 32; 1 with --prefill)
#     --prefill time the prompt instead: the first CHARS characters (default 2300, about
#               512 SmolLM2 tokens) of the Python tutorial's classes.rst.txt (Debian
#               python3.11-doc), prefilled in chunks of 256 tokens
#     --kvq     the kvq command to time (default $BUILD/kvq); given several times, every
#               round runs each of them with 1 and 2 threads, one after the other, and
#               each gets its own summary (to compare builds in the same minutes). CMD
#               is split at spaces: `--kvq "env LD_LIBRARY_PATH=DIR /tmp/kvq-old"`
# Extra environment for kvq (e.g. OMP_WAIT_POLICY=active to see the old behaviour) is
# passed through as it is.
set -u
BUILD=${BUILD:-build}
model= hogs=1 rounds=3 n= f32=0 prefill=0 cmds=()
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift;; --hogs) hogs=$2; shift;; --rounds) rounds=$2; shift;;
    -n) n=$2; shift;; --f32) f32=1;; --kvq) cmds+=("$2"); shift;;
    --prefill) prefill=2300; case ${2:-} in [0-9]*) prefill=$2; shift;; esac;;
    *) echo "usage: bench_load.sh [--model M] [--hogs N] [--rounds N] [-n TOKENS] [--f32]" \
            "[--prefill [CHARS]] [--kvq CMD]..." >&2; exit 2;;
  esac; shift
done
prompt="The history of" ntok=
if [ $prefill -gt 0 ]; then
  text=/usr/share/doc/python3.11/html/_sources/tutorial/classes.rst.txt
  [ -r $text ] || { echo "bench_load.sh: $text: missing (Debian python3.11-doc)" >&2; exit 1; }
  prompt=$(head -c "$prefill" $text)
  n=${n:-1}
fi
n=${n:-32}
[ ${#cmds[@]} -gt 0 ] || cmds=("$BUILD/kvq")
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
  for ((c = 0; c < ${#cmds[@]}; c++)); do
  for t in 1 2; do
    # shellcheck disable=SC2086
    log=$(${cmds[$c]} run --model "$model" -n "$n" --temp 0 --threads $t --prompt "$prompt" \
          2>&1 >/dev/null)
    if [ $prefill -gt 0 ]; then
      x=$(printf '%s\n' "$log" | sed -n 's/.*prompt: \([0-9]*\) tokens in \([0-9.]*\) s;.*/\1 \2/p' |
          awk '$2 > 0 { printf "%.1f", $1 / $2 }')
      ntok=$(printf '%s\n' "$log" | sed -n 's/.*prompt: \([0-9]*\) tokens in.*/\1/p')
    else
      x=$(printf '%s\n' "$log" | sed -n 's/.*generated .* (\([0-9.]*\) tokens\/s).*/\1/p')
    fi
    label=; [ ${#cmds[@]} -gt 1 ] && label=" [${cmds[$c]}]"
    echo "round $r threads $t$label: ${x:-?} tokens/s${ntok:+ ($ntok prompt tokens)}" \
         "(load $(cut -d' ' -f1 /proc/loadavg))"
    rates[$c,$t]="${rates[$c,$t]:-} ${x:-0}"
  done
  done
done
med() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
what=decode; [ $prefill -gt 0 ] && what=prefill
for ((c = 0; c < ${#cmds[@]}; c++)); do
  m1=$(med "${rates[$c,1]}"); m2=$(med "${rates[$c,2]}")
  echo "$what, ${cmds[$c]}, model $model, $hogs hog(s), median of $rounds: 1 thread $m1 tokens/s," \
       "2 threads $m2 tokens/s, ratio 2/1 $(awk -v a="$m2" -v b="$m1" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')"
done
