"""What code written for ProcessGroupNCCL or ProcessGroupGloo relies on, over the
"weft" backend, on host tensors, each against the same call on a Gloo group of
the same ranks where Gloo has it:

- an isend progresses on its own: the receiver gets it within a second while
  the sender sleeps without calling torch.distributed; isends crossing
  between ranks (more than a connection holds) complete, and so does an
  all-reduce issued beside sends and receives;
- a send's wait returns once it is done, though a receive issued after it
  waits for the peer;
- sends and receives do not wait for collectives issued before them, nor
  collectives for sends issued before them (a rank that receives first, then
  joins the collective, meets a rank that did the opposite);
- all_reduce of bool tensors with SUM and PRODUCT (NCCL maps them to MAX and
  MIN; Gloo's results are the same);
- all_gather and reduce_scatter with lists of tensors of unequal sizes;
- Work._get_duration(), set_timeout(), options through pg_options (name,
  timeout, channels), shrink_group, and the time estimate torch asks for;
- a future's callback that issues collectives on the same group and waits
  for them (PowerSGD's hook does), callbacks that issue collectives after
  uneven sleeps (every rank runs them in one order), and DDP with the
  PowerSGD hook over several buckets, whose parameters match Gloo's;
- a _coalescing_manager block in a callback, and a blocking send or
  receive in one while a block of both kinds is queued behind;
- a send or receive with the rank itself as the peer, issued on its own, is
  refused (Gloo raises too); in batch_isend_irecv the two pair up.

Run under torchrun (2 or 3 ranks); exits non-zero with the failing checks
listed. The random sizes are seeded; the seed is printed (WEFT_PARITY_SEED
repeats a run).
"""
import os
import random
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import SHRINK_ABORT
from torch._C._distributed_c10d import ErrorType

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
    # sends and receives, then an all-reduce beside them (it does not wait for
    # them, as NCCL's and Gloo's do not): both complete, with their data
    n = 1 << 19
    t = torch.empty(n, dtype=torch.int64)
    s = dist.isend(rank_ints(r, n, 60), nxt)
    q = dist.irecv(t, prv)
    total = torch.ones(1)
    dist.all_reduce(total)
    check_equal("all_reduce beside isend/irecv", total, torch.full((1,), float(world)))
    q.wait()
    s.wait()
    check_equal("isend/irecv beside an all_reduce", t, rank_ints(prv, n, 60))
    check("isend/irecv beside an all_reduce: completed", s.is_completed() and q.is_completed())
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


def check_p2p_beside_collectives(gloo=None):
    """Sends and receives do not wait for the group's collectives, nor these for
    them (NCCL's run on communicators of their own, Gloo's in the background):
    rank 0 sends after an async all_reduce that rank 1 joins only once it has
    received; rank 0 all-reduces after an isend larger than a connection holds,
    which rank 1 receives only after its own all_reduce. On a weft group with a
    short timeout (a wait for each other fails there), and on Gloo. Then sends
    from a coalescing block and after it arrive in order."""
    r, world = dist.get_rank(), dist.get_world_size()
    if gloo is None:
        gloo = dist.new_group(backend="gloo")
    weft = dist.new_group(backend="weft", timeout=timedelta(seconds=15))
    big = 3 << 20  # past a connection's 2 MiB
    for name, g in (("weft", weft), ("gloo", gloo)):
        try:
            x = torch.full((1000,), float(r + 1))
            y = torch.empty(big, dtype=torch.int64)
            if r == 0:
                w = dist.all_reduce(x, group=g, async_op=True)
                dist.send(rank_ints(0, big, 70), 1, group=g)
                w.wait()
            elif r == 1:
                dist.recv(y, 0, group=g)
                dist.all_reduce(x, group=g)
                check_equal(f"{name}: a send after an async all_reduce", y, rank_ints(0, big, 70))
            else:
                dist.all_reduce(x, group=g)
            check_equal(f"{name}: the all_reduce beside it", x,
                        torch.full((1000,), float(world * (world + 1) // 2)))
            x = torch.full((1000,), float(r + 1))
            if r == 0:
                s = dist.isend(rank_ints(0, big, 71), 1, group=g)
                dist.all_reduce(x, group=g)
                s.wait()
            elif r == 1:
                dist.all_reduce(x, group=g)
                dist.recv(y, 0, group=g)
                check_equal(f"{name}: an isend before an all_reduce", y, rank_ints(0, big, 71))
            else:
                dist.all_reduce(x, group=g)
            check_equal(f"{name}: the all_reduce after an isend", x,
                        torch.full((1000,), float(world * (world + 1) // 2)))
            # a send held behind a receive from any source (which runs on
            # the worker) goes once that is done, not after the collective
            # issued between them; then a send after an async all_reduce
            # again (nothing left holding sends back)
            x = torch.full((1000,), float(r + 1))
            z = torch.empty(7, dtype=torch.int64)
            if r == 0:
                a = dist.irecv(z, group=g)  # from any source
                w = dist.all_reduce(x, group=g, async_op=True)
                s = dist.isend(rank_ints(0, big, 72), 1, group=g)
                for q in (a, s, w):
                    q.wait()
                check_equal(f"{name}: a receive from any source", z, rank_ints(1, 7, 73))
                check(f"{name}: its source", a._source_rank() == 1, f"{a._source_rank()}")
                w = dist.all_reduce(x, group=g, async_op=True)
                dist.send(rank_ints(0, 9, 74), 1, group=g)
                w.wait()
            elif r == 1:
                dist.send(rank_ints(1, 7, 73), 0, group=g)
                dist.recv(y, 0, group=g)
                check_equal(f"{name}: a send held behind a receive from any source", y,
                            rank_ints(0, big, 72))
                dist.all_reduce(x, group=g)
                t = torch.empty(9, dtype=torch.int64)
                dist.recv(t, 0, group=g)
                dist.all_reduce(x, group=g)
                check_equal(f"{name}: then a send after an async all_reduce", t,
                            rank_ints(0, 9, 74))
            else:
                dist.all_reduce(x, group=g)
                dist.all_reduce(x, group=g)
        except Exception as e:  # noqa: BLE001  (a timeout: the ranks waited for each other)
            check(f"{name}: sends beside collectives", False, f"{type(e).__name__}: {str(e)[:200]}")
    # order: a block's sends, then plain ones, with a collective between
    n = 5000
    if r == 0:
        ops = [dist.P2POp(dist.isend, rank_ints(0, n, 80 + i), 1, group=weft) for i in range(2)]
        reqs = dist.batch_isend_irecv(ops)
        w = dist.all_reduce(torch.ones(1), group=weft, async_op=True)
        reqs += [dist.isend(rank_ints(0, n, 82 + i), 1, group=weft) for i in range(2)]
        for q in reqs + [w]:
            q.wait()
    elif r == 1:
        got = [torch.empty(n, dtype=torch.int64) for _ in range(4)]
        reqs = [dist.irecv(got[0], 0, group=weft)]
        ops = [dist.P2POp(dist.irecv, got[i], 0, group=weft) for i in (1, 2)]
        reqs += dist.batch_isend_irecv(ops)
        dist.all_reduce(torch.ones(1), group=weft)
        reqs.append(dist.irecv(got[3], 0, group=weft))
        for q in reqs:
            q.wait()
        for i in range(4):
            check_equal(f"sends in order, from and around a block: {i}", got[i],
                        rank_ints(0, n, 80 + i))
    else:
        dist.all_reduce(torch.ones(1), group=weft)
    dist.destroy_process_group(weft)
    dist.barrier(group=gloo)


def check_wait_on_send(gloo=None):
    """A send's wait returns once the send is done, though a receive issued
    after it waits for a message the peer sends only after this rank's next
    send (pipeline stages do this): 1000 rounds on a weft group with a short
    timeout, and on Gloo."""
    r = dist.get_rank()
    if gloo is None:
        gloo = dist.new_group(backend="gloo")
    weft = dist.new_group(backend="weft", timeout=timedelta(seconds=15))
    for name, g in (("weft", weft), ("gloo", gloo)):
        try:
            for it in range(1000):
                if r == 0:
                    y = torch.empty(1000)
                    s = dist.isend(torch.full((1000,), float(it)), 1, group=g)
                    q = dist.irecv(y, 1, group=g)
                    s.wait()
                    dist.send(torch.full((10,), float(it)), 1, group=g)
                    q.wait()
                    if not bool((y == it + 1).all()):
                        check(f"{name}: wait on a send, round {it}", False, f"got {y[0]}")
                        break
                elif r == 1:
                    x, z = torch.empty(1000), torch.empty(10)
                    dist.recv(x, 0, group=g)
                    dist.recv(z, 0, group=g)
                    dist.send(torch.full((1000,), float(it + 1)), 0, group=g)
            check(f"{name}: waits on sends, 1000 rounds", True)
        except Exception as e:  # noqa: BLE001  (a timeout: the wait ran the receive)
            check(f"{name}: wait on a send", False, f"{type(e).__name__}: {str(e)[:200]}")
    dist.destroy_process_group(weft)
    dist.barrier(group=gloo)


def check_callback_waits(gloo=None):
    """A future's callback issues an all-reduce on the same group and waits
    on its future, then on another's Work (PowerSGD's hook waits so inside
    its .then): it completes, on a weft group with a short timeout as on
    Gloo, with the sums as results."""
    n = dist.get_world_size()
    if gloo is None:
        gloo = dist.new_group(backend="gloo")
    weft = dist.new_group(backend="weft", timeout=timedelta(seconds=10))
    for name, g in (("weft", weft), ("gloo", gloo)):
        def then(fut, g=g):
            y = torch.full((4,), 2.0) * fut.value()[0]
            dist.all_reduce(y, group=g, async_op=True).get_future().wait()
            z = torch.ones(3)
            dist.all_reduce(z, group=g, async_op=True).wait()
            return torch.cat([y, z])
        try:
            first = dist.all_reduce(torch.ones(4), group=g, async_op=True)
            out = first.get_future().then(then).wait()
            check_equal(f"{name}: a callback that waits on its group", out,
                        torch.cat([torch.full((4,), 2.0 * n * n), torch.full((3,), float(n))]))
        except Exception as e:  # noqa: BLE001  (a hang times out: the check fails)
            check(f"{name}: a callback that waits on its group", False,
                  f"{type(e).__name__}: {str(e)[:200]}")
    dist.destroy_process_group(weft)
    dist.barrier(group=gloo)


def check_callback_order():
    """Callbacks registered as each operation is issued (as DDP's comm hooks
    do) issue all-reduces of their own, after a sleep that differs between
    ranks and callbacks, some waiting for theirs and some not: every rank
    runs them in one order (right after the operation whose callback it
    is, as NCCL's), so each gets its own sum; on a weft group only (Gloo's
    threads run such callbacks in any order)."""
    r, n = dist.get_rank(), dist.get_world_size()
    weft = dist.new_group(backend="weft", timeout=timedelta(seconds=10))
    chained = []
    for i in range(6):
        def then(fut, i=i):
            time.sleep(0.02 * ((i + r) % 3))
            x = torch.full((3 + i,), float(i + 1))
            w = dist.all_reduce(x, group=weft, async_op=True)
            if i % 2:
                w.wait()
            return w
        first = dist.all_reduce(torch.full((2 + i,), 1.0), group=weft, async_op=True)
        chained.append(first.get_future().then(then))
    try:
        for i, f in enumerate(chained):
            w = f.wait()
            w.wait()
            check_equal(f"callback {i}'s all-reduce", w.result()[0],
                        torch.full((3 + i,), float(n * (i + 1))))
    except Exception as e:  # noqa: BLE001
        check("callbacks that issue all-reduces", False, f"{type(e).__name__}: {str(e)[:200]}")
    dist.destroy_process_group(weft)


def wait_or_end(fut, seconds, name):
    """fut's value; a hang ends the process, failed (its group would hang at
    destroy too)."""
    out = []
    th = threading.Thread(target=lambda: out.append(fut.wait()), daemon=True)
    th.start()
    th.join(seconds)
    if not out:
        print(f"rank {dist.get_rank()}: FAIL {name}: no result within {seconds} s", flush=True)
        os._exit(1)
    return out[0]


def check_callback_blocks():
    """A callback that runs a _coalescing_manager block of broadcasts, and
    one that makes a blocking send or receive while the main thread queues
    a block of a broadcast and a send behind (a task that holds later sends
    and receives): both run at once on the worker (they waited for it
    before: a hang)."""
    r, n = dist.get_rank(), dist.get_world_size()
    weft = dist.new_group(backend="weft", timeout=timedelta(seconds=10))

    def block(fut):
        a, c = torch.ones(4) * (r + 1), torch.ones(4) * (r + 5)
        with dist._coalescing_manager(group=weft, device=torch.device("cpu")):
            dist.broadcast(a, 0, group=weft)
            dist.broadcast(c, n - 1, group=weft)
        return a + c
    first = dist.all_reduce(torch.ones(4), group=weft, async_op=True)
    if r == 1:
        time.sleep(0.3)
    out = wait_or_end(first.get_future().then(block), 20, "a coalescing block in a callback")
    check_equal("a coalescing block in a callback", out, torch.full((4,), float(1 + n + 4)))

    def p2p(fut):
        time.sleep(0.3)  # the main thread queues the block meanwhile
        t = torch.full((4,), 7.0) if r == 0 else torch.zeros(4)
        if r == 0:
            dist.send(t, 1, group=weft)
        elif r == 1:
            dist.recv(t, 0, group=weft)
        return t
    if r == 1:
        time.sleep(0.2)
    first = dist.all_reduce(torch.ones(4), group=weft, async_op=True)
    chained = first.get_future().then(p2p)
    z, p = torch.ones(4), torch.full((4,), 3.0) if r == 0 else torch.zeros(4)
    with dist._coalescing_manager(group=weft, device=torch.device("cpu"), async_ops=True) as cm:
        dist.broadcast(z, 0, group=weft)
        if r == 0:
            dist.isend(p, 1, group=weft)
        elif r == 1:
            dist.irecv(p, 0, group=weft)
    out = wait_or_end(chained, 20, "a send or receive in a callback, a holder queued behind")
    cm.wait()
    if r < 2:
        check_equal("a send or receive in a callback, a holder queued behind", out,
                    torch.full((4,), 7.0))
        check_equal("the block queued behind it", p, torch.full((4,), 3.0))
    dist.destroy_process_group(weft)


def check_callback_beside_block():
    """Another thread broadcasts and reads the result (a future's callback,
    run where the future completes) while the main thread has a
    _coalescing_manager block open on the group: its broadcast runs at once,
    not inside the main thread's block (whose operations run only at its
    end: it would read its own input), and the block's broadcast is the
    block's alone. (An all-reduce there would join the block in torch's own
    layer, which gathers a block's all-reduces from every thread, whatever
    the backend.)"""
    r, n = dist.get_rank(), dist.get_world_size()
    weft = dist.new_group(backend="weft", timeout=timedelta(seconds=10))

    def then(fut):
        y = torch.full((5,), float(r + 1))
        dist.broadcast(y, 0, group=weft, async_op=True).wait()
        return y.clone()  # read at once, as a hook that goes on with it
    started = torch.futures.Future()
    chained = started.then(then)
    b = torch.full((3,), float(r + 10))
    try:
        with dist._coalescing_manager(group=weft, device=torch.device("cpu"),
                                      async_ops=True) as cm:
            # the callback runs on this thread, the block open
            threading.Thread(target=lambda: started.set_result(None), daemon=True).start()
            out = wait_or_end(chained, 20, "a callback beside an open block")
            dist.broadcast(b, n - 1, group=weft)
        cm.wait()
        check_equal("another thread's broadcast beside an open block", out, torch.full((5,), 1.0))
        check_equal("the open block's broadcast", b, torch.full((3,), float(n - 1 + 10)))
    except Exception as e:  # noqa: BLE001
        check("a callback beside an open block", False, f"{type(e).__name__}: {str(e)[:200]}")
    dist.destroy_process_group(weft)


def check_powersgd(gloo=None):
    """DDP with the PowerSGD comm hook over several buckets (two
    uncompressed steps, then rank-2 approximations whose all-reduces the
    hook waits on inside its callbacks) trains five steps, its parameters
    as Gloo's within float rounding."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP
    r = dist.get_rank()
    if gloo is None:
        gloo = dist.new_group(backend="gloo")
    weft = dist.new_group(backend="weft", timeout=timedelta(seconds=20))
    params = {}
    for name, g in (("weft", weft), ("gloo", gloo)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 8))
        ddp = DDP(model, process_group=g, bucket_cap_mb=0.004)  # several buckets
        state = psgd.PowerSGDState(process_group=g, matrix_approximation_rank=2,
                                   start_powerSGD_iter=2, random_seed=0)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        torch.manual_seed(1 + r)
        try:
            for _ in range(5):
                opt.zero_grad()
                ddp(torch.randn(16, 32)).square().mean().backward()
                opt.step()
        except Exception as e:  # noqa: BLE001
            check(f"{name}: DDP with the PowerSGD hook", False, f"{type(e).__name__}: {str(e)[:200]}")
            break
        params[name] = torch.cat([p.detach().flatten() for p in model.parameters()])
    if len(params) == 2:
        d = (params["weft"] - params["gloo"]).abs().max().item()
        check("DDP with the PowerSGD hook: parameters as Gloo's", d < 1e-4, f"differ by {d}")
    dist.destroy_process_group(weft)
    dist.barrier(group=gloo)


def check_self_p2p():
    """A send or receive to this rank itself, on its own, is refused with a
    message that says where it pairs (Gloo raises too; torch refuses a
    blocking send itself); in batch_isend_irecv the two pair up and the
    data arrives."""
    r = dist.get_rank()
    t = torch.arange(4.0) + 10 * r
    for what, call in (("isend", lambda: dist.isend(t, r)), ("send", lambda: dist.send(t, r)),
                       ("recv", lambda: dist.recv(torch.empty(4), r))):
        try:
            call()
            check(f"{what} with this rank as the peer refused", False, "accepted")
        except Exception as e:  # noqa: BLE001
            check(f"{what} to itself: the error says why",
                  "itself" in str(e) or "should not be the same" in str(e), str(e)[:200])
    b = torch.zeros(4)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, t, r), dist.P2POp(dist.irecv, b, r)]):
        w.wait()
    check_equal("batch_isend_irecv with this rank as the peer", b, t)
    x = torch.ones(2)
    dist.all_reduce(x)  # the group still works
    check_equal("all_reduce after the refusals", x, torch.full((2,), float(dist.get_world_size())))


def trace(what):
    if os.environ.get("WEFT_PARITY_TRACE"):
        print(f"rank {dist.get_rank()}: {what}", flush=True)


# --- parity with NCCL and Gloo ------------------------------------------------

def check_bool(gloo, rng):
    """bool all_reduce: SUM and PRODUCT as NCCL maps them (MAX, MIN), MIN and
    MAX, against Gloo's results."""
    r = dist.get_rank()
    R = dist.ReduceOp
    for op in [R.SUM, R.PRODUCT, R.MIN, R.MAX]:
        for n in [1, 7, 1000, rng.randint(2, 5000)]:
            g = torch.Generator().manual_seed(31 * n + r)
            t = torch.rand(n, generator=g) < (0.8 if op == R.PRODUCT else 0.2)
            ref = t.clone()
            dist.all_reduce(t, op)
            dist.all_reduce(ref, op, group=gloo)
            check_equal(f"bool all_reduce {op} of {n}", t, ref)
    # AVG has no meaning for bools (NCCL refuses it too)
    global checks
    checks += 1
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.bool), R.AVG)
        failures.append("bool AVG: no exception")
    except Exception as e:  # noqa: BLE001
        if "bool" not in str(e):
            failures.append(f"bool AVG: message {str(e)[:200]!r}")


def check_uneven(gloo, rng):
    """all_gather and reduce_scatter with lists of tensors of unequal sizes
    (empty ones among them), several dtypes and ops."""
    r, world = dist.get_rank(), dist.get_world_size()
    R = dist.ReduceOp
    for trial in range(4):
        sizes = [rng.choice([0, 1, 7, rng.randint(1, 70000)]) for _ in range(world)]
        if len(set(sizes)) == 1:
            sizes[0] += 1
        for dtype in [torch.int64, torch.float32, torch.bool, torch.bfloat16]:
            outs = [torch.full((sizes[q],), 7, dtype=torch.int64).to(dtype) for q in range(world)]
            dist.all_gather(outs, rank_ints(r, sizes[r], trial).to(dtype))
            for q in range(world):
                check_equal(f"uneven all_gather {sizes} {dtype} block {q}", outs[q],
                            rank_ints(q, sizes[q], trial).to(dtype))
        for op in [R.SUM, R.PRODUCT, R.MIN, R.MAX]:
            ins = [rank_ints(r, sizes[q], 100 * trial + q) for q in range(world)]
            out = torch.empty(sizes[r], dtype=torch.int64)
            dist.reduce_scatter(out, ins, op)
            each = torch.stack([rank_ints(q, sizes[r], 100 * trial + r) for q in range(world)])
            want = {R.SUM: each.sum(0), R.PRODUCT: each.prod(0),
                    R.MIN: each.min(0).values, R.MAX: each.max(0).values}[op]
            check_equal(f"uneven reduce_scatter {sizes} {op}", out, want)
        # floats with AVG, against Gloo's sum divided
        ins = [rank_ints(r, sizes[q], 7 + q).double() for q in range(world)]
        out = torch.empty(sizes[r], dtype=torch.float64)
        dist.reduce_scatter(out, ins, R.AVG)
        each = torch.stack([rank_ints(q, sizes[r], 7 + r).double() for q in range(world)])
        check_equal(f"uneven reduce_scatter {sizes} AVG", out, each.sum(0) / world)
    # a strided output, written through a staging copy
    sizes = [3 + 2 * q for q in range(world)]
    base = torch.zeros(2 * sizes[-1], dtype=torch.int64)
    outs = [torch.empty(sizes[q], dtype=torch.int64) for q in range(world - 1)]
    outs.append(base[::2])
    dist.all_gather(outs, rank_ints(r, sizes[r], 9))
    check_equal("uneven all_gather into a strided view", base[::2],
                rank_ints(world - 1, sizes[-1], 9))
    check_equal("uneven all_gather leaves the gaps", base[1::2], torch.zeros(sizes[-1],
                                                                             dtype=torch.int64))
    # this rank's block must fit its input
    global checks
    checks += 1
    try:
        bad = [torch.empty(sizes[q] + (1 if q == r else 0), dtype=torch.int64)
               for q in range(world)]
        dist.all_gather(bad, rank_ints(r, sizes[r], 9))
        failures.append("uneven all_gather with this rank's block off: no exception")
    except Exception as e:  # noqa: BLE001
        if "this rank's output" not in str(e):
            failures.append(f"uneven all_gather bad block: message {str(e)[:200]!r}")
    dist.barrier()


def check_duration():
    """Work._get_duration() (torch's name for it): the time the operation took, in ms,
    once it is done: an all-reduce rank 0 waits 0.3 s in for the last rank
    lasts at least 0.25 s there."""
    r, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if r == world - 1:
        time.sleep(0.3)
    w = dist.all_reduce(torch.ones(1000), async_op=True)
    w.wait()
    d = w._get_duration()
    check("get_duration is positive and below a minute", 0 < d < 60000, f"{d} ms")
    if r == 0:
        check("get_duration of an all-reduce waiting 0.3 s for a peer", d >= 250, f"{d} ms")
    nxt, prv = (r + 1) % world, (r - 1) % world
    s = dist.isend(torch.ones(10), nxt)
    q = dist.irecv(torch.empty(10), prv)
    s.wait()
    q.wait()
    check("get_duration of an isend", 0 <= s._get_duration() < 60000, f"{s._get_duration()} ms")


def check_timeouts():
    """set_timeout() and pg_options' timeout: a peer silent past it fails the
    operation with the new timeout named (the group is broken after), and
    the group's watchdog reports it through get_error()."""
    r, world = dist.get_rank(), dist.get_world_size()
    # set_timeout shortens a group made with a long one; pg_options' timeout
    # is the group's from its creation on (long enough for a loaded machine
    # to make the group). Both are made before either breaks.
    groups = {"set_timeout": (dist.new_group(backend="weft", timeout=timedelta(seconds=120)), 2),
              "pg_options": (dist.new_group(backend="weft", pg_options=torch_weft.Options(
                  channels=2, name="parity-timeout", timeout=timedelta(seconds=5))), 5)}
    dist.set_timeout(timedelta(seconds=2), groups["set_timeout"][0])
    for how, (g, secs) in groups.items():
        t = torch.ones(8)
        dist.all_reduce(t, group=g)
        check_equal(f"{how}: all_reduce before", t, torch.full((8,), float(world)))
        if r == world - 1:
            time.sleep(secs + 3)  # silent past the timeout
        else:
            start = time.monotonic()
            try:
                trace(f"{how}: all_reduce on a group with a silent peer")
                dist.all_reduce(t, group=g)
                failures.append(f"{how}: no failure with a peer silent past {secs} s")
            except Exception as e:  # noqa: BLE001
                took = time.monotonic() - start
                # the first rank to give up says why; the others may hear of
                # it from that rank before their own wait runs out
                check(f"{how}: the failure names the {secs} s timeout or the rank that gave up",
                      f"({secs * 1000} ms)" in str(e) or "failed or aborted" in str(e),
                      str(e)[:300])
                check(f"{how}: failed within the timeout and 2 s", took < secs + 2.0,
                      f"{took:.2f} s")
        trace(f"{how}: barrier")
        dist.barrier()
        # the watchdog (told to let the process go on) saw the failure
        backend = g._get_backend(torch.device("cpu"))
        for _ in range(50 if r != world - 1 else 0):
            if backend.get_error() != ErrorType.SUCCESS:
                break
            time.sleep(0.1)
        dist.barrier()
        want = ([ErrorType.TIMEOUT, ErrorType.REMOTE_ERROR, ErrorType.COMM_ERROR]
                if r != world - 1 else [ErrorType.SUCCESS, ErrorType.REMOTE_ERROR,
                                        ErrorType.COMM_ERROR])
        check(f"{how}: get_error()", backend.get_error() in want, str(backend.get_error()))
    for how, (g, secs) in groups.items():
        trace(f"{how}: destroy")
        dist.destroy_process_group(g)
        trace(f"{how}: destroyed")
    # channels: 1 and 4 give the same sums; 0 is refused before any rendezvous
    check("get_error() of a group that did not fail",
          dist.group.WORLD._get_backend(torch.device("cpu")).get_error() == ErrorType.SUCCESS,
          "")
    for channels in [1, 4]:
        g = dist.new_group(backend="weft", pg_options=torch_weft.Options(channels=channels))
        t = rank_ints(r, 100000, 3).double()
        dist.all_reduce(t, group=g)
        want = sum(rank_ints(q, 100000, 3).double() for q in range(world))
        check_equal(f"pg_options channels={channels}: all_reduce", t, want)
        dist.destroy_process_group(g)
    global checks
    checks += 1
    try:
        torch_weft.Options(channels=0)
        failures.append("Options(channels=0): no exception")
    except ValueError as e:
        if "channels" not in str(e):
            failures.append(f"Options(channels=0): message {str(e)[:200]!r}")


def check_no_deadline():
    """A group whose timeout is past the clock's range (timedelta of a
    thousand years; torch's timedelta.max is larger still) has no deadline:
    a receive that waits half a second for its sender completes, one from
    any source too, and the watchdog reports nothing."""
    r, world = dist.get_rank(), dist.get_world_size()
    g = dist.new_group(backend="weft", timeout=timedelta(days=365 * 1000))
    t = torch.full((16,), float(r))
    dist.all_reduce(t, group=g)
    check_equal("no deadline: all_reduce", t, torch.full((16,), float(sum(range(world)))))
    got = torch.zeros(16)
    if r == 0:
        work = dist.irecv(got, src=1, group=g)  # pending while the watchdog looks
        work.wait()
        check_equal("no deadline: a receive that waited", got, torch.full((16,), 7.0))
    elif r == 1:
        time.sleep(0.5)
        dist.send(torch.full((16,), 7.0), dst=0, group=g)
    # a receive from any source waits for its sender as long
    if r == 0:
        src = dist.recv(got, group=g)
        check("no deadline: a receive from any source names its sender", src == 1, str(src))
        check_equal("no deadline: a receive from any source", got, torch.full((16,), 9.0))
    elif r == 1:
        time.sleep(0.3)
        dist.send(torch.full((16,), 9.0), dst=0, group=g)
    # set_timeout takes what creation takes (Gloo and NCCL do): 30 days
    dist.set_timeout(timedelta(days=30), g)
    dist.all_reduce(t, group=g)
    check_equal("set_timeout(30 days): all_reduce", t,
                torch.full((16,), float(sum(range(world)) * world)))
    dist.barrier(group=g)
    check("no deadline: get_error()",
          g._get_backend(torch.device("cpu")).get_error() == ErrorType.SUCCESS,
          str(g._get_backend(torch.device("cpu")).get_error()))
    dist.destroy_process_group(g)


def check_bad_handling():
    """A TORCH_WEFT_ASYNC_ERROR_HANDLING that is not 0-3 makes the group's
    creation raise, naming it, on every rank, and the process goes on (it
    ended in std::terminate when the variable was read after the group's
    threads had started)."""
    os.environ["TORCH_WEFT_ASYNC_ERROR_HANDLING"] = "yes"
    try:
        dist.new_group(backend="weft")
        failures.append("TORCH_WEFT_ASYNC_ERROR_HANDLING=yes: the group was made")
    except Exception as e:  # noqa: BLE001
        check("TORCH_WEFT_ASYNC_ERROR_HANDLING=yes: refused, named",
              "is not one of 0, 1, 2, 3" in str(e), str(e)[:300])
    finally:
        os.environ["TORCH_WEFT_ASYNC_ERROR_HANDLING"] = "0"
    t = torch.ones(4)
    dist.all_reduce(t)
    check_equal("all_reduce after a refused group", t, torch.full((4,), float(dist.get_world_size())))


def check_shrink():
    """shrink_group: the ranks but the last make a group of their own
    (weftCommShrink); the last rank does not take part."""
    r, world = dist.get_rank(), dist.get_world_size()
    g = dist.new_group(backend="weft")
    cut = dist.new_group(backend="weft")
    t = torch.ones(4)
    dist.all_reduce(t, group=g)
    dist.all_reduce(t, group=cut)
    # SHRINK_ABORT ends what waits in the old group: rank 0's receive from
    # the last rank, which never sends, fails and writes nothing
    if r < world - 1:
        got = torch.full((8,), -5.0)
        work = dist.irecv(got, src=world - 1, group=cut) if r == 0 else None
        dist.shrink_group([world - 1], group=cut, shrink_flags=SHRINK_ABORT)
        if work is not None:
            try:
                work.wait()
                failures.append("shrink_group(SHRINK_ABORT): the receive it cut short succeeded")
            except Exception as e:  # noqa: BLE001
                check("shrink_group(SHRINK_ABORT): the receive it cut short fails, saying so",
                      "revoked" in str(e) or "abort" in str(e), str(e)[:300])
            check_equal("shrink_group(SHRINK_ABORT): the receive wrote nothing", got,
                        torch.full((8,), -5.0))
    if r < world - 1:
        small = dist.shrink_group([world - 1], group=g)
        check("shrink_group: the new group's size", small.size() == world - 1, str(small.size()))
        t = rank_ints(r, 1000, 5)
        dist.all_reduce(t, group=small)
        check_equal("shrink_group: all_reduce on the shrunk group", t,
                    sum(rank_ints(q, 1000, 5) for q in range(world - 1)))
    dist.barrier()


def check_sparse(gloo, rng):
    """all_reduce of sparse COO tensors (SUM, as Gloo's): the dense sum of
    every rank's entries (repeated indices among them); tensors whose sizes
    or sparse dimensions differ between ranks raise on every rank, naming
    both layouts, and the group goes on."""
    r, world = dist.get_rank(), dist.get_world_size()
    seed = rng.randrange(1 << 30)
    for sizes, sparse_dim in [((50,), 1), ((12, 7), 1), ((9, 8, 3), 2)]:
        g = torch.Generator().manual_seed(seed + 101 * r)
        nnz = 1 + r * 3
        idx = torch.stack([torch.randint(0, sizes[d], (nnz,), generator=g)
                           for d in range(sparse_dim)])
        val = torch.randn((nnz,) + tuple(sizes[sparse_dim:]), generator=g, dtype=torch.float64)
        t = torch.sparse_coo_tensor(idx, val, sizes, check_invariants=True)
        want = t.to_dense()
        dist.all_reduce(want, group=gloo)
        dist.all_reduce(t)
        check("sparse all_reduce: still sparse", t.is_sparse, str(t.layout))
        check("sparse all_reduce %s: the dense sum" % (sizes,),
              torch.allclose(t.to_dense(), want, rtol=1e-12, atol=1e-12),
              f"{(t.to_dense() - want).abs().max()}")
    for how, mine in [("sizes", torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1),
                                                         (4 + (r == world - 1),),
                                                         check_invariants=True)),
                      ("sparse dimensions",
                       torch.sparse_coo_tensor(torch.zeros((1 + (r == world - 1), 1),
                                                           dtype=torch.long),
                                               torch.ones((1,) + ((3,) if r != world - 1 else ())),
                                               (3, 3), check_invariants=True))]:
        try:
            dist.all_reduce(mine)
            failures.append(f"sparse all_reduce whose {how} differ: no exception")
        except Exception as e:  # noqa: BLE001
            check(f"sparse all_reduce whose {how} differ: refused, both layouts named",
                  "layouts differ" in str(e) and "rank" in str(e), str(e)[:300])
    t = torch.ones(3)
    dist.all_reduce(t)
    check_equal("all_reduce after refused sparse ones", t, torch.full((3,), float(world)))


def check_estimate():
    """dist._time_estimator(): what is issued inside is estimated, not run:
    the tensors keep their values, and a larger all-reduce is estimated to
    take longer."""
    r = dist.get_rank()
    est = {}
    for n in [1 << 10, 1 << 22]:
        t = torch.full((n,), float(r + 1))
        with dist._time_estimator() as e:
            dist.all_reduce(t)
            dist.all_gather_into_tensor(torch.empty(n * dist.get_world_size()), t)
        est[n] = e.estimated_time
        check_equal(f"time estimate of {n}: the tensor is untouched", t,
                    torch.full((n,), float(r + 1)))
    check("time estimates are positive and grow with the size",
          0 < est[1 << 10] < est[1 << 22], str(est))
    t = torch.ones(5)
    dist.all_reduce(t)
    check_equal("all_reduce after a time estimate", t,
                torch.full((5,), float(dist.get_world_size())))
    # an estimated send is not a send: a receive from any source after it
    # takes the rank that sent (3 ranks and more: rank 2's send to rank 0 is
    # estimated only, rank 1's runs, then rank 2's a second later)
    world = dist.get_world_size()
    if world < 3:
        return
    with dist._time_estimator():
        if r == 2:
            dist.isend(torch.full((4,), 9.0), dst=0)
    if r == 1:
        dist.send(torch.full((4,), 1.0), dst=0)
    elif r == 2:
        time.sleep(1.0)
        dist.send(torch.full((4,), 2.0), dst=0)
    elif r == 0:
        got = torch.zeros(4)
        first = dist.recv(got)
        check("a receive from any source after an estimated send takes the sender", first == 1,
              f"source {first}")
        if first == 1:
            check_equal("the first sender's message", got, torch.full((4,), 1.0))
            second = dist.recv(got)
            check("the second receive from any source", second == 2, f"source {second}")
        else:
            dist.recv(got, src=1)  # rank 1's message, left behind
    dist.barrier()


def main():
    # the checks of timeouts leave broken groups behind: failures raise here
    # instead of ending the process (the watchdog's default)
    os.environ["TORCH_WEFT_ASYNC_ERROR_HANDLING"] = "0"
    dist.init_process_group("weft")
    r = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    seed = torch.tensor([int(os.environ.get("WEFT_PARITY_SEED", time.time_ns() % 100000))])
    dist.broadcast(seed, 0, group=gloo)  # rank 0's
    seed = int(seed)
    if r == 0:
        print(f"check_parity: seed {seed} (WEFT_PARITY_SEED={seed} repeats it)", flush=True)
    rng = random.Random(seed)
    fns = [lambda: check_isend_progress(), lambda: check_crossing(rng),
           lambda: check_bool(gloo, rng), lambda: check_uneven(gloo, rng),
           lambda: check_sparse(gloo, rng), lambda: check_p2p_beside_collectives(gloo),
           lambda: check_wait_on_send(gloo),
           lambda: check_callback_waits(gloo), check_callback_order, check_callback_blocks,
           check_callback_beside_block,
           lambda: check_powersgd(gloo), check_self_p2p,
           check_duration,
           check_estimate, check_no_deadline, check_bad_handling, check_timeouts,
           check_shrink]  # last: the ranks that shrink name their later groups apart
    only = os.environ.get("WEFT_PARITY_ONLY")  # a check's name, to run it alone
    if only:
        fns = [globals()[only]]
    for fn in fns:
        if os.environ.get("WEFT_PARITY_TRACE"):
            print(f"rank {r}: {fn}", flush=True)
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
