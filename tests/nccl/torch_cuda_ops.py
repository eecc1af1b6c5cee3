"""PyTorch's point-to-point and FSDP2 paths on CUDA tensors, through
whatever libnccl.so.2 is loaded (weft's, preloaded), against what one process
computes. Every rank uses cuda:0 (weft lets ranks share a GPU).

  LD_PRELOAD=$PWD/build/libnccl.so.2 torchrun --standalone --nproc-per-node 2 \
      tests/nccl/torch_cuda_ops.py

Checks, each printed as "ok NAME" or "FAIL NAME: why":
  all_to_all_single  uneven splits, random float32 rows, every rank's input
                     rebuilt from its seed
  batch_isend_irecv  a ring shift plus a send to every peer, several sizes
  fsdp2_avg          the same with the factor equal to the world size (torch's AVG, no
                     PreMulSum): whether a difference is FSDP2's collectives or the factor
  premul_*           reduce_scatter_tensor and all_reduce with PREMUL_SUM, the
                     factor a double (NCCL's host scalar) and a one-element tensor
                     (a device scalar); a failure says the ratio to the right sum
  fsdp2_divide       fully_shard with set_gradient_divide_factor(2 x world) (NCCL's
                     PreMulSum) trains like one process on the whole batch at half
                     the learning rate

--device cpu --backend gloo --factor-scale 1 runs the same on the host, to
try the script without a GPU; --backend weft runs it on torch_weft's backend
(no preload). Exits 1 when a check fails.
"""
import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

results = []


def report(name, ok, why=""):
    results.append(ok)
    if dist.get_rank() == 0 or not ok:
        print(f"ok {name}" if ok else f"FAIL {name} (rank {dist.get_rank()}): {why}", flush=True)


def rank_rows(rank, nrows, dev):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(nrows, 3, generator=g).to(dev)


def check_all_to_all(dev):
    r, n = dist.get_rank(), dist.get_world_size()
    split = lambda src, dst: (src * 3 + dst * 5) % 4 + 1  # noqa: E731 (0 rows never occurs)
    send_splits = [split(r, d) for d in range(n)]
    recv_splits = [split(s, r) for s in range(n)]
    inp = rank_rows(r, sum(send_splits), dev)
    out = torch.full((sum(recv_splits), 3), float("nan"), device=dev)
    dist.all_to_all_single(out, inp, recv_splits, send_splits)
    want = []
    for s in range(n):
        rows = rank_rows(s, sum(split(s, d) for d in range(n)), "cpu")
        start = sum(split(s, d) for d in range(r))
        want.append(rows[start:start + split(s, r)])
    want = torch.cat(want)
    ok = torch.equal(out.cpu(), want)
    report("all_to_all_single", ok, f"max diff {(out.cpu() - want).abs().max().item()}")


def check_batch_p2p(dev):
    r, n = dist.get_rank(), dist.get_world_size()
    for count in (1, 1000, 70001):
        val = lambda s, d: torch.arange(count, dtype=torch.float32) * (s + 1) + d  # noqa: E731
        ops, recvs = [], {}
        for peer in range(n):
            if peer == r:
                continue
            ops.append(dist.P2POp(dist.isend, val(r, peer).to(dev), peer))
            recvs[peer] = torch.full((count,), float("nan"), device=dev)
            ops.append(dist.P2POp(dist.irecv, recvs[peer], peer))
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        bad = [p for p, t in recvs.items() if not torch.equal(t.cpu(), val(p, r))]
        report(f"batch_isend_irecv_{count}", not bad, f"wrong data from ranks {bad}")


def check_premul(dev):
    """PREMUL_SUM directly, as FSDP2 asks for it: each rank's input times the
    factor, summed. The inputs are small integers, so the sums are exact."""
    r, n = dist.get_rank(), dist.get_world_size()
    count = 4099
    base = lambda q: (torch.arange(count * n, dtype=torch.float32) % 13) + q  # noqa: E731
    whole = sum(base(q) for q in range(n))
    for kind in ("double", "tensor"):
        factor = 0.25 if kind == "double" else torch.tensor(0.25, device=dev)
        op = dist._make_nccl_premul_sum(factor)
        out = torch.full((count,), float("nan"), device=dev)
        dist.reduce_scatter_tensor(out, base(r).to(dev), op=op)
        want = whole[r * count:(r + 1) * count] * 0.25
        got = out.cpu()
        ratio = (got.sum() / want.sum()).item()
        report(f"premul_{kind}_reduce_scatter", torch.equal(got, want),
               f"max diff {(got - want).abs().max().item()}, sum ratio {ratio:.4g}")
        buf = base(r).to(dev)
        dist.all_reduce(buf, op=op)
        got = buf.cpu()
        ratio = (got.sum() / (whole * 0.25).sum()).item()
        report(f"premul_{kind}_all_reduce", torch.equal(got, whole * 0.25),
               f"max diff {(got - whole * 0.25).abs().max().item()}, sum ratio {ratio:.4g}")


def make_model(dev):
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).to(dev)


def train(model, xs, ys, steps, lr):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(xs), ys).backward()
        opt.step()


def check_fsdp2(dev, scale, steps=5, name="fsdp2_divide"):
    from torch.distributed.fsdp import FSDPModule, fully_shard

    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(3)
    xs, ys = torch.randn(8 * n, 16, generator=g), torch.randn(8 * n, 1, generator=g)
    ref = make_model(dev)
    # gradients summed and divided by scale x world are the whole batch's
    # divided by scale: one process with the learning rate divided by scale
    train(ref, xs.to(dev), ys.to(dev), steps, 0.05 / scale)
    model = make_model(dev)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    for m in model.modules():  # each module's own parameter group takes the factor
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(scale * n)
    train(model, xs[8 * r:8 * (r + 1)].to(dev), ys[8 * r:8 * (r + 1)].to(dev), steps, 0.05)
    diff = max((p.full_tensor() - q).abs().max().item()
               for p, q in zip(model.parameters(), ref.parameters()))
    report(name, diff <= 1e-5, f"parameters differ by {diff} from one process")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--factor-scale", type=float, default=2.0,
                    help="divide factor = world size x this; 1 makes torch average instead "
                         "of PreMulSum (Gloo has no PreMulSum)")
    ap.add_argument("--timeout", type=float, default=90,
                    help="the process group's timeout, s: a hang becomes an error naming the "
                         "rank within it (torch's default for non-NCCL backends is 30 min)")
    args = ap.parse_args()
    if args.device == "cuda":
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
    else:
        dev = torch.device("cpu")
    if args.backend == "weft":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "tools", "torch_weft"))
        import torch_weft  # noqa: F401  (registers "weft")
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
    if dist.get_rank() == 0 and args.device == "cuda" and args.backend == "nccl":
        print(f"nccl version seen by torch: {torch.cuda.nccl.version()}", flush=True)
    checks = [("all_to_all_single", check_all_to_all), ("batch_isend_irecv", check_batch_p2p)]
    if args.backend != "gloo":  # Gloo has no PreMulSum
        checks.append(("premul", check_premul))
    if args.factor_scale != 1:  # the divide factor equal to the world size: torch's AVG
        checks.append(("fsdp2_avg", lambda d: check_fsdp2(d, 1.0, name="fsdp2_avg")))
    checks.append(("fsdp2_divide", lambda d: check_fsdp2(d, args.factor_scale)))
    for name, check in checks:
        try:
            check(dev)
        except Exception as e:  # a refused call is a failed check, and the next one still runs
            report(name, False, f"{type(e).__name__}: {e}")
    ok = all(results)
    dist.destroy_process_group()
    if args.backend == "gloo":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "torch"))
        import teardown  # see there: Gloo's threads at interpreter finalization
        teardown.leave(0 if ok else 1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
