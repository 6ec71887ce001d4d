#!/usr/bin/env bash
# demo.sh — `make demo`: calibrates the default model with `kvq calibrate`, evaluates
# retrieval attention against full attention with `kvq eval`, decodes a sample with
# retrieval (`kvq run --artifact`), and prints a short report. Everything it writes goes
# to demo-out/ (gitignored); a second run reuses demo-out/model.kvq.work/ and skips the
# stages that are up to date.
#
# Environment: BUILD (build directory, default build), KVQ_TEST_MODEL (default
# ../shared/models/stories260K.gguf; when it is absent the demo makes a random,
# untrained model with examples/random_model and says so), KVQ_DEMO_THREADS (default:
# all CPUs), KVQ_DEMO_FORCE=1 (rerun every calibration stage).
set -euo pipefail
BUILD=${BUILD:-build}
KVQ="$BUILD/kvq"
OUT=demo-out
MODEL=${KVQ_TEST_MODEL:-../shared/models/stories260K.gguf}
THREADS=${KVQ_DEMO_THREADS:-$(nproc 2>/dev/null || echo 1)}
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
ART="$OUT/model.kvq"
t_start=$(date +%s)

if [ -f "$MODEL" ]; then
  LABEL="$MODEL"
  RANDOM_MODEL=0
else
  MODEL="$OUT/random-model.gguf"
  "$BUILD/examples/random_model" "$MODEL" 1 >/dev/null
  LABEL="$MODEL — a RANDOM, UNTRAINED model made by examples/random_model, because"
  LABEL="$LABEL ${KVQ_TEST_MODEL:-../shared/models/stories260K.gguf} is absent: the"
  LABEL="$LABEL numbers below exercise the pipeline but measure nothing"
  RANDOM_MODEL=1
  ART="$OUT/random-model.kvq"
  echo "demo: WARNING: no trained model found; using $MODEL (random weights, output is noise)" >&2
fi
# Printable text only (a random model emits arbitrary bytes).
printable() { if [ "$RANDOM_MODEL" = 1 ]; then LC_ALL=C tr -c '[:print:]\n' '?'; else cat; fi; }
# Stage banners and warnings of a command's stderr, the rest kept in a log.
banners() { tee "$1" | grep -E '^kvq: (==|   |warning)' >&2 || true; }

# ---- 1. calibrate ---------------------------------------------------------------------
# --positions rope: the budget is profiled with exact RoPE on the attended tokens, as the
# eval and the sample below use it (WRoPE's R_b costs accuracy at head dim 8).
echo "== demo 1/3: kvq calibrate --model $MODEL -o $ART --positions rope"
t0=$(date +%s)
"$KVQ" calibrate --model "$MODEL" -o "$ART" --positions rope --threads "$THREADS" \
  ${KVQ_DEMO_FORCE:+--force} >"$OUT/calibrate.txt" 2> >(banners "$OUT/calibrate.log")
t_cal=$(( $(date +%s) - t0 ))
cat "$OUT/calibrate.txt"

# The budget the profile chose (a fraction of the visible tokens), as a percentage.
budget=$("$KVQ" inspect "$ART" | awk '$1 == "budget.fraction" { printf "%g", 100 * $2 }')
budget=${budget:-6}
budgets="${budget}%"
[ "$budget" = 10 ] || budgets="$budgets,10%"

# ---- 2. evaluate -------------------------------------------------------------------------
# Held-out synthetic prompts (another seed than the calibration's), perplexity at every
# position with each selector, against full attention.
EVAL_CORPUS="passkey:1,kv-recall:2"
echo
echo "== demo 2/3: kvq eval --artifact $ART --corpus $EVAL_CORPUS --budgets $budgets"
t0=$(date +%s)
"$KVQ" eval --model "$MODEL" --artifact "$ART" --corpus "$EVAL_CORPUS" --seed 7 \
  --seq-len 512 --max-tokens 2048 --selectors full,oracle,codebook,quest,fier \
  --budgets "$budgets" --positions rope --threads "$THREADS" \
  >"$OUT/eval.txt" 2> >(banners "$OUT/eval.log")
t_eval=$(( $(date +%s) - t0 ))
cat "$OUT/eval.txt"

# ---- 3. sample -----------------------------------------------------------------------------
PROMPT="Once upon a time"
echo
echo "== demo 3/3: kvq run --artifact $ART --budget ${budget}% (greedy, 160 tokens)"
t0=$(date +%s)
"$KVQ" run --model "$MODEL" --prompt "$PROMPT" -n 160 --temp 0 -q >"$OUT/sample-full.txt"
"$KVQ" run --model "$MODEL" --artifact "$ART" --budget "${budget}%" --positions rope \
  --prompt "$PROMPT" -n 160 --temp 0 >"$OUT/sample-retrieval.txt" 2>"$OUT/sample.log"
t_run=$(( $(date +%s) - t0 ))
printable <"$OUT/sample-retrieval.txt"
echo
# How long the retrieval sample stays identical to the full-attention one.
if cmp -s "$OUT/sample-full.txt" "$OUT/sample-retrieval.txt"; then
  same="identical to the full-attention sample"
else
  at=$(cmp "$OUT/sample-full.txt" "$OUT/sample-retrieval.txt" 2>/dev/null |
       sed -n 's/.* byte \([0-9]*\),.*/\1/p' || true)
  same="the same as the full-attention sample for its first $(( ${at:-1} - 1 )) bytes"
fi

# ---- report ----------------------------------------------------------------------------------
{
  echo "kvq demo report ($(date -u '+%Y-%m-%d %H:%M UTC'), $THREADS threads)"
  echo "model        $LABEL"
  echo "artifact     $ART ($(wc -c <"$ART") bytes; work files in $ART.work/)"
  echo "time         calibrate ${t_cal} s, eval ${t_eval} s, samples ${t_run} s, total $(( $(date +%s) - t_start )) s"
  echo
  sed -n '3,$p' "$OUT/calibrate.txt"
  echo
  echo "retrieval vs full attention (kvq eval, exact RoPE on the attended tokens, $EVAL_CORPUS):"
  sed -n '/^selector/,$p' "$OUT/eval.txt"
  echo
  echo "greedy sample with retrieval at ${budget}% ($OUT/sample-retrieval.txt):"
  printable <"$OUT/sample-retrieval.txt" | fold -s -w 88 | sed 's/^/  /'
  echo "  ($same, $OUT/sample-full.txt)"
  grep '^kvq: retrieval:' "$OUT/sample.log" | sed 's/^kvq: //' | fold -s -w 86 | sed 's/^/  /' || true
} >"$REPORT"
echo
echo "== demo report ($REPORT)"
cat "$REPORT"
echo
echo "demo: outputs in $OUT/: $(basename "$ART"), $(basename "$ART").work/, calibrate.txt, eval.txt, sample-*.txt, report.txt, *.log"
