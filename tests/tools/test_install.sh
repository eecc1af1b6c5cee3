#!/usr/bin/env bash
# weft as `meson install` leaves it, away from the build folder:
#
#   tests/tools/test_install.sh BUILD_DIR SOURCE_DIR
#
# installs BUILD_DIR into a temporary DESTDIR, then, from another folder:
# builds tests/tools/install_weft.c with `pkg-config --cflags --libs weft`
# against the installed tree and runs it on 2 ranks with the installed weftrun;
# runs the installed all_reduce_perf (-c 1: 0 wrong on every size), weft-train
# and weft-info; with the NCCL drop-in, checks that libnccl.so.2 and nccl.h are
# apart (<libdir>/weft, <includedir>/weft: never in the loader's path) and that
# tests/tools/install_nccl.c builds with `pkg-config --cflags --libs weft-nccl`
# and runs on 2 ranks; checks that no installed program or library names the
# build folder in its rpath. Prints "ok NAME" or "FAIL NAME" per check, exits non-zero
# when one failed.
set -u
build=$(cd "${1:?usage: test_install.sh BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: test_install.sh BUILD_DIR SOURCE_DIR}" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_install.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
nfailed=0
check() { # NAME STATUS [LOG]
  if [ "$2" -eq 0 ]; then echo "ok $1"; else
    echo "FAIL $1"
    [ -z "${3:-}" ] || sed 's/^/  | /' "$3"
    nfailed=$((nfailed + 1))
  fi
}

dest="$tmp/dest"
meson install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$tmp/install.log" 2>&1
check "meson install --destdir" $? "$tmp/install.log"
option() { # NAME: a build option's value
  meson introspect --buildoptions "$build" |
    python3 -c "import json, sys; print(next(o['value'] for o in json.load(sys.stdin) if o['name'] == '$1'))"
}
prefix=$(option prefix)
root="$dest$prefix"
bin="$root/$(option bindir)"
pcdir="$root/$(option libdir)/pkgconfig"
[ -f "$pcdir/weft.pc" ]
check "weft.pc installed in $pcdir" $?

cd "$tmp" || exit 2 # nothing from here on runs in the build or source folder
# the .pc files name the prefix; the tree sits under DESTDIR
pc() { PKG_CONFIG_PATH="$pcdir" pkg-config --define-variable=prefix="$root" "$@"; }
# shellcheck disable=SC2046
cc -o install_weft "$src/tests/tools/install_weft.c" $(pc --cflags --libs weft) \
  -Wl,-rpath,"$(pc --variable=libdir weft)" >cc.log 2>&1
check "cc \$(pkg-config --cflags --libs weft) install_weft.c" $? cc.log
! grep -q -- "$src/include\|$build" <(pc --cflags --libs weft)
check "pkg-config names the installed tree only" $?
timeout 60 "$bin/weftrun" -n 2 ./install_weft >run.log 2>&1 && [ "$(grep -c ': ok$' run.log)" -eq 2 ]
check "installed weftrun -n 2 install_weft" $? run.log

timeout 120 "$bin/weftrun" -n 2 "$bin/all_reduce_perf" -b 8 -e 1M -f 8 -c 1 >perf.log 2>&1 &&
  grep -q "Out of bounds values : 0 OK" perf.log &&
  [ "$(grep -E '^\[0\] +[0-9]+ ' perf.log | awk '$10 != 0 || ($14 != 0 && $14 != "N/A")' | wc -l)" -eq 0 ]
check "installed all_reduce_perf -c 1 on 2 ranks: 0 wrong" $? perf.log
timeout 120 "$bin/weftrun" -n 2 "$bin/weft-train" --zero-stage 3 --steps 3 >train.log 2>&1
check "installed weft-train --zero-stage 3 on 2 ranks" $? train.log
"$bin/weft-info" >info.log 2>&1
check "installed weft-info" $? info.log

libdir="$root/$(option libdir)"
if [ "$(option nccl)" = "True" ]; then
  [ -e "$libdir/weft/libnccl.so.2" ] && [ -e "$root/$(option includedir)/weft/nccl.h" ] &&
    [ ! -e "$libdir/libnccl.so.2" ] && [ ! -e "$root/$(option includedir)/nccl.h" ]
  check "libnccl.so.2 and nccl.h installed apart, in weft/" $?
  # shellcheck disable=SC2046
  cc -o install_nccl "$src/tests/tools/install_nccl.c" $(pc --cflags --libs weft-nccl) \
    >ccn.log 2>&1 && ldd ./install_nccl | grep -q "$libdir/weft/libnccl.so.2" >>ccn.log 2>&1
  check "cc \$(pkg-config --cflags --libs weft-nccl) install_nccl.c: weft's libnccl.so.2" $? ccn.log
  timeout 60 "$bin/weftrun" -n 2 ./install_nccl >nccl.log 2>&1 &&
    [ "$(grep -c ': ok$' nccl.log)" -eq 2 ]
  check "installed weftrun -n 2 install_nccl" $? nccl.log
fi

# every installed ELF file: no rpath into the build or source folder, and
# every library it needs found (with the installed libdir on the path, as
# ld.so.conf has the prefix's libdir, and libdir/weft, as nccl_api_perf is
# run: it loads whichever libnccl.so.2 the path names first)
bad=0
while IFS= read -r f; do
  readelf -h "$f" >/dev/null 2>&1 || continue
  if readelf -d "$f" | grep -E 'R(UN)?PATH' | grep -q -- "$build\|$src"; then
    echo "  $f: rpath into the build folder: $(readelf -d "$f" | grep -E 'R(UN)?PATH')"
    bad=1
  fi
  if LD_LIBRARY_PATH="$libdir:$libdir/weft" ldd "$f" 2>&1 | grep -q "not found"; then
    echo "  $f: $(LD_LIBRARY_PATH="$libdir:$libdir/weft" ldd "$f" | grep "not found" | head -3)"
    bad=1
  fi
done < <(find "$root" -type f \( -perm -u+x -o -name '*.so*' \))
check "installed programs and libraries: no build rpath, no missing library" $bad

echo "test_install: $nfailed failed"
[ "$nfailed" -eq 0 ]
