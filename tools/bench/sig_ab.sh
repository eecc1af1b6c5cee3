#!/bin/bash
# What the always-on slot signature costs: paired, alternating rounds of
# all_reduce_perf on 2 ranks from two builds of the same source, A without
# the slot signatures (-DWEFT_SLOT_SIGNATURE=0) and B as shipped. Each round
# runs both once, in an order that alternates between rounds, and the figure
# to read is the median over rounds of B/A (with its quartiles and range).
#
#   tools/bench/sig_ab.sh [ROUNDS] [SIZE] [ITERS] [NICE]
#
# A_DIR and B_DIR name the build folders (default build-nosig and build);
# a missing A_DIR is set up here. ROUNDS defaults to 30, SIZE to 8, ITERS to
# 50000 (warm-up ITERS / 25), NICE (0 = none) to -15: the ranks' priority;
# NICE "rt" runs them SCHED_FIFO at priority 1 instead (root), above every
# ordinary process, so that other load on a shared machine stops mattering.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-30}
size=${2:-8}
iters=${3:-50000}
nice_level=${4:--15}
a=${A_DIR:-build-nosig}
b=${B_DIR:-build}
targets=(tools/all_reduce_perf tools/weftrun)
if [ ! -d "$a" ]; then
  meson setup "$a" -Dc_args=-DWEFT_SLOT_SIGNATURE=0 -Dtests=false -Dnccl=false \
    -Dcuda=disabled >/dev/null
fi
ninja -C "$a" -j2 "${targets[@]}" >/dev/null
ninja -C "$b" -j2 "${targets[@]}" >/dev/null

out=$(mktemp)
dir=$(mktemp -d)
json=$dir/run.json # -J writes a name ending .json, and never over a file
trap 'rm -rf "$out" "$dir"' EXIT

# one run of build $1: prints "out-of-place-us in-place-us" (the JSON's
# three decimals; the table rounds to two)
run_one() {
  local cmd=("$1/tools/weftrun" -n 2 "$1/tools/all_reduce_perf" -b "$size" -e "$size"
             -n "$iters" -w $((iters / 25)) -J "$json")
  if [ "$nice_level" = rt ]; then cmd=(chrt -f 1 "${cmd[@]}")
  elif [ "$nice_level" != 0 ]; then cmd=(nice -n "$nice_level" "${cmd[@]}"); fi
  rm -f "$json"
  "${cmd[@]}" >/dev/null
  # either build's JSON: nccl-tests' ("results", "time") or the tools' earlier ("rows", "time_us")
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
r, k = (d["results"][0], "time") if "results" in d else (d["rows"][0], "time_us")
print(r["out_of_place"][k], r["in_place"][k])' "$json"
}

for ((i = 1; i <= rounds; i++)); do
  if ((i % 2)); then
    ra=$(run_one "$a"); rb=$(run_one "$b")
  else
    rb=$(run_one "$b"); ra=$(run_one "$a")
  fi
  echo "$ra $rb" >>"$out"
  echo "round $i: A $ra  B $rb" >&2
done

python3 - "$out" "$size" "$rounds" <<'EOF'
import statistics as st, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
def q(v):
    v = sorted(v)
    qs = st.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return "median %.3f (quartiles %.3f-%.3f, range %.3f-%.3f)" % (qs[1], qs[0], qs[2], v[0], v[-1])
print("size %s B, %s rounds, load %s" % (sys.argv[2], sys.argv[3],
      open("/proc/loadavg").read().split()[0]))
for name, ia, ib in (("out of place", 0, 2), ("in place", 1, 3)):
    a = [r[ia] for r in rows]; b = [r[ib] for r in rows]
    print("%-12s A %.3f us  B %.3f us  B/A %s" % (name, st.median(a), st.median(b),
          q([y / x for x, y in zip(a, b)])))
EOF
