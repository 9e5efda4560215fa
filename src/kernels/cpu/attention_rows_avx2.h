// The index scan and block attention over FP8 / NVFP4 cache rows decoded in registers (Fp8Rows,
// Nvfp4Rows, QuantBlock), avx2 and avx512 builds.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>
#include <immintrin.h>

#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/element_tables.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/simd_avx2.h"

#if !defined(M3_KERNELS_AVX2)
#error "attention_rows_avx2.h needs the M3_KERNELS_AVX2 compiler flags (see CMakeLists.txt)"
#endif

namespace m3::cpu {
namespace {

// The index scan over quantised cache rows read in place (`serve --attention-config
// '{"indexer_kv_dtype": "fp8" | "nvfp4"}'`, the recipe's setting): each 8-element slice of a key is
// decoded in registers right before its FMAs (speed: decoding whole blocks to fp32 scratch first and
// reading them back cost more than the bytes it saved). The decoded values are those of decode_kv_rows (exact), and every
// (head, key) dot product keeps the order of dot4_tile, so the results equal max_dots over the rows
// decode_kv_rows writes, bit for bit. Row layouts: kv_format.h (scale 1).
// ld16: elements d..d+15 of a row divided by kUnit. The kernels move the factor onto q and p, where
// multiplying by a power of two is exact: fma(256 q, k / 256, a) rounds exactly like fma(q, k, a)
// (speed: two multiplies fewer per 16 FP8 elements; exact while |q| < 2^120, far beyond any query).
// row_bytes: one row's size.
struct Fp8Rows {
  static constexpr float kUnit = 256.0f;
  static int row_bytes(int D) { return D; }
  // 16 E4M3 codes: sign-extended, shifted into the FP16 fields (value / 256), widened.
  inline void ld16(const uint8_t* row, int d, int /*D*/, __m256& a, __m256& b) const {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d)));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(int16_t(0xbf80)));
    a = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    b = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  }
};
// E4M3 block scale by code, times 2^-25: half the scale (the E2M1 codes below are twice their
// values) and 2^-24 (they are read as integers times 2^24). Exact: the smallest nonzero scale, 2^-9,
// becomes 2^-34.
struct E4m3Placed {
  float v[256];
  E4m3Placed() {
    for (int c = 0; c < 256; ++c) v[c] = m3::element_tables().e4m3[size_t(c)] * 0x1p-25f;
  }
};
struct Nvfp4Rows {
  static constexpr float kUnit = 1.0f;
  static int row_bytes(int D) { return D / 2 + D / 16; }
  const float* stab = placed_scales();
  static const float* placed_scales() {
    static const E4m3Placed t;
    return t.v;
  }
  // One 16-element block, the values of decode_kv_rows: the 8 code bytes in both 128-bit lanes, the
  // E2M1 codes as small integers (twice the value), one byte shuffle per 8 elements into the top byte
  // of each 32-bit lane (the integer times 2^24, converted exactly), times the placed scale: t * s / 2
  // rounded once, as decode_kv_rows' t * (s / 2) (speed: two vector operations and a scalar multiply
  // fewer per 16 elements than widening with vpmovsxbd).
  inline void ld16(const uint8_t* row, int d, int D, __m256& a, __m256& b) const {
    const E2m1Placing c;
    int64_t bytes;
    std::memcpy(&bytes, row + d / 2, 8);
    const __m256i by = _mm256_set1_epi64x(bytes), m = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(by, m), hi = _mm256_and_si256(_mm256_srli_epi16(by, 4), m);
    const __m256i v = _mm256_shuffle_epi8(c.table, _mm256_unpacklo_epi8(lo, hi));  // elements 0..15, both lanes
    const __m256 s = _mm256_set1_ps(stab[row[D / 2 + d / 16]]);
    a = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(v, c.top0)), s);
    b = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(v, c.top1)), s);
  }
};

// q_h * Rows::kUnit for H heads, in a per-thread copy (qs becomes D); q itself when kUnit is 1.
template <class Rows>
inline const float* unit_q(const float* q, int64_t& qs, int H, int D) {
  if (Rows::kUnit == 1.0f) return q;
  thread_local std::vector<float> buf;  // grown only
  if (buf.size() < size_t(H) * size_t(D)) buf.resize(size_t(H) * size_t(D));
  const __m256 u = _mm256_set1_ps(Rows::kUnit);
  for (int h = 0; h < H; ++h)
    for (int d = 0; d < D; d += 8)
      _mm256_storeu_ps(buf.data() + h * D + d, _mm256_mul_ps(_mm256_loadu_ps(q + h * qs + d), u));
  qs = D;
  return buf.data();
}

// dot4_tile's sums (same order per (key, head)) for NK keys, 16 elements per step.
template <int NK, class Rows>
inline void dot4_tile_rows(const Rows& rows, const float* q, int64_t qs, const uint8_t* k, int64_t kb, int D,
                           __m128* out) {
  __m256 acc[NK][4];
  for (int j = 0; j < NK; ++j)
    for (int h = 0; h < 4; ++h) acc[j][h] = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 16) {
    __m256 ka[NK], kb2[NK];
    for (int j = 0; j < NK; ++j) rows.ld16(k + j * kb, d, D, ka[j], kb2[j]);
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      const __m256 q0 = _mm256_loadu_ps(q + h * qs + d), q1 = _mm256_loadu_ps(q + h * qs + d + 8);
      for (int j = 0; j < NK; ++j) {
        acc[j][h] = _mm256_fmadd_ps(q0, ka[j], acc[j][h]);
        acc[j][h] = _mm256_fmadd_ps(q1, kb2[j], acc[j][h]);
      }
    }
  }
  for (int j = 0; j < NK; ++j) out[j] = reduce4_heads(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
}

template <class Rows>
inline void max_dots4_rows(const float* q, int64_t qs, const uint8_t* k, int64_t kb, int64_t n, int D, float* m) {
  const Rows rows;
  __m128 mx = _mm_loadu_ps(m), r[2];
  constexpr int64_t kAhead = 16;  // keys prefetched ahead
  auto prefetch = [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t o = 0; o < kb; o += 64) __builtin_prefetch(k + j * kb + o, 0, 3);
  };
  prefetch(0, std::min<int64_t>(n, kAhead));
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {
    prefetch(std::min(n, j + kAhead), std::min(n, j + kAhead + 2));
    dot4_tile_rows<2>(rows, q, qs, k + j * kb, kb, D, r);
    mx = _mm_max_ps(mx, _mm_max_ps(r[0], r[1]));
  }
  for (; j < n; ++j) {
    dot4_tile_rows<1>(rows, q, qs, k + j * kb, kb, D, r);
    mx = _mm_max_ps(mx, r[0]);
  }
  _mm_storeu_ps(m, mx);
}

// pv_heads over quantised rows, slices of 16 (one decoded block; 8 accumulators for 4 heads). Each
// (h, d) sums its keys in the same order as pv_heads, so the results equal pv_heads' over the
// decoded rows (P holds p * kUnit and the rows value / kUnit: the same products).
template <int HB, class Rows>
inline void pv_rows(const Rows& rows, const float* P, int64_t ldp, const uint8_t* V, int64_t vb, int64_t n, int D,
                    const float* r, float* acc, LinePrefetch& next) {
  rescale_heads<HB>(r, acc, D);
  for (int d = 0; d < D; d += 16) {
    __m256 a0[HB], a1[HB];
    for (int h = 0; h < HB; ++h) {
      a0[h] = _mm256_loadu_ps(acc + h * D + d);
      a1[h] = _mm256_loadu_ps(acc + h * D + d + 8);
    }
    for (int64_t j = 0; j < n; ++j) {
      next.step();
      __m256 v0, v1;
      rows.ld16(V + j * vb, d, D, v0, v1);
#pragma GCC unroll 4
      for (int h = 0; h < HB; ++h) {
        const __m256 p = _mm256_broadcast_ss(P + h * ldp + j);
        a0[h] = _mm256_fmadd_ps(p, v0, a0[h]);
        a1[h] = _mm256_fmadd_ps(p, v1, a1[h]);
      }
    }
    for (int h = 0; h < HB; ++h) {
      _mm256_storeu_ps(acc + h * D + d, a0[h]);
      _mm256_storeu_ps(acc + h * D + d + 8, a1[h]);
    }
  }
  next.finish();
}

// attn_block_src's view of quantised K / V rows read in place (FP8 or NVFP4 cache lanes, scale 1):
// 4-head groups (H % 4 == 0) and D % 16 == 0 only; the rows are decoded in registers, the way the
// index scan reads its keys (speed: decoding each block to fp32 scratch first and reading it back
// made an FP8 / NVFP4 cache slower than BF16 at 16K context despite half the bytes).
template <class Rows>
struct QuantBlock {
  const uint8_t *K, *V;
  int64_t kb, vb;
  Rows rows;
  static constexpr float kUnit = Rows::kUnit;
  void scores(const float* qh, int64_t qs, int /*hb == 4*/, int64_t j0, int64_t nk, int D, float* t, bool pf_v) const {
    const int rb = Rows::row_bytes(D);
    __m128 r[2];
    int64_t jj = 0;
    for (; jj + 2 <= nk; jj += 2) {
      if (pf_v) prefetch_rows(V, vb, j0 + jj, j0 + jj + 2, rb);  // rows of rb bytes
      dot4_tile_rows<2>(rows, qh, qs, K + (j0 + jj) * kb, kb, D, r);
      _mm_storeu_ps(t + jj * 4, r[0]);
      _mm_storeu_ps(t + jj * 4 + 4, r[1]);
    }
    for (; jj < nk; ++jj) {
      if (pf_v) prefetch_rows(V, vb, j0 + jj, j0 + jj + 1, rb);
      dot4_tile_rows<1>(rows, qh, qs, K + (j0 + jj) * kb, kb, D, r);
      _mm_storeu_ps(t + jj * 4, r[0]);
    }
  }
  template <int HB>
  void pv(const float* P, int64_t ldp, int64_t n, int D, const float* r, float* acc, LinePrefetch& next) const {
    pv_rows<HB>(rows, P, ldp, V, vb, n, D, r, acc, next);
  }
};

}  // namespace
}  // namespace m3::cpu
