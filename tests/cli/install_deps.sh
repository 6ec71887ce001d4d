#!/usr/bin/env bash
# tests/cli/install_deps.sh — scripts/install-deps.sh's package list (issue 30 item 13):
# on a machine whose python3 is not Debian's (another python3 first on PATH, dpkg
# reporting every package missing) the apt-get list holds whole package names only:
# python3 and python3-pip are left to that python3, python3.11-doc stays whole.
source tests/helpers/clitest.sh

fake=$CLI_TMP/fakebin
mkdir -p "$fake"
# dpkg-query that knows no package, and a python3 that is not the system's
printf '#!/bin/sh\nexit 1\n' >"$fake/dpkg-query"
# apt-get and pip must never run from a dry run (this test may run as root)
printf '#!/bin/sh\necho "apt-get ran: $*" >&2\nexit 97\n' >"$fake/apt-get"
chmod +x "$fake/apt-get"
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "$PYTHON")" >"$fake/python3"
chmod +x "$fake/dpkg-query" "$fake/python3"

out=$(PATH="$fake:$PATH" bash scripts/install-deps.sh --dry-run 2>&1); rc=$?
apt=$(printf '%s\n' "$out" | sed -n 's/^install-deps: apt-get install //p')
want="build-essential pkg-config libopenblas-dev liblapacke-dev libzstd-dev zstd libcjson-dev \
libcmocka-dev clang libopenmpi-dev openmpi-bin python3.11-doc chromium"
if [ "$rc" = 0 ] && [ "$apt" = "$want" ]; then
  ok install_deps_other_python3_whole_names
else
  fail install_deps_other_python3_whole_names "exit $rc" "got:  $apt" "want: $want"
fi
# no word of the list is a fragment (".11-doc") apt-get would read as a pattern
bad=$(printf '%s\n' $apt | grep -Ev '^[a-z0-9][a-z0-9+.-]*$|^$' || true)
case " $apt " in *" .11-doc "* | *" -pip "*) bad="$bad fragment" ;; esac
if [ -z "$bad" ] && [ -n "$apt" ]; then ok install_deps_no_fragments; else
  fail install_deps_no_fragments "bad words: $bad" "list: $apt"; fi

# with Debian's python3 missing and no other python3, python3 and pip are asked for
nopy=$CLI_TMP/nopy
mkdir -p "$nopy"
for t in bash sh sed grep id cat printf xargs; do
  p=$(command -v "$t") && ln -sf "$p" "$nopy/$t"
done
cp "$fake/dpkg-query" "$fake/apt-get" "$nopy/"
out=$(PATH="$nopy" bash scripts/install-deps.sh --dry-run 2>&1)
apt=$(printf '%s\n' "$out" | sed -n 's/^install-deps: apt-get install //p')
case " $apt " in
  *" python3 python3-pip python3.11-doc "*) ok install_deps_no_python3_asks_for_it ;;
  *) fail install_deps_no_python3_asks_for_it "list: $apt" ;;
esac

expect_error install_deps_bad_option 2 'usage: .*--dry-run' -- bash scripts/install-deps.sh --bogus
cli_done
