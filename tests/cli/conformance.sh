#!/usr/bin/env bash
# conformance.sh — kvq inspect and kvq run hold an artifact to one rule (issue 30 item
# 8): an artifact that run refuses (a required key missing, a recorded RoPE value that
# does not parse) is reported by inspect and inspect exits 1, naming the problem. The
# damaged artifacts are re-encoded by tests/helpers/edit_artifact.py (the zstandard
# package). Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/conformance
mkdir -p "$T"
spm_model
if ! "$KVQ" capture --model "$M" --corpus uuid:2 --seq-len 64 --max-tokens 256 --threads 1 -q -o "$T/c" ||
   ! "$KVQ" moments --capture "$T/c" -q -o "$T/m.safetensors" ||
   ! "$KVQ" fit --capture "$T/c" --moments "$T/m.safetensors" --codebook 4 --iters 2 --threads 1 \
       -q -o "$T/a.kvq"; then
  fail conformance_setup "capture, moments or fit failed"; cli_done; exit
fi
_cli_run "$KVQ" inspect "$T/a.kvq"
[ "$(cat "$CLI_TMP/rc")" = 0 ] && grep -q 'conforms to format' "$CLI_TMP/stdout" &&
  ok inspect_conforming_exit_0 || fail inspect_conforming_exit_0 "$(head -3 "$CLI_TMP/stderr")"

edit() { "$PYTHON" tests/helpers/edit_artifact.py "$T/a.kvq" "$@"; }
edit "$T/nob.kvq" --drop wrope.b
edit "$T/nan.kvq" --set model.rope.original_max_pos=nan
for case in "nob:missing required metadata key \"wrope\\.b\"" \
            "nan:metadata \"model\\.rope\\.original_max_pos\": 'nan' is out of range"; do
  n=${case%%:*} why=${case#*:}
  _cli_run "$KVQ" inspect "$T/$n.kvq"
  if [ "$(cat "$CLI_TMP/rc")" = 1 ] && grep -q "does not conform to format" "$CLI_TMP/stdout" &&
     grep -Eq "^kvq inspect: .*$n\\.kvq: does not conform to format [0-9.]+: $why" "$CLI_TMP/stderr"; then
    ok "inspect_nonconforming_${n}_exit_1"
  else
    fail "inspect_nonconforming_${n}_exit_1" "exit $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")"
  fi
  expect_error "inspect_json_nonconforming_${n}_exit_1" 1 "$n\\.kvq: does not conform" -- \
    bash -c '"$1" inspect --json "$2" >/dev/null' _ "$KVQ" "$T/$n.kvq"
  # run refuses the same artifact
  _cli_run "$KVQ" run --model "$M" --artifact "$T/$n.kvq" -n 1 -q
  [ "$(cat "$CLI_TMP/rc")" = 1 ] && grep -Eq "$n\\.kvq: $why" "$CLI_TMP/stderr" &&
    ok "run_refuses_nonconforming_$n" || fail "run_refuses_nonconforming_$n" "exit $(cat "$CLI_TMP/rc")"
  # and card, naming the file (issue 30 item 10)
  expect_error "card_refuses_nonconforming_$n" 1 "$n\.kvq: $why" -- "$KVQ" card "$T/$n.kvq"
done
cli_done
