// The AVX2 matmul kernels (avx2 and avx512 builds): the one-token decode step and steps of a few
// tokens over 4-row tiles of MXFP8, NVFP4 and BF16 weights decoded in registers, and the
// register-blocked dot products over decoded fp32 tiles.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>
#include <immintrin.h>

#include "formats/dtype.h"
#include "kernels/cpu/element_tables.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/simd_avx2.h"

#if !defined(M3_KERNELS_AVX2)
#error "linear_avx2.h needs the M3_KERNELS_AVX2 compiler flags (see CMakeLists.txt)"
#endif

namespace m3::cpu {
namespace {

// 2^8 x the E8M0 block scale, by code. (v/256) * (256 s) rounds exactly like the reference
// (v * s): 256 s is exact for codes up to 246; rows holding a larger code (never produced by real
// checkpoints) take the two-multiply path, so the per-block loop has no branch.
struct E8m0x256 {
  float v[256];
  E8m0x256() {
    for (int c = 0; c < 256; ++c) v[c] = c <= 246 ? m3::bits_to_float(uint32_t(c + 8) << 23) : 0.f;
  }
};
inline const float* e8m0_x256_table() {
  static const E8m0x256 t;
  return t.v;
}
inline bool mxfp8_row_fast(const uint8_t* sc, int64_t nb) {
  uint8_t mx = 0;
  for (int64_t b = 0; b < nb; ++b) mx = std::max(mx, sc[b]);
  return mx <= 246;
}

// One 32-element block decoded to fp32, four vectors in element order, times `s`; `k` is 1 on the
// fast path, 2^8 on the slow one (then `s` is the plain scale).
#define M3_MXFP8_BLOCK(q, s, k, SLOW)                                                              \
  __m256 w0, w1, w2, w3;                                                                           \
  {                                                                                                \
    __m256i ha_, hb_;                                                                              \
    e4m3x32_to_h(q, ha_, hb_);                                                                     \
    w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(ha_));                                            \
    w1 = _mm256_cvtph_ps(_mm256_castsi256_si128(hb_));                                            \
    w2 = _mm256_cvtph_ps(_mm256_extracti128_si256(ha_, 1));                                       \
    w3 = _mm256_cvtph_ps(_mm256_extracti128_si256(hb_, 1));                                       \
    if (SLOW) {                                                                                    \
      w0 = _mm256_mul_ps(w0, k);                                                                   \
      w1 = _mm256_mul_ps(w1, k);                                                                   \
      w2 = _mm256_mul_ps(w2, k);                                                                   \
      w3 = _mm256_mul_ps(w3, k);                                                                   \
    }                                                                                              \
    w0 = _mm256_mul_ps(w0, s);                                                                     \
    w1 = _mm256_mul_ps(w1, s);                                                                     \
    w2 = _mm256_mul_ps(w2, s);                                                                     \
    w3 = _mm256_mul_ps(w3, s);                                                                     \
  }

// Row of K/32 blocks decoded to fp32 (the batched path's scratch); block b's 32 codes at q + b * bs
// (32 row-major, 128 for a row of a 4-row tile).
inline void mxfp8_row_decode(const uint8_t* q, const uint8_t* sc, int64_t K, float* out, int64_t bs = 32) {
  const int64_t nb = K / 32;
  const bool fast = mxfp8_row_fast(sc, nb);
  const float* t = e8m0_x256_table();
  const __m256 k = _mm256_set1_ps(256.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256 s = _mm256_set1_ps(fast ? t[sc[b]] : m3::e8m0_to_float(sc[b]));
    M3_MXFP8_BLOCK(q + b * bs, s, k, !fast)
    _mm256_storeu_ps(out + b * 32, w0);
    _mm256_storeu_ps(out + b * 32 + 8, w1);
    _mm256_storeu_ps(out + b * 32 + 16, w2);
    _mm256_storeu_ps(out + b * 32 + 24, w3);
  }
}

// The decode step (T == 1): decoded vectors go straight into the FMA (no scratch round trip); one
// accumulator per row fed in the order of dot_rows4_x1 over the decoded tile, so results are
// bit-identical to the batched path. R rows are interleaved for independent FMA chains.
// Row i's block b is at q + i * ri + b * bs (row-major: ri = K, bs = 32; tiled: ri = 32, bs = 128).
template <int R, bool SLOW>
inline void mxfp8_rows_dot(const uint8_t* q, const uint8_t* sc, const float* x, int64_t K, int64_t ri, int64_t bs,
                           float* y, TilePrefetch& pf) {
  const int64_t nb = K / 32;
  const float* t = e8m0_x256_table();
  const __m256 k = _mm256_set1_ps(256.0f);
  __m256 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * 32;
    pf.lines(2);  // the next tile: 4 rows x K bytes over K/32 iterations
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const __m256 s = _mm256_set1_ps(SLOW ? m3::e8m0_to_float(sc[i * nb + b]) : t[sc[i * nb + b]]);
      M3_MXFP8_BLOCK(q + i * ri + b * bs, s, k, SLOW)
      acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), w0, acc[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), w1, acc[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), w2, acc[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 24), w3, acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) y[i] = hsum8(acc[i]);
}

void dot_rows4_mxfp8(const uint8_t* q, const uint8_t* sc, const float* x, int64_t K, float* y, bool more,
                     bool tiled) {
  const int64_t nb = K / 32, ri = tiled ? 32 : K, bs = tiled ? 128 : 32;
  TilePrefetch pf(q + 4 * K, more ? size_t(4 * K) : 0);
  if (more) prefetch_range(sc + 4 * nb, size_t(4 * nb));
  constexpr int R = 4;  // the fastest of 1, 2, 4 and 8 rows at once (docs/benchmarks.md section 5)
  for (int i = 0; i < 4; i += R) {
    bool fast = true;
    for (int j = 0; j < R; ++j) fast = fast && mxfp8_row_fast(sc + (i + j) * nb, nb);
    if (fast) mxfp8_rows_dot<R, false>(q + i * ri, sc + i * nb, x, K, ri, bs, y + i, pf);
    else mxfp8_rows_dot<R, true>(q + i * ri, sc + i * nb, x, K, ri, bs, y + i, pf);
  }
}

// The decode step with the block scales moved onto the activations (the scale multiply was 4 of about
// 21 vector instructions per 32 weights, and the in-cache kernel is bound by its instructions).
// Without a per-block multiply, the weight need not pass through FP16 either: the E4M3 byte is placed
// straight into the FP32 fields (sign to bit 31, exponent and mantissa to bits 26..20), which reads it
// as v * 2^-120 for every code, subnormals included (an E4M3 subnormal lands on an FP32 subnormal with
// the same 2^-120 ratio). That is a byte shuffle, a shift and a mask per 8 weights, against
// unpack / shift / mask / extract / vcvtph2ps before.
// xs[(c - lo) * K + k] = x[k] * 2^(c - 7) = x[k] * 2^120 * scale(c), exact (mxfp8_prescale_exact), so
// every FMA multiplies the same real numbers as mxfp8_rows_dot's (x times the exactly scaled weight)
// and adds them in the same order: bit-identical results.
// R = 8 takes two 4-row tiles at once (rows 4..7 are the next tile, 4K bytes on): eight FMA chains
// instead of four, each row's own unchanged: faster from memory (docs/benchmarks.md section 5).
// Scaled = true (matrices with more than kMxfp8PrescaleCodes codes, or x whose copies would not be
// exact): xs is plain x and each placed weight is multiplied by 2^(code - 7) = 2^120 * scale(c), exact
// for codes up to kMxfp8PrescaleMaxCode, so the weight equals the reference's v * scale and the FMA
// is the same. One more multiply per 8 weights, and still faster than the FP16-widening kernel
// (dot_rows4_mxfp8). E4M3 subnormals are placed as FP32 subnormals, which the multiply takes slowly;
// quantised weights have almost none (a subnormal code is below 2^-14 of its block's largest value).
// The E4M3 placement of dot_rows_mxfp8_xs and mxfp8_tile_tokens: 16 codes become two vectors of
// FP32 bit patterns reading v * 2^-120 (sign to bit 31, exponent and mantissa to bits 26..20).
struct E4m3Placing {
  // Codes to the high bytes of 16-bit words (low bytes zero): 32-bit lane l holds element l of w1 in its
  // high word and element l of w0 in its low word (elements 0-3 | 8-11 in the low half, 4-7 | 12-15 in
  // the high half; the group is broadcast to both halves, pshufb works within each).
  static constexpr char z = char(0x80);  // a zero byte
  const __m256i pairs = _mm256_setr_epi8(z, 0, z, 8, z, 1, z, 9, z, 2, z, 10, z, 3, z, 11,  //
                                         z, 4, z, 12, z, 5, z, 13, z, 6, z, 14, z, 7, z, 15);
  // After the 16-bit arithmetic shift by 4 a word reads s ssss eeee mmm 0000: keep the sign, the
  // exponent and the mantissa of the high word.
  const __m256i mask = _mm256_set1_epi32(int(0x87f00000u));
  // Elements 0..7 and 8..15 of the 16 codes at p: one shuffle, two shifts and two masks.
  inline void place16(const uint8_t* p, __m256& w0, __m256& w1) const {
    const __m256i g = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i v = _mm256_srai_epi16(_mm256_shuffle_epi8(g, pairs), 4);
    w0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 16), mask));
    w1 = _mm256_castsi256_ps(_mm256_and_si256(v, mask));
  }
  // One row's 32-code block at qb into its accumulator for one token, x at xb, in element order; Scaled
  // multiplies each placed weight by f first (the one-token kernels below share it).
  template <bool Scaled>
  inline void fma32(const uint8_t* qb, const float* xb, __m256 f, __m256& acc) const {
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      __m256 w0, w1;
      place16(qb + 16 * j, w0, w1);
      if (Scaled) {
        w0 = _mm256_mul_ps(w0, f);
        w1 = _mm256_mul_ps(w1, f);
      }
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16 * j), w0, acc);
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16 * j + 8), w1, acc);
    }
  }
};

template <int R, bool Scaled>
void dot_rows_mxfp8_xs(const uint8_t* q, const uint8_t* sc, const float* xs, int lo, int64_t K, float* y,
                       bool more, bool tiled) {
  const int64_t nb = K / 32, ri = tiled ? 32 : K, bs = tiled ? 128 : 32;  // as in mxfp8_rows_dot
  TilePrefetch pf(q + R * K, more ? size_t(R * K) : 0);
  if (more) prefetch_range(sc + R * nb, size_t(R * nb));
  const E4m3Placing e4;
  __m256 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    pf.lines(R / 2);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const int code = sc[i * nb + b];
      const float* xb = Scaled ? xs + b * 32 : xs + (int64_t(code) - lo) * K + b * 32;
      const uint8_t* qb = q + (i / 4) * 4 * K + (i % 4) * ri + b * bs;  // rows 4..7: the next tile
      const __m256 f = _mm256_castsi256_ps(_mm256_set1_epi32((code + 120) << 23));  // 2^(code - 7), Scaled
      e4.fma32<Scaled>(qb, xb, f, acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) y[i] = hsum8(acc[i]);
}

// dot_rows_mxfp8_xs<8, false> for two tiles of a tiled matrix, with its per-row address work cut down
// (speed: that form spent about 75 scalar instructions per 32-element block of its 8 rows on spilled
// row offsets, an imul per row for the copy of x and a bounds test per prefetched line, against 112
// vector ones; the core issues 6 instructions per cycle for both kinds). Here a row's weights sit at a
// compile-time offset from one of two tile pointers, its scale code at s0 / s4 plus 0, nb, 2 nb or 3 nb,
// its copy of x comes from a table of pointers by code (xsp[c] = xs + (c - lo) * K), and the next two
// tiles are prefetched four lines per block with no test (8 rows x K bytes over K / 32 blocks exactly).
// The same FMAs in the same order: bit-identical. It pays in cache; from memory the stream, not the
// instructions, sets the pace (docs/benchmarks.md section 5).
template <bool Prefetch>
void dot_tiles2_mxfp8_xs(const uint8_t* q, const uint8_t* sc, const float* const* xsp, int64_t K, float* y) {
  const int64_t nb = K / 32, nb2 = 2 * nb, nb3 = 3 * nb;
  const uint8_t* q1 = q + 4 * K;
  const uint8_t *s0 = sc, *s4 = sc + 4 * nb;
  const char* pf = reinterpret_cast<const char*>(q + 8 * K);
  if (Prefetch) prefetch_range(sc + 8 * nb, size_t(8 * nb));  // the next two tiles' scale codes, as dot_rows_mxfp8_xs
  const E4m3Placing e4;
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, q += 128, q1 += 128, ++s0, ++s4) {
    if (Prefetch) {
      _mm_prefetch(pf, _MM_HINT_T1);
      _mm_prefetch(pf + 64, _MM_HINT_T1);
      _mm_prefetch(pf + 128, _MM_HINT_T1);
      _mm_prefetch(pf + 192, _MM_HINT_T1);
      pf += 256;
    }
    const int64_t xo = b * 32;
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const uint8_t* s = i < 4 ? s0 : s4;
      const int r = i % 4;
      const int code = r == 0 ? s[0] : r == 1 ? s[nb] : r == 2 ? s[nb2] : s[nb3];
      const float* xb = xsp[code] + xo;
      e4.fma32<false>((i < 4 ? q : q1) + r * 32, xb, _mm256_setzero_ps(), acc[i]);
    }
  }
  for (int i = 0; i < 8; ++i) y[i] = hsum8(acc[i]);
}

// Rows from r (a full tile) of the decode step through dot_tiles2_mxfp8_xs (two tiles of a tiled
// matrix, copies of x) or dot_rows_mxfp8_xs: two tiles when [r, r1) holds them, else one (the next ones
// prefetched below pf_end); returns the rows done. xs: the copies of x (mxfp8_prescaled_x), or x when
// Scaled; xsp: the copies by code (unused when Scaled).
template <bool Scaled>
int64_t mxfp8_placed_tiles(const m3::Linear& W, const float* xs, const float* const* xsp, int64_t r, int64_t r1,
                           int64_t pf_end, float* y) {
  const uint8_t* q = W.w + size_t(r) * W.K;
  const uint8_t* sc = W.scales + size_t(r) * (W.K / 32);
  const int lo = Scaled ? 0 : W.scale_lo;
  if (!Scaled && W.tiled && r + 8 <= r1) {
    if (r + 16 <= pf_end)
      dot_tiles2_mxfp8_xs<true>(q, sc, xsp, W.K, y + r);
    else
      dot_tiles2_mxfp8_xs<false>(q, sc, xsp, W.K, y + r);
    return 8;
  }
  if (r + 8 <= r1) {
    dot_rows_mxfp8_xs<8, Scaled>(q, sc, xs, lo, W.K, y + r, r + 16 <= pf_end, W.tiled);
    return 8;
  }
  dot_rows_mxfp8_xs<4, Scaled>(q, sc, xs, lo, W.K, y + r, r + 8 <= pf_end, W.tiled);
  return 4;
}

// x[0, K)'s extreme exponent fields (see mxfp8_prescale_exact_fields; K a multiple of 8): emax over all
// elements, emin over the nonzero ones (255 when all are zero); zero: whether some element is +-0.
void x_exponent_fields(const float* x, int64_t K, uint32_t& emin, uint32_t& emax, bool& zero) {
  // Unsigned max of the magnitudes, unsigned min with zeros turned into 0xffffffff, and the plain min.
  const __m256i mag = _mm256_set1_epi32(0x7fffffff), z = _mm256_setzero_si256();
  __m256i vmax = z, vmin = _mm256_set1_epi32(-1), vmin0 = vmin;
  for (int64_t k = 0; k < K; k += 8) {
    const __m256i u = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + k)), mag);
    vmax = _mm256_max_epu32(vmax, u);
    vmin = _mm256_min_epu32(vmin, _mm256_or_si256(u, _mm256_cmpeq_epi32(u, z)));
    vmin0 = _mm256_min_epu32(vmin0, u);
  }
  alignas(32) uint32_t mx[8], mn[8], m0[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(mx), vmax);
  _mm256_store_si256(reinterpret_cast<__m256i*>(mn), vmin);
  _mm256_store_si256(reinterpret_cast<__m256i*>(m0), vmin0);
  uint32_t umax = 0, umin = 0xffffffffu, umin0 = 0xffffffffu;
  for (int i = 0; i < 8; ++i) {
    umax = std::max(umax, mx[i]);
    umin = std::min(umin, mn[i]);
    umin0 = std::min(umin0, m0[i]);
  }
  emin = umin == 0xffffffffu ? 255u : umin >> 23;
  emax = umax >> 23;
  zero = umin0 == 0;
}

// The copies of x for scale codes [lo, hi] of W (see dot_rows_mxfp8_xs), in a per-thread buffer grown
// only (no allocation in steady state); the caller has checked that they are exact and few
// (mxfp8_prescale_exact_fields, kMxfp8PrescaleCodes). xsp: set to a per-thread table of pointers by
// code, xsp[c] = the copy for code c (c in [lo, hi]).
const float* mxfp8_prescaled_x(const m3::Linear& W, const float* x, const float* const*& xsp) {
  const int lo = W.scale_lo, hi = W.scale_hi;
  const int64_t K = W.K;  // MXFP8: a multiple of 32
  thread_local std::vector<float> tab;
  thread_local const float* ptrs[256];
  if (tab.size() < size_t(hi - lo + 1) * size_t(K)) tab.resize(size_t(hi - lo + 1) * size_t(K));
  for (int c = lo; c <= hi; ++c) {
    const __m256 f = _mm256_set1_ps(m3::bits_to_float(uint32_t(c + 120) << 23));  // 2^(c - 7)
    float* t = tab.data() + int64_t(c - lo) * K;
    for (int64_t k = 0; k < K; k += 8) _mm256_storeu_ps(t + k, _mm256_mul_ps(_mm256_loadu_ps(x + k), f));
    ptrs[c] = t;
  }
  xsp = ptrs;
  return tab.data();
}

// NVFP4 rows of a 4-row tile with placed scales (nvfp4_placed_scales), NT tokens per decoded vector
// (tile_tokens; NT = 1 is the decode step, dot_rows4_nvfp4).
// `stab` maps an E4M3 block-scale code to (scale / 2) / global divisor times 2^-24, computed once per
// call with the reference rounding (speed: no division per block); the 2^-24 must be exact
// (nvfp4_placed_scales).
// Tiled (Linear::tiled, K % 32 == 0): row i's 16-byte chunk c (blocks 2c, 2c + 1) is at p + (4c + i) * 16, its
// nibbles block-major (block 2c low, 2c + 1 high).
// The four rows are interleaved (four independent FMA chains: one row at a time is bound by the
// FMA latency), and two 16-element blocks of a row are unpacked per 16-byte load (speed). Each
// row still has one accumulator fed in element order: bit-identical to decode_row + dot_rows4_x1.
// The 16 bytes sit in both 128-bit lanes; the E2M1 codes become small integers (2x the value, one
// byte each) and one byte shuffle per 8 weights moves each into the top byte of its 32-bit lane:
// the integer times 2^24, converted exactly, and the 2^-24 in `stab` takes it back (the product is
// the reference's int * scale, rounded once). Faster than widening with vpmovsxbd from the 128-bit
// halves (two more shuffles per 32 weights), and tiled chunks, whose nibbles need no interleaving,
// faster still (docs/benchmarks.md section 5).
// Mx: an MXFP4 matrix (LinearKind::MXFP4): one E8M0 scale per 32 elements (both 16-element halves of a
// 16-byte load share it; sc rows K/32 apart), stab from mxfp4_placed_scales; the packing and the
// nibble orders are NVFP4's, so the decode is the same.
template <bool Tiled, int NT, bool Mx = false>
void nvfp4_tile_tokens(const uint8_t* p, const uint8_t* sc, const float* stab, const float* x, int64_t K, int64_t N,
                       float* y, bool more) {
  const E2m1Placing c;
  const __m256i &table = c.table, &top0 = c.top0, &top1 = c.top1;
  const __m256i m = _mm256_set1_epi8(0x0f);
  const int64_t nb = K / 16, half = K / 2, ri = Tiled ? 16 : half, cs = Tiled ? 64 : 16;
  const int64_t ns = Mx ? K / 32 : nb;  // scales per row
  __m256 acc[4][NT];
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < NT; ++t) acc[i][t] = _mm256_setzero_ps();
  TilePrefetch pf(p + 4 * half, more ? size_t(4 * half) : 0);  // K/32 iterations, 2K bytes
  if (more) prefetch_range(sc + 4 * ns, size_t(4 * ns));
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    pf.lines(1);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m256i by =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i * ri + (b / 2) * cs)));
      const __m256i lo = _mm256_and_si256(by, m), hi = _mm256_and_si256(_mm256_srli_epi16(by, 4), m);
      // Block b and block b + 1, each in element order in both lanes: tiled chunks hold them as the low
      // and the high nibbles already (Linear::tiled), checkpoint rows interleave them.
      const __m256i v0 = _mm256_shuffle_epi8(table, Tiled ? lo : _mm256_unpacklo_epi8(lo, hi));
      const __m256i v1 = _mm256_shuffle_epi8(table, Tiled ? hi : _mm256_unpackhi_epi8(lo, hi));
      const float sa = stab[sc[i * ns + (Mx ? b / 2 : b)]];
      const __m256 s0 = _mm256_set1_ps(sa), s1 = _mm256_set1_ps(Mx ? sa : stab[sc[i * nb + b + 1]]);
      const __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(v0, top0)), s0);
      const __m256 w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(v0, top1)), s0);
      const __m256 w2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(v1, top0)), s1);
      const __m256 w3 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(v1, top1)), s1);
      for (int t = 0; t < NT; ++t) {
        const float* xb = x + t * K + b * 16;
        acc[i][t] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), w0, acc[i][t]);
        acc[i][t] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), w1, acc[i][t]);
        acc[i][t] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), w2, acc[i][t]);
        acc[i][t] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 24), w3, acc[i][t]);
      }
    }
  }
  if constexpr (!Mx)  // MXFP4: K % 32 == 0, no odd block
  for (; b < nb; ++b)  // an odd last block (row-major only: tiled needs K % 32 == 0)
    for (int i = 0; i < 4; ++i) {
      __m256 a, d;
      e2m1x16_to_ps(p + i * half + b * 8, stab[sc[i * nb + b]] * 0x1p24f, a, d);  // the exact scale back
      for (int t = 0; t < NT; ++t) {
        acc[i][t] = _mm256_fmadd_ps(_mm256_loadu_ps(x + t * K + b * 16), a, acc[i][t]);
        acc[i][t] = _mm256_fmadd_ps(_mm256_loadu_ps(x + t * K + b * 16 + 8), d, acc[i][t]);
      }
    }
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < 4; ++i) y[t * N + i] = hsum8(acc[i][t]);
}

template <bool Tiled, bool Mx = false>
void dot_rows4_nvfp4(const uint8_t* p, const uint8_t* sc, const float* stab, const float* x, int64_t K, float* y,
                     bool more) {
  nvfp4_tile_tokens<Tiled, 1, Mx>(p, sc, stab, x, K, 0, y, more);
}

// A step of a few tokens (batched decode, speculative verification, experts that got 2-3 tokens)
// runs each 4-row tile through the decode step's in-register decode for NT <= 3 tokens at once,
// instead of decoding the tile to fp32 scratch and reading it back per token group (speed: at
// kTileTokensMax; nvfp4_tile_tokens above is the NVFP4 form). Each (row, token) keeps one accumulator fed in element order
// with the same products as the scratch path: bit-identical. x: NT token rows K apart; y: the tile's
// outputs for token t at y + t * N.
//
// MXFP8 tiles whose scale codes allow the Scaled form of dot_rows_mxfp8_xs (placed E4M3 times
// 2^(code - 7), exactly the decoded weight).
template <int NT>
void mxfp8_tile_tokens(const uint8_t* q, const uint8_t* sc, const float* x, int64_t K, int64_t N, float* y,
                       bool more, bool tiled) {
  const int64_t nb = K / 32, ri = tiled ? 32 : K, bs = tiled ? 128 : 32;  // as in mxfp8_rows_dot
  TilePrefetch pf(q + 4 * K, more ? size_t(4 * K) : 0);
  if (more) prefetch_range(sc + 4 * nb, size_t(4 * nb));
  const E4m3Placing e4;
  __m256 acc[4][NT];
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < NT; ++t) acc[i][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    pf.lines(2);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m256 f = _mm256_castsi256_ps(_mm256_set1_epi32((int(sc[i * nb + b]) + 120) << 23));  // 2^(code - 7)
      const uint8_t* qb = q + i * ri + b * bs;
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        __m256 w0, w1;
        e4.place16(qb + 16 * j, w0, w1);
        w0 = _mm256_mul_ps(w0, f);
        w1 = _mm256_mul_ps(w1, f);
        for (int t = 0; t < NT; ++t) {
          const float* xb = x + t * K + b * 32 + 16 * j;
          acc[i][t] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), w0, acc[i][t]);
          acc[i][t] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), w1, acc[i][t]);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int i = 0; i < 4; ++i) y[t * N + i] = hsum8(acc[i][t]);
}

// Fills stab[c] = (E4M3(c) / 2) / global divisor * 2^-24 for dot_rows4_nvfp4; false when some
// scale would lose bits to the 2^-24 (a result below the normal range: only with a divisor above
// about 2^92), and the caller then takes the general path.
bool nvfp4_placed_scales(const m3::Linear& W, float* stab) {
  const float* e4 = m3::element_tables().e4m3.data();
  bool exact = true;
  for (int c = 0; c < 256; ++c) {
    const float s = (e4[c] * 0.5f) / W.global_div;
    stab[c] = s * 0x1p-24f;
    exact &= stab[c] * 0x1p24f == s || s != s;
  }
  return exact;
}

// The same table for an MXFP4 matrix: stab[c] = (2^(c - 127) / 2) * 2^-24 = 2^(c - 152), exact for codes 3
// and up (2^-149 is the smallest float); false when the matrix holds a lower code (set_scale_range:
// scale_lo), and the caller then takes the general path (decode_row's values, computed directly).
bool mxfp4_placed_scales(const m3::Linear& W, float* stab) {
  for (int c = 0; c < 256; ++c) stab[c] = c >= 3 && c < 255 ? std::ldexp(1.0f, c - 152) : 0.f;
  return W.scale_lo >= 3 && W.scale_hi < 255;
}

// BF16 (the lm_head): widening is a shift, so the decoded row need not pass through scratch.
// Same accumulation as decode_row + dot_rows4_x1 (one accumulator per row, then the scalar tail).
// Tiled (K % 8 == 0): row i's elements [k, k + 8) are at w + 4k + 8i.
// NT tokens (x rows K apart, outputs for token t at y + t * N; see tile_tokens) per widened vector,
// so a step that wants logits for every token reads the lm_head once.
template <int NT>
void bf16_tile_tokens(const uint16_t* w, const float* x, int64_t K, int64_t N, float* y, bool more, bool tiled) {
  const int64_t ri = tiled ? 8 : K, km = tiled ? 4 : 1;
  __m256 acc[4][NT];
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < NT; ++t) acc[i][t] = _mm256_setzero_ps();
  TilePrefetch pf(w + 4 * K, more ? size_t(8 * K) : 0);  // K/8 iterations, 8K bytes
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    pf.lines(1);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i * ri + k * km)));
      const __m256 wv = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
      for (int t = 0; t < NT; ++t) acc[i][t] = _mm256_fmadd_ps(_mm256_loadu_ps(x + t * K + k), wv, acc[i][t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    float r[4] = {hsum8(acc[0][t]), hsum8(acc[1][t]), hsum8(acc[2][t]), hsum8(acc[3][t])};
    for (int64_t kk = k; kk < K; ++kk)
      for (int i = 0; i < 4; ++i) r[i] = std::fma(x[t * K + kk], m3::bf16_to_float(w[i * K + kk]), r[i]);
    for (int i = 0; i < 4; ++i) y[t * N + i] = r[i];
  }
}
void dot_rows4_bf16(const uint16_t* w, const float* x, int64_t K, float* y, bool more, bool tiled) {
  bf16_tile_tokens<1>(w, x, K, 0, y, more, tiled);
}

// dot_rows4_bf16 over a tile packed by pack_bf16_nibbles (slots: the tile's first slot; w: its tiled
// bytes, read for escaped rows): per row and chunk, the nibbles index a table of sign and 0x7f - offset,
// minus the row's 0x7f - base that gives the top bytes; two byte interleaves with the low bytes make
// the BF16 words and two word interleaves with zero the four FP32 vectors of elements 0-7, 8-15, 16-23
// and 24-31 (the packing put each low byte where these land). The same values in the same order as
// dot_rows4_bf16: the same bits. Why: the lm_head is memory-bound at one token, and the packing reads
// about a quarter fewer bytes for 15 vector operations per 32 weights instead of 12 (pack_bf16_nibbles).
void dot_rows4_bf16_nibbles(const uint8_t* slots, const uint16_t* w, const float* x, int64_t K, float* y, bool more) {
  const int64_t nc = K / 32;
  const __m256i table = _mm256_setr_epi8(0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x7a, 0x79, 0x78, -1, -2, -3, -4, -5, -6, -7, -8,  //
                                         0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x7a, 0x79, 0x78, -1, -2, -3, -4, -5, -6, -7, -8);
  const __m256i shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4), m = _mm256_set1_epi8(0x0f), z = _mm256_setzero_si256();
  __m256 acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = _mm256_setzero_ps();
  TilePrefetch pf(slots + nc * m3::kBf16NibbleSlot, more ? size_t(nc * m3::kBf16NibbleSlot) : 0);
  for (int64_t c = 0; c < nc; ++c) {
    pf.lines(3);
    const uint8_t* s = slots + c * m3::kBf16NibbleSlot;
    const float* xc = x + 32 * c;
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      __m256 f[4];
      if (s[i] == m3::kBf16NibblesEscape) {  // row i's [32c + 8j, + 8) at 128c + 32j + 8i
        for (int j = 0; j < 4; ++j) {
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 128 * c + 32 * j + 8 * i));
          f[j] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
      } else {
        const uint8_t* rp = s + 4 + 48 * i;
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rp));
        const __m256i nib = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rp + 32)));
        const __m256i top = _mm256_sub_epi8(_mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srlv_epi32(nib, shift), m)),
                                            _mm256_set1_epi8(char(s[i])));
        const __m256i w0 = _mm256_unpacklo_epi8(lo, top), w1 = _mm256_unpackhi_epi8(lo, top);
        f[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w0));
        f[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w0));
        f[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w1));
        f[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w1));
      }
      for (int j = 0; j < 4; ++j) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(xc + 8 * j), f[j], acc[i]);
    }
  }
  for (int i = 0; i < 4; ++i) y[i] = hsum8(acc[i]);
}

// Register-blocked dot products of 4 decoded weight rows with 2 (or 1) activation rows: 6 loads
// feed 8 FMAs instead of 2 loads per FMA, which is what bounds batched steps and prefill.
inline void dot_rows4_x2(const float* w, int64_t K, const float* x0, const float* x1, float* y0, float* y1) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 v0 = _mm256_loadu_ps(x0 + k), v1 = _mm256_loadu_ps(x1 + k);
    const __m256 r0 = _mm256_loadu_ps(w0 + k), r1 = _mm256_loadu_ps(w1 + k);
    const __m256 r2 = _mm256_loadu_ps(w2 + k), r3 = _mm256_loadu_ps(w3 + k);
    a00 = _mm256_fmadd_ps(v0, r0, a00);
    a01 = _mm256_fmadd_ps(v0, r1, a01);
    a02 = _mm256_fmadd_ps(v0, r2, a02);
    a03 = _mm256_fmadd_ps(v0, r3, a03);
    a10 = _mm256_fmadd_ps(v1, r0, a10);
    a11 = _mm256_fmadd_ps(v1, r1, a11);
    a12 = _mm256_fmadd_ps(v1, r2, a12);
    a13 = _mm256_fmadd_ps(v1, r3, a13);
  }
  float t0[4] = {hsum8(a00), hsum8(a01), hsum8(a02), hsum8(a03)};
  float t1[4] = {hsum8(a10), hsum8(a11), hsum8(a12), hsum8(a13)};
  // Tails use an explicit fma so every kernel shape rounds them the same way (batch invariance).
  for (; k < K; ++k)
    for (int i = 0; i < 4; ++i) {
      t0[i] = std::fma(x0[k], w[i * K + k], t0[i]);
      t1[i] = std::fma(x1[k], w[i * K + k], t1[i]);
    }
  for (int i = 0; i < 4; ++i) {
    y0[i] = t0[i];
    y1[i] = t1[i];
  }
}

// 4 rows x 3 tokens: 7 loads feed 12 FMAs (prefill is bound by loads with fewer accumulators).
// Each (row, token) pair keeps the single accumulator and order of dot_rows4_x1: bit-identical.
inline void dot_rows4_x3(const float* w, int64_t K, const float* x0, const float* x1, const float* x2, float* y0,
                         float* y1, float* y2) {
  __m256 a0[4], a1[4], a2[4];
  for (int i = 0; i < 4; ++i) a0[i] = a1[i] = a2[i] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 v0 = _mm256_loadu_ps(x0 + k), v1 = _mm256_loadu_ps(x1 + k), v2 = _mm256_loadu_ps(x2 + k);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m256 r = _mm256_loadu_ps(w + i * K + k);
      a0[i] = _mm256_fmadd_ps(v0, r, a0[i]);
      a1[i] = _mm256_fmadd_ps(v1, r, a1[i]);
      a2[i] = _mm256_fmadd_ps(v2, r, a2[i]);
    }
  }
  float t0[4], t1[4], t2[4];
  for (int i = 0; i < 4; ++i) {
    t0[i] = hsum8(a0[i]);
    t1[i] = hsum8(a1[i]);
    t2[i] = hsum8(a2[i]);
  }
  // Tails use an explicit fma so every kernel shape rounds them the same way (batch invariance).
  for (; k < K; ++k)
    for (int i = 0; i < 4; ++i) {
      t0[i] = std::fma(x0[k], w[i * K + k], t0[i]);
      t1[i] = std::fma(x1[k], w[i * K + k], t1[i]);
      t2[i] = std::fma(x2[k], w[i * K + k], t2[i]);
    }
  for (int i = 0; i < 4; ++i) {
    y0[i] = t0[i];
    y1[i] = t1[i];
    y2[i] = t2[i];
  }
}

inline void dot_rows4_x1(const float* w, int64_t K, const float* x0, float* y0) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 v0 = _mm256_loadu_ps(x0 + k);
    a0 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(w0 + k), a0);
    a1 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(w1 + k), a1);
    a2 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(w2 + k), a2);
    a3 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(w3 + k), a3);
  }
  float t0[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
  for (; k < K; ++k)
    for (int i = 0; i < 4; ++i) t0[i] = std::fma(x0[k], w[i * K + k], t0[i]);
  for (int i = 0; i < 4; ++i) y0[i] = t0[i];
}

// Steps of up to this many tokens take tile_tokens: from about 12 tokens on, decoding each tile once to
// scratch costs no more than decoding it in registers per token group (docs/benchmarks.md section 5).
constexpr int64_t kTileTokensMax = 8;

// Calls f(std::integral_constant<int, n>) for n = 1, 2 or 3 (the kernels' token-group sizes).
template <class F>
inline void with_group_size(int64_t n, F&& f) {
  if (n == 3) f(std::integral_constant<int, 3>());
  else if (n == 2) f(std::integral_constant<int, 2>());
  else f(std::integral_constant<int, 1>());
}

}  // namespace
}  // namespace m3::cpu
