// torch_weft's CPU allocator: large CPU tensors in weft's shareable host
// memory (weftMemAllocHost), so that ranks of one host copy each other's
// tensors with plain loads and stores instead of cross-memory attach.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torch_weft {

struct AllocStats {
  bool installed;
  size_t min_bytes;      // smaller tensors go to the allocator it replaced
  size_t cache_bytes;    // most bytes of freed blocks kept for reuse
  size_t live_blocks, live_bytes;
  size_t cached_blocks, cached_bytes;
  uint64_t reused, fresh, declined; // allocations from the cache, new, refused by weft
};

// Makes the allocator torch's CPU allocator, unless another extension set
// one with a higher priority (false); once: later calls change nothing and
// return false. Tensors of min_bytes and more come from weft;
// freed blocks are kept for the next tensor of their size class (classes
// a quarter of a power of two apart), up to
// cache_bytes in all.
bool alloc_install(size_t min_bytes, size_t cache_bytes);

AllocStats alloc_stats();

// Whether [p, p + nbytes) lies in one live block of this allocator.
bool alloc_owns(const void *p, size_t nbytes);

// Frees every cached block (they are otherwise kept until reused).
void alloc_empty_cache();

}  // namespace torch_weft
