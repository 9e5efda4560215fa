// AVX2 / F16C / FMA building blocks shared by the linear and attention kernels of the avx2 and avx512
// builds: element decoders (E2M1, E4M3, BF16), the 8-lane horizontal sum and the software prefetches.
// Internal linkage (an anonymous namespace): every ISA translation unit that includes this compiles
// its own copy with its own flags.
#pragma once
#include <cstddef>
#include <cstdint>
#include <immintrin.h>

#include "kernels/cpu/isa_level.h"

#if !defined(M3_KERNELS_AVX2)
#error "simd_avx2.h needs the M3_KERNELS_AVX2 compiler flags (see CMakeLists.txt)"
#endif

namespace m3::cpu {
namespace {

// consumes it). E4M3 and BF16 are exact: E4M3 is widened bit-wise to FP16 (its bias-7 exponent lands in the
// bias-15 field, subnormals included) and rescaled by 2^8 (folded into the block scale); E2M1 codes become small integers (2x the
// value) whose product with the E4M3 block scale is exact, as in the reference formula.

// `mul` = block scale / (2 * global divisor), one rounding per block instead of a vector division
// per element: a decoded weight may differ from the reference formula's by 1 ulp, far below the
// summation error of the dot product it feeds (the generic build keeps the exact formula).
// E2M1 codes (one per byte, 0..15) to twice their values as signed bytes.
inline __m128i e2m1_twice(__m128i codes) {
  return _mm_shuffle_epi8(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), codes);
}
// 16 such values (element order) times `mul`, in two registers.
inline void e2m1_twice_to_ps(__m128i vals, float mul, __m256& a, __m256& c) {
  const __m256 s = _mm256_set1_ps(mul);
  a = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(vals)), s);
  c = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(vals, 8))), s);
}
// 16 E2M1 codes (8 bytes, low nibble first) times `mul`, in element order, in two registers.
inline void e2m1x16_to_ps(const uint8_t* p, float mul, __m256& a, __m256& c) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  e2m1_twice_to_ps(e2m1_twice(_mm_unpacklo_epi8(lo, hi)), mul, a, c);  // element order 0..15
}
inline void e2m1x16_to_f32(const uint8_t* p, float mul, float* out) {
  __m256 a, c;
  e2m1x16_to_ps(p, mul, a, c);
  _mm256_storeu_ps(out, a);
  _mm256_storeu_ps(out + 8, c);
}

inline void bf16x8_to_f32(const uint16_t* s, float* out) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  _mm256_storeu_ps(out, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
}

inline float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

// Software prefetch of the next 4-row tile while the current one is being multiplied, a few cache
// lines per loop iteration (speed: a decode step streams many small matrices; the hardware
// prefetchers lose several of the 4 interleaved row streams at every tile and matrix start, which
// left the cold kernels at half their in-cache rate). Prefetches never fault. The lines go to L2
// (T1), not L1: into L1 they evicted the activations and their per-scale copies, which every row tile
// reads again (figures: docs/benchmarks.md section 5, TilePrefetch).
struct TilePrefetch {
  const char* p;
  const char* end;
  TilePrefetch(const void* next, size_t bytes) : p(static_cast<const char*>(next)), end(p + bytes) {}
  inline void lines(int n) {
    for (int i = 0; i < n && p < end; ++i, p += 64) _mm_prefetch(p, _MM_HINT_T1);
  }
};
inline void prefetch_range(const void* q, size_t bytes) {
  const char* c = static_cast<const char*>(q);
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}

// 32 E4M3 codes -> FP16 bit patterns (value / 256) in two vectors: elements [0,8)|[16,24) and
// [8,16)|[24,32). The byte lands in the high half of a 16-bit lane (unpack with zero), an
// arithmetic shift by one moves exponent and mantissa into the FP16 fields, and the mask clears the
// copied sign bit: three operations per 16 codes instead of six (speed).
inline void e4m3x32_to_h(const uint8_t* q, __m256i& h_a, __m256i& h_b) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i z = _mm256_setzero_si256(), m = _mm256_set1_epi16(int16_t(0xbf80));
  h_a = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, b), 1), m);
  h_b = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, b), 1), m);
}

// The byte shuffles of the placed E2M1 decode (dot_rows4_nvfp4 here, NVFP4 cache rows in
// attention_rows_avx2.h): `table` maps a code to twice its value as a signed byte (in both 128-bit lanes);
// top0 / top1 move elements 0..7 (lane 0 takes 0..3, lane 1 4..7) / 8..15 of a 16-element block of
// such bytes into the top byte of each 32-bit lane, where they read as the integer times 2^24.
struct E2m1Placing {
  static constexpr char z = char(0x80);  // a zero byte
  const __m256i table = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,  //
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m256i top0 = _mm256_setr_epi8(z, z, z, 0, z, z, z, 1, z, z, z, 2, z, z, z, 3,  //
                                        z, z, z, 4, z, z, z, 5, z, z, z, 6, z, z, z, 7);
  const __m256i top1 = _mm256_setr_epi8(z, z, z, 8, z, z, z, 9, z, z, z, 10, z, z, z, 11,  //
                                        z, z, z, 12, z, z, z, 13, z, z, z, 14, z, z, z, 15);
};

}  // namespace
}  // namespace m3::cpu
