// Adaptive speculation's decision (engine/spec_adaptive.h) with fake step costs and fake acceptance
// records: no drafts when rows are dear and acceptance low, every draft when rows are cheap, the
// right cut for a known per-position law, the exact optimum of tokens per ms against brute force, the
// scheduler's bound per request respected; the acceptance record's update rule; and adaptive
// verification's cut by the confidence head's survival probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/spec_adaptive.h"

namespace {

m3::SpecAcceptance acc(std::vector<double> r) {
  m3::SpecAcceptance a;
  a.rate = std::move(r);
  return a;
}

double ratio(const std::vector<m3::SpecCandidate>& cands, const std::vector<int>& k, double plain,
             const m3::SpecCosts& c) {
  double tokens = plain, ms = c.base_ms;
  for (size_t r = 0; r < cands.size(); ++r) {
    double p = 1;
    for (int i = 0; i < k[r]; ++i) tokens += (p *= cands[r].acc->rate[size_t(i)]);
    if (k[r] > 0) ms += k[r] * c.row_ms + c.draft_ms;
  }
  return tokens / ms;
}

TEST(SpecAdaptive, DearRowsAndLowAcceptanceSkipDrafting) {
  const auto a = acc({0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1});
  const std::vector<m3::SpecCandidate> c = {{&a, 7}};
  EXPECT_EQ(m3::choose_drafts(c, 1, {10, 5, 5}), std::vector<int>{0});
}

TEST(SpecAdaptive, CheapRowsAndHighAcceptanceVerifyAll) {
  const auto a = acc({0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9});
  const std::vector<m3::SpecCandidate> c = {{&a, 7}, {&a, 3}};
  EXPECT_EQ(m3::choose_drafts(c, 2, {10, 0.1, 0.5}), (std::vector<int>{7, 3}));  // 3: the scheduler's bound
}

TEST(SpecAdaptive, CutsWhereTheLawStopsPaying) {
  // Synthetic acceptance length 2.3 (vLLM's minimum-variance schedule): conditional 1, 0.3, then 0.
  const auto a = acc({1, 0.3, 0, 0, 0, 0, 0});
  const std::vector<m3::SpecCandidate> c = {{&a, 7}};
  // 10 ms step, 1 ms per row, 1 ms per draft pass: 2 drafts give 2.3 tokens in 13 ms (0.177 / ms); a
  // third would add a row and nothing else.
  EXPECT_EQ(m3::choose_drafts(c, 1, {10, 1, 1}), std::vector<int>{2});
  // Rows nearly free: still 2 (the later positions are never accepted).
  EXPECT_EQ(m3::choose_drafts(c, 1, {10, 1e-3, 1}), std::vector<int>{2});
  // The draft pass dearer than what two drafts bring at this rate: none.
  EXPECT_EQ(m3::choose_drafts(c, 1, {10, 1, 20}), std::vector<int>{0});
}

TEST(SpecAdaptive, MatchesBruteForceOptimum) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<m3::SpecAcceptance> accs(3);
    std::vector<m3::SpecCandidate> c;
    for (auto& a : accs) {
      for (int i = 0; i < 4; ++i) a.rate.push_back(u(rng));
      c.push_back({&a, 1 + int(rng() % 4)});
    }
    const m3::SpecCosts cost{5 + 20 * u(rng), 3 * u(rng), 3 * u(rng)};
    const double plain = 3 + double(rng() % 4);
    const auto k = m3::choose_drafts(c, plain, cost);
    double best = 0;
    for (int k0 = 0; k0 <= c[0].max_k; ++k0)
      for (int k1 = 0; k1 <= c[1].max_k; ++k1)
        for (int k2 = 0; k2 <= c[2].max_k; ++k2) best = std::max(best, ratio(c, {k0, k1, k2}, plain, cost));
    for (size_t r = 0; r < 3; ++r) EXPECT_LE(k[r], c[r].max_k);
    EXPECT_NEAR(ratio(c, k, plain, cost), best, 1e-9 * best) << "trial " << trial;
  }
}

// Concurrency 1 on mid m31 as measured: a 5.9 ms plain step. At acceptance 2.3 one draft adds 5.6 ms
// for one more token: a marginal rate above the plain one, but only 0.3 ms saved a step, 19.2 ms over
// 128 tokens (64 steps), less than a 100-token prompt's draft context (44 ms). At acceptance 4.04 three
// drafts add 14.4 ms for 2.97 tokens: 3.1 ms saved a step, 100 ms over 32 steps.
TEST(SpecAdaptive, AdmitCaseWeighsTheTimeSavedOverTheOutput) {
  const double lambda = 1.0 / 5.9;
  const auto low = m3::admit_case({1.0, 0.0, 0.0}, lambda, {5.6, 9.0, 12.0}, 128);
  EXPECT_NEAR(low.best_rate, 1.0 / 5.6, 1e-12);
  EXPECT_NEAR(low.saved_ms, 0.3 * 64, 1e-9);
  const auto high = m3::admit_case({1.0, 1.0, 0.97, 0.0}, lambda, {6.0, 10.0, 14.4, 20.0}, 128);
  EXPECT_NEAR(high.best_rate, 2.97 / 14.4, 1e-12);
  EXPECT_NEAR(high.saved_ms, (2.97 * 5.9 - 14.4) * 128 / 3.97, 1e-9);
  // Drafts that cost more than they bring save nothing.
  EXPECT_EQ(m3::admit_case({0.1, 0.1}, lambda, {8.0, 16.0}, 128).saved_ms, 0.0);
}

TEST(SpecAdaptive, AcceptanceUpdateMovesOnlyReachedPositions) {
  auto a = acc({0.5, 0.5, 0.5, 0.5});
  a.update(3, 1, 0.5);  // draft 1 kept, draft 2 rejected, draft 3 never reached, 4 not verified
  EXPECT_DOUBLE_EQ(a.rate[0], 0.75);
  EXPECT_DOUBLE_EQ(a.rate[1], 0.25);
  EXPECT_DOUBLE_EQ(a.rate[2], 0.5);
  EXPECT_DOUBLE_EQ(a.rate[3], 0.5);
  a.update(2, 2, 0.5);  // both kept
  EXPECT_DOUBLE_EQ(a.rate[0], 0.875);
  EXPECT_DOUBLE_EQ(a.rate[1], 0.625);
  EXPECT_DOUBLE_EQ(a.rate[2], 0.5);
}

}  // namespace

// Adaptive verification's cut (cut_by_survival): the longest prefix whose running product of the
// confidence head's probabilities exceeds the threshold, computed by hand here.
TEST(SpecAdaptive, ConfidenceCutKeepsThePrefixWhoseSurvivalPays) {
  const float conf[] = {0.9f, 0.8f, 0.5f, 0.9f, 0.9f};
  // Survival: 0.9, 0.72, 0.36, 0.324, 0.2916.
  EXPECT_EQ(m3::cut_by_survival(conf, 5, 0.95), 0);
  EXPECT_EQ(m3::cut_by_survival(conf, 5, 0.8), 1);
  EXPECT_EQ(m3::cut_by_survival(conf, 5, 0.5), 2);
  EXPECT_EQ(m3::cut_by_survival(conf, 5, 0.33), 3);
  EXPECT_EQ(m3::cut_by_survival(conf, 5, 0.3), 4);
  EXPECT_EQ(m3::cut_by_survival(conf, 5, 0.1), 5);
  EXPECT_EQ(m3::cut_by_survival(conf, 3, 0.1), 3);  // the bound the plan gives
  EXPECT_EQ(m3::cut_by_survival(conf, 0, 0.1), 0);
  // A low draft ends the prefix even when later ones are confident (survival never rises again).
  const float dip[] = {0.95f, 0.05f, 1.0f, 1.0f};
  EXPECT_EQ(m3::cut_by_survival(dip, 4, 0.1), 1);
  // Out-of-range values are clamped to probabilities; NaN never pays.
  const float odd[] = {1.5f, -0.2f};
  EXPECT_EQ(m3::cut_by_survival(odd, 2, 0.5), 1);
  const float nan[] = {std::nanf("")};
  EXPECT_EQ(m3::cut_by_survival(nan, 1, 0.0), 0);
}

// The head's calibration to a request's measured acceptance: the record of the head's values follows
// only the positions a verification measured (as the acceptance rates do), and the calibrated value is
// head x rate / conf, clamped, computed by hand here.
TEST(SpecAdaptive, ConfidenceCalibrationFollowsMeasuredPositions) {
  m3::SpecAcceptance a = acc({0.8, 0.6, 0.4});
  const float first[] = {0.5f, 0.2f, 0.9f};
  a.update_conf(3, 1, first, 0.5);  // drafts 1 kept, 2 rejected: positions 0 and 1 measured
  ASSERT_EQ(a.conf.size(), 3u);
  EXPECT_DOUBLE_EQ(a.conf[0], 0.5);  // the first record is the value itself
  EXPECT_NEAR(a.conf[1], 0.2, 1e-7);
  EXPECT_LT(a.conf[2], 0);  // never measured
  const float second[] = {0.7f, 0.9f, 0.9f};
  a.update_conf(1, 0, second, 0.5);  // one draft verified and rejected: position 0 only
  EXPECT_NEAR(a.conf[0], 0.6, 1e-7);
  EXPECT_NEAR(a.conf[1], 0.2, 1e-7);
  float out[3];
  const float head[] = {0.3f, 0.1f, 0.5f};
  m3::calibrate_confidence(head, 3, a, out);
  EXPECT_NEAR(out[0], 0.3 * 0.8 / 0.6, 1e-6);
  EXPECT_NEAR(out[1], 0.1 * 0.6 / 0.2, 1e-6);
  EXPECT_NEAR(out[2], 0.5, 1e-7);  // no record: the head's value
  const float high[] = {0.9f};
  m3::calibrate_confidence(high, 1, a, out);
  EXPECT_FLOAT_EQ(out[0], 1.0f);  // 0.9 x 0.8 / 0.6 = 1.2, clamped
}
