"""DDP step time on the "weft" backend: the group's communication stream
against every collective on the compute stream (TORCH_WEFT_COMM_STREAM=0, set
by the caller for the whole run), for the GPU check's step torch_weft_streams.

An MLP of --layers square layers of --width, DDP with buckets of --bucket-mb,
--steps timed steps after --warmup; each step is forward, backward (whose
bucket all-reduces DDP issues as the gradients come) and an SGD step, timed
with a synchronize of the device at each end. Rank 0 prints one line:

    ddp_streams comm_stream=1 ranks=2 step_ms=12.345 (median of 30; min 12.1, max 13.0)

--device cpu runs the same on host tensors (the streams do not apply there),
which keeps the script from rotting where there is no GPU."""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "torch_weft"))
import torch_weft  # noqa: E402,F401
import teardown  # noqa: E402  (beside this script)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bucket-mb", type=float, default=8)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()

    dist.init_process_group("weft")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        # ranks share the GPUs there are (one GPU: every rank on cuda:0)
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        sync = torch.cuda.synchronize
    else:
        dev = torch.device("cpu")
        sync = lambda: None  # noqa: E731
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    model = DDP(torch.nn.Sequential(*layers).to(dev), bucket_cap_mb=args.bucket_mb,
                device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=g).to(dev)
    times = []
    for step in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        sync()
        if step >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    # every rank's median; the slowest rank's is the step time
    med = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    if not torch.isfinite(loss).item():
        print(f"[rank {rank}] ddp_streams: loss is {loss.item()}", flush=True)
        teardown.leave(1)
    if rank == 0:
        print(f"ddp_streams comm_stream={os.environ.get('TORCH_WEFT_COMM_STREAM', '1')} "
              f"ranks={world} step_ms={med.item():.3f} (median of {args.steps}; "
              f"min {min(times):.1f}, max {max(times):.1f})", flush=True)
    dist.destroy_process_group()
    teardown.leave(0)


if __name__ == "__main__":
    main()
