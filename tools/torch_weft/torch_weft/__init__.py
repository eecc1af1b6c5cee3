"""torch_weft: weft as a torch.distributed backend.

    import torch_weft                      # registers the backend "weft"
    dist.init_process_group("weft")        # CPU tensors, and CUDA tensors on a GPU

Every process group (the default one, new_group, DeviceMesh groups) gets its
own weft communicator; its unique id travels through the group's c10d Store,
so no port beyond the store's is needed. The group's timeout is the
communicator's: a dead or silent peer raises DistBackendError naming it.
"""
import os
import sys

# A rank's communication thread waits on its peers while its training thread
# computes; weft's waits spin for WEFT_SPIN_NS before yielding the core, which
# takes cycles from the backward pass when cores are few. Yield at once
# unless the user chose otherwise (read by weft when the first group starts).
os.environ.setdefault("WEFT_SPIN_NS", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

try:
    from . import _C
except ImportError as e:  # pip install . builds it, or tools/scripts/setup.sh in the tree
    raise ImportError(
        "torch_weft: the C++ extension is not built or does not load into this torch "
        f"({torch.__version__}); `pip install .` in weft's checkout builds the package, "
        "`WEFT_SETUP_TORCH=1 tools/scripts/setup.sh` or `python tools/torch_weft/build.py` "
        f"the extension in the tree ({e})") from e

__all__ = ["BACKEND", "Options", "version", "allocator_stats", "empty_allocator_cache",
           "dump_flight_recorder", "flight_recorder_trace"]


def _env_bytes(name, default):
    text = os.environ.get(name, default).strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    try:
        return int(text[:-1] if mult > 1 else text) * mult
    except ValueError:
        raise ValueError(f"torch_weft: {name}={text!r} is not a byte count "
                         "(a number, optionally followed by K, M or G)") from None


# CPU tensors of TORCH_WEFT_ALLOC_MIN_BYTES and more come from weft's shareable
# host memory, which the ranks of one host copy directly (docs/pytorch.md);
# TORCH_WEFT_ALLOC=0 leaves torch's allocator alone, and so does torch's
# autoload of the installed package at `import torch`, which only registers the
# backend (_torch_weft_autoload.py): the program's own `import torch_weft` installs it.
_autoload = sys.modules.get("_torch_weft_autoload")
if os.environ.get("TORCH_WEFT_ALLOC", "1") != "0" and not getattr(_autoload, "registering", False):
    _C.install_allocator(_env_bytes("TORCH_WEFT_ALLOC_MIN_BYTES", "64K"),
                         _env_bytes("TORCH_WEFT_ALLOC_CACHE_BYTES", "1G"))


def allocator_stats():
    """What weft's CPU allocator holds: installed, min_bytes, cache_bytes,
    live_blocks/live_bytes, cached_blocks/cached_bytes, and how many
    allocations were reused from the cache, fresh, or declined by weft."""
    return _C.allocator_stats()


def empty_allocator_cache():
    """Returns the freed blocks weft's CPU allocator keeps for reuse."""
    _C.allocator_empty_cache()

BACKEND = "weft"


def dump_flight_recorder(prefix=None):
    """Writes the flight recorder of this process's weft groups (their last
    TORCH_FR_BUFFER_SIZE operations) to <prefix><global rank>, the prefix
    being TORCH_FR_DUMP_TEMP_FILE's unless given, in the format of PyTorch's
    flight recorder (`torchfrtrace DIR` reads the ranks' files); returns the
    path written. The watchdog writes the same dump when it sees a timeout or
    a failure (docs/pytorch.md)."""
    return _C.flight_recorder_dump(prefix or "")


def flight_recorder_trace():
    """The flight recorder's dump as a dict (version, pg_config, pg_status,
    entries), as dump_flight_recorder() writes it."""
    import pickle
    return pickle.loads(_C.flight_recorder_pickled())


def version():
    """weft's version code (major*10000 + minor*100 + patch)."""
    return _C.weft_version()


class Options:
    """pg_options of a "weft" group (init_process_group, new_group, split_group):

        dist.init_process_group("weft", pg_options=torch_weft.Options(channels=4))

    channels: the communicator's channels (rings or trees run side by side;
    host rings: 1 to 16), else weft's choice (WEFT_MIN_NCHANNELS and
    WEFT_MAX_NCHANNELS); name: the communicator's name in weft's logs and
    errors, else the group's; timeout (a timedelta): the group's timeout,
    else the one given to the call (its default: 30 minutes);
    high_priority_stream (also is_high_priority_stream, NCCL's name): the
    group's CUDA communication streams are of high priority, else
    TORCH_WEFT_HIGH_PRIORITY_STREAM says."""

    def __init__(self, channels=None, name=None, timeout=None, high_priority_stream=None,
                 is_high_priority_stream=None):
        if channels is not None and (not isinstance(channels, int) or channels < 1):
            raise ValueError(f"torch_weft.Options: channels={channels!r} is not a count "
                             "of channels (an int from 1)")
        if timeout is not None and not hasattr(timeout, "total_seconds"):
            raise TypeError(f"torch_weft.Options: timeout={timeout!r} is not a timedelta")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"torch_weft.Options: name={name!r} is not a string")
        if high_priority_stream is None:
            high_priority_stream = is_high_priority_stream
        if high_priority_stream is not None and not isinstance(high_priority_stream, bool):
            raise TypeError(f"torch_weft.Options: high_priority_stream={high_priority_stream!r} "
                            "is not a bool")
        self.channels = channels
        self.name = name
        self.timeout = timeout
        self.high_priority_stream = high_priority_stream

    @property
    def is_high_priority_stream(self):
        return self.high_priority_stream

    def __repr__(self):
        return (f"torch_weft.Options(channels={self.channels!r}, name={self.name!r}, "
                f"timeout={self.timeout!r}, high_priority_stream={self.high_priority_stream!r})")


def _create_backend(opts, backend_options=None, group_desc=None):
    timeout = opts.timeout.total_seconds() if opts.timeout is not None else 1800.0
    name = opts.group_id or "torch"
    channels = 0
    high_priority = -1
    if backend_options is not None:
        if not isinstance(backend_options, Options):
            raise TypeError(f"weft: pg_options must be a torch_weft.Options, got "
                            f"{type(backend_options).__name__}")
        channels = backend_options.channels or 0
        name = backend_options.name or name
        if backend_options.timeout is not None:
            timeout = backend_options.timeout.total_seconds()
        if backend_options.high_priority_stream is not None:
            high_priority = int(backend_options.high_priority_stream)
    # the flight recorder's view of the group: torch's name, description
    # and the members' global ranks (none given: the world's)
    ranks = list(getattr(opts, "global_ranks_in_group", None) or [])
    return _C.create_backend(opts.store, opts.group_rank, opts.group_size, timeout, name,
                             channels, high_priority, group_name=opts.group_id or "",
                             group_desc=group_desc or "undefined", global_ranks=ranks)


def _create(opts, backend_options=None):
    """The group of a "weft" backend: torch's ProcessGroup with weft's backend
    for every device it takes, whose name is "weft" (torch calls the groups of
    registered backends "custom", which DDP's logging data would show)."""
    # what the caller was asked for is in its frame: the group's description
    # (the flight recorder's) and its backends
    caller = sys._getframe(1).f_locals
    backend = _create_backend(opts, backend_options, caller.get("group_desc"))
    # only where weft is the group's backend for every device: torch takes a
    # returned group as the whole group ("cpu:gloo,cuda:weft" keeps torch's,
    # named "custom")
    config = caller.get("backend_config")
    try:
        only_weft = set(config.get_device_backend_map().values()) == {BACKEND}
    except AttributeError:
        only_weft = False
    made = getattr(opts, "process_group", None)
    if not only_weft or made is None or not hasattr(made, "get_group_store"):
        return backend  # a torch without them: the group stays torch's
    pg = _C.WeftProcessGroup(made.get_group_store(), opts.group_rank, opts.group_size)
    # TORCH_DISTRIBUTED_DEBUG=DETAIL: torch's collective checker (shapes, dtypes
    # and kinds compared over a Gloo helper before each call) wraps the backend,
    # as torch does for the groups it makes itself
    if dist.get_debug_level() == dist.DebugLevel.DETAIL and dist.is_gloo_available():
        backend = dist.distributed_c10d._create_process_group_wrapper(
            wrapped_pg=backend, store_prefix=opts.group_id, store=opts.store,
            rank=opts.group_rank, world_size=opts.group_size, timeout=opts.timeout)
    kind = dist.ProcessGroup.BackendType.CUSTOM
    pg._set_default_backend(kind)
    for device in config.get_device_backend_map():
        pg._register_backend(torch.device(device), kind, backend)
    if made.bound_device_id is not None:
        pg.bound_device_id = made.bound_device_id
    return pg


# CUDA tensors where this build has them and a GPU is visible: operations run
# on the caller's current stream, as NCCL's do (docs/pytorch.md).
_DEVICES = ["cpu"] + (["cuda"] if _C.cuda_built() and torch.cuda.is_available() else [])

if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=_DEVICES)
