#!/usr/bin/env bash
# Runs one check of the PyTorch backend (tools/torch_weft) with the checkout's
# .venv-torch (made by WEFT_SETUP_TORCH=1 tools/scripts/setup.sh):
#   run.sh ops N | train N | alloc N | api N | parity N | surfaces N | streams N
#                             under torchrun with N ranks
#   run.sh detail N           check_detail.py with TORCH_DISTRIBUTED_DEBUG=DETAIL: torch's
#                             collective checker over weft's backend
#   run.sh flight N           check_flight.py under torchrun: the flight recorder's
#                             dumps on request, read back and by PyTorch's analyzer
#   run.sh dead_peer N        N ranks of its own, one killed mid-training
#   run.sh watchdog N         the same; the survivors' watchdogs must end them, and
#                             PyTorch's flight-recorder analyzer name the dead rank
#   run.sh watchdog_abort N   the same with TORCH_WEFT_ASYNC_ERROR_HANDLING=1
#   run.sh hang N             one rank asleep mid-training: every watchdog ends its
#                             rank, and the analyzer names the one that did not join
#   run.sh cuda_ops_cpu N     tests/nccl/torch_cuda_ops.py on the host over Gloo
#                             (the GPU check's script, kept from rotting)
#   run.sh cuda_ops_weft N    the same script on the weft backend, host tensors,
#                             with FSDP2's divide factor as PREMUL_SUM
# Without .venv-torch it skips (exit 77) and says why.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$root/.venv-torch"
if [ ! -x "$venv/bin/python" ]; then
  echo "SKIP: no $venv (WEFT_SETUP_TORCH=1 tools/scripts/setup.sh creates it with torch 2.15.0)"
  exit 77
fi
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
check="$1" nranks="$2"
case "$check" in
  ops | train | alloc | api | parity | surfaces | streams)
    exec "$venv/bin/python" -m torch.distributed.run --standalone --nproc-per-node "$nranks" \
      "$root/tests/torch/check_$check.py" ;;
  cuda_ops_cpu)
    exec "$venv/bin/python" -m torch.distributed.run --standalone --nproc-per-node "$nranks" \
      "$root/tests/nccl/torch_cuda_ops.py" --device cpu --backend gloo --factor-scale 1 ;;
  cuda_ops_weft)
    exec "$venv/bin/python" -m torch.distributed.run --standalone --nproc-per-node "$nranks" \
      "$root/tests/nccl/torch_cuda_ops.py" --device cpu --backend weft ;;
  flight)
    dir="$(mktemp -d "${TMPDIR:-/tmp}/weft_fr_check.XXXXXX")"
    trap 'rm -rf "$dir"' EXIT
    TORCH_FR_BUFFER_SIZE=16 TORCH_FR_DUMP_TEMP_FILE="$dir/weft_trace_rank_" \
      "$venv/bin/python" -m torch.distributed.run --standalone --nproc-per-node "$nranks" \
      "$root/tests/torch/check_flight.py" ;;
  detail) # torch's collective checker wrapped around weft's backend
    TORCH_DISTRIBUTED_DEBUG=DETAIL exec "$venv/bin/python" -m torch.distributed.run --standalone \
      --nproc-per-node "$nranks" "$root/tests/torch/check_detail.py" ;;
  reinit) # errors raised, not ending the process; the recorder on, its dumps removed
    dir="$(mktemp -d "${TMPDIR:-/tmp}/weft_reinit_check.XXXXXX")"
    trap 'rm -rf "$dir"' EXIT
    TORCH_WEFT_ASYNC_ERROR_HANDLING=2 TORCH_FR_BUFFER_SIZE=64 \
      TORCH_FR_DUMP_TEMP_FILE="$dir/weft_trace_rank_" \
      "$venv/bin/python" -m torch.distributed.run --standalone --nproc-per-node "$nranks" \
      "$root/tests/torch/check_reinit.py" ;;
  dead_peer)
    exec "$venv/bin/python" "$root/tests/torch/check_dead_peer.py" "$nranks" ;;
  watchdog)
    exec "$venv/bin/python" "$root/tests/torch/check_dead_peer.py" "$nranks" --watchdog ;;
  watchdog_abort) # the same in TORCH_WEFT_ASYNC_ERROR_HANDLING=1
    exec "$venv/bin/python" "$root/tests/torch/check_dead_peer.py" "$nranks" --watchdog \
      --handling 1 ;;
  hang)
    exec "$venv/bin/python" "$root/tests/torch/check_dead_peer.py" "$nranks" --hang ;;
  *)
    echo "run.sh: unknown check $check" >&2
    exit 2 ;;
esac
