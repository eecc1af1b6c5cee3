#!/usr/bin/env bash
# libnccl.so.2 must export every NCCL 2.27 function and its pnccl* alias,
# every function PyTorch's CUDA library calls, and nothing else.
#   test_symbols.sh LIBNCCL NCCL_SYMBOLS PYTORCH_SYMBOLS
set -euo pipefail
lib=$1 api=$2 torch=$3
fail=0

soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
if [ "$soname" != libnccl.so.2 ]; then
  echo "soname is '$soname', want libnccl.so.2"
  fail=1
fi

# defined dynamic symbols, without the linker's own section markers
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v -E '^(_init|_fini|_edata|_end|__bss_start)$' | sort -u)
names() { grep -v -E '^\s*(#|$)' "$1" | awk '{print $1}'; }
expected=$( { names "$api"; names "$api" | sed 's/^/p/'; } | sort -u)

missing=$(comm -13 <(echo "$exported") <(echo "$expected"))
extra=$(comm -23 <(echo "$exported") <(echo "$expected"))
if [ -n "$missing" ]; then
  echo "not exported:"; echo "$missing" | sed 's/^/  /'
  fail=1
fi
if [ -n "$extra" ]; then
  echo "exported but not part of the NCCL API:"; echo "$extra" | sed 's/^/  /'
  fail=1
fi
torch_missing=$(comm -13 <(echo "$exported") <(names "$torch" | sort -u))
if [ -n "$torch_missing" ]; then
  echo "called by PyTorch but not exported:"; echo "$torch_missing" | sed 's/^/  /'
  fail=1
fi
# as NCCL's: nccl* weak (a profiler may override them), pnccl* strong
wrong=$(nm -D --defined-only "$lib" | awk '($3 ~ /^nccl/ && $2 != "W") || ($3 ~ /^pnccl/ && $2 != "T") {print $2, $3}')
if [ -n "$wrong" ]; then
  echo "want nccl* weak (W) and pnccl* strong (T):"; echo "$wrong" | sed 's/^/  /'
  fail=1
fi
[ $fail -eq 0 ] && echo "$(echo "$exported" | wc -l) symbols, as expected; PyTorch's $(names "$torch" | wc -l) all present"
exit $fail
