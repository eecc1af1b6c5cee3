#!/usr/bin/env bash
# tools/scripts/gpu-check.sh still parses and knows its steps: --list prints every
# step with a function behind it and builds nothing; bad arguments are
# refused with exit 2 and a message. With a build directory, the
# multi-process perf steps run on host memory (WEFT_GPU_CHECK_HOST_PERF=1)
# through the script's own launching, parsing, table and $OUT files.
# usage: test_gpu_check.sh SCRIPT [BUILD_DIR]
set -u
script=$1
build=${2:-}
fail=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }

if bash -n "$script" && bash -n "$(dirname "$script")/gpu-check-steps.sh"; then
  ok "syntax"
else
  bad "bash -n"
fi

WEFT_GPU_CHECK_WORK="$work/w" timeout 20 bash "$script" --list >"$work/list" 2>"$work/err"
rc=$?
cat "$work/list" "$work/err"
[ $rc = 0 ] && ok "--list exits 0" || bad "--list exit $rc"
[ -e "$work/w" ] && bad "--list created its work directory" || ok "--list builds nothing"

# the steps the issues ask for (20: build, suites, sanitizers, perf, torch;
# 21: emulated hosts; 22: device ZeRO)
for s in gtest configure build perf_flags device device_ipc zero_math_device zero_device \
         memcheck racecheck synccheck perf_ar_g2 perf_ar_g4 perf_ar_g8 mps_start perf_ar_mps \
         perf_sendrecv perf_alltoall net_socket torch_weft torch_ddp; do
  grep -qE "^$s +[0-9]+s " "$work/list" || bad "step $s missing from --list"
done
rows=$(grep -cE '^[a-z0-9_]+ +[0-9]+s +(-|gpu) ' "$work/list")
[ "$rows" -ge 20 ] && ok "$rows steps listed" || bad "only $rows steps listed"

# the limits add up to more than the budget only because steps skip; each
# single limit must fit in the default budget of 560 s
over=$(awk '$2 ~ /s$/ && $1 != "step" {sub(/s$/, "", $2); if ($2 + 0 > 560) print $1}' "$work/list")
[ -z "$over" ] && ok "each limit fits the budget" || bad "limits over 560 s: $over"

for args in "--nosuch" "--only" "--only nosuchstep" "--step nosuchstep"; do
  # shellcheck disable=SC2086
  WEFT_GPU_CHECK_WORK="$work/w" timeout 20 bash "$script" $args >"$work/out" 2>&1
  rc=$?
  if [ $rc = 2 ] && grep -q 'gpu-check: ' "$work/out"; then
    ok "$args refused: $(head -1 "$work/out")"
  else
    bad "$args: exit $rc, $(head -1 "$work/out")"
  fi
done
# --prepare fills the carried directory: GoogleTest's source and, where this
# machine has UCX, its libraries, modules, headers and pkg-config files
ucx_here=0
pkg-config --exists ucx 2>/dev/null && ucx_here=1
WEFT_GPU_CHECK_DEPS="$work/deps" timeout 60 bash "$script" --prepare >"$work/prep" 2>&1
rc=$?
cat "$work/prep"
[ $rc = 0 ] && [ -f "$work/deps/googletest/CMakeLists.txt" ] && ok "--prepare: GoogleTest" ||
  bad "--prepare exit $rc or no googletest"
if [ $ucx_here = 1 ]; then
  for f in lib/libucp.so.0 lib/libucs.so.0 lib/libuct.so.0 lib/libucm.so.0 lib/libnuma.so.1 \
           include/ucp/api/ucp.h lib/pkgconfig/ucx.pc; do
    [ -e "$work/deps/ucx/$f" ] || bad "--prepare: no ucx/$f"
  done
  grep -q '^prefix = @UCX_PREFIX@' "$work/deps/ucx/lib/pkgconfig/ucx.pc" &&
    ok "--prepare: UCX with its prefix to fill in" || bad "ucx.pc keeps this machine's prefix"
fi

# the plumbing on host memory: each step passes or skips as it should, the
# table comes last, and $OUT gets the summary and the logs; net_ucx runs on
# the carried UCX (its libraries first on LD_LIBRARY_PATH), as on a GPU
# machine without one
if [ -n "$build" ]; then
  steps=perf_sendrecv,perf_alltoall,perf_sendrecv_lanes,perf_types,net_socket,net_bw,device,perf_ar_g2
  npass=6
  if [ $ucx_here = 1 ] && grep -q 'WEFT_HAVE_UCX 1' "$build/weft_build_config.h" 2>/dev/null; then
    steps=$steps,net_ucx npass=7
  fi
  WEFT_GPU_CHECK_WORK="$work/w" WEFT_GPU_CHECK_BUILD_DIR="$build" WEFT_GPU_CHECK_NO_GPU=1 \
    WEFT_GPU_CHECK_HOST_PERF=1 WEFT_GPU_CHECK_DEPS="$work/deps" WEFT_GPU_CHECK_CARRIED_UCX=1 \
    OUT="$work/outdir" timeout 240 bash "$script" --only $steps >"$work/run" 2>&1
  rc=$?
  tail -12 "$work/run"
  [ $rc = 0 ] && ok "host-memory run exits 0" || bad "host-memory run exit $rc"
  checks="perf_sendrecv perf_alltoall perf_types net_socket"
  [ $npass = 7 ] && checks="$checks net_ucx"
  for s in $checks; do
    grep -qE "^\| $s +\| pass +\| +[0-9]+ \| .*[1-9][0-9]* rows, 0 wrong" "$work/run" ||
      bad "$s did not pass with rows and 0 wrong"
  done
  grep -qE "^\| net_bw +\| pass +\| +[0-9]+ \| busbw device/host, socket, 2 hosts: lowest [0-9]+%" \
    "$work/run" && ok "net_bw compares the two memories" || bad "net_bw gave no ratio"
  grep -qE "^\| perf_sendrecv_lanes +\| pass .*alltoall/4 8 lanes: [0-9.]+ [KM]i?B [0-9.]+ GB/s" \
    "$work/run" && ok "perf_sendrecv_lanes reports each lane count" || bad "perf_sendrecv_lanes gave no figures"
  if [ $npass = 7 ]; then
    grep -qE "^\| net_ucx .*UCX carried: $work/deps/ucx/lib/libucp\.so" "$work/run" &&
      ok "net_ucx ran on the carried UCX" || bad "net_ucx did not load the carried UCX"
  fi
  for s in device perf_ar_g2; do
    grep -qE "^\| $s +\| skip +\| +[0-9]+ \| no GPU" "$work/run" || bad "$s did not skip for no GPU"
  done
  [ "$(tail -1 "$work/run" | grep -c "$npass passed, 2 skipped, 0 failed")" = 1 ] &&
    ok "the table comes last" || bad "last line: $(tail -1 "$work/run")"
  for f in summary.txt perf.txt logs.tar.gz; do
    [ -s "$work/outdir/$f" ] || bad "no \$OUT/$f"
  done
  tar tzf "$work/outdir/logs.tar.gz" | grep -q 'perf_types.log' && ok "\$OUT has the logs" ||
    bad "logs.tar.gz lacks perf_types.log"
fi
# step torch_weft waits for the extension's build that the run started in
# the background (libweft being built already), where torch is at hand. The
# extension is built in the tree, against the build directory: only the
# checkout's own build, which the torch suites use too.
repo="$(cd "$(dirname "$script")/../.." && pwd)"
py="$repo/.venv-torch/bin/python"
if [ -n "$build" ] && [ "$(realpath "$build")" = "$(realpath "$repo/build" 2>/dev/null)" ] &&
  [ -x "$py" ] && "$py" -c 'import torch' 2>/dev/null; then
  WEFT_GPU_CHECK_WORK="$work/t" WEFT_GPU_CHECK_BUILD_DIR="$build" WEFT_GPU_CHECK_NO_GPU=1 \
    WEFT_GPU_CHECK_PYTHON="$py" timeout 300 bash "$script" --only perf_flags,torch_weft \
    >"$work/trun" 2>&1
  rc=$?
  tail -4 "$work/trun"
  if [ $rc = 0 ] && grep -qE '^\| torch_weft +\| pass ' "$work/trun" &&
    grep -q 'the build started in the background' "$work/t/logs/torch_weft.log"; then
    ok "torch_weft took the background build"
  else
    bad "torch_weft with the background build: exit $rc"
  fi
else
  echo "skip: torch_weft's background build (needs .venv-torch with torch, and the checkout's build)"
fi
exit $fail
