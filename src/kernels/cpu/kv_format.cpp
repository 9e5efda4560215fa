// KV cache row encoding (see kv_format.h).
#include "kernels/cpu/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/dtype.h"
#include "formats/quantize.h"
#include "kernels/cpu/element_tables.h"

namespace m3 {

const char* kv_dtype_name(KVDtype d) {
  switch (d) {
    case KVDtype::F32: return "fp32";
    case KVDtype::BF16: return "bf16";
    case KVDtype::FP8: return "fp8";
    case KVDtype::NVFP4: return "nvfp4";
  }
  return "?";
}

size_t kv_row_bytes(KVDtype d, int dim) {
  switch (d) {
    case KVDtype::F32: return size_t(dim) * 4;
    case KVDtype::BF16: return size_t(dim) * 2;
    case KVDtype::FP8: return size_t(dim);
    case KVDtype::NVFP4: return size_t(dim) / 2 + size_t(dim) / 16;
  }
  return 0;
}

void kv_encode_row(KVDtype d, const float* x, int dim, float scale, uint8_t* dst) {
  switch (d) {
    case KVDtype::F32:
      std::memcpy(dst, x, size_t(dim) * 4);
      return;
    case KVDtype::BF16:
      for (int i = 0; i < dim; ++i) {
        const uint16_t b = float_to_bf16(x[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      return;
    case KVDtype::FP8: {
      const float inv = 1.0f / scale;
      for (int i = 0; i < dim; ++i) dst[i] = float_to_e4m3(x[i] * inv);
      return;
    }
    case KVDtype::NVFP4: {
      // Per 16 elements: s = E4M3(amax / 6) (global 1), codes = E2M1(x / s).
      uint8_t* packed = dst;
      uint8_t* scales = dst + dim / 2;
      const float* e4 = element_tables().e4m3.data();
      for (int b = 0; b < dim / 16; ++b) {
        float amax = 0.f;
        for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[b * 16 + j]));
        const uint8_t sb = float_to_e4m3(amax / 6.0f);
        scales[b] = sb;
        const float s = e4[sb];
        const float mul = s != 0.f ? 1.0f / s : 0.f;
        for (int j = 0; j < 8; ++j) {
          const uint8_t lo = float_to_e2m1(x[b * 16 + 2 * j] * mul) & 0xf;
          const uint8_t hi = float_to_e2m1(x[b * 16 + 2 * j + 1] * mul) & 0xf;
          packed[b * 8 + j] = uint8_t(lo | (hi << 4));
        }
      }
      return;
    }
  }
}

void kv_decode_row(KVDtype d, const uint8_t* src, int dim, float scale, float* out) {
  const ElementTables& t = element_tables();
  switch (d) {
    case KVDtype::F32:
      std::memcpy(out, src, size_t(dim) * 4);
      return;
    case KVDtype::BF16: {
      // Rows are 2-byte aligned in the pool; a plain widening loop the compiler vectorises.
      const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
      uint32_t* o = reinterpret_cast<uint32_t*>(out);
      for (int i = 0; i < dim; ++i) o[i] = uint32_t(h[i]) << 16;
      return;
    }
    case KVDtype::FP8:
      for (int i = 0; i < dim; ++i) out[i] = t.e4m3[src[i]] * scale;
      return;
    case KVDtype::NVFP4: {
      const uint8_t* packed = src;
      const uint8_t* scales = src + dim / 2;
      for (int b = 0; b < dim / 16; ++b) {
        const float s = t.e4m3[scales[b]];
        for (int j = 0; j < 8; ++j) {
          const uint8_t byte = packed[b * 8 + j];
          out[b * 16 + 2 * j] = t.e2m1[byte & 15] * s;
          out[b * 16 + 2 * j + 1] = t.e2m1[byte >> 4] * s;
        }
      }
      return;
    }
  }
}

}  // namespace m3
