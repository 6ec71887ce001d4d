#!/usr/bin/env bash
# concurrent.sh — the corruption battery's concurrent-run and user-file cases (issue 30
# items 1, 2 and 4): two real `kvq calibrate` runs on the tiny model sharing a work
# directory or an output (the second stops at once, naming the holder, and changes
# nothing; the first finishes with its own bytes), a holder killed with -9 leaves no
# lock held, an existing artifact that the run did not make is replaced only with
# --force, and a work directory that kvq did not make is not touched.
# Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/concurrent
mkdir -p "$T"
spm_model

CAL=("$KVQ" calibrate --model "$M" --seq-len 128 --max-tokens 2048 --heldout-tokens 256
     --codebook 16 --iters 3 --threads 1 --no-positions -q)
cal() { "${CAL[@]}" "$@"; }

# The reference: one run alone.
cal --seed 1 --work "$T/ref.work" -o "$T/ref.kvq" >/dev/null 2>"$T/ref.err" ||
  fail concurrent_reference "$(head -3 "$T/ref.err")"

# start_held NAME ARGS...: starts `cal ARGS` in the background and stops it (SIGSTOP) as
# soon as LOCKFILE holds its name, so the second run meets a lock that is held. Sets PID.
# LOCKFILE is given in $LOCKFILE. Returns 1 when the run ended before that.
start_held() {
  "${CAL[@]}" "$@" >"$T/a.out" 2>"$T/a.err" &
  PID=$!
  for _ in $(seq 1 2000); do
    if grep -q "^pid $PID " "$LOCKFILE" 2>/dev/null; then kill -STOP "$PID"; return 0; fi
    kill -0 "$PID" 2>/dev/null || return 1
    sleep 0.01
  done
  return 1
}

# 1. The same work directory, different seeds and outputs.
LOCKFILE=$T/w/.kvq-lock
if start_held --seed 1 --work "$T/w" -o "$T/a.kvq"; then
  snap=$(cd "$T" && find w -newer "$LOCKFILE" -o -print | sort | md5sum)
  expect_error concurrent_same_work_refused 1 \
    "w is in use by another kvq run \(pid $PID on host [^ ]+ since [0-9T:Z-]+: .*calibrate.*\)" \
    -- cal --seed 2 --work "$T/w" -o "$T/b.kvq"
  [ ! -e "$T/b.kvq" ] && [ ! -e "$T/b.kvq.lock" ] &&
    [ "$(cd "$T" && find w -newer "$LOCKFILE" -o -print | sort | md5sum)" = "$snap" ] &&
    ok concurrent_same_work_second_changes_nothing ||
    fail concurrent_same_work_second_changes_nothing "$(ls -la "$T" "$T/w")"
  kill -CONT "$PID"; wait "$PID"; rc=$?
  [ "$rc" = 0 ] && cmp -s "$T/a.kvq" "$T/ref.kvq" && [ ! -e "$T/w/.kvq-lock" ] &&
    ok concurrent_same_work_first_own_bytes ||
    fail concurrent_same_work_first_own_bytes "exit $rc" "$(head -3 "$T/a.err")"
else
  fail concurrent_same_work_refused "the first run ended before its lock was seen" "$(head -3 "$T/a.err")"
fi

# 2. The same output, different work directories.
LOCKFILE=$T/o.kvq.lock
if start_held --seed 1 --work "$T/w1" -o "$T/o.kvq"; then
  expect_error concurrent_same_output_refused 1 \
    "o\.kvq is in use by another kvq run \(pid $PID on host .*\); wait for it" \
    -- cal --seed 2 --work "$T/w2" -o "$T/o.kvq"
  [ ! -e "$T/w2" ] && ok concurrent_same_output_second_no_work_dir ||
    fail concurrent_same_output_second_no_work_dir "$(ls -la "$T/w2")"
  kill -CONT "$PID"; wait "$PID"; rc=$?
  [ "$rc" = 0 ] && cmp -s "$T/o.kvq" "$T/ref.kvq" && [ ! -e "$T/o.kvq.lock" ] &&
    ok concurrent_same_output_first_own_bytes ||
    fail concurrent_same_output_first_own_bytes "exit $rc" "$(head -3 "$T/a.err")"
else
  fail concurrent_same_output_refused "the first run ended before its lock was seen"
fi

# 3. A holder killed with -9 leaves its lock file but no lock: the next run goes on.
LOCKFILE=$T/k/.kvq-lock
if start_held --seed 1 --work "$T/k" -o "$T/k.kvq"; then
  kill -9 "$PID"; kill -CONT "$PID" 2>/dev/null; wait "$PID" 2>/dev/null
  [ -e "$T/k/.kvq-lock" ] || [ -e "$T/k.kvq.lock" ] || true
  if cal --seed 1 --work "$T/k" -o "$T/k.kvq" >/dev/null 2>"$T/k.err" &&
     cmp -s "$T/k.kvq" "$T/ref.kvq"; then
    ok concurrent_killed_holder_no_stuck_lock
  else
    fail concurrent_killed_holder_no_stuck_lock "$(head -3 "$T/k.err")"
  fi
else
  fail concurrent_killed_holder_no_stuck_lock "the first run ended before its lock was seen"
fi

# 4. An artifact that this work directory did not write is replaced only with --force.
cp "$T/ref.kvq" "$T/prod.kvq"
cal --seed 2 --work "$T/p.work" -o "$T/other.kvq" >/dev/null 2>&1
cp "$T/other.kvq" "$T/prod.kvq"
expect_error calibrate_keeps_other_artifact 1 \
  'prod\.kvq: exists and is not the artifact that the work directory .*p2\.work last wrote; calibrate replaces it only with --force' \
  -- cal --seed 1 --work "$T/p2.work" -o "$T/prod.kvq"
cmp -s "$T/prod.kvq" "$T/other.kvq" && [ ! -e "$T/p2.work" ] &&
  ok calibrate_keeps_other_artifact_untouched || fail calibrate_keeps_other_artifact_untouched
if cal --seed 1 --work "$T/p2.work" --force -o "$T/prod.kvq" >/dev/null 2>"$T/p.err" &&
   cmp -s "$T/prod.kvq" "$T/ref.kvq"; then
  ok calibrate_force_replaces_other_artifact
else
  fail calibrate_force_replaces_other_artifact "$(head -3 "$T/p.err")"
fi
# its own artifact (a changed parameter) is replaced without --force, as before
if cal --seed 1 --iters 4 --work "$T/p2.work" -o "$T/prod.kvq" >"$T/p.out" 2>"$T/p.err" &&
   grep -q '^calibrate: wrote' "$T/p.out" && ! cmp -s "$T/prod.kvq" "$T/ref.kvq"; then
  ok calibrate_replaces_own_artifact
else
  fail calibrate_replaces_own_artifact "$(head -3 "$T/p.err")"
fi

# 5. A work directory kvq did not make: nothing in it is touched, even STAGE.params.json.
mkdir -p "$T/user/capture"
echo '{"mine": 1}' >"$T/user/capture.params.json"
echo 'my notes' >"$T/user/capture/notes.txt"
before=$(cd "$T/user" && find . -type f -exec md5sum {} + | sort)
expect_error calibrate_unmarked_work_refused 1 \
  "user: not a kvq work directory \(no \.kvq-work mark, and it holds '[^']+'\)" \
  -- cal --work "$T/user" -o "$T/u.kvq"
[ "$(cd "$T/user" && find . -type f -exec md5sum {} + | sort)" = "$before" ] &&
  [ "$(ls -A "$T/user" | wc -l)" = 2 ] && [ ! -e "$T/u.kvq" ] &&
  ok calibrate_unmarked_work_untouched || fail calibrate_unmarked_work_untouched "$(ls -A "$T/user")"
# an empty directory is taken (and marked)
mkdir "$T/empty.work"
if cal --work "$T/empty.work" -o "$T/e.kvq" >/dev/null 2>"$T/e.err" &&
   [ "$(head -1 "$T/empty.work/.kvq-work")" = "kvq work directory 1" ]; then
  ok calibrate_empty_work_taken_and_marked
else
  fail calibrate_empty_work_taken_and_marked "$(head -3 "$T/e.err")"
fi
cli_done
