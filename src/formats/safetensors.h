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

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

// All tensors of a checkpoint directory (single file or sharded).
class TensorStore {
 public:
  // Opens DIR/model.safetensors.index.json if present, else every DIR/*.safetensors file.
  explicit TensorStore(const std::string& dir);

  const TensorView* find(const std::string& name) const;
  // Like find, but throws m3::Error naming the tensor when it is missing.
  const TensorView& get(const std::string& name) const;
  bool has(const std::string& name) const { return find(name) != nullptr; }
  const std::map<std::string, const TensorView*>& all() const { return index_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

}  // namespace m3
