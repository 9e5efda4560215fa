// The 512-bit forms of the index scan and block attention over NVFP4 cache rows read in place (the
// recipe's `--kv-cache-dtype nvfp4` and `indexer_kv_dtype: nvfp4`) and over FP8 rows (Fp8Rows512: the
// AVX2 form's FP16 widening, 16 elements per vector), in the avx512 build only
// (attention_avx512.cpp), after the AVX2 forms (Nvfp4Rows, Fp8Rows, dot4_tile_rows, pv_rows), whose bits they
// keep (engine_kv_dtype_test: equal to the kernels over the rows decode_kv_rows writes, every ISA):
//  - decode: one 16-element block's 8 code bytes in every 64-bit lane; one multi-shift byte select
//    (AVX512-VBMI) moves code e into the low bits of the 32-bit lanes that take it, and one permute
//    reads those lanes from a 16-entry table of the block's products t * s (the AVX2 kernel's
//    multiply, done once per table entry: same bits);
//  - scores (dot4_tile_rows512): two heads per vector as dot4_tile512 (each (key, head) keeps its
//    8-lane accumulator fed in element order), elements d..d+7 and d+8..d+15 of a block each in both
//    halves;
//  - P·V (pv_rows512): 16 dimensions per vector, each (head, dimension) summing its keys in order.
// Speed: the AVX2 forms decode with five byte shuffles, two conversions and two multiplies per 16
// elements; here two or three permutes and no multiply (figures: docs/benchmarks.md section 5).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <immintrin.h>

#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/attention_rows_avx2.h"
#include "kernels/cpu/isa_level.h"

#if !defined(M3_KERNELS_AVX512)
#error "attention_rows_avx512.h needs the M3_KERNELS_AVX512 compiler flags (see CMakeLists.txt)"
#endif

namespace m3::cpu {
namespace {

// kv_nvfp4_products()[16 c + e]: E2M1 code e (twice its value, times 2^24) times Nvfp4Rows' placed
// scale of E4M3 code c, the product Nvfp4Rows::ld16 forms for that element.
struct Nvfp4KvProducts {
  alignas(64) float v[256 * 16];
  Nvfp4KvProducts() {
    static constexpr int kTwice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const float* s = Nvfp4Rows::placed_scales();
    for (int c = 0; c < 256; ++c)
      for (int e = 0; e < 16; ++e) v[16 * c + e] = float(kTwice[e] * (1 << 24)) * s[c];
  }
};
inline const float* kv_nvfp4_products() {
  static const Nvfp4KvProducts t;
  return t.v;
}

struct Nvfp4Rows512 {
  static constexpr float kUnit = Nvfp4Rows::kUnit;
  static int row_bytes(int D) { return Nvfp4Rows::row_bytes(D); }
  const float* tab = kv_nvfp4_products();
  // Multi-shift controls (bit offsets of the codes in the block's 64 bits): pair form, lane i takes
  // code i % 8 in its low byte and code 8 + i % 8 in the next; natural form, lane i takes code i.
  const __m512i pair = _mm512_setr_epi32(0x2000, 0x2404, 0x2808, 0x2c0c, 0x3010, 0x3414, 0x3818, 0x3c1c, 0x2000, 0x2404,
                                         0x2808, 0x2c0c, 0x3010, 0x3414, 0x3818, 0x3c1c);
  const __m512i natural = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60);
  static __m512i codes(const uint8_t* row, int d) {
    int64_t bytes;
    std::memcpy(&bytes, row + d / 2, 8);
    return _mm512_set1_epi64(bytes);
  }
  const float* products(const uint8_t* row, int d, int D) const { return tab + 16 * row[D / 2 + d / 16]; }
  // Elements d..d+7 in both halves (a) and d+8..d+15 in both halves (b).
  inline void ld8x2_pair(const uint8_t* row, int d, int D, __m512& a, __m512& b) const {
    const __m512i ix = _mm512_multishift_epi64_epi8(pair, codes(row, d));
    const __m512 t = _mm512_load_ps(products(row, d, D));
    a = _mm512_permutexvar_ps(ix, t);  // the permute reads bits 3..0 of each lane
    b = _mm512_permutexvar_ps(_mm512_srli_epi32(ix, 8), t);
  }
  // Elements d..d+15.
  inline __m512 ld16(const uint8_t* row, int d, int D) const {
    return _mm512_permutexvar_ps(_mm512_multishift_epi64_epi8(natural, codes(row, d)),
                                 _mm512_load_ps(products(row, d, D)));
  }
};

// FP8 (E4M3) rows: Fp8Rows::ld16's values (value / 256 through FP16, the queries carrying the 256,
// the probabilities too in block attention), elements d..d+15 in order (ld16), or d..d+7 and d+8..d+15
// each in both halves (ld8x2_pair).
struct Fp8Rows512 {
  static constexpr float kUnit = Fp8Rows::kUnit;
  static int row_bytes(int D) { return Fp8Rows::row_bytes(D); }
  inline __m512 ld16(const uint8_t* row, int d, int /*D*/) const {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d)));
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(int16_t(0xbf80))));
  }
  inline void ld8x2_pair(const uint8_t* row, int d, int D, __m512& a, __m512& b) const {
    const __m512 z = ld16(row, d, D);
    a = _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(1, 0, 1, 0));
    b = _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(3, 2, 3, 2));
  }
};

// dot4_tile_rows' FMAs for NK keys against 4 heads packed by pack_q4: acc[j][0] holds heads 0 | 1 of
// key j, acc[j][1] heads 2 | 3, each (key, head) in its 8-lane accumulator fed in element order.
template <int NK, class Rows>
inline void dot4_acc_rows512(const Rows& rows, const float* qp, const uint8_t* k, int64_t kb, int D,
                             __m512 (*acc)[2]) {
  for (int j = 0; j < NK; ++j) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 16) {
    const __m512 q01a = _mm512_load_ps(qp + 4 * d), q23a = _mm512_load_ps(qp + 4 * d + 16);
    const __m512 q01b = _mm512_load_ps(qp + 4 * d + 32), q23b = _mm512_load_ps(qp + 4 * d + 48);
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j) {
      __m512 a, b;
      rows.ld8x2_pair(k + j * kb, d, D, a, b);
      acc[j][0] = _mm512_fmadd_ps(q01a, a, acc[j][0]);
      acc[j][1] = _mm512_fmadd_ps(q23a, a, acc[j][1]);
      acc[j][0] = _mm512_fmadd_ps(q01b, b, acc[j][0]);
      acc[j][1] = _mm512_fmadd_ps(q23b, b, acc[j][1]);
    }
  }
}

// dot4_tile_rows' sums for NK keys against 4 packed heads, one xmm per key.
template <int NK, class Rows>
inline void dot4_tile_rows512(const Rows& rows, const float* qp, const uint8_t* k, int64_t kb, int D,
                              __m128* out) {
  __m512 acc[NK][2];
  dot4_acc_rows512<NK>(rows, qp, k, kb, D, acc);
  for (int j = 0; j < NK; ++j)
    out[j] = reduce4_heads(_mm512_castps512_ps256(acc[j][0]), _mm512_extractf32x8_ps(acc[j][0], 1),
                           _mm512_castps512_ps256(acc[j][1]), _mm512_extractf32x8_ps(acc[j][1], 1));
}

// The same sums four keys per vector (dot4_tile512_r's R order): out[t] holds keys 4t..4t+3. Speed:
// sixteen accumulator chains in flight and one reduction per four keys (reduce4_heads_x4) instead of
// eight chains and one reduction per key. It pays in cache; from a cold cache the scan waits on memory
// (docs/benchmarks.md section 5).
template <int NK, class Rows>
inline void dot4_tile_rows512_r(const Rows& rows, const float* qp, const uint8_t* k, int64_t kb, int D,
                                __m512* out) {
  static_assert(NK % 4 == 0, "whole groups of four keys");
  __m512 acc[NK][2];
  dot4_acc_rows512<NK>(rows, qp, k, kb, D, acc);
  for (int t = 0; t < NK / 4; ++t) {
    const __m512 x[4] = {acc[4 * t][0], acc[4 * t + 1][0], acc[4 * t + 2][0], acc[4 * t + 3][0]};
    const __m512 y[4] = {acc[4 * t][1], acc[4 * t + 1][1], acc[4 * t + 2][1], acc[4 * t + 3][1]};
    out[t] = reduce4_heads_x4(x, y);
  }
}

// Keys [0, n) against 4 packed heads, eight keys per tile, then four, then one: f(j, scores of key j)
// in key order.
template <class Rows, class F>
inline void dot4_rows512(const float* qp, const uint8_t* k, int64_t kb, int64_t n, int D, F&& f) {
  const Rows rows;
  const __m512i items = items_from_r_order();
  auto emit = [&](int64_t j0, __m512 r) {
    const __m512 v = _mm512_permutexvar_ps(items, r);
    f(j0, _mm512_castps512_ps128(v));
    f(j0 + 1, _mm512_extractf32x4_ps(v, 1));
    f(j0 + 2, _mm512_extractf32x4_ps(v, 2));
    f(j0 + 3, _mm512_extractf32x4_ps(v, 3));
  };
  __m512 r4[2];
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    dot4_tile_rows512_r<8>(rows, qp, k + j * kb, kb, D, r4);
    emit(j, r4[0]);
    emit(j + 4, r4[1]);
  }
  for (; j + 4 <= n; j += 4) {
    dot4_tile_rows512_r<4>(rows, qp, k + j * kb, kb, D, r4);
    emit(j, r4[0]);
  }
  __m128 r;
  for (; j < n; ++j) {
    dot4_tile_rows512<1>(rows, qp, k + j * kb, kb, D, &r);
    f(j, r);
  }
}

// The index scan over NVFP4 or FP8 rows for 4 heads (max_dots4_rows' results; FP8: q carries kUnit):
// eight keys per tile in R order, the maxima taken per lane and over the four keys of a lane group at
// the end (as max_dots4).
template <class Rows>
inline void max_dots4_rows512(const float* q, int64_t qs, const uint8_t* k, int64_t kb, int64_t n, int D, float* m) {
  alignas(64) float qp[4 * 256];
  pack_q4(q, qs, D, qp);
  const Rows rows;
  constexpr int64_t kAhead = 16;  // keys prefetched ahead (32 or 64: no change, kernels_bench cold)
  auto prefetch = [&](int64_t j0, int64_t j1) {
    for (int64_t j = std::min(n, j0); j < std::min(n, j1); ++j)
      for (int64_t o = 0; o < kb; o += 64) __builtin_prefetch(k + j * kb + o, 0, 3);
  };
  prefetch(0, kAhead);
  __m512 mxr = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), r8[2];
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    prefetch(j + kAhead, j + 8 + kAhead);
    dot4_tile_rows512_r<8>(rows, qp, k + j * kb, kb, D, r8);
    mxr = _mm512_max_ps(mxr, _mm512_max_ps(r8[0], r8[1]));
  }
  const __m512 mi = _mm512_permutexvar_ps(items_from_r_order(), mxr);
  __m128 mx = _mm_max_ps(_mm_loadu_ps(m), _mm_max_ps(_mm_max_ps(_mm512_castps512_ps128(mi), _mm512_extractf32x4_ps(mi, 1)),
                                                     _mm_max_ps(_mm512_extractf32x4_ps(mi, 2), _mm512_extractf32x4_ps(mi, 3))));
  __m128 r1;
  for (; j < n; ++j) {
    dot4_tile_rows512<1>(rows, qp, k + j * kb, kb, D, &r1);
    mx = _mm_max_ps(mx, r1);
  }
  _mm_storeu_ps(m, mx);
}

// The index scan of NQ tokens at once over NVFP4 or FP8 rows (prefill tiles, as max_dots4_multi512):
// each key's 16-element blocks are decoded once for all NQ tokens (speed: the decode is this scan's
// cost). Every (token, head, key) score has the sums and reduction of the single-token scan over the
// same rows (dot4_tile_rows512 / dot4_tile_rows): each token's bits.
template <int NQ, int NK, class Rows>
inline void dot4q_rows512(const Rows& rows, const float* const* qp, const uint8_t* k, int64_t kb, int D,
                          __m512* out) {
  __m512 acc[NK][2][4];  // [key][heads 0|1, 2|3][token]; tokens NQ..3 stay zero
  for (int j = 0; j < NK; ++j)
    for (int i = 0; i < 4; ++i) acc[j][0][i] = acc[j][1][i] = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 16) {
    __m512 a[NK], b[NK];
    for (int j = 0; j < NK; ++j) rows.ld8x2_pair(k + j * kb, d, D, a[j], b[j]);
#pragma GCC unroll 4
    for (int i = 0; i < NQ; ++i) {
      const float* q = qp[i] + 4 * d;
      const __m512 q01a = _mm512_load_ps(q), q23a = _mm512_load_ps(q + 16);
      const __m512 q01b = _mm512_load_ps(q + 32), q23b = _mm512_load_ps(q + 48);
      for (int j = 0; j < NK; ++j) {
        acc[j][0][i] = _mm512_fmadd_ps(q01a, a[j], acc[j][0][i]);
        acc[j][1][i] = _mm512_fmadd_ps(q23a, a[j], acc[j][1][i]);
        acc[j][0][i] = _mm512_fmadd_ps(q01b, b[j], acc[j][0][i]);
        acc[j][1][i] = _mm512_fmadd_ps(q23b, b[j], acc[j][1][i]);
      }
    }
  }
  for (int j = 0; j < NK; ++j) out[j] = reduce4_heads_x4(acc[j][0], acc[j][1]);
}

template <int NQ, class Rows>
inline void max_dots4_rows_multi512(const float* const* qp, const uint8_t* k, int64_t kb, int64_t n, int D,
                                    float* const* m) {
  const Rows rows;
  __m512 mx = maxima_in_r_order<NQ>(m), r[2];
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {
    for (int64_t o = 0; o < 2 * kb; o += 64) __builtin_prefetch(k + (j + 16) * kb + o, 0, 3);
    dot4q_rows512<NQ, 2>(rows, qp, k + j * kb, kb, D, r);
    mx = _mm512_max_ps(mx, _mm512_max_ps(r[0], r[1]));
  }
  for (; j < n; ++j) {
    dot4q_rows512<NQ, 1>(rows, qp, k + j * kb, kb, D, r);
    mx = _mm512_max_ps(mx, r[0]);
  }
  store_maxima_from_r_order<NQ>(mx, m);
}

// pv_rows over NVFP4 or FP8 rows with 16 dimensions per vector: slices of 48 (12 accumulators for 4
// heads), then 32 and 16 (D % 16 == 0).
template <int HB, class Rows>
inline void pv_rows512(const float* P, int64_t ldp, const uint8_t* V, int64_t vb, int64_t n, int D, const float* r,
                       float* acc, LinePrefetch& next) {
  const Rows rows;
  rescale_heads<HB>(r, acc, D);
  int d = 0;
  auto slices = [&](auto w) {
    constexpr int S = decltype(w)::value;  // vectors per slice
    for (; d + 16 * S <= D; d += 16 * S) {
      __m512 a[S][HB];
      for (int s = 0; s < S; ++s)
        for (int h = 0; h < HB; ++h) a[s][h] = _mm512_loadu_ps(acc + h * D + d + 16 * s);
      for (int64_t j = 0; j < n; ++j) {
        next.step();
        __m512 v[S];
        for (int s = 0; s < S; ++s) v[s] = rows.ld16(V + j * vb, d + 16 * s, D);
#pragma GCC unroll 4
        for (int h = 0; h < HB; ++h) {
          const __m512 p = _mm512_set1_ps(P[h * ldp + j]);
          for (int s = 0; s < S; ++s) a[s][h] = _mm512_fmadd_ps(p, v[s], a[s][h]);
        }
      }
      for (int s = 0; s < S; ++s)
        for (int h = 0; h < HB; ++h) _mm512_storeu_ps(acc + h * D + d + 16 * s, a[s][h]);
    }
  };
  slices(std::integral_constant<int, 3>());
  slices(std::integral_constant<int, 2>());
  slices(std::integral_constant<int, 1>());
  next.finish();
}

// QuantBlock's view of NVFP4 or FP8 K / V rows for attn_block_src, through the forms above (4-head
// groups, D % 16 == 0, D <= 256). The block's V rows (n of them) are all prefetched when its scores
// begin, instead of a tile's rows as the tile is scored (the BF16 form's way). Speed: an FP8 page's
// V rows are 16 KB (NVFP4 9 KB), and asked for all at once they arrive while the keys are scored. Not
// for BF16 rows (32 KB per page) nor in the AVX2 form, where the same burst was slower
// (docs/benchmarks.md section 5).
template <class Rows>
struct Block512 {
  const uint8_t *K, *V;
  int64_t kb, vb, n;
  static constexpr float kUnit = Rows::kUnit;
  void scores(const float* qh, int64_t qs, int /*hb == 4*/, int64_t j0, int64_t nk, int D, float* t, bool pf_v) const {
    alignas(64) float qp[4 * 256];
    pack_q4(qh, qs, D, qp);
    if (pf_v && j0 == 0) prefetch_rows(V, vb, 0, n, Rows::row_bytes(D));  // rows of row_bytes bytes
    dot4_rows512<Rows>(qp, K + j0 * kb, kb, nk, D, [&](int64_t jj, __m128 r) { _mm_storeu_ps(t + jj * 4, r); });
  }
  template <int HB>
  void pv(const float* P, int64_t ldp, int64_t n, int D, const float* r, float* acc, LinePrefetch& next) const {
    pv_rows512<HB, Rows>(P, ldp, V, vb, n, D, r, acc, next);
  }
};

}  // namespace
}  // namespace m3::cpu
