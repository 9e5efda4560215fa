// VisionConfig: the M3 vision tower's shape from config.json (vision_config, its
// img_token_compression_config, and the top-level projector and image-token keys; model.md 2.1, 2.4).
#pragma once
#include <cstdint>
#include <string>

namespace m3 {

struct VisionConfig {
  bool present = false;  // config.json has a vision_config
  int hidden = 0;         // hidden_size (1280)
  int heads = 0;          // num_attention_heads (16)
  int head_dim = 0;       // hidden / heads (80)
  int layers = 0;         // num_hidden_layers (32)
  int intermediate = 0;   // intermediate_size (5120)
  int patch_size = 14;
  int temporal_patch_size = 2;
  int spatial_merge_size = 2;
  float layer_norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  int projector_hidden = 0;  // projector_hidden_size (6144)
  int text_hidden = 0;       // output width of the merge MLP (the text hidden size)
  int32_t image_token_id = 200025;
  int32_t video_token_id = 200026;
  // vision_config.vision_segment_max_frames: a video's attention segments hold at most this many temporal
  // groups (vLLM's _apply_max_frames_limit; the 3-D RoPE t restarts in each). 0: absent, one segment.
  int segment_max_frames = 0;

  // 3-D RoPE: head_dim / 6 frequencies per axis (80 -> 13), 6 * that many dims rotated (78), the rest
  // passed through (model.md 9.5).
  int rope_freqs() const { return head_dim / 6; }
  int rope_dims() const { return 6 * rope_freqs(); }
  int patch_dim() const { return 3 * temporal_patch_size * patch_size * patch_size; }

  // Reads it from config.json text; present == false when there is no vision_config. `where` names the
  // file in messages; inconsistent values are errors naming the key.
  static VisionConfig from_json_text(const std::string& text, const std::string& where, int text_hidden);
};

}  // namespace m3
