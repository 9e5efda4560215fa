// Model flag registration and reporting (see model_flags.h).
#include "cli/model_flags.h"

#include <cstdio>
#include <string>

#include "base/error.h"
#include "kernels/cpu/linear.h"

namespace m3::cli {

ModelOptions ModelFlags::options() const {
  ModelOptions o;
  o.nvfp4_int8_activations = nvfp4_activations == "int8";
  o.nvfp4_bf16_activations = nvfp4_activations == "bf16";
  o.mxfp8_bf16_activations = mxfp8_activations == "bf16";
  o.mxfp4_activations = mxfp4_activations;
  if (mmap && no_mmap) throw Error("--mmap and --no-mmap contradict each other: give at most one");
  o.weight_memory = no_mmap ? WeightMemory::Ram : mmap ? WeightMemory::Mmap : WeightMemory::Auto;
  o.config_overrides = ref.config_overrides();
  return o;
}

void add_model_flags(CLI::App* app, ModelFlags& f) {
  app->add_option("--nvfp4-activations", f.nvfp4_activations,
                  "fp32: exact NVFP4 matmuls (default); int8: activations rounded to int8 per 16 elements for "
                  "integer dot products (llama.cpp-style Q8; faster decode on CPUs, logits differ slightly); bf16: "
                  "activations rounded to BF16 for BF16 dot products (AVX512-BF16 CPUs: faster prefill and decode; "
                  "logits differ slightly, as with a GPU's BF16 activations)")
      ->check(CLI::IsMember({"fp32", "int8", "bf16"}))
      ->capture_default_str();
  app->add_option("--mxfp8-activations", f.mxfp8_activations,
                  "fp32: exact MXFP8 matmuls (default); bf16: activations rounded to BF16 for BF16 dot products "
                  "(AVX512-BF16 CPUs: faster prefill and decode; logits differ slightly, as with a GPU's BF16 "
                  "activations)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app->add_option("--mxfp4-activations", f.mxfp4_activations,
                  "MXFP4 (AMD Quark) checkpoints: auto: as the checkpoint's quantization_config says (dynamic MXFP4 "
                  "activations per 32 elements when it has input_tensors, W4A4 as in vLLM; default); mxfp4: those "
                  "dynamic MXFP4 activations; fp32: exact fp32 activations against the dequantised weights")
      ->check(CLI::IsMember({"auto", "mxfp4", "fp32"}))
      ->capture_default_str();
  app->add_flag("--no-mmap", f.no_mmap,
                "read the weights into memory at load (transparent huge pages advised): a full read at start, "
                "faster decode (fewer TLB misses while the weights stream). Default when the checkpoint takes at "
                "most 75% of the available memory");
  app->add_flag("--mmap", f.mmap,
                "map the checkpoint instead (immediate start when the files are in the page cache, shared "
                "between processes, evictable). Default when the checkpoint does not fit in memory as above");
  add_model_ref_flags(app, f.ref);
}

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
  for (const LinearKind kind : {LinearKind::MXFP8, LinearKind::NVFP4}) {
    const bool mx = kind == LinearKind::MXFP8;
    if (!(mx ? f.options().mxfp8_bf16_activations : f.options().nvfp4_bf16_activations)) continue;
    const std::string flag = mx ? "--mxfp8-activations bf16: " : "--nvfp4-activations bf16: ";
    const int n = m.bf16_activation_matrices(kind);
    if (!out.empty()) out += "\n";
    if (n == 0)
      out += flag + "no effect, the checkpoint has no " + linear_kind_name(kind) + " matrix";
    else
      out += flag + std::to_string(n) + " " + linear_kind_name(kind) +
             " matrices use BF16 activations (not bit-exact with the fp32 path), " +
             (!bf16_dot_products() ? std::string("through the fp32 kernels: this CPU has no AVX512-BF16, no speed-up")
              : m.tiled_matrices() == 0
                  ? std::string("through the fp32 kernels: the BF16 dot-product kernels read weights read into "
                                "memory (4-row tiles), not mapped ones (--no-mmap)")
                  : std::string("BF16 dot products (AVX512-BF16)"));
  }
  if (f.mxfp4_activations == "mxfp4" && m.mxfp4_activation_matrices() == 0) {
    if (!out.empty()) out += "\n";
    out += "--mxfp4-activations mxfp4: no effect, the checkpoint has no MXFP4 matrix";
  } else if (m.mxfp4_activation_matrices() > 0) {
    if (!out.empty()) out += "\n";
    out += "MXFP4 activations: dynamic MXFP4 per 32 elements (W4A4, the checkpoint's scheme) in " +
           std::to_string(m.mxfp4_activation_matrices()) + " matrices (--mxfp4-activations fp32: exact activations)";
  }
  const TensorStore& st = m.weights().store();
  std::string where;
  if (st.memory() == WeightMemory::Ram) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "weights: read %.1f MB into memory", double(st.file_bytes()) / 1e6);
    where = buf;
    if (const int64_t huge = huge_page_bytes_in_use(); huge >= 0) {
      std::snprintf(buf, sizeof buf, ", %.1f MB of this process on transparent huge pages", double(huge) / 1e6);
      where += buf;
    }
    where += ", " + std::to_string(m.tiled_matrices()) + " matrices in 4-row tiles for decode";
    if (const Linear& lm = m.weights().lm_head(); lm.bf16_packed) {
      std::snprintf(buf, sizeof buf, ", the BF16 lm_head also packed losslessly for decode (%.1f MB, %.0f%%)",
                    double(lm.bf16_packed_bytes) / 1e6, 100.0 * double(lm.bf16_packed_bytes) / double(lm.bytes()));
      where += buf;
    }
    where += " (--mmap maps the checkpoint instead)";
  } else if (!st.mmap_reason().empty()) {  // the default chose to map; --mmap needs no notice
    where = "weights: mapped from the checkpoint: " + st.mmap_reason() + " (--no-mmap reads them into memory anyway)";
  }
  if (!where.empty()) out = where + (out.empty() ? "" : "\n" + out);
  return out;
}

}  // namespace m3::cli
