// Building blocks of the attention kernels: the exp of the softmax (attn_exp*), row prefetches, loads of
// fp32 / BF16 rows, and the AVX2 score tiles (dot_tile, dot4_tile) the block kernels and the 512-bit
// forms build on.
#pragma once
#include <cmath>
#include <cstdint>
#include <immintrin.h>

#include "formats/dtype.h"
#include "kernels/cpu/isa_level.h"
#ifdef M3_KERNELS_AVX2
#include "kernels/cpu/simd_avx2.h"
#endif

namespace m3::cpu {
namespace {

// exp(x) for x <= ~88, Cephes-style: 2^n * p(r), r = x - n ln2 (ln2 split in two), degree-6
// polynomial; about 1-2 ulp. Inputs below -88.37 (and -inf) give 0.
constexpr float kExpLo = -88.3762626647949f, kExpHi = 88.3762626647949f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500E-4f, kP1 = 1.3981999507E-3f, kP2 = 8.3334519073E-3f, kP3 = 4.1665795894E-2f,
                kP4 = 1.6666665459E-1f, kP5 = 5.0000001201E-1f;

// Prefetch rows [j0, j1) of a row set (D elements each, `stride` apart). Speed: the index scan
// streams every index key of the context, and without a software prefetch a few keys ahead it waits on
// memory at long context (docs/benchmarks.md section 5). Block attention prefetches one phase
// ahead instead (V while scoring K, the next block's K during P·V; see LinePrefetch).
template <class E>
inline void prefetch_rows(const E* base, int64_t stride, int64_t j0, int64_t j1, int D) {
  for (int64_t j = j0; j < j1; ++j) {
    const char* r = reinterpret_cast<const char*>(base + j * stride);
    for (int o = 0; o < D * int(sizeof(E)); o += 64) __builtin_prefetch(r + o, 0, 3);
  }
}

// K / V / index-key elements are fp32 or BF16 (read in place from a BF16 paged cache; widening
// is exact, so both give the same results).
inline float ld1(const float* p) { return *p; }
inline float ld1(const uint16_t* p) { return m3::bf16_to_float(*p); }

#ifdef M3_KERNELS_AVX2
inline __m256 ld8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 ld8(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

inline __m256 attn_exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Hi), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Lo), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(kP0);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kP1));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kP2));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kP3));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kP4));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kP5));
  y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  // 2^n; n = -127 gives a zero exponent field, i.e. 0 (only reached for results below 2^-126).
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
inline float attn_exp1(float x) { return _mm256_cvtss_f32(attn_exp8(_mm256_set1_ps(x))); }

inline float attn_hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

// out[j * HB + h] = q_h · k_j for NK keys x HB heads: NK * HB accumulators, NK + HB loads per 8-wide
// step (the scalar tail uses an explicit fma so every tile shape rounds it the same way).
template <int HB, int NK, class E>
inline void dot_tile(const float* q, int64_t qs, const E* k, int64_t ks, int D, float* out) {
  __m256 acc[NK][HB];
  for (int j = 0; j < NK; ++j)
    for (int h = 0; h < HB; ++h) acc[j][h] = _mm256_setzero_ps();
  int d = 0;
  for (; d + 8 <= D; d += 8) {
    __m256 kv[NK];
    for (int j = 0; j < NK; ++j) kv[j] = ld8(k + j * ks + d);
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) {
      const __m256 qv = _mm256_loadu_ps(q + h * qs + d);
      for (int j = 0; j < NK; ++j) acc[j][h] = _mm256_fmadd_ps(qv, kv[j], acc[j][h]);
    }
  }
  for (int j = 0; j < NK; ++j)
    for (int h = 0; h < HB; ++h) {
      float t = attn_hsum8(acc[j][h]);
      for (int dd = d; dd < D; ++dd) t = std::fma(q[h * qs + dd], ld1(k + j * ks + dd), t);
      out[j * HB + h] = t;
    }
}

// Four heads x NK keys (3 measured fastest: 12 accumulators), D a multiple of 8: the (key, head) sums come back as one xmm per key,
// heads 0..3, each reduced as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) by a hadd tree (speed: eight
// separate horizontal sums cost more than the 128 FMAs of the tile). A key's scores are the same
// whether it is computed alone or in a pair, so tiling never changes results.
inline __m128 reduce4_heads(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}
template <int NK, class E>
inline void dot4_tile(const float* q, int64_t qs, const E* k, int64_t ks, int D, __m128* out) {
  __m256 acc[NK][4];
  for (int j = 0; j < NK; ++j)
    for (int h = 0; h < 4; ++h) acc[j][h] = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    __m256 kv[NK];
    for (int j = 0; j < NK; ++j) kv[j] = ld8(k + j * ks + d);
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      const __m256 qv = _mm256_loadu_ps(q + h * qs + d);
      for (int j = 0; j < NK; ++j) acc[j][h] = _mm256_fmadd_ps(qv, kv[j], acc[j][h]);
    }
  }
  for (int j = 0; j < NK; ++j) out[j] = reduce4_heads(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
}
#endif

}  // namespace
}  // namespace m3::cpu
