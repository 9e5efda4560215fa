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

namespace {

// One temporal group's patches (frames a and b in the two temporal slots) appended to `out`.
void append_group(const RgbImage& a, const RgbImage& b, const ProcessorConfig& cfg, const float (&lut)[3][256],
                  std::vector<float>& out) {
  const int P = cfg.patch_size, M = cfg.merge_size, T = cfg.temporal_patch_size;
  const int gh = a.height / P, gw = a.width / P;
  size_t at = out.size();
  out.resize(at + size_t(gh) * size_t(gw) * size_t(cfg.patch_dim()));
  float* o = out.data() + at;
  const RgbImage* slot[2] = {&a, &b};
  for (int bh = 0; bh < gh / M; ++bh)
    for (int bw = 0; bw < gw / M; ++bw)
      for (int mh = 0; mh < M; ++mh)
        for (int mw = 0; mw < M; ++mw) {
          const int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
          for (int c = 0; c < 3; ++c)
            for (int t = 0; t < T; ++t)
              for (int py = 0; py < P; ++py) {
                const uint8_t* r = slot[t]->row(y0 + py) + size_t(x0) * 3;
                for (int px = 0; px < P; ++px) *o++ = lut[c][r[3 * px + c]];
              }
        }
}

void make_lut(const ProcessorConfig& cfg, float (&lut)[3][256]) {
  for (int c = 0; c < 3; ++c)
    for (int x = 0; x < 256; ++x) {
      const float v = float(double(x) * (1.0 / 255.0));
      lut[c][x] = (v - cfg.image_mean[c]) / cfg.image_std[c];
    }
}

}  // namespace

PreparedVideo preprocess_video(const uint8_t* data, size_t n, const DecodeLimits& limits, const ProcessorConfig& pc,
                               const VideoOptions& vo, bool want_pixels) {
  PreparedVideo out;
  if (pc.temporal_patch_size != 2)
    throw Error("video: temporal_patch_size " + std::to_string(pc.temporal_patch_size) + " (expected 2, temporal pairs)");
  std::vector<RgbImage> frames;  // at most one pair at a time
  float lut[3][256];
  make_lut(pc, lut);
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
    if (!want_pixels) return;
    if (out.indices.size() == 1) {
      // The patch tensor's upper bound by the limits, reserved untouched (no resident pages until written),
      // so appending never reallocates; each temporal pair is patched as soon as it is complete and its
      // frames freed: the peak is the floats plus two frames, not all the frames as well.
      const int64_t by_pixels = vo.total_pixels / (int64_t(rs.width) * rs.height);
      const int64_t by_time = int64_t(vo.max_duration * std::min(vo.fps, info.fps)) + 2;
      const int64_t max_frames = std::min({vo.max_frames, by_pixels, by_time}) + 1;
      out.patches.values.reserve(size_t(max_frames) * size_t(rs.width) * size_t(rs.height) * 3);
    }
    frames.push_back(resize_bicubic(im, rs.width, rs.height));
    if (frames.size() == 2) {
      append_group(frames[0], frames[1], pc, lut, out.patches.values);
      frames.clear();
    }
  });
  out.resized_width = rs.width;
  out.resized_height = rs.height;
  out.timestamps = group_timestamps(out.indices, out.info.fps, pc.temporal_patch_size);
  if (want_pixels && frames.size() == 1) append_group(frames[0], frames[0], pc, lut, out.patches.values);  // odd: last repeated
  out.patches.grid_t = int((out.indices.size() + size_t(pc.temporal_patch_size) - 1) / size_t(pc.temporal_patch_size));
  out.patches.grid_h = rs.height / pc.patch_size;
  out.patches.grid_w = rs.width / pc.patch_size;
  out.patches.patch_dim = pc.patch_dim();
  return out;
}

}  // namespace m3::vision
