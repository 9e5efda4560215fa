// Chooses the kernel table for this CPU (see dispatch.h).
#include "kernels/cpu/dispatch.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "kernels/cpu/cpu_features.h"

namespace m3 {

namespace {
// Built on first use (not at static initialisation: the parts live in other translation units).
const CpuOps& generic_ops() {
  static const CpuOps ops{isa_generic::kLinearOps, isa_generic::kAttentionOps, "generic"};
  return ops;
}
const CpuOps& avx2_ops() {
  static const CpuOps ops{isa_avx2::kLinearOps, isa_avx2::kAttentionOps, "avx2"};
  return ops;
}
const CpuOps& avx512_ops() {
  static const CpuOps ops{isa_avx512::kLinearOps, isa_avx512::kAttentionOps, "avx512"};
  return ops;
}
}  // namespace

const CpuOps* cpu_ops_for(const char* isa) {
  const CpuFeatures& f = cpu_features();
  if (!std::strcmp(isa, "generic")) return &generic_ops();
  if (!std::strcmp(isa, "avx2")) return f.avx2_fma ? &avx2_ops() : nullptr;
  if (!std::strcmp(isa, "avx512")) return f.avx512_kernels ? &avx512_ops() : nullptr;
  return nullptr;
}

const CpuOps& cpu_ops() {
  static const CpuOps* ops = [] {
    if (const char* forced = std::getenv("M3_ISA"); forced && *forced) {
      const CpuOps* o = cpu_ops_for(forced);
      if (!o) throw Error(std::string("M3_ISA=") + forced + ": unknown or not supported by this CPU (generic, avx2, avx512)");
      return o;
    }
    const CpuFeatures& f = cpu_features();
    if (f.avx512_kernels) return &avx512_ops();
    if (f.avx2_fma) return &avx2_ops();
    return &generic_ops();
  }();
  return *ops;
}

}  // namespace m3
