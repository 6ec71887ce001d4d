#!/usr/bin/env bash
# Install what kvq needs on Debian (run as root). Safe to run again: it only
# installs what is missing. Used by `make deps`, `make demo`, `make test` and .ci/run.
#   --dry-run   print the apt-get and pip lists and install nothing (tests/cli/install_deps.sh)
set -euo pipefail
dry=0
case "${1:-}" in
  --dry-run) dry=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

APT_PKGS="build-essential pkg-config libopenblas-dev liblapacke-dev libzstd-dev zstd \
libcjson-dev libcmocka-dev clang libopenmpi-dev openmpi-bin python3 python3-pip python3.11-doc \
chromium"
# python3.11-doc: the reStructuredText sources of the Python documentation, the natural
# text `make demo` calibrates and evaluates on (/usr/share/doc/python3.11/html/_sources/).
# libopenmpi-dev, openmpi-bin: `mpirun kvq calibrate` (docs/mpi.md) and its tests.
# chromium: the headless browser `make test-report` opens the HTML report in (docs/report.md).
PY_PKGS="numpy zstandard regex gguf xxhash matplotlib"
# matplotlib: the figures of `python -m kvq report` (pip install ./python[report] likewise)
# xxhash: the independent XXH64 that tests check kvq's checksums against (tests/cli/corrupt.sh)

missing=()
for p in $APT_PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  # python3/pip may come from elsewhere (pyenv); do not fight it. Whole names only:
  # python3.11-doc is a different package (and a pattern substitution would leave
  # ".11-doc", which apt-get reads as a regular expression).
  if command -v python3 >/dev/null; then
    kept=()
    for p in "${missing[@]}"; do
      case "$p" in python3 | python3-pip) ;; *) kept+=("$p") ;; esac
    done
    missing=("${kept[@]+"${kept[@]}"}")
  fi
  pkgs="${missing[*]+"${missing[*]}"}"
  if [ -n "$pkgs" ]; then
    echo "install-deps: apt-get install $pkgs"
    if [ "$dry" = 1 ]; then
      :
    elif [ "$(id -u)" -ne 0 ]; then
      echo "install-deps: not root; install these packages and run again" >&2
      exit 1
    else
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      # shellcheck disable=SC2086 # whole package names, one word each
      apt-get install -y -qq $pkgs >/dev/null
    fi
  fi
fi

pymissing=()
for m in $PY_PKGS; do
  python3 -c "import $m" 2>/dev/null || pymissing+=("$m")
done
if [ "${#pymissing[@]}" -gt 0 ]; then
  echo "install-deps: pip install ${pymissing[*]}"
  [ "$dry" = 1 ] || python3 -m pip install -q "${pymissing[@]}" 2>&1 | grep -v -i "running pip as the 'root'" || true
fi
[ "$dry" = 1 ] && exit 0
echo "install-deps: all dependencies present"
