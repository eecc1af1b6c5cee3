/* Ring all-reduce. The buffer is cut into nranks chunks per loop; each chunk
 * is one slot. Position i in the ring, k ranks:
 *   send chunk i-1; then k-2 times recv-reduce-send the chunk before;
 *   recv-reduce-copy-send chunk i (now fully reduced: keep it and pass it on);
 *   k-2 times recv-copy-send; then recv the last chunk. */
#include "../transport/status.h"
#include "plan.h"
#include "prims.h"

#define CHUNK_ALIGN_NBYTES 64

weftResult_t ring_allreduce(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count) {
  struct prims p;
  prims_init(&p, comm, ch, plan->datatype, plan->op, plan->proto);
  const int k = comm->nranks, pos = ch->ring_pos;
  const size_t esize = p.elem_nbytes;
  const char *src = (const char *)plan->sendbuf + offset * esize;
  char *dst = (char *)plan->recvbuf + offset * esize;
  const size_t slot_count = prims_slot_count(&p);
  const size_t align_count = CHUNK_ALIGN_NBYTES / esize;

  for (size_t base = 0; base < count; base += (size_t)k * slot_count) {
    /* chunk size for this loop: a full slot, or an even share of the rest */
    size_t chunk = (count - base + (size_t)k - 1) / (size_t)k;
    chunk = (chunk + align_count - 1) / align_count * align_count;
    if (chunk > slot_count) chunk = slot_count;
#define CHUNK_OFF(c) (base + (size_t)(c) * chunk)
#define CHUNK_LEN(c) (CHUNK_OFF(c) >= count ? 0 : (count - CHUNK_OFF(c) < chunk ? count - CHUNK_OFF(c) : chunk))
#define AT(buf, c) ((buf) + CHUNK_OFF(c) * esize)
    int c = (pos - 1 + k) % k;
    WEFT_TRY(prims_send(&p, AT(src, c), CHUNK_LEN(c)));
    for (int j = 2; j < k; j++) {
      c = (pos - j + k) % k;
      WEFT_TRY(prims_recv_reduce_send(&p, AT(src, c), CHUNK_LEN(c)));
    }
    c = pos;
    WEFT_TRY(prims_recv_reduce_copy_send(&p, AT(src, c), AT(dst, c), CHUNK_LEN(c)));
    for (int j = 1; j < k - 1; j++) {
      c = (pos - j + k) % k;
      WEFT_TRY(prims_recv_copy_send(&p, AT(dst, c), CHUNK_LEN(c)));
    }
    c = (pos + 1) % k;
    WEFT_TRY(prims_recv(&p, AT(dst, c), CHUNK_LEN(c)));
#undef CHUNK_OFF
#undef CHUNK_LEN
#undef AT
  }
  return weftSuccess;
}
