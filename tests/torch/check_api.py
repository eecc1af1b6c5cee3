"""torch.distributed paths of the "weft" backend that its CUDA runs take too,
checked on host tensors: a group made while the default group has a bound
device (init_process_group(device_id=...), as tests/nccl/ddp_loss.py does),
PREMUL_SUM inside a coalesced block (FSDP2's divide factor), PREMUL_SUM on a
one-rank group (weft's device path refuses it: the backend scales locally),
a coalesced block whose second operation fails (the weft group must be
closed, or every later call of the thread would be taken into it), and
operations that copy or flatten their inputs, queued behind one that writes
them, reading them when they run; blocking calls inside a coalescing block, and
all_to_all_single refusing an output of another size than its input; a
Work's future complete once wait() returns; and,
last, abort() of a group from a Work's callback (on the backend's worker
thread) and from another thread while its operations wait. Run under
torchrun (2 or 3 ranks); exits non-zero with the failing checks listed.

--device cuda (tools/scripts/gpu-check.sh, step torch_weft_cuda) runs the same on
cuda:0, which every rank shares, and adds what only a GPU shows: operations on
a side stream (an empty tensor among them), wait() and get_future().then()
ordering the current stream after an operation on another stream, and the
object collectives on a "cuda:weft" group, which torch stages on the GPU.
"""
import argparse
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "torch_weft"))
import torch_weft  # noqa: E402,F401
import teardown  # noqa: E402  (beside this script)

failures = []
checks = 0


def check(name, got, want, tol=1e-6):
    global checks
    checks += 1
    got, want = got.cpu(), want.cpu()
    if got.shape != want.shape:
        failures.append(f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    elif not torch.allclose(got.double(), want.double(), rtol=tol, atol=tol):
        bad = ((got.double() - want.double()).abs() > tol).nonzero()
        first = bad[0].tolist() if bad.numel() else "?"
        failures.append(f"{name}: {bad.shape[0]} elements off, first at {first}: "
                        f"{got.flatten()[0].item()} vs {want.flatten()[0].item()}")


DEV = torch.device("cpu")


def rank_data(rank, n, dtype=torch.float64, tag=0, dev=None):
    """rank's random data on DEV (on the host with dev="cpu", for references)."""
    g = torch.Generator().manual_seed(7919 * (rank + 1) + tag)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype).to(dev or DEV)


def premul_sum(n, world, factor, dtype, tag):
    """What a PREMUL_SUM of every rank's rank_data gives."""
    return sum(rank_data(r, n, dtype, tag, "cpu").double() * factor for r in range(world))


def check_bound_new_group():
    """Ranks outside new_group(ranks) get perform_nocolor_split from torch when
    the default group has a bound device; members get a working group."""
    r, world = dist.get_rank(), dist.get_world_size()
    members = [0, world - 1]
    sub = dist.new_group(members)
    t = rank_data(r, 11, tag=1)
    if r in members:
        dist.all_reduce(t, group=sub)
        check("bound: new_group all_reduce", t,
              sum(rank_data(m, 11, tag=1) for m in members))
    t = torch.ones(3, device=DEV)
    dist.all_reduce(t)
    check("bound: world all_reduce after new_group", t, torch.full((3,), float(world)))


def check_premul_coalesced():
    r, world = dist.get_rank(), dist.get_world_size()
    sizes = [5, 1001, 3]
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        ts = [rank_data(r, n, dtype, tag=10 + i) for i, n in enumerate(sizes)]
        with dist._coalescing_manager(async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.375))
        cm.wait()
        for i, (t, n) in enumerate(zip(ts, sizes)):
            check(f"premul all_reduce coalesced {dtype} [{i}]", t,
                  premul_sum(n, world, 0.375, dtype, 10 + i), tol)
        ins = [rank_data(r, n * world, dtype, tag=20 + i) for i, n in enumerate(sizes)]
        outs = [torch.full((n,), float("nan"), dtype=dtype, device=DEV) for n in sizes]
        with dist._coalescing_manager():
            for o, x in zip(outs, ins):
                dist.reduce_scatter_tensor(o, x, op=dist._make_nccl_premul_sum(0.25))
        for i, (o, n) in enumerate(zip(outs, sizes)):
            full = premul_sum(n * world, world, 0.25, dtype, 20 + i)
            check(f"premul reduce_scatter coalesced {dtype} [{i}]", o,
                  full[r * n:(r + 1) * n], tol)


def check_premul_one_rank():
    """PREMUL_SUM on one rank is the input scaled (in place, out of place,
    a tensor factor, a non-contiguous view)."""
    r, world = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group([p]) for p in range(world)]  # every rank makes every group
    me = groups[r]
    x = rank_data(r, 33, torch.float32, tag=30)
    t = x.clone()
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=me)
    check("premul one rank all_reduce", t, x * 0.5)
    t = x.clone()
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(torch.tensor([0.125], device=DEV)),
                    group=me)
    check("premul one rank all_reduce tensor factor", t, x * 0.125)
    m = rank_data(r, 48, torch.float32, tag=31).reshape(6, 8)
    v = m.clone().t()
    dist.all_reduce(v, op=dist._make_nccl_premul_sum(3.0), group=me)
    check("premul one rank all_reduce strided", v, m.t() * 3.0)
    out = torch.full((33,), float("nan"), device=DEV)
    dist.reduce_scatter_tensor(out, x, op=dist._make_nccl_premul_sum(0.75), group=me)
    check("premul one rank reduce_scatter", out, x * 0.75)
    h = rank_data(r, 9, torch.float16, tag=32)
    hh = h.clone()
    dist.all_reduce(hh, op=dist._make_nccl_premul_sum(0.1), group=me)
    check("premul one rank float16", hh, (h.float() * torch.tensor(0.1).half().float()).half(),
          2e-3)


def check_failed_coalesced_block():
    """A coalesced block whose second all-reduce is refused raises, and the
    group works afterwards."""
    global checks
    world = dist.get_world_size()
    checks += 1
    try:
        with dist._coalescing_manager():
            dist.all_reduce(torch.ones(4, device=DEV))
            dist.all_reduce(torch.ones(4, dtype=torch.int16, device=DEV))
        failures.append("coalesced block with an int16 all_reduce: no exception")
    except Exception as e:  # noqa: BLE001
        if "not supported for reductions" not in str(e):
            failures.append(f"coalesced int16: message {str(e)[:200]!r}")
    for i in range(2):
        t = rank_data(dist.get_rank(), 17, tag=40 + i)
        dist.all_reduce(t)
        check(f"all_reduce {i} after a failed coalesced block", t,
              sum(rank_data(p, 17, tag=40 + i) for p in range(world)))


def check_blocking_in_coalesced_block():
    """Blocking broadcasts inside a _coalescing_manager block, which torch
    waits on at once, run when the block ends, as NCCL's do: the block ends
    (waiting inside it waited forever) and their results are right."""
    world, rank = dist.get_world_size(), dist.get_rank()
    a, b = rank_data(rank, 13, tag=60), rank_data(rank, 7, tag=61)
    with dist._coalescing_manager(device=DEV):
        dist.broadcast(a, 0)
        dist.broadcast(b, world - 1)
    check("broadcast from rank 0 in a coalesced block", a, rank_data(0, 13, tag=60))
    check(f"broadcast from rank {world - 1} in a coalesced block", b,
          rank_data(world - 1, 7, tag=61))


def check_a2a_single_sizes():
    """all_to_all_single without splits refuses an output of another size
    than its input, and writes nothing past the output it was given (it
    wrote a smaller output's whole input's worth)."""
    global checks
    world, rank = dist.get_world_size(), dist.get_rank()
    buf = torch.full((4 * world,), -7.0, dtype=torch.float64, device=DEV)
    inp = rank_data(rank, 4 * world, tag=62)
    checks += 1
    try:
        dist.all_to_all_single(buf[:2 * world], inp)
        failures.append("all_to_all_single, output half the input: no exception")
    except Exception as e:  # noqa: BLE001
        if "must be equal" not in str(e):
            failures.append(f"all_to_all_single size mismatch: message {str(e)[:200]!r}")
    check("all_to_all_single refused: the buffer untouched", buf,
          torch.full((4 * world,), -7.0, dtype=torch.float64))
    out = torch.empty(4 * world, dtype=torch.float64, device=DEV)
    dist.all_to_all_single(out, inp)
    want = torch.cat([rank_data(p, 4 * world, tag=62, dev="cpu")[4 * rank:4 * rank + 4]
                      for p in range(world)])
    check("all_to_all_single after a refused one", out, want)


def check_queued_strided():
    """An async operation on a strided view, queued behind an async
    operation on its base, sees what that one wrote (the staging copy of a
    non-contiguous tensor is made when the operation runs)."""
    world = dist.get_world_size()
    for i in range(5):
        x = rank_data(dist.get_rank(), 64 * 64, torch.float64, tag=60 + i).reshape(64, 64)
        w1 = dist.all_reduce(x, async_op=True)
        w2 = dist.all_reduce(x.t(), async_op=True)
        w1.wait()
        w2.wait()
        once = sum(rank_data(p, 64 * 64, torch.float64, 60 + i, "cpu") for p in range(world))
        check(f"strided all_reduce queued behind its base's [{i}]", x,
              once.reshape(64, 64) * world, 1e-9)
    # strided inputs of all_gather_into_tensor, reduce_scatter_tensor and
    # all_to_all_single, each queued behind an all-reduce of their base
    r, rows = dist.get_rank(), 4 * world
    base = rank_data(r, rows * rows, torch.float64, tag=70).reshape(rows, rows)
    summed = sum(rank_data(p, rows * rows, torch.float64, 70, "cpu")
                 for p in range(world)).reshape(rows, rows)
    gathered = torch.full((world * rows * rows,), float("nan"), dtype=torch.float64, device=DEV)
    scattered = torch.full((rows * rows // world,), float("nan"), dtype=torch.float64, device=DEV)
    swapped = torch.full((rows, rows), float("nan"), dtype=torch.float64, device=DEV)
    works = [dist.all_reduce(base, async_op=True),
             dist.all_gather_into_tensor(gathered, base.t(), async_op=True),
             dist.all_reduce(base, async_op=True),
             dist.reduce_scatter_tensor(scattered, base.t(), async_op=True),
             dist.all_to_all_single(swapped, base.t(), async_op=True)]
    for w in works:
        w.wait()
    want = summed.t().contiguous().flatten()
    check("strided all_gather_into_tensor queued", gathered, torch.cat([want] * world), 1e-9)
    full = summed.t().contiguous().flatten() * world * world
    n = rows * rows // world
    check("strided reduce_scatter_tensor queued", scattered, full[r * n:(r + 1) * n], 1e-9)
    block = rows // world  # every rank's rows are the same sum here
    want = (summed.t() * world).contiguous()[r * block:(r + 1) * block].repeat(world, 1)
    check("strided all_to_all_single queued", swapped, want, 1e-9)


INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def small_ints(rank, n, dtype, tag, dev=None):
    """rank's small whole numbers (exact in every dtype, sums of 3 ranks too)."""
    g = torch.Generator().manual_seed(104729 * (rank + 1) + tag)
    lo = 0 if dtype == torch.uint8 else -4
    return torch.randint(lo, 5, (n,), generator=g).to(dtype).to(dev or DEV)


def behind_broadcast(dtype, n, tag, op):
    """Queues a broadcast of the last rank's data into this rank's tensor,
    then op(tensor) -> (works, results): the last rank joins late, so on the
    others the broadcast is still pending when op is queued, and op must read
    the tensor when it runs. Returns (results, the broadcast data)."""
    r, src = dist.get_rank(), dist.get_world_size() - 1
    base = small_ints(r, n, dtype, tag)
    if r == src:
        time.sleep(0.03)
    works = [dist.broadcast(base, src=src, async_op=True)]
    more, results = op(base)
    for w in works + more:
        w.wait()
    return results, small_ints(src, n, dtype, tag, "cpu")


def check_queued_lists():
    """Operations that flatten or copy their inputs (reduce_scatter and
    scatter lists, all_to_all lists, send after a barrier, pre-multiplied and bitwise
    reduce-scatters) queued behind a broadcast writing those inputs see what
    it wrote: the copies are made when they run. Lists lying in one piece
    (chunks of one tensor) and lists that do not (reversed, strided)."""
    r, world = dist.get_rank(), dist.get_world_size()
    n = 7
    for i, dtype in enumerate(INTS + FLOATS + FP8):
        name, tag = str(dtype).replace("torch.", ""), 200 + 20 * i

        def a2a(base):
            outs = [torch.full((n,), 9, dtype=dtype, device=DEV) for _ in range(world)]
            ins = list(base.reshape(world * n, 2)[:, 1].chunk(world))  # strided
            return [dist.all_to_all(outs, ins, async_op=True)], outs
        got, want = behind_broadcast(dtype, 2 * world * n, tag, a2a)
        mine = want.reshape(world * n, 2)[:, 1].chunk(world)[r]
        for p in range(world):
            check(f"queued all_to_all strided list {name} from {p}", got[p], mine)

        for order in ("chunks", "reversed"):
            def sc(base):
                out = torch.full((n,), 9, dtype=dtype, device=DEV)
                parts = list(base.chunk(world))
                parts = parts if order == "chunks" else parts[::-1]
                return [dist.scatter(out, parts if r == 0 else None, src=0, async_op=True)], out
            got, want = behind_broadcast(dtype, world * n, tag + 1, sc)
            k = r if order == "chunks" else world - 1 - r
            check(f"queued scatter list ({order}) {name}", got, want.chunk(world)[k])

        def sendrecv(base):
            # sends do not wait for the group's collectives (NCCL's and
            # Gloo's do not): a blocking barrier does
            dist.barrier()
            buf = torch.full((n,), 9, dtype=dtype, device=DEV)
            if r == 0:
                return [dist.isend(base.reshape(n, 2)[:, 0], dst=1)], buf
            return ([dist.irecv(buf, src=0)] if r == 1 else []), buf
        got, want = behind_broadcast(dtype, 2 * n, tag + 2, sendrecv)
        if r == 1:
            check(f"send strided after a barrier {name}", got, want.reshape(n, 2)[:, 0])
        if dtype in FP8:
            continue

        for order in ("chunks", "reversed"):
            def rs(base):
                out = torch.full((n,), 9, dtype=dtype, device=DEV)
                parts = list(base.chunk(world))
                parts = parts if order == "chunks" else parts[::-1]
                return [dist.reduce_scatter(out, parts, async_op=True)], out
            got, want = behind_broadcast(dtype, world * n, tag + 3, rs)
            k = r if order == "chunks" else world - 1 - r
            check(f"queued reduce_scatter list ({order}) {name}", got,
                  want.chunk(world)[k].double() * world)

        if dtype in INTS:  # identical inputs: AND and OR give them back
            for op, lst in ((dist.ReduceOp.BAND, True), (dist.ReduceOp.BOR, False)):
                def bit(base):
                    out = torch.full((n,), 9, dtype=dtype, device=DEV)
                    if lst:
                        return [dist.reduce_scatter(out, list(base.chunk(world)), op=op,
                                                    async_op=True)], out
                    return [dist.reduce_scatter_tensor(out, base, op=op, async_op=True)], out
                got, want = behind_broadcast(dtype, world * n, tag + 4, bit)
                check(f"queued {op} reduce_scatter {'list' if lst else 'tensor'} {name}", got,
                      want.chunk(world)[r])
            continue

        for lst in (True, False):
            def pre(base):
                out = torch.full((n,), 9, dtype=dtype, device=DEV)
                op = dist._make_nccl_premul_sum(0.5)
                if lst:
                    return [dist.reduce_scatter(out, list(base[:world * n].chunk(world)),
                                                op=op, async_op=True)], out
                strided = base.reshape(world * n, 2)[:, 1]
                return [dist.reduce_scatter_tensor(out, strided, op=op, async_op=True)], out
            got, want = behind_broadcast(dtype, 2 * world * n, tag + 5, pre)
            src = want[:world * n] if lst else want.reshape(world * n, 2)[:, 1]
            check(f"queued premul reduce_scatter {'list' if lst else 'strided'} {name}", got,
                  src.chunk(world)[r].double() * 0.5 * world)


def check_list_aliasing():
    """reduce_scatter and scatter writing one of the tensors of their input
    list: this rank's (weft runs it in place) or another's (the list is
    read through a copy)."""
    r, world = dist.get_rank(), dist.get_world_size()
    for k, which in ((r, "own"), ((r + 1) % world, "another")):
        parts = list(rank_data(r, world * 5, tag=90).chunk(world))
        dist.reduce_scatter(parts[k], parts)
        want = sum(rank_data(p, world * 5, torch.float64, 90, "cpu") for p in range(world))
        check(f"reduce_scatter into the list's {which} block", parts[k], want.chunk(world)[r], 1e-9)
        parts = list(rank_data(r, world * 5, tag=91).chunk(world))
        out = parts[k] if r == 0 else torch.full((5,), float("nan"), dtype=torch.float64, device=DEV)
        dist.scatter(out, parts if r == 0 else None, src=0)
        check(f"scatter into the root's list ({which} block)", out,
              rank_data(0, world * 5, torch.float64, 91, "cpu").chunk(world)[r])


def check_empty_p2p():
    """Sends and receives of empty tensors (on a GPU their data may be NULL)
    go to weft, which does nothing for them: batch_isend_irecv mixing them
    with others, all_to_all_single with zero splits to some peers, and one
    with nothing at all; the group works afterwards."""
    r, world = dist.get_rank(), dist.get_world_size()
    nxt, prev = (r + 1) % world, (r - 1) % world
    a = rank_data(r, 33, torch.float32, tag=80)
    got = torch.full((33,), float("nan"), device=DEV)
    empty = [torch.empty(0, device=DEV) for _ in range(4)]
    ops = [dist.P2POp(dist.isend, empty[0], nxt), dist.P2POp(dist.isend, a, nxt),
           dist.P2POp(dist.isend, empty[1], nxt), dist.P2POp(dist.irecv, empty[2], prev),
           dist.P2POp(dist.irecv, got, prev), dist.P2POp(dist.irecv, empty[3], prev)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("empty isend/irecv among others", got, rank_data(prev, 33, torch.float32, 80, "cpu"))
    rows = [(r + p) % 3 for p in range(world)]  # what r sends p, and gets from p
    inp = rank_data(r, 4 * sum(rows), torch.float32, tag=81).reshape(-1, 4)
    out = torch.full((sum(rows), 4), float("nan"), device=DEV)
    dist.all_to_all_single(out, inp, rows, rows)
    at = 0
    for p in range(world):
        theirs = rank_data(p, 4 * sum((p + q) % 3 for q in range(world)), torch.float32, 81, "cpu")
        start = sum((p + q) % 3 for q in range(r))
        check(f"all_to_all_single zero splits: from {p}", out[at:at + rows[p]],
              theirs.reshape(-1, 4)[start:start + rows[p]])
        at += rows[p]
    dist.all_to_all_single(torch.empty(0, device=DEV), torch.empty(0, device=DEV))
    t = torch.ones(5, device=DEV)
    dist.all_reduce(t)
    check("all_reduce after empty sends and receives", t, torch.full((5,), float(world)))


def check_cuda_streams():
    """Operations on a side stream read what that stream produced; wait() and
    a future's then() order the current stream after them; an empty tensor
    is no error and leaves the group working."""
    r, world = dist.get_rank(), dist.get_world_size()
    main_stream, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main_stream)
    with torch.cuda.stream(side):
        x = rank_data(r, 1 << 20, torch.float32, tag=50) * 2  # made on side
        dist.all_reduce(x)
        dist.all_reduce(torch.empty(0, device=DEV))
        y = rank_data(r, 1 << 20, torch.float32, tag=51)
        work = dist.all_reduce(y, async_op=True)
    work.wait()  # the current (main) stream waits for the all-reduce on side
    want = sum(rank_data(p, 1 << 20, torch.float32, 51, "cpu") for p in range(world))
    check("side stream: wait() orders the current stream", y, want, 1e-4)
    main_stream.wait_stream(side)
    check("side stream all_reduce", x,
          sum(rank_data(p, 1 << 20, torch.float32, 50, "cpu") * 2 for p in range(world)), 1e-4)
    with torch.cuda.stream(side):
        z = rank_data(r, 4099, torch.float32, tag=52)
        fut = dist.all_reduce(z, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    check("future then() after a side-stream all_reduce", doubled,
          2 * sum(rank_data(p, 4099, torch.float32, 52, "cpu") for p in range(world)), 1e-4)
    t = torch.ones(5, device=DEV)
    dist.all_reduce(t)
    check("all_reduce after an empty one", t, torch.full((5,), float(world)))


def check_cuda_objects():
    """Object collectives on a group of CUDA tensors only, which torch stages
    on the GPU (sizes and pickles as CUDA byte tensors), then a barrier."""
    r, world = dist.get_rank(), dist.get_world_size()
    g = dist.new_group(backend="cuda:weft")
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": r, "pad": "x" * (1000 * r + 1)}, group=g)
    check("cuda objects: all_gather_object", torch.tensor([o["rank"] for o in objs]),
          torch.arange(world))
    lst = [{"k": 42}, "s" * 3000] if r == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0, group=g)
    check("cuda objects: broadcast_object_list", torch.tensor([lst[0]["k"], len(lst[1])]),
          torch.tensor([42, 3000]))
    gathered = [None] * world if r == 0 else None
    dist.gather_object(r * 5, gathered, dst=0, group=g)
    if r == 0:
        check("cuda objects: gather_object", torch.tensor(gathered), torch.arange(world) * 5)
    out = [None]
    dist.scatter_object_list(out, [p * 3 for p in range(world)] if r == 0 else None, src=0,
                             group=g)
    check("cuda objects: scatter_object_list", torch.tensor([out[0]]), torch.tensor([r * 3]))
    dist.barrier(group=g)
    dist.barrier()


def group_without_watchdog_exit(ranks):
    """A group that a check aborts on purpose, made with
    TORCH_WEFT_ASYNC_ERROR_HANDLING=0 (read as each group is made): under the
    default, as under NCCL's, a peer's abort is a failure whose watchdog ends
    the late rank's process before its own abort() comes."""
    before = os.environ.get("TORCH_WEFT_ASYNC_ERROR_HANDLING")
    os.environ["TORCH_WEFT_ASYNC_ERROR_HANDLING"] = "0"
    try:
        sub = dist.new_group(ranks)
        t = torch.ones(1024, device=DEV)
        dist.all_reduce(t, group=sub)  # connected
    finally:
        if before is None:
            del os.environ["TORCH_WEFT_ASYNC_ERROR_HANDLING"]
        else:
            os.environ["TORCH_WEFT_ASYNC_ERROR_HANDLING"] = before
    check("abort: the group works first", t, torch.full((1024,), float(len(ranks))))
    return sub


def check_abort_from_another_thread():
    """abort() of a group from another thread while its operations wait for
    late ranks (one in weft, the rest queued behind it): every one of them
    raises within seconds and nothing crashes; the late ranks' operations
    then raise too, and the default group still works (host tensors: on a
    GPU the late ranks' kernels report only at a later call)."""
    import threading
    r, world = dist.get_rank(), dist.get_world_size()
    sub = group_without_watchdog_exit(list(range(world)))
    if r == 0:
        works = [dist.all_reduce(torch.ones(1024, device=DEV), group=sub, async_op=True)
                 for _ in range(4)]
        time.sleep(0.5)  # the first waits in weft for the late ranks by now
        t0 = time.monotonic()
        # two aborts at once, from threads of their own (the backend's, then
        # torch's of the group): one frees the communicator, after the other
        backend = sub._get_backend(DEV)
        aborter = threading.Thread(target=dist.distributed_c10d._abort_process_group,
                                   args=(sub,))
        second = threading.Thread(target=backend.abort)
        second.start()
        aborter.start()
        raised = 0
        for w in works:
            try:
                w.wait()
            except Exception:  # noqa: BLE001  (DistBackendError or the aborted group's)
                raised += 1
        aborter.join()
        second.join()
        took = time.monotonic() - t0
        check("abort: every waiting operation raised", torch.tensor([raised]),
              torch.tensor([len(works)]))
        check(f"abort: raised within 5 s (took {took:.2f} s)", torch.tensor([float(took < 5)]),
              torch.tensor([1.0]))
    else:
        time.sleep(1.5)  # late: rank 0 has aborted by now
        t0 = time.monotonic()
        raised = 0
        try:
            for _ in range(3):
                dist.all_reduce(torch.ones(1024, device=DEV), group=sub)
        except Exception:  # noqa: BLE001
            raised = 1
        took = time.monotonic() - t0
        check("abort: the late rank's operation raised", torch.tensor([raised]),
              torch.tensor([1]))
        check(f"abort: the late rank raised within 10 s (took {took:.2f} s)",
              torch.tensor([float(took < 10)]), torch.tensor([1.0]))
        dist.distributed_c10d._abort_process_group(sub)
    t = torch.ones(5, device=DEV)
    dist.all_reduce(t)
    check("abort: the default group works after", t, torch.full((5,), float(world)))


def check_abort_from_a_callback():
    """abort() of a group from a Work's callback, which the backend's worker
    thread runs: no self-join, the callback returns, an operation queued
    behind the one it completes raises instead of hanging, later ones raise,
    and the default group still works."""
    r, world = dist.get_rank(), dist.get_world_size()
    sub = group_without_watchdog_exit(list(range(world)))
    backend = sub._get_backend(DEV)
    if r == 0:
        # the first waits for the late ranks, so that its callback is in
        # place before it completes (on the worker); the second queues behind
        first = dist.all_reduce(torch.ones(64, device=DEV), group=sub, async_op=True)
        second = dist.all_reduce(torch.ones(64, device=DEV), group=sub, async_op=True)
        on_worker = []

        def abort_it(fut):
            on_worker.append(threading.current_thread() is not threading.main_thread())
            backend.abort()
            return 7
        chained = first.get_future().then(abort_it)
        t0 = time.monotonic()
        got = chained.wait()
        check("callback abort: the callback returned", torch.tensor([float(got == 7)]),
              torch.tensor([1.0]))
        check("callback abort: it ran on the worker thread",
              torch.tensor([float(bool(on_worker) and on_worker[0])]), torch.tensor([1.0]))
        raised = 0
        try:
            second.wait()
        except Exception:  # noqa: BLE001
            raised = 1
        check("callback abort: the queued operation raised", torch.tensor([raised]),
              torch.tensor([1]))
        check(f"callback abort: within 10 s (took {time.monotonic() - t0:.2f} s)",
              torch.tensor([float(time.monotonic() - t0 < 10)]), torch.tensor([1.0]))
        raised = 0
        try:
            dist.all_reduce(torch.ones(4, device=DEV), group=sub)
        except Exception:  # noqa: BLE001
            raised = 1
        check("callback abort: a later operation raised", torch.tensor([raised]),
              torch.tensor([1]))
    else:
        time.sleep(1.0)  # late: rank 0's callback is in place by now
        try:
            dist.all_reduce(torch.ones(64, device=DEV), group=sub)
            dist.all_reduce(torch.ones(64, device=DEV), group=sub)
        except Exception:  # noqa: BLE001  (rank 0 aborted under the second)
            pass
        backend.abort()
    t = torch.ones(5, device=DEV)
    dist.all_reduce(t)
    check("callback abort: the default group works after", t, torch.full((5,), float(world)))


def check_future_after_wait():
    """wait() returned: the Work's future holds its value (Gloo's order: the
    future completes before the waiter wakes)."""
    global checks
    world, r = dist.get_world_size(), dist.get_rank()
    ops = {
        "all_reduce": lambda t: dist.all_reduce(t, async_op=True),
        "broadcast": lambda t: dist.broadcast(t, 0, async_op=True),
        "all_gather_into_tensor": lambda t: dist.all_gather_into_tensor(
            torch.empty(4 * world, device=DEV), t, async_op=True),
        "reduce_scatter_tensor": lambda t: dist.reduce_scatter_tensor(
            torch.empty(4, device=DEV), t.repeat(world), async_op=True),
        "barrier": lambda t: dist.barrier(async_op=True),
    }
    for name, issue in ops.items():
        missing = 0
        for _ in range(30):
            work = issue(torch.ones(4, device=DEV))
            work.wait()
            if not work.get_future().done():
                missing += 1
        checks += 1
        if missing:
            failures.append(f"{name}: wait() returned with the future not done, "
                            f"{missing} of 30 times")


def main():
    global DEV
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    DEV = torch.device(args.device, 0)
    if args.device == "cuda":
        torch.cuda.set_device(DEV)
    try:
        dist.init_process_group("weft", timeout=timedelta(seconds=60), device_id=DEV)
    except ValueError as e:  # torch 2.11 binds accelerators only: the checks run unbound
        if args.device == "cuda" or "accelerator" not in str(e):
            raise
        print(f"rank {os.environ.get('RANK')}: the default group is not bound to {DEV} on "
              f"torch {torch.__version__} ({e})", flush=True)
        dist.init_process_group("weft", timeout=timedelta(seconds=60))
    fns = [check_bound_new_group, check_premul_coalesced, check_premul_one_rank,
           check_failed_coalesced_block, check_blocking_in_coalesced_block,
           check_a2a_single_sizes, check_queued_strided, check_queued_lists,
           check_list_aliasing, check_empty_p2p, check_future_after_wait]
    if args.device == "cuda":
        fns += [check_cuda_streams, check_cuda_objects]
    else:
        fns += [check_abort_from_a_callback,  # last: they abort groups
                check_abort_from_another_thread]
    for fn in fns:
        try:
            fn()
        except Exception as e:  # noqa: BLE001  (a raise is a failed check; the next runs)
            failures.append(f"{fn.__name__}: {type(e).__name__}: {str(e)[:300]}")
    res = torch.tensor([len(failures), checks], dtype=torch.int64, device=DEV)
    dist.all_reduce(res)
    res = res.cpu()
    for f in failures[:40]:
        print(f"rank {dist.get_rank()}: FAIL {f}", flush=True)
    if dist.get_rank() == 0:
        print(f"check_api: {dist.get_world_size()} ranks on {DEV}, {int(res[1])} checks, "
              f"{int(res[0])} failures", flush=True)
    dist.destroy_process_group()
    teardown.leave(1 if res[0] else 0)  # Gloo groups: see teardown.py


if __name__ == "__main__":
    main()
