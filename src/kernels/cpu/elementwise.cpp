// Element-wise fp32 kernels (see elementwise.h).
#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>

namespace m3 {

void rms_norm(const float* x, const float* gamma1p, int64_t n, float eps, float* out) {
  double ss = 0.0;  // double accumulation: the statistic of a 6144-wide row must not drift
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  const float inv = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * gamma1p[i];
}

void rope_table(int64_t pos, int rotary_dim, double theta, float* cos_out, float* sin_out) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * i / double(rotary_dim));
    const double a = double(pos) * inv_freq;
    cos_out[i] = float(std::cos(a));
    sin_out[i] = float(std::sin(a));
  }
}

void rope_apply(float* x, int rotary_dim, const float* c, const float* s) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * c[i] - b * s[i];
    x[i + half] = b * c[i] + a * s[i];
  }
}

void swiglu_oai(const float* g, const float* u, int64_t n, float alpha, float limit, float beta, float* y) {
  // Element-wise, so splitting over threads changes nothing but the speed of prefill-sized calls.
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float gg = std::min(g[i], limit);
    const float uu = std::clamp(u[i], -limit, limit);
    y[i] = (uu + beta) * gg * (1.0f / (1.0f + std::exp(-alpha * gg)));
  }
}

}  // namespace m3
