#!/usr/bin/env bash
# demo.sh — `make demo`: calibrates a real model on real text with `kvq calibrate`,
# evaluates retrieval attention against full attention on other text with `kvq eval`,
# decodes a sample with retrieval (`kvq run --artifact`), prints a short report and
# writes the HTML report demo-out/report.html (`python -m kvq report`, docs/report.md).
# Everything it writes goes to demo-out/ (gitignored); a second run reuses
# demo-out/model.kvq.work/ and skips the stages that are up to date, and reuses
# demo-out/eval.json while the artifact and its arguments are unchanged.
#
# The model: SmolLM2-135M-Instruct Q4_1, fetched once by scripts/fetch-model.sh into
# .cache/models/ (KVQ_MODEL=/path/to/model.gguf or an HF directory uses another). The
# text: the reStructuredText sources of the Python 3.11 documentation (Debian
# python3.11-doc, which scripts/install-deps.sh installs): calibration on library/,
# evaluation on tutorial/ and howto/ (KVQ_DEMO_DOCS points at another copy).
#
# Environment: BUILD (build directory, default build), KVQ_MODEL, KVQ_DEMO_DOCS,
# KVQ_DEMO_THREADS (default: all CPUs), KVQ_DEMO_FORCE=1 (rerun every calibration stage).
set -euo pipefail
BUILD=${BUILD:-build}
KVQ="$BUILD/kvq"
OUT=demo-out
THREADS=${KVQ_DEMO_THREADS:-$(nproc 2>/dev/null || echo 1)}
DOCS=${KVQ_DEMO_DOCS:-/usr/share/doc/python3.11/html/_sources}
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
ART="$OUT/model.kvq"
t_start=$(date +%s)

if ! MODEL=$(bash scripts/fetch-model.sh); then
  echo "demo: no model (scripts/fetch-model.sh failed above; set KVQ_MODEL=/path/to/model.gguf)" >&2
  exit 1
fi
for d in library tutorial howto; do
  if [ ! -d "$DOCS/$d" ]; then
    echo "demo: $DOCS/$d not found: install the Debian package python3.11-doc" \
         "(scripts/install-deps.sh does) or set KVQ_DEMO_DOCS" >&2
    exit 1
  fi
done
LABEL="$MODEL"
CAL_CORPUS="dir:$DOCS/library"
EVAL_CORPUS="dir:$DOCS/tutorial,dir:$DOCS/howto"
printable() { cat; }
# Stage banners and warnings of a command's stderr, the rest kept in a log.
banners() { tee "$1" | grep -E '^kvq: (==|   |warning)' >&2 || true; }

# ---- 1. calibrate ---------------------------------------------------------------------
# Sized to take a few minutes on 2 cores: 4096 calibration tokens (8 sequences of 512,
# K = 64 centroids per head from the data), 512 held-out tokens, every profile (LeanKV,
# PATS, budget, tau: 3 s here). --positions rope: the budget is profiled with exact
# RoPE on the attended tokens, as the eval and the sample below use it.
echo "== demo 1/3: kvq calibrate --model $MODEL --corpus $CAL_CORPUS -o $ART"
t0=$(date +%s)
"$KVQ" calibrate --model "$MODEL" -o "$ART" --corpus "$CAL_CORPUS" --max-tokens 4096 \
  --seq-len 512 --heldout-tokens 512 --tolerance 0.1 --positions rope \
  --threads "$THREADS" ${KVQ_DEMO_FORCE:+--force} \
  >"$OUT/calibrate.txt" 2> >(banners "$OUT/calibrate.log")
t_cal=$(( $(date +%s) - t0 ))
cat "$OUT/calibrate.txt"

# The budget the profile chose (a fraction of the visible tokens), as a percentage.
budget=$("$KVQ" inspect "$ART" | awk '$1 == "budget.fraction" { printf "%g", 100 * $2 }')
budget=${budget:-6}
budgets="${budget}%"

# ---- 2. evaluate -------------------------------------------------------------------------
# Other text than the calibration's (the tutorial and the HOWTOs), perplexity at every
# position after each sequence's first half with each selector, against full attention.
echo
echo "== demo 2/3: kvq eval --artifact $ART --corpus $EVAL_CORPUS --budgets $budgets"
t0=$(date +%s)
"$KVQ" eval --model "$MODEL" --artifact "$ART" --corpus "$EVAL_CORPUS" --seed 7 \
  --seq-len 512 --max-tokens 512 --selectors full,oracle,codebook,quest \
  --budgets "$budgets" --positions rope --threads "$THREADS" \
  >"$OUT/eval.txt" 2> >(banners "$OUT/eval.log")
t_eval=$(( $(date +%s) - t0 ))
cat "$OUT/eval.txt"

# The same evaluation as JSON for the HTML report: every selector (FIER too) at three
# budgets, 2%, the profile's and 12%. The slowest step after calibrate, so it is reused
# while the artifact is older than it and its arguments are the same (eval.json.args).
jbudgets=$(printf '%s\n' 2 "$budget" 12 | sort -g -u | sed 's/$/%/' | paste -sd, -)
JARGS=(--model "$MODEL" --artifact "$ART" --corpus "$EVAL_CORPUS" --seed 7 --seq-len 512
       --max-tokens 512 --selectors full,oracle,codebook,fier,quest --budgets "$jbudgets"
       --positions rope)
echo
if [ -z "${KVQ_DEMO_FORCE:-}" ] && [ -s "$OUT/eval.json" ] && [ "$OUT/eval.json" -nt "$ART" ] &&
   [ "$(cat "$OUT/eval.json.args" 2>/dev/null)" = "${JARGS[*]}" ]; then
  echo "== demo 2/3: $OUT/eval.json is up to date (kvq eval --json --budgets $jbudgets)"
else
  echo "== demo 2/3: kvq eval --json --selectors full,oracle,codebook,fier,quest --budgets $jbudgets"
  rm -f "$OUT/eval.json.args"
  "$KVQ" eval "${JARGS[@]}" --threads "$THREADS" --json -q >"$OUT/eval.json.tmp"
  mv "$OUT/eval.json.tmp" "$OUT/eval.json"
  printf '%s' "${JARGS[*]}" >"$OUT/eval.json.args"
fi

# ---- 3. sample -----------------------------------------------------------------------------
# A plain prompt: kvq's tokenizer does not parse special tokens inside text, so SmolLM2's
# chat template (<|im_start|>user ...) is not used.
PROMPT="Here is a short explanation of Python lists:"
NGEN=96
echo
echo "== demo 3/3: kvq run --artifact $ART --budget ${budget}% (greedy, $NGEN tokens)"
t0=$(date +%s)
"$KVQ" run --model "$MODEL" --prompt "$PROMPT" -n $NGEN --temp 0 -q --threads "$THREADS" \
  >"$OUT/sample-full.txt"
"$KVQ" run --model "$MODEL" --artifact "$ART" --budget "${budget}%" --positions rope \
  --prompt "$PROMPT" -n $NGEN --temp 0 --threads "$THREADS" \
  >"$OUT/sample-retrieval.txt" 2>"$OUT/sample.log"
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
  echo "calibrated on $CAL_CORPUS"
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

# ---- the HTML report ---------------------------------------------------------------------------
# Figures and tables from the work directory, the artifact and eval.json; --check-text
# fails the demo if report.txt and the page disagree on a number they share.
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" KVQ_BUILD="$BUILD" python3 -m kvq report \
  --work "$ART.work" --artifact "$ART" --eval "$OUT/eval.json" -o "$OUT/report.html" --force \
  --check-text "$REPORT" -q
echo
echo "demo: outputs in $OUT/: $(basename "$ART"), $(basename "$ART").work/, calibrate.txt, eval.txt, eval.json, sample-*.txt, report.txt, report.html, *.log"
echo "demo: HTML report $OUT/report.html"
