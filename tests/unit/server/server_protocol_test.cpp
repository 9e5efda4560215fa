// The server's response-building layer on canned model output: ChoiceState runs the minimax_m3
// reasoning and tool-call parsers over streamed text deltas (as the server feeds them), and the
// message / delta / usage JSON and request validation match the OpenAI / vLLM shapes.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "structured/matcher.h"
#include "server/errors.h"
#include "server/openai_protocol.h"

using namespace m3;
using namespace m3::server;

namespace {

const std::string NS = "]<]minimax[>[";

ChoiceOptions m3_options(bool start_in_reasoning) {
  ChoiceOptions o;
  o.reasoning = chat::ReasoningFormat::MiniMaxM3;
  o.reasoning_start = start_in_reasoning;
  o.tool = chat::ToolFormat::MiniMaxM3;
  o.tools = nlohmann::json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{
      "type":"object","properties":{"location":{"type":"string"},"days":{"type":"integer"}}}}}])");
  return o;
}

// Feeds `text` in pieces of `step` bytes; returns the streamed deltas' JSON and the final state.
struct StreamRun {
  std::string reasoning, content, args, name;
  int tool_deltas = 0;
};

StreamRun stream(ChoiceState& s, const std::string& text, size_t step, FinishReason fr) {
  StreamRun r;
  for (size_t i = 0; i < text.size(); i += step) {
    const bool last = i + step >= text.size();
    ChoiceDelta d = s.on_text(text.substr(i, step), last, fr);
    ojson j = chat_delta_json(d);
    if (j.contains("reasoning")) {
      EXPECT_EQ(j["reasoning"], j["reasoning_content"]);
      r.reasoning += j["reasoning"].get<std::string>();
    }
    if (j.contains("content")) r.content += j["content"].get<std::string>();
    if (j.contains("tool_calls"))
      for (auto& t : j["tool_calls"]) {
        ++r.tool_deltas;
        if (t.contains("id")) {
          EXPECT_EQ(t["type"], "function");
          r.name = t["function"]["name"];
          EXPECT_EQ(t["function"]["arguments"], "");
        }
        r.args += t["function"]["arguments"].get<std::string>();
      }
  }
  return r;
}

}  // namespace

TEST(ServerProtocol, ReasoningThenContentEverySplit) {
  const std::string out = "The user asks for 2+2. Trivial.</mm:think>2 + 2 = 4.";
  for (size_t step = 1; step <= out.size(); ++step) {
    ChoiceState s(nullptr, m3_options(true));
    StreamRun r = stream(s, out, step, FinishReason::Stop);
    EXPECT_EQ(r.reasoning, "The user asks for 2+2. Trivial.") << "step " << step;
    EXPECT_EQ(r.content, "2 + 2 = 4.") << "step " << step;
    EXPECT_EQ(s.finish_reason, "stop");
    ojson m = chat_message_json(s);
    EXPECT_EQ(m["role"], "assistant");
    EXPECT_EQ(m["content"], "2 + 2 = 4.");
    EXPECT_EQ(m["reasoning"], "The user asks for 2+2. Trivial.");
    EXPECT_EQ(m["reasoning_content"], m["reasoning"]);
    EXPECT_TRUE(m["tool_calls"].empty());
  }
}

TEST(ServerProtocol, ToolCallAfterReasoningEverySplit) {
  const std::string out = "Need the weather.</mm:think>Checking.\n" + NS + "<tool_call>\n" + NS +
                          "<invoke name=\"get_weather\">" + NS + "<location>Paris" + NS + "</location>" + NS +
                          "<days>3" + NS + "</days>" + NS + "</invoke>\n" + NS + "</tool_call>";
  for (size_t step = 1; step <= out.size(); step += (step < 20 ? 1 : 7)) {
    ChoiceState s(nullptr, m3_options(true));
    StreamRun r = stream(s, out, step, FinishReason::Stop);
    EXPECT_EQ(r.reasoning, "Need the weather.");
    EXPECT_EQ(r.content.find("minimax"), std::string::npos) << "marker leaked at step " << step;
    EXPECT_EQ(r.content.find("<tool_call>"), std::string::npos);
    EXPECT_EQ(r.name, "get_weather");
    EXPECT_EQ(r.args, "{\"location\": \"Paris\", \"days\": 3}") << "step " << step;
    EXPECT_EQ(s.finish_reason, "tool_calls");
    ojson m = chat_message_json(s);
    ASSERT_EQ(m["tool_calls"].size(), 1u);
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], r.args);
    EXPECT_EQ(m["tool_calls"][0]["id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u);
  }
}

TEST(ServerProtocol, LengthInsideReasoningAndStopStrings) {
  {
    ChoiceState s(nullptr, m3_options(true));
    StreamRun r = stream(s, "still thinking about it", 4, FinishReason::Length);
    EXPECT_EQ(r.reasoning, "still thinking about it");
    EXPECT_EQ(s.finish_reason, "length");
    EXPECT_TRUE(chat_message_json(s)["content"].is_null());
  }
  {
    ChoiceOptions o;
    o.stop = {"END"};
    ChoiceState s(nullptr, o);
    EXPECT_EQ(s.on_text("abc", false, FinishReason::None).content, "a");  // "bc" could start "END"
    EXPECT_EQ(s.on_text(" EN", false, FinishReason::None).content, "bc ");  // "EN" is held back
    ChoiceDelta d = s.on_text("D tail", true, FinishReason::Stop);
    EXPECT_EQ(d.content, "");
    EXPECT_EQ(s.content, "abc ");
    EXPECT_EQ(s.stop_reason, "END");
  }
}

TEST(ServerProtocol, UsageAndErrorShapes) {
  ojson u = usage_json(10, 5, 4);
  EXPECT_EQ(u.dump(), R"({"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}})");
  ojson e = error_body(404, "The model `x` does not exist.", "model");
  EXPECT_EQ(e.dump(),
            R"({"error":{"message":"The model `x` does not exist.","type":"NotFoundError","param":"model","code":404}})");
}

TEST(ServerProtocol, RequestValidationNamesTheField) {
  ServerContext ctx;
  ctx.served_names = {"m"};
  auto status_param = [&](const char* body) -> std::pair<int, std::string> {
    try {
      parse_completion_request(ojson::parse(body), ctx);
    } catch (const ApiError& e) {
      return {e.status, e.param};
    }
    return {0, ""};
  };
  EXPECT_EQ(status_param(R"({"model":"other","prompt":"x"})"), std::make_pair(404, std::string("model")));
  EXPECT_EQ(status_param(R"({"prompt":"x","temperature":"a"})"), std::make_pair(400, std::string("temperature")));
  EXPECT_EQ(status_param(R"({"prompt":"x","top_p":0})"), std::make_pair(400, std::string("top_p")));
  EXPECT_EQ(status_param(R"({"prompt":"x","stop":[1]})"), std::make_pair(400, std::string("stop")));
  EXPECT_EQ(status_param(R"({"prompt":"x","stream_options":{"include_usage":true}})"),
            std::make_pair(400, std::string("stream_options")));
  EXPECT_EQ(status_param(R"({"prompt":"x","response_format":{"type":"json_schema"}})"),
            std::make_pair(400, std::string("response_format")));
  EXPECT_EQ(status_param(R"({"prompt":{"a":1}})").first, 400);
  EXPECT_EQ(status_param(R"([1,2])").first, 400);
}

// ---- tool_choice "required" and a named function: forced generation prefix -----------------

namespace {

ChoiceOptions forced_options(const std::string& name) {
  ChoiceOptions o = m3_options(false);
  o.forced_tool_text = forced_tool_prefix(chat::ToolFormat::MiniMaxM3, name, false).parser_text;
  o.allowed_tool_names = {"get_weather"};
  return o;
}

const std::string kBody = NS + "<location>Paris" + NS + "</location>" + NS + "<days>3" + NS + "</days>" + NS +
                          "</invoke>\n" + NS + "</tool_call>";

}  // namespace

TEST(ServerProtocol, ForcedToolPrefixText) {
  auto named = forced_tool_prefix(chat::ToolFormat::MiniMaxM3, "get_weather", false);
  EXPECT_EQ(named.parser_text, NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">");
  EXPECT_EQ(named.prompt_suffix, named.parser_text);
  auto req = forced_tool_prefix(chat::ToolFormat::MiniMaxM3, "", true);
  EXPECT_EQ(req.parser_text, NS + "<tool_call>\n" + NS + "<invoke name=\"");
  EXPECT_EQ(req.prompt_suffix, "</mm:think>" + req.parser_text);
}

TEST(ServerProtocol, NamedToolChoiceEverySplit) {
  for (size_t step = 1; step <= kBody.size(); ++step) {
    ChoiceState s(nullptr, forced_options("get_weather"));
    StreamRun r = stream(s, kBody, step, FinishReason::Stop);
    EXPECT_EQ(r.name, "get_weather") << "step " << step;
    EXPECT_EQ(r.args, "{\"location\": \"Paris\", \"days\": 3}") << "step " << step;
    EXPECT_EQ(r.content, "");
    EXPECT_EQ(s.finish_reason, "tool_calls");
    ojson m = chat_message_json(s);
    ASSERT_EQ(m["tool_calls"].size(), 1u);
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"location\": \"Paris\", \"days\": 3}");
    EXPECT_TRUE(m["content"].is_null());
  }
}

TEST(ServerProtocol, RequiredToolChoiceValidatesTheName) {
  const std::string good = "get_weather\">" + kBody;
  for (size_t step = 1; step <= good.size(); step += 3) {
    ChoiceState s(nullptr, forced_options(""));
    StreamRun r = stream(s, good, step, FinishReason::Stop);
    EXPECT_EQ(r.name, "get_weather");
    EXPECT_EQ(r.args, "{\"location\": \"Paris\", \"days\": 3}") << "step " << step;
    EXPECT_EQ(s.finish_reason, "tool_calls");
  }
  // A name that is not a tool: the call is dropped (also from the stream); no markup leaks.
  const std::string bad = "launch_rockets\">" + kBody;
  for (size_t step = 1; step <= bad.size(); step += 5) {
    ChoiceState s(nullptr, forced_options(""));
    StreamRun r = stream(s, bad, step, FinishReason::Stop);
    EXPECT_EQ(r.tool_deltas, 0) << "step " << step;
    EXPECT_EQ(r.content.find("minimax"), std::string::npos);
    EXPECT_EQ(s.finish_reason, "stop");
    EXPECT_TRUE(chat_message_json(s)["tool_calls"].empty());
  }
  // A bad call followed by a good one: the good one is index 0.
  const std::string two = "nope\">" + NS + "</invoke>\n" + NS + "<invoke name=\"get_weather\">" + kBody;
  ChoiceState s(nullptr, forced_options(""));
  ChoiceDelta d = s.on_text(two, true, FinishReason::Stop);
  ASSERT_FALSE(d.tool_calls.empty());
  for (auto& t : d.tool_calls) EXPECT_EQ(t.index, 0);
  ASSERT_EQ(s.tool_calls().size(), 1u);
  EXPECT_EQ(s.tool_calls()[0].name, "get_weather");
}

TEST(ServerProtocol, ToolChoiceConstrainsTheWholeCall) {
  Tokenizer tok = Tokenizer::from_dir(std::string(M3_TEST_DATA) + "/tokenizer/m3-tiny");
  std::ifstream f(std::string(M3_TEST_DATA) + "/chat/MiniMax-M3.jinja");
  std::stringstream ss;
  ss << f.rdbuf();
  ServerContext ctx;
  ctx.served_names = {"m"};
  ctx.tok = &tok;
  ctx.vocab = tok.vocab_size();
  ctx.chat_template = std::make_shared<chat::ChatTemplate>(ss.str());
  ctx.bos_token = "]~b]";
  ctx.eos_token = "[e~[";
  ctx.reasoning = chat::ReasoningFormat::MiniMaxM3;
  ctx.tool = chat::ToolFormat::MiniMaxM3;
  ojson body = ojson::parse(R"({"messages":[{"role":"user","content":"weather in Paris?"}],
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"location":{"type":"string"},"days":{"type":"integer"}}}}}],
    "tool_choice":{"type":"function","function":{"name":"get_weather"}}})");
  // Named: nothing is forced into the prompt; the whole call block is generated under its grammar.
  ParsedRequest r = parse_chat_request(body, ctx);
  const std::string& p = r.prompt_texts[0];
  EXPECT_EQ(p.find(NS + "<tool_call>", p.rfind("ai\n")), std::string::npos) << p;
  EXPECT_TRUE(r.choice.forced_tool_text.empty());
  ASSERT_TRUE(r.params.constraint);
  EXPECT_TRUE(r.choice.tool.has_value());
  EXPECT_FALSE(r.choice.reasoning_start);
  {
    // The grammar holds the named tool's block: its opener is allowed, another tool's invoke is not.
    structured::Matcher m(r.params.constraint);
    const std::string call = NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">";
    for (int32_t t : tok.encode(call, true)) {
      ASSERT_TRUE(m.accepts(t)) << t;
      m.advance(t);
    }
    structured::Matcher other(r.params.constraint);
    bool ok = true;
    for (int32_t t : tok.encode(NS + "<tool_call>\n" + NS + "<invoke name=\"get_time\">", true)) {
      if (!other.accepts(t)) {
        ok = false;
        break;
      }
      other.advance(t);
    }
    EXPECT_FALSE(ok) << "an unlisted tool name got through the grammar";
  }
  // thinking enabled: the model reasons first (the think block stays open) and the grammar takes over
  // after its end tag.
  body["chat_template_kwargs"] = {{"thinking_mode", "enabled"}};
  r = parse_chat_request(body, ctx);
  const std::string& pt = r.prompt_texts[0];
  EXPECT_EQ(pt.substr(pt.size() - std::string("ai\n<mm:think>").size()), "ai\n<mm:think>");
  EXPECT_TRUE(r.choice.reasoning_start);
  ASSERT_TRUE(r.params.constraint);
  EXPECT_EQ(r.params.constraint->start_after, "</mm:think>");
  {
    structured::Matcher m(r.params.constraint);
    for (int32_t t : tok.encode("Let me look it up.</mm:think>", true)) ASSERT_TRUE(m.advance(t));
    ASSERT_TRUE(m.active());
    bool ok = true;
    for (int32_t t : tok.encode("Sure!", true)) ok = ok && m.advance(t);
    EXPECT_FALSE(ok) << "text after the reasoning got past the tool-call grammar";
  }
  // required
  body["tool_choice"] = "required";
  r = parse_chat_request(body, ctx);
  EXPECT_TRUE(r.choice.forced_tool_text.empty());
  EXPECT_TRUE(r.params.constraint);
  // A parameter schema the grammar cannot hold is refused by name (never loosened to free text), and a
  // response_format cannot be added on top.
  auto message = [&](const ojson& b) {
    try {
      parse_chat_request(b, ctx);
    } catch (const ApiError& e) {
      return std::string(e.what()) + " [" + e.param + "]";
    }
    return std::string();
  };
  ojson bp = body;
  bp["tools"][0]["function"]["parameters"]["properties"]["location"]["format"] = "uri";
  EXPECT_NE(message(bp).find("[tools]"), std::string::npos) << message(bp);
  ojson br = body;
  br["response_format"] = {{"type", "json_object"}};
  EXPECT_NE(message(br).find("cannot be combined with tool_choice"), std::string::npos) << message(br);
  // Errors: unknown name, no tools, no parser.
  auto status = [&](const ojson& b, const ServerContext& c) {
    try {
      parse_chat_request(b, c);
    } catch (const ApiError& e) {
      return e.status;
    }
    return 0;
  };
  ojson b2 = body;
  b2["tool_choice"] = {{"type", "function"}, {"function", {{"name", "other"}}}};
  EXPECT_EQ(status(b2, ctx), 400);
  ojson b3 = body;
  b3.erase("tools");
  EXPECT_EQ(status(b3, ctx), 400);
  ServerContext no_parser = ctx;
  no_parser.tool.reset();
  EXPECT_EQ(status(body, no_parser), 400);
}
