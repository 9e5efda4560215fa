// `m3serve make-model`: writes a deterministic random-weight checkpoint in the M3 BF16, M3 MXFP8
// or M3.1 (MXFP8 + NVFP4 experts) release layout. A preset gives the sizes; every size flag
// overrides its preset value.
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "tools/make_model.h"

namespace m3::cli {

namespace {

struct MakeModelArgs {
  std::string layout = "m31";
  std::string preset = "tiny";
  std::string out;
  uint64_t seed = 0;
  int shards = 1;
  // Size overrides; only the flags actually given are applied on top of the preset.
  std::map<std::string, int64_t> sizes;
};

// Flag name -> member of MakeModelOptions.
const std::pair<const char*, int64_t MakeModelOptions::*> kSizeFlags[] = {
    {"hidden", &MakeModelOptions::hidden},         {"layers", &MakeModelOptions::layers},
    {"heads", &MakeModelOptions::heads},           {"kv-heads", &MakeModelOptions::kv_heads},
    {"head-dim", &MakeModelOptions::head_dim},     {"rotary-dim", &MakeModelOptions::rotary_dim},
    {"vocab", &MakeModelOptions::vocab},           {"experts", &MakeModelOptions::experts},
    {"top-k", &MakeModelOptions::top_k},           {"moe-width", &MakeModelOptions::moe_width},
    {"shared-width", &MakeModelOptions::shared_width}, {"dense-width", &MakeModelOptions::dense_width},
    {"dense-layers", &MakeModelOptions::dense_layers}, {"index-heads", &MakeModelOptions::index_heads},
    {"index-dim", &MakeModelOptions::index_dim},   {"block-size", &MakeModelOptions::block_size},
    {"topk-blocks", &MakeModelOptions::topk_blocks}, {"init-block", &MakeModelOptions::init_block},
    {"local-block", &MakeModelOptions::local_block}, {"merges", &MakeModelOptions::merges},
    {"dspark-layers", &MakeModelOptions::dspark_layers},
    {"vision-hidden", &MakeModelOptions::vision_hidden}, {"vision-layers", &MakeModelOptions::vision_layers},
    {"vision-heads", &MakeModelOptions::vision_heads}, {"vision-width", &MakeModelOptions::vision_width},
};

}  // namespace

void register_make_model(CLI::App& app) {
  auto args = std::make_shared<MakeModelArgs>();
  auto* cmd = app.add_subcommand("make-model", "write a deterministic random-weight M3 / M3.1 checkpoint");
  cmd->add_option("--layout", args->layout, "m3-bf16 | m3-mxfp8 | m31 | m31-mxfp4 (the M3.1 plan as an AMD Quark MXFP4 export)")
      ->check(CLI::IsMember({"m3-bf16", "m3-mxfp8", "m31", "m31-mxfp4"}))
      ->capture_default_str();
  cmd->add_option("--preset", args->preset, "tiny | small | mid")
      ->check(CLI::IsMember({"tiny", "small", "mid"}))
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "random seed")->capture_default_str();
  cmd->add_option("--shards", args->shards, "number of safetensors shards (1 = model.safetensors)")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--out", args->out, "output directory")->required();
  for (const auto& [flag, member] : kSizeFlags) {
    const std::string name = flag;
    cmd->add_option_function<int64_t>(
           "--" + name, [args, name](const int64_t& v) { args->sizes[name] = v; }, "override the preset's " + name)
        // Counts that may be 0 (no vision tower, no dense layer, no draft, ...); every width is positive.
        ->check(name == "vision-layers" || name == "local-block" || name == "init-block" || name == "dense-layers" ||
                        name == "dspark-layers" || name == "merges"
                    ? non_negative_number()
                    : positive_number());
  }
  cmd->callback([args]() {
    const ModelLayout layout = parse_model_layout(args->layout);
    MakeModelOptions o = make_model_preset(args->preset, layout);
    o.seed = args->seed;
    o.shards = args->shards;
    for (const auto& [flag, member] : kSizeFlags) {
      auto it = args->sizes.find(flag);
      if (it != args->sizes.end()) o.*member = it->second;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const MakeModelStats st = make_model(o, args->out);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "make-model: %s %s -> %s: %lld tensors, %.1f M parameters, %.1f MB, vocab %lld, %.1f s\n",
                 args->layout.c_str(), args->preset.c_str(), args->out.c_str(), (long long)st.num_tensors,
                 double(st.num_params) / 1e6, double(st.bytes) / 1e6, (long long)st.vocab_size, secs);
  });
}

}  // namespace m3::cli
