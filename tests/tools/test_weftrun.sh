#!/usr/bin/env bash
# Rank commands are single-quoted on purpose: the ranks expand them.
# shellcheck disable=SC2016
# Tests the weftrun launcher: environment, output prefixes, failure teardown,
# signal forwarding, job control, leftovers, exec errors and argument errors.
#
#   tests/tools/test_weftrun.sh path/to/weftrun
#
# Prints "ok NAME" or "FAIL NAME" per case, then "N passed, M failed"; exits
# non-zero when any case failed. Every wait is bounded.
set -u

weftrun=${1:?usage: test_weftrun.sh path/to/weftrun}
if [[ ! -x $weftrun ]]; then
  echo "test_weftrun: $weftrun is not an executable" >&2
  exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_weftrun.XXXXXX") || exit 2
# Unique to this run: rank commands carry it, so leftovers can be found.
marker="weftrun_test_marker_$$_$RANDOM"
# A unique sleep duration, so leftover sleeps of this run can be found too.
sleep_s="300.$$$RANDOM"
leftovers="$marker|sleep $sleep_s"

kill_leftovers() {
  local pids
  mapfile -t pids < <(pgrep -f -- "$leftovers")
  ((${#pids[@]} == 0)) || kill -9 "${pids[@]}" 2>/dev/null
}

cleanup() {
  kill_leftovers
  rm -rf "$tmp"
}
trap cleanup EXIT

# Runs "$@" in place of the (sub)shell calling it, with SIGINT and SIGQUIT at
# their defaults: a non-interactive
# shell starts what it runs with '&' with both ignored, and weftrun keeps
# signals it finds ignored (as for nohup's SIGHUP, checked below).
with_default_sigint() {
  exec python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGQUIT, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' "$@"
}

npassed=0
nfailed=0
why=""

# fail MESSAGE: records why the current case failed.
fail() {
  why+="  $1"$'\n'
}

report() {
  if [[ -z $why ]]; then
    echo "ok $1"
    npassed=$((npassed + 1))
  else
    echo "FAIL $1"
    printf '%s' "$why"
    nfailed=$((nfailed + 1))
  fi
  why=""
}

# bounded CMD...: runs CMD for at most 20 s (then SIGTERM, SIGKILL 5 s later).
bounded() {
  timeout -k 5 20 "$@"
}

now_ms() {
  echo $(($(date +%s%N) / 1000000))
}

# gone_within PID SECONDS WHAT: waits up to SECONDS for PID to end; if it has
# not, fails the case ("weftrun still running SECONDS s after WHAT") and
# kills it.
gone_within() {
  local _
  for _ in $(seq $(($2 * 20))); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.05
  done
  fail "weftrun still running $2 s after $3"
  kill -9 "$1"
}

# no_leftovers: fails the case if a process of this run survives (1 s grace).
no_leftovers() {
  local _
  for _ in $(seq 20); do
    pgrep -f -- "$leftovers" >/dev/null || return 0
    sleep 0.05
  done
  fail "processes left behind: $(pgrep -af -- "$leftovers" | tr '\n' ';')"
  kill_leftovers # keep the next cases independent of this one
}

# expect_file FILE EXPECTED: FILE's content equals EXPECTED (plus a newline).
expect_file() {
  local got
  got=$(cat "$1")
  if [[ $got != "$2" ]]; then
    fail "got:"$'\n'"    ${got//$'\n'/$'\n'    }"$'\n'"  expected:"$'\n'"    ${2//$'\n'/$'\n'    }"
  fi
}

# --- (a) environment and prefixes ----------------------------------------
bounded "$weftrun" -n 3 sh -c \
  'echo hello $WEFT_RANK $WEFT_NRANKS $RANK $WORLD_SIZE; echo err >&2' \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 0 ]] || fail "exit status $rc, expected 0"
expect_file <(sort "$tmp/out") $'[0] hello 0 3 0 3\n[1] hello 1 3 1 3\n[2] hello 2 3 2 3'
expect_file <(sort "$tmp/err") $'[0] err\n[1] err\n[2] err'
report prefix_env

bounded "$weftrun" -n 3 --no-prefix sh -c \
  'echo $WEFT_UNIQUE_ID $WEFT_LOCAL_RANK $WEFT_LOCAL_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT' \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 0 ]] || fail "exit status $rc, expected 0"
ids=$(cut -d' ' -f1 "$tmp/out" | sort -u)
[[ $(wc -l <"$tmp/out") -eq 3 ]] || fail "expected 3 lines, got: $(cat "$tmp/out")"
[[ $(wc -l <<<"$ids") -eq 1 ]] || fail "ranks got different WEFT_UNIQUE_IDs"
[[ $ids =~ ^[0-9a-f]{256}$ ]] || fail "WEFT_UNIQUE_ID is not 256 lowercase hex chars: '$ids'"
port=$(cut -d' ' -f7 "$tmp/out" | sort -u)
[[ $port =~ ^[0-9]+$ && $port -gt 0 && $port -lt 65536 ]] || fail "bad MASTER_PORT: '$port'"
expect_file <(cut -d' ' -f2-6 "$tmp/out" | sort) \
  $'0 3 0 3 127.0.0.1\n1 3 1 3 127.0.0.1\n2 3 2 3 127.0.0.1'
report unique_id

# A one-host job: its listeners on loopback, and a random secret per job for
# ranks that rendezvous at an address (WEFT_COMM_ID); the caller's secret wins.
secrets=""
for run in 1 2; do
  bounded "$weftrun" -n 2 --no-prefix sh -c 'echo "$WEFT_SOCKET_IFNAME $WEFT_SECRET"' \
    >"$tmp/out" 2>"$tmp/err"
  [[ $(sort -u "$tmp/out" | wc -l) -eq 1 ]] || fail "ranks got different values: $(cat "$tmp/out")"
  read -r ifname secret <"$tmp/out"
  [[ $secret =~ ^[0-9a-f]{32}$ ]] || fail "WEFT_SECRET is not 32 hex chars: '$secret'"
  # "=name": the exact name (a bare one is a prefix: lo would take lowpan0)
  [[ $ifname == =* ]] || fail "WEFT_SOCKET_IFNAME=$ifname is not an exact match (=name)"
  ifname=${ifname#=}
  ip -o addr show dev "$ifname" 2>/dev/null | grep -q ' 127\.' ||
    [[ $ifname == lo ]] || fail "WEFT_SOCKET_IFNAME=$ifname is not the loopback interface"
  secrets+="$secret"$'\n'
done
[[ $(sort -u <<<"$secrets" | grep -c .) -eq 2 ]] || fail "two jobs got the same WEFT_SECRET"
WEFT_SECRET=mine bounded "$weftrun" -n 1 --no-prefix sh -c 'echo "$WEFT_SECRET"' \
  >"$tmp/out" 2>"$tmp/err"
expect_file "$tmp/out" 'mine'
report local_job_env

# -x sets (and overrides) variables in every rank; --no-prefix prints lines as is.
FROM_PARENT=kept bounded "$weftrun" -n 2 --no-prefix -x FOO=bar -x FROM_PARENT \
  -x WORLD_SIZE=7 -- sh -c 'echo "$FOO $FROM_PARENT $WORLD_SIZE"' >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 0 ]] || fail "exit status $rc, expected 0"
expect_file "$tmp/out" $'bar kept 7\nbar kept 7'
report x_vars

# --- (b) one rank fails: the others are torn down --------------------------
t0=$(now_ms)
bounded "$weftrun" -n 3 sh -c \
  'if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; sleep '"$sleep_s"'; :' "$marker" \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
elapsed_ms=$(($(now_ms) - t0))
[[ $rc -eq 3 ]] || fail "exit status $rc, expected 3"
((elapsed_ms < 4000)) || fail "took ${elapsed_ms} ms"
grep -q "rank 1 exited with status 3" "$tmp/err" || fail "no failure message: $(cat "$tmp/err")"
no_leftovers
report fail_fast

# --- (c) a rank that ignores SIGTERM is killed after the timeout -------------
t0=$(now_ms)
WEFTRUN_KILL_TIMEOUT=1 bounded "$weftrun" -n 3 sh -c \
  'if [ "$RANK" = 1 ]; then sleep 0.5; exit 3; fi; trap "" TERM; sleep '"$sleep_s"'; :' \
  "$marker" >"$tmp/out" 2>"$tmp/err"
rc=$?
elapsed_ms=$(($(now_ms) - t0))
[[ $rc -eq 3 ]] || fail "exit status $rc, expected 3"
((elapsed_ms >= 1400)) || fail "took only ${elapsed_ms} ms: SIGTERM was not ignored?"
((elapsed_ms < 6000)) || fail "took ${elapsed_ms} ms"
no_leftovers
report kill_timeout

# --- (c2) after a failure the others have WEFTRUN_FAIL_GRACE to end --------
# by themselves: ranks that end within it get no SIGTERM; with a grace of 0
# they get it at once
for grace in 1 0; do
  WEFTRUN_FAIL_GRACE=$grace bounded "$weftrun" -n 3 sh -c \
    'trap "echo TERMED; exit 143" TERM; if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi
     sleep 0.7 & wait; echo ENDED' "$marker" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 3 ]] || fail "grace $grace: exit status $rc, expected 3"
  termed=$(grep -c TERMED "$tmp/out")
  ended=$(grep -c ENDED "$tmp/out")
  if [[ $grace == 1 ]]; then
    [[ $termed == 0 && $ended == 2 ]] || fail "grace 1: $termed SIGTERMs, $ended ended: $(cat "$tmp/out")"
  else
    [[ $termed == 2 ]] || fail "grace 0: $termed SIGTERMs, want 2: $(cat "$tmp/out")"
  fi
done
no_leftovers
report fail_grace

# --- (c3) a weft job whose rank dies: the others fail at once naming it, and --
# their traces (WEFT_TRACE_DIR) are there for weft-info --trace
tools=$(dirname "$weftrun")
if [[ -x $tools/all_reduce_perf && -x $tools/weft-info ]]; then
  mkdir -p "$tmp/traces"
  bounded "$weftrun" -n 3 -x WEFT_TRACE_DIR="$tmp/traces" -x WEFT_TIMEOUT=10 sh -c \
    'if [ "$RANK" = 2 ]; then (sleep 1; kill -9 $$) & fi
     exec "$0" -B 0 -n 10000000 -w 1 -b 64K -e 64K -c 0' "$tools/all_reduce_perf" \
    >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 137 ]] || fail "exit status $rc, expected 137 (rank 2's SIGKILL)"
  grep -q "rank 2 is dead" "$tmp/out" "$tmp/err" || fail "no survivor named rank 2: $(tail -3 "$tmp/out")"
  dumps=$(find "$tmp/traces" -name 'weft_trace_*.json' | wc -l)
  [[ $dumps == 2 ]] || fail "$dumps trace dumps, want 2 (ranks 0 and 1)"
  "$tools/weft-info" --trace "$tmp/traces" >"$tmp/verdict" 2>&1
  grep -q "did not complete: rank 2 left no trace.*; ranks 0,1 wait on rank 2" "$tmp/verdict" ||
    fail "verdict: $(cat "$tmp/verdict")"
  report dead_rank_traces
else
  echo "skip dead_rank_traces: no all_reduce_perf or weft-info next to weftrun"
fi

# --- (c4) the rendezvous waits for ranks that start late ----------------------
# weftrun's own WEFT_TIMEOUT (1 s) passes before the ranks' init: they join
if [[ -x $tools/all_reduce_perf ]]; then
  WEFT_TIMEOUT=1 bounded "$weftrun" -n 2 -x WEFT_TIMEOUT=10 sh -c \
    'sleep 2; exec "$0" -b 8 -e 8 -n 1 -w 1 -B 0' "$tools/all_reduce_perf" \
    >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 0 ]] || fail "exit status $rc: $(tail -3 "$tmp/err")"
  grep -q "Out of bounds values : 0 OK" "$tmp/out" || fail "no result: $(tail -3 "$tmp/out")"
  report late_init
fi

# --- (c5) a rank that ends before it joins, even with status 0 ---------------
# (it never called weft): the others' rendezvous fails at once naming it, not
# at their WEFT_TIMEOUT (30 s here)
if [[ -x $tools/all_reduce_perf ]]; then
  t0=$(date +%s%N)
  bounded "$weftrun" -n 3 -x WEFT_TIMEOUT=30 sh -c \
    'if [ "$RANK" = 1 ]; then exit 0; fi; sleep 0.5; exec "$0" -b 8 -e 8 -n 1 -w 1 -B 0' \
    "$tools/all_reduce_perf" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  took_ms=$((($(date +%s%N) - t0) / 1000000))
  [[ $rc -ne 0 ]] || fail "exit status 0: the job went on without rank 1"
  ((took_ms < 10000)) || fail "took $took_ms ms (the ranks waited for their timeout)"
  [[ $(grep -c "rank 1 left (exited, failed or died) before all 3 ranks joined" "$tmp/out" "$tmp/err" |
       awk -F: '{s += $2} END {print s}') -ge 1 ]] ||
    fail "no rank named rank 1: $(tail -3 "$tmp/out" "$tmp/err")"
  report rank_ended_before_joining
fi

# --- (d) SIGINT to weftrun reaches the ranks --------------------------------
with_default_sigint "$weftrun" -n 3 sh -c 'sleep '"$sleep_s"'; :' "$marker" >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 100); do # wait for the 3 sleeps, up to 5 s
  [[ $(pgrep -fc -- "^sleep $sleep_s") -ge 3 ]] && break
  sleep 0.05
done
[[ $(pgrep -fc -- "^sleep $sleep_s") -ge 3 ]] || fail "ranks did not start"
kill -INT "$pid"
gone_within "$pid" 5 "SIGINT"
wait "$pid"
rc=$?
[[ $rc -eq 130 ]] || fail "exit status $rc after SIGINT, expected 130"
no_leftovers
report sigint

# --- (d2) signals that end the job: said so, 128+N, a second one kills ------
# The ranks ignore SIGINT and SIGTERM, so only the SIGKILL that a second
# SIGINT sends ends them before WEFTRUN_KILL_TIMEOUT.
WEFTRUN_KILL_TIMEOUT=10 with_default_sigint "$weftrun" -n 2 sh -c \
  'trap "" INT TERM; echo ready; sleep '"$sleep_s"'; :' "$marker" >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 100); do
  [[ $(grep -c ready "$tmp/out") -ge 2 ]] && break
  sleep 0.05
done
kill -INT "$pid"
sleep 0.3
kill -0 "$pid" 2>/dev/null || fail "weftrun ended on the first SIGINT, which the ranks ignore"
t0=$(now_ms)
kill -INT "$pid"
gone_within "$pid" 5 "a second SIGINT"
elapsed_ms=$(($(now_ms) - t0))
wait "$pid"
rc=$?
[[ $rc -eq 130 ]] || fail "exit status $rc, expected 130 (128 + SIGINT)"
((elapsed_ms < 3000)) || fail "the second SIGINT took ${elapsed_ms} ms to end the job"
grep -q "weftrun: interrupted (SIGINT)" "$tmp/err" || fail "no interrupted message: $(cat "$tmp/err")"
grep -q "killed by signal\|exited with status" "$tmp/err" &&
  fail "the ranks weftrun ended are reported as failures: $(cat "$tmp/err")"
no_leftovers
bounded "$weftrun" -n 2 sh -c 'kill -TERM $PPID; sleep '"$sleep_s"'; :' "$marker" \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 143 ]] || fail "SIGTERM: exit status $rc, expected 143"
grep -q "weftrun: interrupted (SIGTERM)" "$tmp/err" || fail "SIGTERM: $(cat "$tmp/err")"
no_leftovers
report interrupted

# --- (d2b) a signal that stops the launch is the job's outcome -------------
# Rank 0 interrupts weftrun while it launches the others, which end at once:
# the job ends 130, said so, even where no rank is left to forward it to.
for try in 1 2 3; do
  (with_default_sigint timeout -k 5 20 "$weftrun" -n 200 sh -c \
    '[ "$RANK" = 0 ] && kill -INT $PPID; :' >"$tmp/out" 2>"$tmp/err")
  rc=$?
  [[ $rc -eq 130 ]] || fail "try $try: exit status $rc, expected 130 ($(wc -l <"$tmp/out") lines out)"
  grep -q "weftrun: interrupted (SIGINT)" "$tmp/err" || fail "try $try: no interrupted message"
done
report interrupted_launch

# --- (d2c) signals ignored at the start stay ignored (nohup's SIGHUP) --------
# weftrun links weft, and so UCX, which catches SIGHUP when it loads
(
  trap '' HUP
  exec "$weftrun" -n 2 sh -c 'echo ready; sleep 1; echo done' >"$tmp/out" 2>"$tmp/err"
) &
pid=$!
for _ in $(seq 100); do
  [[ $(grep -c ready "$tmp/out") -ge 2 ]] && break
  sleep 0.05
done
kill -HUP "$pid"
wait "$pid"
rc=$?
[[ $rc -eq 0 ]] || fail "exit status $rc after an ignored SIGHUP: $(cat "$tmp/err")"
[[ $(grep -c done "$tmp/out") -eq 2 ]] || fail "the ranks did not go on: $(cat "$tmp/out")"
report ignored_signals

# --- (d2d) a reader that stops reading does not keep the job from ending ------
# weftrun's stdout is a FIFO nobody reads once it is full: SIGTERM still ends
# the job, within WEFTRUN_KILL_TIMEOUT and the last grace (1 + 2 s)
mkfifo "$tmp/fifo"
(WEFTRUN_KILL_TIMEOUT=1 exec "$weftrun" -n 2 sh -c 'exec yes "$0"' "$marker" \
  >"$tmp/fifo" 2>"$tmp/err") &
pid=$!
exec 7<"$tmp/fifo" # opened, never read
for _ in $(seq 100); do
  [[ $(pgrep -fc -- "^yes $marker") -ge 2 ]] && break
  sleep 0.05
done
sleep 0.3 # the FIFO fills, weftrun waits on it
t0=$(now_ms)
kill -TERM "$pid"
gone_within "$pid" 10 "SIGTERM, its stdout's reader stalled"
wait "$pid"
rc=$?
elapsed_ms=$(($(now_ms) - t0))
exec 7<&-
[[ $rc -eq 143 ]] || fail "exit status $rc, expected 143"
((elapsed_ms < 6000)) || fail "it took ${elapsed_ms} ms"
grep -q "weftrun: interrupted (SIGTERM)" "$tmp/err" || fail "no interrupted message: $(cat "$tmp/err")"
no_leftovers
report stalled_reader

# --- (d3) SIGUSR1, SIGUSR2 and SIGALRM reach every rank; the job goes on -----
"$weftrun" -n 2 sh -c 'trap "echo usr1 \$RANK" USR1; trap "echo usr2 \$RANK" USR2
  trap "echo alrm \$RANK; exit 0" ALRM; echo ready; while :; do sleep 0.05; done' "$marker" \
  >"$tmp/out" 2>"$tmp/err" &
pid=$!
for sig_word in ready:- usr1:USR1 usr2:USR2 alrm:ALRM; do
  word=${sig_word%:*} sig=${sig_word#*:}
  [[ $sig == - ]] || kill -"$sig" "$pid" 2>/dev/null
  for _ in $(seq 100); do
    [[ $(grep -c "$word" "$tmp/out") -ge 2 ]] && break
    sleep 0.05
  done
done
gone_within "$pid" 5 "SIGALRM"
wait "$pid"
rc=$?
[[ $rc -eq 0 ]] || fail "exit status $rc, expected 0"
expect_file <(grep -v ready "$tmp/out" | sort) \
  $'[0] alrm 0\n[0] usr1 0\n[0] usr2 0\n[1] alrm 1\n[1] usr1 1\n[1] usr2 1'
no_leftovers
report user_signals

# --- (d4) SIGTSTP stops the ranks with weftrun; SIGCONT resumes them ------------
# state PID: its state letter in /proc (T when stopped).
state() {
  sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1
}
# weftrun in a process group of its own whose parent is in another: as a
# shell with job control starts it, where SIGTSTP's stop is not dropped.
set -m
"$weftrun" -n 2 sh -c 'echo ready; while :; do sleep 0.05; done' "$marker" \
  >"$tmp/out" 2>"$tmp/err" &
pid=$!
set +m
for _ in $(seq 100); do
  [[ $(grep -c ready "$tmp/out") -ge 2 ]] && break
  sleep 0.05
done
for _ in $(seq 100); do
  mapfile -t ranks < <(pgrep -P "$pid")
  ((${#ranks[@]} == 2)) && break
  sleep 0.05
done
((${#ranks[@]} == 2)) || fail "expected 2 ranks, found: ${ranks[*]} (weftrun state $(state "$pid"), output $(cat "$tmp/out" "$tmp/err"))"
# stopped PID...: all are stopped; running PID...: none is
stopped() {
  local p
  for p in "$@"; do [[ $(state "$p") == T ]] || return 1; done
}
running() {
  local p
  for p in "$@"; do [[ $(state "$p") != T ]] || return 1; done
}
kill -TSTP "$pid"
for _ in $(seq 100); do
  stopped "$pid" "${ranks[@]}" && break
  sleep 0.05
done
stopped "$pid" || fail "weftrun not stopped by SIGTSTP: state $(state "$pid")"
stopped "${ranks[@]}" || fail "ranks not stopped with weftrun: states $(for p in "${ranks[@]}"; do state "$p"; done)"
kill -CONT "$pid"
for _ in $(seq 100); do
  running "$pid" "${ranks[@]}" && break
  sleep 0.05
done
running "$pid" || fail "weftrun not continued"
running "${ranks[@]}" || fail "ranks not continued"
kill -TERM "$pid"
for _ in $(seq 100); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
wait "$pid" 2>/dev/null
no_leftovers
report stop_continue

# --- (d5) a reaped rank's process group is not signalled -------------------
# Rank 0 exits, leaving a sleep in its process group; a process from outside
# the job joins that group, standing in for one that got the group's id by
# pid reuse. When rank 1 fails, the sleep must go, the outsider must not.
bounded "$weftrun" -n 2 sh -c 'if [ "$RANK" = 0 ]; then sleep '"$sleep_s"' &
    echo $$ >"$0.pgid"; exit 0; fi
  while [ ! -e "$0.go" ]; do sleep 0.05; done; exit 3' "$tmp/x_$marker" \
  >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 100); do
  [[ -s "$tmp/x_$marker.pgid" ]] && break
  sleep 0.05
done
pgid=$(cat "$tmp/x_$marker.pgid")
perl -e 'setpgrp(0, $ARGV[0]) or die "setpgrp: $!\n"; exec "sleep", "299.'"$$"'"' "$pgid" &
outsider=$!
sleep 0.3
kill -0 "$outsider" 2>/dev/null || fail "the outsider could not join rank 0's group"
touch "$tmp/x_$marker.go"
wait "$pid"
rc=$?
[[ $rc -eq 3 ]] || fail "exit status $rc, expected 3"
kill -0 "$outsider" 2>/dev/null || fail "weftrun signalled the group of rank 0 after reaping it"
kill -9 "$outsider" 2>/dev/null
wait "$outsider" 2>/dev/null
no_leftovers
report reaped_group

# --- (d6) leftovers in a session of their own are killed at once ------------
t0=$(now_ms)
bounded "$weftrun" -n 2 sh -c 'setsid sleep '"$sleep_s"' & sleep 0.2' "$marker" \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
elapsed_ms=$(($(now_ms) - t0))
[[ $rc -eq 0 ]] || fail "exit status $rc, expected 0"
((elapsed_ms < 3000)) || fail "took ${elapsed_ms} ms"
no_leftovers
report leftover_session

# --- (d7) more ranks than the soft RLIMIT_NOFILE allows descriptors for -------
# weftrun holds two pipes per rank: it raises its soft limit; the ranks keep
# the one it was started with.
if (($(ulimit -H -n) >= 256)) 2>/dev/null || [[ $(ulimit -H -n) == unlimited ]]; then
  (
    ulimit -S -n 64
    bounded "$weftrun" -n 40 --no-prefix sh -c 'ulimit -n' >"$tmp/out" 2>"$tmp/err"
  )
  rc=$?
  [[ $rc -eq 0 ]] || fail "exit status $rc: $(head -3 "$tmp/err")"
  expect_file <(sort -u "$tmp/out") 64
  report nofile
else
  echo "skip nofile: the hard RLIMIT_NOFILE is $(ulimit -H -n), under 256"
fi

# --- (e) a program that cannot be run ---------------------------------------
bounded "$weftrun" -n 2 "$tmp/no_such_program" >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 127 ]] || fail "path: exit status $rc, expected 127"
grep -q "cannot run" "$tmp/err" || fail "path: no message: $(cat "$tmp/err")"
bounded "$weftrun" -n 2 "no_such_program_$marker" >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 127 ]] || fail "PATH lookup: exit status $rc, expected 127"
grep -q "cannot run" "$tmp/err" || fail "PATH lookup: no message: $(cat "$tmp/err")"
# found but not runnable: 126, as a shell says
bounded "$weftrun" -n 2 "$tmp" >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 126 ]] || fail "a directory: exit status $rc, expected 126"
report exec_fail

# --- (e2) weftrun's own words start a line of their own ------------------------
# rank 0's line is unfinished (and printed in part) when rank 1 fails; one
# output behind 1 and 2 (2>&1) keeps one line open at a time
bounded "$weftrun" -n 2 sh -c 'if [ "$RANK" = 0 ]; then printf "half..."; sleep 0.6; echo " done";
  else sleep 0.3; echo "warning" >&2; sleep 0.2; exit 3; fi' >"$tmp/out" 2>&1
expect_file "$tmp/out" $'[0] half...\n[1] warning\nweftrun: rank 1 exited with status 3\n[0]  done'
# a full disk: said, exit status 1 (EPIPE stays a pipeline's quiet end)
if [[ -w /dev/full ]]; then
  bounded "$weftrun" -n 1 echo hi >/dev/full 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 1 ]] || fail "stdout on /dev/full: exit status $rc, expected 1"
  grep -q "writing its standard output failed: No space left" "$tmp/err" ||
    fail "stdout on /dev/full: $(cat "$tmp/err")"
fi
report own_lines

# --- (f) bad arguments ------------------------------------------------------
for args in "-n 0 true" "-n -2 true" "-n x true" "-n 2" "" "--bogus true"; do
  # shellcheck disable=SC2086 # split on purpose
  bounded "$weftrun" $args >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -ne 0 && $rc -ne 124 ]] || fail "'weftrun $args': exit status $rc"
  grep -qi "usage" "$tmp/err" || fail "'weftrun $args': no usage message"
done
bounded "$weftrun" --help >"$tmp/out" 2>&1
rc=$?
[[ $rc -eq 0 ]] || fail "--help: exit status $rc"
grep -qi "usage" "$tmp/out" || fail "--help: no usage text"
report bad_args

# --- (g) a last line without a newline is still printed ---------------------
bounded "$weftrun" -n 2 sh -c 'printf "first\nno newline $RANK"; printf "e$RANK" >&2' \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 0 ]] || fail "exit status $rc, expected 0"
expect_file <(sort "$tmp/out") $'[0] first\n[0] no newline 0\n[1] first\n[1] no newline 1'
expect_file <(sort "$tmp/err") $'[0] e0\n[1] e1'
[[ $(tail -c1 "$tmp/out" | od -An -c | tr -d ' ') == '\n' ]] || fail "output does not end in a newline"
report partial_line

# --- (g2) a line without its end yet shows: at '\r', or after a moment --------
# wait_for FILE TEXT: up to 1 s until FILE holds TEXT (fixed string).
wait_for() {
  for _ in $(seq 20); do
    grep -qF -- "$2" "$1" && return 0
    sleep 0.05
  done
  return 1
}
"$weftrun" -n 1 sh -c 'printf "\r 10%%"; sleep 2; printf "\r100%%\n"' >"$tmp/out" 2>"$tmp/err" &
pid=$!
wait_for "$tmp/out" "[0]  10%" || fail "a progress line held back: '$(cat "$tmp/out")'"
wait "$pid"
expect_file <(od -An -c "$tmp/out" | tr -s ' ') \
  "$(printf '\r[0]  10%%\r[0] 100%%\n' | od -An -c | tr -s ' ')"
"$weftrun" -n 1 --no-prefix sh -c 'printf half; sleep 2; printf done' >"$tmp/out" 2>"$tmp/err" &
pid=$!
wait_for "$tmp/out" half || fail "--no-prefix: a partial line held back: '$(cat "$tmp/out")'"
wait "$pid"
expect_file "$tmp/out" halfdone
# another rank's line ends an unfinished one, whose rest gets a prefix again
bounded "$weftrun" -n 2 sh -c 'if [ "$RANK" = 0 ]; then printf abc; sleep 1.2; echo def
  else sleep 0.6; echo line; fi' >"$tmp/out" 2>"$tmp/err"
expect_file "$tmp/out" $'[0] abc\n[1] line\n[0] def'
report partial_flush

# --- (h) --bind-to: an equal share of the CPUs each when the ranks fit ---------
# Ranks print "nproc Cpus_allowed_list".
cpus_cmd='echo "$(nproc) $(grep Cpus_allowed_list /proc/self/status | cut -f2)"'
mine=$(grep Cpus_allowed_list /proc/self/status | cut -f2)
ncpus=$(nproc)
bounded "$weftrun" -n 1 --no-prefix sh -c "$cpus_cmd" >"$tmp/out" 2>"$tmp/err"
expect_file "$tmp/out" "$ncpus $mine"
if ((ncpus >= 2)); then
  bounded "$weftrun" -n 2 --no-prefix sh -c "$cpus_cmd" >"$tmp/out" 2>"$tmp/err" ||
    fail "exit status $?"
  [[ $(cut -d' ' -f2 "$tmp/out" | sort -u | wc -l) -eq 2 ]] || fail "ranks share CPUs: $(cat "$tmp/out")"
  [[ $(cut -d' ' -f1 "$tmp/out" | sort -u) == "$((ncpus / 2))" ]] ||
    fail "2 ranks on $ncpus CPUs do not get $((ncpus / 2)) each: $(cat "$tmp/out")"
  bounded "$weftrun" -n 2 --bind-to core --no-prefix sh -c "$cpus_cmd" >"$tmp/out" 2>"$tmp/err"
  [[ $(cut -d' ' -f2 "$tmp/out" | sort -u | wc -l) -eq 2 ]] || fail "core: ranks share CPUs: $(cat "$tmp/out")"
  [[ $(cut -d' ' -f1 "$tmp/out" | sort -u) == 1 ]] || fail "core: not one CPU each: $(cat "$tmp/out")"
fi
bounded "$weftrun" -n 1 --bind-to core --no-prefix sh -c "$cpus_cmd" >"$tmp/out" 2>"$tmp/err"
[[ $(cut -d' ' -f1 "$tmp/out") == 1 ]] || fail "core: one rank not on one CPU: $(cat "$tmp/out")"
bounded "$weftrun" -n $((ncpus + 1)) --no-prefix sh -c "$cpus_cmd" >"$tmp/out" 2>"$tmp/err"
[[ $(sort -u "$tmp/out") == "$ncpus $mine" ]] || fail "oversubscribed ranks pinned: $(cat "$tmp/out")"
# asked for, but more ranks than CPUs: not pinned (two ranks had shared CPU 0), and said so
bounded "$weftrun" -n $((ncpus + 1)) --bind-to core --no-prefix sh -c "$cpus_cmd" >"$tmp/out" 2>"$tmp/err"
[[ $(sort -u "$tmp/out") == "$ncpus $mine" ]] || fail "--bind-to core oversubscribed pinned: $(cat "$tmp/out")"
grep -q "not pinned" "$tmp/err" || fail "--bind-to core oversubscribed: no note: $(cat "$tmp/err")"
bounded "$weftrun" -n 2 --bind-to none --no-prefix sh -c "$cpus_cmd" >"$tmp/out" 2>"$tmp/err"
[[ $(sort -u "$tmp/out") == "$ncpus $mine" ]] || fail "--bind-to none pinned: $(cat "$tmp/out")"
bounded "$weftrun" -n 2 -x WEFT_TRANSPORT=socket --no-prefix sh -c "$cpus_cmd" >"$tmp/out" 2>"$tmp/err"
[[ $(sort -u "$tmp/out") == "$ncpus $mine" ]] || fail "socket ranks pinned: $(cat "$tmp/out")"
bounded "$weftrun" -n 2 --bind-to socket true >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 2 ]] && grep -q "bind-to" "$tmp/err" || fail "--bind-to socket: exit $rc"
report bind_to

# --version, as mpirun's and torchrun's
out=$("$weftrun" --version 2>&1)
rc=$?
[[ $rc -eq 0 && $out =~ ^weftrun\ \(weft\ [0-9]+\.[0-9]+\.[0-9]+\)$ ]] || fail "--version: exit $rc: $out"
report version

echo "$npassed passed, $nfailed failed"
[[ $nfailed -eq 0 ]]
