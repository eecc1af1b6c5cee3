# The steps of tools/scripts/gpu-check.sh (sourced by it; each runs in a process of
# its own, from the repo root, with B the build directory, LOGS the log
# directory, WORK the work directory, PY the python and GPU 0 or 1).
# A step returns 0 on success, ends through skip or fail, and leaves its key
# figure with key.

MIB128=$((128 << 20))
# The multi-process perf steps' memory and largest size: cuda and 128 MiB;
# WEFT_GPU_CHECK_HOST_PERF=1 (gpu-check.sh) runs them on host memory up to
# 1 MiB, to try their launching and parsing on a machine without a GPU.
PERF_MEM=cuda PERF_MAX=$MIB128
if [ "${WEFT_GPU_CHECK_HOST_PERF:-0}" = 1 ] && [ "${GPU:-0}" = 0 ]; then
  PERF_MEM=host PERF_MAX=$((1 << 20))
fi

# ---------------------------------------------------------------- build

step_gtest() {
  [ "$GTEST_BUILD" = 1 ] || skip "the machine's own GoogleTest"
  [ -f "$DEPS/googletest/CMakeLists.txt" ] ||
    fail "no .gpu-deps/googletest: run tools/scripts/gpu-check.sh --prepare and carry .gpu-deps"
  if [ -f "$GTEST_PREFIX/lib/pkgconfig/gtest_main.pc" ]; then
    key "built before in ${GTEST_PREFIX#"$ROOT"/}"
    return 0
  fi
  cmake -S "$DEPS/googletest" -B "$WORK/gtest-build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON \
    -DCMAKE_INSTALL_PREFIX="$GTEST_PREFIX" -DCMAKE_INSTALL_LIBDIR=lib \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON || fail "cmake configure failed"
  cmake --build "$WORK/gtest-build" -j "$(nproc)" || fail "cmake build failed"
  cmake --install "$WORK/gtest-build" || fail "cmake install failed"
  key "GoogleTest $(grep -o 'GOOGLETEST_VERSION [0-9.]*' "$DEPS/googletest/CMakeLists.txt" |
    cut -d' ' -f2) in ${GTEST_PREFIX#"$ROOT"/}"
}

step_configure() {
  local cuda=enabled opts
  command -v nvcc >/dev/null || cuda=auto
  opts=(-Dbuildtype=release "-Dcuda=$cuda" -Ddevice_archs=90
        "-Ddevice_matrix=${WEFT_GPU_CHECK_MATRIX:-full}"
        -Dhwloc=disabled "-Ducx=$([ "${GPU_CHECK_UCX_FROM:-none}" = none ] && echo disabled || echo enabled)"
        -Dibverbs=disabled)
  if [ -f "$B/build.ninja" ]; then
    meson configure "$B" "${opts[@]}" || fail "meson configure failed"
  else
    meson setup "$B" "${opts[@]}" || fail "meson setup failed"
  fi
  local gt
  gt=$(grep -m1 -i 'Run-time dependency gtest' "$B/meson-logs/meson-log.txt" | cut -c1-50)
  [ "$GTEST_BUILD" = 1 ] && gt="gtest from ${GTEST_PREFIX#"$ROOT"/}"
  key "cuda $cuda, matrix ${WEFT_GPU_CHECK_MATRIX:-full}, sm_90; meson $(meson --version); ${gt:-gtest ?}; UCX ${GPU_CHECK_UCX_FROM:-none}"
}

# What the later steps run: the libraries (every kernel is in libweft), the
# device suites, the tools. The host suites are CI's; WEFT_GPU_CHECK_BUILD_ALL=1
# builds them too.
GPU_TARGETS='^(libweft\.so\.[0-9.]+|libnccl\.so\.[0-9.]+|tests/device/test_device(_ipc|_sendrecv)?|tests/(zero/)?test_zero_(math_)?device[a-z_]*|tools/[a-z_]+_perf|tools/weftrun|tools/weft-train)$'

step_build() {
  [ -f "$B/build.ninja" ] || fail "not configured"
  local targets=()
  if [ "${WEFT_GPU_CHECK_BUILD_ALL:-0}" != 1 ]; then
    mapfile -t targets < <(ninja -C "$B" -t targets all | cut -d: -f1 | grep -E "$GPU_TARGETS")
    [ ${#targets[@]} -gt 0 ] || fail "no target matches"
  fi
  ninja -C "$B" -j "$(nproc)" "${targets[@]}" || fail "ninja failed"
  key "${#targets[@]} targets (0: all), $(nproc) jobs"
}

# ---------------------------------------------------------------- perf flags

# Each device perf tool parses -d, -o and -c: whatever the run then does
# (runs on a GPU; stops at "no CUDA device" without one; a collective the
# device path lacks fails in its own step), it does not stop at the flags.
PERF_FLAG_ERRORS='bad value|invalid option|unrecognized option|unexpected argument|^usage:'

flags_taken() { # tool args...
  local out rc
  out=$(timeout 30 "$@" 2>&1)
  rc=$?
  echo "$(basename "$1") $*: exit $rc: $(echo "$out" | tail -2)"
  ! echo "$out" | grep -qE "$PERF_FLAG_ERRORS"
}

step_perf_flags() {
  local t bad=""
  for t in all_reduce all_gather reduce_scatter sendrecv alltoall; do
    need_exe "$B/tools/${t}_perf"
    flags_taken "$B/tools/${t}_perf" -M cuda -d float -o sum -c 1 -b 8 -e 1K -n 1 -w 0 ||
      bad="$bad $t"
    "$B/tools/${t}_perf" -M cuda -d nosuchtype >/dev/null 2>&1 && bad="$bad $t(-d nosuchtype)"
  done
  need_exe "$B/tools/all_reduce_device_perf"
  flags_taken "$B/tools/all_reduce_device_perf" -d float -o sum -c 1 -b 8 -e 1K -n 1 -w 0 ||
    bad="$bad all_reduce_device_perf"
  "$B/tools/all_reduce_device_perf" -d half >/dev/null 2>&1
  [ $? = 2 ] || bad="$bad all_reduce_device_perf(-d half not refused)"
  [ -z "$bad" ] || fail "refused:$bad"
  key "6 tools take -d -o -c; bad values refused"
}

# ---------------------------------------------------------------- device suites

# A device suite's gtest binary. A kernel that hangs gives up after
# WEFT_TIMEOUT without progress (default 600 s, beyond the step's limit):
# 30 s makes a hang one failed test with the kernel's reason, and the rest
# of the suite still runs. Tests that need another timeout set their own.
device_suite() { # binary [args...]
  need_exe "$1"
  WEFT_TIMEOUT="${WEFT_TIMEOUT:-30}" run_gtest "$@"
}

step_device() {
  device_suite "$B/tests/device/test_device" --gtest_filter="${WEFT_GPU_CHECK_DEVICE_FILTER:-*}"
}

# The small-message tests again with programmatic dependent launch off (the
# default has a launch of one channel overlap the stream's previous kernel;
# off, as on GPUs before compute capability 9.0, every kernel follows it):
# every collective at 1 element on 2 ranks (the pair kernel) and 1000 on 3,
# chained calls, two streams, graphs.
step_device_plain() {
  WEFT_DEVICE_PDL=0 device_suite "$B/tests/device/test_device" \
    --gtest_filter='*DeviceColl*_k2_n1_*:*DeviceColl*_k3_n1000_*:DevicePdl*:DeviceStreams*:DeviceGraph*'
}

# The tree all-reduce's kernels (the tuner runs them only where WEFT_ALGO
# leaves all-reduce the tree alone until their figures are measured):
# the device suite's all-reduce cases through them; the comms' INFO line
# of their tree channels shows that the tree ran.
step_device_tree() {
  WEFT_ALGO=allreduce:tree WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=INIT device_suite \
    "$B/tests/device/test_device" --gtest_filter='All/DeviceColl.EveryDatatypeAndOp/AllReduce_*'
  local rc=$? trees
  trees=$(grep -c 'device tree channels connected' "$LOGS/$STEP.gtest")
  key "$(cat "$LOGS/$STEP.key"); $trees ranks connected tree channels"
  [ "$trees" -gt 0 ] || fail "no rank connected tree channels: the ring ran"
  return $rc
}

# Mismatched calls on device memory: the kernels compare the signature in
# each link's first slot (docs/signature.md); DeviceMismatch asserts that
# every rank fails fast, one names the fields, and no canary changed.
step_device_mismatch() {
  device_suite "$B/tests/device/test_device" --gtest_filter='DeviceMismatch*'
}

# WEFT_DETERMINISTIC=1 on device memory: the device suite's
# DeviceDeterministic tests (2-5 ranks under every setting, float32 and
# bfloat16 bit for bit with the fixed order, every datatype and op), then
# the setting's cost: all_reduce_device_perf -g 2 and -g 4 at 64 KiB and
# 16 MiB without and with it, side by side (reported, not judged).
step_device_det() {
  device_suite "$B/tests/device/test_device" --gtest_filter='DeviceDeterministic*'
  local rc=$? k det costs="" suite
  suite=$(cat "$LOGS/$STEP.key")
  need_exe "$B/tools/all_reduce_device_perf"
  for k in 2 4; do
    for det in 0 1; do
      WEFT_DETERMINISTIC=$det "$B/tools/all_reduce_device_perf" -g "$k" -b 64K -e 16M -f 256 \
        -n 50 -w 10 >"$LOGS/$STEP.$k.$det.out" 2>&1 || {
        cat "$LOGS/$STEP.$k.$det.out"
        fail "$suite; all_reduce_device_perf -g $k with WEFT_DETERMINISTIC=$det failed"
      }
    done
    echo "# $k ranks: size(B) tuner(us) deterministic(us) wrong"
    proto_rows "$LOGS/$STEP.$k.0.out" "$LOGS/$STEP.$k.1.out" | tee "$LOGS/$STEP.$k.rows"
    costs+=$(awk -v k="$k" '{ printf "%s%d ranks %s B %.3gx", (NR > 1 ? ", " : "; "), k, $1, $3 / $2 }
                            END { if ($4 > 0) printf " (%d wrong)", $4 }' "$LOGS/$STEP.$k.rows")
  done
  key "$suite$costs"
  return $rc
}

step_device_sendrecv() { device_suite "$B/tests/device/test_device_sendrecv"; }

step_device_ipc() { device_suite "$B/tests/device/test_device_ipc"; }

step_device_ipc_mps() {
  use_mps
  step_device_ipc
}

step_zero_math_device() {
  need_exe "$B/tests/test_zero_math_device"
  "$B/tests/test_zero_math_device"
  local rc=$?
  [ $rc = 77 ] && skip "the test skipped (exit 77)"
  [ $rc = 0 ] || fail "exit $rc"
  key "bit for bit"
}

# Without MPS, ranks in processes sharing the GPU advance once per context
# switch (docs/cuda.md: 40 ms per all-reduce with 4 processes on an H100),
# and a ZeRO step makes a dozen collectives: the steps below run after
# mps_start and use its daemon when it is up; zero_mps_note says which.
zero_mps_note() {
  if [ -f "$WORK/mps/up" ]; then echo "MPS"; else echo "no MPS: slow, run mps_start first"; fi
}

# Every test binary named test_zero_device* under tests/ (issue 22's suites).
step_zero_device() {
  local t ran=0 bad=0 keys="" mps
  mps=$(zero_mps_note)
  [ -f "$WORK/mps/up" ] && use_mps
  for t in "$B"/tests/test_zero_device* "$B"/tests/zero/test_zero_device*; do
    [ -f "$t" ] && [ -x "$t" ] || continue
    ran=$((ran + 1))
    # a hung collective: an error after 30 s without progress, as device_suite
    STEP="zero_device.$(basename "$t")" WEFT_TIMEOUT="${WEFT_TIMEOUT:-30}" run_gtest "$t" ||
      bad=$((bad + 1))
    keys="$keys $(basename "$t"): $(cat "$LOGS/zero_device.$(basename "$t").key" 2>/dev/null);"
  done
  [ $ran -gt 0 ] || skip "no test_zero_device* in this build (issue 22)"
  key "$mps;$keys"
  [ $bad = 0 ]
}

# weft-train on the GPU against the same run on the host
# (tools/scripts/train-device-match.sh): the transformer's every loss within
# 1e-3, the MLP's final params-l2 within 1e-6 relative (the norm's sums
# differ in order, tanhf in its last bit); tokens/s of tiny and mid.
step_weft_train_device() {
  need_exe "$B/tools/weft-train"
  need_exe "$B/tools/weftrun"
  local mps cmp mlp tok mid ok
  mps=$(zero_mps_note)
  [ -f "$WORK/mps/up" ] && use_mps
  local gpt="$LOGS/train-match.$STEP.gpt"
  cmp=$(TRAIN_MATCH_LOGS="$LOGS" TRAIN_MATCH_TIMEOUT=90 "$ROOT/tools/scripts/train-device-match.sh" \
    "$B" "$STEP.gpt" 4 --zero-stage 3 --steps 20 --seq 64 --batch 8 --val-every 10 \
    --val-batches 1 --sample 32 --temperature 0)
  ok=$?
  echo "transformer: $cmp"
  grep -h -A2 '# sample' "$gpt.host" "$gpt.cuda"
  [ $ok = 0 ] || fail "transformer: $cmp (logs $(basename "$gpt").host, .cuda)"
  tok=$(awk '/ tokens\/s over steps/{sub(/^\[0\] # /, ""); print $1}' "$gpt.cuda")
  timeout 60 "$B/tools/weftrun" -n 4 "$B/tools/weft-train" --device cuda --model mid --zero-stage 3 \
    --steps 6 --val-every 0 --sample 0 >"$LOGS/$STEP.gpt_mid" 2>&1
  mid=$(awk '/ tokens\/s over steps/{sub(/^\[0\] # /, ""); print $1}' "$LOGS/$STEP.gpt_mid")
  mlp=$(TRAIN_MATCH_LOGS="$LOGS" TRAIN_MATCH_TIMEOUT=60 "$ROOT/tools/scripts/train-device-match.sh" \
    "$B" "$STEP.mlp" 4 --model mlp --zero-stage 3 --quiet) || fail "$mlp"
  # the optimizer offloaded to the host (ZeRO-Offload): the transformer in
  # bf16 against the host, and mid's tokens/s beside the run above
  local off midoff
  off=$(TRAIN_MATCH_LOGS="$LOGS" TRAIN_MATCH_TIMEOUT=60 TRAIN_MATCH_CUDA_OPTS=--offload-optimizer \
    "$ROOT/tools/scripts/train-device-match.sh" "$B" "$STEP.offload" 4 --zero-stage 3 --dtype bf16 \
    --steps 10 --seq 64 --batch 8 --val-every 5 --val-batches 1 --sample 0) || fail "offload: $off"
  timeout 60 "$B/tools/weftrun" -n 4 "$B/tools/weft-train" --device cuda --model mid --zero-stage 3 \
    --steps 6 --val-every 0 --sample 0 --offload-optimizer >"$LOGS/$STEP.gpt_mid_offload" 2>&1
  midoff=$(awk '/ tokens\/s over steps/{sub(/^\[0\] # /, ""); print $1}' "$LOGS/$STEP.gpt_mid_offload")
  key "$mps; $cmp; tokens/s on the GPU: tiny ${tok:-?}, mid ${mid:-?} (optimizer offloaded:" \
    "${midoff:-?}); $mlp; offloaded: $off; $(train_device_ms)"
}

# Issue 22.3's figure, reported and not judged here: ms per step of stages 0
# and 3 on the GPU, 4 ranks, default sizes (tools/train/train_ab.sh, the build
# against itself: two runs of 30 steps per stage, start-up left out).
train_device_ms() {
  ROUNDS=1 NRANKS=4 STAGES="0 3" STEPS=30 timeout 50 "$ROOT/tools/train/train_ab.sh" "$B" "$B/" \
    --device cuda >"$LOGS/$STEP.ms" 2>&1
  awk '/^stage [0-9]/ { n = 0; s = 0
         for (i = 1; i < NF; i++) if ($i == "median") { s += $(i + 1); n++ }
         ms[$2] = s / n }
       END { if (ms[0] > 0 && ms[3] > 0)
               printf "stage 3 %.3g / stage 0 %.3g ms per step = %.2f (bound 1.3)", ms[3], ms[0],
                      ms[3] / ms[0]
             else printf "no time per step (see %s.ms)", step }' step="$STEP" "$LOGS/$STEP.ms"
}

# ---------------------------------------------------------------- sanitizers

# memcheck: an all-reduce and an all-gather of 1000 elements x every datatype
# and op on 2 ranks, and the graph test; racecheck and synccheck, slower,
# the all-reduce alone.
SANITIZE_AR='All/DeviceColl.EveryDatatypeAndOp/AllReduce_k2_n1000_outofplace'
SANITIZE_FILTER="$SANITIZE_AR:All/DeviceColl.EveryDatatypeAndOp/AllGather_k2_n1000_inplace:DeviceGraph.*"

sanitize() { # tool filter
  local cs
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  [ -x "$cs" ] || skip "no compute-sanitizer"
  need_exe "$B/tests/device/test_device"
  "$cs" --tool "$1" --error-exitcode 9 \
    "$B/tests/device/test_device" --gtest_filter="$2" 2>&1 | tee "$LOGS/$STEP.out"
  local rc=${PIPESTATUS[0]}
  key "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY' "$LOGS/$STEP.out" |
    sed 's/^========= //'); $(gtest_key "$LOGS/$STEP.out")"
  [ $rc = 0 ] || fail "$(cat "$LOGS/$STEP.key") (exit $rc)"
}

step_memcheck() { sanitize memcheck "$SANITIZE_FILTER"; }
SANITIZE_TREE='All/DeviceColl.EveryDatatypeAndOp/AllReduce_k3_n1000_outofplace'
step_tree_memcheck() {
  WEFT_ALGO=allreduce:tree sanitize memcheck "$SANITIZE_TREE:All/DeviceColl.EveryDatatypeAndOp/AllReduce_k2_n1000_inplace"
}
step_tree_racecheck() { WEFT_ALGO=allreduce:tree sanitize racecheck "$SANITIZE_TREE"; }
step_racecheck() { sanitize racecheck "$SANITIZE_AR"; }
step_synccheck() { sanitize synccheck "$SANITIZE_AR"; }

# ---------------------------------------------------------------- perf

# all_reduce_device_perf's table: the 8 B time (and the host's enqueue time
# per call beside it), the 128 MiB busbw, and the GPU's memory traffic
# against twice the copy figure (docs/cuda.md).
# k processes under MPS each measure the copy while the others copy too:
# the GPU's copy figure is then k times rank 0's (copies = k)
ar_key() { # log nranks [copies]
  awk -v k="$2" -v copies="${3:-1}" '
    /device-to-device copy/ { copy = $(NF - 1) * copies }
    { sub(/^\[0\] */, "") }
    /^ *[0-9]+ +[0-9]+ / { if (!first) { first = 1; lat = $3; enq = $7 } last = $1; bw = $5; wrong += $6 }
    END {
      t = k * bw * (k / (k - 1) + 2)
      printf "8 B %.1f us (enqueue %.1f); %d MiB %.1f GB/s busbw, traffic %.0f%% of 2x copy (%.0f GB/s); %d wrong",
             lat, enq, last / 1048576, bw, copy ? 100 * t / (2 * copy) : 0, copy, wrong
    }' "$1"
}

# all_reduce_device_perf on k ranks: one process (-g k) or k processes under
# weftrun (mps); rows go to the log, the key line to $STEP.keys.
perf_ar() { # k g|mps
  local k="$1" launch=() args=()
  need_exe "$B/tools/all_reduce_device_perf"
  if [ "$2" = g ]; then args=(-g "$k"); else launch=("$B/tools/weftrun" -n "$k"); fi
  "${launch[@]}" "$B/tools/all_reduce_device_perf" "${args[@]}" -b 8 -e $MIB128 -f 4 -n 20 -w 5 \
    2>&1 | tee "$LOGS/$STEP.$k.out"
  local rc=${PIPESTATUS[0]}
  echo "$k: $(ar_key "$LOGS/$STEP.$k.out" "$k" "$([ "$2" = g ] && echo 1 || echo "$k")")" \
    >>"$LOGS/$STEP.keys"
  return "$rc"
}

step_perf_ar_g2() { perf_ar 2 g || fail "exit $?"; key "$(cut -d' ' -f2- "$LOGS/$STEP.keys")"; }
step_perf_ar_g4() { perf_ar 4 g || fail "exit $?"; key "$(cut -d' ' -f2- "$LOGS/$STEP.keys")"; }
step_perf_ar_g8() { perf_ar 8 g || fail "exit $?"; key "$(cut -d' ' -f2- "$LOGS/$STEP.keys")"; }

# The device tuner's model (collectives/tune/tuner.c, tuner_dev_cost) in
# figures: all_reduce_device_perf -g k, 8 B..4 MiB, once under
# WEFT_PROTO=simple and once under ll, side by side; the key gives each
# protocol's 8 B time and the first size from which SIMPLE is ahead. A
# floor first: one rank (each call a copy), the launch and timing alone.
proto_rows() { # simple.out ll.out: size, simple us, ll us, wrong
  awk 'FNR == 1 { f++ } { sub(/^\[0\] */, "") }
       /^ *[0-9]+ +[0-9]+ / { t[f, $1] = $3; w += $6; if (f == 1) s[++n] = $1 }
       END { for (i = 1; i <= n; i++) printf "%s %s %s %d\n", s[i], t[1, s[i]], t[2, s[i]], w }' "$1" "$2"
}
proto_cmp() { # k
  local k="$1" p
  for p in simple ll; do
    WEFT_PROTO=$p "$B/tools/all_reduce_device_perf" -g "$k" -b 8 -e 4M -f 2 -n 50 -w 10 \
      >"$LOGS/$STEP.$k.$p.out" 2>&1 || { cat "$LOGS/$STEP.$k.$p.out"; return 1; }
  done
  echo "# $k ranks: size(B) simple(us) ll(us)"
  proto_rows "$LOGS/$STEP.$k.simple.out" "$LOGS/$STEP.$k.ll.out" | tee "$LOGS/$STEP.$k.rows"
  awk -v k="$k" '{ if (NR == 1) { s8 = $2; l8 = $3 } if (!from && $2 < $3) from = $1; w = $4 }
    END { printf "%d ranks: 8 B simple %s us, ll %s us; simple ahead from %s B; %d wrong", k, s8,
                 l8, from ? from : "never", w; exit w > 0 }' "$LOGS/$STEP.$k.rows"
}
step_perf_proto() {
  need_exe "$B/tools/all_reduce_device_perf"
  "$B/tools/all_reduce_device_perf" -g 1 -b 8 -e 8 -n 50 -w 10 >"$LOGS/$STEP.floor.out" 2>&1 ||
    fail "one rank: $(tail -1 "$LOGS/$STEP.floor.out")"
  local floor keys bad=0 k
  floor=$(awk '/^ *[0-9]+ +[0-9]+ / { print $3 " us (enqueue " $7 ")"; exit }' "$LOGS/$STEP.floor.out")
  keys="floor (1 rank, a copy) $floor"
  for k in 2 4; do
    proto_cmp "$k" >"$LOGS/$STEP.$k.log" 2>&1 || bad=1
    cat "$LOGS/$STEP.$k.log"
    keys="$keys; $(tail -1 "$LOGS/$STEP.$k.log")"
  done
  key "$keys"
  [ $bad = 0 ] || fail "$keys"
}

# What each CUDA call on the device enqueue path costs the host, alone, and
# the GPU's time per back-to-back kernel, with an event after each and with
# programmatic dependent launch (tools/bench/launch_cost.cu, built here with
# nvcc): the figures to hold all_reduce_device_perf's enq(us) and time
# against. perf_launch_mps runs the same as an MPS client.
launch_cost() {
  command -v nvcc >/dev/null || skip "no nvcc"
  local exe="$WORK/launch_cost"
  local stubs="$(dirname "$(command -v nvcc)")/../lib64/stubs"
  [ -d "$stubs" ] || stubs=/usr/local/cuda/lib64/stubs
  [ "$exe" -nt "$ROOT/tools/bench/launch_cost.cu" ] ||
    nvcc -O2 -arch=native -o "$exe" "$ROOT/tools/bench/launch_cost.cu" -L"$stubs" -lcuda ||
    fail "nvcc launch_cost.cu failed"
  "$exe" 20000 | tee "$LOGS/$STEP.out"
  [ "${PIPESTATUS[0]}" = 0 ] || fail "launch_cost failed"
  key "$(awk -F'\t' '$1 ~ /64 B arg <<<1,512>>>|cudaGetKernel handle|weft.s calls|^ *cudaEventRecord *$|IsCapturing|Attributes device|D2D|GPU empty|GPU PDL/ {
      sub(/^ +/, "", $1); sub(/ +$/, "", $1); sub(/^ +/, "", $2); printf "%s%s %s", sep, $1, $2; sep = "; " }' \
      "$LOGS/$STEP.out") (us)"
}
step_perf_launch() { launch_cost; }
# As an MPS client, then two clients at once (host rows only), as two ranks
# sharing the GPU launch: what the launches of one cost while the other's go
step_perf_launch_mps() {
  use_mps
  launch_cost
  local exe="$WORK/launch_cost" one two k
  "$exe" 20000 host >"$LOGS/$STEP.pair0.out" 2>&1 &
  one=$!
  "$exe" 20000 host >"$LOGS/$STEP.pair1.out" 2>&1 &
  two=$!
  wait "$one" || fail "launch_cost, the first of two clients, failed"
  wait "$two" || fail "launch_cost, the second of two clients, failed"
  k="$(cat "$LOGS/$STEP.key"); two clients at once:"
  for f in "$LOGS/$STEP.pair0.out" "$LOGS/$STEP.pair1.out"; do
    k="$k $(awk -F'\t' '$1 ~ /64 B arg <<<1,512>>>|weft.s calls|^ *cudaEventRecord *$/ {
        sub(/^ +/, "", $2); printf "%s%s", sep, $2; sep = "/" }' "$f")"
  done
  key "$k (cudaLaunchKernel/cuLaunchKernel/weft's calls/cudaEventRecord, each client)"
}

# all_reduce_device_perf -g 4 and -g 2, 32 to 128 MiB, at each value of one
# variable: each run's 128 MiB busbw and traffic in the key
sweep_ar() { # variable label value...
  need_exe "$B/tools/all_reduce_device_perf"
  local var="$1" label="$2" k v out keys=""
  shift 2
  for k in 4 2; do
    for v in "$@"; do
      out="$LOGS/$STEP.$k.$v.out"
      env "$var=$v" "$B/tools/all_reduce_device_perf" -g "$k" -b 32M -e $MIB128 -f 4 -n 20 -w 5 \
        >"$out" 2>&1 || fail "-g $k, $var=$v: $(tail -1 "$out")"
      keys="$keys${keys:+; }$k ranks $label $v: $(ar_key "$out" "$k" | sed 's/^8 B [^;]*; //')"
    done
  done
  key "$keys"
}

# Device channels against 128 MiB busbw (issue 20.3's 4-rank traffic): a set
# count may use the SMs' occupancy (docs/cuda.md).
step_perf_channels() { sweep_ar WEFT_DEVICE_NCHANNELS ch 32 48 64; }

# The loops a ring channel runs together: 1 puts every hand-over between
# ranks on the critical path, 2 (the default) and 3 overlap it.
step_perf_interleave() { sweep_ar WEFT_DEVICE_RING_INTERLEAVE il 1 2 3; }

step_mps_start() {
  command -v nvidia-cuda-mps-control >/dev/null || skip "no nvidia-cuda-mps-control"
  mkdir -p "$WORK/mps/pipe" "$WORK/mps/log"
  export CUDA_MPS_PIPE_DIRECTORY="$WORK/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$WORK/mps/log"
  nvidia-cuda-mps-control -d || fail "nvidia-cuda-mps-control -d failed"
  touch "$WORK/mps/up"
  sleep 1
  # two clients that cannot reach the server fail here rather than in every later step
  need_exe "$B/tools/all_reduce_device_perf"
  if ! timeout 20 "$B/tools/weftrun" -n 2 "$B/tools/all_reduce_device_perf" -b 8 -e 8 -n 1 -w 0; then
    cat "$WORK/mps/log/"*.log 2>/dev/null | tail -20
    mps_stop
    fail "a CUDA program under MPS failed"
  fi
  key "daemon up, pipe in ${WORK#"$ROOT"/}/mps"
}

step_mps_stop() {
  [ -f "$WORK/mps/up" ] || skip "MPS was not started"
  mps_stop
  key "daemon stopped"
}

# 20 calls a size leave a few microseconds of the processes' start in each
# small call's time: the latency over 2000 calls (after 500), 8 B
perf_ar_latency() { # k [tag of the log [all_reduce_device_perf's flags, for -n 2000]]
  local out="$LOGS/$STEP.lat.$1${2:+.$2}.out" k="$1"
  shift $(($# < 2 ? $# : 2))
  [ $# -gt 0 ] || set -- -n 2000
  "$B/tools/weftrun" -n "$k" "$B/tools/all_reduce_device_perf" -b 8 -e 8 -w 500 "$@" \
    >"$out" 2>&1 || return 1
  awk '{ sub(/^\[0\] */, "") } /^ *8 +2 / { printf "%.2f us (enqueue %.2f)", $3, $7 }' "$out"
}

# Programmatic dependent launch (WEFT_DEVICE_PDL) against none: the 8 B
# latency over 2000 calls of 2 and 4 processes under MPS, alternating.
step_perf_pdl() {
  use_mps
  need_exe "$B/tools/all_reduce_device_perf"
  local k pdl lat keys=""
  for k in 2 4; do
    for pdl in 0 1 0 1; do
      lat=$(WEFT_DEVICE_PDL=$pdl perf_ar_latency "$k" "pdl$pdl") ||
        fail "$k processes, WEFT_DEVICE_PDL=$pdl"
      [ -n "$lat" ] || fail "$k processes, WEFT_DEVICE_PDL=$pdl: no 8 B row"
      keys="$keys${keys:+; }$k pdl $pdl: ${lat%% (*}"
    done
  done
  key "$keys"
}

# The tree all-reduce on 3 to 8 processes sharing the GPU: every datatype
# and op at 1 B to 1 MiB at every rank count, LL forced at 3, 6 and 7 and
# SIMPLE at 4, 5 and 8 (the tuner would pick LL for all of these sizes); the
# key: rows and wrong values per rank count.
step_tree_types() {
  use_mps
  need_exe "$B/tools/all_reduce_perf"
  local k proto out keys="" bad=0
  # every datatype and op at every rank count, each protocol at three of
  # them (odd and even counts both): half the runs of every pair
  for k in 3 4 5 6 7 8; do
    case $k in 3 | 6 | 7) proto=ll ;; *) proto=simple ;; esac
    out="$LOGS/$STEP.$k.$proto.out"
    WEFT_ALGO=allreduce:tree WEFT_PROTO=$proto timeout 60 "$B/tools/weftrun" -n $k \
      "$B/tools/all_reduce_perf" -M $PERF_MEM -T 30 -b 1 -e 1M -f 32 -d all -o all -n 1 -w 0 \
      >"$out" 2>&1 || bad=1
    coll_key "$out" >/dev/null || bad=1
    keys="$keys$k $proto: $(coll_key "$out" | cut -d, -f1-2); "
  done
  key "${keys%; }"
  [ $bad = 0 ] || fail "${keys%; }"
}

# 8 B all-reduce latency, tree against ring, 4 and 8 processes under MPS,
# alternating: the tree as small calls take it (WEFT_TREE_SMALL_BYTES: three
# children a node) and the double binary tree (dtree: WEFT_TREE_SMALL_BYTES=0);
# then 8 processes with the calls in CUDA graphs (100 calls a graph,
# launched 20 times: the kernels' time without the host's launch of each);
# reported with the ratios to the ring (goal: at most 0.5 at 8 ranks), not
# judged: the figures go to tuner_dev_tree_cost (tuner.c).
step_perf_tree() {
  use_mps
  need_exe "$B/tools/all_reduce_device_perf"
  local k algo lat keys="" ring tree dtree small
  ratio() { awk -v t="$1" -v r="$2" 'BEGIN { printf "%.2f", t / r }'; }
  for k in 4 8; do
    for algo in ring tree dtree ring tree dtree; do
      small=4K
      [ $algo = dtree ] && small=0
      lat=$(WEFT_ALGO=allreduce:${algo#d} WEFT_TREE_SMALL_BYTES=$small \
        perf_ar_latency "$k" "$algo") || fail "$k processes, $algo"
      [ -n "$lat" ] || fail "$k processes, $algo: no 8 B row"
      eval "$algo=\${lat%% *}"
    done
    keys="$keys${keys:+; }$k: tree $tree us ($(ratio "$tree" "$ring")),"
    keys="$keys dtree $dtree us ($(ratio "$dtree" "$ring")), ring $ring us"
  done
  # the graphs' figures join the key whatever becomes of them, so that the
  # launched ones above are never lost
  local bad=0
  for algo in ring tree; do
    lat=$(WEFT_ALGO=allreduce:$algo perf_ar_latency 8 "$algo.graph" -n 100 -G 20) || lat=""
    [ -n "$lat" ] || { bad=1; lat="failed"; }
    eval "$algo=\${lat%% *}"
  done
  keys="$keys; 8 in CUDA graphs: tree $tree us, ring $ring us$(
    [ $bad = 0 ] && awk -v t="$tree" -v r="$ring" 'BEGIN { printf " (%.2f)", t / r }')"
  key "$keys"
  [ $bad = 0 ] || fail "$keys"
}

step_perf_ar_mps() {
  use_mps
  local bad=0 k lat
  perf_ar 2 mps || bad=1
  perf_ar 4 mps || bad=1
  for k in 2 4; do
    lat=$(perf_ar_latency "$k") || { bad=1; lat="failed"; }
    [ -n "$lat" ] || { bad=1; lat="no 8 B row"; }
    echo "$k: 8 B over 2000 calls $lat" >>"$LOGS/$STEP.keys"
    # the same calls captured into a CUDA graph of 100, launched 20 times:
    # the kernels' time without the host's launch of each
    lat=$(perf_ar_latency "$k" graph -n 100 -G 20) || { bad=1; lat="failed"; }
    [ -n "$lat" ] || { bad=1; lat="no 8 B row"; }
    echo "$k: in CUDA graphs $lat" >>"$LOGS/$STEP.keys"
  done
  key "$(paste -sd";" "$LOGS/$STEP.keys" | sed "s/;/; /g")"
  [ $bad = 0 ] || fail "$(cat "$LOGS/$STEP.key")"
}

# NCCL's own libnccl.so.2 beside weft's, one NCCL-API binary
# (tools/perf/nccl_api_perf, which starts its ranks itself) run through
# each in turn: NCCL's from the site-packages of the Python with torch
# (nvidia-nccl-*), several ranks on the one GPU with
# NCCL_MULTI_RANK_GPU_ENABLE=1 (NCCL 2.30 and later). The key: NCCL's
# version, then per rank count (processes under MPS, as the other
# multi-process steps) the 8 B time and the 64 MiB busbw of each,
# and the 8 B time of 100 calls in a CUDA graph launched 20 times (2 ranks).
nccl_lib_dir() {
  "$PY" - <<'PY'
import glob, os, site, sys
for root in site.getsitepackages() + [site.getusersitepackages()]:
    for lib in sorted(glob.glob(os.path.join(root, "nvidia", "**", "libnccl.so.2"), recursive=True)):
        print(os.path.dirname(lib))
        sys.exit(0)
sys.exit(1)
PY
}

vs_nccl_run() { # nccl|weft out args...
  local lib="$1" out="$2"
  shift 2
  if [ "$lib" = nccl ]; then
    LD_LIBRARY_PATH="$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_MULTI_RANK_GPU_ENABLE=1       timeout 90 "$B/tools/nccl_api_perf" -T 80 "$@" >"$out" 2>&1
  else
    timeout 90 "$B/tools/nccl_api_perf" -T 80 "$@" >"$out" 2>&1
  fi
}

# first row's time, last row's busbw, wrong values of a nccl_api_perf log
vs_nccl_row() {
  awk '/^ +[0-9]+ +[0-9]+ / { if (!n++) lat = $5; bw = $7; w += $8 }
       END { printf "%s us %s GB/s %d wrong", lat, bw, w }' "$1"
}

step_perf_vs_nccl() {
  need_exe "$B/tools/nccl_api_perf"
  NCCL_DIR=$(nccl_lib_dir) || skip "no libnccl.so.2 under $PY's site-packages (nvidia-nccl-*)"
  use_mps
  local ver k lib out keys="" bad=0 libs="nccl weft nccl weft" graph_libs="nccl weft" refused=""
  ver=$("$PY" -c "import torch; print('.'.join(map(str, torch.cuda.nccl.version())))" 2>/dev/null)
  if vs_nccl_run nccl "$LOGS/$STEP.probe.out" -n 2 -b 8 -e 8; then
    grep -q "library: $NCCL_DIR" "$LOGS/$STEP.probe.out" || fail "the NCCL run did not load $NCCL_DIR"
  else
    # an NCCL before 2.30 refuses ranks sharing a GPU: weft's side alone,
    # the graph-replayed 8 B figure included, and the NCCL named
    refused="NCCL ${ver:-?} ($NCCL_DIR) refuses 2 ranks on one GPU: $(grep -m1 -iE 'error|fail' "$LOGS/$STEP.probe.out" | cut -c1-80)"
    libs="weft" graph_libs="weft"
  fi
  for k in 2 4 8; do
    for lib in $libs; do
      out="$LOGS/$STEP.$k.$lib.out"
      vs_nccl_run "$lib" "$out" -n "$k" -b 8 -e 64M -f 8 -i 20 -w 5 || bad=1
      cat "$out"
    done
    if [ -z "$refused" ]; then
      keys="$keys${keys:+; }$k: nccl $(vs_nccl_row "$LOGS/$STEP.$k.nccl.out"), weft $(vs_nccl_row "$LOGS/$STEP.$k.weft.out")"
    else
      keys="$keys${keys:+; }$k: weft $(vs_nccl_row "$LOGS/$STEP.$k.weft.out")"
    fi
  done
  for lib in $graph_libs; do
    out="$LOGS/$STEP.graph.$lib.out"
    vs_nccl_run "$lib" "$out" -n 2 -b 8 -e 8 -i 100 -w 10 -G 20 || bad=1
    cat "$out"
    keys="$keys; graph 2 $lib: $(vs_nccl_row "$out" | cut -d' ' -f1-2)"
  done
  key "${refused:-NCCL ${ver:-?}} under MPS; $keys"
  grep -qE ' [1-9][0-9]* wrong' "$LOGS/$STEP.key" && bad=1
  [ $bad = 0 ] || fail "$(cat "$LOGS/$STEP.key")"
}

# A perf tool's table under weftrun: rows, rows with wrong values, and the
# first row's time and the last row's busbw (out of place).
coll_key() { awk -f "$ROOT/tools/scripts/perf-verdict.awk" "$1"; } # log

# One perf tool on device memory, k processes under MPS for each k given.
perf_coll() { # tool ranks...
  local tool="$1" k keys="" bad=0 out
  shift
  use_mps
  need_exe "$B/tools/${tool}_perf"
  for k in "$@"; do
    out="$LOGS/$STEP.$k.out"
    timeout 35 "$B/tools/weftrun" -n "$k" "$B/tools/${tool}_perf" -M $PERF_MEM -T 20 \
      -b 8 -e $PERF_MAX -f 16 -n 10 -w 2 "${PERF_ARGS[@]}" >"$out" 2>&1 || bad=1
    cat "$out"
    keys="$keys$k: $(coll_key "$out"); "
    coll_key "$out" >/dev/null || bad=1
  done
  key "${keys%; }"
  [ $bad = 0 ] || fail "${keys%; }"
}

PERF_ARGS=()
step_perf_all_gather() { perf_coll all_gather 2 4 8; }
step_perf_reduce_scatter() { perf_coll reduce_scatter 2 4 8; }
step_perf_sendrecv() { perf_coll sendrecv 2 4 8; }
step_perf_alltoall() { perf_coll alltoall 2 4 8; }

# Device send/recv bandwidth against the lanes per peer (WEFT_P2P_LANES, the
# same on every rank): sendrecv_perf, 2 processes under MPS, 1 MiB to
# 128 MiB, and alltoall_perf with 4, for each lane count; the key gives the
# largest size's busbw of each, so that the default can be chosen by it.
step_perf_sendrecv_lanes() {
  use_mps
  need_exe "$B/tools/sendrecv_perf"
  local lanes tool k keys="" bad=0 out
  for lanes in 1 2 4 8; do
    for tool in sendrecv alltoall; do
      k=$([ $tool = sendrecv ] && echo 2 || echo 4)
      out="$LOGS/$STEP.$tool.$lanes.out"
      WEFT_P2P_LANES=$lanes timeout 30 "$B/tools/weftrun" -n $k "$B/tools/${tool}_perf" \
        -M $PERF_MEM -T 20 -b 1M -e $PERF_MAX -f 8 -n 10 -w 2 >"$out" 2>&1 || bad=1
      cat "$out"
      coll_key "$out" >/dev/null || bad=1
      keys="$keys$tool/$k $lanes lanes: $(coll_key "$out" | sed 's/.*, //'); "
    done
  done
  key "${keys%; }"
  [ $bad = 0 ] || fail "${keys%; }"
}

step_perf_types() {
  use_mps
  need_exe "$B/tools/all_reduce_perf"
  local out="$LOGS/$STEP.3.out"
  timeout 110 "$B/tools/weftrun" -n 3 "$B/tools/all_reduce_perf" -M $PERF_MEM -T 30 \
    -b 1 -e 100K -f 7 -d all -o all -n 1 -w 0 >"$out" 2>&1
  local rc=$?
  cat "$out"
  key "$(coll_key "$out")"
  [ $rc = 0 ] && coll_key "$out" >/dev/null || fail "exit $rc; $(cat "$LOGS/$STEP.key")"
}

# ---------------------------------------------------------------- emulated hosts

# Ranks on the one GPU, each its own emulated host (WEFT_HOSTID), so no
# cuda_ipc between them: the device path must cross over the network. Every
# collective and send/recv/all-to-all on 2 ranks, all-reduce on 3 too (a ring
# with a hop that is not the pair's); the key: all-reduce's figures, then the
# other tools' rows and wrong values.
NET_TOOLS='all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall gather scatter'
net_hosts() { # transport
  use_mps
  local tool k keys="" bad=0 out rows=0 wrong=0 failed=""
  for tool in $NET_TOOLS; do
    for k in 2 3; do
      [ $k = 3 ] && [ $tool != all_reduce ] && continue
      out="$LOGS/$STEP.$tool.$k.out"
      WEFT_TRANSPORT="$1" timeout 55 "$B/tools/weftrun" -n $k sh -c \
        'WEFT_HOSTID=gpu-check-host-$WEFT_RANK exec "$@"' sh "$B/tools/${tool}_perf" \
        -M $PERF_MEM -T 20 -b 8 -e $((PERF_MAX / 8)) -f 16 -n 5 -w 1 >"$out" 2>&1 || bad=1
      cat "$out"
      coll_key "$out" >/dev/null || { bad=1; failed="$failed $tool/$k"; }
      if [ $tool = all_reduce ]; then
        keys="${keys}all_reduce $k ranks: $(coll_key "$out"; grep -m1 -o 'no device transport[^;]*' "$out" | cut -c1-60); "
      else
        rows=$((rows + $(coll_key "$out" | awk '{print $1}')))
        wrong=$((wrong + $(coll_key "$out" | awk '{print $3}')))
      fi
    done
  done
  keys="${keys}8 other tools: $rows rows, $wrong wrong${failed:+; failed:$failed}"
  key "$keys"
  [ $bad = 0 ] || fail "$keys"
}

step_net_socket() { net_hosts socket; }

# Where a small device all-reduce between 2 emulated hosts spends its time
# over UCX: 8 B to 32 KiB, device memory with UCX's own choice of transports
# and with UCX_TLS=tcp, and host memory, each under MPS; the key gives each
# one's 8 B time. The NET log of each process (its proxy's passes and sleeps
# at the end) goes to $STEP.VARIANT.PID.net.
step_net_ucx_diag() {
  grep -q 'WEFT_HAVE_UCX 1' "$B/weft_build_config.h" 2>/dev/null || skip "built without UCX"
  use_mps
  local v out keys="" mem tls bad=0
  for v in dev dev-tcp host; do
    mem=$([ $v = host ] && echo host || echo "$PERF_MEM")
    tls=$([ $v = dev-tcp ] && echo tcp || echo "")
    out="$LOGS/$STEP.$v.out"
    UCX_TLS=$tls WEFT_TRANSPORT=ucx WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=NET \
      WEFT_DEBUG_FILE="$LOGS/$STEP.$v.%p.net" timeout 18 "$B/tools/weftrun" -n 2 sh -c \
      '[ -n "$UCX_TLS" ] || unset UCX_TLS; WEFT_HOSTID=gpu-check-host-$WEFT_RANK exec "$@"' sh \
      "$B/tools/all_reduce_perf" -M "$mem" -T 15 -b 8 -e 32K -f 64 -n 5 -w 1 >"$out" 2>&1 ||
      bad=1
    coll_key "$out" >/dev/null || bad=1
    keys="$keys${keys:+; }$v: $(coll_key "$out" | sed 's/, 32 KiB.*//')"
    key "$keys" # so far, should a later run outlast the step
  done
  [ $bad = 0 ] || fail "$keys"
}

# Issue 21.4: device all-reduce between 2 emulated hosts over loopback TCP
# (sockets), against host memory over the same transport in the same run:
# out-of-place busbw of each from 16 MiB (PERF_MAX / 8) to 64 MiB, and the
# smallest device / host ratio. Reported against the 90 % bound, not judged.
step_net_bw() {
  use_mps
  local mem out lo=$((PERF_MAX / 8)) hi=$((PERF_MAX / 2))
  for mem in dev host; do
    out="$LOGS/$STEP.$mem.out"
    WEFT_TRANSPORT=socket timeout 40 "$B/tools/weftrun" -n 2 sh -c \
      'WEFT_HOSTID=gpu-check-host-$WEFT_RANK exec "$@"' sh "$B/tools/all_reduce_perf" \
      -M "$([ $mem = dev ] && echo $PERF_MEM || echo host)" -T 30 -b $lo -e $hi -f 2 -n 10 -w 2 \
      >"$out" 2>&1
    local rc=$?
    cat "$out"
    [ $rc = 0 ] && coll_key "$out" >/dev/null || fail "$mem: exit $rc; $(coll_key "$out")"
  done
  key "$(awk 'function size(b) { return sprintf("%g MiB", b / 1048576) }
    { sub(/^\[0\] */, "") }
    /^ *[0-9]+ +[0-9]+ / { if (FILENAME ~ /dev.out$/) d[$1] = $8; else h[$1] = $8 }
    END { min = -1
      for (b in d) if (h[b] > 0) { r = d[b] / h[b]; if (min < 0 || r < min) { min = r; at = b } }
      if (min < 0) { print "no rows to compare"; exit }
      printf "busbw device/host, socket, 2 hosts: lowest %.0f%% at %s (%.2f / %.2f GB/s); 21.4 asks >= 90%%",
             100 * min, size(at), d[at], h[at] }' "$LOGS/$STEP.dev.out" "$LOGS/$STEP.host.out")"
}
step_net_ucx() {
  grep -q 'WEFT_HAVE_UCX 1' "$B/weft_build_config.h" 2>/dev/null ||
    skip "built without UCX (none on the machine, none carried: gpu-check.sh --prepare)"
  local ucp
  ucp=$(ldd "$B/libweft.so" | awk '$1 ~ /^libucp/ {print $3}')
  net_hosts ucx
  key "$(cat "$LOGS/$STEP.key"); UCX ${GPU_CHECK_UCX_FROM:-?}: $ucp"
}

# ---------------------------------------------------------------- PyTorch

torch_has() { # python expression that must be true
  "$PY" -c "import sys, torch; sys.exit(0 if ($1) else 1)" 2>/dev/null
}

# The extension's build, on its own: step torch_weft runs it, or waits for
# the run gpu-check.sh started in the background after step build.
step_torch_weft_build() {
  torch_has True || skip "no torch in $PY"
  local pyinc
  pyinc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  [ -f "$pyinc/Python.h" ] || skip "no $pyinc/Python.h to build the extension against"
  "$PY" "$ROOT/tools/torch_weft/build.py" --weft-build "$B" || fail "build.py failed"
}

step_torch_weft() {
  local bg="$WORK/torch_weft_build" rc
  if [ -f "$bg.pid" ]; then
    echo "torch_weft: the build started in the background (log: torch_weft_build.log)"
    while [ ! -f "$bg.rc" ] && kill -0 "$(cat "$bg.pid")" 2>/dev/null; do sleep 1; done
    rc=$(cat "$bg.rc" 2>/dev/null || echo gone)
    cat "$LOGS/torch_weft_build.log" 2>/dev/null
    case $rc in
      0) ;;
      77) skip "$(cat "$LOGS/torch_weft_build.key" 2>/dev/null)" ;;
      *) fail "build.py failed in the background (exit $rc)" ;;
    esac
  else
    (step_torch_weft_build)
    rc=$?
    [ $rc = 0 ] || exit $rc
  fi
  OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 "$PY" -m torch.distributed.run --standalone \
    --nproc-per-node 2 "$ROOT/tests/torch/check_ops.py" 2>&1 | tee "$LOGS/$STEP.out"
  rc=${PIPESTATUS[0]}
  key "torch $("$PY" -c 'import torch; print(torch.__version__)'); $(grep -m1 -iE 'checks|passed|fail' "$LOGS/$STEP.out" | cut -c1-60)"
  [ $rc = 0 ] || fail "$(cat "$LOGS/$STEP.key")"
}

step_torch_preload() {
  torch_has 'torch.cuda.is_available()' || skip "torch without CUDA in $PY"
  bash "$ROOT/tests/nccl/test_torch_preload.sh" "$B/libnccl.so.2" "$PY"
  local rc=$?
  [ $rc = 77 ] && skip "test_torch_preload.sh skipped"
  [ $rc = 0 ] || fail "exit $rc"
  key "torch sees weft's NCCL"
}

torch_cuda_run() { # script args...
  torch_has 'torch.cuda.is_available()' || skip "torch without CUDA in $PY"
  [ -f "$WORK/mps/up" ] && use_mps
  LD_PRELOAD="$B/libnccl.so.2" OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 NCCL_DEBUG=WARN \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 "$@" 2>&1 |
    tee "$LOGS/$STEP.out"
  return "${PIPESTATUS[0]}"
}

step_torch_ddp() {
  torch_cuda_run "$ROOT/tests/nccl/ddp_loss.py"
  local rc=$?
  key "$(grep -m1 -iE 'largest|differ' "$LOGS/$STEP.out" | cut -c1-70)"
  [ $rc = 0 ] || fail "exit $rc; $(cat "$LOGS/$STEP.key")"
}

# torch_weft's own backend on CUDA tensors (built by step torch_weft), no
# preload: DDP against one process; all_to_all_single, batch_isend_irecv
# and FSDP2 with a divide factor; then check_api on cuda:0 (coalesced and
# one-rank PREMUL_SUM, a failed coalesced block, groups under a bound device,
# side streams, an empty tensor).
# Skips unless torch has CUDA and tools/torch_weft was built with it.
need_torch_weft_cuda() {
  torch_has 'torch.cuda.is_available()' || skip "torch without CUDA in $PY"
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/tools/torch_weft'); import torch_weft; \
sys.exit(0 if torch_weft._C.cuda_built() else 1)" 2>/dev/null ||
    skip "torch_weft not built, or built without CUDA (step torch_weft builds it)"
}

step_torch_weft_cuda() {
  need_torch_weft_cuda
  [ -f "$WORK/mps/up" ] && use_mps
  local rc=0 script
  for script in "nccl/ddp_loss.py --backend weft" "nccl/torch_cuda_ops.py --backend weft" \
    "torch/check_api.py --device cuda"; do
    # shellcheck disable=SC2086 # the script and its arguments
    OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 "$PY" -m torch.distributed.run --standalone \
      --nproc-per-node 2 "$ROOT/tests/"$script 2>&1 |
      tee -a "$LOGS/$STEP.out"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
  key "$(grep -m1 -iE 'largest|differ' "$LOGS/$STEP.out" | cut -c1-40); $(grep -m1 -oE 'check_api: .*failures' "$LOGS/$STEP.out" | cut -c12-); $(grep -c '^ok ' "$LOGS/$STEP.out") ok, $(grep -cE '^FAIL |: FAIL ' "$LOGS/$STEP.out") FAIL"
  [ $rc = 0 ] || fail "$(cat "$LOGS/$STEP.key")"
}

# The overlap the communication streams give (docs/pytorch.md, CUDA streams):
# DDP step time of tests/torch/bench_ddp_streams.py, 2 ranks sharing cuda:0
# (under MPS when its daemon is up), with the group's communication stream
# and with every collective on the compute stream (TORCH_WEFT_COMM_STREAM=0),
# alternated twice; the key gives both medians and their ratio (goal: the
# communication stream no slower; reported, not judged).
step_torch_weft_streams() {
  need_torch_weft_cuda
  [ -f "$WORK/mps/up" ] && use_mps
  local rc=0 round mode
  for round in 1 2; do
    for mode in 1 0; do
      TORCH_WEFT_COMM_STREAM=$mode OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 timeout 90 \
        "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
        "$ROOT/tests/torch/bench_ddp_streams.py" 2>&1 | tee -a "$LOGS/$STEP.out"
      [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    done
  done
  local comm compute
  comm=$(awk '/^ddp_streams comm_stream=1/ {sub("step_ms=", "", $4); print $4}' "$LOGS/$STEP.out" | sort -n | head -1)
  compute=$(awk '/^ddp_streams comm_stream=0/ {sub("step_ms=", "", $4); print $4}' "$LOGS/$STEP.out" | sort -n | head -1)
  key "DDP step ms, best of 2: comm stream ${comm:-?}, compute stream ${compute:-?}$(
    [ -n "$comm" ] && [ -n "$compute" ] && awk -v a="$comm" -v b="$compute" 'BEGIN {printf ", ratio %.3f", a / b}')"
  [ $rc = 0 ] || fail "$(cat "$LOGS/$STEP.key")"
}

# A rank SIGKILLed in the middle of DDP on CUDA tensors (the weft backend):
# the other raises DistBackendError naming it within the timeout. Without
# MPS: a client killed with kernels in flight can leave the daemon refusing
# the next clients.
step_torch_dead_peer_cuda() {
  need_torch_weft_cuda
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 "$PY" "$ROOT/tests/torch/check_dead_peer.py" 2 \
    --device cuda 2>&1 | tee "$LOGS/$STEP.out"
  local rc=${PIPESTATUS[0]}
  key "$(grep -m1 -oE 'rank 0: [a-zA-Z]+: [^:]*' "$LOGS/$STEP.out"); $(grep -m1 -oE 'exit codes [^;]*' "$LOGS/$STEP.out")"
  [ "$rc" = 0 ] || fail "$(cat "$LOGS/$STEP.key")"
}

# The watchdog's default on CUDA tensors (the weft backend): a rank SIGKILLed
# in the middle of DDP; every survivor is ended by its watchdog within the
# timeout plus 5 s, with a message naming the group, the rank, the operation
# and its sequence number, and leaves a flight-recorder dump in which
# PyTorch's analyzer names the dead rank. Without MPS, as the dead-peer check.
step_torch_watchdog_cuda() {
  need_torch_weft_cuda
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 "$PY" "$ROOT/tests/torch/check_dead_peer.py" 2 \
    --device cuda --watchdog 2>&1 | tee "$LOGS/$STEP.out"
  local rc=${PIPESTATUS[0]}
  key "$(grep -m1 -oE '^rank 0: (ok|FAIL): exit code [^,]*, [0-9.]+ s' "$LOGS/$STEP.out"); $(grep -m1 -oE '^flight recorder: (ok|FAIL): [^(]*\(exit [0-9]+\) names [^,]*' "$LOGS/$STEP.out")"
  [ "$rc" = 0 ] || fail "$(cat "$LOGS/$STEP.key")"
}

step_torch_cuda_ops() {
  [ -f "$ROOT/tests/nccl/torch_cuda_ops.py" ] || skip "no tests/nccl/torch_cuda_ops.py"
  torch_cuda_run "$ROOT/tests/nccl/torch_cuda_ops.py"
  local rc=$?
  key "$(grep -c '^ok ' "$LOGS/$STEP.out") ok, $(grep -c '^FAIL ' "$LOGS/$STEP.out") FAIL$(grep -m1 '^FAIL ' "$LOGS/$STEP.out" | cut -c5-60 | sed 's/^/: /')"
  [ $rc = 0 ] || fail "exit $rc; $(cat "$LOGS/$STEP.key")"
}
