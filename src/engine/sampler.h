// Per-request sampling from one row of logits, in the order vLLM applies it: repetition /
// presence / frequency penalties, temperature (0 = greedy), top-k, top-p, min-p, then a draw from
// the request's own seeded generator, so its samples depend only on its seed and never on what it
// is batched with. Also the top-n log-probabilities of the raw model distribution, and (for
// speculative decoding) the full post-transform distribution plus draws from the same generator.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace m3 {
namespace structured {
struct ConstraintSpec;
}

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
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to that token's logit before the
  // penalties and every sampling transform (vLLM's order), in the draft's proposals and in
  // speculative verification alike. Log-probabilities stay those of the raw model.
  std::vector<std::pair<int32_t, float>> logit_bias;
  int logprobs = -1;  // -1: none; n >= 0: the chosen token plus the top n
  // Structured output (src/structured): each sequence gets its own matcher from this spec; the
  // logits of tokens it disallows are -inf before every sampling transform.
  std::shared_ptr<const structured::ConstraintSpec> constraint;

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
  // (for the penalties). When lp is non-null and logprobs >= 0, fills it. `allowed` (a bitset over
  // the vocabulary, bit i of word i/64; null = all) masks the logits to -inf first, so greedy,
  // temperature, top-k/p, min-p and the penalties only ever see allowed tokens (log-probabilities
  // stay those of the raw model).
  int32_t sample(const float* logits, int64_t vocab, const std::vector<int32_t>& prompt,
                 const std::vector<int32_t>& output, TokenLogprob* lp = nullptr, const uint64_t* allowed = nullptr);

  // The distribution sample() draws from, as fp32 probabilities over all `vocab` ids (written to
  // probs[0..vocab)): penalties, temperature, top-k, top-p, min-p, renormalised; ids cut by a
  // filter get exactly 0. Temperature 0 gives a one-hot on the argmax (ties: lowest id). Without
  // top-k / top-p it needs no sort. Uses no randomness; no allocation once the buffers have grown.
  void distribution(const float* logits, int64_t vocab, const std::vector<int32_t>& prompt,
                    const std::vector<int32_t>& output, float* probs, const uint64_t* allowed = nullptr);
  // One draw from probs[0..vocab) (need not be normalised; sums in fp64) with this request's
  // generator. Never returns an id whose probability is 0 unless all are 0 (then returns 0).
  int32_t draw(const float* probs, int64_t vocab);
  // U[0, 1) from this request's generator (never exactly 1).
  double uniform();
  // Logprob of `chosen` under the raw logits plus the top-n, as sample() reports them. Does
  // nothing when lp is null or the request asked for no logprobs.
  void fill_logprob(const float* logits, int64_t vocab, int32_t chosen, TokenLogprob* lp);

  const SamplingParams& params() const { return p_; }

  // (logit, id) pairs in id order -> best first, ties (and -0 vs +0) by lowest id: std::sort's order
  // under that comparison, in linear time. `tmp` is scratch.
  static void sort_by_logit(std::vector<std::pair<float, int32_t>>& a, std::vector<std::pair<float, int32_t>>& tmp);

 private:
  // The working buffers below are the calling thread's own (sampler.cpp: SamplerScratch), not the
  // sampler's: requests are sampled on several threads at once (the engine's sample_plain_rows,
  // verification), one thread may sample the rows of one request at once, and a request holds no
  // vocabulary-sized buffers of its own (about 40 bytes a word: 8 MB at 200K words).
  // Disallowed ids to -inf (into the scratch); logits itself when `allowed` is null.
  const float* masked(const float* logits, int64_t V, const uint64_t* allowed);
  // Applies logit_bias and the penalties; returns logits itself when there are none, else the scratch's copy.
  const float* penalized(const float* logits, int64_t V, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& output);
  // temperature > 0: sorts the candidates into the scratch's cand (best first) with their unnormalised
  // probabilities in its prob, applies top-k / top-p / min-p, returns how many are kept.
  int64_t candidates(const float* x, int64_t V);
  // top-k or top-p is active (min-p alone needs no sort).
  bool needs_sort(int64_t V) const;

  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace m3
