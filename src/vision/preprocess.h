// The M3 image processor (model.md section 9.1; transformers' MiniMaxM3VLImageProcessor): smart resize
// to multiples of 28 within [min_pixels, max_pixels], Pillow bicubic resize, rescale by 1/255, CLIP
// mean/std normalisation, and the patch tensor in merge-window order with the image repeated over the
// two temporal slots.
#pragma once
#include <cstdint>
#include <vector>
#include "vision/image.h"

namespace m3::vision {

struct ProcessorConfig {
  int patch_size = 14;
  int merge_size = 2;
  int temporal_patch_size = 2;
  int64_t min_pixels = 4 * 28 * 28;  // 3136
  int64_t max_pixels = 451584;       // 672 * 672
  double max_aspect_ratio = 200.0;
  float image_mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
  float image_std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
  int factor() const { return patch_size * merge_size; }
  int patch_dim() const { return 3 * temporal_patch_size * patch_size * patch_size; }
};

struct ResizedSize {
  int height = 0, width = 0;
};

// transformers' smart_resize for M3 (the same double arithmetic, Python's round-half-even): both
// sides rounded to multiples of factor (at least factor), then scaled down by sqrt(h w / max_pixels)
// with floor, or up by sqrt(min_pixels / (h w)) with ceil. Throws m3::Error for an aspect ratio above
// max_aspect_ratio, or when the downscale leaves a side of zero (the reference would produce an empty
// tensor there).
ResizedSize smart_resize(int height, int width, const ProcessorConfig& cfg);

struct PatchTensor {
  int grid_t = 1, grid_h = 0, grid_w = 0;
  int patch_dim = 0;                // C * T * P * P = 1176
  std::vector<float> values;        // [grid_t * grid_h * grid_w, patch_dim]
  int64_t num_patches() const { return int64_t(grid_t) * grid_h * grid_w; }
  // Tokens after the 2x2 merge: the number of image placeholders in the prompt.
  int64_t num_merged(int merge_size) const { return num_patches() / (int64_t(merge_size) * merge_size); }
};

// Normalised values of one resized image in patch order. Per value: float32(x * (1/255) in double),
// then (v - mean) / std in float32 (transformers' numpy rescale and normalize). Patch order is
// (row-block, col-block, inner row, inner col); within a patch, (channel, temporal, row, col).
PatchTensor patchify(const RgbImage& resized, const ProcessorConfig& cfg);

// decode -> smart_resize -> resize_bicubic -> patchify.
PatchTensor preprocess_image(const RgbImage& image, const ProcessorConfig& cfg);

}  // namespace m3::vision
