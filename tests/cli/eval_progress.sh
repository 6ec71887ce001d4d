#!/usr/bin/env bash
# eval_progress.sh — `kvq eval` reports progress as calibrate does (issue 30 item 15,
# issue 34 item 3): on a terminal a live line with an ETA, in a log a line every 5 s
# and at the end, JSON lines with --json, nothing with -q; the progress total is known
# from the start (the first report says 0 of it) and the last report reaches it. The
# table on stdout is the same with and without progress. Runs on the committed
# stand-in model (spm_model), selectors that need no artifact.
. tests/helpers/clitest.sh
spm_model

T=$CLI_TMP/prog
mkdir -p "$T"
ARGS=(eval --model "$M" --corpus "uuid:2,kv-recall:1" --seq-len 64 --max-tokens 128
      --selectors full,oracle,quest --budgets 4,8 --threads 1)

# --json: every progress line on stderr is JSON; the eval reports start at 0 of a total
# known up front, never go back, and end at the total; 1 reference + 5 rows run the
# same tokens each
_cli_run "$KVQ" "${ARGS[@]}" --json
cp "$CLI_TMP/stdout" "$T/table.json"
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && out=$("$PYTHON" - "$CLI_TMP/stderr" "$T/table.json" <<'EOF' 2>&1
import json, sys
lines = open(sys.argv[1]).read().splitlines()
rows = len(json.load(open(sys.argv[2]))["rows"])
assert rows == 5, rows
prog = [json.loads(l) for l in lines if l.startswith("{")]
other = [l for l in lines if not l.startswith("{")]
assert all(l.startswith("kvq: ") for l in other), other
ev = [p for p in prog if p["progress"] == "eval"]
assert len(ev) >= 2, ev
total = ev[0]["total"]
assert total > 0 and total % (1 + rows) == 0, ev[0]
assert ev[0]["done"] == 0 and ev[0]["eta_s"] is None, ev[0]
assert all(p["total"] == total for p in ev), ev
assert all(a["done"] <= b["done"] for a, b in zip(ev, ev[1:])), ev
assert ev[-1]["done"] == total and ev[-1]["eta_s"] == 0, ev[-1]
assert all(set(p) == {"progress", "done", "total", "elapsed_s", "eta_s"} for p in prog), prog
EOF
); then ok eval_progress_json; else fail eval_progress_json "rc $(cat "$CLI_TMP/rc")" "$out" "$(head -5 "$CLI_TMP/stderr")"; fi

# -q: nothing on stderr, the same table
_cli_run "$KVQ" "${ARGS[@]}" --json -q
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ ! -s "$CLI_TMP/stderr" ] &&
   "$PYTHON" -c 'import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
for r in a["rows"] + b["rows"]:
    r.pop("seconds", None)
for d in (a, b):
    d.pop("command", None)  # its own command line, which -q is part of
assert a == b' "$T/table.json" "$CLI_TMP/stdout"; then
  ok eval_progress_quiet; else fail eval_progress_quiet "rc $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")"; fi

# a log (stderr not a terminal): text lines, the last one at 100%
_cli_run "$KVQ" "${ARGS[@]}"
last=$(grep '^kvq: eval ' "$CLI_TMP/stderr" | tail -1)
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [[ $last =~ ^kvq:\ eval\ ([0-9]+)/([0-9]+)\ \(100%, ]] &&
   [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] && ! grep -q $'\r' "$CLI_TMP/stderr"; then
  ok eval_progress_log; else fail eval_progress_log "$(head -5 "$CLI_TMP/stderr")"; fi

# a terminal (script(1) gives the command a pty; stdout goes to a file): a live line
# redrawn with \r, an ETA on every report between the start and the end, a newline at 100%
if command -v script >/dev/null 2>&1; then
  printf -v cmd '%q ' "$KVQ" "${ARGS[@]}"
  if script -qec "$cmd >$T/tty.out" "$T/tty.log" >/dev/null 2>&1 </dev/null &&
     out=$("$PYTHON" - "$T/tty.log" <<'EOF' 2>&1
import re, sys
text = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
reps = re.findall(r"\rkvq: eval (\d+)/(\d+) \((\d+)%, [0-9.]+/s(, ETA \d+s)?\)", text)
assert reps, text[-400:]
for done, total, pct, eta in reps:
    if 0 < int(done) < int(total):
        assert eta, (done, total)
assert reps[-1][0] == reps[-1][1], reps[-1]
assert re.search(r"\rkvq: eval (\d+)/\1 \(100%, [0-9.]+/s\)\r?\n", text), text[-400:]
EOF
); then ok eval_progress_tty; else fail eval_progress_tty "$out"; fi
else
  skip eval_progress_tty "script(1) (util-linux) not installed"
fi
cli_done
