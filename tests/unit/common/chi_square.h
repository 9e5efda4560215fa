// Pearson chi-square goodness-of-fit for the losslessness tests of speculative decoding: the
// regularized upper incomplete gamma, critical values by bisection, and a pooled statistic.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

namespace m3test {

// ---------------------------------------------------------------------------------------------
// Chi-square machinery. The upper-tail probability of the chi-square law with k degrees of
// freedom is the regularized upper incomplete gamma Q(k/2, x/2), evaluated with its power series
// (x < a + 1) or its continued fraction (modified Lentz) otherwise. The critical value at
// significance alpha is found by bisection on Q(k/2, x/2) = alpha (checked against tabulated
// quantiles in SpecChiSquare.QuantilesMatchTables).

inline double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double lg = std::lgamma(a);
  if (x < a + 1) {  // P(a, x) by its series; Q = 1 - P
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * 1e-16) break;
    }
    return 1.0 - sum * std::exp(-x + a * std::log(x) - lg);
  }
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, f = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    f *= delta;
    if (std::fabs(delta - 1) < 1e-16) break;
  }
  return std::exp(-x + a * std::log(x) - lg) * f;
}

inline double chi2_sf(double x, int df) { return gamma_q(0.5 * df, 0.5 * x); }

inline double chi2_critical(double alpha, int df) {
  double lo = 0, hi = df + 20.0 * std::sqrt(2.0 * df) + 100.0;
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (chi2_sf(mid, df) > alpha ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

constexpr double kAlpha = 1e-3;

struct ChiSquare {
  double stat = 0;
  int df = 0;
  double critical = 0;
  double p_value = 1;
  int64_t impossible = 0;  // samples that landed in a cell of exact probability 0
  bool pass() const { return impossible == 0 && df > 0 && stat <= critical; }
};

// Pearson's statistic of `counts` (N samples) against `probs`. Cells with expected count < 5 are
// pooled into one cell (which, if itself still under 5, joins the smallest regular cell). Cells of
// probability exactly 0 are not cells: any sample there is counted in `impossible` (a failure).
inline ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs, const char* label) {
  double total = 0;
  for (double p : probs) total += p;
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  ChiSquare r;
  std::vector<std::pair<double, double>> cells;  // {expected, observed}
  double pool_e = 0, pool_o = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) {
      r.impossible += counts[i];
      continue;
    }
    const double e = double(n) * probs[i] / total;
    if (e < 5) {
      pool_e += e;
      pool_o += double(counts[i]);
    } else {
      cells.push_back({e, double(counts[i])});
    }
  }
  if (pool_e > 0) {
    if (pool_e >= 5 || cells.empty()) {
      cells.push_back({pool_e, pool_o});
    } else {
      auto smallest = std::min_element(cells.begin(), cells.end());
      smallest->first += pool_e;
      smallest->second += pool_o;
    }
  }
  for (const auto& [e, o] : cells) r.stat += (o - e) * (o - e) / e;
  r.df = int(cells.size()) - 1;
  r.critical = r.df > 0 ? chi2_critical(kAlpha, r.df) : 0;
  r.p_value = r.df > 0 ? chi2_sf(r.stat, r.df) : 1;
  std::printf("[chi2] %-44s N=%lld cells=%d chi2=%.1f critical(alpha=1e-3)=%.1f p=%.3g impossible=%lld\n", label,
              (long long)n, r.df + 1, r.stat, r.critical, r.p_value, (long long)r.impossible);
  return r;
}

}  // namespace m3test
