// Element-wise kernels of the forward pass, all computed in fp32: Gemma RMSNorm (the gamma passed
// in is already 1 + w), partial NEOX RoPE, SwiGLU-OAI, sigmoid.
#pragma once
#include <cstdint>

namespace m3 {

// out = x / sqrt(mean(x^2) + eps) * gamma1p   (gamma1p = 1 + w); out may alias x.
void rms_norm(const float* x, const float* gamma1p, int64_t n, float eps, float* out);
// rms_norm of `rows` rows (x + r * xs -> out + r * os), bit-identical to one call per row: four rows'
// sums run as four independent chains (speed: one row's double sum is bound by the add latency). out
// may alias x.
void rms_norm_rows(const float* x, int64_t xs, const float* gamma1p, int64_t n, int64_t rows, float eps, float* out,
                   int64_t os);

// Rotary table for one position: cos/sin of p * theta^(-2i/rotary_dim), i < rotary_dim/2,
// computed in double and rounded once to fp32.
void rope_table(int64_t pos, int rotary_dim, double theta, float* cos_out, float* sin_out);

// NEOX rotate-half on the first rotary_dim dims of one head vector (pairs i, i + rotary_dim/2).
void rope_apply(float* x, int rotary_dim, const float* cos_t, const float* sin_t);

// y = (clamp(u, -limit, limit) + beta) * g' * sigmoid(alpha * g'),  g' = min(g, limit).
void swiglu_oai(const float* g, const float* u, int64_t n, float alpha, float limit, float beta, float* y);

inline float sigmoidf(float z) { return 1.0f / (1.0f + __builtin_expf(-z)); }

}  // namespace m3
