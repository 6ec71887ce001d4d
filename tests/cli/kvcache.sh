#!/usr/bin/env bash
# kvq eval / kvq run --kv: the compressed caches end to end on the real tiny model
# (PATS with nothing truncated is full attention up to f16 rounding; LeanKV's memory
# adds up by section; greedy text of run), and exit codes and messages for bad input
# (settings missing, out of range); retrieval over a compressed cache (PATS b=0 holds
# the f16 rows: the same perplexity and text as retrieval over f16).
set -u
KVQ=${KVQ:-build/kvq}
PYTHON=${PYTHON:-python3}
MODEL=${KVQ_TEST_MODEL:-../shared/models/stories260K.gguf}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok kvcache: $1"; }
fail() { echo "FAIL kvcache: $1"; }
check() { if eval "$2"; then ok "$1"; else fail "$1"; fi; }

# ---- argument errors (checked before the model opens) --------------------------------
"$KVQ" eval --model x --corpus uuid:1 --kv int8 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval --kv int8" '[ $rc -eq 2 ] && [ "$(tail -1 "$tmp/err")" = "kvq eval: --kv: unknown cache kind '"'int8'"' (f16, leankv, pats, leankv+pats, a list of them separated by commas, or all)" ]'
"$KVQ" eval --model x --corpus uuid:1 --kv leankv,int9,pats >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval --kv list with an unknown kind names it" '[ $rc -eq 2 ] && grep -q "^kvq eval: --kv: unknown cache kind '"'int9'"'" "$tmp/err"'
"$KVQ" eval --model x --corpus uuid:1 --kv pats,leankv,pats >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval --kv list with a kind twice" '[ $rc -eq 2 ] && [ "$(tail -1 "$tmp/err")" = "kvq eval: --kv: pats is listed twice" ]'
"$KVQ" eval --model x --corpus uuid:1 --kv all,f16 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval --kv all stands alone" '[ $rc -eq 2 ] && grep -q "^kvq eval: --kv: unknown cache kind '"'all'"'" "$tmp/err"'
"$KVQ" run --model x --kv leankv,pats >"$tmp/out" 2>"$tmp/err"; rc=$?
check "run --kv takes one kind" '[ $rc -eq 2 ] && [ "$(tail -1 "$tmp/err")" = "kvq run: --kv must be f16, leankv, pats or leankv+pats" ]'
"$KVQ" eval --help >"$tmp/out"; rc=$?
check "eval --help describes --kv LIST" '[ $rc -eq 0 ] && grep -q "^  --kv LIST " "$tmp/out" && grep -q "\"decode\"" "$tmp/out"'
"$KVQ" eval --model x --corpus uuid:1 --kv pats --pats-b 3:11 >/dev/null 2>"$tmp/err"; rc=$?
check "eval --pats-b 3:11" '[ $rc -eq 2 ] && grep -q "^kvq eval: --pats-b must be MIN:MAX with 0 <= MIN <= MAX <= 10" "$tmp/err"'
"$KVQ" eval --model x --corpus uuid:1 --kv pats --pats-schedule middle >/dev/null 2>"$tmp/err"; rc=$?
check "eval --pats-schedule middle" '[ $rc -eq 2 ] && grep -q "^kvq eval: --pats-schedule must be" "$tmp/err"'
"$KVQ" eval --model x --corpus uuid:1 --kv leankv --alpha-h -1 >/dev/null 2>"$tmp/err"; rc=$?
check "eval --alpha-h -1" '[ $rc -eq 2 ] && grep -q "^kvq eval: --alpha-h: " "$tmp/err"'

if [ ! -f "$MODEL" ]; then
    echo "skip kvcache: the model tests: $MODEL not found"
    exit 0
fi
printf 'Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. One day, she saw a big, red ball in the park. She ran to the ball and kicked it very hard. The ball flew up into the sky and landed in a tree.\n' >"$tmp/story.txt"
C="file:$tmp/story.txt"

# ---- settings missing or out of range ------------------------------------------------
"$KVQ" eval --model "$MODEL" --corpus "$C" --kv leankv >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval leankv without thresholds" '[ $rc -eq 2 ] && [ ! -s "$tmp/out" ] && [ "$(tail -1 "$tmp/err")" = "kvq eval: --kv leankv needs --artifact with a profile (run kvq profile), or --alpha-h and --alpha-l" ]'
"$KVQ" eval --model "$MODEL" --corpus "$C" --kv pats --pats-b 2:8 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval pats without schedule" '[ $rc -eq 2 ] && [ ! -s "$tmp/out" ] && grep -q "^kvq eval: --kv pats needs" "$tmp/err"'
"$KVQ" eval --model "$MODEL" --corpus "$C" --kv leankv --alpha-h 0.5 --alpha-l 1 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval alpha_l above alpha_h" '[ $rc -eq 1 ] && [ ! -s "$tmp/out" ] && [ "$(tail -1 "$tmp/err")" = "kvq eval: leankv: alpha_l 1 above alpha_h 0.5" ]'
"$KVQ" eval --model "$MODEL" --corpus "$C" --kv leankv --artifact "$tmp/none.kvq" --alpha-h 1 --alpha-l 0 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval missing artifact" '[ $rc -eq 1 ] && [ ! -s "$tmp/out" ] && grep -q "none.kvq" "$tmp/err"'
"$KVQ" eval --model "$MODEL" --corpus "$C" --kv leankv+pats --alpha-h 1 --alpha-l 0 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval leankv+pats needs PATS's settings too" '[ $rc -eq 2 ] && [ ! -s "$tmp/out" ] && grep -q "^kvq eval: --kv leankv+pats needs" "$tmp/err"'
"$KVQ" eval --model "$MODEL" --corpus "$C" --kv pats --pats-schedule old-heavy --pats-b 2:8 --selectors oracle --budgets 50% --positions wrope >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval --kv with retrieval needs positions rope" '[ $rc -eq 1 ] && [ ! -s "$tmp/out" ] && grep -q "needs positions rope (--positions rope" "$tmp/err"'

# ---- end to end -----------------------------------------------------------------------
"$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 64 --kv pats --pats-schedule middle-heavy --pats-b 0:0 --json -q >"$tmp/p0.json"; rc=$?
check "eval pats b=0 is full attention" '[ $rc -eq 0 ] && "$PYTHON" -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert r[\"kv\"] == \"pats\" and r[\"predicted\"] > 0
assert abs(r[\"ppl\"] / r[\"ppl_full\"] - 1) < 2e-3, r
assert r[\"bytes_per_token\"] >= r[\"f16_bytes_per_token\"]  # d = 8: a row is one block
" "$tmp/p0.json"'
"$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 64 --kv leankv --alpha-h 1 --alpha-l 0.3 --kv-window 4 --json -q >"$tmp/lk.json"; rc=$?
check "eval leankv memory by section" '[ $rc -eq 0 ] && "$PYTHON" -c "
import json, sys
r = json.load(open(sys.argv[1]))
t = r[\"bytes_high_per_token\"] + r[\"bytes_low_per_token\"] + r[\"bytes_exact_per_token\"]
assert abs(t - r[\"bytes_per_token\"]) < 1e-6 * r[\"bytes_per_token\"], r
assert r[\"of_f16\"] < 1 and r[\"ppl\"] > 0 and r[\"prompt_fraction\"] == 0.5
" "$tmp/lk.json"'
"$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 64 --kv leankv+pats --alpha-h 1 --alpha-l 0.3 --kv-window 4 --pats-schedule middle-heavy --pats-b 2:8 --json -q >"$tmp/lp.json"; rc=$?
check "eval leankv+pats" '[ $rc -eq 0 ] && "$PYTHON" -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert r[\"kv\"] == \"leankv+pats\" and r[\"alpha_h\"] == 1 and r[\"schedule\"] == \"middle-heavy\", r
assert r[\"b_min\"] == 2 and r[\"b_max\"] == 8 and r[\"ppl\"] > 0 and r[\"of_f16\"] < 1, r
" "$tmp/lp.json"'
# retrieval over a compressed cache: PATS with nothing truncated holds the f16 rows
R="--seq-len 64 --selectors full,oracle --budgets 25% --window 4 --positions rope --json -q"
"$KVQ" eval --model "$MODEL" --corpus "$C" $R --kv f16 >"$tmp/rf.json"; rc1=$?
"$KVQ" eval --model "$MODEL" --corpus "$C" $R --kv pats --pats-schedule old-heavy --pats-b 0:0 >"$tmp/rp.json"; rc2=$?
"$KVQ" eval --model "$MODEL" --corpus "$C" $R --kv leankv+pats --alpha-h 1 --alpha-l 0.3 --kv-window 4 --pats-schedule middle-heavy --pats-b 2:8 >"$tmp/rl.json"; rc3=$?
check "eval retrieval over pats b=0 is retrieval over f16; leankv+pats rows" '[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && "$PYTHON" -c "
import json, sys
f, p, l = ([json.loads(x) for x in open(a)] for a in sys.argv[1:4])
assert len(f) == len(p) == len(l) == 2, (f, p, l)
for a, b in zip(f, p):
    assert a[\"selector\"] == b[\"selector\"] and abs(a[\"ppl\"] / b[\"ppl\"] - 1) < 1e-6, (a, b)
    assert a[\"ppl_full\"] == b[\"ppl_full\"] and b[\"kv\"] == \"pats\"
assert f[1][\"attended\"] < 0.9 and l[0][\"kv\"] == \"leankv+pats\" and l[1][\"of_f16\"] < 1
" "$tmp/rf.json" "$tmp/rp.json" "$tmp/rl.json"'
# ---- one command, every kind: the rows equal the single-kind commands' -----------------
# seq-len 20: 6 sequences; each kind alone and with full / oracle 25%; the references
# (chunks, decode) once each. Every field of a single-kind object equals the row's.
S="--seq-len 20 --threads 1 --json -q"
LK="--alpha-h 1 --alpha-l 0.3 --kv-window 4"; PA="--pats-schedule middle-heavy --pats-b 2:8"
R2="--selectors full,oracle --budgets 25% --window 4 --positions rope"
"$KVQ" eval --model "$MODEL" --corpus "$C" $S --kv all $LK $PA $R2 >"$tmp/all.json"; rc=$?
ok1=0
for k in leankv pats leankv+pats; do
    "$KVQ" eval --model "$MODEL" --corpus "$C" $S --kv $k $LK $PA >"$tmp/one_$k.json" || ok1=1
done
for k in f16 leankv pats leankv+pats; do
    "$KVQ" eval --model "$MODEL" --corpus "$C" $S --kv $k $LK $PA $R2 >"$tmp/retr_$k.json" || ok1=1
done
check "eval --kv all: every row equals its single-kind command's" '[ $rc -eq 0 ] && [ $ok1 -eq 0 ] && "$PYTHON" -c "
import json, sys
d = sys.argv[1]
t = json.load(open(d + \"/all.json\"))
rows = t[\"rows\"]
assert [(r[\"kv\"], r.get(\"selector\")) for r in rows] == [(k, s) for k in (\"f16\", \"leankv\", \"pats\", \"leankv+pats\") for s in (None, \"full\", \"oracle\")], rows
assert t[\"sequences\"] == 6 and set(t[\"references\"]) == {\"chunks\", \"decode\"}, t
singles = []
for k in (\"leankv\", \"pats\", \"leankv+pats\"):
    singles.append(json.load(open(d + \"/one_\" + k + \".json\")))
for k in (\"f16\", \"leankv\", \"pats\", \"leankv+pats\"):
    singles += [json.loads(x) for x in open(d + \"/retr_\" + k + \".json\")]
assert len(singles) == 11, singles
for s in singles:
    m = [r for r in rows if r[\"kv\"] == s[\"kv\"] and r.get(\"selector\") == s.get(\"selector\")]
    assert len(m) == 1, (s, m)
    for key, v in s.items():
        assert m[0][key] == v, (key, s, m[0])
    assert m[0][\"reference\"] == (\"decode\" if \"selector\" in s else \"chunks\"), m[0]
    assert m[0][\"ppl_full\"] == t[\"references\"][m[0][\"reference\"]][\"ppl\"], (m[0], t[\"references\"])
f = rows[0]
assert f[\"attention\"] == \"full\" and f[\"ppl\"] == f[\"ppl_full\"] and f[\"of_f16\"] == 1, f
assert f[\"predicted\"] == t[\"references\"][\"chunks\"][\"predicted\"] > 0, f
" "$tmp"'
"$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 20 --threads 1 --kv leankv,f16 $LK >"$tmp/tab.txt" 2>"$tmp/err"; rc=$?
check "eval --kv leankv,f16: one text table, the kinds in the list's order, progress and the references on stderr" '[ $rc -eq 0 ] && [ "$(grep -c "^leankv  *full  *chunks " "$tmp/tab.txt")" = 1 ] && [ "$(grep -c "^f16  *full  *chunks .* +0.000% " "$tmp/tab.txt")" = 1 ] && [ "$(grep -A1 "^kind " "$tmp/tab.txt" | tail -1 | cut -c1-6)" = "leankv" ] && grep -q "^reference   chunks " "$tmp/tab.txt" && ! grep -q "^reference   decode" "$tmp/tab.txt" && grep -q "^kvq: eval 1/2: leankv, full .*/" "$tmp/err" && grep -q "^kvq: full attention (reference chunks): perplexity" "$tmp/err"'
"$KVQ" eval --model "$MODEL" --corpus "$C" $S --kv all $LK >"$tmp/all2.json" 2>"$tmp/err"; rc=$?
check "eval --kv all leaves out the kinds without settings" '[ $rc -eq 0 ] && "$PYTHON" -c "
import json, sys
t = json.load(open(sys.argv[1]))
assert [r[\"kv\"] for r in t[\"rows\"]] == [\"f16\", \"leankv\"] and list(t[\"references\"]) == [\"chunks\"], t
" "$tmp/all2.json"'
"$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 20 --kv all $LK >/dev/null 2>"$tmp/err"
check "eval --kv all says which kind it left out and why" 'grep -q "^kvq: --kv all: pats left out (neither pats.schedule in the artifact nor --pats-schedule)$" "$tmp/err"'
"$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 20 --kv leankv,pats $LK >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval --kv list: settings missing for one kind name it" '[ $rc -eq 2 ] && [ ! -s "$tmp/out" ] && [ "$(tail -1 "$tmp/err")" = "kvq eval: --kv pats needs --artifact with a profile, or --pats-schedule and --pats-b" ]'
"$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 20 --kv leankv,pats,f16 --alpha-h 0.5 --alpha-l 1 $PA >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval --kv list: a bad setting fails before any row" '[ $rc -eq 1 ] && [ ! -s "$tmp/out" ] && [ "$(tail -1 "$tmp/err")" = "kvq eval: leankv: alpha_l 1 above alpha_h 0.5" ] && ! grep -q "reference" "$tmp/err"'
"$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 64 --kv pats --pats-schedule old-heavy --pats-b 1:3 --device cuda >"$tmp/out" 2>"$tmp/err"; rc=$?
check "eval --kv with --device cuda says it runs on the CPU" '[ $rc -eq 0 ] && grep -q "^kvq: warning: --kv pats has no CUDA path: it runs on the CPU$" "$tmp/err" && grep -q "^perplexity " "$tmp/out"'
"$KVQ" run --model "$MODEL" -n 24 --temp 0 --kv leankv --alpha-h 0 --alpha-l 0 --kv-window 1000 -q >"$tmp/lk.txt" 2>"$tmp/err"; rc=$?
"$KVQ" run --model "$MODEL" -n 24 --temp 0 -q >"$tmp/full.txt" 2>/dev/null
check "run leankv generates" '[ $rc -eq 0 ] && [ -s "$tmp/lk.txt" ]'
"$KVQ" run --model "$MODEL" -n 24 --temp 0 --kv pats --pats-schedule new-heavy --pats-b 0:0 -q >"$tmp/p0.txt" 2>/dev/null; rc=$?
check "run pats b=0 matches full attention's greedy text" '[ $rc -eq 0 ] && cmp -s "$tmp/p0.txt" "$tmp/full.txt"'
"$KVQ" run --model "$MODEL" -n 24 --temp 0 --selector oracle --budget 30% --window 4 --positions rope -q >"$tmp/r16.txt" 2>/dev/null; rc1=$?
"$KVQ" run --model "$MODEL" -n 24 --temp 0 --selector oracle --budget 30% --window 4 --positions rope --kv pats --pats-schedule new-heavy --pats-b 0:0 -q >"$tmp/rp0.txt" 2>/dev/null; rc2=$?
"$KVQ" run --model "$MODEL" -n 24 --temp 0 --selector oracle --budget 30% --window 4 --positions rope --kv leankv --alpha-h 1 --alpha-l 0.3 --kv-window 4 >"$tmp/rlk.txt" 2>"$tmp/err"; rc3=$?
check "run with retrieval over pats b=0 matches retrieval over f16; over leankv it runs" '[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && [ -s "$tmp/r16.txt" ] && cmp -s "$tmp/r16.txt" "$tmp/rp0.txt" && grep -q "^kvq: kv leankv: .* bytes/token held" "$tmp/err" && grep -q "^kvq: retrieval: oracle" "$tmp/err"'

# ---- the settings from an artifact's profile (capture, moments, fit, profile) ---------
if "$KVQ" capture --model "$MODEL" --corpus uuid:8 --seq-len 128 --max-tokens 512 --threads 1 -q \
     -o "$tmp/cap" 2>"$tmp/err" &&
   "$KVQ" moments --capture "$tmp/cap" -o "$tmp/mom" -q 2>>"$tmp/err" &&
   "$KVQ" fit --capture "$tmp/cap" --moments "$tmp/mom" --codebook 16 --iters 3 --threads 1 -q \
     -o "$tmp/a.kvq" 2>>"$tmp/err" &&
   "$KVQ" profile --capture "$tmp/cap" --artifact "$tmp/a.kvq" --window 32 --alpha-h 0,2 \
     --alpha-l 0,0.05 --knobs leankv,pats --tolerance 0.2 -q -o "$tmp/p.kvq" >/dev/null 2>>"$tmp/err"; then
    "$KVQ" inspect "$tmp/p.kvq" >"$tmp/inspect"
    ah=$(awk '$1 == "leankv.alpha_h" {print $2}' "$tmp/inspect")
    al=$(awk '$1 == "leankv.alpha_l" {print $2}' "$tmp/inspect")
    "$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 64 --kv leankv --artifact "$tmp/p.kvq" --json -q >"$tmp/a.json"; rc=$?
    check "eval leankv takes the artifact's thresholds" '[ $rc -eq 0 ] && [ -n "$ah" ] && "$PYTHON" -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert r[\"alpha_h\"] == float(sys.argv[2]) and abs(r[\"alpha_l\"] - float(sys.argv[3])) < 1e-12, r
assert r[\"window\"] == 32, r
" "$tmp/a.json" "$ah" "$al"'
    "$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 64 --kv leankv --artifact "$tmp/p.kvq" --alpha-h 7 --json -q >"$tmp/o.json"; rc=$?
    check "eval leankv option overrides the artifact" '[ $rc -eq 0 ] && "$PYTHON" -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert r[\"alpha_h\"] == 7 and abs(r[\"alpha_l\"] - float(sys.argv[2])) < 1e-12, r
" "$tmp/o.json" "$al"'
    # head dim 8: no PATS setting saves memory, the profile chose none
    "$KVQ" eval --model "$MODEL" --corpus "$C" --kv pats --artifact "$tmp/p.kvq" >"$tmp/out" 2>"$tmp/err"; rc=$?
    check "eval pats without a schedule in the artifact" '[ $rc -eq 1 ] && [ ! -s "$tmp/out" ] && [ "$(tail -1 "$tmp/err")" = "kvq eval: $tmp/p.kvq: --kv pats needs pats.schedule, pats.b_min and pats.b_max in the artifact (run kvq profile), or --pats-schedule and --pats-b" ]'
    "$KVQ" eval --model "$MODEL" --corpus "$C" --seq-len 64 --kv all --artifact "$tmp/p.kvq" --json >"$tmp/aa.json" 2>"$tmp/err"; rc=$?
    check "eval --kv all with the artifact: the kinds its profile gives" '[ $rc -eq 0 ] && grep -q "^kvq: --kv all: pats left out (neither pats.schedule in the artifact nor --pats-schedule)$" "$tmp/err" && "$PYTHON" -c "
import json, sys
t = json.load(open(sys.argv[1]))
assert [r[\"kv\"] for r in t[\"rows\"]] == [\"f16\", \"leankv\"], t
assert t[\"rows\"][1][\"alpha_h\"] == float(sys.argv[2]) and t[\"rows\"][1][\"window\"] == 32, t
" "$tmp/aa.json" "$ah"'
else
    fail "artifact with a profile: $(head -3 "$tmp/err")"
fi
