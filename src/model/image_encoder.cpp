// ImageEncoder: decode -> preprocess -> vision tower for one request image.
#include "model/image_encoder.h"

#include <fstream>
#include <openssl/evp.h>
#include <iterator>

#include "base/error.h"
#include "formats/safetensors.h"
#include "model/vision_tower.h"
#include "vision/image_decode.h"
#include "vision/processor_options.h"
#include "vision/video_preprocess.h"

namespace m3 {

uint64_t hash_bytes(const uint8_t* data, size_t n) {
  // SHA-256, not a fast non-cryptographic hash: this value keys the encoder cache and salts the prefix
  // cache's page hashes, so a client must not be able to craft an image that lands on another's.
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr) != 1 || len < 8) throw Error("OpenSSL: SHA-256 failed");
  uint64_t h = 0;
  for (int i = 0; i < 8; ++i) h = h << 8 | md[i];
  return h;
}

ImageEncoder::ImageEncoder(const std::string& dir, int text_hidden, const std::string& mm_processor_kwargs) {
  std::ifstream f(dir + "/config.json");
  if (!f) throw Error(dir + "/config.json: cannot open");
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  cfg_ = VisionConfig::from_json_text(text, dir + "/config.json", text_hidden);
  if (!cfg_.present) throw Error(dir + "/config.json: no vision_config (this checkpoint has no vision tower)");
  pc_.patch_size = cfg_.patch_size;
  pc_.merge_size = cfg_.spatial_merge_size;
  pc_.temporal_patch_size = cfg_.temporal_patch_size;
  // The released processor's sizes where the checkpoint ships them; the spec's defaults otherwise.
  if (std::ifstream pf(dir + "/preprocessor_config.json"); pf)
    vision::apply_preprocessor_config(std::string((std::istreambuf_iterator<char>(pf)), {}),
                                      dir + "/preprocessor_config.json", pc_);
  // The video processor shares the patch geometry and normalisation; its own pixel bounds stay its defaults
  // unless --mm-processor-kwargs sets them.
  vision::apply_mm_processor_kwargs(mm_processor_kwargs, pc_, vo_);
  store_ = std::make_unique<TensorStore>(dir);
  tower_ = std::make_unique<VisionTower>(cfg_, *store_);
}

ImageEncoder::~ImageEncoder() = default;

void ImageEncoder::evict_to(size_t bytes) const {  // cache_mu_ held
  while (cache_bytes_ > bytes && !lru_.empty()) {
    auto it = cache_.find(lru_.back());
    cache_bytes_ -= it->second.image.embeds->size() * sizeof(float);
    cache_.erase(it);
    lru_.pop_back();
  }
}

void ImageEncoder::set_cache_bytes(size_t bytes) {
  std::lock_guard<std::mutex> lk(cache_mu_);
  cache_limit_ = bytes;
  evict_to(cache_limit_);
}

int64_t ImageEncoder::cache_hits() const {
  std::lock_guard<std::mutex> lk(cache_mu_);
  return cache_hits_;
}

bool ImageEncoder::cached(const CacheKey& k, EncodedImage* out) const {
  std::lock_guard<std::mutex> lk(cache_mu_);
  auto it = cache_.find(k);
  if (it == cache_.end()) return false;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  ++cache_hits_;
  *out = it->second.image;
  return true;
}

void ImageEncoder::remember(const CacheKey& k, const EncodedImage& e) const {
  const size_t bytes = e.embeds->size() * sizeof(float);
  std::lock_guard<std::mutex> lk(cache_mu_);
  if (bytes > cache_limit_ || cache_.count(k)) return;
  evict_to(cache_limit_ - bytes);
  lru_.push_front(k);
  cache_.emplace(k, CacheEntry{e, lru_.begin()});
  cache_bytes_ += bytes;
}

EncodedImage ImageEncoder::encode(const uint8_t* data, size_t n, const vision::DecodeLimits& limits, bool embed) const {
  EncodedImage e;
  e.hash = hash_bytes(data, n);
  const CacheKey key{e.hash, n};
  if (cached(key, &e)) return e;  // embedded before: its count and embeddings (a count-only caller ignores them)
  const vision::RgbImage im = vision::decode_image(data, n, limits);
  e.width = im.width;
  e.height = im.height;
  if (!embed) {
    // Only the count: the resized grid, without resampling or running the tower.
    const vision::ResizedSize rs = vision::smart_resize(im.height, im.width, pc_);
    const int64_t gh = rs.height / pc_.patch_size, gw = rs.width / pc_.patch_size;
    e.tokens = gh * gw / (int64_t(pc_.merge_size) * pc_.merge_size);
    return e;
  }
  const vision::PatchTensor pt = vision::preprocess_image(im, pc_);
  e.tokens = pt.num_merged(pc_.merge_size);
  std::vector<float> out;
  {
    std::lock_guard<std::mutex> lk(mu_);
    out = tower_->forward(pt.values.data(), {VisionGrid{pt.grid_t, pt.grid_h, pt.grid_w}});
  }
  if (int64_t(out.size()) != e.tokens * cfg_.text_hidden)
    throw Error("vision tower: " + std::to_string(out.size()) + " values for " + std::to_string(e.tokens) +
                " tokens of width " + std::to_string(cfg_.text_hidden));
  e.embeds = std::make_shared<const std::vector<float>>(std::move(out));
  remember(key, e);
  return e;
}

}  // namespace m3

namespace m3 {

EncodedImage ImageEncoder::encode_video(const uint8_t* data, size_t n, const vision::DecodeLimits& limits,
                                        bool embed) const {
  EncodedImage e;
  e.hash = hash_bytes(data, n);
  // An image and a video never share bytes that both decode, but keep the keys apart anyway.
  const CacheKey key{e.hash ^ 0x766964656fULL, n};
  if (cached(key, &e)) return e;
  const vision::PreparedVideo pv = vision::preprocess_video(data, n, limits, pc_, vo_, embed);
  e.video = true;
  e.width = pv.info.width;
  e.height = pv.info.height;
  e.grid_t = pv.patches.grid_t;
  e.tokens_per_group = pv.tokens_per_group(pc_.merge_size);
  e.tokens = int64_t(e.grid_t) * e.tokens_per_group;
  e.timestamps = pv.timestamps;
  if (!embed) return e;
  std::vector<float> out;
  {
    std::lock_guard<std::mutex> lk(mu_);
    out = tower_->forward(pv.patches.values.data(), {VisionGrid{pv.patches.grid_t, pv.patches.grid_h, pv.patches.grid_w}});
  }
  if (int64_t(out.size()) != e.tokens * cfg_.text_hidden)
    throw Error("vision tower: " + std::to_string(out.size()) + " values for " + std::to_string(e.tokens) +
                " video tokens of width " + std::to_string(cfg_.text_hidden));
  e.embeds = std::make_shared<const std::vector<float>>(std::move(out));
  remember(key, e);
  return e;
}

}  // namespace m3
