// Safetensors writer: one file (8-byte little-endian header length, JSON header with sorted
// keys padded with spaces to a multiple of 8, then the raw data) or a sharded checkpoint with
// model.safetensors.index.json. Tensor bytes come from a producer callback, called once per
// tensor in declaration order, so multi-GB checkpoints are written without holding them in
// memory.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/dtype.h"

namespace m3 {

struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t nbytes() const;
};

// Fills `out` with exactly spec.nbytes() bytes of the tensor's data.
using TensorProducer = std::function<void(const TensorSpec& spec, std::vector<uint8_t>& out)>;

// Writes one safetensors file. Data is laid out in the order of `specs`; names must be unique.
void write_safetensors_file(const std::string& path, const std::vector<TensorSpec>& specs,
                            const TensorProducer& produce);

// nshards <= 1: DIR/model.safetensors. Otherwise DIR/model-0000i-of-0000N.safetensors (specs
// split in order into N contiguous groups of about equal byte size) plus
// DIR/model.safetensors.index.json {metadata: {total_size}, weight_map: {name: file}}.
// Returns the file names written (without the index).
std::vector<std::string> write_safetensors_checkpoint(const std::string& dir, const std::vector<TensorSpec>& specs,
                                                      int nshards, const TensorProducer& produce);

// In-memory convenience for small files (tests).
struct TensorData {
  TensorSpec spec;
  std::vector<uint8_t> bytes;
};
void write_safetensors_file(const std::string& path, const std::vector<TensorData>& tensors);

}  // namespace m3
