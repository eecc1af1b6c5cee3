/* weftCommSplit's refusal (api/comm_split.c), for callers that check
 * arguments of their own before a split (the NCCL config). */
#ifndef WEFT_COMM_SPLIT_H
#define WEFT_COMM_SPLIT_H

#include "../../include/weft.h"

/* weftCommSplit on a rank that refuses it (refused, the thread's error text
 * saying why, as a caller's own checks found it): the rank takes part,
 * marked failed, so that every rank fails at once; returns refused. */
weftResult_t comm_split_refused(weftComm_t comm, int key, weftResult_t refused);

#endif
