#!/usr/bin/env bash
# PyTorch's own distributed test suite (DistributedTest) over weft:
# tests/torch/distributed_suite.py with the checkout's .venv-torch (made by
# WEFT_SETUP_TORCH=1 tools/scripts/setup.sh), which also needs expecttest
# (torch's test utilities import it; WEFT_TORCH_SUITE_DEPS=1 installs it).
#   distributed_suite.sh            what CI runs: a seeded sample (the seed is
#                                   printed; WEFT_SUITE_SEED sets it) under weft's
#                                   name and as Gloo, at 2 and 3 ranks forked
#                                   (--start fork); every test of the exception
#                                   list and every test that once failed over
#                                   weft is in it; then 4 of those that passed,
#                                   drawn from the seed, with 2 ranks spawned, as
#                                   torch's runner starts them
#   distributed_suite.sh ARGS...    the runner's arguments, e.g. the whole suite:
#                                   --modes weft,gloo --world-sizes 2,3 --compare-native
# Without .venv-torch or expecttest it skips (exit 77) and says why.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$root/.venv-torch"
if [ ! -x "$venv/bin/python" ]; then
  echo "SKIP: no $venv (WEFT_SETUP_TORCH=1 tools/scripts/setup.sh creates it with torch 2.15.0)"
  exit 77
fi
if ! "$venv/bin/python" -c "import expecttest" 2>/dev/null; then
  if [ "${WEFT_TORCH_SUITE_DEPS:-0}" = 1 ]; then
    "$venv/bin/python" -m pip install -q expecttest
  else
    echo "SKIP: torch's test utilities need expecttest in $venv" \
         "($venv/bin/pip install expecttest, or WEFT_TORCH_SUITE_DEPS=1)"
    exit 77
  fi
fi
export PYTHONPATH="$root/tools/torch_weft${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
if [ $# -eq 0 ]; then
  # the tests that failed over weft before it did what Gloo does
  always=test_all_gather_coalesced_simple,test_all_gather_coalesced_complex
  always+=,test_all_gather_coalesced_full_group,test_all_gather_coalesced_with_empty
  always+=,test_send_recv_any_source,test_send_recv_any_source_autograd_profiler
  always+=,test_send_recv_any_source_torch_profiler,test_ddp_logging_data_cpu
  always+=,test_monitored_barrier_gloo,test_monitored_barrier_gloo_subgroup
  always+=,test_monitored_barrier_gloo_rank_0_timeout,test_sparse_all_reduce_sum
  always+=,test_barrier_timeout_full_group,test_get_backend
  # the sample at 2 and 3 ranks forked (a second or two a test), and a few
  # tests of the same seed with 2 ranks spawned as test_distributed_spawn.py
  # runs them (a fresh interpreter a rank: ten seconds and more a test, most
  # of it importing torch, whether the test runs or skips)
  seed=${WEFT_SUITE_SEED:-$RANDOM}
  rc=0
  results=$(mktemp)
  trap 'rm -f "$results"' EXIT
  "$venv/bin/python" "$root/tests/torch/distributed_suite.py" --modes weft,gloo --sample 24 \
    --always "$always" --seed "$seed" --world-sizes 2,3 --start fork --json "$results" || rc=$?
  # spawned: 4 of the tests that ran and passed at 2 ranks forked (drawn from
  # the seed), so that the spawned ranks run collectives rather than skip
  picked=$("$venv/bin/python" -c '
import json, random, sys
res = json.load(open(sys.argv[1]))
ok = sorted({n for n, o, _ in res.get("weft/2", []) + res.get("gloo/2", []) if o == "passed"})
print("|".join(sorted(random.Random(int(sys.argv[2])).sample(ok, min(4, len(ok))))))
' "$results" "$seed" 2>/dev/null || true)
  if [ -z "$picked" ]; then
    echo "spawned: no test passed forked at 2 ranks to draw from"
    exit 1
  fi
  echo "spawned at 2 ranks (seed $seed): ${picked//|/ }"
  "$venv/bin/python" "$root/tests/torch/distributed_suite.py" --modes weft,gloo \
    -k "^($picked)\$" --world-sizes 2 || rc=$?
  exit $rc
fi
exec "$venv/bin/python" "$root/tests/torch/distributed_suite.py" "$@"
