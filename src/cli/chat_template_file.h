// Where a command finds its chat template: --chat-template (a file, or inline template text as vLLM
// allows), else the checkpoint's chat_template.jinja, else tokenizer_config.json's chat_template.
// Shared by serve and logits --input so both render a chat the same way.
#pragma once
#include <string>

namespace m3::cli {

// The template text; empty when neither the flag nor the checkpoint has one. Throws m3::Error when
// `flag` is neither a file nor template text.
std::string load_chat_template(const std::string& flag, const std::string& dir);

}  // namespace m3::cli
