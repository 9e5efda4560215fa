// Verification rules for speculative decoding: greedy (§2.2), token-wise rejection sampling
// (§2.3), exact block verification (§2.4) and the benchmarking-only synthetic acceptance, as
// pure functions over the target / draft distributions (see spec_verify.h and docs/serving.md §2).
#include "engine/spec_verify.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace m3 {

RejectionMethod parse_rejection_method(const std::string& s) {
  if (s == "block") return RejectionMethod::Block;
  if (s == "standard") return RejectionMethod::Standard;
  if (s == "synthetic") return RejectionMethod::Synthetic;
  throw Error("rejection_sample_method: unknown value '" + s + "' (allowed: block, standard, synthetic)");
}

namespace {

const float* target_row(const VerifyInput& in, int i) { return in.target + int64_t(i) * in.vocab; }
// q_i for i in 1..gamma.
const float* draft_row(const VerifyInput& in, int i) { return in.draft + int64_t(i - 1) * in.vocab; }

// Probability of id t in row (0 for an id outside the vocabulary).
double prob_at(const float* row, int32_t t, int64_t V) { return t >= 0 && t < V ? double(row[t]) : 0.0; }

int32_t argmax_lowest(const float* row, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (row[i] > row[best]) best = i;
  return int32_t(best);
}

// Y ~ normalize(max(0, scale * P - q)); falls back to P when that is (numerically) all zero.
int32_t draw_residual(const float* P, const float* q, double scale, int64_t V, Sampler& s) {
  thread_local std::vector<float> res;
  res.resize(size_t(V));
  double sum = 0;
  for (int64_t x = 0; x < V; ++x) {
    const double r = scale * double(P[x]) - double(q[x]);
    const float f = r > 0 ? float(r) : 0.0f;
    res[x] = f;
    sum += f;
  }
  if (!(sum > 0) || !std::isfinite(sum)) return s.draw(P, V);
  return s.draw(res.data(), V);
}

void check_rates(double acceptance_length, int gamma) {
  if (gamma < 0) throw Error("synthetic acceptance: gamma must be >= 0");
  if (!(acceptance_length >= 1.0 && acceptance_length <= 1.0 + gamma))
    throw Error("synthetic_acceptance_length: " + std::to_string(acceptance_length) + " is outside [1, " +
                std::to_string(1 + gamma) + "] (1 + num_speculative_tokens)");
}

}  // namespace

VerifyOutcome verify_greedy(const VerifyInput& in) {
  const int64_t V = in.vocab;
  int tau = 0;
  while (tau < in.gamma && in.drafts[tau] == argmax_lowest(target_row(in, tau), V)) ++tau;
  return {tau, argmax_lowest(target_row(in, tau), V)};
}

VerifyOutcome verify_standard(const VerifyInput& in, Sampler& s) {
  const int64_t V = in.vocab;
  for (int i = 1; i <= in.gamma; ++i) {
    const int32_t d = in.drafts[i - 1];
    const double pt = prob_at(target_row(in, i - 1), d, V);
    const double qd = prob_at(draft_row(in, i), d, V);
    const double accept = qd > 0 ? std::min(1.0, pt / qd) : (pt > 0 ? 1.0 : 0.0);
    if (!(s.uniform() < accept))
      return {i - 1, draw_residual(target_row(in, i - 1), draft_row(in, i), 1.0, V, s)};
  }
  return {in.gamma, s.draw(target_row(in, in.gamma), V)};
}

void block_verification_weights(const VerifyInput& in, double* p, double* h) {
  const int64_t V = in.vocab;
  const int g = in.gamma;
  p[0] = 1.0;
  h[0] = 1.0;
  for (int i = 1; i <= g; ++i) {
    const int32_t d = in.drafts[i - 1];
    const double num = p[i - 1] * prob_at(target_row(in, i - 1), d, V);
    const double qd = prob_at(draft_row(in, i), d, V);
    p[i] = qd > 0 ? std::min(1.0, num / qd) : (num > 0 ? 1.0 : 0.0);
  }
  for (int i = 1; i < g; ++i) {
    // p_i == 1 gives Z_i / Z_i (or 0/0, defined as 1); p_i == 0 gives Z_i = 0 over a
    // denominator of 1. Both exact without the scan.
    if (p[i] >= 1.0) {
      h[i] = 1.0;
      continue;
    }
    if (p[i] <= 0.0) {
      h[i] = 0.0;
      continue;
    }
    const float* P = target_row(in, i);
    const float* q = draft_row(in, i + 1);
    double z = 0;
    for (int64_t x = 0; x < V; ++x) {
      const double r = p[i] * double(P[x]) - double(q[x]);
      if (r > 0) z += r;
    }
    const double den = z + (1.0 - p[i]);
    h[i] = den > 0 ? z / den : 1.0;
  }
  if (g > 0) h[g] = p[g];
}

VerifyOutcome verify_block(const VerifyInput& in, Sampler& s) {
  const int64_t V = in.vocab;
  const int g = in.gamma;
  if (g <= 0) return {0, s.draw(target_row(in, 0), V)};
  thread_local std::vector<double> p, h;
  p.resize(size_t(g) + 1);
  h.resize(size_t(g) + 1);
  block_verification_weights(in, p.data(), h.data());
  // tau = the largest i with eta_i < h_i. Strict '<' so that h_i = 0 can never be chosen
  // (eta can be exactly 0); P(eta < h) = h either way.
  int tau = 0;
  for (int i = 1; i <= g; ++i)
    if (s.uniform() < h[i]) tau = i;
  if (tau == g) return {g, s.draw(target_row(in, g), V)};
  return {tau, draw_residual(target_row(in, tau), draft_row(in, tau + 1), p[tau], V, s)};
}

VerifyOutcome verify_synthetic(const VerifyInput& in, const std::vector<double>& rate, Sampler& s) {
  if (rate.size() < size_t(std::max(in.gamma, 0)))
    throw Error("synthetic acceptance: " + std::to_string(rate.size()) + " per-position rates for " +
                std::to_string(in.gamma) + " draft tokens");
  int tau = 0;
  while (tau < in.gamma && s.uniform() < rate[tau]) ++tau;
  return {tau, s.draw(target_row(in, tau), in.vocab)};
}

std::vector<double> synthetic_rates_for_length(double acceptance_length, int gamma) {
  check_rates(acceptance_length, gamma);
  if (gamma == 0) return {};
  auto length = [gamma](double a) {
    double sum = 1, pw = 1;
    for (int i = 1; i <= gamma; ++i) sum += pw *= a;
    return sum;
  };
  double lo = 0, hi = 1;  // length() is increasing on [0, 1], from 1 to 1 + gamma
  if (acceptance_length >= 1.0 + gamma) lo = 1;
  else if (acceptance_length > 1.0)
    for (int it = 0; it < 200 && hi - lo > 1e-16; ++it) {
      const double mid = 0.5 * (lo + hi);
      (length(mid) < acceptance_length ? lo : hi) = mid;
    }
  return std::vector<double>(size_t(gamma), lo);
}

std::vector<double> synthetic_rates_min_variance(double acceptance_length, int gamma) {
  check_rates(acceptance_length, gamma);
  const double drafts = acceptance_length - 1.0;
  const int full = int(drafts);
  std::vector<double> u(size_t(gamma), 0.0);
  for (int i = 0; i < gamma; ++i) u[i] = i < full ? 1.0 : (i == full ? drafts - full : 0.0);
  return synthetic_rates_from_unconditional(u);
}

std::vector<double> synthetic_rates_from_unconditional(const std::vector<double>& u) {
  std::vector<double> c(u.size());
  double prev = 1.0;
  for (size_t i = 0; i < u.size(); ++i) {
    if (!(u[i] >= 0.0 && u[i] <= 1.0)) throw Error("synthetic_acceptance_rates: each rate must be in [0, 1]");
    if (u[i] > prev) throw Error("synthetic_acceptance_rates: rates must be non-increasing");
    c[i] = prev > 0 ? u[i] / prev : 0.0;
    prev = u[i];
  }
  return c;
}

}  // namespace m3
