// A model reference as given on the command line (vLLM's MODEL / --tokenizer) turned into a local
// directory: the directory itself, or a Hugging Face Hub id found in the cache or downloaded into it.
#pragma once
#include <filesystem>
#include <string>

namespace m3::hub {

// What a reference needs from its repository: the whole checkpoint, or only the tokenizer files.
enum class FileSet { Model, Tokenizer };

// Whether a repository file is fetched for `set`: Model: the top-level *.safetensors shards,
// model.safetensors.index.json, config.json, generation_config.json, the tokenizer files, and everything
// under dspark/ (the draft model); Tokenizer: tokenizer.json, tokenizer_config.json, chat templates.
bool wanted_file(const std::string& path, FileSet set);

// Where and how to look: the environment huggingface_hub reads.
struct HubSettings {
  std::filesystem::path cache_dir;  // --download-dir, else default_cache_dir()
  bool offline = false;             // HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE)
  std::string endpoint;             // HF_ENDPOINT, default https://huggingface.co
  std::string token;                // HF_TOKEN, else the file `hf auth login` writes ($HF_HOME/token)
  bool progress = true;             // progress bar on stderr
  static HubSettings from_environment(const std::string& download_dir);
};

struct ResolvedRef {
  std::string dir;     // the local directory (a cache snapshot for a Hub id)
  std::string source;  // for the start-up line: "local directory", "HF cache (commit ...)", "downloaded ..."
};

// Resolves `ref` (named `what` in messages, e.g. "MODEL" or "--tokenizer") at `revision` (empty:
// main; branch, tag, full commit id, or an unambiguous commit prefix found in the cache). A local
// directory wins; a Hub id is looked up in the cache (offline, or when the Hub cannot be reached)
// or fetched from the Hub (only the files `set` needs). Throws m3::Error naming the reference, the
// revision and every place looked when nothing is found.
ResolvedRef resolve_model_ref(const std::string& ref, const std::string& revision, FileSet set, const HubSettings& s,
                              const std::string& what);

}  // namespace m3::hub
