// The M3 video processor on top of the decoder: sampled frames (video_decode.h) resized with the video
// processor's smart resize bounds (VideoOptions min/max_pixels) and Pillow's bicubic, as each arrives,
// then normalised and cut into patches in temporal pairs: grid_t = ceil(frames / 2), an odd count padded
// with the last frame (transformers' / vLLM's MiniMaxM3VLVideoProcessor), each group's patches in
// merge-window order as for an image.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "vision/preprocess.h"
#include "vision/video_decode.h"

namespace m3::vision {

struct PreparedVideo {
  PatchTensor patches;              // values empty when counting only
  std::vector<int64_t> indices;     // sampled source frames
  std::vector<double> timestamps;   // seconds, per temporal group (the prompt's "]<]X.X seconds[>[")
  VideoInfo info;
  int resized_width = 0, resized_height = 0;
  // Merged tokens of one temporal group: the ]<]video[>[ tokens between each group's start and end markers.
  int64_t tokens_per_group(int merge_size) const {
    return int64_t(patches.grid_h) * patches.grid_w / (int64_t(merge_size) * merge_size);
  }
};

// The frame size the video processor resizes to: smart_resize with the video's min/max_pixels.
ResizedSize video_frame_size(int height, int width, const ProcessorConfig& pc, const VideoOptions& vo);

// decode -> sample -> resize -> patchify, each temporal pair patched as soon as its two frames are resized
// (frames 2g and 2g + 1 in the two temporal slots, (channel, temporal, row, col) within a patch; an odd
// count ends with the last frame twice), so only one pair of frames is held at a time. Throws m3::Error for a bad video, more than vo.max_frames
// sampled frames, or more than vo.total_pixels resized pixels over all frames (checked per frame, before
// the memory is spent).
PreparedVideo preprocess_video(const uint8_t* data, size_t n, const DecodeLimits& limits, const ProcessorConfig& pc,
                               const VideoOptions& vo, bool want_pixels);

}  // namespace m3::vision
