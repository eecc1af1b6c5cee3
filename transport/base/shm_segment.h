/* POSIX shared-memory segments: created private (0600) by one process,
 * attached by another, unlinked as soon as the other side holds a mapping. */
#ifndef WEFT_SHM_SEGMENT_H
#define WEFT_SHM_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "../../include/weft.h"

#define SHM_NAME_BYTES 64

struct shm_segment {
  char name[SHM_NAME_BYTES];
  void *base;
  size_t nbytes;
  int owner; /* created here: unlink on close if nobody attached */
};

/* Places a new segment's memory (NUMA) before its pages are allocated. */
typedef void (*shm_segment_place_fn)(void *addr, size_t nbytes);
/* Creates a segment; place (may be NULL) runs before its pages exist. */
weftResult_t shm_segment_create(size_t nbytes, shm_segment_place_fn place,
                                struct shm_segment *seg_out);
/* Maps the segment and unlinks its name. */
weftResult_t shm_segment_attach(const char *name, size_t nbytes, struct shm_segment *seg_out);
void shm_segment_close(struct shm_segment *seg);
/* Closes a connection's segment. One this end still owns is a set-up that
 * never completed, where a peer may have died holding segments nobody
 * attached: whoever notices sweeps them (shm_segment_sweep). */
void shm_segment_close_conn(struct shm_segment *seg);
/* Unlinks the segments of this user and pid namespace whose creator died
 * before anyone attached them; returns how many. */
int shm_segment_sweep(void);

/* Markers: empty names "/weft-<pid>-<tag><key>" that say "this process is
 * alive and at work on key" to other processes of the host. One whose
 * creator died is unlinked by whoever looks for it, or by the sweep. */
weftResult_t shm_marker_create(uint32_t key, char name_out[SHM_NAME_BYTES]);
/* Unlinks the marker (created here) and empties name. */
void shm_marker_remove(char name[SHM_NAME_BYTES]);
/* The index in keys of a marker whose creator died (unlinked now), or -1. */
int shm_marker_find_dead(const uint32_t *keys, int nkeys);

#endif
