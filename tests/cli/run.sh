#!/usr/bin/env bash
# kvq run / kvq eval: exact greedy output of the real tiny model, determinism of
# sampling, perplexity reports (text and JSON), help, and exit codes and messages for
# bad input.
set -u
KVQ=${KVQ:-build/kvq}
PYTHON=${PYTHON:-python3}
MODEL=${KVQ_TEST_MODEL:-../shared/models/stories260K.gguf}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok run: $1"; }
fail() { echo "FAIL run: $1"; }
check() { if eval "$2"; then ok "$1"; else fail "$1"; fi; }

# ---- usage and argument errors (no model needed) ----------------------------------
"$KVQ" run --help >"$tmp/out" 2>&1; rc=$?
check "run --help" '[ $rc -eq 0 ] && grep -q "^usage: kvq run --model M" "$tmp/out"'
"$KVQ" eval --help >"$tmp/out" 2>&1; rc=$?
check "eval --help" '[ $rc -eq 0 ] && grep -q "^usage: kvq eval --model M --corpus SPEC" "$tmp/out"'
"$KVQ" help run >"$tmp/out" 2>&1; rc=$?
check "help run" '[ $rc -eq 0 ] && grep -q "^usage: kvq run" "$tmp/out"'
"$KVQ" run >/dev/null 2>"$tmp/err"; rc=$?
check "run without --model" '[ $rc -eq 2 ] && [ "$(tail -1 "$tmp/err")" = "kvq run: --model is required" ]'
"$KVQ" eval --model x >/dev/null 2>"$tmp/err"; rc=$?
check "eval without --corpus" '[ $rc -eq 2 ] && [ "$(tail -1 "$tmp/err")" = "kvq eval: --model and --corpus are required" ]'
"$KVQ" run --model x -n 0 >/dev/null 2>"$tmp/err"; rc=$?
check "run -n 0" '[ $rc -eq 2 ] && grep -q "^kvq run: -n: " "$tmp/err"'
"$KVQ" run --model x --temp -1 >/dev/null 2>"$tmp/err"; rc=$?
check "run --temp -1" '[ $rc -eq 2 ] && grep -q "^kvq run: --temp: " "$tmp/err"'
"$KVQ" run --model x --bogus >/dev/null 2>"$tmp/err"; rc=$?
check "run unknown option" '[ $rc -eq 2 ] && [ "$(tail -1 "$tmp/err")" = "kvq run: unknown option '"'"'--bogus'"'"'" ]'
"$KVQ" run --model "$tmp/nonexistent.gguf" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "run missing model" '[ $rc -eq 1 ] && [ ! -s "$tmp/out" ] && [ "$(cat "$tmp/err")" = "kvq run: $tmp/nonexistent.gguf: no such file or directory" ]'
printf 'GGUF\003\000\000\000' >"$tmp/short.gguf"
"$KVQ" run --model "$tmp/short.gguf" >/dev/null 2>"$tmp/err"; rc=$?
check "run truncated gguf" '[ $rc -eq 1 ] && grep -q "^kvq run: $tmp/short.gguf: " "$tmp/err"'
mkdir "$tmp/hf"; echo '{"model_type": "gpt2"}' >"$tmp/hf/config.json"
"$KVQ" eval --model "$tmp/hf" --corpus uuid:1 >/dev/null 2>"$tmp/err"; rc=$?
check "eval unsupported architecture" '[ $rc -eq 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "^kvq eval: $tmp/hf/config.json: model_type: unsupported architecture '"'"'gpt2'"'"' (kvq reads llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3" "$tmp/err"'

# ---- the real tiny model ----------------------------------------------------------
SMOL=${KVQ_SMOLLM2:-.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -f "$MODEL" ] && [ -f "$SMOL" ]; then
  # No stories260K: SmolLM2's greedy text against llama.cpp's (tests/data/
  # smollm2_q41_golden.json, scripts/gen_smollm2_golden.py), threads and seeds.
  g() { "$PYTHON" -c 'import json, sys; p = json.load(open("tests/data/smollm2_q41_golden.json"))["prompts"][0]; print(p[sys.argv[1]] if sys.argv[1] == "text" else p["llamacpp_greedy"]["text"], end="")' "$1"; }
  prompt=$(g text); want="$prompt$(g greedy)"
  "$KVQ" run --model "$SMOL" -n 32 --temp 0 --prompt "$prompt" >"$tmp/out" 2>"$tmp/err"; rc=$?
  check "run smollm2 greedy = llama.cpp" '[ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = "$want" ]'
  check "run smollm2 reports tokens/s" 'grep -q "generated 32 tokens in .* tokens/s)" "$tmp/err"'
  "$KVQ" run --model "$SMOL" -n 32 --temp 0 --prompt "$prompt" -q --threads 1 >"$tmp/out1" 2>"$tmp/err"; rc=$?
  check "run smollm2 -q --threads 1" '[ $rc -eq 0 ] && [ ! -s "$tmp/err" ] && cmp -s "$tmp/out" "$tmp/out1"'
  "$KVQ" run --model "$SMOL" -n 16 --temp 1.0 --top-p 0.9 --seed 5 -q >"$tmp/s1"
  "$KVQ" run --model "$SMOL" -n 16 --temp 1.0 --top-p 0.9 --seed 5 -q >"$tmp/s2"
  "$KVQ" run --model "$SMOL" -n 16 --temp 1.0 --top-p 0.9 --seed 6 -q >"$tmp/s3"
  check "run smollm2 sampling is seeded" 'cmp -s "$tmp/s1" "$tmp/s2" && [ -s "$tmp/s1" ]'
  check "run smollm2 seeds differ" '! cmp -s "$tmp/s1" "$tmp/s3"'
  exit 0
fi
if [ ! -f "$MODEL" ]; then
  echo "skip run: $MODEL and $SMOL not found (set KVQ_TEST_MODEL)"; exit 0
fi
golden="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to"

"$KVQ" run --model "$MODEL" -n 48 --temp 0 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "run greedy golden text" '[ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = "$golden" ]'
check "run reports tokens/s" 'grep -q "generated 48 tokens in .* tokens/s)" "$tmp/err"'
check "run reports memory" 'grep -q "^kvq: memory: about " "$tmp/err"'
"$KVQ" run --model "$MODEL" -n 48 --temp 0 -q --threads 1 >"$tmp/out1" 2>"$tmp/err"; rc=$?
check "run -q --threads 1" '[ $rc -eq 0 ] && [ ! -s "$tmp/err" ] && cmp -s "$tmp/out" "$tmp/out1"'

"$KVQ" run --model "$MODEL" -n 20 --temp 0 --prompt "Once upon a time, there was a little girl" -q >"$tmp/out"; rc=$?
check "run prompt echoed and continued greedily" '[ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One" ]'
"$KVQ" run --model "$MODEL" -n 20 --temp 0 --prompt "Lily and Ben went to the" -q >"$tmp/out"; rc=$?
check "run second prompt" '[ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = "Lily and Ben went to the park. They saw a big box with a big box. They want" ]'

"$KVQ" run --model "$MODEL" -n 40 --temp 1.0 --top-p 0.9 --seed 5 -q >"$tmp/s1"
"$KVQ" run --model "$MODEL" -n 40 --temp 1.0 --top-p 0.9 --seed 5 -q >"$tmp/s2"
"$KVQ" run --model "$MODEL" -n 40 --temp 1.0 --top-p 0.9 --seed 6 -q >"$tmp/s3"
check "run sampling is seeded" 'cmp -s "$tmp/s1" "$tmp/s2" && [ -s "$tmp/s1" ]'
check "run seeds differ" '! cmp -s "$tmp/s1" "$tmp/s3"'

# eval: the golden text itself, one sequence and in two
printf '%s\n' "$golden" >"$tmp/story.txt"
"$KVQ" eval --model "$MODEL" --corpus "file:$tmp/story.txt" --seq-len 64 --score all -q >"$tmp/out"; rc=$?
cat >"$tmp/want" <<EOF
model       $MODEL
corpus      file:$tmp/story.txt
attention   full
sequences   1 of up to 64 tokens
tokens      50 (49 predicted)
EOF
check "eval text report" '[ $rc -eq 0 ] && head -5 "$tmp/out" | cmp -s - "$tmp/want"'
nll=$(sed -n 's/^nll *\([0-9.]*\) nats\/token$/\1/p' "$tmp/out")
ppl=$(sed -n 's/^perplexity *\([0-9.]*\)$/\1/p' "$tmp/out")
# llama.cpp's NLL of the same text (tests/data/stories260K_nll.json, made by
# scripts/gen_stories260K_nll.py with llama-cpp-python): within 1e-4 nats/token
golden_nll() { "$PYTHON" -c 'import json, sys; print(json.load(open("tests/data/stories260K_nll.json"))[sys.argv[1]]["nll"])' "$1"; }
ref64=$(golden_nll seq_len_64); ref32=$(golden_nll seq_len_32)
check "eval nll and perplexity" \
  '[ -n "$nll" ] && [ -n "$ppl" ] && awk -v a="$nll" -v p="$ppl" -v r="$ref64" "BEGIN { e = exp(a) - p; d = a - r; exit !(e < 1e-3 && e > -1e-3 && d < 1e-4 && d > -1e-4) }"'
"$KVQ" eval --model "$MODEL" --corpus "file:$tmp/story.txt" --seq-len 32 --score all --json -q >"$tmp/json"; rc=$?
check "eval --json" '[ $rc -eq 0 ] && "$PYTHON" - "$tmp/json" <<EOF
import json, math, sys
d = json.load(open(sys.argv[1]))
assert d["attention"] == "full" and d["seq_len"] == 32, d
assert d["sequences"] == 2 and d["tokens"] == 51 and d["predicted"] == 49, d
assert abs(math.exp(d["nll"]) - d["perplexity"]) < 1e-6 * d["perplexity"], d
assert abs(d["nll"] - $ref32) < 1e-4, (d["nll"], "llama.cpp: $ref32")
assert len(d["corpus_hash"]) == 16, d
EOF'
"$KVQ" eval --model "$MODEL" --corpus "file:$tmp/story.txt" --seq-len 64 --max-tokens 20 --score all -q >"$tmp/out"; rc=$?
check "eval --max-tokens" '[ $rc -eq 0 ] && grep -q "^tokens      20 (19 predicted)$" "$tmp/out"'
"$KVQ" eval --model "$MODEL" --corpus "file:$tmp/missing.txt" >/dev/null 2>"$tmp/err"; rc=$?
check "eval missing corpus file" '[ $rc -eq 1 ] && grep -q "^kvq eval: .*missing.txt" "$tmp/err"'
