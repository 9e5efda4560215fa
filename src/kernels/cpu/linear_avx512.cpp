// The matmul part of the avx512 kernel table: linear_kernels.h compiled with the avx512 flags (CMakeLists.txt).
#include "kernels/cpu/linear_kernels.h"

namespace m3::isa_avx512 {
const LinearOps kLinearOps = cpu::kLinearTable;
}  // namespace m3::isa_avx512
