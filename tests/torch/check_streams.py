"""The CUDA stream logic of the "weft" backend, checked on the host: with
torch_weft's recording fake of the CUDA layer on (_C._gpu_fake), host tensors
count as on device 0 and every call of the logic (stream made, event recorded,
stream waiting for an event, record_stream, the operation run) is a line of
the fake's log, while the collectives themselves run on the host over real
communicators, so their results are checked too. For each case the log must
show which stream each operation ran on and which event each stream waited
for, in order: all_reduce and wait(), async_op without wait then use, a side
stream made current, two groups, a high-priority group, blocking wait
(TORCH_WEFT_BLOCKING_WAIT, and TORCH_NCCL_BLOCKING_WAIT honoured), tensors
stashed instead of recorded (TORCH_WEFT_AVOID_RECORD_STREAMS), all on the
current stream (TORCH_WEFT_COMM_STREAM=0), a coalesced block, send/recv, a
graph capture (joined back by wait(); left unjoined without it; left out of
the flight recorder), a capture in CUDA's global mode while operations issued
before it are pending (nothing asks CUDA about them in a way that invalidates
it), a block that fails after a step was enqueued (its end recorded, tensors
held, the caller's stream ordered after it, a capture joined back),
get_duration() and the flight recorder's states from the start and end
events, stashed tensors of a failed operation kept until the GPU is past it,
two threads issuing on one group at once, and a setting that is no flag
refused. Run under torchrun (2 or 3 ranks); exits non-zero with the failing
checks listed."""
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "torch_weft"))
import torch_weft  # noqa: E402
from torch_weft import _C  # noqa: E402
import teardown  # noqa: E402  (beside this script)

failures = []
checks = 0


def fail(name, why):
    failures.append(f"{name}: {why}")


def take_log(keep_queries=False):
    """The fake's log since the last call, less event destructions (when a
    Work is freed is Python's business) and, unless asked, queries (the
    watchdog asks in the background)."""
    lines = _C._gpu_fake_log()
    return [ln for ln in lines
            if not ln.startswith("destroy") and (keep_queries or not ln.startswith("query"))]


def match(name, log, pattern):
    """Whether log is pattern line for line, where a word $X in a pattern
    binds to the word at its place on first use and must equal it after.
    Returns the bindings (None on a mismatch, recorded as a failure)."""
    global checks
    checks += 1
    env = {}
    ok = len(log) == len(pattern)
    for got, want in zip(log, pattern):
        g, w = got.split(), want.split()
        if len(g) != len(w):
            ok = False
            break
        for gw, ww in zip(g, w):
            if ww.startswith("$"):
                if env.setdefault(ww, gw) != gw:
                    ok = False
            elif gw != ww:
                ok = False
    if not ok:
        fail(name, "log\n    " + "\n    ".join(log) + "\n  is not\n    " + "\n    ".join(pattern))
        return None
    return env


def expect(name, cond, why=""):
    global checks
    checks += 1
    if not cond:
        fail(name, why or "false")


def check_values(name, got, want):
    expect(name, torch.equal(got, want), f"{got.tolist()} != {want.tolist()}")


def op(stream_, ran, n=1, caller="default", timed=True):
    """The lines of one operation named ran on the communication stream
    stream_ issued from caller's stream: ready event, wait, start event
    (unless captured: timed False), run, record_stream of n tensors, end
    event, future. $R/$S/$E stand for its events."""
    return ([f"record $R {caller}", f"wait {stream_} $R"] +
            ([f"record $S {stream_}"] if timed else []) +
            [f"run {ran} {stream_}", f"hold {stream_} {n}", f"record $E {stream_}",
             f"future {stream_}"])


def last_flight_entry():
    entries = torch_weft.flight_recorder_trace()["entries"]
    return entries[-1] if entries else {}


def check_capture_global_mode(world):
    """A capture in CUDA's default (global) mode, as torch.cuda.graph's,
    while operations issued before it are pending on the GPU: neither this
    thread (issuing into the capture, waiting for one issued before it) nor
    the watchdog's (which looks every 100 ms) asks CUDA about them in a way
    that invalidates the capture (the fake refuses such a query, and the
    capture's end then raises)."""
    # a refused query, read by the watchdog as a failure, must not end the process
    os.environ["TORCH_WEFT_ASYNC_ERROR_HANDLING"] = "0"
    g = dist.new_group(list(range(world)))
    del os.environ["TORCH_WEFT_ASYNC_ERROR_HANDLING"]
    take_log()
    dist.all_reduce(torch.ones(3), group=g)
    got = match("capture (global mode): first", take_log(),
                ["stream_create $G normal"] + op("$G", "allreduce") + ["wait default $E"])
    if not got:
        return
    s = got["$G"]
    _C._gpu_fake_stall(s, True)
    pending = [dist.all_reduce(torch.ones(3), group=g, async_op=True) for _ in range(3)]
    _C._gpu_fake_set_stream("graph")
    _C._gpu_fake_capture_begin("global")
    try:
        w = dist.all_reduce(torch.ones(3), group=g, async_op=True)
        w.wait()
        pending[0].wait()  # issued before the capture: asked about, then ordered
        time.sleep(0.35)  # the watchdog looks at the pending ones meanwhile
    except Exception as e:  # noqa: BLE001
        fail("capture (global mode): issued and waited for", str(e)[:300])
    try:
        left = _C._gpu_fake_capture_end()
        expect("capture (global mode): joined", left == "", f"unjoined: {left}")
    except RuntimeError as e:
        fail("capture (global mode): valid at its end", str(e)[:300])
    _C._gpu_fake_set_stream("default")
    _C._gpu_fake_stall(s, False)
    for p in pending:
        p.wait()
    refused = [ln for ln in take_log(keep_queries=True) if ln.endswith("refused")]
    expect("capture (global mode): no query refused", not refused, " ".join(refused))


def check_failed_block(comm):
    """A coalesced block whose second step fails when it runs (int16 is no
    reduction dtype of weft) after the first was enqueued: the block's end
    event is recorded and its tensors held all the same, and the caller's
    stream is ordered after it, which in a capture joins the communication
    stream back."""
    for name, capture in (("failed block", False), ("failed block in a capture", True)):
        caller = "graph" if capture else "default"
        if capture:
            _C._gpu_fake_set_stream("graph")
            _C._gpu_fake_capture_begin()
        a, b = torch.ones(3), torch.ones(2, dtype=torch.int16)
        try:
            with dist._coalescing_manager(async_ops=True) as cm:
                dist.all_reduce(a)
                dist.all_reduce(b)
            cm.wait()
            fail(name, "no exception")
        except Exception as e:  # noqa: BLE001
            expect(f"{name}: raised", "not supported for reductions" in str(e), str(e)[:300])
        if capture:
            try:
                left = _C._gpu_fake_capture_end()
                expect(f"{name}: joined back", left == "", f"unjoined: {left}")
            except RuntimeError as e:
                fail(f"{name}: valid at its end", str(e)[:300])
            _C._gpu_fake_set_stream("default")
        lines = [ln for ln in op(comm, "allreduce_coalesced", n=2, caller=caller, timed=not capture)
                 if not ln.startswith("future")]
        match(f"{name}: log", take_log(), lines + [f"wait {caller} $E"])


def check_duration(comm):
    """get_duration(): the GPU's time from the operation's start event to
    its end event, known once the GPU is past it, whoever looked (not at the
    watchdog's next look); the flight recorder's entry is scheduled until
    the GPU reaches the operation, completed once it is past it."""
    _C._gpu_fake_stall(comm, True)
    w = dist.all_reduce(torch.ones(4), async_op=True)
    w.wait()  # orders the caller's stream; the GPU has not run it
    e = last_flight_entry()
    expect("flight recorder: scheduled until the GPU reaches it",
           e.get("profiling_name") == "weft:all_reduce" and e.get("state") == "scheduled",
           f"{e.get('profiling_name')} {e.get('state')}")
    time.sleep(0.3)
    _C._gpu_fake_stall(comm, False)  # the GPU passes it (torch.cuda.synchronize())
    try:
        d = w._get_duration()
        expect("get_duration: the GPU's time", 0 <= d < 100,
               f"{d} ms (the host saw it done 300 ms after its issue)")
    except Exception as e:  # noqa: BLE001
        fail("get_duration once the GPU is past it", str(e)[:300])
    expect("get_duration: done", w.is_completed())
    e = last_flight_entry()
    expect("flight recorder: completed with the GPU's time",
           e.get("state") == "completed" and 0 <= e.get("duration_ms", -1) < 100,
           f"{e.get('state')} {e.get('duration_ms')}")
    take_log()


def check_failed_stash(ga, stream_):
    """Tensors stashed (avoid record_stream) by an operation that failed
    (here a wait's timeout) while the GPU had not passed it stay held when
    its Work is dropped, until the GPU is past it (the watchdog keeps it)."""
    x = torch.ones(6)
    count = x._use_count
    before = count()
    _C._gpu_fake_stall(stream_, True)
    w = dist.all_reduce(x, group=ga, async_op=True)
    try:
        w.wait(timeout=timedelta(milliseconds=200))
        fail("failed stash: timeout", "wait() returned")
    except Exception as e:  # noqa: BLE001
        expect("failed stash: timeout", "has not finished" in str(e), str(e)[:300])
    del w
    time.sleep(0.35)  # the watchdog looks at it
    held = count()
    _C._gpu_fake_stall(stream_, False)
    time.sleep(0.35)
    after = count()
    expect("failed stash: held while the GPU runs it", held > before,
           f"uses {before} before, {held} once dropped, stalled")
    expect("failed stash: released once the GPU is past it", after == before,
           f"uses {before} before, {after} after")
    take_log()


def check_two_threads(world):
    """Two threads issuing on one group at once: each operation's end event
    and future are recorded on the communication stream before the next
    operation is enqueued there."""
    g = dist.new_group(list(range(world)))
    take_log()
    dist.all_reduce(torch.ones(4), group=g)
    got = match("two threads: first", take_log(),
                ["stream_create $T normal"] + op("$T", "allreduce") + ["wait default $E"])
    if not got:
        return
    n = 100

    def issue():  # every operation alike: any pairing across ranks sums the same
        for _ in range(n):
            dist.all_reduce(torch.ones(4), group=g)

    threads = [threading.Thread(target=issue) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    on = [ln.split()[0] for ln in take_log() if got["$T"] in ln.split()[1:3]]
    one = ["wait", "record", "run", "hold", "record", "future"]
    bad = next((i for i in range(0, len(on), len(one)) if on[i:i + len(one)] != one), None)
    expect("two threads: one operation at a time on the stream",
           len(on) == 2 * n * len(one) and bad is None,
           f"{len(on)} lines; at line {bad}: {on[bad:bad + 12] if bad is not None else ''}")


def main():
    _C._gpu_fake(True)
    dist.init_process_group("weft")
    r, world = dist.get_rank(), dist.get_world_size()
    total = float(sum(range(1, world + 1)))
    take_log()

    # all_reduce (blocking): made once, the group's stream waits for the
    # caller's, runs it, and the caller's stream waits for its end
    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t)
    check_values("all_reduce", t, torch.full((5,), total))
    got = match("all_reduce + wait", take_log(),
                ["stream_create $C normal"] + op("$C", "allreduce") + ["wait default $E"])
    comm = got["$C"] if got else "comm1"

    # the stream is the group's: a second operation makes none
    t = torch.full((3,), 1.0)
    dist.all_reduce(t)
    match("second all_reduce, same stream", take_log(), op(comm, "allreduce") + ["wait default $E"])

    # async_op without wait: the caller's stream is not ordered after it, the
    # tensors are recorded on the communication stream (memory not reused
    # under the communication); wait() later orders the stream then
    t = torch.full((4,), float(r))
    w = dist.all_reduce(t, async_op=True)
    log = take_log()
    got = match("async all_reduce, no wait", log, op(comm, "allreduce"))
    u = t * 2  # used without wait: torch's contract is that this needs wait()
    expect("async: future value", torch.equal(w.get_future().wait()[0], t))
    expect("async: is_completed", w.is_completed())
    w.wait()
    if got:
        match("async: wait afterwards", take_log(), [f"wait default {got['$E']}"])
    check_values("async: value", u, torch.full((4,), 2 * float(sum(range(world)))))

    # a side stream made current: the operation follows it and wait() orders it
    _C._gpu_fake_set_stream("side")
    t = torch.ones(2)
    dist.all_reduce(t)
    match("side stream", take_log(), op(comm, "allreduce", caller="side") + ["wait side $E"])
    w = dist.all_reduce(t, async_op=True)
    _C._gpu_fake_set_stream("default")
    w.wait()  # waited for from another stream than the one it was issued on
    match("side stream, waited on default", take_log(),
          op(comm, "allreduce", caller="side") + ["wait default $E"])
    check_values("side stream: value", t, torch.full((2,), float(world * world)))

    # two groups: each its own communication stream
    g2 = dist.new_group(list(range(world)))
    take_log()
    t = torch.ones(3)
    dist.all_reduce(t, group=g2)
    got = match("second group", take_log(),
                ["stream_create $D normal"] + op("$D", "allreduce") + ["wait default $E"])
    expect("second group: another stream", got is None or got["$D"] != comm,
           f"{got and got['$D']} is the first group's stream")
    dist.all_reduce(t)
    match("first group after the second", take_log(), op(comm, "allreduce") + ["wait default $E"])

    # high priority: pg_options (NCCL's is_high_priority_stream), and the setting
    gh = dist.new_group(list(range(world)), pg_options=torch_weft.Options(
        is_high_priority_stream=True))
    os.environ["TORCH_WEFT_HIGH_PRIORITY_STREAM"] = "1"
    ge = dist.new_group(list(range(world)))
    del os.environ["TORCH_WEFT_HIGH_PRIORITY_STREAM"]
    take_log()
    for name, g in (("high priority (pg_options)", gh), ("high priority (setting)", ge)):
        dist.all_reduce(t, group=g)
        match(name, take_log(), ["stream_create $H high"] + op("$H", "allreduce") +
              ["wait default $E"])

    # blocking wait: wait() waits on the host for the end event (released by
    # the fake 1 s later), then orders the stream; without it wait()
    # returns with the operation pending on the GPU
    for name, var, val in (("TORCH_WEFT_BLOCKING_WAIT", "TORCH_WEFT_BLOCKING_WAIT", "1"),
                           ("TORCH_NCCL_BLOCKING_WAIT honoured", "TORCH_NCCL_BLOCKING_WAIT", "true"),
                           ("no blocking wait", None, None)):
        if var:
            os.environ[var] = val
        gb = dist.new_group(list(range(world)))
        if var:
            del os.environ[var]
        take_log()
        dist.all_reduce(t, group=gb)
        got = match(f"{name}: first", take_log(),
                    ["stream_create $B normal"] + op("$B", "allreduce") + ["wait default $E"])
        if not got:
            continue
        # released by the fake after 1 s with blocking wait (which must wait
        # for it), by the test without
        _C._gpu_fake_stall(got["$B"], True, 1000 if var else 0)
        w = dist.all_reduce(t, group=gb, async_op=True)
        expect(f"{name}: pending while stalled", not w.is_completed())
        w.wait()
        done = w.is_completed()
        log = take_log(keep_queries=True)
        # the last event recorded there (the first is the start event)
        end = ([ln.split()[1] for ln in log if ln.startswith("record") and
                ln.endswith(got["$B"])] or ["?"])[-1]
        waits = [i for i, ln in enumerate(log) if ln == f"wait default {end}"]
        queries = [i for i, ln in enumerate(log) if ln == f"query {end} done"]
        if var:
            expect(f"{name}: wait() returned once done", done)
            expect(f"{name}: the host saw it done before the stream wait",
                   waits and queries and queries[0] < waits[0], "\n    " + "\n    ".join(log))
        else:
            expect(f"{name}: wait() returned while the GPU had it pending", not done)
            expect(f"{name}: the stream waits", len(waits) == 1, "\n    " + "\n    ".join(log))
            _C._gpu_fake_stall(got["$B"], False)
            expect(f"{name}: done once released", w.is_completed())
        take_log()

    # avoid record_stream: the Work holds the tensor (no hold) until wait(),
    # or until it sees the operation done; with record_stream it holds none
    os.environ["TORCH_WEFT_AVOID_RECORD_STREAMS"] = "1"
    ga = dist.new_group(list(range(world)))
    del os.environ["TORCH_WEFT_AVOID_RECORD_STREAMS"]
    take_log()
    dist.all_reduce(t, group=ga)
    got = match("avoid record_stream: first", take_log(),
                ["stream_create $A normal"] + [ln for ln in op("$A", "allreduce") if "hold" not in ln] +
                ["wait default $E"])
    ga_stream = got and got["$A"]
    for name, g, s, stash in (("avoid record_stream", ga, got and got["$A"], 1),
                              ("record_stream", None, comm, 0)):
        if not s:
            continue
        for how in ("wait", "done"):
            x = torch.ones(6)
            count = x._use_count  # C++ references to the tensor
            _C._gpu_fake_stall(s, True)  # the GPU has not passed it yet
            before = count()
            w = dist.all_reduce(x, group=g, async_op=True)
            held = count()
            if how == "wait":
                w.wait()  # the caller's stream is ordered after it from here
            else:
                _C._gpu_fake_stall(s, False)
                expect(f"{name}: done once released", w.is_completed())
            after = count()
            _C._gpu_fake_stall(s, False)
            w.wait()
            expect(f"{name}: held by the Work until {how}", held - after == stash,
                   f"uses {before} before, {held} issued, {after} after {how}")
            check_values(f"{name}: value", x, torch.full((6,), float(world)))
    take_log()

    # TORCH_WEFT_COMM_STREAM=0: on the caller's stream, no events before
    os.environ["TORCH_WEFT_COMM_STREAM"] = "0"
    gc = dist.new_group(list(range(world)))
    del os.environ["TORCH_WEFT_COMM_STREAM"]
    take_log()
    dist.all_reduce(t, group=gc)
    match("TORCH_WEFT_COMM_STREAM=0", take_log(),
          ["record $S default", "run allreduce default", "hold default 1", "record $E default",
           "future default", "wait default $E"])

    # a coalesced block (_coalescing_manager): one ready event, one run, every tensor recorded,
    # one end event that the block's wait orders the stream after
    a, b = torch.full((3,), float(r)), torch.full((2,), 1.0)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    log_issue = take_log()
    cm.wait()
    log = log_issue + take_log()
    # (torch makes a block of all-reduces of host tensors one allreduce_coalesced)
    match("coalesced", log, op(comm, "allreduce_coalesced", n=2) + ["wait default $E"])
    check_values("coalesced: a", a, torch.full((3,), float(sum(range(world)))))
    check_values("coalesced: b", b, torch.full((2,), float(world)))

    # send/recv: on the group's stream as collectives are (rank 0 to 1)
    if r in (0, 1):
        m = torch.full((4,), 7.0) if r == 0 else torch.zeros(4)
        if r == 0:
            dist.send(m, 1)
        else:
            dist.recv(m, 0)
        match("send/recv", take_log(),
              op(comm, "send" if r == 0 else "recv") + ["wait default $E"])
        check_values("send/recv: value", m, torch.full((4,), 7.0))
        w = dist.isend(m, 1) if r == 0 else dist.irecv(m, 0)
        match("isend/irecv, no wait", take_log(), op(comm, "send" if r == 0 else "recv"))
        w.wait()
    dist.barrier()
    take_log()

    # buffers an operation makes when it is issued, which the communication
    # stream fills or reads, are held as the caller's tensors are (else the
    # caller's stream could be given their memory meanwhile): a list
    # all_gather's staging (the input, the outputs and the stage), a bitwise
    # all_reduce's gathered copies (the tensor and the copies)
    x = torch.full((3,), float(r + 1))
    outs = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(outs, x)
    match("all_gather to a list: its staging held too", take_log(),
          op(comm, "allgather", n=world + 2) + ["wait default $E"])
    for q in range(world):
        check_values(f"all_gather to a list: block {q}", outs[q], torch.full((3,), float(q + 1)))
    x = torch.full((2,), 1 << r, dtype=torch.int32)
    dist.all_reduce(x, op=dist.ReduceOp.BOR)
    match("bitwise all_reduce: its copies held too", take_log(),
          op(comm, "allreduce", n=2) + ["wait default $E"])
    check_values("bitwise all_reduce: value", x, torch.full((2,), (1 << world) - 1, dtype=torch.int32))

    # capture: the communication stream is forked into the capture by the
    # ready event and joined back by wait(); without the wait the capture
    # ends with it unjoined (as cudaStreamEndCapture fails); nothing is
    # queried in a capture (the fake throws if it is)
    _C._gpu_fake_set_stream("graph")
    last_id = last_flight_entry().get("record_id", -1)
    _C._gpu_fake_capture_begin()
    t = torch.ones(3)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    left = _C._gpu_fake_capture_end()
    expect("capture: joined back by wait()", left == "", f"unjoined: {left}")
    match("capture: log", take_log(keep_queries=True),
          op(comm, "allreduce", caller="graph", timed=False) + ["wait graph $E"])
    _C._gpu_fake_capture_begin()
    w = dist.all_reduce(t, async_op=True)
    left = _C._gpu_fake_capture_end()
    expect("capture: unjoined without wait()", left == comm, f"unjoined: {left!r}")
    w.wait()
    _C._gpu_fake_set_stream("default")
    take_log()
    # the graph runs them, as often as it is replayed: the flight recorder
    # leaves them out, as NCCL's, rather than show them started forever
    added = [e for e in torch_weft.flight_recorder_trace()["entries"]
             if e["record_id"] > last_id]
    expect("capture: not in the flight recorder", not added,
           " ".join(f"{e['profiling_name']}:{e['state']}" for e in added))

    check_capture_global_mode(world)
    check_failed_block(comm)
    check_duration(comm)
    if ga_stream:
        check_failed_stash(ga, ga_stream)
    check_two_threads(world)

    # a setting that is no flag is refused, naming it, when the group is made
    os.environ["TORCH_WEFT_COMM_STREAM"] = "sometimes"
    try:
        dist.new_group(list(range(world)))
        fail("bad setting", "TORCH_WEFT_COMM_STREAM=sometimes was taken")
    except Exception as e:  # noqa: BLE001 (torch wraps it as it likes)
        expect("bad setting: named", "TORCH_WEFT_COMM_STREAM=sometimes is not a flag" in str(e),
               str(e)[:300])
    del os.environ["TORCH_WEFT_COMM_STREAM"]

    dist.barrier()
    _C._gpu_fake(False)
    dist.destroy_process_group()
    if failures:
        print(f"[rank {r}] check_streams: {len(failures)} of {checks} checks failed:")
        for f in failures:
            print(f"  {f}")
        return 1
    print(f"[rank {r}] check_streams: {checks} checks passed ({world} ranks)")
    return 0


if __name__ == "__main__":
    teardown.leave(main())
