// The Responses and Messages translators on their own: request -> the chat-completions body (exact JSON),
// errors naming the API's fields, and canned chat output (ChoiceState running the minimax_m3 parsers)
// -> the API's body and stream events (exact JSON, ids from a counter).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/messages_api.h"
#include "server/openai_response.h"
#include "server/responses_api.h"

using namespace m3;
using namespace m3::server;

namespace {

const std::string NS = "]<]minimax[>[";

IdMaker counter() {
  auto n = std::make_shared<int>(0);
  return [n](const char* prefix) { return std::string(prefix) + std::to_string(++*n); };
}

ChoiceOptions m3_options() {
  ChoiceOptions o;
  o.reasoning = chat::ReasoningFormat::MiniMaxM3;
  o.reasoning_start = true;
  o.tool = chat::ToolFormat::MiniMaxM3;
  o.tools = nlohmann::json::parse(
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  o.stop = {"STOP"};
  return o;
}

// The SSE text as [{"event": name, "data": json}, ...].
ojson parse_sse(const std::string& s) {
  ojson out = ojson::array();
  size_t at = 0;
  while (at < s.size()) {
    const size_t end = s.find("\n\n", at);
    const std::string ev = s.substr(at, end - at);
    at = end + 2;
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    out.push_back({{"event", ev.substr(7, nl - 7)}, {"data", ojson::parse(ev.substr(nl + 7))}});
  }
  return out;
}

std::string expect_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.param;
  }
  ADD_FAILURE() << "no error";
  return {};
}

}  // namespace

TEST(AgentApis, ResponsesRequestToChat) {
  const ojson body = ojson::parse(R"({
    "model": "demo", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0, "stream": true,
    "reasoning": {"effort": "high", "summary": "auto"}, "store": false, "include": ["reasoning.encrypted_content"],
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather.", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Need a call."}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    ]})");
  const ResponsesRequest r = responses_to_chat(body);
  EXPECT_EQ(r.chat, ojson::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "system", "content": "Use tools."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "reasoning_content": "Need a call.",
       "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
    "model": "demo", "temperature": 0, "stream": true, "max_tokens": 50,
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "reasoning_effort": "high", "chat_template_kwargs": {"thinking_mode": "enabled"}})"))
      << r.chat.dump(1);
  EXPECT_EQ(r.echo["reasoning"], ojson::parse(R"({"effort": "high", "summary": null})"));
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
}

TEST(AgentApis, ResponsesRefusalsNameTheField) {
  auto param = [](const char* body) { return expect_error([&] { responses_to_chat(ojson::parse(body)); }); };
  EXPECT_EQ(param(R"({"input": "hi", "store": true})"), "store");
  EXPECT_EQ(param(R"({"input": "hi", "previous_response_id": "resp_1"})"), "previous_response_id");
  EXPECT_EQ(param(R"({"input": "hi", "background": true})"), "background");
  EXPECT_EQ(param(R"({"input": "hi", "truncation": "auto"})"), "truncation");
  EXPECT_EQ(param(R"({"input": "hi", "include": ["message.output_text.logprobs"]})"), "include");
  EXPECT_EQ(param(R"({"input": [{"role": "user", "content": "a"}, {"type": "item_reference", "id": "x"}]})"), "input[1].type");
  // Images: file_id and a detail other than auto are refused by name; input_image only in user messages.
  EXPECT_EQ(param(R"({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1", "detail": "auto"}]}]})"),
            "input[0].content[0].file_id");
  EXPECT_EQ(param(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x", "detail": "low"}]}]})"),
            "input[0].content[0].detail");
  EXPECT_EQ(param(R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})"), "input[0].content[0].image_url");
  EXPECT_EQ(param(R"({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}]})"),
            "input[0].content[0]");
  EXPECT_EQ(param(R"({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]})"),
            "input[0].content[0]");
  EXPECT_EQ(param(R"({"input": "hi", "tools": [{"type": "file_search"}]})"), "tools[0].type");
  EXPECT_EQ(param(R"({"instructions": "x"})"), "input");
  // Errors from the chat path come back under the Responses names.
  const ApiError e = rename_error(bad_request("'max_tokens' must be at least 1", "max_tokens"), responses_field_names());
  EXPECT_EQ(e.param, "max_output_tokens");
  EXPECT_STREQ(e.what(), "'max_output_tokens' must be at least 1");
}

TEST(AgentApis, MessagesRequestToChat) {
  const ojson body = ojson::parse(R"({
    "model": "demo", "max_tokens": 64, "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5,
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
    "thinking": {"type": "enabled", "budget_tokens": 32}, "metadata": {"user_id": "u"},
    "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "Need a call.", "signature": ""},
                                        {"type": "text", "text": "Checking."},
                                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                                   {"type": "text", "text": "And tomorrow?"}]}]})");
  EXPECT_EQ(messages_to_chat(body), ojson::parse(R"({
    "model": "demo",
    "messages": [
      {"role": "system", "content": "Be brief.\nUse tools."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "Checking.", "reasoning_content": "Need a call.",
       "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
      {"role": "user", "content": "And tomorrow?"}],
    "max_tokens": 64, "temperature": 0.5, "top_k": 5, "stop": ["END"],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object"}}}],
    "tool_choice": "required", "parallel_tool_calls": false, "thinking_token_budget": 32,
    "chat_template_kwargs": {"thinking_mode": "enabled"}})"))
      << messages_to_chat(body).dump(1);
  // count_tokens: no max_tokens needed, no sampling fields.
  const ojson ct = messages_to_chat(ojson::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"), true);
  EXPECT_EQ(ct, ojson::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"));
}

// Image parts become chat image_url parts in order, text between them kept as text parts; each image's
// name in the API's own terms is handed on for the chat path's errors. Without images the content stays a
// string, as before.
TEST(AgentApis, ImagesBecomeChatImageParts) {
  const ResponsesRequest r = responses_to_chat(ojson::parse(R"({"instructions": "Be brief.", "input": [
    {"role": "user", "content": "hi"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "A "}, {"type": "input_text", "text": "and "},
      {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto", "file_id": null},
      {"type": "input_image", "image_url": "https://example.com/b.jpg"}, {"type": "input_text", "text": " compare."}]}]})"));
  EXPECT_EQ(r.chat["messages"], ojson::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
    {"role": "user", "content": [{"type": "text", "text": "A and "},
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
      {"type": "image_url", "image_url": {"url": "https://example.com/b.jpg"}}, {"type": "text", "text": " compare."}]}])"))
      << r.chat["messages"].dump(1);
  EXPECT_EQ(r.image_names, (std::vector<std::string>{"input[1].content[2]", "input[1].content[3]"}));

  std::vector<std::string> names;
  const ojson m = messages_to_chat(ojson::parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [
      {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}, "cache_control": {"type": "ephemeral"}},
      {"type": "text", "text": "What is it?"}, {"type": "image", "source": {"type": "url", "url": "https://example.com/c.png"}}]}]})"),
                                   false, &names);
  EXPECT_EQ(m["messages"], ojson::parse(R"([{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}}, {"type": "text", "text": "What is it?"},
      {"type": "image_url", "image_url": {"url": "https://example.com/c.png"}}]}])"))
      << m["messages"].dump(1);
  EXPECT_EQ(names, (std::vector<std::string>{"messages[0].content[0]", "messages[0].content[2]"}));

  // Tool outputs with images: the tool message's parts. Names follow the chat messages' order: a user
  // turn's tool results come before its own text and images.
  const ojson t = messages_to_chat(ojson::parse(R"({"max_tokens": 5, "messages": [
      {"role": "user", "content": "Take a screenshot."},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}]},
      {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u1"}},
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"},
          {"type": "image", "source": {"type": "url", "url": "u2"}}]}]}]})"),
                                   false, &names);
  EXPECT_EQ(t["messages"][2], ojson::parse(R"({"role": "tool", "tool_call_id": "toolu_1", "content": [
      {"type": "text", "text": "a\nb"}, {"type": "image_url", "image_url": {"url": "u2"}}]})")) << t.dump(1);
  EXPECT_EQ(t["messages"][3], ojson::parse(R"({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u1"}}]})"));
  EXPECT_EQ(names, (std::vector<std::string>{"messages[2].content[1].content[2]", "messages[2].content[0]"}));
  const ResponsesRequest fo = responses_to_chat(ojson::parse(R"({"input": [{"role": "user", "content": "Look."},
    {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "done"},
      {"type": "input_image", "image_url": "u3"}]}]})"));
  EXPECT_EQ(fo.chat["messages"][2], ojson::parse(R"({"role": "tool", "tool_call_id": "c1", "content": [
      {"type": "text", "text": "done"}, {"type": "image_url", "image_url": {"url": "u3"}}]})")) << fo.chat.dump(1);
  EXPECT_EQ(fo.image_names, (std::vector<std::string>{"input[2].output[1]"}));
}

TEST(AgentApis, MessagesRefusalsNameTheField) {
  auto param = [](const char* body) { return expect_error([&] { messages_to_chat(ojson::parse(body)); }); };
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(param(("{" + msgs + "}").c_str()), "max_tokens");
  EXPECT_EQ(param(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})"),
            "messages[0].content[0].source.type");
  EXPECT_EQ(param(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]})"),
            "messages[0].content[0].source.type");
  EXPECT_EQ(param(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "text/plain", "data": "aGk="}}]}]})"),
            "messages[0].content[0].source.media_type");
  EXPECT_EQ(param(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]})"),
            "messages[1].content[0]");
  EXPECT_EQ(param(("{\"max_tokens\": 5, \"tools\": [{\"type\": \"bash_20250124\", \"name\": \"bash\"}], " + msgs + "}").c_str()),
            "tools[0].type");
  EXPECT_EQ(param(("{\"max_tokens\": 5, \"thinking\": {\"type\": \"enabled\"}, " + msgs + "}").c_str()),
            "thinking.budget_tokens");
  EXPECT_EQ(param(("{\"max_tokens\": 5, \"mcp_servers\": [{\"url\": \"x\"}], " + msgs + "}").c_str()), "mcp_servers");
  EXPECT_EQ(rename_error(bad_request("'stop' must be a list", "stop"), messages_field_names()).param, "stop_sequences");
  EXPECT_EQ(anthropic_error_body(400, "bad"),
            ojson::parse(R"({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}})"));
  EXPECT_EQ(anthropic_error_body(401, "key")["error"]["type"], "authentication_error");
}

// Text streamed in two outputs: the Responses events, in order, numbered.
TEST(AgentApis, ResponsesStreamEvents) {
  ChoiceOptions o;
  ChoiceState s(nullptr, o);
  auto out = make_responses_output(responses_to_chat(ojson::parse(R"({"input": "hi"})")).echo, "demo", 7, counter(),
                                   [](const std::string& t) { return int64_t(t.size()); });
  std::string sse = out->begin(3);
  sse += out->delta(s.on_text("Hi", false, FinishReason::None));
  sse += out->delta(s.on_text(" there", true, FinishReason::Length));
  sse += out->end(s, usage_json(3, 2, 1));
  const ojson ev = parse_sse(sse);
  std::vector<std::string> names;
  for (size_t i = 0; i < ev.size(); ++i) {
    names.push_back(ev[i]["event"]);
    EXPECT_EQ(ev[i]["data"]["type"], ev[i]["event"]);
    EXPECT_EQ(ev[i]["data"]["sequence_number"], i);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                             "response.content_part.added", "response.output_text.delta",
                                             "response.output_text.delta", "response.output_text.done",
                                             "response.content_part.done", "response.output_item.done",
                                             "response.completed"}));
  EXPECT_EQ(ev[2]["data"], ojson::parse(R"({"type": "response.output_item.added", "output_index": 0,
    "item": {"id": "msg_2", "type": "message", "status": "in_progress", "role": "assistant", "content": []},
    "sequence_number": 2})"));
  EXPECT_EQ(ev[3]["data"], ojson::parse(R"({"type": "response.content_part.added", "item_id": "msg_2", "output_index": 0,
    "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}, "sequence_number": 3})"));
  EXPECT_EQ(ev[5]["data"], ojson::parse(R"({"type": "response.output_text.delta", "item_id": "msg_2", "output_index": 0,
    "content_index": 0, "delta": " there", "logprobs": [], "sequence_number": 5})"));
  EXPECT_EQ(ev[6]["data"], ojson::parse(R"({"type": "response.output_text.done", "item_id": "msg_2", "output_index": 0,
    "content_index": 0, "text": "Hi there", "logprobs": [], "sequence_number": 6})"));
  const ojson& r = ev[9]["data"]["response"];
  EXPECT_EQ(r["id"], "resp_1");
  EXPECT_EQ(r["created_at"], 7);
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"], ojson::parse(R"({"reason": "max_output_tokens"})"));
  // max_output_tokens cut the message: its item is incomplete too (as OpenAI marks it), in the final
  // response and in its output_item.done event.
  EXPECT_EQ(r["output"], ojson::parse(R"([{"id": "msg_2", "type": "message", "status": "incomplete", "role": "assistant",
    "content": [{"type": "output_text", "text": "Hi there", "annotations": [], "logprobs": []}]}])"));
  EXPECT_EQ(ev[8]["data"]["item"], r["output"][0]);
  EXPECT_EQ(r["usage"], ojson::parse(R"({"input_tokens": 3, "input_tokens_details": {"cached_tokens": 1},
    "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 5})"));
}

// Reasoning and a tool call, not streamed: reasoning and function_call items.
TEST(AgentApis, ResponsesFullWithReasoningAndCall) {
  ChoiceState s(nullptr, m3_options());
  s.on_text("Hm.</mm:think>" + NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">" + NS + "<city>Paris" + NS +
                "</city>" + NS + "</invoke>\n" + NS + "</tool_call>",
            true, FinishReason::Stop);
  const std::string call_id = s.tool_calls().at(0).id;
  auto out = make_responses_output(ojson::object(), "demo", 7, counter(), [](const std::string& t) { return int64_t(t.size()); });
  const ojson r = out->full(s, usage_json(10, 20, 0));
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["output"], ojson::parse(R"([
    {"id": "rs_2", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}],
     "encrypted_content": null, "status": "completed"},
    {"id": "fc_3", "type": "function_call", "status": "completed", "call_id": ")" + call_id + R"(",
     "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}])"));
  EXPECT_EQ(r["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
}

// Reasoning and a tool call streamed: Anthropic's events, exact.
TEST(AgentApis, MessagesStreamEvents) {
  ChoiceState s(nullptr, m3_options());
  auto out = make_messages_output("demo", counter());
  std::string sse = out->begin(12);
  for (const std::string& piece :
       {std::string("Hm."), "</mm:think>" + NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">" + NS + "<city>Paris" + NS +
                               "</city>" + NS + "</invoke>\n" + NS + "</tool_call>"})
    sse += out->delta(s.on_text(piece, piece != "Hm.", FinishReason::Stop));
  sse += out->end(s, usage_json(12, 20, 0));
  const std::string id = s.tool_calls().at(0).id;
  ojson events = ojson::array();
  for (auto& e : parse_sse(sse)) {
    EXPECT_EQ(e["data"]["type"], e["event"]);
    events.push_back(e["data"]);
  }
  // The arguments arrive as the tool parser streams them; their concatenation is checked, the rest exactly.
  std::string args;
  ojson rest = ojson::array();
  for (auto& e : events)
    if (e["type"] == "content_block_delta" && e["delta"]["type"] == "input_json_delta")
      args += e["delta"]["partial_json"].get<std::string>();
    else
      rest.push_back(e);
  EXPECT_EQ(args, "{\"city\": \"Paris\"}");
  EXPECT_EQ(rest, ojson::parse(R"([
    {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "demo", "content": [],
      "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 12, "output_tokens": 0}}},
    {"type": "ping"},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hm."}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": ""}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": ")" + id + R"(", "name": "get_weather", "input": {}}},
    {"type": "content_block_stop", "index": 1},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 20}},
    {"type": "message_stop"}])"))
      << rest.dump(1);
}

// Text cut by a stop sequence, not streamed.
TEST(AgentApis, MessagesFullStopSequence) {
  ChoiceOptions o;
  o.stop = {"STOP"};
  ChoiceState s(nullptr, o);
  s.on_text("Hello STOP more", true, FinishReason::Stop);
  const ojson m = make_messages_output("demo", counter())->full(s, usage_json(4, 3, 0));
  EXPECT_EQ(m, ojson::parse(R"({"id": "msg_1", "type": "message", "role": "assistant", "model": "demo",
    "content": [{"type": "text", "text": "Hello "}], "stop_reason": "stop_sequence", "stop_sequence": "STOP",
    "usage": {"input_tokens": 4, "output_tokens": 3}})"))
      << m.dump(1);
}

// A reasoning input item that no assistant message or call follows is kept as an assistant turn of its
// own (chat and Messages render the same history so), at the end of the input or before the next turn.
TEST(AgentApis, ResponsesReasoningItemAloneIsKept) {
  const ResponsesRequest r = responses_to_chat(ojson::parse(R"({"input": [{"role": "user", "content": "Hi"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "The user greets me."}]},
    {"role": "user", "content": "Again"},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Last."}]}]})"));
  EXPECT_EQ(r.chat["messages"], ojson::parse(R"([{"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "", "reasoning_content": "The user greets me."},
    {"role": "user", "content": "Again"},
    {"role": "assistant", "content": "", "reasoning_content": "Last."}])"))
      << r.chat["messages"].dump(1);
  // Followed by its message: one turn, as before.
  const ResponsesRequest m = responses_to_chat(ojson::parse(R"({"input": [{"role": "user", "content": "Hi"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "R"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]}]})"));
  EXPECT_EQ(m.chat["messages"][1], ojson::parse(R"({"role": "assistant", "content": "Hello", "reasoning_content": "R"})"));
}

// A call the model stopped inside (no length cut): the stream has announced it, the parser drops it at the
// end; its output_item.done and the final response mark it incomplete instead of completed.
TEST(AgentApis, ResponsesStreamedCallDroppedAtTheEndIsIncomplete) {
  ChoiceState s(nullptr, m3_options());
  auto out = make_responses_output(responses_to_chat(ojson::parse(R"({"input": "hi"})")).echo, "demo", 7, counter(),
                                   [](const std::string& t) { return int64_t(t.size()); });
  std::string sse = out->begin(3);
  sse += out->delta(s.on_text("Hm.</mm:think>Checking. " + NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">", false,
                              FinishReason::None));
  sse += out->delta(s.on_text(NS + "<city>Par", true, FinishReason::Stop));
  sse += out->end(s, usage_json(3, 2, 0));
  EXPECT_TRUE(s.tool_calls().empty());
  const ojson ev = parse_sse(sse);
  ojson done_item, final_output;
  for (const auto& e : ev) {
    if (e["event"] == "response.output_item.done" && e["data"]["item"]["type"] == "function_call") done_item = e["data"]["item"];
    if (e["event"] == "response.completed") final_output = e["data"]["response"]["output"];
  }
  EXPECT_EQ(done_item["status"], "incomplete") << sse;
  ASSERT_EQ(final_output.size(), 3u) << final_output.dump();  // reasoning, text, the call
  EXPECT_EQ(final_output[1]["status"], "completed");
  EXPECT_EQ(final_output[2]["type"], "function_call");
  EXPECT_EQ(final_output[2]["status"], "incomplete");
}
