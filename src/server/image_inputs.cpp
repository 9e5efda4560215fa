// Image URLs of chat content parts -> encoded bytes, and the --limit-mm-per-prompt flag.
#include "server/image_inputs.h"

#include <algorithm>

#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/http_error_text.h"
#include "server/errors.h"

namespace m3::server {

namespace fs = std::filesystem;

void parse_limit_mm(const std::string& text, MediaOptions& opt) {
  if (text.empty()) return;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw Error("--limit-mm-per-prompt: expected a JSON object such as '{\"image\": 2}', got " + text);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto& v = it.value();
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw Error("--limit-mm-per-prompt: \"" + it.key() + "\" must be a non-negative integer, got " + v.dump());
    const int64_t n = v.get<int64_t>();
    if (it.key() == "image") {
      opt.limit_image = n;
    } else if (it.key() == "video") {
      opt.limit_video = n;
    } else if (it.key() == "audio") {
      // A limit of 0 says "none", which is what this server takes; anything more is refused by name.
      if (n > 0)
        throw Error("--limit-mm-per-prompt: \"" + it.key() + "\": " + std::to_string(n) + ": " + it.key() +
                    " input is not supported by this server (image and video only); give 0 or leave it out");
    } else {
      throw Error("--limit-mm-per-prompt: unknown modality \"" + it.key() + "\" (known: image, video, audio)");
    }
  }
}

bool base64_decode(const std::string& s, size_t begin, std::vector<uint8_t>& out) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  size_t end = s.size();
  size_t pad = 0;
  while (end > begin && s[end - 1] == '=' && pad < 2) --end, ++pad;
  const size_t n = end - begin;
  if (n % 4 == 1) return false;
  if (pad && (n + pad) % 4 != 0) return false;
  out.clear();
  out.reserve(n / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = begin; i < end; ++i) {
    const int v = val(s[i]);
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t(acc >> bits));
      acc &= (1u << bits) - 1;
    }
  }
  return true;
}

namespace {

const char* kind_of(const ImageInput& in) { return in.video ? "video" : "image"; }

std::vector<uint8_t> from_data_url(const ImageInput& in, const MediaOptions& opt) {
  // data:[<mediatype>][;base64],<data>; only base64 images or videos (the media type is not trusted:
  // the decoders sniff the bytes).
  const std::string kind = kind_of(in);
  const std::string& u = in.url;
  const size_t comma = u.find(',');
  if (comma == std::string::npos)
    throw bad_request(in.where + ": a data URL needs a ',' before its data", "messages");
  const std::string meta = u.substr(5, comma - 5);
  if (meta.size() < 7 || meta.compare(meta.size() - 7, 7, ";base64") != 0)
    throw bad_request(in.where + ": only base64 data URLs are supported (data:" + kind + "/...;base64,...), got 'data:" +
                          meta.substr(0, 64) + "'",
                      "messages");
  if (meta.rfind(kind + "/", 0) != 0)
    throw bad_request(in.where + ": the data URL's media type must be " + kind + "/..., got '" +
                          meta.substr(0, std::min<size_t>(64, meta.size() - 7)) + "'",
                      "messages");
  if ((u.size() - comma - 1) / 4 * 3 > opt.decode.max_bytes + 3)
    throw bad_request(in.where + ": the " + kind + " is " + std::to_string((u.size() - comma - 1) / 4 * 3) +
                          " bytes; at most " + std::to_string(opt.decode.max_bytes) + " are accepted",
                      "messages");
  std::vector<uint8_t> out;
  if (!base64_decode(u, comma + 1, out))
    throw bad_request(in.where + ": the data URL is not valid base64", "messages");
  if (out.empty()) throw bad_request(in.where + ": the data URL holds no bytes", "messages");
  return out;
}

// A file URL's path as the file system names it: %XX escapes decoded (Python's Path.as_uri() writes
// spaces and non-ASCII names that way); a '%' not followed by two hex digits stays as it is.
std::string percent_decode(const std::string& s) {
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out.push_back(char(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::vector<uint8_t> from_file_url(const ImageInput& in, const MediaOptions& opt) {
  if (opt.allowed_local_media_path.empty())
    throw bad_request(in.where + ": file:// URLs are refused unless the server runs with --allowed-local-media-path",
                      "messages");
  std::string path = percent_decode(in.url.substr(7));
  if (path.rfind("localhost/", 0) == 0) path = path.substr(9);
  if (path.find('\0') != std::string::npos) throw bad_request(in.where + ": file:// URL with a NUL byte", "messages");
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(opt.allowed_local_media_path, ec);
  const fs::path p = fs::weakly_canonical(fs::path(path), ec);
  if (ec || !fs::path(path).is_absolute())
    throw bad_request(in.where + ": file:// URL with a bad path '" + path + "'", "messages");
  auto rel = p.lexically_relative(root);
  if (rel.empty() || *rel.begin() == "..")
    throw bad_request(in.where + ": '" + path + "' is outside --allowed-local-media-path " + root.string(), "messages");
  if (!fs::is_regular_file(p, ec)) throw bad_request(in.where + ": no such file '" + path + "'", "messages");
  const auto size = fs::file_size(p, ec);
  if (ec || size > opt.decode.max_bytes)
    throw bad_request(in.where + ": '" + path + "' is larger than " + std::to_string(opt.decode.max_bytes) + " bytes",
                      "messages");
  std::ifstream f(p, std::ios::binary);
  if (!f) throw bad_request(in.where + ": cannot read '" + path + "'", "messages");
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), {});
}

// GET with a size cap (the decoder's max_bytes) and a deadline for the whole answer, checked per
// received chunk, so neither a huge body nor a slow drip holds the worker past fetch_timeout_s.
std::vector<uint8_t> from_http_url(const ImageInput& in, const MediaOptions& opt) {
  const std::string& u = in.url;
  const size_t host_at = u.find("://") + 3;
  const size_t path_at = u.find('/', host_at);
  const std::string origin = u.substr(0, path_at);
  const std::string path = path_at == std::string::npos ? "/" : u.substr(path_at);
  if (host_at >= u.size() || origin.size() <= host_at)
    throw bad_request(in.where + ": " + kind_of(in) + " URL without a host: '" + u.substr(0, 64) + "'", "messages");
  httplib::Client c(origin);
  if (!c.is_valid()) throw bad_request(in.where + ": cannot fetch '" + origin + "'", "messages");
  const auto secs = std::chrono::duration<double>(opt.fetch_timeout_s);
  c.set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(secs));
  c.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(secs));
  c.set_follow_location(true);
  const auto deadline = std::chrono::steady_clock::now() + secs;
  std::vector<uint8_t> body;
  bool too_big = false, too_slow = false;
  auto res = c.Get(path, [&](const char* data, size_t n) {
    if (body.size() + n > opt.decode.max_bytes) return !(too_big = true);
    if (std::chrono::steady_clock::now() > deadline) return !(too_slow = true);
    body.insert(body.end(), data, data + n);
    return true;
  });
  if (too_big)
    throw bad_request(in.where + ": the " + std::string(kind_of(in)) + " at '" + u.substr(0, 128) + "' is larger than " +
                          std::to_string(opt.decode.max_bytes) + " bytes",
                      "messages");
  if (too_slow || (!res && (res.error() == httplib::Error::ConnectionTimeout || res.error() == httplib::Error::Read)))
    throw bad_request(in.where + ": fetching '" + u.substr(0, 128) + "' took longer than " +
                          std::to_string(opt.fetch_timeout_s) + " s",
                      "messages");
  if (!res)
    throw bad_request(in.where + ": cannot fetch '" + u.substr(0, 128) + "': " + http_error_text(res.error()), "messages");
  if (res->status != 200)
    throw bad_request(in.where + ": fetching '" + u.substr(0, 128) + "' answered HTTP " + std::to_string(res->status),
                      "messages");
  if (body.empty()) throw bad_request(in.where + ": '" + u.substr(0, 128) + "' returned no bytes", "messages");
  return body;
}

}  // namespace

std::vector<uint8_t> load_image_bytes(const ImageInput& in, const MediaOptions& opt) {
  const std::string& u = in.url;
  if (u.rfind("data:", 0) == 0) return from_data_url(in, opt);
  if (u.rfind("file://", 0) == 0) return from_file_url(in, opt);
  if (u.rfind("http://", 0) == 0 || u.rfind("https://", 0) == 0) return from_http_url(in, opt);
  throw bad_request(in.where + ": unsupported " + std::string(kind_of(in)) + " URL scheme in '" + u.substr(0, 32) +
                        "' (supported: data:, http(s)://, file:// with --allowed-local-media-path)",
                    "messages");
}

}  // namespace m3::server
