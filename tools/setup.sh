#!/usr/bin/env bash
# Installs what weft builds with (Debian packages), then configures and builds
# it in ./build. Safe to run again: it installs only what is missing and
# rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(gcc g++ meson ninja-build pkg-config libgtest-dev)
packages+=(libucx-dev)
packages+=(libhwloc-dev) # topology (NUMA, PCI tree, GPUs, NICs)
packages+=(iproute2) # network namespaces for the multi-host and port-churn tests
# the perf tools' tests, tools/perf_plot.py and tools/bench/compare.py
packages+=(python3)
# compare.py's baselines (Open MPI, Gloo): WEFT_SETUP_BASELINES=1 installs them too
if [ "${WEFT_SETUP_BASELINES:-0}" = 1 ]; then
  packages+=(openmpi-bin libopenmpi-dev libgloo-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# CUDA, when the toolkit is there, only needs nvcc on PATH.
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"

if [ ! -f build/build.ninja ]; then
  meson setup build
fi
ninja -C build
