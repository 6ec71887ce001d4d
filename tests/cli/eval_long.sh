#!/usr/bin/env bash
# eval_long.sh — the long-context evaluation of `kvq eval`: --score last:N (exact
# prefill, the last N tokens of each sequence scored, with retrieval each a one-token
# decode step): the scored positions and counts, llama.cpp's loss of the same
# positions, and the `full` selector equal to full attention over them; and task
# prompts from a jsonl corpus ("answer", "task"). Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

MODEL=../shared/models/stories260K.gguf
expect_error eval_last_zero 2 '^kvq eval: --score: ' -- \
  "$KVQ" eval --model x --corpus uuid:1 --score last:0
expect_error eval_last_bad 2 '^kvq eval: --score: ' -- \
  "$KVQ" eval --model x --corpus uuid:1 --score last:8x
expect_error eval_score_bad 2 '^kvq eval: --score must be second-half, all or last:N$' -- \
  "$KVQ" eval --model x --corpus uuid:1 --score first:8
if [ ! -f "$MODEL" ]; then
  for n in eval_last_llama eval_last_longer eval_last_retrieval eval_jsonl_tasks; do
    skip $n "no $MODEL"
  done
  cli_done; exit
fi

# the text of tests/data/stories260K_nll.json (llama.cpp's NLL per cut, made by
# scripts/gen_stories260K_nll.py with llama-cpp-python): 51 tokens in sequences of 32,
# BOS + 31 and BOS + 19; the last 8 predictions of each, 16 in all
golden="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to"
T=$CLI_TMP/last
mkdir -p "$T"
printf '%s\n' "$golden" >"$T/story.txt"
G=$("$PYTHON" -c 'import json; d = json.load(open("tests/data/stories260K_nll.json")); print(d["seq_len_32_last_8"]["nll"], d["seq_len_32"]["nll"])')
last8=${G% *} all32=${G#* }

# full attention: the predicted count and llama.cpp's loss of the same 16 positions
# (2e-4 nats/token: the mean of the 16 hardest predictions, not of all 49)
expect_json eval_last_llama "
assert d['score'] == 'last:8' and d['sequences'] == 2 and d['tokens'] == 51, d
assert d['predicted'] == 16, d
assert abs(d['nll'] - $last8) < 2e-4, (d['nll'], 'llama.cpp: $last8')
" -- "$KVQ" eval --model "$MODEL" --corpus "file:$T/story.txt" --seq-len 32 --score last:8 --json -q

# N longer than the sequences: every prediction, as --score all
expect_json eval_last_longer "
assert d['predicted'] == 49 and abs(d['nll'] - $all32) < 1e-4, (d, 'llama.cpp: $all32')
" -- "$KVQ" eval --model "$MODEL" --corpus "file:$T/story.txt" --seq-len 32 --score last:100 --json -q

# retrieval: the reference is full attention over the same 16 positions; `full` (every
# token, exact positions, an f32 cache) decodes them one step each after an exact
# prefill and gives the same loss; one retrieval step per scored token, layer (5) and KV
# head (4) of stories260K (llama.block_count, head_count_kv): 16 x 5 x 4, every scored
# position (23..30 and 11..18) having candidates beyond 4 sinks + a window of 4
expect_json eval_last_retrieval "
assert d['scored'] == 'last:8' and d['predicted'] == 16, d
assert abs(d['reference']['nll'] - $last8) < 2e-4, (d['reference'], 'llama.cpp: $last8')
rows = {r['selector']: r for r in d['rows']}
full, ref = rows['full'], d['reference']['perplexity']
assert abs(full['perplexity'] - ref) < 1e-5 * ref, (full, ref)
assert full['recall_topk'] == 1 and abs(full['kv_read_fraction'] - 1) < 1e-9, full
for r in d['rows']:
    assert r['steps'] == 16 * 5 * 4, r
assert rows['oracle']['kv_read_fraction'] < 0.95 and rows['oracle']['perplexity'] != ref, rows
" -- "$KVQ" eval --model "$MODEL" --corpus "file:$T/story.txt" --seq-len 32 --score last:8 \
    --selectors full,oracle --budgets 4 --sink 4 --window 4 --positions rope --cache f32 \
    --threads 1 --json -q

# jsonl task prompts: the golden text is stories260K's greedy continuation after BOS, so
# after its first words the model answers "Lily" (right) and not "Tom" (counted wrong)
cat >"$T/tasks.jsonl" <<'EOF'
{"text": "Once upon a time, there was a little girl named", "answer": "Lily"}
{"text": "Once upon a time, there was a little girl named", "answer": "Tom", "task": "kv-recall"}
{"text": "Once upon a time"}
EOF
expect_json eval_jsonl_tasks "
assert d['reference']['passkey'] == [1, 1] and d['reference']['kv_recall'] == [0, 1], d['reference']
assert d['rows'][0]['passkey'] == [1, 1] and d['rows'][0]['kv_recall'] == [0, 1], d['rows']
" -- "$KVQ" eval --model "$MODEL" --corpus "jsonl:$T/tasks.jsonl" --selectors full --max-tokens 2 \
    --positions rope --threads 1 --json -q

cli_done
