// The cpuid probe (see cpu_features.h).
#include "kernels/cpu/cpu_features.h"

namespace m3 {

namespace {
CpuFeatures probe() {
  __builtin_cpu_init();
  CpuFeatures f;
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
  f.gfni = __builtin_cpu_supports("gfni");
  f.avx512_kernels = f.avx2_fma && f.avx512f && f.avx512bw && __builtin_cpu_supports("avx512vl") &&
                     __builtin_cpu_supports("avx512dq") && f.avx512vbmi && __builtin_cpu_supports("avx512vnni") &&
                     f.gfni;
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  f.amd = __builtin_cpu_is("amd");
  return f;
}
}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = probe();
  return f;
}

}  // namespace m3
