#!/usr/bin/env bash
# all_reduce_perf under weftrun: the table, #wrong checks, and failure exits.
# usage: test_perf.sh WEFTRUN TOOLS_DIR
set -u
weftrun=$1
tools=$2
perf=$tools/all_reduce_perf
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }

# Every data row must show 0 in both #wrong columns; rows must cover the sweep.
check_table() { # name file expected_rows
  local rows wrongrows
  rows=$(grep -cE '^\[0\] +[0-9]+ ' "$2")
  wrongrows=$(grep -E '^\[0\] +[0-9]+ ' "$2" | awk '$10 != 0 || ($14 != 0 && $14 != "N/A")' | wc -l)
  if [ "$rows" -ne "$3" ]; then bad "$1" "$rows rows, want $3"; return; fi
  if [ "$wrongrows" -ne 0 ]; then bad "$1" "$wrongrows rows with wrong values"; return; fi
  if ! grep -q "Out of bounds values : 0 OK" "$2"; then bad "$1" "footer missing"; return; fi
  ok "$1"
}

# the README's main job: 4 ranks, 8 B to 64 MiB by 4
if timeout 300 "$weftrun" -n 4 "$perf" -b 8 -e 64M -f 4 -c 1 -n 3 -w 1 >"$tmp/main" 2>&1; then
  check_table main_job "$tmp/main" 12
else
  bad main_job "exit $?: $(tail -5 "$tmp/main")"
fi

# every datatype and op on 3 ranks, odd sizes
if timeout 300 "$weftrun" -n 3 "$perf" -b 1 -e 100K -f 7 -d all -o all -n 1 -w 0 >"$tmp/all" 2>&1; then
  check_table all_types_ops "$tmp/all" $((12 * 5 * 6))
else
  bad all_types_ops "exit $?: $(tail -5 "$tmp/all")"
fi

# 2 ranks and a linear step
if timeout 120 "$weftrun" -n 2 "$perf" -b 1000 -e 5000 -i 1000 -n 2 -w 1 >"$tmp/lin" 2>&1; then
  check_table linear_step "$tmp/lin" 5
else
  bad linear_step "exit $?"
fi

# a rank that exits early: weftrun reports it and exits non-zero, nobody hangs
start=$(date +%s)
timeout 60 "$weftrun" -n 2 sh -c 'if [ "$WEFT_RANK" = 1 ]; then exit 7; fi; exec "$0" -T 5 -b 1M -e 1M -n 1000' "$perf" >"$tmp/early" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" = 7 ] && [ "$took" -lt 30 ]; then ok early_exit; else bad early_exit "exit $rc after ${took}s"; fi

# a rank killed mid-sweep: the others get an error, weftrun exits non-zero
start=$(date +%s)
timeout 60 "$weftrun" -n 3 sh -c '"$0" -T 20 -b 16M -e 16M -n 100000 & pid=$!; if [ "$WEFT_RANK" = 2 ]; then sleep 1; kill -9 $pid; fi; wait $pid' "$perf" >"$tmp/kill" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$took" -lt 20 ]; then ok killed_rank; else bad killed_rank "exit $rc after ${took}s: $(tail -3 "$tmp/kill")"; fi

# every tool, every datatype, 2 to 4 ranks, a moving root
for tool in all_gather reduce_scatter broadcast reduce sendrecv alltoall gather scatter; do
  for n in 2 3 4; do
    out="$tmp/${tool}_$n"
    if timeout 300 "$weftrun" -n $n "$tools/${tool}_perf" -b 4 -e 300K -f 9 -d all -o all -r $((n - 1)) -n 1 -w 0 >"$out" 2>&1; then
      rows=$(grep -cE '^\[0\] +[0-9]+ ' "$out")
      if [ "$rows" -lt 12 ]; then bad "${tool}_$n" "only $rows rows"; continue; fi
      check_table "${tool}_$n" "$out" "$rows"
    else
      bad "${tool}_$n" "exit $?: $(tail -3 "$out")"
    fi
  done
done

# bad flags
if "$perf" -d nosuchtype >/dev/null 2>&1; then bad bad_flag "accepted -d nosuchtype"; else ok bad_flag; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
