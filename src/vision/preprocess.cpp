// The M3 image processor: smart resize, Pillow bicubic, normalisation, merge-window patch order.
#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "vision/resample.h"

namespace m3::vision {

ResizedSize smart_resize(int height, int width, const ProcessorConfig& cfg) {
  if (height <= 0 || width <= 0)
    throw Error("image has zero size (" + std::to_string(width) + "x" + std::to_string(height) + ")");
  const double ratio = double(std::max(height, width)) / double(std::min(height, width));
  if (ratio > cfg.max_aspect_ratio)
    throw Error("image aspect ratio " + std::to_string(ratio) + " (" + std::to_string(width) + "x" +
                std::to_string(height) + ") is above the limit of " + std::to_string(int(cfg.max_aspect_ratio)));
  const int f = cfg.factor();
  // Python's round() of a float is round-half-even: std::nearbyint under the default rounding mode.
  int64_t h = std::max<int64_t>(f, int64_t(std::nearbyint(double(height) / f)) * f);
  int64_t w = std::max<int64_t>(f, int64_t(std::nearbyint(double(width) / f)) * f);
  if (h * w > cfg.max_pixels) {
    const double beta = std::sqrt(double(int64_t(height) * width) / double(cfg.max_pixels));
    h = int64_t(std::floor(double(height) / beta / f)) * f;
    w = int64_t(std::floor(double(width) / beta / f)) * f;
  } else if (h * w < cfg.min_pixels) {
    const double beta = std::sqrt(double(cfg.min_pixels) / double(int64_t(height) * width));
    h = int64_t(std::ceil(double(height) * beta / f)) * f;
    w = int64_t(std::ceil(double(width) * beta / f)) * f;
  }
  if (h <= 0 || w <= 0)
    throw Error("image of " + std::to_string(width) + "x" + std::to_string(height) + " resizes to " +
                std::to_string(w) + "x" + std::to_string(h) + " under max_pixels " + std::to_string(cfg.max_pixels) +
                " (a side of zero; expected a less extreme aspect ratio)");
  return {int(h), int(w)};
}

PatchTensor patchify(const RgbImage& im, const ProcessorConfig& cfg) {
  const int P = cfg.patch_size, M = cfg.merge_size, T = cfg.temporal_patch_size;
  if (im.height % (P * M) || im.width % (P * M))
    throw Error("patchify: image " + std::to_string(im.width) + "x" + std::to_string(im.height) +
                " is not a multiple of " + std::to_string(P * M));
  PatchTensor pt;
  pt.grid_h = im.height / P;
  pt.grid_w = im.width / P;
  pt.patch_dim = cfg.patch_dim();
  pt.values.resize(size_t(pt.num_patches()) * size_t(pt.patch_dim));
  // Per-channel lookup of the 256 normalised values (the same float ops as numpy, done once).
  float lut[3][256];
  for (int c = 0; c < 3; ++c)
    for (int x = 0; x < 256; ++x) {
      const float v = float(double(x) * (1.0 / 255.0));
      lut[c][x] = (v - cfg.image_mean[c]) / cfg.image_std[c];
    }
  size_t patch = 0;
  for (int bh = 0; bh < pt.grid_h / M; ++bh)
    for (int bw = 0; bw < pt.grid_w / M; ++bw)
      for (int mh = 0; mh < M; ++mh)
        for (int mw = 0; mw < M; ++mw, ++patch) {
          float* o = pt.values.data() + patch * size_t(pt.patch_dim);
          const int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
          for (int c = 0; c < 3; ++c)
            for (int t = 0; t < T; ++t)
              for (int py = 0; py < P; ++py) {
                const uint8_t* r = im.row(y0 + py) + size_t(x0) * 3;
                for (int px = 0; px < P; ++px) *o++ = lut[c][r[3 * px + c]];
              }
        }
  return pt;
}

PatchTensor preprocess_image(const RgbImage& image, const ProcessorConfig& cfg) {
  const ResizedSize s = smart_resize(image.height, image.width, cfg);
  return patchify(resize_bicubic(image, s.width, s.height), cfg);
}

}  // namespace m3::vision
