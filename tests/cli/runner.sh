#!/usr/bin/env bash
# runner.sh — tests/run-tests.sh itself: a skip whose reason is a failure of kvq
# ("capture failed") fails the run; a skip for a missing optional input (a model file
# not found) does not; a CLI test that exits non-zero without a FAIL line fails.
# Each case runs the runner on a small tree of fake tests (KVQ_TESTS_DIR).
. tests/helpers/clitest.sh

# runner_case NAME WANT_RC LINE...: a tree whose one CLI test prints the LINEs
runner_case() {
  local name=$1 want=$2 d=$CLI_TMP/$1; shift 2
  mkdir -p "$d/cli" "$d/py" "$d/build"
  printf '%s\n' "$@" | sed 's/^/echo "/; s/$/"/' >"$d/cli/fake.sh"
  KVQ_TESTS_DIR=$d BUILD=$d/build bash tests/run-tests.sh >"$d/out" 2>&1
  local rc=$?
  if { [ "$want" = 0 ] && [ $rc = 0 ]; } || { [ "$want" != 0 ] && [ $rc != 0 ]; }; then
    ok "$name"
  else
    fail "$name" "runner exit $rc, expected $([ "$want" = 0 ] && echo 0 || echo non-zero):" \
      "$(tail -3 "$d/out")"
  fi
}

runner_case runner_skip_for_kvq_failure_fails 1 "ok a" "skip b: capture, moments or fit failed: boom"
runner_case runner_skip_not_built_fails 1 "skip c: kvq fit is not built"
runner_case runner_skip_missing_model_passes 0 "ok a" "skip b: test model x.gguf not found"
runner_case runner_skip_missing_module_passes 0 "skip b: numpy is not installed"
runner_case runner_all_ok_passes 0 "ok a" "ok b"
runner_case runner_fail_line_fails 1 "ok a" "FAIL b"
cli_done
