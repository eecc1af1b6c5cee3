"""PyTorch DDP on whatever libnccl.so.2 is loaded (or, with --backend weft, on
torch_weft's backend), checked against one process.

Run with torchrun on one GPU machine; every rank uses cuda:0 unless
--one-gpu-per-rank is given (weft lets several ranks share a GPU, NCCL does
not). Each rank first trains a private copy of the model on the whole batch
(the single-process reference), then trains the DDP model on its share of the
same batch; DDP averages gradients, so the two runs see the same gradients and
their losses must agree to float tolerance. Rank 0 prints both curves and the
largest difference, and every rank exits 1 when they differ.

  LD_PRELOAD=$PWD/build/libnccl.so.2 torchrun --standalone --nproc_per_node=2 \
      tests/nccl/ddp_loss.py
"""
import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 1))


def train(model, xs, ys, steps, lr):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--one-gpu-per-rank", action="store_true")
    ap.add_argument("--backend", default="nccl",
                    help="weft: torch_weft's backend instead of a (preloaded) libnccl.so.2")
    ap.add_argument("--timeout", type=float, default=90,
                    help="the process group's timeout, s: a hang becomes an error naming the "
                         "rank within it (torch's default for non-NCCL backends is 30 min)")
    args = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]) if args.one_gpu_per_rank else 0)
    torch.cuda.set_device(dev)
    if args.batch % world:
        sys.exit(f"--batch {args.batch} must divide by the {world} ranks")

    gen = torch.Generator().manual_seed(1234)
    xs = torch.randn(args.batch, 32, generator=gen)  # on the host: the generator's device
    ys = (xs[:, :1] * 0.5 - xs[:, 1:2] ** 2 + 0.1 * torch.randn(args.batch, 1, generator=gen)).to(dev)
    xs = xs.to(dev)

    # the reference: one process, whole batch
    ref = train(make_model(7).to(dev), xs, ys, args.steps, args.lr)

    if args.backend == "weft":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "tools", "torch_weft"))
        import torch_weft  # noqa: F401  (registers "weft")
    dist.init_process_group(args.backend, device_id=dev, timeout=timedelta(seconds=args.timeout))
    if rank == 0 and args.backend == "nccl":
        print(f"nccl version seen by torch: {torch.cuda.nccl.version()}", flush=True)
    model = DDP(make_model(7).to(dev), device_ids=[dev.index])
    share = args.batch // world
    mine = slice(rank * share, (rank + 1) * share)
    local = train(model, xs[mine], ys[mine], args.steps, args.lr)

    # the DDP loss of a step is the mean over ranks of their shares' losses
    ddp = torch.stack(local)
    dist.all_reduce(ddp, op=dist.ReduceOp.SUM)
    ddp /= world
    ref = torch.stack(ref)
    worst = ((ddp - ref).abs() / ref.abs().clamp_min(1e-6)).max().item()
    if rank == 0:
        for step in range(args.steps):
            print(f"step {step:3d}  single {ref[step].item():.6f}  ddp {ddp[step].item():.6f}")
        print(f"largest relative difference {worst:.3g} (tolerance {args.rtol})")
    dist.destroy_process_group()
    sys.exit(0 if worst <= args.rtol else 1)


if __name__ == "__main__":
    main()
