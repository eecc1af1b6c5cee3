"""Every torch.distributed operation on the "weft" backend, compared with the
same call on a Gloo group of the same ranks in the same run: every dtype weft
has x every reduce op, odd sizes, in place and out of place, uneven
all_to_all_single splits, subgroups. Run under torchrun (2 or 3 ranks); exits
non-zero with the failing checks listed.
"""
import os
import sys
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "torch_weft"))
import torch_weft  # noqa: E402,F401
import teardown  # noqa: E402  (beside this script)

R = dist.ReduceOp
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-12,
       torch.float8_e4m3fn: 0.13, torch.float8_e5m2: 0.26}
SIZES = [1, 7, 1000, 4099]

failures = []
checks = 0


def check(name, got, want, dtype=None):
    global checks
    checks += 1
    dtype = dtype or got.dtype
    if got.shape != want.shape:
        failures.append(f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}")
        return
    if dtype in TOL:
        g, w = got.double(), want.double()
        tol = TOL[dtype]
        bad = (g - w).abs() > tol * (1 + w.abs())
        if bad.any():
            i = int(bad.nonzero()[0][0]) if bad.dim() == 1 else 0
            failures.append(f"{name}: {int(bad.sum())} elements off, e.g. [{i}] "
                            f"{g.flatten()[i].item()} != {w.flatten()[i].item()}")
    elif not torch.equal(got, want):
        diff = (got != want).nonzero()
        failures.append(f"{name}: {diff.shape[0]} elements differ, first at {diff[0].tolist()}")


def rand(dtype, n, seed, small=False):
    g = torch.Generator().manual_seed(seed)
    if dtype in INTS:
        lo, hi = (-2, 3) if small else (-50, 50)
        if dtype == torch.uint8:
            lo, hi = (0, 3) if small else (0, 100)
        return torch.randint(lo, hi, (n,), generator=g).to(dtype)
    if small:  # products stay near 1
        return (0.75 + 0.5 * torch.rand(n, generator=g, dtype=torch.float64)).to(dtype)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def ops_for(dtype):
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG]
    if dtype in INTS:
        ops += [R.BAND, R.BOR, R.BXOR]
    else:
        ops += ["premul"]
    return ops


def gloo_reduce_ref(x, op, gloo, n):
    """The all-reduce of x under Gloo, for ops Gloo lacks through others."""
    if op == R.AVG:
        y = x.to(torch.float64, copy=True) if x.is_floating_point() else x.clone()
        dist.all_reduce(y, R.SUM, group=gloo)
        return (y / n).to(x.dtype) if x.is_floating_point() else torch.div(y, n, rounding_mode="trunc")
    if op == "premul":
        y = x.double() * 0.375
        dist.all_reduce(y, R.SUM, group=gloo)
        return y.to(x.dtype)
    if x.dtype in FP8:
        y = x.double()
        dist.all_reduce(y, op, group=gloo)
        return y.to(x.dtype)
    y = x.clone()
    dist.all_reduce(y, op, group=gloo)
    return y


def weft_op(op):
    return dist._make_nccl_premul_sum(0.375) if op == "premul" else op


def opname(op):
    return op if isinstance(op, str) else str(op).split(".")[-1]


def run(group, gloo, tag, dtypes=INTS + FLOATS + FP8):
    r = dist.get_rank(group)
    n = dist.get_world_size(group)
    seed = 1000 * (dist.get_rank() + 1)

    for dtype in dtypes:
        for op in ops_for(dtype):
            if dtype in FP8 and op in (R.PRODUCT, "premul"):
                continue
            for size in SIZES:
                x = rand(dtype, size, seed + size, small=op in (R.PRODUCT,))
                want = gloo_reduce_ref(x, op, gloo, n)
                # in place
                got = x.clone()
                dist.all_reduce(got, weft_op(op), group=group)
                check(f"{tag} all_reduce {dtype} {opname(op)} n={size}", got, want)
            # out of place: a non-contiguous view reduced in place, async
            x = rand(dtype, 64, seed + 3, small=op == R.PRODUCT).reshape(8, 8)
            want = gloo_reduce_ref(x.t().contiguous(), op, gloo, n)
            got = x.clone().t()
            dist.all_reduce(got, weft_op(op), group=group, async_op=True).wait()
            check(f"{tag} all_reduce strided {dtype} {opname(op)}", got, want)

        # reduce: every root, each op
        for op in [R.SUM, R.MAX, R.MIN] + ([R.BXOR] if dtype in INTS else []):
            for root in range(n):
                x = rand(dtype, 33, seed + root)
                want = gloo_reduce_ref(x, op, gloo, n)
                got = x.clone()
                dist.reduce(got, dist.get_global_rank(group, root), op=weft_op(op), group=group)
                if r == root:
                    check(f"{tag} reduce {dtype} {opname(op)} root={root}", got, want)

        # broadcast, every root, odd sizes
        for root in range(n):
            for size in (1, 4099):
                x = rand(dtype, size, seed + 7 * root)
                want = x.clone()
                dist.broadcast(want.view(torch.uint8) if dtype in FP8 else want,
                               dist.get_global_rank(gloo, root), group=gloo)
                got = x.clone()
                dist.broadcast(got, dist.get_global_rank(group, root), group=group)
                check(f"{tag} broadcast {dtype} root={root} n={size}", got, want)

        # all-gathers: list, into a tensor, in place, coalesced
        for size in (1, 1001):
            x = rand(dtype, size, seed + 11)
            x_ref = x.view(torch.uint8) if dtype in FP8 else x
            want = [torch.zeros_like(x_ref) for _ in range(n)]
            dist.all_gather(want, x_ref, group=gloo)
            want = torch.cat(want).view(dtype)
            got = [torch.full_like(x, 7) for _ in range(n)]
            dist.all_gather(got, x, group=group)
            check(f"{tag} all_gather {dtype} n={size}", torch.cat(got), want)
            out = torch.full((n * size,), 3, dtype=dtype) if dtype not in FP8 else torch.zeros(n * size, dtype=dtype)
            dist.all_gather_into_tensor(out, x, group=group)
            check(f"{tag} all_gather_into_tensor {dtype} n={size}", out, want)
            out = torch.zeros(n * size, dtype=dtype)
            out[r * size:(r + 1) * size] = x
            dist.all_gather_into_tensor(out, out[r * size:(r + 1) * size], group=group)
            check(f"{tag} all_gather_into_tensor in place {dtype} n={size}", out, want)

        # reduce-scatters: tensor (in and out of place), list, each op
        for op in ops_for(dtype):
            if dtype in FP8 and op in (R.PRODUCT, "premul"):
                continue
            size = 37
            x = rand(dtype, n * size, seed + 13, small=op == R.PRODUCT)
            full = gloo_reduce_ref(x, op, gloo, n)
            want = full[r * size:(r + 1) * size]
            out = torch.zeros(size, dtype=dtype)
            dist.reduce_scatter_tensor(out, x.clone(), weft_op(op), group=group)
            check(f"{tag} reduce_scatter_tensor {dtype} {opname(op)}", out, want)
            buf = x.clone()
            dist.reduce_scatter_tensor(buf[r * size:(r + 1) * size], buf, weft_op(op), group=group)
            check(f"{tag} reduce_scatter_tensor in place {dtype} {opname(op)}",
                  buf[r * size:(r + 1) * size], want)
            out = torch.zeros(size, dtype=dtype)
            dist.reduce_scatter(out, list(x.clone().chunk(n)), weft_op(op), group=group)
            check(f"{tag} reduce_scatter list {dtype} {opname(op)}", out, want)

        # all-to-all: even, uneven (some blocks empty), list form
        x = rand(dtype, n * 5 * 3, seed + 17).reshape(n * 5, 3)
        xr = x.view(torch.uint8) if dtype in FP8 else x
        want = torch.empty_like(xr)
        dist.all_to_all_single(want, xr, group=gloo)
        got = torch.zeros_like(x)
        dist.all_to_all_single(got, x, group=group)
        check(f"{tag} all_to_all_single even {dtype}", got, want.view(dtype))
        # blocks of 9001 rows and more are past weft's single-copy threshold (64 KiB)
        # for 2-byte types and wider: the receivers copy them from the senders' tensors
        for rows in (1, 9001):
            in_splits = [(r + p) % 3 * rows for p in range(n)]   # rows to rank p, 0 for some
            out_splits = [(p + r) % 3 * rows for p in range(n)]  # rows from rank p
            x = rand(dtype, sum(in_splits) * 3, seed + 19).reshape(-1, 3)
            xr = x.view(torch.uint8) if dtype in FP8 else x
            want = torch.empty(sum(out_splits), 3, dtype=xr.dtype)
            dist.all_to_all_single(want, xr, out_splits, in_splits, group=gloo)
            got = torch.zeros(sum(out_splits), 3, dtype=dtype)
            dist.all_to_all_single(got, x, out_splits, in_splits, group=group)
            check(f"{tag} all_to_all_single uneven x{rows} {dtype}", got, want.view(dtype))
        ins = [rand(dtype, 5, seed + 23 + p) for p in range(n)]
        # the reference through all_to_all_single: Gloo has no list all_to_all before torch 2.12
        want = torch.empty(5 * n, dtype=torch.uint8 if dtype in FP8 else dtype)
        dist.all_to_all_single(want, torch.cat([t.view(torch.uint8) if dtype in FP8 else t
                                                for t in ins]), group=gloo)
        got = [torch.zeros(5, dtype=dtype) for _ in range(n)]
        dist.all_to_all(got, ins, group=group)
        check(f"{tag} all_to_all list {dtype}", torch.cat(got), want.view(dtype))

    # gather and scatter, every root
    for root in range(n):
        groot = dist.get_global_rank(group, root)
        x = rand(torch.float32, 17, seed + 29)
        want = [torch.zeros(17) for _ in range(n)] if r == root else None
        dist.gather(x, want, dst=dist.get_global_rank(gloo, root), group=gloo)
        got = [torch.full((17,), -1.0) for _ in range(n)] if r == root else None
        dist.gather(x, got, dst=groot, group=group)
        if r == root:
            check(f"{tag} gather root={root}", torch.cat(got), torch.cat(want))
        chunks = [rand(torch.int64, 9, 31 + root * 10 + p) for p in range(n)]
        got = torch.zeros(9, dtype=torch.int64)
        dist.scatter(got, chunks if r == root else None, src=groot, group=group)
        check(f"{tag} scatter root={root}", got, chunks[r])

    # coalesced: all_reduce, all_gather_into_tensor and reduce_scatter_tensor
    xs = [rand(torch.float32, s, seed + s) for s in (3, 100, 1)]
    wants = [gloo_reduce_ref(t, R.SUM, gloo, n) for t in xs]
    gots = [t.clone() for t in xs]
    with dist._coalescing_manager(group=group, async_ops=True) as cm:
        for t in gots:
            dist.all_reduce(t, group=group)
    cm.wait()
    for i, (g, w) in enumerate(zip(gots, wants)):
        check(f"{tag} all_reduce coalesced [{i}]", g, w)
    outs = [torch.zeros(n * t.numel()) for t in xs]
    with dist._coalescing_manager(group=group):
        for o, t in zip(outs, xs):
            dist.all_gather_into_tensor(o, t, group=group)
    for i, (o, t) in enumerate(zip(outs, xs)):
        w = [torch.zeros_like(t) for _ in range(n)]
        dist.all_gather(w, t, group=gloo)
        check(f"{tag} all_gather_into_tensor coalesced [{i}]", o, torch.cat(w))
    ins = [rand(torch.float64, n * s, seed + s) for s in (2, 50)]
    outs = [torch.zeros(t.numel() // n, dtype=torch.float64) for t in ins]
    with dist._coalescing_manager(group=group):
        for o, t in zip(outs, ins):
            dist.reduce_scatter_tensor(o, t, group=group)
    for i, (o, t) in enumerate(zip(outs, ins)):
        s = o.numel()
        check(f"{tag} reduce_scatter_tensor coalesced [{i}]", o,
              gloo_reduce_ref(t, R.SUM, gloo, n)[r * s:(r + 1) * s])
    # one output list per rank, each with one tensor per input (Gloo's layout)
    xs = [rand(torch.float32, 4, seed), rand(torch.float32, 9, seed + 1),
          rand(torch.float32, 1, seed + 2)]
    lists = [[torch.zeros_like(x) for x in xs] for _ in range(n)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_coalesced(lists, xs, group=group)
    for i, x in enumerate(xs):
        w = [torch.zeros_like(x) for _ in range(n)]
        dist.all_gather(w, x, group=gloo)
        check(f"{tag} all_gather_coalesced [{i}]", torch.cat([lst[i] for lst in lists]),
              torch.cat(w))

    # point to point: blocking ring, crossing isend/irecv, batch_isend_irecv
    nxt, prv = (r + 1) % n, (r - 1) % n
    gn, gp = dist.get_global_rank(group, nxt), dist.get_global_rank(group, prv)
    big = 1 << 20  # past any connection buffer: a crossing pair must not deadlock
    x = rand(torch.float32, big, seed + 37)
    src = rand(torch.float32, big, 1000 * (dist.get_global_rank(group, prv) + 1) + 37)
    got = torch.zeros(big)
    reqs = [dist.isend(x, gn, group=group), dist.irecv(got, gp, group=group)]
    for q in reqs:
        q.wait()
    check(f"{tag} isend/irecv ring", got, src)
    got = torch.zeros(big)
    ops = [dist.P2POp(dist.irecv, got, gp, group), dist.P2POp(dist.isend, x, gn, group)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    check(f"{tag} batch_isend_irecv", got, src)
    if n >= 2:
        got = torch.zeros(5, dtype=torch.int64)
        if r == 0:
            dist.send(torch.arange(5), dist.get_global_rank(group, n - 1), group=group)
        elif r == n - 1:
            dist.recv(got, dist.get_global_rank(group, 0), group=group)
            check(f"{tag} send/recv", got, torch.arange(5))

    # objects ride on the tensor collectives
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "s": "x" * r}, group=group)
    check(f"{tag} all_gather_object", torch.tensor([o["rank"] for o in objs]), torch.arange(n))
    lst = [{"k": 42}, "s"] if r == 0 else [None, None]
    dist.broadcast_object_list(lst, src=dist.get_global_rank(group, 0), group=group)
    check(f"{tag} broadcast_object_list", torch.tensor([lst[0]["k"]]), torch.tensor([42]))
    out = [None]
    dist.scatter_object_list(out, [p * 3 for p in range(n)] if r == 0 else None,
                             src=dist.get_global_rank(group, 0), group=group)
    check(f"{tag} scatter_object_list", torch.tensor([out[0]]), torch.tensor([r * 3]))
    gathered = [None] * n if r == 0 else None
    dist.gather_object(r * 5, gathered, dst=dist.get_global_rank(group, 0), group=group)
    if r == 0:
        check(f"{tag} gather_object", torch.tensor(gathered), torch.arange(n) * 5)
    dist.barrier(group=group)


def errors(group):
    """Bad input raises a clear error and the group still works after."""
    global checks
    cases = [
        ("int16 SUM", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16), group=group),
         "not supported for reductions"),
        ("float BAND", lambda: dist.all_reduce(torch.ones(3), R.BAND, group=group),
         "bitwise reductions need an integer"),
        ("bad split", lambda: dist.all_to_all_single(torch.zeros(4), torch.zeros(4), [1] * 9,
                                                     [1] * 9, group=group), "splits"),
        # as NCCL: an integer factor would be truncated (0.5 gave 0)
        ("int64 PREMUL_SUM", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64),
                                                     dist._make_nccl_premul_sum(0.5), group=group),
         "PREMUL_SUM needs"),
    ]
    for name, fn, text in cases:
        checks += 1
        try:
            fn()
            failures.append(f"error {name}: no exception")
        except Exception as e:  # noqa: BLE001
            if text not in str(e):
                failures.append(f"error {name}: message {str(e)[:200]!r} lacks {text!r}")
    t = torch.ones(5)
    dist.all_reduce(t, group=group)
    check("all_reduce after errors", t, torch.full((5,), float(dist.get_world_size(group))))
    # complex sums run on the real and imaginary parts
    z = torch.complex(torch.ones(4), torch.full((4,), float(dist.get_rank())))
    dist.all_reduce(z, group=group)
    n = dist.get_world_size(group)
    check("complex all_reduce", torch.view_as_real(z),
          torch.view_as_real(torch.complex(torch.full((4,), float(n)),
                                           torch.full((4,), float(sum(range(n)))))))


def params(group):
    """Parameters (leaves that require grad), contiguous or not (a channels-last
    convolution, a transposed matrix), reduced, broadcast and received in place
    as Gloo takes them; autograd sees no in-place op."""
    r = dist.get_rank(group)
    n = dist.get_world_size(group)
    src = dist.get_global_rank(group, 0)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    p = torch.nn.Parameter((base + r).t())  # non-contiguous leaf
    dist.all_reduce(p, group=group)
    check("parameter all_reduce (transposed)", p.detach(), n * base.t() + sum(range(n)))
    q = torch.nn.Parameter((base + r).t())
    dist.broadcast(q, src=src, group=group, async_op=True).wait()
    check("parameter broadcast (transposed, async)", q.detach(), base.t())
    torch.manual_seed(17 + r)
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    for t in conv.parameters():
        dist.broadcast(t, src=src, group=group)
    torch.manual_seed(17)
    want = torch.nn.Conv2d(3, 4, 3)
    check("channels-last conv weight broadcast", conv.weight.detach().contiguous(),
          want.weight.detach())
    check("channels-last conv bias broadcast", conv.bias.detach(), want.bias.detach())
    global checks
    checks += 1
    if not (p.requires_grad and q.requires_grad and p.grad is None and p.is_leaf):
        failures.append("a parameter reduced in place lost requires_grad or gained a grad")
    if n > 1:  # a receive into a transposed parameter
        z = torch.nn.Parameter(torch.zeros(3, 4).t())
        if r == 0:
            dist.send(base.t().contiguous(), dst=dist.get_global_rank(group, 1), group=group)
        elif r == 1:
            dist.recv(z, src=src, group=group)
            check("parameter recv (transposed)", z.detach(), base.t())


def main():
    dist.init_process_group("weft", timeout=timedelta(seconds=120))
    world = dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    run(dist.group.WORLD, gloo, f"world{world}")
    errors(dist.group.WORLD)
    params(dist.group.WORLD)
    # a subgroup of the first and last rank, with its own Gloo twin
    members = [0, world - 1]
    sub = dist.new_group(members, backend="weft")
    sub_gloo = dist.new_group(members, backend="gloo")
    if dist.get_rank() in members:
        run(sub, sub_gloo, f"sub{members}",
            dtypes=[torch.uint8, torch.int64, torch.bfloat16, torch.float32, torch.float8_e5m2])
    # the same ranks split from the world group (weftCommSplit, no store
    # rendezvous); with 3 ranks the middle one is in no group of the split
    try:
        split = dist.split_group(split_ranks=[members])
    except RuntimeError as e:  # torch 2.11 splits only a group bound to an accelerator
        if "No device associated" not in str(e):
            raise
        print(f"rank {dist.get_rank()}: split_group skipped on torch {torch.__version__}: {e}",
              flush=True)
        split = None
    if split is None:
        pass
    elif dist.get_rank() in members:
        global checks
        checks += 1
        if dist.get_world_size(split) != len(members) or \
                dist.get_rank(split) != members.index(dist.get_rank()):
            failures.append(f"split_group: rank {dist.get_rank(split)} of "
                            f"{dist.get_world_size(split)}")
        run(split, sub_gloo, f"split{members}", dtypes=[torch.int32, torch.float32])
    elif split is not dist.GroupMember.NON_GROUP_MEMBER:
        failures.append("split_group gave a group to a rank outside it")
    dist.barrier()
    # every rank reports; rank 0 sums
    res = torch.tensor([len(failures), checks], dtype=torch.int64)
    dist.all_reduce(res, group=gloo)
    for f in failures[:40]:
        print(f"rank {dist.get_rank()}: FAIL {f}", flush=True)
    if dist.get_rank() == 0:
        print(f"check_ops: {world} ranks, {int(res[1])} checks, {int(res[0])} failures", flush=True)
    dist.destroy_process_group()
    teardown.leave(1 if res[0] else 0)  # Gloo groups: see teardown.py


if __name__ == "__main__":
    main()
