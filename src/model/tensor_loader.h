// TensorLoader: typed, checked access to a checkpoint's tensors (shape, dtype, quantised-linear
// format by suffix); every failure names the tensor, its file and what was expected. Shared by the
// target model's Weights and the DSpark draft.
#pragma once
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "base/error.h"
#include "formats/safetensors.h"
#include "kernels/cpu/linear.h"
#include "model/config.h"

namespace m3 {

inline std::string shape_of(std::initializer_list<int64_t> s) {
  std::string r = "[";
  size_t i = 0;
  for (int64_t d : s) r += (i++ ? ", " : "") + std::to_string(d);
  return r + "]";
}

class TensorLoader {
 public:
  explicit TensorLoader(const TensorStore& st) : st_(st) {}

  const TensorView& tensor(const std::string& name) const {
    const TensorView* v = st_.find(name);
    if (!v) throw Error(st_.dir() + ": missing tensor " + name);
    return *v;
  }

  void expect_shape(const TensorView& v, std::initializer_list<int64_t> shape) const {
    if (v.shape != std::vector<int64_t>(shape))
      throw Error(where(v) + ": shape " + v.shape_str() + ", expected " + shape_of(shape) + " (from config.json)");
  }
  void expect_dtype(const TensorView& v, std::initializer_list<DType> ok, const char* what) const {
    for (DType d : ok)
      if (v.dtype == d) return;
    throw Error(where(v) + ": dtype " + dtype_name(v.dtype) + ", expected " + what);
  }
  std::string where(const TensorView& v) const { return st_.dir() + "/" + v.file + ": tensor " + v.name; }

  // A [n] vector (norm gamma, bias) as fp32; `plus_one` stores the Gemma scale 1 + w (in fp32).
  std::vector<float> vec(const std::string& name, int64_t n, bool plus_one) const {
    const TensorView& v = tensor(name);
    expect_dtype(v, {DType::BF16, DType::F16, DType::F32}, "BF16, F16 or F32");
    expect_shape(v, {n});
    std::vector<float> out(n);
    to_float(v, out.data());
    if (plus_one)
      for (float& x : out) x += 1.0f;
    return out;
  }

  // A small matrix (the router) as fp32.
  std::vector<float> matrix_f32(const std::string& name, int64_t r, int64_t c) const {
    const TensorView& v = tensor(name);
    expect_dtype(v, {DType::BF16, DType::F16, DType::F32}, "F32 (or BF16/F16)");
    expect_shape(v, {r, c});
    std::vector<float> out(size_t(r * c));
    to_float(v, out.data());
    return out;
  }

  // A linear `base` with out N and in K, stored as base.weight (plain or MXFP8 with
  // base.weight_scale_inv) or base.weight_packed (NVFP4 compressed-tensors).
  Linear linear(const std::string& base, int64_t N, int64_t K, WeightFormat expect) const {
    Linear L;
    L.name = base;
    L.N = N;
    L.K = K;
    if (st_.has(base + ".weight_packed")) {
      const TensorView& p = tensor(base + ".weight_packed");
      if (expect != WeightFormat::NVFP4)
        throw Error(where(p) + ": NVFP4 weight found, but config.json quantization_config implies " +
                    weight_format_name(expect) + " for this tensor");
      if (K % 16) throw Error(where(p) + ": in-features " + std::to_string(K) + " not a multiple of 16 (NVFP4 block)");
      expect_dtype(p, {DType::U8, DType::I8}, "U8 (two E2M1 codes per byte)");
      expect_shape(p, {N, K / 2});
      const TensorView& s = tensor(base + ".weight_scale");
      expect_dtype(s, {DType::F8_E4M3}, "F8_E4M3 (one scale per 16 elements)");
      expect_shape(s, {N, K / 16});
      const TensorView& g = tensor(base + ".weight_global_scale");
      expect_dtype(g, {DType::F32}, "F32 scalar");
      if (g.numel() != 1) throw Error(where(g) + ": shape " + g.shape_str() + ", expected a scalar ([] or [1])");
      float gv;
      std::memcpy(&gv, g.data, 4);
      if (!std::isfinite(gv) || gv <= 0)
        throw Error(where(g) + ": value " + std::to_string(gv) + ", expected a positive finite divisor");
      if (const size_t i = find_e4m3_nan(s.data, s.nbytes); i < s.nbytes)
        throw Error(where(s) + ": NaN E4M3 scale byte at index " + std::to_string(i));
      L.kind = LinearKind::NVFP4;
      L.w = p.data;
      L.scales = s.data;
      L.global_div = gv;
      return L;
    }
    const TensorView& w = tensor(base + ".weight");
    if (expect == WeightFormat::MXFP4) {
      // Quark OCP MXFP4 (docs/formats.md section 4): weight U8 [N, K/2] (element 2i in the low nibble),
      // weight_scale U8 [N, K/32] (E8M0).
      if (K % 32) throw Error(where(w) + ": in-features " + std::to_string(K) + " not a multiple of 32 (MXFP4 block)");
      if (!st_.has(base + ".weight_scale"))
        throw Error(where(w) + ": " + dtype_name(w.dtype) + " weight without " + base +
                    ".weight_scale, but config.json quantization_config (quark) makes this module MXFP4 (it is not "
                    "in its exclude list)");
      expect_dtype(w, {DType::U8}, "U8 (two E2M1 codes per byte, MXFP4)");
      expect_shape(w, {N, K / 2});
      const TensorView& s = tensor(base + ".weight_scale");
      expect_dtype(s, {DType::U8}, "U8 (E8M0 scale bytes, one per 32 elements)");
      expect_shape(s, {N, K / 32});
      for (size_t i = 0; i < s.nbytes; ++i)
        if (s.data[i] == 0xff) throw Error(where(s) + ": E8M0 scale byte 0xFF (NaN) at index " + std::to_string(i));
      L.kind = LinearKind::MXFP4;
      L.w = w.data;
      L.scales = s.data;
      set_scale_range(L);
      return L;
    }
    if (w.dtype == DType::U8 && st_.has(base + ".weight_scale"))
      throw Error(where(w) + ": MXFP4 weight found (U8 with " + base + ".weight_scale), but config.json " +
                  "quantization_config implies " + weight_format_name(expect) + " for this tensor" +
                  (expect == WeightFormat::Plain ? " (a quark exclude entry names it, or there is no quark config)" : ""));
    if (st_.has(base + ".weight_scale_inv")) {
      if (expect != WeightFormat::MXFP8)
        throw Error(where(w) + ": MXFP8 weight found, but config.json quantization_config implies " +
                    weight_format_name(expect) + " for this tensor");
      if (K % 32) throw Error(where(w) + ": in-features " + std::to_string(K) + " not a multiple of 32 (MXFP8 block)");
      expect_dtype(w, {DType::F8_E4M3}, "F8_E4M3 (MXFP8 elements)");
      expect_shape(w, {N, K});
      const TensorView& s = tensor(base + ".weight_scale_inv");
      expect_dtype(s, {DType::U8}, "U8 (E8M0 scale bytes)");
      expect_shape(s, {N, K / 32});
      for (size_t i = 0; i < s.nbytes; ++i)
        if (s.data[i] == 0xff) throw Error(where(s) + ": E8M0 scale byte 0xFF (NaN) at index " + std::to_string(i));
      // Every element byte is read once here (in memory or through the mapping): the fast kernels
      // would read a NaN code as a finite value, and a NaN weight poisons every logit anyway.
      if (const size_t i = find_e4m3_nan(w.data, w.nbytes); i < w.nbytes)
        throw Error(where(w) + ": NaN E4M3 element byte 0x" + (w.data[i] & 0x80 ? std::string("FF") : std::string("7F")) +
                    " at row " + std::to_string(int64_t(i) / K) + ", column " + std::to_string(int64_t(i) % K) +
                    " (MXFP8 weights hold finite values; quantisers do not emit NaN)");
      L.kind = LinearKind::MXFP8;
      L.w = w.data;
      L.scales = s.data;
      set_scale_range(L);
      return L;
    }
    if (w.dtype == DType::F8_E4M3)
      throw Error(where(w) + ": F8_E4M3 weight without " + base + ".weight_scale_inv (MXFP8 needs its scales)");
    if (expect != WeightFormat::Plain)
      throw Error(where(w) + ": " + dtype_name(w.dtype) + " weight, but config.json quantization_config says " +
                  weight_format_name(expect) + " (expected " + base +
                  (expect == WeightFormat::NVFP4 ? ".weight_packed)" : ".weight_scale_inv)"));
    expect_dtype(w, {DType::BF16, DType::F16, DType::F32}, "BF16, F16 or F32");
    expect_shape(w, {N, K});
    L.kind = w.dtype == DType::BF16 ? LinearKind::BF16 : w.dtype == DType::F16 ? LinearKind::F16 : LinearKind::F32;
    L.w = w.data;
    return L;
  }

  // Any BF16 / F16 / F32 tensor to fp32 (out has numel() floats).
  static void to_float(const TensorView& v, float* out) {
    const int64_t n = v.numel();
    for (int64_t i = 0; i < n; ++i) {
      if (v.dtype == DType::F32) {
        std::memcpy(out + i, v.data + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, v.data + 2 * i, 2);
        out[i] = v.dtype == DType::BF16 ? bf16_to_float(h) : f16_to_float(h);
      }
    }
  }

 private:
  const TensorStore& st_;
};


}  // namespace m3
