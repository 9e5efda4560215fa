// The Hugging Face Hub HTTP API through cpp-httplib (see hub_client.h). Request shapes follow
// huggingface_hub: the revision endpoint for the commit and file list, HEAD on the resolve URL for
// the ETag / X-Linked-Etag / X-Repo-Commit / X-Linked-Size headers, then a GET of the bytes.
#include "hub/hub_client.h"

#include <fcntl.h>
#include <httplib.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/http_error_text.h"
#include "hub/checksum.h"
#include "hub/progress.h"

namespace m3::hub {

namespace fs = std::filesystem;

namespace {

struct Url {
  std::string origin;  // scheme://host[:port]
  std::string path;    // /... (with the query)
};

Url split_url(const std::string& url) {
  const size_t p = url.find("://");
  if (p == std::string::npos) throw Error("URL " + url + ": expected scheme://host[:port][/path]");
  const size_t s = url.find('/', p + 3);
  if (s == std::string::npos) return {url, "/"};
  return {url.substr(0, s), url.substr(s)};
}

// Percent-encoding of everything but unreserved characters and `safe` (Python's urllib quote).
std::string quote(const std::string& s, const std::string& safe) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || safe.find(char(c)) != std::string::npos) {
      out += char(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

httplib::Client make_client(const std::string& origin) {
  httplib::Client c(origin);
  if (!c.is_valid()) throw Error("URL " + origin + ": cannot make an HTTP client for it (http:// or https:// expected)");
  c.set_connection_timeout(10);
  c.set_read_timeout(60);
  c.set_decompress(false);  // byte ranges and checksums are of the file's own bytes
  c.set_follow_location(false);
  return c;
}

std::string unquote_etag(std::string e) {
  if (e.rfind("W/", 0) == 0) e = e.substr(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

bool is_hex(const std::string& s, size_t n) {
  return s.size() == n && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

int64_t header_int(const httplib::Headers& h, const char* name) {
  auto it = h.find(name);
  if (it == h.end()) return -1;
  try {
    return std::stoll(it->second);
  } catch (...) {
    return -1;
  }
}

std::string header(const httplib::Headers& h, const char* name) {
  auto it = h.find(name);
  return it == h.end() ? std::string() : it->second;
}

std::string network_error(const std::string& url, httplib::Error e) { return url + ": " + http_error_text(e); }

}  // namespace

HubClient::HubClient(std::string endpoint, std::string token, bool progress)
    : endpoint_(std::move(endpoint)), token_(std::move(token)), progress_(progress) {
  while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
  const Url u = split_url(endpoint_);
  origin_ = u.origin;
  prefix_ = u.path == "/" ? "" : u.path;  // a mirror may serve the Hub under a path
}

namespace {

// One request's answer, with what the caller needs for errors and redirects.
struct Answer {
  int status = 0;
  httplib::Headers headers;
  std::string body;
};

// Turns a non-2xx answer into the error a user can act on (the Hub's X-Error-Code says which).
HubError answer_error(const std::string& request, const Answer& a, const std::string& endpoint, const std::string& repo,
                      const std::string& revision, bool have_token) {
  const std::string code = header(a.headers, "X-Error-Code");
  std::string msg = header(a.headers, "X-Error-Message");
  if (msg.empty()) {
    auto j = nlohmann::json::parse(a.body, nullptr, false);
    if (j.is_object() && j.contains("error") && j["error"].is_string()) msg = j["error"].get<std::string>();
  }
  const std::string http = " (HTTP " + std::to_string(a.status) + (msg.empty() ? "" : ": " + msg) + ")";
  if (code == "GatedRepo")
    return HubError(repo + " is a gated repository on " + endpoint + ": " +
                        (have_token ? "the token in HF_TOKEN has not been granted access to it (accept its conditions "
                                      "on the model page with that account)"
                                    : "set HF_TOKEN to an access token of an account that has accepted its conditions") +
                        http,
                    a.status, code);
  if (code == "RepoNotFound" || (code.empty() && a.status == 401))
    return HubError("repository " + repo + " not found on " + endpoint +
                        (have_token ? "" : " (if it is private or gated, set HF_TOKEN)") + http,
                    a.status, code.empty() ? "RepoNotFound" : code);
  if (code == "RevisionNotFound")
    return HubError("revision " + revision + " not found in " + repo + " on " + endpoint + http, a.status, code);
  return HubError(request + ": HTTP " + std::to_string(a.status) + (msg.empty() ? "" : " (" + msg + ")"), a.status, code);
}

}  // namespace

RepoRevision HubClient::revision(const std::string& repo, const std::string& rev) const {
  std::string path = prefix_ + "/api/models/" + repo + "/revision/" + quote(rev, "") + "?blobs=true";
  Answer a;
  // A renamed repository answers with a relative redirect to its new name; followed (a few hops).
  for (int hop = 0; hop < 5; ++hop) {
    httplib::Client c = make_client(origin_);
    httplib::Headers h{{"User-Agent", "m3serve"}};
    if (!token_.empty()) h.emplace("Authorization", "Bearer " + token_);
    auto r = c.Get(path, h);
    if (!r) throw HubError(network_error(origin_ + path, r.error()), 0, "");
    a = Answer{r->status, r->headers, r->body};
    const std::string loc = header(a.headers, "Location");
    if (a.status >= 300 && a.status < 400 && !loc.empty() && loc.front() == '/') {
      path = loc;
      continue;
    }
    break;
  }
  if (a.status != 200) throw answer_error("GET " + origin_ + path, a, endpoint_, repo, rev, !token_.empty());
  auto j = nlohmann::json::parse(a.body, nullptr, false);
  if (!j.is_object() || !j.contains("sha") || !j["sha"].is_string() || !j.contains("siblings") ||
      !j["siblings"].is_array())
    throw HubError("GET " + origin_ + path + ": expected a JSON object with \"sha\" and \"siblings\", got " +
                       a.body.substr(0, 200),
                   a.status, "");
  RepoRevision out;
  out.commit = j["sha"].get<std::string>();
  for (const auto& s : j["siblings"]) {
    if (!s.is_object() || !s.contains("rfilename") || !s["rfilename"].is_string()) continue;
    HubFile f;
    f.path = s["rfilename"].get<std::string>();
    if (s.contains("size") && s["size"].is_number_integer()) f.size = s["size"].get<int64_t>();
    if (s.contains("lfs") && s["lfs"].is_object()) {
      const auto& l = s["lfs"];
      if (l.contains("sha256") && l["sha256"].is_string()) f.sha256 = l["sha256"].get<std::string>();
      if (l.contains("size") && l["size"].is_number_integer()) f.size = l["size"].get<int64_t>();
    }
    out.files.push_back(std::move(f));
  }
  return out;
}

FileMeta HubClient::file_meta(const std::string& repo, const std::string& commit, const std::string& file) const {
  std::string path = prefix_ + "/" + repo + "/resolve/" + commit + "/" + quote(file, "/");
  for (int hop = 0; hop < 5; ++hop) {
    httplib::Client c = make_client(origin_);
    httplib::Headers h{{"User-Agent", "m3serve"}, {"Accept-Encoding", "identity"}};
    if (!token_.empty()) h.emplace("Authorization", "Bearer " + token_);
    auto r = c.Head(path, h);
    if (!r) throw HubError(network_error(origin_ + path, r.error()), 0, "");
    const Answer a{r->status, r->headers, ""};
    const std::string loc = header(a.headers, "Location");
    const bool redirect = a.status >= 300 && a.status < 400 && !loc.empty();
    if (redirect && loc.front() == '/') {  // a renamed repository: follow
      path = loc;
      continue;
    }
    if (!redirect && a.status != 200) {
      if (a.status == 404 && header(a.headers, "X-Error-Code") == "EntryNotFound")
        throw HubError(file + " not found in " + repo + " at commit " + commit + " on " + endpoint_, a.status,
                       "EntryNotFound");
      throw answer_error("HEAD " + origin_ + path, a, endpoint_, repo, commit, !token_.empty());
    }
    FileMeta m;
    m.etag = unquote_etag(header(a.headers, "X-Linked-Etag"));
    if (m.etag.empty()) m.etag = unquote_etag(header(a.headers, "ETag"));
    if (m.etag.empty())
      throw HubError("HEAD " + origin_ + path + ": no ETag or X-Linked-Etag header (needed to name and check the file)",
                     a.status, "");
    m.commit = header(a.headers, "X-Repo-Commit");
    m.size = header_int(a.headers, "X-Linked-Size");
    if (m.size < 0) m.size = header_int(a.headers, "Content-Length");
    m.url = redirect ? loc : origin_ + path;  // an absolute redirect is the CDN holding the bytes
    m.cdn = redirect;
    return m;
  }
  throw HubError("HEAD " + origin_ + path + ": too many redirects", 0, "");
}

namespace {

// An exclusive lock on <cache>/.locks/<repo folder>/<etag>.lock (huggingface_hub's place), so two
// processes never write the same blob at once.
class BlobLock {
 public:
  explicit BlobLock(const fs::path& blob) {
    const fs::path repo = blob.parent_path().parent_path();
    const fs::path p = repo.parent_path() / ".locks" / repo.filename() / (blob.filename().string() + ".lock");
    fs::create_directories(p.parent_path());
    fd_ = ::open(p.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(p.string() + ": cannot open the download lock");
    ::flock(fd_, LOCK_EX);
  }
  ~BlobLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

 private:
  int fd_ = -1;
};

int64_t size_or_zero(const fs::path& p) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);
  return ec ? 0 : int64_t(n);
}

}  // namespace

// One GET of `url` (following redirects to any host) appending to `part` from `have` bytes. Returns
// "" when the answer ended normally, else why the connection broke (the caller resumes). Throws for an
// HTTP error status.
std::string HubClient::fetch_once(std::string url, bool send_token, const fs::path& part, int64_t have,
                                  const std::string& file, Progress& bar) const {
  for (int hop = 0; hop < 10; ++hop) {
    const Url u = split_url(url);
    httplib::Client c = make_client(u.origin);
    httplib::Headers h{{"User-Agent", "m3serve"}, {"Accept-Encoding", "identity"}};
    // The token goes to the Hub only: never to where a redirect points (hop > 0, or a CDN URL).
    if (send_token && hop == 0 && !token_.empty() && u.origin == origin_) h.emplace("Authorization", "Bearer " + token_);
    if (have > 0) h.emplace("Range", "bytes=" + std::to_string(have) + "-");
    Answer a;
    std::unique_ptr<FILE, int (*)(FILE*)> out(nullptr, &std::fclose);
    auto on_response = [&](const httplib::Response& r) {
      a.status = r.status;
      a.headers = r.headers;
      // 206: the rest after `have`; 200: the whole file (the server ignored Range): start over.
      if (r.status == 206 || r.status == 200) out.reset(std::fopen(part.c_str(), r.status == 206 ? "ab" : "wb"));
      if (r.status == 200 && have > 0) bar.restart();
      return !(r.status == 200 || r.status == 206) || out != nullptr;
    };
    auto on_data = [&](const char* d, size_t n) {
      if (!out) {  // an error or redirect body: kept (short) for the message
        if (a.body.size() < 4096) a.body.append(d, n);
        return true;
      }
      if (std::fwrite(d, 1, n, out.get()) != n) return false;
      bar.add(int64_t(n));
      return true;
    };
    auto r = c.Get(u.path, h, on_response, on_data);
    out.reset();
    const std::string loc = header(a.headers, "Location");
    if (a.status >= 300 && a.status < 400 && !loc.empty()) {
      url = loc.front() == '/' ? u.origin + loc : loc;
      continue;
    }
    if (a.status == 416) {  // the range starts past the end: the partial file is not this file's prefix
      fs::remove(part);
      return "HTTP 416 for the range from byte " + std::to_string(have) + "; starting over";
    }
    if (a.status != 0 && a.status != 200 && a.status != 206)
      throw answer_error("GET " + url, a, endpoint_, file, "", !token_.empty());
    return r ? std::string() : network_error(url, r.error());
  }
  throw HubError("GET " + url + ": too many redirects", 0, "");
}

bool HubClient::download(const FileMeta& meta, const std::string& file, const fs::path& blob) const {
  fs::create_directories(blob.parent_path());
  BlobLock lock(blob);
  if (fs::exists(blob)) return false;  // shared with another snapshot, or another process finished it
  const fs::path part = blob.string() + ".incomplete";
  if (meta.size >= 0 && size_or_zero(part) > meta.size) fs::remove(part);  // not a prefix of this file
  Progress bar(file, meta.size, size_or_zero(part), progress_);
  std::string last_error;
  // Up to 5 attempts; each resumes from the bytes already in the .incomplete file.
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (meta.size >= 0 && size_or_zero(part) == meta.size) break;
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200 * attempt));  // back-off
    last_error = fetch_once(meta.url, !meta.cdn, part, size_or_zero(part), file, bar);
    if (last_error.empty() && meta.size < 0) break;  // unknown size: one complete answer is the file
    if (last_error.empty() && size_or_zero(part) < meta.size) last_error = "the server closed the answer early";
  }
  const int64_t got = size_or_zero(part);
  if ((meta.size >= 0 && got < meta.size) || (meta.size < 0 && !last_error.empty())) {
    bar.finish("interrupted");
    throw Error("download of " + file + " from " + meta.url + " interrupted after " + std::to_string(got) + " of " +
                (meta.size >= 0 ? std::to_string(meta.size) : std::string("an unknown number of")) + " bytes" +
                (last_error.empty() ? "" : " (" + last_error + ")") +
                "; the bytes are kept in " + part.string() + ": run again to resume");
  }
  if (meta.size >= 0 && got > meta.size) {
    fs::remove(part);
    bar.finish("failed");
    throw Error(file + ": received " + std::to_string(got) + " bytes, the Hub announced " + std::to_string(meta.size) +
                " (the file was deleted; run again to download it anew)");
  }
  std::string kind, sum;
  if (is_hex(meta.etag, 64)) kind = "sha256", sum = sha256_file(part);
  else if (is_hex(meta.etag, 40)) kind = "git blob sha1", sum = git_blob_sha1_file(part);
  if (!kind.empty() && sum != meta.etag) {
    fs::remove(part);
    bar.finish("checksum mismatch");
    throw Error(file + ": the downloaded bytes have " + kind + " " + sum + ", the Hub announced " + meta.etag +
                " (from " + meta.url + "); the file was deleted: run again to download it anew");
  }
  fs::rename(part, blob);
  bar.finish(kind.empty() ? "done (no checksum to check: ETag " + meta.etag + ")" : "done, " + kind + " verified");
  return true;
}

}  // namespace m3::hub
