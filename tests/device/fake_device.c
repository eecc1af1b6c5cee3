/* fake_device.h's emulated device state. */
#include "fake_device.h"

#include <stdlib.h>
#include <string.h>

#include "collectives/core/comm.h"
#include "collectives/core/plan.h"
#include "collectives/exec/device/device_priv.h"

struct fake_device {
  struct weftComm *comm;
  struct device_comm *d;
};

struct fake_device *fake_device_attach(weftComm_t comm) {
  struct fake_device *f = calloc(1, sizeof *f);
  struct device_comm *d = calloc(1, sizeof *d);
  void *flags = NULL;
  if (f == NULL || d == NULL || posix_memalign(&flags, 4096, DEV_FLAGS_PAGE_NBYTES) != 0) abort();
  memset(flags, 0, DEV_FLAGS_PAGE_NBYTES);
  d->flags_h = flags;
  device_watch_init(d);
  comm->device = d;
  device_watch_open(comm, d);
  f->comm = comm;
  f->d = d;
  return f;
}

void fake_device_detach(struct fake_device *f) {
  device_watch_close(f->comm, f->d);
  device_watch_fini(f->d);
  f->comm->device = NULL;
  free(f->d->flags_h);
  free(f->d);
  free(f);
}

void fake_device_launch(struct fake_device *f, size_t count, int nblocks, int proto) {
  struct weft_plan p;
  memset(&p, 0, sizeof p);
  plan_init(&p, COLL_ALLREDUCE, NULL, NULL, count, weftFloat32, weftSum, -1);
  p.on_device = 1;
  p.proto = (enum coll_proto)proto;
  const uint64_t seq = f->d->done.seq + 1;
  f->d->done.seq = seq;
  f->d->done.nblocks = nblocks;
  const struct trace_launch l = {seq, seq, (uint64_t)nblocks};
  device_trace_call(f->comm, &p, &l, weftSuccess);
}

void fake_device_end(struct fake_device *f, uint64_t seq, int nblocks) {
  uint64_t *failed = (uint64_t *)((char *)f->d->flags_h + DEV_FAILED_OFFSET);
  for (int b = 0; b < nblocks; b++) {
    if (__atomic_load_n(&f->d->flags_h[1], __ATOMIC_ACQUIRE) != 0 && *failed == 0)
      __atomic_store_n(failed, seq, __ATOMIC_RELEASE);
    __atomic_store_n(&device_ended_h(f->d)[b], seq, __ATOMIC_RELEASE);
  }
}

void fake_device_time_out(struct fake_device *f, int peer) {
  struct dev_stall *st = (struct dev_stall *)((char *)f->d->flags_h + DEV_STALL_OFFSET);
  st[0].peer = peer;
  st[0].dir = DEV_STALL_RECV;
  st[0].step = 0;
  __atomic_store_n(&st[0].found, 1u, __ATOMIC_RELEASE);
  __atomic_store_n(&f->d->flags_h[1], (uint32_t)DEV_GAVE_UP_TIMEOUT, __ATOMIC_RELEASE);
}

uint32_t fake_device_abort_word(const struct fake_device *f) {
  return __atomic_load_n(&f->d->flags_h[0], __ATOMIC_ACQUIRE);
}
