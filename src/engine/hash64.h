// The 64-bit mixing step shared by the prefix-cache hash chain (block_pool.cpp) and the KV page
// checksum (kv_page_codec.cpp): splitmix64's finaliser.
#pragma once
#include <cstdint>

namespace m3 {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace m3
