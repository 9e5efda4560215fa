// Safetensors parsing and memory mapping (see safetensors.h).
#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace m3 {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// Reads exactly n bytes at offset off (EINTR retried, 1 GiB per call); throws naming the file and
// `what` on an error or a short file.
void pread_all(int fd, const std::string& path, uint8_t* dst, size_t n, size_t off, const char* what) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, dst + done, std::min<size_t>(n - done, size_t(1) << 30), off_t(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw Error(path + ": cannot read " + what + " at byte " + std::to_string(off + done) + ": " +
                  (r < 0 ? std::strerror(errno) : "unexpected end of file"));
    done += size_t(r);
  }
}

// WeightMemory::Ram places every tensor on a 64-byte boundary (a cache line, a 512-bit vector).
// Checkpoint tensors start wherever the header's length leaves them (often only 8-byte aligned),
// and a kernel's 64-byte load from such a tensor spans two cache lines, which costs the decode kernels
// about a quarter of their speed (docs/benchmarks.md section 5).
constexpr size_t kTensorAlign = 64;

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path, WeightMemory mem) : path_(path) {
  if (mem == WeightMemory::Auto) mem = WeightMemory::Mmap;  // the choice is TensorStore's (it sees every shard)
  const std::string fname = fs::path(path).filename().string();
  struct FileDescriptor {
    int fd;
    ~FileDescriptor() {
      if (fd >= 0) ::close(fd);
    }
  } file{::open(path.c_str(), O_RDONLY)};
  const int fd = file.fd;
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
  size_ = size_t(st.st_size);
  if (size_ < 8) {
    throw Error(path + ": truncated file (" + std::to_string(size_) +
                " bytes; a safetensors file starts with an 8-byte header length)");
  }
  const bool ram = mem == WeightMemory::Ram;
  std::string head;  // Ram: the 8-byte length and the JSON header, read from the file
  const uint8_t* base = nullptr;
  uint64_t hlen = 0;
  if (ram) {
    head.resize(8);
    pread_all(fd, path, reinterpret_cast<uint8_t*>(head.data()), 8, 0, "the header length");
    std::memcpy(&hlen, head.data(), 8);
    if (hlen <= size_ - 8) {
      head.resize(size_t(8 + hlen));
      pread_all(fd, path, reinterpret_cast<uint8_t*>(head.data()) + 8, size_t(hlen), 8, "the header");
    }
    base = reinterpret_cast<const uint8_t*>(head.data());
  } else {
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      throw Error(path + ": mmap failed: " + std::strerror(errno));
    }
    base = static_cast<const uint8_t*>(map_);
    std::memcpy(&hlen, base, 8);
  }
  if (hlen > size_ - 8) {
    throw Error(path + ": corrupt header: header length " + std::to_string(hlen) +
                " exceeds the file size " + std::to_string(size_));
  }
  json header;
  try {
    header = json::parse(base + 8, base + 8 + hlen);
  } catch (const std::exception& e) {
    throw Error(path + ": corrupt header: not valid JSON (" + e.what() + ")");
  }
  if (!header.is_object()) throw Error(path + ": corrupt header: expected a JSON object");
  const size_t data_start = 8 + hlen;
  const size_t data_size = size_ - data_start;
  std::vector<std::pair<uint64_t, TensorView*>> placed;  // Ram: (file offset in the data, tensor)
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const json& e = it.value();
    auto bad = [&](const std::string& why) { return Error(path + ": tensor " + name + ": " + why); };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      throw bad("corrupt header entry (expected dtype, shape and data_offsets)");
    if (!e["dtype"].is_string()) throw bad("dtype must be a string");
    TensorView v;
    v.name = name;
    v.file = fname;
    const std::string dt = e["dtype"].get<std::string>();
    if (!dtype_from_name(dt, &v.dtype))
      throw bad("unknown dtype \"" + dt + "\" (expected one of F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U8 BOOL)");
    if (!e["shape"].is_array()) throw bad("shape must be an array");
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw bad("shape entries must be non-negative integers");
      v.shape.push_back(d.get<int64_t>());
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad("data_offsets must be two non-negative integers");
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en) throw bad("data_offsets begin > end");
    if (en > data_size)
      throw bad("data_offsets end " + std::to_string(en) + " is past the end of the data (" +
                std::to_string(data_size) + " bytes): truncated file?");
    // Overflow-safe numel * size check.
    unsigned __int128 need = dtype_size(v.dtype);
    for (int64_t d : v.shape) need *= uint64_t(d);
    if (need != (unsigned __int128)(en - b))
      throw bad("byte size " + std::to_string(en - b) + " does not match shape " + v.shape_str() + " x " +
                dtype_name(v.dtype));
    v.data = ram ? nullptr : base + data_start + b;
    v.nbytes = size_t(en - b);
    TensorView& kept = tensors_.emplace(name, std::move(v)).first->second;
    if (ram) placed.push_back({b, &kept});
  }
  if (!ram) return;
  // Every tensor on its own 64-byte boundary, in file order (one read per tensor).
  std::sort(placed.begin(), placed.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  size_t total = 0;
  for (auto& [b, v] : placed) total = (total + kTensorAlign - 1) / kTensorAlign * kTensorAlign + v->nbytes;
  ram_ = HugePageBuffer(std::max<size_t>(total, 1), path + " (--no-mmap)");
  size_t at = 0;
  for (auto& [b, v] : placed) {
    at = (at + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
    pread_all(fd, path, ram_.data() + at, v->nbytes, data_start + b, ("tensor " + v->name).c_str());
    v->data = ram_.data() + at;
    at += v->nbytes;
  }
  ram_.make_read_only();
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

TensorStore::TensorStore(const std::string& dir, WeightMemory mem) : dir_(dir) {
  const fs::path d(dir);
  const fs::path index = d / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index)) {
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const std::exception& e) {
      throw Error(index.string() + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string() + ": missing object \"weight_map\"");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) throw Error(index.string() + ": weight_map[" + it.key() + "] must be a file name");
      const std::string f = it.value().get<std::string>();
      weight_map[it.key()] = f;
      if (std::find(shard_names.begin(), shard_names.end(), f) == shard_names.end()) shard_names.push_back(f);
    }
  } else {
    if (!fs::is_directory(d)) throw Error(dir + ": not a directory");
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().extension() == ".safetensors") shard_names.push_back(e.path().filename().string());
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) throw Error(dir + ": no *.safetensors file and no model.safetensors.index.json");
  }
  for (const auto& s : shard_names) {
    const fs::path p = d / s;
    if (!fs::exists(p)) throw Error(p.string() + ": shard named in model.safetensors.index.json does not exist");
  }
  if (mem == WeightMemory::Auto) {
    double total = 0;
    for (const auto& s : shard_names) total += double(fs::file_size(d / s));
    const uint64_t avail = available_memory_bytes();
    char why[256] = "";
    if (!transparent_huge_pages_available())
      std::snprintf(why, sizeof why, "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled), so "
                    "reading them into memory would not pay");
    else if (avail == 0)
      std::snprintf(why, sizeof why, "available memory unknown (no MemAvailable in /proc/meminfo)");
    else if (total > kAutoRamFraction * double(avail))
      std::snprintf(why, sizeof why, "%.1f MB is more than %.0f%% of the %.1f MB of available memory", total / 1e6,
                    100 * kAutoRamFraction, double(avail) / 1e6);
    mmap_reason_ = why;
    mem = mmap_reason_.empty() ? WeightMemory::Ram : WeightMemory::Mmap;
  }
  memory_ = mem;
  for (const auto& s : shard_names) files_.push_back(std::make_unique<SafetensorsFile>((d / s).string(), mem));
  for (const auto& f : files_) {
    for (const auto& [name, view] : f->tensors()) {
      auto [it, inserted] = index_.emplace(name, &view);
      if (!inserted)
        throw Error(dir + ": tensor " + name + " appears in both " + it->second->file + " and " + view.file);
    }
  }
  for (const auto& [name, file] : weight_map) {
    auto it = index_.find(name);
    if (it == index_.end())
      throw Error((d / file).string() + ": tensor " + name +
                  " is listed in model.safetensors.index.json but missing from the file");
    if (it->second->file != file)
      throw Error(dir + ": tensor " + name + " is in " + it->second->file + " but the index says " + file);
  }
}

void SafetensorsFile::set_writable(bool writable) {
  if (writable) ram_.make_writable();
  else ram_.make_read_only();
}

bool TensorStore::set_writable(bool writable) {
  if (memory_ != WeightMemory::Ram) return false;
  for (auto& f : files_) f->set_writable(writable);
  return true;
}

size_t TensorStore::file_bytes() const {
  size_t n = 0;
  for (const auto& f : files_) n += f->size();
  return n;
}

const TensorView* TensorStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& TensorStore::get(const std::string& name) const {
  const TensorView* v = find(name);
  if (!v) throw Error(dir_ + ": missing tensor " + name);
  return *v;
}

}  // namespace m3
