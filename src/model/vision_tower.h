// VisionTower: the M3 vision encoder and its projectors (model.md 9.2-9.8), loaded from the
// checkpoint's own tensor names and dtypes (3.6: FP32 patch embedding, BF16 elsewhere), turning
// preprocessed patch tensors into the merged embeddings that replace the image placeholder tokens.
// Attention is confined to each image (vLLM's cu_seqlens), so a batch of images gives each image the
// same embeddings as running it alone.
#pragma once
#include <cstdint>
#include <vector>

#include "formats/safetensors.h"
#include "kernels/cpu/linear.h"
#include "model/vision_config.h"

namespace m3 {

struct VisionGrid {
  int t = 1, h = 0, w = 0;  // grid_thw, in patches
  int64_t patches() const { return int64_t(t) * h * w; }
};

// The attention segments of a batch of grids: each grid, with grid t split into runs of at most
// max_frames temporal groups (0: no split).
std::vector<VisionGrid> attention_segments(const std::vector<VisionGrid>& grids, int max_frames);

class VisionTower {
 public:
  VisionTower(const VisionConfig& cfg, const TensorStore& store);

  const VisionConfig& config() const { return cfg_; }
  // A batch of more patches than this runs a pass of whole attention segments at a time (forward()).
  static constexpr int64_t kPassPatches = 8192;

  // patches: [sum of grids' patches, patch_dim] in merge-window order (vision/preprocess.h), images and
  // videos one after the other (a video: grid t temporal groups, each group's patches contiguous).
  // Returns [sum of patches / 4, text_hidden] merged embeddings, in order. A video of more than
  // config().segment_max_frames groups attends in segments of at most that many groups, RoPE t counted
  // from 0 in each (vLLM's _apply_max_frames_limit).
  std::vector<float> forward(const float* patches, const std::vector<VisionGrid>& grids) const;

 private:
  struct Layer {
    std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;
    Linear q, k, v, o, fc1, fc2;
    std::vector<float> q_b, k_b, v_b, o_b, fc1_b, fc2_b;
  };
  VisionConfig cfg_;
  Linear patch_embed_;
  std::vector<float> pre_ln_w_, pre_ln_b_;
  std::vector<Layer> layers_;
  Linear proj1_, proj2_, merge1_, merge2_;
  std::vector<float> proj1_b_, proj2_b_, merge1_b_, merge2_b_;
};

}  // namespace m3
