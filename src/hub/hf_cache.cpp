// The Hugging Face Hub cache layout (see hf_cache.h).
#include "hub/hf_cache.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace m3::hub {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return false;
  std::string s(v);
  for (char& c : s) c = char(std::toupper((unsigned char)c));
  return s == "1" || s == "ON" || s == "YES" || s == "TRUE";
}

fs::path default_cache_dir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v ? v : "";
  };
  if (auto v = env("HF_HUB_CACHE"); !v.empty()) return v;
  if (auto v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) return v;
  if (auto v = env("HF_HOME"); !v.empty()) return fs::path(v) / "hub";
  if (auto v = env("XDG_CACHE_HOME"); !v.empty()) return fs::path(v) / "huggingface" / "hub";
  return fs::path(env("HOME")) / ".cache" / "huggingface" / "hub";
}

namespace {

bool is_hex_lower(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool valid_part(const std::string& p) {
  if (p.empty()) return false;
  for (char c : p)
    if (!std::isalnum((unsigned char)c) && c != '-' && c != '_' && c != '.') return false;
  const auto edge = [](char c) { return c == '-' || c == '.'; };
  return !edge(p.front()) && !edge(p.back());
}

}  // namespace

bool is_commit_sha(const std::string& s) { return s.size() == 40 && is_hex_lower(s); }

bool is_repo_id(const std::string& s) {
  if (s.empty() || s.size() > 96 || s.find("--") != std::string::npos || s.find("..") != std::string::npos)
    return false;
  const size_t slash = s.find('/');
  if (slash == std::string::npos) return valid_part(s);
  return s.find('/', slash + 1) == std::string::npos && valid_part(s.substr(0, slash)) && valid_part(s.substr(slash + 1));
}

std::string repo_folder_name(const std::string& repo_id) {
  std::string out = "models";
  std::stringstream ss(repo_id);
  for (std::string part; std::getline(ss, part, '/');) out += "--" + part;
  return out;
}

CacheRepo::CacheRepo(fs::path cache_dir, std::string repo_id) : dir_(cache_dir / repo_folder_name(repo_id)) {}

std::optional<std::string> CacheRepo::read_ref(const std::string& revision) const {
  std::ifstream in(ref_path(revision));
  std::string commit;
  if (!in || !(in >> commit)) return std::nullopt;
  return commit;
}

void CacheRepo::write_ref(const std::string& revision, const std::string& commit) const {
  if (revision == commit) return;
  const fs::path p = ref_path(revision);
  if (read_ref(revision) == commit) return;  // unchanged: a read-only cache stays usable
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << commit;
  if (!out) throw Error(p.string() + ": cannot write the commit of revision " + revision);
}

std::optional<std::string> CacheRepo::find_commit(const std::string& revision, std::vector<std::string>* looked) const {
  auto note = [&](const std::string& s) {
    if (looked) looked->push_back(s);
  };
  std::error_code ec;
  if (is_commit_sha(revision)) {
    if (fs::is_directory(snapshot_dir(revision), ec)) return revision;
    note(snapshot_dir(revision).string() + " (no such snapshot)");
    return std::nullopt;
  }
  if (auto c = read_ref(revision)) {
    if (fs::is_directory(snapshot_dir(*c), ec)) return c;
    note(ref_path(revision).string() + " names commit " + *c + ", but " + snapshot_dir(*c).string() +
         " does not exist");
    return std::nullopt;
  }
  note(ref_path(revision).string() + " (no such ref)");
  // A short commit id: accepted when it names exactly one snapshot (git's rule, 7 digits at least).
  if (revision.size() < 7 || revision.size() >= 40 || !is_hex_lower(revision)) return std::nullopt;
  std::vector<std::string> hits;
  for (const auto& e : fs::directory_iterator(dir_ / "snapshots", ec))
    if (e.path().filename().string().rfind(revision, 0) == 0) hits.push_back(e.path().filename().string());
  if (hits.size() == 1) return hits.front();
  if (hits.empty()) {
    note((dir_ / "snapshots").string() + " (no snapshot whose commit starts with " + revision + ")");
    return std::nullopt;
  }
  std::sort(hits.begin(), hits.end());
  std::string all;
  for (auto& h : hits) all += (all.empty() ? "" : ", ") + h;
  throw Error("revision " + revision + " is ambiguous in " + (dir_ / "snapshots").string() + ": it starts " +
              std::to_string(hits.size()) + " commits (" + all + "); give more digits or the full commit id");
}

void CacheRepo::link(const std::string& commit, const std::string& file, const std::string& etag) const {
  const fs::path dst = snapshot_dir(commit) / file;
  fs::create_directories(dst.parent_path());
  std::error_code ec;
  fs::remove(dst, ec);
  fs::create_symlink(fs::relative(blob_path(etag), dst.parent_path()), dst);
}

}  // namespace m3::hub
