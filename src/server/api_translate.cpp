// Shared pieces of the Responses and Messages translators (see api_translate.h).
#include "server/api_translate.h"

#include <algorithm>
#include <random>
#include <utility>

#include "server/openai_response.h"
#include "server/request_fields.h"

namespace m3::server {

ApiError rename_error(const ApiError& e, const FieldNames& names) {
  std::string param = e.param, msg = e.what();
  for (const auto& [chat, api] : names) {
    if (param == chat) param = api;
    // The message quotes the chat name ('stop' must be ...): quote the API's instead.
    const std::string q = "'" + chat + "'";
    for (size_t at = msg.find(q); at != std::string::npos; at = msg.find(q, at + api.size() + 2))
      msg.replace(at, q.size(), "'" + api + "'");
  }
  return ApiError(e.status, msg, param);
}

void ChatContent::add_image(const std::string& url, const std::string& where, std::vector<std::string>& names) {
  if (!text_.empty()) parts_.push_back({{"type", "text"}, {"text", std::exchange(text_, "")}});
  parts_.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
  names.push_back(where);
  images_ = true;
}

ojson ChatContent::take() {
  if (!images_) return std::exchange(text_, "");
  if (!text_.empty()) parts_.push_back({{"type", "text"}, {"text", std::exchange(text_, "")}});
  images_ = false;
  return std::exchange(parts_, ojson::array());
}

IdMaker random_ids() {
  return [](const char* prefix) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char* hex = "0123456789abcdef";
    std::string s = prefix;
    for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
    return s;
  };
}

ChoiceDelta whole_delta(const ChoiceState& s) {
  ChoiceDelta d;
  d.reasoning = s.reasoning;
  d.content = s.content;
  int i = 0;
  for (const chat::ToolCall& c : s.tool_calls()) d.tool_calls.push_back({i++, c.id, c.name, c.arguments});
  d.finished = true;
  return d;
}

std::string BlockBuilder::open_block(Block b) {
  std::string out = close_open();
  blocks_.push_back(std::move(b));
  open_ = int(blocks_.size()) - 1;
  return out + on_open(blocks_.size() - 1);
}

std::string BlockBuilder::close_open() {
  if (open_ < 0) return {};
  const size_t i = size_t(open_);
  open_ = -1;
  return on_close(i);
}

std::string BlockBuilder::feed(const ChoiceDelta& d) {
  std::string out;
  auto append = [&](Kind k, const std::string& piece) {
    if (piece.empty()) return;
    if (open_ < 0 || blocks_[size_t(open_)].kind != k) out += open_block({k, "", "", ""});
    blocks_[size_t(open_)].text += piece;
    out += on_append(size_t(open_), piece);
  };
  append(Kind::Reasoning, d.reasoning);
  append(Kind::Text, d.content);
  for (const chat::ToolCallDelta& t : d.tool_calls) {
    auto it = std::find_if(tool_block_.begin(), tool_block_.end(), [&](auto& p) { return p.first == t.index; });
    if (it == tool_block_.end()) {
      out += open_block({Kind::Tool, "", t.id.value_or(""), t.name.value_or("")});
      tool_block_.emplace_back(t.index, blocks_.size() - 1);
      it = tool_block_.end() - 1;
    }
    // Argument fragments of a call belong to its block even if (never so far) another block opened since.
    if (t.arguments.empty()) continue;
    blocks_[it->second].text += t.arguments;
    out += on_append(it->second, t.arguments);
  }
  return out;
}

namespace {
bool listed(const std::vector<const char*>& names, const std::string& k) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return k == n; });
}
}  // namespace

void check_api_fields(const ojson& body, const std::vector<const char*>& served, const std::vector<RefusedRule>& refused,
                      const char* endpoint) {
  std::vector<std::string> unknown;
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    auto r = std::find_if(refused.begin(), refused.end(), [&](const RefusedRule& x) { return k == x.name; });
    if (r != refused.end()) {
      if (!r->is_default(it.value()))
        throw bad_request("'" + k + "' asks for " + r->what + ", which this server does not support; leave it out", k);
      continue;
    }
    if (!listed(served, k)) unknown.push_back(k);
  }
  if (!unknown.empty()) warn_unknown_fields(unknown, endpoint);
}

bool json_null(const ojson& v) { return v.is_null(); }
bool json_null_or_false(const ojson& v) { return v.is_null() || (v.is_boolean() && !v.get<bool>()); }
bool json_null_or_empty(const ojson& v) {
  return v.is_null() || ((v.is_array() || v.is_object() || v.is_string()) && v.empty());
}

const ojson* get_field(const ojson& b, const char* key) {
  auto it = b.find(key);
  return it == b.end() || it->is_null() ? nullptr : &*it;
}

std::string string_field(const ojson& v, const std::string& where) {
  if (!v.is_string()) throw bad_request("'" + where + "' must be a string", where);
  return v.get<std::string>();
}

const ojson& object_field(const ojson& v, const std::string& where) {
  if (!v.is_object()) throw bad_request("'" + where + "' must be an object", where);
  return v;
}

const ojson& array_field(const ojson& v, const std::string& where) {
  if (!v.is_array()) throw bad_request("'" + where + "' must be a list", where);
  return v;
}

std::string indexed(const std::string& where, size_t i) { return where + "[" + std::to_string(i) + "]"; }

std::string required_string(const ojson& o, const char* key, const std::string& where) {
  const ojson* v = get_field(object_field(o, where), key);
  return string_field(v ? *v : ojson(), where + "." + key);
}

ojson flat_tools_to_chat(const ojson& tools, const char* served_type, const char* schema_key, bool schema_required,
                         const char* served) {
  array_field(tools, "tools");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string w = indexed("tools", i);
    const ojson& t = object_field(tools[i], w);
    if (const ojson* ty = get_field(t, "type"); ty && !(ty->is_string() && ty->get<std::string>() == served_type))
      throw bad_request(w + ": tool type " + ty->dump() + " is not supported by this server (" + served + ")", w + ".type");
    ojson fn = {{"name", required_string(t, "name", w)}};
    if (const ojson* d = get_field(t, "description")) fn["description"] = *d;
    const ojson* s = get_field(t, schema_key);
    if (!s && schema_required) throw bad_request("'" + w + "." + schema_key + "' is required", w + "." + schema_key);
    if (s) fn["parameters"] = object_field(*s, w + "." + schema_key);
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

std::string sse_named(const std::string& name, const ojson& data) {
  return "event: " + name + "\ndata: " + dump(data) + "\n\n";
}

}  // namespace m3::server
