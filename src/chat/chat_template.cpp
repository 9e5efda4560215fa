// Chat rendering with transformers' conventions: template variables are messages, tools,
// add_generation_prompt, bos_token, eos_token plus every chat_template_kwargs entry; tool-call
// arguments given as JSON strings (the OpenAI wire form) are decoded to objects first, as vLLM does,
// because templates iterate over them with `.items()`.
#include "chat/chat_template.h"

#include "chat/json_depth.h"
#include "base/error.h"

namespace m3::chat {
namespace {

using ojson = nlohmann::ordered_json;

ojson decode_tool_call_arguments(const ojson& messages) {
  ojson out = messages;
  if (!out.is_array()) return out;
  for (auto& m : out) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& tc : m["tool_calls"]) {
      if (!tc.is_object()) continue;
      ojson* fn = tc.contains("function") && tc["function"].is_object() ? &tc["function"] : &tc;
      auto it = fn->find("arguments");
      if (it == fn->end() || !it->is_string()) continue;
      ojson parsed = parse_json_limited_or_discarded(it->get<std::string>());
      if (parsed.is_object()) *it = std::move(parsed);
    }
  }
  return out;
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& template_text) : tmpl_(template_text) {}

std::string ChatTemplate::render(const ojson& messages, const ojson& tools, bool add_generation_prompt,
                                 const ojson& chat_template_kwargs, const std::string& bos_token,
                                 const std::string& eos_token) const {
  // The conversions below copy and recurse once per level: refuse deep values before touching them.
  for (auto [what, v] : {std::pair{"messages", &messages}, {"tools", &tools}, {"chat_template_kwargs", &chat_template_kwargs}})
    if (nests_deeper_than(*v, jinja::Value::kMaxJsonDepth))
      throw Error(std::string(what) + " nests deeper than " + std::to_string(jinja::Value::kMaxJsonDepth) +
                  " levels (objects and arrays)");
  auto ctx = std::make_shared<jinja::Object>();
  ctx->set("bos_token", jinja::Value(bos_token));
  ctx->set("eos_token", jinja::Value(eos_token));
  if (chat_template_kwargs.is_object())
    for (auto it = chat_template_kwargs.begin(); it != chat_template_kwargs.end(); ++it)
      ctx->set(it.key(), jinja::Value::from_json(it.value()));
  // These three are the call's own arguments; kwargs cannot replace them.
  ctx->set("messages", jinja::Value::from_json(decode_tool_call_arguments(messages)));
  ctx->set("tools", tools.is_null() ? jinja::Value::none() : jinja::Value::from_json(tools));
  ctx->set("add_generation_prompt", jinja::Value(add_generation_prompt));
  return tmpl_.render(jinja::Value(ctx));
}

std::string render_chat(const std::string& template_text, const ojson& messages, const ojson& tools,
                        bool add_generation_prompt, const ojson& chat_template_kwargs, const std::string& bos_token,
                        const std::string& eos_token) {
  return ChatTemplate(template_text)
      .render(messages, tools, add_generation_prompt, chat_template_kwargs, bos_token, eos_token);
}

std::string render_chat(const std::string& template_text, const nlohmann::json& messages, const nlohmann::json& tools,
                        bool add_generation_prompt, const nlohmann::json& chat_template_kwargs,
                        const std::string& bos_token, const std::string& eos_token) {
  return render_chat(template_text, ojson(messages), ojson(tools), add_generation_prompt, ojson(chat_template_kwargs),
                     bos_token, eos_token);
}

}  // namespace m3::chat
