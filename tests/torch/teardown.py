"""How a torch.distributed test process that used a Gloo group leaves.

Gloo's worker threads can still be freeing finished work, and the tensors it
holds, after destroy_process_group returns. If the interpreter is finalizing
by then, the tensor's decref takes the GIL, Python makes the thread exit and
std::terminate aborts the process ("terminate called without an active
exception", torch 2.15; seen in about 1 run in 8 of a 3-rank script). Such a
test leaves without finalization, once what it printed is flushed: the
process groups are already destroyed, so weft's teardown still runs."""
import os
import sys


def leave(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
