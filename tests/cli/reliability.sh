#!/usr/bin/env bash
# reliability.sh — nothing a user owns is deleted, nothing wrong is accepted silently
# (issue 12): --force replaces only kvq's own outputs, calibrate --work leaves what it
# did not make, fit refuses moments of another capture, outputs are checked before the
# work, temporaries go away on SIGTERM and stale ones on a rerun. Run by
# tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/rel
mkdir -p "$T"

if ! real_model; then
  for n in force_user_dir force_dot force_own_dir calibrate_work_user_capture \
           fit_other_capture fit_missing_layer fit_layers_restrict fit_out_checked_first \
           profile_out_checked_first moments_force_user_file fit_force_user_file \
           pats_never_chooses_no_saving \
           sigterm_removes_temporaries rerun_removes_stale_temporaries; do
    skip "$n" "$no_model"
  done
  cli_done; exit
fi
cap() { "$KVQ" capture --model "$M" --threads 1 --seq-len 32 --max-tokens 128 -q "$@"; }

# ---- --force replaces only a kvq capture directory --------------------------------------
mkdir -p "$T/docs" && echo "my notes" >"$T/docs/notes.txt"
expect_error force_user_dir 1 "docs/notes\.txt: not written by kvq; kvq does not delete files it did not write" -- \
  cap --corpus uuid:2 --force -o "$T/docs"
[ "$(cat "$T/docs/notes.txt" 2>/dev/null)" = "my notes" ] || fail force_user_dir_kept "$(ls "$T/docs")"
mkdir -p "$T/cwd" && echo x >"$T/cwd/keep"
_cli_run bash -c "cd '$T/cwd' && exec \"\$0\" capture --model '$M' --corpus uuid:2 --seq-len 32 \
  --max-tokens 64 -q --force -o ." "$KVQ"
if [ "$(cat "$CLI_TMP/rc")" = 1 ] && grep -q "^kvq capture: \./keep: not written by kvq" \
     "$CLI_TMP/stderr" && [ "$(ls -A "$T/cwd")" = keep ] && [ ! -e "$T/cwd.lock" ]; then
  ok force_dot
else
  fail force_dot "exit $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")" "$(ls -A "$T/cwd")"
fi
cap --corpus uuid:2 --layers 0,1,2,3,4 -o "$T/a"
_cli_run cap --corpus uuid:2 --max-tokens 96 --force -o "$T/a"
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && grep -q '"n_tokens": 96' "$T/a/capture.json" &&
   [ "$(ls -A "$T" | grep -c '^a\.')" = 0 ]; then
  ok force_own_dir
else
  fail force_own_dir "exit $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")" "$(ls -A "$T")"
fi
cap --corpus uuid:2 --layers 0,1,2,3,4 --force -o "$T/a"

# ---- calibrate --work: a subdirectory it did not make is left alone ---------------------
mkdir -p "$T/work/capture" && echo "mine" >"$T/work/capture/thesis.txt"
_cli_run "$KVQ" calibrate --model "$M" --corpus uuid:2 --max-tokens 64 --seq-len 32 \
  --work "$T/work" -q -o "$T/cal.kvq"
if [ "$(cat "$CLI_TMP/rc")" = 1 ] && grep -q "work: not a kvq work directory (no \.kvq-work mark" \
     "$CLI_TMP/stderr" && [ "$(cat "$T/work/capture/thesis.txt" 2>/dev/null)" = mine ] &&
   [ ! -e "$T/cal.kvq" ]; then
  ok calibrate_work_user_capture
else
  fail calibrate_work_user_capture "exit $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")" \
    "$(ls -A "$T/work" "$T/work/capture")"
fi

# ---- fit: moments of another capture, and missing layers ------------------------------
cap --corpus uuid:2 --layers 0,1,2,3,4 --seed 9 -o "$T/b"    # other tokens, same model
cap --corpus uuid:2 --layers 0,1 -o "$T/c"                   # same tokens, 2 of 5 layers
"$KVQ" moments --capture "$T/b" -q -o "$T/b.st"
"$KVQ" moments --capture "$T/c" -q -o "$T/c.st"
expect_error fit_other_capture 1 "b\.st vs .*a/capture\.json: computed from another capture \(corpus\.hash" -- \
  "$KVQ" fit --capture "$T/a" --moments "$T/b.st" --iters 2 -q -o "$T/x.kvq"
expect_error fit_missing_layer 1 "c\.st has no layer 2 of .*a \(give --layers" -- \
  "$KVQ" fit --capture "$T/a" --moments "$T/c.st" --iters 2 -q -o "$T/x.kvq"
_cli_run "$KVQ" fit --capture "$T/a" --moments "$T/c.st" --iters 2 --layers 0,1 -q -o "$T/x.kvq"
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ -f "$T/x.kvq" ]; then
  ok fit_layers_restrict
else
  fail fit_layers_restrict "exit $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")"
fi

# ---- the output is checked before the work (one line: no progress, no log before it) -----
expect_error fit_out_checked_first 1 "^kvq fit: $T/nodir/f\.kvq: cannot create: No such file" -- \
  "$KVQ" fit --capture "$T/a" --moments "$T/c.st" --layers 0,1 --iters 2 --no-checkpoint \
  -o "$T/nodir/f.kvq"
expect_error profile_out_checked_first 1 "^kvq profile: $T/nodir/p\.kvq: cannot create: No such file" -- \
  "$KVQ" profile --capture "$T/a" --artifact "$T/x.kvq" -o "$T/nodir/p.kvq"
echo "draft" >"$T/paper.txt"
expect_error moments_force_user_file 1 "paper\.txt: exists and is not a kvq moments file" -- \
  "$KVQ" moments --capture "$T/a" --force -q -o "$T/paper.txt"
expect_error fit_force_user_file 1 "paper\.txt: exists and is not a \.kvq artifact" -- \
  "$KVQ" fit --capture "$T/a" --moments "$T/c.st" --layers 0,1 --iters 2 --force -q \
  -o "$T/paper.txt"
[ "$(cat "$T/paper.txt")" = draft ] || fail force_user_file_kept "$(cat "$T/paper.txt")"

# ---- PATS: with head dim 8 a packed row (one 64-byte block) costs 4x the f16 row (16
# bytes), so no setting saves memory and none may be chosen -------------------------------
# (With a larger head dim, e.g. SmolLM2's 64, the f16 row is 128 bytes: then the setting
# PATS chooses must save memory, its memory fraction below 1.)
_cli_run "$KVQ" profile --capture "$T/a" --artifact "$T/x.kvq" -o "$T/p.kvq"
pats_mem=$(sed -n 's/.*pats: chose .* memory \([0-9.]*\),.*/\1/p' "$CLI_TMP/stderr")
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && { if [ $((2 * MI_HEAD_DIM)) -le 64 ]; then
     grep -q "warning: profile: pats: no setting saves memory" "$CLI_TMP/stderr" &&
     "$KVQ" inspect "$T/p.kvq" | grep -Eq '^  pats +no setting chosen'
   else [ -n "$pats_mem" ] && "$PYTHON" -c "import sys; assert 0 < float(sys.argv[1]) < 1" "$pats_mem"
   fi; }; then
  ok pats_never_chooses_no_saving
else
  fail pats_never_chooses_no_saving "exit $(cat "$CLI_TMP/rc")" "$(grep -i pats "$CLI_TMP/stderr")"
fi

# ---- temporaries: removed on SIGTERM; a killed run's removed by the rerun --------------
# A capture long enough to be caught writing (about 10 s on stories260K).
# Starts long_cap, waits for its temporary directory, sends signal $1; prints the exit code.
kill_when_writing() {
  # (SmolLM2: layer 0 alone, which bounds the disk it writes before the signal)
  "$KVQ" capture --model "$M" --threads 1 --corpus uuid:200 --seq-len 256 --max-tokens 100000 \
    $([ "$IS_STORIES" = 1 ] || echo --layers 0) -q -o "$T/big" 2>/dev/null &
  local pid=$!
  for _ in $(seq 400); do
    ls -A "$T" | grep -q '^big\.tmp\.' && break
    sleep 0.025
  done
  sleep 0.2
  kill "-$1" "$pid"; wait "$pid" 2>/dev/null; echo $?
}
rc=$(kill_when_writing TERM)
if [ "$rc" = 143 ] && [ "$(ls -A "$T" | grep -c '^big')" = 0 ]; then
  ok sigterm_removes_temporaries
else
  fail sigterm_removes_temporaries "exit $rc" "$(ls -A "$T")"
fi
rc=$(kill_when_writing KILL)
left=$(ls -A "$T" | grep -c '^big\.tmp\.')
cap --corpus uuid:2 -o "$T/big"
if [ "$rc" = 137 ] && [ "$left" = 1 ] && [ "$(ls -A "$T" | grep '^big')" = big ]; then
  ok rerun_removes_stale_temporaries
else
  fail rerun_removes_stale_temporaries "exit $rc, $left temporaries after the kill" "$(ls -A "$T")"
fi

cli_done
