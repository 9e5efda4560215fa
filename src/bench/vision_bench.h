// `m3serve bench vision`: times the image path on this machine: decoding (for image files),
// preprocessing (smart resize, Pillow bicubic, patches) and the vision tower's encoder, per image size,
// and reports the process's peak resident memory after the decode.
#pragma once
#include <string>
#include <vector>

namespace m3::bench {

struct VisionBenchOptions {
  std::string model_dir;
  std::vector<std::string> images;  // files
  std::vector<std::string> sizes;   // "WxH": synthetic RGB images
  int repeats = 3;
  int threads = 0;
};

void run_vision_bench(const VisionBenchOptions& o);

}  // namespace m3::bench
