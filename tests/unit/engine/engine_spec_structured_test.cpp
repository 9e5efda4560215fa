// Structured outputs under DSpark speculative decoding: drafts follow a fork of the request's
// matcher (masked draft distributions), verification masks the target at every position, and the
// request's matcher advances over the kept tokens only. Checked here: greedy outputs are
// token-for-token those of the same constraints without speculation (the demo model with its
// trained draft, and a random-weight model with a random draft), in batches mixing constrained
// and free requests, under preemption; sampled outputs all validate (ajv); and sampled outputs
// follow the masked target law exactly (chi-square on the joint law of 4 constrained tokens).
#include <gtest/gtest.h>

#include <functional>
#include <regex>
#include <nlohmann/json.hpp>

#include "chi_square.h"
#include "engine_test_util.h"
#include "../structured/structured_test_util.h"
#include "model/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace {

using m3::Engine;
using m3::EngineConfig;
using m3::SamplingParams;
using namespace m3::structured;

const std::string kDemo = std::string(M3_TEST_DATA) + "/../../models/demo";

struct Loaded {
  m3::Model model;
  m3::Tokenizer tok;
  std::shared_ptr<const TokenVocab> vocab;
  explicit Loaded(const std::string& dir)
      : model(dir), tok(m3::Tokenizer::from_dir(dir)), vocab(TokenVocab::build(tok, model.config().vocab)) {}
};
Loaded& demo() {
  static Loaded d(kDemo);
  return d;
}
// A random-weight tiny model with a random one-layer DSpark draft in its dspark/ folder.
Loaded& random_model() {
  static Loaded d([] {
    const std::string dir = m3test::test_tmp_dir() + "/spec_structured_random";
    std::filesystem::remove_all(dir);
    m3::MakeModelOptions o = m3::make_model_preset("tiny", m3::ModelLayout::M31);
    o.seed = 21;
    o.dspark_layers = 1;
    m3::make_model(o, dir);
    return dir;
  }());
  return d;
}

std::shared_ptr<const ConstraintSpec> spec_of(const Loaded& m, Grammar g) {
  auto s = std::make_shared<ConstraintSpec>();
  s->grammar = compile(g);
  s->vocab = m.vocab;
  s->description = "test";
  return s;
}

const std::vector<std::string> kSchemas = {
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":120},
        "ok":{"type":"boolean"}},"required":["name","age"]})",
    R"({"type":"array","items":{"type":"number","minimum":-5,"maximum":5},"minItems":1,"maxItems":4})",
    R"({"type":"object","properties":{"kind":{"enum":["cat","dog",null]},"id":{"type":"string","format":"uuid"}},
        "required":["kind","id"],"additionalProperties":false})",
    R"({"$defs":{"t":{"type":"object","properties":{"v":{"type":"integer","minimum":0,"maximum":9},
        "kids":{"type":"array","items":{"$ref":"#/$defs/t"},"maxItems":2}},"required":["v"],"additionalProperties":false}},
        "$ref":"#/$defs/t"})",
};

// The constraints of the greedy runs: the JSON schemas, a regex, a choice, a gated regex, and none.
std::vector<std::shared_ptr<const ConstraintSpec>> constraints(const Loaded& m) {
  std::vector<std::shared_ptr<const ConstraintSpec>> c;
  for (const auto& s : kSchemas) c.push_back(spec_of(m, json_schema_grammar(nlohmann::ordered_json::parse(s), JsonOptions{2})));
  c.push_back(spec_of(m, regex_grammar("( [a-z]+){3,12}\\.")));
  c.push_back(spec_of(m, choice_grammar({"the LORD said", "the LORD God", "and it was so"})));
  // Gated (as after a reasoning end tag): free until "LORD" has been generated, then the regex; the
  // drafts' forks carry the gate's tail too.
  auto gated = std::make_shared<ConstraintSpec>(*spec_of(m, regex_grammar("( [a-z]+){1,8}[.;]")));
  gated->start_after = "LORD";
  c.push_back(gated);
  c.push_back(nullptr);
  return c;
}

EngineConfig spec_config(int k, const std::string& rejection, const std::string& draft_sample, int64_t pages) {
  EngineConfig c;
  c.step_latency_factor = 0;  // token budgets only: the preemption asserted below must not hang on measured step times
  c.num_pages = pages;
  if (k > 0)
    c.spec = m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":)" + std::to_string(k) +
                                          R"(,"rejection_sample_method":")" + rejection +
                                          R"(","draft_sample_method":")" + draft_sample + R"("})");
  return c;
}

// Every constraint on three prompts, greedy, all in one batch.
std::map<std::string, m3test::Finished> run_greedy(Loaded& m, const EngineConfig& cfg, m3::EngineStats* st = nullptr,
                                                   int max_tokens = 60) {
  Engine e(m.model, &m.tok, cfg);
  const auto cons = constraints(m);
  const std::vector<std::string> prompts = {"In the beginning God created", "Reply with JSON only.\n",
                                            "And God said, Let there be"};
  for (size_t i = 0; i < cons.size(); ++i)
    for (size_t j = 0; j < prompts.size(); ++j) {
      SamplingParams p = m3test::greedy(max_tokens);
      p.ignore_eos = false;
      if (j == 1) p.repetition_penalty = 1.2f;
      p.constraint = cons[i];
      e.add_request("c" + std::to_string(i) + "_p" + std::to_string(j), m.tok.encode(prompts[j], true), p);
    }
  auto out = m3test::drain(e);
  if (st) *st = e.stats();
  return out;
}

void expect_same(const std::map<std::string, m3test::Finished>& ref, const std::map<std::string, m3test::Finished>& got,
                 const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (const auto& [id, f] : ref) {
    EXPECT_EQ(got.at(id).tokens, f.tokens) << id << " " << what << "\nref: " << f.text << "\ngot: " << got.at(id).text;
    EXPECT_EQ(got.at(id).reason, f.reason) << id << " " << what;
  }
}

// The JSON outputs that ended by themselves, validated by ajv; returns how many were checked.
int validate_json(const std::map<std::string, m3test::Finished>& out, const std::string& name) {
  nlohmann::json cases = nlohmann::json::array();
  int checked = 0;
  for (size_t i = 0; i < kSchemas.size(); ++i) {
    nlohmann::json c{{"schema", nlohmann::json::parse(kSchemas[i])}, {"outputs", nlohmann::json::array()}};
    const std::string pre = "c" + std::to_string(i) + "_";
    for (const auto& [id, f] : out)
      if (id.rfind(pre, 0) == 0 && f.reason == m3::FinishReason::Stop) {
        c["outputs"].push_back(f.text);
        ++checked;
      }
    cases.push_back(c);
  }
  const std::string path = m3test::test_tmp_dir() + "/" + name + ".json";
  std::ofstream(path) << cases.dump(1);
  bool ok = false;
  const std::string report = m3test::validate_cases(path, ok);
  EXPECT_TRUE(ok) << report;
  return checked;
}

}  // namespace

TEST(SpecStructured, GreedyIdenticalToUnspeculatedDemo) {
  const auto ref = run_greedy(demo(), spec_config(0, "", "", 96));
  EXPECT_GT(validate_json(ref, "spec_structured_ref"), 6);
  // The gated regex took over after "LORD" in some output: the text after it matches.
  int gated = 0;
  for (const auto& [id, f] : ref)
    if (id.rfind("c6_", 0) == 0 && f.reason == m3::FinishReason::Stop) {
      const size_t at = f.text.find("LORD");
      ASSERT_NE(at, std::string::npos) << f.text;
      EXPECT_TRUE(std::regex_match(f.text.substr(at + 4), std::regex("( [a-z]+){1,8}[.;]"))) << f.text;
      ++gated;
    }
  EXPECT_GT(gated, 0);
  struct Case {
    int k;
    const char* rej;
    const char* ds;
  };
  for (const Case& cs : {Case{1, "standard", "probabilistic"}, Case{3, "block", "probabilistic"},
                         Case{7, "standard", "greedy"}}) {
    m3::EngineStats st;
    const auto got = run_greedy(demo(), spec_config(cs.k, cs.rej, cs.ds, 96), &st);
    expect_same(ref, got, "k=" + std::to_string(cs.k) + " " + cs.rej + " " + cs.ds);
    EXPECT_GT(st.spec_drafts, 0);
    EXPECT_GT(st.spec_accepted_tokens, 0) << "the trained draft keeps some constrained tokens";
  }
}

TEST(SpecStructured, GreedyIdenticalUnderPreemption) {
  // 12 pages of 32 tokens for 24 requests of up to ~90 tokens: requests are preempted and
  // recomputed; their matchers keep the state of the kept output.
  EngineConfig base = spec_config(0, "", "", 12);
  base.max_num_batched_tokens = 64;
  EngineConfig spec = spec_config(5, "block", "probabilistic", 12);
  spec.max_num_batched_tokens = 64;
  const auto ref = run_greedy(demo(), base, nullptr, 60);
  m3::EngineStats st;
  const auto got = run_greedy(demo(), spec, &st, 60);
  expect_same(ref, got, "preemption");
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.spec_accepted_tokens, 0);
}

TEST(SpecStructured, GreedyIdenticalToUnspeculatedRandomModel) {
  const auto ref = run_greedy(random_model(), spec_config(0, "", "", 128), nullptr, 40);
  for (int k : {2, 7}) {
    m3::EngineStats st;
    const auto got = run_greedy(random_model(), spec_config(k, "block", "probabilistic", 128), &st, 40);
    expect_same(ref, got, "random model k=" + std::to_string(k));
    EXPECT_GT(st.spec_drafts, 0);
  }
}

TEST(SpecStructured, SampledOutputsValidate) {
  Loaded& d = demo();
  EngineConfig cfg = spec_config(4, "block", "probabilistic", 16);  // short of pages: preemption
  Engine e(d.model, &d.tok, cfg);
  const std::vector<int32_t> prompt = d.tok.encode("Reply with JSON only.\n");
  for (size_t i = 0; i < kSchemas.size(); ++i) {
    auto spec = spec_of(d, json_schema_grammar(nlohmann::ordered_json::parse(kSchemas[i]), JsonOptions{4}));
    for (int k = 0; k < 5; ++k) {
      SamplingParams p;
      p.temperature = 1.3f;
      p.max_tokens = 300;
      p.has_seed = true;
      p.seed = 1000 + 10 * i + k;
      p.constraint = spec;
      e.add_request("c" + std::to_string(i) + "_" + std::to_string(k), prompt, p);
    }
  }
  const auto out = m3test::drain(e);
  const auto st = e.stats();
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GE(validate_json(out, "spec_structured_sampled"), 15) << "most sampled outputs end by themselves";
}

// Losslessness with a constraint: temperature 1, top-k 3 over the ALLOWED tokens (the mask comes
// before top-k), so the joint law of the first 4 tokens has at most 81 cells; it is computed
// exactly by enumerating prefixes with the plain forward pass and a matcher advanced over each
// prefix. The regex forbids what the model prefers (the demo model writes capitalised words and
// punctuation), so the mask changes the law at every step. The speculative engine's samples must
// fit it (Pearson chi-square, alpha = 1e-3) and never leave the constraint.
void check_lossless_constrained(const char* rejection) {
  Loaded& d = demo();
  const int64_t V = d.model.config().vocab;
  const std::vector<int32_t> prompt = d.tok.encode("And God said, Let", true);
  const auto cons = spec_of(d, regex_grammar("( [a-z]+)+"));
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 3;
  sp.max_tokens = 4;
  sp.ignore_eos = true;
  sp.constraint = cons;
  std::map<std::vector<int32_t>, double> exact;
  std::vector<float> logits(static_cast<size_t>(V)), probs(static_cast<size_t>(V));
  std::function<void(std::vector<int32_t>, double)> walk = [&](std::vector<int32_t> out, double pr) {
    if (out.size() == 4) {
      exact[out] = pr;
      return;
    }
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), out.begin(), out.end());
    m3::SeqCache cache = d.model.new_cache(int64_t(all.size()));
    d.model.forward(all.data(), int64_t(all.size()), cache, logits.data());
    Matcher m(cons);
    for (int32_t t : out) ASSERT_TRUE(m.advance(t));
    m3::Sampler smp(sp);
    smp.distribution(logits.data(), V, prompt, out, probs.data(), m.mask());
    const std::vector<float> dist = probs;
    for (int64_t t = 0; t < V; ++t)
      if (dist[size_t(t)] > 0) {
        std::vector<int32_t> next = out;
        next.push_back(int32_t(t));
        walk(next, pr * double(dist[size_t(t)]));
      }
  };
  walk({}, 1.0);
  ASSERT_LE(exact.size(), 81u);
  // The constraint matters: the unconstrained argmax after the prompt is not allowed.
  {
    m3::SeqCache cache = d.model.new_cache(int64_t(prompt.size()));
    d.model.forward(prompt.data(), int64_t(prompt.size()), cache, logits.data());
    Matcher m(cons);
    EXPECT_FALSE(m.accepts(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin())));
  }
  EngineConfig c = spec_config(3, rejection, "probabilistic", 64);
  c.kv_cache_dtype = "fp32";
  c.indexer_kv_dtype = "fp32";
  c.max_num_batched_tokens = 4096;
  Engine e(d.model, &d.tok, c);
  auto [p, counts] = m3test::sample_cells(e, prompt, sp, exact, 1500, 29u);
  const auto st = e.stats();
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_EQ(counts.back(), 0) << "samples outside the exact (constrained) support";
  counts.pop_back();
  const m3test::ChiSquare r = m3test::chi_square(counts, p, rejection);
  EXPECT_TRUE(r.pass()) << rejection << ": chi2 " << r.stat << " > critical " << r.critical;
  std::printf("constrained %s: %zu cells, acceptance length %.3f over %lld drafts\n", rejection, p.size(),
              1.0 + double(st.spec_accepted_tokens) / double(st.spec_drafts), (long long)st.spec_drafts);
}

TEST(SpecStructured, SampledOutputFollowsMaskedTargetBlock) { check_lossless_constrained("block"); }
TEST(SpecStructured, SampledOutputFollowsMaskedTargetStandard) { check_lossless_constrained("standard"); }
