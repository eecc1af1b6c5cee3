#!/usr/bin/env bash
# weft's Debian packages (tools/scripts/deb.sh), as a user installs them:
#
#   tests/tools/test_deb.sh SOURCE_DIR SCRATCH_DIR
#
# builds the packages from SOURCE_DIR with a release build in SCRATCH_DIR/build
# (kept between runs; $WEFT_TEST_DEB_MESON_OPTIONS, default -Dcuda=disabled:
# the layout does not depend on it), then checks the library package's name
# (libweft0.1 for the soname libweft.so.0.1 of a 0.x weft), each package's metadata (the
# -dev package on the others at this version, no package on itself, every
# library a program needs in its Depends), that every file is in exactly one
# package, owned by root, with md5sums that hold, and the copyright and
# changelog Debian asks for; the library package's shlibs (libweft 0.1
# libweft0.1 (>= 0.1.0)); that the packaged .pc files name /usr; that apt
# resolves them (`apt-get install -s`).
# With WEFT_TEST_DEB_INSTALL=1, as root, where no weft package is installed
# (CI), it installs them with apt-get, builds tests/tools/install_weft.c with
# the system's pkg-config and tests/tools/install_cmake with find_package
# alone, runs them and the installed perf tool on 2 ranks from PATH, then
# purges the packages and checks that nothing of them is left. Otherwise it
# runs the same programs from the packages' files unpacked (dpkg -x) and says
# why it did not install.
# Prints "ok NAME" or "FAIL NAME" per check, exits non-zero when one failed.
set -u
src=$(cd "${1:?usage: test_deb.sh SOURCE_DIR SCRATCH_DIR}" && pwd)
scratch=$(mkdir -p "${2:?usage: test_deb.sh SOURCE_DIR SCRATCH_DIR}" && cd "$2" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_deb.XXXXXX") || exit 2
# the soname's version: a 0.x weft promises nothing to another minor version
upstream=$(meson introspect --projectinfo "$src/meson.build" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
major=${upstream%%.*} minor=${upstream#*.}
minor=${minor%%.*}
if [ "$major" = 0 ]; then soversion=0.$minor; else soversion=$major; fi
libpkg=libweft$soversion
pkgs=("$libpkg" libweft-nccl2 libweft-dev weft-tools)
installed=0
cleanup() {
  if [ $installed -eq 1 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${pkgs[@]}" >/dev/null 2>&1
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
nfailed=0
check() { # NAME STATUS [LOG]
  if [ "$2" -eq 0 ]; then echo "ok $1"; else
    echo "FAIL $1"
    [ -z "${3:-}" ] || sed 's/^/  | /' "$3"
    nfailed=$((nfailed + 1))
  fi
}
for tool in dpkg-deb dpkg-shlibdeps; do
  if ! command -v $tool >/dev/null; then
    echo "skip test_deb: $tool is missing (dpkg-dev: tools/scripts/setup.sh installs it)"
    exit 0
  fi
done

out="$tmp/out"
WEFT_DEB_BUILD="$scratch/build" WEFT_DEB_MESON_OPTIONS="${WEFT_TEST_DEB_MESON_OPTIONS--Dcuda=disabled}" \
  "$src/tools/scripts/deb.sh" "$out" >"$tmp/deb.log" 2>&1
check "tools/scripts/deb.sh" $? "$tmp/deb.log"
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=/usr/lib/$multiarch
version=$(dpkg-deb -f "$out/${libpkg}_${upstream}"-*.deb Version 2>/dev/null)
debs=()
bad=0
if [ -z "$version" ]; then
  echo "  no $out/${libpkg}_$upstream-*.deb: $(cd "$out" && echo *.deb)"
  bad=1
fi
for p in "${pkgs[@]}"; do
  f="$out/${p}_${version}_$arch.deb"
  if [ -f "$f" ]; then debs+=("$f"); elif [ -n "$version" ]; then echo "  no $f"; bad=1; fi
done
check "four packages: ${pkgs[*]} ($version, $arch)" $bad
[ $bad -eq 0 ] || { echo "test_deb: $nfailed failed"; exit 1; }
field() { dpkg-deb -f "$out/${1}_${version}_$arch.deb" "$2"; }

# dependencies: between weft's own packages at this version, on the system's
# libraries by dpkg-shlibdeps, never on itself
bad=0
field libweft-dev Depends | grep -qF "$libpkg (= $version)" &&
  field libweft-dev Depends | grep -qF "libweft-nccl2 (= $version)" || {
  echo "  libweft-dev: Depends: $(field libweft-dev Depends)"
  bad=1
}
for p in "${pkgs[@]}"; do
  if field "$p" Depends | tr ',' '\n' | grep -q "^ *$p\b"; then
    echo "  $p depends on itself: $(field "$p" Depends)"
    bad=1
  fi
done
for p in "$libpkg" libweft-nccl2 weft-tools; do
  field "$p" Depends | grep -q "libc6 (>= " || { echo "  $p: no libc6 in Depends: $(field "$p" Depends)"; bad=1; }
done
# weft-tools' nccl_api_perf runs on weft's libnccl.so.2 (its run path)
field weft-tools Depends | grep -qF "libweft-nccl2 (= $version)" || {
  echo "  weft-tools: Depends: $(field weft-tools Depends)"
  bad=1
}
check "Depends: weft's packages at $version, the system's libraries, none on itself" $bad

# every file in one package; owned by root; the documents Debian asks for
bad=0
for f in "${debs[@]}"; do dpkg-deb -c "$f"; done >"$tmp/contents"
awk '$1 !~ /^d/ {print $6}' "$tmp/contents" | sort | uniq -d >"$tmp/dups"
[ -s "$tmp/dups" ] && { echo "  in two packages: $(head -5 "$tmp/dups" | tr '\n' ' ')"; bad=1; }
awk '$2 != "root/root"' "$tmp/contents" >"$tmp/owners"
[ -s "$tmp/owners" ] && { echo "  not root's: $(head -3 "$tmp/owners")"; bad=1; }
for p in "${pkgs[@]}"; do
  for doc in copyright changelog.Debian.gz; do
    grep -q " ./usr/share/doc/$p/$doc$" "$tmp/contents" || { echo "  $p: no /usr/share/doc/$p/$doc"; bad=1; }
  done
done
for want in "$libdir/libweft.so.$soversion" "$libdir/libweft_zero.so.$soversion" "$libdir/weft/libnccl.so.2" \
  /usr/include/weft.h /usr/include/weft_zero.h /usr/include/weft/nccl.h "$libdir/libweft.so" \
  "$libdir/libweft.a" "$libdir/pkgconfig/weft.pc" "$libdir/cmake/weft/weftConfig.cmake" \
  /usr/bin/weftrun /usr/bin/all_reduce_perf /usr/bin/weft-train /usr/share/man/man1/weftrun.1.gz; do
  grep -q " \.$want\( -> .*\)\?$" "$tmp/contents" || { echo "  no package holds $want"; bad=1; }
done
grep -q " \./usr/lib/$multiarch/libnccl" "$tmp/contents" && { echo "  libnccl in the loader's path"; bad=1; }
check "every file in one package, owned by root, with copyright and changelog" $bad

# md5sums hold for the unpacked files; the library packages run ldconfig
bad=0
root="$tmp/root"
for f in "${debs[@]}"; do
  p=$(dpkg-deb -f "$f" Package)
  dpkg-deb -x "$f" "$root"
  dpkg-deb -e "$f" "$tmp/ctl-$p"
  (cd "$root" && md5sum --quiet -c "$tmp/ctl-$p/md5sums") >"$tmp/md5-$p.log" 2>&1 ||
    { echo "  $p: md5sums: $(head -3 "$tmp/md5-$p.log")"; bad=1; }
done
for p in "$libpkg" libweft-nccl2; do
  grep -qx "activate-noawait ldconfig" "$tmp/ctl-$p/triggers" 2>/dev/null || { echo "  $p: no ldconfig trigger"; bad=1; }
done
for lib in libweft libweft_zero; do
  grep -qx "$lib $soversion $libpkg (>= $upstream)" "$tmp/ctl-$libpkg/shlibs" 2>/dev/null ||
    { echo "  $libpkg: no shlibs line for $lib.so.$soversion: $(cat "$tmp/ctl-$libpkg/shlibs" 2>&1)"; bad=1; }
done
check "md5sums of every package hold; ldconfig triggers; $libpkg's shlibs" $bad
# the .pc files of a system package name /usr, not a prefix found from their
# place, which pkg-config would not know for the system's own
bad=0
for pc in "$root$libdir"/pkgconfig/*.pc; do
  grep -qx "prefix=/usr" "$pc" || { echo "  $pc: $(grep '^prefix=' "$pc")"; bad=1; }
done
check "the packaged .pc files: prefix=/usr" $bad

# apt resolves them together (on this machine's installed packages)
apt-get install -s --no-install-recommends "${debs[@]}" >"$tmp/apt-s.log" 2>&1 &&
  grep -q "^Inst $libpkg " "$tmp/apt-s.log"
check "apt-get install -s ./*.deb: resolved" $? "$tmp/apt-s.log"

cd "$tmp" || exit 2
cmake_build() { # CMAKE_PREFIX_PATH (empty: the system's)
  cmake -S "$src/tests/tools/install_cmake" -B cmake-build ${1:+-DCMAKE_PREFIX_PATH="$1"} \
    -DCMAKE_BUILD_TYPE=Release >cmake.log 2>&1 && cmake --build cmake-build >>cmake.log 2>&1
}
two_ranks_ok() { # LOG
  [ "$(grep -c ': ok$' "$1")" -eq 2 ]
}
if [ "${WEFT_TEST_DEB_INSTALL:-0}" = 1 ] && [ "$(id -u)" -eq 0 ] &&
  ! dpkg-query -W -f='${Status}' "${pkgs[@]}" 2>/dev/null | grep -q "ok installed"; then
  installed=1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${debs[@]}" >apt.log 2>&1
  check "apt-get install ./*.deb" $? apt.log
  # (with /usr merged, the loader names /lib/<multiarch>)
  ldconfig -p | grep -q "libweft.so.$soversion .*=> \(/usr\)\?/lib/$multiarch/libweft.so.$soversion"
  check "ldconfig knows libweft.so.$soversion" $?
  timeout 120 weftrun -n 2 all_reduce_perf -b 8 -e 1M -f 8 -c 1 >perf.log 2>&1 &&
    grep -q "Out of bounds values : 0 OK" perf.log
  check "weftrun -n 2 all_reduce_perf -c 1 from PATH: 0 wrong" $? perf.log
  # shellcheck disable=SC2046
  cc -o install_weft "$src/tests/tools/install_weft.c" $(pkg-config --cflags --libs weft) >cc.log 2>&1 &&
    timeout 60 weftrun -n 2 ./install_weft >run.log 2>&1 && two_ranks_ok run.log &&
    ldd ./install_weft | grep -q "=> \(/usr\)\?/lib/$multiarch/libweft.so.$soversion"
  check "cc \$(pkg-config --cflags --libs weft), no run path: runs on 2 ranks" $? run.log
  # shellcheck disable=SC2046
  cc -o install_nccl "$src/tests/tools/install_nccl.c" $(pkg-config --cflags --libs weft-nccl) >ccn.log 2>&1 &&
    timeout 60 weftrun -n 2 ./install_nccl >nccl.log 2>&1 && two_ranks_ok nccl.log &&
    ldd ./install_nccl | grep -q "=> \(/usr\)\?/lib/$multiarch/weft/libnccl.so.2"
  check "cc \$(pkg-config --cflags --libs weft-nccl): weft's libnccl.so.2 on 2 ranks" $? nccl.log
  if command -v cmake >/dev/null; then
    cmake_build "" && timeout 60 weftrun -n 2 cmake-build/install_weft >cmrun.log 2>&1 &&
      two_ranks_ok cmrun.log && timeout 120 weftrun -n 2 cmake-build/zero_example_static 3 >>cmrun.log 2>&1 &&
      grep -q "w0 0.100 w9 1.000 b 0.500" cmrun.log
    check "find_package(weft) with no prefix path: targets build and run" $? cmake.log
  fi
  dpkg -V "${pkgs[@]}" >verify.log 2>&1 && [ ! -s verify.log ]
  check "dpkg -V: the installed files as packaged" $? verify.log
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${pkgs[@]}" >purge.log 2>&1
  check "apt-get purge" $? purge.log
  installed=0
  left=0
  for f in $(awk '$1 !~ /^d/ {print substr($6, 2)}' "$tmp/contents"); do
    [ -e "$f" ] || [ -L "$f" ] && { echo "  left: $f"; left=1; }
  done
  ! ldconfig -p | grep -q "libweft.so.$soversion" || { echo "  ldconfig still lists libweft.so.$soversion"; left=1; }
  check "nothing of the packages left after purge" $left
else
  if [ "$(id -u)" -ne 0 ]; then why="not root"
  elif [ "${WEFT_TEST_DEB_INSTALL:-0}" != 1 ]; then why="WEFT_TEST_DEB_INSTALL=1 not set"
  else why="a weft package is installed already"; fi
  echo "skip apt-get install: $why; the unpacked packages instead"
  pc() { PKG_CONFIG_PATH="$root$libdir/pkgconfig" pkg-config --define-variable=prefix="$root/usr" "$@"; }
  # shellcheck disable=SC2046
  cc -o install_weft "$src/tests/tools/install_weft.c" $(pc --cflags --libs weft) >cc.log 2>&1 &&
    LD_LIBRARY_PATH="$root$libdir" timeout 60 "$root/usr/bin/weftrun" -n 2 ./install_weft >run.log 2>&1 &&
    two_ranks_ok run.log
  check "unpacked: cc \$(pkg-config --cflags --libs weft) install_weft.c runs on 2 ranks" $? run.log
  timeout 120 "$root/usr/bin/weftrun" -n 2 "$root/usr/bin/all_reduce_perf" -b 8 -e 1M -f 8 -c 1 >perf.log 2>&1 &&
    grep -q "Out of bounds values : 0 OK" perf.log
  check "unpacked: weftrun -n 2 all_reduce_perf -c 1: 0 wrong" $? perf.log
  if command -v cmake >/dev/null; then
    cmake_build "$root/usr" && LD_LIBRARY_PATH="$root$libdir" timeout 60 "$root/usr/bin/weftrun" -n 2 \
      cmake-build/install_weft >cmrun.log 2>&1 && two_ranks_ok cmrun.log
    check "unpacked: find_package(weft) targets build and run" $? cmake.log
  fi
fi

echo "test_deb: $nfailed failed"
[ "$nfailed" -eq 0 ]
