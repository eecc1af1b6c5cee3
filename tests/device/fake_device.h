/* An emulated device state for a comm (device_watch.c's view of it): the
 * words its kernels would report in, in plain host memory, written here as
 * the kernels write them (launch_done.h, dev_done_report). C, since the
 * device executor's private header is; test_device_watch.cc uses it. */
#ifndef WEFT_TESTS_FAKE_DEVICE_H
#define WEFT_TESTS_FAKE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "weft.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fake_device;
/* Gives comm a device state of plain host memory, watched as a real one. */
struct fake_device *fake_device_attach(weftComm_t comm);
/* Takes it away (before the comm is destroyed). */
void fake_device_detach(struct fake_device *f);
/* Enqueues an all-reduce of count float32 as the comm's next launch, of
 * nblocks blocks, planned for protocol proto (enum coll_proto): recorded in
 * the trace as device_enqueue records it. */
void fake_device_launch(struct fake_device *f, size_t count, int nblocks, int proto);
/* Every block of launch seq ends. */
void fake_device_end(struct fake_device *f, uint64_t seq, int nblocks);
/* The kernels give up for want of progress from peer (a block's stall
 * record, then the error word). */
void fake_device_time_out(struct fake_device *f, int peer);
/* The kernels' abort word, as the host set it. */
uint32_t fake_device_abort_word(const struct fake_device *f);

#ifdef __cplusplus
}
#endif

#endif
