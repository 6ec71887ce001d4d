#!/usr/bin/env bash
# runtime.sh — `kvq run` / `kvq eval` with retrieval attention: option errors, the real
# tiny model's (or its stand-in's) greedy text with budget = everything (exact positions), a real budget,
# artifacts refused for another model or when truncated, and the eval table (text and
# JSON). The artifact comes from capture -> moments -> fit. Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/rt
mkdir -p "$T"

# ---- options (no model needed) ------------------------------------------------------
_cli_run "$KVQ" run --help
if grep -q -- "--artifact A" "$CLI_TMP/stdout" && grep -q -- "--selector S" "$CLI_TMP/stdout"; then
  ok runtime_run_help; else fail runtime_run_help "$(head -3 "$CLI_TMP/stdout")"; fi
_cli_run "$KVQ" eval --help
if grep -q -- "--selectors LIST" "$CLI_TMP/stdout" && grep -q -- "--budgets LIST" "$CLI_TMP/stdout"; then
  ok runtime_eval_help; else fail runtime_eval_help "$(head -3 "$CLI_TMP/stdout")"; fi
expect_error runtime_needs_artifact_or_selector 2 '^kvq run: retrieval options need --artifact or --selector$' -- \
  "$KVQ" run --model x --budget 8
expect_error runtime_one_selector 2 '^kvq run: --selector takes one selector$' -- \
  "$KVQ" run --model x --selector full,oracle
expect_error runtime_bad_positions 2 "^kvq run: --positions: 'exact' is not wrope or rope$" -- \
  "$KVQ" run --model x --selector full --positions exact
expect_error runtime_bad_cache 2 "^kvq run: --cache: 'bf16' is not f16 or f32$" -- \
  "$KVQ" run --model x --selector full --cache bf16
expect_error runtime_bad_window 2 '^kvq run: --window: ' -- "$KVQ" run --model x --window 0
expect_error runtime_bad_tau 2 '^kvq eval: --tau: ' -- "$KVQ" eval --model x --corpus uuid:1 --tau 2
expect_error runtime_bad_device 2 "^kvq run: --device: 'gpu' is not cpu, cuda or auto$" -- \
  "$KVQ" run --model x --selector full --device gpu

# stories260K, or without ../shared its stand-in tests/data/tiny_spm.gguf (head dim 8
# too), with its greedy text after BOS: SOURCES.md's, or llama.cpp's (spm_model)
spm_model
MODEL=$M golden=$GOLDEN
expect_error runtime_bad_selector 2 "^kvq run: unknown selector 'h2o'" -- \
  "$KVQ" run --model "$MODEL" --selector h2o
expect_error runtime_codebook_needs_artifact 2 '^kvq run: the codebook selector needs --artifact$' -- \
  "$KVQ" run --model "$MODEL" --selector codebook
expect_error runtime_bad_budget 2 "^kvq eval: budget '0': a count must be in" -- \
  "$KVQ" eval --model "$MODEL" --corpus uuid:1 --selectors full --budgets 6%,0

# no artifact: full attention through the runtime, exact positions, is the reference text
_cli_run "$KVQ" run --model "$MODEL" -n 48 --temp 0 --selector full --positions rope --window 8 -q
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ "$(cat "$CLI_TMP/stdout")" = "$golden" ]; then
  ok runtime_full_selector_golden; else fail runtime_full_selector_golden "$(cat "$CLI_TMP/stdout" "$CLI_TMP/stderr")"; fi

# ---- an artifact of the real model ----------------------------------------------------
if ! "$KVQ" capture --model "$MODEL" --corpus uuid:8 --seq-len 64 --max-tokens 4096 --threads 1 \
       -q -o "$T/cap" 2>"$T/err" ||
   ! "$KVQ" moments --capture "$T/cap" -o "$T/mom" -q 2>>"$T/err" ||
   ! "$KVQ" fit --capture "$T/cap" --moments "$T/mom" --codebook 32 --iters 5 -q -o "$T/a.kvq" 2>>"$T/err"; then
  fail runtime_artifact "capture, moments or fit failed:" "$(head -3 "$T/err")"; cli_done; exit
fi

for cache in f32 f16; do
  _cli_run "$KVQ" run --model "$MODEL" --artifact "$T/a.kvq" --budget all --positions rope \
    --window 8 --cache $cache -n 48 --temp 0
  if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ "$(cat "$CLI_TMP/stdout")" = "$golden" ] &&
     grep -q '^kvq: retrieval: qavq, budget all: [0-9]* steps' "$CLI_TMP/stderr"; then
    ok "runtime_budget_all_golden_$cache"
  else
    fail "runtime_budget_all_golden_$cache" "$(cat "$CLI_TMP/stdout")" "$(tail -2 "$CLI_TMP/stderr")"
  fi
done

# a cache that never outgrows the sinks and the window: said so, not "0 steps, 100%"
_cli_run "$KVQ" run --model "$MODEL" --artifact "$T/a.kvq" --budget 8 -n 3 --temp 0
if [ "$(cat "$CLI_TMP/rc")" = 0 ] &&
   grep -q '^kvq: retrieval: qavq, budget 8: no step selected (the cache never held more' \
     "$CLI_TMP/stderr" && ! grep -q 'of the KV cache' "$CLI_TMP/stderr"; then
  ok runtime_short_context_said
else
  fail runtime_short_context_said "$(tail -2 "$CLI_TMP/stderr")"
fi
_cli_run "$KVQ" run --model "$MODEL" --artifact "$T/a.kvq" --budget 8 --window 16 -n 100 --temp 0
read_pct=$(sed -n 's/.*reading \([0-9.]*\)% of the KV cache$/\1/p' "$CLI_TMP/stderr")
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ -n "$read_pct" ] &&
   awk -v p="$read_pct" 'BEGIN { exit !(p > 0 && p < 80) }' &&
   [ "$(head -c ${#GOLDEN_HEAD} "$CLI_TMP/stdout")" = "$GOLDEN_HEAD" ]; then
  ok runtime_budget_8
else
  fail runtime_budget_8 "read $read_pct%" "$(head -2 "$CLI_TMP/stdout")" "$(tail -2 "$CLI_TMP/stderr")"
fi
# --device cuda where CUDA cannot run (this build, or no device): one warning, then the
# CPU's text, byte for byte
cp "$CLI_TMP/stdout" "$T/cpu.txt"
_cli_run "$KVQ" run --model "$MODEL" --artifact "$T/a.kvq" --budget 8 --window 16 -n 100 --temp 0 \
  --device cuda
n_warn=$(grep -c '^kvq: warning: retrieval: CUDA requested but unavailable: .*; using the CPU$' "$CLI_TMP/stderr")
if [ "$n_warn" = 0 ] && [ "$(cat "$CLI_TMP/rc")" = 0 ] && ! grep -q warning "$CLI_TMP/stderr"; then
  # a usable GPU (CUDA build): the selection ran on it; near-ties may pick other tokens
  # (docs/runtime.md), so the text is only checked to be there
  if [ -s "$CLI_TMP/stdout" ]; then ok runtime_device_cuda_ran
  else fail runtime_device_cuda_ran "no text" "$(tail -2 "$CLI_TMP/stderr")"; fi
elif [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ "$n_warn" = 1 ] &&
     [ "$(grep -c 'warning' "$CLI_TMP/stderr")" = 1 ] && cmp -s "$CLI_TMP/stdout" "$T/cpu.txt"; then
  ok runtime_device_cuda_fallback
else
  fail runtime_device_cuda_fallback "warnings: $n_warn" "$(grep warning "$CLI_TMP/stderr")" \
    "$(head -c 200 "$CLI_TMP/stdout")"
fi
expect_error runtime_method_mismatch 1 "^kvq run: selector pq: the artifact's method is qavq$" -- \
  "$KVQ" run --model "$MODEL" --artifact "$T/a.kvq" --selector pq

# refused: truncated, and made for a model with the other RoPE pair layout
head -c 100 "$T/a.kvq" >"$T/short.kvq"
expect_error runtime_truncated 1 "^kvq run: $T/short.kvq: " -- \
  "$KVQ" run --model "$MODEL" --artifact "$T/short.kvq"
if "$PYTHON" - "$T/a.kvq" "$T/half.kvq" <<'EOF' 2>"$T/pyerr"
import json, struct, sys
import zstandard
buf = open(sys.argv[1], "rb").read()
size = struct.unpack_from("<I", buf, 4)[0]
payload = zstandard.ZstdDecompressor().decompress(buf[8 + size:])
n = struct.unpack_from("<Q", payload, 0)[0]
head = json.loads(payload[8:8 + n])
head["__metadata__"]["model.rope.layout"] = "half"
text = json.dumps(head, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
new = struct.pack("<Q", len(text)) + text + payload[8 + n:]
frame = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True).compress(new)
hdr = bytearray(buf[:8 + size])
struct.pack_into("<Q", hdr, 24, len(new))
open(sys.argv[2], "wb").write(bytes(hdr) + frame)
EOF
then
  expect_error runtime_layout_mismatch 1 \
    "^kvq run: $T/half.kvq vs $MODEL: model.rope.layout differs \(half vs interleaved\)$" -- \
    "$KVQ" run --model "$MODEL" --artifact "$T/half.kvq"
else
  skip runtime_layout_mismatch "python zstandard: $(tail -1 "$T/pyerr")"
fi

# ---- eval: the selector x budget table ----------------------------------------------------
printf '%s\n' "$golden" >"$T/story.txt"
expect_json runtime_eval_json '
rows = {(r["selector"], r["budget"]): r for r in d["rows"]}
assert d["attention"] == "retrieval" and d["method"] == "qavq", d
assert set(rows) == {("full", "all"), ("oracle", "4"), ("qavq", "4"), ("fier", "4"), ("quest", "4"), ("mass", "4")}, rows.keys()
full = rows[("full", "all")]
# exact positions, every token: perplexity and outputs of full attention
assert abs(full["perplexity"] - d["reference"]["perplexity"]) < 1e-3 * d["reference"]["perplexity"], full
assert full["recall_mass"] > 0.99999 and full["out_rel_err"] < 1e-3 and full["recall_topk"] == 1, full
assert abs(full["kv_read_fraction"] - 1) < 1e-9 and full["steps"] > 0, full
assert rows[("oracle", "4")]["recall_topk"] == 1, rows[("oracle", "4")]
# bits per key: K 32 codes (log2 32), the codebook plus its residual stage (1 bit per
# channel and an f32 scale: d + 32), fier d + 2d (groups of 32), quest 4d (pages of 16), d = 8
bits = {k[0]: r["bits_per_key"] for k, r in rows.items()}
assert bits == {"full": 0, "oracle": 128, "qavq": 45, "mass": 5, "fier": 24, "quest": 32}, bits
assert abs(full["perplexity_rel"] - (full["perplexity"] / d["reference"]["perplexity"] - 1)) < 1e-6, full
for key, r in rows.items():
    assert r["steps"] == full["steps"], (key, r)
    assert 0 < r["recall_mass"] <= 1.000001 and 0 <= r["recall_topk"] <= 1, (key, r)
    if key[0] in ("qavq", "fier", "quest", "mass"):
        assert r["kv_read_fraction"] < 0.8, (key, r)
assert d["reference"]["kv_recall"][1] == 1 and d["reference"]["passkey"][1] == 0, d
assert all(r["kv_recall"][1] == 1 for r in d["rows"]) and d["sequences"] == 1, d
' -- "$KVQ" eval --model "$MODEL" --artifact "$T/a.kvq" --corpus "file:$T/story.txt,kv-recall:1" \
    --seq-len 64 --max-tokens 64 --budgets 4 --window 8 --positions rope --json -q

# WRoPE is exact for tokens inside the window (i - j < w), sinks included: with a window
# that covers the whole sequence, `full` under wrope is full attention (an f32 cache, so
# only the order of the sums differs). Before, the sinks always took q R_b.
expect_json runtime_wrope_window_covers_all '
full = [r for r in d["rows"] if r["selector"] == "full"][0]
ref = d["reference"]["perplexity"]
assert abs(full["perplexity"] - ref) < 1e-5 * ref, (full["perplexity"], ref)
' -- "$KVQ" eval --model "$MODEL" --artifact "$T/a.kvq" --corpus "file:$T/story.txt" \
    --seq-len 64 --max-tokens 64 --selectors full --window 64 --positions wrope --cache f32 \
    --json -q

_cli_run "$KVQ" eval --model "$MODEL" --artifact "$T/a.kvq" --corpus "file:$T/story.txt" \
  --seq-len 64 --selectors full,qavq --budgets 4,50% --window 8 -q
if [ "$(cat "$CLI_TMP/rc")" = 0 ] &&
   grep -q "^attention   retrieval: artifact $T/a.kvq (qavq, K 32, G 1), positions wrope, score mean, rerank +0.08, residual 1 bit (max, W 64, share 1), sink 4, window 8, cache f16, group sum$" "$CLI_TMP/stdout" &&
   grep -q '^selector     budget    bits        ppl     d_ppl   d_ppl%  recall    mass  out_err  kv_read  passkey kv-recall$' "$CLI_TMP/stdout" &&
   [ "$(grep -c '^qavq  ' "$CLI_TMP/stdout")" = 2 ] && [ "$(grep -c '^full  ' "$CLI_TMP/stdout")" = 1 ]; then
  ok runtime_eval_text
else
  fail runtime_eval_text "$(cat "$CLI_TMP/stdout" "$CLI_TMP/stderr" | head -20)"
fi
# eval with --device cuda where CUDA cannot run: one warning for all rows, the same table
cp "$CLI_TMP/stdout" "$T/eval_cpu.txt"
_cli_run "$KVQ" eval --model "$MODEL" --artifact "$T/a.kvq" --corpus "file:$T/story.txt" \
  --seq-len 64 --selectors full,qavq --budgets 4,50% --window 8 -q --device cuda
n_warn=$(grep -c '^kvq: warning: retrieval: CUDA requested but unavailable' "$CLI_TMP/stderr")
if [ "$n_warn" = 0 ] && [ "$(cat "$CLI_TMP/rc")" = 0 ] && ! grep -q warning "$CLI_TMP/stderr"; then
  # a usable GPU (CUDA build): the selection ran on it; the table has its rows
  if [ "$(grep -c '^qavq  ' "$CLI_TMP/stdout")" = 2 ]; then ok runtime_eval_device_cuda_ran
  else fail runtime_eval_device_cuda_ran "$(head -20 "$CLI_TMP/stdout")"; fi
elif [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ "$n_warn" = 1 ] &&
     [ "$(grep -c 'warning' "$CLI_TMP/stderr")" = 1 ] && cmp -s "$CLI_TMP/stdout" "$T/eval_cpu.txt"; then
  ok runtime_eval_device_cuda_fallback
else
  fail runtime_eval_device_cuda_fallback "warnings: $n_warn" "$(cat "$CLI_TMP/stderr" | head -5)" \
    "$(diff "$T/eval_cpu.txt" "$CLI_TMP/stdout" | head -5)"
fi
cli_done
