#!/usr/bin/env bash
# The perf tools' bound columns: present in the table and in -J, each
# percentage the one the printed times give, each bound the documented
# formula of the figures the header prints, and -B 0 leaving them out.
# Asserts nothing about speed.
# usage: test_perf_bound.sh WEFTRUN TOOLS_DIR
set -u
weftrun=$1
tools=$2
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }

# check NAME TOOL NRANKS TRAFFIC_OOP TRAFFIC_IP: runs TOOL and checks its table
# and JSON; TRAFFIC_* are the bytes read and written per byte of the size
# column (docs/perf.md), in-place "-" for tools without in-place columns
check() {
  local name=$1 tool=$2 n=$3
  if ! timeout 120 "$weftrun" -n "$n" "$tools/${tool}_perf" -b 8 -e 16M -f 64 -n 3 -w 1 -B 1 \
      -J "$tmp/$name.json" >"$tmp/$name" 2>&1; then
    bad "$name" "exit $?: $(tail -3 "$tmp/$name")"
    return
  fi
  local why
  if why=$(python3 - "$tmp/$name" "$tmp/$name.json" "$4" "$5" 2>&1 <<'EOF'
import json, re, sys

text, doc = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
traffic = [float(sys.argv[3]), None if sys.argv[4] == "-" else float(sys.argv[4])]
lines = [re.sub(r"^\[0\] ?", "", l) for l in text.splitlines()]
heads = [l for l in lines if l.startswith("#") and "#wrong" in l]
if not heads or heads[0].split()[-4:] != ["time", "%", "time", "%"]:
    sys.exit("no bound columns in the header: %r" % heads)
rt = re.search(r"cache-line round trip ([0-9.]+) us", text)
cp = re.search(r"copy ([0-9.]+) GB/s read \+ written", text)
# on a busy machine the ping-pong may not finish: the header must say so,
# and the bound is the copy's alone
no_rt = re.search(r"#   no round trip: .*busy machine", text)
if not (rt or no_rt) or not cp:
    sys.exit("the header lacks the round trip (or why not) or the copy rate")
rt, rw = float(rt.group(1)) if rt else 0.0, float(cp.group(1))
rows = [l.split() for l in lines if re.match(r"\s+\d+\s+\d+\s", l)]
if len(rows) < 4:
    sys.exit("%d rows" % len(rows))
by = set()
for f in rows:
    if len(f) != 17:
        sys.exit("row of %d columns: %s" % (len(f), " ".join(f)))
    size = int(f[0])
    for side, (t, b, pct) in enumerate(((f[5], f[13], f[14]), (f[9], f[15], f[16]))):
        if traffic[side] is None:
            if (b, pct) != ("N/A", "N/A"):
                sys.exit("in-place bound of a tool without in place: %s" % " ".join(f))
            continue
        t, b, pct = float(t), float(b), float(pct)
        # the printed bound is the larger of the round trip and the traffic
        # at the copy rate, both as the header prints them (rounded)
        lo = max(rt - 5e-4, traffic[side] * size / ((rw + 5e-3) * 1e3))
        hi = max(rt + 5e-4, traffic[side] * size / ((rw - 5e-3) * 1e3))
        if not lo - 5e-4 <= b <= hi + 5e-4:
            sys.exit("size %d: bound %.3f us, want %.4f-%.4f" % (size, b, lo, hi))
        by.add("copy" if traffic[side] * size / (rw * 1e3) > rt else "round_trip")
        # the percentage is bound / time of the printed figures
        if t > 0.005:
            plo = 100 * (b - 5e-4) / (t + 5e-3)
            phi = 100 * (b + 5e-4) / (t - 5e-3)
            if not plo - 0.05 <= pct <= phi + 0.05:
                sys.exit("size %d: %.1f %% from %.3f / %.2f us, want %.2f-%.2f"
                         % (size, pct, b, t, plo, phi))
if by != ({"copy", "round_trip"} if rt > 0 else {"copy"}):
    sys.exit("the sweep should reach both kinds of bound, got %s" % sorted(by))
# the JSON: the same figures, and each percentage from its own time and bound
bound = doc["weft"].get("bound") or {}
if (abs((bound.get("round_trip_us") or 0.0) - rt) > 5e-4 + 1e-9
        or abs(bound.get("copy_rw_GBps", -1) - rw) > 6e-3):
    sys.exit("JSON bound %r, header %.3f us %.2f GB/s" % (bound, rt, rw))
for row in doc["results"]:
    for side, key in enumerate(("out_of_place", "in_place")):
        r = row[key]
        if traffic[side] is None:
            if r is not None:
                sys.exit("in-place JSON of a tool without in place")
            continue
        if r["bound_by"] not in ("copy", "round_trip") or r["bound_us"] <= 0:
            sys.exit("JSON row %r" % r)
        if abs(r["bound_pct"] - 100 * r["bound_us"] / r["time"]) > 0.01 * r["bound_pct"] + 0.01:
            sys.exit("JSON %% %r" % r)
print("%d rows, round trip %s, copy %.2f GB/s"
      % (len(rows), "%.3f us" % rt if rt else "not measured", rw))
EOF
  ); then
    ok "$name ($why)"
  else
    bad "$name" "$why"
  fi
}

# bytes read + written per byte of the size column (docs/perf.md, "The bound")
check all_reduce_2 all_reduce 2 4 4
check all_gather_2 all_gather 2 3 2
check reduce_scatter_3 reduce_scatter 3 4 4
check broadcast_2 broadcast 2 3 2
check sendrecv_2 sendrecv 2 4 4

# -B 0 and the default: no measurement, nccl-tests' 13 columns exactly (a
# script that counts them from the end reads what it reads in nccl-tests'),
# null in the JSON
for flag in "-B 0" ""; do
  rm -f "$tmp/off.json" # -J never writes over a file
  # shellcheck disable=SC2086 # empty or two words
  if timeout 60 "$weftrun" --no-prefix -n 2 "$tools/all_reduce_perf" -b 8 -e 8K -f 32 $flag \
      -J "$tmp/off.json" >"$tmp/off" 2>&1; then
    rows=$(grep -cE '^ +[0-9]+ ' "$tmp/off")
    thirteen=$(grep -E '^ +[0-9]+ ' "$tmp/off" | awk 'NF == 13' | wc -l)
    head=$(grep -E '^# +size ' "$tmp/off" | awk '{print NF - 1}')
    if [ "$rows" -ge 2 ] && [ "$thirteen" = "$rows" ] && [ "$head" = 13 ] &&
        ! grep -q "Bound" "$tmp/off" && grep -q '"bound":null' "$tmp/off.json" &&
        grep -q '"bound_us":null' "$tmp/off.json"; then
      ok "bound_off${flag:+ ($flag)}"
    else
      bad "bound_off${flag:+ ($flag)}" "$rows rows, $thirteen of 13 fields, header $head: $(grep -E '^# +size|^ +[0-9]' "$tmp/off" | head -3)"
    fi
  else
    bad "bound_off${flag:+ ($flag)}" "exit $?"
  fi
done

# a bad value for -B
"$tools/all_reduce_perf" -B 2 >/dev/null 2>&1
rc=$?
if [ "$rc" = 2 ]; then ok bad_bound_flag; else bad bad_bound_flag "exit $rc, want 2"; fi

echo "pass $pass fail $fail"
[ "$fail" = 0 ]
