// The GEMM's packing and register-tiled micro-kernel (gemm.h), compiled once per ISA by gemm_generic.cpp,
// gemm_avx2.cpp and gemm_avx512.cpp (isa_level.h says which vector family the including unit has).
// Hand-written for speed: the products are compute-bound, and a micro-kernel that keeps an MR x NR tile
// of C in registers while B's panel streams from L1/L2 and A's values are broadcast runs the FMA units
// near their peak, where linear.h's decode kernels (one pass over the weights per call) do not.
// Every lane of C sums its K products one after the other with FMAs (fp32), the same order in every
// build's micro-kernel shape and for every MR variant (edges included).
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/isa_level.h"

namespace m3::gemm_impl {
namespace {

#if defined(M3_KERNELS_AVX512)
// 16 floats per register; a 6 x 64 tile: 24 accumulators, 4 panel loads and 6 broadcasts per k.
struct Vec {
  using R = __m512;
  static constexpr int W = 16, MR = 6, NV = 4;
  static R zero() { return _mm512_setzero_ps(); }
  static R load(const float* p) { return _mm512_load_ps(p); }
  static R loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, R v) { _mm512_storeu_ps(p, v); }
  static R set1(float a) { return _mm512_set1_ps(a); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
};
#elif defined(M3_KERNELS_AVX2)
// 8 floats per register; a 6 x 16 tile: 12 accumulators of the 16 registers.
struct Vec {
  using R = __m256;
  static constexpr int W = 8, MR = 6, NV = 2;
  static R zero() { return _mm256_setzero_ps(); }
  static R load(const float* p) { return _mm256_load_ps(p); }
  static R loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, R v) { _mm256_storeu_ps(p, v); }
  static R set1(float a) { return _mm256_set1_ps(a); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
};
#else
// Scalars (generic x86-64 has no FMA instruction: a fused std::fma would be a library call, so the
// product is rounded before the sum here; this build is the portable fallback, not a parity target).
struct Vec {
  using R = float;
  static constexpr int W = 1, MR = 4, NV = 4;
  static R zero() { return 0.f; }
  static R load(const float* p) { return *p; }
  static R loadu(const float* p) { return *p; }
  static void storeu(float* p, R v) { *p = v; }
  static R set1(float a) { return a; }
  static R fma(R a, R b, R c) { return a * b + c; }
  static R add(R a, R b) { return a + b; }
};
#endif

constexpr int kNR = Vec::W * Vec::NV;

inline float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float element(const GemmB& B, int64_t i) {
  return B.bf16 ? bf16_value(static_cast<const uint16_t*>(B.p)[i]) : static_cast<const float*>(B.p)[i];
}

#if defined(M3_KERNELS_AVX512)
inline __m512 load16(const GemmB& B, int64_t i) {
  if (!B.bf16) return _mm512_loadu_ps(static_cast<const float*>(B.p) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(B.p) + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// r[i] lane j -> r[j] lane i.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + j], 128-bit lane L: rows 4i..4i+3 of column 4L + j
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  __m512 o[16];
  for (int j = 0; j < 4; ++j) {  // a 4 x 4 transpose of 128-bit lanes
    const __m512 x0 = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 x1 = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 y0 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 y1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(3, 2, 3, 2));
    o[j] = _mm512_shuffle_f32x4(x0, y0, _MM_SHUFFLE(2, 0, 2, 0));
    o[4 + j] = _mm512_shuffle_f32x4(x0, y0, _MM_SHUFFLE(3, 1, 3, 1));
    o[8 + j] = _mm512_shuffle_f32x4(x1, y1, _MM_SHUFFLE(2, 0, 2, 0));
    o[12 + j] = _mm512_shuffle_f32x4(x1, y1, _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 16; ++i) r[i] = o[i];
}
#endif

void pack(const GemmB& B, int64_t n0, int64_t nc, int64_t k0, int64_t kc, float* out) {
  for (int64_t p = 0; p * kNR < nc; ++p) {
    float* o = out + p * kc * kNR;
    const int64_t c0 = n0 + p * kNR, cols = nc - p * kNR < kNR ? nc - p * kNR : kNR;
    if (cols < kNR) std::memset(o, 0, size_t(kc * kNR) * sizeof(float));
    if (B.kn) {  // rows of B are k: each panel row is a contiguous run of B's row
      for (int64_t k = 0; k < kc; ++k) {
        float* d = o + k * kNR;
        if (B.bf16) {
          const uint16_t* s = static_cast<const uint16_t*>(B.p) + (k0 + k) * B.ld + c0;
          for (int64_t c = 0; c < cols; ++c) d[c] = bf16_value(s[c]);
        } else {
          std::memcpy(d, static_cast<const float*>(B.p) + (k0 + k) * B.ld + c0, size_t(cols) * sizeof(float));
        }
      }
    } else {
      // Weight form: column c of the panel is B's row c0 + c (a transpose).
      int64_t c = 0, kdone = 0;
#if defined(M3_KERNELS_AVX512)
      // 16 x 16 blocks through registers (speed: the scalar transpose cost 7% of the mid tower's time).
      kdone = kc & ~int64_t(15);
      for (; c + 16 <= cols; c += 16)
        for (int64_t k = 0; k < kdone; k += 16) {
          __m512 r[16];
          for (int i = 0; i < 16; ++i) r[i] = load16(B, (c0 + c + i) * B.ld + k0 + k);
          transpose16(r);
          for (int j = 0; j < 16; ++j) _mm512_store_ps(o + (k + j) * kNR + c, r[j]);
        }
      for (int64_t cc = 0; cc < c; ++cc)  // the K tail of the blocked columns
        for (int64_t k = kdone; k < kc; ++k) o[k * kNR + cc] = element(B, (c0 + cc) * B.ld + k0 + k);
#endif
      for (; c < cols; ++c)
        for (int64_t k = 0; k < kc; ++k) o[k * kNR + c] = element(B, (c0 + c) * B.ld + k0 + k);
      (void)kdone;
    }
  }
}

// C[MR rows, NV vectors] (ldc) += A[MR, kc] (lda) · Bp[kc][kNR] (its first NV vectors).
template <int MR, int NV>
inline void micro(int64_t kc, const float* A, int64_t lda, const float* Bp, float* C, int64_t ldc) {
  typename Vec::R c[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) c[i][j] = Vec::zero();
  for (int64_t k = 0; k < kc; ++k) {
    typename Vec::R b[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) b[j] = Vec::load(Bp + k * kNR + j * Vec::W);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const typename Vec::R a = Vec::set1(A[i * lda + k]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) c[i][j] = Vec::fma(a, b[j], c[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j)
      Vec::storeu(C + i * ldc + j * Vec::W, Vec::add(Vec::loadu(C + i * ldc + j * Vec::W), c[i][j]));
}

// The last panel of a matrix whose columns are not a multiple of kNR: only the vectors that hold
// columns run; a partial last vector goes through a copy of C's tile.
template <int MR, int NV>
void micro_edge(int64_t kc, const float* A, int64_t lda, const float* Bp, float* C, int64_t ldc, int64_t cols) {
  if (cols == NV * Vec::W) {
    micro<MR, NV>(kc, A, lda, Bp, C, ldc);
    return;
  }
  alignas(64) float t[MR * kNR] = {};
  for (int i = 0; i < MR; ++i)
    for (int64_t c = 0; c < cols; ++c) t[i * kNR + c] = C[i * ldc + c];
  micro<MR, NV>(kc, A, lda, Bp, t, kNR);
  for (int i = 0; i < MR; ++i)
    for (int64_t c = 0; c < cols; ++c) C[i * ldc + c] = t[i * kNR + c];
}

template <int MR>
inline void micro_any(int64_t kc, const float* A, int64_t lda, const float* Bp, float* C, int64_t ldc, int64_t cols) {
  if (cols == kNR) {
    micro<MR, Vec::NV>(kc, A, lda, Bp, C, ldc);
    return;
  }
  switch ((cols + Vec::W - 1) / Vec::W) {
    case 1: micro_edge<MR, 1>(kc, A, lda, Bp, C, ldc, cols); break;
    case 2: micro_edge<MR, 2 <= Vec::NV ? 2 : 1>(kc, A, lda, Bp, C, ldc, cols); break;
    case 3: micro_edge<MR, 3 <= Vec::NV ? 3 : 1>(kc, A, lda, Bp, C, ldc, cols); break;
    default: micro_edge<MR, Vec::NV>(kc, A, lda, Bp, C, ldc, cols); break;
  }
}

void block(int64_t m, int64_t nc, int64_t kc, const float* A, int64_t lda, const float* Bp, int64_t pstride, float* C,
           int64_t ldc) {
  constexpr int MR = Vec::MR;
  for (int64_t p = 0; p * kNR < nc; ++p) {  // one panel stays in L1/L2 while every row block runs over it
    const float* bp = Bp + p * pstride;
    const int64_t cols = nc - p * kNR < kNR ? nc - p * kNR : kNR;
    float* cp = C + p * kNR;
    int64_t i = 0;
    for (; i + MR <= m; i += MR) micro_any<MR>(kc, A + i * lda, lda, bp, cp + i * ldc, ldc, cols);
    switch (m - i) {
      case 0: break;
      case 1: micro_any<1>(kc, A + i * lda, lda, bp, cp + i * ldc, ldc, cols); break;
      case 2: micro_any<2>(kc, A + i * lda, lda, bp, cp + i * ldc, ldc, cols); break;
      case 3: micro_any<3>(kc, A + i * lda, lda, bp, cp + i * ldc, ldc, cols); break;
      case 4: micro_any<4 < MR ? 4 : 1>(kc, A + i * lda, lda, bp, cp + i * ldc, ldc, cols); break;
      default: micro_any<5 < MR ? 5 : 1>(kc, A + i * lda, lda, bp, cp + i * ldc, ldc, cols); break;
    }
  }
}

// Each row i of s[rows, n] (ld apart) to exp(scale (s - max of the row)), in place, and its sum to
// sums[i] (the caller divides the product with the values by it). The exp is the attention kernels'
// (attention_simd.h, about 1-2 ulp) where the build has AVX2 (speed: a library exp per score cost more
// than the score products), else std::exp.
void softmax_rows(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* sums) {
  for (int64_t i = 0; i < rows; ++i) {
    float* r = s + i * ld;
    float mx = -INFINITY, sum = 0.f;
    int64_t j = 0;
#ifdef M3_KERNELS_AVX2
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= n; j += 8) vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(r + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmx);
    for (const float l : lanes) mx = l > mx ? l : mx;
    for (; j < n; ++j) mx = r[j] > mx ? r[j] : mx;
    const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    for (j = 0; j + 8 <= n; j += 8) {
      const __m256 e = m3::cpu::attn_exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(r + j), vm), vs));
      _mm256_storeu_ps(r + j, e);
      acc = _mm256_add_ps(acc, e);
    }
    sum = m3::cpu::attn_hsum8(acc);
    for (; j < n; ++j) sum += (r[j] = m3::cpu::attn_exp1((r[j] - mx) * scale));
#else
    for (; j < n; ++j) mx = r[j] > mx ? r[j] : mx;
    for (j = 0; j < n; ++j) sum += (r[j] = std::exp((r[j] - mx) * scale));
#endif
    sums[i] = sum;
  }
}

// x <- x Phi(x) = 0.5 x erfc(-x / sqrt 2) (the erf GELU). Where the build has AVX2, erfc comes from the
// Chebyshev fit erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), z >= 0 (Numerical Recipes' erfcc,
// fractional error below 1.2e-7) with the attention kernels' exp, and erfc(-z) = 2 - erfc(z) (speed: the
// library erf per element cost 11% of the mid tower's time). Measured against float64 (Gemm.Gelu*):
// 1.1e-6 relative for |x| <= 3, 3.5e-6 out to |x| = 6, against 0.8e-6 and 2.8e-6 for std::erfc in fp32
// (the rounded x / sqrt 2 dominates both). Written from erfc, not 1 + erf, which loses the negative tail
// (GELU(-6) would be 0). Elsewhere std::erfc.
void gelu(float* x, int64_t n) {
  int64_t i = 0;
#ifdef M3_KERNELS_AVX2
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.f), two = _mm256_set1_ps(2.f),
               rs2 = _mm256_set1_ps(float(M_SQRT1_2)), sign = _mm256_set1_ps(-0.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 u = _mm256_mul_ps(v, rs2);                         // erfc(-u) wanted
    const __m256 z = _mm256_andnot_ps(sign, u);                     // |u|
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(half, z, one));
    __m256 p = _mm256_set1_ps(0.17087277f);
    for (const float c : {-0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f, 0.09678418f,
                          0.37409196f, 1.00002368f, -1.26551223f})
      p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c));
    const __m256 ec = _mm256_mul_ps(t, m3::cpu::attn_exp8(_mm256_fnmadd_ps(z, z, p)));  // erfc(|u|)
    // erfc(-u) = erfc(|u|) for u < 0, 2 - erfc(|u|) for u >= 0.
    const __m256 pos = _mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_GE_OQ);
    const __m256 e = _mm256_blendv_ps(ec, _mm256_sub_ps(two, ec), pos);
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(half, v), e));
  }
#endif
  for (; i < n; ++i) x[i] = 0.5f * x[i] * std::erfc(-x[i] * float(M_SQRT1_2));
}

}  // namespace
}  // namespace m3::gemm_impl

// The table entry of the including unit's ISA.
#define M3_GEMM_OPS(label) \
  GemmOps { label, m3::gemm_impl::kNR, m3::gemm_impl::pack, m3::gemm_impl::block, m3::gemm_impl::softmax_rows, m3::gemm_impl::gelu }
