// The 512-bit forms of the matmul kernels (linear_avx512.cpp only).
//
// Two rows per vector: rows 2p and 2p + 1 of a 4-row tile ("pair" p) share one 512-bit register,
// each in 8 lanes, against the token's 8 activations broadcast to both halves. Every lane receives
// the same products in the same order as the AVX2 kernels' lane (one accumulator per row and token,
// elements in 8-wide steps in element order), and each half is summed by hsum8: every result is
// bit-identical to the AVX2 build's (kernels_isa_test checks it), with half the FMA, decode and load
// instructions (speed: this machine runs two 512-bit FMAs per cycle and core, twice the 256-bit
// rate, so the 256-bit kernels could reach only half its FMA peak).
//
// The weights are decoded from the tiled layouts (Linear::tiled) by byte permutes (AVX512-VBMI):
// MXFP8 codes as the placed E4M3 bits the AVX2 kernels form (their two FP32 bytes made by a GFNI
// affine map), times 2^(code - 7) (the Scaled form of dot_rows_mxfp8_xs); NVFP4 codes into the
// low bits of a lane as the index of a 16-entry table per scale code holding the AVX2 kernel's
// products (vpermt2ps); BF16 by placing its two bytes in the top half.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <immintrin.h>

#include "base/aligned_vector.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_avx2.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/simd_avx2.h"

#if !defined(M3_KERNELS_AVX512)
#error "linear_avx512.h needs the M3_KERNELS_AVX512 compiler flags (see CMakeLists.txt)"
#endif

namespace m3::cpu {
namespace {

// Steps of up to this many tokens decode each tile in registers; more decode it once to a panel.
// Per format, since the decode's share differs: each bound is where panels start to beat registers
// (docs/benchmarks.md section 5).
inline int64_t tile_tokens512_max(m3::LinearKind kind) {
  switch (kind) {
    case m3::LinearKind::MXFP8: return 15;
    case m3::LinearKind::NVFP4:
    case m3::LinearKind::MXFP4: return 11;  // MXFP4: NVFP4's decode, not measured apart
    default: return 40;
  }
}

// 64 byte indices for vpermb from f(destination byte).
template <class F>
constexpr std::array<int8_t, 64> permute_bytes(F f) {
  std::array<int8_t, 64> a{};
  for (int i = 0; i < 64; ++i) a[i] = int8_t(f(i));
  return a;
}
inline __m512i load_bytes(const std::array<int8_t, 64>& a) { return _mm512_loadu_si512(a.data()); }
constexpr uint64_t kTopHalves = 0xccccccccccccccccull;  // bytes 2, 3 of every 32-bit lane

// Lane q (0..15) of a pair vector: row 2p + q / 8 of the tile, element q % 8 of the step.
// MXFP8 (chunk = block b, 128 bytes: row i's 32 codes at 32i): a pair's 64 bytes hold row 2p's 32 codes,
// then row 2p + 1's. For steps 2h and 2h + 1 (codes 16h..16h + 15 of each row) the two rows' 16 codes
// are gathered twice (128-bit lanes h, 2 + h, h, 2 + h) and mapped to their FP32 bytes: high bytes in
// bytes 0..31, low bytes in 32..63 (row 2p + 1 16 bytes after row 2p's). Step 2h + s then takes, for
// lane q, code 16h + 8s + q % 8 of row 2p + q / 8: its high byte to byte 3 of the lane, its low byte to
// byte 2.
constexpr std::array<std::array<int8_t, 64>, 2> kMxfp8Steps = {
    permute_bytes([](int i) { return 32 * (i % 4 == 2) + 16 * (i / 32) + 0 + (i / 4) % 8; }),
    permute_bytes([](int i) { return 32 * (i % 4 == 2) + 16 * (i / 32) + 8 + (i / 4) % 8; })};
// The same steps from one two-source byte permute: step k = 2h + s takes, for lane q, the high byte
// (bytes 0..63: the codes mapped by kE4m3HighByte in place) and the low byte (64..127: by kE4m3LowByte)
// of code 16h + 8s + q % 8 of row 2p + q / 8.
constexpr std::array<std::array<int8_t, 64>, 4> kMxfp8Steps2 = {
    permute_bytes([](int i) { return 64 * (i % 4 == 2) + 32 * (i / 32) + 0 + (i / 4) % 8; }),
    permute_bytes([](int i) { return 64 * (i % 4 == 2) + 32 * (i / 32) + 8 + (i / 4) % 8; }),
    permute_bytes([](int i) { return 64 * (i % 4 == 2) + 32 * (i / 32) + 16 + (i / 4) % 8; }),
    permute_bytes([](int i) { return 64 * (i % 4 == 2) + 32 * (i / 32) + 24 + (i / 4) % 8; })};
// GF(2) affine maps (gf2p8affineqb: output bit j of a byte is the parity of the input bits chosen
// by byte 7 - j of the matrix) splitting an E4M3 code s e3 e2 e1 e0 m2 m1 m0 into the two top bytes
// of its placed FP32 bits (sign at bit 31, e3..e0 at 26..23, m2..m0 at 22..20, the rest zero):
// high byte s 0 0 0 0 e3 e2 e1, low byte e0 m2 m1 m0 0 0 0 0.
constexpr uint64_t kE4m3HighByte = 0x80ull | (0x40ull << 40) | (0x20ull << 48) | (0x10ull << 56);
constexpr uint64_t kE4m3LowByte = 0x08ull | (0x04ull << 8) | (0x02ull << 16) | (0x01ull << 24);
// BF16 (each 8-element step: 64 bytes, row i's 8 values at 16i): pair p, the value's low
// byte to byte 2 of the lane, its high byte to byte 3.
constexpr std::array<std::array<int8_t, 64>, 2> kBf16Pairs = {
    permute_bytes([](int i) { return 16 * (0 + (i / 32)) + 2 * ((i / 4) % 8) + (i % 4 == 3); }),
    permute_bytes([](int i) { return 16 * (2 + (i / 32)) + 2 * ((i / 4) % 8) + (i % 4 == 3); })};

// The decoders: chunk(c, emit) decodes chunk c of the tile (kElems elements of each row) and calls
// emit(j, p, w) for each 8-element step j and pair p, in element order.
// E4M3 subnormal codes are placed as fp32 subnormals, which this Intel CPU's multiply takes through a
// microcode assist (about 150 cycles each); quantised checkpoints hold about 1e-4 of them, which costs
// little. Exact fp32 values from two 128-entry byte tables (vpermi2b) and a two-source permute per 16
// weights would be immune to subnormals but were slower at realistic rates (docs/benchmarks.md
// section 5).
struct Mxfp8Tile {
  static constexpr int kElems = 32, kLines = 2;  // cache lines per chunk (for the prefetch)
  const uint8_t* q;                              // the tile's bytes
  const uint8_t* sc;                             // row 0's scale codes (rows nb apart)
  int64_t nb;
  __m512i idx[2];
  // High-byte map in the low 256 bits, low-byte map in the high 256 bits.
  __m512i maps = _mm512_inserti64x4(_mm512_set1_epi64(int64_t(kE4m3HighByte)), _mm256_set1_epi64x(int64_t(kE4m3LowByte)), 1);
  Mxfp8Tile(const uint8_t* q_, const uint8_t* sc_, int64_t K) : q(q_), sc(sc_), nb(K / 32) {
    for (int j = 0; j < 2; ++j) idx[j] = load_bytes(kMxfp8Steps[j]);
  }
  // The tile at row r of W.
  static Mxfp8Tile at(const m3::Linear& W, const float* /*wtab*/, int64_t r) {
    return Mxfp8Tile(W.w + size_t(r) * size_t(W.K), W.scales + size_t(r) * size_t(W.K / 32), W.K);
  }
  // Per 32 codes of a pair: one lane shuffle and one affine map form both FP32 bytes of each code,
  // and one byte permute per 16 weights places them (fewer instructions than the former permute, shift
  // and mask per 16 weights; the two-source byte permute, which would skip the shuffle, issues once per
  // two cycles on Intel's AVX-512 cores).
  template <class Emit>
  inline void chunk(int64_t b, Emit&& emit) const {
    chunk_form<true>(b, [&](int j, int p, __m512 w, __m512i) { emit(j, p, w); });
  }
  // The placed weights alone (v * 2^-120) with each pair's exponent offsets: emit(j, p, w, off), off
  // holding (c - 7) << 23 for row 2p's code c in lanes 0..7 and row 2p + 1's in lanes 8..15, to be
  // added to the bits of x (tiles_mxfp8_shifted). TwoSource: both FP32 bytes of each code from an
  // affine map each over the chunk as loaded and one two-source byte permute per 16 weights (6 shuffle-
  // class instructions per 64 weights of a pair instead of 8; the same values, so the same bits). It
  // pays on AMD Zen 5, where the two-source permute is one instruction.
  template <bool TwoSource, class Emit>
  inline void chunk_shifted(int64_t b, Emit&& emit) const {
    if constexpr (!TwoSource) {
      chunk_form<false>(b, std::forward<Emit>(emit));
    } else {
      const __m512i mhi = _mm512_set1_epi64(int64_t(kE4m3HighByte)), mlo = _mm512_set1_epi64(int64_t(kE4m3LowByte));
      __m512i idx2[4], e[2], hi[2], lo[2];  // (constants: loaded once per loop where this is inlined)
      for (int k = 0; k < 4; ++k) idx2[k] = load_bytes(kMxfp8Steps2[k]);
      for (int p = 0; p < 2; ++p) {
        const __m512i v = _mm512_loadu_si512(q + b * 128 + 64 * p);
        e[p] = pair_exponents<-7>(b, p);
        hi[p] = _mm512_gf2p8affine_epi64_epi8(v, mhi, 0);
        lo[p] = _mm512_gf2p8affine_epi64_epi8(v, mlo, 0);
      }
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k)
#pragma GCC unroll 2
        for (int p = 0; p < 2; ++p)
          emit(k, p, _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(kTopHalves, hi[p], idx2[k], lo[p])), e[p]);
    }
  }

 private:
  // (c + K) << 23 for row 2p's scale code c of block b in lanes 0..7, row 2p + 1's in lanes 8..15: with
  // K = 120 the float 2^(c - 7), with K = -7 the offset c - 7 of an exponent. From a table of the 256
  // values, broadcast from memory (the one-token step is bound by the instructions it issues, and the
  // table spares a scalar add, a shift and a broadcast from a general register).
  template <int K>
  inline __m512i pair_exponents(int64_t b, int p) const {
    const int32_t* t = exponent_words<K>();
    const int c0 = sc[(2 * p) * nb + b], c1 = sc[(2 * p + 1) * nb + b];
    return _mm512_mask_broadcastd_epi32(_mm512_set1_epi32(t[c0]), 0xff00, _mm_cvtsi32_si128(t[c1]));
  }
  template <int K>
  static const int32_t* exponent_words() {
    alignas(64) static const std::array<int32_t, 256> t = [] {
      std::array<int32_t, 256> a{};
      for (int c = 0; c < 256; ++c) a[size_t(c)] = int32_t(uint32_t(c + K) << 23);  // (wraps as the bits do)
      return a;
    }();
    return t.data();
  }
  template <bool Scaled, class Emit>
  inline void chunk_form(int64_t b, Emit&& emit) const {
    __m512i v[2], e[2];
    for (int p = 0; p < 2; ++p) {
      v[p] = _mm512_loadu_si512(q + b * 128 + 64 * p);
      e[p] = pair_exponents<Scaled ? 120 : -7>(b, p);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) {
        const __m512i g = _mm512_gf2p8affine_epi64_epi8(
            h ? _mm512_shuffle_i64x2(v[p], v[p], _MM_SHUFFLE(3, 1, 3, 1)) : _mm512_shuffle_i64x2(v[p], v[p], _MM_SHUFFLE(2, 0, 2, 0)),
            maps, 0);
#pragma GCC unroll 2
        for (int s = 0; s < 2; ++s) {
          const __m512 w = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi8(kTopHalves, idx[s], g));
          emit(2 * h + s, p, Scaled ? _mm512_mul_ps(w, _mm512_castsi512_ps(e[p])) : w, e[p]);
        }
      }
  }
};

// NVFP4 goes through a table instead of a multiply per weight: wtab[16c + e] is E2M1 code e under
// block-scale code c, the product the AVX2 kernel forms (twice the value, times 2^24, times the placed
// scale: one rounding), so a lookup gives the same bits. One vpermt2ps looks up 16 weights of a pair
// (a row's table in each half); the index is the code, with bit 4 choosing the pair's second row
// (fewer instructions than the former vpermb + cvtdq2ps + mul per 16 weights and a blend per scale
// vector).
// Byte i of the 64-byte vector whose 32-bit lane q holds, for row 2p + q / 8 and l = q % 8, the codes of
// elements l, 8 + l (low nibbles: block 2c) and 16 + l, 24 + l (high nibbles: block 2c + 1) in bytes
// 0..3: indices into lo (0..63) and hi (64..127), the chunk's low and high nibbles as bytes.
constexpr std::array<std::array<int8_t, 64>, 2> kNvfp4Lanes = {
    permute_bytes([](int i) { return 64 * ((i % 4) / 2) + 16 * (0 + i / 32) + 8 * (i % 2) + (i / 4) % 8; }),
    permute_bytes([](int i) { return 64 * ((i % 4) / 2) + 16 * (2 + i / 32) + 8 * (i % 2) + (i / 4) % 8; })};

// wtab (256 x 16 floats, 64-byte aligned) from the placed scales (nvfp4_placed_scales).
void nvfp4_weight_table(const float* stab, float* wtab) {
  const __m512 twice = _mm512_cvtepi32_ps(_mm512_slli_epi32(
      _mm512_cvtepi8_epi32(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)), 24));
  for (int c = 0; c < 256; ++c) _mm512_store_ps(wtab + 16 * c, _mm512_mul_ps(twice, _mm512_set1_ps(stab[c])));
}

// Mx: MXFP4 (one E8M0 scale per 32-element chunk, rows K/32 scales apart; wtab from mxfp4_placed_scales):
// the chunk's two halves (low and high nibbles) take the same table.
template <bool Mx>
struct Fp4Tile {
  static constexpr int kElems = 32, kLines = 1;
  const uint8_t* q;
  const uint8_t* sc;
  const float* wtab;  // nvfp4_weight_table
  int64_t nb;         // scales per row
  __m512i idx[2];
  __m512i m = _mm512_set1_epi8(0x0f);
  __m512i odd = _mm512_maskz_set1_epi8(0xffff0000ffff0000ull, 0x10);  // in the bytes of rows 1 and 3
  Fp4Tile(const uint8_t* q_, const uint8_t* sc_, const float* wtab_, int64_t K)
      : q(q_), sc(sc_), wtab(wtab_), nb(Mx ? K / 32 : K / 16) {
    for (int p = 0; p < 2; ++p) idx[p] = load_bytes(kNvfp4Lanes[p]);
  }
  static Fp4Tile at(const m3::Linear& W, const float* wtab, int64_t r) {
    return Fp4Tile(W.w + size_t(r) * size_t(W.K / 2), W.scales + size_t(r) * size_t(Mx ? W.K / 32 : W.K / 16), wtab, W.K);
  }
  template <class Emit>
  inline void chunk(int64_t c, Emit&& emit) const {
    const __m512i v = _mm512_loadu_si512(q + c * 64);
    const __m512i lo = _mm512_ternarylogic_epi32(v, m, odd, 0xea);  // (v & m) | odd
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m, odd, 0xea);
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) {
      const __m512i d = _mm512_permutex2var_epi8(lo, idx[p], hi);
      const uint8_t* s0 = sc + (2 * p) * nb + (Mx ? c : 2 * c);
      const uint8_t* s1 = s0 + nb;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {  // block 2c + h: steps 2h, 2h + 1 (bytes 2h, 2h + 1 of each lane)
        const int sh = Mx ? 0 : h;
        const __m512 t0 = _mm512_load_ps(wtab + 16 * size_t(s0[sh])), t1 = _mm512_load_ps(wtab + 16 * size_t(s1[sh]));
        emit(2 * h, p, _mm512_permutex2var_ps(t0, h ? _mm512_srli_epi32(d, 16) : d, t1));
        emit(2 * h + 1, p, _mm512_permutex2var_ps(t0, _mm512_srli_epi32(d, 16 * h + 8), t1));
      }
    }
  }
};

using Nvfp4Tile = Fp4Tile<false>;
using Mxfp4Tile = Fp4Tile<true>;

struct Bf16Tile {
  static constexpr int kElems = 32, kLines = 4;  // four 8-element steps per chunk (K % 32 == 0)
  const uint8_t* q;
  __m512i idx[2];
  explicit Bf16Tile(const uint8_t* q_) : q(q_) {
    for (int p = 0; p < 2; ++p) idx[p] = load_bytes(kBf16Pairs[p]);
  }
  static Bf16Tile at(const m3::Linear& W, const float* /*wtab*/, int64_t r) {
    return Bf16Tile(W.w + size_t(r) * size_t(W.K) * 2);
  }
  template <class Emit>
  inline void chunk(int64_t c, Emit&& emit) const {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(q + c * 256 + 64 * j);
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) emit(j, p, _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi8(kTopHalves, idx[p], v)));
    }
  }
};

// BF16 tiles packed by pack_bf16_tiles: per 32-element chunk, the low bytes as they are; the top bytes
// from one byte shuffle per 64 weights through a 16-entry table per row built from the row's base; a
// byte interleave per 32 weights forms the BF16 words and one byte permute per 16 weights places them in
// the top half of each lane, as Bf16Tile does (same values, same order of emits: the same bits; the
// two-source byte permute, which would skip the interleave, issues once per two cycles here). Escaped
// chunks are read raw.
// After the byte interleave of low and top bytes (vpunpck[lh]bw: 128-bit lane k of the low-half result
// holds the BF16 words of bytes 16k..16k+7 of the low-byte vector, the high-half result those of
// 16k+8..16k+15), step j of pair p reads words of the j % 2 result: lane q (row q / 8 of the pair,
// element 8j + q % 8) from lane 2 (q / 8) + j / 2, word q % 8; its two bytes to bytes 2, 3 of lane q.
constexpr std::array<std::array<int8_t, 64>, 2> kBf16PackedSteps = {
    permute_bytes([](int i) { return 16 * (2 * (i / 32) + 0) + 2 * ((i / 4) % 8) + (i % 4 == 3); }),
    permute_bytes([](int i) { return 16 * (2 * (i / 32) + 1) + 2 * ((i / 4) % 8) + (i % 4 == 3); })};
struct Bf16PackedTile {
  static constexpr int kElems = 32, kLines = 3;
  const uint8_t* q;        // the tile's slots (192 bytes per chunk)
  const uint8_t* base;     // the tile's chunk bases (4 bytes per chunk)
  const uint8_t* esc;      // escaped chunks (256 raw tiled bytes each)
  __m512i idx[2], raw[2];
  __m512i m = _mm512_set1_epi8(0x0f);
  // Per 128-bit lane: the base byte of the lane's row (bytes 0..31: row 0 or 2, 32..63: row 1 or 3).
  __m512i sel[2] = {_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0x01010101, 0x01010101, 0x01010101, 0x01010101,
                                      0x01010101, 0x01010101, 0x01010101, 0x01010101),
                    _mm512_setr_epi32(0x02020202, 0x02020202, 0x02020202, 0x02020202, 0x02020202, 0x02020202,
                                      0x02020202, 0x02020202, 0x03030303, 0x03030303, 0x03030303, 0x03030303,
                                      0x03030303, 0x03030303, 0x03030303, 0x03030303)};
  // Nibble n: offset n & 7 below the base, sign n >> 3.
  __m512i offs = _mm512_set1_epi64(0x0706050403020100ll);
  __m512i signs = _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0, int(0x80808080), int(0x80808080)));
  Bf16PackedTile(const uint8_t* q_, const uint8_t* base_, const uint8_t* esc_) : q(q_), base(base_), esc(esc_) {
    for (int h = 0; h < 2; ++h) idx[h] = load_bytes(kBf16PackedSteps[size_t(h)]);
    for (int p = 0; p < 2; ++p) raw[p] = load_bytes(kBf16Pairs[size_t(p)]);
  }
  static Bf16PackedTile at(const m3::Linear& W, const float* /*wtab*/, int64_t r) {
    const int64_t chunks = W.K / 32, slots = W.N / m3::kLinearTileRows * chunks, t = r / m3::kLinearTileRows;
    return Bf16PackedTile(W.bf16_packed + t * chunks * 192, W.bf16_packed + slots * 192 + t * chunks * 4,
                          W.bf16_packed + slots * 196);
  }
  // The tile's bytes in the slot stream and per row of the base stream (prefetch).
  static size_t tile_bytes(const m3::Linear& W) { return size_t(W.K / 32) * 192; }
  template <class Emit>
  inline void chunk(int64_t c, Emit&& emit) const {
    uint32_t b;
    std::memcpy(&b, base + c * 4, 4);
    const uint8_t* slot = q + c * 192;
    if (__builtin_expect(b == m3::kBf16PackedEscape, 0)) {
      uint32_t e;
      std::memcpy(&e, slot, 4);
      const uint8_t* r = esc + size_t(e) * 256;
      for (int j = 0; j < 4; ++j) {
        const __m512i v = _mm512_loadu_si512(r + 64 * j);
        for (int p = 0; p < 2; ++p) emit(j, p, _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi8(kTopHalves, raw[p], v)));
      }
      return;
    }
    const __m512i bv = _mm512_set1_epi32(int(b));
    const __m512i nb = _mm512_loadu_si512(slot + 128);
    __m512i lo[2], hi[2];
    lo[0] = _mm512_loadu_si512(slot);
    lo[1] = _mm512_loadu_si512(slot + 64);
    const __m512i n0 = _mm512_and_si512(nb, m), n1 = _mm512_and_si512(_mm512_srli_epi16(nb, 4), m);
    hi[0] = _mm512_shuffle_epi8(_mm512_or_si512(_mm512_sub_epi8(_mm512_shuffle_epi8(bv, sel[0]), offs), signs), n0);
    hi[1] = _mm512_shuffle_epi8(_mm512_or_si512(_mm512_sub_epi8(_mm512_shuffle_epi8(bv, sel[1]), offs), signs), n1);
    const __m512i w[2][2] = {{_mm512_unpacklo_epi8(lo[0], hi[0]), _mm512_unpackhi_epi8(lo[0], hi[0])},
                             {_mm512_unpacklo_epi8(lo[1], hi[1]), _mm512_unpackhi_epi8(lo[1], hi[1])}};
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p)
        emit(j, p, _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi8(kTopHalves, idx[j / 2], w[p][j % 2])));
  }
};

// The tile's 4 rows for NT tokens (x: rows K apart; token t's outputs at y + t * N), decoded in
// registers: the decode step (NT = 1) and steps of a few tokens.
template <int NT, class D>
void tile_tokens512(const D& d, const float* x, int64_t K, int64_t N, float* y, TilePrefetch& pf) {
  __m512 acc[2][NT];
  for (int p = 0; p < 2; ++p)
    for (int t = 0; t < NT; ++t) acc[p][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / D::kElems; ++c) {
    pf.lines(D::kLines);
    d.chunk(c, [&](int j, int p, __m512 w) {
      for (int t = 0; t < NT; ++t) {
        const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * K + c * D::kElems + 8 * j));
        acc[p][t] = _mm512_fmadd_ps(xv, w, acc[p][t]);
      }
    });
  }
  for (int t = 0; t < NT; ++t)
    for (int p = 0; p < 2; ++p) {
      y[t * N + 2 * p] = hsum8(_mm512_castps512_ps256(acc[p][t]));
      y[t * N + 2 * p + 1] = hsum8(_mm512_extractf32x8_ps(acc[p][t], 1));
    }
}

// Two tiles (rows r..r+7) for NT <= 4 tokens: 4 NT FMA chains instead of 2 NT (each chain takes four
// dependent FMAs per chunk), since one tile's two chains per token are bound by the FMA latency.
template <int NT, class D>
void two_tiles_tokens(const D& d0, const D& d1, const float* x, int64_t K, int64_t N, float* y, TilePrefetch pf) {
  __m512 acc[2][2][NT];
  for (int u = 0; u < 2; ++u)
    for (int p = 0; p < 2; ++p)
      for (int t = 0; t < NT; ++t) acc[u][p][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / D::kElems; ++c) {
    pf.lines(2 * D::kLines);
    d0.chunk(c, [&](int j, int p, __m512 w) {
      for (int t = 0; t < NT; ++t)
        acc[0][p][t] = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * K + c * D::kElems + 8 * j)), w,
                                       acc[0][p][t]);
    });
    d1.chunk(c, [&](int j, int p, __m512 w) {
      for (int t = 0; t < NT; ++t)
        acc[1][p][t] = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * K + c * D::kElems + 8 * j)), w,
                                       acc[1][p][t]);
    });
  }
  for (int t = 0; t < NT; ++t)
    for (int u = 0; u < 2; ++u)
      for (int p = 0; p < 2; ++p) {
        y[t * N + 4 * u + 2 * p] = hsum8(_mm512_castps512_ps256(acc[u][p][t]));
        y[t * N + 4 * u + 2 * p + 1] = hsum8(_mm512_extractf32x8_ps(acc[u][p][t], 1));
      }
}

// One token over U (1 or 2) MXFP8 tiles from d[0] with the block scale moved onto x as an exponent
// offset: each pair's x vector (the 8 activations in both halves) gets (c - 7) << 23 added to its bits,
// row 2p's code in the low half and row 2p + 1's in the high half, and meets the placed weight unscaled.
// For a normal x whose scaled exponent field stays in [1, 254] (mxfp8_x_shift_exact; zero and subnormal
// x excluded) the added offset is the exact product x * 2^(c - 7), so the FMA multiplies the same real
// numbers as two_tiles_tokens<1> / tile_tokens512<1> (x times the exactly scaled weight), in the same
// order: bit-identical. Why: the weight's multiply shared the two FMA pipes with the FMA (two per 16
// weights), while the integer add issues on the other vector pipes. Copies of x per code (two loads and
// an insert per 16 weights, the copy's address from the code) were no faster: the address chain (code,
// then pointer, then x) cost what the multiply had.
template <int U, bool TwoSource>
void tiles_mxfp8_shifted(const Mxfp8Tile* d, const float* x, float* y, TilePrefetch pf) {
  __m512 acc[U][2];
  for (int u = 0; u < U; ++u)
    for (int p = 0; p < 2; ++p) acc[u][p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < d[0].nb; ++b) {
    pf.lines(U * Mxfp8Tile::kLines);
#pragma GCC unroll 2
    for (int u = 0; u < U; ++u)
      d[u].template chunk_shifted<TwoSource>(b, [&](int j, int p, __m512 w, __m512i off) {
        const __m512i xv = _mm512_castps_si512(_mm512_broadcast_f32x8(_mm256_loadu_ps(x + 32 * b + 8 * j)));
        acc[u][p] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_add_epi32(xv, off)), w, acc[u][p]);
      });
  }
  for (int u = 0; u < U; ++u)
    for (int p = 0; p < 2; ++p) {
      y[4 * u + 2 * p] = hsum8(_mm512_castps512_ps256(acc[u][p]));
      y[4 * u + 2 * p + 1] = hsum8(_mm512_extractf32x8_ps(acc[u][p], 1));
    }
}

// tiles_mxfp8_shifted with the byte placement chosen at run time (mxfp8_two_source_permute).
template <int U>
inline void tiles_mxfp8_shifted_at(const Mxfp8Tile* d, const float* x, float* y, const TilePrefetch& pf, bool two_source) {
  if (two_source)
    tiles_mxfp8_shifted<U, true>(d, x, y, pf);
  else
    tiles_mxfp8_shifted<U, false>(d, x, y, pf);
}

// The tile decoded to the interleaved panel layout: row i's elements [k, k + 8) at 4k + 8i, so a
// pair's step is one 512-bit vector at 4k + 16p.
// pf: lines of another tile to fetch meanwhile, D::kLines per chunk.
template <class D>
void tile_interleaved(const D& d, int64_t K, float* out, TilePrefetch& pf) {
  for (int64_t c = 0; c < K / D::kElems; ++c) {
    pf.lines(D::kLines);
    d.chunk(c, [&](int j, int p, __m512 w) { _mm512_storeu_ps(out + 4 * (c * D::kElems + 8 * j) + 16 * p, w); });
  }
}

// TL decoded tiles in the interleaved layout (tile q at w + 4Kq) times NT tokens (x rows K apart);
// token t's outputs for tile q at y + t * N + 4q.
template <int TL, int NT>
inline void panel_tokens512(const float* w, int64_t K, const float* x, int64_t N, float* y) {
  __m512 acc[2 * TL][NT];
  for (int j = 0; j < 2 * TL; ++j)
    for (int t = 0; t < NT; ++t) acc[j][t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m512 wv[2 * TL];
    for (int j = 0; j < 2 * TL; ++j) wv[j] = _mm512_loadu_ps(w + (j / 2) * 4 * K + 4 * k + 16 * (j % 2));
    for (int t = 0; t < NT; ++t) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * K + k));
      for (int j = 0; j < 2 * TL; ++j) acc[j][t] = _mm512_fmadd_ps(xv, wv[j], acc[j][t]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int j = 0; j < 2 * TL; ++j) {
      float* o = y + t * N + (j / 2) * 4 + (j % 2) * 2;
      o[0] = hsum8(_mm512_castps512_ps256(acc[j][t]));
      o[1] = hsum8(_mm512_extractf32x8_ps(acc[j][t], 1));
    }
}

// Calls f(std::integral_constant<int, n>) for n = 1..4.
template <class F>
inline void with_group_size4(int64_t n, F&& f) {
  if (n == 4) f(std::integral_constant<int, 4>());
  else with_group_size(n, std::forward<F>(f));
}

// Calls f(std::integral_constant<int, n>) for n = 1..6.
template <class F>
inline void with_tokens6(int64_t n, F&& f) {
  switch (n) {
    case 6: f(std::integral_constant<int, 6>()); break;
    case 5: f(std::integral_constant<int, 5>()); break;
    case 4: f(std::integral_constant<int, 4>()); break;
    case 3: f(std::integral_constant<int, 3>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    default: f(std::integral_constant<int, 1>()); break;
  }
}

// Whether a 512-bit decoder applies to W: tiled, and MXFP8 with codes the Scaled form takes, NVFP4 or
// MXFP4 with placed scales (wtab), or BF16 (K % 32 == 0).
inline bool tile512_applies(const m3::Linear& W, const float* wtab) {
  if (!W.tiled) return false;
  switch (W.kind) {
    case m3::LinearKind::MXFP8: return W.scale_hi <= m3::kMxfp8PrescaleMaxCode;
    case m3::LinearKind::NVFP4:
    case m3::LinearKind::MXFP4: return wtab != nullptr;
    case m3::LinearKind::BF16: return W.K % Bf16Tile::kElems == 0;
    default: return false;
  }
}

// Calls f(decoder) for the tile at row r (tile512_applies holds); the decoder's type gives the
// tile at any other row (D::at).
template <class F>
inline void with_tile512(const m3::Linear& W, const float* wtab, int64_t r, F&& f) {
  if (W.kind == m3::LinearKind::MXFP8)
    f(Mxfp8Tile::at(W, wtab, r));
  else if (W.kind == m3::LinearKind::NVFP4)
    f(Nvfp4Tile::at(W, wtab, r));
  else if (W.kind == m3::LinearKind::MXFP4)
    f(Mxfp4Tile::at(W, wtab, r));
  else
    f(Bf16Tile::at(W, wtab, r));
}

// Full tiles [r0, r1) for T tokens with the 512-bit kernels (tile512_applies(W, wtab) holds). Up to
// tile_tokens512_max tokens decode each tile in registers, in even groups of up to six tokens (1-3
// tokens: two tiles at a time), prefetching the next tile while it is below pf_end; more go through
// panels of kPanelTiles tiles decoded once to the interleaved layout, each token group then over the
// panel two tiles at a time (the panel stays in L2 while every token passes).
// xshift: an MXFP8 matrix and one token whose x takes the scales as exponent offsets (mxfp8_x_shift_exact).
void rows512(const m3::Linear& W, const float* wtab, const float* x, int64_t T, float* y, int64_t r0, int64_t r1,
             int64_t pf_end, bool xshift) {
  constexpr int64_t tr = m3::kLinearTileRows;
  const int64_t K = W.K, N = W.N;
  // Up to 16 tiles, at most 512 KiB of panel (the fastest panel size measured, docs/benchmarks.md
  // section 5).
  const int64_t kPanelTiles = std::clamp<int64_t>(131072 / (tr * K), 2, 16);
  if (T <= tile_tokens512_max(W.kind) && W.bf16_packed) {  // packed BF16 (pack_bf16_tiles)
    const size_t tb = Bf16PackedTile::tile_bytes(W);
    for (int64_t r = r0; r < r1; r += tr) {
      const Bf16PackedTile d = Bf16PackedTile::at(W, wtab, r);
      const bool more = r + 2 * tr <= pf_end;
      TilePrefetch pf(d.q + tb, more ? tb : 0);
      if (more) prefetch_range(d.base + W.K / 32 * 4, size_t(W.K / 32 * 4));
      if (T <= 3 && r + 2 * tr <= r1) {  // two tiles
        const Bf16PackedTile d1 = Bf16PackedTile::at(W, wtab, r + tr);
        TilePrefetch pf2(d.q + 2 * tb, r + 4 * tr <= pf_end ? 2 * tb : 0);
        if (r + 4 * tr <= pf_end) prefetch_range(d.base + W.K / 32 * 8, size_t(W.K / 32 * 8));
        with_group_size(T, [&](auto g) { two_tiles_tokens<decltype(g)::value>(d, d1, x, K, N, y + r, pf2); });
        r += tr;
        continue;
      }
      const int64_t groups = (T + 5) / 6;
      for (int64_t t = 0, i = 0; t < T; ++i) {
        const int64_t nt = (T - t + (groups - i) - 1) / (groups - i);
        with_tokens6(nt, [&](auto g) { tile_tokens512<decltype(g)::value>(d, x + t * K, K, N, y + t * N + r, pf); });
        t += nt;
      }
    }
    return;
  }
  if (T <= tile_tokens512_max(W.kind)) {
    const size_t eb = W.element_row_bytes(), sb = W.row_bytes() - eb;  // per row: elements, scales
    const bool two_source = xshift && m3::mxfp8_two_source_permute();
    // MXFP8 also takes 4, 7 and 8 tokens two tiles at a time, in groups of at most 4 (4 + 3, 4 + 4):
    // with one tile, 4 tokens read 0.86x the rate of 3 (BM_mxfp8_few_tokens, Zen 5: 230 against 242
    // GFLOP/s) and two tiles give 270. NVFP4's 4 tokens went the other way (300-328 against 279-282
    // with two tiles), and 5-6 tokens in one group of one tile beat two groups of two.
    const bool mx_two = W.kind == m3::LinearKind::MXFP8 && (T == 4 || T == 7 || T == 8);
    for (int64_t r = r0; r < r1; r += tr) {
      if ((T <= 3 || mx_two) && r + 2 * tr <= r1) {  // two tiles
        const bool more = r + 4 * tr <= pf_end;
        TilePrefetch pf(W.w + size_t(r + 2 * tr) * eb, more ? size_t(2 * tr) * eb : 0);
        if (more && sb) prefetch_range(W.scales + size_t(r + 2 * tr) * sb, size_t(2 * tr) * sb);
        with_tile512(W, wtab, r, [&](const auto& d0) {
          using D = std::decay_t<decltype(d0)>;
          const D d1 = D::at(W, wtab, r + tr);
          if constexpr (std::is_same_v<D, Mxfp8Tile>) {
            if (xshift) {
              const Mxfp8Tile d[2] = {d0, d1};
              tiles_mxfp8_shifted_at<2>(d, x, y + r, pf, two_source);
              return;
            }
          }
          for (int64_t t = 0; t < T; t += 4)
            with_group_size4(std::min<int64_t>(4, T - t), [&](auto g) {
              two_tiles_tokens<decltype(g)::value>(d0, d1, x + t * K, K, N, y + t * N + r, pf);
            });
        });
        r += tr;
        continue;
      }
      const bool more = r + 2 * tr <= pf_end;
      TilePrefetch pf(W.w + size_t(r + tr) * eb, more ? size_t(tr) * eb : 0);
      if (more && sb) prefetch_range(W.scales + size_t(r + tr) * sb, size_t(tr) * sb);
      with_tile512(W, wtab, r, [&](const auto& d) {
        if constexpr (std::is_same_v<std::decay_t<decltype(d)>, Mxfp8Tile>) {
          if (xshift) {
            tiles_mxfp8_shifted_at<1>(&d, x, y + r, pf, two_source);
            return;
          }
        }
        // Groups of at most six tokens, as even as possible (8 tokens: 4 + 4, not 6 + 2).
        const int64_t groups = (T + 5) / 6;
        for (int64_t t = 0, i = 0; t < T; ++i) {
          const int64_t nt = (T - t + (groups - i) - 1) / (groups - i);
          with_tokens6(nt, [&](auto g) { tile_tokens512<decltype(g)::value>(d, x + t * K, K, N, y + t * N + r, pf); });
          t += nt;
        }
      });
    }
    return;
  }
  static thread_local m3::AlignedVector<float> panel;  // grown on demand
  if (panel.size() < size_t(kPanelTiles * tr * K)) panel.resize(size_t(kPanelTiles * tr * K));
  for (int64_t p0 = r0; p0 < r1; p0 += kPanelTiles * tr) {
    const int64_t np = std::min(kPanelTiles, (r1 - p0) / tr);
    // While a tile is decoded, the same tile of the next panel is fetched (up to pf_end): the decode
    // reads the weights from memory, and without the prefetch it ran at about half the read rate of
    // the one-token kernel (docs/benchmarks.md section 5).
    const size_t eb = W.element_row_bytes(), sb = W.row_bytes() - eb;
    for (int64_t q = 0; q < np; ++q) {
      const int64_t nr = p0 + (q + np) * tr;
      const bool more = nr + tr <= pf_end;
      TilePrefetch pf(W.w + size_t(nr) * eb, more ? size_t(tr) * eb : 0);
      if (more && sb) prefetch_range(W.scales + size_t(nr) * sb, size_t(tr) * sb);
      with_tile512(W, wtab, p0 + q * tr, [&](const auto& d) { tile_interleaved(d, K, panel.data() + q * tr * K, pf); });
    }
    for (int64_t t = 0; t < T;) {
      const int64_t nt = std::min<int64_t>(6, T - t);
      with_tokens6(nt, [&](auto g) {
        constexpr int NT = decltype(g)::value;
        int64_t q = 0;
        for (; q + 2 <= np; q += 2)
          panel_tokens512<2, NT>(panel.data() + q * tr * K, K, x + t * K, N, y + t * N + p0 + q * tr);
        if (q < np) panel_tokens512<1, NT>(panel.data() + q * tr * K, K, x + t * K, N, y + t * N + p0 + q * tr);
      });
      t += nt;
    }
  }
}

}  // namespace
}  // namespace m3::cpu
