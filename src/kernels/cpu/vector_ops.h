// The dot product and axpy of the kernel table (CpuOps::dot, CpuOps::axpy), every ISA: fixed-width
// lane arrays that GCC vectorises with each build's flags (several independent accumulators).
#pragma once
#include <cstdint>

namespace m3::cpu {
namespace {

constexpr int kLanes = 32;

[[maybe_unused]] float dot_impl(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0.f;
  for (; i < n; ++i) tail += a[i] * b[i];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0] + tail;
}

[[maybe_unused]] void axpy_impl(float a, const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace
}  // namespace m3::cpu
