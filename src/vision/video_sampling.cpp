// Frame sampling of the M3 video loader (see the header).
#include "vision/video_sampling.h"

#include <algorithm>
#include <cmath>

namespace m3::vision {

int64_t next_sample_index(int64_t prev, double video_fps, double fps) {
  if (prev < 0) return 0;
  const double prev_ts = double(prev) / video_fps;
  const double target_ts = prev_ts + 1.0 / fps - 1e-4;
  const int64_t target = int64_t(std::ceil(target_ts * video_fps));
  return std::max(target, prev + 1);
}

std::vector<int64_t> sample_indices(int64_t total, double video_fps, double fps) {
  std::vector<int64_t> out;
  for (int64_t i = next_sample_index(-1, video_fps, fps); i < total; i = next_sample_index(i, video_fps, fps))
    out.push_back(i);
  return out;
}

std::vector<double> group_timestamps(const std::vector<int64_t>& indices, double video_fps, int temporal_patch_size) {
  std::vector<double> out;
  if (indices.empty()) return out;
  const size_t groups = (indices.size() + size_t(temporal_patch_size) - 1) / size_t(temporal_patch_size);
  for (size_t g = 0; g < groups; ++g)
    out.push_back(double(indices[std::min(g * size_t(temporal_patch_size), indices.size() - 1)]) / video_fps);
  return out;
}

}  // namespace m3::vision
