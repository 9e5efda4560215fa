// The engine flags shared by `serve` and `generate` (vLLM names and meanings).
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "cli/model_flags.h"
#include "engine/engine.h"

namespace m3::cli {

struct EngineFlags {
  EngineConfig cfg;
  std::string attention_config;  // JSON, e.g. {"indexer_kv_dtype": "fp8"}
  std::string speculative_config;  // JSON, vLLM's keys (method dspark)
  bool no_prefix_caching = false;
  bool prefix_caching = false;
  std::string kv_offloading_backend = "native";
  ModelFlags model;  // load-time model flags (registered with the engine flags)
  // Applies the parsed flags to cfg (call after parsing). Throws m3::Error on bad values. `ignored`,
  // when given, receives the --attention-config keys accepted without effect here (GPU kernel options).
  EngineConfig resolve(std::vector<std::string>* ignored = nullptr) const;
};

void add_engine_flags(CLI::App* app, EngineFlags& f);

// Prints, when there are any, the flags accepted without effect on this build (one stderr line).
void print_not_applicable(const std::vector<std::string>& flags);

}  // namespace m3::cli
