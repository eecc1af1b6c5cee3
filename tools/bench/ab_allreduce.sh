#!/usr/bin/env bash
# A/B of all_reduce_perf on 2 ranks at 8 B, 64 KiB and 16 MiB: two builds
# (each a meson build folder with tools/weftrun and tools/all_reduce_perf),
# run in alternating rounds so that both see the same machine load; prints
# each build's median out-of-place time per size and the spread (min..max).
# usage: ab_allreduce.sh BUILD_A BUILD_B [ROUNDS]
set -eu
a=$1
b=$2
rounds=${3:-7}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sizes="8 65536 16777216"
for r in $(seq 1 "$rounds"); do
  for build in "$a" "$b"; do
    tag=$(echo "$build" | md5sum | cut -c1-8)
    for s in $sizes; do
      iters=200
      [ "$s" -ge 16777216 ] && iters=20
      timeout 120 "$build/tools/weftrun" -n 2 "$build/tools/all_reduce_perf" -b "$s" -e "$s" \
        -n "$iters" -w 5 -c 0 2>&1 | awk -v s="$s" '$1 == "[0]" && $2 == s { print $7 }' \
        >> "$out/$tag.$s"
    done
  done
done
for build in "$a" "$b"; do
  tag=$(echo "$build" | md5sum | cut -c1-8)
  for s in $sizes; do
    sort -g "$out/$tag.$s" | awk -v b="$build" -v s="$s" '
      { v[NR] = $1 }
      END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
            printf "%-28s %9d B  median %10.2f us  (%.2f .. %.2f, %d rounds)\n", b, s, m, v[1], v[NR], NR }'
  done
done
