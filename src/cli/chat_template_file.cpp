// The chat template a command renders with (chat_template_file.h).
#include "cli/chat_template_file.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"

namespace m3::cli {

namespace fs = std::filesystem;

static std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw Error(p.string() + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string load_chat_template(const std::string& flag, const std::string& dir) {
  if (!flag.empty()) {
    if (fs::exists(flag)) return slurp(flag);
    if (flag.find("{{") != std::string::npos || flag.find("{%") != std::string::npos) return flag;
    throw Error("--chat-template: " + flag + " is neither a file nor a template");
  }
  if (fs::exists(fs::path(dir) / "chat_template.jinja")) return slurp(fs::path(dir) / "chat_template.jinja");
  const fs::path tc = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(tc)) {
    auto j = nlohmann::json::parse(slurp(tc), nullptr, false);
    if (j.is_object() && j.contains("chat_template")) {
      const auto& t = j["chat_template"];
      if (t.is_string()) return t.get<std::string>();
      if (t.is_array())
        for (auto& e : t)
          if (e.value("name", "") == "default" && e.contains("template")) return e["template"].get<std::string>();
    }
  }
  return {};
}

}  // namespace m3::cli
