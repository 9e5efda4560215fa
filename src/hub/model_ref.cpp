// Model reference resolution: local directory, Hugging Face cache, Hub download (see model_ref.h).
#include "hub/model_ref.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "hub/hf_cache.h"
#include "hub/hub_client.h"

namespace m3::hub {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// What a snapshot directory lacks for `set` ("" when it is usable): config.json and every shard the
// index names (or one *.safetensors file); or tokenizer.json.
std::string snapshot_missing(const fs::path& dir, FileSet set) {
  std::error_code ec;
  if (set == FileSet::Tokenizer) return fs::exists(dir / "tokenizer.json", ec) ? "" : "no tokenizer.json";
  if (!fs::exists(dir / "config.json", ec)) return "no config.json";
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    std::ifstream in(index);
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return "model.safetensors.index.json has no weight_map";
    for (const auto& [name, shard] : j["weight_map"].items())
      if (shard.is_string() && !fs::exists(dir / shard.get<std::string>(), ec))
        return "no " + shard.get<std::string>() + " (named by model.safetensors.index.json)";
    return "";
  }
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (ends_with(e.path().filename().string(), ".safetensors")) return "";
  return "no *.safetensors file";
}

// A reference spelled as a path (not an id): reported as a missing directory, never looked up.
bool looks_like_path(const std::string& ref) {
  return ref.empty() || ref.front() == '/' || ref.front() == '.' || ref.front() == '~' || ref.back() == '/';
}

// A repository file name the Hub lists that is safe to place under the snapshot directory.
bool safe_relative(const std::string& p) {
  if (p.empty() || p.front() == '/') return false;
  std::stringstream ss(p);
  for (std::string part; std::getline(ss, part, '/');)
    if (part.empty() || part == "." || part == "..") return false;
  return true;
}

// Fetches what `set` needs of `repo_id` at `revision` into the cache; returns the snapshot.
ResolvedRef download_snapshot(const CacheRepo& repo, const std::string& repo_id, const std::string& revision,
                              FileSet set, const HubSettings& s) {
  HubClient hub(s.endpoint, s.token, s.progress);
  const RepoRevision rr = hub.revision(repo_id, revision);
  if (!is_commit_sha(rr.commit))
    throw Error(s.endpoint + ": revision " + revision + " of " + repo_id + " answered commit \"" + rr.commit +
                "\", expected 40 hex digits");
  std::vector<HubFile> files;
  for (const HubFile& f : rr.files)
    if (wanted_file(f.path, set)) {
      if (!safe_relative(f.path))
        throw Error(s.endpoint + ": " + repo_id + " lists the file \"" + f.path + "\", which is not a relative path");
      files.push_back(f);
    }
  const std::string needed = set == FileSet::Model ? "config.json" : "tokenizer.json";
  if (std::none_of(files.begin(), files.end(), [&](const HubFile& f) { return f.path == needed; }))
    throw Error(repo_id + " at revision " + revision + " (commit " + rr.commit + ") on " + s.endpoint + " has no " +
                needed + ": not a checkpoint this engine can load");
  const fs::path snap = repo.snapshot_dir(rr.commit);
  int fetched = 0, kept = 0;
  int64_t bytes = 0;
  for (const HubFile& f : files) {
    std::error_code ec;
    if (fs::exists(snap / f.path, ec)) {  // linked by an earlier run: its blob is complete and checked
      ++kept;
      continue;
    }
    const FileMeta m = hub.file_meta(repo_id, rr.commit, f.path);
    if (!m.commit.empty() && m.commit != rr.commit)
      throw Error(f.path + ": the Hub served commit " + m.commit + " for a request at commit " + rr.commit);
    if (!f.sha256.empty() && m.etag != f.sha256)
      throw Error(f.path + ": the Hub's file list gives sha256 " + f.sha256 + ", its resolve URL the ETag " + m.etag);
    const bool fetched_now = hub.download(m, f.path, repo.blob_path(m.etag));
    repo.link(rr.commit, f.path, m.etag);
    fetched_now ? ++fetched : ++kept;
    bytes += fetched_now && m.size > 0 ? m.size : 0;
  }
  // The ref is written last: an interrupted run leaves no ref naming an incomplete snapshot.
  repo.write_ref(revision, rr.commit);
  if (const std::string missing = snapshot_missing(snap, set); !missing.empty())
    throw Error(repo_id + " at commit " + rr.commit + ": " + missing + " after the download, in " + snap.string());
  char what[160];
  std::snprintf(what, sizeof what, "commit %s from %s: %d files fetched (%.1f MB), %d already cached",
                rr.commit.c_str(), s.endpoint.c_str(), fetched, double(bytes) / 1e6, kept);
  return {snap.string(), what};
}

}  // namespace

bool wanted_file(const std::string& path, FileSet set) {
  const bool top = path.find('/') == std::string::npos;
  const bool tokenizer = path == "tokenizer.json" || path == "tokenizer_config.json" ||
                         path == "chat_template.json" || (top && ends_with(path, ".jinja"));
  if (set == FileSet::Tokenizer) return tokenizer;
  return tokenizer || path.rfind("dspark/", 0) == 0 || (top && ends_with(path, ".safetensors")) ||
         path == "model.safetensors.index.json" || path == "config.json" || path == "generation_config.json";
}

HubSettings HubSettings::from_environment(const std::string& download_dir) {
  HubSettings s;
  s.cache_dir = download_dir.empty() ? default_cache_dir() : fs::path(download_dir);
  s.offline = env_flag("HF_HUB_OFFLINE") || env_flag("TRANSFORMERS_OFFLINE");
  s.endpoint = getenv_str("HF_ENDPOINT");
  if (s.endpoint.empty()) s.endpoint = "https://huggingface.co";
  s.token = getenv_str("HF_TOKEN");
  if (s.token.empty()) s.token = getenv_str("HUGGING_FACE_HUB_TOKEN");
  if (s.token.empty()) {  // the token `hf auth login` saved
    std::string path = getenv_str("HF_TOKEN_PATH");
    if (path.empty()) {
      const std::string home = getenv_str("HF_HOME");
      path = (home.empty() ? fs::path(getenv_str("HOME")) / ".cache" / "huggingface" : fs::path(home)) / "token";
    }
    std::ifstream in(path);
    in >> s.token;
  }
  return s;
}

ResolvedRef resolve_model_ref(const std::string& ref, const std::string& revision, FileSet set, const HubSettings& s,
                              const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(ref, ec)) {
    if (!revision.empty())
      throw Error(what + " " + ref + " is a local directory: a revision (" + revision +
                  ") applies only to a Hugging Face Hub id");
    return {ref, "local directory"};
  }
  if (fs::exists(ref, ec))
    throw Error(what + " " + ref + " is a file: pass the checkpoint directory (with config.json) or a Hugging Face Hub id");
  if (looks_like_path(ref) || !is_repo_id(ref))
    throw Error(what + " " + ref + ": no such directory, and not a Hugging Face Hub id (ORG/NAME)");
  const std::string rev = revision.empty() ? "main" : revision;
  const CacheRepo repo(s.cache_dir, ref);
  std::vector<std::string> looked{"no directory " + fs::absolute(ref).string()};
  std::optional<ResolvedRef> cached;
  if (auto c = repo.find_commit(rev, &looked)) {
    const fs::path dir = repo.snapshot_dir(*c);
    if (const std::string missing = snapshot_missing(dir, set); !missing.empty())
      looked.push_back(dir.string() + " (" + missing + ")");
    else
      cached = ResolvedRef{dir.string(), "HF cache, commit " + *c};
  }
  auto not_found = [&](const std::string& why) {
    std::string msg = what + " " + ref + " (revision " + rev + ") not found:";
    for (const auto& l : looked) msg += " " + l + ";";
    return Error(msg + " " + why);
  };
  // A full commit id names fixed files: a complete snapshot needs no network (as huggingface_hub).
  if (cached && (s.offline || is_commit_sha(rev))) return *cached;
  if (s.offline) throw not_found("HF_HUB_OFFLINE is set, so nothing is downloaded");
  try {
    return download_snapshot(repo, ref, rev, set, s);
  } catch (const HubError& e) {
    // As huggingface_hub: a Hub that cannot be reached or refuses (network down, token missing) falls
    // back to what the cache holds; a revision the Hub says does not exist does not.
    if (cached && e.code != "RevisionNotFound") {
      std::fprintf(stderr, "[m3serve] warning: %s; using the cached snapshot %s\n", e.what(), cached->dir.c_str());
      return *cached;
    }
    throw not_found(std::string("the Hub: ") + e.what());
  }
}

}  // namespace m3::hub
