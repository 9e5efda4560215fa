// The Anthropic Messages translator (see messages_api.h).
#include "server/messages_api.h"

#include "server/openai_response.h"

namespace m3::server {

namespace {

const std::vector<const char*> kServed = {"model", "messages", "system", "max_tokens", "stop_sequences", "stream",
                                          "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking",
                                          "metadata", "service_tier"};

const std::vector<RefusedRule> kRefused = {
    {"container", json_null, "a code-execution container"},
    {"mcp_servers", json_null_or_empty, "MCP servers"},
    {"context_management", json_null, "context management"},
};

const std::string& block_type(const ojson& b, const std::string& w) {
  const ojson* t = get_field(object_field(b, w), "type");
  if (!t || !t->is_string()) throw bad_request("'" + w + ".type' must be a string", w + ".type");
  return t->get_ref<const std::string&>();
}

// Text of a string or a list of text blocks (system, tool_result content).
std::string blocks_text(const ojson& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  array_field(c, where);
  std::string text;
  for (size_t j = 0; j < c.size(); ++j) {
    const std::string w = indexed(where, j);
    const std::string& type = block_type(c[j], w);
    if (type != "text")
      throw bad_request(w + ": block type '" + type + "' is not supported here by this server (text only)", w);
    if (!text.empty()) text += "\n";
    text += required_string(c[j], "text", w);
  }
  return text;
}

// An image block's source (Anthropic: {"type": "base64", "media_type": "image/png", "data": ...} or {"type":
// "url", "url": ...}) -> the URL the chat path loads (base64 as a data: URL). A "file" source needs
// Anthropic's Files API: refused by name.
std::string image_source_url(const ojson& b, const std::string& w) {
  const ojson* src = get_field(b, "source");
  if (!src) throw bad_request("'" + w + ".source' is required in an image block", w + ".source");
  const std::string sw = w + ".source";
  const std::string type = required_string(*src, "type", sw);
  if (type == "base64") {
    const std::string mt = required_string(*src, "media_type", sw);
    if (mt.rfind("image/", 0) != 0)
      throw bad_request(sw + ".media_type must be an image type (image/jpeg, image/png, ...), got '" + mt + "'",
                        sw + ".media_type");
    return "data:" + mt + ";base64," + required_string(*src, "data", sw);
  }
  if (type == "url") return required_string(*src, "url", sw);
  if (type == "file")
    throw bad_request(sw + ": source type 'file' (Anthropic's Files API) is not supported by this server (send the "
                           "image as a base64 or url source)", sw + ".type");
  throw bad_request(sw + ".type '" + type + "' must be base64 or url", sw + ".type");
}

// A tool_result's content (a string, or text and image blocks) -> the tool message's chat content: text
// blocks joined by newlines (as blocks_text), images in place.
ojson tool_result_content(const ojson& c, const std::string& where, std::vector<std::string>& image_names) {
  if (c.is_string()) return c.get<std::string>();
  array_field(c, where);
  ChatContent out;
  bool text_before = false;
  for (size_t j = 0; j < c.size(); ++j) {
    const std::string w = indexed(where, j);
    const std::string& type = block_type(c[j], w);
    if (type == "text") {
      if (text_before) out.add_text("\n");
      out.add_text(required_string(c[j], "text", w));
      text_before = true;
    } else if (type == "image") {
      out.add_image(image_source_url(c[j], w), w, image_names);
      text_before = false;
    } else {
      throw bad_request(w + ": block type '" + type + "' is not supported in a tool_result by this server (text, image)", w);
    }
  }
  return out.take();
}

// One Messages message -> chat messages (a user turn's tool_result blocks become tool messages first).
// image_names gets the message's images in the order the chat messages hold them: the tool results'
// first, then the user text's.
void add_message(const ojson& m, const std::string& w, ojson& msgs, std::vector<std::string>& image_names) {
  const std::string role = required_string(object_field(m, w), "role", w);
  if (role != "user" && role != "assistant") throw bad_request(w + ".role must be user or assistant", w + ".role");
  const ojson* c = get_field(m, "content");
  if (!c) throw bad_request("'" + w + ".content' is required", w + ".content");
  if (c->is_string()) {
    msgs.push_back({{"role", role}, {"content", *c}});
    return;
  }
  array_field(*c, w + ".content");
  ChatContent text;  // text and image blocks, in order
  std::vector<std::string> text_images;  // its images' names, after the tool results' (see above)
  std::string thinking;
  ojson calls = ojson::array();
  for (size_t j = 0; j < c->size(); ++j) {
    const std::string bw = indexed(w + ".content", j);
    const ojson& b = (*c)[j];
    const std::string& type = block_type(b, bw);
    if (type == "text") {
      text.add_text(required_string(b, "text", bw));
    } else if (type == "image" && role == "user") {
      text.add_image(image_source_url(b, bw), bw, text_images);
    } else if (type == "thinking" && role == "assistant") {
      thinking += required_string(b, "thinking", bw);
    } else if (type == "redacted_thinking" && role == "assistant") {
      // Encrypted by Anthropic: nothing this model can read.
    } else if (type == "tool_use" && role == "assistant") {
      const ojson* in = get_field(b, "input");
      calls.push_back({{"id", required_string(b, "id", bw)},
                       {"type", "function"},
                       {"function",
                        {{"name", required_string(b, "name", bw)},
                         {"arguments", dump(in ? object_field(*in, bw + ".input") : ojson::object())}}}});
    } else if (type == "tool_result" && role == "user") {
      const ojson* rc = get_field(b, "content");
      msgs.push_back({{"role", "tool"},
                      {"tool_call_id", required_string(b, "tool_use_id", bw)},
                      {"content", rc ? tool_result_content(*rc, bw + ".content", image_names) : ojson("")}});
    } else {
      throw bad_request(bw + ": block type '" + type + "' is not supported in " + (role == "assistant" ? "an " : "a ") + role +
                            " message by this server (text and image in user messages, tool_use, tool_result, thinking)",
                        bw);
    }
  }
  ojson content = text.take();
  image_names.insert(image_names.end(), text_images.begin(), text_images.end());
  if (role == "user" && content.is_string() && content.get<std::string>().empty()) return;  // tool results only
  ojson out = {{"role", role}, {"content", std::move(content)}};
  if (!thinking.empty()) out["reasoning_content"] = thinking;
  if (!calls.empty()) out["tool_calls"] = calls;
  msgs.push_back(out);
}

}  // namespace

const FieldNames& messages_field_names() {
  static const FieldNames n = {{"stop", "stop_sequences"},
                               {"chat_template_kwargs", "thinking"},
                               {"parallel_tool_calls", "tool_choice"}};
  return n;
}

ojson messages_to_chat(const ojson& body, bool count_only, std::vector<std::string>* image_names) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  check_api_fields(body, kServed, kRefused, count_only ? "/v1/messages/count_tokens" : "/v1/messages");
  ojson c;
  if (const ojson* m = get_field(body, "model")) c["model"] = *m;
  ojson msgs = ojson::array();
  if (const ojson* s = get_field(body, "system")) msgs.push_back({{"role", "system"}, {"content", blocks_text(*s, "system")}});
  const ojson* ms = get_field(body, "messages");
  if (!ms || !ms->is_array() || ms->empty()) throw bad_request("'messages' must be a non-empty list", "messages");
  std::vector<std::string> names;
  for (size_t i = 0; i < ms->size(); ++i) add_message((*ms)[i], indexed("messages", i), msgs, names);
  if (image_names) *image_names = std::move(names);
  c["messages"] = msgs;
  if (!count_only) {
    // Required by the Messages API (no default).
    const ojson* mt = get_field(body, "max_tokens");
    if (!mt) throw bad_request("'max_tokens' is required", "max_tokens");
    c["max_tokens"] = *mt;
    for (const char* k : {"temperature", "top_p", "top_k", "stream"})
      if (const ojson* v = get_field(body, k)) c[k] = *v;
    // The Messages API's temperature range is [0, 1] (chat completions' is wider).
    if (const ojson* t = get_field(body, "temperature"); t && t->is_number() && !(t->get<double>() >= 0.0 && t->get<double>() <= 1.0))
      throw bad_request("'temperature' must be in [0, 1]", "temperature");
    if (const ojson* s = get_field(body, "stop_sequences")) c["stop"] = array_field(*s, "stop_sequences");
  }
  if (const ojson* t = get_field(body, "tools")) c["tools"] = flat_tools_to_chat(*t, "custom", "input_schema", true, "custom tools with input_schema; Anthropic's server and client tools are not");
  if (const ojson* tc = get_field(body, "tool_choice")) {
    const std::string type = required_string(object_field(*tc, "tool_choice"), "type", "tool_choice");
    if (type == "auto" || type == "none") c["tool_choice"] = type;
    else if (type == "any") c["tool_choice"] = "required";
    else if (type == "tool")
      c["tool_choice"] = {{"type", "function"}, {"function", {{"name", required_string(*tc, "name", "tool_choice")}}}};
    else throw bad_request("tool_choice type '" + type + "' must be auto, any, tool or none", "tool_choice.type");
    if (const ojson* d = get_field(*tc, "disable_parallel_tool_use")) {
      if (!d->is_boolean()) throw bad_request("'tool_choice.disable_parallel_tool_use' must be a boolean", "tool_choice");
      c["parallel_tool_calls"] = !d->get<bool>();
    }
  }
  if (const ojson* th = get_field(body, "thinking")) {
    // The M3 templates' thinking_mode; budget_tokens bounds the thinking (thinking_token_budget).
    const std::string type = required_string(object_field(*th, "thinking"), "type", "thinking");
    if (type != "enabled" && type != "disabled" && type != "adaptive")
      throw bad_request("thinking type '" + type + "' must be enabled, disabled or adaptive", "thinking.type");
    if (type != "enabled" && get_field(*th, "budget_tokens"))
      throw bad_request("'thinking.budget_tokens' applies to thinking type enabled only (with '" + type +
                            "' the model's own thinking cannot be bounded here)",
                        "thinking.budget_tokens");
    if (type == "enabled") {
      const ojson* b = get_field(*th, "budget_tokens");
      if (!b || !b->is_number_integer() || b->get<int64_t>() < 1)
        throw bad_request("'thinking.budget_tokens' must be a positive integer", "thinking.budget_tokens");
      // Enforced: at most that many thinking tokens, then the block is closed (thinking_token_budget).
      // As the Messages API, the budget must leave room for the answer.
      if (!count_only) {
        const ojson* mt = get_field(body, "max_tokens");
        if (mt && mt->is_number_integer() && b->get<int64_t>() >= mt->get<int64_t>())
          throw bad_request("'thinking.budget_tokens' must be less than 'max_tokens'", "thinking.budget_tokens");
        c["thinking_token_budget"] = *b;
      }
    }
    c["chat_template_kwargs"] = {{"thinking_mode", type}};
  }
  return c;
}

namespace {

class MessagesOutput final : public ApiOutput, BlockBuilder {
 public:
  MessagesOutput(std::string model, IdMaker ids) : model_(std::move(model)), ids_(std::move(ids)), id_(ids_("msg_")) {}

  std::string begin(int64_t input_tokens) override {
    ojson m = message();
    m["usage"] = {{"input_tokens", input_tokens}, {"output_tokens", 0}};
    return event("message_start", {{"message", m}}) + event("ping", ojson::object());
  }
  std::string delta(const ChoiceDelta& d) override { return feed(d); }
  std::string end(const ChoiceState& s, const ojson& u) override {
    std::string out = close_open();
    const auto [reason, seq] = stop(s);
    out += event("message_delta", {{"delta", {{"stop_reason", reason}, {"stop_sequence", seq}}},
                                   {"usage", {{"output_tokens", u.value("completion_tokens", int64_t(0))}}}});
    return out + event("message_stop", ojson::object());
  }
  ojson full(const ChoiceState& s, const ojson& u) override {
    feed(whole_delta(s));
    close_open();
    ojson m = message();
    for (size_t i = 0; i < blocks().size(); ++i) m["content"].push_back(block(i, true));
    const auto [reason, seq] = stop(s);
    m["stop_reason"] = reason;
    m["stop_sequence"] = seq;
    m["usage"] = {{"input_tokens", u.value("prompt_tokens", int64_t(0))},
                  {"output_tokens", u.value("completion_tokens", int64_t(0))}};
    return m;
  }
  std::string stream_error(int status, const std::string& message) override {
    return sse_named("error", anthropic_error_body(status, message));
  }

 private:
  std::string model_;
  IdMaker ids_;
  std::string id_;
  std::vector<std::string> tool_ids_;

  static std::string event(const char* type, ojson fields) {
    ojson e = {{"type", type}};
    for (auto it = fields.begin(); it != fields.end(); ++it) e[it.key()] = it.value();
    return sse_named(type, e);
  }
  ojson message() const {
    return {{"id", id_},          {"type", "message"},      {"role", "assistant"},      {"model", model_},
            {"content", ojson::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr}};
  }
  // The chat finish -> stop_reason and the stop sequence matched (a string stop_reason of the chat path).
  static std::pair<std::string, ojson> stop(const ChoiceState& s) {
    if (s.finish_reason == "length") return {"max_tokens", nullptr};
    if (s.finish_reason == "tool_calls") return {"tool_use", nullptr};
    if (s.stop_reason.is_string()) return {"stop_sequence", s.stop_reason};
    return {"end_turn", nullptr};
  }
  // Content block i; done: with its content (the final message), else as content_block_start shows it.
  ojson block(size_t i, bool done) const {
    const Block& b = blocks()[i];
    switch (b.kind) {
      case Kind::Reasoning: return {{"type", "thinking"}, {"thinking", done ? b.text : ""}, {"signature", ""}};
      case Kind::Text: return {{"type", "text"}, {"text", done ? b.text : ""}};
      case Kind::Tool: {
        ojson input = ojson::object();
        if (done && !b.text.empty()) {
          try {
            input = ojson::parse(b.text);
          } catch (const std::exception&) {
            input = ojson::object();  // the parser emits JSON objects; never expected
          }
        }
        return {{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", input}};
      }
    }
    return {};
  }
  std::string on_open(size_t i) override {
    return event("content_block_start", {{"index", i}, {"content_block", block(i, false)}});
  }
  std::string on_append(size_t i, const std::string& piece) override {
    ojson d;
    switch (blocks()[i].kind) {
      case Kind::Reasoning: d = {{"type", "thinking_delta"}, {"thinking", piece}}; break;
      case Kind::Text: d = {{"type", "text_delta"}, {"text", piece}}; break;
      case Kind::Tool: d = {{"type", "input_json_delta"}, {"partial_json", piece}}; break;
    }
    return event("content_block_delta", {{"index", i}, {"delta", d}});
  }
  std::string on_close(size_t i) override {
    std::string out;
    // The SDKs keep a thinking block's signature from a signature_delta; this server signs nothing.
    if (blocks()[i].kind == Kind::Reasoning)
      out += event("content_block_delta", {{"index", i}, {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
    return out + event("content_block_stop", {{"index", i}});
  }
};

}  // namespace

std::unique_ptr<ApiOutput> make_messages_output(std::string model, IdMaker ids) {
  return std::make_unique<MessagesOutput>(std::move(model), std::move(ids));
}

ojson anthropic_error_body(int status, const std::string& message) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 ? "overloaded_error"
                     : status >= 500 ? "api_error"
                                     : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

}  // namespace m3::server
