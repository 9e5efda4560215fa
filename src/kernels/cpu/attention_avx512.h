// The 512-bit forms of the attention kernels over fp32 / BF16 rows (attention_avx512.cpp only)
//, bit-identical to the AVX2 forms (kernels_isa_test):
//  - scores (dot4_tile): two heads per vector, each in 8 lanes, against the key's 8 elements
//    broadcast to both halves; each (key, head) keeps its 8-lane accumulator and the same reduction;
//  - P·V (pv_heads): 16 output dimensions per vector; each (head, dimension) sums its keys in order.
// Speed: half the FMA and load instructions (AVX-512 cores run two 512-bit FMAs per cycle).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <immintrin.h>

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/isa_level.h"

#if !defined(M3_KERNELS_AVX512)
#error "attention_avx512.h needs the M3_KERNELS_AVX512 compiler flags (see CMakeLists.txt)"
#endif

namespace m3::cpu {
namespace {

// The 8 elements at p in both halves.
inline __m512 ld8x2(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }
inline __m512 ld8x2(const uint16_t* p) {
  // The 16 bytes in every 128-bit lane; each value's two bytes into the top half of its 32-bit lane by
  // word unpacks with zero: elements 0..3 (unpacklo) in lanes 0 and 2, 4..7 (unpackhi, merged under a
  // mask) in lanes 1 and 3. Speed: a byte shuffle did this on the two pipes the FMAs use, the unpacks
  // issue beside them.
  const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i z = _mm512_setzero_si512();
  return _mm512_castsi512_ps(_mm512_mask_unpackhi_epi16(_mm512_unpacklo_epi16(z, b), 0xff00ff00u, z, b));
}
// 16 consecutive elements.
inline __m512 ld16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 ld16(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// Four query heads packed for dot4_tile512: qp[(2 * (d / 8) + pair) * 16 + 8 * half + e] =
// q_(2 pair + half)[d + e] (D % 8 == 0).
inline void pack_q4(const float* q, int64_t qs, int D, float* qp) {
  for (int d = 0; d < D; d += 8)
    for (int h = 0; h < 4; ++h) std::memcpy(qp + (2 * (d / 8) + h / 2) * 16 + 8 * (h % 2), q + h * qs + d, 32);
}

// vhaddps' sums on each 128-bit lane of two 512-bit vectors: [v0+v1, v2+v3, w0+w1, w2+w3].
inline __m512 hadd512(__m512 v, __m512 w) {
  return _mm512_add_ps(_mm512_shuffle_ps(v, w, 0x88), _mm512_shuffle_ps(v, w, 0xdd));
}
// reduce4_heads of four items at once (x[i]: item i's heads 0 | 1, y[i]: heads 2 | 3, as dot4_tile512's
// accumulators): the same additions in the same tree, 21 instructions for the four instead of about
// 14 each (speed: the per-item reduction's shuffles competed with the FMAs for the shuffle port).
// Result lanes ("R order"): 4 * (2 * (i / 2) + h % 2) + 2 * (i % 2) + h / 2 holds item i, head h.
inline __m512 reduce4_heads_x4(const __m512* x, const __m512* y) {
  const __m512 a0 = hadd512(x[0], y[0]), a1 = hadd512(x[1], y[1]), a2 = hadd512(x[2], y[2]), a3 = hadd512(x[3], y[3]);
  const __m512 b01 = hadd512(a0, a1), b23 = hadd512(a2, a3);
  return _mm512_add_ps(_mm512_shuffle_f32x4(b01, b23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(b01, b23, _MM_SHUFFLE(3, 1, 3, 1)));
}
// Permutes between item-major order (lane 4 i + h) and R order.
inline __m512i r_order_from_items() {
  return _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
}
inline __m512i items_from_r_order() {
  return _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
}
// The running maxima m[i][0..3] of NQ <= 4 tokens in R order (tokens as items), and back.
template <int NQ>
inline __m512 maxima_in_r_order(float* const* m) {
  alignas(64) float mv[16];
  for (int i = 0; i < 4; ++i)
    for (int h = 0; h < 4; ++h) mv[4 * i + h] = i < NQ ? m[i][h] : 0.0f;
  return _mm512_permutexvar_ps(r_order_from_items(), _mm512_load_ps(mv));
}
template <int NQ>
inline void store_maxima_from_r_order(__m512 mx, float* const* m) {
  alignas(64) float mv[16];
  _mm512_store_ps(mv, _mm512_permutexvar_ps(items_from_r_order(), mx));
  for (int i = 0; i < NQ; ++i)
    for (int h = 0; h < 4; ++h) m[i][h] = mv[4 * i + h];
}

// dot4_tile's FMAs with the packed heads for NK keys: acc[j][0] holds heads 0 | 1 of key j, acc[j][1]
// heads 2 | 3, each in its 8-lane accumulator.
template <int NK, class E>
inline void dot4_acc512(const float* qp, const E* k, int64_t ks, int D, __m512 (*acc)[2]) {
  for (int j = 0; j < NK; ++j) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    const __m512 q01 = _mm512_loadu_ps(qp + 4 * d), q23 = _mm512_loadu_ps(qp + 4 * d + 16);
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j) {
      const __m512 kv = ld8x2(k + j * ks + d);
      acc[j][0] = _mm512_fmadd_ps(q01, kv, acc[j][0]);
      acc[j][1] = _mm512_fmadd_ps(q23, kv, acc[j][1]);
    }
  }
}

// dot4_tile with the packed heads: out[j] = the 4 heads' scores of key j.
template <int NK, class E>
inline void dot4_tile512(const float* qp, const E* k, int64_t ks, int D, __m128* out) {
  __m512 acc[NK][2];
  dot4_acc512<NK>(qp, k, ks, D, acc);
  for (int j = 0; j < NK; ++j)
    out[j] = reduce4_heads(_mm512_castps512_ps256(acc[j][0]), _mm512_extractf32x8_ps(acc[j][0], 1),
                           _mm512_castps512_ps256(acc[j][1]), _mm512_extractf32x8_ps(acc[j][1], 1));
}

// The same scores four keys per vector: out[t] holds keys 4t..4t+3 (items) in R order.
template <int NK, class E>
inline void dot4_tile512_r(const float* qp, const E* k, int64_t ks, int D, __m512* out) {
  static_assert(NK % 4 == 0, "whole groups of four keys");
  __m512 acc[NK][2];
  dot4_acc512<NK>(qp, k, ks, D, acc);
  for (int t = 0; t < NK / 4; ++t) {
    const __m512 x[4] = {acc[4 * t][0], acc[4 * t + 1][0], acc[4 * t + 2][0], acc[4 * t + 3][0]};
    const __m512 y[4] = {acc[4 * t][1], acc[4 * t + 1][1], acc[4 * t + 2][1], acc[4 * t + 3][1]};
    out[t] = reduce4_heads_x4(x, y);
  }
}

// Keys [0, n) against 4 packed heads, eight keys per tile, then four, then one: f(j, scores of key j)
// in key order (the V rows prefetched meanwhile when v_pf).
template <class E, class F>
inline void dot4_keys512(const float* qp, const E* k, int64_t ks, int64_t n, int D, const E* v_pf, int64_t vs_pf,
                         F&& f) {
  const __m512i items = items_from_r_order();
  auto emit = [&](int64_t j0, __m512 r) {
    const __m512 v = _mm512_permutexvar_ps(items, r);
    f(j0, _mm512_castps512_ps128(v));
    f(j0 + 1, _mm512_extractf32x4_ps(v, 1));
    f(j0 + 2, _mm512_extractf32x4_ps(v, 2));
    f(j0 + 3, _mm512_extractf32x4_ps(v, 3));
  };
  __m512 r[2];
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    if (v_pf) prefetch_rows(v_pf, vs_pf, j, j + 8, D);
    dot4_tile512_r<8>(qp, k + j * ks, ks, D, r);
    emit(j, r[0]);
    emit(j + 4, r[1]);
  }
  for (; j + 4 <= n; j += 4) {
    if (v_pf) prefetch_rows(v_pf, vs_pf, j, j + 4, D);
    dot4_tile512_r<4>(qp, k + j * ks, ks, D, r);
    emit(j, r[0]);
  }
  __m128 r1;
  for (; j < n; ++j) {
    if (v_pf) prefetch_rows(v_pf, vs_pf, j, j + 1, D);
    dot4_tile512<1>(qp, k + j * ks, ks, D, &r1);
    f(j, r1);
  }
}

// pv_heads with 16 dimensions per vector: slices of 48 (12 accumulators for 4 heads), then 32 and 16;
// what is left (D % 16) through the AVX2 loops' 8-wide and scalar steps, which feed the same sums.
template <int HB, class E, class Prefetch>
inline int pv_heads512(const float* P, int64_t ldp, const E* V, int64_t vs, int64_t n, int D, float* acc,
                       Prefetch& next) {
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
        for (int s = 0; s < S; ++s) v[s] = ld16(V + j * vs + d + 16 * s);
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
  return d;
}

// The multi-token index scans' passes: for each group of 4 heads and each run of up to 4 of the Q
// tokens, the tokens' heads packed by pack_q4 (times `unit`, a power of two: exact) and their maxima,
// handed to scan(std::integral_constant<int, nq>, packed heads, maxima).
template <class Scan>
inline void multi_token_passes(int Q, const float* const* q, int64_t qs, int H, int D, float unit, float* const* m,
                               Scan&& scan) {
  alignas(64) float qp[4][4 * 256];
  const float* qpp[4] = {qp[0], qp[1], qp[2], qp[3]};
  float* mp[4];
  for (int h0 = 0; h0 < H; h0 += 4)
    for (int i0 = 0; i0 < Q; i0 += 4) {
      const int nq = std::min(4, Q - i0);
      for (int i = 0; i < nq; ++i) {
        pack_q4(q[i0 + i] + h0 * qs, qs, D, qp[i]);
        if (unit != 1.0f)
          for (int e = 0; e < 4 * D; e += 16)
            _mm512_store_ps(qp[i] + e, _mm512_mul_ps(_mm512_load_ps(qp[i] + e), _mm512_set1_ps(unit)));
        mp[i] = m[i0 + i] + h0;
      }
      switch (nq) {
        case 4: scan(std::integral_constant<int, 4>(), qpp, mp); break;
        case 3: scan(std::integral_constant<int, 3>(), qpp, mp); break;
        case 2: scan(std::integral_constant<int, 2>(), qpp, mp); break;
        default: scan(std::integral_constant<int, 1>(), qpp, mp); break;
      }
    }
}

// The index scan of NQ query tokens at once (prefill: consecutive tokens scan the same blocks), 4
// heads each, packed by pack_q4: each key's 8-element step is loaded and placed once for all NQ
// queries (speed: the single-query tile spends one byte shuffle per two FMAs on the key; here one per
// 2 NQ FMAs). Every (query, head, key) score has dot4_tile512's accumulator and reduction: the same
// bits as scanning each query alone.
template <int NQ, int NK, class E>
inline void dot4q_tile512(const float* const* qp, const E* k, int64_t ks, int D, __m512* out) {
  __m512 acc[NK][2][4];  // [key][heads 0|1, 2|3][token]; tokens NQ..3 stay zero
  for (int j = 0; j < NK; ++j)
    for (int i = 0; i < 4; ++i) acc[j][0][i] = acc[j][1][i] = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    __m512 kv[NK];
    for (int j = 0; j < NK; ++j) kv[j] = ld8x2(k + j * ks + d);
#pragma GCC unroll 4
    for (int i = 0; i < NQ; ++i) {
      const __m512 q01 = _mm512_load_ps(qp[i] + 4 * d), q23 = _mm512_load_ps(qp[i] + 4 * d + 16);
      for (int j = 0; j < NK; ++j) {
        acc[j][0][i] = _mm512_fmadd_ps(q01, kv[j], acc[j][0][i]);
        acc[j][1][i] = _mm512_fmadd_ps(q23, kv[j], acc[j][1][i]);
      }
    }
  }
  for (int j = 0; j < NK; ++j) out[j] = reduce4_heads_x4(acc[j][0], acc[j][1]);
}

// max_dots4 for NQ queries (their 4 heads packed in qp[i]; running maxima m[i][0..3]) over keys [0, n).
template <int NQ, class E>
inline void max_dots4_multi512(const float* const* qp, const E* k, int64_t ks, int64_t n, int D, float* const* m) {
  __m512 mx = maxima_in_r_order<NQ>(m), r[3];
  constexpr int64_t kAhead = 12;  // keys prefetched ahead, as max_dots4
  prefetch_rows(k, ks, 0, std::min<int64_t>(n, kAhead), D);
  int64_t j = 0;
  for (; j + 3 <= n; j += 3) {
    prefetch_rows(k, ks, std::min(n, j + kAhead), std::min(n, j + kAhead + 3), D);
    dot4q_tile512<NQ, 3>(qp, k + j * ks, ks, D, r);
    mx = _mm512_max_ps(mx, _mm512_max_ps(r[0], _mm512_max_ps(r[1], r[2])));
  }
  for (; j < n; ++j) {
    dot4q_tile512<NQ, 1>(qp, k + j * ks, ks, D, r);
    mx = _mm512_max_ps(mx, r[0]);
  }
  store_maxima_from_r_order<NQ>(mx, m);
}

}  // namespace
}  // namespace m3::cpu
