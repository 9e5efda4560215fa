// generation_config.json's sampling defaults (see generation_defaults.h).
#include "cli/generation_defaults.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

namespace m3::cli {

SamplingParams generation_defaults(const std::string& model_dir) {
  SamplingParams p;
  std::ifstream f(std::filesystem::path(model_dir) / "generation_config.json");
  if (!f) return p;
  const auto j = nlohmann::json::parse(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), nullptr, false);
  if (!j.is_object()) return p;
  if (j.contains("temperature") && j["temperature"].is_number()) p.temperature = j["temperature"].get<float>();
  if (j.contains("top_p") && j["top_p"].is_number()) p.top_p = j["top_p"].get<float>();
  if (j.contains("top_k") && j["top_k"].is_number_integer()) p.top_k = j["top_k"].get<int>();
  if (j.contains("min_p") && j["min_p"].is_number()) p.min_p = j["min_p"].get<float>();
  if (j.contains("repetition_penalty") && j["repetition_penalty"].is_number())
    p.repetition_penalty = j["repetition_penalty"].get<float>();
  return p;
}

}  // namespace m3::cli
