// The M3 video processor: sampled, resized frames into temporal-pair patches (see the header).
#include "vision/video_preprocess.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "vision/resample.h"

namespace m3::vision {

ResizedSize video_frame_size(int height, int width, const ProcessorConfig& pc, const VideoOptions& vo) {
  ProcessorConfig v = pc;
  v.min_pixels = vo.min_pixels;
  v.max_pixels = vo.max_pixels;
  return smart_resize(height, width, v);
}

PatchTensor patchify_frames(const std::vector<RgbImage>& frames, const ProcessorConfig& cfg) {
  const int P = cfg.patch_size, M = cfg.merge_size, T = cfg.temporal_patch_size;
  if (frames.empty()) throw Error("patchify: a video without frames");
  const int W = frames[0].width, H = frames[0].height;
  for (const auto& f : frames)
    if (f.width != W || f.height != H) throw Error("patchify: video frames of different sizes");
  if (H % (P * M) || W % (P * M))
    throw Error("patchify: frames of " + std::to_string(W) + "x" + std::to_string(H) + " are not a multiple of " +
                std::to_string(P * M));
  PatchTensor pt;
  pt.grid_t = int((frames.size() + size_t(T) - 1) / size_t(T));
  pt.grid_h = H / P;
  pt.grid_w = W / P;
  pt.patch_dim = cfg.patch_dim();
  pt.values.resize(size_t(pt.num_patches()) * size_t(pt.patch_dim));
  float lut[3][256];
  for (int c = 0; c < 3; ++c)
    for (int x = 0; x < 256; ++x) {
      const float v = float(double(x) * (1.0 / 255.0));
      lut[c][x] = (v - cfg.image_mean[c]) / cfg.image_std[c];
    }
  float* o = pt.values.data();
  for (int g = 0; g < pt.grid_t; ++g)
    for (int bh = 0; bh < pt.grid_h / M; ++bh)
      for (int bw = 0; bw < pt.grid_w / M; ++bw)
        for (int mh = 0; mh < M; ++mh)
          for (int mw = 0; mw < M; ++mw) {
            const int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
            for (int c = 0; c < 3; ++c)
              for (int t = 0; t < T; ++t) {
                const RgbImage& f = frames[std::min(size_t(g) * size_t(T) + size_t(t), frames.size() - 1)];
                for (int py = 0; py < P; ++py) {
                  const uint8_t* r = f.row(y0 + py) + size_t(x0) * 3;
                  for (int px = 0; px < P; ++px) *o++ = lut[c][r[3 * px + c]];
                }
              }
          }
  return pt;
}

PreparedVideo preprocess_video(const uint8_t* data, size_t n, const DecodeLimits& limits, const ProcessorConfig& pc,
                               const VideoOptions& vo, bool want_pixels) {
  PreparedVideo out;
  std::vector<RgbImage> frames;
  ResizedSize rs{};
  int64_t pixels = 0;
  out.info = decode_video(data, n, limits, vo, want_pixels, [&](int64_t idx, RgbImage&& im, const VideoInfo& info) {
    if (out.indices.empty()) rs = video_frame_size(info.height, info.width, pc, vo);
    out.indices.push_back(idx);
    if (int64_t(out.indices.size()) > vo.max_frames)
      throw Error("video: more than " + std::to_string(vo.max_frames) + " frames sampled at " + std::to_string(vo.fps) +
                  " fps (max_frames); send a shorter video");
    pixels += int64_t(rs.width) * rs.height;
    if (pixels > vo.total_pixels)
      throw Error("video: " + std::to_string(out.indices.size()) + " frames of " + std::to_string(rs.width) + "x" +
                  std::to_string(rs.height) + " are more than the " + std::to_string(vo.total_pixels) +
                  " resized pixels a video may hold (total_pixels); send a shorter or smaller video");
    if (want_pixels) frames.push_back(resize_bicubic(im, rs.width, rs.height));
  });
  out.resized_width = rs.width;
  out.resized_height = rs.height;
  out.timestamps = group_timestamps(out.indices, out.info.fps, pc.temporal_patch_size);
  if (want_pixels) {
    out.patches = patchify_frames(frames, pc);
  } else {
    out.patches.grid_t = int((out.indices.size() + size_t(pc.temporal_patch_size) - 1) / size_t(pc.temporal_patch_size));
    out.patches.grid_h = rs.height / pc.patch_size;
    out.patches.grid_w = rs.width / pc.patch_size;
    out.patches.patch_dim = pc.patch_dim();
  }
  return out;
}

}  // namespace m3::vision
