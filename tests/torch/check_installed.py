"""The installed wheel (tests/tools/test_wheel.sh) under torchrun: a program
that never imports torch_weft names the "weft" backend, which torch's autoload
registered at `import torch` without changing the CPU allocator; DDP and FSDP2
training steps on it give Gloo's losses and parameters. Run under torchrun (2 or
3 ranks); exits non-zero with the failing checks listed.
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, DIM, SEQ, BATCH, STEPS = 64, 32, 12, 4, 3


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.0, batch_first=True)
            for _ in range(2))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def loss_of(model, batch):
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def train(group, kind):
    torch.manual_seed(0)
    model = Tiny()
    if kind == "ddp":
        wrapped = DDP(model, process_group=group, bucket_cap_mb=0.01)
    else:
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = loss_of(wrapped, torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [p.full_tensor() if kind == "fsdp2" else p for p in model.parameters()]
    return [p.detach().clone() for p in params], losses


def main():
    failures = []
    # registered by `import torch` alone (the entry point), the package not kept
    # imported, and torch's CPU allocator left alone
    if "weft" not in dist.Backend.backend_list:
        failures.append("the weft backend is not registered at import torch")
    if "torch_weft" in sys.modules:
        failures.append("torch_weft stayed imported")
    ext = sys.modules.get("torch_weft._C")
    if ext is None or ext.allocator_stats()["installed"]:
        failures.append("the autoload changed the CPU allocator (or did not load the extension)")
    elif not ext.__file__.startswith(sys.prefix):
        failures.append(f"the extension {ext.__file__} is not the installed one ({sys.prefix})")
    dist.init_process_group("weft", timeout=timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    for kind in ["ddp", "fsdp2"]:
        (pw, lw), (pg, lg) = train(dist.group.WORLD, kind), train(gloo, kind)
        lossdiff = max(abs(a - b) for a, b in zip(lw, lg))
        worst = max(((a - b).abs().max() / (1 + b.abs().max())).item() for a, b in zip(pw, pg))
        ok = lossdiff <= 1e-4 and worst <= 1e-5
        print(f"rank {dist.get_rank()}: {kind} losses {' '.join(f'{x:.6f}' for x in lw)} "
              f"(Gloo's differ by {lossdiff:.1e}, parameters by {worst:.1e}) "
              f"{'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(f"{kind} differs from Gloo")
    for f in failures:
        print(f"rank {dist.get_rank()}: FAIL {f}", flush=True)
    res = torch.tensor([len(failures)])
    dist.all_reduce(res, group=gloo)
    if dist.get_rank() == 0:
        print(f"check_installed: {dist.get_world_size()} ranks, "
              f"{'ok' if res.item() == 0 else 'FAILED'}", flush=True)
    dist.destroy_process_group()
    # leave as tests/torch/teardown.py says (Gloo's threads at finalization)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if res.item() else 0)


if __name__ == "__main__":
    main()
