"""torch.distributed on weft against Gloo, alternating in one run.

    .venv-torch/bin/python tools/torch_weft/bench.py [--nranks 2,4] [--rounds 3]
        [--ops all_reduce,...] [--sizes 1M,4M] [--no-train]

For each rank count it starts that many processes (env:// rendezvous on a
free port); each makes a default "weft" group and a Gloo group of the same
ranks. Then, per operation and size, rounds alternate weft and Gloo; a
round's time is the slowest rank's, and the table shows the median round.
Sizes are nccl-tests' (the larger buffer: all_gather's output,
reduce_scatter's input), float32 CPU tensors; --ops also takes reduce_scatter
and all_to_all, the list forms (each list the chunks of one tensor). Last, step times of DDP and
FSDP2 on a small transformer, alternating the same way.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta

OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"]
# on request (--ops): the list forms, their tensors the chunks of one
LIST_OPS = ["reduce_scatter", "all_to_all"]
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def fmt_size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def run_rank(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_weft  # noqa: F401

    dist.init_process_group("weft", timeout=timedelta(seconds=300))
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    groups = {"weft": dist.group.WORLD, "gloo": gloo}

    def slowest(t):
        x = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(x, dist.ReduceOp.MAX, group=gloo)
        return x.item()

    def op_call(op, size, group):
        count = size // 4
        if op == "all_reduce":
            t = torch.ones(count)
            return lambda: dist.all_reduce(t, group=group)
        if op == "all_gather_into_tensor":
            out, inp = torch.empty(count // n * n), torch.ones(count // n)
            return lambda: dist.all_gather_into_tensor(out, inp, group=group)
        if op == "reduce_scatter_tensor":
            inp, out = torch.ones(count // n * n), torch.empty(count // n)
            return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
        if op == "reduce_scatter":
            inp, out = torch.ones(count // n * n), torch.empty(count // n)
            parts = list(inp.chunk(n))
            return lambda: dist.reduce_scatter(out, parts, group=group)
        inp, out = torch.ones(count // n * n), torch.empty(count // n * n)
        if op == "all_to_all":
            ins, outs = list(inp.chunk(n)), list(out.chunk(n))
            return lambda: dist.all_to_all(outs, ins, group=group)
        return lambda: dist.all_to_all_single(out, inp, group=group)

    rows = []
    for op in args.ops if not args.train_only else []:
        for size in args.sizes:
            iters = max(2, min(200, (4 << 20) // size * 10))
            times = {"weft": [], "gloo": []}
            calls = {b: op_call(op, size, g) for b, g in groups.items()}
            for b in groups:  # warm up (connections, shared buffers)
                calls[b]()
            for _ in range(args.rounds):
                for b in ("weft", "gloo"):
                    dist.barrier(group=gloo)
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        calls[b]()
                    times[b].append(slowest(time.perf_counter() - t0) / iters)
            w, g = statistics.median(times["weft"]), statistics.median(times["gloo"])
            rows.append((op, size, w, g))
            if rank == 0:
                print(f"  {n} ranks {op:24s} {fmt_size(size):>7s}  weft {w * 1e6:10.1f} us  "
                      f"gloo {g * 1e6:10.1f} us  {g / w:6.1f}x", flush=True)

    # training steps of a small transformer
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(256, 128)
            self.layers = nn.ModuleList(nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0,
                                                                   batch_first=True)
                                        for _ in range(2))
            self.head = nn.Linear(128, 256)

        def forward(self, x):
            h = self.emb(x)
            for layer in self.layers:
                h = layer(h)
            return self.head(h)

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    def make(kind, group):
        torch.manual_seed(0)
        m = Tiny()
        if kind == "ddp":
            return DDP(m, process_group=group)
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in m.layers:
            fully_shard(layer, mesh=mesh)
        return fully_shard(m, mesh=mesh)

    if args.no_train:
        dist.destroy_process_group()
        return
    data = torch.randint(0, 256, (8, 33), generator=torch.Generator().manual_seed(rank))
    steps = 10
    for kind in ("ddp", "fsdp2"):
        models = {b: make(kind, g) for b, g in groups.items()}
        opts = {b: torch.optim.SGD(m.parameters(), lr=0.01) for b, m in models.items()}
        times = {"weft": [], "gloo": []}
        losses = {}
        for rnd in range(args.rounds + 1):
            for b in ("weft", "gloo"):
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                for _ in range(steps):
                    opts[b].zero_grad()
                    out = models[b](data[:, :-1])
                    loss = nn.functional.cross_entropy(out.reshape(-1, 256),
                                                       data[:, 1:].reshape(-1))
                    loss.backward()
                    opts[b].step()
                losses[b] = loss.item()
                if rnd > 0:  # round 0 warms up
                    times[b].append(slowest(time.perf_counter() - t0) / steps)
        w, g = statistics.median(times["weft"]), statistics.median(times["gloo"])
        if rank == 0:
            print(f"  {n} ranks {kind} step: weft {w * 1e3:.2f} ms  gloo {g * 1e3:.2f} ms  "
                  f"{g / w:.2f}x  (final loss weft {losses['weft']:.6f} gloo "
                  f"{losses['gloo']:.6f})", flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nranks", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-only", action="store_true", help="only the DDP/FSDP2 step times")
    ap.add_argument("--no-train", action="store_true", help="only the collectives")
    ap.add_argument("--ops", default=",".join(OPS),
                    help="comma-separated, of " + ",".join(OPS + LIST_OPS))
    ap.add_argument("--sizes", default=",".join(fmt_size(b).replace(" ", "")[:-2] for b in SIZES),
                    help="comma-separated sizes such as 64K,4M")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.ops = args.ops.split(",")
    if any(op not in OPS + LIST_OPS for op in args.ops):
        ap.error(f"--ops: each of {','.join(OPS + LIST_OPS)}")
    units = {"K": 1 << 10, "M": 1 << 20}
    try:
        args.sizes = [int(x[:-1]) * units[x[-1].upper()] for x in args.sizes.split(",")]
    except (KeyError, ValueError, IndexError):
        ap.error("--sizes: comma-separated sizes such as 64K,4M")
    if args.rank:
        run_rank(args)
        # without interpreter finalization: Gloo's worker threads may still
        # free finished work then, and a tensor's decref in them aborts the
        # process (std::terminate) after the figures are in
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    for n in [int(x) for x in args.nranks.split(",")]:
        print(f"{n} ranks (weft and Gloo alternating, {args.rounds} rounds, median):", flush=True)
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   WORLD_SIZE=str(n), OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank",
                                   "--rounds", str(args.rounds), "--ops", ",".join(args.ops),
                                   "--sizes", ",".join(f"{b >> 10}K" for b in args.sizes)]
                                  + (["--train-only"] if args.train_only else [])
                                  + (["--no-train"] if args.no_train else []),
                                  env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
                 for r in range(n)]
        codes = [p.wait() for p in procs]
        if any(codes):
            sys.exit(f"bench: ranks exited with {codes}")


if __name__ == "__main__":
    main()
