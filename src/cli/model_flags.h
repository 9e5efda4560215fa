// The load-time model flags shared by `serve`, `generate`, `logits` and `bench roofline`.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "model/model.h"

namespace m3::cli {

struct ModelFlags {
  std::string nvfp4_activations = "fp32";  // fp32 (exact) or int8
  bool no_mmap = false;                     // read the weights into memory instead of mapping them
  ModelOptions options() const;
};

void add_model_flags(CLI::App* app, ModelFlags& f);

// What the flags did to the loaded model, for stderr ("" when they changed nothing), one line per
// flag. Says so when int8 activations were asked for but the checkpoint has no NVFP4 matrix they
// apply to; for --no-mmap, how many bytes were read and how many of them huge pages back.
std::string describe_model_flags(const ModelFlags& f, const Model& m);

}  // namespace m3::cli
