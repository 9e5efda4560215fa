// Every golden model reproduces its float64 reference logits (tests/data/golden), by one prefill
// and by token-by-token decode through the cache, including the 3000-token sequences where MSA
// block selection is active. Tolerance (golden README, FP32 engine): max-abs <= 1e-4 and 100%
// top-1 agreement on positions with route_margin >= 1e-4 and block_margin >= 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

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

// The opt-in int8-activation path (`--nvfp4-activations int8`) on the M3.1 golden model, whose
// routed experts are NVFP4. Measured on these 16 positions: max-abs 0.022-0.031 up to the first
// routing near-tie (position 5, route_margin 8.8e-4, where the int8 rounding picks the other expert
// and the logits move by 1.35; later positions see it through attention), median per-position
// max-abs 0.055, top-1 agreement 16/16. (On the 3000-token file: median 0.030, p90 0.041, top-1
// 97.6%, 99.1% where the reference top-1 gap exceeds 0.1.) The golden README expects errors of order
// 1e-2 and near-tie flips from dynamic activation quantisation. The bounds below keep about 1.6x
// margin over those figures. Prefill and token-by-token decode stay bit-identical (each token's
// activations are quantised on their own).
namespace {

// The logits of tokens[0, n) from one prefill (pre) and token by token through a second cache (dec),
// [n, vocab] each.
void prefill_and_decode(m3::Model& model, const std::vector<int32_t>& tokens, int n, std::vector<float>& pre,
                        std::vector<float>& dec) {
  const int64_t V = model.config().vocab;
  pre.assign(size_t(n * V), 0.f);
  dec.assign(size_t(n * V), 0.f);
  m3::SeqCache c1 = model.new_cache(n), c2 = model.new_cache(n);
  m3::ForwardOptions fo;
  fo.all_logits = true;
  model.forward(tokens.data(), n, c1, pre.data(), fo);
  fo.all_logits = false;
  for (int t = 0; t < n; ++t) model.forward(&tokens[t], 1, c2, dec.data() + int64_t(t) * V, fo);
}

TEST(GoldenLogitsInt8Act, M31CloseToReferenceAndBatchInvariant) {
  const std::string data = std::string(M3_TEST_DATA) + "/golden/m31-tiny";
  m3::ModelOptions mo;
  mo.nvfp4_int8_activations = true;
  m3::Model model(m3test::golden_model_dir("m31-tiny"), mo);
  EXPECT_GT(model.int8_activation_matrices(), 0);
  const int n = 16;
  const auto tokens = m3test::read_tokens(data + "/tokens_16.txt");
  const auto ref = m3test::read_f32(data + "/logits/numpy.16.f32");
  const auto margins = m3test::read_margins(data + "/logits/margins.16.tsv");
  const int64_t V = model.config().vocab;
  std::vector<float> pre, dec;
  prefill_and_decode(model, tokens, n, pre, dec);
  for (size_t i = 0; i < pre.size(); ++i) ASSERT_EQ(pre[i], dec[i]) << "prefill and decode differ at " << i;
  int first_tie = n;
  for (int t = 0; t < n; ++t)
    if (margins.route[size_t(t)] < 1e-3) {
      first_tie = t;
      break;
    }
  ASSERT_GE(first_tie, 3);  // the clean prefix the first bound is about
  std::vector<double> err(static_cast<size_t>(n));
  int top1 = 0;
  for (int t = 0; t < n; ++t) {
    const float* g = pre.data() + int64_t(t) * V;
    const float* r = ref.data() + int64_t(t) * V;
    for (int64_t v = 0; v < V; ++v) err[size_t(t)] = std::max(err[size_t(t)], double(std::fabs(g[v] - r[v])));
    top1 += std::max_element(g, g + V) - g == std::max_element(r, r + V) - r;
    if (t < first_tie) {
      EXPECT_LE(err[size_t(t)], 0.05) << "position " << t;
    }
  }
  std::vector<double> sorted = err;
  std::sort(sorted.begin(), sorted.end());
  std::printf("[m31-tiny int8 activations] max-abs before the first routing near-tie %.3g, median %.3g, max %.3g, "
              "top-1 %d/%d\n", *std::max_element(err.begin(), err.begin() + first_tie), sorted[size_t(n / 2)],
              sorted.back(), top1, n);
  EXPECT_LE(sorted[size_t(n / 2)], 0.09);
  EXPECT_EQ(top1, n);
  EXPECT_GT(sorted.back(), 1e-3);  // really the inexact path, not the exact one
}


// The opt-in BF16 activations (`--mxfp8-activations bf16`, `--nvfp4-activations bf16`) on the M3.1
// golden model, whose attention, dense MLP and shared expert are MXFP8 and routed experts NVFP4.
// Measured on these 16 positions, per-position max-abs (prefill and token-by-token decode alike; the
// two differ by at most 4e-4 / 1e-6 / 1e-6, different sums): MXFP8 only 0.0091-0.0157 (median
// 0.0107), NVFP4 only 0.0059-0.0098 (0.0072), both 0.0113-0.0194 (0.0143); top-1 16/16 each. On the
// 3000-token file (median / p90 / top-1, and top-1 where the reference top-1 gap exceeds 0.1): MXFP8
// 0.011 / 0.019 / 98.3% (99.4%), NVFP4 0.0084 / 0.011 / 99.4% (99.7%), both 0.014 / 0.022 / 98.1%
// (99.3%), against 0.030 / 0.041 / 97.6% (99.2%) for `--nvfp4-activations int8`. Where the CPU has
// no AVX512-BF16 the same rounded activations go through the fp32 kernels (same bounds). The bounds
// keep about 2x margin.
struct Bf16ActCase {
  bool mxfp8, nvfp4;
  double max_abs, median;
};
class GoldenLogitsBf16Act : public testing::TestWithParam<Bf16ActCase> {};

TEST_P(GoldenLogitsBf16Act, M31CloseToReferenceInPrefillAndDecode) {
  const Bf16ActCase bc = GetParam();
  const std::string data = std::string(M3_TEST_DATA) + "/golden/m31-tiny";
  m3::ModelOptions mo;
  mo.mxfp8_bf16_activations = bc.mxfp8;
  mo.nvfp4_bf16_activations = bc.nvfp4;
  m3::Model model(m3test::golden_model_dir("m31-tiny"), mo);
  EXPECT_EQ(model.bf16_activation_matrices(m3::LinearKind::MXFP8) > 0, bc.mxfp8);
  EXPECT_EQ(model.bf16_activation_matrices(m3::LinearKind::NVFP4) > 0, bc.nvfp4);
  const int n = 16;
  const auto tokens = m3test::read_tokens(data + "/tokens_16.txt");
  const auto ref = m3test::read_f32(data + "/logits/numpy.16.f32");
  const int64_t V = model.config().vocab;
  std::vector<float> pre, dec;
  prefill_and_decode(model, tokens, n, pre, dec);
  const std::string what = std::string(bc.mxfp8 ? "MXFP8" : "") + (bc.mxfp8 && bc.nvfp4 ? " + " : "") + (bc.nvfp4 ? "NVFP4" : "");
  for (const auto* run : {&pre, &dec}) {
    const std::string name = what + (run == &pre ? ", prefill" : ", decode");
    std::vector<double> err(static_cast<size_t>(n));
    int top1 = 0;
    for (int t = 0; t < n; ++t) {
      const float* g = run->data() + int64_t(t) * V;
      const float* r = ref.data() + int64_t(t) * V;
      for (int64_t v = 0; v < V; ++v) err[size_t(t)] = std::max(err[size_t(t)], double(std::fabs(g[v] - r[v])));
      top1 += std::max_element(g, g + V) - g == std::max_element(r, r + V) - r;
      EXPECT_LE(err[size_t(t)], bc.max_abs) << name << " position " << t;
    }
    std::vector<double> sorted = err;
    std::sort(sorted.begin(), sorted.end());
    std::printf("[m31-tiny bf16 activations, %s] max-abs median %.3g, max %.3g, top-1 %d/%d\n", name.c_str(),
                sorted[size_t(n / 2)], sorted.back(), top1, n);
    EXPECT_LE(sorted[size_t(n / 2)], bc.median) << name;
    EXPECT_EQ(top1, n) << name;
    EXPECT_GT(sorted.back(), 1e-3) << name << ": really the inexact path, not the exact one";
  }
  double d = 0;
  for (size_t i = 0; i < pre.size(); ++i) d = std::max(d, double(std::fabs(pre[i] - dec[i])));
  EXPECT_LE(d, 0.002) << what << ": prefill and decode";
}

INSTANTIATE_TEST_SUITE_P(M31, GoldenLogitsBf16Act,
                         testing::Values(Bf16ActCase{true, false, 0.035, 0.022}, Bf16ActCase{false, true, 0.02, 0.015},
                                         Bf16ActCase{true, true, 0.04, 0.03}),
                         [](const testing::TestParamInfo<Bf16ActCase>& i) {
                           return std::string(i.param.mxfp8 ? "Mxfp8" : "") + (i.param.nvfp4 ? "Nvfp4" : "");
                         });

}  // namespace
