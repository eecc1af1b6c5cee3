#!/usr/bin/env bash
# The network proxies' kick (WEFT_PROXY_KICK_US) on and off: an 8-byte
# all-reduce after an idle spell (idle_latency.c), 2 ranks over each
# transport, in alternating rounds so that load falls on both.
#
#   [GAPS="1000 5000"] [TRANSPORTS="socket ucx"] tools/bench/idle_ab.sh [BUILD] [ROUNDS]
#
# BUILD (default build) holds libweft.so and tools/weftrun.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
rounds=${2:-3}
exe=$(mktemp -d)/idle_latency
trap 'rm -rf "$(dirname "$exe")"' EXIT
cc -O2 -I "$root/include" "$root/tools/bench/idle_latency.c" -o "$exe" -L "$build" -lweft \
  -Wl,-rpath,"$build"
for round in $(seq "$rounds"); do
  for gap in ${GAPS:-1000 5000}; do
    for t in ${TRANSPORTS:-socket ucx}; do
      for kick in 0 100; do
        r=$(WEFT_PROXY_KICK_US=$kick WEFT_TRANSPORT=$t timeout 120 "$build/tools/weftrun" -n 2 \
          "$exe" "$gap" 2>&1 | grep -o 'median.*' || echo failed)
        echo "round $round, $t, ${gap} us idle, WEFT_PROXY_KICK_US=$kick: $r"
      done
    done
  done
done
