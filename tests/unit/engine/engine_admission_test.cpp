// Admission when the KV pool is tight, on the golden M3 model (MSA blocks of 128), reproducing what
// lost requests before: a 27-page pool (3456 tokens) with 24 greedy requests, twelve of 3000-3400
// prompt tokens (six sharing a 3000-token prefix) and twelve of 1-300, must give every request exactly
// the tokens it gives alone (a 3340-token prompt needs all 27 pages: the watermark kept it out forever
// and the engine then ended the waiting requests empty with "length"). Also the start-time check of
// --max-model-len against the pool, and the errors for requests that can never fit.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "base/error.h"
#include "golden_compare.h"
#include "model/model.h"

namespace {

using m3test::drain;
using m3test::greedy;
using m3test::random_tokens;

m3::Model& golden_m3() {
  static m3::Model model(m3test::golden_model_dir("m3-tiny"));
  return model;
}

struct Req {
  std::vector<int32_t> prompt;
  m3::SamplingParams p;
};

// The pool of the report: --kv-cache-memory 0.004 = 27 pages, budget 256, 16 sequences.
m3::EngineConfig tight() {
  m3::EngineConfig c;
  c.num_pages = 27;
  c.max_num_batched_tokens = 256;
  c.max_num_seqs = 16;
  return c;
}

std::vector<int32_t> run_alone(const Req& r) {
  m3::EngineConfig c;
  c.num_pages = 40;
  c.enable_prefix_caching = false;
  c.max_num_batched_tokens = 4096;
  m3::Engine e(golden_m3(), nullptr, c);
  e.add_request("x", r.prompt, r.p);
  return drain(e)["x"].tokens;
}

TEST(EngineAdmission, TwentyFourRequestsInATightPoolGiveWhatTheyGiveAlone) {
  std::mt19937 rng(7);
  const int V = 420;
  const auto prefix = random_tokens(rng, 3000, V);
  std::vector<Req> reqs;
  for (int i = 0; i < 12; ++i) {
    const int n = i == 4 ? 3340 : 3000 + int(rng() % 401);
    Req lr;
    lr.prompt = i % 2 == 0 ? prefix : random_tokens(rng, 3000, V);
    const auto more = random_tokens(rng, size_t(n - 3000), V);
    lr.prompt.insert(lr.prompt.end(), more.begin(), more.end());
    lr.p = greedy(12);
    Req sr;
    sr.prompt = random_tokens(rng, 1 + rng() % 300, V);
    sr.p = greedy(12);
    reqs.push_back(lr);
    reqs.push_back(sr);
  }
  ASSERT_EQ(reqs[8].prompt.size(), 3340u);  // ninth, as in the report: every request after it came back empty
  m3::Engine e(golden_m3(), nullptr, tight());
  ASSERT_EQ(e.max_model_len(), 27 * 128);
  for (size_t i = 0; i < reqs.size(); ++i) e.add_request(std::to_string(i), reqs[i].prompt, reqs[i].p);
  auto got = drain(e);
  const auto st = e.stats();
  std::printf("24 requests: %lld steps, %lld preemptions, prefix hits %lld / %lld tokens\n", (long long)st.steps,
              (long long)st.preemptions, (long long)st.prefix_hits, (long long)st.prefix_queries);
  EXPECT_EQ(st.free_pages, st.total_pages);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& g = got[std::to_string(i)];
    EXPECT_EQ(g.reason, m3::FinishReason::Length) << "request " << i;
    ASSERT_EQ(g.tokens.size(), 12u) << "request " << i << " (" << reqs[i].prompt.size() << " prompt tokens)";
    EXPECT_EQ(g.tokens, run_alone(reqs[i])) << "request " << i << " (" << reqs[i].prompt.size() << " prompt tokens)";
  }
}

TEST(EngineAdmission, APromptThatNeedsTheWholePoolRunsAfterTheOthers) {
  std::mt19937 rng(11);
  Req big{random_tokens(rng, 3340, 420), greedy(12)}, small{random_tokens(rng, 181, 420), greedy(12)};
  m3::Engine e(golden_m3(), nullptr, tight());
  e.add_request("big", big.prompt, big.p);
  e.add_request("small", small.prompt, small.p);
  auto got = drain(e);
  EXPECT_EQ(got["big"].tokens, run_alone(big));
  EXPECT_EQ(got["small"].tokens, run_alone(small));
  // And behind running work: the small one first, then the one that needs every page.
  m3::Engine e2(golden_m3(), nullptr, tight());
  e2.add_request("small", small.prompt, small.p);
  std::vector<int32_t> small_tokens;
  for (auto& o : e2.step()) small_tokens = o.new_tokens;  // the small one's prefill and first token
  e2.add_request("big", big.prompt, big.p);
  auto got2 = drain(e2);
  EXPECT_EQ(got2["big"].tokens, got["big"].tokens);
  small_tokens.insert(small_tokens.end(), got2["small"].tokens.begin(), got2["small"].tokens.end());
  EXPECT_EQ(small_tokens, got["small"].tokens);
}

TEST(EngineAdmission, RequestsThatCanNeverFitAreRefusedWithTheNumbers) {
  std::mt19937 rng(3);
  m3::Engine e(golden_m3(), nullptr, tight());
  // Prompt alone over the pool.
  try {
    e.add_request("a", random_tokens(rng, 3456, 420), greedy(1));
    FAIL() << "expected an error";
  } catch (const m3::Error& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("the prompt has 3456 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("--max-model-len is 3456"), std::string::npos) << m;
    EXPECT_NE(m.find("--kv-cache-memory"), std::string::npos) << m;
  }
  // Prompt + max_tokens over the pool.
  try {
    e.add_request("b", random_tokens(rng, 3400, 420), greedy(100));
    FAIL() << "expected an error";
  } catch (const m3::Error& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("max_tokens is 100"), std::string::npos) << m;
    EXPECT_NE(m.find("at most 56 tokens"), std::string::npos) << m;
  }
  EXPECT_FALSE(e.has_work());
  // Exactly the pool: runs.
  e.add_request("c", random_tokens(rng, 3400, 420), greedy(56));
  EXPECT_EQ(drain(e)["c"].tokens.size(), 56u);
}

TEST(EngineAdmission, MaxModelLenIsCheckedAgainstThePoolAtStart) {
  m3::EngineConfig c = tight();
  c.max_model_len = 3457;
  try {
    m3::Engine e(golden_m3(), nullptr, c);
    FAIL() << "expected an error";
  } catch (const m3::Error& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("--max-model-len 3457 needs 28 KV pages"), std::string::npos) << m;
    EXPECT_NE(m.find("holds 27 pages (3456 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("Lower --max-model-len to at most 3456"), std::string::npos) << m;
    EXPECT_NE(m.find("raise --kv-cache-memory"), std::string::npos) << m;
  }
  c.max_model_len = 3456;
  EXPECT_EQ(m3::Engine(golden_m3(), nullptr, c).max_model_len(), 3456);
  // Not given: the most the pool holds, and the start-up line says so.
  c.max_model_len = 0;
  m3::Engine e(golden_m3(), nullptr, c);
  EXPECT_EQ(e.max_model_len(), 3456);
  EXPECT_NE(e.describe().find("max-model-len 3456 (the most the KV cache holds"), std::string::npos) << e.describe();
}

}  // namespace
