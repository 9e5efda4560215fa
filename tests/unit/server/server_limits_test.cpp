// Issue 47's parse-level guards, without a server: the JSON nesting limit (60,000 levels crashed the
// server), the template conversion's limit (40,000 levels inside messages), and the per-request limits
// (each violation a 400 that names its field).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "chat/chat_template.h"
#include "chat/jinja/jinja.h"
#include "chat/json_depth.h"
#include "base/error.h"
#include "server/errors.h"
#include "server/request_limits.h"

using namespace m3;
using ojson = nlohmann::ordered_json;

namespace {

std::string brackets(int n) { return std::string(size_t(n), '[') + "1" + std::string(size_t(n), ']'); }

// Built with moves only: nesting by copy would recurse (and take quadratic time) in the test itself.
ojson nested(int n) {
  ojson v = "x";
  for (int i = 0; i < n; ++i) {
    ojson a = ojson::array();
    a.push_back(std::move(v));
    v = std::move(a);
  }
  return v;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST(JsonDepth, RefusesDeepDocumentsWhileParsing) {
  EXPECT_NO_THROW(chat::parse_json_limited(brackets(chat::kMaxJsonDepth)));
  EXPECT_THROW(chat::parse_json_limited(brackets(chat::kMaxJsonDepth + 1)), chat::JsonTooDeep);
  EXPECT_THROW(chat::parse_json_limited(brackets(60000)), chat::JsonTooDeep);
  EXPECT_THROW(chat::parse_json_limited("{\"a\": " + brackets(60000) + "}"), chat::JsonTooDeep);
  EXPECT_THROW(chat::parse_json_limited("[[[[1]"), nlohmann::json::parse_error);
  EXPECT_TRUE(chat::parse_json_limited_or_discarded(brackets(60000)).is_discarded());
  EXPECT_TRUE(chat::parse_json_limited_or_discarded("{").is_discarded());
  EXPECT_EQ(chat::parse_json_limited("{\"a\":[1,{\"b\":2}]}").dump(), "{\"a\":[1,{\"b\":2}]}");
}

TEST(JsonDepth, TemplateConversionStopsAtItsLimit) {
  EXPECT_NO_THROW(jinja::Value::from_json(nested(jinja::Value::kMaxJsonDepth)));
  EXPECT_THROW(jinja::Value::from_json(nested(jinja::Value::kMaxJsonDepth + 1)), Error);
  const chat::ChatTemplate t(read_file(std::string(M3_TEST_DATA) + "/chat/MiniMax-M3.jinja"));
  ojson msgs = ojson::array();
  ojson m;
  m["role"] = "user";
  m["content"] = nested(40000);  // the issue's 40,000 levels: refused before any recursive copy
  msgs.push_back(std::move(m));
  try {
    t.render(msgs, nullptr, true, ojson::object(), "<s>", "</s>");
    ADD_FAILURE() << "deep messages rendered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("messages nests deeper than"), std::string::npos) << e.what();
  }
  // Tool-call arguments given as a JSON string are decoded with the limit: a deep one stays a string
  // (which the M3 template then refuses by name: it iterates over the arguments' items).
  ojson tc = ojson::parse(R"([{"role":"user","content":"x"},{"role":"assistant","content":"","tool_calls":[
      {"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}])");
  tc[1]["tool_calls"][0]["function"]["arguments"] = brackets(100000);
  EXPECT_THROW(t.render(tc, nullptr, true, ojson::object(), "<s>", "</s>"), Error);
}

TEST(RequestLimits, EachLimitNamesItsField) {
  server::RequestLimits lim;
  lim.max_prompts = 4;
  lim.max_choices = 8;
  lim.max_tokens = 1000;
  lim.max_stop = 3;
  lim.max_stop_bytes = 10;
  lim.max_logprobs = 500;
  auto param_of = [&](const server::ParsedRequest& r) -> std::string {
    try {
      server::check_request_limits(r, lim);
      return "ok";
    } catch (const server::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(std::string(e.what()).find("--max-"), std::string::npos) << "names its flag: " << e.what();
      return e.param;
    }
  };
  server::ParsedRequest r;
  r.chat = false;
  r.prompts = {{1, 2}};
  r.n = 1;
  r.params.max_tokens = 10;
  EXPECT_EQ(param_of(r), "ok");
  auto p = r;
  p.prompts.assign(5, {1});
  EXPECT_EQ(param_of(p), "prompt");
  p = r;
  p.n = 9;
  EXPECT_EQ(param_of(p), "n");
  p = r;
  p.n = 4;
  p.params.max_tokens = 251;  // 4 x 251 > 1000
  EXPECT_EQ(param_of(p), "max_tokens");
  p = r;
  p.params.stop = {"a", "b", "c", "d"};
  EXPECT_EQ(param_of(p), "stop");
  p = r;
  p.params.stop = {"0123456789a"};
  EXPECT_EQ(param_of(p), "stop");
  p = r;
  p.params.stop_token_ids = {1, 2, 3, 4};
  EXPECT_EQ(param_of(p), "stop_token_ids");
  p = r;
  p.logprobs = true;
  p.top_logprobs = 50;  // 10 x 51 > 500
  EXPECT_EQ(param_of(p), "logprobs");
  p.chat = true;
  EXPECT_EQ(param_of(p), "top_logprobs");
  p.top_logprobs = 20;  // 10 x 21 <= 500
  EXPECT_EQ(param_of(p), "ok");
  // Products that would overflow 64 bits are still compared exactly.
  p = r;
  p.n = 8;
  p.params.max_tokens = 1 << 30;
  p.logprobs = true;
  p.top_logprobs = 20;
  lim.max_tokens = int64_t(1) << 62;
  EXPECT_EQ(param_of(p), "logprobs");
}
