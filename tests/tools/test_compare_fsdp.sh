#!/bin/bash
# tools/train/compare_fsdp.sh end to end at a small size (tiny, batch 8 of 16
# tokens, 3 steps, one round, stage 3): weft-train and PyTorch FSDP2 over Gloo
# each print a positive tokens/s, the kernels weft-train's sgemm ran are
# named, and the summary has a row per trainer. FSDP2 over weft joins when
# torch_weft imports, else the script says it skipped it. Skips (77) without
# the checkout's .venv-torch.
# usage: test_compare_fsdp.sh SOURCE_DIR BUILD_DIR
set -u
src=$1
build=$2
py="$src/.venv-torch/bin/python"
if [ ! -x "$py" ] || ! "$py" -c "import torch" 2>/dev/null; then
  echo "SKIP: no $src/.venv-torch with torch (WEFT_SETUP_TORCH=1 tools/scripts/setup.sh)"
  exit 77
fi
out=$(ROUNDS=1 STAGES=3 BUILD="$build" timeout 240 "$src/tools/train/compare_fsdp.sh" tiny 8 3 16 2>&1)
rc=$?
echo "$out"
fail=0
[ $rc -eq 0 ] || { echo "FAIL: compare_fsdp.sh exited $rc"; fail=1; }
check() { # pattern of a figure line, what
  if ! echo "$out" | grep -Eq "$1"; then
    echo "FAIL: no figure for $2"
    fail=1
  fi
}
check '^  weft-train stage 3 \(sgemm: [A-Za-z0-9]+\): [1-9][0-9]* tokens/s$' "weft-train stage 3"
check '^  FSDP2 over gloo: [1-9][0-9]* tokens/s$' "FSDP2 over Gloo"
check '^\| weft-train stage 3 \| [1-9][0-9]* \| ' "weft-train's summary row"
check '^\| FSDP2 over gloo \| [1-9][0-9]* \| ' "Gloo's summary row"
if ! echo "$out" | grep -q "torch_weft does not import"; then
  check '^  FSDP2 over weft: [1-9][0-9]* tokens/s$' "FSDP2 over weft"
fi
[ $fail -eq 0 ] && echo "PASS"
exit $fail
