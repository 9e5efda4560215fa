// ImageEncoder: the model-level "encode an image" API the server calls for chat image parts: encoded
// bytes -> decode (vision/image_decode.h) -> M3 preprocessing (vision/preprocess.h) -> the vision tower
// (model/vision_tower.h) -> the merged embeddings that replace the image's placeholder tokens. It keeps
// kernels and weights out of the server; the engine only ever sees the resulting embeddings.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/vision_config.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace m3 {

class TensorStore;
class VisionTower;

struct EncodedImage {
  int width = 0, height = 0;  // decoded size
  int64_t tokens = 0;         // merged tokens = placeholder tokens in the prompt
  uint64_t hash = 0;          // of the encoded bytes (prefix-cache salt: the same image shares KV)
  std::shared_ptr<const std::vector<float>> embeds;  // [tokens, text_hidden]; null when not embedded
};

class ImageEncoder {
 public:
  // Loads the tower of the checkpoint in `dir` (config.json's vision_config); throws m3::Error when the
  // checkpoint has none. The processor takes preprocessor_config.json when the checkpoint has one, then
  // `mm_processor_kwargs` (--mm-processor-kwargs JSON; empty: none).
  ImageEncoder(const std::string& dir, int text_hidden, const std::string& mm_processor_kwargs = "");
  const vision::ProcessorConfig& processor() const { return pc_; }
  ~ImageEncoder();

  const VisionConfig& config() const { return cfg_; }
  // Decodes and preprocesses; with embed, runs the tower too (serialised: the tower's kernels use every
  // thread already). Throws m3::Error for a bad image (corrupt, truncated, too large, unsupported).
  EncodedImage encode(const uint8_t* data, size_t n, const vision::DecodeLimits& limits, bool embed) const;

 private:
  VisionConfig cfg_;
  vision::ProcessorConfig pc_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<VisionTower> tower_;
  mutable std::mutex mu_;
};

// FNV-1a 64 of the bytes.
uint64_t hash_bytes(const uint8_t* data, size_t n);

}  // namespace m3
