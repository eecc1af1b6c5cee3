#!/usr/bin/env bash
# Compiles header_check.c, which includes nccl.h alone and asserts its ABI
# (sizes, offsets, enum values, function types), with every compiler at hand.
#   test_header.sh CHECK_C INCLUDE_DIR host CC CXX
#   test_header.sh CHECK_C INCLUDE_DIR nvcc NVCC     (skips when NVCC is empty)
set -euo pipefail
check=$1 inc=$2 mode=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {
  echo "+ $*"
  "$@"
}

if [ "$mode" = host ]; then
  cc=$4 cxx=$5
  # C11 and C++11, strict: the header must not warn
  run "$cc" -std=c11 -pedantic -Wall -Wextra -Werror -I"$inc" -c "$check" -o "$out/c.o"
  run "$cc" -std=c99 -Wall -Wextra -Werror -I"$inc" -c "$check" -o "$out/c99.o"
  run "$cxx" -x c++ -std=c++11 -pedantic -Wall -Wextra -Werror -I"$inc" -c "$check" -o "$out/cxx.o"
  # with CUDA's headers on the path the header takes cudaStream_t from them
  cuda_inc=/usr/local/cuda/include
  if [ -f "$cuda_inc/cuda_runtime.h" ]; then
    run "$cc" -std=c11 -Wall -Wextra -Werror -DEXPECT_CUDA_RUNTIME -I"$inc" -I"$cuda_inc" \
      -c "$check" -o "$out/c_cuda.o"
    run "$cxx" -x c++ -std=c++17 -Wall -Wextra -Werror -DEXPECT_CUDA_RUNTIME -I"$inc" \
      -I"$cuda_inc" -c "$check" -o "$out/cxx_cuda.o"
  else
    echo "no $cuda_inc/cuda_runtime.h: the CUDA-header variants are not compiled"
  fi
elif [ "$mode" = nvcc ]; then
  nvcc=${4:-}
  if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
    echo "SKIP: nvcc not found"
    exit 77
  fi
  run "$nvcc" -x cu -std=c++17 -DEXPECT_CUDA_RUNTIME -I"$inc" -c "$check" -o "$out/cu.o"
else
  echo "unknown mode $mode" >&2
  exit 2
fi
echo "nccl.h compiles cleanly ($mode)"
