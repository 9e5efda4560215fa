// Speculative-decoding verification (docs/serving.md §2) and the sampler functions it relies on:
// exact small cases of the greedy / standard / block rules, the block paper's toy example,
// LOSSLESSNESS (a toy autoregressive target + a deliberately different draft, simulated the way
// the engine runs speculative steps; the joint law of the next 3 tokens must pass a Pearson
// chi-square test against the exact target law at alpha = 1e-3, and deliberately wrong rules
// must fail the very same test), and Sampler::distribution / draw / fill_logprob against sample().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/spec_verify.h"
#include "chi_square.h"
#include "base/error.h"

namespace {

using m3::Sampler;
using m3::SamplingParams;
using m3::VerifyInput;
using m3::VerifyOutcome;

using namespace m3test;

TEST(SpecChiSquare, QuantilesMatchTables) {
  // Upper-tail critical values from standard chi-square tables.
  EXPECT_NEAR(chi2_critical(0.05, 1), 3.841, 2e-3);
  EXPECT_NEAR(chi2_critical(0.001, 1), 10.828, 2e-3);
  EXPECT_NEAR(chi2_critical(0.001, 10), 29.588, 2e-3);
  EXPECT_NEAR(chi2_critical(0.001, 100), 149.449, 2e-2);
  EXPECT_NEAR(chi2_critical(0.01, 30), 50.892, 2e-3);
  // Wilson-Hilferty: x ~ k (1 - 2/(9k) + z sqrt(2/(9k)))^3, z = 3.0902 for alpha = 1e-3.
  const int k = 124;
  const double wh = k * std::pow(1 - 2.0 / (9 * k) + 3.090232 * std::sqrt(2.0 / (9 * k)), 3);
  EXPECT_NEAR(chi2_critical(0.001, k), wh, 0.3);
  EXPECT_NEAR(chi2_sf(chi2_critical(0.001, 57), 57), 0.001, 1e-9);
}

// ---------------------------------------------------------------------------------------------
// Helpers.

Sampler make_rng(uint64_t seed) {
  SamplingParams p;
  p.has_seed = true;
  p.seed = seed;
  return Sampler(p);
}

std::vector<float> normalized(std::vector<double> w) {
  double s = 0;
  for (double x : w) s += x;
  std::vector<float> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = float(w[i] / s);
  return out;
}

// Random distribution over V ids with some exact zeros (at least `min_nonzero` ids kept).
std::vector<float> random_dist(std::mt19937_64& g, int V, double zero_prob, int min_nonzero = 1) {
  std::uniform_real_distribution<double> u(0, 1);
  for (;;) {
    std::vector<double> w(static_cast<size_t>(V));
    int nz = 0;
    for (int i = 0; i < V; ++i) {
      w[i] = u(g) < zero_prob ? 0.0 : 0.05 + u(g) * u(g) * 3.0;
      nz += w[i] > 0;
    }
    if (nz >= min_nonzero) return normalized(w);
  }
}

// ---------------------------------------------------------------------------------------------
// Exact small cases.

TEST(SpecRules, ParseRejectionMethod) {
  EXPECT_EQ(m3::parse_rejection_method("block"), m3::RejectionMethod::Block);
  EXPECT_EQ(m3::parse_rejection_method("standard"), m3::RejectionMethod::Standard);
  EXPECT_EQ(m3::parse_rejection_method("synthetic"), m3::RejectionMethod::Synthetic);
  try {
    m3::parse_rejection_method("strict");
    FAIL() << "no throw";
  } catch (const m3::Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("strict"), std::string::npos) << w;
    EXPECT_NE(w.find("block, standard, synthetic"), std::string::npos) << w;
  }
}

TEST(SpecGreedy, AcceptsWhileDraftIsTargetArgmax) {
  const int V = 4, G = 3;
  // P_0 argmax 2; P_1 argmax 1 (tie 1/3 broken to the lowest id); P_2 argmax 3; P_3 argmax 0.
  std::vector<float> target = {0.1f, 0.2f, 0.6f, 0.1f,  0.0f, 0.4f, 0.2f, 0.4f,
                               0.1f, 0.1f, 0.1f, 0.7f,  0.9f, 0.0f, 0.1f, 0.0f};
  const int32_t all[G] = {2, 1, 3}, second_wrong[G] = {2, 3, 3}, first_wrong[G] = {0, 1, 3};
  VerifyInput in{G, V, all, target.data(), nullptr};
  VerifyOutcome o = m3::verify_greedy(in);
  EXPECT_EQ(o.accepted, 3);
  EXPECT_EQ(o.next, 0);  // bonus argmax P_3
  in.drafts = second_wrong;
  o = m3::verify_greedy(in);
  EXPECT_EQ(o.accepted, 1);
  EXPECT_EQ(o.next, 1);  // argmax P_1, lowest id of the tie
  in.drafts = first_wrong;
  o = m3::verify_greedy(in);
  EXPECT_EQ(o.accepted, 0);
  EXPECT_EQ(o.next, 2);
  in.gamma = 0;
  o = m3::verify_greedy(in);
  EXPECT_EQ(o.accepted, 0);
  EXPECT_EQ(o.next, 2);
}

TEST(SpecStandard, AcceptanceProbabilityAndResidual) {
  // P_0 = (.5, .3, .2), q_1 = (.2, .5, .3), d_1 = 1: accept with min(1, .3/.5) = .6; the residual
  // max(0, P_0 - q_1) = (.3, 0, 0) so a rejection always emits 0. Accepted: bonus ~ P_1.
  const int V = 3;
  std::vector<float> target = {0.5f, 0.3f, 0.2f, 0.0f, 0.25f, 0.75f};
  std::vector<float> draft = {0.2f, 0.5f, 0.3f};
  const int32_t d[1] = {1};
  VerifyInput in{1, V, d, target.data(), draft.data()};
  Sampler s = make_rng(11);
  const int N = 200000;
  int acc = 0, bonus2 = 0;
  for (int i = 0; i < N; ++i) {
    const VerifyOutcome o = m3::verify_standard(in, s);
    if (o.accepted == 1) {
      ++acc;
      ASSERT_NE(o.next, 0);  // P_1(0) = 0
      bonus2 += o.next == 2;
    } else {
      ASSERT_EQ(o.accepted, 0);
      ASSERT_EQ(o.next, 0);
    }
  }
  const double se = std::sqrt(0.6 * 0.4 / N);
  EXPECT_NEAR(double(acc) / N, 0.6, 5 * se);
  EXPECT_NEAR(double(bonus2) / acc, 0.75, 5 * std::sqrt(0.75 * 0.25 / acc));
}

TEST(SpecStandard, GammaZeroAndResidualFallback) {
  const int V = 3;
  Sampler s = make_rng(12);
  // gamma 0: next ~ P_0, never the zero-probability id.
  std::vector<float> p0 = {0.25f, 0.0f, 0.75f};
  VerifyInput in0{0, V, nullptr, p0.data(), nullptr};
  int two = 0;
  const int N = 100000;
  for (int i = 0; i < N; ++i) {
    const VerifyOutcome o = m3::verify_standard(in0, s);
    ASSERT_EQ(o.accepted, 0);
    ASSERT_NE(o.next, 1);
    two += o.next == 2;
    ASSERT_EQ(m3::verify_block(in0, s).accepted, 0);
  }
  EXPECT_NEAR(double(two) / N, 0.75, 5 * std::sqrt(0.75 * 0.25 / N));
  // An unnormalised q = 2 P: accept with 1/2, and the residual max(0, P - q) is all zero, so the
  // rejection falls back to P_0 (never the id with P_0 = 0).
  std::vector<float> target = {0.5f, 0.5f, 0.0f, 0.0f, 0.0f, 1.0f};
  std::vector<float> draft = {1.0f, 1.0f, 0.0f};
  const int32_t d[1] = {0};
  VerifyInput in{1, V, d, target.data(), draft.data()};
  int rej = 0;
  for (int i = 0; i < N; ++i) {
    const VerifyOutcome o = m3::verify_standard(in, s);
    if (o.accepted == 0) {
      ++rej;
      ASSERT_NE(o.next, 2);
    } else {
      ASSERT_EQ(o.next, 2);
    }
    const VerifyOutcome b = m3::verify_block(in, s);  // gamma 1: tau = 0 w.p. 1 - p_1 = 1/2
    if (b.accepted == 0) {
      ASSERT_NE(b.next, 2);
    }
  }
  EXPECT_NEAR(double(rej) / N, 0.5, 5 * std::sqrt(0.25 / N));
}

// Exact expected number of accepted drafts of one verification step, over all draft sequences
// (context-free toy: the same P and q at every position), for the block rule (from its weights)
// and the token-wise rule (product of min(1, P/q)).
void toy_expected_accepted(const std::vector<float>& P, const std::vector<float>& q, int G, double* block,
                           double* standard) {
  const int V = int(P.size());
  std::vector<float> target, draft;
  for (int i = 0; i <= G; ++i) target.insert(target.end(), P.begin(), P.end());
  for (int i = 0; i < G; ++i) draft.insert(draft.end(), q.begin(), q.end());
  *block = *standard = 0;
  std::vector<int32_t> d(size_t(G), 0);
  std::vector<double> p(size_t(G) + 1), h(size_t(G) + 1);
  for (int64_t code = 0; code < int64_t(std::pow(V, G)); ++code) {
    int64_t c = code;
    double w = 1;
    for (int i = 0; i < G; ++i) {
      d[i] = int32_t(c % V);
      c /= V;
      w *= q[d[i]];
    }
    if (w == 0) continue;
    VerifyInput in{G, V, d.data(), target.data(), draft.data()};
    m3::block_verification_weights(in, p.data(), h.data());
    double tail = 1, eb = 0;  // prod_{j>i} (1 - h_j)
    for (int i = G; i >= 1; --i) {
      eb += i * h[i] * tail;
      tail *= 1 - h[i];
    }
    double run = 1, es = 0;
    for (int i = 0; i < G; ++i) {
      run *= std::min(1.0, double(P[d[i]]) / q[d[i]]);
      es += run;
    }
    *block += w * eb;
    *standard += w * es;
  }
}

TEST(SpecBlock, PaperToyExampleExactAndSampled) {
  // Sun et al.'s toy example: M_b = (1/3, 2/3), M_s = (2/3, 1/3) at every position, gamma = 2:
  // expected accepted drafts 10/9 token-wise, 11/9 with block verification.
  const std::vector<float> P = {1.0f / 3, 2.0f / 3}, q = {2.0f / 3, 1.0f / 3};
  double eb, es;
  toy_expected_accepted(P, q, 2, &eb, &es);
  EXPECT_NEAR(eb, 11.0 / 9, 1e-6);
  EXPECT_NEAR(es, 10.0 / 9, 1e-6);
  // The same by sampling through the real rules (drafts drawn from q).
  const int G = 2, V = 2, N = 400000;
  std::vector<float> target = {P[0], P[1], P[0], P[1], P[0], P[1]}, draft = {q[0], q[1], q[0], q[1]};
  Sampler s = make_rng(13);
  int64_t sum_b = 0, sum_s = 0;
  int32_t d[2];
  for (int i = 0; i < N; ++i) {
    d[0] = s.draw(q.data(), V);
    d[1] = s.draw(q.data(), V);
    VerifyInput in{G, V, d, target.data(), draft.data()};
    sum_b += m3::verify_block(in, s).accepted;
    sum_s += m3::verify_standard(in, s).accepted;
  }
  // sd of the accepted count is below 1, so 5 sd of the mean is < 5 / sqrt(N) = 0.008.
  EXPECT_NEAR(double(sum_b) / N, 11.0 / 9, 0.008);
  EXPECT_NEAR(double(sum_s) / N, 10.0 / 9, 0.008);
  // And never below token-wise on random cases (up to the fp32 rounding of the inputs).
  std::mt19937_64 g(14);
  for (int t = 0; t < 20; ++t) {
    const std::vector<float> P2 = random_dist(g, 3, 0.2), q2 = random_dist(g, 3, 0.2);
    toy_expected_accepted(P2, q2, 3, &eb, &es);
    EXPECT_GE(eb, es - 1e-7) << "diff " << eb - es;
  }
}

TEST(SpecBlock, OneHotDraftReducesToTokenWise) {
  // With a one-hot q the block rule keeps exactly i drafts with the token-wise probability
  // prod_{j<=i} P_{j-1}(d_j) * (1 - P_i(d_{i+1})), and its residual is the token-wise one.
  std::mt19937_64 g(15);
  const int V = 6, G = 4;
  for (int t = 0; t < 50; ++t) {
    std::vector<float> target, draft(size_t(G) * V, 0.0f);
    for (int i = 0; i <= G; ++i) {
      const std::vector<float> r = random_dist(g, V, 0.3);
      target.insert(target.end(), r.begin(), r.end());
    }
    std::vector<int32_t> d(G);
    for (int i = 0; i < G; ++i) {
      d[i] = int32_t(g() % V);
      draft[size_t(i) * V + d[i]] = 1.0f;
    }
    VerifyInput in{G, V, d.data(), target.data(), draft.data()};
    std::vector<double> p(G + 1), h(G + 1);
    m3::block_verification_weights(in, p.data(), h.data());
    double run = 1;
    for (int i = 0; i <= G; ++i) {
      double tail = 1;
      for (int j = i + 1; j <= G; ++j) tail *= 1 - h[j];
      const double block = (i == 0 ? 1.0 : h[i]) * tail;
      const double tokenwise = i < G ? run * (1 - target[size_t(i) * V + d[i]]) : run;
      EXPECT_NEAR(block, tokenwise, 1e-6) << "case " << t << " tau " << i;
      if (i < G) run *= target[size_t(i) * V + d[i]];
    }
  }
  // Sampled: the (tau, next) law of verify_block equals the token-wise closed form.
  std::vector<float> target, draft(size_t(G) * V, 0.0f);
  for (int i = 0; i <= G; ++i) {
    const std::vector<float> r = random_dist(g, V, 0.25, 3);
    target.insert(target.end(), r.begin(), r.end());
  }
  std::vector<int32_t> d(G);
  for (int i = 0; i < G; ++i) {  // the most likely ids, so that long prefixes are common
    d[i] = int32_t(std::max_element(target.begin() + i * V, target.begin() + (i + 1) * V) - (target.begin() + i * V));
    draft[size_t(i) * V + d[i]] = 1.0f;
  }
  std::vector<double> exact(size_t(G + 1) * V, 0.0);
  double run = 1;
  for (int i = 0; i <= G; ++i) {
    const float* Pi = target.data() + size_t(i) * V;
    for (int y = 0; y < V; ++y) {
      if (i == G) exact[size_t(i) * V + y] = run * Pi[y];
      else if (y != d[i]) exact[size_t(i) * V + y] = run * Pi[y];  // run (1 - P(d)) * P(y) / (1 - P(d))
    }
    if (i < G) run *= Pi[d[i]];
  }
  VerifyInput in{G, V, d.data(), target.data(), draft.data()};
  Sampler s = make_rng(16);
  std::vector<int64_t> counts(exact.size(), 0);
  for (int n = 0; n < 200000; ++n) {
    const VerifyOutcome o = m3::verify_block(in, s);
    ++counts[size_t(o.accepted) * V + o.next];
  }
  EXPECT_TRUE(chi_square(counts, exact, "block one-hot (tau, next) vs token-wise").pass());
}

TEST(SpecBlock, TauLawMatchesWeightsScanningAllPositions) {
  // tau = the LARGEST i with eta_i < h_i: P(tau = i) = h_i prod_{j>i} (1 - h_j). An early-stopping
  // scan has a different law (see SpecLosslessWrongRule.BlockEarlyStopFails). The case: random target
  // rows, drafts q_i = P_{i-1} perturbed (log-normal noise), d_i = argmax P_{i-1}; the first
  // generator seed whose tau law gives every tau at least 2 % is used.
  const int V = 4, G = 5;
  std::vector<float> target, draft;
  int32_t d[G];
  std::vector<double> p(G + 1), h(G + 1), law(G + 1);
  bool found = false;
  for (uint64_t seed = 0; seed < 1000 && !found; ++seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<double> noise(0.0, 1.0);
    target.clear();
    draft.clear();
    for (int i = 0; i <= G; ++i) {
      const std::vector<float> r = random_dist(g, V, 0.0);
      target.insert(target.end(), r.begin(), r.end());
    }
    for (int i = 0; i < G; ++i) {
      const float* P = target.data() + size_t(i) * V;
      std::vector<double> w(static_cast<size_t>(V));
      for (int x = 0; x < V; ++x) w[x] = P[x] * std::exp(noise(g));
      const std::vector<float> q = normalized(w);
      draft.insert(draft.end(), q.begin(), q.end());
      d[i] = int32_t(std::max_element(P, P + V) - P);
    }
    VerifyInput in{G, V, d, target.data(), draft.data()};
    m3::block_verification_weights(in, p.data(), h.data());
    found = true;
    for (int i = 0; i <= G; ++i) {
      double tail = 1;
      for (int j = i + 1; j <= G; ++j) tail *= 1 - h[j];
      law[i] = (i == 0 ? 1.0 : h[i]) * tail;
      found = found && law[i] >= 0.02;
    }
  }
  ASSERT_TRUE(found);
  VerifyInput in{G, V, d, target.data(), draft.data()};
  Sampler s = make_rng(18);
  std::vector<int64_t> counts(G + 1, 0);
  for (int n = 0; n < 200000; ++n) ++counts[m3::verify_block(in, s).accepted];
  EXPECT_TRUE(chi_square(counts, law, "block tau law vs h-weights").pass());
}

// ---------------------------------------------------------------------------------------------
// Synthetic acceptance (benchmarking).

TEST(SpecSynthetic, RatesForLengthAndVllmSchedules) {
  EXPECT_EQ(m3::synthetic_rates_for_length(1.0, 4), std::vector<double>(4, 0.0));
  EXPECT_EQ(m3::synthetic_rates_for_length(5.0, 4), std::vector<double>(4, 1.0));
  EXPECT_TRUE(m3::synthetic_rates_for_length(1.0, 0).empty());
  for (double al : {1.3, 2.0, 3.0, 4.04, 7.9}) {
    const std::vector<double> r = m3::synthetic_rates_for_length(al, 7);
    ASSERT_EQ(r.size(), 7u);
    double sum = 1, pw = 1;
    for (double a : r) sum += pw *= a;
    EXPECT_NEAR(sum, al, 1e-12);
  }
  EXPECT_THROW(m3::synthetic_rates_for_length(0.9, 4), m3::Error);
  EXPECT_THROW(m3::synthetic_rates_for_length(5.01, 4), m3::Error);
  EXPECT_THROW(m3::synthetic_rates_min_variance(8.5, 7), m3::Error);
  // vLLM: length 2.6 over 3 drafts -> unconditional [1, .6, 0]; 3.5 over 4 -> [1, 1, .5, 0].
  const std::vector<double> mv = m3::synthetic_rates_min_variance(2.6, 3);
  ASSERT_EQ(mv.size(), 3u);
  EXPECT_DOUBLE_EQ(mv[0], 1.0);
  EXPECT_NEAR(mv[1], 0.6, 1e-12);
  EXPECT_DOUBLE_EQ(mv[2], 0.0);
  EXPECT_EQ(m3::synthetic_rates_min_variance(4.0, 3), std::vector<double>(3, 1.0));
  const std::vector<double> c = m3::synthetic_rates_from_unconditional({0.7, 0.4, 0.1, 0.0, 0.0});
  EXPECT_NEAR(c[0], 0.7, 1e-12);
  EXPECT_NEAR(c[1], 0.4 / 0.7, 1e-12);
  EXPECT_NEAR(c[2], 0.25, 1e-12);
  EXPECT_EQ(c[3], 0.0);
  EXPECT_EQ(c[4], 0.0);
  EXPECT_THROW(m3::synthetic_rates_from_unconditional({0.5, 0.6}), m3::Error);
  EXPECT_THROW(m3::synthetic_rates_from_unconditional({1.5}), m3::Error);
}

TEST(SpecSynthetic, AchievesTheConfiguredAcceptanceLength) {
  const int V = 3, G = 7, N = 200000;
  std::vector<float> target;
  for (int i = 0; i <= G; ++i) target.insert(target.end(), {0.2f, 0.0f, 0.8f});
  const int32_t d[G] = {1, 1, 1, 1, 1, 1, 1};  // ids the target never produces: acceptance is forced
  VerifyInput in{G, V, d, target.data(), nullptr};
  Sampler s = make_rng(19);
  for (const auto& rates : {m3::synthetic_rates_for_length(4.04, G), m3::synthetic_rates_min_variance(4.04, G)}) {
    int64_t emitted = 0;
    for (int n = 0; n < N; ++n) {
      const VerifyOutcome o = m3::verify_synthetic(in, rates, s);
      ASSERT_NE(o.next, 1);
      emitted += o.accepted + 1;
    }
    EXPECT_NEAR(double(emitted) / N, 4.04, 0.03);  // sd of the length <= 3.5: 5 sd of the mean < 0.04
  }
  EXPECT_THROW(m3::verify_synthetic(in, std::vector<double>(3, 0.5), s), m3::Error);
}

// ---------------------------------------------------------------------------------------------
// LOSSLESSNESS. A toy autoregressive target over V = 5 ids, P(x | last two tokens), and a
// deliberately different draft q(x | last token), both drawn from seeded generators with exact
// zeros in places (so some target-impossible ids get drafted, and some target-likely ids are
// draft-impossible). One sample = run speculative steps exactly as the engine does (draft gamma
// tokens one after another from q, each conditioned on the previous draft; P_0..P_gamma along the
// drafted path; verify; append the accepted drafts and `next`) until at least 3 new tokens exist,
// and keep the first 3. Their empirical joint law over the 125 cells must match the exact target
// law P(x1|a,b) P(x2|b,x1) P(x3|x1,x2): Pearson chi-square at alpha = 1e-3 (pooling cells with
// expected count < 5), and no sample in a cell of probability 0.

constexpr int kV = 5;
constexpr int kM = 3;        // tokens compared per sample
constexpr int kN = 200000;   // samples per test
const int32_t kPrefix[2] = {1, 3};

struct Toy {
  std::vector<float> P;  // [kV * kV * kV]: P(x | a, b) at (a * kV + b) * kV + x
  std::vector<float> Q;  // [kV * kV]: q(x | b) at b * kV + x
  const float* p(int a, int b) const { return P.data() + (size_t(a) * kV + b) * kV; }
  const float* q(int b) const { return Q.data() + size_t(b) * kV; }
};

const Toy& toy() {
  static const Toy t = [] {
    Toy t;
    std::mt19937_64 g(2024);
    for (int c = 0; c < kV * kV; ++c) {
      const std::vector<float> r = random_dist(g, kV, 0.3, 2);
      t.P.insert(t.P.end(), r.begin(), r.end());
    }
    std::mt19937_64 h(777);
    for (int c = 0; c < kV; ++c) {
      const std::vector<float> r = random_dist(h, kV, 0.2, 2);
      t.Q.insert(t.Q.end(), r.begin(), r.end());
    }
    return t;
  }();
  return t;
}

std::vector<double> exact_joint() {
  const Toy& t = toy();
  std::vector<double> law(size_t(kV * kV * kV));
  for (int x1 = 0; x1 < kV; ++x1)
    for (int x2 = 0; x2 < kV; ++x2)
      for (int x3 = 0; x3 < kV; ++x3)
        law[(x1 * kV + x2) * kV + x3] = double(t.p(kPrefix[0], kPrefix[1])[x1]) * t.p(kPrefix[1], x1)[x2] * t.p(x1, x2)[x3];
  return law;
}

using Rule = std::function<VerifyOutcome(const VerifyInput&, Sampler&)>;

// One-hot drafts: the draft takes the argmax of q(. | last) and verification sees a one-hot q.
ChiSquare run_lossless(const Rule& rule, int G, bool one_hot_draft, uint64_t seed, const char* label) {
  const Toy& t = toy();
  Sampler s = make_rng(seed);
  std::vector<int32_t> seq, d(size_t(std::max(G, 1)));
  std::vector<float> target(size_t(G + 1) * kV), draft(size_t(std::max(G, 1)) * kV);
  std::vector<int64_t> counts(size_t(kV * kV * kV), 0);
  for (int n = 0; n < kN; ++n) {
    seq.assign(kPrefix, kPrefix + 2);
    while (int(seq.size()) - 2 < kM) {
      // Draft: d_j ~ q(. | previous token), sequentially.
      int32_t prev = seq.back();
      for (int j = 0; j < G; ++j) {
        float* qj = draft.data() + size_t(j) * kV;
        const float* row = t.q(prev);
        if (one_hot_draft) {
          std::fill(qj, qj + kV, 0.0f);
          qj[std::max_element(row, row + kV) - row] = 1.0f;
        } else {
          std::copy(row, row + kV, qj);
        }
        d[j] = s.draw(qj, kV);
        prev = d[j];
      }
      // Target distributions along the drafted path.
      int32_t a = seq[seq.size() - 2], b = seq.back();
      for (int i = 0; i <= G; ++i) {
        std::copy(t.p(a, b), t.p(a, b) + kV, target.data() + size_t(i) * kV);
        if (i < G) {
          a = b;
          b = d[i];
        }
      }
      const VerifyInput in{G, kV, d.data(), target.data(), draft.data()};
      const VerifyOutcome o = rule(in, s);
      seq.insert(seq.end(), d.begin(), d.begin() + o.accepted);
      seq.push_back(o.next);
    }
    ++counts[(size_t(seq[2]) * kV + seq[3]) * kV + seq[4]];
  }
  return chi_square(counts, exact_joint(), label);
}

const Rule kStandard = [](const VerifyInput& in, Sampler& s) { return m3::verify_standard(in, s); };
const Rule kBlock = [](const VerifyInput& in, Sampler& s) { return m3::verify_block(in, s); };

TEST(SpecLossless, ToyModelsHaveZerosAndDisagree) {
  // Guard the test's power: the draft must put mass where the target has none and vice versa.
  const Toy& t = toy();
  int draft_only = 0, target_only = 0;
  for (int a = 0; a < kV; ++a)
    for (int b = 0; b < kV; ++b)
      for (int x = 0; x < kV; ++x) {
        draft_only += t.p(a, b)[x] == 0 && t.q(b)[x] > 0;
        target_only += t.p(a, b)[x] > 0 && t.q(b)[x] == 0;
      }
  EXPECT_GT(draft_only, 5);
  EXPECT_GT(target_only, 5);
}

TEST(SpecLossless, StandardGamma2) { EXPECT_TRUE(run_lossless(kStandard, 2, false, 101, "standard gamma=2").pass()); }
TEST(SpecLossless, StandardGamma4) { EXPECT_TRUE(run_lossless(kStandard, 4, false, 102, "standard gamma=4").pass()); }
TEST(SpecLossless, BlockGamma2) { EXPECT_TRUE(run_lossless(kBlock, 2, false, 103, "block gamma=2").pass()); }
TEST(SpecLossless, BlockGamma4) { EXPECT_TRUE(run_lossless(kBlock, 4, false, 104, "block gamma=4").pass()); }
TEST(SpecLossless, BlockGamma7) { EXPECT_TRUE(run_lossless(kBlock, 7, false, 105, "block gamma=7").pass()); }
TEST(SpecLossless, BlockOneHotDraftGamma3) {
  EXPECT_TRUE(run_lossless(kBlock, 3, true, 106, "block one-hot draft gamma=3").pass());
}
TEST(SpecLossless, StandardOneHotDraftGamma3) {
  EXPECT_TRUE(run_lossless(kStandard, 3, true, 107, "standard one-hot draft gamma=3").pass());
}
TEST(SpecLossless, GammaZeroIsPlainSampling) {
  EXPECT_TRUE(run_lossless(kBlock, 0, false, 108, "block gamma=0").pass());
}

// Deliberately wrong rules: each must FAIL the same test, by a wide margin. (Accepting with
// P/q "without the min" is not among them: u < P/q and u < min(1, P/q) are the same event for
// u in [0, 1), so that rule is in fact correct.)

Rule wrong_block(int variant) {
  return [variant](const VerifyInput& in, Sampler& s) -> VerifyOutcome {
    const int G = in.gamma;
    const int64_t V = in.vocab;
    std::vector<double> p(G + 1), h(G + 1);
    m3::block_verification_weights(in, p.data(), h.data());
    int tau = 0;
    if (variant == 2) {  // early stop: tau = (first i with eta_i >= h_i) - 1
      while (tau < G && s.uniform() < h[tau + 1]) ++tau;
    } else {
      for (int i = 1; i <= G; ++i)
        if (s.uniform() < h[i]) tau = i;
    }
    const float* P = in.target + tau * V;
    if (tau == G) return {G, s.draw(P, V)};
    if (variant == 0) return {tau, s.draw(P, V)};  // residual replaced by P_tau
    const float* q = in.draft + tau * V;
    const double scale = variant == 1 ? 1.0 : p[tau];  // variant 1: p_tau factor dropped
    std::vector<float> r(V);
    double sum = 0;
    for (int64_t x = 0; x < V; ++x) sum += r[x] = float(std::max(0.0, scale * P[x] - q[x]));
    return {tau, sum > 0 ? s.draw(r.data(), V) : s.draw(P, V)};
  };
}

Rule wrong_standard(int variant) {
  return [variant](const VerifyInput& in, Sampler& s) -> VerifyOutcome {
    const int64_t V = in.vocab;
    for (int i = 1; i <= in.gamma; ++i) {
      const int32_t d = in.drafts[i - 1];
      const float* P = in.target + (i - 1) * V;
      const float* q = in.draft + (i - 1) * V;
      // variant 1: accept with P(d) alone (forgets to divide by q).
      const double accept = variant == 1 ? P[d] : std::min(1.0, double(P[d]) / q[d]);
      if (!(s.uniform() < accept)) {
        if (variant == 0) return {i - 1, s.draw(P, V)};  // resamples from P, not the residual
        std::vector<float> r(V);
        double sum = 0;
        for (int64_t x = 0; x < V; ++x) sum += r[x] = std::max(0.0f, P[x] - q[x]);
        return {i - 1, sum > 0 ? s.draw(r.data(), V) : s.draw(P, V)};
      }
    }
    return {in.gamma, s.draw(in.target + in.gamma * V, V)};
  };
}

TEST(SpecLosslessWrongRule, BlockResidualIsTargetFails) {
  const ChiSquare c = run_lossless(wrong_block(0), 4, false, 201, "WRONG block: residual = P_tau");
  EXPECT_FALSE(c.pass());
  EXPECT_GT(c.stat, 3 * c.critical);
}
TEST(SpecLosslessWrongRule, BlockResidualWithoutPTauFails) {
  const ChiSquare c = run_lossless(wrong_block(1), 4, false, 202, "WRONG block: residual without p_tau");
  EXPECT_FALSE(c.pass());
  EXPECT_GT(c.stat, 3 * c.critical);
}
TEST(SpecLosslessWrongRule, BlockEarlyStopFails) {
  const ChiSquare c = run_lossless(wrong_block(2), 4, false, 203, "WRONG block: early-stopping scan");
  EXPECT_FALSE(c.pass());
  EXPECT_GT(c.stat, 3 * c.critical);
}
TEST(SpecLosslessWrongRule, StandardResampleFromTargetFails) {
  const ChiSquare c = run_lossless(wrong_standard(0), 4, false, 204, "WRONG standard: Y ~ P on reject");
  EXPECT_FALSE(c.pass());
  EXPECT_GT(c.stat, 3 * c.critical);
}
TEST(SpecLosslessWrongRule, StandardAcceptWithoutRatioFails) {
  const ChiSquare c = run_lossless(wrong_standard(1), 2, false, 205, "WRONG standard: accept w.p. P(d)");
  EXPECT_FALSE(c.pass());
  EXPECT_GT(c.stat, 3 * c.critical);
}

// ---------------------------------------------------------------------------------------------
// Sampler: distribution() / draw() / uniform() / fill_logprob() against sample().

// The sampler as it was before distribution() existed (commit 77fe299), to pin sample()'s
// behaviour and random stream.
int32_t reference_sample(const SamplingParams& p_, std::mt19937_64& rng_, const float* logits, int64_t V,
                         const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  std::vector<float> work_(logits, logits + V);
  float* x = work_.data();
  if (p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    std::vector<int32_t> counts_(size_t(V), 0);
    for (int32_t t : output)
      if (t >= 0 && t < V) ++counts_[t];
    if (p_.repetition_penalty != 1.0f) {
      std::vector<uint8_t> seen_(size_t(V), 0);
      for (int32_t t : prompt)
        if (t >= 0 && t < V) seen_[t] = 1;
      for (int32_t t : output)
        if (t >= 0 && t < V) seen_[t] = 1;
      for (int64_t i = 0; i < V; ++i)
        if (seen_[i]) x[i] = x[i] > 0 ? x[i] / p_.repetition_penalty : x[i] * p_.repetition_penalty;
    }
    for (int64_t i = 0; i < V; ++i)
      if (counts_[i]) x[i] -= p_.frequency_penalty * float(counts_[i]) + p_.presence_penalty;
  }
  if (p_.temperature <= 0.0f) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (x[i] > x[best]) best = i;
    return int32_t(best);
  }
  std::vector<std::pair<float, int32_t>> cand_(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) cand_[i] = {x[i], int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  int64_t n = V;
  if (p_.top_k > 0 && p_.top_k < V) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = p_.top_k;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  const double mx = cand_[0].first;
  std::vector<double> prob_(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += prob_[i] = std::exp((double(cand_[i].first) - mx) / p_.temperature);
  if (p_.top_p < 1.0f) {
    double acc = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; ++i) {
      acc += prob_[i] / sum;
      if (acc >= double(p_.top_p)) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (p_.min_p > 0.0f) {
    const double floor = prob_[0] * p_.min_p;
    int64_t keep = 1;
    while (keep < n && prob_[keep] >= floor) ++keep;
    n = keep;
  }
  sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += prob_[i];
  const double r = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * sum;
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    acc += prob_[i];
    if (r < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

struct Combo {
  const char* name;
  SamplingParams p;
};

std::vector<Combo> combos() {
  std::vector<Combo> c;
  auto add = [&](const char* name, float t, int k, float tp, float mp, float rep, float pres, float freq) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = k;
    p.top_p = tp;
    p.min_p = mp;
    p.repetition_penalty = rep;
    p.presence_penalty = pres;
    p.frequency_penalty = freq;
    p.has_seed = true;
    p.seed = 4242;
    c.push_back({name, p});
  };
  add("plain t=1", 1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
  add("t=0.6", 0.6f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
  add("top_k=4", 1.0f, 4, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
  add("top_p=0.7 t=1.3", 1.3f, 0, 0.7f, 0.0f, 1.0f, 0.0f, 0.0f);
  add("min_p=0.15", 1.0f, 0, 1.0f, 0.15f, 1.0f, 0.0f, 0.0f);
  add("top_k=6 top_p=0.9 min_p=0.05 t=0.8", 0.8f, 6, 0.9f, 0.05f, 1.0f, 0.0f, 0.0f);
  add("penalties rep=1.4 pres=0.5 freq=0.3", 1.0f, 0, 1.0f, 0.0f, 1.4f, 0.5f, 0.3f);
  add("penalties + top_p=0.8 + min_p=0.02", 0.9f, 0, 0.8f, 0.02f, 1.2f, 0.2f, 0.4f);
  add("greedy + penalties", 0.0f, 0, 1.0f, 0.0f, 1.5f, 0.3f, 0.2f);
  return c;
}

const std::vector<float> kLogits = {1.2f, -0.4f, 2.5f, 0.3f, 2.5f, -3.0f, 0.9f, 1.7f, -1.1f, 0.0f, 2.1f, -0.2f};
const std::vector<int32_t> kPrompt = {2, 7, 7};
const std::vector<int32_t> kOutput = {4, 10, 4, 1};

// Every combination's sampler draws the reference's tokens, `draws` times from the same logits.
void expect_sampler_matches_reference(const std::vector<float>& logits, const std::vector<int32_t>& prompt,
                                      const std::vector<int32_t>& output, int draws) {
  const int64_t V = int64_t(logits.size());
  for (const Combo& c : combos()) {
    Sampler s(c.p);
    std::mt19937_64 ref(c.p.seed);
    for (int n = 0; n < draws; ++n)
      ASSERT_EQ(s.sample(logits.data(), V, prompt, output), reference_sample(c.p, ref, logits.data(), V, prompt, output))
          << c.name << " draw " << n;
  }
}

TEST(SpecSampler, SampleBehaviourUnchanged) { expect_sampler_matches_reference(kLogits, kPrompt, kOutput, 3000); }

// The same over a vocabulary large enough for the radix sort's three passes to matter, with many
// equal logits (ties go to the lowest id), +0 and -0 (equal), and -inf entries.
TEST(SpecSampler, SampleBehaviourUnchangedLargeVocabularyWithTies) {
  const int64_t V = 5000;
  std::mt19937 g(9);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> logits(V);
  for (auto& v : logits) v = std::round(nd(g) * 4.f) / 4.f;  // about 60 distinct values
  for (int64_t i = 0; i < V; i += 97) logits[i] = (i / 97) % 2 ? -0.0f : 0.0f;
  for (int64_t i = 5; i < V; i += 301) logits[i] = -std::numeric_limits<float>::infinity();
  logits[4321] = 9.5f;
  logits[17] = 9.5f;  // the top two tie
  expect_sampler_matches_reference(logits, {17, 4321, 8, 8}, {4999, 0}, 400);
}

// The linear-time sort behind top-p gives exactly std::sort's order (descending logit, lowest id
// first among equal logits, -0 equal to +0) on logits with many ties, both zeros, infinities and
// subnormals, for vocabularies from 1 entry to past 2^16.
TEST(SpecSampler, RadixOrderEqualsStdSort) {
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.f, 5.f);
  for (int64_t V : {int64_t(1), int64_t(2), int64_t(7), int64_t(5000), int64_t(70001)}) {
    std::vector<std::pair<float, int32_t>> a(static_cast<size_t>(V)), tmp;
    for (int64_t i = 0; i < V; ++i) {
      float v = std::round(nd(g) * 8.f) / 8.f;
      switch (g() % 16) {
        case 0: v = 0.0f; break;
        case 1: v = -0.0f; break;
        case 2: v = -std::numeric_limits<float>::infinity(); break;
        case 3: v = std::numeric_limits<float>::infinity(); break;
        case 4: v = std::numeric_limits<float>::denorm_min() * float(g() % 5) * (g() % 2 ? 1.f : -1.f); break;
        case 5: v = nd(g); break;  // distinct values
        default: break;
      }
      a[size_t(i)] = {v, int32_t(i)};
    }
    auto b = a;
    std::sort(b.begin(), b.end(), [](const auto& x, const auto& y) {
      return x.first > y.first || (x.first == y.first && x.second < y.second);
    });
    Sampler::sort_by_logit(a, tmp);
    for (int64_t i = 0; i < V; ++i) ASSERT_EQ(a[size_t(i)].second, b[size_t(i)].second) << "V=" << V << " rank " << i;
  }
}

TEST(SpecSampler, DistributionMatchesSampleFrequencies) {
  const int64_t V = int64_t(kLogits.size());
  std::vector<float> probs(V);
  for (const Combo& c : combos()) {
    Sampler s(c.p);
    s.distribution(kLogits.data(), V, kPrompt, kOutput, probs.data());
    double total = 0;
    for (float x : probs) total += x;
    EXPECT_NEAR(total, 1.0, 1e-6) << c.name;
    std::vector<double> law(probs.begin(), probs.end());
    std::vector<int64_t> counts(V, 0);
    for (int n = 0; n < 100000; ++n) ++counts[s.sample(kLogits.data(), V, kPrompt, kOutput)];
    if (c.p.temperature <= 0.0f) {
      EXPECT_EQ(counts[std::max_element(probs.begin(), probs.end()) - probs.begin()], 100000) << c.name;
      continue;
    }
    EXPECT_TRUE(chi_square(counts, law, c.name).pass()) << c.name;
    // The support is exactly sample()'s: ids cut by top-k / top-p / min-p have probability 0.
    for (int64_t i = 0; i < V; ++i)
      if (probs[i] == 0.0f) {
        EXPECT_EQ(counts[i], 0) << c.name << " id " << i;
      }
  }
}

TEST(SpecSampler, DistributionValues) {
  const int64_t V = int64_t(kLogits.size());
  std::vector<float> probs(V);
  // Plain softmax at temperature T.
  SamplingParams p;
  p.temperature = 0.7f;
  Sampler s(p);
  s.distribution(kLogits.data(), V, {}, {}, probs.data());
  double z = 0;
  for (float l : kLogits) z += std::exp(double(l) / 0.7);
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(probs[i], std::exp(double(kLogits[i]) / 0.7) / z, 1e-7);
  // top-k = 3 on logits {2.5 (id 2), 2.5 (id 4), 2.1 (id 10), ...}: the renormalised softmax of those.
  p.temperature = 1.0f;
  p.top_k = 3;
  Sampler k3(p);
  k3.distribution(kLogits.data(), V, {}, {}, probs.data());
  z = 2 * std::exp(2.5) + std::exp(2.1);
  for (int64_t i = 0; i < V; ++i) {
    const double want = (i == 2 || i == 4) ? std::exp(2.5) / z : i == 10 ? std::exp(2.1) / z : 0.0;
    EXPECT_NEAR(probs[i], want, 1e-7) << i;
  }
  // min-p without a sort equals the sorted path (min-p combined with top-k = V, which sorts).
  p.top_k = 0;
  p.min_p = 0.2f;
  Sampler a(p);
  std::vector<float> fast(V), sorted(V);
  a.distribution(kLogits.data(), V, kPrompt, kOutput, fast.data());
  p.top_k = int(V) - 1;  // sorted path; the cut at V-1 is below the min-p floor here
  Sampler b(p);
  b.distribution(kLogits.data(), V, kPrompt, kOutput, sorted.data());
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(fast[i], sorted[i], 1e-7) << i;
}

TEST(SpecSampler, GreedyDistributionIsOneHot) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p);
  const int64_t V = int64_t(kLogits.size());
  std::vector<float> probs(V);
  s.distribution(kLogits.data(), V, {}, {}, probs.data());
  for (int64_t i = 0; i < V; ++i) EXPECT_EQ(probs[i], i == 2 ? 1.0f : 0.0f) << i;  // tie 2 / 4: lowest id
  p.presence_penalty = 1.0f;  // id 2 in the output: 2.5 - 1 = 1.5, so id 4 wins
  Sampler t(p);
  t.distribution(kLogits.data(), V, {}, {2}, probs.data());
  for (int64_t i = 0; i < V; ++i) EXPECT_EQ(probs[i], i == 4 ? 1.0f : 0.0f) << i;
  EXPECT_EQ(t.sample(kLogits.data(), V, {}, {2}), 4);
}

TEST(SpecSampler, FillLogprobEqualsSample) {
  const int64_t V = int64_t(kLogits.size());
  for (int nlp : {0, 3, 20}) {
    SamplingParams p;
    p.logprobs = nlp;
    p.top_k = 5;
    Sampler s(p), other(p);
    for (int n = 0; n < 50; ++n) {
      m3::TokenLogprob a, b;
      const int32_t t = s.sample(kLogits.data(), V, kPrompt, kOutput, &a);
      other.fill_logprob(kLogits.data(), V, t, &b);
      EXPECT_EQ(a.token, t);
      EXPECT_EQ(b.token, t);
      EXPECT_EQ(a.logprob, b.logprob);
      EXPECT_EQ(a.top, b.top);
      EXPECT_EQ(int64_t(b.top.size()), std::min<int64_t>(nlp, V));
    }
  }
  SamplingParams none;  // logprobs = -1: nothing written
  Sampler s(none);
  m3::TokenLogprob lp;
  lp.token = -7;
  s.fill_logprob(kLogits.data(), V, 3, &lp);
  EXPECT_EQ(lp.token, -7);
}

TEST(SpecSampler, DrawAndUniform) {
  Sampler s = make_rng(31);
  const std::vector<float> w = {0.0f, 3.0f, 0.0f, 1.0f, 0.0f};  // unnormalised
  int64_t three = 0;
  const int N = 100000;
  for (int n = 0; n < N; ++n) {
    const int32_t t = s.draw(w.data(), int64_t(w.size()));
    ASSERT_TRUE(t == 1 || t == 3);
    three += t == 3;
    const double u = s.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
  EXPECT_NEAR(double(three) / N, 0.25, 5 * std::sqrt(0.25 * 0.75 / N));
  // Same seed, same stream.
  Sampler a = make_rng(5), b = make_rng(5);
  for (int n = 0; n < 10; ++n) EXPECT_EQ(a.uniform(), b.uniform());
}

TEST(SpecSampler, LargeVocabFastPath) {
  const int64_t V = 200064;
  std::vector<float> logits(V);
  std::mt19937_64 g(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (float& x : logits) x = nd(g);
  SamplingParams p;
  p.temperature = 0.8f;
  Sampler s(p);
  std::vector<float> probs(V);
  s.distribution(logits.data(), V, {}, {}, probs.data());
  double mx = *std::max_element(logits.begin(), logits.end()), z = 0, total = 0;
  for (float x : logits) z += std::exp((double(x) - mx) / 0.8);
  double worst = 0;
  for (int64_t i = 0; i < V; ++i) {
    total += probs[i];
    worst = std::max(worst, std::fabs(probs[i] - std::exp((double(logits[i]) - mx) / 0.8) / z));
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_LT(worst, 1e-8);
}

}  // namespace
