// The flags that say where a model comes from (vLLM's names): MODEL as a directory or a Hugging Face
// Hub id at --revision, the cache (--download-dir), another tokenizer (--tokenizer,
// --tokenizer-revision), and --hf-overrides for config.json.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace m3::cli {

struct ModelRefFlags {
  std::string revision, download_dir, hf_overrides;
  std::string tokenizer, tokenizer_revision;  // registered only where a tokenizer is loaded
  // --hf-overrides checked to be a JSON object (m3::Error naming the flag otherwise); "" when not given.
  std::string config_overrides() const;
};

struct ModelDirs {
  std::string model, tokenizer;  // local directories
};

// --revision, --download-dir, --hf-overrides (every command that loads a model).
void add_model_ref_flags(CLI::App* app, ModelRefFlags& f);
// --tokenizer, --tokenizer-revision (the commands that also load a tokenizer).
void add_tokenizer_ref_flags(CLI::App* app, ModelRefFlags& f);

// Resolves `model` (as given: a directory or a Hub id) and the tokenizer to local directories
// (src/hub/model_ref.h: the cache, else a download), with one stderr line for each Hub id.
ModelDirs resolve_model_dirs(const ModelRefFlags& f, const std::string& model);

}  // namespace m3::cli
