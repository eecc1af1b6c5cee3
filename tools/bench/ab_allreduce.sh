#!/usr/bin/env bash
# A/B of all_reduce_perf on 2 ranks (AB_NRANKS: others) at 8 B, 64 KiB and 16 MiB: two builds
# (each a meson build folder with tools/weftrun and tools/all_reduce_perf),
# run in alternating rounds (the order of the two swaps every round) so that
# both see the same machine load; prints each build's median out-of-place
# time per size and the spread (min..max), then per size the median of the
# rounds' own B/A ratios with their quartiles and range. The environment
# reaches the ranks (WEFT_ALGO=ring measures the ring and its primitives at
# sizes where the tuner would take cma). AB_TOOL names another perf tool of
# the same table (broadcast_perf, all_gather_perf, reduce_perf, ...).
# usage: ab_allreduce.sh BUILD_A BUILD_B [ROUNDS]
set -eu
a=$1
b=$2
rounds=${3:-7}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sizes=${AB_SIZES:-"8 65536 16777216"} # AB_SIZES: others
nranks=${AB_NRANKS:-2}
tool=${AB_TOOL:-all_reduce_perf}
for r in $(seq 1 "$rounds"); do
  order="$a $b"
  [ $((r % 2)) -eq 0 ] && order="$b $a"
  for build in $order; do
    tag=$(echo "$build" | md5sum | cut -c1-8)
    for s in $sizes; do
      iters=200
      [ "$s" -ge 16777216 ] && iters=20
      t=$(timeout 120 "$build/tools/weftrun" -n "$nranks" "$build/tools/$tool" -b "$s" -e "$s" \
        -n "$iters" -w 5 -c 0 2>&1 | awk -v s="$s" '$1 == "[0]" && $2 == s { print $7 }')
      echo "${t:-NA}" >> "$out/$tag.$s" # a failed run keeps its round's line
    done
  done
done
for build in "$a" "$b"; do
  tag=$(echo "$build" | md5sum | cut -c1-8)
  for s in $sizes; do
    grep -v NA "$out/$tag.$s" | sort -g | awk -v b="$build" -v s="$s" '
      { v[NR] = $1 }
      END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
            printf "%-28s %9d B  median %10.2f us  (%.2f .. %.2f, %d rounds)\n", b, s, m, v[1], v[NR], NR }'
  done
done
ta=$(echo "$a" | md5sum | cut -c1-8)
tb=$(echo "$b" | md5sum | cut -c1-8)
for s in $sizes; do
  paste "$out/$ta.$s" "$out/$tb.$s" | python3 -c '
import statistics, sys
r = sorted(float(b) / float(a) for a, b in (l.split() for l in sys.stdin)
           if a != "NA" and b != "NA" and float(a) > 0)
if len(r) < 2: sys.exit(print("%9s B  B/A: too few paired rounds (%d)" % (sys.argv[1], len(r))))
q1, med, q3 = statistics.quantiles(r, n=4) if len(r) >= 4 else (r[0], statistics.median(r), r[-1])
print("%9s B  B/A paired: median %.3f  quartiles %.3f .. %.3f  range %.3f .. %.3f  (%d rounds)"
      % (sys.argv[1], med, q1, q3, r[0], r[-1], len(r)))' "$s"
done
