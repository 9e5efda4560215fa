// The attention part of the avx512 kernel table: attention_kernels.h compiled with the avx512 flags (CMakeLists.txt).
#include "kernels/cpu/attention_kernels.h"

namespace m3::isa_avx512 {
const AttentionOps kAttentionOps = cpu::kAttentionTable;
}  // namespace m3::isa_avx512
