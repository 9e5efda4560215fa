// A step's logits are the same bits on one thread and on two, on both sides of the sizes below which
// the router and the attention run on the calling thread instead of a parallel region (issue 46): a
// 300-token prefill (router of 300 x 8 x 256 multiply-adds, split) and decode steps from position 64
// to 299 (attention split above 128 cached positions with 16 heads of 128).
#include <gtest/gtest.h>
#include <omp.h>

#include "test_tmp.h"

#include <cstring>
#include <random>

#include "tools/make_model.h"
#include "model/model.h"

namespace {

TEST(DecodeThreads, SameBitsOnOneAndTwoThreadsAcrossTheSplitThresholds) {
  m3::MakeModelOptions o = m3::make_model_preset("tiny", m3::ModelLayout::M3Bf16);
  o.hidden = 256;
  o.layers = 2;
  o.heads = 16;
  o.kv_heads = 4;
  o.index_heads = 4;
  o.head_dim = 128;
  o.experts = 8;
  o.seed = 46;
  const std::string dir = m3test::test_tmp_dir() + "/decode_threads";
  m3::make_model(o, dir);
  m3::Model model(dir);
  constexpr int n = 300, first = 64;
  std::mt19937 rng(46);
  std::vector<int32_t> toks(n);
  for (auto& t : toks) t = int32_t(rng() % 256);
  const int64_t V = model.config().vocab;
  auto run = [&](int threads, bool decode) {
    omp_set_num_threads(threads);
    std::vector<float> logits(size_t(n) * V);
    m3::SeqCache cache = model.new_cache(n);
    m3::ForwardOptions fo;
    fo.all_logits = true;
    model.forward(toks.data(), decode ? first : n, cache, logits.data(), fo);
    fo.all_logits = false;
    for (int t = first; decode && t < n; ++t) model.forward(&toks[t], 1, cache, logits.data() + int64_t(t) * V, fo);
    return logits;
  };
  const int saved = omp_get_max_threads();
  for (bool decode : {false, true}) {
    const auto one = run(1, decode), two = run(2, decode);
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0) << (decode ? "decode" : "prefill");
  }
  omp_set_num_threads(saved);
}

}  // namespace
