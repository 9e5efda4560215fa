// Weight rows and 4-row tiles of a Linear decoded to fp32 (every ISA; the avx2 and avx512 builds use
// the AVX2 decoders): the scratch the batched kernels multiply, and CpuOps::decode_rows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>
#include <immintrin.h>

#include "formats/dtype.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/element_tables.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/linear.h"
#ifdef M3_KERNELS_AVX2
#include <immintrin.h>

#include "kernels/cpu/linear_avx2.h"
#include "kernels/cpu/simd_avx2.h"
#endif

namespace m3::cpu {
namespace {

// Row r's element bytes in row-major order: in place, or (a row of a tile of a tiled matrix) gathered
// into a per-thread buffer grown only (no allocation in steady state).
const uint8_t* row_elements(const m3::Linear& W, int64_t r) {
  const int64_t rb = int64_t(W.element_row_bytes());
  if (!W.tiled || r >= W.N / m3::kLinearTileRows * m3::kLinearTileRows) return W.w + size_t(r) * size_t(rb);
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < size_t(rb)) buf.resize(size_t(rb));
  const int64_t cb = m3::tile_chunk_bytes(W), i = r % m3::kLinearTileRows;
  const uint8_t* tile = W.w + size_t(r - i) * size_t(rb);
  for (int64_t c = 0; c < rb / cb; ++c) {
    const uint8_t* chunk = tile + (c * m3::kLinearTileRows + i) * cb;
    if (W.kind == m3::LinearKind::NVFP4 || W.kind == m3::LinearKind::MXFP4)
      m3::nvfp4_chunk_nibbles(chunk, buf.data() + c * cb, false);
    else
      std::memcpy(buf.data() + c * cb, chunk, size_t(cb));
  }
  return buf.data();
}

void decode_row(const m3::Linear& W, int64_t r, float* __restrict out) {
  const int64_t K = W.K;
  switch (W.kind) {
    case m3::LinearKind::F32:
      std::memcpy(out, W.w + size_t(r) * K * 4, size_t(K) * 4);
      break;
    case m3::LinearKind::BF16: {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(row_elements(W, r));
      int64_t k0 = 0;
#ifdef M3_KERNELS_AVX2
      for (; k0 + 8 <= K; k0 += 8) bf16x8_to_f32(s + k0, out + k0);
#endif
      for (int64_t k = k0; k < K; ++k) {
        uint32_t u = uint32_t(s[k]) << 16;
        std::memcpy(out + k, &u, 4);
      }
      break;
    }
    case m3::LinearKind::F16: {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(W.w) + size_t(r) * K;
      for (int64_t k = 0; k < K; ++k) out[k] = m3::f16_to_float(s[k]);
      break;
    }
    case m3::LinearKind::MXFP8: {
      const uint8_t* q = row_elements(W, r);
      const uint8_t* sc = W.scales + size_t(r) * (K / 32);
#ifdef M3_KERNELS_AVX2
      mxfp8_row_decode(q, sc, K, out);
#else
      const float* tab = m3::element_tables().e4m3.data();
      for (int64_t b = 0; b < K / 32; ++b) {
        const float s = m3::e8m0_to_float(sc[b]);
        for (int j = 0; j < 32; ++j) out[b * 32 + j] = tab[q[b * 32 + j]] * s;
      }
#endif
      break;
    }
    case m3::LinearKind::NVFP4: {
      const float* tab = m3::element_tables().e4m3.data();
      const float* e2 = m3::element_tables().e2m1.data();
      const uint8_t* p = row_elements(W, r);
      const uint8_t* sc = W.scales + size_t(r) * (K / 16);
      const float g = W.global_div;
      for (int64_t b = 0; b < K / 16; ++b) {
        const float s = tab[sc[b]];
        // Exact product in fp32, then one rounding for the division (the reference convention).
#ifdef M3_KERNELS_AVX2
        (void)e2;
        e2m1x16_to_f32(p + b * 8, (s * 0.5f) / g, out + b * 16);
        continue;
#endif
        for (int j = 0; j < 8; ++j) {
          const uint8_t byte = p[b * 8 + j];
          out[b * 16 + 2 * j] = (e2[byte & 15] * s) / g;
          out[b * 16 + 2 * j + 1] = (e2[byte >> 4] * s) / g;
        }
      }
      break;
    }
    case m3::LinearKind::MXFP4: {
      // e2m1 * 2^(code - 127): exact in fp32 for every code pair (mxfp4_dequant_row's values).
      const float* e2 = m3::element_tables().e2m1.data();
      const uint8_t* p = row_elements(W, r);
      const uint8_t* sc = W.scales + size_t(r) * (K / 32);
      for (int64_t b = 0; b < K / 32; ++b) {
        const float s = m3::e8m0_to_float(sc[b]);
#ifdef M3_KERNELS_AVX2
        (void)e2;
        e2m1x16_to_f32(p + b * 16, s * 0.5f, out + b * 32);  // codes decode to twice their value
        e2m1x16_to_f32(p + b * 16 + 8, s * 0.5f, out + b * 32 + 16);
        continue;
#endif
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = p[b * 16 + j];
          out[b * 32 + 2 * j] = e2[byte & 15] * s;
          out[b * 32 + 2 * j + 1] = e2[byte >> 4] * s;
        }
      }
      break;
    }
    case m3::LinearKind::None:
      std::memset(out, 0, size_t(K) * 4);
      break;
  }
}

#ifdef M3_KERNELS_AVX2
// One row's 16-byte chunk of a tiled NVFP4 matrix (blocks 2c in the low nibbles, 2c + 1 in the high
// ones) decoded to 32 floats at out, the blocks scaled by s0 and s1.
inline void nvfp4_tile_chunk(const uint8_t* chunk, float s0, float s1, float* out) {
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk));
  __m256 a0, a1, a2, a3;
  e2m1_twice_to_ps(e2m1_twice(_mm_and_si128(b, m)), s0, a0, a1);
  e2m1_twice_to_ps(e2m1_twice(_mm_and_si128(_mm_srli_epi16(b, 4), m)), s1, a2, a3);
  _mm256_storeu_ps(out, a0);
  _mm256_storeu_ps(out + 8, a1);
  _mm256_storeu_ps(out + 16, a2);
  _mm256_storeu_ps(out + 24, a3);
}
#endif

// The 4 rows of the tile at row r (r % 4 == 0, r + 4 <= N) decoded to fp32, out[i * K + k]: equal to
// decode_row for each row, bit for bit (the same per-element arithmetic). A tiled matrix is read
// in its tiled order directly (speed: gathering each row's chunks through row_elements costs one
// memcpy per 32-byte chunk, and for NVFP4 a scalar nibble reshuffle; steps of a few tokens, which
// decode every tile for those tokens only, gain most).
void decode_tile(const m3::Linear& W, int64_t r, float* __restrict out) {
  const int64_t K = W.K;
#ifdef M3_KERNELS_AVX2
  const uint8_t* tile = W.w + size_t(r) * W.element_row_bytes();
  if (W.tiled && W.kind == m3::LinearKind::MXFP8) {  // chunk = one 32-element block
    for (int i = 0; i < m3::kLinearTileRows; ++i)
      mxfp8_row_decode(tile + i * 32, W.scales + size_t(r + i) * (K / 32), K, out + i * K, 32 * m3::kLinearTileRows);
    return;
  }
  if (W.tiled && W.kind == m3::LinearKind::NVFP4) {  // chunk = 16 bytes, blocks 2c (low nibbles), 2c + 1 (high)
    const float* e4 = m3::element_tables().e4m3.data();
    const float g = W.global_div;
    for (int i = 0; i < m3::kLinearTileRows; ++i) {
      const uint8_t* sc = W.scales + size_t(r + i) * (K / 16);
      for (int64_t c = 0; c < K / 32; ++c)
        nvfp4_tile_chunk(tile + (c * m3::kLinearTileRows + i) * 16, (e4[sc[2 * c]] * 0.5f) / g,
                         (e4[sc[2 * c + 1]] * 0.5f) / g, out + i * K + c * 32);
    }
    return;
  }
  if (W.tiled && W.kind == m3::LinearKind::MXFP4) {  // chunk = 16 bytes, one block: elements j low, 16 + j high
    for (int i = 0; i < m3::kLinearTileRows; ++i) {
      const uint8_t* sc = W.scales + size_t(r + i) * (K / 32);
      for (int64_t c = 0; c < K / 32; ++c) {
        const float s = m3::e8m0_to_float(sc[c]) * 0.5f;
        nvfp4_tile_chunk(tile + (c * m3::kLinearTileRows + i) * 16, s, s, out + i * K + c * 32);
      }
    }
    return;
  }
  if (W.tiled && W.kind == m3::LinearKind::BF16) {  // chunk = 8 elements: row i's [k, k + 8) at 4k + 8i
    const uint16_t* h = reinterpret_cast<const uint16_t*>(tile);
    for (int i = 0; i < m3::kLinearTileRows; ++i)
      for (int64_t k = 0; k < K; k += 8) bf16x8_to_f32(h + 4 * k + 8 * i, out + i * K + k);
    return;
  }
#endif
  for (int i = 0; i < m3::kLinearTileRows; ++i) decode_row(W, r + i, out + i * K);
}

#ifdef M3_KERNELS_AVX2
// decode_tile's NVFP4 block scale for every E4M3 code, (E4M3(c) / 2) / global divisor: the same values,
// one division per code and call instead of one per 16 weights (lane_decode_pack_tiled).
void nvfp4_block_scales(const m3::Linear& W, float* scales) {
  const float* e4 = m3::element_tables().e4m3.data();
  for (int c = 0; c < 256; ++c) scales[c] = (e4[c] * 0.5f) / W.global_div;
}
#endif

void decode_rows_impl(const m3::Linear& W, int64_t r0, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) decode_row(W, r0 + i, out + i * W.K);
}

}  // namespace
}  // namespace m3::cpu
