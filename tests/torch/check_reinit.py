"""A group made again after a failure, under torchrun (run.sh reinit N sets
TORCH_WEFT_ASYNC_ERROR_HANDLING=2, so that the failure is an exception the
ranks catch, and turns the flight recorder on): rank 0 sleeps through the
first group's all-reduce, whose watchdog fires on the others and leaves the
flight recorder's dump signal in the store; every rank then destroys the
group and makes it again, which PyTorch does under the same store prefix.
The new group must train: two all-reduces two seconds apart (the signal
thread looks twice a second), with the right sums. A signal left under the
old group's keys failed the new group at its first look; the first group's
unique id, left in the store, was read by ranks that came before rank 0.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "torch_weft"))
import torch_weft  # noqa: E402,F401


def main():
    dist.init_process_group("weft", timeout=datetime.timedelta(seconds=3))
    rank, world = dist.get_rank(), dist.get_world_size()
    failed = False
    if rank == 0:
        time.sleep(5)
    else:
        try:
            t = torch.ones(2)
            dist.all_reduce(t)
        except Exception as e:  # noqa: BLE001  (the timeout, as it must be)
            failed = True
            print(f"rank {rank}: the first group failed as it should: {str(e)[:160]}",
                  flush=True)
        if not failed:
            print(f"rank {rank}: FAIL: the all-reduce rank 0 slept through completed", flush=True)
            sys.exit(1)
    time.sleep(1)
    dist.destroy_process_group()
    # the others first: PyTorch reuses the keys, and they must wait for rank 0's
    # new unique id, not read the first group's (rank 0 took it out of the store)
    if rank == 0:
        time.sleep(2)
    dist.init_process_group("weft", timeout=datetime.timedelta(seconds=30))
    for i in range(2):
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t)
        want = world * (world + 1) / 2
        if t.tolist() != [want] * 3:
            print(f"rank {rank}: FAIL: all-reduce {i} of the new group gave {t.tolist()}, "
                  f"want {want}", flush=True)
            sys.exit(1)
        time.sleep(2)
    dist.destroy_process_group()
    print(f"rank {rank}: the group made again trains", flush=True)


if __name__ == "__main__":
    main()
