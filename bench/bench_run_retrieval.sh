#!/usr/bin/env bash
# bench_run_retrieval.sh — decode with retrieval attention (`kvq run --artifact`) against
# kvq's full-attention decode at SmolLM2's longest context, in one run: a prompt of about
# 8K tokens (the Python tutorial and HOWTOs, Debian python3.11-doc), then 128 greedy
# tokens. Rounds alternate full and retrieval (the first of the pair swaps every round)
# so both see the same load; each prints the decode tokens/s `kvq run` reports; the
# summary is the best per configuration, the ratio retrieval / full (above 1: retrieval
# decodes faster) and the load average before and after (the machine may be shared).
#
#   bash bench/bench_run_retrieval.sh [--model M] [--artifact A] [--threads T]
#                                     [--rounds N] [--chars C] [-n TOKENS] [--runtime-full]
#     --model     default: scripts/fetch-model.sh's SmolLM2-135M-Instruct Q4_1
#     --artifact  the model's .kvq; default demo-out/model.kvq, made first (as `make demo`
#                 makes it: kvq calibrate, 4096 tokens of library/) when it is absent
#     --threads   default 2; --rounds default 3; -n default 128
#     --chars     prompt characters (default 33500: 7,996 SmolLM2 tokens, so the prompt
#                 and the 128 generated tokens stay within the 8,192 trained context)
#     --runtime-full  a third configuration, the retrieval runtime attending every token
#                 (`--artifact A --selector full`: its f16 cache and attention kernels,
#                 nothing selected): what retrieval gains by selecting alone, apart from
#                 the cache format and kernels. kvq run without --artifact attends an f32
#                 cache with two OpenBLAS sgemm calls a query head, which at 8K spend most
#                 of a decode step packing the keys (docs/runtime.md, "Decode at 8K").
# One round is two 8K prefills and two decodes (three with --runtime-full): on the shared
# 2-core machine at a load average of 14-29, 7-10 minutes a prefill (docs/runtime.md).
# The budget is the artifact's profile's (kvq run's default with --artifact).
set -euo pipefail
BUILD=${BUILD:-build}
KVQ="$BUILD/kvq"
model='' art=demo-out/model.kvq threads=2 rounds=3 chars=33500 n=128 rtfull=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --artifact) art=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --chars) chars=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    --runtime-full) rtfull=1; shift ;;
    *) echo "usage: bench_run_retrieval.sh [--model M] [--artifact A] [--threads T] [--rounds N] [--chars C] [-n TOKENS] [--runtime-full]" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || model=$(bash scripts/fetch-model.sh)
DOCS=${KVQ_DEMO_DOCS:-/usr/share/doc/python3.11/html/_sources}
[ -d "$DOCS/tutorial" ] || { echo "bench_run_retrieval: $DOCS/tutorial not found (Debian python3.11-doc)" >&2; exit 1; }
if [ ! -f "$art" ]; then
  echo "bench_run_retrieval: making $art (kvq calibrate, as make demo does)" >&2
  mkdir -p "$(dirname "$art")"
  "$KVQ" calibrate --model "$model" -o "$art" --corpus "dir:$DOCS/library" --max-tokens 4096 \
    --seq-len 512 --heldout-tokens 512 --tolerance 0.1 --positions rope --threads "$threads" -q
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Through a file: under pipefail, `cat | head -c` fails when head closes the pipe early.
cat "$DOCS"/tutorial/*.rst.txt "$DOCS"/howto/*.rst.txt | tr -d '\000-\010\013-\037' >"$tmp/all.txt"
head -c "$chars" "$tmp/all.txt" >"$tmp/prompt.txt"

# One run: prints "PROMPT_TOKENS GENERATED DECODE_TOKS_PER_S" from kvq run's timing line.
one() {
  "$KVQ" run --model "$model" --prompt "$(cat "$tmp/prompt.txt")" -n "$n" --temp 0 \
    --threads "$threads" "$@" >"$tmp/out" 2>"$tmp/err" ||
    { echo "bench_run_retrieval: kvq run $* failed:" >&2; cat "$tmp/err" >&2; exit 1; }
  sed -n 's/.*prompt: \([0-9]*\) tokens in .* s; generated \([0-9]*\) tokens in .* (\(.*\) tokens\/s).*/\1 \2 \3/p' "$tmp/err"
}
best_full=0 best_ret=0 best_rt=0 info=
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then
    read -r np gf full < <(one)
    read -r _ gr ret < <(one --artifact "$art")
    info=$(grep "^kvq: retrieval:" "$tmp/err" | head -1 || true)
  else
    read -r _ gr ret < <(one --artifact "$art")
    info=$(grep "^kvq: retrieval:" "$tmp/err" | head -1 || true)
    read -r np gf full < <(one)
  fi
  if [ -z "$full" ] || [ -z "$ret" ]; then
    echo "bench_run_retrieval: no timing line from kvq run (round $r)" >&2
    exit 1
  fi
  line="round $r: prompt $np tokens; full attention $full tok/s ($gf generated), retrieval $ret tok/s ($gr generated)"
  if [ "$rtfull" = 1 ]; then
    read -r _ gt rt < <(one --artifact "$art" --selector full)
    [ -n "$rt" ] || { echo "bench_run_retrieval: no timing line from kvq run (round $r)" >&2; exit 1; }
    line="$line, runtime full $rt tok/s ($gt generated)"
    best_rt=$(awk -v a="$best_rt" -v b="$rt" 'BEGIN { print (b > a ? b : a) }')
  fi
  echo "$line"
  best_full=$(awk -v a="$best_full" -v b="$full" 'BEGIN { print (b > a ? b : a) }')
  best_ret=$(awk -v a="$best_ret" -v b="$ret" 'BEGIN { print (b > a ? b : a) }')
done
echo "${info#kvq: }"
echo "load average (1, 5, 15 min): $load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after"
awk -v f="$best_full" -v r="$best_ret" -v t="$threads" -v k="$rounds" -v p="$np" -v n="$n" 'BEGIN {
  printf "%d threads, %d-token prompt then %d tokens, best of %d: full attention %.1f tok/s (%.1f ms a token), retrieval %.1f tok/s (%.1f ms): retrieval / full %.2fx\n", t, p, n, k, f, 1000 / f, r, 1000 / r, r / f }'
[ "$rtfull" = 1 ] && awk -v r="$best_ret" -v t="$best_rt" 'BEGIN {
  printf "runtime full (f16 cache, the same kernels, nothing selected) %.1f tok/s (%.1f ms): retrieval / runtime full %.2fx\n", t, 1000 / t, r / t }'
exit 0
