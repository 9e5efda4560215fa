// Reasoning and tool-call parser tests (docs/serving.md 4-6): its examples exactly, streaming with the
// output split at every character boundary (must equal the non-streaming result), truncated and
// malformed calls, schema typing, a render -> parse round trip through the M3 template, and M2.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "chat/reasoning_parser.h"
#include "chat/tool_parser.h"
#include "base/error.h"

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace m3::chat;

const std::string NS = "]<]minimax[>[";

json spec_tools() {
  return json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "location":{"type":"string"},"days":{"type":"integer"}}}}},
    {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
      "queries":{"type":"array","items":{"type":"string"}},
      "filters":{"type":"object","properties":{"lang":{"type":"string"}}}}}}}])");
}

const std::string kSpecOutput =
    "I'll check both.\n" + NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">" + NS + "<location>Paris" + NS +
    "</location>" + NS + "<days>3" + NS + "</days>" + NS + "</invoke>\n" + NS + "<invoke name=\"search\">" + NS +
    "<queries>" + NS + "<item>louvre hours" + NS + "</item>" + NS + "<item>metro map" + NS + "</item>" + NS +
    "</queries>" + NS + "<filters>" + NS + "<lang>fr" + NS + "</lang>" + NS + "</filters>" + NS + "</invoke>\n" + NS +
    "</tool_call>[e~[";

ToolParserOptions counter_ids() {
  ToolParserOptions o;
  auto n = std::make_shared<int>(0);
  o.make_id = [n] { return "call-" + std::to_string((*n)++); };
  return o;
}

// Streams `pieces` through a fresh parser and reassembles content and calls from the deltas.
struct Streamed {
  std::string content;
  std::vector<ToolCall> calls;
  std::vector<ToolStreamDelta> deltas;
};
Streamed stream_tools(ToolFormat fmt, const json& tools, const std::vector<std::string>& pieces,
                      ToolParserOptions opt = counter_ids()) {
  ToolParser p(fmt, tools, opt);
  Streamed s;
  auto take = [&](ToolStreamDelta d) {
    s.content += d.content;
    for (auto& tc : d.tool_calls) {
      if (tc.id) {
        EXPECT_EQ(size_t(tc.index), s.calls.size());
        EXPECT_TRUE(tc.name.has_value());
        EXPECT_EQ(tc.arguments, "");
        s.calls.push_back(ToolCall{*tc.id, *tc.name, ""});
      } else {
        EXPECT_LT(size_t(tc.index), s.calls.size());
        s.calls.at(size_t(tc.index)).arguments += tc.arguments;
      }
    }
    s.deltas.push_back(std::move(d));
  };
  for (auto& piece : pieces) take(p.feed(piece));
  take(p.finish());
  return s;
}

void expect_same(const ToolParseResult& a, const Streamed& b) {
  EXPECT_EQ(a.content, b.content);
  ASSERT_EQ(a.calls.size(), b.calls.size());
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id);
    EXPECT_EQ(a.calls[i].name, b.calls[i].name);
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments);
  }
}

std::vector<std::string> chars(const std::string& s) {
  std::vector<std::string> v;
  for (char c : s) v.emplace_back(1, c);
  return v;
}

TEST(ToolParserM3, SpecExampleNonStreaming) {
  ToolParser p(ToolFormat::MiniMaxM3, spec_tools(), counter_ids());
  ToolParseResult r = p.parse(kSpecOutput);
  EXPECT_EQ(r.content, "I'll check both.\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"location": "Paris", "days": 3})");
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(r.calls[1].arguments, R"({"queries": ["louvre hours", "metro map"], "filters": {"lang": "fr"}})");
  EXPECT_EQ(r.calls[0].id, "call-0");
  EXPECT_FALSE(r.incomplete);
}

TEST(ToolParserM3, StreamingEverySplitEqualsNonStreaming) {
  ToolParser ref(ToolFormat::MiniMaxM3, spec_tools(), counter_ids());
  ToolParseResult want = ref.parse(kSpecOutput);
  for (size_t k = 0; k <= kSpecOutput.size(); ++k) {
    SCOPED_TRACE(k);
    Streamed s = stream_tools(ToolFormat::MiniMaxM3, spec_tools(), {kSpecOutput.substr(0, k), kSpecOutput.substr(k)});
    expect_same(want, s);
    for (auto& d : s.deltas) {
      EXPECT_EQ(d.content.find("]<]"), std::string::npos);
      EXPECT_EQ(d.content.find("<tool_call>"), std::string::npos);
    }
  }
  for (size_t a = 0; a < kSpecOutput.size(); a += 7)
    for (size_t b = a; b <= kSpecOutput.size(); b += 11)
      expect_same(want, stream_tools(ToolFormat::MiniMaxM3, spec_tools(),
                                     {kSpecOutput.substr(0, a), kSpecOutput.substr(a, b - a), kSpecOutput.substr(b)}));
  expect_same(want, stream_tools(ToolFormat::MiniMaxM3, spec_tools(), chars(kSpecOutput)));
}

TEST(ToolParserM3, ArgumentsStreamPerParameter) {
  ToolParser p(ToolFormat::MiniMaxM3, spec_tools(), counter_ids());
  std::string head = "I'll check both.\n" + NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">";
  ToolStreamDelta d1 = p.feed(head);
  EXPECT_EQ(d1.content, "I'll check both.\n");
  ASSERT_EQ(d1.tool_calls.size(), 1u);
  EXPECT_EQ(*d1.tool_calls[0].name, "get_weather");
  ToolStreamDelta d2 = p.feed(NS + "<location>Par");
  EXPECT_TRUE(d2.empty());
  ToolStreamDelta d3 = p.feed("is" + NS + "</location>");
  ASSERT_EQ(d3.tool_calls.size(), 1u);
  EXPECT_EQ(d3.tool_calls[0].arguments, R"({"location": "Paris")");
  ToolStreamDelta d4 = p.feed(NS + "</invoke>\n" + NS + "</tool_call>");
  ASSERT_EQ(d4.tool_calls.size(), 1u);
  EXPECT_EQ(d4.tool_calls[0].arguments, "}");
  ToolStreamDelta d5 = p.feed(" Done.");
  EXPECT_EQ(d5.content, " Done.");
}

TEST(ToolParserM3, ContentAroundBlockAndStrayMarkers) {
  ToolParser p(ToolFormat::MiniMaxM3, nullptr, counter_ids());
  std::string text = "A" + NS + "B <tool " + NS + "<tool_call>" + NS + "<invoke name=\"f\">" + NS + "</invoke>" + NS +
                     "</tool_call> after[e~[";
  ToolParseResult r = p.parse(text);
  EXPECT_EQ(r.content, "AB <tool  after");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  Streamed s = stream_tools(ToolFormat::MiniMaxM3, nullptr, chars(text));
  expect_same(r, s);
  // Held-back text that turns out not to be markup is released at once, not at end of stream.
  ToolParser q(ToolFormat::MiniMaxM3, nullptr, counter_ids());
  EXPECT_EQ(q.feed("x <tool").content, "x ");
  EXPECT_EQ(q.feed("box> y").content, "<toolbox> y");
  EXPECT_EQ(q.feed("]<]mini").content, "");
  EXPECT_EQ(q.feed("max[>[z").content, "z");
}

// A bare <tool_call> (no namespace token) opens a block only when an invoke follows it; otherwise it is
// text of the answer, streamed or not, however it is split.
TEST(ToolParserM3, BareToolCallTagIsTextUnlessAnInvokeFollows) {
  const std::string text = "Wrap calls in <tool_call> tags. Then wait for the result.";
  ToolParser p(ToolFormat::MiniMaxM3, nullptr, counter_ids());
  ToolParseResult r = p.parse(text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.calls.empty());
  for (size_t k = 0; k <= text.size(); ++k) expect_same(r, stream_tools(ToolFormat::MiniMaxM3, nullptr, {text.substr(0, k), text.substr(k)}));
  expect_same(r, stream_tools(ToolFormat::MiniMaxM3, nullptr, chars(text)));
  // At the very end it is text too.
  EXPECT_EQ(p.parse("see <tool_call>").content, "see <tool_call>");
  // Followed by an NS invoke: a call, as before.
  const std::string call = "ok <tool_call>\n" + NS + "<invoke name=\"f\">" + NS + "<a>1" + NS + "</a>" + NS + "</invoke>" + NS +
                           "</tool_call>";
  r = ToolParser(ToolFormat::MiniMaxM3, nullptr, counter_ids()).parse(call);
  EXPECT_EQ(r.content, "ok ");
  ASSERT_EQ(r.calls.size(), 1u) << call;
  expect_same(r, stream_tools(ToolFormat::MiniMaxM3, nullptr, chars(call)));
  // A wholly bare block (no NS anywhere) is text, streamed or not: its parameters could not be read.
  const std::string bare = "Sure<tool_call>\n<invoke name=\"calc\"><expression>4</expression></invoke>\n</tool_call> done";
  r = ToolParser(ToolFormat::MiniMaxM3, nullptr, counter_ids()).parse(bare);
  EXPECT_EQ(r.content, bare);
  EXPECT_TRUE(r.calls.empty());
  expect_same(r, stream_tools(ToolFormat::MiniMaxM3, nullptr, chars(bare)));
}

TEST(ToolParserM3, TruncatedAndMalformed) {
  ToolParser p(ToolFormat::MiniMaxM3, spec_tools(), counter_ids());
  // Several invokes, the last one cut mid-value: only the complete one is a call.
  std::string cut = NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">" + NS + "<location>Oslo" + NS +
                    "</location>" + NS + "</invoke>\n" + NS + "<invoke name=\"search\">" + NS + "<queries>" + NS +
                    "<item>fjo";
  ToolParseResult r = p.parse(cut);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"location": "Oslo"})");
  EXPECT_TRUE(r.incomplete);
  // Cut inside the very first value: no calls, and no markup in content.
  r = p.parse("Hi" + NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">" + NS + "<loc");
  EXPECT_EQ(r.content, "Hi");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_TRUE(r.incomplete);
  // Missing <tool_call> opener: the invoke is still parsed.
  r = p.parse("ok " + NS + "<invoke name=\"get_weather\">" + NS + "<days>2" + NS + "</days>" + NS + "</invoke>");
  EXPECT_EQ(r.content, "ok ");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"days": 2})");
  // Block closed while an invoke is open: the open invoke is dropped, later text is content.
  r = p.parse(NS + "<tool_call>" + NS + "<invoke name=\"x\">" + NS + "<a>1" + NS + "</tool_call>tail");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "tail");
  // Unclosed block at end after complete invokes: calls kept, not incomplete.
  r = p.parse(NS + "<tool_call>" + NS + "<invoke name=\"x\">" + NS + "</invoke>\n");
  EXPECT_EQ(r.calls.size(), 1u);
  EXPECT_FALSE(r.incomplete);
  // Mismatched closing tag is ignored; the element closes at </invoke>.
  r = p.parse(NS + "<tool_call>" + NS + "<invoke name=\"x\">" + NS + "<a>v" + NS + "</b>" + NS + "</invoke>" + NS + "</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"a": "v"})");
}

TEST(ToolParserM3, SchemaTyping) {
  json tools = json::parse(R"([{"name":"f","parameters":{"type":"object","properties":{
    "s":{"type":"string"}, "code":{"type":"string"}, "n":{"type":"number"}, "i":{"anyOf":[{"type":"integer"},{"type":"null"}]},
    "b":{"type":"boolean"}, "t":{"type":["boolean","null"]}, "o":{"type":"object","properties":{"k":{"type":"integer"}}},
    "arr":{"type":"array","items":{"type":"object","properties":{"x":{"type":"number"}}}},
    "raw":{"type":"object"}}}}])");
  auto call = [&](const std::string& params) {
    ToolParser p(ToolFormat::MiniMaxM3, tools, counter_ids());
    ToolParseResult r = p.parse(NS + "<tool_call>\n" + NS + "<invoke name=\"f\">" + params + NS + "</invoke>\n" + NS + "</tool_call>");
    EXPECT_EQ(r.calls.size(), 1u);
    return r.calls.empty() ? std::string() : r.calls[0].arguments;
  };
  auto el = [&](const std::string& k, const std::string& v) { return NS + "<" + k + ">" + v + NS + "</" + k + ">"; };
  EXPECT_EQ(call(el("s", "007") + el("n", "2.50") + el("i", " 42 ") + el("b", "true") + el("t", "false")),
            R"({"s": "007", "n": 2.5, "i": 42, "b": true, "t": false})");
  EXPECT_EQ(call(el("code", "  if (a < b && c) {\n  }\n") + el("s", "x &amp; &lt;y&gt; &#233;")),
            R"({"code": "  if (a < b && c) {\n  }\n", "s": "x & <y> é"})");
  EXPECT_EQ(call(el("o", el("k", "5")) + el("arr", el("item", el("x", "1.5")) + el("item", el("x", "2")))),
            R"({"o": {"k": 5}, "arr": [{"x": 1.5}, {"x": 2}]})");
  EXPECT_EQ(call(el("raw", R"({"a": [1, 2]})") + el("o", "note" + el("k", "1"))), R"({"raw": {"a": [1, 2]}, "o": {"k": 1, "$text": "note"}})");
  // Local $refs are followed (as the grammar follows them): a string behind a $ref stays a string.
  {
    json rt = json::parse(R"([{"name":"g","parameters":{"type":"object","$defs":{"s":{"type":"string"},
      "n":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}}}},
      "properties":{"a":{"$ref":"#/$defs/s"},"t":{"$ref":"#/$defs/n"},"o":{"anyOf":[{"$ref":"#/$defs/s"},{"type":"null"}]}}}}])");
    ToolParser p(ToolFormat::MiniMaxM3, rt, counter_ids());
    const ToolParseResult r = p.parse(NS + "<tool_call>\n" + NS + "<invoke name=\"g\">" + el("a", "700") +
                                      el("t", el("v", "1") + el("kids", el("item", el("v", "2")))) + el("o", "5") + NS +
                                      "</invoke>\n" + NS + "</tool_call>");
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].arguments, R"({"a": "700", "t": {"v": 1, "kids": [{"v": 2}]}, "o": "5"})");
  }
  // "null" for a parameter that may be null is null, whatever its other type; for one that may not, text.
  EXPECT_EQ(call(el("i", "null") + el("t", " null ") + el("s", "null")), R"({"i": null, "t": null, "s": "null"})");
  // Not in the schema: inferred.
  EXPECT_EQ(call(el("u1", "true") + el("u2", "null") + el("u3", "-3") + el("u4", "1e3") + el("u5", "hi there") +
                 el("u6", el("item", "1") + el("item", "b"))),
            R"({"u1": true, "u2": null, "u3": -3, "u4": 1000.0, "u5": "hi there", "u6": [1, "b"]})");
  // Unknown function: everything inferred.
  ToolParser p(ToolFormat::MiniMaxM3, tools, counter_ids());
  EXPECT_EQ(p.parse(NS + "<invoke name=\"g\">" + el("a", "1") + NS + "</invoke>").calls.at(0).arguments, R"({"a": 1})");
}

TEST(ToolParserM3, ParallelToolCallsFalseKeepsFirst) {
  ToolParserOptions opt = counter_ids();
  opt.parallel_tool_calls = false;
  ToolParser p(ToolFormat::MiniMaxM3, spec_tools(), opt);
  ToolParseResult r = p.parse(kSpecOutput);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  Streamed s = stream_tools(ToolFormat::MiniMaxM3, spec_tools(), chars(kSpecOutput), opt);
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, r.calls[0].arguments);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// docs/serving.md 5.2 item 6: render a known call through the shipped template's history path, parse it back.
TEST(ToolParserM3, TemplateRoundTrip) {
  std::string tmpl = read_file(std::string(M3_TEST_DATA) + "/chat/MiniMax-M3.jinja");
  ojson args = ojson::parse(R"({"location": " Paris \n", "days": 3, "metric": true,
    "tags": ["a", "b c"], "opts": {"lang": "fr", "depth": 2.5, "nested": [{"k": "v"}]}, "code": "x<y && z>w"})");
  ojson msgs = ojson::array({ojson{{"role", "user"}, {"content", "q"}},
                             ojson{{"role", "assistant"}, {"content", ""},
                                   {"tool_calls", ojson::array({ojson{{"type", "function"},
                                                                      {"function", {{"name", "get_weather"}, {"arguments", args}}}}})}}});
  std::string prompt = render_chat(tmpl, msgs, ojson(nullptr), false, ojson::object(), "", "");
  size_t start = prompt.rfind("]~b]ai\n");
  ASSERT_NE(start, std::string::npos);
  std::string reply = prompt.substr(start + 7);
  reply = reply.substr(0, reply.rfind("[e~[") + 4);  // the model's output ends at its end-of-turn token
  ReasoningResult rr = ReasoningParser::parse(ReasoningFormat::MiniMaxM3, false, reply);
  ASSERT_TRUE(rr.content.has_value());
  json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
    "location":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},"tags":{"type":"array","items":{"type":"string"}},
    "opts":{"type":"object","properties":{"lang":{"type":"string"},"depth":{"type":"number"},"nested":{"type":"array"}}},
    "code":{"type":"string"}}}}}])");
  ToolParser p(ToolFormat::MiniMaxM3, tools, counter_ids());
  ToolParseResult r = p.parse(*rr.content);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(ojson::parse(r.calls[0].arguments), args);
  EXPECT_EQ(rr.reasoning, std::nullopt);
}

// ---- M2 ----

const std::string kM2Output =
    "Checking.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"location\">Paris</parameter>\n"
    "<parameter name=\"days\">3</parameter>\n</invoke>\n<invoke name=\"search\">\n"
    "<parameter name=\"queries\">[\"louvre hours\", \"metro map\"]</parameter>\n"
    "<parameter name=\"filters\">{\"lang\": \"fr\"}</parameter>\n</invoke>\n</minimax:tool_call>";

TEST(ToolParserM2, ExampleAndStreaming) {
  ToolParser p(ToolFormat::MiniMaxM2, spec_tools(), counter_ids());
  ToolParseResult r = p.parse(kM2Output);
  EXPECT_EQ(r.content, "Checking.\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"location": "Paris", "days": 3})");
  EXPECT_EQ(r.calls[1].arguments, R"({"queries": ["louvre hours", "metro map"], "filters": {"lang": "fr"}})");
  for (size_t k = 0; k <= kM2Output.size(); ++k) {
    SCOPED_TRACE(k);
    expect_same(r, stream_tools(ToolFormat::MiniMaxM2, spec_tools(), {kM2Output.substr(0, k), kM2Output.substr(k)}));
  }
  expect_same(r, stream_tools(ToolFormat::MiniMaxM2, spec_tools(), chars(kM2Output)));
  // No schema: JSON-looking values are decoded, others inferred; truncated invoke dropped.
  ToolParser q(ToolFormat::MiniMaxM2, nullptr, counter_ids());
  ToolParseResult t = q.parse("<minimax:tool_call><invoke name=\"f\"><parameter name=\"a\">\n[1, 2]\n</parameter>"
                              "<parameter name=\"b\">yes</parameter></invoke><invoke name=\"g\"><parameter name=\"c\">1");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].arguments, R"({"a": [1, 2], "b": "yes"})");
  EXPECT_TRUE(t.incomplete);
  EXPECT_THROW(tool_format_from_name("hermes"), m3::Error);
}

// ---- reasoning ----

std::pair<std::string, std::string> stream_reasoning(ReasoningFormat fmt, bool start, const std::vector<std::string>& pieces,
                                                     std::vector<ReasoningDelta>* deltas = nullptr) {
  ReasoningParser p(fmt, start);
  std::string r, c;
  auto take = [&](ReasoningDelta d) {
    r += d.reasoning;
    c += d.content;
    if (deltas) deltas->push_back(d);
  };
  for (auto& s : pieces) take(p.feed(s));
  take(p.finish());
  return {r, c};
}

TEST(ReasoningParserM3, SpecExample) {
  std::string out = "The user asks for 2+2. Trivial.</mm:think>2 + 2 = 4.[e~[";
  ReasoningResult r = ReasoningParser::parse(ReasoningFormat::MiniMaxM3, true, out);
  EXPECT_EQ(r.reasoning, "The user asks for 2+2. Trivial.");
  EXPECT_EQ(r.content, "2 + 2 = 4.");
  std::vector<ReasoningDelta> d;
  stream_reasoning(ReasoningFormat::MiniMaxM3, true, {"The user asks", " for 2+2. Trivial.", "</mm:think>", "2 + 2", " = 4."}, &d);
  ASSERT_EQ(d.size(), 6u);
  EXPECT_EQ(d[0].reasoning, "The user asks");
  EXPECT_EQ(d[1].reasoning, " for 2+2. Trivial.");
  EXPECT_TRUE(d[2].empty());
  EXPECT_EQ(d[3].content, "2 + 2");
  EXPECT_EQ(d[3].reasoning, "");
  EXPECT_EQ(d[4].content, " = 4.");
  EXPECT_TRUE(d[5].empty());
  for (size_t k = 0; k <= out.size(); ++k) {
    auto [rs, cs] = stream_reasoning(ReasoningFormat::MiniMaxM3, true, {out.substr(0, k), out.substr(k)});
    EXPECT_EQ(rs, *r.reasoning) << k;
    EXPECT_EQ(cs, *r.content) << k;
  }
}

TEST(ReasoningParserM3, ModesAndStrayTags) {
  auto parse = [](bool start, const std::string& s) { return ReasoningParser::parse(ReasoningFormat::MiniMaxM3, start, s); };
  // adaptive: output opens the tag itself.
  ReasoningResult r = parse(false, "<mm:think>hmm</mm:think>Answer");
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.content, "Answer");
  r = parse(false, "\n<mm:think>hmm</mm:think>Answer");
  EXPECT_EQ(r.reasoning, "hmm");
  // adaptive without thinking; disabled; stray leading </mm:think> (history teaches it).
  r = parse(false, "Just the answer.");
  EXPECT_EQ(r.reasoning, std::nullopt);
  EXPECT_EQ(r.content, "Just the answer.");
  r = parse(false, "</mm:think>Answer</mm:think> more");
  EXPECT_EQ(r.reasoning, std::nullopt);
  EXPECT_EQ(r.content, "Answer more");
  // enabled, model repeats the open tag, and duplicates the close tag.
  r = parse(true, "<mm:think>deep</mm:think></mm:think>Done");
  EXPECT_EQ(r.reasoning, "deep");
  EXPECT_EQ(r.content, "Done");
  // Stopped while reasoning: all reasoning, content null.
  r = parse(true, "still thinking");
  EXPECT_EQ(r.reasoning, "still thinking");
  EXPECT_EQ(r.content, std::nullopt);
  // A partial tag at the very end is real text.
  r = parse(true, "a</mm:th");
  EXPECT_EQ(r.reasoning, "a</mm:th");
  // Streaming at every split equals non-streaming on a harder string.
  std::string s = "\n<mm:think>x < y </mm:think></mm:think>\n<b>ok</b><mm:think>[e~[";
  ReasoningResult want = parse(false, s);
  EXPECT_EQ(want.reasoning, "x < y ");
  EXPECT_EQ(want.content, "\n<b>ok</b>");
  for (size_t k = 0; k <= s.size(); ++k)
    for (size_t j = k; j <= s.size(); j += 3) {
      auto [rs, cs] = stream_reasoning(ReasoningFormat::MiniMaxM3, false, {s.substr(0, k), s.substr(k, j - k), s.substr(j)});
      EXPECT_EQ(rs, *want.reasoning) << k << "," << j;
      EXPECT_EQ(cs, *want.content) << k << "," << j;
    }
}

TEST(ReasoningParserM3, InitialStateFromPromptTail) {
  std::string tmpl = read_file(std::string(M3_TEST_DATA) + "/chat/MiniMax-M3.jinja");
  ojson msgs = ojson::parse(R"([{"role":"user","content":"Hi"}])");
  auto prompt = [&](const char* mode) { return render_chat(tmpl, msgs, ojson(nullptr), true, ojson{{"thinking_mode", mode}}, "", ""); };
  // The system prompt mentions <mm:think></mm:think>; only the tail decides.
  EXPECT_TRUE(ReasoningParser::prompt_starts_reasoning(ReasoningFormat::MiniMaxM3, prompt("enabled")));
  EXPECT_FALSE(ReasoningParser::prompt_starts_reasoning(ReasoningFormat::MiniMaxM3, prompt("disabled")));
  EXPECT_FALSE(ReasoningParser::prompt_starts_reasoning(ReasoningFormat::MiniMaxM3, prompt("adaptive")));
  EXPECT_TRUE(ReasoningParser::prompt_starts_reasoning(ReasoningFormat::MiniMaxM2, "]~b]ai\n<think>\n"));
}

TEST(ReasoningParserM2, SplitAndAppendThink) {
  std::string out = "Let me see.\n</think>\n\nIt is 4.[e~[";
  ReasoningResult r = ReasoningParser::parse(ReasoningFormat::MiniMaxM2, true, out);
  EXPECT_EQ(r.reasoning, "Let me see.\n");
  EXPECT_EQ(r.content, "\n\nIt is 4.");
  for (size_t k = 0; k <= out.size(); ++k) {
    auto [rs, cs] = stream_reasoning(ReasoningFormat::MiniMaxM2, true, {out.substr(0, k), out.substr(k)});
    EXPECT_EQ(rs, *r.reasoning);
    EXPECT_EQ(cs, *r.content);
  }
  ReasoningResult a = ReasoningParser::parse(ReasoningFormat::MiniMaxM2AppendThink, true, out);
  EXPECT_EQ(a.reasoning, std::nullopt);
  EXPECT_EQ(a.content, "<think>Let me see.\n</think>\n\nIt is 4.");
  for (size_t k = 0; k <= out.size(); ++k) {
    auto [rs, cs] = stream_reasoning(ReasoningFormat::MiniMaxM2AppendThink, true, {out.substr(0, k), out.substr(k)});
    EXPECT_EQ(rs, "");
    EXPECT_EQ(cs, *a.content) << k;
  }
  EXPECT_EQ(reasoning_format_from_name("minimax_m2_append_think"), ReasoningFormat::MiniMaxM2AppendThink);
  EXPECT_THROW(reasoning_format_from_name("deepseek"), m3::Error);
}

}  // namespace
