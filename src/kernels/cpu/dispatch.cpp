// Chooses the kernel table for this CPU (see dispatch.h).
#include "kernels/cpu/dispatch.h"

#include <cstdlib>
#include <cstring>

#include "formats/error.h"

namespace m3 {

namespace {
bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool has_avx512() {
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("gfni");
}
}  // namespace

const CpuOps* cpu_ops_for(const char* isa) {
  if (!std::strcmp(isa, "generic")) return &isa_generic::kOps;
  if (!std::strcmp(isa, "avx2")) return has_avx2() ? &isa_avx2::kOps : nullptr;
  if (!std::strcmp(isa, "avx512")) return has_avx512() ? &isa_avx512::kOps : nullptr;
  return nullptr;
}

const CpuOps& cpu_ops() {
  static const CpuOps* ops = [] {
    if (const char* forced = std::getenv("M3_ISA"); forced && *forced) {
      const CpuOps* o = cpu_ops_for(forced);
      if (!o) throw Error(std::string("M3_ISA=") + forced + ": unknown or not supported by this CPU (generic, avx2, avx512)");
      return o;
    }
    if (has_avx512()) return &isa_avx512::kOps;
    if (has_avx2()) return &isa_avx2::kOps;
    return &isa_generic::kOps;
  }();
  return *ops;
}

}  // namespace m3
