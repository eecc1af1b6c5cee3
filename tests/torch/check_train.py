"""DDP and FSDP2 training of a small transformer on the "weft" backend give
the parameters the same training gives on Gloo in the same run. Run under
torchrun (2 or 3 ranks); exits non-zero with the failing variants listed.
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "torch_weft"))
import torch_weft  # noqa: E402,F401
import teardown  # noqa: E402  (beside this script)

VOCAB, DIM, SEQ, BATCH, STEPS = 64, 32, 12, 4, 4


class Tiny(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.0, batch_first=True)
            for _ in range(2))
        self.head = nn.Linear(DIM, VOCAB)
        self.unused = nn.Linear(DIM, DIM) if unused else None

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def batches(rank, steps):
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(steps)]


def loss_of(model, batch):
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def train_ddp(group, variant):
    torch.manual_seed(0)
    model = Tiny(unused=variant == "find_unused_parameters")
    kw = {}
    if variant == "find_unused_parameters":
        kw["find_unused_parameters"] = True
    if variant == "static_graph":
        kw["static_graph"] = True
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.01, **kw)  # several buckets
    if variant == "allreduce_hook":
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
    if variant == "bf16_compress_hook":
        ddp.register_comm_hook(group, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    data = batches(dist.get_rank(), STEPS * 2)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        if variant == "no_sync":
            with ddp.no_sync():
                loss_of(ddp, data[2 * step]).backward()
            loss = loss_of(ddp, data[2 * step + 1])
        else:
            loss = loss_of(ddp, data[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().clone() for p in model.parameters()], losses


def train_fsdp(group, variant, loss_scale=1.0):
    torch.manual_seed(0)
    model = Tiny()
    mesh = DeviceMesh.from_group(group, "cpu")
    kw = {"mesh": mesh}
    if variant == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    if variant == "no_reshard":
        kw["reshard_after_forward"] = False
    for layer in model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    if variant == "divide_factor":
        for m in [*model.layers, model]:  # each FSDP module has its own
            m.set_gradient_divide_factor(3.0)  # a PREMUL_SUM reduce-scatter
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = batches(dist.get_rank(), STEPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_of(model, data[step])
        (loss * loss_scale).backward()
        opt.step()
        losses.append(loss.item())
    params = [p.full_tensor().detach().clone() for p in model.parameters()]
    return params, losses


def compare(name, weft, gloo, tol):
    (pw, lw), (pg, lg) = weft, gloo
    worst = max(((a - b).abs().max() / (1 + b.abs().max())).item() for a, b in zip(pw, pg))
    lossdiff = max(abs(a - b) for a, b in zip(lw, lg))
    # training must also have moved the parameters: the check can fail
    torch.manual_seed(0)
    moved = max((a - b).abs().max().item() for a, b in zip(pw, Tiny().parameters()))
    ok = worst <= tol and lossdiff <= tol * 10 and moved > 1e-3
    print(f"rank {dist.get_rank()}: {name:34s} max param diff {worst:.2e} loss diff "
          f"{lossdiff:.2e} moved {moved:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def main():
    dist.init_process_group("weft", timeout=timedelta(seconds=120))
    weft = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    ok = True
    for v in ["default", "allreduce_hook", "bf16_compress_hook", "find_unused_parameters",
              "static_graph", "no_sync"]:
        tol = 2e-2 if v == "bf16_compress_hook" else 1e-5
        ok &= compare(f"ddp {v}", train_ddp(weft, v), train_ddp(gloo, v), tol)
    for v in ["fp32", "bf16", "no_reshard"]:
        tol = 2e-2 if v == "bf16" else 1e-5
        ok &= compare(f"fsdp2 {v}", train_fsdp(weft, v), train_fsdp(gloo, v), tol)
    # Gloo has no PREMUL_SUM: its twin scales the loss by n/3 and averages
    n = dist.get_world_size()
    ok &= compare("fsdp2 divide_factor", train_fsdp(weft, "divide_factor"),
                  train_fsdp(gloo, "fp32", loss_scale=n / 3.0), 1e-4)
    # a subgroup of weft trains with DDP too: ranks [0, last]
    members = [0, dist.get_world_size() - 1]
    sub = dist.new_group(members, backend="weft")
    sub_gloo = dist.new_group(members, backend="gloo")
    if dist.get_rank() in members:
        ok &= compare("ddp subgroup", train_ddp(sub, "default"), train_ddp(sub_gloo, "default"),
                      1e-5)
    res = torch.tensor([0 if ok else 1])
    dist.all_reduce(res, group=gloo)
    if dist.get_rank() == 0:
        print(f"check_train: {dist.get_world_size()} ranks, "
              f"{'all variants match Gloo' if res.item() == 0 else 'FAILED'}", flush=True)
    dist.destroy_process_group()
    teardown.leave(1 if res.item() else 0)  # Gloo groups: see teardown.py


if __name__ == "__main__":
    main()
