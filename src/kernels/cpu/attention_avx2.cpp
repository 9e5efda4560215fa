// The attention part of the avx2 kernel table: attention_kernels.h compiled with the avx2 flags (CMakeLists.txt).
#include "kernels/cpu/attention_kernels.h"

namespace m3::isa_avx2 {
const AttentionOps kAttentionOps = cpu::kAttentionTable;
}  // namespace m3::isa_avx2
