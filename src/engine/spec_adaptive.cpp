// Adaptive speculation's decision (see spec_adaptive.h).
#include "engine/spec_adaptive.h"

#include <algorithm>
#include <cmath>

namespace m3 {

void SpecAcceptance::update(int verified, int accepted, double alpha) {
  for (int j = 0; j < verified && j < int(rate.size()) && j <= accepted; ++j)
    rate[size_t(j)] += alpha * ((j < accepted ? 1.0 : 0.0) - rate[size_t(j)]);
}

void SpecAcceptance::update_mean(int verified, int accepted, double alpha) {
  if (seen.size() < rate.size()) seen.resize(rate.size(), 0);
  for (int j = 0; j < verified && j < int(rate.size()) && j <= accepted; ++j) {
    const double step = std::max(alpha, 1.0 / double(++seen[size_t(j)] + 1));
    rate[size_t(j)] += step * ((j < accepted ? 1.0 : 0.0) - rate[size_t(j)]);
  }
}

void SpecAcceptance::update_conf(int verified, int accepted, const float* head, double alpha) {
  if (conf.size() < rate.size()) conf.resize(rate.size(), -1.0);
  for (int j = 0; j < verified && j < int(conf.size()) && j <= accepted; ++j) {
    const double c = std::clamp(double(head[j]), 0.0, 1.0);
    if (!(c == c)) continue;  // NaN: nothing to learn
    double& m = conf[size_t(j)];
    m = m < 0 ? c : m + alpha * (c - m);
  }
}

void calibrate_confidence(const float* head, int n, const SpecAcceptance& a, float* out) {
  for (int j = 0; j < n; ++j) {
    double c = head[j];
    if (size_t(j) < a.conf.size() && size_t(j) < a.rate.size() && a.conf[size_t(j)] > 1e-3)
      c *= a.rate[size_t(j)] / a.conf[size_t(j)];
    out[j] = float(std::clamp(c, 0.0, 1.0));
  }
}

std::vector<int> choose_drafts(const std::vector<SpecCandidate>& cands, double plain_tokens, const SpecCosts& c) {
  std::vector<int> k;
  choose_drafts(cands, plain_tokens, c, k);
  return k;
}

void choose_drafts(const std::vector<SpecCandidate>& cands, double plain_tokens, const SpecCosts& c,
                   std::vector<int>& k) {
  k.assign(cands.size(), 0);
  if (cands.empty() || !(c.base_ms > 0)) return;
  // Best k of one request at rate lambda (tokens per ms), and its expected accepted drafts.
  auto best = [&](const SpecCandidate& cand, double lambda, double* gain_tokens) {
    double p = 1, tokens = 0, value = 0, best_value = 0;
    int best_k = 0;
    *gain_tokens = 0;
    for (int i = 1; i <= cand.max_k && i <= int(cand.acc->rate.size()); ++i) {
      p *= std::clamp(cand.acc->rate[size_t(i - 1)], 0.0, 1.0);
      tokens += p;
      value += p - lambda * (c.row_ms + c.slot_ms + p * c.ctx_ms);
      if (value - lambda * c.draft_ms > best_value) {
        best_value = value - lambda * c.draft_ms;
        best_k = i;
        *gain_tokens = tokens;
      }
    }
    return best_k;
  };
  double lambda = plain_tokens / c.base_ms;
  for (int iter = 0; iter < 20; ++iter) {
    double tokens = plain_tokens, ms = c.base_ms;
    for (size_t r = 0; r < cands.size(); ++r) {
      double g = 0;
      k[r] = best(cands[r], lambda, &g);
      tokens += g;
      if (k[r] > 0) ms += double(k[r]) * (c.row_ms + c.slot_ms) + c.draft_ms + g * c.ctx_ms;
    }
    const double next = tokens / ms;
    if (!(next > lambda * (1 + 1e-9))) break;  // the ratio stopped rising: optimal
    lambda = next;
  }
}

AdmitCase admit_case(const std::vector<double>& rate, double lambda, const std::vector<double>& extra_ms,
                     double out_tokens) {
  AdmitCase out;
  double g = 0, p = 1;
  for (size_t k = 1; k <= rate.size() && k <= extra_ms.size(); ++k) {
    g += (p *= std::clamp(rate[k - 1], 0.0, 1.0));
    const double extra = extra_ms[k - 1];
    if (!(extra > 0)) continue;
    out.best_rate = std::max(out.best_rate, g / extra);
    if (lambda > 0) out.saved_ms = std::max(out.saved_ms, (g / lambda - extra) * out_tokens / (1.0 + g));
  }
  return out;
}

int cut_by_survival(const float* conf, int n, double threshold) {
  double survival = 1;
  for (int i = 0; i < n; ++i) {
    survival *= std::clamp(double(conf[i]), 0.0, 1.0);
    if (!(survival > threshold)) return i;
  }
  return n;
}

}  // namespace m3
