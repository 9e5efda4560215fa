// The GEMM part of the generic kernel build: gemm_kernels.h compiled with the generic flags (CMakeLists.txt).
#include "kernels/cpu/gemm_kernels.h"

namespace m3::isa_generic {
const GemmOps kGemmOps = M3_GEMM_OPS("generic");
}  // namespace m3::isa_generic
