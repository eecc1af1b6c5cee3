#!/usr/bin/env bash
# tools/gpu-check.sh still parses and knows its steps: --list prints every
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
# the plumbing on host memory: each step passes or skips as it should, the
# table comes last, and $OUT gets the summary and the logs
if [ -n "$build" ]; then
  steps=perf_sendrecv,perf_alltoall,perf_types,net_socket,device,perf_ar_g2
  WEFT_GPU_CHECK_WORK="$work/w" WEFT_GPU_CHECK_BUILD_DIR="$build" WEFT_GPU_CHECK_NO_GPU=1 \
    WEFT_GPU_CHECK_HOST_PERF=1 OUT="$work/outdir" timeout 240 bash "$script" --only $steps \
    >"$work/run" 2>&1
  rc=$?
  tail -12 "$work/run"
  [ $rc = 0 ] && ok "host-memory run exits 0" || bad "host-memory run exit $rc"
  for s in perf_sendrecv perf_alltoall perf_types net_socket; do
    grep -qE "^\| $s +\| pass +\| +[0-9]+ \| .*[1-9][0-9]* rows, 0 wrong" "$work/run" ||
      bad "$s did not pass with rows and 0 wrong"
  done
  for s in device perf_ar_g2; do
    grep -qE "^\| $s +\| skip +\| +0 \| no GPU" "$work/run" || bad "$s did not skip for no GPU"
  done
  [ "$(tail -1 "$work/run" | grep -c '4 passed, 2 skipped, 0 failed')" = 1 ] &&
    ok "the table comes last" || bad "last line: $(tail -1 "$work/run")"
  for f in summary.txt perf.txt logs.tar.gz; do
    [ -s "$work/outdir/$f" ] || bad "no \$OUT/$f"
  done
  tar tzf "$work/outdir/logs.tar.gz" | grep -q 'perf_types.log' && ok "\$OUT has the logs" ||
    bad "logs.tar.gz lacks perf_types.log"
fi
exit $fail
