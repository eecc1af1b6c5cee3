"""libnccl.so.2 loaded with dlopen and called through ctypes, as Python
wrappers of NCCL do (vLLM's pynccl, CuPy): run under weftrun, which gives
each rank WEFT_RANK, WEFT_NRANKS and the unique id in WEFT_UNIQUE_ID.

    weftrun -n 2 python3 tests/nccl/test_ctypes.py build/libnccl.so.2
"""
import array
import ctypes
import os
import sys

NCCL_SUCCESS, NCCL_INVALID_ARGUMENT = 0, 4
NCCL_INT64, NCCL_FLOAT32 = 4, 7
NCCL_SUM, NCCL_MAX = 0, 2


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def main():
    lib = ctypes.CDLL(sys.argv[1])
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetLastError.restype = ctypes.c_char_p
    rank, nranks = int(os.environ["WEFT_RANK"]), int(os.environ["WEFT_NRANKS"])
    failures = []

    def check(res, what):
        if res != NCCL_SUCCESS:
            sys.exit(f"rank {rank}: {what}: {lib.ncclGetErrorString(res).decode()} "
                     f"({lib.ncclGetLastError(None).decode()})")

    version = ctypes.c_int()
    check(lib.ncclGetVersion(ctypes.byref(version)), "ncclGetVersion")
    if version.value != 23203:
        failures.append(f"version {version.value}")

    uid = UniqueId()
    ctypes.memmove(ctypes.byref(uid), bytes.fromhex(os.environ["WEFT_UNIQUE_ID"]), 128)
    comm = ctypes.c_void_p()
    # the id goes by value, as the C ABI passes a 128-byte struct
    check(lib.ncclCommInitRank(ctypes.byref(comm), nranks, uid, rank), "ncclCommInitRank")

    count = 4097
    data = array.array("f", [rank + i * 0.5 for i in range(count)])
    out = array.array("f", bytes(4 * count))
    src = (ctypes.c_float * count).from_buffer(data)
    dst = (ctypes.c_float * count).from_buffer(out)
    check(lib.ncclAllReduce(src, dst, ctypes.c_size_t(count), NCCL_FLOAT32, NCCL_SUM, comm, None),
          "ncclAllReduce")
    base = nranks * (nranks - 1) / 2
    bad = [i for i in range(count) if out[i] != base + nranks * i * 0.5]
    if bad:
        failures.append(f"all-reduce sum wrong at {len(bad)} elements, first {bad[0]}")

    mine = (ctypes.c_int64 * 1)(1000 * rank)
    top = (ctypes.c_int64 * 1)(-1)
    check(lib.ncclAllReduce(mine, top, ctypes.c_size_t(1), NCCL_INT64, NCCL_MAX, comm, None),
          "ncclAllReduce max")
    if top[0] != 1000 * (nranks - 1):
        failures.append(f"all-reduce max gave {top[0]}")

    # a ring exchange in one group
    nxt, prv = (rank + 1) % nranks, (rank + nranks - 1) % nranks
    send = (ctypes.c_int64 * 3)(rank, rank * 2, rank * 3)
    recv = (ctypes.c_int64 * 3)(-1, -1, -1)
    check(lib.ncclGroupStart(), "ncclGroupStart")
    check(lib.ncclSend(send, ctypes.c_size_t(3), NCCL_INT64, nxt, comm, None), "ncclSend")
    check(lib.ncclRecv(recv, ctypes.c_size_t(3), NCCL_INT64, prv, comm, None), "ncclRecv")
    check(lib.ncclGroupEnd(), "ncclGroupEnd")
    if list(recv) != [prv, prv * 2, prv * 3]:
        failures.append(f"ring exchange gave {list(recv)}")

    res = lib.ncclAllReduce(src, dst, ctypes.c_size_t(count), 99, NCCL_SUM, comm, None)
    if res != NCCL_INVALID_ARGUMENT or not lib.ncclGetLastError(comm):
        failures.append(f"a bad datatype returned {res}")

    check(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    for f in failures:
        print(f"rank {rank}: {f}", file=sys.stderr)
    if not failures and rank == 0:
        print(f"ctypes: {nranks} ranks: all checks passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
