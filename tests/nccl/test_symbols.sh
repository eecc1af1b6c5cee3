#!/usr/bin/env bash
# libnccl.so.2 must export every NCCL 2.32 function and its pnccl* alias (but
# for those the list marks `alone`) and nothing else, nccl.h must declare
# each of them, and libnccl.so.2 must export every nccl* function that the
# installed PyTorch's libtorch_cuda.so leaves undefined (read off it with
# nm, not listed here).
#   test_symbols.sh LIBNCCL NCCL_SYMBOLS [TORCH_PYTHON [NCCL_H]]
# Without TORCH_PYTHON (.venv-torch/bin/python) the PyTorch part is skipped,
# and says so.
set -euo pipefail
lib=$1 api=$2 torch_python=${3:-} header=${4:-}
fail=0
export LC_ALL=C

soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
if [ "$soname" != libnccl.so.2 ]; then
  echo "soname is '$soname', want libnccl.so.2"
  fail=1
fi

# defined dynamic symbols, without the linker's own section markers
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v -E '^(_init|_fini|_edata|_end|__bss_start)$' | sort -u)
names() { grep -v -E '^\s*(#|$)' "$1" | awk '{print $1}'; }
alone() { grep -v -E '^\s*(#|$)' "$1" | awk '$2 == "alone" {print $1}'; }
expected=$( { names "$api"; comm -23 <(names "$api" | sort -u) <(alone "$api" | sort -u) | sed 's/^/p/'; } | sort -u)

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
# as NCCL's: nccl* weak (a profiler may override them), pnccl* strong
alone_list=" $(alone "$api" | tr '\n' ' ')"
wrong=$(nm -D --defined-only "$lib" | awk -v alone="$alone_list" '
  index(alone, " " $3 " ") { if ($2 != "T") print $2, $3; next }
  ($3 ~ /^nccl/ && $2 != "W") || ($3 ~ /^pnccl/ && $2 != "T") {print $2, $3}')
if [ -n "$wrong" ]; then
  echo "want nccl* weak (W), pnccl* and those marked alone strong (T):"; echo "$wrong" | sed 's/^/  /'
  fail=1
fi
echo "$(echo "$exported" | wc -l) symbols exported, NCCL 2.32's $(names "$api" | wc -l) functions and their pnccl* aliases"

# the header declares every function of the list, as a function
if [ -n "$header" ]; then
  undeclared=$(names "$api" | while read -r f; do
    grep -q -E "(\b$f *\(|, $f,)" "$header" || echo "$f"
  done)
  if [ -n "$undeclared" ]; then
    echo "exported but not declared in $header:"; echo "$undeclared" | sed 's/^/  /'
    fail=1
  else
    echo "nccl.h declares all $(names "$api" | wc -l) of them"
  fi
fi

# PyTorch's needs, from its library
if [ -z "$torch_python" ] || [ ! -x "$torch_python" ]; then
  echo "PyTorch not checked: no ${torch_python:-.venv-torch/bin/python} (WEFT_SETUP_TORCH=1 tools/scripts/setup.sh makes it)"
else
  torch_dir=$("$torch_python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))')
  cuda_lib=$torch_dir/lib/libtorch_cuda.so
  if [ ! -f "$cuda_lib" ]; then
    echo "PyTorch not checked: $cuda_lib is absent (a CPU-only build links no NCCL)"
  else
    needed=$(nm -D --undefined-only "$cuda_lib" | awk '{print $NF}' | sed 's/@.*//' | grep -E '^p?nccl' | sort -u)
    torch_missing=$(comm -13 <(echo "$exported") <(echo "$needed"))
    not_api=$(comm -13 <(echo "$expected") <(echo "$needed"))
    if [ -z "$needed" ]; then
      echo "$cuda_lib needs no nccl* symbol: nm found none"
      fail=1
    fi
    if [ -n "$torch_missing" ]; then
      echo "needed by $cuda_lib but not exported:"; echo "$torch_missing" | sed 's/^/  /'
      fail=1
    fi
    if [ -n "$not_api" ]; then
      echo "needed by PyTorch but not in NCCL 2.32's list (nccl_symbols.txt is out of date):"
      echo "$not_api" | sed 's/^/  /'
      fail=1
    fi
    version=$("$torch_python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo '?')
    [ -z "$torch_missing" ] && echo "PyTorch $version: the $(echo "$needed" | wc -l) nccl* symbols libtorch_cuda.so needs are all exported"
  fi
fi
exit $fail
