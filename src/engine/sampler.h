// Token sampling from one row of logits: greedy (temperature 0) or temperature + top-k + top-p
// with a per-request seeded generator, so a request's samples depend only on its seed.
// (The engine issue extends this with min_p, penalties and logprobs.)
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace m3 {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;  // 0 = off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Picks a token id from logits[0..vocab).
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

}  // namespace m3
