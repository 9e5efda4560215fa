// Penalties, temperature, top-k / top-p / min-p, seeded draws, and the post-transform distribution
// that speculative verification needs (see sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "base/error.h"

namespace m3 {

namespace {
// A thread's working buffers for every Sampler call on it (see sampler.h), grown only.
struct SamplerScratch {
  std::vector<float> work, masked;
  std::vector<int32_t> counts;
  std::vector<uint8_t> seen;
  std::vector<int32_t> idx;
  std::vector<std::pair<float, int32_t>> cand, tmp;
  std::vector<double> prob;
};
SamplerScratch& scratch() {
  thread_local SamplerScratch s;
  return s;
}
}  // namespace

void SamplingParams::validate() const {
  auto bad = [](const std::string& f, const std::string& why) { throw Error(f + ": " + why); };
  if (!(temperature >= 0.0f) || temperature > 100.0f) bad("temperature", "must be in [0, 100]");
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p", "must be in (0, 1]");
  if (top_k < -1) bad("top_k", "must be -1, 0 (off) or a positive count");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p", "must be in [0, 1]");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) bad("presence_penalty", "must be in [-2, 2]");
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) bad("frequency_penalty", "must be in [-2, 2]");
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 100.0f)) bad("repetition_penalty", "must be in (0, 100]");
  if (max_tokens < 1) bad("max_tokens", "must be at least 1");
  if (logprobs > 20) bad("logprobs", "at most 20");
  for (const auto& s : stop)
    if (s.empty()) bad("stop", "stop strings must not be empty");
  for (const auto& [id, b] : logit_bias) {
    if (id < 0) bad("logit_bias", "token id " + std::to_string(id) + " is outside the vocabulary");
    if (!(b >= -100.0f && b <= 100.0f)) bad("logit_bias", "the bias of token " + std::to_string(id) + " must be in [-100, 100]");
  }
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

const float* Sampler::masked(const float* logits, int64_t V, const uint64_t* allowed) {
  SamplerScratch& w = scratch();
  if (!allowed) return logits;
  w.masked.resize(size_t(V));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // A word at a time: masks are mostly runs (all allowed inside a string, nearly none at a
  // structural position), so whole words are copied or filled and only mixed ones test each bit.
  float* out = w.masked.data();
  for (int64_t base = 0; base < V; base += 64) {
    const uint64_t m = allowed[base >> 6];
    const int64_t n = std::min<int64_t>(64, V - base);
    if (m == ~uint64_t(0)) std::copy(logits + base, logits + base + n, out + base);
    else if (m == 0) std::fill(out + base, out + base + n, kNegInf);
    else
      for (int64_t j = 0; j < n; ++j) out[base + j] = (m >> j) & 1 ? logits[base + j] : kNegInf;
  }
  return w.masked.data();
}

const float* Sampler::penalized(const float* logits, int64_t V, const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& output) {
  SamplerScratch& w = scratch();
  const bool penalties = p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  if (!penalties && p_.logit_bias.empty()) return logits;
  w.work.assign(logits, logits + V);
  float* x = w.work.data();
  // logit_bias first, then the penalties, as vLLM applies them.
  for (const auto& [id, b] : p_.logit_bias)
    if (id >= 0 && id < V) x[id] += b;
  if (!penalties) return x;
  // Penalties (vLLM semantics): repetition over prompt + output, presence / frequency over output.
  w.counts.assign(size_t(V), 0);
  for (int32_t t : output)
    if (t >= 0 && t < V) ++w.counts[t];
  if (p_.repetition_penalty != 1.0f) {
    w.seen.assign(size_t(V), 0);
    for (int32_t t : prompt)
      if (t >= 0 && t < V) w.seen[t] = 1;
    for (int32_t t : output)
      if (t >= 0 && t < V) w.seen[t] = 1;
    for (int64_t i = 0; i < V; ++i)
      if (w.seen[i]) x[i] = x[i] > 0 ? x[i] / p_.repetition_penalty : x[i] * p_.repetition_penalty;
  }
  for (int64_t i = 0; i < V; ++i)
    if (w.counts[i]) x[i] -= p_.frequency_penalty * float(w.counts[i]) + p_.presence_penalty;
  return x;
}

static int64_t argmax_lowest(const float* x, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (x[i] > x[best]) best = i;  // ties: lowest id
  return best;
}

// The order std::sort with by_logit gives (descending logit, ascending id among equal logits, -0 equal
// to +0), by a stable LSD radix sort on an order-preserving 32-bit key of the logit: the entries arrive
// in id order and stay in it among equal keys. Hand-written for speed: std::sort over a full
// vocabulary, per sampled token with top-p, cost milliseconds; three 11-bit passes are linear in the
// vocabulary.
void Sampler::sort_by_logit(std::vector<std::pair<float, int32_t>>& a, std::vector<std::pair<float, int32_t>>& tmp) {
  auto key = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (u == 0x80000000u) u = 0;                                    // -0 sorts as +0
    const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~ascending;                                              // ascending key = descending logit
  };
  constexpr int kBits = 11;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  tmp.resize(a.size());
  for (int shift = 0; shift < 32; shift += kBits) {
    uint32_t start[1u << kBits] = {};
    for (const auto& e : a) ++start[(key(e.first) >> shift) & kMask];
    uint32_t sum = 0;
    for (uint32_t& c : start) {
      const uint32_t n = c;
      c = sum;
      sum += n;
    }
    for (const auto& e : a) tmp[start[(key(e.first) >> shift) & kMask]++] = e;
    a.swap(tmp);
  }
}

int64_t Sampler::candidates(const float* x, int64_t V) {
  SamplerScratch& w = scratch();
  w.cand.resize(size_t(V));
  for (int64_t i = 0; i < V; ++i) w.cand[i] = {x[i], int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  int64_t n = V;
  if (p_.top_k > 0 && p_.top_k < V) {
    std::partial_sort(w.cand.begin(), w.cand.begin() + p_.top_k, w.cand.end(), by_logit);
    n = p_.top_k;
  } else {
    sort_by_logit(w.cand, w.tmp);
  }
  const double mx = w.cand[0].first;
  w.prob.resize(size_t(n));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += w.prob[i] = std::exp((double(w.cand[i].first) - mx) / p_.temperature);
  if (p_.top_p < 1.0f) {
    double acc = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; ++i) {
      acc += w.prob[i] / sum;
      if (acc >= double(p_.top_p)) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (p_.min_p > 0.0f) {
    const double floor = w.prob[0] * p_.min_p;  // prob[0] is the max
    int64_t keep = 1;
    while (keep < n && w.prob[keep] >= floor) ++keep;
    n = keep;
  }
  return n;
}

bool Sampler::needs_sort(int64_t V) const { return (p_.top_k > 0 && p_.top_k < V) || p_.top_p < 1.0f; }

int32_t Sampler::sample(const float* logits, int64_t V, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output, TokenLogprob* lp, const uint64_t* allowed) {
  SamplerScratch& w = scratch();
  const float* x = penalized(masked(logits, V, allowed), V, prompt, output);
  int32_t chosen;
  if (p_.temperature <= 0.0f) {
    chosen = int32_t(argmax_lowest(x, V));
  } else {
    const int64_t n = candidates(x, V);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += w.prob[i];
    const double r = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * sum;
    double acc = 0;
    chosen = w.cand[n - 1].second;
    for (int64_t i = 0; i < n; ++i) {
      acc += w.prob[i];
      if (r < acc) {
        chosen = w.cand[i].second;
        break;
      }
    }
  }
  fill_logprob(logits, V, chosen, lp);
  return chosen;
}

void Sampler::distribution(const float* logits, int64_t V, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& output, float* probs, const uint64_t* allowed) {
  SamplerScratch& w = scratch();
  const float* x = penalized(masked(logits, V, allowed), V, prompt, output);
  if (p_.temperature <= 0.0f) {
    std::fill(probs, probs + V, 0.0f);
    probs[argmax_lowest(x, V)] = 1.0f;
    return;
  }
  if (!needs_sort(V)) {
    // No sort needed: plain softmax (same fp64 terms as candidates()), then the min-p floor,
    // which keeps exactly the ids whose term is >= min_p times the largest (the largest is 1).
    const int64_t top = argmax_lowest(x, V);
    const double mx = x[top];
    const double floor = p_.min_p > 0.0f ? double(p_.min_p) : 0.0;
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) {
      const double e = std::exp((double(x[i]) - mx) / p_.temperature);
      const bool keep = floor == 0.0 || e >= floor;
      probs[i] = keep ? float(e) : 0.0f;
      if (keep) sum += e;
    }
    const double inv = 1.0 / sum;
    if (floor == 0.0) {
      for (int64_t i = 0; i < V; ++i) probs[i] = float(double(probs[i]) * inv);
    } else {
      for (int64_t i = 0; i < V; ++i)
        if (probs[i] != 0.0f) probs[i] = float(std::exp((double(x[i]) - mx) / p_.temperature) * inv);
    }
    return;
  }
  const int64_t n = candidates(x, V);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += w.prob[i];
  std::fill(probs, probs + V, 0.0f);
  for (int64_t i = 0; i < n; ++i) probs[w.cand[i].second] = float(w.prob[i] / sum);
}

int32_t Sampler::draw(const float* probs, int64_t V) {
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += probs[i];
  const double r = uniform() * sum;
  double acc = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < V; ++i) {
    if (!(probs[i] > 0.0f)) continue;
    acc += probs[i];
    last = i;
    if (r < acc) return int32_t(i);
  }
  return last < 0 ? 0 : int32_t(last);  // rounding at the top end: the last id with mass
}

double Sampler::uniform() {
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return u < 1.0 ? u : std::nextafter(1.0, 0.0);  // libstdc++ can round up to exactly 1
}

void Sampler::fill_logprob(const float* logits, int64_t V, int32_t chosen, TokenLogprob* lp) {
  SamplerScratch& w = scratch();
  if (!lp || p_.logprobs < 0) return;
  // Log-softmax of the raw logits (fp64 sum).
  double mx = logits[0];
  for (int64_t i = 1; i < V; ++i) mx = std::max(mx, double(logits[i]));
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(s);
  lp->token = chosen;
  lp->logprob = float(double(logits[chosen]) - lse);
  lp->top.clear();
  if (p_.logprobs > 0) {
    w.idx.resize(size_t(V));
    for (int64_t i = 0; i < V; ++i) w.idx[i] = int32_t(i);
    const int64_t k = std::min<int64_t>(p_.logprobs, V);
    std::partial_sort(w.idx.begin(), w.idx.begin() + k, w.idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int64_t i = 0; i < k; ++i) lp->top.push_back({w.idx[i], float(double(logits[w.idx[i]]) - lse)});
  }
}

}  // namespace m3
