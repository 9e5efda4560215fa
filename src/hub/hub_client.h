// The Hugging Face Hub's HTTP API for one endpoint ($HF_ENDPOINT): a revision's commit and file list,
// a file's metadata from its resolve URL, and downloads into the cache's blobs with resume (HTTP
// Range on the .incomplete file) and checksum verification.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"

namespace m3::hub {

class Progress;

// A failed Hub request. status 0: no HTTP answer (connection, TLS, timeout). code: the Hub's
// X-Error-Code (GatedRepo, RepoNotFound, RevisionNotFound, EntryNotFound), when it sent one.
class HubError : public Error {
 public:
  HubError(const std::string& what, int status, std::string code) : Error(what), status(status), code(std::move(code)) {}
  int status;
  std::string code;
};

struct HubFile {
  std::string path;    // rfilename, '/'-separated
  int64_t size = -1;
  std::string sha256;  // lfs.sha256 (LFS files only)
};

struct RepoRevision {
  std::string commit;  // the revision's full commit id ("sha")
  std::vector<HubFile> files;
};

struct FileMeta {
  std::string etag;    // X-Linked-Etag (LFS: the sha256) else ETag (git blob sha1), without quotes
  std::string commit;  // X-Repo-Commit
  int64_t size = -1;   // X-Linked-Size else Content-Length
  std::string url;     // where the bytes are: the redirect's Location (a CDN), else the resolve URL
  bool cdn = false;    // url came from a redirect: a signed URL that gets no token (as huggingface_hub)
};

class HubClient {
 public:
  // endpoint: scheme://host[:port][/prefix], e.g. https://huggingface.co. token: sent as
  // `Authorization: Bearer` to the endpoint only (never to the CDN a file redirects to).
  HubClient(std::string endpoint, std::string token, bool progress);

  // GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true
  RepoRevision revision(const std::string& repo, const std::string& revision) const;
  // HEAD {endpoint}/{repo}/resolve/{commit}/{file}, not following a redirect to another host.
  FileMeta file_meta(const std::string& repo, const std::string& commit, const std::string& file) const;
  // Fetches meta.url into `blob` through blob.incomplete, resuming what an earlier attempt left there;
  // checks the size and the checksum the etag names (64 hex digits: sha256; 40: git blob sha1). A
  // checksum mismatch deletes the file and throws; an interruption keeps it for the next run. Returns
  // false when the blob was already there (another snapshot shares it): nothing fetched.
  bool download(const FileMeta& meta, const std::string& file, const std::filesystem::path& blob) const;

  const std::string& endpoint() const { return endpoint_; }

 private:
  std::string fetch_once(std::string url, bool send_token, const std::filesystem::path& part, int64_t have,
                         const std::string& file, Progress& bar) const;
  std::string endpoint_, origin_, prefix_, token_;
  bool progress_;
};

}  // namespace m3::hub
