// Registration hooks for the m3serve subcommands; each lives in its own cmd_*.cpp.
// A command reports failure by throwing m3::Error (printed as "error: ..." with exit code 1).
#pragma once
#include <CLI/CLI.hpp>

namespace m3::cli {

void register_generate(CLI::App& app);
void register_logits(CLI::App& app);
void register_tokenize(CLI::App& app);    // also registers `detokenize`
void register_make_model(CLI::App& app);
void register_serve(CLI::App& app);       // cmd_serve.cpp: the OpenAI-compatible server
void register_bench(CLI::App& app);       // cmd_bench.cpp: bench serve / bench roofline
void register_proxy(CLI::App& app);       // cmd_proxy.cpp: the prefill/decode disaggregation proxy

}  // namespace m3::cli
