// NVFP4 weights times int8 activations: the opt-in fast path of NVFP4 matmuls (Linear::act_int8),
// what llama.cpp does with its Q8 activations. Not exact: each token's activations are rounded to
// int8 with one fp32 scale per 16 elements, the NVFP4 block (error up to 1/254 of the block's largest
// magnitude per element; per-16 rather than llama.cpp's per-32 because expert inputs after SwiGLU
// are heavy-tailed), so logits differ slightly from the exact fp32 path, which stays the default.
// Why (speed): the exact path spends about one instruction per weight decoding E2M1 to fp32 and is
// bound by instruction throughput, not memory; here a byte-wise table lookup turns the
// codes into int8 and one maddubs multiplies 32 of them, about a quarter of the instructions.
//
// Arithmetic (every ISA build computes exactly this, so results are bit-identical across ISAs and
// batch compositions; each token is computed on its own):
//   per 16-element block b of group g:  s_b = sum_e (2 * e2m1_e) * q_e        (exact int32)
//   weight block scale                  w_b = (e4m3(sc_b) / 256) * (128 / global_div)
//   activation block scale              xs_b = amax_b / 127, q_e = round_half_even(x_e * (127 / amax_b))
//   8 lane accumulators, lane p of group g takes block 8g + kQ8BlockOrder[p]:
//       acc_p = fma(float(s_b), w_b * xs_b, acc_p)
//   y = the hsum8 reduction of the 8 lanes ((p, p+4) pairs, then (0,2)/(1,3), then the last pair).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>
#include <immintrin.h>

#include "formats/dtype.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/element_tables.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/linear.h"
#ifdef M3_KERNELS_AVX2
#include "kernels/cpu/simd_avx2.h"
#endif
#ifdef M3_KERNELS_AVX512
#include "kernels/cpu/linear_avx512.h"
#endif

namespace m3::cpu {
namespace {

constexpr int64_t kQ8Group = 128;
constexpr int kQ8BlockOrder[8] = {0, 1, 4, 5, 2, 3, 6, 7};  // the lane order of hadd_epi32 over two chunks

// One call's activations in the kernel's layout: per 64-element chunk the 32 even elements then the
// 32 odd ones (the order of an NVFP4 byte's low and high nibbles); per group the 8 block scales and
// the 8 block corrections 12 * sum(q) (the weight codes are stored with +12 so that they are
// unsigned), both in lane order.
struct Q8Acts {
  std::vector<int8_t> q;      // [T, K]
  std::vector<int32_t> corr;  // [T, K/16]
  std::vector<float> scale;   // [T, K/16]
};

// E4M3 code -> value / 256 through its FP16 bit pattern (the vector decoder's formula, NaN codes
// included, so every ISA agrees; valid checkpoints hold no NaN scales).
inline float q8_e4m3_div256(uint8_t c) {
  return m3::f16_to_float(uint16_t(((c & 0x80u) << 8) | ((c & 0x7fu) << 7)));
}

#ifdef M3_KERNELS_AVX2
// One group of 128 activations (speed: a decode step quantises every expert input; the scalar loops
// cost as much as the product itself). Same results as the scalar version below: the block maximum
// is order-independent, and division, multiplication and round-to-nearest-even are exact IEEE steps.
inline void q8_quantize_group(const float* xg, int8_t* q, int32_t* corr, float* scale) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 k127 = _mm256_set1_ps(127.0f);
  alignas(32) float amax[8];  // natural block order
  __m256i n[4];               // the group's codes in natural order, 32 per vector
  for (int k = 0; k < 4; ++k) {
    __m256i iv[4];
    for (int h = 0; h < 2; ++h) {  // block 2k + h
      const float* xb = xg + 32 * k + 16 * h;
      const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
      __m256 m = _mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask));
      m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
      m = _mm256_max_ps(m, _mm256_permute_ps(m, 0x4e));
      m = _mm256_max_ps(m, _mm256_permute_ps(m, 0xb1));  // the block maximum in every lane
      amax[2 * k + h] = _mm256_cvtss_f32(m);
      const __m256 id = _mm256_and_ps(_mm256_div_ps(k127, m), _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_GT_OQ));
      iv[2 * h] = _mm256_cvtps_epi32(_mm256_mul_ps(v0, id));
      iv[2 * h + 1] = _mm256_cvtps_epi32(_mm256_mul_ps(v1, id));
    }
    // packs work per 128-bit lane: one dword permute restores element order.
    const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
    n[k] = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
  // Even elements to the front of each 64-element chunk, odd ones to the back.
  const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14,
                                      1, 3, 5, 7, 9, 11, 13, 15);
  for (int c = 0; c < 2; ++c) {
    const __m256i a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(n[2 * c], eo), 0xd8);
    const __m256i b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(n[2 * c + 1], eo), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 64 * c), _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 64 * c + 32), _mm256_permute2x128_si256(a, b, 0x31));
  }
  // Block sums: bytes -> 4-element sums -> per block (blocks [0,2,4,6 | 1,3,5,7]) -> lane order.
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256i s4[4];
  for (int k = 0; k < 4; ++k) s4[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, n[k]), ones16);
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s4[0], s4[1]), _mm256_hadd_epi32(s4[2], s4[3]));
  const __m256i sums = _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(corr),
                      _mm256_add_epi32(_mm256_slli_epi32(sums, 3), _mm256_slli_epi32(sums, 2)));  // 12 * sum
  const __m256 am = _mm256_permutevar8x32_ps(_mm256_load_ps(amax), _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
  _mm256_storeu_ps(scale, _mm256_div_ps(am, k127));
}
#else
inline void q8_quantize_group(const float* xg, int8_t* q, int32_t* corr, float* scale) {
  int8_t qn[kQ8Group];  // natural order
  for (int b = 0; b < 8; ++b) {
    float amax = 0.f;
    for (int e = 0; e < 16; ++e) amax = std::max(amax, std::fabs(xg[16 * b + e]));
    const float id = amax > 0.f ? 127.0f / amax : 0.f;
    for (int e = 0; e < 16; ++e) qn[16 * b + e] = int8_t(std::nearbyint(xg[16 * b + e] * id));
    for (int p = 0; p < 8; ++p)
      if (kQ8BlockOrder[p] == b) scale[p] = amax / 127.0f;
  }
  for (int c = 0; c < 2; ++c)
    for (int j = 0; j < 32; ++j) {
      q[64 * c + j] = qn[64 * c + 2 * j];
      q[64 * c + 32 + j] = qn[64 * c + 2 * j + 1];
    }
  for (int p = 0; p < 8; ++p) {
    int32_t s = 0;
    for (int e = 0; e < 16; ++e) s += qn[16 * kQ8BlockOrder[p] + e];
    corr[p] = 12 * s;
  }
}
#endif

void q8_quantize(const float* x, int64_t T, int64_t K, Q8Acts& a) {
  if (a.q.size() < size_t(T * K)) a.q.resize(size_t(T * K));
  if (a.corr.size() < size_t(T * K / 16)) a.corr.resize(size_t(T * K / 16));
  if (a.scale.size() < size_t(T * K / 16)) a.scale.resize(size_t(T * K / 16));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < K / kQ8Group; ++g)
      q8_quantize_group(x + t * K + g * kQ8Group, a.q.data() + t * K + g * kQ8Group,
                        a.corr.data() + t * (K / 16) + g * 8, a.scale.data() + t * (K / 16) + g * 8);
}

// The final reduction of the 8 lanes, in hsum8's order.
inline float q8_reduce_lanes(const float* l) {
  const float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (a0 + a2) + (a1 + a3);
}

// Scalar form of the arithmetic above: the generic build's kernel, which the ISA test holds the vector
// builds to bit for bit.
[[maybe_unused]] float q8_dot_row_scalar(const uint8_t* p, const uint8_t* sc, float c256, const int8_t* q,
                                         const float* xs, int64_t K) {
  const float* e2 = m3::element_tables().e2m1.data();
  float acc[8] = {};
  for (int64_t g = 0; g < K / kQ8Group; ++g)
    for (int lane = 0; lane < 8; ++lane) {
      const int blk = kQ8BlockOrder[lane];  // block of 16 within the group
      const int c = blk / 4;                // 64-element chunk
      int32_t s = 0;
      for (int e = 0; e < 16; ++e) {
        const int64_t n = g * kQ8Group + 16 * blk + e;  // element index
        const int j = int(n % 64) / 2;
        const uint8_t byte = p[n / 2];
        const int v = int(2.0f * e2[(n & 1) ? byte >> 4 : byte & 15]);
        s += v * q[g * kQ8Group + 64 * c + ((n & 1) ? 32 : 0) + j];
      }
      const float ws = q8_e4m3_div256(sc[g * 8 + blk]) * c256;
      acc[lane] = std::fma(float(s), ws * xs[g * 8 + lane], acc[lane]);
    }
  return q8_reduce_lanes(acc);
}

#ifdef M3_KERNELS_AVX2
// The 8 block scales of one group in lane order, times c256 (one pshufb permutes the bytes into
// the high halves of 16-bit lanes; shift and mask make the FP16 pattern of value / 256).
inline __m256 q8_block_scales(const uint8_t* sc, __m256 c256) {
  const __m128i perm = _mm_setr_epi8(-128, 0, -128, 1, -128, 4, -128, 5, -128, 2, -128, 3, -128, 6, -128, 7);
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc));
  const __m128i h = _mm_and_si128(_mm_srai_epi16(_mm_shuffle_epi8(b, perm), 1), _mm_set1_epi16(int16_t(0xbf80)));
  return _mm256_mul_ps(_mm256_cvtph_ps(h), c256);
}

// The 64 packed bytes of one group as unsigned codes (2 * value + 12): low and high nibbles of
// each 32-byte chunk.
inline void q8_unpack_group(const uint8_t* p, __m256i& l0, __m256i& h0, __m256i& l1, __m256i& h1) {
  const __m256i tab = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15,
                                       16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  const __m256i m = _mm256_set1_epi8(0x0f);
  const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
  l0 = _mm256_shuffle_epi8(tab, _mm256_and_si256(b0, m));
  h0 = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(b0, 4), m));
  l1 = _mm256_shuffle_epi8(tab, _mm256_and_si256(b1, m));
  h1 = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(b1, 4), m));
}

// One group of one row: the 8 exact block sums in lane order. u * q pairs stay below 2 * 24 * 127
// and four of them below 2^15, so maddubs and the 16-bit add cannot saturate.
inline __m256i q8_group_sums(__m256i l0, __m256i h0, __m256i l1, __m256i h1, const int8_t* q, const int32_t* corr) {
  const __m256i ones = _mm256_set1_epi16(1);
  auto ld = [](const int8_t* a) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)); };
  const __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(l0, ld(q)), _mm256_maddubs_epi16(h0, ld(q + 32)));
  const __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(l1, ld(q + 64)), _mm256_maddubs_epi16(h1, ld(q + 96)));
  const __m256i s = _mm256_hadd_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones));
  return _mm256_sub_epi32(s, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr)));
}

// Decode step, one 4-row tile and one token: rows interleaved (four independent chains), weights
// unpacked in registers, the next tile prefetched.
void q8_dot_rows4_x1(const uint8_t* p, const uint8_t* sc, float c256, const Q8Acts& a, int64_t K, float* y,
                     bool more) {
  const int64_t G = K / kQ8Group, half = K / 2;
  const __m256 vc = _mm256_set1_ps(c256);
  TilePrefetch pf(p + 4 * half, more ? size_t(4 * half) : 0);  // G iterations, 2K bytes
  if (more) prefetch_range(sc + 4 * (K / 16), size_t(4 * (K / 16)));
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g = 0; g < G; ++g) {
    pf.lines(4);
    const int8_t* q = a.q.data() + g * kQ8Group;
    const int32_t* corr = a.corr.data() + g * 8;
    const __m256 xs = _mm256_loadu_ps(a.scale.data() + g * 8);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      __m256i l0, h0, l1, h1;
      q8_unpack_group(p + i * half + g * 64, l0, h0, l1, h1);
      const __m256 ws = q8_block_scales(sc + i * (K / 16) + g * 8, vc);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_group_sums(l0, h0, l1, h1, q, corr)), _mm256_mul_ps(ws, xs),
                               acc[i]);
    }
  }
  for (int i = 0; i < 4; ++i) y[i] = hsum8(acc[i]);
}

// NT tokens of one row against its unpacked codes (K bytes) and block scales (K/16 floats): each
// group's codes are loaded once for the NT tokens (speed: prefill and batched steps).
template <int NT>
inline void q8_row_tokens(const uint8_t* codes, const float* ws, const Q8Acts& a, int64_t t0, int64_t K, float* y,
                          int64_t N) {
  auto ld = [](const uint8_t* b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)); };
  __m256 acc[NT];
  for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < K / kQ8Group; ++g) {
    const uint8_t* c = codes + g * kQ8Group;
    const __m256i c0 = ld(c), c1 = ld(c + 32), c2 = ld(c + 64), c3 = ld(c + 96);
    const __m256 w = _mm256_loadu_ps(ws + g * 8);
#pragma GCC unroll 4
    for (int j = 0; j < NT; ++j) {
      const int64_t t = t0 + j;
      const __m256i s = q8_group_sums(c0, c1, c2, c3, a.q.data() + t * K + g * kQ8Group,
                                      a.corr.data() + t * (K / 16) + g * 8);
      const __m256 xs = _mm256_loadu_ps(a.scale.data() + t * (K / 16) + g * 8);
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(w, xs), acc[j]);
    }
  }
  for (int j = 0; j < NT; ++j) y[(t0 + j) * N] = hsum8(acc[j]);
}

// Several tokens (or a short tile): the tile's codes and scales are unpacked once into scratch
// (K bytes + K/16 floats per row) and reused for every token, four tokens per pass.
void q8_dot_rows_xT(const uint8_t* p, const uint8_t* sc, float c256, const Q8Acts& a, int64_t K, int64_t nr,
                    int64_t T, int64_t N, float* y, float* scratch) {
  const int64_t G = K / kQ8Group, half = K / 2;
  const __m256 vc = _mm256_set1_ps(c256);
  uint8_t* codes = reinterpret_cast<uint8_t*>(scratch);  // [nr, K]
  float* ws = scratch + nr * K / 4;                        // [nr, K/16]
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t g = 0; g < G; ++g) {
      __m256i u[4];
      q8_unpack_group(p + i * half + g * 64, u[0], u[1], u[2], u[3]);
      for (int c = 0; c < 4; ++c)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i * K + g * kQ8Group + 32 * c), u[c]);
      _mm256_storeu_ps(ws + i * (K / 16) + g * 8, q8_block_scales(sc + i * (K / 16) + g * 8, vc));
    }
  for (int64_t t = 0; t < T; t += 4)
    for (int64_t i = 0; i < nr; ++i) {
      const uint8_t* ci = codes + i * K;
      const float* wi = ws + i * (K / 16);
      switch (std::min<int64_t>(4, T - t)) {
        case 4: q8_row_tokens<4>(ci, wi, a, t, K, y + i, N); break;
        case 3: q8_row_tokens<3>(ci, wi, a, t, K, y + i, N); break;
        case 2: q8_row_tokens<2>(ci, wi, a, t, K, y + i, N); break;
        default: q8_row_tokens<1>(ci, wi, a, t, K, y + i, N); break;
      }
    }
}
#endif

#if defined(M3_KERNELS_AVX512) && defined(__AVX512VNNI__)
// The 512-bit forms (avx512 build with AVX512-VNNI): two rows per register (row A in the low half, B in
// the high), one vpdpbusd per 64 code bytes instead of maddubs + add + madd. The integer block sums
// are exact either way and land in the same lanes (the per-128-bit shuffles below are hadd_epi32's
// pairing), and the float steps are the AVX2 ones lane for lane: same bits as every other build
// (KernelsIsaInt8Act.IsasAgreeAndErrorWithinQuantisationBound).

// One group's 8 block sums of rows A and B (codes c0..c3: low / high nibbles of the two 64-element
// chunks, A's 32 bytes then B's) against one token's activations (q, corr: as q8_group_sums).
inline __m512i q8_pair_group_sums(__m512i c0, __m512i c1, __m512i c2, __m512i c3, const int8_t* q,
                                  const int32_t* corr) {
  auto ld2 = [](const int8_t* a) { return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))); };
  const __m512i z = _mm512_setzero_si512();
  const __m512 s0 = _mm512_castsi512_ps(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, c0, ld2(q)), c1, ld2(q + 32)));
  const __m512 s1 = _mm512_castsi512_ps(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, c2, ld2(q + 64)), c3, ld2(q + 96)));
  const __m512i h = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(s0, s1, 0x88)),
                                     _mm512_castps_si512(_mm512_shuffle_ps(s0, s1, 0xdd)));
  return _mm512_sub_epi32(h, _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr))));
}

// The codes of one group of rows A and B (packed bytes pa, pb: 64 each) as q8_unpack_group's four vectors.
inline void q8_unpack_pair(const uint8_t* pa, const uint8_t* pb, __m512i u[4]) {
  const __m512i tab = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i m = _mm512_set1_epi8(0x0f);
  auto ld = [](const uint8_t* a) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)); };
  const __m512i b0 = _mm512_inserti64x4(_mm512_castsi256_si512(ld(pa)), ld(pb), 1);
  const __m512i b1 = _mm512_inserti64x4(_mm512_castsi256_si512(ld(pa + 32)), ld(pb + 32), 1);
  u[0] = _mm512_shuffle_epi8(tab, _mm512_and_si512(b0, m));
  u[1] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(b0, 4), m));
  u[2] = _mm512_shuffle_epi8(tab, _mm512_and_si512(b1, m));
  u[3] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(b1, 4), m));
}

inline __m512 q8_pair_scales(const uint8_t* sa, const uint8_t* sb, __m256 vc) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(q8_block_scales(sa, vc)), q8_block_scales(sb, vc), 1);
}

// The decode step's tile (4 rows, one token): pairs (0, 1) and (2, 3).
void q8_dot_rows4_x1_512(const uint8_t* p, const uint8_t* sc, float c256, const Q8Acts& a, int64_t K, float* y,
                         bool more) {
  const int64_t G = K / kQ8Group, half = K / 2, ns = K / 16;
  const __m256 vc = _mm256_set1_ps(c256);
  TilePrefetch pf(p + 4 * half, more ? size_t(4 * half) : 0);
  if (more) prefetch_range(sc + 4 * ns, size_t(4 * ns));
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t g = 0; g < G; ++g) {
    pf.lines(4);
    const int8_t* q = a.q.data() + g * kQ8Group;
    const int32_t* corr = a.corr.data() + g * 8;
    const __m512 xs = _mm512_broadcast_f32x8(_mm256_loadu_ps(a.scale.data() + g * 8));
#pragma GCC unroll 2
    for (int pr = 0; pr < 2; ++pr) {
      __m512i u[4];
      q8_unpack_pair(p + (2 * pr) * half + g * 64, p + (2 * pr + 1) * half + g * 64, u);
      const __m512 ws = q8_pair_scales(sc + (2 * pr) * ns + g * 8, sc + (2 * pr + 1) * ns + g * 8, vc);
      acc[pr] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q8_pair_group_sums(u[0], u[1], u[2], u[3], q, corr)),
                                _mm512_mul_ps(ws, xs), acc[pr]);
    }
  }
  for (int pr = 0; pr < 2; ++pr) {
    y[2 * pr] = hsum8(_mm512_castps512_ps256(acc[pr]));
    y[2 * pr + 1] = hsum8(_mm512_extractf32x8_ps(acc[pr], 1));
  }
}

// NT tokens of a row pair against its unpacked codes (per group four 64-byte vectors) and scales
// (per group 16 floats); outputs of token t at y[t * N] (row A) and y[t * N + 1] (row B).
template <int NT>
inline void q8_pair_tokens(const uint8_t* codes, const float* ws, const Q8Acts& a, int64_t t0, int64_t K, float* y,
                           int64_t N) {
  __m512 acc[NT];
  for (int j = 0; j < NT; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < K / kQ8Group; ++g) {
    const uint8_t* c = codes + g * 256;
    const __m512i c0 = _mm512_loadu_si512(c), c1 = _mm512_loadu_si512(c + 64), c2 = _mm512_loadu_si512(c + 128),
                  c3 = _mm512_loadu_si512(c + 192);
    const __m512 w = _mm512_loadu_ps(ws + g * 16);
#pragma GCC unroll 6
    for (int j = 0; j < NT; ++j) {
      const int64_t t = t0 + j;
      const __m512i s = q8_pair_group_sums(c0, c1, c2, c3, a.q.data() + t * K + g * kQ8Group,
                                           a.corr.data() + t * (K / 16) + g * 8);
      const __m512 xs = _mm512_broadcast_f32x8(_mm256_loadu_ps(a.scale.data() + t * (K / 16) + g * 8));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(w, xs), acc[j]);
    }
  }
  for (int j = 0; j < NT; ++j) {
    y[(t0 + j) * N] = hsum8(_mm512_castps512_ps256(acc[j]));
    y[(t0 + j) * N + 1] = hsum8(_mm512_extractf32x8_ps(acc[j], 1));
  }
}

// Several tokens over a full tile: each pair's codes and scales unpacked once into scratch, then six
// tokens per pass.
void q8_dot_rows_xT_512(const uint8_t* p, const uint8_t* sc, float c256, const Q8Acts& a, int64_t K, int64_t T,
                        int64_t N, float* y, float* scratch) {
  const int64_t G = K / kQ8Group, half = K / 2, ns = K / 16;
  const __m256 vc = _mm256_set1_ps(c256);
  uint8_t* codes = reinterpret_cast<uint8_t*>(scratch);  // [2 pairs][G][256 bytes]
  float* ws = scratch + 4 * K / 4;                         // [2 pairs][G][16]
  for (int pr = 0; pr < 2; ++pr)
    for (int64_t g = 0; g < G; ++g) {
      __m512i u[4];
      q8_unpack_pair(p + (2 * pr) * half + g * 64, p + (2 * pr + 1) * half + g * 64, u);
      for (int c = 0; c < 4; ++c) _mm512_storeu_si512(codes + (pr * G + g) * 256 + 64 * c, u[c]);
      _mm512_storeu_ps(ws + (pr * G + g) * 16, q8_pair_scales(sc + (2 * pr) * ns + g * 8, sc + (2 * pr + 1) * ns + g * 8, vc));
    }
  for (int64_t t = 0; t < T;) {
    const int64_t nt = std::min<int64_t>(6, T - t);
    for (int pr = 0; pr < 2; ++pr)
      with_tokens6(nt, [&](auto gsz) {
        q8_pair_tokens<decltype(gsz)::value>(codes + pr * G * 256, ws + pr * G * 16, a, t, K, y + 2 * pr, N);
      });
    t += nt;
  }
}
#endif

// Rows [r0, r1) of y[T, N] for an NVFP4 matrix with int8 activations (K a multiple of 128).
// Rows [r0, r1) with the activations quantised by q8_quantize; the next tile is prefetched below pf_end.
void nvfp4_q8_rows(const m3::Linear& W, const Q8Acts& acts, int64_t T, float* y, int64_t r0, int64_t r1,
                   int64_t pf_end, float* scratch) {
  const int64_t K = W.K, N = W.N;
  const float c256 = 128.0f / W.global_div;
  for (int64_t r = r0; r < r1; r += m3::kLinearTileRows) {
    const int64_t nr = std::min<int64_t>(m3::kLinearTileRows, r1 - r);
    const uint8_t* p = W.w + size_t(r) * (K / 2);
    const uint8_t* sc = W.scales + size_t(r) * (K / 16);
#if defined(M3_KERNELS_AVX512) && defined(__AVX512VNNI__)
    if (nr == 4) {
      if (T == 1) q8_dot_rows4_x1_512(p, sc, c256, acts, K, y + r, r + 8 <= pf_end);
      else q8_dot_rows_xT_512(p, sc, c256, acts, K, T, N, y + r, scratch);
      continue;
    }
#endif
#ifdef M3_KERNELS_AVX2
    if (T == 1 && nr == 4) q8_dot_rows4_x1(p, sc, c256, acts, K, y + r, r + 8 <= pf_end);
    else q8_dot_rows_xT(p, sc, c256, acts, K, nr, T, N, y + r, scratch);
#else
    (void)scratch, (void)pf_end;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < nr; ++i)
        y[t * N + r + i] = q8_dot_row_scalar(p + i * (K / 2), sc + i * (K / 16), c256, acts.q.data() + t * K,
                                             acts.scale.data() + t * (K / 16), K);
#endif
  }
}

}  // namespace
}  // namespace m3::cpu
