// Chat rendering: turns OpenAI-style messages (+ tools, kwargs) into the prompt string by running the
// checkpoint's Jinja chat template the way transformers' apply_chat_template does.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "chat/jinja/jinja.h"

namespace m3::chat {

// A compiled chat template; compile once per model, render per request.
class ChatTemplate {
 public:
  // Throws m3::Error("template line N: ...") on a syntax error.
  explicit ChatTemplate(const std::string& template_text);

  // Key order matters (tool schemas are printed with tojson), so callers that parse requests should
  // keep them as ordered_json; the nlohmann::json overload renders objects in sorted key order.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::ordered_json& chat_template_kwargs,
                     const std::string& bos_token, const std::string& eos_token) const;

 private:
  jinja::Template tmpl_;
};

// One-shot form. `tools` is an array or null; `chat_template_kwargs` (e.g. thinking_mode,
// reasoning_effort) become template variables as in transformers. Throws m3::Error with the template
// line on syntax errors and raise_exception().
std::string render_chat(const std::string& template_text, const nlohmann::json& messages, const nlohmann::json& tools,
                        bool add_generation_prompt, const nlohmann::json& chat_template_kwargs,
                        const std::string& bos_token, const std::string& eos_token);
std::string render_chat(const std::string& template_text, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const nlohmann::ordered_json& chat_template_kwargs, const std::string& bos_token,
                        const std::string& eos_token);

}  // namespace m3::chat
