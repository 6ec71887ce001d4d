#!/usr/bin/env bash
# kill9.sh — `kvq fit` and `kvq calibrate` killed with SIGKILL at random moments: after
# each kill the output is absent or complete (byte for byte the uninterrupted run's:
# never half-written), and the same command run again finishes with exactly the bytes
# of an uninterrupted run (fit resumes from OUT.kvq.ckpt/, calibrate from its work
# directory). KVQ_KILL_ROUNDS (default 2 per command) and KVQ_KILL_SEED set the size;
# `make fuzz` runs the long form. Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/kill9
mkdir -p "$T"
ROUNDS=${KVQ_KILL_ROUNDS:-2}
RANDOM=${KVQ_KILL_SEED:-1}
# stories260K, else SmolLM2 (its fit on layers 0-4)
if ! real_model; then
  skip kill9 "$no_model"; cli_done; exit
fi
# (SmolLM2's calibrate takes about 8 s: one kill per command unless asked for more)
[ "$IS_STORIES" = 1 ] || ROUNDS=${KVQ_KILL_ROUNDS:-1}
echo "kill -9 test: $ROUNDS kills per command, seed ${KVQ_KILL_SEED:-1} (KVQ_KILL_SEED)"
now_ms() { date +%s%3N; }

# killed NAME OUT REF MS CMD...: starts CMD, kills it with SIGKILL after a random part
# of MS milliseconds, checks OUT, reruns CMD to the end and compares OUT with REF.
killed() {
  local name=$1 out=$2 ref=$3 ms=$4; shift 4
  local delay=$((RANDOM % (ms + 1)))
  "$@" >/dev/null 2>"$T/killed.err" &
  local pid=$!
  sleep "$(awk -v d="$delay" 'BEGIN { printf "%.3f", d / 1000 }')"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if [ -e "$out" ]; then  # the output is published last: complete, or absent
    if cmp -s "$out" "$ref"; then ok "$name (killed after $delay ms, output complete)"
    else fail "$name" "killed after $delay ms: $out exists and differs from the uninterrupted run"; fi
    return
  fi
  if ! "$@" >/dev/null 2>"$T/rerun.err"; then
    fail "$name" "killed after $delay ms; the rerun failed:" "$(head -3 "$T/rerun.err")"
  elif ! cmp -s "$out" "$ref"; then
    fail "$name" "killed after $delay ms; the rerun's output differs from the uninterrupted run"
  else
    ok "$name (killed after $delay ms)"
  fi
}

# ---- kvq fit ----------------------------------------------------------------------------
if ! "$KVQ" capture --model "$M" --corpus uuid:4 --seq-len 64 --max-tokens 1024 --threads 1 \
       --layers 0-4 -q -o "$T/cap" 2>"$T/err" ||
   ! "$KVQ" moments --capture "$T/cap" -q -o "$T/mom.safetensors" 2>>"$T/err"; then
  fail kill9_fit "capture or moments failed:" "$(head -3 "$T/err")"; cli_done; exit
fi
# commands as arrays, not functions: a function put in the background is a subshell, and
# SIGKILL to it would leave kvq running
fit=("$KVQ" fit --capture "$T/cap" --moments "$T/mom.safetensors" --codebook 16 --iters 6
     --threads 1 -q)
t0=$(now_ms)
if ! "${fit[@]}" -o "$T/ref.kvq" 2>"$T/err"; then
  fail kill9_fit "the uninterrupted fit failed:" "$(head -3 "$T/err")"; cli_done; exit
fi
fit_ms=$(($(now_ms) - t0 + 50))
for ((r = 0; r < ROUNDS; r++)); do
  rm -rf "$T/k.kvq" "$T/k.kvq.ckpt"
  killed "kill9_fit_$r" "$T/k.kvq" "$T/ref.kvq" "$fit_ms" "${fit[@]}" -o "$T/k.kvq"
done

# ---- kvq calibrate ----------------------------------------------------------------------
cal=("$KVQ" calibrate --model "$M" --seq-len 64 --max-tokens 512 --heldout-tokens 128
     --codebook 16 --iters 3 --threads 1 -q)
t0=$(now_ms)
if ! "${cal[@]}" --work "$T/ref.work" -o "$T/cref.kvq" >/dev/null 2>"$T/err"; then
  fail kill9_calibrate "the uninterrupted calibrate failed:" "$(head -3 "$T/err")"; cli_done; exit
fi
cal_ms=$(($(now_ms) - t0 + 50))
for ((r = 0; r < ROUNDS; r++)); do
  rm -rf "$T/c.kvq" "$T/c.work"
  killed "kill9_calibrate_$r" "$T/c.kvq" "$T/cref.kvq" "$cal_ms" "${cal[@]}" --work "$T/c.work" -o "$T/c.kvq"
done
cli_done
