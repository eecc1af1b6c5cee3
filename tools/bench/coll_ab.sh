#!/bin/bash
# Paired A/B of one perf tool at one size: builds A_DIR and B_DIR (meson
# build folders with tools/weftrun and the tool) run in alternating order,
# once each per round, both SCHED_FIFO at priority 1 (root) so that other
# load on a shared machine matters less; prints each build's median and
# minimum out-of-place time (the JSON's) and the median of the rounds' own
# B/A ratios with their quartiles. The environment reaches the ranks
# (WEFT_ALGO=ring forces the ring).
#
#   A_DIR=... B_DIR=... tools/bench/coll_ab.sh TOOL NRANKS SIZE ITERS ROUNDS
#   e.g. WEFT_ALGO=ring tools/bench/coll_ab.sh broadcast_perf 3 8 20000 10
set -euo pipefail
tool=$1 n=$2 size=$3 iters=$4 rounds=$5
a=${A_DIR:?A_DIR: build folder A} b=${B_DIR:-build}
dir=$(mktemp -d) out=$(mktemp)
json=$dir/run.json # -J writes a name ending .json, and never over a file
trap 'rm -rf "$dir" "$out"' EXIT
one() {
  rm -f "$json"
  chrt -f 1 "$1/tools/weftrun" -n "$n" "$1/tools/$tool" -b "$size" -e "$size" -n "$iters" \
    -w $((iters / 25 + 1)) -J "$json" >/dev/null 2>&1
  # either build's JSON: nccl-tests' ("results", "time") or the tools' earlier ("rows", "time_us")
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(d["results"][0]["out_of_place"]["time"] if "results" in d
      else d["rows"][0]["out_of_place"]["time_us"])' "$json"
}
for ((i = 1; i <= rounds; i++)); do
  if ((i % 2)); then ra=$(one "$a"); rb=$(one "$b"); else rb=$(one "$b"); ra=$(one "$a"); fi
  echo "$ra $rb" >>"$out"
done
python3 - "$out" "$tool, $n ranks, $size B, ${WEFT_ALGO:-tuner}" <<'PY'
import statistics as st, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
a = [r[0] for r in rows]; b = [r[1] for r in rows]
q = sorted(y / x for x, y in rows)
q1, _, q3 = st.quantiles(q, n=4) if len(q) >= 4 else (q[0], 0, q[-1])
print("%s: A median %.3f us (min %.3f), B median %.3f us (min %.3f), B/A paired median %.3f "
      "(quartiles %.3f-%.3f, %d rounds)" % (sys.argv[2], st.median(a), min(a), st.median(b),
                                            min(b), st.median(q), q1, q3, len(q)))
PY
