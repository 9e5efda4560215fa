// FFN of one layer for T tokens: the dense SwiGLU-OAI MLP, or the MoE (fp32 sigmoid router with a
// selection-only bias, renormalised top-k weights x routed_scaling_factor, plus the unscaled
// shared expert). Tokens routed to the same expert are batched so each expert's weights are
// decoded once per step.
#pragma once
#include <cstdint>

#include "model/config.h"
#include "model/weights.h"

namespace m3 {

struct RouteDecision {
  int32_t* experts;  // [T, k]
  float* weights;    // [T, k] (already x routed_scaling_factor)
};

// Routes T tokens (m: [T, H]) with the layer's fp32 router.
void moe_route(const ModelConfig& cfg, const LayerWeights& L, const float* m, int64_t T, RouteDecision out);

// y[T, H] = FFN_l(m[T, H]).
void ffn_forward(const ModelConfig& cfg, const LayerWeights& L, bool moe, const float* m, int64_t T, float* y);

}  // namespace m3
