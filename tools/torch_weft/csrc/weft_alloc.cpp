// torch_weft's CPU allocator (weft_alloc.h).
//
// weft's single-copy collectives and sends read and write a peer's buffer
// directly. A buffer from weftMemAllocHost is a memfd that the peer maps
// once and then copies with memcpy; any other buffer (what torch's default
// allocator gives) is reached through process_vm_readv/writev, which moved
// less than half as many bytes per second on the development machine. So
// large CPU tensors come from weftMemAllocHost.
//
// A new memfd costs system calls and its pages fault in on first touch, and
// every peer maps a new allocation again; training loops free and allocate
// tensors of the same sizes step after step. Freed blocks are therefore
// kept by size class and handed to the next tensor of that class (the peers'
// maps of them stay valid), up to a cap; beyond it they go back to weft. Tensors
// below min_bytes, and any that weft declines, come from the allocator this
// one replaced.
//
// Memory from weftMemAllocHost is copy-on-write in a forked child (a
// DataLoader worker), as malloc's is (include/weft.h).
#include "weft_alloc.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <weft.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace torch_weft {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHuge = 2u << 20; // weftMemAllocHost aligns from here on

// The block size for a tensor of n bytes: size classes a quarter of a power
// of two apart (at most a quarter more than asked), so that tensors of nearby
// sizes, as variable shapes make them, share cached blocks; then weft's own
// rounding (pages, 2 MiB from 2 MiB on).
size_t round_block(size_t n) {
  size_t pow2 = kPage;
  while (pow2 <= n / 2) pow2 *= 2;
  const size_t step = pow2 / 4 > kPage ? pow2 / 4 : kPage;
  const size_t c = (n + step - 1) / step * step;
  const size_t a = c >= kHuge ? kHuge : kPage;
  return (c + a - 1) / a * a;
}

class WeftCpuAllocator final : public c10::Allocator {
 public:
  WeftCpuAllocator(c10::Allocator *fallback, size_t min_bytes, size_t cache_bytes)
      : fallback_(fallback), min_bytes_(min_bytes), cache_cap_(cache_bytes) {}

  c10::DataPtr allocate(size_t n) override {
    void *p = n >= min_bytes_ ? take(round_block(n)) : nullptr;
    if (p == nullptr) return fallback_->allocate(n);
    return {p, p, &WeftCpuAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &WeftCpuAllocator::release; }

  void copy_data(void *dest, const void *src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  AllocStats stats() {
    std::lock_guard<std::mutex> g(mu_);
    AllocStats s{};
    s.installed = c10::GetCPUAllocator() == this;
    s.min_bytes = min_bytes_;
    s.cache_bytes = cache_cap_;
    s.live_blocks = live_.size();
    for (const auto &kv : live_) s.live_bytes += kv.second;
    for (const auto &kv : cache_) s.cached_blocks += kv.second.size();
    s.cached_bytes = cached_bytes_;
    s.reused = reused_;
    s.fresh = fresh_;
    s.declined = declined_;
    return s;
  }

  bool owns(const void *p, size_t nbytes) {
    std::lock_guard<std::mutex> g(mu_);
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = live_.upper_bound(a);
    if (it == live_.begin()) return false;
    --it;
    return a - it->first <= it->second && nbytes <= it->second - (a - it->first);
  }

  void empty_cache() {
    std::vector<void *> gone;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto &kv : cache_)
        for (void *p : kv.second) gone.push_back(p);
      cache_.clear();
      cached_bytes_ = 0;
    }
    for (void *p : gone) weftMemFree(p);
  }

  static WeftCpuAllocator *instance;

 private:
  // A block of exactly nbytes (rounded): a cached one, else a new one from
  // weft; nullptr when weft declines.
  void *take(size_t nbytes) {
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = cache_.find(nbytes);
      if (it != cache_.end() && !it->second.empty()) {
        void *p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= nbytes;
        live_.emplace(reinterpret_cast<uintptr_t>(p), nbytes);
        reused_++;
        return p;
      }
    }
    void *p = nullptr;
    const bool ok = weftMemAllocHost(&p, nbytes) == weftSuccess;
    std::lock_guard<std::mutex> g(mu_);
    if (!ok) {
      declined_++;
      return nullptr;
    }
    live_.emplace(reinterpret_cast<uintptr_t>(p), nbytes);
    fresh_++;
    return p;
  }

  // The deleter of every DataPtr this allocator made, and its raw_deleter,
  // which raw_deallocate also calls with the fallback's pointers.
  static void release(void *p) {
    WeftCpuAllocator *self = instance;
    bool free_it = false;
    {
      std::lock_guard<std::mutex> g(self->mu_);
      auto it = self->live_.find(reinterpret_cast<uintptr_t>(p));
      if (it == self->live_.end()) {
        c10::DeleterFnPtr d = self->fallback_->raw_deleter();
        if (d != nullptr) d(p);
        return;
      }
      const size_t nbytes = it->second;
      self->live_.erase(it);
      if (self->cached_bytes_ + nbytes <= self->cache_cap_) {
        self->cache_[nbytes].push_back(p);
        self->cached_bytes_ += nbytes;
      } else {
        free_it = true;
      }
    }
    if (free_it) weftMemFree(p);
  }

  c10::Allocator *fallback_;
  const size_t min_bytes_, cache_cap_;
  std::mutex mu_;
  std::map<uintptr_t, size_t> live_;                       // block -> bytes
  std::unordered_map<size_t, std::vector<void *>> cache_; // bytes -> free blocks
  size_t cached_bytes_ = 0;
  uint64_t reused_ = 0, fresh_ = 0, declined_ = 0;
};

WeftCpuAllocator *WeftCpuAllocator::instance = nullptr;
std::mutex install_mu;

}  // namespace

bool alloc_install(size_t min_bytes, size_t cache_bytes) {
  std::lock_guard<std::mutex> g(install_mu);
  if (WeftCpuAllocator::instance != nullptr) return false;
  // never freed: tensors made through it may outlive every Python object
  auto *a = new WeftCpuAllocator(c10::GetCPUAllocator(), min_bytes, cache_bytes);
  WeftCpuAllocator::instance = a;
  // torch's own allocator has priority 0; one set with a higher priority
  // before (by another extension) is left in place
  c10::SetCPUAllocator(a, /*priority=*/0);
  return c10::GetCPUAllocator() == a;
}

AllocStats alloc_stats() {
  if (WeftCpuAllocator::instance == nullptr) return AllocStats{};
  return WeftCpuAllocator::instance->stats();
}

bool alloc_owns(const void *p, size_t nbytes) {
  return WeftCpuAllocator::instance != nullptr && WeftCpuAllocator::instance->owns(p, nbytes);
}

void alloc_empty_cache() {
  if (WeftCpuAllocator::instance != nullptr) WeftCpuAllocator::instance->empty_cache();
}

}  // namespace torch_weft
