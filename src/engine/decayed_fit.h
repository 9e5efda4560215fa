// Online least squares over recent observations with non-negative coefficients: each older
// observation's weight decays by `decay` per new one, so the fit follows the machine when its
// neighbours' load changes. Shared by the step cost model (fixed + per decode row + per prefill token,
// step_cost.h) and the draft pass's cost (per request + per drafted slot, speculator.h): costs that
// never fall as the work grows. Cheap: an N x N solve per refit (N <= 3 here).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace m3 {

template <int N>
class DecayedLeastSquares {
 public:
  explicit DecayedLeastSquares(double decay) : decay_(decay) {}

  void observe(const double (&x)[N], double y) {
    for (int i = 0; i < N; ++i) {
      xty_[i] = decay_ * xty_[i] + x[i] * y;
      for (int j = 0; j < N; ++j) xtx_[i][j] = decay_ * xtx_[i][j] + x[i] * x[j];
    }
    ++count_;
  }
  int64_t count() const { return count_; }

  // The coefficients, each >= 0: one that comes out negative (noise, or a feature that never varied)
  // is fixed at 0 and the others refitted. A small ridge keeps the solve defined while a feature has
  // taken a single value so far (e.g. every decode step had 8 rows): the prediction at the values seen
  // is then still right. False while the system is singular (nothing observed).
  bool solve(double (&coef)[N]) const {
    bool use[N];
    std::fill(use, use + N, true);
    for (int attempt = 0; attempt < N; ++attempt) {
      int idx[N], n = 0;
      for (int i = 0; i < N; ++i)
        if (use[i]) idx[n++] = i;
      double A[N][N + 1] = {};
      for (int r = 0; r < n; ++r) {
        for (int c = 0; c < n; ++c) A[r][c] = xtx_[idx[r]][idx[c]];
        A[r][r] += 1e-6 * (xtx_[idx[r]][idx[r]] + 1.0);
        A[r][n] = xty_[idx[r]];
      }
      for (int col = 0; col < n; ++col) {  // Gaussian elimination, partial pivoting
        int piv = col;
        for (int r = col + 1; r < n; ++r)
          if (std::fabs(A[r][col]) > std::fabs(A[piv][col])) piv = r;
        if (std::fabs(A[piv][col]) < 1e-12) return false;
        for (int c = 0; c <= n; ++c) std::swap(A[col][c], A[piv][c]);
        for (int r = 0; r < n; ++r) {
          if (r == col) continue;
          const double f = A[r][col] / A[col][col];
          for (int c = col; c <= n; ++c) A[r][c] -= f * A[col][c];
        }
      }
      double out[N] = {};
      bool negative = false;
      for (int r = 0; r < n; ++r) {
        out[idx[r]] = A[r][n] / A[r][r];
        if (out[idx[r]] < 0) {
          use[idx[r]] = false;
          negative = true;
        }
      }
      if (!negative) {
        std::copy(out, out + N, coef);
        return true;
      }
    }
    return false;
  }

 private:
  double decay_;
  double xtx_[N][N] = {};  // decayed sums of x x^T
  double xty_[N] = {};
  int64_t count_ = 0;
};

}  // namespace m3
