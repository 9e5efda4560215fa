// The GEMM part of the avx2 kernel build: gemm_kernels.h compiled with the avx2 flags (CMakeLists.txt).
#include "kernels/cpu/gemm_kernels.h"

namespace m3::isa_avx2 {
const GemmOps kGemmOps = M3_GEMM_OPS("avx2");
}  // namespace m3::isa_avx2
