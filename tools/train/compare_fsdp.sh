#!/usr/bin/env bash
# Tokens/s of weft-train's transformer against PyTorch FSDP2 training the same
# model (tools/train/gpt2_fsdp_bench.py) over Gloo and over the weft backend:
# 2 ranks, one thread each, fp32, same model, global batch and sequence, in
# alternating rounds (weft-train at each stage, FSDP2 over Gloo, over weft,
# then again) so that a shared machine's load falls on every trainer alike.
#
#   tools/train/compare_fsdp.sh [MODEL [BATCH [STEPS [SEQ]]]]   (tiny 24 10)
#
# Every trainer's figure is tokens/s over steps 3-STEPS (its first two steps,
# warm-up, left out); the summary gives each one's median and range over the
# rounds. Environment: ROUNDS (3), STAGES ("0 3"), BUILD (the build directory,
# build), TORCH_WEFT_DIR (where
# torch_weft imports from; default tools/torch_weft, built against this
# checkout's build/), BLAS_CORE (OpenBLAS's kernels for weft-train: "auto",
# the default, clears OPENBLAS_CORETYPE so that OpenBLAS picks them for the
# CPU, as it does where nothing pins them; a name such as Haswell is passed as
# OPENBLAS_CORETYPE; each run prints the kernels that ran). PyTorch's matrix
# products are MKL's, which OPENBLAS_CORETYPE does not touch. Needs build/
# and .venv-torch.
set -u
cd "$(dirname "$0")/../.."
model=${1:-tiny} batch=${2:-24} steps=${3:-10} seq=${4:-0}
rounds=${ROUNDS:-3} stages=${STAGES:-0 3} core=${BLAS_CORE:-auto} build=${BUILD:-build}
py=.venv-torch/bin/python
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
seqarg=()
[ "$seq" != 0 ] && seqarg=(--seq "$seq")
if [ "$steps" -lt 3 ]; then
  echo "STEPS must be at least 3 (steps 1-2 are left out)" >&2
  exit 2
fi
tw=${TORCH_WEFT_DIR:-$PWD/tools/torch_weft}
backends=(gloo)
if PYTHONPATH=$tw $py -c "import torch_weft" 2>/dev/null; then
  backends+=(weft)
else
  echo "# fsdp2 weft: torch_weft does not import from $tw: skipped"
fi

weft_train() { # stage: tokens/s over steps 3-STEPS; the kernels on stderr
  local envs=(env -u OPENBLAS_CORETYPE)
  [ "$core" != auto ] && envs=(env OPENBLAS_CORETYPE="$core")
  "${envs[@]}" "$build/tools/weftrun" -n 2 "$build/tools/weft-train" --model "$model" \
    --batch "$batch" --steps "$steps" --zero-stage "$1" --sample 0 --val-every 0 \
    "${seqarg[@]}" 2>&1 |
    awk '
      /# weft-train:/ {match($0, /sgemm: [A-Za-z0-9]+/); core = substr($0, RSTART + 7, RLENGTH - 7)
                       match($0, /sequence [0-9]+/); T = substr($0, RSTART + 9, RLENGTH - 9)}
      /tokens a step/ {match($0, /\([0-9]+ tokens/); tok = substr($0, RSTART + 1, RLENGTH - 8)}
      $2 == "step" && $3 >= 3 {ms += $(NF - 1); n++}
      END {if (n == 0) exit 1; printf "%.0f\n", tok * n * 1000 / ms; print core > "/dev/stderr"}'
}

fsdp2() { # backend: tokens/s over steps 3-STEPS
  local pp=""
  [ "$1" = weft ] && pp=$tw
  PYTHONPATH=$pp $py -m torch.distributed.run --standalone --nproc-per-node 2 \
    tools/train/gpt2_fsdp_bench.py --backend "$1" --model "$model" --batch "$batch" \
    --steps "$steps" "${seqarg[@]}" 2>&1 | awk '/^fsdp2/ {print $4; found = 1} END {exit !found}'
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1}
  END {printf "%.0f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
range() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {print lo "-" hi}'; }

names=()
for s in $stages; do names+=("weft-train stage $s"); done
for b in "${backends[@]}"; do names+=("FSDP2 over $b"); done
declare -A got
echo "# $model, global batch $batch, sequence ${seqarg[1]:-its context}, $steps steps a run" \
     "(tokens/s over steps 3-$steps), $rounds rounds, 2 ranks; $(lscpu | sed -n 's/^Model name: *//p')"
for r in $(seq "$rounds"); do
  echo "# round $r: $(uptime)"
  for name in "${names[@]}"; do
    case $name in
      weft-train*) v=$(weft_train "${name##* }" 2>/tmp/compare_fsdp_core.$$) &&
                   name_core=" (sgemm: $(cat /tmp/compare_fsdp_core.$$))" ;;
      *) v=$(fsdp2 "${name##* }"); name_core= ;;
    esac
    if [ -z "$v" ]; then
      echo "$name: no figure (the run failed)" >&2
      continue
    fi
    echo "  $name$name_core: $v tokens/s"
    got[$name]="${got[$name]:-} $v"
  done
done
rm -f /tmp/compare_fsdp_core.$$
echo "# $(uptime)"
echo "| trainer | median tokens/s | range | runs |"
echo "|---|---|---|---|"
for name in "${names[@]}"; do
  [ -z "${got[$name]:-}" ] && continue
  # shellcheck disable=SC2086
  echo "| $name | $(median ${got[$name]}) | $(range ${got[$name]}) | $(echo ${got[$name]} | wc -w) |"
done
