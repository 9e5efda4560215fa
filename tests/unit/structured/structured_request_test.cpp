// Structured outputs: the request fields (response_format, structured_outputs, guided_*) read into
// grammars, conflicts and unsupported fields refused by name.
#include "structured_test_util.h"

#include "structured/request.h"

using m3::structured::StructuredError;
using m3::structured::structured_from_request;
using ojson = nlohmann::ordered_json;

TEST(StructuredRequest, ReadsEveryField) {
  auto kind = [](const char* body) {
    auto r = structured_from_request(ojson::parse(body));
    return r ? r->field + "/" + r->kind : std::string("none");
  };
  EXPECT_EQ(kind(R"({"messages":[]})"), "none");
  EXPECT_EQ(kind(R"({"response_format":{"type":"text"}})"), "none");
  EXPECT_EQ(kind(R"({"response_format":{"type":"json_object"}})"), "response_format/json_object");
  EXPECT_EQ(kind(R"({"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"integer"}}}})"),
            "response_format/json_schema");
  EXPECT_EQ(kind(R"({"structured_outputs":{"json":{"type":"integer"}}})"), "structured_outputs.json/json_schema");
  EXPECT_EQ(kind(R"({"structured_outputs":{"json":"{\"type\":\"integer\"}"}})"), "structured_outputs.json/json_schema");
  EXPECT_EQ(kind(R"({"structured_outputs":{"regex":"a+"}})"), "structured_outputs.regex/regex");
  EXPECT_EQ(kind(R"({"structured_outputs":{"choice":["a","b"]}})"), "structured_outputs.choice/choice");
  EXPECT_EQ(kind(R"({"structured_outputs":{"grammar":"root ::= \"a\""}})"), "structured_outputs.grammar/grammar");
  EXPECT_EQ(kind(R"({"guided_json":{"type":"integer"},"guided_decoding_backend":"xgrammar"})"), "guided_json/json_schema");
  EXPECT_EQ(kind(R"({"guided_regex":"\\d+"})"), "guided_regex/regex");
  EXPECT_EQ(kind(R"({"guided_choice":["x"]})"), "guided_choice/choice");
  EXPECT_EQ(kind(R"({"guided_grammar":"root ::= [a-z]+"})"), "guided_grammar/grammar");

  auto r = structured_from_request(ojson::parse(R"({"structured_outputs":{"json":{"type":"array"},"disable_any_whitespace":true}})"));
  m3test::GrammarProbe p(r->grammar);
  EXPECT_TRUE(p.full("[1,2]"));
  EXPECT_FALSE(p.full("[1, 2]"));
}

TEST(StructuredRequest, RefusesByName) {
  auto refused = [](const char* body, const std::string& name) {
    try {
      structured_from_request(ojson::parse(body));
      ADD_FAILURE() << "not refused: " << body;
    } catch (const StructuredError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  refused(R"({"guided_json":{"type":"integer"},"guided_regex":"a"})", "guided_json");
  refused(R"({"response_format":{"type":"structural_tag"}})", "structural_tag");
  refused(R"({"guided_whitespace_pattern":" *"})", "guided_whitespace_pattern");
  refused(R"({"guided_json":"{not json"})", "guided_json");
  refused(R"({"structured_outputs":{"json":{"type":"string","format":"hostname"}}})", "hostname");
  refused(R"({"structured_outputs":{"structural_tag":{}}})", "structured_outputs.structural_tag");
  refused(R"({"guided_choice":[]})", "guided_choice");
}
