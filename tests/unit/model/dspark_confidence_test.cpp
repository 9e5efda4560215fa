// The DSpark draft's confidence head (DSparkDraft::confidence) on the demo model's trained draft:
// its value equals a hand computation in double, sigmoid(b + w . [x_j ; markov_w1[prev]]), from the
// checkpoint's tensors and the slot's final-normed hidden state (the input DeepSpec's
// AcceptRatePredictor and tools/train/dspark.py train on); and the trained head carries the
// information it was trained for: along a greedy continuation of the target, drafts the target keeps
// get a higher confidence than drafts it rejects (the demo's small head orders about 60% of (kept,
// rejected) pairs right, 0.5 being no information).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "model/dspark.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/tensor_loader.h"

namespace {

const std::string kModel = std::string(M3_TEST_DATA) + "/../../models/demo";

m3::Model& demo() {
  static m3::Model m(kModel);
  return m;
}

// The golden passage's tokens (tools/train/dspark_golden.py): real text the draft was trained on.
std::vector<int32_t> passage() {
  std::ifstream jf(std::string(M3_TEST_DATA) + "/demo/dspark_golden.json");
  return nlohmann::json::parse(jf)["tokens"].get<std::vector<int32_t>>();
}

// Target taps (and all logits) of `toks`, for the draft's context.
void target_pass(const std::vector<int32_t>& toks, const m3::DSparkDraft& d, std::vector<float>& taps,
                 std::vector<float>& logits) {
  m3::Model& m = demo();
  const int64_t T = int64_t(toks.size()), V = m.config().vocab;
  taps.assign(size_t(T * d.taps_width()), 0.0f);
  logits.assign(size_t(T * V), 0.0f);
  m.set_tap_layers(d.config().target_layers);
  m3::SeqCache cache = m.new_cache(T);
  m3::BatchItem it{&cache, toks.data(), T, 0, 0};
  m.forward_batch(&it, 1, logits.data(), m3::AttentionPath::Sparse, taps.data());
  m.set_tap_layers({});
}

TEST(DSparkConfidence, EqualsHandComputationFromTheCheckpoint) {
  m3::DSparkDraft d(kModel + "/dspark", demo());
  ASSERT_TRUE(d.has_confidence());
  const int64_t H = d.config().hidden, R = d.config().markov_rank;
  // The head's weights and markov_w1, read from the safetensors here.
  m3::TensorStore st(kModel + "/dspark");
  m3::TensorLoader ld(st);
  const std::string P = "language_model.model.dspark.";
  const std::vector<float> w = ld.matrix_f32(P + "confidence_head.proj.weight", 1, H + R);
  const float b = ld.vec(P + "confidence_head.proj.bias", 1, false)[0];
  const std::vector<float> w1 = ld.matrix_f32(P + "markov_head.markov_w1.weight", d.config().vocab, R);

  const std::vector<int32_t> toks = passage();
  std::vector<float> taps, logits;
  target_pass(toks, d, taps, logits);
  const int S = d.config().block_size;
  double worst = 0;
  int n = 0;
  for (int64_t p : {5, 60, 131}) {
    m3::SeqCache dkv(d.config().kv_layout(), p + 1);
    m3::DraftContextRows rows{&dkv, taps.data(), 0, p};
    d.write_context(&rows, 1);
    dkv.n_tokens = p;
    std::vector<float> z(size_t(S) * size_t(d.config().vocab));
    m3::DraftQuery q{&dkv, toks[size_t(p)], p};
    d.propose(&q, 1, S, z.data());
    for (int j = 0; j < S; ++j) {
      const int32_t prev = toks[size_t(p + j)];  // the anchor, then the passage's tokens as drafts
      const float* x = d.slot_hidden(j);
      double s = b, ss = 0;
      for (int64_t i = 0; i < H; ++i) {
        s += double(w[size_t(i)]) * double(x[i]);
        ss += double(x[i]) * double(x[i]);
      }
      for (int64_t i = 0; i < R; ++i) s += double(w[size_t(H + i)]) * double(w1[size_t(prev * R + i)]);
      const double want = 1.0 / (1.0 + std::exp(-s));
      const double got = d.confidence(j, prev);
      EXPECT_NEAR(got, want, 1e-5) << "position " << p << " slot " << j;
      worst = std::max(worst, std::fabs(got - want));
      EXPECT_GT(ss, 0.0);
      ++n;
    }
  }
  std::printf("confidence vs hand computation: %d slots, max-abs %.3g\n", n, worst);
  // Rows outside the last pass are refused.
  EXPECT_THROW(d.confidence(S, toks[0]), m3::Error);
}

TEST(DSparkConfidence, TrainedHeadSeparatesKeptFromRejectedDrafts) {
  m3::Model& m = demo();
  m3::DSparkDraft d(kModel + "/dspark", m);
  const int64_t V = m.config().vocab;
  const int S = d.config().block_size;
  // A greedy continuation of the passage's start by the target: its tokens are what greedy
  // verification keeps.
  const std::vector<int32_t> text = passage();
  std::vector<int32_t> seq(text.begin(), text.begin() + 40);
  {
    std::vector<float> lg(static_cast<size_t>(V));
    m3::SeqCache cache = m.new_cache(200);
    m.forward(seq.data(), int64_t(seq.size()), cache, lg.data());
    for (int i = 0; i < 120; ++i) {
      const int32_t t = int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
      seq.push_back(t);
      m.forward(&t, 1, cache, lg.data());
    }
  }
  std::vector<float> taps, logits;
  target_pass(seq, d, taps, logits);
  double sum_hit = 0, sum_miss = 0;
  int hits = 0, misses = 0;
  std::vector<double> c_hit, c_miss;
  for (int64_t p = 40; p + S + 1 < int64_t(seq.size()); ++p) {
    m3::SeqCache dkv(d.config().kv_layout(), p + 1);
    m3::DraftContextRows rows{&dkv, taps.data(), 0, p};
    d.write_context(&rows, 1);
    dkv.n_tokens = p;
    std::vector<float> z(size_t(S) * size_t(V));
    m3::DraftQuery q{&dkv, seq[size_t(p)], p};
    d.propose(&q, 1, S, z.data());
    for (int j = 0; j < S; ++j) {
      // Slot j after the target's own tokens: does the draft's greedy choice match the target's?
      const int32_t prev = seq[size_t(p + j)];
      float* zj = &z[size_t(j) * size_t(V)];
      d.add_markov(prev, zj);
      const bool hit = int32_t(std::max_element(zj, zj + V) - zj) == seq[size_t(p + j + 1)];
      const double c = d.confidence(j, prev);
      (hit ? sum_hit : sum_miss) += c;
      ++(hit ? hits : misses);
      (hit ? c_hit : c_miss).push_back(c);
    }
  }
  ASSERT_GT(hits, 20);
  ASSERT_GT(misses, 20);
  const double mh = sum_hit / hits, mm = sum_miss / misses;
  // Ranking quality: the fraction of (kept, rejected) pairs the head orders right (0.5 = no information).
  double right = 0;
  for (double a : c_hit)
    for (double b : c_miss) right += a > b ? 1.0 : a == b ? 0.5 : 0.0;
  const double auc = right / (double(c_hit.size()) * double(c_miss.size()));
  std::printf("trained confidence head: mean %.3f on %d kept drafts, %.3f on %d rejected; pairs ordered right %.3f\n",
              mh, hits, mm, misses, auc);
  EXPECT_GT(mh, mm);
  EXPECT_GT(auc, 0.55);
}

}  // namespace
