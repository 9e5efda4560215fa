// The matmul part of the generic kernel table: linear_kernels.h compiled with the generic flags (CMakeLists.txt).
#include "kernels/cpu/linear_kernels.h"

namespace m3::isa_generic {
const LinearOps kLinearOps = cpu::kLinearTable;
}  // namespace m3::isa_generic
