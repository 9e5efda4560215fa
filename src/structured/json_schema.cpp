// JSON Schema -> grammar (see json_schema.h for what is supported, refused and restricted).
#include "structured/json_schema.h"

#include <cmath>
#include <map>
#include <set>

#include "structured/regex.h"
#include "tokenizer/utf8.h"

namespace m3::structured {

using ojson = nlohmann::ordered_json;

namespace {

const ExprPtr kDigit = e_bytes({{'0', '9'}});

// ---- integer ranges as digit patterns (no leading zeros) ----
// Same number of digits, a <= b (decimal strings).
ExprPtr same_len(const std::string& a, const std::string& b) {
  if (a.empty()) return e_empty();
  if (a[0] == b[0]) return e_seq({e_byte(uint8_t(a[0])), same_len(a.substr(1), b.substr(1))});
  const std::string ra = a.substr(1), rb = b.substr(1);
  const bool a_min = ra.find_first_not_of('0') == std::string::npos;
  const bool b_max = rb.find_first_not_of('9') == std::string::npos;
  const int n = int(ra.size());
  if (a_min && b_max) return e_seq({e_bytes({{uint8_t(a[0]), uint8_t(b[0])}}), e_rep(kDigit, n, n)});
  std::vector<ExprPtr> alts;
  int lo = a[0], hi = b[0];
  if (a_min) {
    // a[0]..b[0]-1 full, then b[0] partial
    alts.push_back(e_seq({e_bytes({{uint8_t(lo), uint8_t(hi - 1)}}), e_rep(kDigit, n, n)}));
    alts.push_back(e_seq({e_byte(uint8_t(hi)), same_len(std::string(size_t(n), '0'), rb)}));
    return e_alt(std::move(alts));
  }
  alts.push_back(e_seq({e_byte(uint8_t(lo)), same_len(ra, std::string(size_t(n), '9'))}));
  if (lo + 1 <= hi - 1) alts.push_back(e_seq({e_bytes({{uint8_t(lo + 1), uint8_t(hi - 1)}}), e_rep(kDigit, n, n)}));
  if (b_max) alts.push_back(e_seq({e_byte(uint8_t(hi)), e_rep(kDigit, n, n)}));
  else alts.push_back(e_seq({e_byte(uint8_t(hi)), same_len(std::string(size_t(n), '0'), rb)}));
  return e_alt(std::move(alts));
}

std::string pow10m1(int digits) { return std::string(size_t(digits), '9'); }
std::string pow10(int digits) { return "1" + std::string(size_t(digits - 1), '0'); }  // 10^(digits-1)

constexpr int kMaxIntDigits = 18;

// Non-negative integers in [a, b] (b < 0: unbounded, up to max(kMaxIntDigits, digits of a) digits).
ExprPtr mag_range(uint64_t a, int64_t b) {
  const std::string sa = std::to_string(a);
  std::vector<ExprPtr> alts;
  const int da = int(sa.size());
  if (b >= 0 && uint64_t(b) < a) return nullptr;
  const int db = b >= 0 ? int(std::to_string(b).size()) : std::max(kMaxIntDigits, da);
  for (int d = da; d <= db; ++d) {
    std::string lo = d == da ? sa : pow10(d);
    std::string hi = (b >= 0 && d == db) ? std::to_string(b) : pow10m1(d);
    if (d == 1 && d != da) lo = "0";
    alts.push_back(same_len(lo, hi));
  }
  return e_alt(std::move(alts));
}

[[noreturn]] void refuse(const std::string& what, const std::string& ptr) {
  throw StructuredError("structured output: " + what + " at " + (ptr.empty() ? std::string("#") : ptr) +
                        " is not supported");
}

bool get_int_bound(const ojson& s, const char* key, const std::string& ptr, int64_t& v) {
  if (!s.contains(key)) return false;
  const ojson& x = s[key];
  if (x.is_number_integer()) {
    v = x.get<int64_t>();
    return true;
  }
  if (x.is_number_float()) {
    const double d = x.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 1e17) {
      v = int64_t(d);
      return true;
    }
    refuse("'" + std::string(key) + "' with a non-integral value", ptr + "/" + key);
  }
  if (x.is_boolean()) return false;  // draft-4 exclusive flags, handled by the caller
  throw StructuredError("structured output: '" + std::string(key) + "' at " + ptr + " must be a number");
}

// Integers in [lo, hi] (either side optional).
ExprPtr int_range(bool has_lo, int64_t lo, bool has_hi, int64_t hi) {
  std::vector<ExprPtr> alts;
  // negative part: [lo, min(hi, -1)]
  if (!has_lo || lo < 0) {
    const int64_t top = has_hi ? std::min<int64_t>(hi, -1) : -1;
    if (!has_lo || lo <= top) {
      const uint64_t a = uint64_t(-(top));
      const int64_t b = has_lo ? -lo : -1;
      if (ExprPtr m = mag_range(a, b)) alts.push_back(e_seq({e_byte('-'), m}));
    }
  }
  // non-negative part: [max(lo, 0), hi]
  if (!has_hi || hi >= 0) {
    const uint64_t a = has_lo ? uint64_t(std::max<int64_t>(lo, 0)) : 0;
    if (ExprPtr m = mag_range(a, has_hi ? hi : -1)) alts.push_back(m);
  }
  if (alts.empty()) return nullptr;
  return e_alt(std::move(alts));
}

ExprPtr frac_digits() { return e_seq({e_byte('.'), e_rep(kDigit, 1, 16)}); }

// Non-negative reals with magnitude in [L, H] (H < 0: unbounded), written without exponent.
ExprPtr real_mag(int64_t L, int64_t H) {
  std::vector<ExprPtr> alts;
  if (H < 0) return e_seq({mag_range(uint64_t(L), -1), e_opt(frac_digits())});
  if (H - 1 >= L) alts.push_back(e_seq({mag_range(uint64_t(L), H - 1), e_opt(frac_digits())}));
  alts.push_back(e_seq({e_lit(std::to_string(H)), e_opt(e_seq({e_byte('.'), e_rep(e_byte('0'), 1, 16)}))}));
  return e_alt(std::move(alts));
}

ExprPtr ws_expr(int n) {
  if (n <= 0) return e_empty();
  return e_rep(e_bytes({{'\t', '\n'}, {' ', ' '}}), 0, n);
}

ExprPtr json_string_chars(int min, int max) {
  return e_seq({e_byte('"'), e_rep(json_chars({{0, 0x10FFFF}}), min, max), e_byte('"')});
}

// A JSON string (with its quotes) whose value is none of `names`: additional members never repeat a
// declared property name (a duplicate key would let the later value escape its schema).
ExprPtr json_key_excluding(const std::vector<std::string>& names) {
  struct Node {
    std::map<uint32_t, int> kids;
    bool word = false;
  };
  std::vector<Node> t(1);
  for (auto& n : names) {
    int cur = 0;
    for (size_t i = 0; i < n.size();) {
      uint32_t cp;
      const size_t len = tok::decode_utf8(n, i, cp);
      if (len == 0) break;
      i += len;
      auto it = t[size_t(cur)].kids.find(cp);
      if (it == t[size_t(cur)].kids.end()) {
        t.push_back({});
        const int id = int(t.size()) - 1;
        t[size_t(cur)].kids[cp] = id;
        cur = id;
      } else cur = it->second;
    }
    t[size_t(cur)].word = true;
  }
  const ExprPtr rest = e_seq({e_star(json_chars({{0, 0x10FFFF}})), e_byte('"')});
  auto build = [&](int node, auto&& self) -> ExprPtr {
    std::vector<ExprPtr> alts;
    if (!t[size_t(node)].word) alts.push_back(e_byte('"'));
    std::vector<std::pair<uint32_t, uint32_t>> used;
    for (auto& [cp, kid] : t[size_t(node)].kids) {
      used.push_back({cp, cp});
      alts.push_back(e_seq({json_chars({{cp, cp}}), self(kid, self)}));
    }
    alts.push_back(e_seq({json_chars(cp_complement(used)), rest}));
    return e_alt(std::move(alts));
  };
  return e_seq({e_byte('"'), build(0, build)});
}

const std::set<std::string> kAnnotations{"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                         "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "$anchor",
                                         "contentMediaType", "contentEncoding", "contentSchema"};
const std::set<std::string> kRefused{"not", "if", "then", "else", "multipleOf", "uniqueItems", "contains",
                                     "minContains", "maxContains", "patternProperties", "propertyNames",
                                     "minProperties", "maxProperties", "dependentRequired", "dependentSchemas",
                                     "dependencies", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
                                     "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor", "additionalItems"};
const std::set<std::string> kKnown{"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required",
                                   "additionalProperties", "items", "prefixItems", "minItems", "maxItems", "minLength",
                                   "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                   "exclusiveMaximum"};

std::string esc_ptr(const std::string& k) {
  std::string o;
  for (char c : k) {
    if (c == '~') o += "~0";
    else if (c == '/') o += "~1";
    else o += c;
  }
  return o;
}

class Converter {
 public:
  Converter(const ojson& root, const JsonOptions& opt, const Limits& lim)
      : root_(root), opt_(opt), lim_(lim), clock_(lim.max_compile_seconds) {
    ws_ = ws_expr(opt.max_whitespace);
    sep_ = e_seq({ws_, e_byte(','), ws_});
  }

  Grammar run() {
    const int r = g_.add_rule("root");
    g_.set_body(r, e_seq({ws_, conv(root_, "#", 0), ws_}));
    g_.root = r;
    return std::move(g_);
  }

  // A rule for any JSON value (lazily).
  int any_value() {
    if (any_ >= 0) return any_;
    any_ = g_.add_rule("any_value");
    const int obj = g_.add_rule("any_object"), arr = g_.add_rule("any_array");
    const ExprPtr v = e_ref(any_);
    const ExprPtr str = json_string_chars(0, -1);
    const ExprPtr kv = e_seq({str, ws_, e_byte(':'), ws_, v});
    g_.set_body(obj, e_seq({e_byte('{'), ws_, e_opt(e_seq({kv, e_star(e_seq({sep_, kv}))})), ws_, e_byte('}')}));
    g_.set_body(arr, e_seq({e_byte('['), ws_, e_opt(e_seq({v, e_star(e_seq({sep_, v}))})), ws_, e_byte(']')}));
    g_.set_body(any_, e_alt({e_ref(obj), e_ref(arr), str, number_plain(), e_lit("true"), e_lit("false"), e_lit("null")}));
    return any_;
  }
  int any_object() {
    any_value();
    return g_.find("any_object");
  }

  static ExprPtr number_plain() {
    return e_seq({e_opt(e_byte('-')), e_alt({e_byte('0'), e_seq({e_bytes({{'1', '9'}}), e_rep(kDigit, 0, kMaxIntDigits - 1)})}),
                  e_opt(frac_digits()),
                  e_opt(e_seq({e_bytes({{'E', 'E'}, {'e', 'e'}}), e_opt(e_bytes({{'+', '+'}, {'-', '-'}})), e_rep(kDigit, 1, 3)}))});
  }

 private:
  void check_size(int64_t v, const std::string& key, const std::string& ptr) {
    if (v < 0) throw StructuredError("structured output: '" + key + "' at " + ptr + " must not be negative");
    if (v > lim_.max_repeat)
      throw StructuredError("structured output: '" + key + "' at " + ptr + " is " + std::to_string(v) + ", over the limit of " +
                            std::to_string(lim_.max_repeat));
  }
  int64_t get_count(const ojson& s, const char* key, const std::string& ptr, int64_t dflt) {
    if (!s.contains(key)) return dflt;
    const ojson& x = s[key];
    if (!x.is_number_integer() && !(x.is_number_float() && std::floor(x.get<double>()) == x.get<double>()))
      throw StructuredError("structured output: '" + std::string(key) + "' at " + ptr + " must be a whole number");
    const int64_t v = x.is_number_integer() ? x.get<int64_t>() : int64_t(x.get<double>());
    check_size(v, key, ptr);
    return v;
  }

  // A rule whose body is the schema at `ptr` (object, array, composite values get their own rule so
  // repetition and alternatives stay small).
  ExprPtr sub(const ojson& s, const std::string& ptr, int depth) {
    ExprPtr e = conv(s, ptr, depth);
    if (e->kind == Expr::Kind::Ref) return e;
    const int r = g_.add_rule(ptr.empty() ? "#" : ptr);
    g_.set_body(r, e);
    return e_ref(r);
  }

  ExprPtr ref(const std::string& target, const std::string& ptr) {
    auto it = refs_.find(target);
    if (it != refs_.end()) return e_ref(it->second);
    if (target.empty() || target[0] != '#') refuse("'$ref' to another document (\"" + target + "\")", ptr + "/$ref");
    const ojson* t = nullptr;
    try {
      t = &root_.at(ojson::json_pointer(target.substr(1)));
    } catch (const std::exception&) {
      throw StructuredError("structured output: '$ref' at " + ptr + " points to \"" + target + "\", which does not exist");
    }
    const int r = g_.add_rule(target);
    refs_[target] = r;
    g_.set_body(r, conv(*t, target, 0));
    return e_ref(r);
  }

  ExprPtr literal(const ojson& v) { return e_lit(v.dump()); }

  // ---- oneOf: generated as the union of its branches, which is exact only when no value can
  // validate against two branches (then every output matches exactly one). That is proved pairwise
  // from what a branch can generate against what the other's validator accepts; what cannot be
  // proved is refused, never loosened to anyOf.
  // JSON value kinds as bits; numbers split into integral values (1, 1.0) and the others.
  static constexpr unsigned kNull = 1, kBool = 2, kStr = 4, kInt = 8, kFrac = 16, kObj = 32, kArr = 64, kAll = 127;
  static unsigned kind_of(const ojson& v) {
    if (v.is_null()) return kNull;
    if (v.is_boolean()) return kBool;
    if (v.is_string()) return kStr;
    if (v.is_number_integer() || v.is_number_unsigned()) return kInt;
    if (v.is_number()) return std::floor(v.get<double>()) == v.get<double>() ? kInt : kFrac;
    return v.is_object() ? kObj : kArr;
  }
  // The schema behind local $refs and one-entry allOf (itself when a reference does not resolve:
  // conv() reports that).
  const ojson& resolved(const ojson& s) const {
    const ojson* cur = &s;
    for (int hops = 0; hops < 64 && cur->is_object(); ++hops) {
      if (cur->contains("$ref") && (*cur)["$ref"].is_string()) {
        const std::string t = (*cur)["$ref"].get<std::string>();
        if (t.empty() || t[0] != '#') return *cur;
        try {
          cur = &root_.at(ojson::json_pointer(t.substr(1)));
        } catch (const std::exception&) {
          return *cur;
        }
      } else if (cur->contains("allOf") && (*cur)["allOf"].is_array() && (*cur)["allOf"].size() == 1) {
        cur = &(*cur)["allOf"][0];
      } else {
        break;
      }
    }
    return *cur;
  }
  // The kinds of value the schema lets through: `generated` = what conv() writes for it (no 'type'
  // is inferred from the keywords there), else what a validator accepts (no 'type' = any kind).
  unsigned kinds(const ojson& s0, bool generated, int depth) const {
    const ojson& s = resolved(s0);
    if (s.is_boolean()) return s.get<bool>() ? kAll : 0;
    if (!s.is_object() || depth > 32 || s.contains("$ref")) return kAll;
    for (const char* kw : {"anyOf", "oneOf"})
      if (s.contains(kw) && s[kw].is_array()) {
        unsigned k = 0;
        for (auto& b : s[kw]) k |= kinds(b, generated, depth + 1);
        return k;
      }
    if (s.contains("const")) return kind_of(s["const"]);
    if (s.contains("enum") && s["enum"].is_array()) {
      unsigned k = 0;
      for (auto& v : s["enum"]) k |= kind_of(v);
      return k;
    }
    if (s.contains("type")) {
      std::vector<std::string> names;
      if (s["type"].is_string()) names.push_back(s["type"].get<std::string>());
      else if (s["type"].is_array())
        for (auto& t : s["type"])
          if (t.is_string()) names.push_back(t.get<std::string>());
      unsigned k = 0;
      for (auto& t : names)
        k |= t == "null" ? kNull : t == "boolean" ? kBool : t == "string" ? kStr : t == "integer" ? kInt
           : t == "number" ? kInt | kFrac : t == "object" ? kObj : t == "array" ? kArr : kAll;
      return k;
    }
    if (!generated) return kAll;
    unsigned k = 0;
    for (const char* key : {"properties", "required", "additionalProperties"})
      if (s.contains(key)) k |= kObj;
    for (const char* key : {"items", "prefixItems", "minItems", "maxItems"})
      if (s.contains(key)) k |= kArr;
    for (const char* key : {"minLength", "maxLength", "pattern", "format"})
      if (s.contains(key)) k |= kStr;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(key)) k |= kInt | kFrac;
    return k ? k : kAll;
  }
  // The values a schema allows when it lists them (const / enum), else null.
  static const ojson* listed(const ojson& s) {
    if (!s.is_object()) return nullptr;
    if (s.contains("const")) return &s["const"];
    if (s.contains("enum") && s["enum"].is_array()) return &s["enum"];
    return nullptr;
  }
  static std::vector<ojson> values_of(const ojson& s) {
    const ojson* l = listed(s);
    if (!l) return {};
    if (s.contains("const")) return {*l};
    return std::vector<ojson>(l->begin(), l->end());
  }
  // A validator of `s` rejects the value v (proved from its kinds or its const / enum).
  bool rejects(const ojson& s0, const ojson& v) const {
    const ojson& s = resolved(s0);
    if ((kind_of(v) & kinds(s, false, 0)) == 0) return true;
    if (listed(s)) {
      for (auto& w : values_of(s))
        if (w == v) return false;
      return true;
    }
    return false;
  }
  // Every value generated from branch a is rejected by branch b's validator.
  bool excludes(const ojson& a0, const ojson& b0, int depth = 0) const {
    const ojson& a = resolved(a0);
    const ojson& b = resolved(b0);
    if ((kinds(a, true, 0) & kinds(b, false, 0)) == 0) return true;
    if (listed(a)) {
      for (auto& v : values_of(a))
        if (!rejects(b, v)) return false;
      return true;
    }
    // A discriminator: a writes only objects and always writes property P (required, listed in
    // properties) with values that b's schema for P rejects (distinct const/enum values, other
    // JSON types, or the same reasoning one level down).
    if (depth > 8 || kinds(a, true, 0) != kObj || !a.is_object() || !b.is_object() || !a.contains("required") ||
        !a["required"].is_array() || !a.contains("properties") || !a["properties"].is_object() ||
        !b.contains("properties") || !b["properties"].is_object())
      return false;
    for (auto& r : a["required"]) {
      if (!r.is_string()) continue;
      const std::string name = r.get<std::string>();
      if (a["properties"].contains(name) && b["properties"].contains(name) &&
          excludes(a["properties"][name], b["properties"][name], depth + 1))
        return true;
    }
    return false;
  }
  void check_exclusive(const ojson& branches, const std::string& ptr) const {
    for (size_t i = 0; i < branches.size(); ++i)
      for (size_t j = i + 1; j < branches.size(); ++j)
        if (!excludes(branches[i], branches[j]) || !excludes(branches[j], branches[i]))
          refuse("'oneOf' whose branches " + std::to_string(i) + " and " + std::to_string(j) +
                     " may both match one value (oneOf is generated exactly only when its branches exclude each "
                     "other: different JSON types, distinct const/enum values, or a property every branch has "
                     "with distinct const/enum values, a discriminator; use anyOf if a value may match several)",
                 ptr);
  }

  ExprPtr conv(const ojson& s, const std::string& ptr, int depth) {
    clock_.check();
    if (depth > lim_.max_schema_depth)
      throw StructuredError("structured output: the schema nests deeper than " + std::to_string(lim_.max_schema_depth) +
                            " levels at " + ptr + " (use $defs and $ref)");
    if (s.is_boolean()) {
      if (s.get<bool>()) return e_ref(any_value());
      refuse("the schema 'false' (it matches nothing)", ptr);
    }
    if (!s.is_object()) throw StructuredError("structured output: the schema at " + (ptr.empty() ? "#" : ptr) + " must be an object or a boolean");
    std::vector<std::string> constraining;
    for (auto& [k, v] : s.items()) {
      if (kRefused.count(k)) refuse("the keyword '" + k + "'", ptr + "/" + esc_ptr(k));
      if (kKnown.count(k)) constraining.push_back(k);
    }
    auto only = [&](const std::string& kw) {
      for (auto& k : constraining)
        if (k != kw) refuse("'" + k + "' beside '" + kw + "' (an intersection)", ptr + "/" + esc_ptr(k));
    };
    if (s.contains("$ref")) {
      only("$ref");
      if (!s["$ref"].is_string()) throw StructuredError("structured output: '$ref' at " + ptr + " must be a string");
      return ref(s["$ref"].get<std::string>(), ptr);
    }
    for (const char* kw : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(kw)) continue;
      only(kw);
      const ojson& a = s[kw];
      if (!a.is_array() || a.empty()) throw StructuredError("structured output: '" + std::string(kw) + "' at " + ptr + " must be a non-empty array");
      if (std::string(kw) == "allOf") {
        if (a.size() != 1) refuse("'allOf' with more than one entry", ptr + "/allOf");
        return conv(a[0], ptr + "/allOf/0", depth + 1);
      }
      if (std::string(kw) == "oneOf") check_exclusive(a, ptr + "/oneOf");
      std::vector<ExprPtr> alts;
      for (size_t i = 0; i < a.size(); ++i) alts.push_back(sub(a[i], ptr + "/" + kw + "/" + std::to_string(i), depth + 1));
      return e_alt(std::move(alts));
    }
    if (s.contains("const")) return literal(s["const"]);
    if (s.contains("enum")) {
      const ojson& en = s["enum"];
      if (!en.is_array() || en.empty()) throw StructuredError("structured output: 'enum' at " + ptr + " must be a non-empty array");
      std::vector<ExprPtr> alts;
      for (auto& v : en) alts.push_back(literal(v));
      return e_alt(std::move(alts));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array())
        for (auto& x : t) {
          if (!x.is_string()) throw StructuredError("structured output: 'type' at " + ptr + " must name types");
          types.push_back(x.get<std::string>());
        }
      else throw StructuredError("structured output: 'type' at " + ptr + " must be a string or an array");
      if (types.empty()) refuse("an empty 'type' list (it matches nothing)", ptr + "/type");
    } else {
      auto has = [&](std::initializer_list<const char*> ks) {
        for (auto k : ks)
          if (s.contains(k)) return true;
        return false;
      };
      if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
      if (has({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
      if (has({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
      if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
      if (types.empty()) return e_ref(any_value());
    }
    std::vector<ExprPtr> alts;
    for (auto& t : types) {
      if (t == "null") alts.push_back(e_lit("null"));
      else if (t == "boolean") alts.push_back(e_alt({e_lit("true"), e_lit("false")}));
      else if (t == "string") alts.push_back(string_expr(s, ptr));
      else if (t == "integer") alts.push_back(json_integer_expr(s, ptr));
      else if (t == "number") alts.push_back(json_number_expr(s, ptr));
      else if (t == "object") alts.push_back(object_expr(s, ptr, depth));
      else if (t == "array") alts.push_back(array_expr(s, ptr, depth));
      else throw StructuredError("structured output: unknown type '" + t + "' at " + ptr + "/type");
    }
    return e_alt(std::move(alts));
  }

  ExprPtr string_expr(const ojson& s, const std::string& ptr) {
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("format")) {
      if (has_len || s.contains("pattern")) refuse("'format' together with 'pattern', 'minLength' or 'maxLength'", ptr + "/format");
      if (!s["format"].is_string()) throw StructuredError("structured output: 'format' at " + ptr + " must be a string");
      const std::string f = s["format"].get<std::string>();
      const std::string* rx = json_format_regex(f);
      if (!rx) refuse("the format '" + f + "' (supported: date, time, date-time, uuid, ipv4, email)", ptr + "/format");
      return e_seq({e_byte('"'), regex_expr(*rx, RegexMode::Raw, lim_, "format"), e_byte('"')});
    }
    if (s.contains("pattern")) {
      if (has_len) refuse("'pattern' together with 'minLength' or 'maxLength'", ptr + "/pattern");
      if (!s["pattern"].is_string()) throw StructuredError("structured output: 'pattern' at " + ptr + " must be a string");
      return e_seq({e_byte('"'),
                    regex_expr(s["pattern"].get<std::string>(), RegexMode::JsonString, lim_, "'pattern' at " + ptr + "/pattern"),
                    e_byte('"')});
    }
    const int64_t mn = get_count(s, "minLength", ptr, 0), mx = get_count(s, "maxLength", ptr, -1);
    if (mx >= 0 && mx < mn) refuse("'maxLength' below 'minLength' (it matches nothing)", ptr + "/maxLength");
    return json_string_chars(int(mn), int(mx));
  }

  ExprPtr object_expr(const ojson& s, const std::string& ptr, int depth) {
    struct Prop {
      std::string name;
      const ojson* schema;
      std::string ptr;
      bool required;
    };
    std::vector<Prop> props;
    static const ojson kTrue = true;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) throw StructuredError("structured output: 'properties' at " + ptr + " must be an object");
      for (auto& [k, v] : s["properties"].items()) props.push_back({k, &v, ptr + "/properties/" + esc_ptr(k), false});
    }
    const ojson* add = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    bool extras;
    const ojson* extra_schema = &kTrue;
    if (!add) extras = props.empty();
    else if (add->is_boolean()) extras = add->get<bool>();
    else {
      extras = true;
      extra_schema = add;
    }
    if (s.contains("required")) {
      if (!s["required"].is_array()) throw StructuredError("structured output: 'required' at " + ptr + " must be an array");
      for (auto& r : s["required"]) {
        if (!r.is_string()) throw StructuredError("structured output: 'required' at " + ptr + " must list names");
        const std::string n = r.get<std::string>();
        bool found = false;
        for (auto& p : props)
          if (p.name == n) found = p.required = true;
        if (!found) {
          if (add && add->is_boolean() && !add->get<bool>())
            refuse("'required' naming '" + n + "', which 'properties' lacks while additionalProperties is false (it matches nothing)",
                   ptr + "/required");
          props.push_back({n, extra_schema, ptr + "/additionalProperties", true});
        }
      }
    }
    auto kv = [&](const Prop& p) {
      return e_seq({literal(ojson(p.name)), ws_, e_byte(':'), ws_, sub(*p.schema, p.ptr, depth + 1)});
    };
    const ExprPtr open = e_seq({e_byte('{'), ws_}), close = e_seq({ws_, e_byte('}')});
    const size_t n = props.size();
    bool all_required = true;
    for (auto& p : props) all_required = all_required && p.required;
    if (all_required && !extras) {
      std::vector<ExprPtr> seq{open};
      for (size_t i = 0; i < n; ++i) {
        if (i) seq.push_back(sep_);
        seq.push_back(kv(props[i]));
      }
      seq.push_back(close);
      return e_seq(std::move(seq));
    }
    // S(i, first): the members from property i on; a rule each (shared suffixes).
    std::vector<int> kv_rule(n, -1);
    for (size_t i = 0; i < n; ++i) {
      kv_rule[i] = g_.add_rule(props[i].ptr + "#member");
      g_.set_body(kv_rule[i], kv(props[i]));
    }
    ExprPtr extra_kv;
    if (extras) {
      std::vector<std::string> names;
      for (auto& p : props) names.push_back(p.name);
      extra_kv = e_seq({names.empty() ? json_string_chars(0, -1) : json_key_excluding(names), ws_, e_byte(':'), ws_,
                        sub(*extra_schema, add ? ptr + "/additionalProperties" : ptr + "#extra", depth + 1)});
    }
    std::map<std::pair<size_t, bool>, int> memo;
    auto S = [&](size_t i, bool first, auto&& self) -> ExprPtr {
      auto it = memo.find({i, first});
      if (it != memo.end()) return e_ref(it->second);
      const int r = g_.add_rule(ptr + "#members" + std::to_string(i) + (first ? "f" : ""));
      memo[{i, first}] = r;
      std::vector<ExprPtr> alts;
      size_t j = i;
      for (; j < n; ++j) {
        std::vector<ExprPtr> seq;
        if (!first) seq.push_back(sep_);
        seq.push_back(e_ref(kv_rule[j]));
        seq.push_back(self(j + 1, false, self));
        alts.push_back(e_seq(std::move(seq)));
        if (props[j].required) break;
      }
      if (j >= n) {  // no required member left: may end here, after optional extras
        if (extras) {
          std::vector<ExprPtr> seq;
          if (!first) seq.push_back(sep_);
          seq.push_back(extra_kv);
          seq.push_back(e_star(e_seq({sep_, extra_kv})));
          alts.push_back(e_opt(e_seq(std::move(seq))));
        } else {
          alts.push_back(e_empty());
        }
      }
      g_.set_body(r, e_alt(std::move(alts)));
      return e_ref(r);
    };
    return e_seq({open, S(0, true, S), close});
  }

  ExprPtr array_expr(const ojson& s, const std::string& ptr, int depth) {
    std::vector<ExprPtr> prefix;
    ExprPtr item;  // null: no items beyond the prefix
    auto add_prefix = [&](const ojson& a, const std::string& key) {
      for (size_t i = 0; i < a.size(); ++i) prefix.push_back(sub(a[i], ptr + "/" + key + "/" + std::to_string(i), depth + 1));
    };
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) throw StructuredError("structured output: 'prefixItems' at " + ptr + " must be an array");
      add_prefix(s["prefixItems"], "prefixItems");
    }
    if (s.contains("items")) {
      const ojson& it = s["items"];
      if (it.is_array()) {
        if (s.contains("prefixItems")) refuse("'items' as an array beside 'prefixItems'", ptr + "/items");
        add_prefix(it, "items");
        item = e_ref(any_value());
      } else if (it.is_boolean() && !it.get<bool>()) {
        item = nullptr;
      } else {
        item = sub(it, ptr + "/items", depth + 1);
      }
    } else {
      item = e_ref(any_value());
    }
    const int64_t mn = get_count(s, "minItems", ptr, 0);
    int64_t mx = get_count(s, "maxItems", ptr, -1);
    const int64_t P = int64_t(prefix.size());
    if (!item) mx = mx < 0 ? P : std::min(mx, P);
    if (mx >= 0 && mx < mn) refuse("'maxItems' below 'minItems' (or items: false with too few prefixItems)", ptr + "/maxItems");
    auto rest = [&](int64_t i) -> ExprPtr {
      const int64_t rmin = std::max<int64_t>(0, mn - i), rmax = mx < 0 ? -1 : mx - i;
      if (rmax == 0 || !item) return e_empty();
      if (i == 0) {
        ExprPtr e = e_seq({item, e_rep(e_seq({sep_, item}), int(std::max<int64_t>(rmin - 1, 0)), rmax < 0 ? -1 : int(rmax - 1))});
        return rmin == 0 ? e_opt(e) : e;
      }
      return e_rep(e_seq({sep_, item}), int(rmin), int(rmax));
    };
    auto from = [&](int64_t i, auto&& self) -> ExprPtr {
      if (i >= P) return rest(i);
      if (mx >= 0 && i >= mx) return e_empty();
      std::vector<ExprPtr> seq;
      if (i > 0) seq.push_back(sep_);
      seq.push_back(prefix[size_t(i)]);
      seq.push_back(self(i + 1, self));
      ExprPtr e = e_seq(std::move(seq));
      return i < mn ? e : e_opt(e);
    };
    return e_seq({e_byte('['), ws_, from(0, from), ws_, e_byte(']')});
  }

  const ojson& root_;
  JsonOptions opt_;
  Limits lim_;
  CompileClock clock_;
  Grammar g_;
  ExprPtr ws_, sep_;
  int any_ = -1;
  std::map<std::string, int> refs_;
};

}  // namespace

ExprPtr json_integer_expr(const ojson& s, const std::string& ptr) {
  int64_t lo = 0, hi = 0;
  bool has_lo = get_int_bound(s, "minimum", ptr, lo), has_hi = get_int_bound(s, "maximum", ptr, hi);
  int64_t x;
  if (s.contains("exclusiveMinimum")) {
    if (s["exclusiveMinimum"].is_boolean()) {
      if (s["exclusiveMinimum"].get<bool>() && has_lo) ++lo;
    } else if (get_int_bound(s, "exclusiveMinimum", ptr, x)) {
      lo = has_lo ? std::max(lo, x + 1) : x + 1;
      has_lo = true;
    }
  }
  if (s.contains("exclusiveMaximum")) {
    if (s["exclusiveMaximum"].is_boolean()) {
      if (s["exclusiveMaximum"].get<bool>() && has_hi) --hi;
    } else if (get_int_bound(s, "exclusiveMaximum", ptr, x)) {
      hi = has_hi ? std::min(hi, x - 1) : x - 1;
      has_hi = true;
    }
  }
  ExprPtr e = int_range(has_lo, lo, has_hi, hi);
  if (!e) refuse("integer bounds that no integer meets", ptr);
  return e;
}

ExprPtr json_number_expr(const ojson& s, const std::string& ptr) {
  for (const char* k : {"exclusiveMinimum", "exclusiveMaximum"})
    if (s.contains(k) && !(s[k].is_boolean() && !s[k].get<bool>())) refuse("'" + std::string(k) + "' on a number", ptr + "/" + k);
  int64_t lo = 0, hi = 0;
  const bool has_lo = get_int_bound(s, "minimum", ptr, lo), has_hi = get_int_bound(s, "maximum", ptr, hi);
  if (!has_lo && !has_hi) return Converter::number_plain();
  if (has_lo && has_hi && hi < lo) refuse("number bounds that no number meets", ptr);
  std::vector<ExprPtr> alts;
  // non-negative values in [max(lo,0), hi]
  if (!has_hi || hi >= 0) alts.push_back(real_mag(has_lo ? std::max<int64_t>(lo, 0) : 0, has_hi ? hi : -1));
  // negative values in [lo, min(hi,0)): magnitudes (max(-hi,0), -lo]
  if (!has_lo || lo < 0) {
    const int64_t L = has_hi && hi < 0 ? -hi : 0;
    const int64_t H = has_lo ? -lo : -1;
    alts.push_back(e_seq({e_byte('-'), real_mag(L, H)}));
  }
  return e_alt(std::move(alts));
}

Grammar json_schema_grammar(const ojson& schema, const JsonOptions& opt, const Limits& limits) {
  Converter c(schema, opt, limits);
  return c.run();
}

Grammar json_object_grammar(const JsonOptions& opt) {
  static const ojson root = ojson::parse(R"({"type": "object"})");
  Converter c(root, opt, Limits{});
  return c.run();
}

Grammar json_value_grammar(const JsonOptions& opt) {
  static const ojson root = true;
  Converter c(root, opt, Limits{});
  return c.run();
}

const std::string* json_format_regex(const std::string& format) {
  static const std::string date =
      "[0-9]{4}-((01|03|05|07|08|10|12)-(0[1-9]|[12][0-9]|3[01])|(04|06|09|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))";
  static const std::string time = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  static const std::map<std::string, std::string> formats{
      {"date", date},
      {"time", time},
      {"date-time", date + "T" + time},
      {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
      {"ipv4", "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}"},
      {"email", "[A-Za-z0-9_+-]{1,32}(\\.[A-Za-z0-9_+-]{1,32}){0,3}@([A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?\\.){1,3}[A-Za-z]{2,12}"},
  };
  auto it = formats.find(format);
  return it == formats.end() ? nullptr : &it->second;
}

const nlohmann::ordered_json& json_resolve_ref(const nlohmann::ordered_json& root, const std::string& ref,
                                               const std::string& pointer) {
  if (ref.empty() || ref[0] != '#')
    throw StructuredError("structured output: '$ref' to another document (\"" + ref + "\") at " + pointer +
                          " is not supported");
  try {
    return root.at(nlohmann::ordered_json::json_pointer(ref.substr(1)));
  } catch (const std::exception&) {
    throw StructuredError("structured output: '$ref' at " + pointer + " points to \"" + ref + "\", which does not exist");
  }
}

}  // namespace m3::structured
