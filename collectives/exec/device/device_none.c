/* The device executor of a build without CUDA: no buffer is device memory,
 * and whatever asks for a GPU gets a clear error. */
#include "../../../transport/base/status.h"
#include "device.h"

int device_built(void) { return 0; }

int device_plan_on_device(const struct weft_plan *plan, int uses_send, int uses_recv) {
  (void)plan;
  (void)uses_send;
  (void)uses_recv;
  return 0;
}

weftResult_t device_check_ordinal(int dev) {
  /* every device is out of range here (NCCL's "Invalid device": an argument) */
  return weft_error_set(weftInvalidArgument,
                        "CUDA device %d requested, but weft was built without CUDA "
                        "(nvcc was not found at build time)",
                        dev);
}

weftResult_t device_plan_refusal(const struct weft_plan *plan) {
  return weft_error_set(weftInvalidUsage, "%s on device memory: weft was built without CUDA",
                        coll_kind_name(plan->coll));
}

weftResult_t device_enqueue(struct weftComm *comm, const struct weft_plan *plan, void *stream) {
  (void)comm;
  (void)stream;
  return weft_error_set(weftInvalidUsage, "%s on device memory: weft was built without CUDA",
                        coll_kind_name(plan->coll));
}

weftResult_t device_enqueue_group(struct weftComm *const *comms,
                                  const struct weft_plan *const *plans, void *const *streams,
                                  size_t nops) {
  (void)comms;
  (void)streams;
  return nops == 0 ? weftSuccess : device_enqueue(NULL, plans[0], NULL);
}

void device_comm_abort(struct weftComm *comm) { (void)comm; }
weftResult_t device_comm_error(struct weftComm *comm) {
  (void)comm;
  return weftSuccess;
}
weftResult_t device_comm_watch(struct weftComm *comm) {
  (void)comm;
  return weftSuccess;
}
void device_comm_free(struct weftComm *comm) { (void)comm; }
uint64_t device_comm_pdl_launches(const struct weftComm *comm) {
  (void)comm;
  return 0;
}
int device_comm_interleave(const struct weftComm *comm) {
  (void)comm;
  return 0;
}

weftResult_t device_mem_alloc(void **ptr, size_t nbytes, int *on_device_out) {
  (void)ptr;
  (void)nbytes;
  *on_device_out = 0;
  return weftSuccess;
}

int device_mem_free(void *ptr) {
  (void)ptr;
  weft_error_set(weftInternalError, "device memory without CUDA");
  return 0;
}

int device_ptr_on_device(const void *ptr) {
  (void)ptr;
  return 0;
}

int device_ptr_device_only(const void *ptr) {
  (void)ptr;
  return 0;
}

int device_current(void) { return -1; }

int device_count(void) { return 0; }

void device_ctx_make(void) {}
