#!/usr/bin/env python3
"""Fails when the device path calls CUDA on the legacy default stream.

cudaMemcpy, cudaMemset and their relatives run on the legacy default stream,
which waits for every blocking stream of the device. In the device path that
means: a rank's set-up waits for the kernels of other ranks of its process,
which wait for this rank (a deadlock until WEFT_TIMEOUT); a graph capture in
progress on a blocking stream fails (cudaErrorStreamCaptureImplicit); and a
FIFO cleared that way may be cleared after a peer's kernel wrote to it, when
the caller's stream is non-blocking. Set-up copies go through cuda_fifo_copy
(transport/cuda_ipc), launches through the caller's stream.

Usage: check_setup_sync.py SOURCE_ROOT
"""
import glob
import os
import re
import sys

FILES = ["collectives/exec/device/*.c", "collectives/exec/device/*.cu",
         "collectives/exec/device/*.cuh", "transport/cuda_ipc/*.c", "transport/p2p/*.c",
         "transport/host_fifo/*.c", "transport/net_dev*.c"]
# the calls that take no stream and so use the legacy default stream
LEGACY = re.compile(r"\b(cudaMemcpy|cudaMemset|cudaMemcpy2D|cudaMemcpy3D|cudaMemset2D|"
                    r"cudaMemcpyToSymbol|cudaMemcpyFromSymbol|cudaMemcpyPeer|"
                    r"cudaDeviceSynchronize)\s*\(")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def blank_comments(text):
    """Comments replaced by as many newlines, so line numbers hold."""
    return COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    root = sys.argv[1]
    found, nfiles = [], 0
    for pattern in FILES:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            nfiles += 1
            with open(path) as f:
                code = blank_comments(f.read())
            for i, line in enumerate(code.splitlines(), 1):
                m = LEGACY.search(line)
                if m:
                    found.append("%s:%d: %s" % (os.path.relpath(path, root), i, m.group(1)))
    if nfiles == 0:
        print("check_setup_sync: no device source under %s" % root, file=sys.stderr)
        return 1
    for f in found:
        print("%s: on the legacy default stream (use cuda_fifo_copy or an Async call on "
              "a stream)" % f)
    print("check_setup_sync: %d files, %d legacy-stream calls" % (nfiles, len(found)))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
