/* An LL line (DEV_LL_LINE_NBYTES, dev_types.h): 8 payload bytes beside two
 * copies of the step's flag, as four 32-bit words {data low, flag, data
 * high, flag}. The kernels store and load a line with one 16-byte access,
 * but what is sure to arrive whole (over NVLink or PCIe, into device or host
 * memory) is each 8-byte half: a reader takes a line only when both halves
 * carry the flag it waits for, so neither a half still in flight nor one
 * left by an earlier use of the slot (another step's flag) passes. One
 * source for the kernels (prims_device.cuh) and the host's tests of it.
 * Compiles as C, C++ and CUDA (host and device). */
#ifndef WEFT_LL_LINE_H
#define WEFT_LL_LINE_H

#include <stdint.h>

#if defined(__CUDACC__)
#define LL_HD static __host__ __device__ __forceinline__
#else
#define LL_HD static inline
#endif

/* The flag of the lines of FIFO step `step`: 1 to 2^32 - 1, never 0, which
 * a line no step has written yet holds. Counting modulo 2^32 - 1 (odd)
 * rather than 2^32 also keeps a slot's flags from repeating every 2^32
 * steps: with a power-of-two number of slots, a slot sees a flag again only
 * after 4 x (2^32 - 1) steps (4 slots). Step + 1 truncated, as the kernels
 * first had, gave step 2^32 - 1 the flag 0, so a line of that step beyond
 * what its slot had ever held was taken at once, zeros for data. */
LL_HD uint32_t ll_flag(uint64_t step) { return (uint32_t)(step % 0xffffffffu) + 1; }

LL_HD void ll_line_pack(uint64_t data, uint32_t flag, uint32_t line[4]) {
  line[0] = (uint32_t)data;
  line[1] = flag;
  line[2] = (uint32_t)(data >> 32);
  line[3] = flag;
}

/* Whether both halves of line carry flag. */
LL_HD int ll_line_ready(const uint32_t line[4], uint32_t flag) {
  return line[1] == flag && line[3] == flag;
}

LL_HD uint64_t ll_line_data(const uint32_t line[4]) {
  return (uint64_t)line[0] | (uint64_t)line[2] << 32;
}

#endif
