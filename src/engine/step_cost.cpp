// Online fit of a step's wall time (see step_cost.h).
#include "engine/step_cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace m3 {

void FittedStepCost::observe(int64_t prefill_tokens, int64_t decode_rows, double ms) {
  if (!(ms >= 0) || !std::isfinite(ms)) return;
  const double x[3] = {1.0, double(decode_rows), double(prefill_tokens)};
  for (int i = 0; i < 3; ++i) {
    xty_[i] = decay_ * xty_[i] + x[i] * ms;
    for (int j = 0; j < 3; ++j) xtx_[i][j] = decay_ * xtx_[i][j] + x[i] * x[j];
  }
  ++steps_;
  if (prefill_tokens > 0) ++steps_with_prefill_;
  if (decode_rows > 0) ++steps_with_decode_;
  refit();
}

// Least squares with every coefficient >= 0: a coefficient that comes out negative (noise, or a
// feature that never varied) is fixed at 0 and the others refitted. A small ridge keeps the solve
// defined while a feature has taken a single value so far (e.g. every decode step had 8 rows): the
// prediction at the values seen is then still right.
void FittedStepCost::refit() {
  ready_ = false;
  // Three steps suffice to start: a feature not seen yet keeps a zero coefficient (the ridge), so
  // e.g. the prefill cost reads as free until a prefill was measured, which leaves the latency budget
  // unbounded, as without a model.
  if (steps_ < 3) return;
  bool use[3] = {true, true, true};
  for (int attempt = 0; attempt < 3; ++attempt) {
    int idx[3], n = 0;
    for (int i = 0; i < 3; ++i)
      if (use[i]) idx[n++] = i;
    double A[3][4] = {};
    for (int r = 0; r < n; ++r) {
      for (int c = 0; c < n; ++c) A[r][c] = xtx_[idx[r]][idx[c]];
      A[r][r] += 1e-6 * (xtx_[idx[r]][idx[r]] + 1.0);
      A[r][n] = xty_[idx[r]];
    }
    bool singular = false;
    for (int col = 0; col < n && !singular; ++col) {  // Gaussian elimination, partial pivoting
      int piv = col;
      for (int r = col + 1; r < n; ++r)
        if (std::fabs(A[r][col]) > std::fabs(A[piv][col])) piv = r;
      if (std::fabs(A[piv][col]) < 1e-12) {
        singular = true;
        break;
      }
      for (int c = 0; c <= n; ++c) std::swap(A[col][c], A[piv][c]);
      for (int r = 0; r < n; ++r) {
        if (r == col) continue;
        const double f = A[r][col] / A[col][col];
        for (int c = col; c <= n; ++c) A[r][c] -= f * A[col][c];
      }
    }
    if (singular) return;
    double coef[3] = {0, 0, 0};
    bool negative = false;
    for (int r = 0; r < n; ++r) {
      coef[idx[r]] = A[r][n] / A[r][r];
      if (coef[idx[r]] < 0) {
        use[idx[r]] = false;
        negative = true;
      }
    }
    if (!negative) {
      std::copy(coef, coef + 3, coef_);
      ready_ = true;
      return;
    }
  }
}

double FittedStepCost::predict_ms(int64_t prefill_tokens, int64_t decode_rows) const {
  if (!ready_) return -1;
  return coef_[0] + coef_[1] * double(decode_rows) + coef_[2] * double(prefill_tokens);
}

std::string FittedStepCost::describe() const {
  if (!ready_) return "not measured yet";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.2f ms + %.3f ms/decode row + %.3f ms/prefill token", coef_[0], coef_[1], coef_[2]);
  return buf;
}

}  // namespace m3
