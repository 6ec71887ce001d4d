#!/usr/bin/env bash
# install.sh — `make install PREFIX=...` into a temporary prefix: libkvq.so with its
# SONAME and version links, libkvq.a, bin/kvq, the stable headers only (docs/api.md:
# kvq.h, kvq/common.h, artifact.h, calibrate.h, eval.h, engine.h; each compiles on its
# own without KVQ_UNSTABLE_API; no unstable header, no kvq/util.h, no kvq_rk_* kernel)
# and kvq.pc; then examples/engine_example.c and examples/describe_artifact.c, built
# against the installed stable headers with `pkg-config --cflags --libs kvq`, decode
# through kvq/engine.h with an artifact of a random model (refused for other weights)
# and describe that artifact; `make install-unstable` adds the unstable tier, against
# which examples/random_model.c builds; `make uninstall` removes it all. Run by
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

# the stable tier and nothing else
got=$(cd "$P/include" && ls kvq.h kvq/*.h | tr '\n' ' ')
if [ "$got" = "kvq.h kvq/artifact.h kvq/calibrate.h kvq/common.h kvq/engine.h kvq/eval.h " ]; then
  ok install_stable_headers_only; else fail install_stable_headers_only "$got"; fi

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
   ldd "$T/engine_example" | grep -q "libkvq.so.$major => $P/lib/libkvq.so.$major" &&
   cc -std=c11 -Wall -Wextra -Werror $SAN examples/describe_artifact.c $(pkg-config --cflags --libs kvq) \
      -Wl,-rpath,"$P/lib" -o "$T/describe_artifact" 2>>"$T/err"; then
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
  _cli_run "$T/describe_artifact" "$T/m.kvq" 4 3
  if [ "$(cat "$CLI_TMP/rc")" = 0 ] && head -1 "$CLI_TMP/stdout" | "$PYTHON" -c '
import json, sys
d = json.load(sys.stdin)
assert d["format"] == "kvq" and d["metadata"]["codebook_size"] == "16", d["metadata"]
t = {x["name"]: x for x in d["tensors"]}["layer.4.head.3.codebook"]
assert t["dtype"] == "F32" and t["shape"] == [16, 8] and t["nbytes"] == 512, t' &&
     [ "$(tail -n +2 "$CLI_TMP/stdout" | wc -l)" = 128 ]; then
    ok install_example_describes; else fail install_example_describes "rc $(cat "$CLI_TMP/rc")" "$(head -c 300 "$CLI_TMP/stdout" "$CLI_TMP/stderr")"; fi
  _cli_run "$T/engine_example" "$T/m.kvq" 5 8 4 8 10000 half "$fp"
  if [ "$(cat "$CLI_TMP/rc")" = 1 ] && grep -q "model.rope.layout differs (interleaved vs half)" "$CLI_TMP/stderr"; then
    ok install_example_refuses_other_layout; else fail install_example_refuses_other_layout "$(cat "$CLI_TMP/stderr")"; fi
else
  fail install_example_artifact "$(head -3 "$T/err")"
fi

# the unstable tier on request: every header but kvq/util.h, and a program of that tier
# (the GGUF writer) builds against the installed headers and runs
if make --no-print-directory -s install-unstable BUILD="$B" PREFIX="$P" >"$T/out" 2>&1 &&
   [ -f "$P/include/kvq/gguf.h" ] && [ -f "$P/include/kvq/runtime.h" ] && [ ! -e "$P/include/kvq/util.h" ] &&
   cc -std=c11 -Wall -Wextra -Werror $SAN examples/random_model.c $(pkg-config --cflags --libs kvq) -lm \
      -Wl,-rpath,"$P/lib" -o "$T/random_model" 2>"$T/err" &&
   "$T/random_model" "$T/r.gguf" 7 >/dev/null && "$P/bin/kvq" inspect "$T/r.gguf" >/dev/null 2>>"$T/err"; then
  ok install_unstable_tier; else fail install_unstable_tier "$(head -5 "$T/out" "$T/err")"; fi

make --no-print-directory -s uninstall BUILD="$B" PREFIX="$P" >/dev/null 2>&1
if [ -z "$(find "$P" -type f -o -type l)" ]; then
  ok install_uninstall; else fail install_uninstall "$(find "$P" -type f -o -type l | head)"; fi
cli_done
