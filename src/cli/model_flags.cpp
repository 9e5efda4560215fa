// Model flag registration and reporting (see model_flags.h).
#include "cli/model_flags.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace m3::cli {

ModelOptions ModelFlags::options() const {
  ModelOptions o;
  o.nvfp4_int8_activations = nvfp4_activations == "int8";
  o.weight_memory = no_mmap ? WeightMemory::Ram : WeightMemory::Mmap;
  return o;
}

void add_model_flags(CLI::App* app, ModelFlags& f) {
  app->add_option("--nvfp4-activations", f.nvfp4_activations,
                  "fp32: exact NVFP4 matmuls (default); int8: activations rounded to int8 per 16 elements for "
                  "integer dot products (llama.cpp-style Q8; faster decode on CPUs, logits differ slightly)")
      ->check(CLI::IsMember({"fp32", "int8"}))
      ->capture_default_str();
  app->add_flag("--no-mmap", f.no_mmap,
                "read the weights into memory at load (transparent huge pages advised) instead of mapping the "
                "checkpoint: slower start and no sharing of the page cache between processes, faster decode "
                "(fewer TLB misses while the weights stream)");
}

namespace {

// AnonHugePages of this process in bytes (Linux /proc/self/smaps_rollup), -1 when unknown.
int64_t anon_huge_bytes() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("AnonHugePages:", 0) == 0) return std::atoll(line.c_str() + 14) * 1024;
  return -1;
}

}  // namespace

std::string describe_model_flags(const ModelFlags& f, const Model& m) {
  std::string out;
  if (f.options().nvfp4_int8_activations) {
    if (m.int8_activation_matrices() == 0)
      out += "--nvfp4-activations int8: no effect, the checkpoint has no NVFP4 matrix with an input width divisible "
             "by 128";
    else
      out += "--nvfp4-activations int8: " + std::to_string(m.int8_activation_matrices()) +
             " NVFP4 matrices use int8 activations (per-16 scales; not bit-exact with the fp32 path)";
  }
  if (f.no_mmap) {
    if (!out.empty()) out += "\n";
    const double mb = double(m.weights().file_bytes()) / 1e6;
    const int64_t huge = anon_huge_bytes();
    char buf[256];
    if (huge >= 0)
      std::snprintf(buf, sizeof buf, "--no-mmap: read %.1f MB of weights into memory; %.1f MB of this process are on "
                    "transparent huge pages", mb, double(huge) / 1e6);
    else
      std::snprintf(buf, sizeof buf, "--no-mmap: read %.1f MB of weights into memory", mb);
    out += buf;
  }
  return out;
}

}  // namespace m3::cli
