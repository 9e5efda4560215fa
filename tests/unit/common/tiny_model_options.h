// The dimensions shared by the tests' tiny random-weight checkpoints (hidden 64, 4 heads, 4 experts):
// small enough to build in milliseconds, large enough that every layer kind and quantised layout runs.
#pragma once
#include <cstdint>

#include "tools/make_model.h"

namespace m3test {

inline m3::MakeModelOptions tiny_model_options(m3::ModelLayout layout, uint64_t seed) {
  m3::MakeModelOptions o = m3::make_model_preset("tiny", layout);
  o.hidden = 64;
  o.heads = 4;
  o.kv_heads = 2;
  o.index_heads = 2;
  o.dense_width = 64;
  o.moe_width = 32;
  o.shared_width = 32;
  o.experts = 4;
  o.seed = seed;
  return o;
}

}  // namespace m3test
