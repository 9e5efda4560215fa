// Names and sizes of the safetensors dtypes.
#include "formats/dtype.h"

namespace m3 {

namespace {
struct DTypeInfo {
  const char* name;
  DType type;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {"F64", DType::F64, 8},  {"F32", DType::F32, 4},         {"F16", DType::F16, 2},
    {"BF16", DType::BF16, 2}, {"F8_E4M3", DType::F8_E4M3, 1}, {"F8_E5M2", DType::F8_E5M2, 1},
    {"I64", DType::I64, 8},  {"I32", DType::I32, 4},         {"I16", DType::I16, 2},
    {"I8", DType::I8, 1},    {"U8", DType::U8, 1},           {"BOOL", DType::BOOL, 1},
};
}  // namespace

bool dtype_from_name(std::string_view name, DType* out) {
  for (const auto& d : kDTypes) {
    if (name == d.name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

const char* dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

}  // namespace m3
