// Chat image inputs on the server side: the media options (--limit-mm-per-prompt,
// --language-model-only, --allowed-local-media-path) and turning an image part's URL into encoded
// bytes (data: URLs, http(s) with a size and time limit, file:// under the allowed folder). Decoding and the tower are the model's
// (model/image_encoder.h); every failure here is a 400 naming the content part.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "vision/image.h"

namespace m3::server {

struct MediaOptions {
  int64_t limit_image = 999;  // images per prompt (vLLM's default limit per modality)
  int64_t limit_video = 999;  // videos per prompt (the same default)
  bool language_model_only = false;
  std::string allowed_local_media_path;  // empty: file:// URLs refused
  vision::DecodeLimits decode;
  double fetch_timeout_s = 5;  // an http(s) image, connection to last byte (vLLM's VLLM_IMAGE_FETCH_TIMEOUT)
};

// Parses --limit-mm-per-prompt's JSON ({"image": N, "video": M}) into opt; throws m3::Error naming the
// key for a modality this server does not take (audio with a limit above 0) or a bad value.
void parse_limit_mm(const std::string& json, MediaOptions& opt);

// One image (or video_url) part of a chat request: where it is ("messages[0].content[1]") and its URL.
struct ImageInput {
  std::string where, url;
  bool video = false;  // a video_url part: data URLs must say video/..., the bytes go to the video decoder
};

// The encoded bytes behind an image or video URL (same schemes and limits for both); throws ApiError
// 400 naming `in.where`.
std::vector<uint8_t> load_image_bytes(const ImageInput& in, const MediaOptions& opt);

// Strict base64 (RFC 4648, padding optional, no whitespace); false on any other character.
bool base64_decode(const std::string& s, size_t begin, std::vector<uint8_t>& out);

}  // namespace m3::server
