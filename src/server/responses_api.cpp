// The Responses API translator (see responses_api.h).
#include "server/responses_api.h"

#include <algorithm>

namespace m3::server {

namespace {

// Fields the Responses API defines that are served (directly or through the chat path).
const std::vector<const char*> kServed = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "reasoning",
    "max_output_tokens", "temperature", "top_p", "stream", "text", "user", "metadata", "prompt_cache_key",
    "safety_identifier", "service_tier", "include", "stream_options", "truncation",
    // vLLM's sampling extensions, passed to the chat path as they are.
    "top_k", "min_p", "repetition_penalty", "seed", "stop", "ignore_eos"};

bool not_stored(const ojson& v) { return json_null_or_false(v); }
bool no_truncation(const ojson& v) { return v.is_null() || (v.is_string() && v.get<std::string>() == "disabled"); }
bool zero(const ojson& v) { return v.is_null() || (v.is_number() && v.get<double>() == 0); }

// This server keeps no responses (stateless, as vLLM by default): what needs a store is refused by name.
const std::vector<RefusedRule> kRefused = {
    {"previous_response_id", json_null, "a stored previous response (this server keeps no responses; send the "
                                        "whole conversation in 'input')"},
    {"store", not_stored, "storing the response (this server keeps no responses; send \"store\": false)"},
    {"conversation", json_null, "a stored conversation"},
    {"background", json_null_or_false, "background processing"},
    {"prompt", json_null, "a stored prompt template"},
    {"max_tool_calls", json_null, "a limit on built-in tool calls"},
    {"top_logprobs", zero, "log-probabilities"},
    {"truncation", no_truncation, "automatic truncation of the input"},
};

// One input_image part (OpenAI: {"type": "input_image", "image_url": "data:...|https://...", "detail":
// "auto", "file_id": null}) -> its URL. file_id needs OpenAI's file store and a detail other than auto a
// resolution tier M3's processor does not have: both refused by name.
std::string input_image_url(const ojson& p, const std::string& w) {
  for (auto it = p.begin(); it != p.end(); ++it) {
    const std::string& k = it.key();
    if (k == "type" || k == "image_url" || it.value().is_null()) continue;
    if (k == "detail") {
      const std::string d = string_field(it.value(), w + ".detail");
      if (d == "auto") continue;
      throw bad_request(w + ".detail: \"" + d + "\" is not supported (this model's image processor has one resolution: "
                            "only \"auto\")", w + ".detail");
    }
    if (k == "file_id")
      throw bad_request(w + ".file_id: images from OpenAI's file store are not supported by this server (send the image "
                            "in image_url, as a data: or http(s) URL)", w + ".file_id");
    throw bad_request(w + ": '" + k + "' is not supported in an input_image part (image_url, detail)", w + "." + k);
  }
  const ojson* u = get_field(p, "image_url");
  if (!u) throw bad_request(w + ": an input_image part needs 'image_url' (a data: or http(s) URL)", w + ".image_url");
  return string_field(*u, w + ".image_url");
}

// A content list (input_text / output_text / text parts, and input_image parts when `names` is given: a
// user message or a function_call_output) -> chat content; other kinds are refused by name.
ojson parts_content(const ojson& content, const std::string& where, std::vector<std::string>* names) {
  if (content.is_string()) return content.get<std::string>();
  array_field(content, where);
  ChatContent out;
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& p = content[j];
    const std::string w = indexed(where, j);
    const std::string type = string_field(object_field(p, w).value("type", ojson("")), w + ".type");
    if (type == "input_text" || type == "output_text" || type == "text" || type == "refusal") {
      const ojson* t = get_field(p, type == "refusal" ? "refusal" : "text");
      out.add_text(string_field(t ? *t : ojson(), w + (type == "refusal" ? ".refusal" : ".text")));
    } else if (type == "input_image" && names) {
      out.add_image(input_image_url(p, w), w, *names);
    } else if (type == "input_image") {
      throw bad_request(w + ": input_image parts are served in user messages and function_call_output only", w);
    } else {
      throw bad_request(w + ": content type '" + type + "' is not supported by this server (" +
                            (names ? "input_text, input_image" : "text only") + ")",
                        w);
    }
  }
  return out.take();
}

// Text of a content list: parts_content without images.
std::string parts_text(const ojson& content, const std::string& where) {
  return parts_content(content, where, nullptr).get<std::string>();
}

// input (a string or items) -> chat messages.
ojson input_messages(const ojson& input, const ojson* instructions, std::vector<std::string>& image_names) {
  ojson msgs = ojson::array();
  if (instructions) msgs.push_back({{"role", "system"}, {"content", string_field(*instructions, "instructions")}});
  if (input.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", input}});
    return msgs;
  }
  if (!input.is_array() || input.empty()) throw bad_request("'input' must be a string or a non-empty list of items", "input");
  std::string reasoning;  // a reasoning item, for the assistant turn that follows it
  bool open_assistant = false;  // the last message is an assistant turn that function_call items extend
  auto assistant = [&]() -> ojson& {
    if (!open_assistant) {
      msgs.push_back({{"role", "assistant"}, {"content", ""}});
      open_assistant = true;
    }
    ojson& m = msgs.back();
    if (!reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, "");
    return m;
  };
  // A reasoning item that no assistant message or call follows is an assistant turn of its own (as chat
  // and Messages render the same history), never dropped.
  auto flush_reasoning = [&] {
    if (reasoning.empty()) return;
    open_assistant = false;
    assistant();
    open_assistant = false;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string w = indexed("input", i);
    const ojson& item = object_field(input[i], w);
    const ojson* t = get_field(item, "type");
    const std::string type = t ? string_field(*t, w + ".type") : "message";
    if (type == "message") {
      std::string role = required_string(item, "role", w);
      const ojson* c = get_field(item, "content");
      if (role == "assistant") {
        open_assistant = false;
        assistant()["content"] = parts_text(c ? *c : ojson(""), w + ".content");
        continue;
      }
      if (role == "developer") role = "system";
      if (role != "user" && role != "system")
        throw bad_request(w + ".role must be user, assistant, system or developer", w + ".role");
      flush_reasoning();
      msgs.push_back({{"role", role}, {"content", parts_content(c ? *c : ojson(""), w + ".content",
                                                                  role == "user" ? &image_names : nullptr)}});
      open_assistant = false;
    } else if (type == "function_call") {
      ojson call = {{"id", required_string(item, "call_id", w)},
                    {"type", "function"},
                    {"function",
                     {{"name", required_string(item, "name", w)}, {"arguments", required_string(item, "arguments", w)}}}};
      ojson& m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
      m["tool_calls"].push_back(call);
    } else if (type == "function_call_output") {
      flush_reasoning();
      const ojson* out = get_field(item, "output");
      msgs.push_back({{"role", "tool"},
                      {"tool_call_id", required_string(item, "call_id", w)},
                      {"content", parts_content(out ? *out : ojson(), w + ".output", &image_names)}});
      open_assistant = false;
    } else if (type == "reasoning") {
      // Its text (content, else the summary) is shown to the template with the next assistant turn.
      const ojson* c = get_field(item, "content");
      const ojson* s = get_field(item, "summary");
      std::string text;
      if (c) {
        array_field(*c, w + ".content");
        for (size_t j = 0; j < c->size(); ++j) text += required_string((*c)[j], "text", indexed(w + ".content", j));
      } else if (s) {
        array_field(*s, w + ".summary");
        for (size_t j = 0; j < s->size(); ++j) text += required_string((*s)[j], "text", indexed(w + ".summary", j));
      }
      reasoning += text;
      open_assistant = false;
    } else {
      throw bad_request(w + ": input item type '" + type +
                            "' is not supported by this server (message, function_call, function_call_output, reasoning)",
                        w + ".type");
    }
  }
  flush_reasoning();
  return msgs;
}

ojson chat_tool_choice(const ojson& tc) {
  if (tc.is_string()) return tc;  // none / auto / required: the chat path checks the value
  const ojson& o = object_field(tc, "tool_choice");
  const ojson* type = get_field(o, "type");
  const std::string ty = type ? string_field(*type, "tool_choice.type") : "";
  if (ty != "function")
    throw bad_request("tool_choice type '" + ty + "' is not supported by this server (none, auto, required or "
                      "{\"type\": \"function\", \"name\": ...})",
                      "tool_choice");
  return {{"type", "function"}, {"function", {{"name", required_string(o, "name", "tool_choice")}}}};
}

}  // namespace

const FieldNames& responses_field_names() {
  static const FieldNames n = {{"messages", "input"},
                               {"max_tokens", "max_output_tokens"},
                               {"response_format", "text.format"},
                               {"reasoning_effort", "reasoning.effort"},
                               {"chat_template_kwargs", "reasoning"}};
  return n;
}

ResponsesRequest responses_to_chat(const ojson& body) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  check_api_fields(body, kServed, kRefused, "/v1/responses");
  if (const ojson* inc = get_field(body, "include")) {
    // Encrypted reasoning is asked for by stateless clients (Codex); the reasoning items carry it in the clear.
    for (const ojson& x : array_field(*inc, "include"))
      if (!(x.is_string() && x.get<std::string>() == "reasoning.encrypted_content"))
        throw bad_request("include '" + (x.is_string() ? x.get<std::string>() : x.dump()) +
                              "' is not supported by this server (only reasoning.encrypted_content, answered in the clear)",
                          "include");
  }
  ResponsesRequest r;
  ojson& c = r.chat;
  const ojson* input = get_field(body, "input");
  if (!input) throw bad_request("'input' is required", "input");
  const ojson* instructions = get_field(body, "instructions");
  c["messages"] = input_messages(*input, instructions, r.image_names);
  for (const char* k : {"model", "parallel_tool_calls", "temperature", "top_p", "stream", "user", "metadata",
                        "prompt_cache_key", "safety_identifier", "service_tier", "top_k", "min_p",
                        "repetition_penalty", "seed", "stop", "ignore_eos"})
    if (const ojson* v = get_field(body, k)) c[k] = *v;
  if (const ojson* m = get_field(body, "max_output_tokens")) c["max_tokens"] = *m;
  if (const ojson* t = get_field(body, "tools")) c["tools"] = flat_tools_to_chat(*t, "function", "parameters", false, "function tools; built-in tools are not");
  if (const ojson* tc = get_field(body, "tool_choice")) c["tool_choice"] = chat_tool_choice(*tc);
  ojson reasoning = nullptr;
  if (const ojson* re = get_field(body, "reasoning")) {
    object_field(*re, "reasoning");
    reasoning = {{"effort", nullptr}, {"summary", nullptr}};
    if (const ojson* e = get_field(*re, "effort")) {
      const std::string eff = string_field(*e, "reasoning.effort");
      // The effort goes to the template as reasoning_effort (as chat's reasoning_effort does); the M3
      // templates read thinking_mode, so effort "none" turns thinking off and any other effort on.
      c["reasoning_effort"] = eff;
      c["chat_template_kwargs"] = {{"thinking_mode", eff == "none" ? "disabled" : "enabled"}};
      reasoning["effort"] = eff;
    }
  }
  ojson text = {{"format", {{"type", "text"}}}};
  if (const ojson* t = get_field(body, "text")) {
    object_field(*t, "text");
    if (const ojson* f = get_field(*t, "format")) {
      // Rewritten as chat's response_format: served or refused there (the chat path owns constrained decoding).
      const ojson& fo = object_field(*f, "text.format");
      const ojson* ty = get_field(fo, "type");
      const std::string type = ty ? string_field(*ty, "text.format.type") : "text";
      if (type == "json_schema") {
        ojson js = fo;
        js.erase("type");
        c["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
      } else {
        c["response_format"] = {{"type", type}};
      }
      text["format"] = fo;
    }
  }
  ojson& e = r.echo;
  e["instructions"] = instructions ? *instructions : ojson(nullptr);
  e["max_output_tokens"] = body.value("max_output_tokens", ojson(nullptr));
  e["parallel_tool_calls"] = body.value("parallel_tool_calls", ojson(true));
  e["reasoning"] = reasoning;
  e["temperature"] = body.value("temperature", ojson(nullptr));
  e["text"] = text;
  e["tool_choice"] = body.value("tool_choice", ojson("auto"));
  e["tools"] = body.value("tools", ojson::array());
  e["top_p"] = body.value("top_p", ojson(nullptr));
  e["user"] = body.value("user", ojson(nullptr));
  e["metadata"] = body.value("metadata", ojson::object());
  return r;
}

namespace {

class ResponsesOutput final : public ApiOutput, BlockBuilder {
 public:
  ResponsesOutput(ojson echo, std::string model, int64_t created, IdMaker ids,
                  std::function<int64_t(const std::string&)> count)
      : echo_(std::move(echo)), model_(std::move(model)), created_(created), ids_(std::move(ids)),
        count_(std::move(count)), id_(ids_("resp_")) {}

  std::string begin(int64_t) override {
    ojson r = response("in_progress", nullptr);
    std::string out = event("response.created", {{"response", r}});  // two statements: numbered in order
    return out + event("response.in_progress", {{"response", r}});
  }
  std::string delta(const ChoiceDelta& d) override { return feed(d); }
  std::string end(const ChoiceState& s, const ojson& chat_usage) override {
    cut_ = s.finish_reason == "length";
    for (const chat::ToolCall& c : s.tool_calls()) final_calls_.push_back(c.id);
    final_known_ = true;
    std::string out = close_open();
    return out + event("response.completed", {{"response", final_response(s, chat_usage)}});
  }
  ojson full(const ChoiceState& s, const ojson& chat_usage) override {
    cut_ = s.finish_reason == "length";
    for (const chat::ToolCall& c : s.tool_calls()) final_calls_.push_back(c.id);
    final_known_ = true;
    feed(whole_delta(s));
    close_open();
    return final_response(s, chat_usage);
  }
  std::string stream_error(int status, const std::string& message) override {
    return event("error", {{"code", std::to_string(status)}, {"message", message}, {"param", nullptr}});
  }

 private:
  ojson echo_;
  std::string model_;
  int64_t created_;
  IdMaker ids_;
  std::function<int64_t(const std::string&)> count_;
  std::string id_;
  int64_t seq_ = 0;
  bool cut_ = false;  // finish_reason length (set by end() and full() before the last block closes)
  bool final_known_ = false;              // end() / full(): the parser's final calls are known
  std::vector<std::string> final_calls_;  // their ids
  std::vector<std::string> item_ids_;

  std::string event(const char* type, ojson fields) {
    ojson e = {{"type", type}};
    for (auto it = fields.begin(); it != fields.end(); ++it) e[it.key()] = it.value();
    e["sequence_number"] = seq_++;
    return sse_named(type, e);
  }

  ojson echoed(const char* key) const { return echo_.is_object() ? echo_.value(key, ojson(nullptr)) : ojson(nullptr); }

  ojson response(const char* status, ojson usage) const {
    ojson r;
    r["id"] = id_;
    r["object"] = "response";
    r["created_at"] = created_;
    r["status"] = status;
    r["background"] = false;
    r["error"] = nullptr;
    r["incomplete_details"] = nullptr;
    r["instructions"] = echoed("instructions");
    r["max_output_tokens"] = echoed("max_output_tokens");
    r["max_tool_calls"] = nullptr;
    r["model"] = model_;
    r["output"] = ojson::array();
    r["parallel_tool_calls"] = echoed("parallel_tool_calls");
    r["previous_response_id"] = nullptr;
    r["reasoning"] = echoed("reasoning");
    r["service_tier"] = "auto";
    r["store"] = false;
    r["temperature"] = echoed("temperature");
    r["text"] = echoed("text");
    r["tool_choice"] = echoed("tool_choice");
    r["tools"] = echoed("tools");
    r["top_logprobs"] = 0;
    r["top_p"] = echoed("top_p");
    r["truncation"] = "disabled";
    r["usage"] = std::move(usage);
    r["user"] = echoed("user");
    r["metadata"] = echoed("metadata");
    return r;
  }

  ojson final_response(const ChoiceState& s, const ojson& u) const {
    const int64_t in = u.value("prompt_tokens", int64_t(0)), out = u.value("completion_tokens", int64_t(0));
    ojson usage;
    usage["input_tokens"] = in;
    usage["input_tokens_details"] = {{"cached_tokens", u["prompt_tokens_details"].value("cached_tokens", int64_t(0))}};
    usage["output_tokens"] = out;
    // The parser splits text, not tokens: the reasoning's length is its text re-tokenized (bounded by the output).
    usage["output_tokens_details"] = {{"reasoning_tokens", std::min(out, s.reasoning.empty() ? 0 : count_(s.reasoning))}};
    usage["total_tokens"] = in + out;
    const bool cut = s.finish_reason == "length";
    // abort: the server ended the request (shutdown) before the model did.
    ojson r = response(cut ? "incomplete" : s.finish_reason == "abort" ? "cancelled" : "completed", usage);
    if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    for (size_t i = 0; i < blocks().size(); ++i) r["output"].push_back(item(i, done_status(i)));
    return r;
  }
  // A closed item's status: the last one is incomplete when max_output_tokens cut the response, and so is a
  // streamed call the parser dropped at the end (the model stopped inside it: not among the final calls).
  const char* done_status(size_t i) const {
    if (cut_ && i + 1 == blocks().size()) return "incomplete";
    const Block& b = blocks()[i];
    const bool dropped = b.kind == Kind::Tool && final_known_ &&
                         std::find(final_calls_.begin(), final_calls_.end(), b.id) == final_calls_.end();
    return dropped ? "incomplete" : "completed";
  }

  // Output item i; in_progress: as announced by output_item.added (no content yet).
  ojson item(size_t i, const char* status) const {
    const Block& b = blocks()[i];
    const bool done = std::string(status) != "in_progress";
    ojson it;
    it["id"] = item_ids_[i];
    switch (b.kind) {
      case Kind::Reasoning:
        it["type"] = "reasoning";
        it["summary"] = ojson::array();
        it["content"] = done ? ojson::array({reasoning_part(b.text)}) : ojson::array();
        it["encrypted_content"] = nullptr;
        it["status"] = status;
        break;
      case Kind::Text:
        it["type"] = "message";
        it["status"] = status;
        it["role"] = "assistant";
        it["content"] = done ? ojson::array({text_part(b.text)}) : ojson::array();
        break;
      case Kind::Tool:
        it["type"] = "function_call";
        it["status"] = status;
        it["call_id"] = b.id;
        it["name"] = b.name;
        it["arguments"] = done ? b.text : "";
        break;
    }
    return it;
  }
  static ojson text_part(const std::string& t) {
    return {{"type", "output_text"}, {"text", t}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
  }
  static ojson reasoning_part(const std::string& t) { return {{"type", "reasoning_text"}, {"text", t}}; }
  ojson where(size_t i, bool content) const {
    ojson w = {{"item_id", item_ids_[i]}, {"output_index", i}};
    if (content) w["content_index"] = 0;
    return w;
  }
  static ojson with(ojson a, const ojson& b) {
    for (auto it = b.begin(); it != b.end(); ++it) a[it.key()] = it.value();
    return a;
  }

  std::string on_open(size_t i) override {
    const Kind k = blocks()[i].kind;
    item_ids_.push_back(ids_(k == Kind::Reasoning ? "rs_" : k == Kind::Text ? "msg_" : "fc_"));
    std::string out = event("response.output_item.added", {{"output_index", i}, {"item", item(i, "in_progress")}});
    if (k != Kind::Tool)
      out += event("response.content_part.added",
                   with(where(i, true), {{"part", k == Kind::Text ? text_part("") : reasoning_part("")}}));
    return out;
  }
  std::string on_append(size_t i, const std::string& piece) override {
    switch (blocks()[i].kind) {
      case Kind::Reasoning: return event("response.reasoning_text.delta", with(where(i, true), {{"delta", piece}}));
      case Kind::Text:
        return event("response.output_text.delta", with(where(i, true), {{"delta", piece}, {"logprobs", ojson::array()}}));
      case Kind::Tool: return event("response.function_call_arguments.delta", with(where(i, false), {{"delta", piece}}));
    }
    return {};
  }
  std::string on_close(size_t i) override {
    const Block& b = blocks()[i];
    std::string out;
    switch (b.kind) {
      case Kind::Reasoning:
        out += event("response.reasoning_text.done", with(where(i, true), {{"text", b.text}}));
        out += event("response.content_part.done", with(where(i, true), {{"part", reasoning_part(b.text)}}));
        break;
      case Kind::Text:
        out += event("response.output_text.done", with(where(i, true), {{"text", b.text}, {"logprobs", ojson::array()}}));
        out += event("response.content_part.done", with(where(i, true), {{"part", text_part(b.text)}}));
        break;
      case Kind::Tool:
        out += event("response.function_call_arguments.done",
                     with(where(i, false), {{"name", b.name}, {"arguments", b.text}}));
        break;
    }
    return out + event("response.output_item.done", {{"output_index", i}, {"item", item(i, done_status(i))}});
  }
};

}  // namespace

std::unique_ptr<ApiOutput> make_responses_output(ojson echo, std::string model, int64_t created, IdMaker ids,
                                                 std::function<int64_t(const std::string&)> count_tokens) {
  return std::make_unique<ResponsesOutput>(std::move(echo), std::move(model), created, std::move(ids),
                                           std::move(count_tokens));
}

}  // namespace m3::server
