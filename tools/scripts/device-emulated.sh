#!/usr/bin/env bash
# The device path without a GPU (CI runs this after tools/scripts/test.sh;
# docs/cuda.md, "Without a GPU: cuda_emu"): build-emu/ is configured with
# -Ddevice_emulate=true, so the device kernels are compiled by the host's C++
# compiler and tests/device/cuda_emu runs them on threads, with device memory
# in shared memory that other processes open through IPC handles. The device
# suites then run as on a GPU: every collective, datatype and op through the
# ring and tree kernels, point-to-point, graphs, streams, mismatches, ranks in
# several processes. Then the ZeRO layer's device suites and weft-train's
# --device cuda against the host (tools/scripts/train-device-match.sh).
# What they time is not a GPU's: the figures come from tools/gpu-check.sh on
# a GPU machine.
# Usage: tools/scripts/device-emulated.sh
# Environment: WEFT_CUDA_EMU_THREADS (threads per block, default 4).
set -euo pipefail
cd "$(dirname "$0")/../.."
# the packages; the CUDA toolkit's headers and nvcc must be there already
# (/usr/local/cuda, or nvcc on PATH): no GPU
tools/scripts/setup.sh
B=build-emu
# the full matrix, as gpu-check builds it: every datatype x op has its kernels
# (compiled by the host's compiler in about half a minute)
if [ ! -f $B/build.ninja ]; then
  meson setup $B -Ddevice_emulate=true -Ddevice_matrix=full -Dnccl=false \
    -Dbuildtype=debugoptimized
else
  meson configure $B -Ddevice_matrix=full
fi
suites=(device/test_device device/test_device_sendrecv device/test_device_ipc
        test_zero_device test_zero_device_ctx test_zero_device_streams)
perf_tools=(all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall gather scatter
            alltoallv hypercube)
ninja -C $B "${suites[@]/#/tests/}" tools/weft-train tools/weftrun \
  tests/device/cuda_emu/libcublas_emu.so $(printf "tools/%s_perf " "${perf_tools[@]}") tools/all_reduce_device_perf
# Sampled: DeviceDeterministic.EverySettingGivesTheFixedOrder runs 5 of its
# 20 setting x rank-count pairs (WEFT_TEST_SAMPLE=1: every setting once, every
# rank count, seeded and printed), since each pair's 16 MiB reductions take
# seconds on threads. Left out: DevicePdl (compute capability 8.0 here, no
# programmatic launches; it skips and says so).
status=0
for path in "${suites[@]}"; do
  s=$(basename "$path")
  echo "== $s (device emulated)"
  start=$SECONDS
  if ! WEFT_TEST_SAMPLE=1 timeout 900 "$B/tests/$path" >"$B/$s.log" 2>&1; then
    status=1
    grep -E "Failure|FAILED|rank [0-9]+:" "$B/$s.log" | head -40 || true
    tail -5 "$B/$s.log"
  fi
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |of the settings x rank counts" "$B/$s.log" || true
  echo "   $((SECONDS - start)) s"
done
# the tree all-reduce's kernels on every case, whatever the tuner would choose
echo "== test_device, all-reduce with WEFT_ALGO=tree (device emulated)"
start=$SECONDS
if ! WEFT_ALGO=tree timeout 900 "$B/tests/device/test_device" \
    --gtest_filter='All/DeviceColl.*AllReduce*' >"$B/test_device_tree.log" 2>&1; then
  status=1
  grep -E "Failure|FAILED" "$B/test_device_tree.log" | head -40 || true
fi
grep -E "^\[  (PASSED|FAILED) " "$B/test_device_tree.log" || true
echo "   $((SECONDS - start)) s"
# The perf tools on device memory (as gpu-check's perf_* and tree_types
# steps, at small sizes): each tool on 3 processes, every datatype; the tree
# all-reduce on 3 to 8 processes under both protocols, every datatype and op;
# across emulated hosts; nothing wrong.
echo "== perf tools -M cuda (device emulated)"
start=$SECONDS
perf_check() { awk -f tools/scripts/perf-verdict.awk "$1"; } # log: fails on a wrong value or no rows
perf_run() { # tag, environment and tool arguments
  local tag=$1 log="$B/perf.$1.log" v
  shift
  if env "$@" >"$log" 2>&1 && v=$(perf_check "$log"); then
    echo "$tag: $v"
  else
    echo "$tag: FAILED: $(perf_check "$log"); $(grep -m2 -iE 'error|no kernel' "$log" | tr '\n' ' ')"
    status=1
  fi
}
perf_args=(-M cuda -T 30 -b 1 -e 64K -f 32 -n 1 -w 0)
for t in "${perf_tools[@]}"; do
  n=3
  [ "$t" = hypercube ] && n=4 # a power of 2, or it skips
  perf_run "$t-$n" timeout 120 $B/tools/weftrun -n $n $B/tools/${t}_perf "${perf_args[@]}" -d all
done
for k in 3 4 5 6 7 8; do
  for proto in ll simple; do
    perf_run "tree-$k-$proto" WEFT_ALGO=allreduce:tree WEFT_PROTO=$proto timeout 300 \
      $B/tools/weftrun -n $k $B/tools/all_reduce_perf "${perf_args[@]}" -d all -o all
  done
done
# between emulated hosts (WEFT_HOSTID per rank): device memory through the
# network proxy, each tool on 2 over sockets, the all-reduce on 3 over sockets
# and over UCX (where built with it)
hosts=(sh -c 'WEFT_HOSTID=emulated-host-$WEFT_RANK exec "$@"' sh)
for t in "${perf_tools[@]}"; do
  perf_run "$t-2-hosts-socket" WEFT_TRANSPORT=socket timeout 120 $B/tools/weftrun -n 2 \
    "${hosts[@]}" $B/tools/${t}_perf "${perf_args[@]}" -d all
done
transports=(socket)
grep -q 'WEFT_HAVE_UCX 1' $B/weft_build_config.h && transports+=(ucx)
for tr in "${transports[@]}"; do
  perf_run "all_reduce-3-hosts-$tr" WEFT_TRANSPORT=$tr timeout 120 $B/tools/weftrun -n 3 \
    "${hosts[@]}" $B/tools/all_reduce_perf "${perf_args[@]}" -d all -o all
done
if timeout 120 $B/tools/all_reduce_device_perf -g 3 -b 8 -e 64K >"$B/perf.device_g3.log" 2>&1 &&
   rows=$(grep -cE '^ +[0-9]+ +[0-9]+ ' "$B/perf.device_g3.log") && [ "$rows" -gt 0 ]; then
  echo "all_reduce_device_perf -g 3: $rows rows, none wrong (it exits 1 on a wrong value)"
else
  echo "all_reduce_device_perf -g 3: FAILED: $(tail -2 "$B/perf.device_g3.log" | tr '\n' ' ')"
  status=1
fi
echo "   $((SECONDS - start)) s"

# weft-train --device cuda against the host: every stage, dtype and a few
# rank counts, the transformer and the MLP (on a GPU: gpu-check's
# weft_train_device)
echo "== weft-train --device cuda against the host (device emulated)"
start=$SECONDS
# (the products through cublas_emu, and once through weft-train's own kernel;
# "+offload": the GPU's optimizer state and step on the host)
gpt=(--seq 32 --val-batches 1 --sample 8 --temperature 0)
matches=(
  "cuBLAS gpt-s3 4 --zero-stage 3 --steps 5 --batch 8 --val-every 5 ${gpt[*]}"
  "cuBLAS gpt-s2-bf16 2 --zero-stage 2 --dtype bf16 --steps 4 --batch 8 --val-every 2 ${gpt[*]}"
  "cuBLAS gpt-s1-accum 3 --zero-stage 1 --accum 2 --steps 3 --batch 6 --val-every 3 ${gpt[*]}"
  "kernel gpt-s0-fp16 1 --zero-stage 0 --dtype fp16 --steps 3 --batch 4 --val-every 0 ${gpt[*]}"
  "cuBLAS+offload gpt-s3-bf16-offload 2 --zero-stage 3 --dtype bf16 --steps 4 --batch 8 --val-every 2 ${gpt[*]}"
  "-+offload mlp-s1-fp16-offload 3 --model mlp --zero-stage 1 --dtype fp16 --reduce-dtype fp32 --quiet"
  "- mlp-s3 4 --model mlp --zero-stage 3 --quiet"
  "- mlp-s2-bf16 3 --model mlp --zero-stage 2 --dtype bf16 --quiet"
  "- mlp-s1-sgd 2 --model mlp --zero-stage 1 --optimizer sgd --quiet"
  "- mlp-s0-fp16 1 --model mlp --zero-stage 0 --dtype fp16 --quiet"
)
for m in "${matches[@]}"; do
  gemm=${m%% *} m=${m#* } cuda_opts=
  case $gemm in *+offload) gemm=${gemm%+offload} cuda_opts=--offload-optimizer ;; esac
  cublas=1
  case $gemm in kernel) cublas=0 gemm="weft's kernel" ;; -) gemm= ;; esac
  # shellcheck disable=SC2086 # the words of one case
  WEFT_CUDA_EMU_CUBLAS=$cublas TRAIN_MATCH_GEMM=$gemm TRAIN_MATCH_CUDA_OPTS=$cuda_opts \
    tools/scripts/train-device-match.sh $B $m || status=1
done
# a checkpoint of the GPU's ZeRO state (stage 3, 4 ranks) resumed on the
# host at stage 1 on 2 ranks: the last steps' losses as an uninterrupted run
ck="$B/train-match.ckpt"
rm -rf "$ck"
run6=(--steps 6 --batch 8 --val-every 0 --seq 32 --sample 0)
if timeout 300 $B/tools/weftrun -n 4 $B/tools/weft-train --device cuda --zero-stage 3      "${run6[@]}" --stop-at 3 --save "$ck" >"$ck.save.log" 2>&1 &&
   timeout 300 $B/tools/weftrun -n 2 $B/tools/weft-train --zero-stage 1 "${run6[@]}"      --resume "$ck" >"$ck.resume.log" 2>&1 &&
   timeout 300 $B/tools/weftrun -n 4 $B/tools/weft-train --zero-stage 3 "${run6[@]}"      >"$ck.whole.log" 2>&1; then
  steps46() { awk '{ sub(/^\[ *0\] /, "") } /^step +[4-6] loss /{ print $2, $4 }' "$1"; }
  paste <(steps46 "$ck.resume.log") <(steps46 "$ck.whole.log") |
    awk '{ n++; d = $2 - $4; if (d < 0) d = -d; if (d / $4 > max) max = d / $4
           if ($1 != $3 || !(d <= 1e-5 * $4)) bad++ }
         END { printf "ckpt GPU stage 3 on 4 ranks -> host stage 1 on 2: steps 4-6, %d of %d off by more than 1e-5, largest %.2g\n", bad, n, max
               exit !(n == 3 && bad == 0) }' || status=1
else
  echo "ckpt GPU -> host: a run failed: $(tail -3 "$ck".*.log | tr '\n' ' ')"
  status=1
fi
echo "   $((SECONDS - start)) s"
exit $status
