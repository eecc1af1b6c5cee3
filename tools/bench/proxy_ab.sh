#!/usr/bin/env bash
# A/B of all_reduce busbw over the network transports between two builds of
# weft (a baseline and a candidate), in paired, alternating rounds so that
# load from other work on the machine falls on both. Prints each round's
# figures, then per transport and size the median busbw (GB/s, out-of-place,
# from the time column)
# of each build, the spread (min-max) and the median of the paired ratios.
#
#   [ITERS=50] [TRANSPORTS="socket ucx"] [SIZES="64K 16M"] [CONCURRENT=1] \
#     tools/bench/proxy_ab.sh BASE_BUILD NEW_BUILD [ROUNDS] [NRANKS]
#
# CONCURRENT=1 runs the two builds' jobs at the same time in each round
# instead of one after the other (on a machine loaded by other work).
#
# Each build folder needs tools/all_reduce_perf and tools/weftrun (e.g.
# meson setup B -Dcuda=disabled -Dtests=false -Dnccl=false &&
# ninja -C B tools/all_reduce_perf tools/weftrun).
set -u
base=$1
new=$2
rounds=${3:-7}
nranks=${4:-2}
iters=${ITERS:-50}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# one run: build transport size -> the out-of-place time (us)
run_one() {
  local build=$1 transport=$2 size=$3 env=()
  case $transport in
  socket) env=(WEFT_TRANSPORT=socket) ;;
  ucx) env=(WEFT_TRANSPORT=ucx UCX_TLS=tcp) ;;
  esac
  env "${env[@]}" timeout 120 "$build/tools/weftrun" -n "$nranks" "$build/tools/all_reduce_perf" \
    -b "$size" -e "$size" -n "$iters" -w 5 -c 0 2>&1 | awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ {print $2, $7}'
}

for r in $(seq 1 "$rounds"); do
  for transport in ${TRANSPORTS:-socket ucx}; do
    for size in ${SIZES:-64K 16M}; do
      if [ "${CONCURRENT:-0}" = 1 ]; then
        # both builds at once: whatever else loads the machine falls on both alike
        run_one "$base" "$transport" "$size" >"$tmp/base.out" &
        run_one "$new" "$transport" "$size" >"$tmp/new.out"
        wait
        for which in base new; do
          bw=$(awk -v n="$nranks" '{printf "%.4f", 2 * (n - 1) / n * $1 / ($2 * 1e3)}' "$tmp/$which.out")
          echo "round $r $transport $size $which ${bw:-NA}"
          echo "$transport $size $which $r ${bw:-NA}" >>"$tmp/all"
        done
        continue
      fi
      # alternate which build goes first
      if [ $((r % 2)) -eq 1 ]; then order="base new"; else order="new base"; fi
      for which in $order; do
        b=$base
        [ "$which" = new ] && b=$new
        # busbw of all_reduce: 2 (n-1)/n bytes per rank over the time
        bw=$(run_one "$b" "$transport" "$size" |
          awk -v n="$nranks" '{printf "%.4f", 2 * (n - 1) / n * $1 / ($2 * 1e3)}')
        echo "round $r $transport $size $which ${bw:-NA}"
        echo "$transport $size $which $r ${bw:-NA}" >>"$tmp/all"
      done
    done
  done
done

python3 - "$tmp/all" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
data = {}
for transport, size, which, r, bw in rows:
    if bw == "NA":
        continue
    data.setdefault((transport, size), {}).setdefault(which, {})[r] = float(bw)
print("%-7s %-5s %22s %22s %8s" % ("net", "size", "base median [min-max]", "new median [min-max]",
                                   "new/base"))
for (transport, size), d in data.items():
    b, n = d.get("base", {}), d.get("new", {})
    if not b or not n:
        continue
    ratios = [n[r] / b[r] for r in b if r in n and b[r] > 0]
    fmt = lambda v: "%6.3f [%6.3f-%6.3f]" % (statistics.median(v), min(v), max(v))
    print("%-7s %-5s %22s %22s %8.3f" % (transport, size, fmt(list(b.values())),
                                          fmt(list(n.values())), statistics.median(ratios)))
EOF
