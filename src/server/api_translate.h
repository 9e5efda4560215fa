// What the Responses and Messages translators share. Both APIs are served by translation around the
// chat-completions path: the API's request is rewritten into a chat-completions body and goes through
// parse_chat_request (template, parsers, sampling, limits) and the same engine call; the chat output
// (ChoiceDeltas while streaming, the final ChoiceState) is rewritten into the API's shapes by an
// ApiOutput. So nothing about templates, parsing or sampling exists twice.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "server/choice_state.h"
#include "server/errors.h"

namespace m3::server {

// Chat output -> one API's response body or stream events. One object per request, used once.
class ApiOutput {
 public:
  virtual ~ApiOutput() = default;
  // Events before any output (input_tokens: the prompt's length).
  virtual std::string begin(int64_t input_tokens) = 0;
  // Events for one chat delta.
  virtual std::string delta(const ChoiceDelta& d) = 0;
  // Closing events, once the choice has finished (chat_usage: usage_json's object).
  virtual std::string end(const ChoiceState& s, const ojson& chat_usage) = 0;
  // The whole (non-streamed) response.
  virtual ojson full(const ChoiceState& s, const ojson& chat_usage) = 0;
  // An error after the stream has started.
  virtual std::string stream_error(int status, const std::string& message) = 0;
};

// Chat-request field names as the API calls them, to rename the field in an error from the chat path.
using FieldNames = std::vector<std::pair<std::string, std::string>>;
ApiError rename_error(const ApiError& e, const FieldNames& names);

// Ids: prefix + 24 random hex digits (tests inject a counter).
using IdMaker = std::function<std::string(const char* prefix)>;
IdMaker random_ids();

// The whole choice as one delta (reasoning, content, then the tool calls with their ids and names):
// full() runs it through the same block builder as a stream, so both give the same items.
ChoiceDelta whole_delta(const ChoiceState& s);

// The output's blocks as they open and close: reasoning, text, and one per tool call. A stream closes
// the open block when another kind starts; each API renders the three events its own way.
class BlockBuilder {
 public:
  enum class Kind { Reasoning, Text, Tool };
  struct Block {
    Kind kind;
    std::string text;  // reasoning, text, or the tool call's arguments
    std::string id, name;  // tool calls
  };
  virtual ~BlockBuilder() = default;
  std::string feed(const ChoiceDelta& d);
  std::string close_open();
  const std::vector<Block>& blocks() const { return blocks_; }

 protected:
  virtual std::string on_open(size_t i) = 0;
  virtual std::string on_append(size_t i, const std::string& piece) = 0;
  virtual std::string on_close(size_t i) = 0;

 private:
  std::vector<Block> blocks_;
  int open_ = -1;
  std::vector<std::pair<int, size_t>> tool_block_;  // tool-call index -> block
  std::string open_block(Block b);
};

// Field checks shared by the translators: a field the API defines that this server does not serve is
// refused by name unless it carries its default; a field the API does not define is logged once.
struct RefusedRule {
  const char* name;
  bool (*is_default)(const ojson&);
  const char* what;  // what it asks for
};
void check_api_fields(const ojson& body, const std::vector<const char*>& served, const std::vector<RefusedRule>& refused,
                      const char* endpoint);
bool json_null(const ojson& v);
bool json_null_or_false(const ojson& v);
bool json_null_or_empty(const ojson& v);

// Typed reads naming the field (absent and null read as absent).
const ojson* get_field(const ojson& b, const char* key);
std::string string_field(const ojson& v, const std::string& where);
const ojson& object_field(const ojson& v, const std::string& where);
const ojson& array_field(const ojson& v, const std::string& where);

// where + "[i]"; a required string field (named where.key in the error).
std::string indexed(const std::string& where, size_t i);
std::string required_string(const ojson& o, const char* key, const std::string& where);

// Flat tool definitions (Responses: {type: "function", name, description, parameters}; Messages: {name,
// description, input_schema}) -> chat-completions tools. A tool whose type is neither absent nor
// `served_type` is refused by name (`served` says what is); `schema_required`: the schema key must be there.
ojson flat_tools_to_chat(const ojson& tools, const char* served_type, const char* schema_key, bool schema_required,
                         const char* served);

// A chat message's content rebuilt from an API's blocks, in order: the text string when there are no
// images (as before images were served), else chat parts (text, and image_url for each image), which
// the chat path collects as a chat request's images. `names` (one per image, in order: how the API's
// client calls the part, e.g. "input[0].content[1]") is handed to parse_chat_request for its errors.
class ChatContent {
 public:
  void add_text(const std::string& t) { text_ += t; }
  void add_image(const std::string& url, const std::string& where, std::vector<std::string>& names);
  ojson take();

 private:
  std::string text_;
  ojson parts_ = ojson::array();
  bool images_ = false;
};

// `event: NAME` + `data: JSON` (both APIs name their events; the SDKs read either line).
std::string sse_named(const std::string& name, const ojson& data);

}  // namespace m3::server
