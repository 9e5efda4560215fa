// The matmul part of the avx2 kernel table: linear_kernels.h compiled with the avx2 flags (CMakeLists.txt).
#include "kernels/cpu/linear_kernels.h"

namespace m3::isa_avx2 {
const LinearOps kLinearOps = cpu::kLinearTable;
}  // namespace m3::isa_avx2
