// The shipped demo model (models/demo, trained by tools/train): m3::Model's greedy completions of fixed prompts
// equal the PyTorch model's greedy tokens (tests/data/demo/greedy.jsonl), held-out perplexity equals the PyTorch
// figure within 1% (tests/data/demo/heldout_ppl.json), and the checkpoint keeps the M3.1 layout within 30 MB.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/model.h"

namespace {

const std::string kRoot = std::string(M3_TEST_DATA) + "/../..";
const std::string kModel = kRoot + "/models/demo";
const std::string kData = std::string(M3_TEST_DATA) + "/demo";

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return nlohmann::json::parse(f);
}

int argmax(const float* v, int64_t n) { return int(std::max_element(v, v + n) - v); }

TEST(DemoModel, CheckpointLayout) {
  const auto cfg = read_json(kModel + "/config.json");
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "mxfp8");
  EXPECT_EQ(cfg["quantization_config"]["moe_quant_format"], "nvfp4-pack-quantized");
  const auto& tc = cfg["text_config"];
  const auto& sa = tc["sparse_attention_config"];
  for (int f : sa["sparse_attention_freq"]) EXPECT_EQ(f, 1);  // M3.1: MSA on every layer
  EXPECT_EQ(tc["moe_layer_freq"][0], 0);                     // leading dense MLP layer
  // Selection must be active within the demo's context (the held-out sequences are 512 tokens).
  EXPECT_LT(int(sa["sparse_block_size"]) * int(sa["sparse_topk_blocks"]), 512);
  uintmax_t total = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(kModel))
    if (e.is_regular_file()) total += e.file_size();
  EXPECT_LE(total, 30u * 1000 * 1000);
  m3::Model model(kModel);
  EXPECT_EQ(model.config().vocab, int64_t(tc["vocab_size"]));
}

TEST(DemoModel, GreedyMatchesPyTorch) {
  m3::Model model(kModel);
  const int64_t V = model.config().vocab;
  std::ifstream f(kData + "/greedy.jsonl");
  ASSERT_TRUE(f.good());
  std::string line;
  int cases = 0;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const auto row = nlohmann::json::parse(line);
    const std::vector<int32_t> prompt = row["prompt"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = row["greedy"].get<std::vector<int32_t>>();
    m3::SeqCache cache = model.new_cache(int64_t(prompt.size() + want.size()) + 1);
    std::vector<float> logits(V);
    model.forward(prompt.data(), int64_t(prompt.size()), cache, logits.data());
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      const int32_t t = argmax(logits.data(), V);
      got.push_back(t);
      if (t != want[i]) break;
      if (i + 1 < want.size()) model.forward(&t, 1, cache, logits.data());
    }
    EXPECT_EQ(got, want) << "prompt " << row["name"];
    ++cases;
  }
  EXPECT_GE(cases, 3);
}

TEST(DemoModel, HeldoutPerplexityMatchesPyTorch) {
  m3::Model model(kModel);
  const int64_t V = model.config().vocab;
  const auto ref = read_json(kData + "/heldout_ppl.json");
  std::ifstream f(kData + "/heldout_tokens.txt");
  ASSERT_TRUE(f.good());
  std::string line;
  double nll = 0;
  int64_t n = 0;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::vector<int32_t> ids;
    for (int32_t t; is >> t;) ids.push_back(t);
    if (ids.size() < 2) continue;
    const int64_t T = int64_t(ids.size());
    std::vector<float> logits(size_t(T) * size_t(V));
    m3::SeqCache cache = model.new_cache(T);
    m3::ForwardOptions fo;
    fo.all_logits = true;
    model.forward(ids.data(), T, cache, logits.data(), fo);
    for (int64_t p = 0; p + 1 < T; ++p) {
      const float* l = logits.data() + p * V;
      const double mx = *std::max_element(l, l + V);
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(double(l[v]) - mx);
      nll += mx + std::log(s) - double(l[ids[size_t(p) + 1]]);
      ++n;
    }
  }
  ASSERT_EQ(n, int64_t(ref["tokens"]));
  const double ppl = std::exp(nll / double(n));
  const double want = ref["ppl_pytorch"];
  std::printf("demo held-out perplexity: m3::Model %.4f, PyTorch %.4f (%lld tokens)\n", ppl, want, (long long)n);
  EXPECT_NEAR(ppl / want, 1.0, 0.01);
}

}  // namespace
