#!/usr/bin/env bash
# weft as `meson install` leaves it, away from the build folder:
#
#   tests/tools/test_install.sh BUILD_DIR SOURCE_DIR
#
# installs BUILD_DIR into a temporary DESTDIR, then, from another folder:
# builds tests/tools/install_weft.c with `pkg-config --cflags --libs weft`
# against the installed tree and runs it on 2 ranks with the installed weftrun;
# runs the installed all_reduce_perf (-c 1: 0 wrong on every size), weft-train
# and weft-info; checks the sonames (libweft.so.0.<minor> for a 0.x weft), that
# the .pc files find the tree from their own place, that a program calling
# only weftZero* functions, linked with --as-needed and a run path to the
# libdir alone, loads (libweft_zero.so finds libweft.so beside itself), that
# tests/tools/install_cmake/own_names.c, which defines names weft uses inside
# (clock_ns, env_int ...), links the static libraries through `pkg-config
# --static` and runs on 2 ranks, and that the licence is installed in
# <datadir>/doc/weft; with the NCCL drop-in, checks that libnccl.so.2 and nccl.h are
# apart (<libdir>/weft, <includedir>/weft: never in the loader's path) and that
# tests/tools/install_nccl.c builds with `pkg-config --cflags --libs weft-nccl`
# and runs on 2 ranks; builds the same programs and tools/train/zero_example.c
# with CMake through find_package(weft) (tests/tools/install_cmake) against every
# target of the package (own_names.c against the static ones), and runs them;
# checks that every installed program
# has a manual page (rendered by groff -man where groff is installed); checks that
# no installed program or library names the build folder in its rpath.
# Prints "ok NAME" or "FAIL NAME" per check, exits non-zero when one failed.
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
# the sonames: a 0.x weft promises nothing to another minor version
version=$(meson introspect --projectinfo "$build" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
major=${version%%.*} minor=${version#*.}
minor=${minor%%.*}
if [ "$major" = 0 ]; then soversion=0.$minor; else soversion=$major; fi
bad=0
for lib in libweft libweft_zero; do
  soname=$(readelf -d "$libdir/$lib.so.$version" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  if [ "$soname" != "$lib.so.$soversion" ] || [ "$(readlink "$libdir/$lib.so")" != "$lib.so.$soversion" ] ||
    [ ! -e "$libdir/$lib.so.$soversion" ]; then
    echo "  $lib.so.$version: soname '$soname', $lib.so -> $(readlink "$libdir/$lib.so")"
    bad=1
  fi
done
check "sonames libweft.so.$soversion, libweft_zero.so.$soversion (weft $version)" $bad

# the .pc files name the tree from their own place: moved, it is still found
[ "$(realpath -m "$(PKG_CONFIG_PATH="$pcdir" pkg-config --variable=libdir weft)")" = "$(realpath "$libdir")" ]
check "weft.pc relocatable: its libdir is the moved tree's" $?

# the licence, beside the files it covers
cmp -s "$src/LICENSE" "$root/$(option datadir)/doc/weft/LICENSE"
check "LICENSE installed in <datadir>/doc/weft" $?

# weftZero* calls only, --as-needed (Ubuntu's default), a run path to the
# libdir alone, as a RUNPATH (it serves the program, not its libraries):
# libweft.so is libweft_zero.so's to find
# shellcheck disable=SC2046
cc -o zero_only "$src/tests/tools/install_cmake/zero_only.c" -Wl,--as-needed \
  -Wl,--enable-new-dtags -Wl,-rpath,"$libdir" $(pc --cflags --libs weft_zero) >cczo.log 2>&1 &&
  ! readelf -d zero_only | grep -q "NEEDED.*libweft\.so" >>cczo.log 2>&1 &&
  env -u LD_LIBRARY_PATH ./zero_only >>cczo.log 2>&1 &&
  env -u LD_LIBRARY_PATH ldd ./zero_only | grep -q "libweft.so.$soversion => $libdir/" >>cczo.log 2>&1
check "--as-needed program of weftZero* calls only, run path to the libdir: loads libweft.so" $? cczo.log

# names of weft's internals defined by the program, the static libraries
# through pkg-config --static (-l:lib*.a: the archives, not the .so files)
# as api.md says, whole: the modules weft.pc requires (hwloc, UCX) with their
# own static flags (Debian's hwloc.pc asks for -ludev: setup.sh installs
# libudev-dev, as libweft-dev's package depends on it)
static_libs=$(pc --static --libs weft_zero)
# shellcheck disable=SC2046
cc -o own_names "$src/tests/tools/install_cmake/own_names.c" $(pc --cflags weft_zero) \
  $(echo "$static_libs " | sed -E 's/-lweft_zero /-l:libweft_zero.a /; s/-lweft /-l:libweft.a /') \
  >ccown.log 2>&1 && ! ldd ./own_names | grep -q libweft >>ccown.log 2>&1 &&
  timeout 60 "$bin/weftrun" -n 2 ./own_names >>ccown.log 2>&1 && [ "$(grep -c ': ok$' ccown.log)" -eq 2 ]
check "pkg-config --static: libweft.a, libweft_zero.a and a program's own clock_ns, env_int ... on 2 ranks" $? ccown.log

if [ "$(option nccl)" = "True" ]; then
  [ -e "$libdir/weft/libnccl.so.2" ] && [ -e "$root/$(option includedir)/weft/nccl.h" ] &&
    [ ! -e "$libdir/libnccl.so.2" ] && [ ! -e "$root/$(option includedir)/nccl.h" ]
  check "libnccl.so.2 and nccl.h installed apart, in weft/" $?
  # nccl_api_perf loads weft's through its run path, relative to bindir
  if [ -x "$bin/nccl_api_perf" ]; then
    env -u LD_LIBRARY_PATH "$bin/nccl_api_perf" -M host -n 1 >napi.log 2>&1 &&
      napi_lib=$(sed -n '1s/^# library: \(.*\) (version code .*/\1/p' napi.log) &&
      [ -n "$napi_lib" ] &&
      [ "$(realpath "$napi_lib")" = "$(realpath "$libdir/weft/libnccl.so.2")" ]
    check "installed nccl_api_perf runs weft's libnccl.so.2 (its run path)" $? napi.log
    "$bin/nccl_api_perf" --help >napi_help.log 2>&1 && grep -q "^usage: nccl_api_perf" napi_help.log
    check "nccl_api_perf --help: the usage, status 0" $? napi_help.log
  fi
  # shellcheck disable=SC2046
  cc -o install_nccl "$src/tests/tools/install_nccl.c" $(pc --cflags --libs weft-nccl) \
    >ccn.log 2>&1 && ldd ./install_nccl | grep -q "$libdir/weft/libnccl.so.2" >>ccn.log 2>&1
  check "cc \$(pkg-config --cflags --libs weft-nccl) install_nccl.c: weft's libnccl.so.2" $? ccn.log
  timeout 60 "$bin/weftrun" -n 2 ./install_nccl >nccl.log 2>&1 &&
    [ "$(grep -c ': ok$' nccl.log)" -eq 2 ]
  check "installed weftrun -n 2 install_nccl" $? nccl.log
fi

# a manual page for every installed program, from its --help
mandir="$root/$(option mandir)/man1"
bad=0
for prog in "$bin"/*; do
  name=$(basename "$prog")
  page="$mandir/$name.1"
  if [ ! -f "$page" ] || ! grep -q '^\.SH SYNOPSIS' "$page" || ! grep -qF -- "$name \\- " "$page"; then
    echo "  $name: no manual page with a synopsis in $mandir"
    bad=1
  elif command -v groff >/dev/null &&
    ! GROFF_NO_SGR=1 groff -man -Tascii -P-bu -ww "$page" 2>&1 | grep -q "^NAME"; then
    echo "  groff -man $page does not render it"
    bad=1
  fi
done
check "man pages of the installed programs in $mandir" $bad

# find_package(weft): tests/tools/install_cmake builds the same programs
# against each target of the installed CMake package, found through
# CMAKE_PREFIX_PATH alone; versions and components it must refuse, refused
if command -v cmake >/dev/null; then
  cmake -S "$src/tests/tools/install_cmake" -B cmake-build -DCMAKE_PREFIX_PATH="$root" \
    -DCMAKE_BUILD_TYPE=Release >cmake.log 2>&1 && cmake --build cmake-build >>cmake.log 2>&1
  check "cmake find_package(weft 0.1 COMPONENTS zero static): every target builds" $? cmake.log
  # compile and link lines: the installed tree's folders, never the build's
  [ -f cmake-build/CMakeCache.txt ] &&
    ! grep -rqs --include=flags.make --include=link.txt -- "$src/include\|$build" cmake-build
  check "the CMake targets name the installed tree only" $?
  for prog in install_weft install_weft_static; do
    timeout 60 "$bin/weftrun" -n 2 "cmake-build/$prog" >"$prog.log" 2>&1 &&
      [ "$(grep -c ': ok$' "$prog.log")" -eq 2 ]
    check "installed weftrun -n 2 $prog (weft::${prog#install_})" $? "$prog.log"
  done
  ldd cmake-build/install_weft | grep -q "libweft.so.$soversion => $libdir/libweft.so.$soversion"
  check "weft::weft: the installed libweft.so.$soversion" $?
  ! ldd cmake-build/install_weft_static | grep -q "libweft" &&
    ! ldd cmake-build/zero_example_static | grep -q "libweft" &&
    ! ldd cmake-build/own_names_static | grep -q "libweft"
  check "weft::weft_static, weft::weft_zero_static: no weft library loaded" $?
  timeout 60 "$bin/weftrun" -n 2 cmake-build/own_names_static >cmown.log 2>&1 &&
    [ "$(grep -c ': ok$' cmown.log)" -eq 2 ]
  check "installed weftrun -n 2 own_names_static (weft::weft_zero_static, a program's own clock_ns ...)" $? cmown.log
  for prog in zero_example zero_example_static; do
    # y = w.x + b fitted at stage 3: the last line's weights are the target's
    timeout 120 "$bin/weftrun" -n 2 "cmake-build/$prog" 3 >"$prog.log" 2>&1 &&
      grep -q "w0 0.100 w9 1.000 b 0.500" "$prog.log"
    check "installed weftrun -n 2 $prog 3 (weft::weft_zero${prog#zero_example}): fitted" $? "$prog.log"
  done
  if [ "$(option nccl)" = "True" ]; then
    timeout 60 "$bin/weftrun" -n 2 cmake-build/install_nccl >cmnccl.log 2>&1 &&
      [ "$(grep -c ': ok$' cmnccl.log)" -eq 2 ] &&
      ldd cmake-build/install_nccl | grep -q "$libdir/weft/libnccl.so.2" >>cmnccl.log 2>&1
    check "installed weftrun -n 2 install_nccl (weft::nccl: weft's libnccl.so.2)" $? cmnccl.log
  fi
  # what a version or component the package does not have gets: not found
  mkdir -p refuse
  printf '%s\n' 'cmake_minimum_required(VERSION 3.16)' 'project(refuse C)' \
    'find_package(weft ${WANT} QUIET ${COMPONENTS})' \
    'if(weft_FOUND)' '  message(FATAL_ERROR "found")' 'endif()' >refuse/CMakeLists.txt
  bad=0
  for want in "-DWANT=0.2" "-DWANT=1.0" "-DWANT=0.1 -DCOMPONENTS=COMPONENTS;bogus"; do
    # shellcheck disable=SC2086
    if ! cmake -S refuse -B "refuse/b" $want -DCMAKE_PREFIX_PATH="$root" >refuse.log 2>&1; then
      echo "  find_package(weft) with $want: found"; bad=1
    fi
    rm -rf refuse/b
  done
  check "find_package(weft 0.2), (weft 1.0), (COMPONENTS bogus): not found" $bad
  # found through a link to the libdir (a merged /usr's /lib -> usr/lib): the
  # prefix is the real one, and weft.h is found
  ln -s "$libdir" linked-lib
  cmake -S "$src/tests/tools/install_cmake" -B cmake-linked \
    -Dweft_DIR="$PWD/linked-lib/cmake/weft" -DCMAKE_BUILD_TYPE=Release >cmlinked.log 2>&1 &&
    cmake --build cmake-linked --target install_weft >>cmlinked.log 2>&1
  check "find_package(weft) through a link to the libdir: the real prefix" $? cmlinked.log
  rm -rf cmake-linked linked-lib
else
  echo "skip cmake find_package(weft): cmake is not installed (tools/scripts/setup.sh installs it)"
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
