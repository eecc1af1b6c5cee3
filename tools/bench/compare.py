#!/usr/bin/env python3
"""Run weft's perf tools and the baselines (Open MPI, Gloo) alternately and
print a side-by-side table of medians.

The baselines are the programs in the shared baselines folder (mpi_coll_bench.c,
gloo_allreduce_bench.c); they are built into --build (default /tmp/weft-bench),
never into the repository. Every repetition runs each library once, one after
the other, so that noise from other work on the machine falls on all of them.

    tools/bench/compare.py -n 2 -C allreduce -b 8 -e 256M -f 4 -r 3
    tools/bench/compare.py -n 2 -C allreduce --socket --gloo -b 1M -e 256M -f 4
    tools/bench/compare.py -n 4 -C allreduce -b 64M -e 64M --ompi-only default

Columns: median time (us) and busbw (GB/s) of each library, then weft's busbw
divided by the best baseline's (out-of-place, then in-place), from the medians
("ratio") and as the median of each repetition's own ratio ("paired"). On a
machine whose speed drifts, --per-size runs every size on its own, each library
right after the other, so that the runs paired in a repetition are seconds
apart rather than a whole sweep:

    tools/bench/compare.py -n 2 -C allreduce -x WEFT_TRANSPORT=ucx -x UCX_TLS=tcp \
        --ompi tcp -b 1M -e 256M -f 4 -r 7 --per-size
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TOOLS = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
         "bcast": "broadcast", "reduce": "reduce"}
OMPI = {
    "vader": ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"],
    "ucx": ["--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any"],
    "default": [],
    "tcp": ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp"],
}
ROW = re.compile(r"^(?:\[\d+\])?\s+(\d+)\s+(\d+)\s+\S+\s+\S+\s+-?\d+\s+(\S+)\s+(\S+)\s+(\S+)\s+\S+"
                 r"\s+(\S+)\s+(\S+)\s+(\S+)\s+\S+(?:\s+\S+\s+(\S+)\s+\S+\s+(\S+))?")
NAN6 = (float("nan"),) * 6


def find_baselines(arg):
    for d in [arg, os.environ.get("BASELINES_SRC"), os.path.join(ROOT, "..", "..", "shared",
              "baselines"), os.path.join(ROOT, "..", "shared", "baselines"), "/work/shared/baselines"]:
        if d and os.path.exists(os.path.join(d, "mpi_coll_bench.c")):
            return os.path.abspath(d)
    return None


def build(src, out, want_gloo):
    os.makedirs(out, exist_ok=True)
    mpi = os.path.join(out, "mpi_coll_bench_ompi")
    gloo = os.path.join(out, "gloo_allreduce_bench")
    if not os.path.exists(mpi):
        if not shutil.which("mpicc.openmpi"):
            sys.exit("compare: no mpicc.openmpi (apt-get install openmpi-bin libopenmpi-dev)")
        subprocess.run(["mpicc.openmpi", "-O3", "-march=native", "-o", mpi,
                        os.path.join(src, "mpi_coll_bench.c")], check=True)
    if want_gloo and not os.path.exists(gloo):
        if not os.path.exists("/usr/include/gloo/allreduce.h"):
            sys.exit("compare: --gloo needs libgloo-dev")
        subprocess.run(["g++", "-O3", "-march=native", "-std=c++17", "-o", gloo,
                        os.path.join(src, "gloo_allreduce_bench.cc"), "-lgloo", "-lpthread"],
                       check=True)
    return mpi, gloo


def parse(text):
    """{size: (oop_time, oop_busbw, ip_time, ip_busbw, oop_pct, ip_pct)} from one
    table; the last two are the % of the bound weft's tools print (NaN elsewhere)."""
    rows = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if not m:
            continue

        def num(s):
            try:
                return float(s)
            except ValueError:
                return float("nan")
        rows[int(m.group(1))] = (num(m.group(3)), num(m.group(5)), num(m.group(6)),
                                 num(m.group(8)), num(m.group(9) or "nan"),
                                 num(m.group(10) or "nan"))
    return rows


def run(cmd, env, log, timeout):
    t0 = time.time()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + p.stdout)
    if p.returncode != 0:
        print(f"compare: exit {p.returncode} after {time.time() - t0:.0f} s: {' '.join(cmd)} "
              f"(log {log})", file=sys.stderr)
    return parse(p.stdout)


def run_gloo(binary, nranks, sweep, algo, log, timeout):
    store = tempfile.mkdtemp(prefix="gloo_store.")
    try:
        base = [binary, "-S", str(nranks), "-p", store, "-H", "127.0.0.1", "-a", algo] + sweep
        others = [subprocess.Popen(base + ["-R", str(r)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL) for r in range(1, nranks)]
        rows = run(base + ["-R", "0"], os.environ.copy(), log, timeout)
        for p in others:
            p.wait(timeout=60)
        return rows
    finally:
        shutil.rmtree(store, ignore_errors=True)


def sizes_of(b, e, f):
    """The sizes a perf tool's -b B -e E -f F sweep runs (K, M, G suffixes)."""
    def num(v):
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:].upper(), 1)
        return int(v[:-1] if mult > 1 else v) * mult
    lo, hi, step = num(b), num(e), int(f)
    out = [lo]
    while step > 1 and out[-1] * step <= hi:
        out.append(out[-1] * step)
    return out


def median(values):
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def record(results, key, rep, rows):
    """Adds rows (one run's table) to repetition rep's table of key."""
    tables = results.setdefault(key, [])
    while len(tables) <= rep:
        tables.append({})
    tables[rep].update(rows)


def paired(results, coll, libs, size, col):
    """The median, min and max over repetitions of the best baseline's time in
    a repetition divided by weft's in the same repetition."""
    nan = NAN6
    ratios = []
    for rep, table in enumerate(results.get((coll, "weft"), [])):
        wt = table.get(size, nan)[col]
        base = [results[(coll, lib)][rep].get(size, nan)[col] for lib in libs
                if lib != "weft" and rep < len(results[(coll, lib)])]
        base = [t for t in base if t == t]
        if wt == wt and wt > 0 and base:
            ratios.append(min(base) / wt)
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f} - {max(ratios):.2f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=2)
    ap.add_argument("-C", "--collectives", default="allreduce",
                    help="comma list of " + ",".join(TOOLS))
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="256M")
    ap.add_argument("-f", default="4")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per size (-n)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--socket", action="store_true", help="weft with WEFT_TRANSPORT=socket")
    ap.add_argument("--gloo", action="store_true", help="add Gloo (all-reduce only)")
    ap.add_argument("--gloo-algo", default="ring")
    ap.add_argument("--ompi", default="vader,ucx",
                    help="Open MPI configurations: vader, ucx, default, tcp (comma list, or none)")
    ap.add_argument("-x", action="append", default=[], help="VAR=VALUE for weft's ranks")
    ap.add_argument("--build", default="/tmp/weft-bench")
    ap.add_argument("--baselines", default=None, help="folder with mpi_coll_bench.c")
    ap.add_argument("--weft-build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--logs", default=None, help="keep raw outputs here")
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--per-size", action="store_true",
                    help="run each size on its own, the libraries back to back")
    args = ap.parse_args()
    unknown = [c for c in args.collectives.split(",") if c not in TOOLS]
    if unknown:
        ap.error("-C: unknown collective(s) %s; known: %s" % (",".join(unknown), ",".join(TOOLS)))

    src = find_baselines(args.baselines)
    ompi_cfgs = [c for c in args.ompi.split(",") if c and c != "none"]
    if src is None and (ompi_cfgs or args.gloo):
        sys.exit("compare: baselines not found (pass --baselines DIR with mpi_coll_bench.c)")
    mpi_bin, gloo_bin = build(src, args.build, args.gloo) if src else (None, None)
    logs = args.logs or tempfile.mkdtemp(prefix="weft-compare.")
    os.makedirs(logs, exist_ok=True)
    weftrun = os.path.join(args.weft_build, "tools", "weftrun")
    sweeps = ([["-b", str(s), "-e", str(s), "-f", "2"] for s in sizes_of(args.b, args.e, args.f)]
              if args.per_size else [["-b", args.b, "-e", args.e, "-f", args.f]])
    colls = args.collectives.split(",")
    results = {}  # (coll, lib) -> list of tables, one per repetition
    env = os.environ.copy()
    for rep in range(args.reps):
        for coll, sweep in ((c, w) for c in colls for w in sweeps):
            tool = os.path.join(args.weft_build, "tools", TOOLS[coll] + "_perf")
            wx = []
            for kv in args.x + (["WEFT_TRANSPORT=socket"] if args.socket else []):
                wx += ["-x", kv]
            libs = [("weft", [weftrun, "-n", str(args.nranks)] + wx +
                     [tool] + sweep + ["-n", str(args.iters), "-w", str(args.warmup), "-c", "0",
                                       "-B", "1"])]
            for cfg in ompi_cfgs:
                libs.append((f"ompi-{cfg}", ["mpirun.openmpi", "--allow-run-as-root",
                                             "--oversubscribe", "-np", str(args.nranks)] +
                             OMPI[cfg] + [mpi_bin, "-C", coll] + sweep +
                             ["-n", str(args.iters), "-w", str(args.warmup), "-c", "0"]))
            # alternate the order between repetitions as well
            if rep % 2:
                libs.reverse()
            tag = f"{coll}.{sweep[1]}" if args.per_size else coll
            for lib, cmd in libs:
                log = os.path.join(logs, f"{tag}.{lib}.rep{rep}.txt")
                record(results, (coll, lib), rep, run(cmd, env, log, args.timeout))
            if args.gloo and coll == "allreduce":
                log = os.path.join(logs, f"{tag}.gloo.rep{rep}.txt")
                record(results, (coll, f"gloo-{args.gloo_algo}"), rep,
                       run_gloo(gloo_bin, args.nranks, sweep + ["-n", str(args.iters), "-w",
                                str(args.warmup)], args.gloo_algo, log, args.timeout))
            print(f"# rep {rep + 1}/{args.reps} {tag} done", file=sys.stderr)

    print(f"# compare: {args.nranks} ranks, medians of {args.reps} alternating runs"
          f"{' of each size on its own' if args.per_size else ''}, "
          f"weft{' over sockets' if args.socket else ''}; raw logs in {logs}")
    for coll in colls:
        libs = [lib for (c, lib) in results if c == coll]
        sizes = sorted({s for lib in libs for t in results[(coll, lib)] for s in t})
        med = {}
        for lib in libs:
            for s in sizes:
                vals = [t[s] for t in results[(coll, lib)] if s in t]
                med[(lib, s)] = tuple(median([v[k] for v in vals]) for k in range(6))
        print(f"\n## {coll}: time (us) / busbw (GB/s); ratio = best baseline time / weft time "
              f"(= weft busbw / best busbw) of the medians; paired = the median of each "
              f"repetition's ratio (min - max); bound % = weft's % of the bound its tool "
              f"prints (median)")
        for col, name in ((0, "out-of-place"), (2, "in-place")):
            head = f"| size (B) | " + " | ".join(libs) + " | ratio | paired | bound % |"
            print(f"\n{name}\n\n{head}\n|" + "---|" * (len(libs) + 4))
            for s in sizes:
                cells, best = [], float("inf")
                for lib in libs:
                    t, bw = med.get((lib, s), NAN6)[col:col + 2]
                    cells.append(f"{t:.2f} / {bw:.2f}" if t == t else "-")
                    if lib != "weft" and t == t:
                        best = min(best, t)
                # busbw ratio from the times (the busbw columns are rounded)
                wt = med.get(("weft", s), NAN6)[col]
                ratio = f"{best / wt:.2f}" if best < float("inf") and wt == wt and wt > 0 else "-"
                pct = med.get(("weft", s), NAN6)[4 + col // 2]
                pct = f"{pct:.1f}" if pct == pct else "-"
                print(f"| {s} | " + " | ".join(cells) +
                      f" | {ratio} | {paired(results, coll, libs, s, col)} | {pct} |")


if __name__ == "__main__":
    main()
