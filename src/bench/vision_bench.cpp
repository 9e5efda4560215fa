// `m3serve bench vision` (see vision_bench.h).
#include "bench/vision_bench.h"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>

#include "base/error.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/vision_tower.h"
#include "vision/image_decode.h"
#include "vision/preprocess.h"
#include "vision/processor_options.h"
#include "vision/video_preprocess.h"

namespace m3::bench {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

double cpu_ms() {  // this process's user + system CPU time (steadier than wall time on a shared host)
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

// Multiply-add FLOPs (2 per product) of one image through the tower: patch embedding, each layer's
// q/k/v/o, fc1/fc2 and attention (scores and P.V), the projector and the merge MLP.
double encoder_flops(const VisionConfig& c, int64_t n) {
  const double H = c.hidden, I = c.intermediate, PH = c.projector_hidden, TH = c.text_hidden, N = double(n);
  const double layer = 2 * N * (4 * H * H + 2 * H * I) + 2 * 2 * N * N * H;
  return 2 * N * H * double(c.patch_dim()) + c.layers * layer + 2 * N * (H * PH + PH * TH) +
         2 * (N / 4) * (4 * TH * PH + PH * TH);
}

void time_one(const std::string& label, const vision::RgbImage& im, const VisionTower& tower, int repeats) {
  vision::ProcessorConfig pc;
  std::vector<double> pre, enc, cpu;
  vision::PatchTensor pt;
  std::vector<float> out;
  for (int r = 0; r < repeats; ++r) {
    double t0 = now_ms();
    pt = vision::preprocess_image(im, pc);
    double t1 = now_ms(), c1 = cpu_ms();
    out = tower.forward(pt.values.data(), {{pt.grid_t, pt.grid_h, pt.grid_w}});
    double t2 = now_ms(), c2 = cpu_ms();
    pre.push_back(t1 - t0);
    enc.push_back(t2 - t1);
    cpu.push_back(c2 - c1);
  }
  std::sort(pre.begin(), pre.end());
  std::sort(enc.begin(), enc.end());
  std::sort(cpu.begin(), cpu.end());
  std::printf("%-22s -> %4dx%-4d %5lld patches %4lld tokens | preprocess ms median %.1f (%.1f-%.1f) | "
              "encoder ms median %.1f (%.1f-%.1f)\n",
              label.c_str(), pt.grid_w * 14, pt.grid_h * 14, (long long)pt.num_patches(), (long long)pt.num_merged(2),
              pre[pre.size() / 2], pre.front(), pre.back(), enc[enc.size() / 2], enc.front(), enc.back());
  // CPU time is the sum over the threads; GFLOP/s per CPU-second is what one busy core achieved.
  const double gf = encoder_flops(tower.config(), pt.num_patches()) / 1e9;
  std::printf("%-22s    encoder %.1f GFLOP | CPU ms median %.1f (%.1f-%.1f) | %.1f GFLOP/s wall (median), %.1f per "
              "CPU-second\n",
              "", gf, cpu[cpu.size() / 2], cpu.front(), cpu.back(), gf / (enc[enc.size() / 2] / 1e3),
              gf / (cpu[cpu.size() / 2] / 1e3));
}

}  // namespace

void run_vision_bench(const VisionBenchOptions& o) {
  if (o.images.empty() && o.sizes.empty() && o.videos.empty())
    throw Error("bench vision: give --image FILE, --size WxH or --video FILE");
  if (o.repeats < 1) throw Error("bench vision: --repeats must be at least 1");
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const ModelConfig mc = ModelConfig::from_dir(o.model_dir);
  std::ifstream cf(o.model_dir + "/config.json");
  const std::string text((std::istreambuf_iterator<char>(cf)), {});
  const VisionConfig vc = VisionConfig::from_json_text(text, o.model_dir + "/config.json", mc.hidden);
  TensorStore store(o.model_dir);
  VisionTower tower(vc, store);
  std::printf("vision tower: hidden %d, heads %d x %d, layers %d, intermediate %d; threads %d\n", vc.hidden, vc.heads,
              vc.head_dim, vc.layers, vc.intermediate, omp_get_max_threads());
  for (const auto& f : o.images) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw Error("bench vision: cannot read " + f);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    const double rss0 = peak_rss_mib(), t0 = now_ms();
    vision::DecodeLimits lim;
    lim.max_bytes = std::max(lim.max_bytes, bytes.size());
    const vision::RgbImage im = vision::decode_image(bytes.data(), bytes.size(), lim);
    const double t1 = now_ms(), rss1 = peak_rss_mib();
    std::printf("%s: %dx%d, decoded in %.1f ms; peak RSS %.1f MiB before, %.1f MiB after the decode (+%.1f)\n",
                f.c_str(), im.width, im.height, t1 - t0, rss0, rss1, rss1 - rss0);
    time_one(f.substr(f.rfind('/') + 1), im, tower, o.repeats);
  }
  vision::ProcessorConfig pc;
  vision::VideoOptions vo;
  vision::apply_mm_processor_kwargs(o.mm_processor_kwargs, pc, vo);
  for (const auto& f : o.videos) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw Error("bench vision: cannot read " + f);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    vision::DecodeLimits lim;
    lim.max_bytes = std::max(lim.max_bytes, bytes.size());
    std::vector<double> pre, enc;
    int64_t tokens = 0;
    for (int r = 0; r < o.repeats; ++r) {
      const double rss0 = peak_rss_mib(), t0 = now_ms();
      const vision::PreparedVideo pv = vision::preprocess_video(bytes.data(), bytes.size(), lim, pc, vo, true);
      const double t1 = now_ms(), rss1 = peak_rss_mib();
      if (r == 0)
        std::printf("%s: %dx%d at %.3g fps, %lld frames read, %zu sampled -> %dx%d, grid %dx%dx%d; peak RSS %.1f MiB "
                    "before, %.1f MiB after decode+preprocess (+%.1f)\n",
                    f.c_str(), pv.info.width, pv.info.height, pv.info.fps, (long long)pv.info.frames_read,
                    pv.indices.size(), pv.resized_width, pv.resized_height, pv.patches.grid_t, pv.patches.grid_h,
                    pv.patches.grid_w, rss0, rss1, rss1 - rss0);
      if (!o.preprocess_only)
        tower.forward(pv.patches.values.data(), {{pv.patches.grid_t, pv.patches.grid_h, pv.patches.grid_w}});
      const double t2 = now_ms();
      tokens = pv.patches.num_merged(2);
      pre.push_back(t1 - t0);
      enc.push_back(t2 - t1);
    }
    std::sort(pre.begin(), pre.end());
    std::sort(enc.begin(), enc.end());
    std::printf("%-22s -> %5lld tokens | decode+preprocess ms median %.1f (%.1f-%.1f) | encoder ms median %.1f "
                "(%.1f-%.1f) | peak RSS %.1f MiB\n",
                f.substr(f.rfind('/') + 1).c_str(), (long long)tokens, pre[pre.size() / 2], pre.front(), pre.back(),
                enc[enc.size() / 2], enc.front(), enc.back(), peak_rss_mib());
  }
  for (const auto& s : o.sizes) {
    int w = 0, h = 0;
    if (std::sscanf(s.c_str(), "%dx%d", &w, &h) != 2 || w <= 0 || h <= 0)
      throw Error("bench vision: --size " + s + " (expected WxH, e.g. 448x448)");
    vision::RgbImage im;
    im.width = w;
    im.height = h;
    im.rgb.resize(size_t(w) * size_t(h) * 3);
    std::mt19937 rng(1);
    for (auto& b : im.rgb) b = uint8_t(rng());
    time_one(s, im, tower, o.repeats);
  }
}

}  // namespace m3::bench
