// Request validation for the OpenAI-compatible endpoints (see openai_request.h).
#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "base/error.h"
#include "chat/json_depth.h"
#include "server/errors.h"
#include "server/openai_response.h"
#include "server/request_fields.h"
#include "server/sampling_fields.h"
#include "structured/matcher.h"
#include "structured/tool_grammar.h"

namespace m3::server {

namespace {

const ojson* field(const ojson& b, const char* key) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return nullptr;
  return &*it;
}

const FieldStyle kApi;

std::optional<int64_t> opt_int(const ojson& b, const char* key) {
  const ojson* v = field(b, key);
  if (!v) return std::nullopt;
  return read_integer(key, *v, kApi);
}

// Refuses fields that ask for what this build does not implement; logs unknown ones once.
void check_fields(const ojson& body, Endpoint ep, const char* endpoint) {
  if (auto r = refused_field(body, ep)) throw bad_request(r->message, r->name);
  if (auto u = unknown_fields(body, ep); !u.empty()) warn_unknown_fields(u, endpoint);
}

std::optional<bool> opt_bool(const ojson& b, const char* key) {
  const ojson* v = field(b, key);
  if (!v) return std::nullopt;
  return read_bool(key, *v, kApi);
}

std::optional<std::string> opt_str(const ojson& b, const char* key) {
  const ojson* v = field(b, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw bad_request(std::string("'") + key + "' must be a string", key);
  return v->get<std::string>();
}

const ojson* opt_obj(const ojson& b, const char* key) {
  const ojson* v = field(b, key);
  if (v && !v->is_object()) throw bad_request(std::string("'") + key + "' must be an object", key);
  return v;
}

// The structured-output field of the body, for `param`.
std::string structured_field(const ojson& b) {
  for (const char* k : {"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                        "guided_grammar", "guided_whitespace_pattern", "structural_tag"})
    if (field(b, k)) return k;
  return "response_format";
}

// Sampling fields shared by both endpoints.
void parse_sampling(const ojson& b, const ServerContext& ctx, ParsedRequest& r) {
  SamplingParams& p = r.params;
  // Defaults from generation_config.json (vLLM's behaviour), else OpenAI's.
  p.temperature = ctx.default_temperature;
  p.top_p = ctx.default_top_p;
  p.top_k = ctx.default_top_k;
  p.min_p = ctx.default_min_p;
  p.repetition_penalty = ctx.default_repetition_penalty;
  for (const std::string& k : sampling_field_names()) {
    if (const ojson* v = field(b, k.c_str())) read_sampling_field(k, *v, p, kApi);
    // The numbers' ranges are checked before seed and the stop fields are read.
    if (k == "repetition_penalty") check_sampling_ranges(p);
  }
  check_token_ids_in_vocab(p, ctx.vocab, kApi);
  const int64_t n = opt_int(b, "n").value_or(1);
  if (n < 1 || n > 128) throw bad_request("'n' must be in [1, 128]", "n");
  r.n = int(n);
  r.stream = opt_bool(b, "stream").value_or(false);
  if (const ojson* so = opt_obj(b, "stream_options")) {
    if (!r.stream) throw bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    r.include_usage = opt_bool(*so, "include_usage").value_or(false);
    // As vLLM: usage in every chunk only together with include_usage.
    r.continuous_usage = r.include_usage && opt_bool(*so, "continuous_usage_stats").value_or(false);
  }
  r.choice.skip_special = opt_bool(b, "skip_special_tokens").value_or(true);
  r.choice.include_stop_str = opt_bool(b, "include_stop_str_in_output").value_or(false);
  r.choice.stop = p.stop;
  try {
    r.structured = structured::structured_from_request(b);
  } catch (const structured::StructuredError& e) {
    throw bad_request(e.what(), structured_field(b));
  }
}

// The grammar of response_format / structured_outputs / guided_* as this request's constraint; it
// applies after the reasoning end tag when the prompt opened reasoning.
void attach_constraint(const ojson& b, const ServerContext& ctx, ParsedRequest& r, bool reasoning_start) {
  if (!r.structured) return;
  if (!r.choice.forced_tool_text.empty() || r.params.constraint)
    throw bad_request("'" + r.structured->field + "' cannot be combined with tool_choice required or a named function",
                      structured_field(b));
  std::string after;
  if (reasoning_start && ctx.reasoning)
    after = *ctx.reasoning == chat::ReasoningFormat::MiniMaxM3 ? "</mm:think>" : "</think>";
  try {
    r.params.constraint = structured::make_constraint(r.structured->grammar, structured::TokenVocab::shared(*ctx.tok, ctx.vocab),
                                                      *ctx.tok, r.params.stop_token_ids, after, r.structured->kind);
  } catch (const structured::StructuredError& e) {
    throw bad_request(e.what(), structured_field(b));
  }
}

// thinking_token_budget (vLLM's field; the Messages API's thinking.budget_tokens): at most that many
// tokens of reasoning, then the end tag is forced (a constraint: exact with speculation too, and
// composed with a response_format grammar that applies after the tag). It needs a block the prompt
// opened (thinking_mode enabled); where the prompt closed it (disabled, or a forced minimax_m2 call) there
// is no reasoning to bound; where the model may open one itself (adaptive) it cannot be counted here,
// so the field is refused.
void read_thinking_budget(const ojson& b, const ServerContext& ctx, ParsedRequest& r, const std::string& prompt,
                          bool prompt_opened, bool reasoning_start) {
  const std::optional<int64_t> budget = opt_int(b, "thinking_token_budget");
  if (!budget) return;
  if (*budget < 0) throw bad_request("'thinking_token_budget' must be 0 or more", "thinking_token_budget");
  if (!ctx.reasoning)
    throw bad_request("'thinking_token_budget' needs a reasoning parser (serve --reasoning-parser)",
                      "thinking_token_budget");
  const std::string close = chat::ReasoningParser::tags(*ctx.reasoning).second;
  if (!prompt_opened && !chat::ReasoningParser::prompt_ends_reasoning(*ctx.reasoning, prompt))
    throw bad_request("'thinking_token_budget' needs a prompt that opens the reasoning (chat_template_kwargs "
                      "{\"thinking_mode\": \"enabled\"}): the model's own think block cannot be counted",
                      "thinking_token_budget");
  if (!reasoning_start) return;  // no reasoning in this reply: the budget holds
  try {
    r.params.constraint = structured::with_reasoning_budget(
        r.params.constraint, structured::TokenVocab::shared(*ctx.tok, ctx.vocab), *ctx.tok, close, *budget);
  } catch (const structured::StructuredError& e) {
    throw bad_request(e.what(), "thinking_token_budget");
  }
}

// max_tokens against the context window, then the engine's own checks.
void finish_limits(const ojson& b, const ServerContext& ctx, ParsedRequest& r, int64_t default_max) {
  std::optional<int64_t> mt = opt_int(b, "max_completion_tokens");
  const char* mt_name = "max_completion_tokens";
  if (!mt) {
    mt = opt_int(b, "max_tokens");
    mt_name = "max_tokens";
  }
  if (mt && *mt < 1) throw bad_request(std::string("'") + mt_name + "' must be at least 1", mt_name);
  int64_t longest = 0;
  for (auto& p : r.prompts) {
    if (p.empty()) throw bad_request("the prompt is empty", r.chat ? "messages" : "prompt");
    for (int32_t id : p)
      if (id < 0 || (ctx.vocab > 0 && id >= ctx.vocab))
        throw bad_request("token id " + std::to_string(id) + " is outside the vocabulary", "prompt");
    longest = std::max<int64_t>(longest, int64_t(p.size()));
  }
  if (ctx.max_model_len > 0 && longest >= ctx.max_model_len)
    throw bad_request("This model's maximum context length is " + std::to_string(ctx.max_model_len) +
                          " tokens. However, your request has " + std::to_string(longest) +
                          " input tokens. Please reduce the length of the input messages.",
                      r.chat ? "messages" : "prompt");
  // Compared as max_model_len - longest (>= 1 here): longest + max_tokens could overflow.
  if (mt && ctx.max_model_len > 0 && *mt > ctx.max_model_len - longest)
    throw bad_request("This model's maximum context length is " + std::to_string(ctx.max_model_len) +
                          " tokens. However, you requested more: " + std::to_string(longest) + " + " +
                          std::to_string(*mt) + " tokens (" +
                          std::to_string(longest) + " in the messages, " + std::to_string(*mt) +
                          " in the completion). Please reduce the length of the messages or completion.",
                      mt_name);
  int64_t max_tokens = mt ? *mt : default_max;
  if (ctx.max_model_len > 0) max_tokens = std::min<int64_t>(max_tokens, ctx.max_model_len - longest);
  r.params.max_tokens = int(std::clamp<int64_t>(max_tokens, 1, 1 << 30));
  r.params.logprobs = r.logprobs ? r.top_logprobs : -1;
  try {
    r.params.validate();
  } catch (const Error& e) {
    throw bad_request(e.what());
  }
}

}  // namespace

ForcedToolPrefix forced_tool_prefix(chat::ToolFormat fmt, const std::string& name, bool close_think) {
  ForcedToolPrefix p;
  std::string think_close;
  if (fmt == chat::ToolFormat::MiniMaxM3) {
    const std::string ns = "]<]minimax[>[";
    p.parser_text = ns + "<tool_call>\n" + ns + "<invoke name=\"";
    think_close = "</mm:think>";
  } else {
    p.parser_text = "<minimax:tool_call>\n<invoke name=\"";
    think_close = "</think>\n";
  }
  if (!name.empty()) p.parser_text += name + "\">";
  p.prompt_suffix = (close_think ? think_close : std::string()) + p.parser_text;
  return p;
}

std::string check_model(const ojson& body, const ServerContext& ctx) {
  auto m = opt_str(body, "model");
  if (!m) return ctx.served_names.front();
  for (auto& n : ctx.served_names)
    if (n == *m) return *m;
  throw ApiError(404, "The model `" + *m + "` does not exist.", "model");
}

namespace {

// Content parts of message i: text, and image_url parts when `images` collects them (the chat endpoint
// with a vision tower). Other image kinds, audio, video and file parts are refused by name (never
// dropped: the model would answer about an image it never saw).
void check_content_parts(const ojson& parts, size_t i, const ServerContext& ctx, std::vector<ImageInput>* images,
                         const std::vector<std::string>* image_names) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  for (size_t j = 0; j < parts.size(); ++j) {
    const ojson& p = parts[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      throw bad_request(at + ": each content part must be an object with a string 'type' (got " +
                            std::string(p.type_name()) + ")",
                        "messages");
    const std::string t = p["type"].get<std::string>();
    if (t == "text") {
      if (!p.contains("text") || !p["text"].is_string())
        throw bad_request(at + ": a text part needs a string 'text'", "messages");
      continue;
    }
    if (t == "image_url" && images) {
      // A translated body (Responses, Messages) names the part as its client wrote it.
      const std::string name = image_names && images->size() < image_names->size() ? (*image_names)[images->size()]
                                                                                  : where + "[" + std::to_string(j) + "]";
      if (ctx.media.language_model_only)
        throw bad_request(name + ": image input is disabled on this server (--language-model-only)", "messages");
      if (!ctx.images)
        throw bad_request(name + ": this model has no vision tower; image parts cannot be served", "messages");
      auto u = p.find("image_url");
      std::string url;
      if (u != p.end() && u->is_string()) {
        url = u->get<std::string>();
      } else if (u != p.end() && u->is_object() && u->contains("url") && (*u)["url"].is_string()) {
        url = (*u)["url"].get<std::string>();
        for (auto it = u->begin(); it != u->end(); ++it) {
          if (it.key() == "url") continue;
          // OpenAI's detail picks a resolution tier; M3's processor has one, so only "auto" is honoured.
          if (it.key() == "detail" && it.value().is_string() && it.value().get<std::string>() == "auto") continue;
          throw bad_request(name + ".image_url: '" + it.key() + "' is not supported (only url, and detail \"auto\")",
                            "messages");
        }
      } else {
        throw bad_request(name + ": an image_url part needs 'image_url': {\"url\": \"data:image/...;base64,...\"}",
                          "messages");
      }
      images->push_back({name, url});
      continue;
    }
    if (t == "video_url" && images) {
      // vLLM's video_url part: the same URL schemes and limits as image_url, decoded as a video.
      if (ctx.media.language_model_only)
        throw bad_request(at + ": video input is disabled on this server (--language-model-only)", "messages");
      if (!ctx.images)
        throw bad_request(at + ": content part type 'video_url' is not supported: this model has no vision tower",
                          "messages");
      auto u = p.find("video_url");
      std::string url;
      if (u != p.end() && u->is_string()) {
        url = u->get<std::string>();
      } else if (u != p.end() && u->is_object() && u->contains("url") && (*u)["url"].is_string()) {
        url = (*u)["url"].get<std::string>();
        for (auto it = u->begin(); it != u->end(); ++it)
          if (it.key() != "url")
            throw bad_request(at + ".video_url: '" + it.key() + "' is not supported (only url)", "messages");
      } else {
        throw bad_request(at + ": a video_url part needs 'video_url': {\"url\": \"data:video/mp4;base64,...\"}",
                          "messages");
      }
      images->push_back({at, url, true});
      continue;
    }
    const char* kind = nullptr;
    for (const char* x : {"image_url", "image", "input_image", "image_pil", "image_embeds"})
      if (t == x) kind = "image";
    for (const char* x : {"audio_url", "input_audio", "audio", "audio_embeds"})
      if (t == x) kind = "audio";
    for (const char* x : {"video_url", "video"})
      if (t == x) kind = "video";
    for (const char* x : {"file", "input_file"})
      if (t == x) kind = "file";
    if (kind)
      throw bad_request(at + ": content part type '" + t + "' (" + kind + " input) is not supported by this " +
                            (images && std::string(kind) == "image"   ? "server (images: send image_url parts)"
                             : images && std::string(kind) == "video" ? "server (videos: send video_url parts)"
                                                                      : "server yet; send text parts only"),
                        "messages");
    throw bad_request(at + ": unknown content part type '" + t + "' (supported: text" +
                          (images ? ", image_url, video_url" : "") + ")",
                      "messages");
  }
}

// An assistant turn's tool_calls as vLLM takes them back in history: a list of {"id", "type":
// "function", "function": {"name", "arguments"}} whose arguments are a JSON object or a string holding
// one. Checked here so a malformed call is refused naming its field, not by the template's error.
void check_history_tool_calls(const ojson& m, size_t i) {
  auto tc = m.find("tool_calls");
  if (tc == m.end() || tc->is_null()) return;
  const std::string where = "messages[" + std::to_string(i) + "].tool_calls";
  if (!tc->is_array()) throw bad_request(where + " must be a list (got " + std::string(tc->type_name()) + ")", "messages");
  for (size_t j = 0; j < tc->size(); ++j) {
    const ojson& call = (*tc)[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    if (!call.is_object()) throw bad_request(at + " must be an object", "messages");
    // The template also takes the call's name and arguments at the top level (no "function").
    const bool nested = call.contains("function");
    const ojson& fn = nested ? call["function"] : call;
    const std::string fw = at + (nested ? ".function" : "");
    if (!fn.is_object() || !fn.contains("name"))
      throw bad_request(at + " needs 'function': {\"name\": ..., \"arguments\": ...}", "messages");
    if (!fn["name"].is_string() || fn["name"].get<std::string>().empty())
      throw bad_request(fw + ".name must be a non-empty string", "messages");
    auto args = fn.find("arguments");
    if (args == fn.end() || args->is_null())
      throw bad_request(fw + ".arguments is required (a JSON object, or a string holding one: \"{}\" for none)",
                        "messages");
    if (args->is_object()) continue;
    bool ok = false;
    if (args->is_string()) {
      const ojson parsed = chat::parse_json_limited_or_discarded<ojson>(args->get<std::string>());
      ok = !parsed.is_discarded() && parsed.is_object();
    }
    if (!ok)
      throw bad_request(fw + ".arguments must be a JSON object or a string holding one (got " +
                            (args->is_string() ? std::string("a string that is not a JSON object")
                                               : std::string(args->type_name())) +
                            ")",
                        "messages");
  }
}

// The M3 template's image marker (model.md 8): one per image, expanded after rendering.
const std::string kImageMarker = "]<]image[>[";
// And its video marker: one per video, expanded per temporal group (tokenize_chat).
const std::string kVideoMarker = "]<]video[>[";

}  // namespace

std::string render_messages(const ojson& body, const ServerContext& ctx, bool default_add_generation_prompt,
                            std::vector<ImageInput>* images, const std::vector<std::string>* image_names) {
  const ojson* msgs = field(body, "messages");
  if (!msgs) throw bad_request("'messages' is required", "messages");
  if (!msgs->is_array() || msgs->empty()) throw bad_request("'messages' must be a non-empty list", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& m = (*msgs)[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw bad_request("each message must be an object with a string 'role'", "messages");
    auto c = m.find("content");
    if (c != m.end() && !(c->is_null() || c->is_string() || c->is_array()))
      throw bad_request("message 'content' must be a string or a list of content parts", "messages");
    if (c != m.end() && c->is_array()) check_content_parts(*c, i, ctx, images, image_names);
    check_history_tool_calls(m, i);
    for (const char* k : {"reasoning", "reasoning_content"})
      if (m.contains(k) && !(m[k].is_null() || m[k].is_string()))
        throw bad_request("messages[" + std::to_string(i) + "]." + k + " must be a string (got " +
                              std::string(m[k].type_name()) + ")",
                          "messages");
  }
  // An assistant turn's reasoning comes back as `reasoning` (what this server returns first) or as
  // `reasoning_content`; the template reads the latter, so both names carry it (as vLLM does).
  ojson rewritten;
  auto rewrite = [&]() -> ojson& {
    if (msgs != &rewritten) {
      rewritten = *msgs;
      msgs = &rewritten;
    }
    return rewritten;
  };
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& m = (*msgs)[i];
    const bool has_reasoning = m.contains("reasoning") && m["reasoning"].is_string();
    const bool has_content = m.contains("reasoning_content") && m["reasoning_content"].is_string();
    if (has_reasoning && !has_content) rewrite()[i]["reasoning_content"] = m["reasoning"];
  }
  // The template renders a {"type": "image"} part as the image marker (vLLM hands it image parts that way).
  if (images && !images->empty()) {
    const int64_t n_video = std::count_if(images->begin(), images->end(), [](const ImageInput& in) { return in.video; });
    const int64_t n_image = int64_t(images->size()) - n_video;
    if (n_video > ctx.media.limit_video)
      throw bad_request(std::to_string(n_video) + " videos in the prompt; this server takes at most " +
                            std::to_string(ctx.media.limit_video) + " per prompt (--limit-mm-per-prompt {\"video\": " +
                            std::to_string(ctx.media.limit_video) + "})",
                        "messages");
    if (n_image > ctx.media.limit_image)
      throw bad_request(std::to_string(n_image) + " images in the prompt; this server takes at most " +
                            std::to_string(ctx.media.limit_image) + " per prompt (--limit-mm-per-prompt {\"image\": " +
                            std::to_string(ctx.media.limit_image) + "})",
                        "messages");
    for (auto& m : rewrite()) {
      auto c = m.find("content");
      if (c == m.end() || !c->is_array()) continue;
      for (auto& p : *c)
        if (p["type"] == "image_url") p = ojson{{"type", "image"}};
        else if (p["type"] == "video_url") p = ojson{{"type", "video"}};
    }
  }
  ojson tools = nullptr;
  if (const ojson* t = field(body, "tools")) {
    if (!t->is_array()) throw bad_request("'tools' must be a list", "tools");
    for (size_t i = 0; i < t->size(); ++i) {
      const ojson& tool = (*t)[i];
      if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object() ||
          !tool["function"].contains("name") || !tool["function"]["name"].is_string())
        throw bad_request("each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tools");
      auto params = tool["function"].find("parameters");
      if (params != tool["function"].end() && !params->is_null() && !params->is_object())
        throw bad_request("tools[" + std::to_string(i) + "].function.parameters must be a JSON Schema object (got " +
                              std::string(params->type_name()) + ")",
                          "tools");
    }
    if (!t->empty()) tools = *t;
  }
  ojson kwargs = ojson::object();
  if (const ojson* k = opt_obj(body, "chat_template_kwargs")) kwargs = *k;
  if (auto eff = opt_str(body, "reasoning_effort"))
    if (!kwargs.contains("reasoning_effort")) kwargs["reasoning_effort"] = *eff;
  const bool agp = opt_bool(body, "add_generation_prompt").value_or(default_add_generation_prompt);
  if (!ctx.chat_template)
    throw bad_request("this model has no chat template (add chat_template.jinja or pass --chat-template)", "messages");
  try {
    return ctx.chat_template->render(*msgs, tools, agp, kwargs, ctx.bos_token, ctx.eos_token);
  } catch (const std::exception& e) {
    throw bad_request(std::string("chat template: ") + e.what(), "messages");
  }
}

ChatTokens tokenize_chat(const std::string& text, const std::vector<ImageInput>& images, const ServerContext& ctx,
                         bool embed) {
  ChatTokens out;
  // Every piece of the rendered prompt is the template's output, so special tokens in it (role markers,
  // end of turn) are parsed as such in the text after an image too, as in the prompt without images.
  auto encode = [&](const std::string& t) {
    try {
      const auto ids = ctx.tok->encode(t, true);
      out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    } catch (const std::exception& e) {
      throw bad_request(std::string("cannot tokenize the prompt: ") + e.what(), "messages");
    }
  };
  if (images.empty()) {
    encode(text);
    return out;
  }
  // The text between markers is tokenized piece by piece: the marker is a special token, which splits
  // the text the same way before the BPE. Each marker becomes [start] + N x image token + [end]
  // (model.md 8), N the image's merged patches; start/end only where the tokenizer has them.
  const VisionConfig& vc = ctx.images->config();
  const auto start_id = ctx.tok->token_to_id("]<]start of image[>[");
  const auto end_id = ctx.tok->token_to_id("]<]end of image[>[");
  size_t pos = 0, k = 0;
  for (;;) {
    const size_t at_image = text.find(kImageMarker, pos), at_video = text.find(kVideoMarker, pos);
    const size_t at = std::min(at_image, at_video);
    if (at == std::string::npos) break;
    const bool is_video = at_video < at_image;
    if (k == images.size())
      throw bad_request("messages: the prompt holds more image/video markers (" + kImageMarker + ", " + kVideoMarker +
                            ") than image and video parts (" + std::to_string(images.size()) +
                            "); text may not contain the markers",
                        "messages");
    const ImageInput& in = images[k];
    if (in.video != is_video)
      throw bad_request("messages: the chat template rendered " + std::string(is_video ? "a video" : "an image") +
                            " marker where " + in.where + " is " + (in.video ? "a video" : "an image") +
                            " (text may not contain the markers)",
                        "messages");
    encode(text.substr(pos, at - pos));
    const std::vector<uint8_t> bytes = load_image_bytes(in, ctx.media);
    EncodedImage e;
    try {
      e = is_video ? ctx.images->encode_video(bytes.data(), bytes.size(), ctx.media.decode, embed)
                   : ctx.images->encode(bytes.data(), bytes.size(), ctx.media.decode, embed);
    } catch (const Error& err) {
      throw bad_request(in.where + ": " + err.what(), "messages");
    }
    if (e.tokens <= 0) throw bad_request(in.where + ": the " + std::string(is_video ? "video" : "image") + " gives no tokens", "messages");
    if (!is_video) {
      if (start_id) out.ids.push_back(*start_id);
      MultimodalSpan span;
      span.offset = int64_t(out.ids.size());
      span.count = e.tokens;
      span.hash = e.hash;
      span.embeds = e.embeds;
      out.ids.insert(out.ids.end(), size_t(e.tokens), vc.image_token_id);
      if (end_id) out.ids.push_back(*end_id);
      if (embed) out.mm.push_back(std::move(span));
    } else {
      // vLLM's M3 video replacement: per temporal group "]<]X.X seconds[>[" (ordinary text), the image
      // start marker, the group's video tokens, the image end marker (the processor reuses the image
      // markers for video). Each group is its own span (its slice of the embeddings), salted by the
      // video's hash and the group's index.
      const size_t width = size_t(vc.text_hidden);
      for (int g = 0; g < e.grid_t; ++g) {
        if (size_t(g) < e.timestamps.size()) {
          char ts[64];
          std::snprintf(ts, sizeof ts, "]<]%.1f seconds[>[", e.timestamps[size_t(g)]);
          encode(ts);
        }
        if (start_id) out.ids.push_back(*start_id);
        MultimodalSpan span;
        span.offset = int64_t(out.ids.size());
        span.count = e.tokens_per_group;
        span.hash = e.hash ^ (0x9e3779b97f4a7c15ULL * uint64_t(g + 1));
        if (embed && e.embeds) {
          const auto first = e.embeds->begin() + std::ptrdiff_t(size_t(g) * size_t(e.tokens_per_group) * width);
          span.embeds = std::make_shared<const std::vector<float>>(
              first, first + std::ptrdiff_t(size_t(e.tokens_per_group) * width));
        }
        out.ids.insert(out.ids.end(), size_t(e.tokens_per_group), vc.video_token_id);
        if (end_id) out.ids.push_back(*end_id);
        if (embed) out.mm.push_back(std::move(span));
      }
    }
    pos = at + (is_video ? kVideoMarker : kImageMarker).size();
    ++k;
  }
  if (k != images.size())
    throw bad_request("messages: the chat template rendered " + std::to_string(k) + " image/video markers for " +
                          std::to_string(images.size()) +
                          " image and video parts (does it render {\"type\": \"image\"} and {\"type\": \"video\"} parts?)",
                      "messages");
  encode(text.substr(pos));
  return out;
}

// kv_transfer_params, vLLM's NixlConnector protocol: {"do_remote_decode": true} on the prefill leg
// (the prompt's pages are held for a decode engine, and the response says where), {"do_remote_prefill":
// true, "remote_engine_id", "remote_block_ids", "remote_host", "remote_port", "remote_request_id"} on the
// decode leg. Other keys a proxy sends along (tp_size, nulls) are accepted; a leg the server's kv_role
// does not serve is refused by name.
static void read_kv_transfer_params(const ojson& body, const ServerContext& ctx, ParsedRequest& r) {
  const ojson* kv = field(body, "kv_transfer_params");
  if (!kv) return;
  const char* P = "kv_transfer_params";
  if (!kv->is_object()) throw bad_request("'kv_transfer_params' must be an object", P);
  r.kv_params = true;
  auto flag = [&](const char* k) {
    const ojson* v = field(*kv, k);
    if (!v) return false;
    if (!v->is_boolean()) throw bad_request(std::string("kv_transfer_params.") + k + " must be true or false", P);
    return v->get<bool>();
  };
  const bool decode = flag("do_remote_decode"), prefill = flag("do_remote_prefill");
  if (decode && prefill)
    throw bad_request("kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true", P);
  const char* nixl = " (start the server with --kv-transfer-config '{\"kv_connector\": \"NixlConnector\", "
                     "\"kv_role\": \"kv_both\"}')";
  if (decode) {
    if (!ctx.kv_producer)
      throw bad_request(std::string("'kv_transfer_params' do_remote_decode: this server does not prefill for other "
                                    "engines (its kv_role is not kv_producer or kv_both)") + nixl, P);
    r.kv_hold = true;
  }
  if (!prefill) return;
  if (!ctx.kv_consumer || !ctx.kv_fetcher)
    throw bad_request(std::string("'kv_transfer_params' do_remote_prefill: this server does not decode for other "
                                  "engines (its kv_role is not kv_consumer or kv_both)") + nixl, P);
  RemoteKvRef ref;
  auto str = [&](const char* k) {
    const ojson* v = field(*kv, k);
    if (!v || !v->is_string() || v->get<std::string>().empty())
      throw bad_request(std::string("kv_transfer_params.") + k + " (a non-empty string) is required with do_remote_prefill", P);
    return v->get<std::string>();
  };
  ref.engine_id = str("remote_engine_id");
  ref.host = str("remote_host");
  ref.request_id = str("remote_request_id");
  const ojson* port = field(*kv, "remote_port");
  if (!port || !port->is_number_integer() || port->get<int64_t>() < 1 || port->get<int64_t>() > 65535)
    throw bad_request("kv_transfer_params.remote_port (an integer in [1, 65535]) is required with do_remote_prefill", P);
  ref.port = int(port->get<int64_t>());
  const ojson* ids = field(*kv, "remote_block_ids");
  if (!ids || !ids->is_array() || ids->empty())
    throw bad_request("kv_transfer_params.remote_block_ids (a list of block ids) is required with do_remote_prefill", P);
  for (const auto& x : *ids) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      throw bad_request("kv_transfer_params.remote_block_ids must hold block ids (integers >= 0)", P);
    ref.block_ids.push_back(int32_t(x.get<int64_t>()));
  }
  if (const ojson* tp = field(*kv, "tp_size"); tp && !(tp->is_number_integer() && tp->get<int64_t>() == 1))
    throw bad_request("kv_transfer_params.tp_size: only 1 (one engine process per side) is served", P);
  r.kv_remote = std::move(ref);
}

// One prompt and one choice per request when KV moves between engines: the lease and the pulled pages
// belong to exactly one sequence.
static void check_kv_single(const ParsedRequest& r) {
  if ((r.kv_hold || r.kv_remote) && (r.prompts.size() != 1 || r.n != 1))
    throw bad_request("kv_transfer_params: a disaggregated request must have one prompt and n = 1", "kv_transfer_params");
}

ParsedRequest parse_chat_request(const ojson& body, const ServerContext& ctx, const std::vector<std::string>* image_names) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  check_fields(body, Endpoint::Chat, "/v1/chat/completions");
  ParsedRequest r;
  r.chat = true;
  r.model = check_model(body, ctx);
  parse_sampling(body, ctx, r);
  r.logprobs = opt_bool(body, "logprobs").value_or(false);
  const int64_t tl = opt_int(body, "top_logprobs").value_or(0);
  if (tl < 0 || tl > 20) throw bad_request("'top_logprobs' must be in [0, 20]", "top_logprobs");
  if (tl > 0 && !r.logprobs) throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  r.top_logprobs = int(tl);

  // Tools and tool_choice.
  const ojson* tools = field(body, "tools");
  const bool has_tools = tools && tools->is_array() && !tools->empty();
  std::string choice = has_tools ? "auto" : "none";
  if (const ojson* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required")
        throw bad_request("'tool_choice' must be none, auto, required or a named function", "tool_choice");
    } else if (tc->is_object()) {
      choice = "named";
    } else {
      throw bad_request("'tool_choice' must be a string or an object", "tool_choice");
    }
  }
  std::string forced_name;  // tool_choice {"type": "function", "function": {"name": ...}}
  if (choice == "named") {
    const ojson& tc = *field(body, "tool_choice");
    const ojson* fn = field(tc, "function");
    if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      throw bad_request("a named 'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        "tool_choice");
    forced_name = (*fn)["name"].get<std::string>();
  }
  const bool forced = choice == "required" || choice == "named";
  if (forced && !has_tools)
    throw bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice");
  if (forced && !ctx.tool)
    throw bad_request("tool_choice '" + std::string(choice == "named" ? "a named function" : "required") +
                          "' requires --tool-call-parser to be set",
                      "tool_choice");
  std::vector<std::string> tool_names;
  if (has_tools)
    for (auto& t : *tools)
      if (t.is_object() && t.contains("function") && t["function"].is_object() && t["function"].contains("name") &&
          t["function"]["name"].is_string())
        tool_names.push_back(t["function"]["name"].get<std::string>());
  if (!forced_name.empty() && std::find(tool_names.begin(), tool_names.end(), forced_name) == tool_names.end())
    throw bad_request("tool_choice names the function '" + forced_name + "', which is not in 'tools'", "tool_choice");
  if (choice == "auto" && has_tools && !(ctx.tool && ctx.enable_auto_tool_choice))
    throw bad_request("\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
                      "tool_choice");
  const bool parse_tools = has_tools && (choice == "auto" || forced);
  r.choice.parallel_tool_calls = opt_bool(body, "parallel_tool_calls").value_or(true);

  std::vector<ImageInput> images;
  std::string prompt = render_messages(body, ctx, true, &images, image_names);
  const bool separate_reasoning = opt_bool(body, "separate_reasoning").value_or(true);
  bool reasoning_start = ctx.reasoning && chat::ReasoningParser::prompt_starts_reasoning(*ctx.reasoning, prompt);
  const bool prompt_opened_reasoning = reasoning_start;  // before a forced minimax_m2 call closes it below
  if (forced && *ctx.tool == chat::ToolFormat::MiniMaxM3) {
    // The whole tool-call block is generated under a grammar (src/structured/tool_grammar.h): invoke
    // names from the listed tools (the named one only), parameters per each tool's schema, so the
    // parsed tool_calls always validate. A prompt that opened a think block keeps it: the model reasons
    // first, unconstrained, and the grammar takes over after the end tag (as response_format does;
    // vLLM also reasons before a forced call). A parameter schema the grammar cannot hold is refused by
    // name, never loosened to free text.
    const std::string after = reasoning_start ? chat::ReasoningParser::tags(*ctx.reasoning).second : std::string();
    try {
      const structured::Grammar g =
          structured::tool_call_grammar(*tools, forced_name, forced_name.empty() && r.choice.parallel_tool_calls);
      r.params.constraint = structured::make_constraint(g, structured::TokenVocab::shared(*ctx.tok, ctx.vocab), *ctx.tok,
                                                        r.params.stop_token_ids, after, "tool_call");
    } catch (const structured::StructuredError& e) {
      throw bad_request(std::string("tool_choice ") + (forced_name.empty() ? "required" : "'" + forced_name + "'") +
                            ": " + e.what(),
                        "tools");
    }
    r.choice.allowed_tool_names = tool_names;
  } else if (forced) {
    // The minimax_m2 format has no grammar here: its tool-call opener (and, for a named function, the
    // whole invoke tag) is forced right after the generation prompt.
    const ForcedToolPrefix fp = forced_tool_prefix(*ctx.tool, forced_name, reasoning_start);
    prompt += fp.prompt_suffix;
    r.choice.forced_tool_text = fp.parser_text;
    r.choice.allowed_tool_names = tool_names;
    reasoning_start = false;
  }
  r.prompt_texts.push_back(prompt);
  ChatTokens ct = tokenize_chat(prompt, images, ctx, true);
  r.prompts.push_back(std::move(ct.ids));
  r.mm = std::move(ct.mm);
  if (ctx.reasoning && separate_reasoning) {
    r.choice.reasoning = ctx.reasoning;
    r.choice.reasoning_start = reasoning_start;
  } else if (ctx.reasoning) {
    r.choice.keep_think_tags = ctx.reasoning;
    r.choice.reasoning_start = reasoning_start;
  }
  if (parse_tools) {
    r.choice.tool = ctx.tool;
    r.choice.tools = nlohmann::json::parse(dump(*tools));  // dump() replaces invalid UTF-8
  }
  attach_constraint(body, ctx, r, reasoning_start);
  read_thinking_budget(body, ctx, r, prompt, prompt_opened_reasoning, reasoning_start);
  finish_limits(body, ctx, r, ctx.max_model_len > 0 ? ctx.max_model_len : (1 << 20));
  read_kv_transfer_params(body, ctx, r);
  check_kv_single(r);
  return r;
}

ParsedRequest parse_completion_request(const ojson& body, const ServerContext& ctx) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  check_fields(body, Endpoint::Completion, "/v1/completions");
  ParsedRequest r;
  r.chat = false;
  r.model = check_model(body, ctx);
  parse_sampling(body, ctx, r);
  if (auto lp = opt_int(body, "logprobs")) {
    if (*lp < 0 || *lp > 20) throw bad_request("'logprobs' must be in [0, 20]", "logprobs");
    r.logprobs = true;
    r.top_logprobs = int(*lp);
  }
  r.echo = opt_bool(body, "echo").value_or(false);
  // OpenAI's echo with logprobs returns the prompt tokens' log-probabilities too (what lm-eval's
  // loglikelihood reads); the engine computes logits for generated positions only, so the pair is
  // refused rather than answered with the generated tokens' alone.
  if (r.echo && r.logprobs)
    throw bad_request("'echo' with 'logprobs' asks for log-probabilities of the prompt tokens, which this server "
                      "does not support yet; send 'echo' or 'logprobs', not both",
                      "echo");
  if (field(body, "suffix")) throw bad_request("'suffix' is not supported", "suffix");
  if (auto bo = opt_int(body, "best_of"))
    if (*bo != r.n) throw bad_request("'best_of' other than n is not supported", "best_of");
  const ojson* p = field(body, "prompt");
  if (!p) throw bad_request("'prompt' is required", "prompt");
  const char* shape = "'prompt' must be a string, a list of token ids, or a list of either";
  auto add_ids = [&](const ojson& a) {
    std::vector<int32_t> ids;
    for (auto& x : a) ids.push_back(read_token_id("prompt", x, shape, kApi));
    for (int32_t id : ids)
      if (!ctx.tok->is_valid(id)) throw bad_request("token id " + std::to_string(id) + " is not valid", "prompt");
    r.prompt_texts.push_back(ctx.tok->decode(ids));
    r.prompts.push_back(std::move(ids));
  };
  auto add_text = [&](const std::string& s) {
    r.prompt_texts.push_back(s);
    try {
      r.prompts.push_back(ctx.tok->encode(s, true));
    } catch (const std::exception& e) {
      throw bad_request(std::string("cannot tokenize the prompt: ") + e.what(), "prompt");
    }
  };
  if (p->is_string()) {
    add_text(p->get<std::string>());
  } else if (p->is_array() && !p->empty()) {
    if ((*p)[0].is_number_integer()) {
      add_ids(*p);
    } else {
      for (auto& e : *p) {
        if (e.is_string()) add_text(e.get<std::string>());
        else if (e.is_array() && !e.empty()) add_ids(e);
        else throw bad_request(shape, "prompt");
      }
    }
  } else {
    throw bad_request(shape, "prompt");
  }
  attach_constraint(body, ctx, r, false);
  finish_limits(body, ctx, r, 16);
  read_kv_transfer_params(body, ctx, r);
  check_kv_single(r);
  return r;
}

}  // namespace m3::server
