#!/usr/bin/env bash
# The GPU acceptance in one command (docs/gpu-check.md): builds weft
# with CUDA, runs the device suites, compute-sanitizer on a sample, the
# device perf tools with 2, 4 and 8 ranks sharing the GPU, and the PyTorch
# checks, then prints one table: step, result, seconds, key figure.
#
#   tools/scripts/gpu-check.sh --prepare     on a machine with the sources at hand:
#                                    fills .gpu-deps/ (GoogleTest's source, this
#                                    machine's UCX) to carry
#   tools/scripts/gpu-check.sh --list        the steps, their limits and issues; builds nothing
#   tools/scripts/gpu-check.sh [--only a,b]  runs every step (or those named), from the repo root
#
# Every step runs under its own time limit, cut to what is left of the whole
# budget; a step that fails does not stop the others. Without a GPU the GPU
# steps say "skip: no GPU" and the rest run. Exit 0 when no step failed, ran
# out of time or was left out for lack of time; 1 otherwise; 2 on bad usage.
#
# Environment:
#   WEFT_GPU_CHECK_BUDGET=560      seconds for the whole run
#   WEFT_GPU_CHECK_WORK=.gpu-check build directory, GoogleTest prefix, logs
#   WEFT_GPU_CHECK_BUILD_DIR       another meson build directory (default WORK/build)
#   WEFT_GPU_CHECK_BUILD_GTEST=1   build GoogleTest from .gpu-deps even when the
#                                  machine has one
#   WEFT_GPU_CHECK_CARRIED_UCX=1   use the UCX in .gpu-deps even when the machine
#                                  has one
#   WEFT_GPU_CHECK_DEPS=.gpu-deps  what is carried (--prepare fills it)
#   WEFT_GPU_CHECK_MATRIX=full     device_matrix (full or small)
#   WEFT_GPU_CHECK_DEVICE_FILTER   gtest filter of the device step (default: every test)
#   WEFT_GPU_CHECK_PYTHON          python with torch (default
#                                  /opt/torch/.venv/bin/python3, else python3)
#   WEFT_GPU_CHECK_BUILD_ALL=1     build the host suites too (default: what the steps run)
#   WEFT_GPU_CHECK_NO_GPU=1        behave as on a machine without a GPU
#   WEFT_GPU_CHECK_HOST_PERF=1     without a GPU, run the multi-process perf steps
#                                  on host memory up to 1 MiB (tries their plumbing)
#   OUT                            when set: summary.txt, perf.txt and logs.tar.gz
set -uo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
ROOT="$(cd "$(dirname "$SELF")/../.." && pwd)"
export DEPS="${WEFT_GPU_CHECK_DEPS:-$ROOT/.gpu-deps}"

# name | limit (s) | needs (- or gpu) | issue item | what it checks
# In this order so that one call of the budget reaches first the checks that
# have not passed on a GPU yet (the kernels' comparison of the ranks' calls,
# the PyTorch backend's streams, NCCL side by side and the graph-replayed
# 8 B call, the tree's latency and its every datatype and op), then the rest
# as regression checks: the tree kernels, WEFT_DETERMINISTIC and the
# watchdog on CUDA tensors, the device suites, the single-process 2- and
# 4-rank perf steps and the sanitizers, then under MPS the 8 B latency steps,
# the transformer on the GPU, the ZeRO, emulated-host and PyTorch steps and
# the other multi-process perf steps, then without MPS the 8-rank perf step
# and the dead-peer check. MPS starts and stops twice (a name listed twice
# runs twice); the steps that kill a rank run without it. The PyTorch
# extension (step torch_weft) builds on the CPU in the background from the
# end of step build on.
STEPS='
gtest|180|-|20|GoogleTest built from .gpu-deps with cmake when the machine has none
configure|120|-|20|meson: release, CUDA on, device_archs=90, the matrix, no hwloc, UCX if found or carried
build|420|-|20.1|ninja on every core: every CUDA part compiles
perf_flags|60|-|20.1|perf tools take -d, -o, -c with -M cuda; all_reduce_device_perf too
device_mismatch|120|gpu|40.1|ranks that disagree on device memory (count, datatype of one size and of another, op, root, collective; ring and tree, SIMPLE and LL, 2-4 ranks): every rank fails within 1 s with WEFT_TIMEOUT=30, one names the fields, nothing past a count; send/recv sizes that differ; WEFT_CHECK=1 refuses before launching; counts across the LL/SIMPLE threshold found by the watch in weftCommGetAsyncError within 2 s; a skipped call named after WEFT_TIMEOUT=2
torch_weft|180|-|20.4|tools/torch_weft built against the local torch; check_ops on 2 ranks
mps_start|30|gpu|20.2|MPS daemon, private pipe directory, for the multi-process steps
torch_weft_streams|150|gpu|38.3|the weft backend, communication streams: DDP step time, 2 ranks on cuda:0, comm stream vs compute stream
perf_vs_nccl|120|gpu|42.4|nccl_api_perf through the libnccl.so.2 of NCCL itself (nvidia-nccl in the torch Python, NCCL_MULTI_RANK_GPU_ENABLE=1) and through weft, 2/4/8 ranks on the GPU alternating, 8 B..64 MiB, and 8 B in a CUDA graph
perf_tree|160|gpu|42.2|8 B all-reduce over 2000 calls, 4 and 8 processes under MPS, tree (of small calls) and dtree (WEFT_TREE_SMALL_BYTES=0) against ring (goal: tree at most half the ring time at 8), and 8 in CUDA graphs
tree_types|240|gpu|42.2|tree all-reduce, 3 to 8 processes under MPS: all_reduce_perf -M cuda -d all -o all, 1 B..1 MiB, WEFT_PROTO ll at 3, 6, 7 and simple at 4, 5, 8, WEFT_ALGO=allreduce:tree; 0 wrong
mps_stop|20|gpu|20.2|stops the MPS daemon: the single-process steps after it run without
device_tree|240|gpu|42.2|all-reduce cases of the device suite (2-4 ranks, every datatype and op of the matrix, 1 to 1M elements, in and out of place) with WEFT_ALGO=allreduce:tree: the tree kernels
tree_memcheck|120|gpu|42.2|compute-sanitizer memcheck on the tree kernels: all-reduce of 1000 elements, every datatype and op, 2 and 3 ranks, WEFT_ALGO=allreduce:tree
tree_racecheck|150|gpu|42.2|compute-sanitizer racecheck on the tree kernels: one all-reduce case, 3 ranks
device_det|240|gpu|40.4|WEFT_DETERMINISTIC=1 on device memory: DeviceDeterministic (2-5 ranks, every setting, float32 and bf16 bit for bit with the fixed order; every datatype and op), then all_reduce_device_perf -g 2 and -g 4 at 64 KiB and 16 MiB with and without it
torch_watchdog_cuda|120|gpu|38.3|the watchdog of the weft backend on CUDA tensors: a rank SIGKILLed mid-DDP; every survivor ended within the timeout + 5 s by a message naming group, rank, operation and sequence number; torchfrtrace names the dead rank from the flight-recorder dumps (no MPS)
device|240|gpu|20.2|device suite: every collective x datatype x op, 2-4 ranks on the GPU, graphs
device_plain|90|gpu|20.3|the device suite small messages, chained calls, two streams and graphs with WEFT_DEVICE_PDL=0 (no overlapped launches)
device_ipc|120|gpu|20.2|ranks in processes (cuda_ipc); a silent peer ends in a timeout error
device_sendrecv|120|gpu|20.2|send/recv groups on device memory: pipelines, all-to-all, gather, scatter
perf_ar_g2|60|gpu|20.3|all_reduce_device_perf -g 2, 8 B..128 MiB: latency and busbw
perf_ar_g4|60|gpu|20.3|all_reduce_device_perf -g 4: memory traffic against twice the copy
memcheck|120|gpu|20.2|compute-sanitizer memcheck on a small device sample
racecheck|150|gpu|20.2|compute-sanitizer racecheck on a small device sample
synccheck|120|gpu|20.2|compute-sanitizer synccheck on a small device sample
perf_proto|60|gpu|20.3|the device tuner model: -g 2 and -g 4 under WEFT_PROTO=simple and ll, 8 B..4 MiB, and a 1-rank floor
perf_launch|40|gpu|20.3|host time of each CUDA call on the enqueue path (tools/bench/launch_cost.cu)
perf_channels|60|gpu|20.3|all_reduce_device_perf -g 4 and -g 2, 32-128 MiB, at WEFT_DEVICE_NCHANNELS 32, 48, 64
perf_interleave|60|gpu|20.3|all_reduce_device_perf -g 4 and -g 2, 32-128 MiB, at WEFT_DEVICE_RING_INTERLEAVE 1, 2, 3
mps_start|30|gpu|20.2|MPS daemon, private pipe directory, for the multi-process steps
perf_launch_mps|30|gpu|20.3|the same as an MPS client, then two clients at once (host rows)
perf_ar_mps|90|gpu|20.3|all_reduce_device_perf, 2 and 4 processes under MPS, and their 8 B latency over 2000 calls
perf_pdl|60|gpu|20.3|8 B all-reduce latency over 2000 calls, 2 and 4 processes under MPS, at WEFT_DEVICE_PDL 0 and 1 alternating
weft_train_device|200|gpu|39.5|weft-train --device cuda, 4 ranks under MPS: the transformer (tiny, stage 3, 20 steps) within 1e-3 of the host loss at every step, tokens/s of tiny and mid; the MLP final line against the host one; --offload-optimizer (bf16, stage 3) against the host, and the tokens/s of mid with it
zero_math_device|60|gpu|22.2|zero_math.h kernels against the host, bit for bit
zero_device|180|gpu|22.2|device ZeRO suites (zero_device*) under MPS: kernels; device contexts vs host, checkpoints
net_socket|150|gpu|21.3|every device collective, send/recv, all-to-all between 2 emulated hosts over sockets (all-reduce on 3 too)
net_ucx|180|gpu|21.3|the same over UCX (carried in .gpu-deps where the machine has none)
net_ucx_diag|60|gpu|21.3|8 B-32 KiB all-reduce over UCX between 2 emulated hosts: device memory (transports as UCX picks, then UCX_TLS=tcp) and host memory
net_bw|90|gpu|21.4|device all-reduce busbw over sockets between 2 emulated hosts, 16-64 MiB, against host memory
torch_preload|60|gpu|20.4|torch imports with libnccl.so.2 preloaded and sees weft
torch_ddp|120|gpu|20.4|DDP on cuda:0, 2 ranks, through libnccl.so.2, against one process
torch_cuda_ops|180|gpu|20.4|all_to_all_single, batch_isend_irecv, FSDP2 divide factor on CUDA
torch_weft_cuda|240|gpu|19.6|the weft backend on CUDA tensors: check_api, DDP, all-to-all, p2p, FSDP2 vs one process
device_ipc_mps|120|gpu|20.2|device_ipc under MPS
perf_sendrecv|110|gpu|20.3|sendrecv_perf -M cuda, 2/4/8 processes
perf_alltoall|110|gpu|20.3|alltoall_perf -M cuda, 2/4/8 processes
perf_sendrecv_lanes|90|gpu|20.3|sendrecv (2) and alltoall (4 processes) busbw at WEFT_P2P_LANES 1, 2, 4, 8
perf_all_gather|110|gpu|20.2|all_gather_perf -M cuda, 2/4/8 processes, 8 B..128 MiB
perf_reduce_scatter|110|gpu|20.2|reduce_scatter_perf -M cuda, 2/4/8 processes
perf_types|120|gpu|20.2|all_reduce_perf -M cuda -d all -o all, 3 processes, odd sizes
mps_stop|20|gpu|20.2|stops the MPS daemon: the single-process steps after it run without
perf_ar_g8|90|gpu|20.3|all_reduce_device_perf -g 8
torch_dead_peer_cuda|120|gpu|19.6|the weft backend: a rank SIGKILLed mid-DDP on CUDA tensors, the other raises DistBackendError within the timeout (no MPS)
'

step_names() { echo "$STEPS" | awk -F'|' 'NF >= 5 {print $1}'; }
step_field() { echo "$STEPS" | awk -F'|' -v n="$1" -v f="$2" '$1 == n {print $f; exit}'; }

die_usage() {
  echo "gpu-check: $1" >&2
  echo "usage: tools/scripts/gpu-check.sh [--prepare | --list | --only STEP[,STEP...]]" >&2
  exit 2
}

# ---------------------------------------------------------------- --prepare

# GoogleTest's source into .gpu-deps/googletest: /usr/src/googletest, else
# the Debian package that holds it (apt-get download, no root needed).
prepare() {
  mkdir -p "$DEPS"
  local src=/usr/src/googletest tmp=""
  if [ ! -f "$src/googletest/CMakeLists.txt" ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download googletest) || {
      echo "gpu-check: no $src and apt-get download googletest failed" >&2
      rm -rf "$tmp"
      return 1
    }
    dpkg -x "$tmp"/googletest_*.deb "$tmp/x"
    src="$tmp/x/usr/src/googletest"
  fi
  rm -rf "$DEPS/googletest"
  mkdir -p "$DEPS/googletest"
  cp "$src/CMakeLists.txt" "$DEPS/googletest/"
  # googletest alone: no googlemock, docs, samples or its own tests
  (cd "$src" && tar cf - --exclude=docs --exclude=samples --exclude=test googletest) |
    (cd "$DEPS/googletest" && tar xf -)
  [ -n "$tmp" ] && rm -rf "$tmp"
  local version
  version=$(grep -o 'GOOGLETEST_VERSION [0-9.]*' "$DEPS/googletest/CMakeLists.txt" | cut -d' ' -f2)
  echo "gpu-check: $DEPS/googletest (GoogleTest $version) ready"
  prepare_ucx || return 1
  echo "gpu-check: carry .gpu-deps: $(du -sh "$DEPS" | cut -f1) in all (the limit is 64 MiB with the tree)"
}

# This machine's UCX into .gpu-deps/ucx for step net_ucx (the GPU machine has
# none): its libraries and transport modules (lib/, lib/ucx/, where libucs
# looks for them), libnuma, headers, its pkg-config files with the prefix
# left to fill in where they land, and pkgconf for a machine without
# pkg-config. Built for an older glibc than the GPU machine's, so they load.
prepare_ucx() {
  local d="$DEPS/ucx" libdir incdir pc lib
  if ! libdir=$(pkg-config --variable=libdir ucx 2>/dev/null); then
    echo "gpu-check: no UCX here (pkg-config ucx): step net_ucx will skip on the GPU machine"
    return 0
  fi
  incdir=$(pkg-config --variable=includedir ucx)
  rm -rf "$d"
  mkdir -p "$d/lib/ucx" "$d/lib/pkgconfig" "$d/include" "$d/bin"
  cp -a "$libdir"/lib{ucp,uct,ucs,ucm}.so* "$d/lib/" || return 1
  # the shared-memory module only: the GPU machine has no InfiniBand stack
  cp -a "$libdir"/ucx/libuct_cma.so* "$d/lib/ucx/" 2>/dev/null
  (cd "$incdir" && cp -a ucp uct ucs ucm "$d/include/") || return 1
  for pc in "$libdir"/pkgconfig/ucx*.pc; do
    sed -e 's|^prefix *=.*|prefix = @UCX_PREFIX@|' -e 's|^libdir *=.*|libdir = ${prefix}/lib|' \
      -e 's|^includedir *=.*|includedir = ${prefix}/include|' "$pc" >"$d/lib/pkgconfig/${pc##*/}"
  done
  if command -v pkgconf >/dev/null; then
    cp -L "$(command -v pkgconf)" "$d/bin/pkgconf"
  fi
  for lib in $(ldd "$libdir/libucs.so.0" "$d/bin/pkgconf" 2>/dev/null |
               awk '/=> \// {print $3}' | grep -E '/lib(numa|pkgconf)\.so' | sort -u); do
    cp -L "$lib" "$d/lib/"
  done
  echo "gpu-check: $d (UCX $(pkg-config --modversion ucx), $(du -sh "$d" | cut -f1)) ready"
}

# ---------------------------------------------------------------- --list

list_steps() {
  local n
  printf '%-20s %6s  %-5s %-6s %s\n' step limit needs issue "what it checks"
  for n in $(step_names); do
    declare -F "step_$n" >/dev/null || { echo "gpu-check: step $n has no step_$n" >&2; return 1; }
    printf '%-20s %5ss  %-5s %-6s %s\n' "$n" "$(step_field "$n" 2)" "$(step_field "$n" 3)" \
      "$(step_field "$n" 4)" "$(step_field "$n" 5)"
  done
}

# ---------------------------------------------------------------- step helpers
# A step runs in its own process (gpu-check.sh --step NAME) with its log as
# stdout; key TEXT records its key figure, skip TEXT ends it as skipped.

key() { echo "$*" >"$LOGS/$STEP.key"; }
skip() { key "$*"; exit 77; }
fail() { key "$*"; echo "FAIL: $*"; exit 1; }

# Runs the binary of a meson test when the build has it, else skips.
need_exe() { # path
  [ -x "$1" ] || skip "not built: ${1#"$B"/}"
}

# Counts of a gtest run's log: "N passed, M skipped" or the failures.
gtest_key() { # log
  local passed skipped failed
  passed=$(grep -o '\[  PASSED  \] [0-9]* test' "$1" | grep -o '[0-9]*' | tail -1)
  skipped=$(grep -o '\[  SKIPPED \] [0-9]* test' "$1" | grep -o '[0-9]*' | tail -1)
  failed=$(grep -c '^\[  FAILED  \] .*\.' "$1")
  echo "${passed:-0} passed, ${skipped:-0} skipped, ${failed} failed"
}

run_gtest() { # binary [args...]
  local log="$LOGS/$STEP.gtest"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  echo "slowest tests (ms):"
  sed -nE 's/^\[ +OK \] (.*) \(([0-9]+) ms\)$/\2 \1/p' "$log" | sort -rn | head -8
  key "$(gtest_key "$log")"
  if grep -q '\[  SKIPPED \]' "$log" && ! grep -q '\[  PASSED  \] [1-9]' "$log"; then
    skip "every test skipped: $(grep -m1 -A1 ': Skipped$' "$log" | tail -1 | cut -c1-60)"
  fi
  return "$rc"
}

# Sends the multi-process steps' CUDA work through the MPS daemon of mps_start.
use_mps() {
  [ "$PERF_MEM" = host ] && return 0
  [ -f "$WORK/mps/up" ] || skip "MPS is not running (see mps_start)"
  export CUDA_MPS_PIPE_DIRECTORY="$WORK/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$WORK/mps/log"
}

mps_stop() {
  [ -f "$WORK/mps/up" ] || return 0
  echo quit | CUDA_MPS_PIPE_DIRECTORY="$WORK/mps/pipe" nvidia-cuda-mps-control >/dev/null 2>&1
  rm -f "$WORK/mps/up"
}

# shellcheck source=tools/scripts/gpu-check-steps.sh
. "$ROOT/tools/scripts/gpu-check-steps.sh"

# ---------------------------------------------------------------- the run

# PATH: the CUDA toolkit, and the meson/ninja/cmake of a python venv when the
# system has none (the GPU machine's are in /opt/torch/.venv).
setup_path() {
  [ -d /usr/local/cuda/bin ] && PATH="$PATH:/usr/local/cuda/bin"
  local t
  for t in meson ninja cmake; do
    command -v $t >/dev/null || [ ! -x "/opt/torch/.venv/bin/$t" ] || PATH="$PATH:/opt/torch/.venv/bin"
  done
  export PATH
}

pick_python() {
  if [ -n "${WEFT_GPU_CHECK_PYTHON:-}" ]; then echo "$WEFT_GPU_CHECK_PYTHON"
  elif [ -x /opt/torch/.venv/bin/python3 ]; then echo /opt/torch/.venv/bin/python3
  else command -v python3
  fi
}

has_gpu() {
  [ "${WEFT_GPU_CHECK_NO_GPU:-0}" = 1 ] && return 1
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU 0'
}

# GoogleTest from the machine (pkg-config, or headers where meson looks)
# unless told to build it; a built one is found through pkg-config, or
# through the compiler's search paths where pkg-config is missing.
setup_gtest_env() {
  export GTEST_PREFIX="$WORK/gtest"
  GTEST_BUILD=0
  if [ "${WEFT_GPU_CHECK_BUILD_GTEST:-0}" = 1 ] ||
     ! { pkg-config --exists gtest_main 2>/dev/null || [ -f /usr/include/gtest/gtest.h ] ||
         [ -f /usr/src/googletest/googletest/src/gtest-all.cc ]; }; then
    GTEST_BUILD=1
    export PKG_CONFIG_PATH="$GTEST_PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export LIBRARY_PATH="$GTEST_PREFIX/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export CPATH="$GTEST_PREFIX/include${CPATH:+:$CPATH}"
  fi
  export GTEST_BUILD
}

# The carried UCX (--prepare) where the machine has none, or where told to
# (WEFT_GPU_CHECK_CARRIED_UCX=1): its .pc files with their prefix filled in,
# first on PKG_CONFIG_PATH; its libraries first on LD_LIBRARY_PATH for every
# step; the carried pkgconf where the machine has no pkg-config. GPU_CHECK_UCX_FROM
# says which UCX the build will find (configure, net_ucx).
setup_ucx_env() {
  local d="$DEPS/ucx" pc
  GPU_CHECK_UCX_FROM=none
  if pkg-config --exists ucx 2>/dev/null; then GPU_CHECK_UCX_FROM=system; fi
  if [ -d "$d/lib/pkgconfig" ] &&
     { [ "$GPU_CHECK_UCX_FROM" = none ] || [ "${WEFT_GPU_CHECK_CARRIED_UCX:-0}" = 1 ]; }; then
    mkdir -p "$WORK/ucx-pc"
    for pc in "$d"/lib/pkgconfig/*.pc; do
      sed "s|@UCX_PREFIX@|$d|" "$pc" >"$WORK/ucx-pc/${pc##*/}"
    done
    export PKG_CONFIG_PATH="$WORK/ucx-pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    command -v pkg-config >/dev/null || [ ! -x "$d/bin/pkgconf" ] || export PKG_CONFIG="$d/bin/pkgconf"
    GPU_CHECK_UCX_FROM=carried
  fi
  export GPU_CHECK_UCX_FROM
}

# WEFT_GPU_CHECK_HOST_PERF=1 without a GPU: the multi-process perf steps run
# on host memory (gpu-check-steps.sh's PERF_MEM), the other GPU steps skip.
host_perf_step() { # name
  [ "${WEFT_GPU_CHECK_HOST_PERF:-0}" = 1 ] &&
    [[ "$1" =~ ^(perf_(sendrecv|alltoall|all_gather|reduce_scatter|types|sendrecv_lanes)|tree_types|net_(socket|ucx|bw))$ ]]
}

# One step under its limit: pass, fail, skip, timeout, or "no time" when the
# budget is spent. Prints a line as it ends, and the log's tail on failure.
run_step() { # name
  local n="$1" lim needs left start rc result keytext
  lim=$(step_field "$n" 2)
  needs=$(step_field "$n" 3)
  left=$((DEADLINE - $(date +%s) - 5))
  start=$(date +%s)
  rm -f "$LOGS/$n.key"
  if [ "$needs" = gpu ] && [ "$GPU" = 0 ] && ! host_perf_step "$n"; then
    result=skip keytext="no GPU"
  elif [ "$left" -lt 10 ]; then
    result="no time" keytext="budget spent before this step"
  else
    [ "$lim" -gt "$left" ] && lim=$left
    STEP="$n" timeout -k 10 "$lim" bash "$SELF" --step "$n" >"$LOGS/$n.log" 2>&1
    rc=$?
    case $rc in
      0) result=pass ;;
      77) result=skip ;;
      124 | 137) result=timeout ;;
      *) result=fail ;;
    esac
    keytext=$(tr '|\n' '/ ' <"$LOGS/$n.key" 2>/dev/null)
    keytext=${keytext% }
    [ "$result" = timeout ] && keytext="over ${lim}s${keytext:+; $keytext}"
    [ "$result" = fail ] && [ -z "$keytext" ] &&
      keytext="exit $rc: $(tail -1 "$LOGS/$n.log" | tr '|' '/' | cut -c1-60)"
  fi
  local secs=$(($(date +%s) - start))
  printf '%s|%s|%s|%s\n' "$n" "$result" "$secs" "$keytext" >>"$LOGS/table"
  printf 'gpu-check: %-20s %-7s %4ss  %s\n' "$n" "$result" "$secs" "$keytext"
  if [ "$result" = fail ] || [ "$result" = timeout ]; then
    tail -n 10 "$LOGS/$n.log" | sed 's/^/    | /'
    mps_restart "$n"
  fi
}

# After a failed step under MPS: a client that died with kernels in flight
# can leave the daemon refusing new clients ("CUDA-capable device(s) is/are
# busy or unavailable"), which would fail the next steps for no reason of
# their own. A fresh daemon for them.
mps_restart() { # failed step
  [ -f "$WORK/mps/up" ] || return 0
  mps_stop
  if STEP=mps_start timeout -k 5 30 bash "$SELF" --step mps_start >>"$LOGS/mps_restart.log" 2>&1; then
    echo "gpu-check: MPS restarted after $1 failed"
  else
    echo "gpu-check: MPS did not restart after $1 failed (mps_restart.log); later steps run without"
  fi
}

print_table() {
  # a tree copied onto the machine may differ from the commit its .git names
  local commit dirty=""
  commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')
  [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | head -1)" ] &&
    dirty=" with changes to tracked files"
  echo "weft gpu-check $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit$dirty"
  echo "machine: $MACHINE"
  echo
  printf '| %-20s | %-7s | %5s | %s\n' step result s "key figure"
  printf '|%s|%s|%s|%s\n' "----------------------" "---------" "-------" "-----------"
  awk -F'|' '{printf "| %-20s | %-7s | %5s | %s\n", $1, $2, $3, $4}' "$LOGS/table"
  local bad
  bad=$(awk -F'|' '$2 != "pass" && $2 != "skip"' "$LOGS/table" | wc -l)
  echo
  echo "$(awk -F'|' '$2 == "pass"' "$LOGS/table" | wc -l) passed, $(awk -F'|' '$2 == "skip"' "$LOGS/table" | wc -l) skipped, $bad failed or not run, $(($(date +%s) - START)) s"
}

describe_machine() {
  local gpu="no GPU" cores nvccv torchv
  has_gpu && gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
  cores=$(nproc)
  nvccv=$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | cut -d' ' -f2)
  torchv=$("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null)
  echo "$gpu; $cores cores; nvcc ${nvccv:-none}; torch ${torchv:-none} ($PY)"
}

save_out() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  cp "$LOGS/summary.txt" "$OUT/summary.txt"
  cat "$LOGS"/perf_*.log >"$OUT/perf.txt" 2>/dev/null
  tar czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null
}

# Step torch_weft's build (CPU only, about 40 s) in the background while the
# GPU steps run: started once libweft is built (after step build, or at the
# start when the build is carried), when torch_weft is among the steps. It
# runs in a session of its own (setsid), so that what is left of it at the
# end is stopped whole; its exit status lands in torch_weft_build.rc whole
# (written aside, then renamed).
torch_weft_prebuild() { # selected steps...
  [[ " $* " == *" torch_weft "* ]] || return 0
  [ -f "$WORK/torch_weft_build.pid" ] && return 0
  [ -f "$B/libweft.so" ] || return 0
  command -v setsid >/dev/null || return 0 # step torch_weft builds it then
  rm -f "$WORK/torch_weft_build.rc"
  # shellcheck disable=SC2016 # expanded by the inner shell
  STEP=torch_weft_build setsid bash -c '
    bash "$1" --step torch_weft_build >"$2" 2>&1
    echo $? >"$3.tmp" && mv "$3.tmp" "$3"' _ "$SELF" "$LOGS/torch_weft_build.log" \
    "$WORK/torch_weft_build.rc" </dev/null >/dev/null 2>&1 &
  echo $! >"$WORK/torch_weft_build.pid"
}

# At the end: a background build the run did not wait for (its step was
# left out for lack of time) is stopped, its whole session: stopped first,
# so that none of it starts another process meanwhile.
torch_weft_prebuild_stop() {
  local pid
  pid=$(cat "$WORK/torch_weft_build.pid" 2>/dev/null) || return 0
  if [ ! -f "$WORK/torch_weft_build.rc" ]; then
    kill -STOP -- "-$pid" 2>/dev/null
    kill -KILL -- "-$pid" 2>/dev/null
  fi
  rm -f "$WORK/torch_weft_build.pid"
  return 0
}

at_exit() {
  torch_weft_prebuild_stop
  mps_stop
}

main_run() { # selected steps...
  START=$(date +%s)
  DEADLINE=$((START + ${WEFT_GPU_CHECK_BUDGET:-560}))
  export WORK="${WEFT_GPU_CHECK_WORK:-$ROOT/.gpu-check}"
  export B="${WEFT_GPU_CHECK_BUILD_DIR:-$WORK/build}" LOGS="$WORK/logs" ROOT
  mkdir -p "$WORK" "$LOGS"
  rm -f "$LOGS"/*
  : >"$LOGS/table"
  setup_path
  setup_gtest_env
  setup_ucx_env
  export PY GPU=0
  PY=$(pick_python)
  has_gpu && GPU=1
  MACHINE=$(describe_machine)
  echo "gpu-check: $MACHINE; budget ${WEFT_GPU_CHECK_BUDGET:-560} s; logs in $LOGS"
  trap at_exit EXIT
  local n
  rm -f "$WORK"/torch_weft_build.*
  [[ " $* " == *" build "* ]] || torch_weft_prebuild "$@"
  for n in "$@"; do
    run_step "$n"
    [ "$n" = build ] && torch_weft_prebuild "$@"
  done
  mps_stop
  print_table >"$LOGS/summary.txt"
  save_out
  echo
  cat "$LOGS/summary.txt"
  ! awk -F'|' '$2 != "pass" && $2 != "skip" {bad = 1} END {exit !bad}' "$LOGS/table"
}

main() {
  case "${1:-}" in
    --prepare) prepare ;;
    --list) list_steps ;;
    --step)
      declare -F "step_${2:-}" >/dev/null || die_usage "no step '${2:-}'"
      STEP="$2"
      cd "$ROOT" && "step_$2" ;;
    --only)
      [ -n "${2:-}" ] || die_usage "--only needs step names"
      local n sel=()
      for n in ${2//,/ }; do
        [ -n "$(step_field "$n" 1)" ] || die_usage "no step '$n' (--list shows them)"
        sel+=("$n")
      done
      cd "$ROOT" && main_run "${sel[@]}" ;;
    "") cd "$ROOT" && main_run $(step_names) ;;
    *) die_usage "unknown argument '$1'" ;;
  esac
}

main "$@"
