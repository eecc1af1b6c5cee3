"""A rank killed (SIGKILL) in the middle of DDP training on the "weft" backend:
every other rank raises torch.distributed.DistBackendError, naming the dead rank,
within the process group's timeout, and none hangs (the watchdog told to let the
process go on: TORCH_WEFT_ASYNC_ERROR_HANDLING=0).

With --watchdog, the watchdog's default (TORCH_WEFT_ASYNC_ERROR_HANDLING unset):
the survivors catch the error and then sleep, as a rank stuck elsewhere would;
each must be ended by its watchdog within the group's timeout plus 5 s of the
death, with exit code 1 and a message naming the group, the rank, the
operation and its sequence number.

    python check_dead_peer.py [nranks] [--device cuda] [--watchdog [--handling 1]]

--handling 1 runs the watchdog in TORCH_WEFT_ASYNC_ERROR_HANDLING=1 (it also frees
the communicator before the process ends): the same must hold, and the line must
name that mode.

With --watchdog the ranks also leave flight-recorder dumps (TORCH_FR_DUMP_TEMP_FILE,
one file per rank, written by the watchdog before it ends the process): each
survivor's must hold the operation its watchdog named, by sequence number
(op_id), not completed, and PyTorch's analyzer (torchfrtrace, run from the
venv as a user would) must name the killed rank, whose dump is missing.

With --hang (implies --watchdog) the victim sleeps instead of dying, inside
the training loop and outside any operation: the survivors' operation times
out; the victim's watchdog learns of the broken communicator and ends it too,
so every rank dumps, and the analyzer names the victim as the rank that did
not join the collective the others are in.

With --device cuda (tools/scripts/gpu-check.sh, step torch_dead_peer_cuda) the model and
its data are on cuda:0, which every rank shares: the survivors' kernels wait for
the dead rank until the timeout, and the error reaches the training loop through
the next operation weft refuses (wait() on CUDA does not block the host).

Launches its own ranks (torchrun would stop the survivors itself when one
dies, which is what this test must not hide) with the env:// rendezvous.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

TIMEOUT_S = 15      # the process group's timeout
VICTIM = 1
KILL_AT_STEP = 3


def rank_main(device):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "tools", "torch_weft"))
    import torch_weft  # noqa: F401

    dev = torch.device(device, 0)
    if device == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("weft", timeout=timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to(dev)
    model = DDP(net, device_ids=[0] if device == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    last_ok = time.monotonic()
    try:
        for step in range(1000):
            if rank == VICTIM and step == KILL_AT_STEP:
                if os.environ.get("CHECK_HANG"):
                    print(f"rank {rank}: asleep at {time.time():.3f}", file=sys.stderr, flush=True)
                    time.sleep(4 * TIMEOUT_S)  # only the watchdog ends this rank now
                    print(f"rank {rank}: FAIL: the watchdog did not end the sleeping rank",
                          flush=True)
                    os._exit(2)
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            model(torch.randn(32, 64, device=dev)).square().mean().backward()
            opt.step()
            last_ok = time.monotonic()
        print(f"rank {rank}: FAIL: trained 1000 steps without noticing the dead rank", flush=True)
        sys.exit(1)
    except dist.DistBackendError as e:
        waited = time.monotonic() - last_ok
        msg = str(e).splitlines()[0][:300]
        # on a GPU the survivors' kernels time out waiting, and the message
        # may name only the rank that gave up: required on the host only
        named = f"rank {VICTIM} " in msg or device == "cuda"
        ok = waited < TIMEOUT_S + 5 and named
        print(f"rank {rank}: {'ok' if ok else 'FAIL'}: DistBackendError after {waited:.2f} s "
              f"(timeout {TIMEOUT_S} s): {msg}", flush=True)
        if os.environ.get("CHECK_WATCHDOG"):
            time.sleep(3 * TIMEOUT_S)  # only the watchdog ends this rank now
            print(f"rank {rank}: FAIL: the watchdog did not end the process", flush=True)
            os._exit(2)
        os._exit(0 if ok else 1)  # the group is broken: skip its orderly teardown
    except Exception as e:  # noqa: BLE001
        print(f"rank {rank}: FAIL: {type(e).__name__} instead of DistBackendError: {e}",
              flush=True)
        os._exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WATCHDOG_LINE = re.compile(r"weft watchdog: process group '[^']*', rank (\d+) of (\d+): "
                           r"(\w+) \(sequence number (\d+)\)")


SIGNALED_LINE = re.compile(rf"weft watchdog: process group '0', rank {VICTIM} of \d+: the group "
                           r"failed on another rank \(rank \d+: \w+ \(sequence number \d+\)")
ASLEEP_LINE = re.compile(r"asleep at ([\d.]+)")
DUMPED_LINE = re.compile(r"weft: flight recorder dumped to (\S+)")
# where the analyzer names ranks: a dump missing (without and with
# --allow-incomplete-ranks), or a rank that did not join a collective
ANALYZER_RANKS = re.compile(r"(?:Missing dump files from ranks|missed FR dumps from ranks \(|"
                            r"missing ranks:) *\{([\d, ]+)\}")


def check_flight(dump_dir, nranks, seqs, hang):
    """The dumps the ranks left in dump_dir: each survivor's (every rank's
    when hang) holds the operation its watchdog named (seqs: rank -> its
    sequence number) as op_id, not completed; PyTorch's analyzer names the
    victim. Returns whether all holds, printing what it found."""
    import pickle
    ok = True
    dumped = sorted(int(f[len("weft_trace_rank_"):]) for f in os.listdir(dump_dir)
                    if f.startswith("weft_trace_rank_") and ".tmp." not in f)
    want = list(range(nranks)) if hang else [r for r in range(nranks) if r != VICTIM]
    if dumped != want:
        print(f"flight recorder: FAIL: dumps of ranks {dumped}, expected {want}", flush=True)
        return False
    for r in want:
        with open(os.path.join(dump_dir, f"weft_trace_rank_{r}"), "rb") as f:
            d = pickle.load(f)
        entries = d["entries"]
        named = [e for e in entries if e["op_id"] == seqs.get(r)]
        good = (d["version"] == "2.10" and len(entries) > 0 and
                all(e["process_group"] == ("0", "default_pg") for e in entries) and
                d["pg_config"]["0"]["ranks"] == str(list(range(nranks))) and
                (r == VICTIM and hang or
                 (len(named) == 1 and named[0]["state"] != "completed" and
                  named[0]["profiling_name"] == "weft:all_reduce")))
        last = entries[-1] if entries else {}
        print(f"flight recorder: rank {r}: {'ok' if good else 'FAIL'}: {len(entries)} entries, "
              f"the last {last.get('profiling_name')} #{last.get('collective_seq_id')} "
              f"(op_id {last.get('op_id')}) {last.get('state')}; the watchdog named "
              f"op_id {seqs.get(r)}", flush=True)
        ok = ok and good
    # the analyzer as a user runs it: the console script of the venv's torch
    exe = os.path.join(os.path.dirname(sys.executable), "torchfrtrace")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m",
                                               "torch.distributed.flight_recorder.fr_trace"]
    runs = [[dump_dir]] if hang else [[dump_dir], [dump_dir, "--allow-incomplete-ranks"]]
    for extra in runs:
        res = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=120)
        out = res.stdout + res.stderr
        named = [set(int(x) for x in m.group(1).split(",")) for m in ANALYZER_RANKS.finditer(out)]
        # what it says first, for the log (without the warnings about the
        # comm library's name it gives for each entry)
        lines = [ln for ln in out.splitlines() if "unrecognized comm library" not in ln]
        first = next((i for i, ln in enumerate(lines)
                      if "Not all ranks" in ln or "We cannot decide" in ln or
                      "Missing dump files" in ln), 0)
        good = len(named) > 0 and all(n == {VICTIM} for n in named)
        print(f"flight recorder: {'ok' if good else 'FAIL'}: {' '.join(cmd[-1:] + extra[1:])} "
              f"(exit {res.returncode}) names {named[:3]}, {len(named)} times; it says:",
              flush=True)
        for ln in lines[first:first + 10]:
            print(f"    {ln[:200]}", flush=True)
        if not good:
            print(out[-3000:], flush=True)
        ok = ok and good
    return ok


def launcher(nranks, device, watchdog, hang=False, handling=None):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(nranks))
    env.pop("TORCH_WEFT_ASYNC_ERROR_HANDLING", None)
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    dump_dir = tempfile.TemporaryDirectory(prefix="weft_fr_")
    env["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(dump_dir.name, "weft_trace_rank_")
    if hang:
        env["CHECK_HANG"] = "1"
    if watchdog:
        env["CHECK_WATCHDOG"] = "1"
        if handling is not None:
            env["TORCH_WEFT_ASYNC_ERROR_HANDLING"] = str(handling)
    else:
        env["TORCH_WEFT_ASYNC_ERROR_HANDLING"] = "0"
    procs, logs = [], []
    for r in range(nranks):
        logs.append(tempfile.TemporaryFile(mode="w+"))
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", device],
                                      env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                      stderr=logs[-1] if watchdog else None))
    start = time.monotonic()
    deadline = start + 120 + 3 * TIMEOUT_S  # startup under load, then the timeout
    codes, ended = {}, {}
    while len(codes) < nranks and time.monotonic() < deadline:
        for r, p in enumerate(procs):
            if r not in codes and p.poll() is not None:
                codes[r] = p.returncode
                ended[r] = time.time()
        time.sleep(0.1)
    for r, p in enumerate(procs):
        if r not in codes:
            p.kill()
            print(f"check_dead_peer: FAIL: rank {r} hung", flush=True)
            codes[r] = "hung"
    seqs = {}
    if not watchdog:
        ok = codes[VICTIM] == -signal.SIGKILL and all(
            c == 0 for r, c in codes.items() if r != VICTIM)
    else:
        ok = codes[VICTIM] == (1 if hang else -signal.SIGKILL)
        ok = ok and all(r in ended for r in range(nranks))
        logs[VICTIM].seek(0)
        victim_text = logs[VICTIM].read()
        m = ASLEEP_LINE.search(victim_text)
        asleep_at = float(m.group(1)) if m else None
        for r in range(nranks):
            if r == VICTIM:
                if hang:
                    # the survivors' dump signal woke its watchdog
                    m = SIGNALED_LINE.search(victim_text)
                    good = m is not None and DUMPED_LINE.search(victim_text) is not None
                    line = (victim_text[m.start():].splitlines()[0][:400] if m
                            else "(no watchdog message)")
                    print(f"rank {r} (asleep): {'ok' if good else 'FAIL'}: exit code {codes[r]}: "
                          f"{line}", flush=True)
                    ok = ok and good
                continue
            logs[r].seek(0)
            text = logs[r].read()
            m = WATCHDOG_LINE.search(text)
            # from the victim's death, or the moment it fell asleep
            since = ended.get(VICTIM) if not hang else asleep_at
            after = ended[r] - since if r in ended and since is not None else None
            if m is not None:
                seqs[r] = int(m.group(4))
            mode = f"(TORCH_WEFT_ASYNC_ERROR_HANDLING={handling if handling is not None else 3}"
            good = (codes[r] == 1 and m is not None and int(m.group(1)) == r and
                    mode in text[m.start():m.start() + 4000] and
                    after is not None and after < TIMEOUT_S + 5 and
                    DUMPED_LINE.search(text) is not None)
            line = text[m.start():].splitlines()[0][:400] if m else "(no watchdog message)"
            after_text = f"{after:.2f} s" if after is not None else "never"
            print(f"rank {r}: {'ok' if good else 'FAIL'}: exit code {codes[r]}, "
                  f"{after_text} after rank {VICTIM} {'fell asleep' if hang else 'died'}: {line}",
                  flush=True)
            ok = ok and good
        ok = check_flight(dump_dir.name, nranks, seqs, hang) and ok
    dump_dir.cleanup()
    print(f"check_dead_peer{' --hang' if hang else ' --watchdog' if watchdog else ''}: "
          f"{nranks} ranks on {device}, "
          f"rank {VICTIM} {'asleep' if hang else 'killed'} at step "
          f"{KILL_AT_STEP}; "
          f"exit codes {codes}; {time.monotonic() - start:.1f} s: {'ok' if ok else 'FAILED'}",
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2])
    else:
        args = sys.argv[1:]
        device = "cpu"
        if "--device" in args:
            i = args.index("--device")
            device = args[i + 1] if i + 1 < len(args) else ""
            del args[i:i + 2]
        hang = "--hang" in args
        if hang:
            args.remove("--hang")
        watchdog = "--watchdog" in args or hang
        if "--watchdog" in args:
            args.remove("--watchdog")
        handling = None
        if "--handling" in args:
            i = args.index("--handling")
            handling = int(args[i + 1]) if i + 1 < len(args) and args[i + 1] in ("1", "3") else -1
            del args[i:i + 2]
            if handling < 0 or not watchdog:
                sys.exit("check_dead_peer: --handling takes 1 or 3, with --watchdog")
        if device not in ("cpu", "cuda"):
            sys.exit("check_dead_peer: --device takes cpu or cuda")
        sys.exit(launcher(int(args[0]) if args else 3, device, watchdog, hang, handling))
