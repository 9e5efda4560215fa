// The block-sparse MSA path (gathering only the selected blocks) equals the dense-with-mask oracle
// on random models with several block sizes, top-k and init-block settings, in both the M3 plan
// (leading dense-attention layer) and the M3.1 plan (every layer sparse). Dense attention that
// ignores MSA must differ, which shows that block selection is active in these runs.
#include <gtest/gtest.h>

#include "test_tmp.h"

#include <cmath>
#include <filesystem>
#include <random>

#include "tools/make_model.h"
#include "model/model.h"

namespace {

struct OracleCase {
  m3::ModelLayout layout;
  int block_size, topk, init_block, local_block;
};

class MsaOracle : public testing::TestWithParam<OracleCase> {};

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

TEST_P(MsaOracle, SparseEqualsDenseWithMask) {
  const OracleCase c = GetParam();
  m3::MakeModelOptions o = m3::make_model_preset("tiny", c.layout);
  o.hidden = 128;
  o.layers = 3;
  o.heads = 4;
  o.kv_heads = 2;
  o.index_heads = 2;
  o.head_dim = 32;
  o.index_dim = 32;
  o.dense_width = 128;
  o.moe_width = 64;
  o.shared_width = 64;
  o.block_size = c.block_size;
  o.topk_blocks = c.topk;
  o.init_block = c.init_block;
  o.local_block = c.local_block;
  o.seed = 7 + c.block_size + c.topk;
  const std::string dir = m3test::test_tmp_dir() + "/msa_oracle_" + std::to_string(c.block_size) + "_" +
                          std::to_string(c.topk) + "_" + std::to_string(c.init_block) + "_" +
                          std::to_string(int(c.layout));
  m3::make_model(o, dir);
  m3::Model model(dir);
  const int n = c.block_size * (c.topk + 6) + 5;  // well past the point where selection starts
  std::mt19937 rng(11);
  std::vector<int32_t> toks(n);
  for (auto& t : toks) t = int32_t(rng() % 256);
  const int64_t V = model.config().vocab;

  auto run = [&](m3::AttentionPath path, bool decode) {
    std::vector<float> logits(size_t(n) * V);
    m3::SeqCache cache = model.new_cache(n);
    m3::ForwardOptions fo;
    fo.attention = path;
    if (decode) {
      // Mixed steps: a prefill chunk, then single tokens (the decode path).
      const int first = n / 2;
      fo.all_logits = true;
      model.forward(toks.data(), first, cache, logits.data(), fo);
      fo.all_logits = false;
      for (int t = first; t < n; ++t) model.forward(&toks[t], 1, cache, logits.data() + int64_t(t) * V, fo);
    } else {
      fo.all_logits = true;
      model.forward(toks.data(), n, cache, logits.data(), fo);
    }
    return logits;
  };
  const auto sparse = run(m3::AttentionPath::Sparse, false);
  const auto oracle = run(m3::AttentionPath::DenseMaskOracle, false);
  const auto sparse_decode = run(m3::AttentionPath::Sparse, true);
  const auto dense = run(m3::AttentionPath::DenseIgnoreMsa, false);
  const double d_oracle = max_abs(sparse, oracle), d_decode = max_abs(sparse, sparse_decode),
               d_dense = max_abs(sparse, dense);
  std::printf("block %d top-%d init %d local %d: |sparse-oracle| %.3g, |prefill-decode| %.3g, |sparse-dense| %.3g\n",
              c.block_size, c.topk, c.init_block, c.local_block, d_oracle, d_decode, d_dense);
  EXPECT_LE(d_oracle, 1e-5);
  EXPECT_LE(d_decode, 1e-4);
  EXPECT_GE(d_dense, 1e-3) << "selection did not change anything: the test would not catch a dense fallback";
}

INSTANTIATE_TEST_SUITE_P(Configs, MsaOracle,
                         testing::Values(OracleCase{m3::ModelLayout::M3Bf16, 16, 2, 0, 1},
                                         OracleCase{m3::ModelLayout::M3Bf16, 32, 4, 0, 1},
                                         OracleCase{m3::ModelLayout::M3Bf16, 8, 5, 0, 2},
                                         OracleCase{m3::ModelLayout::M31, 16, 3, 1, 1},
                                         OracleCase{m3::ModelLayout::M31, 32, 2, 1, 1},
                                         OracleCase{m3::ModelLayout::M3Mxfp8, 64, 3, 0, 1}));

}  // namespace
