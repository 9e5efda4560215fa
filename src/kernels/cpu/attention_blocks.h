// The index scan (max_dots_t) and one block of online-softmax attention (attn_block_t, attn_block_src)
// over fp32 / BF16 rows, every ISA: the AVX2 bodies (and, in the avx512 build, their 512-bit forms from
// attention_avx512.h), or the portable loops of the generic build.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <immintrin.h>

#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/vector_ops.h"
#ifdef M3_KERNELS_AVX512
#include "kernels/cpu/attention_avx512.h"
#endif

namespace m3::cpu {
namespace {

#ifdef M3_KERNELS_AVX2
// All n keys against heads [0, H) in tiles of up to 4 heads x 2 keys; out[j * H + h].
template <class E>
inline void dot_block(const float* q, int64_t qs, int H, const E* k, int64_t ks, int64_t n, int D, float* out,
                      const E* v_pf = nullptr, int64_t vs_pf = 0) {
  float t[8];
  for (int h0 = 0; h0 < H; h0 += 4) {
    const int hb = std::min(4, H - h0);
    const float* qh = q + h0 * qs;
#ifdef M3_KERNELS_AVX512
    if (hb == 4 && D % 8 == 0 && D <= 256) {
      alignas(64) float qp[4 * 256];
      pack_q4(qh, qs, D, qp);
      dot4_keys512(qp, k, ks, n, D, v_pf, vs_pf, [&](int64_t j, __m128 r) { _mm_storeu_ps(out + j * H + h0, r); });
      continue;
    }
#endif
    if (hb == 4 && D % 8 == 0) {
      __m128 r[3];
      int64_t j = 0;
      for (; j + 3 <= n; j += 3) {
        if (v_pf) prefetch_rows(v_pf, vs_pf, j, j + 3, D);
        dot4_tile<3>(qh, qs, k + j * ks, ks, D, r);
        _mm_storeu_ps(out + j * H + h0, r[0]);
        _mm_storeu_ps(out + (j + 1) * H + h0, r[1]);
        _mm_storeu_ps(out + (j + 2) * H + h0, r[2]);
      }
      for (; j < n; ++j) {
        if (v_pf) prefetch_rows(v_pf, vs_pf, j, j + 1, D);
        dot4_tile<1>(qh, qs, k + j * ks, ks, D, r);
        _mm_storeu_ps(out + j * H + h0, r[0]);
      }
      continue;
    }
    for (int64_t j = 0; j < n;) {
      const int nk = n - j >= 2 ? 2 : 1;
      const E* kj = k + j * ks;
      switch (hb * 2 + nk - 1) {
        case 2 * 1 + 0: dot_tile<1, 1>(qh, qs, kj, ks, D, t); break;
        case 2 * 1 + 1: dot_tile<1, 2>(qh, qs, kj, ks, D, t); break;
        case 2 * 2 + 0: dot_tile<2, 1>(qh, qs, kj, ks, D, t); break;
        case 2 * 2 + 1: dot_tile<2, 2>(qh, qs, kj, ks, D, t); break;
        case 2 * 3 + 0: dot_tile<3, 1>(qh, qs, kj, ks, D, t); break;
        case 2 * 3 + 1: dot_tile<3, 2>(qh, qs, kj, ks, D, t); break;
        case 2 * 4 + 0: dot_tile<4, 1>(qh, qs, kj, ks, D, t); break;
        default: dot_tile<4, 2>(qh, qs, kj, ks, D, t); break;
      }
      for (int jj = 0; jj < nk; ++jj)
        for (int h = 0; h < hb; ++h) out[(j + jj) * H + h0 + h] = t[jj * hb + h];
      j += nk;
    }
  }
}

// The index scan for groups of 4 heads: scores stay in registers, the running max is a vector op.
template <class E>
inline void max_dots4(const float* q, int64_t qs, const E* k, int64_t ks, int64_t n, int D, float* m) {
  __m128 mx = _mm_loadu_ps(m), r[3];
  constexpr int64_t kAhead = 12;  // keys prefetched ahead (6 KB of 128-dim rows)
  prefetch_rows(k, ks, 0, std::min<int64_t>(n, kAhead), D);
  int64_t j = 0;
#ifdef M3_KERNELS_AVX512
  if (D <= 256) {
    alignas(64) float qp[4 * 256];
    pack_q4(q, qs, D, qp);
    // Eight keys per tile, their scores reduced four keys per vector (R order), the maxima over keys
    // taken per lane and over the four keys of a lane group at the end.
    __m512 mxr = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), r8[2];
    for (; j + 8 <= n; j += 8) {
      prefetch_rows(k, ks, std::min(n, j + kAhead), std::min(n, j + kAhead + 8), D);
      dot4_tile512_r<8>(qp, k + j * ks, ks, D, r8);
      mxr = _mm512_max_ps(mxr, _mm512_max_ps(r8[0], r8[1]));
    }
    const __m512 mi = _mm512_permutexvar_ps(items_from_r_order(), mxr);
    mx = _mm_max_ps(mx, _mm_max_ps(_mm_max_ps(_mm512_castps512_ps128(mi), _mm512_extractf32x4_ps(mi, 1)),
                                   _mm_max_ps(_mm512_extractf32x4_ps(mi, 2), _mm512_extractf32x4_ps(mi, 3))));
    __m128 r1;
    for (; j < n; ++j) {
      dot4_tile512<1>(qp, k + j * ks, ks, D, &r1);
      mx = _mm_max_ps(mx, r1);
    }
    _mm_storeu_ps(m, mx);
    return;
  }
#endif
  for (; j + 3 <= n; j += 3) {
    prefetch_rows(k, ks, std::min(n, j + kAhead), std::min(n, j + kAhead + 3), D);
    dot4_tile<3>(q, qs, k + j * ks, ks, D, r);
    mx = _mm_max_ps(mx, _mm_max_ps(r[0], _mm_max_ps(r[1], r[2])));
  }
  for (; j < n; ++j) {
    dot4_tile<1>(q, qs, k + j * ks, ks, D, r);
    mx = _mm_max_ps(mx, r[0]);
  }
  _mm_storeu_ps(m, mx);
}
#define M3_HAVE_MAX_DOTS4 1

// Software prefetch of a key block's rows, one cache line per step(): attn_block fetches the next
// block's K rows this way during its P·V loop, and V rows while it scores K (speed: at long context
// these rows come from DRAM; without it a decode step's block attention waited on memory and then
// computed). Into L2 (prefetcht1): the lines are used within a phase, and an L1 prefetch holds one of
// the few L1 miss buffers for the whole DRAM round trip (figures: docs/benchmarks.md section 5).
struct LinePrefetch {
  const char* row = nullptr;
  int64_t stride = 0, rows_left = 0;
  int row_bytes = 0, off = 0;
  LinePrefetch() = default;
  template <class E>
  LinePrefetch(const E* rows, int64_t stride_elems, int64_t n, int D)
      : row(reinterpret_cast<const char*>(rows)), stride(stride_elems * int64_t(sizeof(E))), rows_left(rows ? n : 0),
        row_bytes(D * int(sizeof(E))) {}
  // Rows of row_bytes bytes, stride_bytes apart (quantised cache rows).
  static LinePrefetch bytes(const uint8_t* rows, int64_t stride_bytes, int64_t n, int row_bytes) {
    LinePrefetch p;
    p.row = reinterpret_cast<const char*>(rows), p.stride = stride_bytes, p.rows_left = rows ? n : 0;
    p.row_bytes = row_bytes;
    return p;
  }
  inline void step() {
    if (rows_left <= 0) return;
    __builtin_prefetch(row + off, 0, 2);
    if ((off += 64) >= row_bytes) off = 0, row += stride, --rows_left;
  }
  inline void finish() {
    while (rows_left > 0) step();
  }
};

// acc[h][d] = acc[h][d] * r[h] + sum_j P[h][j] V[j][d] for HB heads at once. Each (h, d) sums its
// keys in order j = 0..n-1 onto the rescaled accumulator. `next`: rows to prefetch meanwhile.
// acc[h] *= r[h] for HB heads (x * 1 skipped). The rescale is its own pass before P·V (speed:
// folded into the slice loops it kept the HB factors live across the key loop, and GCC spilled three
// of the twelve BF16-path accumulators to the stack, a store-forwarding round trip per key; same bits).
template <int HB>
inline void rescale_heads(const float* r, float* acc, int D) {
  for (int h = 0; h < HB; ++h) {
    if (r[h] == 1.0f) continue;
    const __m256 rh = _mm256_set1_ps(r[h]);
    float* a = acc + h * D;
    int d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(a + d, _mm256_mul_ps(_mm256_loadu_ps(a + d), rh));
    for (; d < D; ++d) a[d] *= r[h];
  }
}

template <int HB, class E>
inline void pv_heads(const float* P, int64_t ldp, const E* V, int64_t vs, int64_t n, int D, const float* r,
                     float* acc, LinePrefetch& next) {
  rescale_heads<HB>(r, acc, D);
  int d = 0;
#ifdef M3_KERNELS_AVX512
  d = pv_heads512<HB>(P, ldp, V, vs, n, D, acc, next);
#endif
  // Slices of 24 (12 accumulators for 4 heads: 3 V loads + 4 broadcasts feed 12 FMAs; measured
  // faster than slices of 16), then 16 and 8.
  for (; d + 24 <= D; d += 24) {
    __m256 a0[HB], a1[HB], a2[HB];
    for (int h = 0; h < HB; ++h) {
      a0[h] = _mm256_loadu_ps(acc + h * D + d);
      a1[h] = _mm256_loadu_ps(acc + h * D + d + 8);
      a2[h] = _mm256_loadu_ps(acc + h * D + d + 16);
    }
    for (int64_t j = 0; j < n; ++j) {
      next.step();
      const E* vj = V + j * vs + d;
      const __m256 v0 = ld8(vj), v1 = ld8(vj + 8), v2 = ld8(vj + 16);
#pragma GCC unroll 4
      for (int h = 0; h < HB; ++h) {
        const __m256 p = _mm256_broadcast_ss(P + h * ldp + j);
        a0[h] = _mm256_fmadd_ps(p, v0, a0[h]);
        a1[h] = _mm256_fmadd_ps(p, v1, a1[h]);
        a2[h] = _mm256_fmadd_ps(p, v2, a2[h]);
      }
    }
    for (int h = 0; h < HB; ++h) {
      _mm256_storeu_ps(acc + h * D + d, a0[h]);
      _mm256_storeu_ps(acc + h * D + d + 8, a1[h]);
      _mm256_storeu_ps(acc + h * D + d + 16, a2[h]);
    }
  }
  for (; d + 16 <= D; d += 16) {
    __m256 a0[HB], a1[HB];
    for (int h = 0; h < HB; ++h) {
      a0[h] = _mm256_loadu_ps(acc + h * D + d);
      a1[h] = _mm256_loadu_ps(acc + h * D + d + 8);
    }
    for (int64_t j = 0; j < n; ++j) {
      next.step();
      const __m256 v0 = ld8(V + j * vs + d), v1 = ld8(V + j * vs + d + 8);
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
  for (; d + 8 <= D; d += 8) {
    __m256 a0[HB];
    for (int h = 0; h < HB; ++h) a0[h] = _mm256_loadu_ps(acc + h * D + d);
    for (int64_t j = 0; j < n; ++j) {
      next.step();
      const __m256 v0 = ld8(V + j * vs + d);
      for (int h = 0; h < HB; ++h) a0[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + h * ldp + j), v0, a0[h]);
    }
    for (int h = 0; h < HB; ++h) _mm256_storeu_ps(acc + h * D + d, a0[h]);
  }
  for (; d < D; ++d)
    for (int h = 0; h < HB; ++h) {
      float a = acc[h * D + d];
      for (int64_t j = 0; j < n; ++j) a = std::fma(P[h * ldp + j], ld1(V + j * vs + d), a);
      acc[h * D + d] = a;
    }
  next.finish();
}
#else
inline float attn_exp1(float x) {
  x = std::min(std::max(x, kExpLo), kExpHi);
  const float fx = std::floor(x * kLog2e + 0.5f);
  x = x - fx * kLn2Hi;
  x = x - fx * kLn2Lo;
  const float z = x * x;
  float y = kP0;
  y = y * x + kP1;
  y = y * x + kP2;
  y = y * x + kP3;
  y = y * x + kP4;
  y = y * x + kP5;
  y = y * z + (x + 1.0f);
  uint32_t e = uint32_t(int32_t(fx) + 127) << 23;
  float s;
  std::memcpy(&s, &e, 4);
  return y * s;
}

template <class E>
inline void dot_block(const float* q, int64_t qs, int H, const E* k, int64_t ks, int64_t n, int D, float* out) {
  static_assert(sizeof(E) == 4, "the generic build widens BF16 rows before calling (see the *_bf16_impl entries)");
  for (int64_t j = 0; j < n; ++j)
    for (int h = 0; h < H; ++h) out[j * H + h] = dot_impl(q + h * qs, k + j * ks, D);
}
#endif

template <class E>
void max_dots_t(const float* q, int64_t qs, int H, const E* k, int64_t ks, int64_t n, int D, float* m) {
#ifdef M3_HAVE_MAX_DOTS4
  if (H % 4 == 0 && D % 8 == 0) {
    for (int h0 = 0; h0 < H; h0 += 4) max_dots4(q + h0 * qs, qs, k, ks, n, D, m + h0);
    return;
  }
#endif
  float t[64 * 4];
  const int hc = std::min(H, 64);
  for (int h0 = 0; h0 < H; h0 += hc) {
    const int hb = std::min(hc, H - h0);
    for (int64_t j = 0; j < n; j += 4) {
      const int64_t nk = std::min<int64_t>(4, n - j);
      dot_block(q + h0 * qs, qs, hb, k + j * ks, ks, nk, D, t);
      for (int64_t jj = 0; jj < nk; ++jj)
        for (int h = 0; h < hb; ++h) m[h0 + h] = std::max(m[h0 + h], t[jj * hb + h]);
    }
  }
}

// Where attn_block_src reads a block's K and V rows: fp32 or BF16 rows, strides in elements.
// kUnit: the rows' values are the cache's values / kUnit (see QuantBlock); 1 here.
template <class E>
struct PlainBlock {
  const E *K, *V;
  int64_t ks, vs;
  static constexpr float kUnit = 1.0f;
  // t[jj * hb + h] = q_h · k_(j0 + jj) for hb heads and nk keys (V rows prefetched meanwhile when pf_v).
  void scores(const float* qh, int64_t qs, int hb, int64_t j0, int64_t nk, int D, float* t, bool pf_v) const {
#if defined(M3_KERNELS_AVX2)
    dot_block(qh, qs, hb, K + j0 * ks, ks, nk, D, t, pf_v ? V + j0 * vs : nullptr, vs);
#else
    (void)pf_v;
    dot_block(qh, qs, hb, K + j0 * ks, ks, nk, D, t);
#endif
  }
#if defined(M3_KERNELS_AVX2)
  template <int HB>
  void pv(const float* P, int64_t ldp, int64_t n, int D, const float* r, float* acc, LinePrefetch& next) const {
    pv_heads<HB>(P, ldp, V, vs, n, D, r, acc, next);
  }
#endif
};

#if !(defined(M3_KERNELS_AVX2))
struct LinePrefetch {  // the generic build does not prefetch
  void step() {}
  void finish() {}
};
#endif

// One key block (n keys) of online softmax for H heads. State: m[H] running max (-inf before the
// first block), l[H] running sum, acc[H * D] unnormalised output. scratch >= H * (n + 8) floats.
// `next`: the rows the caller reads next, prefetched meanwhile (during the first head group's P·V).
template <class Src>
void attn_block_src(const float* q, int64_t qs, int H, const Src& src, int64_t n, int D, float scale, float* m,
                    float* l, float* acc, float* scratch, LinePrefetch next) {
  if (n <= 0) return;
  const int64_t ldp = (n + 7) & ~int64_t(7);
  float* S = scratch;  // [H][ldp], scores then probabilities (times Src::kUnit once exponentiated)
  float r[4];
  [[maybe_unused]] LinePrefetch none;  // (the generic build has no P·V prefetch)
  for (int h0 = 0; h0 < H; h0 += 4) {
    const int hb = std::min(4, H - h0);
    const float* qh = q + h0 * qs;
    // Scores, key-major tiles transposed into per-head rows.
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
      float t[32 * 4];
      const int64_t nk = std::min<int64_t>(32, n - j0);
      src.scores(qh, qs, hb, j0, nk, D, t, h0 == 0);
      int64_t jj = 0;
#if defined(M3_KERNELS_AVX2)
      if (hb == 4) {  // 4 keys x 4 heads at a time: a register transpose (speed: fewer horizontal
                      // reductions than one key at a time)
        const __m128 sv = _mm_set1_ps(scale);
        for (; jj + 4 <= nk; jj += 4) {
          __m128 a = _mm_loadu_ps(t + jj * 4), b = _mm_loadu_ps(t + jj * 4 + 4);
          __m128 c = _mm_loadu_ps(t + jj * 4 + 8), d = _mm_loadu_ps(t + jj * 4 + 12);
          _MM_TRANSPOSE4_PS(a, b, c, d);
          _mm_storeu_ps(S + j0 + jj, _mm_mul_ps(a, sv));
          _mm_storeu_ps(S + ldp + j0 + jj, _mm_mul_ps(b, sv));
          _mm_storeu_ps(S + 2 * ldp + j0 + jj, _mm_mul_ps(c, sv));
          _mm_storeu_ps(S + 3 * ldp + j0 + jj, _mm_mul_ps(d, sv));
        }
      }
#endif
      for (; jj < nk; ++jj)
        for (int h = 0; h < hb; ++h) S[h * ldp + j0 + jj] = t[jj * hb + h] * scale;
    }
    for (int h = 0; h < hb; ++h) {
      float* sh = S + h * ldp;
      for (int64_t j = n; j < ldp; ++j) sh[j] = -std::numeric_limits<float>::infinity();
      float bm;
#if defined(M3_KERNELS_AVX2)
      {  // vector max over the padded row (a scalar max chain was a sizeable share of the kernel)
        __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j < ldp; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(sh + j));
        __m128 a = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
        a = _mm_max_ps(a, _mm_movehl_ps(a, a));
        bm = _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
      }
#else
      bm = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) bm = std::max(bm, sh[j]);
#endif
      const int hh = h0 + h;
      const float mold = m[hh], mnew = std::max(mold, bm);
      r[h] = mold == -std::numeric_limits<float>::infinity() || mold == mnew ? 1.0f : attn_exp1(mold - mnew);
      m[hh] = mnew;
      float sum;
#if defined(M3_KERNELS_AVX2)
      const __m256 mv = _mm256_set1_ps(mnew);
      __m256 sv = _mm256_setzero_ps();
      for (int64_t j = 0; j < ldp; j += 8) {
        const __m256 p = attn_exp8(_mm256_sub_ps(_mm256_loadu_ps(sh + j), mv));
        _mm256_storeu_ps(sh + j, Src::kUnit == 1.0f ? p : _mm256_mul_ps(p, _mm256_set1_ps(Src::kUnit)));
        sv = _mm256_add_ps(sv, p);
      }
      sum = attn_hsum8(sv);
#else
      sum = 0.f;
      for (int64_t j = 0; j < ldp; ++j) sum += sh[j] = attn_exp1(sh[j] - mnew);
#endif
      l[hh] = l[hh] * r[h] + sum;
    }
    float* ah = acc + int64_t(h0) * D;
#if defined(M3_KERNELS_AVX2)
    switch (hb) {
      case 1: src.template pv<1>(S, ldp, n, D, r, ah, h0 == 0 ? next : none); break;
      case 2: src.template pv<2>(S, ldp, n, D, r, ah, h0 == 0 ? next : none); break;
      case 3: src.template pv<3>(S, ldp, n, D, r, ah, h0 == 0 ? next : none); break;
      default: src.template pv<4>(S, ldp, n, D, r, ah, h0 == 0 ? next : none); break;
    }
#else
    for (int h = 0; h < hb; ++h) {
      float* a = ah + int64_t(h) * D;
      for (int d = 0; d < D; ++d) a[d] *= r[h];
      for (int64_t j = 0; j < n; ++j) axpy_impl(S[h * ldp + j], src.V + j * src.vs, a, D);
    }
#endif
  }
}

template <class E>
void attn_block_t(const float* q, int64_t qs, int H, const E* K, int64_t ks, const E* V, int64_t vs, int64_t n, int D,
                  float scale, float* m, float* l, float* acc, float* scratch, const E* K_next, int64_t ks_next,
                  int64_t n_next) {
#if defined(M3_KERNELS_AVX2)
  const LinePrefetch next(K_next, ks_next, n_next, D);
#else
  (void)K_next, (void)ks_next, (void)n_next;
  const LinePrefetch next;
#endif
  attn_block_src(q, qs, H, PlainBlock<E>{K, V, ks, vs}, n, D, scale, m, l, acc, scratch, next);
}

}  // namespace
}  // namespace m3::cpu
