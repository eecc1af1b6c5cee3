/* The call's signature in the kernels: struct signature_packed
 * (collectives/core/signature.h) as two 64-bit words, its count first, keyed
 * with a FIFO's step exactly as signature_packed_keyed keys the host's SIMPLE
 * slots, so that what an earlier call left in a slot's head never reads as
 * this call's. Compiles as C, C++ and CUDA (host and device), so that the
 * host's tests check it against signature_packed_keyed. */
#ifndef WEFT_DEV_SIG_H
#define WEFT_DEV_SIG_H

#include <stdint.h>

#if defined(__CUDACC__)
#define DEV_SIG_HD static __host__ __device__ __forceinline__
#else
#define DEV_SIG_HD static inline
#endif

#define DEV_SIG_KEY 0x9e3779b97f4a7c15ull

/* out = sig keyed with step (word 0 is the count). */
DEV_SIG_HD void dev_sig_keyed(const uint64_t sig[2], uint64_t step, uint64_t out[2]) {
  out[0] = sig[0] ^ (step + 1) * DEV_SIG_KEY;
  out[1] = sig[1];
}

/* Back from a keyed head to the signature it was (keyed with step). */
DEV_SIG_HD void dev_sig_unkeyed(const uint64_t keyed[2], uint64_t step, uint64_t out[2]) {
  dev_sig_keyed(keyed, step, out); /* xor is its own inverse */
}

#endif
