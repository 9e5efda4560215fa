// The request-field table (see request_fields.h). Each refused field carries the test for its default
// value: clients and SDKs often send defaults explicitly, and those ask for nothing we lack.
#include "server/request_fields.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>

namespace m3::server {

namespace {

using ojson = nlohmann::ordered_json;

constexpr unsigned kChat = 1, kCompletion = 2, kOffline = 4, kServer = kChat | kCompletion, kAll = 7;

unsigned bit(Endpoint ep) {
  switch (ep) {
    case Endpoint::Chat: return kChat;
    case Endpoint::Completion: return kCompletion;
    default: return kOffline;
  }
}

bool is_null(const ojson& v) { return v.is_null(); }
bool null_or_empty(const ojson& v) {
  return v.is_null() || ((v.is_object() || v.is_array() || v.is_string()) && v.empty());
}
bool null_or_false(const ojson& v) { return v.is_null() || (v.is_boolean() && !v.get<bool>()); }
bool null_or_true(const ojson& v) { return v.is_null() || (v.is_boolean() && v.get<bool>()); }
bool null_or_zero(const ojson& v) { return v.is_null() || (v.is_number() && v.get<double>() == 0.0); }
bool null_or_one(const ojson& v) { return v.is_null() || (v.is_number() && v.get<double>() == 1.0); }
bool text_modalities(const ojson& v) {
  if (v.is_null()) return true;
  if (!v.is_array()) return false;
  return std::all_of(v.begin(), v.end(), [](const ojson& m) { return m.is_string() && m.get<std::string>() == "text"; });
}
bool standard_tier(const ojson& v) {
  return v.is_null() || (v.is_string() && (v.get<std::string>() == "auto" || v.get<std::string>() == "default"));
}

struct Rule {
  const char* name;
  unsigned endpoints;
  bool (*is_default)(const ojson&);
  const char* what;      // what the field asks for, in a few words
  const char* instead;   // the value that is accepted (its default), for the message
};

// Fields vLLM or OpenAI define that this build does not implement. Later issues that implement one
// remove it from here. Structured outputs (src/structured) are served by the HTTP endpoints and by
// `generate --input`; only their whitespace pattern and structural tags are refused.
const Rule kRefused[] = {
    {"min_tokens", kAll, null_or_zero, "a minimum output length", "0"},
    {"prompt_logprobs", kAll, is_null, "log-probabilities of the prompt tokens", "null"},
    {"guided_whitespace_pattern", kAll, is_null, "constrained decoding", "null"},
    {"structural_tag", kAll, is_null, "structural-tag constrained decoding", "null"},
    {"use_beam_search", kAll, null_or_false, "beam search", "false"},
    {"length_penalty", kAll, null_or_one, "a beam-search length penalty", "1.0"},
    {"bad_words", kAll, null_or_empty, "banned words", "[]"},
    {"allowed_token_ids", kAll, null_or_empty, "a restricted vocabulary", "null"},
    {"truncate_prompt_tokens", kAll, is_null, "prompt truncation", "null"},
    {"logits_processors", kAll, null_or_empty, "custom logits processors", "null"},
    {"spaces_between_special_tokens", kAll, null_or_true, "detokenisation without spaces between special tokens",
     "true"},
    {"return_tokens_as_token_ids", kServer, null_or_false, "tokens rendered as token ids", "false"},
    {"return_token_ids", kServer, null_or_false, "token ids in the response", "false"},
    {"priority", kServer, null_or_zero, "priority scheduling", "0"},
    {"request_id", kServer, is_null, "a caller-chosen request id", "null"},
    {"cache_salt", kServer, is_null, "a prefix-cache salt", "null"},
    {"vllm_xargs", kServer, null_or_empty, "extra arguments for custom extensions", "null"},
    {"mm_processor_kwargs", kChat, null_or_empty, "multimodal processor options", "null"},
    {"media_io_kwargs", kChat, null_or_empty, "media loading options", "null"},
    {"chat_template", kChat, is_null, "a per-request chat template (the server's template is used)", "null"},
    {"documents", kChat, null_or_empty, "documents for the chat template", "null"},
    {"continue_final_message", kChat, null_or_false, "continuing the final message", "false"},
    {"include_reasoning", kChat, null_or_true, "dropping the reasoning from the response", "true"},
    {"echo", kChat, null_or_false, "echoing the last message (chat)", "false"},
    {"best_of", kChat, null_or_one, "best-of-n sampling", "1"},
    {"functions", kChat, null_or_empty, "the deprecated functions API (use tools)", "null"},
    {"function_call", kChat, is_null, "the deprecated functions API (use tool_choice)", "null"},
    {"audio", kChat, is_null, "audio output", "null"},
    {"modalities", kChat, text_modalities, "output modalities other than text", "[\"text\"]"},
    {"prediction", kChat, is_null, "predicted outputs", "null"},
    {"web_search_options", kChat, is_null, "web search", "null"},
    {"store", kChat, null_or_false, "stored completions", "false"},
    {"verbosity", kChat, is_null, "a verbosity setting", "null"},
    {"service_tier", kServer, standard_tier, "a service tier", "\"auto\""},
    {"prompt_embeds", kCompletion, is_null, "prompt embeddings", "null"},
    {"thinking_token_budget", kCompletion | kOffline, is_null,
     "a reasoning budget (it needs the chat template's think block: use /v1/chat/completions)", "null"},
    {"n", kOffline, null_or_one, "several samples per line (write one line per sample)", "1"},
    {"include_stop_str_in_output", kOffline, null_or_false, "stop strings kept in the text", "false"},
    {"skip_special_tokens", kOffline, null_or_true, "special tokens in the text", "true"},
};

// Fields each endpoint honours (the refused ones above are known too).
const char* const kChatFields[] = {
    "kv_transfer_params",  // read by read_kv_transfer_params (openai_request.cpp), against the server's kv_role
    "messages", "model", "frequency_penalty", "presence_penalty", "repetition_penalty", "temperature", "top_p",
    "top_k", "min_p", "seed", "stop", "stop_token_ids", "logit_bias", "ignore_eos", "include_stop_str_in_output",
    "skip_special_tokens", "n", "stream", "stream_options", "max_tokens", "max_completion_tokens", "logprobs",
    "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "reasoning_effort",
    "add_generation_prompt", "separate_reasoning", "thinking_token_budget", "add_special_tokens", "user", "metadata",
    "prompt_cache_key",
    "safety_identifier", "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "guided_decoding_backend"};
const char* const kCompletionFields[] = {
    "kv_transfer_params",
    "model", "prompt", "frequency_penalty", "presence_penalty", "repetition_penalty", "temperature", "top_p",
    "top_k", "min_p", "seed", "stop", "stop_token_ids", "logit_bias", "ignore_eos", "include_stop_str_in_output",
    "skip_special_tokens", "n", "best_of", "stream", "stream_options", "max_tokens", "logprobs", "echo", "suffix",
    "add_special_tokens", "user", "response_format", "structured_outputs", "guided_json", "guided_regex",
    "guided_choice", "guided_grammar", "guided_decoding_backend"};

template <size_t N>
bool listed(const char* const (&names)[N], const std::string& k) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return k == n; });
}

}  // namespace

std::optional<RefusedField> refused_field(const ojson& body, Endpoint ep) {
  if (!body.is_object()) return std::nullopt;
  const unsigned b = bit(ep);
  for (auto it = body.begin(); it != body.end(); ++it) {
    for (const Rule& r : kRefused) {
      if (!(r.endpoints & b) || it.key() != r.name || r.is_default(it.value())) continue;
      return RefusedField{r.name, std::string("'") + r.name + "' asks for " + r.what +
                                      ", which this server does not support yet; leave it out (or send " + r.instead +
                                      ")"};
    }
  }
  return std::nullopt;
}

bool is_refused_field_name(const std::string& name, Endpoint ep) {
  const unsigned b = bit(ep);
  return std::any_of(std::begin(kRefused), std::end(kRefused),
                     [&](const Rule& r) { return (r.endpoints & b) && name == r.name; });
}

std::vector<std::string> unknown_fields(const ojson& body, Endpoint ep) {
  std::vector<std::string> out;
  if (!body.is_object() || ep == Endpoint::Offline) return out;
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    const bool known =
        (ep == Endpoint::Chat ? listed(kChatFields, k) : listed(kCompletionFields, k)) || is_refused_field_name(k, ep);
    if (!known) out.push_back(k);
  }
  return out;
}

void warn_unknown_fields(const std::vector<std::string>& names, const char* endpoint) {
  static std::mutex mu;
  static std::set<std::string> seen;
  static bool capped = false;
  constexpr size_t kMaxNames = 64;
  std::lock_guard lk(mu);
  for (const std::string& n : names) {
    if (seen.count(n)) continue;
    if (seen.size() >= kMaxNames) {
      if (!capped)
        std::fprintf(stderr, "[m3serve] warning: more unknown request fields were ignored; no longer logging them\n");
      capped = true;
      return;
    }
    seen.insert(n);
    std::string shown = n.size() > 64 ? n.substr(0, 64) + "..." : n;
    for (char& c : shown)
      if (static_cast<unsigned char>(c) < 0x20) c = '?';
    std::fprintf(stderr, "[m3serve] warning: %s: ignored the request field '%s' (neither vLLM nor OpenAI defines it)\n",
                 endpoint, shown.c_str());
  }
}

}  // namespace m3::server
