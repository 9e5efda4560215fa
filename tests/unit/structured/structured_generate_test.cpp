// Structured outputs through the engine with the demo model (models/demo): high-temperature sampled
// outputs under JSON Schema constraints all parse and validate with an independent validator
// (ajv + ajv-formats from tests/tools/ajv, installed by `make test`; python3-jsonschema when node or
// the install is missing), preempted requests included; greedy output is unchanged where the
// constraint allows the argmax; a forced tool call reads back through the minimax_m3 tool parser.
#include "engine_test_util.h"
#include "structured_test_util.h"

#include <cstdlib>
#include <fstream>

#include "chat/tool_parser.h"
#include "structured/tool_grammar.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace m3::structured;

const std::string kDemo = std::string(M3_TEST_DATA) + "/../../models/demo";

struct Demo {
  m3::Model model{kDemo};
  m3::Tokenizer tok = m3::Tokenizer::from_dir(kDemo);
  std::shared_ptr<const TokenVocab> vocab = TokenVocab::build(tok, model.config().vocab);
};
Demo& demo() {
  static Demo d;
  return d;
}

std::shared_ptr<const ConstraintSpec> spec_of(Grammar g) {
  auto s = std::make_shared<ConstraintSpec>();
  s->grammar = compile(g);
  s->vocab = demo().vocab;
  s->description = "test";
  return s;
}

}  // namespace

TEST(StructuredGenerate, SampledOutputsValidate) {
  Demo& d = demo();
  const std::vector<std::string> schemas = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0,"maximum":120},
          "ok":{"type":"boolean"}},"required":["name","age"]})",
      R"({"type":"array","items":{"type":"number","minimum":-5,"maximum":5},"minItems":1,"maxItems":4})",
      R"({"type":"object","properties":{"kind":{"enum":["cat","dog",null]},"id":{"type":"string","format":"uuid"},
          "when":{"type":"string","format":"date-time"}},"required":["kind","id","when"],"additionalProperties":false})",
      R"({"anyOf":[{"type":"string","pattern":"^[A-Z][a-z]{1,5}-\\d{2}$"},{"type":"null"},{"type":"integer","exclusiveMaximum":10}]})",
      R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"boolean"},"required":["a"]})",
      R"({"$defs":{"t":{"type":"object","properties":{"v":{"type":"integer","minimum":0,"maximum":9},
          "kids":{"type":"array","items":{"$ref":"#/$defs/t"},"maxItems":2}},"required":["v"],"additionalProperties":false}},
          "$ref":"#/$defs/t"})",
      // oneOf with exclusive branches (a discriminator, and another JSON type): ajv checks that exactly one matches.
      R"({"$defs":{"cat":{"type":"object","properties":{"kind":{"const":"cat"},"lives":{"type":"integer","minimum":1,"maximum":9}},
          "required":["kind","lives"],"additionalProperties":false},"dog":{"type":"object","properties":{"kind":{"enum":["dog","wolf"]},
          "bark":{"type":"boolean"}},"required":["kind"],"additionalProperties":false}},
          "oneOf":[{"$ref":"#/$defs/cat"},{"$ref":"#/$defs/dog"},{"type":"string","maxLength":6}]})",
      R"({"type":"object","properties":{"ip":{"type":"string","format":"ipv4"},"day":{"type":"string","format":"date"},
          "email":{"type":"string","format":"email"},"tags":{"type":"array","prefixItems":[{"const":"x"},{"type":"integer"}],
          "items":false}},"required":["ip","day","email","tags"]})",
  };
  m3::EngineConfig cfg;
  cfg.step_latency_factor = 0;  // token budgets only: the preemption asserted below must not hang on measured step times
  cfg.num_pages = 16;
  m3::Engine e(d.model, &d.tok, cfg);
  const std::vector<int32_t> prompt = d.tok.encode("Reply with JSON only.\n");
  const int kPer = 4;
  for (size_t i = 0; i < schemas.size(); ++i) {
    auto spec = spec_of(json_schema_grammar(nlohmann::ordered_json::parse(schemas[i]), JsonOptions{4}));
    for (int k = 0; k < kPer; ++k) {
      m3::SamplingParams p;
      p.temperature = 1.5f;
      p.max_tokens = 300;
      p.has_seed = true;
      p.seed = 100 * i + k;
      p.constraint = spec;
      e.add_request("s" + std::to_string(i) + "_" + std::to_string(k), prompt, p);
    }
  }
  auto done = m3test::drain(e);
  // The pool (16 pages of 32 tokens) cannot hold all 28 requests at full length: some are preempted
  // and recomputed, and their matchers (advanced over the kept output) carry on unchanged.
  EXPECT_GT(e.stats().preemptions, 0);
  nlohmann::json cases = nlohmann::json::array();
  int finished = 0, total = 0;
  for (size_t i = 0; i < schemas.size(); ++i) {
    nlohmann::json c{{"schema", nlohmann::json::parse(schemas[i])}, {"outputs", nlohmann::json::array()}};
    for (int k = 0; k < kPer; ++k) {
      const auto& f = done.at("s" + std::to_string(i) + "_" + std::to_string(k));
      ++total;
      if (f.reason != m3::FinishReason::Stop) continue;  // cut by max_tokens: a prefix, not checked
      ++finished;
      c["outputs"].push_back(f.text);
    }
    cases.push_back(c);
  }
  EXPECT_GE(finished, total * 3 / 4) << "most constrained outputs should end by themselves";
  const std::string path = m3test::test_tmp_dir() + "/structured_cases.json";
  std::ofstream(path) << cases.dump(1);
  bool ok = false;
  const std::string report = m3test::validate_cases(path, ok);
  EXPECT_TRUE(ok) << report;
  std::cout << report;
}

TEST(StructuredGenerate, GreedyUnchangedWhereAllowed) {
  Demo& d = demo();
  m3::EngineConfig cfg;
  cfg.num_pages = 32;
  m3::Engine e(d.model, &d.tok, cfg);
  const std::vector<int32_t> prompt = d.tok.encode("In the beginning");
  e.add_request("free", prompt, m3test::greedy(24));
  const auto free = m3test::drain(e).at("free");
  std::string text;
  for (int32_t t : free.tokens) text += d.vocab->bytes(t);
  // A constraint that allows the greedy text (and another branch): the same tokens come out.
  m3::SamplingParams p = m3test::greedy(24);
  p.constraint = spec_of(choice_grammar({text, text + " and more", "zzz"}));
  e.add_request("constrained", prompt, p);
  EXPECT_EQ(m3test::drain(e).at("constrained").tokens, free.tokens);
  // One that forbids the greedy start: a different, allowed output.
  m3::SamplingParams q = m3test::greedy(8);
  q.ignore_eos = false;
  q.constraint = spec_of(choice_grammar({"zzz"}));
  e.add_request("forced", prompt, q);
  const auto forced = m3test::drain(e).at("forced");
  EXPECT_EQ(forced.text, "zzz");
  EXPECT_EQ(forced.reason, m3::FinishReason::Stop);
}

TEST(StructuredGenerate, ToolCallBlockParses) {
  Demo& d = demo();
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string","enum":["Paris","Rome"]},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"]}}}])");
  auto s = std::make_shared<ConstraintSpec>();
  s->grammar = compile(tool_call_grammar(tools, "get_weather"));
  s->vocab = d.vocab;
  if (auto ns = d.tok.token_to_id(kToolNamespaceText)) s->text_specials.push_back(*ns);
  m3::EngineConfig cfg;
  cfg.num_pages = 32;
  m3::Engine e(d.model, &d.tok, cfg);
  m3::SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 120;
  p.has_seed = true;
  p.constraint = s;
  e.add_request("t", d.tok.encode("Weather?"), p);
  const auto out = m3test::drain(e).at("t");
  ASSERT_EQ(out.reason, m3::FinishReason::Stop);
  const std::string text = d.tok.decode(out.tokens, false);
  EXPECT_NE(text.find("<invoke name=\"get_weather\">"), std::string::npos) << text;
  EXPECT_NE(text.find("<city>"), std::string::npos) << text;
  // The minimax_m3 tool parser reads it as one call whose arguments satisfy the schema.
  m3::chat::ToolParser parser(m3::chat::ToolFormat::MiniMaxM3, nlohmann::json::parse(tools.dump()));
  const auto r = parser.parse(text);
  ASSERT_EQ(r.calls.size(), 1u) << text;
  EXPECT_EQ(r.calls[0].name, "get_weather");
  const auto args = nlohmann::json::parse(r.calls[0].arguments);
  EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Rome") << args.dump();
  ASSERT_TRUE(args["days"].is_number_integer()) << args.dump();
  EXPECT_GE(args["days"].get<int>(), 1);
  EXPECT_LE(args["days"].get<int>(), 7);
}

// The oneOf schemas the grammar refuses really do overlap: ajv finds a value matching two branches
// (valid under anyOf, invalid under oneOf), so generating them like anyOf would have been wrong.
TEST(StructuredGenerate, RefusedOneOfOverlapsUnderAjv) {
  struct Witness {
    const char* branches;
    const char* value;
  };
  const std::vector<Witness> w = {
      {R"([{"type":"number"},{"type":"integer"}])", "3"},
      {R"([{"type":"string"},{"type":"string","maxLength":3}])", R"("ab")"},
      {R"([{"type":"object","properties":{"a":{"type":"integer"}}},{"type":"object","properties":{"b":{"type":"integer"}}}])",
       R"({"a":1,"b":2})"},
      {R"([{"properties":{"k":{"const":"x"}},"required":["k"]},{"type":"string"}])", R"("s")"},
      {R"([{"type":"object","properties":{"t":{"const":1}}},{"type":"object","properties":{"t":{"const":2}}}])", "{}"},
  };
  nlohmann::json any = nlohmann::json::array(), one = nlohmann::json::array();
  for (const auto& x : w) {
    const auto br = nlohmann::ordered_json::parse(x.branches);
    EXPECT_THROW(json_schema_grammar(nlohmann::ordered_json{{"oneOf", br}}), StructuredError) << x.branches;
    any.push_back({{"schema", {{"anyOf", nlohmann::json::parse(x.branches)}}}, {"outputs", {x.value}}});
    one.push_back({{"schema", {{"oneOf", nlohmann::json::parse(x.branches)}}}, {"outputs", {x.value}}});
  }
  const std::string dir = m3test::test_tmp_dir();
  std::ofstream(dir + "/oneof_any.json") << any.dump(1);
  std::ofstream(dir + "/oneof_one.json") << one.dump(1);
  bool ok = false;
  const std::string r_any = m3test::validate_cases(dir + "/oneof_any.json", ok);
  EXPECT_TRUE(ok) << r_any;
  const std::string r_one = m3test::validate_cases(dir + "/oneof_one.json", ok);
  EXPECT_FALSE(ok) << r_one;
  EXPECT_NE(r_one.find(std::to_string(w.size()) + " failed"), std::string::npos) << r_one;
}
