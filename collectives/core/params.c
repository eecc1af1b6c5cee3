/* The collectives layer's parameters. */
#include "params.h"

#include "../../include/weft.h"
#include "comm.h"

struct weft_param coll_params[] = {
    [P_NCHANNELS] = {.name = "WEFT_NCHANNELS", .type = PARAM_INT, .default_str = "1",
     .min = 1, .max = WEFT_MAX_CHANNELS, .out_of_range = PARAM_RANGE_CLAMP,
     .doc = "channels (independent rings) per communicator, within the config's "
            "`minChannels`/`maxChannels`; bulk spreads its chunks over them, while ring plans "
            "on the host take one, as the host executor runs channels one after another. The "
            "count within those bounds must be the same on every rank: a communicator whose "
            "ranks differ refuses to form, naming them",
     .see = "design.md"},
    [P_NSLOTS] = {.name = "WEFT_NSLOTS", .type = PARAM_INT, .default_str = "8", .min = 2,
     .max = CONN_MAX_SLOTS, .doc = "FIFO slots per connection", .agree = 1},
    [P_SLOT_BYTES] = {.name = "WEFT_SLOT_BYTES", .type = PARAM_INT, .default_str = "128K",
     .doc = "bytes per FIFO slot, the pipelining chunk; a multiple of 64 up to 64M (K, M "
            "suffixes)", .agree = 1},
    [P_CHECK] = {.name = "WEFT_CHECK", .type = PARAM_INT, .min = 0, .max = 1,
     .out_of_range = PARAM_RANGE_ERROR, .default_str = "0",
     .doc = "`1`: before each collective, ranks allgather its signature (collective, count, "
            "datatype, op, root, sequence number) over the bootstrap; if any differ, every "
            "rank returns `weftInvalidUsage` without running it, naming the ranks and what "
            "differs (`WEFT_CHECK: AllReduce #12: count differs: ranks 0,2 have 1024, rank 1 "
            "has 1000`). Costs one bootstrap round per collective. Sends and receives are not "
            "checked; gather, scatter and all-to-all on host memory are, as collectives, where they run on the calling thread (not queued on a host stream). With `0` a cheaper check is still always on: the same fields, the "
            "sequence number modulo 256, ride packed in 16 bytes with the first message of the call on "
            "every connection a host path uses (the ring's first slot of each link, SIMPLE and "
            "LL; a signature alone on the link a broadcast's or reduce's chain leaves unused; "
            "the trees' first pieces; recursive doubling's first slots; single copy's address "
            "exchange; a message of its own for bulk), so a "
            "mismatch is `weftInvalidUsage` naming the ranks and what differs (`ranks disagree "
            "on a collective: AllReduce #3: count differs: rank 0 has 4, rank 1 has 5`) on the "
            "ranks that see it, which break the communicator so that the others fail at once "
            "(single copy: every rank, and the comm goes on working unless the numbers differ). "
            "On device memory the ring "
            "and tree kernels compare the head of each link's first slot, and the send/recv kernel "
            "each message's size, and report through `weftCommGetAsyncError`; there "
            "`WEFT_DETERMINISTIC`'s exchanges compare only their sizes. docs/signature.md has "
            "the table",
     .see = "signature.md", .agree = 1},
    [P_ALGO] = {.name = "WEFT_ALGO", .type = PARAM_STR,
     .doc = "algorithms the tuner may pick (unset: all): `ring`, `tree`, `rd`, `direct`, `cma`, `bulk`; "
            "`^` excludes; per collective as `allreduce:tree;broadcast:ring`; unknown names are "
            "ignored with a warning, and a list that then allows none restricts nothing",
     .agree = 1},
    [P_PROTO] = {.name = "WEFT_PROTO", .type = PARAM_STR,
     .doc = "protocols the tuner may pick (unset: all): `simple`, `ll`; same syntax as "
            "`WEFT_ALGO`", .agree = 1},
    [P_DETERMINISTIC] = {.name = "WEFT_DETERMINISTIC", .type = PARAM_INT, .default_str = "0",
     .min = 0, .max = 1,
     .doc = "`1`: every all-reduce, reduce-scatter and reduce (host and device buffers) "
            "sums each element in rank order (0, 1, ... n-1; float16, bfloat16 and fp8 in float32, rounded once), "
            "so its result is bitwise the same whatever the size, `WEFT_ALGO`, `WEFT_PROTO`, "
            "channels or transport, for a given number of ranks; `WEFT_ALGO` and `WEFT_PROTO` "
            "then do not apply to reductions",
     .see = "determinism.md", .agree = 1},
    [P_TREE_SMALL_BYTES] = {.name = "WEFT_TREE_SMALL_BYTES", .type = PARAM_INT,
     .default_str = "4K", .min = 0, .max = (int64_t)1 << 30,
     .doc = "tree all-reduces (host and device buffers) of up to this many bytes run whole over "
            "one tree with three children a node (depth 1 up to 4 ranks, 2 up to 13), on one "
            "channel, instead of halves over the double binary tree, whose depth is log2 of the "
            "ranks: fewer levels for calls of a piece or two; on one host only (across hosts the "
            "trees stay hierarchical); 0: always the double binary tree (and device tree channels "
            "without the small tree's links)",
     .see = "cuda.md", .agree = 1},
    PARAM_END,
};
