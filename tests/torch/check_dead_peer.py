"""A rank killed (SIGKILL) in the middle of DDP training on the "weft" backend:
every other rank raises torch.distributed.DistBackendError, naming the dead rank,
within the process group's timeout, and none hangs (the watchdog told to let the
process go on: TORCH_WEFT_ASYNC_ERROR_HANDLING=0).

With --watchdog, the watchdog's default (TORCH_WEFT_ASYNC_ERROR_HANDLING unset):
the survivors catch the error and then sleep, as a rank stuck elsewhere would;
each must be ended by its watchdog within the group's timeout plus 5 s of the
death, with exit code 1 and a message naming the group, the rank, the
operation and its sequence number.

    python check_dead_peer.py [nranks] [--device cuda] [--watchdog]

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


def launcher(nranks, device, watchdog):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(nranks))
    env.pop("TORCH_WEFT_ASYNC_ERROR_HANDLING", None)
    if watchdog:
        env["CHECK_WATCHDOG"] = "1"
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
                ended[r] = time.monotonic()
        time.sleep(0.1)
    for r, p in enumerate(procs):
        if r not in codes:
            p.kill()
            print(f"check_dead_peer: FAIL: rank {r} hung", flush=True)
            codes[r] = "hung"
    if not watchdog:
        ok = codes[VICTIM] == -signal.SIGKILL and all(
            c == 0 for r, c in codes.items() if r != VICTIM)
    else:
        ok = codes[VICTIM] == -signal.SIGKILL
        for r in range(nranks):
            if r == VICTIM:
                continue
            logs[r].seek(0)
            text = logs[r].read()
            m = WATCHDOG_LINE.search(text)
            after = ended[r] - ended[VICTIM] if r in ended and VICTIM in ended else None
            good = (codes[r] == 1 and m is not None and int(m.group(1)) == r and
                    after is not None and after < TIMEOUT_S + 5)
            line = text[m.start():].splitlines()[0][:400] if m else "(no watchdog message)"
            after_text = f"{after:.2f} s" if after is not None else "never"
            print(f"rank {r}: {'ok' if good else 'FAIL'}: exit code {codes[r]}, "
                  f"{after_text} after rank {VICTIM} died: {line}", flush=True)
            ok = ok and good
    print(f"check_dead_peer{' --watchdog' if watchdog else ''}: {nranks} ranks on {device}, "
          f"rank {VICTIM} killed at step "
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
        watchdog = "--watchdog" in args
        if watchdog:
            args.remove("--watchdog")
        if device not in ("cpu", "cuda"):
            sys.exit("check_dead_peer: --device takes cpu or cuda")
        sys.exit(launcher(int(args[0]) if args else 3, device, watchdog))
