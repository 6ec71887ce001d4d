#!/usr/bin/env bash
# messages.sh — argument errors (issue 12): one prefix style "kvq CMD: ...", exit code 2
# for every malformed argument (corpus specs included), messages that name the problem
# (a misspelt corpus kind, a budget that is no number), and examples/random_model's
# --help. None needs a model: arguments are checked before any model is read. Run by
# tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/msg
mkdir -p "$T"

expect_error corpus_unknown_kind 2 \
  "^kvq capture: corpus: 'bogus:3': unknown kind 'bogus' \(kinds: .*\) and no such file$" -- \
  "$KVQ" capture --model "$T/no-model.gguf" --corpus bogus:3 -o "$T/c"
expect_error corpus_bad_count 2 "^kvq eval: corpus: 'uuid:x': the count must be an integer" -- \
  "$KVQ" eval --model "$T/no-model.gguf" --corpus uuid:x
expect_error corpus_calibrate_exit_2 2 "^kvq calibrate: corpus: 'bogus:1': unknown kind" -- \
  "$KVQ" calibrate --model "$T/no-model.gguf" --corpus bogus:1 -o "$T/m.kvq"
expect_error corpus_missing_file_exit_1 1 "^kvq capture: corpus: $T/none\.txt: No such file" -- \
  "$KVQ" capture --model "$T/no-model.gguf" --corpus "$T/none.txt" -o "$T/c"
expect_error budget_not_a_number 2 \
  "^kvq run: budget '6%x': not a token count \(256\), a percentage \(6%\), a fraction" -- \
  "$KVQ" run --model "$T/no-model.gguf" --selector oracle --budget 6%x --prompt hi
expect_error prefix_option_error 2 "^kvq run: --sink: 'x' is not an integer$" -- \
  "$KVQ" run --model "$T/no-model.gguf" --sink x --prompt hi
expect_error rerank_below_one 2 "^kvq run: --rerank: 0.5 is not 0 \(off\), in \[1, 64\] or \+E$" -- \
  "$KVQ" run --model "$T/no-model.gguf" --rerank 0.5 --prompt hi
_cli_run "$KVQ" run --prompt hi    # the usage, then the error
if [ "$(cat "$CLI_TMP/rc")" = 2 ] && [ "$(tail -1 "$CLI_TMP/stderr")" = "kvq run: --model is required" ]
then
  ok prefix_command_error
else
  fail prefix_command_error "exit $(cat "$CLI_TMP/rc")" "$(tail -1 "$CLI_TMP/stderr")"
fi
expect_error prefix_library_error 1 "^kvq run: $T/no-model\.gguf: no such file" -- \
  "$KVQ" run --model "$T/no-model.gguf" --prompt hi

# ---- examples/random_model ---------------------------------------------------------------
RM=$KVQ_BUILD/examples/random_model
if [ ! -x "$RM" ]; then
  fail random_model_help "$RM was not built"
else
  _cli_run bash -c "cd '$T' && exec '$RM' --help"
  if [ "$(cat "$CLI_TMP/rc")" = 0 ] && grep -q '^usage: random_model OUT.gguf' "$CLI_TMP/stdout" &&
     [ ! -e "$T/--help" ]; then
    ok random_model_help
  else
    fail random_model_help "exit $(cat "$CLI_TMP/rc")" "$(ls -A "$T")"
  fi
  echo "my notes" >"$T/notes.txt"
  expect_error random_model_keeps_other_files 1 "notes\.txt: exists and is not a GGUF file" -- \
    "$RM" "$T/notes.txt"
  [ "$(cat "$T/notes.txt")" = "my notes" ] || fail random_model_notes_kept "$(head -c 64 "$T/notes.txt")"
fi

# ---- messages that name the file and the value; degenerate input (issue 30 items 10, 11)
spm_model
E=$T/degenerate
mkdir -p "$E"
ged() { "$PYTHON" tests/helpers/gguf_edit.py "$M" "$@"; }
ged "$E/notok.gguf" --drop-prefix tokenizer.
expect_error no_tokenizer_names_model 1 'notok\.gguf: has no tokenizer \(no vocabulary in its metadata\), so corpus item 1 \(uuid\) cannot be read: give token ids' \
  -- "$KVQ" capture --model "$E/notok.gguf" --corpus uuid:1 -q -o "$E/c"
ged "$E/arch.gguf" --arch ""
expect_error empty_architecture 1 'arch\.gguf: metadata general\.architecture is empty' \
  -- "$KVQ" run --model "$E/arch.gguf" -n 1 -q
ged "$E/blocks.gguf" --u32 llama.block_count=1
expect_error block_count_below_tensors 1 "blocks\.gguf: block_count is 1 but its tensors are of $MI_LAYERS layers" \
  -- "$KVQ" run --model "$E/blocks.gguf" -n 1 -q
ged "$E/ctx0.gguf" --u32 llama.context_length=0
_cli_run "$KVQ" run --model "$E/ctx0.gguf" -n 1 -q --prompt a
[ "$(cat "$CLI_TMP/rc")" = 0 ] &&
  grep -q 'ctx0\.gguf: context_length is 0 (not recorded)' "$CLI_TMP/stderr" &&
  ok context_length_zero_warns || fail context_length_zero_warns "$(head -3 "$CLI_TMP/stderr")"
printf '   \n\n \t  \n' >"$E/blank.txt"
expect_error whitespace_corpus_refused 1 "corpus '.*blank\.txt' contains only white space \([0-9]+ bytes\)" \
  -- "$KVQ" calibrate --model "$M" --corpus "$E/blank.txt" -q -o "$E/b.kvq"
[ ! -e "$E/b.kvq" ] && [ ! -e "$E/b.kvq.work" ] && ok whitespace_corpus_leaves_nothing ||
  fail whitespace_corpus_leaves_nothing "$(ls -A "$E")"
expect_error calibrate_max_tokens_one 2 "max-tokens: '1' is out of range \[2," \
  -- "$KVQ" calibrate --model "$M" --max-tokens 1 -q -o "$E/m.kvq"
expect_error capture_max_tokens_one 1 "max tokens 1 makes no sequence: a sequence needs 2 tokens" \
  -- "$KVQ" capture --model "$M" --corpus uuid:1 --max-tokens 1 -q -o "$E/c1"
expect_error profile_budget_percent 2 "--budgets: '101%' is not a percentage in \[.*%, 100%\]" \
  -- "$KVQ" profile --capture "$E/x" --artifact "$E/y.kvq" -o "$E/z.kvq" --budgets 101%

cli_done
