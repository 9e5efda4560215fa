// Model reference flags: registration and resolution through src/hub (see model_ref_flags.h).
#include "cli/model_ref_flags.h"

#include <cstdio>

#include "base/json_flag.h"
#include "hub/model_ref.h"

namespace m3::cli {

std::string ModelRefFlags::config_overrides() const {
  if (hf_overrides.empty()) return "";
  return parse_json_flag(hf_overrides, "--hf-overrides").dump();
}

void add_model_ref_flags(CLI::App* app, ModelRefFlags& f) {
  app->add_option("--revision", f.revision,
                  "Hugging Face Hub id only: the branch, tag or commit id of MODEL (default main); a commit prefix "
                  "is accepted when it names one snapshot in the cache");
  app->add_option("--download-dir", f.download_dir,
                  "Hugging Face cache directory to look in and download into, instead of $HF_HUB_CACHE "
                  "(default $HF_HOME/hub, ~/.cache/huggingface/hub)");
  app->add_option("--hf-overrides", f.hf_overrides,
                  "JSON object merged into the checkpoint's config.json before it is read, e.g. "
                  "'{\"text_config\": {\"max_position_embeddings\": 65536}}' (sub-configs such as text_config are merged key "
                  "by key, other keys replaced)");
}

void add_tokenizer_ref_flags(CLI::App* app, ModelRefFlags& f) {
  app->add_option("--tokenizer", f.tokenizer,
                  "Tokenizer (and chat template) from this directory or Hub id instead of MODEL's");
  app->add_option("--tokenizer-revision", f.tokenizer_revision,
                  "Branch, tag or commit id of the tokenizer's Hub id (default: main; without --tokenizer: MODEL's "
                  "tokenizer files at this revision)");
}

ModelDirs resolve_model_dirs(const ModelRefFlags& f, const std::string& model) {
  const hub::HubSettings s = hub::HubSettings::from_environment(f.download_dir);
  auto resolve = [&](const std::string& ref, const std::string& rev, hub::FileSet set, const std::string& what) {
    const hub::ResolvedRef r = hub::resolve_model_ref(ref, rev, set, s, what);
    if (r.source != "local directory")
      std::fprintf(stderr, "[m3serve] %s %s%s: %s (%s)\n", what.c_str(), ref.c_str(),
                   rev.empty() ? "" : ("@" + rev).c_str(), r.dir.c_str(), r.source.c_str());
    return r.dir;
  };
  ModelDirs d;
  d.model = resolve(model, f.revision, hub::FileSet::Model, "MODEL");
  if (!f.tokenizer.empty())
    d.tokenizer = resolve(f.tokenizer, f.tokenizer_revision, hub::FileSet::Tokenizer, "--tokenizer");
  else if (!f.tokenizer_revision.empty())
    d.tokenizer = resolve(model, f.tokenizer_revision, hub::FileSet::Tokenizer, "--tokenizer-revision of MODEL");
  else
    d.tokenizer = d.model;
  return d;
}

}  // namespace m3::cli
