#!/usr/bin/env bash
# bench_profile.sh — `kvq profile` against the capture of the same held-out tokens, in
# one run, on the same thread count (issue 13's target: profile <= 0.5x the capture).
#
#   bench/bench_profile.sh [ARTIFACT] [THREADS]
#   KVQ=/other/build/kvq KVQ_BENCH_DIR=/tmp/other bench/bench_profile.sh ...   (another
#   binary, e.g. a before/after pair in one command; each in its own directory)
#
# ARTIFACT: a fit of SmolLM2 (default: the work directory of `kvq calibrate` with its
# defaults, /tmp/kvq-bench-profile/smol.kvq.work/fit.kvq, made first when missing:
# minutes). The held-out set is the calibrate default: 2048 tokens in sequences of 512
# of natural text. Prints both wall times, their ratio, the per-(layer, KV head,
# sequence) cost of the LeanKV/PATS grid, and that cost times a 7B shape.
set -euo pipefail
cd "$(dirname "$0")/.."
KVQ=${KVQ:-./build/kvq}
MODEL=${KVQ_SMOLLM2:-.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
TEXT=${KVQ_BENCH_TEXT:-/usr/share/doc/python3.11/html/_sources}
W=${KVQ_BENCH_DIR:-/tmp/kvq-bench-profile}
THREADS=${2:-2}
mkdir -p "$W"
ART=${1:-$W/smol.kvq.work/fit.kvq}
if [ ! -f "$ART" ]; then
  $KVQ calibrate --model "$MODEL" --corpus "$TEXT/library" -o "$W/smol.kvq" --threads "$THREADS" \
    --no-profile -q
fi
now() { date +%s.%N; }
t0=$(now)
$KVQ capture --model "$MODEL" --corpus "$TEXT/tutorial" --seq-len 512 --max-tokens 2048 \
  --threads "$THREADS" -o "$W/heldout" --force -q
t1=$(now)
$KVQ profile --capture "$W/heldout" --artifact "$ART" -o "$W/profile.kvq" --force \
  --knobs leankv,pats --threads "$THREADS" -q > "$W/grid.txt" 2>/dev/null || true
t2=$(now)
$KVQ profile --capture "$W/heldout" --artifact "$ART" -o "$W/profile.kvq" --force \
  --threads "$THREADS" -q > "$W/all.txt" 2>/dev/null || true
t3=$(now)
python3 - "$t0" "$t1" "$t2" "$t3" <<'PY'
import sys
t0, t1, t2, t3 = map(float, sys.argv[1:])
cap, grid, full = t1 - t0, t2 - t1, t3 - t2
jobs = 30 * 3 * 4   # SmolLM2: 30 layers x 3 KV heads x 4 sequences of 512
print(f"capture of the held-out tokens   {cap:8.2f} s")
print(f"profile leankv+pats              {grid:8.2f} s  ({grid / cap:.2f}x the capture)")
print(f"profile, every knob              {full:8.2f} s  ({full / cap:.2f}x the capture)")
per = grid / jobs
# (the grid's wall time over every job: with the job sample, most settings run on a third
# of them, so this is the cost per job of the whole design, not of one job run alone)
print(f"leankv+pats per (layer, KV head, sequence of 512, gs 3, d 64): {per * 1e3:.1f} ms")
# 7B shape of issue 13 (32 layers x 8 KV heads, gs 4, d 128) on one held-out sequence
# of 8192 tokens: the LeanKV sums dominate and grow as n^2 x gs per job
scale = (8192 / 512) ** 2 * (4 / 3)
print(f"7B shape, one 8K sequence: {per * scale:.1f} s per (layer, KV head) x 256 = "
      f"{per * scale * 256 / 60:.0f} min on this thread count")
PY
