"""Point-to-point round trips on the "weft" backend and on a Gloo group of the
same ranks, alternating, host tensors: rank 0 sends and then receives, rank 1
receives and then sends back (blocking send/recv, which torch runs as isend or
irecv and a wait). Prints the median round trip per size, and the 10th
percentile (on a loaded machine the median is mostly the scheduler's).

    torchrun --standalone --nproc-per-node 2 tools/torch_weft/bench_p2p.py [--rounds 60]
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_weft  # noqa: E402,F401

WARMUP = 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60, help="round trips per size and backend")
    rounds = ap.parse_args().rounds + WARMUP
    dist.init_process_group("weft")
    gloo = dist.new_group(backend="gloo")
    r = dist.get_rank()
    for nbytes in [1 << 10, 1 << 22]:
        for name, group in [("weft", None), ("gloo", gloo)]:
            t = torch.ones(nbytes // 4)
            times = []
            for _ in range(rounds):
                dist.barrier(group=gloo)
                start = time.perf_counter()
                if r == 0:
                    dist.send(t, 1, group=group)
                    dist.recv(t, 1, group=group)
                elif r == 1:
                    dist.recv(t, 0, group=group)
                    dist.send(t, 0, group=group)
                times.append(time.perf_counter() - start)
            times = sorted(times[WARMUP:])
            if r == 0:
                print(f"{name} round trip {nbytes} bytes: median "
                      f"{times[len(times) // 2] * 1e6:.0f} us, p10 "
                      f"{times[len(times) // 10] * 1e6:.0f} us", flush=True)
    dist.destroy_process_group()
    os._exit(0)  # Gloo's threads at exit: tests/torch/teardown.py


if __name__ == "__main__":
    main()
