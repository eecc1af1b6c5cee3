"""torch_weft's CPU allocator, under torchrun (2 or more ranks):

- CPU tensors from TORCH_WEFT_ALLOC_MIN_BYTES (64 KiB) up come from weft's
  shareable memory, smaller ones from torch's allocator; views of them too;
- a freed block serves the next tensor of its size class (not of the next
  class up); the cache keeps at most
  TORCH_WEFT_ALLOC_CACHE_BYTES (set small here) and empties on request;
- a forked child reads the parent's tensors and its writes stay its own;
- peers map each other's tensors: after collectives on fresh tensors a rank
  holds mappings of weft memory that is not its own, and results are right
  (random data, odd offsets, against the same call on Gloo);
- a bad byte count in the environment is a clear error at import.

Each failed check prints FAIL and the rank exits 1.
"""
import os
import subprocess
import sys

CACHE_BYTES = 1 << 20
os.environ["TORCH_WEFT_ALLOC_CACHE_BYTES"] = str(CACHE_BYTES)
os.environ.pop("TORCH_WEFT_ALLOC", None)
os.environ.pop("TORCH_WEFT_ALLOC_MIN_BYTES", None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "torch_weft"))
import torch_weft  # noqa: E402
import teardown  # noqa: E402  (beside this script)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"rank {os.environ.get('RANK')}: FAIL: {what}", flush=True)


def owns(t):
    return torch_weft._C.allocator_owns(t)


def check_placement():
    st = torch_weft.allocator_stats()
    check(st["installed"], f"allocator not installed: {st}")
    check(st["min_bytes"] == 64 << 10 and st["cache_bytes"] == CACHE_BYTES, f"settings {st}")
    big, small = torch.empty(64 << 10, dtype=torch.uint8), torch.empty((64 << 10) - 1,
                                                                        dtype=torch.uint8)
    check(owns(big), "a 64 KiB tensor is not weft memory")
    check(not owns(small), "a tensor under 64 KiB is weft memory")
    m = torch.randn(300, 301, dtype=torch.float64)
    check(owns(m[7:, 3:]) and owns(m.t()), "views of a weft tensor are not weft memory")
    check(not owns(torch.from_numpy(m.numpy().copy())), "numpy's memory counted as weft's")


def check_cache():
    torch_weft.empty_allocator_cache()
    before = torch_weft.allocator_stats()
    a = torch.empty(100_000)  # 400000 bytes, 98 pages
    ptr = a.data_ptr()
    del a
    b = torch.empty(99_999)  # same rounded size
    after = torch_weft.allocator_stats()
    check(b.data_ptr() == ptr and after["reused"] == before["reused"] + 1,
          f"a freed block was not reused: {before} -> {after}")
    c = torch.empty(110_000)  # 440000 bytes: the same class (448 KiB) as 400000
    check(c.data_ptr() != ptr, "one block served two live tensors")
    del b
    d = torch.empty(110_000)
    check(d.data_ptr() == ptr, "a block was not reused for a tensor of its size class")
    del c, d
    st = torch_weft.allocator_stats()
    e = torch.empty(125_000)  # 500000 bytes: the next class up
    check(torch_weft.allocator_stats()["fresh"] == st["fresh"] + 1,
          "a block served a tensor larger than its class")
    del e
    ts = [torch.empty(1 << 18) for _ in range(3)]  # 1 MiB each: the cache holds one
    del ts
    st = torch_weft.allocator_stats()
    check(st["cached_bytes"] <= CACHE_BYTES and st["cached_blocks"] >= 1,
          f"cache over its cap or empty: {st}")
    torch_weft.empty_allocator_cache()
    st = torch_weft.allocator_stats()
    check(st["cached_bytes"] == 0 and st["cached_blocks"] == 0, f"cache not emptied: {st}")


def check_fork():
    t = torch.full((1 << 18,), 3.0)
    pid = os.fork()
    if pid == 0:
        ok = bool((t == 3.0).all())
        t.fill_(7.0)
        ok = ok and bool((t == 7.0).all())
        u = torch.ones(1 << 18)  # the child's own tensors work
        ok = ok and owns(u) and float(u.sum()) == float(1 << 18)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    check(os.waitstatus_to_exitcode(status) == 0, "the forked child saw or wrote wrong data")
    check(bool((t == 3.0).all()), "the forked child's writes reached the parent's tensor")


def peer_mapped_inodes():
    """Inodes of weft memory mapped here that this process does not own."""
    own = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:weft-mem"):
                own.add(os.stat(f"/proc/self/fd/{fd}").st_ino)
        except OSError:
            pass
    mapped = set()
    with open("/proc/self/maps") as f:
        for line in f:
            if "weft-mem" in line:
                mapped.add(int(line.split()[4]))
    return mapped - own


def check_collectives(gloo):
    rank, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1234 + rank)
    before = peer_mapped_inodes()
    for count in (1 << 16, 100_003):
        base = torch.randn(count * n + 5, generator=g)
        inp = base[5:5 + count]  # an odd offset into a weft block
        out, ref = torch.full((count * n,), float("nan")), torch.empty(count * n)
        dist.all_gather_into_tensor(out, inp)
        dist.all_gather_into_tensor(ref, inp, group=gloo)
        check(torch.equal(out, ref), f"all_gather of {count} differs from Gloo")
        x = torch.randn(count * n, generator=g)
        y = x.clone()
        dist.all_reduce(x)
        dist.all_reduce(y, group=gloo)
        check(torch.allclose(x, y, rtol=1e-5, atol=1e-5), f"all_reduce of {count} differs")
        a2a, a2a_ref = torch.full_like(x, float("nan")), torch.empty_like(x)
        dist.all_to_all_single(a2a, x)
        dist.all_to_all_single(a2a_ref, x, group=gloo)
        check(torch.equal(a2a, a2a_ref), f"all_to_all_single of {count} differs from Gloo")
    gained = peer_mapped_inodes() - before
    check(len(gained) >= 1, "no peer's tensor was mapped: collectives went through the kernel")


def check_bad_env():
    code = "import torch_weft"
    env = dict(os.environ, TORCH_WEFT_ALLOC_MIN_BYTES="lots",
               PYTHONPATH=os.path.join(HERE, "..", "..", "tools", "torch_weft"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    check(r.returncode != 0 and "TORCH_WEFT_ALLOC_MIN_BYTES='lots' is not a byte count"
          in r.stderr, f"a bad byte count was not refused clearly: {r.stderr[-300:]}")


def main():
    dist.init_process_group("weft")
    gloo = dist.new_group(backend="gloo")
    check_placement()
    check_cache()
    check_fork()
    check_collectives(gloo)
    if dist.get_rank() == 0:
        check_bad_env()
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    print(f"rank {os.environ.get('RANK')}: {'FAIL' if failures else 'ok'}: "
          f"{len(failures)} failed checks", flush=True)
    teardown.leave(1 if failures else 0)  # a Gloo group: see teardown.py


if __name__ == "__main__":
    main()
