/* The collectives layer's parameters. */
#include "params.h"

#include "../../include/weft.h"
#include "comm.h"

struct weft_param coll_params[] = {
    [P_NCHANNELS] = {.name = "WEFT_NCHANNELS", .type = PARAM_INT, .default_str = "1",
     .min = 1, .max = WEFT_MAX_CHANNELS, .out_of_range = PARAM_RANGE_CLAMP,
     .doc = "channels (independent rings) per communicator, within the config's "
            "`minChannels`/`maxChannels`; bulk spreads its chunks over them, while ring plans "
            "on the host take one, as the host executor runs channels one after another",
     .see = "design.md"},
    [P_NSLOTS] = {.name = "WEFT_NSLOTS", .type = PARAM_INT, .default_str = "8", .min = 2,
     .max = CONN_MAX_SLOTS, .doc = "FIFO slots per connection"},
    [P_SLOT_BYTES] = {.name = "WEFT_SLOT_BYTES", .type = PARAM_INT, .default_str = "128K",
     .doc = "bytes per FIFO slot, the pipelining chunk; a multiple of 64 up to 64M (K, M "
            "suffixes)"},
    [P_CHECK] = {.name = "WEFT_CHECK", .type = PARAM_INT, .default_str = "0",
     .doc = "`1`: before each collective, ranks allgather its signature (collective, count, "
            "datatype, op, root, sequence number) over the bootstrap; if any differ, every "
            "rank returns `weftInvalidUsage` without running it, naming the ranks and what "
            "differs (`WEFT_CHECK: AllReduce #12: count differs: ranks 0,2 have 1024, rank 1 "
            "has 1000`). Costs one bootstrap round per collective; must be the same on every "
            "rank. Sends and receives are not checked. With `0` a cheaper check is still always "
            "on: the same fields but the sequence number ride, packed in 16 bytes, with the "
            "first message that single copy (its address exchange, every call), recursive "
            "doubling (its first slots) and the SIMPLE ring (its first slot on each channel, "
            "where the data's last cache line has room) send anyway, so a mismatch there is "
            "`weftInvalidUsage` naming the ranks and what differs (`ranks disagree on a "
            "collective: AllReduce: count differs: rank 0 has 4, rank 1 has 5`): on every rank "
            "for single copy, which then goes on working; on the ranks that see it for "
            "recursive doubling and the ring, which break the communicator so that the others "
            "fail at once; LL, tree, bulk and device kernels are checked by `WEFT_CHECK=1` only",
     .see = "perf.md"},
    [P_ALGO] = {.name = "WEFT_ALGO", .type = PARAM_STR,
     .doc = "algorithms the tuner may pick (unset: all): `ring`, `tree`, `rd`, `cma`, `bulk`; "
            "`^` excludes; per collective as `allreduce:tree;broadcast:ring`"},
    [P_PROTO] = {.name = "WEFT_PROTO", .type = PARAM_STR,
     .doc = "protocols the tuner may pick (unset: all): `simple`, `ll`; same syntax as "
            "`WEFT_ALGO`"},
    PARAM_END,
};
