/* Host buffers that peers on the same host can map (collectives/core/mem.c).
 *
 * weftMemAllocHost takes buffers from 64 KiB up from a memfd: a rank passes
 * (fd, id, offset) of a buffer to its peers, which open the fd through
 * /proc/<pid>/fd once, map it, and then copy to and from it in user space
 * (collectives/algo/cma.c) instead of asking the kernel to copy each time. */
#ifndef WEFT_MEM_H
#define WEFT_MEM_H

#include <stddef.h>
#include <stdint.h>

struct weftComm;

/* Where a buffer lies in a shareable allocation, as peers need to find it. */
struct mem_shared_ref {
  int32_t fd;      /* the allocation's memfd in the owner's process; -1: not shareable */
  uint32_t pad;
  uint64_t id;     /* the owner's allocation number (never reused by a process) */
  uint64_t dev;    /* the memfd's device and inode, to check that the file opened */
  uint64_t ino;    /* through /proc is this allocation's */
  uint64_t base;   /* the allocation's address in the owner's process */
  uint64_t nbytes; /* the allocation's length */
};

/* Fills ref_out with the allocation holding [ptr, ptr + nbytes); fd -1 when
 * no shareable allocation holds all of it. Thread safe. */
void mem_shared_find(const void *ptr, size_t nbytes, struct mem_shared_ref *ref_out);

/* This process's address of peer's allocation ref, mapped on first use and
 * kept with comm until the peer's address range shows up with another
 * allocation or comm is destroyed. NULL (and an info log) when it cannot be
 * mapped: the caller copies through the kernel instead. */
void *mem_peer_map(struct weftComm *comm, int peer, const struct mem_shared_ref *ref);

/* Frees the registrations of comm that were never deregistered: comm's free. */
void mem_regs_free(struct weftComm *comm);

#ifdef WEFT_TEST_HOOKS
/* The suites' build only: how many peers' allocations comm holds mapped
 * (comm unmaps them when it is freed). */
int mem_peer_map_count(const struct weftComm *comm);
#endif

#endif
