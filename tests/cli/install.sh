#!/usr/bin/env bash
# install.sh — `make install PREFIX=...` into a temporary prefix: libkvq.so with its
# SONAME and version links, libkvq.a, bin/kvq, the public headers (each compiles on its
# own; kvq/util.h and the kvq_rk_* kernels are not among them) and kvq.pc; then
# examples/engine_example.c built against the installed library with `pkg-config
# --cflags --libs kvq` decodes through kvq/engine.h with an artifact of a random model
# and is refused for other weights; `make uninstall` removes it all. Run by
# tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/inst
P=$T/prefix
mkdir -p "$T"
B=$(basename "$KVQ_BUILD")
SAN=; case $B in *asan*) SAN="-fsanitize=address,undefined";; esac

if make --no-print-directory -s install BUILD="$B" PREFIX="$P" >"$T/out" 2>&1; then
  ok install_make_install; else fail install_make_install "$(tail -5 "$T/out")"; cli_done; exit; fi

ver=$(sed -n 's/^#define KVQ_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' include/kvq/common.h | paste -sd.)
major=${ver%%.*}
if [ -f "$P/lib/libkvq.so.$ver" ] && [ "$(readlink "$P/lib/libkvq.so.$major")" = "libkvq.so.$ver" ] &&
   [ "$(readlink "$P/lib/libkvq.so")" = "libkvq.so.$major" ] && [ -f "$P/lib/libkvq.a" ] &&
   [ -x "$P/bin/kvq" ] && [ -f "$P/include/kvq.h" ] && [ -f "$P/include/kvq/engine.h" ] &&
   readelf -d "$P/lib/libkvq.so.$ver" | grep -q "SONAME.*\[libkvq.so.$major\]"; then
  ok install_files_and_soname; else fail install_files_and_soname "$(find "$P" | head -20)"; fi

# no declaration of a kernel (kvq_rk_*) and no include of util.h (comments may name them)
internal='^#include "kvq/util.h"|^[a-z].*[ *]kvq_rk_[a-z0-9_]+\('
if [ ! -e "$P/include/kvq/util.h" ] && ! grep -Eq "$internal" "$P/include/kvq.h" "$P"/include/kvq/*.h; then
  ok install_no_internal_headers; else fail install_no_internal_headers "$(grep -En "$internal" "$P"/include/kvq/*.h | head -3)"; fi

bad=
for h in kvq.h "$P"/include/kvq/*.h; do
  h=${h#"$P/include/"}
  echo "#include <$h>" | cc -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$P/include" -x c - 2>"$T/err" || bad="$bad $h: $(head -1 "$T/err")"
done
if [ -z "$bad" ]; then ok install_headers_stand_alone; else fail install_headers_stand_alone "$bad"; fi

export PKG_CONFIG_PATH=$P/lib/pkgconfig
if [ "$(pkg-config --modversion kvq)" = "$ver" ] &&
   cc -std=c11 -Wall -Wextra -Werror $SAN examples/engine_example.c $(pkg-config --cflags --libs kvq) \
      -lm -Wl,-rpath,"$P/lib" -o "$T/engine_example" 2>"$T/err" &&
   ldd "$T/engine_example" | grep -q "libkvq.so.$major => $P/lib/libkvq.so.$major"; then
  ok install_pkg_config_example_builds; else fail install_pkg_config_example_builds "$(head -5 "$T/err")"; fi

# an artifact for the random model (shape: 5 layers, 8 heads, 4 KV heads, head dim 8)
"$KVQ_BUILD/examples/random_model" "$T/m.gguf" 3 >/dev/null
if "$P/bin/kvq" capture --model "$T/m.gguf" --corpus uuid:4 --seq-len 64 --max-tokens 1024 -q -o "$T/cap" 2>"$T/err" &&
   "$P/bin/kvq" moments --capture "$T/cap" -o "$T/mom" -q 2>>"$T/err" &&
   "$P/bin/kvq" fit --capture "$T/cap" --moments "$T/mom" --codebook 16 --iters 3 -q -o "$T/m.kvq" 2>>"$T/err"; then
  fp=$("$P/bin/kvq" inspect --json "$T/m.gguf" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["fingerprint"])')
  _cli_run "$T/engine_example" "$T/m.kvq" 5 8 4 8 10000 interleaved "$fp" 300
  if [ "$(cat "$CLI_TMP/rc")" = 0 ] && grep -q "^artifact weights: $fp " "$CLI_TMP/stdout" &&
     grep -q "^tokens: 300, " "$CLI_TMP/stdout" && grep -q "(finite)$" "$CLI_TMP/stdout"; then
    ok install_example_decodes; else fail install_example_decodes "rc $(cat "$CLI_TMP/rc")" "$(cat "$CLI_TMP/stdout" "$CLI_TMP/stderr")"; fi
  _cli_run "$T/engine_example" "$T/m.kvq" 5 8 4 8 10000 interleaved 00000000000000000000000000000000
  if [ "$(cat "$CLI_TMP/rc")" = 1 ] && grep -q "the weights differ (fingerprint $fp" "$CLI_TMP/stderr"; then
    ok install_example_refuses_other_weights; else fail install_example_refuses_other_weights "$(cat "$CLI_TMP/stderr")"; fi
  _cli_run "$T/engine_example" "$T/m.kvq" 5 8 4 8 10000 half "$fp"
  if [ "$(cat "$CLI_TMP/rc")" = 1 ] && grep -q "model.rope.layout differs (interleaved vs half)" "$CLI_TMP/stderr"; then
    ok install_example_refuses_other_layout; else fail install_example_refuses_other_layout "$(cat "$CLI_TMP/stderr")"; fi
else
  fail install_example_artifact "$(head -3 "$T/err")"
fi

make --no-print-directory -s uninstall BUILD="$B" PREFIX="$P" >/dev/null 2>&1
if [ -z "$(find "$P" -type f -o -type l)" ]; then
  ok install_uninstall; else fail install_uninstall "$(find "$P" -type f -o -type l | head)"; fi
cli_done
