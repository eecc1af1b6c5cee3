"""TORCH_DISTRIBUTED_DEBUG=DETAIL (run.sh detail N sets it): torch's collective
checker wraps weft's backend as it wraps Gloo's and NCCL's, on the world group
and on a subgroup. Calls whose shapes (same element count), kinds or dtypes
differ between ranks raise "Detected mismatch between collectives" on every
rank, before anything runs, and the group goes on working; a send between
two ranks only does not put the others out of step (the checker compares
the collectives' count, as NCCL's); matching calls
give the right results through the wrapper (random inputs, each op checked
against the sum or concatenation computed here).
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "torch_weft"))
import torch_weft  # noqa: E402,F401

failures = 0


def fail(msg):
    global failures
    failures += 1
    print(f"rank {dist.get_rank()}: FAIL: {msg}", flush=True)


def expect_mismatch(what, call):
    try:
        call()
    except RuntimeError as e:
        if "Detected mismatch between collectives" not in str(e):
            fail(f"{what}: raised without naming the mismatch: {str(e)[:200]}")
        return
    fail(f"{what}: no error")


def inputs(seed, world, shape, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-1000, 1000, shape, generator=g).to(dtype) for _ in range(world)]


def check_group(group, tag):
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    kind = type(group._get_backend(torch.device("cpu"))).__name__
    if kind != "_ProcessGroupWrapper":
        fail(f"{tag}: the cpu backend is {kind}, not torch's checker")
    # the same element count, other shapes; then another kind; then another dtype
    expect_mismatch(f"{tag}: shapes", lambda: dist.all_reduce(
        torch.zeros((2, 3) if rank == 0 else (3, 2)), group=group))
    expect_mismatch(f"{tag}: barrier against all-reduce", lambda: dist.barrier(group=group)
                    if rank == 0 else dist.all_reduce(torch.zeros(1, dtype=torch.uint8),
                                                      group=group))
    expect_mismatch(f"{tag}: dtypes", lambda: dist.all_reduce(
        torch.zeros(4, dtype=torch.float32 if rank == 0 else torch.float64), group=group))
    # sends and receives between two ranks only (a pipeline's) do not make the
    # others' collectives look out of step: the checker compares collectives
    if world >= 2:
        x = torch.arange(5, dtype=torch.float64) + 10 * world
        if rank == 0:
            dist.send(x, group_dst=1, group=group)
        elif rank == 1:
            y = torch.zeros(5, dtype=torch.float64)
            dist.recv(y, group_src=0, group=group)
            if not torch.equal(x, y):
                fail(f"{tag}: the received tensor differs")
        t = torch.ones(3)
        dist.all_reduce(t, group=group)
        if t.tolist() != [float(world)] * 3:
            fail(f"{tag}: all_reduce after a send between two ranks gave {t.tolist()}")
    # matching calls after the refusals: right results
    for seed, shape in ((1, (7,)), (2, (3, 5)), (3, (1001,))):
        xs = inputs(seed + 100 * world, world, shape)
        t = xs[rank].clone()
        dist.all_reduce(t, group=group)
        if not torch.equal(t, sum(xs)):
            fail(f"{tag}: all_reduce {shape} differs from the sum")
        out = torch.empty((world,) + shape, dtype=xs[0].dtype)
        dist.all_gather_into_tensor(out, xs[rank], group=group)
        if not torch.equal(out, torch.stack(xs)):
            fail(f"{tag}: all_gather_into_tensor {shape} differs")
        big = inputs(seed + 7, world, (world * shape[0],) + shape[1:])
        part = torch.empty(shape, dtype=xs[0].dtype)
        dist.reduce_scatter_tensor(part, big[rank], group=group)
        if not torch.equal(part, sum(big).chunk(world)[rank]):
            fail(f"{tag}: reduce_scatter_tensor {shape} differs")
        b = xs[rank].clone()
        dist.broadcast(b, group_src=world - 1, group=group)
        if not torch.equal(b, xs[world - 1]):
            fail(f"{tag}: broadcast {shape} differs")


def main():
    dist.init_process_group("weft")
    if dist.get_debug_level() != dist.DebugLevel.DETAIL:
        print("run with TORCH_DISTRIBUTED_DEBUG=DETAIL (run.sh detail N)", flush=True)
        sys.exit(2)
    rank, world = dist.get_rank(), dist.get_world_size()
    check_group(dist.group.WORLD, "world")
    sub = dist.new_group(list(range(world - 1, -1, -1)))  # every rank, reversed
    check_group(sub, "reversed subgroup")
    dist.destroy_process_group()
    if failures:
        sys.exit(1)
    print(f"rank {rank}: mismatches caught and results right through torch's checker", flush=True)


if __name__ == "__main__":
    main()
