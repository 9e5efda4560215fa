// The M3 tool-call block grammar (see tool_grammar.h).
#include "structured/tool_grammar.h"

#include "structured/json_schema.h"

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

  ExprPtr value(const ojson& s0, const std::string& ptr, int depth) {
    if (depth > lim_.max_schema_depth) refuse("nesting deeper than " + std::to_string(lim_.max_schema_depth), ptr);
    std::string type;
    const ojson& s = unwrap(s0, ptr, type);
    if (s.is_object()) {
      for (const char* k : {"pattern", "format", "$ref", "allOf", "not", "patternProperties", "minLength", "maxLength"})
        if (s.contains(k)) refuse("the keyword '" + std::string(k) + "' in a tool parameter", ptr + "/" + k);
      if (s.contains("const")) return scalar_literal(s["const"], ptr + "/const");
      if (s.contains("enum") && s["enum"].is_array()) {
        std::vector<ExprPtr> alts;
        for (auto& v : s["enum"]) alts.push_back(scalar_literal(v, ptr + "/enum"));
        return e_alt(std::move(alts));
      }
    }
    if (type.empty() || type == "string") return text();
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
