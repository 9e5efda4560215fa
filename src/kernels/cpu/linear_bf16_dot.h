// MXFP8 and NVFP4 matmuls with BF16 activations (the opt-in `--mxfp8-activations bf16` and
// `--nvfp4-activations bf16`, Linear::act_bf16) on CPUs with AVX512-BF16 (linear_avx512.cpp
// only; every function that uses BF16 instructions carries the target attribute
// and runs only where bf16_dot_available() holds). Steps of up to kBf16DotMaxTokens tokens decode the
// tiles in registers (bf16_dot_rows); more tokens go through panels of tiles
// decoded once to BF16 words (bf16_panel_rows).
//
// MXFP8. An E4M3 code is exactly a BF16 value (3 mantissa bits, exponents 2^-9..2^8), so a 32-code block of
// a row is one 512-bit vector of BF16 words and one vdpbf16ps multiplies it by the token's 32
// activations rounded to BF16 (products exact in fp32, sums in fp32), leaving per lane the sum of two
// products; the block's E8M0 scale (a power of two, exact) multiplies that block sum into the row's
// accumulator with one FMA per lane. Per 64 weights (two rows of a block): two byte-table lookups and
// an OR form the BF16 bytes, two unpacks the words, then per token two vdpbf16ps and one FMA, against
// the exact kernel's four byte permutes, four multiplies and four FMAs (Mxfp8Tile). A decode step bound
// by memory gains little from it; the products of a prefill gain most (docs/benchmarks.md section 5).
//
// Layout read: the tiled MXFP8 bytes (Linear::tiled; chunk b of a 4-row tile = block b, row i's 32
// codes at 32i), so rows 2p and 2p + 1 of a tile ("pair" p) are one 64-byte load. After the unpacks
// the words are in the order of 128-bit lanes: unpacklo holds codes {0..7, 16..23} of row 2p, then the
// same codes of row 2p + 1; unpackhi codes {8..15, 24..31} of each. The activations are laid out to
// match (bf16_dot_pack_x): per token and block, 32 words for the unpacklo vector and 32 for unpackhi.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <immintrin.h>

#include "base/aligned_vector.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_avx512.h"
#include "kernels/cpu/simd_avx2.h"

#if !defined(M3_KERNELS_AVX512)
#error "linear_bf16_dot.h needs the M3_KERNELS_AVX512 compiler flags (see CMakeLists.txt)"
#endif

namespace m3::cpu {
namespace {

#define M3_BF16_DOT_TARGET __attribute__((target("avx512bf16")))

// Whether this CPU runs vdpbf16ps (the avx512 build's other extensions are already required).
inline bool bf16_dot_available() {
  return m3::cpu_features().avx512bf16;
}

// The high and low bytes of the BF16 word of E4M3 magnitude codes 0..127 (code 0x7f, NaN, as the quiet
// BF16 NaN 0x7fc0); the sign bit is ORed in from the code.
struct E4m3Bf16Bytes {
  alignas(64) uint8_t hi[128];
  alignas(64) uint8_t lo[128];
  E4m3Bf16Bytes() {
    for (int c = 0; c < 128; ++c) {
      const int e = c >> 3, m = c & 7;
      const float v = e ? std::ldexp(1.0f + float(m) / 8, e - 7) : std::ldexp(float(m) / 8, -6);
      uint32_t u;
      std::memcpy(&u, &v, 4);
      const uint16_t w = c == 0x7f ? uint16_t(0x7fc0) : uint16_t(u >> 16);  // exact: low 16 bits are zero
      hi[c] = uint8_t(w >> 8);
      lo[c] = uint8_t(w & 0xff);
    }
  }
};
inline const E4m3Bf16Bytes& e4m3_bf16_bytes() {
  static const E4m3Bf16Bytes t;
  return t;
}

// Whether the one-step BF16-dot kernels take W for T tokens: tiled, act_bf16, at most kBf16DotMaxTokens
// tokens (more go through the panels), NVFP4, or MXFP8 with block scales that are normal floats (codes
// 1..254: 2^(code - 127) is then the float with exponent field `code`). Up to that many tokens this is
// faster from memory than the panels, and no slower in cache.
constexpr int64_t kBf16DotMaxTokens = 12;
inline bool bf16_dot_applies(const m3::Linear& W, int64_t T) {
  if (!W.act_bf16 || !W.tiled || W.N < m3::kLinearTileRows || T > kBf16DotMaxTokens || !bf16_dot_available())
    return false;
  return W.kind == m3::LinearKind::NVFP4 || (W.kind == m3::LinearKind::MXFP8 && W.scale_lo >= 1 && W.scale_hi <= 254);
}

// The top halves (BF16 words) of p[0, 32) in element order (p already rounded to BF16).
inline __m512i bf16_words32(const float* p) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_loadu_si512(p), 16))),
      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_loadu_si512(p + 16), 16)), 1);
}

// The activations (already rounded to BF16, as floats: their low 16 bits are zero) in the order the
// kernel reads them: for token t and block b, at out + (t * K / 32 + b) * 64, the words of elements
// {0..7, 16..23} twice (both rows of a pair), then of {8..15, 24..31} twice. (Speed: a scalar loop took
// as long as the kernel's 128 rows.)
constexpr std::array<int16_t, 32> bf16_dot_x_order(int h) {
  std::array<int16_t, 32> a{};
  for (int w = 0; w < 32; ++w) a[size_t(w)] = int16_t(16 * ((w / 8) % 2) + 8 * h + w % 8);
  return a;
}
constexpr std::array<int16_t, 32> kBf16DotXLo = bf16_dot_x_order(0), kBf16DotXHi = bf16_dot_x_order(1);
inline void bf16_dot_pack_x(const float* xr, int64_t T, int64_t K, uint16_t* out) {
  const __m512i lo = _mm512_loadu_si512(kBf16DotXLo.data()), hi = _mm512_loadu_si512(kBf16DotXHi.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < K / 32; ++b) {
      const __m512i w = bf16_words32(xr + t * K + b * 32);
      uint16_t* o = out + (t * (K / 32) + b) * 64;
      _mm512_store_si512(o, _mm512_permutexvar_epi16(lo, w));
      _mm512_store_si512(o + 32, _mm512_permutexvar_epi16(hi, w));
    }
}

// Rows 8 at a time (two tiles, four pairs) for NT tokens: acc[p][t] holds rows 2p, 2p + 1 of the two
// tiles (lanes 0..7, 8..15), each lane the sum of its products in block order.
template <int NT>
M3_BF16_DOT_TARGET inline void mxfp8_bf16_two_tiles(const uint8_t* q0, const uint8_t* q1, const uint8_t* sc0,
                                                    const uint8_t* sc1, int64_t nb, const uint16_t* xp, float* y,
                                                    int64_t N, TilePrefetch pf) {
  const E4m3Bf16Bytes& tb = e4m3_bf16_bytes();
  const __m512i th0 = _mm512_load_si512(tb.hi), th1 = _mm512_load_si512(tb.hi + 64);
  const __m512i tl0 = _mm512_load_si512(tb.lo), tl1 = _mm512_load_si512(tb.lo + 64);
  const __m512i sign = _mm512_set1_epi8(char(0x80));
  __m512 acc[4][NT];
  for (int p = 0; p < 4; ++p)
    for (int t = 0; t < NT; ++t) acc[p][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    pf.lines(4);
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m512i c = _mm512_loadu_si512((p < 2 ? q0 : q1) + b * 128 + 64 * (p & 1));
      // hi | (c & 0x80): the sign bit from the code (vpermi2b reads index bits 0..6 only).
      const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(th0, c, th1), c, sign, 0xf8);
      const __m512i lo = _mm512_permutex2var_epi8(tl0, c, tl1);
      const __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
      const uint8_t* s = (p < 2 ? sc0 : sc1) + 2 * (p & 1) * nb + b;  // the pair's first row's scale code
      const __m512 f = _mm512_castsi512_ps(
          _mm512_mask_set1_epi32(_mm512_set1_epi32(int(s[0]) << 23), 0xff00, int(s[nb]) << 23));
#pragma GCC unroll 6
      for (int t = 0; t < NT; ++t) {
        const uint16_t* xb = xp + (t * nb + b) * 64;
        __m512 d = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)w0, (__m512bh)_mm512_load_si512(xb));
        d = _mm512_dpbf16_ps(d, (__m512bh)w1, (__m512bh)_mm512_load_si512(xb + 32));
        acc[p][t] = _mm512_fmadd_ps(d, f, acc[p][t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int p = 0; p < 4; ++p) {
      const int r = 4 * (p >> 1) + 2 * (p & 1);
      y[t * N + r] = _mm512_mask_reduce_add_ps(0x00ff, acc[p][t]);
      y[t * N + r + 1] = _mm512_mask_reduce_add_ps(0xff00, acc[p][t]);
    }
}

// Steps of more tokens (prefill, kBf16DotMaxTokens + 1 or more): panels of tiles decoded once to BF16
// words (NVFP4: nvfp4_bf16_panel_tile below); MXFP8 with the block scale folded in (an E4M3 value times 2^(code - 127) is a BF16 value: the code
// is added to the exponent field of every nonzero word, exact while the products stay normal and
// finite, which scale codes 10..246 guarantee for every E4M3 magnitude 2^-9..448), each row's block in
// the order {0..7, 16..23, 8..15, 24..31}; then per 4 rows and up to 6 tokens, one vdpbf16ps per row,
// token and block (32 multiply-adds, against two FMAs of 16 in the fp32 panels). Each row and token
// ends as the sum of its 16 lanes.
constexpr int kBf16PanelScaleLo = 10, kBf16PanelScaleHi = 246;
inline bool bf16_panel_applies(const m3::Linear& W, int64_t T) {
  if (!W.act_bf16 || !W.tiled || W.N < m3::kLinearTileRows || T <= kBf16DotMaxTokens || !bf16_dot_available())
    return false;
  return W.kind == m3::LinearKind::NVFP4 ||
         (W.kind == m3::LinearKind::MXFP8 && W.scale_lo >= kBf16PanelScaleLo && W.scale_hi <= kBf16PanelScaleHi);
}

// x (rounded to BF16) as the panel rows order it: per token and block, the words of elements {0..7,
// 16..23, 8..15, 24..31}.
constexpr std::array<int16_t, 32> kBf16PanelXOrder = [] {
  std::array<int16_t, 32> a{};
  for (int w = 0; w < 32; ++w) a[size_t(w)] = int16_t(8 * (w / 8 == 1 ? 2 : w / 8 == 2 ? 1 : w / 8) + w % 8);
  return a;
}();
inline void bf16_panel_pack_x(const float* xr, int64_t T, int64_t K, uint16_t* out) {
  const __m512i ord = _mm512_loadu_si512(kBf16PanelXOrder.data());
  for (int64_t i = 0; i < T * K; i += 32) _mm512_store_si512(out + i, _mm512_permutexvar_epi16(ord, bf16_words32(xr + i)));
}

// Tile t of W (4 rows) to BF16 panel rows at out (row i at out + i * K), scales folded in; prefetches
// the next tile when `more`.
M3_BF16_DOT_TARGET inline void mxfp8_bf16_panel_tile(const m3::Linear& W, int64_t r, uint16_t* out, bool more) {
  const int64_t K = W.K, nb = K / 32;
  const E4m3Bf16Bytes& tb = e4m3_bf16_bytes();
  const __m512i th0 = _mm512_load_si512(tb.hi), th1 = _mm512_load_si512(tb.hi + 64);
  const __m512i tl0 = _mm512_load_si512(tb.lo), tl1 = _mm512_load_si512(tb.lo + 64);
  const __m512i sign = _mm512_set1_epi8(char(0x80)), mag = _mm512_set1_epi16(0x7fff), nan = _mm512_set1_epi16(0x7f80);
  const uint8_t* q = W.w + size_t(r) * size_t(K);
  const uint8_t* sc = W.scales + size_t(r) * size_t(nb);
  TilePrefetch pf(q + 4 * K, more ? size_t(4 * K) : 0);
  for (int64_t b = 0; b < nb; ++b) {
    pf.lines(2);
    for (int p = 0; p < 2; ++p) {
      const __m512i c = _mm512_loadu_si512(q + b * 128 + 64 * p);
      const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(th0, c, th1), c, sign, 0xf8);
      const __m512i lo = _mm512_permutex2var_epi8(tl0, c, tl1);
      const __m512i u0 = _mm512_unpacklo_epi8(lo, hi), u1 = _mm512_unpackhi_epi8(lo, hi);
      for (int h = 0; h < 2; ++h) {  // row 2p + h: lanes 2h, 2h + 1 of each unpack
        const __m512i w = h ? _mm512_shuffle_i64x2(u0, u1, _MM_SHUFFLE(3, 2, 3, 2))
                            : _mm512_shuffle_i64x2(u0, u1, _MM_SHUFFLE(1, 0, 1, 0));
        const int code = sc[(2 * p + h) * nb + b];
        // Nonzero and finite words only: zeros stay zero, NaN codes (0x7fc0) stay NaN.
        const __m512i m = _mm512_and_si512(w, mag);
        const __mmask32 finite = _mm512_test_epi16_mask(m, m) & _mm512_cmplt_epu16_mask(m, nan);
        const __m512i scaled = _mm512_mask_add_epi16(w, finite, w, _mm512_set1_epi16(int16_t((code - 127) << 7)));
        _mm512_storeu_si512(out + (2 * p + h) * K + b * 32, scaled);
      }
    }
  }
}

// Four rows' sums (a[i]: row i's 16 lanes) as one 128-bit vector, row i in lane i.
M3_BF16_DOT_TARGET inline __m128 sum4_rows(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m256 b0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm512_extractf32x8_ps(a0, 1));
  const __m256 b1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm512_extractf32x8_ps(a1, 1));
  const __m256 b2 = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm512_extractf32x8_ps(a2, 1));
  const __m256 b3 = _mm256_add_ps(_mm512_castps512_ps256(a3), _mm512_extractf32x8_ps(a3, 1));
  const __m256 c01 = _mm256_hadd_ps(b0, b1), c23 = _mm256_hadd_ps(b2, b3);  // per 128-bit half: 0 0 1 1 | ...
  const __m256 d = _mm256_hadd_ps(c01, c23);                                  // 0 1 2 3 | 0 1 2 3
  return _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
}

// 4 panel rows (w, K apart) times NT tokens (xq: rows K apart): y[t * N + i], each sum divided by div.
template <int NT>
M3_BF16_DOT_TARGET inline void bf16_panel_rows4(const uint16_t* w, const uint16_t* xq, int64_t K, float div, float* y,
                                                int64_t N) {
  __m512 acc[4][NT];
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < NT; ++t) acc[i][t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    __m512i wv[4];
    for (int i = 0; i < 4; ++i) wv[i] = _mm512_loadu_si512(w + i * K + k);
#pragma GCC unroll 6
    for (int t = 0; t < NT; ++t) {
      const __m512i xv = _mm512_load_si512(xq + t * K + k);
      for (int i = 0; i < 4; ++i) acc[i][t] = _mm512_dpbf16_ps(acc[i][t], (__m512bh)wv[i], (__m512bh)xv);
    }
  }
  const __m128 d = _mm_set1_ps(div);
  for (int t = 0; t < NT; ++t) {
    const __m128 r = sum4_rows(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
    _mm_storeu_ps(y + t * N, div == 1.0f ? r : _mm_div_ps(r, d));
  }
}

// NVFP4 (`--nvfp4-activations bf16`). An E2M1 value times its block's E4M3 scale is a BF16 value (at
// most 2 + 4 significant bits), so a 16-entry table of BF16 words per scale code (kNvfp4Bf16Table) turns
// a block's codes into its weights with one word permute (vpermw, two blocks per vector, one table in
// each half); the tensor's global divisor divides each output. Tiled chunk c of a row: 16 bytes, byte j's
// low nibble element j (block 2c), high nibble element 16 + j (block 2c + 1).
struct Nvfp4Bf16Table {
  alignas(64) uint16_t w[256 * 16];
  Nvfp4Bf16Table() {
    static constexpr float kE2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 256; ++c) {
      const int e = (c >> 3) & 15, m = c & 7;
      float s = e ? std::ldexp(1.0f + float(m) / 8, e - 7) : std::ldexp(float(m) / 8, -6);
      if ((c & 0x7f) == 0x7f) s = std::numeric_limits<float>::quiet_NaN();
      if (c & 0x80) s = -s;
      for (int k = 0; k < 16; ++k) {
        const float v = (k & 8 ? -kE2m1[k & 7] : kE2m1[k & 7]) * s;  // exact in BF16
        uint32_t u;
        std::memcpy(&u, &v, 4);
        w[16 * c + k] = std::isnan(v) ? uint16_t(0x7fc0) : uint16_t(u >> 16);
      }
    }
  }
};
inline const uint16_t* nvfp4_bf16_table() {
  static const Nvfp4Bf16Table t;
  return t.w;
}
// The tables of scale codes a (low half) and b (high half) as one vector.
inline __m512i nvfp4_bf16_tables(const uint16_t* tab, int a, int b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(tab + 16 * a))),
                            _mm256_load_si256(reinterpret_cast<const __m256i*>(tab + 16 * b)), 1);
}

// x (rounded) for nvfp4_bf16_two_tiles: per token and 32-element chunk, elements 0..15 twice (both rows
// of a pair), then 16..31 twice.
inline void nvfp4_bf16_dot_pack_x(const float* xr, int64_t T, int64_t K, uint16_t* out) {
  for (int64_t i = 0; i < T * K; i += 32) {
    const __m512i w = bf16_words32(xr + i);
    _mm512_store_si512(out + 2 * i, _mm512_shuffle_i64x2(w, w, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm512_store_si512(out + 2 * i + 32, _mm512_shuffle_i64x2(w, w, _MM_SHUFFLE(3, 2, 3, 2)));
  }
}

// Rows 8 at a time (two tiles, four pairs) for NT tokens, as mxfp8_bf16_two_tiles; sc0 / sc1: the
// tiles' first rows' scale codes (rows K / 16 apart).
template <int NT>
M3_BF16_DOT_TARGET inline void nvfp4_bf16_two_tiles(const uint8_t* q0, const uint8_t* q1, const uint8_t* sc0,
                                                    const uint8_t* sc1, int64_t K, float div, const uint16_t* xp,
                                                    float* y, int64_t N, TilePrefetch pf) {
  const uint16_t* tab = nvfp4_bf16_table();
  const int64_t nb = K / 16, chunks = K / 32;
  const __m512i m = _mm512_set1_epi16(0x0f);
  const __m512i up = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1);  // words 16..31
  __m512 acc[4][NT];
  for (int p = 0; p < 4; ++p)
    for (int t = 0; t < NT; ++t) acc[p][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    pf.lines(2);
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m512i w = _mm512_cvtepu8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>((p < 2 ? q0 : q1) + c * 64 + 32 * (p & 1))));
      const __m512i il = _mm512_ternarylogic_epi32(w, m, up, 0xea);  // (w & 0x0f) | up
      const __m512i ih = _mm512_or_si512(_mm512_srli_epi16(w, 4), up);
      const uint8_t* s = (p < 2 ? sc0 : sc1) + 2 * (p & 1) * nb + 2 * c;  // row 2p's codes of blocks 2c, 2c + 1
      const __m512i wl = _mm512_permutexvar_epi16(il, nvfp4_bf16_tables(tab, s[0], s[nb]));
      const __m512i wh = _mm512_permutexvar_epi16(ih, nvfp4_bf16_tables(tab, s[1], s[nb + 1]));
#pragma GCC unroll 6
      for (int t = 0; t < NT; ++t) {
        const uint16_t* xb = xp + (t * chunks + c) * 64;
        acc[p][t] = _mm512_dpbf16_ps(acc[p][t], (__m512bh)wl, (__m512bh)_mm512_load_si512(xb));
        acc[p][t] = _mm512_dpbf16_ps(acc[p][t], (__m512bh)wh, (__m512bh)_mm512_load_si512(xb + 32));
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int p = 0; p < 4; ++p) {
      const int r = 4 * (p >> 1) + 2 * (p & 1);
      y[t * N + r] = _mm512_mask_reduce_add_ps(0x00ff, acc[p][t]) / div;
      y[t * N + r + 1] = _mm512_mask_reduce_add_ps(0xff00, acc[p][t]) / div;
    }
}

// The two-tile kernel of W's format for NT tokens.
template <int NT>
M3_BF16_DOT_TARGET inline void bf16_two_tiles(const m3::Linear& W, const uint8_t* q0, const uint8_t* q1,
                                              const uint8_t* sc0, const uint8_t* sc1, const uint16_t* xp, float* y,
                                              int64_t N, TilePrefetch pf) {
  if (W.kind == m3::LinearKind::NVFP4)
    nvfp4_bf16_two_tiles<NT>(q0, q1, sc0, sc1, W.K, W.global_div, xp, y, N, pf);
  else
    mxfp8_bf16_two_tiles<NT>(q0, q1, sc0, sc1, W.K / 32, xp, y, N, pf);
}

// Full tiles [r0, r1) of an MXFP8 or NVFP4 W (bf16_dot_applies(W, T)) for T tokens with activations xp
// (bf16_dot_pack_x / nvfp4_bf16_dot_pack_x: 2K words per token), two tiles at a time in groups of up to
// three tokens; a last single tile runs as a pair with itself and keeps its first half.
M3_BF16_DOT_TARGET void bf16_dot_rows(const m3::Linear& W, const uint16_t* xp, int64_t T, float* y, int64_t r0,
                                      int64_t r1, int64_t pf_end) {
  constexpr int64_t tr = m3::kLinearTileRows;
  const int64_t N = W.N;
  const size_t eb = W.element_row_bytes(), sb = W.row_bytes() - eb;  // per row: codes, scale codes
  for (int64_t r = r0; r < r1; r += 2 * tr) {
    const bool two = r + 2 * tr <= r1;
    const uint8_t* q0 = W.w + size_t(r) * eb;
    const uint8_t* q1 = two ? q0 + tr * eb : q0;
    const uint8_t* sc0 = W.scales + size_t(r) * sb;
    const uint8_t* sc1 = two ? sc0 + tr * sb : sc0;
    const bool more = r + 4 * tr <= pf_end;
    TilePrefetch pf(q0 + 2 * tr * eb, more ? 2 * tr * eb : 0);
    if (more) prefetch_range(sc0 + 2 * tr * sb, 2 * tr * sb);
    alignas(64) float tmp[kBf16DotMaxTokens * 8];  // a lone tile's results (rows 4..7 repeat rows 0..3)
    float* out = two ? y + r : tmp;
    const int64_t ld = two ? N : 8;
    for (int64_t t = 0; t < T;) {
      const int64_t nt = std::min<int64_t>(3, T - t);
      const uint16_t* xt = xp + t * 2 * W.K;
      float* yt = out + t * ld;
      switch (nt) {
        case 3: bf16_two_tiles<3>(W, q0, q1, sc0, sc1, xt, yt, ld, pf); break;
        case 2: bf16_two_tiles<2>(W, q0, q1, sc0, sc1, xt, yt, ld, pf); break;
        default: bf16_two_tiles<1>(W, q0, q1, sc0, sc1, xt, yt, ld, pf); break;
      }
      pf = TilePrefetch(q0, 0);  // the next tiles are on their way after the first group
      t += nt;
    }
    if (!two)
      for (int64_t t = 0; t < T; ++t)
        for (int i = 0; i < 4; ++i) y[t * N + r + i] = tmp[t * 8 + i];
  }
}

// Tile r of an NVFP4 W to BF16 panel rows (row i at out + i * K, elements in order); prefetches the
// next tile when `more`.
M3_BF16_DOT_TARGET inline void nvfp4_bf16_panel_tile(const m3::Linear& W, int64_t r, uint16_t* out, bool more) {
  const int64_t K = W.K, nb = K / 16;
  const uint16_t* tab = nvfp4_bf16_table();
  const __m512i m = _mm512_set1_epi16(0x0f);
  const __m512i up = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1);
  const uint8_t* q = W.w + size_t(r) * size_t(K / 2);
  const uint8_t* sc = W.scales + size_t(r) * size_t(nb);
  TilePrefetch pf(q + 2 * K, more ? size_t(2 * K) : 0);
  for (int64_t c = 0; c < K / 32; ++c) {
    pf.lines(1);
    for (int p = 0; p < 2; ++p) {
      const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + c * 64 + 32 * p)));
      const __m512i lo = _mm512_and_si512(w, m), hi = _mm512_srli_epi16(w, 4);
      for (int h = 0; h < 2; ++h) {  // row 2p + h: its low nibbles (elements 0..15), then its high ones
        const __m512i ix = _mm512_or_si512(h ? _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2))
                                             : _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)),
                                           up);
        const uint8_t* s = sc + (2 * p + h) * nb + 2 * c;
        _mm512_storeu_si512(out + (2 * p + h) * K + c * 32, _mm512_permutexvar_epi16(ix, nvfp4_bf16_tables(tab, s[0], s[1])));
      }
    }
  }
}

// x (rounded) for the NVFP4 panels: BF16 words in element order.
inline void nvfp4_bf16_panel_pack_x(const float* xr, int64_t T, int64_t K, uint16_t* out) {
  for (int64_t i = 0; i < T * K; i += 32) _mm512_store_si512(out + i, bf16_words32(xr + i));
}

// Full tiles [r0, r1) (bf16_panel_applies(W, T)) for T tokens, x packed by bf16_panel_pack_x (MXFP8) or
// nvfp4_bf16_panel_pack_x.
M3_BF16_DOT_TARGET void bf16_panel_rows(const m3::Linear& W, const uint16_t* xq, int64_t T, float* y,
                                               int64_t r0, int64_t r1) {
  constexpr int64_t tr = m3::kLinearTileRows;
  const int64_t K = W.K, N = W.N;
  const int64_t kTiles = std::clamp<int64_t>(65536 / K, 2, 16);  // a panel of at most 256 KiB (K >= 2048)
  static thread_local m3::AlignedVector<uint16_t> panel;         // grown on demand
  if (panel.size() < size_t(kTiles * tr * K)) panel.resize(size_t(kTiles * tr * K));
  for (int64_t p0 = r0; p0 < r1; p0 += kTiles * tr) {
    const int64_t np = std::min(kTiles, (r1 - p0) / tr);
    for (int64_t q = 0; q < np; ++q) {
      const bool more = p0 + (q + 2) * tr <= r1;  // a next full tile in this range
      if (W.kind == m3::LinearKind::NVFP4)
        nvfp4_bf16_panel_tile(W, p0 + q * tr, panel.data() + q * tr * K, more);
      else
        mxfp8_bf16_panel_tile(W, p0 + q * tr, panel.data() + q * tr * K, more);
    }
    const float div = W.kind == m3::LinearKind::NVFP4 ? W.global_div : 1.0f;
    for (int64_t t = 0; t < T;) {
      const int64_t nt = std::min<int64_t>(6, T - t);
      for (int64_t q = 0; q < np; ++q) {
        const uint16_t* w = panel.data() + q * tr * K;
        const uint16_t* xt = xq + t * K;
        float* yt = y + t * N + p0 + q * tr;
        switch (nt) {
          case 6: bf16_panel_rows4<6>(w, xt, K, div, yt, N); break;
          case 5: bf16_panel_rows4<5>(w, xt, K, div, yt, N); break;
          case 4: bf16_panel_rows4<4>(w, xt, K, div, yt, N); break;
          case 3: bf16_panel_rows4<3>(w, xt, K, div, yt, N); break;
          case 2: bf16_panel_rows4<2>(w, xt, K, div, yt, N); break;
          default: bf16_panel_rows4<1>(w, xt, K, div, yt, N); break;
        }
      }
      t += nt;
    }
  }
}

}  // namespace
}  // namespace m3::cpu
