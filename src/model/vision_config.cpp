// VisionConfig from config.json.
#include "model/vision_config.h"

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace m3 {

VisionConfig VisionConfig::from_json_text(const std::string& text, const std::string& where, int text_hidden) {
  VisionConfig v;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) throw Error(where + ": not valid JSON");
  if (!j.contains("vision_config") || !j["vision_config"].is_object()) return v;
  const auto& vc = j["vision_config"];
  auto geti = [&](const nlohmann::json& o, const char* key, const std::string& path) -> int {
    if (!o.contains(key) || !o[key].is_number_integer() || o[key].get<int64_t>() <= 0)
      throw Error(where + ": " + path + key + " missing or not a positive integer");
    return o[key].get<int>();
  };
  v.present = true;
  v.hidden = geti(vc, "hidden_size", "vision_config.");
  v.heads = geti(vc, "num_attention_heads", "vision_config.");
  v.layers = geti(vc, "num_hidden_layers", "vision_config.");
  v.intermediate = geti(vc, "intermediate_size", "vision_config.");
  v.patch_size = geti(vc, "patch_size", "vision_config.");
  if (vc.contains("layer_norm_eps")) v.layer_norm_eps = vc["layer_norm_eps"].get<float>();
  if (vc.contains("vision_segment_max_frames") && !vc["vision_segment_max_frames"].is_null())
    v.segment_max_frames = geti(vc, "vision_segment_max_frames", "vision_config.");
  if (vc.contains("rope_theta")) v.rope_theta = vc["rope_theta"].get<double>();
  const nlohmann::json* comp = vc.contains("img_token_compression_config") ? &vc["img_token_compression_config"]
                               : j.contains("img_token_compression_config") ? &j["img_token_compression_config"]
                                                                            : nullptr;
  if (comp) {
    if (comp->contains("spatial_merge_size")) v.spatial_merge_size = geti(*comp, "spatial_merge_size", "img_token_compression_config.");
    if (comp->contains("temporal_patch_size")) v.temporal_patch_size = geti(*comp, "temporal_patch_size", "img_token_compression_config.");
  }
  if (v.hidden % v.heads) throw Error(where + ": vision_config.hidden_size " + std::to_string(v.hidden) +
                                      " is not a multiple of num_attention_heads " + std::to_string(v.heads));
  v.head_dim = v.hidden / v.heads;
  if (v.rope_freqs() < 1) throw Error(where + ": vision head_dim " + std::to_string(v.head_dim) + " below 6 (3-D RoPE needs 6 dims)");
  v.projector_hidden = geti(j, "projector_hidden_size", "");
  v.text_hidden = text_hidden;
  if (j.contains("image_token_index")) v.image_token_id = j["image_token_index"].get<int32_t>();
  if (j.contains("video_token_index")) v.video_token_id = j["video_token_index"].get<int32_t>();
  if (v.spatial_merge_size != 2 || v.temporal_patch_size != 2)
    throw Error(where + ": img_token_compression_config spatial_merge_size " + std::to_string(v.spatial_merge_size) +
                ", temporal_patch_size " + std::to_string(v.temporal_patch_size) + " (expected 2 and 2, as M3)");
  return v;
}

}  // namespace m3
