"""PyTorch FSDP2 (fully_shard per block, then the root) training weft-train's
transformer (tests/zero/gpt2_ref.py's model), fp32 with AdamW, on random
bytes: prints tokens/s over the steps after the first two. Under torchrun:

  torchrun --standalone --nproc-per-node 2 tools/train/gpt2_fsdp_bench.py \
      --backend gloo --model tiny --batch 24 --steps 10

--backend weft needs torch_weft importable (tools/torch_weft built)."""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "zero"))
from gpt2_ref import GPT  # noqa: E402

SHAPES = {"tiny": (5, 4, 128, 64), "mid": (6, 6, 384, 256), "gpt2": (12, 12, 768, 1024)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo")
    p.add_argument("--model", default="tiny", choices=SHAPES)
    p.add_argument("--batch", type=int, default=24, help="global sequences per step")
    p.add_argument("--seq", type=int, default=0)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    if a.backend == "weft":
        import torch_weft  # noqa: F401  registers the backend
    torch.set_num_threads(1)
    dist.init_process_group(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    L, H, C, T = SHAPES[a.model]
    seq = a.seq or T
    torch.manual_seed(0)
    model = GPT(L, H, C, T)
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    B = a.batch // n
    g = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(a.steps):
        w = torch.randint(0, 256, (B, seq + 1), generator=g)
        t0 = time.perf_counter()
        loss = model(w[:, :-1], w[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach())
        times.append(time.perf_counter() - t0)
    if rank == 0:
        tok = a.batch * seq * (len(times) - 2) / sum(times[2:])
        print(f"fsdp2 {a.backend} {a.model}: {tok:.0f} tokens/s over steps 3-{a.steps} "
              f"({a.batch * seq} tokens a step)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
