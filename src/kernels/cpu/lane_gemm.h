// Products of many tokens (prefill chunks, steps of kLaneGemmMinTokens tokens or more) in the AVX2
// build: a register-blocked GEMM in outer-product form that keeps the bits of dot_rows4_x1.
//
// Why (speed): the dot-product form (dot_rows4_x3: 4 rows x 3 tokens, 12 FMAs per 7 vector loads)
// streams either the decoded weights or the activations from L2 for every FMA group, well below the
// rate with both operands in L1. Here 16 rows x 6 tokens keep 12 accumulators; each step loads two
// weight vectors from a 16 KB block that stays in L1 and broadcasts six activations from a packed copy
// (24 bytes per 12 FMAs from L2/L3), the shape of the BLIS Haswell kernel. Products of few tokens (the
// experts' 64) amortise a panel's decode and transpose least. Figures: docs/benchmarks.md section 5.
//
// Bits: dot_rows4_x1 gives output (row i, token t) as the hsum8 reduction of 8 lane sums, lane j
// accumulating fma(x[t][8m + j], w[i][8m + j], acc) for m = 0, 1, ... from +0, followed by one fma per
// element of the K % 8 tail. Here each lane j is a product of its own over the elements 8m + j: the
// packed weights hold, per lane, the 16 rows' w[i][8m + j] side by side for each m, the packed
// activations the 6 tokens' x[t][8m + j]. Accumulator (i, t) of lane j receives the same fmas in the
// same order (the product inside an fma is symmetric, so which operand is the broadcast does not
// matter; a block of steps that continues a lane reloads the stored sum, which changes nothing), and
// the 8 lane sums are then added in hsum8's order, ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), before
// the same tail fmas. Every output therefore has the bits of the one-token decode step.
//
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

#include "formats/dtype.h"
#include "base/host_memory.h"
#include "base/aligned_vector.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_avx2.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/simd_avx2.h"

#if !defined(M3_KERNELS_AVX2)
#error "lane_gemm.h needs the M3_KERNELS_AVX2 compiler flags (see CMakeLists.txt)"
#endif

namespace m3::cpu {
namespace {

constexpr int64_t kLaneRows = m3::kLanePanelRows;  // rows per panel: two 8-row vectors
constexpr int kLaneTokens = 6;                      // tokens per register block (6 x 2 accumulators)
constexpr int64_t kLaneSteps = 256;  // steps per block: 16 rows x 256 x 4 B = 16 KB of weights, held in L1
constexpr int64_t kLaneChunkGroups = 16;  // token groups whose lane sums are held at once (96 tokens, 48 KB)
constexpr int64_t kLaneSumFloats = kLaneTokens * kLaneRows;  // one block's sums: 6 tokens x 16 rows

// 8x8 transpose in registers: lane j of r[i] becomes lane i of r[j].
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// The activations of T tokens, packed per lane: for token group g (tokens 6g .. 6g + 5) and step m,
// the 6 floats at data[(j * G + g) * stride + 6m] are x[6g + u][8m + j] for u = 0..5 (tokens past T are
// zeros). stride = 6 * K8 + 2: each block ends in two spare floats that its last 8-float store fills.
// The copy lives on transparent huge pages (speed: the kernel streams 4 MB of it per panel in a
// 512-token product, and on 4 KiB pages the TLB misses slow the stand-alone kernel down).
struct LaneX {
  m3::HugePageBuffer buf;  // grown only: no allocation in steady state
  const float* x = nullptr;  // the activations as given (for the K % 8 tail)
  int64_t T = 0, K8 = 0, G = 0, stride = 0;
  float* block(int j, int64_t g) const { return reinterpret_cast<float*>(buf.data()) + (j * G + g) * stride; }
};

// Packs x into p; false (p unchanged) when the memory for the copy cannot be had.
bool lane_pack_x(const float* x, int64_t T, int64_t K, LaneX& p) {
  const int64_t K8 = K / 8, G = (T + kLaneTokens - 1) / kLaneTokens, stride = kLaneTokens * K8 + 2;
  const size_t need = size_t(8 * G * stride) * sizeof(float);
  if (p.buf.size() < need) {
    try {
      p.buf = m3::HugePageBuffer(need + need / 4, "lane GEMM activations");  // a quarter spare: fewer regrowths
    } catch (const std::exception&) {
      return false;
    }
  }
  p.x = x, p.T = T, p.K8 = K8, p.G = G, p.stride = stride;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t m = 0; m < K8; ++m) {
      __m256 r[8];
      for (int u = 0; u < 8; ++u) {
        const int64_t t = g * kLaneTokens + u;
        r[u] = u < kLaneTokens && t < T ? _mm256_loadu_ps(x + t * K + 8 * m) : _mm256_setzero_ps();
      }
      transpose8(r);
      // 8 floats at 6m: slots 6 and 7 are step m + 1's first two, written next (or the spare floats).
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(p.block(j, g) + kLaneTokens * m, r[j]);
    }
  return true;
}

// The 16 decoded rows (rows[i * K + k]) of a panel packed per lane: wl[(j * K8 + m) * 16 + i] = rows[i * K + 8m + j].
void lane_pack_w(const float* rows, int64_t K, float* wl) {
  const int64_t K8 = K / 8;
  for (int64_t m = 0; m < K8; ++m)
    for (int h = 0; h < 2; ++h) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows + (8 * h + i) * K + 8 * m);
      transpose8(r);
      for (int j = 0; j < 8; ++j) _mm256_store_ps(wl + (j * K8 + m) * 16 + 8 * h, r[j]);
    }
}

// Byte transpose of 8 rows of 16 bytes (per 128-bit half for __m256i): d[n] holds byte 2n of rows 0..7,
// then byte 2n + 1 of rows 0..7. Three rounds of unpacks (bytes of row pairs, then of row quads, then
// of all eight).
inline __m128i unpack_lo(__m128i a, __m128i b, int w) {
  return w == 8 ? _mm_unpacklo_epi8(a, b) : w == 16 ? _mm_unpacklo_epi16(a, b) : _mm_unpacklo_epi32(a, b);
}
inline __m128i unpack_hi(__m128i a, __m128i b, int w) {
  return w == 8 ? _mm_unpackhi_epi8(a, b) : w == 16 ? _mm_unpackhi_epi16(a, b) : _mm_unpackhi_epi32(a, b);
}
inline __m256i unpack_lo(__m256i a, __m256i b, int w) {
  return w == 8 ? _mm256_unpacklo_epi8(a, b) : w == 16 ? _mm256_unpacklo_epi16(a, b) : _mm256_unpacklo_epi32(a, b);
}
inline __m256i unpack_hi(__m256i a, __m256i b, int w) {
  return w == 8 ? _mm256_unpackhi_epi8(a, b) : w == 16 ? _mm256_unpackhi_epi16(a, b) : _mm256_unpackhi_epi32(a, b);
}
template <class V>
inline void transpose_bytes_8rows(const V x[8], V d[8]) {
  V a[8], e[8];
  for (int i = 0; i < 4; ++i) {  // rows 2i, 2i + 1: bytes 0-7, 8-15
    a[2 * i] = unpack_lo(x[2 * i], x[2 * i + 1], 8);
    a[2 * i + 1] = unpack_hi(x[2 * i], x[2 * i + 1], 8);
  }
  for (int g = 0; g < 2; ++g)  // rows 4g .. 4g + 3: bytes 0-3, 4-7, 8-11, 12-15
    for (int u = 0; u < 2; ++u) {
      e[4 * g + 2 * u] = unpack_lo(a[4 * g + u], a[4 * g + 2 + u], 16);
      e[4 * g + 2 * u + 1] = unpack_hi(a[4 * g + u], a[4 * g + 2 + u], 16);
    }
  for (int q = 0; q < 4; ++q) {
    d[2 * q] = unpack_lo(e[q], e[4 + q], 32);
    d[2 * q + 1] = unpack_hi(e[q], e[4 + q], 32);
  }
}

// Stores v, element 32c + e of 8 rows of a panel, at its place in the lane layout: lane plane e % 8, step
// 4c + e / 8 (wc = wl + 64c + 8h for rows 8h .. 8h + 7).
inline void lane_store(float* wc, int64_t K8, int e, __m256 v) { _mm256_store_ps(wc + ((e % 8) * K8 + e / 8) * 16, v); }

// lane_decode_pack_tiled for a tiled NVFP4 matrix: the panel is decoded straight in the lane order,
// k-major. Rows 8h .. 8h + 7 are two tiles, whose 16-byte chunks c sit side by side (64 bytes per
// tile); a byte transpose (three rounds of unpacks) turns the 8 chunks into 16 groups of 8 bytes, one
// per byte position b, the rows in order, and the low / high nibbles of group b are elements 32c + b /
// 32c + 16 + b of the 8 rows: one vector each of wl, after decode_tile's arithmetic (the code's value
// times two, sign-extended and converted, times the row's block scale). Speed: the decode-then-transpose
// form wrote each value twice and ran 24 shuffles per 64 values to transpose them.
void lane_pack_nvfp4_tiled(const m3::Linear& W, int64_t r, float* wl, const float* nvfp4_scales) {
  const int64_t K = W.K, K8 = K / 8, nc = K / 32, rb = int64_t(W.element_row_bytes());
  const __m128i m = _mm_set1_epi8(0x0f);
  constexpr int64_t kScaleChunks = 64;
  alignas(32) float sv[kScaleChunks][16];  // chunk c: the 8 rows' scales of block 2c, then of block 2c + 1
  for (int h = 0; h < 2; ++h) {
    const int64_t row0 = r + 8 * h;
    const uint8_t* t0 = W.w + size_t(row0) * rb;  // rows row0 .. row0 + 3
    const uint8_t* t1 = t0 + 4 * rb;              // rows row0 + 4 .. row0 + 7
    for (int64_t c0 = 0; c0 < nc; c0 += kScaleChunks) {
      const int64_t cn = std::min(kScaleChunks, nc - c0);
      for (int i = 0; i < 8; ++i) {
        const uint8_t* sc = W.scales + size_t(row0 + i) * (K / 16) + 2 * c0;
        for (int64_t c = 0; c < cn; ++c) sv[c][i] = nvfp4_scales[sc[2 * c]], sv[c][8 + i] = nvfp4_scales[sc[2 * c + 1]];
      }
      for (int64_t c = c0; c < c0 + cn; ++c) {
        __m128i x[8];
        for (int i = 0; i < 4; ++i) {
          x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t0 + c * 64 + 16 * i));
          x[4 + i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t1 + c * 64 + 16 * i));
        }
        __m128i d[8];
        transpose_bytes_8rows(x, d);
        const __m256 s_lo = _mm256_load_ps(sv[c - c0]), s_hi = _mm256_load_ps(sv[c - c0] + 8);
        float* const wc = wl + 4 * c * 16 + 8 * h;
#pragma GCC unroll 8
        for (int n = 0; n < 8; ++n) {
          const __m128i lo = e2m1_twice(_mm_and_si128(d[n], m)), hi = e2m1_twice(_mm_and_si128(_mm_srli_epi16(d[n], 4), m));
          lane_store(wc, K8, 2 * n, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), s_lo));
          lane_store(wc, K8, 2 * n + 1, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), s_lo));
          lane_store(wc, K8, 16 + 2 * n, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), s_hi));
          lane_store(wc, K8, 17 + 2 * n, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), s_hi));
        }
      }
    }
  }
}

// The same for a tiled MXFP8 matrix: chunk c of a row is its block c (32 bytes; 128 bytes per tile),
// transposed per 128-bit half (bytes 0-15 | 16-31), and each byte becomes decode_tile's value (the
// code as FP16 / 256, then times 2^8 times the block scale, or on rows with a code above 246 (`fast`
// false) times 2^8 and then the scale: a lane per row, so a pair of multiplies where any of the 8
// rows needs it, the other lanes' first factor being 1). Speed: as for NVFP4.
void lane_pack_mxfp8_tiled(const m3::Linear& W, int64_t r, float* wl, const bool* fast) {
  const int64_t K = W.K, K8 = K / 8, nc = K / 32, rb = int64_t(W.element_row_bytes());
  const __m256i z = _mm256_setzero_si256(), hm = _mm256_set1_epi16(int16_t(0xbf80));
  const float* e8 = e8m0_x256_table();
  constexpr int64_t kScaleChunks = 64;
  alignas(32) float sv[kScaleChunks][8];  // chunk c: the 8 rows' factors (2^8 x scale, or the scale)
  for (int h = 0; h < 2; ++h) {
    const int64_t row0 = r + 8 * h;
    const uint8_t* t0 = W.w + size_t(row0) * rb;
    const uint8_t* t1 = t0 + 4 * rb;
    bool slow = false;
    alignas(32) float kv[8];
    for (int i = 0; i < 8; ++i) slow |= !fast[8 * h + i], kv[i] = fast[8 * h + i] ? 1.0f : 256.0f;
    const __m256 k = _mm256_load_ps(kv);
    for (int64_t c0 = 0; c0 < nc; c0 += kScaleChunks) {
      const int64_t cn = std::min(kScaleChunks, nc - c0);
      for (int i = 0; i < 8; ++i) {
        const uint8_t* sc = W.scales + size_t(row0 + i) * nc + c0;
        for (int64_t c = 0; c < cn; ++c) sv[c][i] = fast[8 * h + i] ? e8[sc[c]] : m3::e8m0_to_float(sc[c]);
      }
      for (int64_t c = c0; c < c0 + cn; ++c) {
        __m256i x[8], d[8];
        for (int i = 0; i < 4; ++i) {
          x[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t0 + c * 128 + 32 * i));
          x[4 + i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t1 + c * 128 + 32 * i));
        }
        transpose_bytes_8rows(x, d);  // d[n]: bytes 2n, 2n + 1 | 16 + 2n, 17 + 2n
        const __m256 sc = _mm256_load_ps(sv[c - c0]);
        float* const wc = wl + 4 * c * 16 + 8 * h;
#pragma GCC unroll 8
        for (int n = 0; n < 8; ++n) {
          const __m256i ha = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, d[n]), 1), hm);
          const __m256i hb = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, d[n]), 1), hm);
          __m256 v[4] = {_mm256_cvtph_ps(_mm256_castsi256_si128(ha)), _mm256_cvtph_ps(_mm256_castsi256_si128(hb)),
                         _mm256_cvtph_ps(_mm256_extracti128_si256(ha, 1)), _mm256_cvtph_ps(_mm256_extracti128_si256(hb, 1))};
          const int e[4] = {2 * n, 2 * n + 1, 16 + 2 * n, 17 + 2 * n};
          for (int u = 0; u < 4; ++u) {
            if (slow) v[u] = _mm256_mul_ps(v[u], k);
            lane_store(wc, K8, e[u], _mm256_mul_ps(v[u], sc));
          }
        }
      }
    }
  }
}

// The same packing straight from a tiled matrix (Linear::tiled: MXFP8, NVFP4 or BF16, K % 32 == 0),
// without the decoded rows. Speed: the decoded panel's round trip through L2 (128 KB written and read
// again per 16 rows of a 2048-wide matrix) weighs most where each panel serves few tokens, as the
// experts' 64 (the first form of this packing, a decode into an L1 buffer and 8x8 float transposes,
// which BF16 keeps, already paid there). NVFP4 and MXFP8 are
// decoded in the lane order after a byte transpose (lane_pack_nvfp4_tiled, lane_pack_mxfp8_tiled).
// Every element gets decode_tile's arithmetic (NVFP4 block scales from nvfp4_scales, which holds
// decode_tile's per-block expression by code), so wl holds the same values. False (nothing written)
// for other layouts.
bool lane_decode_pack_tiled(const m3::Linear& W, int64_t r, float* wl, const float* nvfp4_scales) {
  const int64_t K = W.K, K8 = K / 8, rb = int64_t(W.element_row_bytes());
  if (!W.tiled || K % 32 != 0) return false;
  switch (W.kind) {
    case m3::LinearKind::NVFP4:
      if (!nvfp4_scales) return false;
      lane_pack_nvfp4_tiled(W, r, wl, nvfp4_scales);
      return true;
    case m3::LinearKind::MXFP8: {
      bool fast[16];  // rows whose scale codes allow the 2^8-folded block scale (mxfp8_row_fast)
      for (int i = 0; i < 16; ++i) fast[i] = mxfp8_row_fast(W.scales + size_t(r + i) * (K / 32), K / 32);
      lane_pack_mxfp8_tiled(W, r, wl, fast);
      return true;
    }
    case m3::LinearKind::BF16: break;
    default: return false;
  }
  // BF16: each 32-element chunk of 8 rows widened into a 1 KB buffer that stays in L1, then transposed
  // from there. Row ti's [k, k + 8) of a tile is at 4k + 8 ti.
  alignas(32) float tmp[8][32];
  for (int h = 0; h < 2; ++h)
    for (int64_t c = 0; c < K / 32; ++c) {
      for (int i = 0; i < 8; ++i) {
        const int64_t row = r + 8 * h + i;
        const uint16_t* hw = reinterpret_cast<const uint16_t*>(W.w + size_t(row & ~int64_t(3)) * rb);  // the row's tile
        const int ti = int(row & 3);
        for (int q = 0; q < 4; ++q) bf16x8_to_f32(hw + 4 * (32 * c + 8 * q) + 8 * ti, tmp[i] + 8 * q);
      }
      for (int q = 0; q < 4; ++q) {
        __m256 v[8];
        for (int i = 0; i < 8; ++i) v[i] = _mm256_load_ps(tmp[i] + 8 * q);
        transpose8(v);
        const int64_t m = 4 * c + q;
        for (int j = 0; j < 8; ++j) _mm256_store_ps(wl + (j * K8 + m) * 16 + 8 * h, v[j]);
      }
    }
  return true;
}

// c[u * 16 + i] = (kFirst ? +0 : c[u * 16 + i]) followed by fma(xp[6m + u], wl[16m + i], .) for m = 0 .. M - 1:
// one lane's sums for 6 tokens x 16 rows over M steps.
template <bool kFirst>
inline void lane_block_6x16(const float* __restrict xp, const float* __restrict wl, int64_t M, float* __restrict c) {
  __m256 a[kLaneTokens][2];
#pragma GCC unroll 6
  for (int u = 0; u < kLaneTokens; ++u)
    for (int h = 0; h < 2; ++h) a[u][h] = kFirst ? _mm256_setzero_ps() : _mm256_load_ps(c + u * 16 + 8 * h);
  for (int64_t m = 0; m < M; ++m) {
    const __m256 w0 = _mm256_load_ps(wl + 16 * m), w1 = _mm256_load_ps(wl + 16 * m + 8);
#pragma GCC unroll 6
    for (int u = 0; u < kLaneTokens; ++u) {
      const __m256 b = _mm256_broadcast_ss(xp + kLaneTokens * m + u);
      a[u][0] = _mm256_fmadd_ps(b, w0, a[u][0]);
      a[u][1] = _mm256_fmadd_ps(b, w1, a[u][1]);
    }
  }
#pragma GCC unroll 6
  for (int u = 0; u < kLaneTokens; ++u)
    for (int h = 0; h < 2; ++h) _mm256_store_ps(c + u * 16 + 8 * h, a[u][h]);
}

// Per-thread buffers of the lane GEMM (grown only).
struct LaneScratch {
  m3::AlignedVector<float> rows, wl, sums;
  void reserve(int64_t K) {
    const size_t n = size_t(kLaneRows * K);
    if (rows.size() < n) rows.resize(n), wl.resize(n);
    if (sums.empty()) sums.resize(size_t(kLaneChunkGroups * 8 * kLaneSumFloats));
  }
};

// Adds up the lane sums of token groups [g0, g0 + ng) (sums[(g * 8 + j) * kLaneSumFloats + u * 16 + i]
// for group g0 + g, lane j, token u, row i) in hsum8's order, applies the K % 8 tail from the panel's
// decoded rows, and stores each token's 16 outputs at y[t * N + i].
void lane_add_sums(const LaneX& p, const float* sums, int64_t ng, int64_t g0, const float* rows, int64_t K, float* y,
                   int64_t N) {
  for (int64_t g = 0; g < ng; ++g)
    for (int u = 0; u < kLaneTokens; ++u) {
      const int64_t t = (g0 + g) * kLaneTokens + u;
      if (t >= p.T) return;
      for (int h = 0; h < 2; ++h) {
        const float* c = sums + g * 8 * kLaneSumFloats + u * 16 + 8 * h;  // lane j's sums at c + j * kLaneSumFloats
        auto lane = [&](int j) { return _mm256_load_ps(c + j * kLaneSumFloats); };
        __m256 v = _mm256_setzero_ps();  // K < 8: hsum8 of zero accumulators
        if (p.K8 > 0)
          v = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(lane(0), lane(4)), _mm256_add_ps(lane(2), lane(6))),
                            _mm256_add_ps(_mm256_add_ps(lane(1), lane(5)), _mm256_add_ps(lane(3), lane(7))));
        float* yt = y + t * N + 8 * h;
        if (K % 8 == 0) {
          _mm256_storeu_ps(yt, v);
          continue;
        }
        // The tail as dot_rows4_x3 does it: one explicit fma per element, in element order.
        alignas(32) float o[8];
        _mm256_store_ps(o, v);
        for (int i = 0; i < 8; ++i)
          for (int64_t k = 8 * p.K8; k < K; ++k) o[i] = std::fma(p.x[t * K + k], rows[(8 * h + i) * K + k], o[i]);
        std::memcpy(yt, o, sizeof o);
      }
    }
}

// y rows [r, r + 16) (four whole tiles) for every token of p: the panel is decoded and packed once,
// then each chunk of token groups runs lane by lane over it (one lane's 16 KB weight block stays in L1
// while the groups' activations stream past), and its lane sums are added up.
// nvfp4_scales: decode_tile's NVFP4 block scales by code (nvfp4_block_scales; nullptr for other formats).
void lane_panel(const m3::Linear& W, const LaneX& p, float* y, int64_t r, LaneScratch& s, const float* nvfp4_scales) {
  const int64_t K = W.K, N = W.N, K8 = p.K8, G = p.G;
  float *rows = s.rows.data(), *wl = s.wl.data(), *sums = s.sums.data();
  if (!lane_decode_pack_tiled(W, r, wl, nvfp4_scales)) {
    for (int i = 0; i < kLaneRows / m3::kLinearTileRows; ++i)
      decode_tile(W, r + i * m3::kLinearTileRows, rows + i * m3::kLinearTileRows * K);
    lane_pack_w(rows, K, wl);
  }
  for (int64_t g0 = 0; g0 < G; g0 += kLaneChunkGroups) {
    const int64_t ng = std::min(kLaneChunkGroups, G - g0);
    for (int j = 0; j < 8; ++j)
      for (int64_t m0 = 0; m0 < K8; m0 += kLaneSteps) {
        const int64_t mm = std::min(kLaneSteps, K8 - m0);
        const float* wj = wl + (j * K8 + m0) * kLaneRows;
        for (int64_t g = 0; g < ng; ++g) {
          const float* xg = p.block(j, g0 + g) + kLaneTokens * m0;
          float* c = sums + (g * 8 + j) * kLaneSumFloats;
          if (m0 == 0)
            lane_block_6x16<true>(xg, wj, mm, c);
          else
            lane_block_6x16<false>(xg, wj, mm, c);
        }
      }
    lane_add_sums(p, sums, ng, g0, rows, K, y + r, N);
  }
}

// y rows [r0, r1) (whole panels) for every token of p.
void lane_rows(const m3::Linear& W, const LaneX& p, float* y, int64_t r0, int64_t r1, const float* nvfp4_scales) {
  static thread_local LaneScratch scratch;
  scratch.reserve(W.K);
  for (int64_t r = r0; r < r1; r += kLaneRows) lane_panel(W, p, y, r, scratch, nvfp4_scales);
}

}  // namespace
}  // namespace m3::cpu
