# clitest.sh — the harness for tests/cli/*.sh (source it from the repository root).
#
# Each check prints exactly one line that tests/run-tests.sh counts:
#   ok NAME            FAIL NAME (details follow, indented)            skip NAME: why
# Environment (set by run-tests.sh): KVQ (the kvq binary), KVQ_BUILD (the build
# directory), KVQ_TEST_MODEL (the real tiny model), PYTHON.
# KVQ_BLESS=1 rewrites the expected files from the current output instead of comparing
# (review the diff before committing it).
#
#   expect_output NAME EXPECTED -- CMD...   CMD exits 0, prints nothing on stderr, and
#                                           its stdout equals tests/cli/expected/EXPECTED
#   expect_output_sed NAME EXPECTED SEDEXPR -- CMD...
#                                           the same after `sed -E SEDEXPR` on stdout (for
#                                           numbers that legitimately vary, e.g. sizes
#                                           that depend on the libzstd version)
#   expect_error NAME CODE REGEX -- CMD...  CMD exits CODE, prints nothing on stdout, and
#                                           its stderr is one line matching REGEX (grep -E)
#   expect_json NAME PYCODE -- CMD...       CMD exits 0; its stdout parses as JSON into
#                                           `d` and the Python assertions PYCODE hold
#   cli_done                                exit status: 1 if any check failed
set -u
KVQ=${KVQ:-$PWD/build/kvq}
KVQ_BUILD=${KVQ_BUILD:-$PWD/build}
PYTHON=${PYTHON:-python3}
CLI_EXPECTED=${CLI_EXPECTED:-$PWD/tests/cli/expected}
CLI_TMP=$(mktemp -d)
trap 'rm -rf "$CLI_TMP"' EXIT
cli_failures=0

ok() { echo "ok $1"; }
skip() { echo "skip $1: $2"; }
fail() {
  echo "FAIL $1"; shift
  local line
  for line in "$@"; do printf '  %s\n' "$line"; done
  cli_failures=$((cli_failures + 1))
}

# Runs "$@" with stdout, stderr and the exit code captured in $CLI_TMP.
_cli_run() {
  "$@" >"$CLI_TMP/stdout" 2>"$CLI_TMP/stderr"
  echo $? >"$CLI_TMP/rc"
}

expect_output() {
  local name=$1 expected=$2; shift 3
  expect_output_sed "$name" "$expected" '' -- "$@"
}

expect_output_sed() {
  local name=$1 expected=$CLI_EXPECTED/$2 sedexpr=$3; shift 4
  _cli_run "$@"
  if [ -n "$sedexpr" ]; then
    sed -E "$sedexpr" "$CLI_TMP/stdout" >"$CLI_TMP/stdout.sed" && mv "$CLI_TMP/stdout.sed" "$CLI_TMP/stdout"
  fi
  local rc; rc=$(cat "$CLI_TMP/rc")
  if [ "$rc" != 0 ] || [ -s "$CLI_TMP/stderr" ]; then
    fail "$name" "exit $rc, stderr:" "$(head -5 "$CLI_TMP/stderr")"; return
  fi
  if [ "${KVQ_BLESS:-0}" = 1 ]; then
    mkdir -p "$(dirname "$expected")"; cp "$CLI_TMP/stdout" "$expected"
    ok "$name (blessed $expected)"; return
  fi
  if [ ! -f "$expected" ]; then
    fail "$name" "missing $expected (run with KVQ_BLESS=1 to create it)"; return
  fi
  if cmp -s "$expected" "$CLI_TMP/stdout"; then
    ok "$name"
  else
    fail "$name" "output differs from $expected:" "$(diff "$expected" "$CLI_TMP/stdout" | head -20)"
  fi
}

expect_error() {
  local name=$1 code=$2 regex=$3; shift 4
  _cli_run "$@"
  local rc; rc=$(cat "$CLI_TMP/rc")
  local lines; lines=$(wc -l <"$CLI_TMP/stderr")
  if [ "$rc" != "$code" ]; then
    fail "$name" "exit $rc, expected $code; stderr:" "$(head -3 "$CLI_TMP/stderr")"
  elif [ -s "$CLI_TMP/stdout" ]; then
    fail "$name" "unexpected stdout:" "$(head -3 "$CLI_TMP/stdout")"
  elif [ "$lines" != 1 ] || ! grep -Eq -- "$regex" "$CLI_TMP/stderr"; then
    fail "$name" "stderr does not match /$regex/:" "$(head -3 "$CLI_TMP/stderr")"
  else
    ok "$name"
  fi
}

expect_json() {
  local name=$1 code=$2; shift 3
  _cli_run "$@"
  local rc; rc=$(cat "$CLI_TMP/rc")
  if [ "$rc" != 0 ]; then
    fail "$name" "exit $rc, stderr:" "$(head -3 "$CLI_TMP/stderr")"; return
  fi
  local out
  if out=$("$PYTHON" -c "
import json, sys
d = json.load(open(sys.argv[1]))
$code
" "$CLI_TMP/stdout" 2>&1); then
    ok "$name"
  else
    fail "$name" "$(printf '%s' "$out" | tail -3)"
  fi
}

# real_model: the real model the checks run on — stories260K (KVQ_TEST_MODEL) when
# present, else SmolLM2 (KVQ_SMOLLM2, fetched by `make test`), so a machine without
# ../shared skips nothing. Sets M, IS_STORIES (1/0) and the MI_* shape read from the file
# by the `gguf` package (tests/helpers/model_info.py). Returns 1 when neither exists.
real_model() {
  KVQ_TEST_MODEL=${KVQ_TEST_MODEL:-../shared/models/stories260K.gguf}
  KVQ_SMOLLM2=${KVQ_SMOLLM2:-.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
  if [ -f "$KVQ_TEST_MODEL" ]; then M=$KVQ_TEST_MODEL; IS_STORIES=1
  elif [ -f "$KVQ_SMOLLM2" ]; then M=$KVQ_SMOLLM2; IS_STORIES=0
  else M=; return 1; fi
  eval "$("$PYTHON" tests/helpers/model_info.py "$M")"
}
# spm_model: the llama + SentencePiece model that checks of the pipeline's mechanics run
# on — stories260K (KVQ_TEST_MODEL) when present, else its committed stand-in
# tests/data/tiny_spm.gguf (scripts/gen_tiny_spm.py: 4 layers x 2 KV heads, head dim 8 as
# stories260K, random weights), so they never skip. Sets M, IS_STORIES (1/0), the MI_*
# shape read by the `gguf` package, HEADS (layers x KV heads), GOLDEN: the greedy text
# of 48 tokens after BOS (stories260K: SOURCES.md; the stand-in: llama.cpp's, from
# tests/data/tiny_spm_golden.json), and GOLDEN_HEAD, its start that a retrieval run with
# a window of 16 must keep: stories260K 40 bytes (9 tokens), the stand-in 16 tokens.
spm_model() {
  KVQ_TEST_MODEL=${KVQ_TEST_MODEL:-../shared/models/stories260K.gguf}
  if [ -f "$KVQ_TEST_MODEL" ]; then
    M=$KVQ_TEST_MODEL; IS_STORIES=1
    GOLDEN="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to"
    GOLDEN_HEAD=${GOLDEN:0:40}
  else
    M=tests/data/tiny_spm.gguf; IS_STORIES=0
    local g='import json, sys; print(json.load(open("tests/data/tiny_spm_golden.json"))["greedy"][sys.argv[1]])'
    GOLDEN=$("$PYTHON" -c "$g" text); GOLDEN_HEAD=$("$PYTHON" -c "$g" text_16)
  fi
  eval "$("$PYTHON" tests/helpers/model_info.py "$M")"
  HEADS=$((MI_LAYERS * MI_KV_HEADS))
}
# The reason for a skip when real_model finds nothing.
no_model="models ${KVQ_TEST_MODEL:-../shared/models/stories260K.gguf} and ${KVQ_SMOLLM2:-.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf} not found"

cli_done() { [ "$cli_failures" -eq 0 ]; }
