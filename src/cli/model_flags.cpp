// Model flag registration and reporting (see model_flags.h).
#include "cli/model_flags.h"

namespace m3::cli {

ModelOptions ModelFlags::options() const {
  ModelOptions o;
  o.nvfp4_int8_activations = nvfp4_activations == "int8";
  return o;
}

void add_model_flags(CLI::App* app, ModelFlags& f) {
  app->add_option("--nvfp4-activations", f.nvfp4_activations,
                  "fp32: exact NVFP4 matmuls (default); int8: activations rounded to int8 per 16 elements for "
                  "integer dot products (llama.cpp-style Q8; faster decode on CPUs, logits differ slightly)")
      ->check(CLI::IsMember({"fp32", "int8"}))
      ->capture_default_str();
}

std::string describe_model_flags(const ModelFlags& f, const Model& m) {
  if (!f.options().nvfp4_int8_activations) return "";
  if (m.int8_activation_matrices() == 0)
    return "--nvfp4-activations int8: no effect, the checkpoint has no NVFP4 matrix with an input width divisible "
           "by 128";
  return "--nvfp4-activations int8: " + std::to_string(m.int8_activation_matrices()) +
         " NVFP4 matrices use int8 activations (per-16 scales; not bit-exact with the fp32 path)";
}

}  // namespace m3::cli
