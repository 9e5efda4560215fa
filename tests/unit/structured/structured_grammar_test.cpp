// Structured outputs: the byte automaton on hand-written accept / reject strings for every
// supported JSON Schema keyword, regexes, GBNF, choices, tool-call blocks, and the refusals.
#include "structured_test_util.h"

#include "structured/tool_grammar.h"

using m3::structured::StructuredError;
using m3test::GrammarProbe;
using m3test::schema_probe;

namespace {

struct Case {
  const char* schema;
  std::vector<std::string> accept, reject;
};

void check(const Case& c) {
  SCOPED_TRACE(c.schema);
  GrammarProbe p = schema_probe(c.schema);
  for (auto& s : c.accept) EXPECT_TRUE(p.full(s)) << "should accept: " << s;
  for (auto& s : c.reject) EXPECT_FALSE(p.full(s)) << "should reject: " << s;
}

void refused(const std::string& schema, const std::string& keyword, const std::string& pointer) {
  SCOPED_TRACE(schema);
  try {
    m3::structured::json_schema_grammar(nlohmann::ordered_json::parse(schema));
    ADD_FAILURE() << "not refused";
  } catch (const StructuredError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(keyword), std::string::npos) << m;
    EXPECT_NE(m.find(pointer), std::string::npos) << m;
  }
}

}  // namespace

TEST(StructuredSchema, Types) {
  check({R"({"type":"null"})", {"null"}, {"nul", "nulll", "0", "\"null\""}});
  check({R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "tru"}});
  check({R"({"type":"integer"})", {"0", "-7", "123456789"}, {"01", "1.5", "1e3", "+1", "", "-"}});
  check({R"({"type":"number"})", {"0", "-0.5", "3.25", "1e10", "2.5E-3", "-12"}, {".5", "1.", "01", "1e", "NaN"}});
  check({R"({"type":"string"})", {R"("")", R"("abc")", R"("a\"b")", R"("\\")", R"("\n")", "\"h\xC3\xA9\""},
         {R"(abc)", R"("a"b")", "\"a\nb\"", R"("\q")", "\"\xC3\""}});
  check({R"({"type":["integer","null"]})", {"5", "null"}, {"\"5\"", "true"}});
}

TEST(StructuredSchema, ObjectsPropertiesRequiredAdditional) {
  check({R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a","b"]})",
         {R"({"a":1,"b":"x"})", R"({ "a": 1, "b": "x" })", "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"},
         {R"({"a":1})", R"({"b":"x","a":1})", R"({"a":"1","b":"x"})", R"({"a":1,"b":"x","c":2})", R"({"a":1,,"b":"x"})"}});
  // Optional members in order, may be skipped.
  check({R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"required":["b"]})",
         {R"({"b":2})", R"({"a":1,"b":2})", R"({"b":2,"c":3})", R"({"a":1,"b":2,"c":3})"},
         {R"({})", R"({"a":1})", R"({"a":1,"c":3})", R"({,"b":2})", R"({"b":2,})"}});
  check({R"({"type":"object","properties":{"a":{"type":"integer"}}})", {R"({})", R"({"a":1})"}, {R"({"z":1})"}});
  check({R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false})", {R"({})", R"({"a":1})"},
         {R"({"z":1})"}});
  check({R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})",
         {R"({})", R"({"a":1})", R"({"a":1,"z":[1,{"q":null}]})", R"({"z":"x"})"}, {R"({"a":"x","z":1})"}});
  check({R"({"type":"object","additionalProperties":{"type":"boolean"}})", {R"({})", R"({"x":true,"y":false})"},
         {R"({"x":1})"}});
  check({R"({"type":"object"})", {R"({})", R"({"k":[1,2,{"a":"b"}],"n":-1.5})"}, {"[]", R"({"k"})"}});
  // Whitespace is bounded: 16 bytes per gap by default.
  check({R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})",
         {"{" + std::string(16, ' ') + "\"a\":1}"}, {"{" + std::string(17, ' ') + "\"a\":1}"}});
}

TEST(StructuredSchema, CompactWhitespace) {
  GrammarProbe p = schema_probe(R"({"type":"array","items":{"type":"integer"}})", 0);
  EXPECT_TRUE(p.full("[1,2,3]"));
  EXPECT_FALSE(p.full("[1, 2]"));
}

TEST(StructuredSchema, EnumConstAnyOfOneOfAllOf) {
  check({R"({"enum":["red","green",3,null]})", {R"("red")", R"("green")", "3", "null"}, {R"("blue")", "4", R"("re")"}});
  check({R"({"const":{"a":[1,"x"]}})", {R"({"a":[1,"x"]})"}, {R"({"a":[1]})"}});
  check({R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})", {"12", R"("ab")"}, {R"("abc")", "true"}});
  check({R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"0"}});
  check({R"({"allOf":[{"type":"integer","minimum":3}]})", {"3", "40"}, {"2", "-3"}});
}

// oneOf is generated only when its branches provably exclude each other (then the union is exact);
// the rest is refused naming the two branches that may overlap.
const char* const kPetsOneOf = R"({"$defs":{"cat":{"type":"object","properties":{"kind":{"const":"cat"},"lives":{"type":"integer"}},
    "required":["kind","lives"],"additionalProperties":false},
  "dog":{"type":"object","properties":{"kind":{"enum":["dog","wolf"]},"bark":{"type":"boolean"}},"required":["kind"],
    "additionalProperties":false}},
  "oneOf":[{"$ref":"#/$defs/cat"},{"$ref":"#/$defs/dog"},{"type":"null"}]})";

TEST(StructuredSchema, OneOfExactWhenBranchesExclude) {
  check({R"({"oneOf":[{"type":"integer"},{"type":"string","maxLength":2}]})", {"12", R"("ab")"}, {R"("abc")", "true"}});
  check({R"({"oneOf":[{"const":"a"},{"enum":["b","c",1]}]})", {R"("a")", R"("c")", "1"}, {R"("d")"}});
  check({R"({"oneOf":[{"type":"integer","minimum":0},{"enum":[-1.5,"x"]}]})", {"3", "-1.5", R"("x")"}, {"-2"}});
  check({kPetsOneOf, {R"({"kind":"cat","lives":9})", R"({"kind":"wolf"})", R"({"kind":"dog","bark":true})", "null"},
         {R"({"kind":"cat"})", R"({"kind":"dog","lives":1})", R"({"kind":"cow"})"}});
  // A discriminator without 'type' on the other side: its schema for the property still rejects.
  check({R"({"oneOf":[{"type":"object","properties":{"t":{"const":1}},"required":["t"]},
                      {"type":"object","properties":{"t":{"type":"string"}},"required":["t"]}]})",
         {R"({"t":1})", R"({"t":"one"})"}, {R"({"t":2})"}});
}

TEST(StructuredSchema, OneOfRefusedWhenBranchesMayOverlap) {
  // integer values are numbers too
  refused(R"({"oneOf":[{"type":"number"},{"type":"integer"}]})", "'oneOf' whose branches 0 and 1", "#/oneOf");
  refused(R"({"oneOf":[{"type":"string"},{"type":"string","maxLength":3}]})", "may both match", "#/oneOf");
  // objects without a discriminator: {"a":1,"b":2} matches both
  refused(R"({"type":"object","properties":{"x":{"oneOf":[{"type":"object","properties":{"a":{"type":"integer"}}},
                                                          {"type":"object","properties":{"b":{"type":"integer"}}}]}}})",
          "oneOf", "/properties/x/oneOf");
  // no 'type' on the first branch: a validator lets any string through it
  refused(R"({"oneOf":[{"properties":{"k":{"const":"x"}},"required":["k"]},{"type":"string"}]})", "branches 0 and 1", "#/oneOf");
  refused(R"({"oneOf":[{"const":1},{"enum":[2,1.0]}]})", "branches 0 and 1", "#/oneOf");
  refused(R"({"oneOf":[{"type":"null"},{"type":"boolean"},{"enum":[true,"x"]}]})", "branches 1 and 2", "#/oneOf");
  // the discriminator must be a property the first branch always writes
  refused(R"({"oneOf":[{"type":"object","properties":{"t":{"const":1}}},{"type":"object","properties":{"t":{"const":2}}}]})",
          "branches 0 and 1", "#/oneOf");
}

TEST(StructuredSchema, ArraysItemsPrefixItemsCounts) {
  check({R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})", {"[1,2]", "[1, 2, 3]"},
         {"[]", "[1]", "[1,2,3,4]", "[1,\"a\"]"}});
  check({R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
         {"[]", R"(["a"])", R"(["a",1])"}, {R"(["a",1,2])", R"([1])"}});
  check({R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"boolean"},"minItems":2})",
         {R"(["a",true])", R"(["a",true,false])"}, {R"(["a"])", R"(["a",1])"}});
  check({R"({"type":"array"})", {"[]", R"([1,"a",{"b":null},[]])"}, {"[1,]"}});
}

TEST(StructuredSchema, StringLengthPatternFormat) {
  check({R"({"type":"string","minLength":2,"maxLength":3})", {R"("ab")", R"("abc")", "\"\xC3\xA9\xC3\xA9\"", R"("\"\\")"},
         {R"("a")", R"("abcd")"}});
  check({R"({"type":"string","pattern":"^[a-z]+-\\d{2,3}$"})", {R"("ab-12")", R"("x-123")"}, {R"("ab-1")", R"("Ab-12")", R"("ab-1234")"}});
  // Unanchored patterns are searches.
  check({R"({"type":"string","pattern":"ab"})", {R"("ab")", R"("xxabyy")"}, {R"("a b")"}});
  check({R"({"type":"string","format":"date"})", {R"("2024-01-31")", R"("1999-12-01")"},
         {R"("2024-02-30")", R"("2024-13-01")", R"("2024-1-01")"}});
  check({R"({"type":"string","format":"date-time"})", {R"("2024-01-31T23:59:59Z")", R"("2024-01-31T00:00:00.5+02:00")"},
         {R"("2024-01-31T24:00:00Z")", R"("2024-01-31 10:00:00Z")"}});
  check({R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"}});
  check({R"({"type":"string","format":"ipv4"})", {R"("192.168.0.1")", R"("0.0.0.0")"}, {R"("256.1.1.1")", R"("1.2.3")"}});
  check({R"({"type":"string","format":"email"})", {R"("a.b@example.com")"}, {R"("a@b")", R"("@x.com")"}});
  check({R"({"type":"string","format":"time"})", {R"("10:20:30Z")"}, {R"("10:20")"}});
}

TEST(StructuredSchema, NumberBounds) {
  check({R"({"type":"integer","minimum":-15,"maximum":120})", {"-15", "-9", "0", "7", "99", "120"},
         {"-16", "121", "200", "-100", "1000"}});
  check({R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})", {"1", "9"}, {"0", "10", "-1"}});
  check({R"({"type":"integer","minimum":1000})", {"1000", "5000", "123456789"}, {"999", "0", "-1000"}});
  check({R"({"type":"integer","maximum":-3})", {"-3", "-100"}, {"-2", "0", "5"}});
  check({R"({"type":"number","minimum":0,"maximum":10})", {"0", "0.5", "9.99", "10", "10.000"}, {"-0.5", "10.5", "11", "1e1"}});
  check({R"({"type":"number","minimum":-2,"maximum":-1})", {"-2", "-1.5", "-1"}, {"-0.5", "-2.5", "0"}});
  check({R"({"type":"number","minimum":-1})", {"-1", "-0.25", "0", "1000000000"}, {"-1.5", "-2"}});
}

TEST(StructuredSchema, RefsDefsRecursion) {
  const char* tree = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"]}},"$ref":"#/$defs/node"})";
  check({tree, {R"({"v":1,"kids":[]})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}]})"},
         {R"({"v":1,"kids":[{"v":2}]})"}});
  check({R"({"definitions":{"x":{"type":"boolean"}},"type":"object","properties":{"a":{"$ref":"#/definitions/x"}},"required":["a"]})",
         {R"({"a":true})"}, {R"({"a":1})"}});
  check({R"({"type":"object","properties":{"next":{"$ref":"#"}}})", {R"({})", R"({"next":{"next":{}}})"}, {R"({"next":1})"}});
}

TEST(StructuredSchema, RefusedByNameWithPointer) {
  refused(R"({"type":"object","properties":{"a":{"type":"integer","multipleOf":3}}})", "multipleOf", "/properties/a/multipleOf");
  refused(R"({"type":"array","uniqueItems":true})", "uniqueItems", "#/uniqueItems");
  refused(R"({"not":{"type":"string"}})", "'not'", "/not");
  refused(R"({"if":{},"then":{}})", "'if'", "/if");
  refused(R"({"allOf":[{"type":"integer"},{"minimum":1}]})", "allOf", "/allOf");
  refused(R"({"type":"object","patternProperties":{"^x":{}}})", "patternProperties", "/patternProperties");
  refused(R"({"type":"string","format":"hostname"})", "hostname", "/format");
  refused(R"({"type":"number","minimum":0.5})", "non-integral", "/minimum");
  refused(R"({"type":"number","exclusiveMinimum":0})", "exclusiveMinimum", "/exclusiveMinimum");
  refused(R"({"$ref":"other.json#/a"})", "$ref", "/$ref");
  refused(R"({"type":"string","pattern":"(a)\\1"})", "backreference", "/pattern");
  refused(R"j({"type":"string","pattern":"a(?=b)"})j", "lookahead", "/pattern");
  refused(R"({"type":"object","minProperties":1})", "minProperties", "#/minProperties");
  refused(R"({"type":"string","maxLength":100000})", "maxLength", "#");
  refused(R"({"anyOf":[{"type":"integer"}],"type":"integer"})", "beside 'anyOf'", "/type");
}

TEST(StructuredSchema, LimitsAreClearErrors) {
  m3::structured::Limits lim;
  lim.max_dfa_states = 50;
  try {
    m3::structured::compile(m3::structured::json_schema_grammar(nlohmann::ordered_json::parse(R"({"type":"string","maxLength":200})")), lim);
    ADD_FAILURE() << "not refused";
  } catch (const StructuredError& e) {
    EXPECT_NE(std::string(e.what()).find("max_dfa_states"), std::string::npos) << e.what();
  }
}

TEST(StructuredRegex, Subset) {
  auto rx = [](const char* p) { return GrammarProbe(m3::structured::regex_grammar(p)); };
  GrammarProbe a = rx("(ab|cd)+x?[0-9]{2}");
  EXPECT_TRUE(a.full("ab12"));
  EXPECT_TRUE(a.full("abcdx99"));
  EXPECT_FALSE(a.full("x12"));
  EXPECT_FALSE(a.full("ab1"));
  GrammarProbe b = rx("^[^a-c\\s]\\w*\\.\\d+$");
  EXPECT_TRUE(b.full("Z_9.5"));
  EXPECT_FALSE(b.full("a.5"));
  EXPECT_FALSE(b.full(" x.5"));
  GrammarProbe c = rx(".{2}");
  EXPECT_TRUE(c.full("\xE2\x82\xAC" "a"));
  EXPECT_FALSE(c.full("a\n"));
  GrammarProbe d = rx("(?:x|y){2,}?z\\u0041\\x42");
  EXPECT_TRUE(d.full("xyxzAB"));
  EXPECT_FALSE(d.full("xzAB"));
  for (const char* bad : {"a\\b", "(?<=a)b", "(a)\\1", "a^b", "\\p{L}"}) {
    EXPECT_THROW(m3::structured::regex_grammar(bad), StructuredError) << bad;
  }
}

TEST(StructuredGbnf, ParsesLlamaCppStyle) {
  const char* g = R"g(
# arithmetic
root ::= expr
expr ::= term ([-+] term)*
term ::= num | "(" expr ")"
num  ::= [0-9]+ ("." [0-9]{1,2})?
)g";
  GrammarProbe p(m3::structured::gbnf_grammar(g));
  EXPECT_TRUE(p.full("1+2"));
  EXPECT_TRUE(p.full("(1.25-3)+4"));
  EXPECT_FALSE(p.full("1+"));
  EXPECT_FALSE(p.full("1.234"));
  const char* multi = "root ::=\n  \"a\"\n  | \"b\" (\n \"c\"\n)\n";
  GrammarProbe q(m3::structured::gbnf_grammar(multi));
  EXPECT_TRUE(q.full("a"));
  EXPECT_TRUE(q.full("bc"));
  EXPECT_FALSE(q.full("b"));
  EXPECT_THROW(m3::structured::gbnf_grammar("root ::= x"), StructuredError);                  // undefined rule
  EXPECT_THROW(m3::structured::compile(m3::structured::gbnf_grammar("root ::= root \"a\" | \"a\"")), StructuredError);  // left recursion
  EXPECT_THROW(m3::structured::gbnf_grammar("start: \"a\""), StructuredError);               // Lark
  EXPECT_THROW(m3::structured::gbnf_grammar("root ::= <[12]>"), StructuredError);            // token refs
}

TEST(StructuredChoice, ExactlyOne) {
  GrammarProbe p(m3::structured::choice_grammar({"yes", "no", "maybe so"}));
  EXPECT_TRUE(p.full("yes"));
  EXPECT_TRUE(p.full("maybe so"));
  EXPECT_FALSE(p.full("ye"));
  EXPECT_FALSE(p.full("yesno"));
}

TEST(StructuredTools, M3BlockForRequiredAndNamed) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "location":{"type":"string"},"days":{"type":"integer","minimum":1,"maximum":14},
      "unit":{"type":"string","enum":["c","f"]}},"required":["location"]}}},
    {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
      "queries":{"type":"array","items":{"type":"string"}},
      "filters":{"type":"object","properties":{"lang":{"type":"string"}}}}}}}])");
  const std::string NS = "]<]minimax[>[";
  const std::string call1 = NS + "<invoke name=\"get_weather\">" + NS + "<location>Paris" + NS + "</location>" + NS + "<days>3" +
                            NS + "</days>" + NS + "</invoke>\n";
  const std::string call2 = NS + "<invoke name=\"search\">" + NS + "<queries>" + NS + "<item>louvre hours" + NS + "</item>" + NS +
                            "</queries>" + NS + "<filters>" + NS + "<lang>fr" + NS + "</lang>" + NS + "</filters>" + NS +
                            "</invoke>\n";
  auto block = [&](const std::string& body) { return NS + "<tool_call>\n" + body + NS + "</tool_call>"; };
  GrammarProbe req(m3::structured::tool_call_grammar(tools, ""));
  {
    GrammarProbe one(m3::structured::tool_call_grammar(nlohmann::ordered_json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"string"}}}}}])"), ""));
    EXPECT_TRUE(one.full(block(NS + "<invoke name=\"f\">" + NS + "</invoke>\n")));
    EXPECT_TRUE(one.full(block(NS + "<invoke name=\"f\">" + NS + "<x>P" + NS + "</x>" + NS + "</invoke>\n")));
  }
  EXPECT_TRUE(req.full(block(call1)));
  EXPECT_TRUE(req.full(block(call1 + call2)));
  EXPECT_FALSE(req.full(block("")));
  EXPECT_FALSE(req.full(block(NS + "<invoke name=\"other\">" + NS + "</invoke>\n")));
  EXPECT_FALSE(req.full(block(NS + "<invoke name=\"get_weather\">" + NS + "<days>3" + NS + "</days>" + NS + "</invoke>\n")));  // location required
  EXPECT_FALSE(req.full(block(NS + "<invoke name=\"get_weather\">" + NS + "<location>P" + NS + "</location>" + NS + "<days>30" +
                              NS + "</days>" + NS + "</invoke>\n")));  // days > 14
  GrammarProbe named(m3::structured::tool_call_grammar(tools, "search"));
  EXPECT_TRUE(named.full(block(call2)));
  EXPECT_FALSE(named.full(block(call1)));
  EXPECT_FALSE(named.full(block(call2 + call2)));
  EXPECT_THROW(m3::structured::tool_call_grammar(tools, "nope"), StructuredError);
}

// Tool parameters with format, pattern, minLength / maxLength and local $refs (as generated tool schemas
// carry them): each constrains the raw text between the tags as JSON Schema means it; a pattern must match
// the whole text (a restriction of its search semantics: every value still validates).
TEST(StructuredTools, StringKeywordsAndRefsInParameters) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type":"function","function":{"name":"f",
    "parameters":{"type":"object","$defs":{"code":{"type":"string","pattern":"^[A-Z]{3}$"},
      "node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"$ref":"#/$defs/node"}}}},
    "properties":{"day":{"type":"string","format":"date"},"code":{"$ref":"#/$defs/code"},
      "name":{"type":"string","minLength":2,"maxLength":4},"list":{"$ref":"#/$defs/node"},
      "maybe":{"anyOf":[{"$ref":"#/$defs/code"},{"type":"null"}]}}}}}])");
  const std::string NS = "]<]minimax[>[";
  auto el = [&](const std::string& k, const std::string& v) { return NS + "<" + k + ">" + v + NS + "</" + k + ">"; };
  auto call = [&](const std::string& body) {
    return NS + "<tool_call>\n" + NS + "<invoke name=\"f\">" + body + NS + "</invoke>\n" + NS + "</tool_call>";
  };
  GrammarProbe p(m3::structured::tool_call_grammar(tools, ""));
  EXPECT_TRUE(p.full(call(el("day", "2026-12-06") + el("code", "ABC") + el("name", "Ann") +
                          el("list", el("v", "1") + el("next", el("v", "2"))))));
  EXPECT_FALSE(p.full(call(el("day", "2026-13-06"))));   // format date
  EXPECT_FALSE(p.full(call(el("code", "ABCD"))));        // pattern, whole text
  EXPECT_FALSE(p.full(call(el("code", "abc"))));
  EXPECT_FALSE(p.full(call(el("name", "A"))));           // minLength
  EXPECT_FALSE(p.full(call(el("name", "Annabel"))));     // maxLength
  EXPECT_FALSE(p.full(call(el("list", el("v", "x")))));  // through the recursive $ref
  EXPECT_TRUE(p.full(call(el("maybe", "XYZ"))));         // a $ref inside anyOf is enforced too
  EXPECT_FALSE(p.full(call(el("maybe", "free text"))));
  // What stays refused names the keyword and where it is.
  for (const char* bad : {R"({"type":"string","format":"hostname"})", R"({"$ref":"other.json#/x"})", R"({"$ref":"#/$defs/none"})",
                          R"({"type":"string","pattern":"a","maxLength":3})", R"({"type":"string","minLength":5,"maxLength":2})"}) {
    nlohmann::ordered_json t = tools;
    t[0]["function"]["parameters"]["properties"]["x"] = nlohmann::ordered_json::parse(bad);
    EXPECT_THROW(m3::structured::tool_call_grammar(t, ""), StructuredError) << bad;
  }
}
