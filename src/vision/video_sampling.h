// Which source frames of a video the M3 video loader keeps, and the video processor's settings
// (vLLM's MiniMaxM3VideoBackend and MiniMaxM3VLVideoProcessor). Sampling walks the frames in order,
// so the decoder can keep or drop each frame as it arrives without knowing the total count.
#pragma once
#include <cstdint>
#include <vector>

namespace m3::vision {

// Defaults and where they come from (vLLM, vllm/models/minimax_m3/common/mm_preprocess.py and
// vllm/transformers_utils/processors/minimax_m3.py). Settable by --mm-processor-kwargs (processor_options.h).
struct VideoOptions {
  double fps = 1.0;            // MiniMaxM3VideoBackend.load_bytes fps=1 (frames kept per second)
  double max_duration = 300;   // the loader's max_duration=300 s: a longer video is refused
  int64_t max_frames = 768;    // MiniMaxM3VLVideoProcessor.max_frames: more sampled frames are refused
  int64_t min_pixels = 4 * 28 * 28;       // the video processor's per-frame smart_resize bounds
  int64_t max_pixels = 768 * 28 * 28;     // 602112 (the image processor's is 451584)
  int64_t total_pixels = int64_t(64000 * 28 * 28 * 0.9);  // processor total_pixels: frames x resized area cap
};

// vLLM's compute_frames_index_to_sample, one step at a time: the first kept frame is 0; after keeping
// frame `prev`, the next is ceil((prev / video_fps + 1 / fps - 1e-4) * video_fps), at least prev + 1.
int64_t next_sample_index(int64_t prev, double video_fps, double fps);

// The whole list for a video of `total` frames (tests, and what the decoder keeps). Empty for total <= 0.
std::vector<int64_t> sample_indices(int64_t total, double video_fps, double fps);

// The timestamp text before temporal group g (vLLM's processor: frames_indices[min(2g, n - 1)] / fps
// printed "%.1f"): "]<]X.X seconds[>[".
std::vector<double> group_timestamps(const std::vector<int64_t>& indices, double video_fps, int temporal_patch_size);

}  // namespace m3::vision
