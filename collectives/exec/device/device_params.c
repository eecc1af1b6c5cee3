/* Environment of the device executor: channels, send/recv lanes, loops run
 * together, launches and the pointer cache. Built in every build, so that
 * weft-info lists them; they matter only with CUDA. */
#include "device_params.h"

struct weft_param device_params[] = {
    [DEVICE_P_NCHANNELS] = {"WEFT_DEVICE_NCHANNELS", PARAM_INT, NULL,
     "channels (kernel blocks, each a ring with its own device FIFOs) of a comm's device "
     "collectives, 1 to 64; unset: 32, at most one block per SM of the GPU over the ranks "
     "sharing it; set: at most the blocks its SMs hold at once over those ranks; a launch "
     "uses one per 64 KiB (LL: per 16 KiB)", 0, 0, NULL},
    [DEVICE_P_SENDRECV_LANES] = {"WEFT_P2P_LANES", PARAM_INT, "4",
     "FIFOs (lanes) per peer and direction of device send/recv, 1 to 8: "
     "a message's slots take turns on them and each lane is one kernel block's work at a "
     "time; each costs 1 MiB of the receiver's memory per peer", 0, 0, NULL, .agree = 1},
    /* 1 to 3: ring_interleave_max of the device FIFOs' DEV_NSLOTS (4) */
    [DEVICE_P_RING_INTERLEAVE] = {"WEFT_DEVICE_RING_INTERLEAVE", PARAM_INT, "2",
     "loops of a device ring collective (an all-reduce's loop: one slot per rank; the other "
     "collectives': one slot) each channel runs together, 1 to 3 (ranks that differ take the "
     "fewest): step s of each before step s + 1 of any, so that a step's wait for the previous "
     "rank overlaps the other loops' steps; 1 runs one loop after another", 0, 0, NULL},
    [DEVICE_P_PDL] = {"WEFT_DEVICE_PDL", PARAM_INT, "1",
     "1 launches a device ring collective of one channel (a small message) with programmatic "
     "dependent launch on GPUs of compute capability 9.0 and later: the GPU schedules its "
     "kernel while the stream's previous kernel still runs, and the kernel waits for that one "
     "before it reads anything; not while the stream is captured into a graph; 0 launches "
     "every kernel after the stream's previous one", 0, 0, NULL},
    [DEVICE_P_PTR_CACHE] = {"WEFT_DEVICE_PTR_CACHE", PARAM_INT, "1",
     "1 remembers, per thread, the ranges of the last device allocations a call's buffers lay "
     "in, so that later calls on them skip the pointer query (a sixth of a microsecond); 0 "
     "asks CUDA on every call (for allocators that give freed device addresses back to the "
     "host)", 0, 0, NULL},
    [DEVICE_P_NUM] = PARAM_END,
};
