// The load-time model flags shared by `serve`, `generate`, `logits` and `bench roofline`.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "cli/model_ref_flags.h"
#include "model/model.h"

namespace m3::cli {

struct ModelFlags {
  std::string nvfp4_activations = "fp32";  // fp32 (exact) or int8
  std::string mxfp8_activations = "fp32";  // fp32 (exact) or bf16
  std::string mxfp4_activations = "auto";  // auto (the checkpoint's), mxfp4 (W4A4) or fp32 (exact)
  bool no_mmap = false;                     // read the weights into memory (default: when they fit)
  bool mmap = false;                        // map the checkpoint instead
  ModelRefFlags ref;                        // where the checkpoint comes from; --hf-overrides
  ModelOptions options() const;
};

void add_model_flags(CLI::App* app, ModelFlags& f);

// What the flags did to the loaded model, for stderr, one line each: where the weights live (read
// into memory: how many MB and how many on huge pages; mapped: why, when it was not asked for); and,
// for --nvfp4-activations int8 and --mxfp8-activations bf16, how many matrices use it (or that the
// checkpoint has none) and, for bf16, whether this CPU has BF16 dot products.
// options() throws m3::Error for contradictory flags (--mmap with --no-mmap).
std::string describe_model_flags(const ModelFlags& f, const Model& m);

}  // namespace m3::cli
