// Per-request sampling from one row of logits, in the order vLLM applies it: repetition /
// presence / frequency penalties, temperature (0 = greedy), top-k, top-p, min-p, then a draw from
// the request's own seeded generator, so its samples depend only on its seed and never on what it
// is batched with. Also the top-n log-probabilities of the raw model distribution.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace m3 {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;  // 0 or -1 = off
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  bool has_seed = false;
  uint64_t seed = 0;
  int max_tokens = 16;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  int logprobs = -1;  // -1: none; n >= 0: the chosen token plus the top n

  // Throws m3::Error naming the field when a value is out of range.
  void validate() const;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // best first
};

class Sampler {
 public:
  Sampler() = default;
  explicit Sampler(const SamplingParams& p);
  // Picks a token id from logits[0..vocab). `prompt` and `output` are the request's tokens so far
  // (for the penalties). When lp is non-null and logprobs >= 0, fills it.
  int32_t sample(const float* logits, int64_t vocab, const std::vector<int32_t>& prompt,
                 const std::vector<int32_t>& output, TokenLogprob* lp = nullptr);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> counts_;
  std::vector<uint8_t> seen_;
  std::vector<int32_t> idx_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> prob_;
};

}  // namespace m3
