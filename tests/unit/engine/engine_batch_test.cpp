// Engine behaviour on the golden M3.1 model (MSA blocks of 128, init block 1, top-3):
// - batch invariance: 32 greedy requests of mixed lengths (shared long prefixes, two over 3000 tokens
//   so sparse selection is active) run together with a small token budget, chunked prefill, prefix
//   caching and a pool small enough to force preemption give exactly the tokens each gives alone;
// - a request sharing a 3000-token prefix reports those tokens cached, computes only its suffix and
//   gives the same output as without prefix caching;
// - seeded sampling gives the same tokens alone and in a batch.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "base/error.h"
#include "golden_compare.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace {

using m3test::drain;
using m3test::random_tokens;

m3::Model& golden_m31() {
  static m3::Model model(m3test::golden_model_dir("m31-tiny"));
  return model;
}

struct Req {
  std::vector<int32_t> prompt;
  m3::SamplingParams p;
};

std::vector<int32_t> run_alone(const Req& r) {
  m3::EngineConfig c;
  c.num_pages = 40;
  c.enable_prefix_caching = false;
  c.max_num_batched_tokens = 4096;
  m3::Engine e(golden_m31(), nullptr, c);
  e.add_request("x", r.prompt, r.p);
  return drain(e)["x"].tokens;
}

TEST(EngineBatch, BatchInvariantUnderChunkingCachingAndPreemption) {
  std::mt19937 rng(42);
  const int V = 420;  // ordinary tokens of the golden vocabulary
  const auto prefix_a = random_tokens(rng, 700, V), prefix_b = random_tokens(rng, 1500, V);
  std::vector<Req> reqs;
  for (int i = 0; i < 32; ++i) {
    Req r;
    if (i < 2) {
      r.prompt = prefix_b;
      const auto more = random_tokens(rng, 1600 + 37 * i, V);
      r.prompt.insert(r.prompt.end(), more.begin(), more.end());  // > 3000 tokens
    } else {
      const int kind = i % 3;
      if (kind == 1) r.prompt = prefix_a;
      if (kind == 2) r.prompt = prefix_b;
      const auto more = random_tokens(rng, 20 + rng() % 400, V);
      r.prompt.insert(r.prompt.end(), more.begin(), more.end());
    }
    r.p.temperature = 0;
    r.p.max_tokens = 4 + int(rng() % 6);
    r.p.ignore_eos = true;
    reqs.push_back(r);
  }
  m3::EngineConfig c;
  c.step_latency_factor = 0;  // token budgets only: the preemption asserted below must not hang on measured step times
  c.num_pages = 48;  // 6144 tokens for ~30k prompt tokens: forces preemption
  c.max_num_batched_tokens = 384;
  c.long_prefill_token_threshold = 256;
  c.watermark = 0.0;
  m3::Engine e(golden_m31(), nullptr, c);
  for (size_t i = 0; i < reqs.size(); ++i) e.add_request(std::to_string(i), reqs[i].prompt, reqs[i].p);
  auto batched = drain(e);
  const auto st = e.stats();
  std::printf("batched: %lld steps, %lld preemptions, prefix hits %lld / %lld tokens\n", (long long)st.steps,
              (long long)st.preemptions, (long long)st.prefix_hits, (long long)st.prefix_queries);
  EXPECT_GT(st.preemptions, 0) << "the pool was meant to force preemption";
  EXPECT_GT(st.prefix_hits, 0);
  EXPECT_EQ(st.free_pages, st.total_pages);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto alone = run_alone(reqs[i]);
    ASSERT_EQ(int(alone.size()), reqs[i].p.max_tokens);
    EXPECT_EQ(batched[std::to_string(i)].tokens, alone) << "request " << i << " (" << reqs[i].prompt.size()
                                                        << " prompt tokens)";
  }
}

TEST(EngineBatch, PrefixCacheHitComputesOnlyTheSuffix) {
  std::mt19937 rng(7);
  const auto prefix = random_tokens(rng, 3000, 420);
  auto first = prefix, second = prefix;
  const auto s1 = random_tokens(rng, 50, 420), s2 = random_tokens(rng, 40, 420);
  first.insert(first.end(), s1.begin(), s1.end());
  second.insert(second.end(), s2.begin(), s2.end());
  m3::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 5;
  p.ignore_eos = true;

  m3::EngineConfig c;
  c.num_pages = 64;
  m3::Engine e(golden_m31(), nullptr, c);
  e.add_request("first", first, p);
  auto r1 = drain(e);
  EXPECT_EQ(r1["first"].cached, 0);
  const int64_t computed_before = e.stats().prompt_tokens_computed;
  e.add_request("second", second, p);
  auto r2 = drain(e);
  const int64_t computed = e.stats().prompt_tokens_computed - computed_before;
  EXPECT_EQ(r2["second"].cached, 2944);  // 23 full pages of 128 inside the shared 3000 tokens
  EXPECT_EQ(computed, int64_t(second.size()) - 2944);

  c.enable_prefix_caching = false;
  m3::Engine plain(golden_m31(), nullptr, c);
  plain.add_request("second", second, p);
  auto r3 = drain(plain);
  EXPECT_EQ(r3["second"].cached, 0);
  EXPECT_EQ(r2["second"].tokens, r3["second"].tokens);
}

TEST(EngineBatch, SeededSamplingIndependentOfBatch) {
  std::mt19937 rng(3);
  std::vector<Req> reqs;
  for (int i = 0; i < 8; ++i) {
    Req r;
    r.prompt = random_tokens(rng, 30 + 50 * i, 420);
    r.p.temperature = 1.0f;
    r.p.top_p = 0.9f;
    r.p.top_k = 50;
    r.p.has_seed = true;
    r.p.seed = 1000 + i;
    r.p.max_tokens = 12;
    r.p.ignore_eos = true;
    reqs.push_back(r);
  }
  m3::EngineConfig c;
  c.num_pages = 64;
  c.max_num_batched_tokens = 200;
  m3::Engine e(golden_m31(), nullptr, c);
  for (size_t i = 0; i < reqs.size(); ++i) e.add_request(std::to_string(i), reqs[i].prompt, reqs[i].p);
  auto batched = drain(e);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(batched[std::to_string(i)].tokens, run_alone(reqs[i])) << "request " << i;
}

TEST(EngineBatch, StopStringsStopTokensAndErrors) {
  m3::Model& model = golden_m31();
  m3::Tokenizer tok = m3::Tokenizer::from_dir(m3test::golden_model_dir("m31-tiny"));
  m3::EngineConfig c;
  c.num_pages = 16;
  c.max_model_len = 600;
  m3::Engine e(model, &tok, c);
  std::mt19937 rng(5);
  const auto prompt = random_tokens(rng, 40, 420);
  m3::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 20;
  p.ignore_eos = true;
  e.add_request("free", prompt, p);
  auto free_run = drain(e)["free"];
  ASSERT_EQ(free_run.tokens.size(), 20u);
  // Stop on the 5th generated token id.
  m3::SamplingParams ps = p;
  ps.stop_token_ids = {free_run.tokens[4]};
  e.add_request("stop_id", prompt, ps);
  auto r = drain(e)["stop_id"];
  EXPECT_EQ(r.reason, m3::FinishReason::Stop);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() +
                                           (std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[4]) -
                                            free_run.tokens.begin() + 1)));
  // A stop string taken from the middle of the free-running text ends the text before it.
  const std::string text = free_run.text;
  if (text.size() > 6) {
    const std::string stop = text.substr(text.size() / 2, 2);
    m3::SamplingParams pstr = p;
    pstr.stop = {stop};
    e.add_request("stop_str", prompt, pstr);
    auto rs = drain(e)["stop_str"];
    EXPECT_EQ(rs.reason, m3::FinishReason::Stop);
    EXPECT_EQ(rs.text, text.substr(0, text.find(stop)));
  }
  // max-model-len is enforced at admission, with a message that names it.
  try {
    e.add_request("long", random_tokens(rng, 600, 420), p);
    FAIL() << "expected an error";
  } catch (const m3::Error& err) {
    EXPECT_NE(std::string(err.what()).find("--max-model-len is 600"), std::string::npos) << err.what();
  }
  // Abort frees the pages at once.
  e.add_request("abort_me", prompt, p);
  e.step();
  EXPECT_LT(e.stats().free_pages, e.stats().total_pages);
  EXPECT_TRUE(e.abort("abort_me"));
  EXPECT_EQ(e.stats().free_pages, e.stats().total_pages);
  EXPECT_FALSE(e.has_work());
}

TEST(EngineBatch, BlockSizeMustMatchMsaBlock) {
  m3::EngineConfig c;
  c.block_size = 64;
  c.num_pages = 4;
  try {
    m3::Engine e(golden_m31(), nullptr, c);
    FAIL() << "expected an error";
  } catch (const m3::Error& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("--block-size 64"), std::string::npos) << m;
    EXPECT_NE(m.find("128"), std::string::npos) << m;
  }
}

}  // namespace
