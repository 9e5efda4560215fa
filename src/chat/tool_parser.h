// Tool-call parsers (minimax_m3 and minimax_m2): extract tool calls from model output, typed by the
// request's JSON schemas, non-streaming and as a streaming state machine that emits OpenAI-style
// tool-call deltas (docs/serving.md 5 and 6).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace m3::chat {

enum class ToolFormat { MiniMaxM3, MiniMaxM2 };

// Parses "minimax_m3" / "minimax_m2"; throws m3::Error otherwise.
ToolFormat tool_format_from_name(const std::string& name);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, json.dumps spacing: {"a": 1, "b": [1, 2]}
};

// One streamed tool-call update. The first delta of a call carries id and name (arguments empty);
// later ones carry argument fragments that concatenate to the final `arguments`.
struct ToolCallDelta {
  int index = 0;
  std::optional<std::string> id;
  std::optional<std::string> name;
  std::string arguments;
};

struct ToolStreamDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && tool_calls.empty(); }
};

struct ToolParseResult {
  std::string content;          // text outside the tool-call block, markers stripped
  std::vector<ToolCall> calls;  // complete invokes only
  bool incomplete = false;      // output ended inside an invoke (the partial one is not in `calls`)
};

struct ToolParserOptions {
  bool parallel_tool_calls = true;  // false: only the first invoke is returned
  // Makes call ids; default "chatcmpl-tool-" + 32 random hex digits.
  std::function<std::string()> make_id;
};

class ToolParser {
 public:
  // `tools` is the request's tools array (OpenAI form, or bare function objects) or null.
  ToolParser(ToolFormat fmt, const nlohmann::json& tools, ToolParserOptions opt = {});
  ~ToolParser();
  ToolParser(ToolParser&&) noexcept;

  // Streaming: feed detokenised pieces (special tokens kept); held-back text is released as soon
  // as it cannot be markup, and by finish().
  ToolStreamDelta feed(std::string_view delta);
  ToolStreamDelta finish();

  // Non-streaming: a fresh parse of the whole output (does not disturb the streaming state).
  ToolParseResult parse(std::string_view text) const;

  // State after finish(): calls completed so far, and whether the output ended inside an invoke.
  const std::vector<ToolCall>& calls() const;
  bool incomplete() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3::chat
