#!/usr/bin/env bash
# Tokens/s of weft-train's transformer against PyTorch FSDP2 training the same
# model (tools/train/gpt2_fsdp_bench.py) over Gloo and over the weft backend,
# 2 ranks, fp32, same model, global batch and sequence:
#   tools/train/compare_fsdp.sh [MODEL [BATCH [STEPS [SEQ]]]]   (tiny 24 10)
# Needs build/ and .venv-torch; TORCH_WEFT_DIR: where torch_weft imports from
# (default tools/torch_weft, built against this checkout's build/).
set -u
cd "$(dirname "$0")/../.."
model=${1:-tiny} batch=${2:-24} steps=${3:-10} seq=${4:-0}
py=.venv-torch/bin/python
export OMP_NUM_THREADS=1
seqarg=()
[ "$seq" != 0 ] && seqarg=(--seq "$seq")
for stage in 0 3; do
  build/tools/weftrun -n 2 build/tools/weft-train --model "$model" --batch "$batch" \
    --steps "$steps" --zero-stage "$stage" --sample 0 --val-every 0 "${seqarg[@]}" 2>&1 |
    awk -v s=$stage -v m=$model '/tokens\/s over steps/{print "weft-train stage " s " " m ": " $3 " tokens/s over steps " $7 " " $8 " " $9 " " $10 " " $11 " " $12}'
done
for backend in gloo weft; do
  pp=""
  if [ "$backend" = weft ]; then
    pp=${TORCH_WEFT_DIR:-$PWD/tools/torch_weft}
    if ! PYTHONPATH=$pp $py -c "import torch_weft" 2>/dev/null; then
      echo "fsdp2 weft: torch_weft does not import from $pp: skipped"
      continue
    fi
  fi
  PYTHONPATH=$pp $py -m torch.distributed.run --standalone --nproc-per-node 2 \
    tools/train/gpt2_fsdp_bench.py --backend "$backend" --model "$model" --batch "$batch" \
    --steps "$steps" "${seqarg[@]}" 2>&1 | grep '^fsdp2'
done
