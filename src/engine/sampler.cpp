// Greedy / temperature / top-k / top-p sampling (see sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace m3 {

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (p_.temperature <= 0.0f) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i)
      if (logits[i] > logits[best]) best = i;  // ties: lowest id
    return int32_t(best);
  }
  cand_.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) cand_[i] = {logits[i], int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  int64_t n = vocab;
  if (p_.top_k > 0 && p_.top_k < vocab) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = p_.top_k;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax at temperature over the kept candidates (fp64 sums).
  const double mx = cand_[0].first;
  std::vector<double> prob(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += prob[i] = std::exp((double(cand_[i].first) - mx) / p_.temperature);
  // top-p: smallest prefix whose mass reaches top_p.
  if (p_.top_p < 1.0f) {
    double acc = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; ++i) {
      acc += prob[i] / sum;
      if (acc >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += prob[i];
  }
  const double r = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * sum;
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    acc += prob[i];
    if (r < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace m3
