// Encoding of the KV transfer messages (see transfer_protocol.h): line-based text for the small
// control messages, so that a refused handshake can be read in a packet capture.
#include "transfer/transfer_protocol.h"

#include <cinttypes>
#include <cstdio>
#include <sstream>

namespace m3::transfer {

std::string encode(const Hello& h) {
  std::ostringstream o;
  char id[20];
  std::snprintf(id, sizeof id, "%016" PRIx64, h.layout_id);
  o << "m3pd-hello " << h.version << "\nlayout " << id << "\nblock " << h.block_size << "\ndtypes " << h.dtypes
    << "\npage " << h.page_bytes << "\nengine " << h.engine_id << "\n";
  return o.str();
}

std::optional<Hello> decode_hello(const std::string& bytes) {
  std::istringstream in(bytes);
  std::string line;
  Hello h;
  if (!std::getline(in, line) || line.rfind("m3pd-hello ", 0) != 0) return std::nullopt;
  try {
    h.version = std::stoi(line.substr(11));
    int seen = 0;
    while (std::getline(in, line)) {
      const size_t sp = line.find(' ');
      if (sp == std::string::npos) return std::nullopt;
      const std::string k = line.substr(0, sp), v = line.substr(sp + 1);
      if (k == "layout") h.layout_id = std::stoull(v, nullptr, 16), seen |= 1;
      else if (k == "block") h.block_size = std::stoi(v), seen |= 2;
      else if (k == "dtypes") h.dtypes = v, seen |= 4;
      else if (k == "page") h.page_bytes = std::stoull(v), seen |= 8;
      else if (k == "engine") h.engine_id = v, seen |= 16;
      else return std::nullopt;
    }
    if (seen != 31) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return h;
}

std::string check_hello(const Hello& mine, const Hello& theirs) {
  if (mine.version != theirs.version)
    return "transfer protocol version " + std::to_string(theirs.version) + ", this engine speaks " +
           std::to_string(mine.version);
  if (mine.block_size != theirs.block_size)
    return "page size " + std::to_string(theirs.block_size) + " tokens, this engine's is " +
           std::to_string(mine.block_size);
  if (mine.dtypes != theirs.dtypes) return "KV cache dtypes \"" + theirs.dtypes + "\", this engine's are \"" + mine.dtypes + "\"";
  if (mine.page_bytes != theirs.page_bytes)
    return "KV pages of " + std::to_string(theirs.page_bytes) + " bytes, this engine's are " +
           std::to_string(mine.page_bytes) + " bytes (another cache layout)";
  if (mine.layout_id != theirs.layout_id) {
    char a[20], b[20];
    std::snprintf(a, sizeof a, "%016" PRIx64, theirs.layout_id);
    std::snprintf(b, sizeof b, "%016" PRIx64, mine.layout_id);
    return std::string("model and cache layout ") + a + ", this engine's is " + b + " (another model or weights)";
  }
  return {};
}

std::string encode(const ReadRequest& r) {
  std::string s = "m3pd-read " + r.request_id + "\n";
  for (size_t i = 0; i < r.block_ids.size(); ++i) s += (i ? " " : "") + std::to_string(r.block_ids[i]);
  return s + (r.mode == ReadMode::Rma ? "\nmode rma\n" : "\nmode stream\n");
}

std::optional<ReadRequest> decode_read(const std::string& bytes) {
  std::istringstream in(bytes);
  std::string line;
  ReadRequest r;
  if (!std::getline(in, line) || line.rfind("m3pd-read ", 0) != 0) return std::nullopt;
  r.request_id = line.substr(10);
  if (r.request_id.empty() || r.request_id.size() > 256) return std::nullopt;
  if (!std::getline(in, line)) return std::nullopt;
  std::istringstream ids(line);
  long long v;
  while (ids >> v) {
    if (v < 0 || v > INT32_MAX) return std::nullopt;
    r.block_ids.push_back(int32_t(v));
  }
  if (!ids.eof() || r.block_ids.empty() || r.block_ids.size() > (1u << 20)) return std::nullopt;
  if (!std::getline(in, line)) return std::nullopt;
  if (line == "mode rma") r.mode = ReadMode::Rma;
  else if (line == "mode stream") r.mode = ReadMode::Stream;
  else return std::nullopt;
  if (std::getline(in, line)) return std::nullopt;  // nothing after the mode
  return r;
}

std::string encode(const RmaOffer& o) {
  char head[80];
  std::snprintf(head, sizeof head, "m3pd-rma %" PRIx64 " %" PRIu64 "\n", o.addr, o.bytes);
  return head + o.key;
}

std::optional<RmaOffer> decode_rma_offer(const std::string& bytes) {
  const size_t nl = bytes.find('\n');
  if (bytes.rfind("m3pd-rma ", 0) != 0 || nl == std::string::npos) return std::nullopt;
  RmaOffer o;
  unsigned long long a = 0, n = 0;
  char tail = 0;
  const std::string head = bytes.substr(9, nl - 9);
  if (std::sscanf(head.c_str(), "%llx %llu%c", &a, &n, &tail) != 2) return std::nullopt;
  o.addr = a;
  o.bytes = n;
  o.key = bytes.substr(nl + 1);
  if (o.key.empty()) return std::nullopt;
  return o;
}

}  // namespace m3::transfer
