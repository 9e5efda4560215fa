// std::vector storage on 64-byte (cache-line) boundaries, for activations, panels and scratch the
// 512-bit kernels load whole vectors from. Speed: glibc's malloc places large blocks 16 bytes past a
// page boundary, so every 64-byte load from such a buffer spans two cache lines (a quarter of the
// prefill panel kernel's speed lost; docs/benchmarks.md section 5).
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace m3 {

template <class T>
struct CacheAlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAlignedAllocator() noexcept = default;
  template <class U>
  CacheAlignedAllocator(const CacheAlignedAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t n) noexcept { ::operator delete(p, n * sizeof(T), kAlign); }
  template <class U>
  bool operator==(const CacheAlignedAllocator<U>&) const noexcept { return true; }
};

template <class T>
using AlignedVector = std::vector<T, CacheAlignedAllocator<T>>;

}  // namespace m3
