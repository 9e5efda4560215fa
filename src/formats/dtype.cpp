// Names and sizes of the safetensors dtypes; the E4M3 NaN scan the loader runs over FP8 tensors.
#include "formats/dtype.h"

#include <algorithm>
#include <cstring>

namespace m3 {

namespace {
struct DTypeInfo {
  const char* name;
  DType type;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {"F64", DType::F64, 8},  {"F32", DType::F32, 4},         {"F16", DType::F16, 2},
    {"BF16", DType::BF16, 2}, {"F8_E4M3", DType::F8_E4M3, 1}, {"F8_E5M2", DType::F8_E5M2, 1},
    {"I64", DType::I64, 8},  {"I32", DType::I32, 4},         {"I16", DType::I16, 2},
    {"I8", DType::I8, 1},    {"U8", DType::U8, 1},           {"BOOL", DType::BOOL, 1},
};
}  // namespace

bool dtype_from_name(std::string_view name, DType* out) {
  for (const auto& d : kDTypes) {
    if (name == d.name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

const char* dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

namespace {
// First NaN code in p[0, n), or n. Eight bytes at a time (hand-written SWAR: the loader scans every
// MXFP8 weight byte, gigabytes for a full checkpoint, and a plain byte loop is far slower than memory):
// a byte b is a NaN code iff (b | 0x80) == 0xFF, i.e. iff ~(b | 0x80) is zero.
size_t first_nan_serial(const uint8_t* p, size_t n) {
  constexpr uint64_t kLo = 0x0101010101010101ull, kHi = 0x8080808080808080ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    const uint64_t y = ~(v | kHi);  // zero bytes mark NaN codes
    if ((y - kLo) & ~y & kHi) break;  // some byte of y is zero (exact: no false positives overall)
  }
  for (; i < n; ++i)
    if ((p[i] | 0x80) == 0xff) return i;
  return n;
}
}  // namespace

size_t find_e4m3_nan(const uint8_t* p, size_t n) {
  constexpr size_t kChunk = size_t(1) << 20;
  const int64_t chunks = int64_t((n + kChunk - 1) / kChunk);
  size_t first = n;
#pragma omp parallel for schedule(dynamic) reduction(min : first) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t lo = size_t(c) * kChunk, len = std::min(kChunk, n - lo);
    const size_t i = first_nan_serial(p + lo, len);
    if (i < len) first = std::min(first, lo + i);
  }
  return first;
}

}  // namespace m3
