// Chat-template and Jinja engine tests: every case in tests/data/chat/expected.json (rendered by
// Python Jinja2 configured like transformers, see gen_expected.py there) must render byte-identically,
// and errors (syntax, raise_exception) must surface as m3::Error with the template line.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "chat/jinja/jinja.h"
#include "base/error.h"

namespace {

using ojson = nlohmann::ordered_json;
const std::string kChat = std::string(M3_TEST_DATA) + "/chat/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const ojson& expected() {
  static ojson j = ojson::parse(read_file(kChat + "expected.json"));
  return j;
}

std::string render_case(const ojson& c) {
  return m3::chat::render_chat(read_file(kChat + c["template"].get<std::string>()), c["messages"], c["tools"],
                               c["add_generation_prompt"].get<bool>(), c["kwargs"], c["bos"].get<std::string>(),
                               c["eos"].get<std::string>());
}

TEST(ChatTemplate, MatchesPythonJinjaOnAllChatCases) {
  int n = 0;
  for (const auto& c : expected()["chat"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    if (c.contains("expected")) {
      EXPECT_EQ(render_case(c), c["expected"].get<std::string>());
    } else {
      try {
        render_case(c);
        ADD_FAILURE() << "expected an error";
      } catch (const m3::Error& e) {
        std::string msg = e.what();
        EXPECT_NE(msg.find(c["error"].get<std::string>()), std::string::npos) << msg;
        EXPECT_EQ(msg.rfind("template line ", 0), 0u) << msg;
      }
    }
    ++n;
  }
  EXPECT_GE(n, 16);
}

TEST(JinjaEngine, MatchesPythonJinjaOnFeatureSnippets) {
  EXPECT_GE(expected()["snippets"].size(), 30u);
  for (const auto& s : expected()["snippets"]) {
    std::string src = s["template"].get<std::string>();
    SCOPED_TRACE(src);
    auto render = [&] { return m3::jinja::Template(src).render(m3::jinja::Value::from_json(s["context"])); };
    if (s.contains("expected")) {
      EXPECT_EQ(render(), s["expected"].get<std::string>());
    } else {
      try {
        render();
        ADD_FAILURE() << "expected an error: " << s["error"];
      } catch (const m3::Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("template line ", 0), 0u) << e.what();
      }
    }
  }
}

// Hand-checked pieces of the M3 prompt (docs/model.md 8): the generation prefix per thinking_mode, the
// developer turn, and history rendering of reasoning and tool calls.
class M3Template : public ::testing::Test {
 protected:
  std::string tmpl = read_file(kChat + "MiniMax-M3.jinja");
  std::string render(const ojson& messages, const ojson& kwargs, const ojson& tools = nullptr, bool agp = true) {
    return m3::chat::render_chat(tmpl, messages, tools, agp, kwargs, "", "");
  }
  static bool ends_with(const std::string& s, const std::string& t) {
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
  }
};

TEST_F(M3Template, GenerationPrefixPerThinkingMode) {
  ojson msgs = ojson::parse(R"([{"role":"user","content":"Hi"}])");
  const std::string user_tail = "]~b]user\nHi[e~[\n]~b]ai\n";
  EXPECT_TRUE(ends_with(render(msgs, {{"thinking_mode", "enabled"}}), user_tail + "<mm:think>"));
  EXPECT_TRUE(ends_with(render(msgs, {{"thinking_mode", "disabled"}}), user_tail + "</mm:think>"));
  EXPECT_TRUE(ends_with(render(msgs, {{"thinking_mode", "adaptive"}}), user_tail));
  EXPECT_TRUE(ends_with(render(msgs, ojson::object()), user_tail));
  EXPECT_TRUE(ends_with(render(msgs, ojson::object(), nullptr, false), "]~b]user\nHi[e~[\n"));
}

TEST_F(M3Template, PlainUserTurnExact) {
  std::string out = render(ojson::parse(R"([{"role":"user","content":"Hello!"}])"), {{"thinking_mode", "disabled"}});
  const std::string expect =
      "]~!b[]~b]system\n"
      "Your model version is MiniMax-M3, developed by MiniMax. Knowledge cutoff: January 2026. Founded in early "
      "2022, MiniMax is a global AI foundation model company committed to advancing the frontiers of AI towards AGI."
      "\n\n<thinking_instructions>\n"
      "You have a thinking capability that allows you to reason step by step before responding. When thinking is "
      "enabled, wrap your reasoning in <mm:think></mm:think> tags before your response. When thinking is disabled, "
      "begin your response directly after the </mm:think> prefix. When thinking is adaptive, decide on your own "
      "whether to think for the current turn.\n"
      "Current thinking mode: disabled. Do not output any thinking process.\n"
      "</thinking_instructions>[e~[\n"
      "]~b]developer\nYou are a helpful assistant.[e~[\n"
      "]~b]user\nHello![e~[\n"
      "]~b]ai\n</mm:think>";
  EXPECT_EQ(out, expect);
}

TEST_F(M3Template, HistoryReasoningAndToolCalls) {
  ojson msgs = ojson::parse(R"([
    {"role":"system","content":"Sys."},
    {"role":"user","content":"Q"},
    {"role":"assistant","content":"A1"},
    {"role":"assistant","content":"ok","reasoning_content":"why",
     "tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"a\": [1, {\"b\": true}], \"n\": null, \"s\": \" x \"}"}}]},
    {"role":"tool","content":"r1"},{"role":"tool","content":"r2"}])");
  std::string out = render(msgs, {{"thinking_mode", "enabled"}});
  EXPECT_NE(out.find("]~b]developer\nSys.[e~[\n"), std::string::npos);
  EXPECT_NE(out.find("]~b]ai\n</mm:think>A1[e~[\n"), std::string::npos);
  const std::string ns = "]<]minimax[>[";
  const std::string call = "]~b]ai\n<mm:think>why</mm:think>ok" + ns + "<tool_call>\n" + ns + "<invoke name=\"f\">" + ns +
                           "<a>" + ns + "<item>1" + ns + "</item>" + ns + "<item>" + ns + "<b>true" + ns + "</b>" + ns +
                           "</item>" + ns + "</a>" + ns + "<s> x " + ns + "</s>" + ns + "</invoke>\n" + ns +
                           "</tool_call>[e~[\n]~b]tool\n<response>r1</response>\n<response>r2</response>[e~[\n]~b]ai\n<mm:think>";
  EXPECT_TRUE(ends_with(out, call)) << out;
}

TEST(JinjaEngine, ErrorsCarryTemplateLine) {
  try {
    m3::jinja::Template("line1\n{% if x %}\nno end");
    FAIL();
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("template line"), std::string::npos) << e.what();
  }
  try {
    m3::jinja::Template("a\nb\n{{ raise_exception('nope') }}").render(m3::jinja::Value::object());
    FAIL();
  } catch (const m3::Error& e) {
    EXPECT_EQ(std::string(e.what()), "template line 3: nope");
  }
  try {
    m3::jinja::Template("\n\n\n{% frobnicate %}");
    FAIL();
  } catch (const m3::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("template line 4:", 0), 0u) << e.what();
  }
  EXPECT_THROW(m3::jinja::Template("{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}").render(m3::jinja::Value::object()),
               m3::Error);
}

}  // namespace
