// The GEMM part of the avx512 kernel build: gemm_kernels.h compiled with the avx512 flags (CMakeLists.txt).
#include "kernels/cpu/gemm_kernels.h"

namespace m3::isa_avx512 {
const GemmOps kGemmOps = M3_GEMM_OPS("avx512");
}  // namespace m3::isa_avx512
