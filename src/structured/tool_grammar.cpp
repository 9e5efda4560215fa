// The M3 tool-call block grammar (see tool_grammar.h).
#include "structured/tool_grammar.h"

#include <map>

#include "structured/json_schema.h"
#include "structured/regex.h"

namespace m3::structured {

namespace {

using ojson = nlohmann::ordered_json;

class ToolBuilder {
 public:
  ToolBuilder(const Limits& lim) : lim_(lim) {}
  Grammar g;

  ExprPtr ns_tag(const std::string& tag) { return e_lit(std::string(kToolNamespaceText) + tag); }

  [[noreturn]] void refuse(const std::string& what, const std::string& ptr) {
    throw StructuredError("structured output: tool_choice: " + what + " at " + ptr + " is not supported");
  }

  // Text values: no '&', no "]<".
  ExprPtr text() {
    // ( [^]&] | ]+ [^]<&] )* ]*
    const auto plain = e_codepoints(cp_complement({{']', ']'}, {'&', '&'}}));
    const auto after = e_codepoints(cp_complement({{']', ']'}, {'<', '<'}, {'&', '&'}}));
    return e_seq({e_star(e_alt({plain, e_seq({e_plus(e_byte(']')), after})})), e_star(e_byte(']'))});
  }

  const ojson& unwrap(const ojson& s, const std::string& ptr, std::string& type) {
    type.clear();
    if (!s.is_object()) {
      if (s.is_boolean() && s.get<bool>()) return s;
      refuse("a schema that is not an object", ptr);
    }
    for (const char* k : {"anyOf", "oneOf"})
      if (s.contains(k) && s[k].is_array()) {
        const ojson* keep = nullptr;
        for (auto& a : s[k]) {
          if (a.is_object() && a.contains("type") && a["type"] == "null") continue;
          if (keep) refuse("'" + std::string(k) + "' with more than one non-null branch", ptr + "/" + k);
          keep = &a;
        }
        if (!keep) refuse("'" + std::string(k) + "' with only null", ptr);
        return unwrap(*keep, ptr + "/" + k, type);
      }
    if (s.contains("type")) {
      if (s["type"].is_string()) type = s["type"].get<std::string>();
      else if (s["type"].is_array()) {
        for (auto& t : s["type"])
          if (t.is_string() && t != "null") {
            if (!type.empty()) refuse("a 'type' list with more than one non-null type", ptr + "/type");
            type = t.get<std::string>();
          }
        if (type.empty()) type = "null";
      }
    } else if (s.contains("properties")) type = "object";
    else if (s.contains("items")) type = "array";
    return s;
  }

  // The tool whose parameters are being read: local $refs point into them; each target is one rule
  // (recursion included).
  void begin_tool(const ojson& params, const std::string& ptr) {
    root_ = &params;
    root_ptr_ = ptr;
    refs_.clear();
  }

  ExprPtr ref(const std::string& target, const std::string& ptr, int depth) {
    auto it = refs_.find(target);
    if (it != refs_.end()) return e_ref(it->second);
    const ojson& t = json_resolve_ref(*root_, target, ptr + "/$ref");
    const int r = g.add_rule(root_ptr_ + " " + target);
    refs_[target] = r;
    g.set_body(r, value(t, root_ptr_ + target.substr(1), depth + 1));
    return e_ref(r);
  }

  // A string value: its raw text between the tags. format / pattern / minLength / maxLength as JSON
  // Schema means them, on the text as written (a pattern must match the whole text: a restriction of
  // JSON Schema's search semantics, so every value still validates; bounded lengths leave out ']').
  ExprPtr string_value(const ojson& s, const std::string& ptr) {
    if (!s.is_object()) return text();
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("format")) {
      if (has_len || s.contains("pattern")) refuse("'format' together with 'pattern', 'minLength' or 'maxLength'", ptr + "/format");
      const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
      const std::string* rx = json_format_regex(f);
      if (!rx) refuse("the format '" + f + "' (supported: date, time, date-time, uuid, ipv4, email)", ptr + "/format");
      return regex_expr(*rx, RegexMode::Raw, lim_, "format at " + ptr);
    }
    if (s.contains("pattern")) {
      if (has_len) refuse("'pattern' together with 'minLength' or 'maxLength'", ptr + "/pattern");
      if (!s["pattern"].is_string()) refuse("a 'pattern' that is not a string", ptr + "/pattern");
      return regex_expr(s["pattern"].get<std::string>(), RegexMode::Raw, lim_, "'pattern' at " + ptr + "/pattern");
    }
    if (!has_len) return text();
    auto count = [&](const char* k, int dflt) {
      if (!s.contains(k)) return dflt;
      if (!s[k].is_number_integer() || s[k].get<int64_t>() < 0 || s[k].get<int64_t>() > lim_.max_repeat)
        refuse("'" + std::string(k) + "' outside 0.." + std::to_string(lim_.max_repeat), ptr + "/" + k);
      return int(s[k].get<int64_t>());
    };
    const int mn = count("minLength", 0), mx = count("maxLength", -1);
    if (mx >= 0 && mx < mn) refuse("'maxLength' below 'minLength' (it matches nothing)", ptr + "/maxLength");
    return e_rep(e_codepoints(cp_complement({{']', ']'}, {'&', '&'}})), mn, mx);
  }

  ExprPtr value(const ojson& s0, const std::string& ptr, int depth) {
    if (depth > lim_.max_schema_depth) refuse("nesting deeper than " + std::to_string(lim_.max_schema_depth), ptr);
    if (s0.is_object() && s0.contains("$ref")) {
      if (!s0["$ref"].is_string()) refuse("a '$ref' that is not a string", ptr + "/$ref");
      return ref(s0["$ref"].get<std::string>(), ptr, depth);
    }
    std::string type;
    const ojson& s = unwrap(s0, ptr, type);
    if (s.is_object() && s.contains("$ref")) {  // the one non-null branch of an anyOf / oneOf
      if (!s["$ref"].is_string()) refuse("a '$ref' that is not a string", ptr + "/$ref");
      return ref(s["$ref"].get<std::string>(), ptr, depth);
    }
    if (s.is_object()) {
      for (const char* k : {"allOf", "not", "patternProperties"})
        if (s.contains(k)) refuse("the keyword '" + std::string(k) + "' in a tool parameter", ptr + "/" + k);
      if (s.contains("const")) return scalar_literal(s["const"], ptr + "/const");
      if (s.contains("enum") && s["enum"].is_array()) {
        std::vector<ExprPtr> alts;
        for (auto& v : s["enum"]) alts.push_back(scalar_literal(v, ptr + "/enum"));
        return e_alt(std::move(alts));
      }
    }
    if (type.empty() || type == "string") return string_value(s, ptr);
    if (type == "integer") return json_integer_expr(s, ptr);
    if (type == "number") return json_number_expr(s, ptr);
    if (type == "boolean") return e_alt({e_lit("true"), e_lit("false")});
    if (type == "null") return e_lit("null");
    if (type == "object") return members(s, ptr, depth);
    if (type == "array") {
      const ojson* it = s.contains("items") ? &s["items"] : nullptr;
      ExprPtr item = it ? value(*it, ptr + "/items", depth + 1) : text();
      const int r = g.add_rule(ptr + "/items");
      g.set_body(r, e_seq({ns_tag("<item>"), item, ns_tag("</item>")}));
      const int mn = s.contains("minItems") ? s["minItems"].get<int>() : 0;
      const int mx = s.contains("maxItems") ? s["maxItems"].get<int>() : -1;
      if (mn > lim_.max_repeat || mx > lim_.max_repeat) refuse("minItems/maxItems over the limit", ptr);
      return e_rep(e_ref(r), mn, mx);
    }
    refuse("the type '" + type + "'", ptr);
  }

  ExprPtr scalar_literal(const ojson& v, const std::string& ptr) {
    if (v.is_string()) {
      const std::string t = v.get<std::string>();
      if (t.find('&') != std::string::npos || t.find("]<") != std::string::npos) refuse("a value with '&' or \"]<\"", ptr);
      return e_lit(t);
    }
    if (v.is_object() || v.is_array()) refuse("an object or array in enum/const", ptr);
    return e_lit(v.dump());
  }

  ExprPtr members(const ojson& s, const std::string& ptr, int depth) {
    std::vector<ExprPtr> seq;
    if (!s.contains("properties")) return e_empty();
    std::vector<std::string> req;
    if (s.contains("required") && s["required"].is_array())
      for (auto& r : s["required"])
        if (r.is_string()) req.push_back(r.get<std::string>());
    for (auto& [k, v] : s["properties"].items()) {
      if (k.empty() || k.find_first_of("<>/ \t\n\"&") != std::string::npos) refuse("the property name '" + k + "'", ptr);
      const int r = g.add_rule(ptr + "/properties/" + k);
      g.set_body(r, e_seq({ns_tag("<" + k + ">"), value(v, ptr + "/properties/" + k, depth + 1), ns_tag("</" + k + ">")}));
      const bool required = std::find(req.begin(), req.end(), k) != req.end();
      seq.push_back(required ? e_ref(r) : e_opt(e_ref(r)));
    }
    return e_seq(std::move(seq));
  }

 private:
  const Limits& lim_;
  const ojson* root_ = nullptr;
  std::string root_ptr_;
  std::map<std::string, int> refs_;
};

}  // namespace

Grammar tool_call_grammar(const nlohmann::ordered_json& tools, const std::string& only, bool parallel, const Limits& limits) {
  ToolBuilder b(limits);
  const int root = b.g.add_rule("root");
  std::vector<ExprPtr> invokes;
  if (!tools.is_array() || tools.empty()) throw StructuredError("structured output: tool_choice needs a non-empty 'tools' list");
  bool found = false;
  for (size_t i = 0; i < tools.size(); ++i) {
    const nlohmann::ordered_json& t = tools[i];
    const nlohmann::ordered_json& fn = t.contains("function") && t["function"].is_object() ? t["function"] : t;
    if (!fn.contains("name") || !fn["name"].is_string()) throw StructuredError("structured output: tools[" + std::to_string(i) + "] has no function name");
    const std::string name = fn["name"].get<std::string>();
    if (!only.empty() && name != only) continue;
    found = true;
    if (name.find_first_of("\"<>&") != std::string::npos) b.refuse("the tool name '" + name + "'", "/tools/" + std::to_string(i));
    const std::string ptr = "/tools/" + std::to_string(i) + "/function/parameters";
    const ojson params = fn.contains("parameters") ? ojson(fn["parameters"]) : ojson::object();
    b.begin_tool(params, ptr);
    ExprPtr body = b.members(params, ptr, 0);
    const int r = b.g.add_rule("invoke " + name);
    b.g.set_body(r, e_seq({b.ns_tag("<invoke name=\"" + name + "\">"), body, b.ns_tag("</invoke>"), e_byte('\n')}));
    invokes.push_back(e_ref(r));
  }
  if (!found) throw StructuredError("structured output: tool_choice names the function '" + only + "', which 'tools' does not list");
  ExprPtr inv = e_alt(std::move(invokes));
  b.g.set_body(root, e_seq({b.ns_tag("<tool_call>\n"), (parallel && only.empty()) ? e_plus(inv) : inv, b.ns_tag("</tool_call>")}));
  b.g.root = root;
  return std::move(b.g);
}

}  // namespace m3::structured
