// Every golden model reproduces its float64 reference logits (tests/data/golden), by one prefill
// and by token-by-token decode through the cache, including the 3000-token sequences where MSA
// block selection is active. Tolerance (golden README, FP32 engine): max-abs <= 1e-4 and 100%
// top-1 agreement on positions with route_margin >= 1e-4 and block_margin >= 1e-3.
#include <gtest/gtest.h>

#include "golden_compare.h"
#include "model/model.h"

namespace {

using m3test::compare_logits;

struct GoldenCase {
  const char* model;
  int n;  // 16 or 3000
  bool decode;
};

std::string case_name(const testing::TestParamInfo<GoldenCase>& i) {
  std::string m = i.param.model;
  for (char& ch : m)
    if (ch == '-') ch = '_';
  return m + "_" + std::to_string(i.param.n) + (i.param.decode ? "_decode" : "_prefill");
}

class GoldenLogits : public testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenLogits, MatchesReference) {
  const GoldenCase gc = GetParam();
  const std::string data = std::string(M3_TEST_DATA) + "/golden/" + gc.model;
  m3::Model model(m3test::golden_model_dir(gc.model));
  const auto tokens = m3test::read_tokens(data + "/tokens_" + std::to_string(gc.n) + ".txt");
  ASSERT_EQ(int(tokens.size()), gc.n);
  const auto ref = m3test::read_f32(data + "/logits/numpy." + std::to_string(gc.n) + ".f32");
  const int64_t V = model.config().vocab;
  ASSERT_EQ(int64_t(ref.size()), gc.n * V);
  const auto margins = m3test::read_margins(data + "/logits/margins." + std::to_string(gc.n) + ".tsv");
  std::vector<float> got(ref.size());
  m3::SeqCache cache = model.new_cache(gc.n);
  m3::ForwardOptions fo;
  if (gc.decode) {
    for (int t = 0; t < gc.n; ++t) model.forward(&tokens[t], 1, cache, got.data() + int64_t(t) * V, fo);
  } else {
    fo.all_logits = true;
    model.forward(tokens.data(), gc.n, cache, got.data(), fo);
  }
  const double tol = 1e-4;
  auto r = compare_logits(got.data(), ref.data(), gc.n, V, margins, 1e-4, 1e-3, tol);
  std::printf("[%s n=%d %s] max-abs all %.3g (mean %.3g), on %lld safe positions %.3g, top-1 disagreements %lld\n%s",
              gc.model, gc.n, gc.decode ? "decode" : "prefill", r.max_abs_all, r.mean_abs_all,
              (long long)r.safe_positions, r.max_abs_safe, (long long)r.top1_disagree_safe, r.worst.c_str());
  EXPECT_LE(r.max_abs_safe, tol);
  EXPECT_EQ(r.top1_disagree_safe, 0);
  EXPECT_GT(r.safe_positions, gc.n * 9 / 10);  // the tolerance must cover nearly every position
}

INSTANTIATE_TEST_SUITE_P(All, GoldenLogits,
                         testing::Values(GoldenCase{"m3-tiny", 16, false}, GoldenCase{"m3-tiny", 16, true},
                                         GoldenCase{"m3-tiny", 3000, false}, GoldenCase{"m3-tiny", 3000, true},
                                         GoldenCase{"m3-tiny-topk2", 3000, false},
                                         GoldenCase{"m3-tiny-topk2", 3000, true}, GoldenCase{"m31-tiny", 16, false},
                                         GoldenCase{"m31-tiny", 16, true}, GoldenCase{"m31-tiny", 3000, false},
                                         GoldenCase{"m31-tiny", 3000, true}),
                         case_name);

}  // namespace
