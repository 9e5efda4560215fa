// ImageEncoder: the model-level "encode an image" (and "encode a video") API the server calls for chat image parts: encoded
// bytes -> decode (vision/image_decode.h) -> M3 preprocessing (vision/preprocess.h) -> the vision tower
// (model/vision_tower.h) -> the merged embeddings that replace the image's placeholder tokens. It keeps
// kernels and weights out of the server; the engine only ever sees the resulting embeddings.
#pragma once
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/vision_config.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/video_sampling.h"

namespace m3 {

class TensorStore;
class VisionTower;

struct EncodedImage {
  int width = 0, height = 0;  // decoded size
  int64_t tokens = 0;         // merged tokens = placeholder tokens in the prompt
  uint64_t hash = 0;          // of the encoded bytes (prefix-cache salt: the same image shares KV)
  std::shared_ptr<const std::vector<float>> embeds;  // [tokens, text_hidden]; null when not embedded
  // A video: grid_t temporal groups of tokens_per_group tokens each (tokens = their product), and the
  // seconds of each group's first frame (the prompt's timestamp text). An image: grid_t 1, no timestamps.
  bool video = false;
  int grid_t = 1;
  int64_t tokens_per_group = 0;
  std::vector<double> timestamps;
};

class ImageEncoder {
 public:
  // Loads the tower of the checkpoint in `dir` (config.json's vision_config); throws m3::Error when the
  // checkpoint has none. The processor takes preprocessor_config.json when the checkpoint has one, then
  // `mm_processor_kwargs` (--mm-processor-kwargs JSON; empty: none).
  ImageEncoder(const std::string& dir, int text_hidden, const std::string& mm_processor_kwargs = "");
  // Encoded images are kept by content (hash and length of the bytes), least recently used dropped
  // first, up to `bytes` of embeddings (vLLM's --mm-processor-cache-gb; 0: no cache), so an image sent
  // again (every turn of a conversation resends it) skips decoding and the tower.
  void set_cache_bytes(size_t bytes);
  int64_t cache_hits() const;
  const vision::ProcessorConfig& processor() const { return pc_; }
  const vision::VideoOptions& video() const { return vo_; }
  ~ImageEncoder();

  const VisionConfig& config() const { return cfg_; }
  // Decodes and preprocesses; with embed, runs the tower too (serialised: the tower's kernels use every
  // thread already). Throws m3::Error for a bad image (corrupt, truncated, too large, unsupported).
  EncodedImage encode(const uint8_t* data, size_t n, const vision::DecodeLimits& limits, bool embed) const;
  // The same for a video (vision/video_preprocess.h): sampled frames in temporal pairs through the tower
  // (segments of config().segment_max_frames groups). Cached like images, by content. Throws m3::Error
  // for a bad video (corrupt, truncated, no frames, unsupported codec, too long or too large).
  EncodedImage encode_video(const uint8_t* data, size_t n, const vision::DecodeLimits& limits, bool embed) const;

 private:
  VisionConfig cfg_;
  vision::ProcessorConfig pc_;
  vision::VideoOptions vo_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<VisionTower> tower_;
  mutable std::mutex mu_;

  using CacheKey = std::pair<uint64_t, size_t>;
  struct CacheEntry {
    EncodedImage image;
    std::list<CacheKey>::iterator lru;
  };
  mutable std::mutex cache_mu_;
  mutable std::list<CacheKey> lru_;  // most recent first
  mutable std::map<CacheKey, CacheEntry> cache_;
  size_t cache_limit_ = size_t(4) << 30;
  mutable size_t cache_bytes_ = 0;
  mutable int64_t cache_hits_ = 0;
  bool cached(const CacheKey& k, EncodedImage* out) const;
  void remember(const CacheKey& k, const EncodedImage& e) const;
  void evict_to(size_t bytes) const;
};

// The first 64 bits of the bytes' SHA-256 (cache key and prefix-cache salt: not forgeable by a client).
uint64_t hash_bytes(const uint8_t* data, size_t n);

}  // namespace m3
