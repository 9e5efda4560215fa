// `m3serve bench vision`: times the image path on this machine: decoding (for image files),
// preprocessing (smart resize, Pillow bicubic, patches) and the vision tower's encoder, per image size,
// and reports the process's peak resident memory after the decode. Videos (--video FILE): decoding,
// sampling and preprocessing together, then the encoder over all temporal groups.
#pragma once
#include <string>
#include <vector>

namespace m3::bench {

struct VisionBenchOptions {
  std::string model_dir;
  std::vector<std::string> images;  // files
  std::vector<std::string> sizes;   // "WxH": synthetic RGB images
  std::vector<std::string> videos;  // files
  std::string mm_processor_kwargs;  // as serve's flag (video sampling and pixel bounds)
  bool preprocess_only = false;     // videos: stop before the tower (decode memory and time alone)
  int repeats = 3;
  int threads = 0;
};

void run_vision_bench(const VisionBenchOptions& o);

}  // namespace m3::bench
