#!/usr/bin/env bash
# Installs what weft builds with (Debian packages), then configures and builds
# it in ./build. Safe to run again: it installs only what is missing and
# rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/../.."

packages=(gcc g++ meson ninja-build pkg-config libgtest-dev)
packages+=(libucx-dev)
packages+=(libhwloc-dev) # topology (NUMA, PCI tree, GPUs, NICs)
packages+=(libudev-dev) # a static link of hwloc (its hwloc.pc asks for -ludev)
packages+=(libopenblas-dev) # weft-train's transformer: cblas_sgemm
packages+=(cmake) # the install test: find_package(weft) as CMake projects use it
packages+=(dpkg-dev) # tools/scripts/deb.sh: Debian packages (dpkg-shlibdeps)
packages+=(iproute2) # network namespaces for the multi-host and port-churn tests
# the perf tools' tests, tools/perf/perf_plot.py and tools/bench/compare.py
packages+=(python3)
# compare.py's baselines (Open MPI, Gloo): WEFT_SETUP_BASELINES=1 installs them too
if [ "${WEFT_SETUP_BASELINES:-0}" = 1 ]; then
  packages+=(openmpi-bin libopenmpi-dev libgloo-dev)
fi
# the PyTorch backend (tools/torch_weft): WEFT_SETUP_TORCH=1 makes .venv-torch
if [ "${WEFT_SETUP_TORCH:-0}" = 1 ]; then
  packages+=(python3-venv python3-dev)
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

# PyTorch (WEFT_SETUP_TORCH=1): .venv-torch with the pinned torch (PyPI's
# default wheel, which brings its CUDA libraries: the NCCL shim's tests read
# libtorch_cuda.so) and numpy. The download runs while weft builds; its log is
# shown if it fails.
torch_version=2.15.0
torch_pid=""
torch_log=".venv-torch.log"
if [ "${WEFT_SETUP_TORCH:-0}" = 1 ]; then
  if [ ! -x .venv-torch/bin/python ]; then
    echo "setup: creating .venv-torch"
    python3 -m venv .venv-torch
  fi
  if ! .venv-torch/bin/python -c "import numpy, torch; assert torch.__version__.split('+')[0] == '$torch_version'" 2>/dev/null; then
    echo "setup: installing torch==$torch_version and numpy into .venv-torch (in the background; log: $torch_log)"
    # --no-cache-dir: the wheels (about 3 GB with torch's CUDA libraries) are
    # not kept twice; the venv itself takes about 5.5 GB
    avail_gb=$(df -P -BG . | awk 'NR == 2 { sub("G", "", $4); print $4 }')
    if [ "${avail_gb:-0}" -lt 9 ]; then
      echo "setup: warning: ${avail_gb} GB free here; torch's installation needs about 9 GB while it runs" >&2
    fi
    .venv-torch/bin/python -m pip install -q --no-cache-dir "torch==$torch_version" numpy >"$torch_log" 2>&1 &
    torch_pid=$!
  fi
fi

t0=$SECONDS
# WEFT_SETUP_MESON_OPTIONS: options for the first `meson setup build` (CI's,
# for one, in .ci/run)
# pkgconfig.relocatable is meson.build's default too; given on the command
# line it is kept through any reconfiguration of build/ (a build dir once
# found with it false made an install whose .pc files named /usr/local)
if [ ! -f build/build.ninja ]; then
  # shellcheck disable=SC2086
  meson setup build -Dpkgconfig.relocatable=true ${WEFT_SETUP_MESON_OPTIONS:-}
fi
ninja -C build
echo "setup: build took $((SECONDS - t0)) s"

# The PyTorch backend: torch_weft built against .venv-torch's torch and
# build/libweft.so; a .pth file in the venv makes `import torch_weft` work from
# anywhere.
if [ "${WEFT_SETUP_TORCH:-0}" = 1 ]; then
  t0=$SECONDS
  if [ -n "$torch_pid" ] && ! wait "$torch_pid"; then
    echo "setup: installing torch into .venv-torch failed:" >&2
    cat "$torch_log" >&2
    df -h . >&2
    exit 1
  fi
  [ -z "$torch_pid" ] || echo "setup: waited $((SECONDS - t0)) s for torch's installation after the build"
  .venv-torch/bin/python tools/torch_weft/build.py --weft-build build
  site="$(.venv-torch/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$PWD/tools/torch_weft" > "$site/torch_weft.pth"
  .venv-torch/bin/python -c "import torch_weft" 2>/dev/null || {
    echo "setup: .venv-torch/bin/python cannot import torch_weft" >&2
    exit 1
  }
fi
