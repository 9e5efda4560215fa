// Safetensors file / sharded-checkpoint writer (see safetensors_writer.h).
#include "formats/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"

namespace m3 {

namespace fs = std::filesystem;

size_t TensorSpec::nbytes() const {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

void write_safetensors_file(const std::string& path, const std::vector<TensorSpec>& specs,
                            const TensorProducer& produce) {
  // nlohmann::json keeps object keys sorted, which gives the sorted header we want.
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> seen;
  size_t offset = 0;
  for (const auto& s : specs) {
    if (!seen.insert(s.name).second) throw Error(path + ": duplicate tensor name " + s.name);
    if (s.name == "__metadata__") throw Error(path + ": reserved tensor name __metadata__");
    const size_t n = s.nbytes();
    header[s.name] = {{"dtype", dtype_name(s.dtype)}, {"shape", s.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(path + ": cannot open for writing");
  uint8_t len[8];
  uint64_t hl = h.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(hl >> (8 * i));  // little-endian regardless of host
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(h.data(), std::streamsize(h.size()));
  std::vector<uint8_t> buf;
  for (const auto& s : specs) {
    buf.clear();
    produce(s, buf);
    if (buf.size() != s.nbytes())
      throw Error(path + ": tensor " + s.name + ": producer gave " + std::to_string(buf.size()) + " bytes, expected " +
                  std::to_string(s.nbytes()));
    out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
    if (!out) throw Error(path + ": write failed at tensor " + s.name);
  }
  out.close();
  if (!out) throw Error(path + ": write failed");
}

std::vector<std::string> write_safetensors_checkpoint(const std::string& dir, const std::vector<TensorSpec>& specs,
                                                      int nshards, const TensorProducer& produce) {
  fs::create_directories(dir);
  if (nshards <= 1 || specs.size() <= 1) {
    write_safetensors_file((fs::path(dir) / "model.safetensors").string(), specs, produce);
    return {"model.safetensors"};
  }
  const size_t n = std::min(size_t(nshards), specs.size());
  size_t total = 0;
  for (const auto& s : specs) total += s.nbytes();
  // Contiguous split: shard i ends once the running total reaches (i+1)/n of the bytes, while
  // leaving at least one tensor for every later shard.
  std::vector<std::vector<TensorSpec>> groups(n);
  size_t acc = 0, g = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const size_t remaining = specs.size() - i;
    if (g + 1 < n && !groups[g].empty() &&
        (acc >= total / n * (g + 1) || remaining <= n - 1 - g))
      ++g;
    groups[g].push_back(specs[i]);
    acc += specs[i].nbytes();
  }
  std::vector<std::string> names;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    write_safetensors_file((fs::path(dir) / name).string(), groups[i], produce);
    names.push_back(name);
    for (const auto& s : groups[i]) weight_map[s.name] = name;
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  const std::string ipath = (fs::path(dir) / "model.safetensors.index.json").string();
  std::ofstream out(ipath, std::ios::trunc);
  if (!out) throw Error(ipath + ": cannot open for writing");
  out << index.dump(2) << "\n";
  if (!out) throw Error(ipath + ": write failed");
  return names;
}

void write_safetensors_file(const std::string& path, const std::vector<TensorData>& tensors) {
  std::vector<TensorSpec> specs;
  std::map<std::string, const TensorData*> by_name;
  for (const auto& t : tensors) {
    specs.push_back(t.spec);
    by_name[t.spec.name] = &t;
  }
  write_safetensors_file(path, specs, [&](const TensorSpec& s, std::vector<uint8_t>& out) {
    const auto& b = by_name.at(s.name)->bytes;
    out.assign(b.begin(), b.end());
  });
}

}  // namespace m3
