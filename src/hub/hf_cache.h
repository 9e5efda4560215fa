// The Hugging Face Hub cache layout, as huggingface_hub writes it: where the cache is, and one model
// repository's refs (revision -> commit), snapshots (commit -> files as symlinks) and blobs in it.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace m3::hub {

namespace fs = std::filesystem;

// huggingface_hub's reading of a boolean environment variable: 1, ON, YES or TRUE in any case.
bool env_flag(const char* name);

// The cache huggingface_hub uses: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE (its older name), else
// $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
fs::path default_cache_dir();

// A full commit id: 40 lowercase hex digits.
bool is_commit_sha(const std::string& s);

// A Hub repository id as huggingface_hub validates it: [ORG/]NAME of letters, digits, '-', '_', '.',
// neither part starting or ending with '-' or '.', no "--" or "..", at most 96 characters.
bool is_repo_id(const std::string& s);

// "models--ORG--NAME": the repository's folder in the cache.
std::string repo_folder_name(const std::string& repo_id);

// One model repository in one cache directory.
class CacheRepo {
 public:
  CacheRepo(fs::path cache_dir, std::string repo_id);

  const fs::path& dir() const { return dir_; }  // <cache>/models--ORG--NAME
  fs::path ref_path(const std::string& revision) const { return dir_ / "refs" / revision; }
  fs::path snapshot_dir(const std::string& commit) const { return dir_ / "snapshots" / commit; }
  fs::path blob_path(const std::string& etag) const { return dir_ / "blobs" / etag; }

  // The commit refs/<revision> holds (a branch or tag once resolved), if any.
  std::optional<std::string> read_ref(const std::string& revision) const;
  // Records revision -> commit (nothing to record when the revision is the commit itself).
  void write_ref(const std::string& revision, const std::string& commit) const;

  // The commit `revision` names in this cache, when its snapshot is there: a ref (branch or tag), a
  // full commit id, or a prefix of at least 7 hex digits of exactly one snapshot's commit. Each place
  // looked at is appended to `looked` (for the error when nothing is found). Throws m3::Error for a
  // prefix that matches several snapshots, naming them.
  std::optional<std::string> find_commit(const std::string& revision, std::vector<std::string>* looked) const;

  // Makes snapshots/<commit>/<file> a relative symlink to blobs/<etag> (so the cache survives a move).
  void link(const std::string& commit, const std::string& file, const std::string& etag) const;

 private:
  fs::path dir_;
};

}  // namespace m3::hub
