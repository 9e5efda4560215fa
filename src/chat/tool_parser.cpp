// MiniMax tool-call parsing. One incremental engine serves both streaming and non-streaming use, so
// the two can never disagree. M3 markup puts the namespace token NS before every structural tag and
// names parameter elements after the parameter; only NS-prefixed tags are structure inside an invoke,
// so values may contain '<' freely (code). M2 uses <parameter name="k">value</parameter>.
#include "chat/tool_parser.h"

#include "chat/text_scan.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>

#include "chat/jinja/jinja_value.h"
#include "base/error.h"
#include "tokenizer/utf8.h"

namespace m3::chat {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kNs = "]<]minimax[>[";
const std::string kEndOfTurn = "[e~[";


std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}


bool is_proper_prefix_of(std::string_view s, const std::string& pat) {
  return s.size() < pat.size() && pat.compare(0, s.size(), s) == 0;
}

std::string decode_entities(const std::string& s) {
  if (s.find('&') == std::string::npos) return s;
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '&') {
      size_t semi = s.find(';', i);
      if (semi != std::string::npos && semi - i <= 10) {
        std::string ent = s.substr(i + 1, semi - i - 1);
        static const std::map<std::string, std::string> named{
            {"lt", "<"}, {"gt", ">"}, {"amp", "&"}, {"quot", "\""}, {"apos", "'"}};
        auto it = named.find(ent);
        if (it != named.end()) {
          out += it->second;
          i = semi + 1;
          continue;
        }
        if (ent.size() > 1 && ent[0] == '#') {
          bool hex = ent[1] == 'x' || ent[1] == 'X';
          std::string digits = ent.substr(hex ? 2 : 1);
          char* end = nullptr;
          unsigned long cp = digits.empty() ? 0 : std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
          if (!digits.empty() && end && *end == '\0' && cp > 0 && cp <= 0x10FFFF) {
            tok::append_utf8(out, uint32_t(cp));
            i = semi + 1;
            continue;
          }
        }
      }
    }
    out += s[i++];
  }
  return out;
}

// ---- schema typing ----

// Unwraps nullable anyOf/oneOf wrappers and ["T", "null"] type lists to the one schema that matters,
// following local "$ref"s into `root` (the tool's parameters), as the tool-call grammar does.
const ojson* unwrap(const ojson* s, const ojson* root) {
  for (int guard = 0; s && s->is_object() && guard < 16; ++guard) {
    if (s->contains("$ref") && (*s)["$ref"].is_string()) {
      const std::string ref = (*s)["$ref"].get<std::string>();
      if (!root || ref.empty() || ref[0] != '#') return nullptr;
      try {
        s = &root->at(ojson::json_pointer(ref.substr(1)));
      } catch (const std::exception&) {
        return nullptr;
      }
      continue;
    }
    const ojson* alts = nullptr;
    if (s->contains("anyOf") && (*s)["anyOf"].is_array()) alts = &(*s)["anyOf"];
    else if (s->contains("oneOf") && (*s)["oneOf"].is_array()) alts = &(*s)["oneOf"];
    if (!alts) return s;
    const ojson* pick = nullptr;
    for (auto& a : *alts)
      if (!(a.is_object() && a.contains("type") && a["type"] == "null")) {
        pick = &a;
        break;
      }
    s = pick;
  }
  return s;
}

std::string schema_type(const ojson* s) {
  if (!s || !s->is_object()) return "";
  if (!s->contains("type")) {
    if (s->contains("properties")) return "object";
    if (s->contains("items")) return "array";
    return "";
  }
  const ojson& t = (*s)["type"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (auto& x : t)
      if (x.is_string() && x != "null") return x.get<std::string>();
  return "";
}

const ojson* child_schema(const ojson* s, const char* key, const std::string& name = "") {
  if (!s || !s->is_object() || !s->contains(key)) return nullptr;
  const ojson& c = (*s)[key];
  if (name.empty()) return &c;
  if (c.is_object() && c.contains(name)) return &c[name];
  return nullptr;
}

bool parse_int(const std::string& t, int64_t& v) {
  if (t.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(t.c_str(), &end, 10);
  if (*end != '\0' || errno) return false;
  v = x;
  return true;
}

bool parse_float(const std::string& t, double& v) {
  if (t.empty() || is_ws(t[0])) return false;
  char* end = nullptr;
  double x = std::strtod(t.c_str(), &end);
  if (*end != '\0') return false;
  std::string lower = t;
  for (auto& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("inf") != std::string::npos || lower.find("nan") != std::string::npos || lower.find("0x") != std::string::npos)
    return false;
  v = x;
  return true;
}

// Schema-less inference on a primitive: true/false/null, integers, floats, else the raw string.
ojson infer_scalar(const std::string& raw) {
  std::string t = trim(raw);
  if (t == "true") return true;
  if (t == "false") return false;
  if (t == "null") return nullptr;
  int64_t i;
  if (parse_int(t, i)) return i;
  double d;
  if (parse_float(t, d)) return d;
  return decode_entities(raw);
}

ojson typed_scalar(const std::string& raw, const std::string& type) {
  std::string t = trim(raw);
  if (type == "string") return decode_entities(raw);
  if (type == "integer") {
    int64_t i;
    if (parse_int(t, i)) return i;
    double d;
    if (parse_float(t, d)) return d == double(int64_t(d)) ? ojson(int64_t(d)) : ojson(d);
    return decode_entities(raw);
  }
  if (type == "number") {
    int64_t i;
    if (parse_int(t, i)) return i;
    double d;
    if (parse_float(t, d)) return d;
    return decode_entities(raw);
  }
  if (type == "boolean") {
    std::string l = t;
    for (auto& c : l) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (l == "true" || l == "1") return true;
    if (l == "false" || l == "0") return false;
    return decode_entities(raw);
  }
  if (type == "null") return t == "null" || t.empty() ? ojson(nullptr) : ojson(decode_entities(raw));
  if (type == "object" || type == "array") {  // a JSON literal written as text
    ojson j = ojson::parse(decode_entities(t), nullptr, false);
    if (!j.is_discarded() && (type == "object" ? j.is_object() : j.is_array())) return j;
    if (t.empty()) return type == "object" ? ojson::object() : ojson::array();
    return decode_entities(raw);
  }
  return infer_scalar(raw);
}

// An element of an M3 invoke: raw text plus NS-tagged children, in order.
struct Node {
  std::string name;
  std::string text;
  std::vector<Node> children;
};

// Whether the schema admits null: {"type": [..., "null"]} or an anyOf / oneOf branch {"type": "null"}.
bool nullable(const ojson* s) {
  if (!s || !s->is_object()) return false;
  if (s->contains("type") && (*s)["type"].is_array())
    for (auto& x : (*s)["type"])
      if (x == "null") return true;
  for (const char* k : {"anyOf", "oneOf"})
    if (s->contains(k) && (*s)[k].is_array())
      for (auto& a : (*s)[k])
        if (a.is_object() && a.contains("type") && a["type"] == "null") return true;
  return false;
}

ojson convert(const Node& n, const ojson* schema, const ojson* root) {
  // "null" written for a parameter that may be null is JSON null (as vLLM's MiniMax parsers give it),
  // whatever its other type.
  if (n.children.empty() && nullable(schema) && trim(n.text) == "null") return nullptr;
  schema = unwrap(schema, root);
  std::string type = schema_type(schema);
  if (n.children.empty()) return typed_scalar(n.text, type);
  bool all_items = std::all_of(n.children.begin(), n.children.end(), [](const Node& c) { return c.name == "item"; });
  if (type == "array" || (type.empty() && all_items)) {
    ojson arr = ojson::array();
    const ojson* items = child_schema(schema, "items");
    for (auto& c : n.children) arr.push_back(convert(c, items, root));
    return arr;
  }
  ojson obj = ojson::object();
  for (auto& c : n.children) obj[c.name] = convert(c, child_schema(schema, "properties", c.name), root);
  std::string text = trim(n.text);
  if (!text.empty()) obj["$text"] = decode_entities(text);
  return obj;
}

std::string dumps(const ojson& j) { return jinja::Value::from_json(j).to_json(); }

std::string random_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = "chatcmpl-tool-";
  for (int i = 0; i < 32; ++i) id += hex[rng() & 15];
  return id;
}

}  // namespace

ToolFormat tool_format_from_name(const std::string& name) {
  if (name == "minimax_m3") return ToolFormat::MiniMaxM3;
  if (name == "minimax_m2") return ToolFormat::MiniMaxM2;
  throw Error("unknown tool-call parser '" + name + "' (expected minimax_m3 or minimax_m2)");
}

struct ToolParser::Impl {
  enum class Mode { Content, Block, Invoke, SkipInvoke };

  ToolFormat fmt;
  std::map<std::string, ojson> schemas;  // function name -> parameters schema
  ToolParserOptions opt;

  Mode mode = Mode::Content;
  std::string buf;
  std::vector<ToolCall> done;
  // The call being parsed.
  int index = -1;
  ToolCall cur;
  const ojson* cur_schema = nullptr;
  int params = 0;
  std::vector<Node> stack;  // M3 open elements
  int started = 0;          // invokes begun, counting skipped ones

  Impl(ToolFormat f, const nlohmann::json& tools, ToolParserOptions o) : fmt(f), opt(std::move(o)) {
    if (!opt.make_id) opt.make_id = random_id;
    if (tools.is_array())
      for (auto& t : tools) {
        const nlohmann::json& fn = t.contains("function") && t["function"].is_object() ? t["function"] : t;
        if (fn.contains("name") && fn["name"].is_string())
          schemas[fn["name"].get<std::string>()] = fn.contains("parameters") ? ojson(fn["parameters"]) : ojson();
      }
  }

  // ---- emission ----
  void start_call(const std::string& name, ToolStreamDelta& out) {
    ++started;
    if (!opt.parallel_tool_calls && started > 1) {
      mode = Mode::SkipInvoke;
      return;
    }
    cur = ToolCall{opt.make_id(), name, ""};
    auto it = schemas.find(name);
    cur_schema = it == schemas.end() ? nullptr : &it->second;
    params = 0;
    stack.clear();
    ++index;
    ToolCallDelta d;
    d.index = index;
    d.id = cur.id;
    d.name = name;
    out.tool_calls.push_back(std::move(d));
    mode = Mode::Invoke;
  }

  void add_fragment(const std::string& frag, ToolStreamDelta& out) {
    cur.arguments += frag;
    if (!out.tool_calls.empty() && out.tool_calls.back().index == index && !out.tool_calls.back().id)
      out.tool_calls.back().arguments += frag;  // merge fragments within one feed
    else {
      ToolCallDelta d;
      d.index = index;
      d.arguments = frag;
      out.tool_calls.push_back(std::move(d));
    }
  }

  void add_param(const std::string& key, const ojson& value, ToolStreamDelta& out) {
    add_fragment((params++ == 0 ? "{" : ", ") + dumps(ojson(key)) + ": " + dumps(value), out);
  }

  void end_call(ToolStreamDelta& out) {
    if (mode == Mode::Invoke) {
      while (!stack.empty()) close_element(stack.back().name, out);  // unclosed elements: close them
      add_fragment(params == 0 ? "{}" : "}", out);
      done.push_back(cur);
    }
    mode = Mode::Block;
  }

  void emit_content(std::string_view s, ToolStreamDelta& out) { out.content.append(s); }

  // ---- M3 elements ----
  const ojson* param_schema(const std::string& name) const {
    const ojson* s = unwrap(cur_schema, cur_schema);
    return child_schema(s, "properties", name);
  }

  void close_element(const std::string& name, ToolStreamDelta& out) {
    auto it = std::find_if(stack.rbegin(), stack.rend(), [&](const Node& n) { return n.name == name; });
    if (it == stack.rend()) return;  // closing tag with no open element: ignored
    size_t target = size_t(stack.rend() - it) - 1;
    while (stack.size() > target) {
      Node n = std::move(stack.back());
      stack.pop_back();
      if (stack.empty()) {
        add_param(n.name, convert(n, param_schema(n.name), cur_schema), out);
      } else {
        stack.back().children.push_back(std::move(n));
      }
    }
  }

  // ---- scanning ----
  void process(bool final, ToolStreamDelta& out) {
    if (fmt == ToolFormat::MiniMaxM3) process_m3(final, out);
    else process_m2(final, out);
    if (final) {
      if (mode == Mode::Content && !buf.empty()) emit_content(buf, out);
      buf.clear();
    }
  }

  // Content: everything up to the block opener; NS and end-of-turn markers are stripped.
  // Returns false when it must wait for more text.
  bool scan_content(const std::string& opener, const std::vector<std::string>& strip, bool final, ToolStreamDelta& out) {
    std::vector<std::string> pats{opener, kEndOfTurn};
    for (auto& s : strip) pats.push_back(s);
    if (fmt == ToolFormat::MiniMaxM3) pats.push_back(kNs + opener);
    size_t best = std::string::npos, which = 0;
    for (size_t i = 0; i < pats.size(); ++i) {
      size_t p = buf.find(pats[i]);
      if (p < best) best = p, which = i;
    }
    if (best == std::string::npos) {
      size_t hold = final ? 0 : partial_suffix(buf, pats);
      emit_content(std::string_view(buf).substr(0, buf.size() - hold), out);
      buf.erase(0, buf.size() - hold);
      return false;
    }
    emit_content(std::string_view(buf).substr(0, best), out);
    const std::string& pat = pats[which];
    if (pat == kNs) {
      std::string_view rest = std::string_view(buf).substr(best + kNs.size());
      const std::string invoke = "<invoke name=\"";
      if (!final && (is_proper_prefix_of(rest, opener) || is_proper_prefix_of(rest, invoke))) {
        buf.erase(0, best);  // maybe NS<tool_call> (or a bare invoke) still arriving
        return false;
      }
      if (rest.substr(0, opener.size()) == opener) {
        buf.erase(0, best + kNs.size() + opener.size());
        mode = Mode::Block;
        return true;
      }
      if (rest.substr(0, invoke.size()) == invoke) {  // missing <tool_call> opener: still a call
        buf.erase(0, best);
        mode = Mode::Block;
        return true;
      }
    }
    if (pat == opener && fmt == ToolFormat::MiniMaxM3) {
      // A bare <tool_call> (no namespace token) opens a block only when an NS invoke follows; otherwise it
      // is text, e.g. an answer that explains another model's tool format ("wrap calls in <tool_call> tags").
      std::string_view rest = std::string_view(buf).substr(best + opener.size());
      while (!rest.empty() && is_ws(rest.front())) rest.remove_prefix(1);
      // (A wholly bare block, tags without NS, stays text too: its parameters could not be read.)
      const std::string ns_invoke = kNs + "<invoke name=\"";
      const bool call = rest.substr(0, ns_invoke.size()) == ns_invoke;
      if (!call) {
        if (!final && (rest.empty() || is_proper_prefix_of(rest, ns_invoke))) {
          buf.erase(0, best);  // still undecided
          return false;
        }
        emit_content(opener, out);
        buf.erase(0, best + opener.size());
        return true;
      }
    }
    buf.erase(0, best + pat.size());
    if (pat == opener || pat == kNs + opener) mode = Mode::Block;
    return true;
  }

  // Block level: whitespace, `<invoke name="...">`, the block closer; NS before them is optional.
  bool scan_block(const std::string& closer, bool final, ToolStreamDelta& out) {
    size_t i = 0;
    while (i < buf.size() && is_ws(buf[i])) ++i;
    buf.erase(0, i);
    if (buf.empty()) return false;
    std::string_view b = buf;
    size_t skip = 0;
    if (fmt == ToolFormat::MiniMaxM3) {
      if (b.substr(0, kNs.size()) == kNs) skip = kNs.size();
      else if (!final && is_proper_prefix_of(b, kNs)) return false;
    }
    std::string_view r = b.substr(skip);
    const std::string open = "<invoke name=\"";
    if (r.substr(0, open.size()) == open) {
      size_t q = r.find('"', open.size());
      if (q == std::string_view::npos) return false;  // name not complete yet
      size_t gt = r.find('>', q);
      if (gt == std::string_view::npos) return false;
      std::string name(r.substr(open.size(), q - open.size()));
      buf.erase(0, skip + gt + 1);
      start_call(name, out);
      return true;
    }
    if (r.substr(0, closer.size()) == closer) {
      buf.erase(0, skip + closer.size());
      mode = Mode::Content;
      return true;
    }
    if (!final && (is_proper_prefix_of(r, open) || is_proper_prefix_of(r, closer) || r.empty())) return false;
    // Anything else between invokes is noise (never content): drop up to the next plausible tag.
    size_t next = buf.find_first_of("<]", 1);
    buf.erase(0, next == std::string::npos ? buf.size() : next);
    return true;
  }

  void process_m3(bool final, ToolStreamDelta& out) {
    const std::string opener = "<tool_call>", closer = "</tool_call>";
    while (true) {
      if (mode == Mode::Content) {
        if (!scan_content(opener, {kNs}, final, out)) return;
      } else if (mode == Mode::Block) {
        if (!scan_block(closer, final, out)) return;
      } else {  // Invoke / SkipInvoke: NS-prefixed tags are structure, everything else is text
        size_t p = buf.find(kNs);
        if (p == std::string::npos) {
          size_t hold = final ? 0 : partial_suffix(buf, {kNs});
          append_text(std::string_view(buf).substr(0, buf.size() - hold));
          buf.erase(0, buf.size() - hold);
          return;
        }
        append_text(std::string_view(buf).substr(0, p));
        buf.erase(0, p);
        std::string_view rest = std::string_view(buf).substr(kNs.size());
        if (rest.empty() || (rest[0] == '<' && rest.find('>') == std::string_view::npos && rest.size() < 512)) {
          if (!final) return;  // tag still arriving
          buf.clear();
          return;
        }
        if (rest[0] != '<') {  // stray NS inside a value: dropped
          buf.erase(0, kNs.size());
          continue;
        }
        size_t gt = rest.find('>');
        std::string tag(rest.substr(1, gt - 1));
        buf.erase(0, kNs.size() + gt + 1);
        if (tag == "/invoke") {
          end_call(out);
        } else if (tag == "/tool_call") {  // block closed without </invoke>: the open invoke is cut
          mode = Mode::Content;
        } else if (mode == Mode::SkipInvoke) {
          continue;
        } else if (!tag.empty() && tag[0] == '/') {
          close_element(tag.substr(1), out);
        } else {
          stack.push_back(Node{trim(tag), "", {}});
        }
      }
    }
  }

  void append_text(std::string_view t) {
    if (mode == Mode::Invoke && !stack.empty()) stack.back().text.append(t);
  }

  void process_m2(bool final, ToolStreamDelta& out) {
    const std::string opener = "<minimax:tool_call>", closer = "</minimax:tool_call>";
    while (true) {
      if (mode == Mode::Content) {
        if (!scan_content(opener, {}, final, out)) return;
      } else if (mode == Mode::Block) {
        if (!scan_block(closer, final, out)) return;
      } else {
        size_t i = 0;
        while (i < buf.size() && is_ws(buf[i])) ++i;
        buf.erase(0, i);
        if (buf.empty()) return;
        const std::string popen = "<parameter name=\"", pclose = "</parameter>", iclose = "</invoke>";
        std::string_view b = buf;
        if (b.substr(0, popen.size()) == popen) {
          size_t q = b.find('"', popen.size());
          size_t gt = q == std::string_view::npos ? q : b.find('>', q);
          size_t end = gt == std::string_view::npos ? gt : b.find(pclose, gt);
          if (end == std::string_view::npos) {
            if (final) buf.clear();
            return;  // value still arriving (M2 streams each parameter whole)
          }
          std::string key(b.substr(popen.size(), q - popen.size()));
          std::string value(b.substr(gt + 1, end - gt - 1));
          buf.erase(0, end + pclose.size());
          if (mode == Mode::Invoke) add_param(key, m2_value(key, value), out);
          continue;
        }
        if (b.substr(0, iclose.size()) == iclose) {
          buf.erase(0, iclose.size());
          end_call(out);
          continue;
        }
        if (b.substr(0, closer.size()) == closer) {  // block closed inside an invoke: the invoke is cut
          buf.erase(0, closer.size());
          mode = Mode::Content;
          continue;
        }
        if (!final && (is_proper_prefix_of(b, popen) || is_proper_prefix_of(b, iclose) || is_proper_prefix_of(b, closer)))
          return;
        size_t next = buf.find('<', 1);
        buf.erase(0, next == std::string::npos ? buf.size() : next);
        if (final && buf.empty()) return;
      }
    }
  }

  // M2 values are JSON-ish text: one newline of padding on each side is template layout, not data.
  ojson m2_value(const std::string& key, std::string v) {
    if (!v.empty() && v.front() == '\n') v.erase(0, 1);
    if (!v.empty() && v.back() == '\n') v.pop_back();
    const ojson* s = unwrap(param_schema(key), cur_schema);
    std::string type = schema_type(s);
    if (type.empty()) {
      std::string t = trim(v);
      ojson j = ojson::parse(t, nullptr, false);
      if (!j.is_discarded() && (j.is_object() || j.is_array())) return j;
      return infer_scalar(v);
    }
    return typed_scalar(v, type);
  }
};

ToolParser::ToolParser(ToolFormat fmt, const nlohmann::json& tools, ToolParserOptions opt)
    : impl_(std::make_unique<Impl>(fmt, tools, std::move(opt))) {}
ToolParser::~ToolParser() = default;
ToolParser::ToolParser(ToolParser&&) noexcept = default;

ToolStreamDelta ToolParser::feed(std::string_view delta) {
  ToolStreamDelta out;
  impl_->buf.append(delta);
  impl_->process(false, out);
  return out;
}

ToolStreamDelta ToolParser::finish() {
  ToolStreamDelta out;
  impl_->process(true, out);
  return out;
}

const std::vector<ToolCall>& ToolParser::calls() const { return impl_->done; }
bool ToolParser::incomplete() const { return impl_->mode == Impl::Mode::Invoke; }

ToolParseResult ToolParser::parse(std::string_view text) const {
  Impl p(impl_->fmt, nlohmann::json(), impl_->opt);
  p.schemas = impl_->schemas;
  ToolStreamDelta out;
  p.buf.assign(text);
  p.process(true, out);
  ToolParseResult r;
  r.content = std::move(out.content);
  r.calls = p.done;
  r.incomplete = p.mode == Impl::Mode::Invoke;
  return r;
}

}  // namespace m3::chat
