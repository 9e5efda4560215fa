// File checksums through OpenSSL's EVP digests (see checksum.h).
#include "hub/checksum.h"

#include <openssl/evp.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "base/error.h"

namespace m3::hub {

namespace {

// Digest of `prefix` followed by the file's bytes, read in 4 MiB pieces.
std::string digest_file(const std::filesystem::path& p, const EVP_MD* md, const std::string& prefix) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(p.c_str(), "rb"), &std::fclose);
  if (!f) throw Error(p.string() + ": cannot open to check its checksum");
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1) throw Error("OpenSSL: cannot start a digest");
  EVP_DigestUpdate(ctx.get(), prefix.data(), prefix.size());
  std::vector<unsigned char> buf(4 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) EVP_DigestUpdate(ctx.get(), buf.data(), n);
  if (std::ferror(f.get())) throw Error(p.string() + ": read error while checking its checksum");
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx.get(), out, &len);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) {
    s += hex[out[i] >> 4];
    s += hex[out[i] & 15];
  }
  return s;
}

}  // namespace

std::string sha256_file(const std::filesystem::path& p) { return digest_file(p, EVP_sha256(), ""); }

std::string git_blob_sha1_file(const std::filesystem::path& p) {
  std::string prefix = "blob " + std::to_string(std::filesystem::file_size(p));
  prefix.push_back('\0');
  return digest_file(p, EVP_sha1(), prefix);
}

}  // namespace m3::hub
