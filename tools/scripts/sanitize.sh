#!/usr/bin/env bash
# Sanitizer runs (CI runs this after tools/scripts/test.sh; see docs/sanitizers.md):
#  1. AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/): a seeded
#     sample of the GoogleTest suites (every WEFT_SANITIZE_SUITES-th suite,
#     and of those one shard of WEFT_SANITIZE_SHARDS, both chosen by the
#     seed; only those suites are built), then every fuzz target for
#     WEFT_FUZZ_SECONDS.
#  2. ThreadSanitizer (build-tsan/): the suites where threads share weft's
#     state (several ranks in one process, groups over several comms, host
#     streams, abort from another thread).
# Usage: tools/scripts/sanitize.sh [asan|tsan]...   (default: both)
# Environment: WEFT_SANITIZE_SEED (default: the time; printed, so a run can
# be repeated), WEFT_SANITIZE_SUITES (default 3; 1 takes every suite),
# WEFT_SANITIZE_SHARDS (default 2; 1 runs every test of the suites taken),
# WEFT_FUZZ_SECONDS (default 10 per target).
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/scripts/setup.sh # the packages the plain build needs (gcc brings the sanitizers)

seed="${WEFT_SANITIZE_SEED:-$(date +%s)}"
suite_groups="${WEFT_SANITIZE_SUITES:-3}"
shards="${WEFT_SANITIZE_SHARDS:-2}"
suite_group=$((seed % suite_groups))
shard=$((seed / suite_groups % shards))
fuzz_s="${WEFT_FUZZ_SECONDS:-10}"
jobs="${WEFT_SANITIZE_JOBS:-2}"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(asan tsan)
supp="$PWD/tools/scripts/sanitize"
common=(-Dcuda=disabled -Dnccl=false -Dbuildtype=debugoptimized -Doptimization=1 -Db_lundef=false)
# UBSan's nonnull-attribute check is off: the suites pass an empty vector's
# data() (NULL) with a length of 0 to memcpy/memcmp in their count-0 cases,
# which C2y defines (N3322) and glibc handles; every other UBSan check is on.
asan_flags=(-Db_sanitize=address,undefined -Dc_args=-fno-sanitize=nonnull-attribute
            -Dcpp_args=-fno-sanitize=nonnull-attribute)

# Configures dir with the options given, or brings an existing one to them.
configure() { # dir options...
  local dir="$1"
  shift
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
}

# Every report fails the run; UCX's memory hooks are off under the
# sanitizers' own allocators (they intercept the same calls).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0:allocator_may_return_null=1:handle_segv=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$supp/tsan.supp:report_signal_unsafe=0"
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no

stamp() { date +%s; }
t_start=$(stamp)

# The executables the given meson tests run (protocol gtest, or suite fuzz),
# and their names; of the GoogleTest suites, those in the given group (by
# name order, every groups-th from group).
test_targets() { # build_dir kind groups group
  meson introspect --tests "$1" | python3 -c '
import json, os, sys
build, kind = os.path.abspath(sys.argv[1]), sys.argv[2]
groups, group = int(sys.argv[3]), int(sys.argv[4])
def kind_of(t):
    if any(s.endswith(":fuzz") for s in t["suite"]):
        return "fuzz"
    # the kill test (a minute of forked jobs) runs in the plain suite only;
    # in the multihost suite, the helper that takes a link down (system() in a
    # forked child) reports failure under ASan although the link goes down
    if t["protocol"] == "gtest" and t["name"] not in ("kill", "multihost"):
        return "gtest"
    return None
tests = sorted((t for t in json.load(sys.stdin) if kind_of(t) == kind), key=lambda t: t["name"])
tests = tests[group::groups]
names = [t["name"] for t in tests]
exes = {os.path.relpath(t["cmd"][0], build) for t in tests}
print(" ".join(sorted(exes)))
print(" ".join(names))' "$@"
}

run_asan() {
  echo "sanitize: ASan+UBSan, seed $seed: suite group $suite_group of $suite_groups (by name)," \
       "shard $shard of $shards of each (WEFT_SANITIZE_SEED=$seed repeats it)," \
       "fuzzing ${fuzz_s} s per target"
  configure build-asan "${common[@]}" "${asan_flags[@]}" "-Dfuzz_seconds=$fuzz_s"
  local exes names fexes fnames
  { read -r exes; read -r names; } < <(test_targets build-asan gtest "$suite_groups" "$suite_group")
  { read -r fexes; read -r fnames; } < <(test_targets build-asan fuzz 1 0)
  echo "sanitize: suites: $names"
  local t0; t0=$(stamp)
  # shellcheck disable=SC2086
  ninja -C build-asan -j "$jobs" $exes $fexes
  echo "sanitize: ASan build took $(( $(stamp) - t0 )) s"
  t0=$(stamp)
  # shellcheck disable=SC2086
  GTEST_TOTAL_SHARDS="$shards" GTEST_SHARD_INDEX="$shard" \
    meson test -C build-asan --no-rebuild --print-errorlogs $names
  echo "sanitize: ASan suites took $(( $(stamp) - t0 )) s"
  t0=$(stamp)
  # the fuzz targets mutate with the run's seed (each test passes -seed 1 for
  # the plain suite; the last -seed wins)
  # shellcheck disable=SC2086
  meson test -C build-asan --no-rebuild --print-errorlogs --test-args="-seed $seed" $fnames
  echo "sanitize: fuzzing took $(( $(stamp) - t0 )) s"
}

# Threaded suites and the filters that pick their threaded tests.
tsan_runs=(
  "test_threads:*"
  "test_allreduce:AllReduceInitAll.*"
  "test_stream:HostStream.OneThreadManyRanks:HostStream.ErrorAtSynchronize:HostStream.TraceWrittenByCallerAndStream"
  "test_stream_event:*"
  "test_failure:Failure.AbortFromAnotherThread"
  "test_errors:ErrorsNoComm.GroupWithBadCallRunsNothing:ErrorsNoComm.NonblockingInitFromOneThread"
)

run_tsan() {
  echo "sanitize: ThreadSanitizer over the threaded suites"
  configure build-tsan "${common[@]}" -Db_sanitize=thread
  local exes=() run
  for run in "${tsan_runs[@]}"; do exes+=("tests/${run%%:*}"); done
  local t0; t0=$(stamp)
  ninja -C build-tsan -j "$jobs" "${exes[@]}"
  echo "sanitize: TSan build took $(( $(stamp) - t0 )) s"
  t0=$(stamp)
  local failed=0
  for run in "${tsan_runs[@]}"; do
    local exe="${run%%:*}" filter="${run#*:}"
    echo "sanitize: tsan $exe --gtest_filter=$filter"
    if ! timeout 600 "build-tsan/tests/$exe" "--gtest_filter=$filter" >"build-tsan/$exe.log" 2>&1; then
      echo "sanitize: FAILED: tsan $exe --gtest_filter=$filter:"
      tail -n 80 "build-tsan/$exe.log"
      failed=1
    else
      grep -E '^\[  (PASSED|SKIPPED) ' "build-tsan/$exe.log" || true
    fi
  done
  echo "sanitize: TSan runs took $(( $(stamp) - t0 )) s"
  return $failed
}

for step in "${steps[@]}"; do
  case "$step" in
    asan) run_asan ;;
    tsan) run_tsan ;;
    *) echo "usage: $0 [asan|tsan]..." >&2; exit 2 ;;
  esac
done
echo "sanitize: done in $(( $(stamp) - t_start )) s (seed $seed)"
