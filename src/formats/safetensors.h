// Safetensors reader: memory-maps one file or a sharded checkpoint (model.safetensors.index.json)
// and exposes each tensor as a typed, shaped view into the mapping. Validates every header
// entry (dtype, shape x dtype size = byte range, range inside the file) with messages naming the
// file and tensor.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "base/host_memory.h"

namespace m3 {

struct TensorView {
  std::string name;
  std::string file;  // file name (for messages)
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
  std::string shape_str() const;
};

// Where tensor bytes live. Mmap (`--mmap`): the files are mapped read-only and pages come from the
// page cache on first touch (immediate start, shared between processes, evictable). Ram
// (`--no-mmap`): each file is read once into anonymous memory advised for transparent huge pages,
// its page-cache copy is dropped, and the memory is made read-only. Same bytes either way; Ram costs
// a full read at load and pays back in fewer TLB misses every time decode streams the weights.
// Auto (the models' default): Ram when transparent huge pages are available and the files take at
// most kAutoRamFraction of the available memory, else Mmap (a checkpoint that does not fit is better
// paged than killed; without huge pages the copy would not pay).
enum class WeightMemory { Auto, Mmap, Ram };
constexpr double kAutoRamFraction = 0.75;

// One .safetensors file, mapped or read into memory (WeightMemory).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path, WeightMemory mem = WeightMemory::Mmap);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  size_t size() const { return size_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // WeightMemory::Ram only: lets the loader rewrite tensor bytes in place (Linear tiling), then
  // protects them again; a mapped file is left as it is.
  void set_writable(bool writable);

 private:
  std::string path_;
  void* map_ = nullptr;  // WeightMemory::Mmap: the file mapping
  HugePageBuffer ram_;   // WeightMemory::Ram: the tensors' bytes, each on a 64-byte boundary
  size_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

// All tensors of a checkpoint directory (single file or sharded).
class TensorStore {
 public:
  // Opens DIR/model.safetensors.index.json if present, else every DIR/*.safetensors file.
  explicit TensorStore(const std::string& dir, WeightMemory mem = WeightMemory::Mmap);

  const TensorView* find(const std::string& name) const;
  // Like find, but throws m3::Error naming the tensor when it is missing.
  const TensorView& get(const std::string& name) const;
  bool has(const std::string& name) const { return find(name) != nullptr; }
  const std::map<std::string, const TensorView*>& all() const { return index_; }
  const std::string& dir() const { return dir_; }
  // Bytes of all files (what WeightMemory::Ram copies into memory).
  size_t file_bytes() const;
  // Mmap or Ram (what Auto resolved to), and why Auto chose Mmap ("" when it was asked for or Ram).
  WeightMemory memory() const { return memory_; }
  const std::string& mmap_reason() const { return mmap_reason_; }
  // SafetensorsFile::set_writable on every file; false when the files are mapped.
  bool set_writable(bool writable);

 private:
  std::string dir_;
  WeightMemory memory_ = WeightMemory::Mmap;
  std::string mmap_reason_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

}  // namespace m3
