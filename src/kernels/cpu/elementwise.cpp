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

void rms_norm_rows(const float* x, int64_t xs, const float* gamma1p, int64_t n, int64_t rows, float eps, float* out,
                   int64_t os) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float *x0 = x + r * xs, *x1 = x0 + xs, *x2 = x1 + xs, *x3 = x2 + xs;
    double s[4] = {0.0, 0.0, 0.0, 0.0};  // each row's sum in rms_norm's order
    for (int64_t i = 0; i < n; ++i) {
      s[0] += double(x0[i]) * double(x0[i]);
      s[1] += double(x1[i]) * double(x1[i]);
      s[2] += double(x2[i]) * double(x2[i]);
      s[3] += double(x3[i]) * double(x3[i]);
    }
    for (int j = 0; j < 4; ++j) {
      const float inv = float(1.0 / std::sqrt(s[j] / double(n) + double(eps)));
      const float* xj = x + (r + j) * xs;
      float* oj = out + (r + j) * os;
      for (int64_t i = 0; i < n; ++i) oj[i] = xj[i] * inv * gamma1p[i];
    }
  }
  for (; r < rows; ++r) rms_norm(x + r * xs, gamma1p, n, eps, out + r * os);
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
