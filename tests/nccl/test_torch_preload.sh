#!/usr/bin/env bash
# PyTorch with weft's libnccl.so.2 preloaded: `import torch` succeeds, and
# the dynamic loader binds every nccl* symbol libtorch_cuda.so needs to
# weft's library (LD_DEBUG=bindings, with LD_BIND_NOW so that all of them
# are bound at import, not on first call). torch.cuda.nccl.version() is
# weft's NCCL version, and torch.cuda.nccl.unique_id() (ncclGetUniqueId,
# which needs no GPU) returns weft's 128-byte id.
#   test_torch_preload.sh LIBNCCL TORCH_PYTHON
# Skips (77) without TORCH_PYTHON or without libtorch_cuda.so.
set -euo pipefail
lib=$(realpath "$1") python=$2
export LC_ALL=C

if [ ! -x "$python" ]; then
  echo "SKIP: no $python (WEFT_SETUP_TORCH=1 tools/scripts/setup.sh creates .venv-torch)"
  exit 77
fi
torch_dir=$("$python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))')
cuda_lib=$torch_dir/lib/libtorch_cuda.so
if [ ! -f "$cuda_lib" ]; then
  echo "SKIP: $cuda_lib is absent (a CPU-only PyTorch loads no NCCL)"
  exit 77
fi
needed=$(nm -D --undefined-only "$cuda_lib" | awk '{print $NF}' | sed 's/@.*//' | grep -E '^p?nccl' | sort -u)
if [ -z "$needed" ]; then
  echo "FAIL: nm finds no nccl* symbol undefined in $cuda_lib"
  exit 1
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0
if ! LD_PRELOAD=$lib LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT=$out/bind \
    "$python" -c 'import torch; print("torch", torch.__version__, "sees NCCL", torch.cuda.nccl.version()); print("unique id from weft:", len(torch.cuda.nccl.unique_id()), "bytes")' \
    >"$out/stdout" 2>&1; then
  echo "FAIL: import torch with LD_PRELOAD=$lib:"
  tail -20 "$out/stdout"
  exit 1
fi
cat "$out/stdout"
if ! grep -q 'sees NCCL (2, 32, 3)' "$out/stdout"; then
  # some releases (torch 2.11) return the NCCL version they were built with,
  # not ncclGetVersion's: then the same without the preload, and the
  # bindings below are what shows weft is the library in use
  seen=$(sed -n 's/.* sees NCCL \(.*\)$/\1/p' "$out/stdout")
  plain=$("$python" -c 'import torch; print(torch.cuda.nccl.version())' 2>/dev/null || true)
  if [ -n "$seen" ] && [ "$seen" = "$plain" ]; then
    echo "torch.cuda.nccl.version() is $seen with or without the preload: torch's build-time" \
      "NCCL version, not a query of the library"
  else
    echo "FAIL: torch.cuda.nccl.version() is $seen, neither weft's (2, 32, 3) nor torch's own ($plain)"
    fail=1
  fi
fi
grep -q 'unique id from weft: 128 bytes' "$out/stdout" || { echo "FAIL: torch.cuda.nccl.unique_id() did not give 128 bytes"; fail=1; }

# "binding file <libtorch_cuda.so> [0] to <library> [0]: normal symbol `name'"
bound=$(cat "$out"/bind.* | grep -F "/libtorch_cuda.so [" | grep -F "binding file " |
  sed -n "s/.* to \(.*\) \[[0-9]*\]: normal symbol \`\(p\{0,1\}nccl[A-Za-z0-9_]*\)'.*/\2 \1/p" | sort -u)
to_weft=$(echo "$bound" | awk -v lib="$lib" '$2 == lib {print $1}' | sort -u)
elsewhere=$(echo "$bound" | awk -v lib="$lib" '$2 != lib')
unbound=$(comm -23 <(echo "$needed") <(echo "$to_weft"))
if [ -n "$elsewhere" ]; then
  echo "FAIL: bound to another library:"; echo "$elsewhere" | sed 's/^/  /'
  fail=1
fi
if [ -n "$unbound" ]; then
  echo "FAIL: not bound to $lib:"; echo "$unbound" | sed 's/^/  /'
  fail=1
fi
[ $fail -eq 0 ] && echo "all $(echo "$needed" | wc -l) nccl* symbols of libtorch_cuda.so bound to $lib"
exit $fail
