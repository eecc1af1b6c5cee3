#!/usr/bin/env bash
# Debian packages of weft, as NVIDIA ships NCCL's (libnccl2, libnccl-dev):
#
#   tools/scripts/deb.sh [OUT_DIR]        (default: ./deb)
#
# configures a release build for /usr in $WEFT_DEB_BUILD (default build-deb;
# $WEFT_DEB_MESON_OPTIONS adds options, -Dcuda=disabled say), installs it into
# a staging tree, and splits that into
#
#   libweft0.1     libweft.so.0.1 and libweft_zero.so.0.1 (ldconfig trigger,
#                  shlibs), named for the soname as Debian names library
#                  packages: a 0.x weft's soname carries its minor version
#   libweft-nccl2  libnccl.so.2, the NCCL API over weft, in <libdir>/weft: apart
#                  from the loader's path, so it never stands in for NVIDIA's
#                  libnccl2 (docs/nccl.md); programs find it through a run path
#   libweft-dev    headers, libweft.so, static libraries, pkg-config files,
#                  CMake's weftConfig.cmake, nccl.h and weft-nccl.pc
#   weft-tools     weftrun, the perf tools, weft-train, weft-info, weft-topo ...
#                  with their manual pages
#
# each with Depends from dpkg-shlibdeps (and the -dev package on the others at
# this version), md5sums, a copyright file and a changelog, owned by root, built
# by dpkg-deb. Every installed file goes into exactly one package: a file that
# no rule places stops the script. Install them with
#
#   sudo apt-get install ./deb/*.deb
#
# Maintainer: $DEBFULLNAME <$DEBEMAIL>, as Debian's own tools take it.
# The .pc files name /usr (pkg-config leaves the system's own folders out of
# the flags), not a prefix found from their place.
set -euo pipefail
out=$(mkdir -p "${1:-deb}" && cd "${1:-deb}" && pwd) # the caller's folder
cd "$(dirname "$0")/../.."
src=$PWD
build=${WEFT_DEB_BUILD:-build-deb}
for tool in dpkg-deb dpkg-shlibdeps dpkg-architecture meson ninja readelf strip; do
  command -v $tool >/dev/null || {
    echo "deb: $tool is missing (dpkg-dev, meson, ninja-build: tools/scripts/setup.sh)" >&2
    exit 1
  }
done
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=usr/lib/$multiarch
upstream=$(meson introspect --projectinfo meson.build |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
version="$upstream-1"
maintainer="${DEBFULLNAME:-weft maintainers} <${DEBEMAIL:-weft@localhost}>"

# a build for /usr: Debian's layout, no test suites, no Python package;
# set up again (wiped) when it was set up with other options
setup_args="--prefix=/usr --libdir=lib/$multiarch --buildtype=release -Dtests=false -Dpython=false -Dpkgconfig.relocatable=false ${WEFT_DEB_MESON_OPTIONS:-}"
if [ ! -f "$build/build.ninja" ] || [ "$(cat "$build/.deb-setup" 2>/dev/null)" != "$setup_args" ]; then
  wipe=()
  [ ! -f "$build/build.ninja" ] || wipe=(--wipe)
  # shellcheck disable=SC2086
  meson setup "${wipe[@]}" "$build" $setup_args >"$out/meson-setup.log" 2>&1 || {
    cat "$out/meson-setup.log" >&2
    exit 1
  }
  echo "$setup_args" >"$build/.deb-setup"
fi
prefix=$(meson introspect --buildoptions "$build" |
  python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
if [ "$prefix" != /usr ]; then
  echo "deb: $build is configured for $prefix; packages install into /usr (remove $build)" >&2
  exit 1
fi
ninja -C "$build" >"$out/build.log" 2>&1 || {
  tail -40 "$out/build.log" >&2
  exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/weft-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/stage
meson install -C "$build" --no-rebuild --quiet --destdir "$stage" >"$out/install.log" 2>&1 || {
  cat "$out/install.log" >&2
  exit 1
}

# the shared libraries' package, named for their soname (libweft.so.0.1:
# libweft0.1)
soname=$(readelf -d "$stage/$libdir/libweft.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
soversion=${soname#libweft.so.}
if [ -z "$soname" ] || [ "$soversion" = "$soname" ]; then
  echo "deb: no soname libweft.so.<version> in $stage/$libdir/libweft.so" >&2
  exit 1
fi
libpkg=libweft$soversion

# which package each installed path goes to ("-": none, left out)
package_of() { # PATH (relative to the staging root)
  case "$1" in
    $libdir/libweft.so.$soversion* | $libdir/libweft_zero.so.$soversion*) echo "$libpkg" ;;
    usr/share/doc/weft/LICENSE) echo - ;; # each package's copyright file holds it
    $libdir/weft/libnccl.so.2*) echo libweft-nccl2 ;;
    usr/include/* | $libdir/*.so | $libdir/weft/libnccl.so | $libdir/*.a | \
      $libdir/pkgconfig/* | $libdir/cmake/weft/*) echo libweft-dev ;;
    usr/bin/* | usr/share/man/man1/*) echo weft-tools ;;
    *) echo "" ;;
  esac
}
deb=$work/debian # dpkg-shlibdeps reads debian/control and debian/<package>/
mkdir -p "$deb"
unplaced=0
while IFS= read -r -d '' f; do
  rel=${f#"$stage"/}
  pkg=$(package_of "$rel")
  if [ -z "$pkg" ]; then
    echo "deb: no package takes /$rel" >&2
    unplaced=1
    continue
  fi
  [ "$pkg" != - ] || continue
  mkdir -p "$deb/$pkg/$(dirname "$rel")"
  cp -a "$f" "$deb/$pkg/$rel"
done < <(find "$stage" \( -type f -o -type l \) -print0)
[ $unplaced -eq 0 ] || exit 1

packages=()
for p in "$libpkg" libweft-nccl2 libweft-dev weft-tools; do
  [ -d "$deb/$p" ] && packages+=("$p")
done

is_elf() { # FILE: a shared object or a program (not a static library)
  case "$1" in *.a) return 1 ;; esac
  readelf -h "$1" >/dev/null 2>&1
}

# what Debian requires of every package's files; stripped ELF files (the
# static libraries keep their symbols), man pages compressed
for p in "${packages[@]}"; do
  root=$deb/$p
  while IFS= read -r -d '' f; do
    if is_elf "$f"; then strip --strip-unneeded --remove-section=.comment "$f"; fi
  done < <(find "$root" -type f -print0)
  find "$root" -name '*.a' -type f -exec strip --strip-debug {} +
  if [ -d "$root/usr/share/man" ]; then
    find "$root/usr/share/man" -type f -name '*.[0-9]' -exec gzip -9n {} +
  fi
  doc=$root/usr/share/doc/$p
  mkdir -p "$doc"
  {
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: weft"
    echo
    echo "Files: *"
    echo "Copyright: $(sed -n 's/^Copyright (c) //p' "$src/LICENSE")"
    echo "License: Expat"
    # the licence's text after its copyright line, as an indented block
    sed '1,/^Copyright/d' "$src/LICENSE" | sed '/./,$!d; s/^$/./; s/^/ /'
  } >"$doc/copyright"
  printf '%s\n' "weft ($version) unstable; urgency=medium" "" \
    "  * Packages of weft $upstream built by tools/scripts/deb.sh." "" \
    " -- $maintainer  $(TZ=UTC date -R -d "@${SOURCE_DATE_EPOCH:-$(git -C "$src" log -1 --format=%ct 2>/dev/null || date +%s)}")" |
    gzip -9n >"$doc/changelog.Debian.gz"
  find "$root" -type d -exec chmod 755 {} +
  find "$root" -type f -exec chmod go-w {} +
done

# our own libraries' shlibs, so that the packages that link them depend on
# the library package at this version or later
mkdir -p "$deb/$libpkg/DEBIAN"
printf '%s\n' "libweft $soversion $libpkg (>= $upstream)" \
  "libweft_zero $soversion $libpkg (>= $upstream)" >"$deb/$libpkg/DEBIAN/shlibs"
# weft's libnccl.so.2, which nccl_api_perf finds through its run path, for
# this build only: installed, it claims no library of the system's
[ ! -d "$deb/libweft-nccl2" ] || echo "libnccl 2 libweft-nccl2 (= $version)" >"$deb/shlibs.local"
{
  echo "Source: weft"
  for p in "${packages[@]}"; do printf '\nPackage: %s\nArchitecture: any\n' "$p"; done
} >"$deb/control"

cuda_lib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib; do
  [ -d "$d" ] && cuda_lib=$d && break
done

description() { # PACKAGE
  case "$1" in
    "$libpkg") printf '%s\n' "collective communication library (NCCL's API shapes) - shared libraries" \
      " weft moves data between the ranks of a job: all-reduce, all-gather," \
      " reduce-scatter, broadcast, reduce, gather, scatter, all-to-all and" \
      " point-to-point sends, over host memory and CUDA device memory, through" \
      " shared memory, sockets and UCX. This package holds libweft.so.$soversion and" \
      " libweft_zero.so.$soversion, its ZeRO layer (sharded data-parallel training)." ;;
    libweft-nccl2) printf '%s\n' "collective communication library (NCCL's API shapes) - NCCL API" \
      " libnccl.so.2 with NCCL 2.32's API over weft, installed apart from the" \
      " loader's path (in the weft folder of the library directory), so that" \
      " it stands in for NVIDIA's libnccl2 only where a program asks for it:" \
      " LD_LIBRARY_PATH, LD_PRELOAD or a run path (weft-nccl.pc gives one)." ;;
    libweft-dev) printf '%s\n' "collective communication library (NCCL's API shapes) - development files" \
      " Headers (weft.h, weft_zero.h, weft/nccl.h), the libraries to link, shared" \
      " and static, pkg-config files (weft, weft_zero, weft-nccl) and CMake's" \
      " package (find_package(weft): weft::weft, weft::weft_zero, weft::nccl," \
      " weft::weft_static, weft::weft_zero_static)." ;;
    weft-tools) printf '%s\n' "collective communication library (NCCL's API shapes) - programs" \
      " weftrun (starts the ranks of a job on one machine), the collective" \
      " benchmarks in nccl-tests' format (all_reduce_perf ...), weft-train" \
      " (trains a transformer with the ZeRO layer), weft-info and weft-topo." ;;
  esac
}
section() { case "$1" in libweft-dev) echo libdevel ;; weft-tools) echo net ;; *) echo libs ;; esac; }

for p in "${packages[@]}"; do
  root=$deb/$p
  mkdir -p "$root/DEBIAN"
  elves=()
  while IFS= read -r -d '' f; do
    if is_elf "$f"; then elves+=("-e$f"); fi
  done < <(find "$root" -path "$root/DEBIAN" -prune -o -type f -print0)
  depends=""
  if [ ${#elves[@]} -gt 0 ]; then
    # CUDA's runtime (nccl_api_perf and the perf tools of a CUDA build link
    # libcudart.so) comes with the CUDA toolkit, in no Debian package: it is
    # found in the toolkit's folder, and named in no Depends
    depends=$(cd "$work" && dpkg-shlibdeps -O -x"$p" --ignore-missing-info \
      -l"$deb/libweft-nccl2/$libdir/weft" ${cuda_lib:+-l"$cuda_lib"} "${elves[@]}" 2>"$work/shlibdeps.log" |
      sed -n 's/^shlibs:Depends=//p') || {
      cat "$work/shlibdeps.log" >&2
      exit 1
    }
  fi
  case "$p" in
    libweft-dev)
      extra="$libpkg (= $version)"
      [ -d "$deb/libweft-nccl2" ] && extra+=", libweft-nccl2 (= $version)"
      # a static link takes hwloc's and UCX's through pkg-config (weft.pc)
      pc_requires=$(sed -n 's/^Requires.private: *//p' "$root/$libdir/pkgconfig/weft.pc")
      # (Debian's hwloc.pc asks a static link for -ludev: libudev-dev)
      case "$pc_requires" in *hwloc*) extra+=", libhwloc-dev, libudev-dev" ;; esac
      case "$pc_requires" in *ucx*) extra+=", libucx-dev" ;; esac
      depends="${depends:+$depends, }$extra" ;;
  esac
  {
    echo "Package: $p"
    echo "Source: weft"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: $maintainer"
    echo "Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)"
    [ -z "$depends" ] || echo "Depends: $depends"
    case "$p" in "$libpkg" | libweft-nccl2) echo "Multi-Arch: same" ;; esac
    echo "Section: $(section "$p")"
    echo "Priority: optional"
    echo "Description: $(description "$p")"
  } >"$root/DEBIAN/control"
  case "$p" in "$libpkg" | libweft-nccl2) echo "activate-noawait ldconfig" >"$root/DEBIAN/triggers" ;; esac
  [ "$p" = "$libpkg" ] || rm -f "$root/DEBIAN/shlibs"
  (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
    xargs -0 -r md5sum >DEBIAN/md5sums)
  chmod 644 "$root"/DEBIAN/*
  dpkg-deb --root-owner-group -Zxz --build "$root" "$out/${p}_${version}_$arch.deb" >/dev/null
  echo "deb: $out/${p}_${version}_$arch.deb"
done
