#!/usr/bin/env bash
# archs.sh — the new architectures from the command line (issue 33): the tiny qwen3,
# gemma3, gemma2 and phi3 models of tests/data/archs (scripts/gen_arch_models.py)
# capture, and capture.json carries each layer's attention; kvq fit leaves gemma3's
# sliding-window layers without a codebook; bad input (an unknown architecture, an
# unknown rope scaling type, a GGUF key kvq does not know, metadata that contradicts
# itself) is one line naming the file and the key, exit 1, and nothing written;
# calibrate, eval and run --artifact work on each architecture, the local layers
# attended exactly over their window; an artifact whose layers contradict the model's
# is refused. Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/archs
D=tests/data/archs
mkdir -p "$T"

# ---- capture: per-layer attention in capture.json --------------------------------------
_cli_run "$KVQ" capture --model "$D/gemma3.gguf" --corpus uuid:2 --seq-len 32 -o "$T/cap3"
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && "$PYTHON" - "$T/cap3/capture.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["model"]
a = m["attention"]
assert m["architecture"] == "gemma3" and m["rope"]["base"] == 1e6, m
assert (a["sliding_window"], a["sliding_period"], a["rope_local_base"]) == (8, 6, 10000), a
L = a["layers"]
assert [l["window"] for l in L] == [8, 8, 8, 8, 8, 0], L
assert [l["rope_base"] for l in L] == [1e4] * 5 + [1e6], L
assert [l["rope_scaling"] for l in L] == ["none"] * 5 + ["linear"] and L[5]["rope_factor"] == 8
assert all(abs(l["scale"] - 0.25) < 1e-12 and l["softcap"] == 0 and l["rope"] for l in L)
EOF
then
  ok capture_gemma3_layers
else
  fail capture_gemma3_layers "exit $(cat "$CLI_TMP/rc")" "$(tail -3 "$CLI_TMP/stderr")"
fi

# ---- moments: WRoPE rotates each layer by its own RoPE -------------------------------------
# numpy over the capture's pre-RoPE sums: H = R_b^T (grouped mean) R_b with layer 0's
# RoPE (base 10000, unscaled) and layer 5's (base 1e6, linear 8), b = 2048.
_cli_run "$KVQ" moments --capture "$T/cap3" -o "$T/m3.safetensors"
if [ "$(cat "$CLI_TMP/rc")" != 0 ]; then
  fail moments_gemma3 "exit $(cat "$CLI_TMP/rc")" "$(tail -3 "$CLI_TMP/stderr")"
elif ! "$PYTHON" -c "import numpy" 2>/dev/null; then
  skip moments_gemma3_per_layer_rope "numpy is not installed (make deps installs it)"
elif "$PYTHON" - "$T/cap3" "$T/m3.safetensors" <<'EOF2'
import json, struct, sys
import numpy as np
def load_file(path):  # safetensors: u64 header size, JSON header, data
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    dt = {"F64": "<f8", "F32": "<f4", "I32": "<i4", "F16": "<f2"}
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]],
                             dtype=dt[v["dtype"]]).reshape(v["shape"])
            for k, v in hdr.items() if k != "__metadata__" and v["dtype"] in dt}
cap, mom = sys.argv[1], sys.argv[2]
M = load_file(mom)
def R(base, factor, d=16, b=2048):
    th = base ** (-np.arange(d // 2) * 2.0 / d) / factor
    r = np.zeros((d, d))
    h = d // 2
    for m in range(h):
        c, s = np.cos(b * th[m]), np.sin(b * th[m])
        r[m, m], r[m, m + h], r[m + h, m], r[m + h, m + h] = c, s, -s, c
    return r
for layer, base, factor in ((0, 1e4, 1.0), (5, 1e6, 8.0)):
    L = load_file(f"{cap}/layer_{layer:03d}.safetensors")
    S, c = L["q_moment_sum"], L["q_moment_count"]
    Hpre = S.sum(0) / c.sum()          # 4 query heads share the one KV head
    for b2, f2, want in ((base, factor, True), (1e6 if layer == 0 else 1e4, 1.0, False)):
        r = R(b2, f2)
        H = r.T @ Hpre @ r
        got = M[f"layer.{layer}.H"][0]
        close = np.abs(got - H).max() <= 1e-9 * np.abs(H).max()
        assert close == want, (layer, b2, f2, np.abs(got - H).max())
EOF2
then
  ok moments_gemma3_per_layer_rope
else
  fail moments_gemma3_per_layer_rope "numpy's H with each layer's RoPE differs from kvq's"
fi

# ---- fit: no codebook for gemma3's sliding-window layers --------------------------------
_cli_run "$KVQ" fit --capture "$T/cap3" --moments "$T/m3.safetensors" -o "$T/g3.kvq" --codebook 8 -v
if [ "$(cat "$CLI_TMP/rc")" = 0 ] &&
   grep -q "5 of the model's 6 layers attend a sliding window of 8 tokens exactly: no codebook" \
     "$CLI_TMP/stderr" &&
   "$KVQ" inspect "$T/g3.kvq" | grep -Eq '^  layers +5 \(1 of 6\)'; then
  ok fit_gemma3_global_layers_only
else
  fail fit_gemma3_global_layers_only "exit $(cat "$CLI_TMP/rc")" "$(tail -3 "$CLI_TMP/stderr")"
fi

# ---- the runtime on each architecture: calibrate, eval, run --artifact ------------------
# The local layers (gemma2's even ones, gemma3's 0-4: a window of 8 beside global
# layers) get no codebook and are attended exactly over their window; run with the
# artifact at a budget covering every token (exact RoPE, window 4, so that the global
# layers go through retrieval steps) prints what full attention prints.
for A in qwen3 gemma2 gemma3 phi3; do
  case $A in
    gemma3) LOCAL="layers 0-4 of 6 slide over 8 tokens: attended exactly, no retrieval"; LJ="[0, 1, 2, 3, 4]" ;;
    gemma2) LOCAL="layers 0,2 of 4 slide over 8 tokens: attended exactly, no retrieval"; LJ="[0, 2]" ;;
    *) LOCAL=""; LJ="[]" ;;
  esac
  _cli_run "$KVQ" calibrate --model "$D/$A.gguf" -o "$T/cal_$A.kvq" --max-tokens 1024 \
    --heldout-tokens 256 --seq-len 64 --codebook 8 --iters 4 -q
  if [ "$(cat "$CLI_TMP/rc")" != 0 ] || [ ! -s "$T/cal_$A.kvq" ]; then
    fail "calibrate_$A" "exit $(cat "$CLI_TMP/rc")" "$(tail -3 "$CLI_TMP/stderr")"
    continue
  fi
  if [ -z "$LOCAL" ] && ! "$KVQ" inspect "$T/cal_$A.kvq" | grep -q "^  local "; then
    ok "calibrate_$A"
  elif [ -n "$LOCAL" ] && "$KVQ" inspect "$T/cal_$A.kvq" | grep -qF "local       $LOCAL (no codebook)"; then
    ok "calibrate_$A"
  else
    fail "calibrate_$A" "kvq inspect does not name the local layers ($LOCAL)"
  fi
  _cli_run "$KVQ" eval --model "$D/$A.gguf" --artifact "$T/cal_$A.kvq" --corpus uuid:2 \
    --seq-len 64 --max-tokens 256 --score last:16 --selectors full,codebook --json -q
  if [ "$(cat "$CLI_TMP/rc")" = 0 ] && "$PYTHON" - "$CLI_TMP/stdout" "$LJ" <<'EOF'
import json, math, sys
d = json.load(open(sys.argv[1]))
assert json.dumps(d["local_layers"]) == sys.argv[2], d["local_layers"]
ref = d["reference"]["perplexity"]
rows = {r["selector"]: r for r in d["rows"]}
assert abs(rows["full"]["perplexity"] / ref - 1) < 0.01, (rows["full"], ref)
assert math.isfinite(rows[[k for k in rows if k != "full"][0]]["perplexity"]), rows
EOF
  then
    ok "eval_$A"
  else
    fail "eval_$A" "exit $(cat "$CLI_TMP/rc")" "$(tail -3 "$CLI_TMP/stderr")"
  fi
  "$KVQ" run --model "$D/$A.gguf" --prompt "hello there" -n 40 --temp 0 -q > "$T/run_full_$A" 2>/dev/null
  _cli_run "$KVQ" run --model "$D/$A.gguf" --artifact "$T/cal_$A.kvq" --prompt "hello there" \
    -n 40 --temp 0 --budget 100% --positions rope --cache f32 --window 4 --sink 2
  if [ "$(cat "$CLI_TMP/rc")" = 0 ] && cmp -s "$CLI_TMP/stdout" "$T/run_full_$A" &&
     grep -q "steps (layer x KV head) attended" "$CLI_TMP/stderr" &&
     { [ -z "$LOCAL" ] || grep -qF "retrieval: $LOCAL" "$CLI_TMP/stderr"; }; then
    ok "run_artifact_$A"
  else
    fail "run_artifact_$A" "exit $(cat "$CLI_TMP/rc"): output differs from full attention or the local layers are not named" "$(tail -3 "$CLI_TMP/stderr")"
  fi
done

# ---- bad input: an HF directory whose config.json says something kvq does not do --------
# hfdir NAME PYCODE: a copy of the qwen3 (or phi3) directory with config.json edited by
# PYCODE (a dict `c`).
hfdir() {
  local src=$1 name=$2 code=$3
  mkdir -p "$T/$name"
  ln -sf "$PWD/$D/$src/model.safetensors" "$T/$name/model.safetensors"
  "$PYTHON" - "$D/$src/config.json" "$T/$name/config.json" "$code" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
EOF
}
hfdir qwen3 unknown_arch 'c["model_type"] = "mamba"; c["architectures"] = ["MambaForCausalLM"]'
expect_error unknown_architecture 1 \
  "^kvq capture: $T/unknown_arch/config\.json: model_type: unsupported architecture 'mamba' \(kvq reads llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3" \
  -- "$KVQ" capture --model "$T/unknown_arch" --corpus uuid:1 -o "$T/out_arch"
[ -e "$T/out_arch" ] && fail unknown_architecture_nothing_written "$T/out_arch exists"

hfdir qwen3 yarn 'c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}'
expect_error unknown_rope_scaling 1 \
  "^kvq capture: $T/yarn/config\.json: rope_scaling\.rope_type: unsupported rope scaling type 'yarn'" \
  -- "$KVQ" capture --model "$T/yarn" --corpus uuid:1 -o "$T/out_yarn"
[ -e "$T/out_yarn" ] && fail unknown_rope_scaling_nothing_written "$T/out_yarn exists"

hfdir phi3 longrope 'c["rope_scaling"] = {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}'
expect_error phi3_longrope_refused 1 \
  "^kvq capture: $T/longrope/config\.json: rope_scaling\.rope_type: unsupported rope scaling type 'longrope'" \
  -- "$KVQ" capture --model "$T/longrope" --corpus uuid:1 -o "$T/out_long"

hfdir qwen3 contradict 'c["layer_types"] = ["full_attention"] * 2; c["use_sliding_window"] = True; c["sliding_window"] = 4'
expect_error contradictory_layer_types 1 \
  "^kvq capture: $T/contradict/config\.json: \"layer_types\"" \
  -- "$KVQ" capture --model "$T/contradict" --corpus uuid:1 -o "$T/out_contra"
[ -e "$T/out_contra" ] && fail contradictory_nothing_written "$T/out_contra exists"

# ---- bad input: GGUF metadata (needs the gguf package) ------------------------------------
if "$PYTHON" -c "import gguf" 2>/dev/null; then
  # gguf_edit OUT KEY VALUE: gemma3.gguf with one metadata key set (added or replaced).
  gguf_edit() {
    "$PYTHON" - "$D/gemma3.gguf" "$1" "$2" "$3" <<'EOF'
import sys
import gguf
src, out, key, val = sys.argv[1:5]
r = gguf.GGUFReader(src)
w = gguf.GGUFWriter(out, arch=None)
for f in r.fields.values():
    if f.name.startswith("GGUF.") or f.name == key:
        continue
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        w.add_key_value(f.name, f.contents(), t, sub_type=f.types[-1])
    else:
        w.add_key_value(f.name, f.contents(), t)
if val.isdigit():
    w.add_uint32(key, int(val))
else:
    w.add_string(key, val)
for t in r.tensors:
    w.add_tensor(t.name, t.data, raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
EOF
  }
  gguf_edit "$T/pattern.gguf" gemma3.attention.sliding_window_pattern 4
  expect_error gguf_unknown_key 1 \
    "^kvq capture: $T/pattern\.gguf: metadata key gemma3\.attention\.sliding_window_pattern: not implemented by kvq" \
    -- "$KVQ" capture --model "$T/pattern.gguf" --corpus uuid:1 -o "$T/out_pat"
  [ -e "$T/out_pat" ] && fail gguf_unknown_key_nothing_written "$T/out_pat exists"
  # an artifact whose layers attend otherwise than the model's (a window of 16)
  gguf_edit "$T/w16.gguf" gemma3.attention.sliding_window 16
  expect_error artifact_contradicts_layers 1 \
    "^kvq run: $T/cal_gemma3\.kvq vs $T/w16\.gguf: model\.attention\.sliding_window differs \(8 vs 16\)" \
    -- "$KVQ" run --model "$T/w16.gguf" --artifact "$T/cal_gemma3.kvq" --prompt hi -n 4 --temp 0 -q
  gguf_edit "$T/mamba.gguf" general.architecture mamba
  expect_error gguf_unknown_architecture 1 \
    "^kvq capture: $T/mamba\.gguf: general\.architecture: unsupported architecture 'mamba'" \
    -- "$KVQ" capture --model "$T/mamba.gguf" --corpus uuid:1 -o "$T/out_mamba"
  gguf_edit "$T/yarn.gguf" gemma3.rope.scaling.type yarn
  expect_error gguf_unknown_rope_scaling 1 \
    "^kvq capture: $T/yarn\.gguf: gemma3\.rope\.scaling\.type: unsupported rope scaling type 'yarn'" \
    -- "$KVQ" capture --model "$T/yarn.gguf" --corpus uuid:1 -o "$T/out_gyarn"
else
  skip gguf_metadata "the gguf Python package is not installed (make deps installs it)"
fi

# ---- a capture.json whose per-layer list contradicts its attention fields ---------------
cp -r "$T/cap3" "$T/cap3bad"
"$PYTHON" - "$T/cap3bad/capture.json" <<'EOF'
import json, sys
p = sys.argv[1]
d = json.load(open(p))
d["model"]["attention"]["layers"][5]["window"] = 8
json.dump(d, open(p, "w"))
EOF
expect_error capture_json_contradiction 1 \
  "capture\.json: model\.attention\.layers\[5\]\.window = 8 contradicts model\.attention" \
  -- "$KVQ" moments --capture "$T/cap3bad" -o "$T/mbad.safetensors"
[ -e "$T/mbad.safetensors" ] && fail capture_json_contradiction_nothing_written "exists"

cli_done
