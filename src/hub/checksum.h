// Checksums the Hub publishes for a file: the sha256 of an LFS file, the git blob sha1 of any other.
#pragma once
#include <filesystem>
#include <string>

namespace m3::hub {

// Lowercase hex sha256 of the file's bytes (what the Hub gives LFS files as ETag / lfs.sha256).
std::string sha256_file(const std::filesystem::path& p);

// Lowercase hex sha1 of "blob <size>\0<bytes>": git's object id, the ETag of a file kept in git.
std::string git_blob_sha1_file(const std::filesystem::path& p);

}  // namespace m3::hub
