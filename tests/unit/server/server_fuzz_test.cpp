// Randomized robustness tests for the server's input paths (fixed seeds, bounded iterations, a few
// seconds in all): mutated chat / completion request bodies through the request parser and validator
// (only 400/404 ApiError or m3::Error may come out), mutated and random templates through the Jinja
// engine (only m3::Error), and random model output built from the M3 markers through the reasoning
// and tool-call parsers, split into random deltas: no crash or hang, and the streamed concatenation
// equals the one-shot parse (docs/serving.md 5.3: fragments concatenate to the final arguments).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/jinja/jinja.h"
#include "chat/reasoning_parser.h"
#include "chat/tool_parser.h"
#include "base/error.h"
#include "server/errors.h"
#include "server/openai_protocol.h"

using namespace m3;
using namespace m3::server;

namespace {

using Clock = std::chrono::steady_clock;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string rand_text(std::mt19937& rng, size_t max_len) {
  static const std::string pool = "abc xyz 0123456789 \n\t\"'<>/={}[]\\&;:,.-_~!%|";
  std::string s;
  const size_t n = rng() % (max_len + 1);
  for (size_t i = 0; i < n; ++i) {
    switch (rng() % 10) {
      case 0: s += char(0x80 + rng() % 0x40); break;  // stray continuation byte: invalid UTF-8
      case 1: s += "\xc3\xa9"; break;                 // é
      case 2: s += "\xe2\x82"; break;                 // truncated 3-byte sequence
      default: s += pool[rng() % pool.size()];
    }
  }
  return s;
}

ojson rand_scalar(std::mt19937& rng) {
  switch (rng() % 14) {
    case 0: return nullptr;
    case 1: return bool(rng() & 1);
    case 2: return int64_t(rng() % 100) - 50;
    case 3: return std::numeric_limits<int64_t>::max();
    case 4: return std::numeric_limits<int64_t>::min();
    case 5: return std::numeric_limits<uint64_t>::max();
    case 6: return 1e308;
    case 7: return -1e308;
    case 8: return std::numeric_limits<double>::quiet_NaN();
    case 9: return std::numeric_limits<double>::infinity();
    case 10: return "NaN";
    case 11: return 0.5;
    case 12: return rand_text(rng, 12);
    default: return ojson::array();
  }
}

ojson deep(int depth, bool arrays) {
  ojson v = "x";
  for (int i = 0; i < depth; ++i) v = arrays ? ojson::array({v}) : ojson({{"a", v}});
  return v;
}

// Every JSON pointer in `j` (containers and leaves).
void pointers(const ojson& j, const ojson::json_pointer& at, std::vector<ojson::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object())
    for (auto& [k, v] : j.items()) pointers(v, at / k, out);
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) pointers(j[i], at / i, out);
}

ojson mutate(ojson body, std::mt19937& rng) {
  const int edits = 1 + int(rng() % 3);
  for (int e = 0; e < edits; ++e) {
    std::vector<ojson::json_pointer> ps;
    pointers(body, ojson::json_pointer(), ps);
    const auto p = ps[rng() % ps.size()];
    ojson& v = body[p];
    switch (rng() % 8) {
      case 0: v = rand_scalar(rng); break;
      case 1:
        if (!p.empty()) body[p.parent_pointer()].is_object() ? (void)body[p.parent_pointer()].erase(p.back())
                                                             : (void)(v = nullptr);
        break;
      case 2: v = deep(1 + int(rng() % 300), rng() & 1); break;
      case 3: v = ojson::array({v, rand_scalar(rng)}); break;
      case 4: v = ojson({{"x", v}}); break;
      case 5: v = rand_text(rng, 40); break;
      case 6:
        if (v.is_object()) v[rand_text(rng, 6)] = rand_scalar(rng);
        else if (v.is_array()) v.push_back(rand_scalar(rng));
        break;
      default:
        if (v.is_string()) v = v.get<std::string>() + std::string(1, char(0xff));
        else v = rand_scalar(rng);
    }
  }
  return body;
}

struct Ctx {
  Tokenizer tok = Tokenizer::from_dir(std::string(M3_TEST_DATA) + "/tokenizer/m3-tiny");
  ServerContext ctx;
  Ctx() {
    ctx.served_names = {"m", "alias"};
    ctx.tok = &tok;
    ctx.max_model_len = 2048;
    ctx.vocab = tok.vocab_size();
    ctx.chat_template = std::make_shared<chat::ChatTemplate>(read_file(std::string(M3_TEST_DATA) + "/chat/MiniMax-M3.jinja"));
    ctx.bos_token = "]~b]";
    ctx.eos_token = "[e~[";
    ctx.reasoning = chat::ReasoningFormat::MiniMaxM3;
    ctx.tool = chat::ToolFormat::MiniMaxM3;
    ctx.enable_auto_tool_choice = true;
  }
};

// Runs one body through a request parser: only an ApiError of status 400/404 or m3::Error may
// come out (anything else would be a 500 for a client mistake).
void expect_clean(const std::function<void()>& fn, const std::string& what) {
  try {
    fn();
  } catch (const ApiError& e) {
    EXPECT_TRUE(e.status == 400 || e.status == 404) << what << ": status " << e.status << " " << e.what();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": unexpected exception " << typeid(e).name() << ": " << e.what();
  }
}

}  // namespace

TEST(ServerFuzz, MalformedRequests) {
  Ctx c;
  const ojson chat = ojson::parse(R"({"model":"m","messages":[
      {"role":"system","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"weather?"}]},
      {"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"get_weather","arguments":{"location":"Paris","days":3}}}]},
      {"role":"tool","tool_call_id":"c1","content":"sunny"}],
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"location":{"type":"string"},"days":{"type":"integer"}}}}}],
    "tool_choice":"auto","temperature":0.7,"top_p":0.9,"max_tokens":16,"stop":["END"],"n":2,
    "stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,
    "chat_template_kwargs":{"thinking_mode":"enabled"},"seed":7})");
  const ojson completion = ojson::parse(
      R"({"model":"alias","prompt":["Hello there",[1,2,3]],"max_tokens":8,"logprobs":1,"echo":false,
          "stop":"x","temperature":0,"n":1,"stop_token_ids":[5]})");
  std::mt19937 rng(12345);
  int ok = 0;
  const auto t0 = Clock::now();
  for (int it = 0; it < 1500; ++it) {
    const bool is_chat = it % 2 == 0;
    const ojson body = mutate(is_chat ? chat : completion, rng);
    bool parsed = false;
    expect_clean(
        [&] {
          ParsedRequest r = is_chat ? parse_chat_request(body, c.ctx) : parse_completion_request(body, c.ctx);
          parsed = true;
          // What a valid request yields must be usable by the engine.
          EXPECT_FALSE(r.prompts.empty());
          r.params.validate();
        },
        "iteration " + std::to_string(it));
    ok += parsed;
  }
  // Raw byte-level corruption of the text (the server parses without exceptions reaching handlers).
  const std::string text = chat.dump();
  for (int it = 0; it < 1500; ++it) {
    std::string s = text;
    for (int e = 0, n = 1 + int(rng() % 4); e < n && !s.empty(); ++e) {
      const size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[pos] = char(rng() & 0xff); break;
        case 1: s.erase(pos, 1 + rng() % 8); break;
        default: s.insert(pos, rand_text(rng, 6));
      }
    }
    const ojson j = ojson::parse(s, nullptr, false);
    if (j.is_discarded()) continue;
    expect_clean([&] { parse_chat_request(j, c.ctx); }, "raw " + std::to_string(it));
  }
  EXPECT_GT(ok, 10);  // the mutations leave some requests valid
  // No timing assertion (speed is for benchmarks); a hang is caught by the ctest timeout.
  std::printf("  %.2f s\n", std::chrono::duration<double>(Clock::now() - t0).count());
}

TEST(ServerFuzz, RandomTemplates) {
  std::vector<std::string> sources;
  for (const char* f : {"MiniMax-M3.jinja", "llama3_like.jinja", "mistral_like.jinja", "qwen3_like.jinja"})
    sources.push_back(read_file(std::string(M3_TEST_DATA) + "/chat/" + f));
  const nlohmann::ordered_json vars = nlohmann::ordered_json::parse(R"({
    "messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"},
      {"role":"assistant","content":"a","reasoning_content":"r","tool_calls":[{"function":{"name":"f","arguments":{"x":1}}}]},
      {"role":"tool","content":"t"}],
    "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}],
    "add_generation_prompt":true,"bos_token":"<s>","eos_token":"</s>","thinking_mode":"enabled"})");
  const jinja::Value ctx = jinja::Value::from_json(vars);
  static const std::vector<std::string> toks = {
      "{%", "%}", "{{", "}}", "{#", "#}", "{%-", "-%}", " for x in messages ", " endfor ", " if ", " else ",
      " endif ", " macro m(a, b=1) ", " endmacro ", " set ns = namespace(a=1) ", " ns.a ", "m(1)", " call ",
      "(", ")", "[", "]", "{", "}", "|", "~", "+", "*", "/", "//", "%", "**", "'s'", "\"q\"", "1", "-1",
      "0.5", "none", "true", " is ", " not ", " in ", " and ", " or ", "loop.index", "x.content", "[1:-1]",
      "|tojson", "|length", "|join(',')", "raise_exception('no')", "range(3)", ".split(',')", ".strip()",
      " recursive ", "loop(x)", " filter ", " raw ", " endraw ", "\n", "text ", "\xff\xfe", "=", "==", "!=",
      ",", ":", ".", "?", "x", "messages", "ns", "tools", "dict(a=1)", " elif ", "break", "continue"};
  std::mt19937 rng(777);
  auto run = [&](const std::string& src, const std::string& what) {
    try {
      jinja::Template t(src);
      (void)t.render(ctx);
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": " << typeid(e).name() << ": " << e.what();
    }
  };
  const auto t0 = Clock::now();
  for (int it = 0; it < 400; ++it) {
    std::string s = sources[size_t(it) % sources.size()];
    for (int e = 0, n = 1 + int(rng() % 5); e < n && !s.empty(); ++e) {
      const size_t pos = rng() % s.size(), len = 1 + rng() % 40;
      switch (rng() % 4) {
        case 0: s.erase(pos, len); break;
        case 1: s.insert(pos, toks[rng() % toks.size()]); break;
        case 2: s.insert(pos, s.substr(rng() % s.size(), len)); break;
        default: s.resize(pos);
      }
    }
    run(s, "mutated " + std::to_string(it));
  }
  for (int it = 0; it < 1500; ++it) {
    std::string s;
    for (int k = 0, n = 1 + int(rng() % 30); k < n; ++k) s += toks[rng() % toks.size()];
    run(s, "random " + std::to_string(it) + ": " + s);
  }
  // Deep nesting must fail cleanly (or render), not overflow the stack.
  for (int depth : {50, 500, 5000}) {
    run("{{ " + std::string(size_t(depth), '(') + "1" + std::string(size_t(depth), ')') + " }}", "parens");
    run("{{ " + std::string(size_t(depth), '[') + "1" + std::string(size_t(depth), ']') + " }}", "lists");
    std::string ifs;
    for (int i = 0; i < depth; ++i) ifs += "{% if true %}";
    run(ifs + "x", "unclosed ifs");
    run("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "runaway recursion");
  }
  // No timing assertion (speed is for benchmarks); a hang is caught by the ctest timeout.
  std::printf("  %.2f s\n", std::chrono::duration<double>(Clock::now() - t0).count());
}

namespace {

std::string rand_output(std::mt19937& rng) {
  static const std::vector<std::string> marks = {
      "]<]minimax[>[", "<tool_call>", "</tool_call>", "<invoke name=\"", "<invoke name=\"get_weather\">",
      "</invoke>", "<mm:think>", "</mm:think>", "[e~[", "<location>", "</location>", "<days>", "</days>",
      "<item>", "</item>", "\">", "\n", "3", "Paris", " text ", "<", "]<]", "[>[", "&amp;", "\xe2\x82\xac"};
  std::string s;
  for (int k = 0, n = int(rng() % 40); k < n; ++k)
    s += rng() % 3 ? marks[rng() % marks.size()] : rand_text(rng, 5);
  return s;
}

std::vector<std::string> rand_split(const std::string& s, std::mt19937& rng) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < s.size();) {
    const size_t n = 1 + rng() % 9;
    parts.push_back(s.substr(i, n));
    i += n;
  }
  return parts;
}

const nlohmann::json& weather_tools() {
  static const nlohmann::json t = nlohmann::json::parse(R"([{"type":"function","function":{"name":"get_weather",
    "parameters":{"type":"object","properties":{"location":{"type":"string"},"days":{"type":"integer"}}}}}])");
  return t;
}

}  // namespace

TEST(ServerFuzz, RandomModelOutputThroughParsers) {
  std::mt19937 rng(4242);
  const auto t0 = Clock::now();
  for (int it = 0; it < 10000; ++it) {
    const std::string out = rand_output(rng);
    const auto parts = rand_split(out, rng);
    const bool start = rng() & 1;
    // Reasoning parser: streamed pieces concatenate to the one-shot result.
    {
      chat::ReasoningParser p(chat::ReasoningFormat::MiniMaxM3, start);
      std::string r, c;
      for (auto& piece : parts) {
        auto d = p.feed(piece);
        r += d.reasoning;
        c += d.content;
      }
      auto d = p.finish();
      r += d.reasoning;
      c += d.content;
      auto one = chat::ReasoningParser::parse(chat::ReasoningFormat::MiniMaxM3, start, out);
      EXPECT_EQ(r, one.reasoning.value_or("")) << "iteration " << it;
      EXPECT_EQ(c, one.content.value_or("")) << "iteration " << it;
    }
    // Tool parser: streamed content and calls equal the non-streaming parse; argument fragments
    // of each complete call concatenate to its arguments.
    {
      chat::ToolParser p(chat::ToolFormat::MiniMaxM3, weather_tools());
      std::string content;
      std::map<int, std::string> args, names;
      auto take = [&](const chat::ToolStreamDelta& d) {
        content += d.content;
        for (auto& t : d.tool_calls) {
          if (t.name) names[t.index] = *t.name;
          args[t.index] += t.arguments;
        }
      };
      for (auto& piece : parts) take(p.feed(piece));
      take(p.finish());
      const chat::ToolParseResult one = p.parse(out);
      EXPECT_EQ(content, one.content) << "iteration " << it;
      ASSERT_EQ(p.calls().size(), one.calls.size()) << "iteration " << it;
      for (size_t i = 0; i < one.calls.size(); ++i) {
        EXPECT_EQ(p.calls()[i].name, one.calls[i].name);
        EXPECT_EQ(p.calls()[i].arguments, one.calls[i].arguments) << "iteration " << it;
        EXPECT_EQ(names[int(i)], one.calls[i].name);
        EXPECT_EQ(args[int(i)], one.calls[i].arguments) << "iteration " << it;
        EXPECT_TRUE(nlohmann::json::accept(one.calls[i].arguments)) << one.calls[i].arguments;
      }
      EXPECT_EQ(content.find("]<]minimax[>[<tool_call>"), std::string::npos) << "iteration " << it;
    }
    // The server's whole chain (stop strings, reasoning, tools): random deltas = one shot.
    {
      ChoiceOptions o;
      o.reasoning = chat::ReasoningFormat::MiniMaxM3;
      o.reasoning_start = start;
      o.tool = chat::ToolFormat::MiniMaxM3;
      o.tools = weather_tools();
      if (it % 3 == 0) o.stop = {"Paris"};
      ChoiceState a(nullptr, o), b(nullptr, o);
      for (size_t i = 0; i < parts.size(); ++i) a.on_text(parts[i], false, FinishReason::None);
      a.on_text("", true, FinishReason::Stop);
      b.on_text(out, true, FinishReason::Stop);
      EXPECT_EQ(a.content, b.content) << "iteration " << it;
      EXPECT_EQ(a.reasoning, b.reasoning) << "iteration " << it;
      EXPECT_EQ(a.finish_reason, b.finish_reason);
      ASSERT_EQ(a.tool_calls().size(), b.tool_calls().size()) << "iteration " << it;
      for (size_t i = 0; i < a.tool_calls().size(); ++i)
        EXPECT_EQ(a.tool_calls()[i].arguments, b.tool_calls()[i].arguments);
    }
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "first failing output: " << nlohmann::json(out).dump(-1, ' ', false,
                                                                             nlohmann::json::error_handler_t::replace);
      break;
    }
  }
  // No timing assertion (speed is for benchmarks); a hang is caught by the ctest timeout.
  std::printf("  %.2f s\n", std::chrono::duration<double>(Clock::now() - t0).count());
}
