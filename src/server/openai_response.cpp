// Response JSON for the OpenAI-compatible endpoints (see openai_response.h).
#include "server/openai_response.h"

#include <algorithm>
#include <random>

namespace m3::server {

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  ojson u;
  u["prompt_tokens"] = prompt_tokens;
  u["completion_tokens"] = completion_tokens;
  u["total_tokens"] = prompt_tokens + completion_tokens;
  u["prompt_tokens_details"] = {{"cached_tokens", cached_tokens}};
  return u;
}

ojson chat_message_json(const ChoiceState& c) {
  ojson m;
  m["role"] = "assistant";
  const auto calls = c.tool_calls();
  const bool null_content = c.content.empty() && (!calls.empty() || !c.reasoning.empty());
  m["content"] = null_content ? ojson(nullptr) : ojson(c.content);
  if (c.has_reasoning_parser()) {
    m["reasoning"] = c.reasoning.empty() ? ojson(nullptr) : ojson(c.reasoning);
    m["reasoning_content"] = m["reasoning"];
  }
  ojson tc = ojson::array();
  for (auto& call : calls) {
    ojson t;
    t["id"] = call.id;
    t["type"] = "function";
    t["function"] = {{"name", call.name}, {"arguments", call.arguments}};
    tc.push_back(t);
  }
  m["tool_calls"] = tc;
  return m;
}

ojson chat_delta_json(const ChoiceDelta& d) {
  ojson j = ojson::object();
  if (!d.reasoning.empty()) {
    j["reasoning"] = d.reasoning;
    j["reasoning_content"] = d.reasoning;
  }
  if (!d.content.empty()) j["content"] = d.content;
  if (!d.tool_calls.empty()) {
    ojson arr = ojson::array();
    for (auto& t : d.tool_calls) {
      ojson x;
      x["index"] = t.index;
      if (t.id) {
        x["id"] = *t.id;
        x["type"] = "function";
      }
      ojson f = ojson::object();
      if (t.name) f["name"] = *t.name;
      f["arguments"] = t.arguments;
      x["function"] = f;
      arr.push_back(x);
    }
    j["tool_calls"] = arr;
  }
  return j;
}

namespace {
ojson bytes_array(const std::string& s) {
  ojson a = ojson::array();
  for (unsigned char ch : s) a.push_back(int(ch));
  return a;
}
std::string token_text(const Tokenizer& tok, int32_t id) {
  return tok.is_valid(id) ? tok.token_bytes(id) : std::string();
}
}  // namespace

ojson chat_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps) {
  ojson content = ojson::array();
  for (auto& lp : lps) {
    ojson e;
    const std::string t = token_text(tok, lp.token);
    e["token"] = t;
    e["logprob"] = std::max(lp.logprob, -9999.0f);
    e["bytes"] = bytes_array(t);
    ojson top = ojson::array();
    for (auto& [id, v] : lp.top) {
      const std::string tt = token_text(tok, id);
      top.push_back({{"token", tt}, {"logprob", std::max(v, -9999.0f)}, {"bytes", bytes_array(tt)}});
    }
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return {{"content", content}};
}

ojson completion_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, size_t text_offset) {
  ojson tokens = ojson::array(), tlp = ojson::array(), top = ojson::array(), offs = ojson::array();
  for (auto& lp : lps) {
    const std::string t = token_text(tok, lp.token);
    tokens.push_back(t);
    tlp.push_back(std::max(lp.logprob, -9999.0f));
    // OpenAI / vLLM: the sampled token is always in the dict (up to logprobs + 1 entries). Tokens whose
    // text is the same (byte tokens of partial characters) share a key: the sampled token keeps its own
    // value, else the best-ranked one does.
    ojson m = ojson::object();
    for (auto& [id, v] : lp.top) {
      const std::string k = token_text(tok, id);
      if ((k == t && id != lp.token) || m.contains(k)) continue;
      m[k] = std::max(v, -9999.0f);
    }
    if (!m.contains(t)) m[t] = std::max(lp.logprob, -9999.0f);
    top.push_back(m);
    offs.push_back(text_offset);
    text_offset += t.size();
  }
  ojson j;
  j["text_offset"] = offs;
  j["token_logprobs"] = tlp;
  j["tokens"] = tokens;
  j["top_logprobs"] = top;
  return j;
}

std::string make_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 32; ++i) s += hex[rng() & 15];
  return s;
}

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace); }

}  // namespace m3::server