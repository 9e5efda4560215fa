// What this CPU can run, probed once from cpuid: the one place that asks (kernel dispatch, the
// avx512 build's BF16 dot products and byte-permute choice, the roofline and machine benchmarks).
#pragma once

namespace m3 {

struct CpuFeatures {
  bool avx2_fma = false;  // AVX2 + FMA: the avx2 kernel build
  bool avx512f = false;   // AVX-512 Foundation (the roofline's 512-bit FMA probe)
  bool avx512bw = false, avx512vbmi = false, gfni = false;  // with avx512f: machine_bench's probes
  // Every extension the avx512 kernel build is compiled for (F, BW, VL, DQ, VBMI, VNNI, GFNI), and AVX2.
  bool avx512_kernels = false;
  bool avx512bf16 = false;  // vdpbf16ps (linear_bf16_dot.h)
  bool amd = false;         // vendor AMD (cheap two-source byte permutes; see set_mxfp8_permute_form)
};

const CpuFeatures& cpu_features();

}  // namespace m3
