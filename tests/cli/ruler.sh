#!/usr/bin/env bash
# ruler.sh — `kvq eval --suite` (the RULER-style tasks, docs/ruler.md): its option
# errors (clear message, exit 2, nothing on stdout), and a small run on the spm model:
# one JSON row per selector x budget x task x length with the dense score and the gap,
# progress as JSON lines from 0 to the total, nothing on stderr with -q and the same
# table.
. tests/helpers/clitest.sh
spm_model

F=file:docs/design.md
if [ "$IS_STORIES" = 1 ]; then LEN=1024; else LEN=$MI_CTX; fi
E=(eval --model "$M" --corpus "$F")

expect_error ruler_bad_task 2 "unknown task 'needle' \(tasks: niah_single_number, " -- \
  "$KVQ" "${E[@]}" --suite ruler:vt,needle
expect_error ruler_bad_suite 2 "suite 'babilong': the suite is ruler or ruler:TASK" -- \
  "$KVQ" "${E[@]}" --suite babilong
expect_error ruler_too_long 2 "--lengths 1048576 is longer than the context of .* \($MI_CTX tokens\)" -- \
  "$KVQ" "${E[@]}" --suite ruler --lengths "$LEN",1048576
expect_error ruler_bad_lengths 2 "--lengths '4k': a list of up to 16 token counts" -- \
  "$KVQ" "${E[@]}" --suite ruler --lengths 4k
expect_error ruler_lengths_alone 2 "--lengths and --samples need --suite" -- \
  "$KVQ" "${E[@]}" --lengths 512
expect_error ruler_too_short 2 "niah_multiquery needs more than 64 tokens" -- \
  "$KVQ" "${E[@]}" --suite ruler:niah_multiquery --lengths 64
printf 'three short words\n' >"$CLI_TMP/tiny.txt"
expect_error ruler_small_filler 2 "--corpus file:.*tiny.txt: ruler: the filler text has 3 words" -- \
  "$KVQ" eval --model "$M" --corpus "file:$CLI_TMP/tiny.txt" --suite ruler --lengths 128
expect_error ruler_samples 2 "samples" -- "$KVQ" "${E[@]}" --suite ruler --samples 0

if [ "$IS_STORIES" != 1 ]; then
  for n in ruler_json ruler_quiet_threads ruler_text ruler_progress_tty; do
    skip $n "needs stories260K: the stand-in's context (256 tokens) is shorter than a suite prompt"
  done
  cli_done; exit
fi
T=$CLI_TMP/suite
mkdir -p "$T"
ARGS=("${E[@]}" --suite ruler:niah_single_number,vt --lengths "$LEN" --samples 2
      --selectors oracle --budgets 8,16 --threads 1)
_cli_run "$KVQ" "${ARGS[@]}" --json
cp "$CLI_TMP/stdout" "$T/a.json"
out=
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && out=$("$PYTHON" - "$T/a.json" "$CLI_TMP/stderr" "$LEN" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
n = int(sys.argv[3])
rows = d["rows"]
assert d["suite"] == "ruler:niah_single_number,vt" and d["samples"] == 2, d
# full attention first (added), then oracle at 8 and 16; two tasks at one length
assert [(r["selector"], r["budget"]) for r in rows[::2]] == [("full", "all"), ("oracle", "8"), ("oracle", "16")], rows
assert [r["task"] for r in rows] == ["niah_single_number", "vt"] * 3
for r in rows:
    assert r["suite"] == "ruler" and r["length"] == n and r["n"] == 2, r
    assert len(r["scores"]) == 2 and len(r["predictions"]) == 2, r
    assert abs(r["score"] - 50 * sum(r["scores"])) < 1e-3, r
    dense = [x for x in rows if x["selector"] == "full" and x["task"] == r["task"]][0]
    assert r["dense"] == dense["score"] and abs(r["gap"] - (r["score"] - dense["score"])) < 1e-3, r
    assert 0 <= r["score"] <= 100 and r["stderr"] >= 0, r
prog = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
ev = [p for p in prog if p["progress"] == "eval"]
assert ev[0]["done"] == 0 and ev[-1]["done"] == ev[0]["total"] > 0, ev
assert all(a["done"] <= b["done"] for a, b in zip(ev, ev[1:])), ev
PY
); then ok ruler_json; else fail ruler_json "rc $(cat "$CLI_TMP/rc")" "$out" "$(head -3 "$CLI_TMP/stderr")"; fi

# -q: nothing on stderr, the same rows (the seed fixes the prompts)
_cli_run "$KVQ" "${ARGS[@]}" --json -q --threads 2
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ ! -s "$CLI_TMP/stderr" ] &&
   "$PYTHON" -c 'import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
a.pop("seconds"); b.pop("seconds")
assert "--suite" in a.pop("command") and "--threads 2" in b.pop("command")
assert a == b' "$T/a.json" "$CLI_TMP/stdout"; then
  ok ruler_quiet_threads; else fail ruler_quiet_threads "rc $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")"; fi

# the text table: a column per task, full attention's row, the gaps
_cli_run "$KVQ" "${ARGS[@]}" -q
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && grep -q "^length $LEN: score %" "$CLI_TMP/stdout" &&
   grep -Eq '^selector +budget +s-num +vt +needles$' "$CLI_TMP/stdout" &&
   grep -Eq '^full +all +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$CLI_TMP/stdout" &&
   grep -Eq '^oracle +16 +[0-9.]+ \( *[-+][0-9.]+\)' "$CLI_TMP/stdout"; then
  ok ruler_text; else fail ruler_text "$(cat "$CLI_TMP/stdout")"; fi
# a terminal (script(1) gives the command a pty): the suite's live progress line with an
# ETA between the start and the end, as eval's (tests/cli/eval_progress.sh)
if command -v script >/dev/null 2>&1; then
  printf -v cmd '%q ' "$KVQ" "${ARGS[@]}"
  if script -qec "$cmd >$T/tty.out" "$T/tty.log" >/dev/null 2>&1 </dev/null &&
     out=$("$PYTHON" - "$T/tty.log" <<'PY' 2>&1
import re, sys
text = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
reps = re.findall(r"\rkvq: eval (\d+)/(\d+) \((\d+)%, [0-9.]+/s(, ETA \d+s)?\)", text)
assert len(reps) >= 3, text[-400:]
assert all(eta for d, t, p, eta in reps if 0 < int(d) < int(t)), reps
assert reps[-1][0] == reps[-1][1], reps[-1]
PY
); then ok ruler_progress_tty; else fail ruler_progress_tty "$out"; fi
else
  skip ruler_progress_tty "script(1) (util-linux) not installed"
fi
cli_done
