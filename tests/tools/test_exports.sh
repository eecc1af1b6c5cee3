#!/usr/bin/env bash
# The shared libraries export their public headers' functions and nothing
# else, and the static libraries define nothing else global (libweft.a and
# libweft_zero.a, as installed: the build root's and zero/'s); programs still
# link against them: a program built from the shared libraries runs under
# weftrun, and one built with pkg-config's flags (the uninstalled .pc files
# of the build tree) runs.
#   test_exports.sh LIBWEFT WEFT_H LIBWEFT_ZERO WEFT_ZERO_H WEFTRUN ZERO_EXAMPLE_SHARED BUILD_ROOT CC
set -uo pipefail
libweft=$1 weft_h=$2 libzero=$3 zero_h=$4 weftrun=$5 example=$6 build=$7 cc=$8
fail=0

# Function names a header declares: comments removed, then every line at
# column 0 that is not a typedef or directive and reads "... name(".
declared() {
  awk '{
    line = $0; out = ""
    while (length(line) > 0) {
      if (in_comment) {
        i = index(line, "*/"); if (i == 0) { line = ""; break }
        line = substr(line, i + 2); in_comment = 0
      } else {
        i = index(line, "/*"); if (i == 0) { out = out line; line = ""; break }
        out = out substr(line, 1, i - 1); line = substr(line, i + 2); in_comment = 1
      }
    }
    print out
  }' "$1" | grep -E '^[A-Za-z_]' | grep -v -E '^(typedef|extern|#)' |
    sed -n -E 's/^[^(]*[ *]([A-Za-z_][A-Za-z0-9_]*)\(.*/\1/p' | sort -u
}

# Defined dynamic symbols, without the linker's own section markers.
exported() {
  nm -D --defined-only "$1" | awk '{print $NF}' |
    grep -v -E '^(_init|_fini|_edata|_end|__bss_start)$' | sort -u
}

# Global symbols a static library defines, every member's: a program that
# links it sees these, and a shared library built with it exports them.
defined_global() {
  nm -g --defined-only "$1" | awk 'NF == 3 {print $3}' | sort -u
}

check_lib() { # library, header, [exported | defined_global]
  local lib=$1 header=$2 names=${3:-exported} want have missing extra verb=exported
  [ "$names" = exported ] || verb="defined global"
  want=$(declared "$header")
  have=$($names "$lib")
  if [ "$(echo "$want" | wc -l)" -lt 10 ]; then
    echo "FAIL: only $(echo "$want" | wc -l) functions found in $header"
    fail=1
    return
  fi
  missing=$(comm -13 <(echo "$have") <(echo "$want"))
  extra=$(comm -23 <(echo "$have") <(echo "$want"))
  if [ -n "$missing" ]; then
    echo "FAIL: $(basename "$lib"): declared in $(basename "$header") but not $verb:"
    echo "$missing" | sed 's/^/  /'
    fail=1
  fi
  if [ -n "$extra" ]; then
    echo "FAIL: $(basename "$lib"): $(echo "$extra" | wc -l) names $verb but not declared in $(basename "$header"):"
    echo "$extra" | head -20 | sed 's/^/  /'
    fail=1
  fi
  if [ -z "$missing" ] && [ -z "$extra" ]; then
    echo "ok: $(basename "$lib"): the $(echo "$want" | wc -l) functions of $(basename "$header") $verb, nothing else"
  fi
}

check_lib "$libweft" "$weft_h"
check_lib "$libzero" "$zero_h"
# the static libraries: the same names global, every other one local, so a
# program's own clock_ns or env_int is no second definition of weft's. (A
# -Ddevice_emulate=true build, never for use, bundles cuda_emu's objects into
# libweft.a, and its kernels' C++ statics are unique symbols, which objcopy
# leaves global.)
emulated=$(meson introspect --buildoptions "$build" 2>/dev/null |
  python3 -c "import json, sys; print(next((o['value'] for o in json.load(sys.stdin) if o['name'] == 'device_emulate'), False))" 2>/dev/null)
for a in "$build/libweft.a:$weft_h" "$build/zero/libweft_zero.a:$zero_h"; do
  if [ "$emulated" = True ]; then
    echo "skipped: $(basename "${a%%:*}"): a -Ddevice_emulate=true build's"
  elif [ -f "${a%%:*}" ]; then
    check_lib "${a%%:*}" "${a#*:}" defined_global
  else
    echo "FAIL: ${a%%:*} is missing"
    fail=1
  fi
done

# The test hooks (-DWEFT_TEST_HOOKS) are in the suites' static variants only,
# not in any object of the libraries that ship, local symbols included.
hooks='bulk_comm_calls|sendrecv_cma_counts|mem_peer_map_count|net_dev_conn_failed|zero_test_save_crash_rank'
for lib in "$libweft" "$libzero" "$build/libweft.a" "$build/zero/libweft_zero.a" "$build/libnccl.so.2"; do
  [ -e "$lib" ] || continue
  found=$(nm -A "$lib" 2>/dev/null | grep -E " ($hooks)\$")
  if [ -n "$found" ]; then
    echo "FAIL: $(basename "$lib") holds test hooks:"; echo "$found" | sed 's/^/  /'
    fail=1
  else
    echo "ok: $(basename "$lib") holds no test hook"
  fi
done

# A program linked against both shared libraries (no static copy of weft).
libs=$(ldd "$example") # (grep -q on a pipe would stop ldd early: pipefail)
if grep -q 'libweft\.so' <<<"$libs" && grep -q 'libweft_zero\.so' <<<"$libs"; then
  echo "ok: $(basename "$example") is linked against libweft.so and libweft_zero.so"
else
  echo "FAIL: $(basename "$example") is not linked against the shared libraries"; echo "$libs"
  fail=1
fi
work=$(mktemp -d /tmp/weft_exports_XXXXXX)
trap 'rm -rf "$work"' EXIT
out=$(cd "$work" && timeout 120 "$weftrun" -n 2 "$example" 1 2>&1)
if [ $? -eq 0 ]; then
  echo "ok: $(basename "$example") runs on 2 ranks"
else
  echo "FAIL: $(basename "$example") on 2 ranks:"; echo "$out" | tail -20
  fail=1
fi

# A program built with pkg-config's flags for weft and weft_zero.
pcdir="$build/meson-uninstalled"
if ! command -v pkg-config >/dev/null; then
  echo "skipped: pkg-config is not installed, so the pkg-config build was not tried"
elif [ ! -f "$pcdir/weft-uninstalled.pc" ]; then
  echo "FAIL: $pcdir/weft-uninstalled.pc is missing"
  fail=1
else
  cat >"$work/use.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include "weft_zero.h"
int main(void) {
  int version = 0;
  if (weftGetVersion(&version) != weftSuccess || version <= 0) return 1;
  weftZeroShard_t s = weftZeroShardOf(10, 4, 3);
  if (s.offset != 9 || s.count != 1) return 2;
  float in[3] = {1, 2, 3}, out[3];
  unsigned short half[3];
  if (weftZeroFromFloat(in, weftBfloat16, half, 3) != weftSuccess) return 3;
  if (weftZeroToFloat(half, weftBfloat16, out, 3) != weftSuccess) return 4;
  if (memcmp(in, out, sizeof in) != 0) return 5;
  printf("weft %d\n", version);
  return 0;
}
EOF
  flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs weft_zero-uninstalled weft-uninstalled)
  # a sanitizer build's libraries need their runtime first: build the program with it
  weft_libs=$(ldd "$libweft")
  for san in address thread undefined; do
    short=${san:0:1}san; [ $san = undefined ] && short=ubsan
    if grep -q "lib$short\\." <<<"$weft_libs"; then flags="-fsanitize=$san $flags"; fi
  done
  # shellcheck disable=SC2086
  if ! "$cc" -o "$work/use" "$work/use.c" $flags 2>"$work/cc.log"; then
    echo "FAIL: building with pkg-config's flags ($flags):"; cat "$work/cc.log"
    fail=1
  elif ! out=$(LD_LIBRARY_PATH="$build:$build/zero" "$work/use" 2>&1); then
    echo "FAIL: the pkg-config build does not run: $out"
    fail=1
  else
    echo "ok: built with pkg-config's flags and ran ($out)"
  fi
fi
exit $fail
