"""A rank killed (SIGKILL) in the middle of DDP training on the "weft" backend:
every other rank raises torch.distributed.DistBackendError, naming the dead rank,
within the process group's timeout, and none hangs.

    python check_dead_peer.py [nranks] [--device cuda]

With --device cuda (tools/scripts/gpu-check.sh, step torch_dead_peer_cuda) the model and
its data are on cuda:0, which every rank shares: the survivors' kernels wait for
the dead rank until the timeout, and the error reaches the training loop through
the next operation weft refuses (wait() on CUDA does not block the host).

Launches its own ranks (torchrun would stop the survivors itself when one
dies, which is what this test must not hide) with the env:// rendezvous.
"""
import os
import signal
import socket
import subprocess
import sys
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
        os._exit(0 if ok else 1)  # the group is broken: skip its orderly teardown
    except Exception as e:  # noqa: BLE001
        print(f"rank {rank}: FAIL: {type(e).__name__} instead of DistBackendError: {e}",
              flush=True)
        os._exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher(nranks, device):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(nranks))
    procs = []
    for r in range(nranks):
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", device],
                                      env=dict(env, RANK=str(r), LOCAL_RANK=str(r))))
    start = time.monotonic()
    deadline = start + 120 + 3 * TIMEOUT_S  # startup under load, then the timeout
    codes = {}
    while len(codes) < nranks and time.monotonic() < deadline:
        for r, p in enumerate(procs):
            if r not in codes and p.poll() is not None:
                codes[r] = p.returncode
        time.sleep(0.1)
    for r, p in enumerate(procs):
        if r not in codes:
            p.kill()
            print(f"check_dead_peer: FAIL: rank {r} hung", flush=True)
            codes[r] = "hung"
    ok = codes[VICTIM] == -signal.SIGKILL and all(
        c == 0 for r, c in codes.items() if r != VICTIM)
    print(f"check_dead_peer: {nranks} ranks on {device}, rank {VICTIM} killed at step "
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
        if device not in ("cpu", "cuda"):
            sys.exit("check_dead_peer: --device takes cpu or cuda")
        sys.exit(launcher(int(args[0]) if args else 3, device))
