#!/usr/bin/env bash
# The perf tools under weftrun: the table, #wrong checks, and failure exits.
# usage: test_perf.sh WEFTRUN TOOLS_DIR [PERF_FAULT]
# PERF_FAULT: the driver with faults injected into weftReduce
# (tests/tools/perf_fault.c), run as reduce_perf
set -u
weftrun=$1
tools=$2
fault=${3:-}
perf=$tools/all_reduce_perf
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }

# Every data row must show 0 in both #wrong columns (N/A in place where the
# tool does not check it); rows must cover the sweep. The columns are
# counted from the end: hypercube's redop column is empty.
check_table() { # name file expected_rows
  local rows wrongrows
  rows=$(grep -cE '^\[0\] +[0-9]+ ' "$2")
  wrongrows=$(grep -E '^\[0\] +[0-9]+ ' "$2" | awk '$(NF-4) != 0 || ($NF != 0 && $NF != "N/A")' | wc -l)
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

# every datatype and op (mulsum among them) on 3 ranks, odd sizes
if timeout 300 "$weftrun" -n 3 "$perf" -b 1 -e 100K -f 7 -d all -o all -n 1 -w 0 >"$tmp/all" 2>&1; then
  check_table all_types_ops "$tmp/all" $((12 * 6 * 6))
else
  bad all_types_ops "exit $?: $(tail -5 "$tmp/all")"
fi

# 2 ranks and a linear step
if timeout 120 "$weftrun" -n 2 "$perf" -b 1000 -e 5000 -i 1000 -n 2 -w 1 >"$tmp/lin" 2>&1; then
  check_table linear_step "$tmp/lin" 5
else
  bad linear_step "exit $?"
fi

# flags as nccl-tests reads them: -f wins over -i in either order; a small
# factor still moves (-f 1.1 had stopped at the first size); -c 0 prints N/A
# for #wrong; the header's step is a whole number of bytes
if timeout 60 "$weftrun" -n 2 "$perf" -b 8 -e 64 -f 2 -i 1K -c 0 -n 1 -w 0 -B 0 >"$tmp/fi" 2>&1 &&
   timeout 60 "$weftrun" -n 2 "$perf" -b 8 -e 64 -f 2 -i 0 -c 5 -n 1 -w 0 -B 0 >"$tmp/c5" 2>&1 &&
   timeout 60 "$weftrun" -n 2 "$perf" -b 100 -e 200 -f 1.1 -d int8 -n 1 -w 0 -B 0 >"$tmp/f11" 2>&1 &&
   timeout 60 "$weftrun" -n 2 "$perf" -b 8 -e 8 -n 1 -w 0 -B 0 >"$tmp/step" 2>&1; then
  sizes=$(grep -E '^\[0\] +[0-9]+ ' "$tmp/fi" | awk '{print $2}' | tr '\n' ' ')
  wrong=$(grep -E '^\[0\] +[0-9]+ ' "$tmp/fi" | awk '$10 == "N/A" && $14 == "N/A"' | wc -l)
  f11=$(grep -cE '^\[0\] +[0-9]+ ' "$tmp/f11")
  if [ "$sizes" != "8 16 32 64 " ]; then bad factor_over_step "sizes $sizes, want 8 16 32 64"
  elif [ "$wrong" != 4 ]; then bad no_check_na "$(grep -E '^\[0\] +8 ' "$tmp/fi")"
  elif [ "$f11" != 8 ]; then bad small_factor "$f11 rows from 100 to 200 by 1.1, want 8"
  elif ! grep -q "Out of bounds values : 0 OK" "$tmp/c5"; then bad check_count "-c 5: $(tail -2 "$tmp/c5")"
  elif ! grep -q "step: 1048576(bytes)" "$tmp/step"; then bad header_step "$(grep step: "$tmp/step")"
  else ok nccl_tests_flags; fi
else
  bad nccl_tests_flags "exit $?"
fi

# the count column is what each call is given (a gather's block), as nccl-tests
# prints it: 96 B of int8 on 3 ranks, blocks of 32 (a multiple of 16 bytes)
if timeout 60 "$weftrun" -n 3 "$tools/all_gather_perf" -b 96 -e 96 -d int8 -n 1 -w 0 -B 0 >"$tmp/cnt" 2>&1 &&
   [ "$(grep -E '^\[0\] +96 ' "$tmp/cnt" | awk '{print $3}')" = 32 ]; then ok count_column
else bad count_column "$(grep -E '^\[0\] +[0-9]+ ' "$tmp/cnt")"; fi

# every tool on 3 ranks, checked out of place and in place (gather and scatter
# too, as nccl-tests runs them); sendrecv and the all-to-alls are timed in
# place, as nccl-tests times them, with #wrong N/A there
for t in all_gather reduce_scatter broadcast reduce sendrecv alltoall gather scatter alltoallv; do
  if timeout 120 "$weftrun" -n 3 "$tools/${t}_perf" -b 8 -e 64K -f 32 -c 1 -n 2 -w 1 \
      >"$tmp/$t" 2>&1; then
    check_table "${t}_checked" "$tmp/$t" 3
    [ "$(grep -E '^\[0\] +[0-9]+ ' "$tmp/$t" | awk '$11 == "N/A"' | wc -l)" = 0 ] ||
      bad "${t}_in_place" "no in-place figures: $(grep -E '^\[0\] +[0-9]+ ' "$tmp/$t" | head -1)"
    case $t in sendrecv | alltoall | alltoallv)
      [ "$(grep -E '^\[0\] +[0-9]+ ' "$tmp/$t" | awk '$14 != "N/A"' | wc -l)" = 0 ] ||
        bad "${t}_in_place_unchecked" "$(grep -E '^\[0\] +[0-9]+ ' "$tmp/$t" | head -1)"
    esac
  else
    bad "${t}_checked" "exit $?: $(tail -3 "$tmp/$t")"
  fi
done
# busbw = algbw where nccl-tests' factor is 1, on one rank too
for t in broadcast reduce sendrecv; do
  if timeout 60 "$weftrun" -n 1 "$tools/${t}_perf" -b 64K -e 64K -n 2 -w 1 >"$tmp/one_$t" 2>&1 &&
     grep -E '^\[0\] +[0-9]+ ' "$tmp/one_$t" | awk '$8 != $9 || $8 == 0 {bad = 1} END {exit bad}'
  then ok "${t}_busbw_one_rank"
  else bad "${t}_busbw_one_rank" "$(grep -E '^\[0\] +[0-9]+ ' "$tmp/one_$t")"; fi
done

# bad values are refused (exit 2, naming the flag), never read as 0 or clamped
refused_all=1
for args in "-b 1M -e 8" "-c yes" "-r abc" "-n 1x" "-b nan" "-b 1e30" "-b inf" "-f 0.5" \
            "-b 8 -e 64 -i 0" "-b 0 -e 8G -i 1"; do
  # shellcheck disable=SC2086
  timeout 30 "$weftrun" -n 1 "$perf" $args -n 1 -w 0 -B 0 >"$tmp/badflag" 2>&1
  rc=$?
  if [ "$rc" != 2 ] || ! grep -qE "bad value|invalid sizes|never reaches|more than" "$tmp/badflag"; then
    bad "refused_${args// /_}" "exit $rc: $(tail -2 "$tmp/badflag")"
    refused_all=0
  fi
done
[ "$refused_all" = 1 ] && ok bad_values_refused

# nccl-tests' -t and -g: 1 is taken (its scripts pass -g 1), more is refused
# naming weftrun -n
if timeout 30 "$weftrun" -n 1 "$perf" -t 1 -g 1 -b 8 -e 8 -n 1 -w 0 -B 0 >"$tmp/tg" 2>&1 &&
   grep -qE '^\[0\] +8 ' "$tmp/tg" &&
   ! timeout 30 "$weftrun" -n 1 "$perf" -g 2 -b 8 -e 8 -n 1 -w 0 -B 0 >"$tmp/g2" 2>&1 &&
   grep -q "weftrun -n 2" "$tmp/g2"; then ok threads_gpus_flags
else bad threads_gpus_flags "$(tail -2 "$tmp/tg" "$tmp/g2")"; fi

# -J stays JSON where a row has no bytes and the bound allows 0 us (one rank)
if timeout 60 "$weftrun" -n 1 "$perf" -b 1 -e 64 -f 8 -n 1 -w 0 -B 1 -J "$tmp/zero.json" >/dev/null 2>&1 &&
   python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["results"][0]["size"]==0, d' \
     "$tmp/zero.json" 2>"$tmp/zero.err"; then ok json_finite
else bad json_finite "$(cat "$tmp/zero.err"; grep -o '.\{30\}nan.\{10\}' "$tmp/zero.json" | head -2)"; fi

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

# every tool, every datatype, 2 to 4 ranks (hypercube: powers of 2), a moving root
for tool in all_gather reduce_scatter broadcast reduce sendrecv alltoall gather scatter \
            alltoallv hypercube; do
  for n in 2 3 4; do
    [ "$tool" = hypercube ] && [ $n = 3 ] && continue
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
"$perf" -M nosuchmemory >/dev/null 2>&1
rc=$?
if [ "$rc" = 2 ]; then ok bad_memory_kind; else bad bad_memory_kind "exit $rc, want 2"; fi

# -z 0 (a host stream), -G (noted, ignored), -J (JSON), -P (progress on stderr)
if timeout 120 "$weftrun" -n 2 "$perf" -b 8 -e 1M -f 4 -z 0 -G 2 -J "$tmp/run.json" -P 1 -n 3 -w 1 \
    >"$tmp/flags" 2>"$tmp/flags.err"; then
  check_table nonblocking "$tmp/flags" 9
  # the header's graph: is what runs (none), beside the note that -G 2 was ignored
  if grep -q -- "-G 2 ignored" "$tmp/flags" && ! grep -q "Blocking Enabled" "$tmp/flags" &&
     grep -q "validation: 1 graph: 0 unalign: 0$" "$tmp/flags"; then
    ok graph_note
  else bad graph_note "no -G note, a Blocking line for -z 0, or not graph: 0: $(grep 'graph:' "$tmp/flags")"; fi
  progress=$(grep -c "all_reduce_perf: [0-9]*/9 rows" "$tmp/flags.err")
  if [ "$progress" = 9 ]; then ok progress; else bad progress "$progress progress lines, want 9"; fi
  if python3 - "$tmp/run.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["results"]
assert doc["version"] == 3 and len(doc["config"]["devices"]) == 2, doc
assert doc["weft"]["complete"] == "true" and doc["out_of_bounds"]["count"] == 0, doc
assert doc["config"]["blocking_collectives"] == "false", doc["config"]
assert doc["config"]["graph"] == 0, doc["config"]
assert [r["size"] for r in rows] == [8 * 4 ** k for k in range(9)], rows
assert all(r["out_of_place"]["nwrong"] == 0 and r["in_place"]["nwrong"] == 0 for r in rows)
assert all(r["out_of_place"]["time"] > 0 and r["in_place"]["bus_bw"] >= 0 for r in rows)
assert all(r["root"] == "    -1" and r["actual_iterations"] == 3 for r in rows)
PY
  then ok json; else bad json "$(head -c 300 "$tmp/run.json")"; fi
else
  bad nonblocking "exit $?: $(tail -5 "$tmp/flags")"
fi

# without -P and with stderr not a terminal: no progress lines
timeout 60 "$weftrun" -n 2 "$perf" -b 8 -e 64 -f 8 -n 1 -w 0 >"$tmp/quiet" 2>"$tmp/quiet.err"
if grep -q "rows," "$tmp/quiet.err" "$tmp/quiet"; then bad no_progress "progress without -P"
else ok no_progress; fi

# every tool on a host stream (-z 0), 3 ranks (hypercube 4)
for tool in all_gather reduce_scatter broadcast reduce sendrecv alltoall gather scatter \
            alltoallv hypercube; do
  out="$tmp/${tool}_z0"
  n=3
  [ "$tool" = hypercube ] && n=4
  if timeout 120 "$weftrun" -n $n "$tools/${tool}_perf" -b 4 -e 300K -f 9 -z 0 -r 1 -n 2 -w 1 \
      >"$out" 2>&1; then
    check_table "${tool}_z0" "$out" 6
  else
    bad "${tool}_z0" "exit $?: $(tail -3 "$out")"
  fi
done

# -M cuda: runs with 0 wrong where the tools have CUDA and a device, else a clear error and exit 2
timeout 60 "$weftrun" -n 2 "$perf" -M cuda -b 8 -e 64K -f 8 -n 1 -w 0 >"$tmp/cuda" 2>&1
rc=$?
if [ "$rc" = 0 ]; then check_table cuda_memory "$tmp/cuda" 6
elif [ "$rc" = 2 ] && grep -qE "without CUDA|no CUDA device" "$tmp/cuda"; then ok cuda_unavailable
else bad cuda_memory "exit $rc: $(tail -3 "$tmp/cuda")"; fi

# all_reduce_device_perf (CUDA builds) takes -d float -o sum -c as the others
# do, and -G (graph launches, as nccl-tests' -G): it runs, or stops at the
# device, never at the flags; another datatype or op is refused with exit 2,
# naming the tool that runs it, and so is -G with -g 2 or below 0
dev_perf="$tools/all_reduce_device_perf"
if [ -x "$dev_perf" ]; then
  for case in "flags:-d float -o sum -c 1 -n 1" "graph_flag:-G 2 -n 2"; do
    # shellcheck disable=SC2086
    timeout 60 "$dev_perf" ${case#*:} -b 8 -e 64 -w 0 >"$tmp/devrun" 2>&1
    rc=$?
    if [ "$rc" = 0 ] || { [ "$rc" = 1 ] && grep -q "no CUDA device" "$tmp/devrun"; }; then
      ok "device_perf_${case%%:*}"
    else
      bad "device_perf_${case%%:*}" "exit $rc: $(tail -2 "$tmp/devrun")"
    fi
  done
  for case in "d half:-d half:all_reduce_perf -M cuda -d half" \
    "o max:-o max:all_reduce_perf -M cuda -o max" \
    "G_with_g2:-G 2 -g 2:more than 0 only with -g 1" "G_negative:-G -1:more than 0 only with -g 1"; do
    IFS=: read -r name flags want <<<"$case"
    # shellcheck disable=SC2086
    "$dev_perf" $flags -b 8 -e 8 >"$tmp/devrefuse" 2>&1
    rc=$?
    if [ "$rc" = 2 ] && grep -q -- "$want" "$tmp/devrefuse"; then
      ok "device_perf_refuses_$name"
    else
      bad "device_perf_refuses_$name" "exit $rc: $(head -1 "$tmp/devrefuse")"
    fi
  done
else
  echo "skip device_perf_flags: no all_reduce_device_perf (built without CUDA)"
fi

# weft-info --version: the version line alone, exit 0; an unknown option: exit 2, nothing on stdout
if [ "$("$tools/weft-info" --version 2>&1)" = "$("$tools/weft-info" 2>&1)" ] &&
   "$tools/weft-info" --version >/dev/null 2>&1 &&
   { "$tools/weft-info" --bogus >"$tmp/info.out" 2>/dev/null; [ $? = 2 ] && [ ! -s "$tmp/info.out" ]; }; then
  ok info_version
else
  bad info_version "$("$tools/weft-info" --version 2>&1)"
fi

# over UCX's TCP transport, where weft has UCX: right, and nothing from UCX in the
# output (a credit that arrived after its connection closed made UCX warn at exit
# in most runs)
if "$tools/weft-info" --config 2>/dev/null | grep -q WEFT_UCX_DISABLE; then
  ucx_bad=""
  for i in 1 2 3; do
    if ! timeout 120 "$weftrun" -n 2 -x WEFT_TRANSPORT=ucx -x UCX_TLS=tcp "$perf" -b 1M -e 4M \
        -f 4 -n 20 -w 3 >"$tmp/ucx$i" 2>&1; then
      ucx_bad="run $i exit $?: $(tail -3 "$tmp/ucx$i")"
    elif grep -q "UCX .*WARN" "$tmp/ucx$i"; then
      ucx_bad="run $i: $(grep "UCX .*WARN" "$tmp/ucx$i" | head -2)"
    fi
  done
  if [ -z "$ucx_bad" ]; then check_table ucx_tcp_quiet "$tmp/ucx3" 2; else bad ucx_tcp_quiet "$ucx_bad"; fi
else
  echo "skip ucx_tcp_quiet: weft built without UCX"
fi

# the plot tool: two runs (a table and a JSON file) overlaid in one SVG
if python3 "$(dirname "$0")/../../tools/perf/perf_plot.py" -o "$tmp/plot.svg" table="$tmp/flags" \
    "$tmp/run.json" >"$tmp/plot.log" 2>&1 &&
   python3 - "$tmp/plot.svg" <<'PY'
import sys, xml.dom.minidom
doc = xml.dom.minidom.parse(sys.argv[1])
lines = doc.getElementsByTagName("polyline")
assert len(lines) == 2, len(lines)
assert all(len(l.getAttribute("points").split()) == 9 for l in lines)
PY
then ok plot; else bad plot "$(cat "$tmp/plot.log")"; fi

# ---- nccl-tests' flags, output and exit statuses (its src/common.cu, util.cu)

rows_of() { grep -E '^ *[0-9]+ +[0-9]+ ' "$1"; } # a --no-prefix table's rows

# every flag of nccl-tests' getopt table, short and long, with its value
# syntax: taken, and the run's rows all right
flags_bad=""
while IFS= read -r flags; do
  [ -n "$flags" ] || continue
  tool=$perf
  case $flags in "-r "* | "--root "*) tool=$tools/broadcast_perf ;; esac
  flags=${flags//@/$tmp}
  # shellcheck disable=SC2086
  timeout 60 "$weftrun" --no-prefix -n 2 "$tool" -b 8 -e 64 -f 8 -n 2 -w 1 $flags >"$tmp/flag" 2>&1
  rc=$?
  if [ "$rc" != 0 ] || [ "$(rows_of "$tmp/flag" | wc -l)" -lt 1 ] ||
     ! grep -q "Out of bounds values : 0 OK" "$tmp/flag"; then
    flags_bad="$flags_bad [$flags: exit $rc $(grep -m1 -E 'bad value|invalid|unrecognized|FAILED|failure' "$tmp/flag")]"
  fi
done <<'FLAGS'
-t 1
-g 1
-b 16
-e 32
-i 8
-f 2
-n 3
-m 2
-w 0
-N 2
-p 1
-c 2
-o mulsum
-d int32
-r 1
-r -1
-z 0
-z 1
-z 2
-z 3
-y 1
-y 1 -z 0
-T 10
-G 1
-C 1
-S 1
-J @/short.json
-a 0
-a 3
-R 1
-R 2
-x 1
-D 0
-V 16
-M 1
-M host
-u 1
-I 1
-I 1 -K 1
-I 1 -z 0
--nthreads 1
--ngpus 1
--minbytes 16
--maxbytes 32
--stepbytes 8
--stepfactor 2
--iters 3
--agg_iters 2
--warmup_iters 0
--run_cycles 2
--parallel_init 1
--check 2
--op prod
--datatype half
--root 1
--blocking 3
--stream_null 1
--timeout 10
--cudagraph 1
--report_cputime 1
--report_timestamps 1
--output_file @/long.json
--average 2
--local_register 1
--cta_policy 2
--device_implementation 0
--device_cta_count 200
--memory 1
--unalign 3
--per_iter_timing 1
--per_iter_skip 0
FLAGS
if [ -z "$flags_bad" ]; then ok nccl_tests_flags_taken; else bad nccl_tests_flags_taken "$flags_bad"; fi

# -D: nccl-tests' answers, exit 2 without -R 2, 5 with it (no device kernels here)
"$perf" -D 1 -b 8 -e 8 >"$tmp/d1" 2>&1
rc1=$?
"$perf" -D 1 -R 2 -b 8 -e 8 >"$tmp/d2" 2>&1
rc2=$?
if [ "$rc1" = 2 ] && grep -q "requires enabling symmetric memory registration" "$tmp/d1" &&
   [ "$rc2" = 5 ] && grep -q "Device implementation 1 is not supported by this test" "$tmp/d2"
then ok device_impl_refused; else bad device_impl_refused "exit $rc1 and $rc2"; fi

# what the flags print: -N cycles the sweep, -z its Blocking line, -c N its
# validation count, -u its unalign field, -C its cputime heads, -S a
# timestamp, -I four columns a side, -M 1 the memory line
run2() { # file args...: 2 ranks, 8 B to 64 B
  local out=$1
  shift
  timeout 60 "$weftrun" --no-prefix -n 2 "$perf" -b 8 -e 64 -f 8 -n 2 -w 1 "$@" >"$out" 2>&1
}
what=""
run2 "$tmp/n3" -N 3 || what="$what -N3:exit"
[ "$(rows_of "$tmp/n3" | wc -l)" = 6 ] || what="$what -N3:rows"
for z in 0 1 2 3; do
  run2 "$tmp/z$z" -z $z || what="$what -z$z:exit"
done
grep -q "Blocking" "$tmp/z0" && what="$what -z0:line"
grep -q "^# Blocking Enabled: wait and barrier after each inner iteration (-m) $" "$tmp/z1" ||
  what="$what -z1:line"
grep -q "^# Blocking Enabled: wait after each inner iteration (-m), no barrier $" "$tmp/z2" ||
  what="$what -z2:line"
grep -q "^# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier $" \
  "$tmp/z3" || what="$what -z3:line"
run2 "$tmp/c3" -c 3 -u 3 -d all || what="$what -c3:exit"
grep -q "validation: 3 graph: 0 unalign: 3$" "$tmp/c3" || what="$what -c3:header"
run2 "$tmp/cpu" -C 1 || what="$what -C:exit"
[ "$(grep -E '^# +size' "$tmp/cpu" | grep -o cputime | wc -l)" = 2 ] || what="$what -C:heads"
run2 "$tmp/ts" -S 1 || what="$what -S:exit"
rows_of "$tmp/ts" | awk 'NF != 15 || $14 !~ /^20[0-9][0-9]-[01][0-9]-[0-3][0-9]$/ {bad = 1} END {exit bad}' ||
  what="$what -S:column"
grep -E '^# +size' "$tmp/ts" | grep -q ' timestamp$' || what="$what -S:head"
rm -f "$tmp/iter.json"
run2 "$tmp/iter" -I 1 -n 5 -K 1 -J "$tmp/iter.json" || what="$what -I:exit"
rows_of "$tmp/iter" | awk 'NF != 21 {bad = 1} END {exit bad}' || what="$what -I:columns"
python3 - "$tmp/iter.json" <<'PY' || what="$what -I:json"
import json, sys
doc = json.load(open(sys.argv[1]))
for r in doc["results"]:
    for side in ("out_of_place_per_iter", "in_place_per_iter"):
        it = r[side]
        assert len(it["times_us"]) == 5 and it["skipped_iterations"] == 1, it
        assert len(it["per_process_max_times_us"]) == 2, it
        assert it["min_us"] <= it["p50_us"] <= it["max_us"], it
PY
run2 "$tmp/mem" -M 1 || what="$what -M1:exit"
grep -qE '^# Host memory usage    : Initialization [0-9.]+ [KMG]?B \| User-Allocated [0-9.]+ [KMG]?B \| Collective -?[0-9.]+ [KMG]?B \| Total  [0-9.]+ [KMG]?B$' \
  "$tmp/mem" || what="$what -M1:line"
if [ -z "$what" ]; then ok nccl_tests_flag_effects; else bad nccl_tests_flag_effects "$what"; fi

# nccl-tests' header: its version line, its nThread line (unalign last), and
# "# Using devices" with one line per rank in the shape its JSON writer parses
# ("#  Rank %d Group %d Pid %d on %s device %d [%[^]]] %[^\n]"); every row 118
# characters wide, as nccl-tests' columns make it
timeout 60 "$weftrun" --no-prefix -n 3 "$perf" -b 8 -e 64K -f 8 -n 2 -w 1 >"$tmp/head" 2>&1
if python3 - "$tmp/head" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
assert re.fullmatch(r"# nccl-tests version [0-9.]+ nccl-headers=\d+ nccl-library=\d+", lines[0]), lines[0]
assert lines[1] == "# Collective test starting: all_reduce_perf", lines[1]
assert re.fullmatch(r"# nThread 1 nGpus 1 minBytes 8 maxBytes 65536 step: 8\(factor\) warmup iters: 1 "
                    r"iters: 2 agg iters: 1 validation: 1 graph: 0 unalign: 0", lines[2]), lines[2]
at = lines.index("# Using devices")
rank = re.compile(r"#  Rank +(\d+) Group +(\d+) Pid +(\d+) on +(\S+) device +(-?\d+) \[([^]]+)\] (.+)")
ranks = [rank.fullmatch(l) for l in lines[at + 1:at + 4]]
assert all(ranks) and [int(m.group(1)) for m in ranks] == [0, 1, 2], lines[at:at + 4]
assert len({m.group(3) for m in ranks}) == 3 and lines[at + 4].startswith("#"), lines[at:at + 5]
rows = [l for l in lines if re.match(r" *\d+ +\d+ ", l)]
assert len(rows) == 5 and all(len(l) == 118 for l in rows), [len(l) for l in rows]
assert lines[-3:] == ["# Collective test concluded: all_reduce_perf", "#", ""], lines[-3:]
PY
then ok nccl_tests_header; else bad nccl_tests_header "$(head -12 "$tmp/head")"; fi

# numbers too wide for a column are narrowed as nccl-tests narrows them (no
# decimals, then an exponent): one rank's in-place broadcast of 64 MiB moves
# nothing, so its algbw runs to 10^5 GB/s and more, yet the row keeps its 116
# characters (118 less the two that -c 0's N/A takes away)
timeout 60 "$weftrun" --no-prefix -n 1 "$tools/broadcast_perf" -b 64M -e 64M -c 0 -n 3 -w 1 \
  >"$tmp/wide" 2>&1
row=$(rows_of "$tmp/wide")
if [ "${#row}" = 116 ] && echo "$row" | awk '{exit !(NF == 13 && $11 + 0 >= 100000)}'; then
  ok number_narrowing
else bad number_narrowing "${#row} characters: $row"; fi

# exit statuses as nccl-tests': 7 and a " .. <host> pid <N>: Test failure"
# line for a wrong value (ranks given different -o fill different inputs;
# sendrecv takes no op, so the library sees no disagreement and the receivers'
# checks fail), 3 and "Test NCCL failure" for a weft error (a root out of
# range), 4 and "Test timeout" when a peer stops (SIGSTOP) past -T, followed
# by weft's verdict naming the stopped rank
timeout 60 "$weftrun" --no-prefix -n 2 sh -c 'op=sum; [ "$WEFT_RANK" = 1 ] && op=prod; exec "$0" -b 64 -e 256 -f 4 -n 1 -w 0 -o $op' \
  "$tools/sendrecv_perf" >"$tmp/wrong" 2>&1
rc=$?
if [ "$rc" = 7 ] && grep -qE '^ \.\. \S+ pid [0-9]+: Test failure \S+:[0-9]+$' "$tmp/wrong" &&
   grep -q "^# Out of bounds values : 4 FAILED$" "$tmp/wrong"; then ok exit_wrong_value
else bad exit_wrong_value "exit $rc: $(grep -E 'Out of|failure' "$tmp/wrong")"; fi
timeout 60 "$weftrun" --no-prefix -n 2 "$tools/broadcast_perf" -r 5 -b 8 -e 8 -n 1 -w 0 >"$tmp/lib" 2>&1
rc=$?
if [ "$rc" = 3 ] && grep -qE "^\S+: Test NCCL failure \S+:[0-9]+ 'invalid argument / .*root 5" "$tmp/lib"
then ok exit_library_error; else bad exit_library_error "exit $rc: $(grep -i failure "$tmp/lib")"; fi
start=$(date +%s)
timeout 60 "$weftrun" -n 2 sh -c '"$0" -T 1 -N 0 -b 1K -e 1K -n 100 -w 0 -P 0 >"$1.$WEFT_RANK" 2>&1 & pid=$!
  if [ "$WEFT_RANK" = 1 ]; then sleep 1; kill -STOP $pid; sleep 4; kill -CONT $pid; fi; wait $pid' \
  "$perf" "$tmp/stopped" >"$tmp/timeout" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" = 4 ] && [ "$took" -lt 30 ] && grep -qE '^\S+: Test timeout \(1s\) \S+:[0-9]+$' "$tmp/stopped.0" &&
   grep -qE '^\S+:   .*rank 1' "$tmp/stopped.0"
then ok exit_timeout; else bad exit_timeout "exit $rc after ${took}s: $(grep -h -i -E 'timeout|failure' "$tmp"/stopped.*)"; fi

# NCCL_TESTS_MIN_BW: the average busbw line ends OK or FAILED (below 0.9 of
# it), FAILED exits 7; without it the line has no verdict
verdicts=""
for min in 0.000001 1000000; do
  NCCL_TESTS_MIN_BW=$min timeout 60 "$weftrun" --no-prefix -n 2 "$perf" -b 1K -e 4K -f 4 -n 2 -w 1 \
    >"$tmp/minbw" 2>&1
  verdicts="$verdicts $?:$(grep '^# Avg bus bandwidth' "$tmp/minbw" | awk '{print $NF}')"
done
env -u NCCL_TESTS_MIN_BW timeout 60 "$weftrun" --no-prefix -n 2 "$perf" -b 1K -e 4K -f 4 -n 2 -w 1 \
  >"$tmp/nominbw" 2>&1
if [ "$verdicts" = " 0:OK 7:FAILED" ] && grep -qE '^# Avg bus bandwidth    : [0-9.e+-]+ $' "$tmp/nominbw"
then ok min_bw; else bad min_bw "$verdicts; $(grep 'Avg bus' "$tmp/nominbw")"; fi

# -r -1: every rank the root in turn, each checked
roots_bad=""
for t in broadcast reduce gather scatter; do
  if timeout 60 "$weftrun" --no-prefix -n 3 "$tools/${t}_perf" -r -1 -b 96 -e 96 -n 1 -w 0 \
      >"$tmp/roots" 2>&1; then
    [ "$(rows_of "$tmp/roots" | awk '{print $5}' | tr '\n' ' ')" = "0 1 2 " ] &&
      grep -q "Out of bounds values : 0 OK" "$tmp/roots" || roots_bad="$roots_bad $t"
  else roots_bad="$roots_bad $t(exit $?)"; fi
done
if [ -z "$roots_bad" ]; then ok every_root; else bad every_root "$roots_bad"; fi

# -o mulsum: inputs times 1 on even ranks and 2 on odd ones, summed, checked
# against that (a plain sum would be wrong on every element rank 1 adds to)
mulsum_bad=""
for t in all_reduce reduce_scatter reduce; do
  if timeout 120 "$weftrun" --no-prefix -n 3 "$tools/${t}_perf" -o mulsum -d all -b 24 -e 24K -f 32 \
      -n 1 -w 0 >"$tmp/mulsum" 2>&1; then
    [ "$(rows_of "$tmp/mulsum" | awk '$4 == "mulsum"' | wc -l)" = 36 ] &&
      grep -q "Out of bounds values : 0 OK" "$tmp/mulsum" || mulsum_bad="$mulsum_bad $t"
  else mulsum_bad="$mulsum_bad $t(exit $?)"; fi
done
if [ -z "$mulsum_bad" ]; then ok mulsum; else bad mulsum "$mulsum_bad"; fi

# -J: only for a .json name; never over a file (FILE.0 next), saying where
rm -f "$tmp/x.json"*
run2 "$tmp/j1" -J "$tmp/x.json" && run2 "$tmp/j2" -J "$tmp/x.json" && run2 "$tmp/j3" -J "$tmp/x.txt"
if grep -q "^# Writing JSON output to $tmp/x.json$" "$tmp/j1" &&
   grep -q "^# Writing JSON output to $tmp/x.json.0$" "$tmp/j2" &&
   python3 -c 'import json,sys; [json.load(open(f)) for f in sys.argv[1:]]' "$tmp/x.json" "$tmp/x.json.0" &&
   [ ! -e "$tmp/x.txt" ] && grep -q "^# -J $tmp/x.txt ignored" "$tmp/j3"; then ok json_file
else bad json_file "$(grep -h JSON "$tmp"/j[123]; echo "$tmp"/x.*)"; fi

# ---- nccl-tests' per-rank blocks, groups, in-place sides, check rounds, and
# its hypercube and alltoallv tests

# each rank's block rounded down to 16 bytes (nccl-tests' GetCollByteCount):
# an all-gather of 40 B on 2 ranks moves blocks of 4 floats, 32 B; 1000 B on
# 3 ranks, blocks of 80, 960 B (all-gather, reduce-scatter, all-to-all)
blocks=""
timeout 60 "$weftrun" --no-prefix -n 2 "$tools/all_gather_perf" -b 40 -e 40 -n 1 -w 0 >"$tmp/blk" 2>&1
blocks="$blocks$(rows_of "$tmp/blk" | awk '{print $1 "/" $2 "/" $9 "/" $13}') "
for t in all_gather reduce_scatter alltoall; do
  timeout 60 "$weftrun" --no-prefix -n 3 "$tools/${t}_perf" -b 1000 -e 1000 -n 1 -w 0 >"$tmp/blk" 2>&1
  blocks="$blocks$(rows_of "$tmp/blk" | awk '{print $1 "/" $2 "/" $9}') "
done
if [ "$blocks" = "32/4/0/0 960/80/0 960/80/0 960/80/0 " ]; then ok block_rounding
else bad block_rounding "size/count/#wrong: $blocks"; fi

# NCCL_TESTS_SPLIT / NCCL_TESTS_SPLIT_MASK: groups by color, each its own
# communicator; the Group column shows the color, busbw is the group's
# (2 ranks: all-reduce's 2(n-1)/n is 1, so busbw = algbw), blocks are the
# group's (an all-gather of 1000 B on 2 ranks: 992 B of 124)
split_bad=""
NCCL_TESTS_SPLIT="MOD 2" timeout 60 "$weftrun" --no-prefix -n 4 "$perf" -b 64K -e 1M -f 16 -n 2 -w 1 \
  >"$tmp/split" 2>&1 || split_bad="$split_bad MOD:exit $?"
[ "$(grep -E '^#  Rank' "$tmp/split" | awk '{print $5}' | tr '\n' ' ')" = "0 1 0 1 " ] ||
  split_bad="$split_bad MOD:groups($(grep -E '^#  Rank' "$tmp/split" | awk '{print $5}' | tr '\n' ' '))"
rows_of "$tmp/split" | awk '$7 != $8 || $11 != $12 || $9 != 0 || $13 != 0 {bad = 1}
  END {exit bad || NR != 2}' || split_bad="$split_bad MOD:rows($(rows_of "$tmp/split" | head -1))"
grep -q "Out of bounds values : 0 OK" "$tmp/split" || split_bad="$split_bad MOD:footer"
NCCL_TESTS_SPLIT_MASK=0x2 timeout 60 "$weftrun" --no-prefix -n 4 "$tools/all_gather_perf" -b 1000 -e 1000 \
  -n 2 -w 1 >"$tmp/mask" 2>&1 || split_bad="$split_bad MASK:exit $?"
[ "$(grep -E '^#  Rank' "$tmp/mask" | awk '{print $5}' | tr '\n' ' ')" = "0 0 2 2 " ] ||
  split_bad="$split_bad MASK:groups"
[ "$(rows_of "$tmp/mask" | awk '{print $1 "/" $2 "/" $9 "/" $13}')" = "992/124/0/0" ] ||
  split_bad="$split_bad MASK:row($(rows_of "$tmp/mask"))"
NCCL_TESTS_SPLIT="div 0b10" timeout 60 "$weftrun" --no-prefix -n 4 "$tools/broadcast_perf" -r -1 -b 1K -e 1K \
  -n 1 -w 0 >"$tmp/div" 2>&1 || split_bad="$split_bad DIV:exit $?"
[ "$(grep -E '^#  Rank' "$tmp/div" | awk '{print $5}' | tr '\n' ' ')" = "0 0 1 1 " ] &&
  [ "$(rows_of "$tmp/div" | awk '{print $5}' | tr '\n' ' ')" = "0 1 " ] || split_bad="$split_bad DIV"
for v in "MOD 0" "XOR 1" "MOD two"; do
  NCCL_TESTS_SPLIT=$v timeout 30 "$weftrun" --no-prefix -n 2 "$perf" -b 8 -e 8 -n 1 -w 0 >"$tmp/splitbad" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q "NCCL_TESTS_SPLIT" "$tmp/splitbad" || split_bad="$split_bad refused($v):exit $rc"
done
if [ -z "$split_bad" ]; then ok split_groups; else bad split_groups "$split_bad"; fi

# sendrecv sweeps -o's ops, each a row that names it, and both tools that do
# not check in place time it: figures, #wrong N/A; the average busbw takes
# the in-place sides too
timeout 60 "$weftrun" --no-prefix -n 2 "$tools/sendrecv_perf" -b 1M -e 1M -o all -n 2 -w 1 >"$tmp/srall" 2>&1
rc=$?
ops=$(rows_of "$tmp/srall" | awk '{print $4}' | tr '\n' ' ')
if [ $rc = 0 ] && [ "$ops" = "sum prod max min avg mulsum " ] &&
   rows_of "$tmp/srall" | awk '$9 != 0 || $13 != "N/A" || $10 + 0 <= 0 || $12 + 0 <= 0 {bad = 1} END {exit bad}' &&
   awk '/^ *[0-9]+ +[0-9]+ / {s += $8 + $12; n += 2} /^# Avg bus bandwidth/ {avg = $6}
        END {d = s / n - avg; exit !(n == 12 && d < 0.011 && d > -0.011)}' "$tmp/srall"
then ok sendrecv_ops_in_place
else bad sendrecv_ops_in_place "exit $rc, ops $ops: $(rows_of "$tmp/srall" | head -1; grep 'Avg bus' "$tmp/srall")"; fi

# hypercube: an all-gather by recursive doubling, power-of-2 ranks only; the
# redop column empty; algbw counts the n - 1 blocks a rank receives and busbw
# is algbw (within what printing time and algbw to 2 decimals allows: a
# time of 2.50 us may be 2.495). On 3 ranks nccl-tests' words from every
# rank, no row, exit 0
timeout 60 "$weftrun" --no-prefix -n 2 "$tools/hypercube_perf" -b 1000 -e 64K -f 8 -d all -c 2 -n 2 -w 1 \
  >"$tmp/hc2" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q "Out of bounds values : 0 OK" "$tmp/hc2" &&
   [ "$(rows_of "$tmp/hc2" | awk '$3 == "float" {print $1 "/" $2}' | tr '\n' ' ')" = "992/124 8000/1000 64000/8000 " ] &&
   rows_of "$tmp/hc2" | awk 'NF != 12 || $8 != 0 || $12 != 0 || $6 != $7 || $10 != $11 {bad = 1; print "row: " $0}
     $5 > 1 && $1 > 60000 {e = $1 / 2 / $5 / 1000; tol = e * 0.0051 / ($5 - 0.005) + 0.0051
       if ($6 - e > tol || e - $6 > tol) {bad = 1; print "algbw " $6 ", expected " e ": " $0}}
     END {exit bad}' >"$tmp/hc2.bad"
then ok hypercube_sizes_2
else bad hypercube_sizes_2 "exit $rc: $(cat "$tmp/hc2.bad"; rows_of "$tmp/hc2" | head -2)"; fi
timeout 60 "$weftrun" --no-prefix -n 3 "$tools/hypercube_perf" -b 1000 -e 64K -f 8 -n 2 -w 1 >"$tmp/hc3" 2>&1
rc=$?
if [ $rc = 0 ] && [ "$(grep -c '^nRanks 3 is not a power of 2, skipping$' "$tmp/hc3")" = 3 ] &&
   [ "$(rows_of "$tmp/hc3" | wc -l)" = 0 ] && grep -q "Out of bounds values : 0 OK" "$tmp/hc3"
then ok hypercube_3_skips
else bad hypercube_3_skips "exit $rc: $(tail -5 "$tmp/hc3")"; fi

# alltoallv: nccl-tests' generated pattern, rank i sending rank j a share
# that grows with (j - i) mod n (NCCL_TESTS_ALLTOALLV_SPREAD=1, the default)
# or even shares (0), each rounded down to 16 bytes: 1000 B of floats is 992
# B in blocks of 124 on 2 ranks, 960 of 80 on 3; busbw = algbw (n-1)/n
a2av_bad=""
for case in "2:1:992/124" "3:1:960/80" "3:0:960/80" "3:0.3:960/80"; do
  IFS=: read -r n spread want <<<"$case"
  NCCL_TESTS_ALLTOALLV_SPREAD=$spread timeout 60 "$weftrun" --no-prefix -n "$n" \
    "$tools/alltoallv_perf" -b 1000 -e 64K -f 8 -d all -c 2 -n 2 -w 1 >"$tmp/a2av" 2>&1
  rc=$?
  [ $rc = 0 ] && grep -q "Out of bounds values : 0 OK" "$tmp/a2av" &&
    [ "$(rows_of "$tmp/a2av" | awk '$3 == "float" {print $1 "/" $2; exit}')" = "$want" ] &&
    rows_of "$tmp/a2av" | awk -v n="$n" '$4 != "none" || $9 != 0 || $13 != "N/A" {bad = 1}
      $8 - $7 * (n - 1) / n > 0.011 || $7 * (n - 1) / n - $8 > 0.011 {bad = 1} END {exit bad}' ||
    a2av_bad="$a2av_bad [$case: exit $rc $(rows_of "$tmp/a2av" | head -1)]"
done
for env in NCCL_TESTS_ALLTOALLV_SPREAD=abc NCCL_TESTS_ALLTOALLV_MATRIX_FILE=/dev/null; do
  env "$env" timeout 30 "$weftrun" --no-prefix -n 2 "$tools/alltoallv_perf" -b 8 -e 8 -n 1 -w 0 \
    >"$tmp/a2avbad" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q "${env%%=*}" "$tmp/a2avbad" || a2av_bad="$a2av_bad [$env: exit $rc]"
done
if [ -z "$a2av_bad" ]; then ok alltoallv; else bad alltoallv "$a2av_bad"; fi

# faults injected into weftReduce (tests/tools/perf_fault.c), run as reduce_perf
if [ -n "$fault" ] && [ -x "$fault" ]; then
  ln -s "$fault" "$tmp/reduce_perf"
  # one wrong element on the root, rank 2 of 4, each side: #wrong 1, and the
  # footer counts the sides where a rank saw a wrong value, summed over the
  # ranks: 4 sides of one rank, not 16
  WEFT_PERF_FAULT=wrong timeout 60 "$weftrun" --no-prefix -n 4 "$tmp/reduce_perf" -r 2 -b 1K -e 4K -f 4 \
    -n 2 -w 1 >"$tmp/fwrong" 2>&1
  rc=$?
  if [ $rc = 7 ] && [ "$(rows_of "$tmp/fwrong" | awk '{print $9 "/" $13}' | tr '\n' ' ')" = "1/1 1/1 " ] &&
     grep -q "^# Out of bounds values : 4 FAILED$" "$tmp/fwrong"
  then ok wrong_count_one_rank
  else bad wrong_count_one_rank "exit $rc: $(rows_of "$tmp/fwrong"; grep 'Out of' "$tmp/fwrong")"; fi
  # -c 3: a round that returns the first round's output again is caught,
  # each round's inputs being new
  WEFT_PERF_FAULT=replay timeout 60 "$weftrun" --no-prefix -n 2 "$tmp/reduce_perf" -b 4K -e 4K -c 3 \
    -n 2 -w 1 >"$tmp/freplay" 2>&1
  rc=$?
  if [ $rc = 7 ] && rows_of "$tmp/freplay" | awk '{exit !($9 > 0 && $13 == 0)}' &&
     grep -q "^# Out of bounds values : 1 FAILED$" "$tmp/freplay"
  then ok check_rounds_fresh
  else bad check_rounds_fresh "exit $rc: $(rows_of "$tmp/freplay"; grep 'Out of' "$tmp/freplay")"; fi
  # a rank 1 s late out of its warm-up: the barrier before the timed loop
  # keeps the wait out of rank 0's time (-a 0), which would be 500000 us
  WEFT_PERF_FAULT=stall timeout 60 "$weftrun" --no-prefix -n 2 "$tmp/reduce_perf" -b 4K -e 4K -u 1 -a 0 \
    -n 2 -w 1 >"$tmp/fstall" 2>&1
  rc=$?
  if [ $rc = 0 ] && rows_of "$tmp/fstall" | awk '{exit !($6 + 0 < 100000)}'
  then ok barrier_before_timing
  else bad barrier_before_timing "exit $rc: $(rows_of "$tmp/fstall")"; fi
else
  echo "skip perf_fault: no fault-injecting build given"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
