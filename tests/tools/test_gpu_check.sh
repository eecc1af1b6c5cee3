#!/usr/bin/env bash
# tools/gpu-check.sh still parses and knows its steps: --list prints every
# step with a function behind it and builds nothing; bad arguments are
# refused with exit 2 and a message. Nothing here needs a GPU or a build.
# usage: test_gpu_check.sh SCRIPT
set -u
script=$1
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
exit $fail
