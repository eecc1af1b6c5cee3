"""PyTorch's own distributed test suite (DistributedTest, as pytorch's
test_distributed_spawn.py runs it for Gloo) over the weft backend.

Modes:
  weft     BACKEND=weft: the suite runs what it runs for a backend of that
           name; weft is added to its "ddp", "subgroup" and "plugin" feature
           sets (DistTestCases.backend_feature), which it has.
  gloo     BACKEND=gloo, and every process group the suite makes over "gloo"
           is made over "weft" instead (torch then reports the groups' backend
           as "weft"): the suite runs what it runs for Gloo.
  native   BACKEND=gloo with Gloo itself, for the counts to compare with.

    python tests/torch/distributed_suite.py --modes weft,gloo,native --world-sizes 2,3
    python tests/torch/distributed_suite.py --modes gloo -k all_gather_coalesced
    python tests/torch/distributed_suite.py --sample 30 --seed 7   (what CI runs)

Each mode and world size runs in a process of its own (the suite reads
BACKEND and WORLD_SIZE when it is imported), which spawns WORLD_SIZE ranks per
test as the suite does; with --start fork it forks them instead, which spares
each rank importing torch again (tens of seconds a test on loaded cores, most
of all for the many tests that only skip once their ranks are up). The tests named in distributed_suite_exceptions.txt
(with the reason) are skipped in the modes it names, and nothing else.
Prints passed, failed and skipped per mode and world size, and the first line
of each failure; exits 1 when a test failed, except where --compare-native
names only the tests that pass over Gloo itself.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXCEPTIONS = os.path.join(HERE, "distributed_suite_exceptions.txt")
MODES = ("weft", "gloo", "native")


def read_exceptions(path=EXCEPTIONS):
    """{(mode, test): reason} from lines `test  mode[,mode]  reason`."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, modes, reason = line.split(None, 2)
            for m in modes.split(","):
                if m not in MODES:
                    raise ValueError(f"{path}: unknown mode {m!r} in: {line}")
                out[(m, name)] = reason
    return out


# --- the worker: one mode and world size, in a process of its own -----------

def _patch_weft_features():
    import torch_weft  # noqa: F401  registers "weft"
    from torch.testing._internal.common_distributed import DistTestCases
    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("weft")


def _patch_gloo_is_weft():
    import torch_weft  # noqa: F401  registers "weft"
    from torch.distributed import distributed_c10d as c10d
    make_group = c10d._new_process_group_helper

    # every group is made here (init_process_group, new_group with or
    # without backend="gloo", new_subgroups): "gloo" becomes "weft", for
    # every device of the group, and torch then calls the group's backend
    # "weft" (dist.get_backend), as it would any backend's under its own name
    def weft_for_gloo(group_size, group_rank, global_ranks, backend, *args, **kwargs):
        backend = re.sub(r"\bgloo\b", "weft", str(backend))
        return make_group(group_size, group_rank, global_ranks, backend, *args, **kwargs)

    c10d._new_process_group_helper = weft_for_gloo


def _patch(mode):
    if mode == "weft":
        _patch_weft_features()
    elif mode == "gloo":
        _patch_gloo_is_weft()


if os.environ.get("WEFT_SUITE_MODE"):
    # here in the worker and in every rank it spawns (which imports this file
    # as __mp_main__): the class must be defined, the same way, in both
    _patch(os.environ["WEFT_SUITE_MODE"])
    import torch
    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest, TestDistBackend)

    torch.backends.cuda.matmul.allow_tf32 = False

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if os.environ.get("WEFT_SUITE_START") == "fork":
                # --start fork: the ranks are forked from this process, which
                # has imported torch and the suite already
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


def _first_line(err_text):
    """The failing rank's exception line out of the suite's report (the
    report's own first line only says which process exited)."""
    lines = [ln.strip() for ln in err_text.splitlines() if ln.strip()]
    exc = [ln for ln in lines
           if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt|Failure)\b", ln)
           and not re.match(r"^RuntimeError: Process \d+ (exited|terminated|timed out)", ln)]
    text = exc[0] if exc else (lines[-1] if lines else "")
    at = lines.index(text) if text in lines else -1
    if 0 <= at < len(lines) - 1 and text.endswith("!"):  # assertEqual's detail follows
        text += " " + lines[at + 1]
    return text[:240]


def run_worker(args):
    import unittest
    mode = os.environ["WEFT_SUITE_MODE"]
    exceptions = read_exceptions()
    cls = TestDistBackendWithSpawn
    names = args.tests.split(",") if args.tests else \
        unittest.TestLoader().getTestCaseNames(cls)
    results = []

    class Result(unittest.TestResult):
        def addSuccess(self, test):
            results.append((test._testMethodName, "passed", ""))

        def addFailure(self, test, err):
            results.append((test._testMethodName, "failed",
                            _first_line(self._exc_info_to_string(err, test))))

        addError = addFailure

        def addSkip(self, test, reason):
            results.append((test._testMethodName, "skipped", reason.splitlines()[0][:160]))

        def addExpectedFailure(self, test, err):
            results.append((test._testMethodName, "passed", ""))

        def addUnexpectedSuccess(self, test):
            results.append((test._testMethodName, "failed", "unexpected success"))

    for name in names:
        reason = exceptions.get((mode, name))
        if reason is not None:
            results.append((name, "excluded", reason))
            continue
        t0 = time.time()
        cls(name).run(Result())
        n, outcome, why = results[-1]
        print(f"{mode} ws={os.environ['WORLD_SIZE']} {name} {outcome} "
              f"{time.time() - t0:.1f}s {why}", flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f)


# --- the driver ---------------------------------------------------------------

def all_test_names():
    env = dict(os.environ, WEFT_SUITE_MODE="native", BACKEND="gloo", WORLD_SIZE="2",
               TEMP_DIR=tempfile.gettempdir())
    code = ("import sys, unittest; sys.path.insert(0, %r); import distributed_suite as s; "
            "print(' '.join(unittest.TestLoader().getTestCaseNames(s.TestDistBackendWithSpawn)))"
            % HERE)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def run_mode(mode, world_size, tests, log, start):
    with tempfile.TemporaryDirectory(prefix="weft-dist-suite-") as tmp:
        out = os.path.join(tmp, "results.json")
        env = dict(os.environ, WEFT_SUITE_MODE=mode, WORLD_SIZE=str(world_size),
                   BACKEND="weft" if mode == "weft" else "gloo", TEMP_DIR=tmp,
                   WEFT_SUITE_START=start)
        env.setdefault("OMP_NUM_THREADS", "1")
        if mode == "gloo":
            # Gloo's semantics: a failed operation raises to its caller and the
            # process goes on (Gloo has no watchdog that ends it, as weft's does
            # by default, like NCCL's TORCH_NCCL_ASYNC_ERROR_HANDLING=3)
            env["TORCH_WEFT_ASYNC_ERROR_HANDLING"] = "0"
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out]
        if tests is not None:
            cmd += ["--tests", ",".join(tests)]
        with open(log, "a") as lf:
            rc = subprocess.run(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT).returncode
        if not os.path.exists(out):
            raise SystemExit(f"distributed_suite: the {mode} run at world size {world_size} "
                             f"ended without results (exit {rc}); see {log}")
        with open(out) as f:
            return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="weft,gloo")
    p.add_argument("--world-sizes", default="2,3")
    p.add_argument("-k", dest="pattern", help="only tests whose name contains this (regex)")
    p.add_argument("--sample", type=int, help="a seeded sample of this many tests, plus "
                   "every test of the exception list and of --always")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--always", default="", help="comma-separated tests every sample has")
    p.add_argument("--compare-native", action="store_true",
                   help="run Gloo itself too; a test failing over weft fails the run only "
                        "where it passes over Gloo")
    p.add_argument("--start", choices=("spawn", "fork"), default="spawn",
                   help="how each test starts its ranks: spawn (a fresh interpreter per "
                        "rank, as test_distributed_spawn.py) or fork (from the worker, "
                        "which has imported torch: seconds less per test)")
    p.add_argument("--log", default=None, help="the ranks' output (default: a temp file)")
    p.add_argument("--json", default=None, help="write every result here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tests", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        run_worker(args)
        return 0

    modes = args.modes.split(",")
    if args.compare_native and "native" not in modes:
        modes.append("native")
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m}")
    sizes = [int(s) for s in args.world_sizes.split(",")]
    exceptions = read_exceptions()
    names = all_test_names()
    tests = None
    if args.pattern:
        tests = [n for n in names if re.search(args.pattern, n)]
    if args.sample:
        seed = args.seed if args.seed is not None else random.randrange(1 << 16)
        must = sorted({t for (_, t) in exceptions} | set(filter(None, args.always.split(","))))
        rest = [n for n in (tests or names) if n not in must]
        picked = random.Random(seed).sample(rest, min(args.sample, len(rest)))
        tests = sorted(set(must) | set(picked))
        print(f"sample: seed {seed}, {len(tests)} tests: {' '.join(tests)}", flush=True)
    log = args.log or tempfile.mkstemp(prefix="weft-dist-suite-", suffix=".log")[1]
    print(f"ranks' output: {log}", flush=True)

    all_results = {}
    bad = 0
    for ws in sizes:
        for mode in modes:
            t0 = time.time()
            res = run_mode(mode, ws, tests, log, args.start)
            all_results[f"{mode}/{ws}"] = res
            count = {k: sum(1 for r in res if r[1] == k)
                     for k in ("passed", "failed", "skipped", "excluded")}
            print(f"{mode:6s} world size {ws}: {count['passed']} passed, {count['failed']} "
                  f"failed, {count['skipped']} skipped, {count['excluded']} excluded "
                  f"({time.time() - t0:.0f} s)", flush=True)
            for name, outcome, why in res:
                if outcome == "failed":
                    print(f"    FAILED {name}: {why}", flush=True)
        native = {n: o for n, o, _ in all_results.get(f"native/{ws}", [])}
        for mode in modes:
            if mode == "native":
                continue
            for name, outcome, why in all_results[f"{mode}/{ws}"]:
                if outcome != "failed":
                    continue
                if args.compare_native and native.get(name) != "passed":
                    print(f"    ({mode} world size {ws}: {name} fails over Gloo too: "
                          f"{native.get(name)})")
                    continue
                bad += 1
        if args.compare_native:
            for mode in modes:
                if mode != "gloo":
                    continue
                mine = {n: o for n, o, _ in all_results[f"{mode}/{ws}"]}
                lost = [n for n, o in native.items() if o == "passed" and
                        mine.get(n) not in ("passed", "excluded")]
                print(f"  world size {ws}: passing over Gloo, not over weft as Gloo "
                      f"(outside the exception list): {len(lost)} {' '.join(lost)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_results, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
