// The attention part of the generic kernel table: attention_kernels.h compiled with the generic flags (CMakeLists.txt).
#include "kernels/cpu/attention_kernels.h"

namespace m3::isa_generic {
const AttentionOps kAttentionOps = cpu::kAttentionTable;
}  // namespace m3::isa_generic
