// Decoding a request video from its encoded bytes with Debian's libavformat / libavcodec / libswscale
// (the FFmpeg libraries vLLM's OpenCV loader sits on), keeping only the frames the M3 loader samples
// (video_sampling.h). Memory stays bounded: one decoded frame at a time plus what the caller keeps of the
// sampled ones; the container is read from memory; frame size, duration and frame count are checked
// before the work they would cause.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "vision/image.h"
#include "vision/video_sampling.h"

namespace m3::vision {

struct VideoInfo {
  int width = 0, height = 0;  // of the frames
  double fps = 0;             // the stream's average frame rate (OpenCV's CAP_PROP_FPS)
  int64_t frames_read = 0;    // decoded frames, kept or not
  const char* codec = "";     // libavcodec's short name
};

// Calls on_frame(index, rgb, info) for each sampled frame in order (rgb empty when !want_pixels: counting
// only; info holds the stream's size and rate).
// `limits` bounds the frame size (max_side, max_pixels) and the encoded size (max_bytes). Throws
// m3::Error naming what is wrong: not a container libav reads, no video stream, unsupported codec, a
// frame size above the limits, longer than opt.max_duration, corrupt or truncated data, no frames, the
// frame size changing mid-stream.
VideoInfo decode_video(const uint8_t* data, size_t n, const DecodeLimits& limits, const VideoOptions& opt,
                       bool want_pixels, const std::function<void(int64_t, RgbImage&&, const VideoInfo&)>& on_frame);

}  // namespace m3::vision
