// Model flag registration and reporting (see model_flags.h).
#include "cli/model_flags.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "formats/error.h"

namespace m3::cli {

ModelOptions ModelFlags::options() const {
  ModelOptions o;
  o.nvfp4_int8_activations = nvfp4_activations == "int8";
  if (mmap && no_mmap) throw Error("--mmap and --no-mmap contradict each other: give at most one");
  o.weight_memory = no_mmap ? WeightMemory::Ram : mmap ? WeightMemory::Mmap : WeightMemory::Auto;
  return o;
}

void add_model_flags(CLI::App* app, ModelFlags& f) {
  app->add_option("--nvfp4-activations", f.nvfp4_activations,
                  "fp32: exact NVFP4 matmuls (default); int8: activations rounded to int8 per 16 elements for "
                  "integer dot products (llama.cpp-style Q8; faster decode on CPUs, logits differ slightly)")
      ->check(CLI::IsMember({"fp32", "int8"}))
      ->capture_default_str();
  app->add_flag("--no-mmap", f.no_mmap,
                "read the weights into memory at load (transparent huge pages advised): a full read at start, "
                "faster decode (fewer TLB misses while the weights stream). Default when the checkpoint takes at "
                "most 75% of the available memory");
  app->add_flag("--mmap", f.mmap,
                "map the checkpoint instead (immediate start when the files are in the page cache, shared "
                "between processes, evictable). Default when the checkpoint does not fit in memory as above");
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
  const TensorStore& st = m.weights().store();
  const double mb = double(st.file_bytes()) / 1e6;
  char buf[320];
  if (st.memory() == WeightMemory::Ram) {
    const int64_t huge = anon_huge_bytes();
    if (huge >= 0)
      std::snprintf(buf, sizeof buf, "weights: read %.1f MB into memory, %.1f MB of this process on transparent huge "
                    "pages (--mmap maps the checkpoint instead)", mb, double(huge) / 1e6);
    else
      std::snprintf(buf, sizeof buf, "weights: read %.1f MB into memory (--mmap maps the checkpoint instead)", mb);
  } else if (!f.mmap && !st.auto_found_thp()) {
    std::snprintf(buf, sizeof buf, "weights: mapped from the checkpoint: transparent huge pages are off "
                  "(/sys/kernel/mm/transparent_hugepage/enabled), so reading them into memory would not pay "
                  "(--no-mmap reads them anyway)");
  } else if (!f.mmap && st.auto_available_bytes() > 0) {
    std::snprintf(buf, sizeof buf, "weights: mapped from the checkpoint: %.1f MB is more than %.0f%% of the %.1f MB of "
                  "available memory (--no-mmap reads them into memory anyway)", mb, 100 * kAutoRamFraction,
                  double(st.auto_available_bytes()) / 1e6);
  } else if (!f.mmap) {
    std::snprintf(buf, sizeof buf, "weights: mapped from the checkpoint: available memory unknown (no MemAvailable in "
                  "/proc/meminfo; --no-mmap reads them into memory anyway)");
  } else {
    buf[0] = 0;  // --mmap: as asked
  }
  if (buf[0]) out = std::string(buf) + (out.empty() ? "" : "\n" + out);
  return out;
}

}  // namespace m3::cli
