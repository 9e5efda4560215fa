// Paged KV cache rows (BF16, FP8 E4M3, NVFP4) decoded to fp32: CpuOps::decode_kv_rows, and the
// fallback of the attention kernels for shapes they do not decode in registers. Every ISA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

#include "formats/dtype.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/element_tables.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/kv_format.h"
#ifdef M3_KERNELS_AVX2
#include <immintrin.h>

#include "kernels/cpu/simd_avx2.h"
#endif

namespace m3::cpu {
namespace {

// Paged KV rows (see CpuOps::decode_kv_rows). Products are exact (E2M1 x E4M3, E4M3 x 2^8), so
// the vector paths equal the scalar reference bit for bit. (E4M3 NaN codes never occur: the cache
// encoder saturates.)
void decode_kv_rows_impl(m3::KVDtype kind, const uint8_t* src, int64_t stride, int64_t n, int dim, float* out) {
  const float* e4 = m3::element_tables().e4m3.data();
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* row = src + r * stride;
    float* o = out + r * dim;
    int d0 = 0;
    switch (kind) {
      case m3::KVDtype::F32:
        std::memcpy(o, row, size_t(dim) * 4);
        break;
      case m3::KVDtype::BF16: {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(row);
#ifdef M3_KERNELS_AVX2
        for (; d0 + 8 <= dim; d0 += 8) bf16x8_to_f32(h + d0, o + d0);
#endif
        for (int d = d0; d < dim; ++d) o[d] = m3::bf16_to_float(h[d]);
        break;
      }
      case m3::KVDtype::FP8: {
#ifdef M3_KERNELS_AVX2
        const __m256 k256 = _mm256_set1_ps(256.0f);
        for (; d0 + 32 <= dim; d0 += 32) {
          __m256i ha, hb;
          e4m3x32_to_h(row + d0, ha, hb);
          _mm256_storeu_ps(o + d0, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(ha)), k256));
          _mm256_storeu_ps(o + d0 + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(hb)), k256));
          _mm256_storeu_ps(o + d0 + 16, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(ha, 1)), k256));
          _mm256_storeu_ps(o + d0 + 24, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(hb, 1)), k256));
        }
#endif
        for (int d = d0; d < dim; ++d) o[d] = e4[row[d]];
        break;
      }
      case m3::KVDtype::NVFP4: {
        const uint8_t* sc = row + dim / 2;
        for (int b = 0; b < dim / 16; ++b) {
          const float s = e4[sc[b]];
#ifdef M3_KERNELS_AVX2
          e2m1x16_to_f32(row + b * 8, s * 0.5f, o + b * 16);
#else
          const float* e2 = m3::element_tables().e2m1.data();
          for (int j = 0; j < 8; ++j) {
            const uint8_t byte = row[b * 8 + j];
            o[b * 16 + 2 * j] = e2[byte & 15] * s;
            o[b * 16 + 2 * j + 1] = e2[byte >> 4] * s;
          }
#endif
        }
        break;
      }
    }
  }
}

}  // namespace
}  // namespace m3::cpu
