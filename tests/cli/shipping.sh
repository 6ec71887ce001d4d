#!/usr/bin/env bash
# shipping.sh — an artifact bound to its weights: the weight fingerprint of `kvq inspect
# MODEL` against scripts/fingerprint.py (numpy + gguf, independent of kvq); two random
# models of one shape and SmolLM2 vs a copy with one weight changed get different
# fingerprints; `kvq run` / `kvq eval` refuse an artifact made for the other checkpoint
# (both fingerprints named) and accept it with --accept-model-mismatch and a warning;
# no metadata value of an artifact (fit, profile, calibrate) or capture.json holds an
# absolute path. Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/ship
mkdir -p "$T"
RANDOM_MODEL=$KVQ_BUILD/examples/random_model
SMOL=${KVQ_SMOLLM2:-.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}

fingerprint() { "$KVQ" inspect --json "$1" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["fingerprint"])'; }

# ---- fingerprints: kvq against the independent script --------------------------------
"$RANDOM_MODEL" "$T/a.gguf" 1 >/dev/null && "$RANDOM_MODEL" "$T/b.gguf" 2 >/dev/null
fa=$(fingerprint "$T/a.gguf"); fb=$(fingerprint "$T/b.gguf")
pa=$("$PYTHON" scripts/fingerprint.py "$T/a.gguf"); pb=$("$PYTHON" scripts/fingerprint.py "$T/b.gguf")
if [ -n "$fa" ] && [ "$fa" = "$pa" ] && [ "$fb" = "$pb" ] && [ "$fa" != "$fb" ]; then
  ok ship_fingerprint_random_models; else fail ship_fingerprint_random_models "kvq $fa $fb, script $pa $pb"; fi
"$PYTHON" tests/helpers/perturb_gguf.py "$T/a.gguf" "$T/a1.gguf" blk.3.attn_q.weight
fa1=$(fingerprint "$T/a1.gguf"); pa1=$("$PYTHON" scripts/fingerprint.py "$T/a1.gguf")
if [ "$fa1" = "$pa1" ] && [ "$fa1" != "$fa" ]; then
  ok ship_fingerprint_one_weight; else fail ship_fingerprint_one_weight "kvq $fa1, script $pa1, before $fa"; fi
"$PYTHON" tests/helpers/perturb_gguf.py "$T/a.gguf" "$T/a2.gguf" blk.0.ffn_down.weight
if [ "$(fingerprint "$T/a2.gguf")" = "$fa" ]; then
  ok ship_fingerprint_ignores_mlp; else fail ship_fingerprint_ignores_mlp "an MLP weight changed the fingerprint"; fi
if [ -f "$SMOL" ]; then
  "$PYTHON" tests/helpers/perturb_gguf.py "$SMOL" "$T/smol1.gguf" blk.0.attn_k.weight
  fs=$(fingerprint "$SMOL"); fs1=$(fingerprint "$T/smol1.gguf")
  ps=$("$PYTHON" scripts/fingerprint.py "$SMOL"); ps1=$("$PYTHON" scripts/fingerprint.py "$T/smol1.gguf")
  if [ "$fs" = "$ps" ] && [ "$fs1" = "$ps1" ] && [ "$fs" != "$fs1" ]; then
    ok ship_fingerprint_smollm2; else fail ship_fingerprint_smollm2 "kvq $fs $fs1, script $ps $ps1"; fi
else
  skip ship_fingerprint_smollm2 "$SMOL not found"
fi

# ---- an artifact for model a, refused for model b and for a's perturbed copy --------------
if ! "$KVQ" capture --model "$T/a.gguf" --corpus uuid:4 --seq-len 64 --max-tokens 1024 --threads 1 \
       -q -o "$T/cap" 2>"$T/err" ||
   ! "$KVQ" moments --capture "$T/cap" -o "$T/mom" -q 2>>"$T/err" ||
   ! "$KVQ" fit --capture "$T/cap" --moments "$T/mom" --codebook 16 --iters 3 -q -o "$T/a.kvq" 2>>"$T/err"; then
  fail ship_artifact "capture, moments or fit failed: $(head -3 "$T/err")"; cli_done; exit
fi
"$KVQ" inspect --json "$T/a.kvq" >"$T/a.json"
if "$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); m=d["metadata"]; assert m["model.fingerprint"]==sys.argv[2], m; assert m["model.path"]=="a.gguf", m["model.path"]' "$T/a.json" "$fa" 2>"$T/err"; then
  ok ship_artifact_records_fingerprint; else fail ship_artifact_records_fingerprint "$(tail -2 "$T/err")"; fi
_cli_run "$KVQ" inspect "$T/a.kvq"
if grep -Eq "fingerprint +$fa" "$CLI_TMP/stdout"; then
  ok ship_inspect_artifact_fingerprint; else fail ship_inspect_artifact_fingerprint "$(head -12 "$CLI_TMP/stdout")"; fi

for other in b a1; do
  fo=$(fingerprint "$T/$other.gguf")
  _cli_run "$KVQ" run --model "$T/$other.gguf" --artifact "$T/a.kvq" -n 4 --temp 0 -q
  if [ "$(cat "$CLI_TMP/rc")" = 1 ] && [ ! -s "$CLI_TMP/stdout" ] &&
     grep -q "the weights differ (fingerprint $fa (.*) vs $fo (.*))" "$CLI_TMP/stderr"; then
    ok "ship_run_refuses_$other"; else fail "ship_run_refuses_$other" "rc $(cat "$CLI_TMP/rc")" "$(cat "$CLI_TMP/stderr")"; fi
done
_cli_run "$KVQ" eval --model "$T/b.gguf" --artifact "$T/a.kvq" --corpus uuid:1 --max-tokens 64 --seq-len 64 -q
if [ "$(cat "$CLI_TMP/rc")" = 1 ] && grep -q "fingerprint $fa" "$CLI_TMP/stderr" && grep -q "fingerprint .* vs $fb" "$CLI_TMP/stderr"; then
  ok ship_eval_refuses; else fail ship_eval_refuses "rc $(cat "$CLI_TMP/rc")" "$(cat "$CLI_TMP/stderr")"; fi
_cli_run "$KVQ" run --model "$T/b.gguf" --artifact "$T/a.kvq" --accept-model-mismatch -n 4 --temp 0 -q
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ -s "$CLI_TMP/stdout" ] &&
   grep -q "^kvq: warning: .*fingerprint $fa .* vs $fb" "$CLI_TMP/stderr"; then
  ok ship_run_accepts_with_flag; else fail ship_run_accepts_with_flag "rc $(cat "$CLI_TMP/rc")" "$(cat "$CLI_TMP/stderr")"; fi
_cli_run "$KVQ" run --model "$T/a.gguf" --artifact "$T/a.kvq" -n 4 --temp 0 -q
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ ! -s "$CLI_TMP/stderr" ]; then
  ok ship_run_same_weights; else fail ship_run_same_weights "rc $(cat "$CLI_TMP/rc")" "$(cat "$CLI_TMP/stderr")"; fi

# ---- no local path in anything shipped ----------------------------------------------------
# Absolute inputs everywhere: the model, the corpus files, the output.
mkdir -p "$T/corpus dir"
for i in 1 2 3; do sed -n "$((i * 40)),$((i * 40 + 400))p" tests/helpers/clitest.sh >"$T/corpus dir/doc$i.txt"; done
ABS=$(cd "$T" && pwd)
if "$KVQ" profile --artifact "$ABS/a.kvq" --capture "$ABS/cap" --knobs budget -q -o "$ABS/p.kvq" >/dev/null 2>"$T/err"; then
  arts="$ABS/a.kvq $ABS/p.kvq"
else
  arts="$ABS/a.kvq"; fail ship_profile "$(head -3 "$T/err")"
fi
if "$KVQ" calibrate --model "$ABS/a.gguf" --corpus "$ABS/corpus dir" --seq-len 64 --max-tokens 1024 \
     --heldout-tokens 256 --codebook 16 --iters 2 -q -o "$ABS/c.kvq" >/dev/null 2>"$T/err"; then
  arts="$arts $ABS/c.kvq"
else
  fail ship_calibrate "$(head -3 "$T/err")"
fi
"$KVQ" capture --model "$ABS/a.gguf" --corpus "$ABS/corpus dir" --seq-len 64 --max-tokens 512 -q -o "$ABS/cap2" 2>/dev/null
if "$PYTHON" tests/helpers/no_local_paths.py $arts "$ABS/cap2/capture.json" >"$T/out" 2>&1; then
  ok ship_no_local_paths; else fail ship_no_local_paths "$(head -8 "$T/out")"; fi

# ---- kvq card --------------------------------------------------------------------------
_cli_run "$KVQ" card "$T/p.kvq"
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && grep -q "^| weight fingerprint | \`$fa\` |$" "$CLI_TMP/stdout" &&
   grep -q "^| file | \`a.gguf\` (gguf) |$" "$CLI_TMP/stdout" &&
   grep -q "^| tokens | 1024 in 16 sequences of 64 |$" "$CLI_TMP/stdout" &&
   grep -q "^| \*\*all\*\* | " "$CLI_TMP/stdout" && grep -q "^| budget | " "$CLI_TMP/stdout" &&
   grep -q "^| made by | kvq .* 2023-11-14 |$" "$CLI_TMP/stdout" &&
   grep -q "^kvq run  --model MODEL --artifact p.kvq" "$CLI_TMP/stdout"; then
  ok ship_card; else fail ship_card "rc $(cat "$CLI_TMP/rc")" "$(head -40 "$CLI_TMP/stdout")" "$(cat "$CLI_TMP/stderr")"; fi
"$KVQ" card "$T/p.kvq" -o "$T/card.md" && cmp -s "$T/card.md" "$CLI_TMP/stdout"; r1=$?
echo keep >"$T/notes.md"
"$KVQ" card "$T/p.kvq" -o "$T/notes.md" 2>/dev/null; r2=$?
if [ $r1 = 0 ] && [ $r2 = 1 ] && [ "$(cat "$T/notes.md")" = keep ]; then
  ok ship_card_output_file; else fail ship_card_output_file "r1 $r1 r2 $r2"; fi
expect_error ship_card_not_artifact 1 "^kvq card: $T/notes.md: " -- "$KVQ" card "$T/notes.md"
cli_done
