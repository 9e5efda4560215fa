// `m3serve logits`: run a token file through the model (one prefill, or one token at a time with
// --decode) and write raw little-endian float32 logits [n_tokens, vocab].
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "base/error.h"
#include "model/model.h"

namespace m3::cli {

namespace {

std::vector<int32_t> read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open token file");
  std::vector<int32_t> ids;
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long v = std::strtol(word.c_str(), &end, 10);
    if (*end != '\0' || word.empty() || v < 0 || v > INT32_MAX)
      throw Error(path + ": \"" + word + "\" is not a token id (expected whitespace-separated non-negative integers)");
    ids.push_back(int32_t(v));
  }
  return ids;
}

}  // namespace

void register_logits(CLI::App& app) {
  auto* sub = app.add_subcommand("logits", "Write the logits of every position of a token file");
  struct Opts {
    std::string model, tokens, out, attention = "sparse";
    bool decode = false;
    ModelFlags model_flags;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--model", o->model, "Checkpoint directory (config.json + safetensors) or Hugging Face Hub id")
      ->required();
  sub->add_option("--tokens", o->tokens, "File of whitespace-separated token ids")->required();
  sub->add_option("--out", o->out, "Output file: raw little-endian float32 [n_tokens, vocab]")->required();
  sub->add_flag("--decode", o->decode, "Feed the tokens one at a time through the cache instead of one prefill");
  sub->add_option("--attention", o->attention, "sparse (the model), oracle (dense with MSA mask), dense (ignore MSA)")
      ->check(CLI::IsMember({"sparse", "oracle", "dense"}));
  add_model_flags(sub, o->model_flags);
  sub->callback([o] {
    const ModelOptions mo = o->model_flags.options();  // flag errors before a download
    Model model(resolve_model_dirs(o->model_flags.ref, o->model).model, mo);
    if (const std::string d = describe_model_flags(o->model_flags, model); !d.empty())
      std::fprintf(stderr, "[m3serve] %s\n", d.c_str());
    const auto ids = read_token_file(o->tokens);
    if (ids.empty()) throw Error(o->tokens + ": no token ids");
    const int64_t V = model.config().vocab, n = int64_t(ids.size());
    std::vector<float> logits(size_t(n * V));
    ForwardOptions fo;
    fo.attention = o->attention == "oracle" ? AttentionPath::DenseMaskOracle
                   : o->attention == "dense" ? AttentionPath::DenseIgnoreMsa
                                             : AttentionPath::Sparse;
    SeqCache cache = model.new_cache(n);
    const auto t0 = std::chrono::steady_clock::now();
    if (o->decode) {
      fo.all_logits = false;
      for (int64_t t = 0; t < n; ++t) model.forward(&ids[t], 1, cache, logits.data() + t * V, fo);
    } else {
      fo.all_logits = true;
      model.forward(ids.data(), n, cache, logits.data(), fo);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ofstream out(o->out, std::ios::binary);
    if (!out) throw Error(o->out + ": cannot open for writing");
    out.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * 4));
    if (!out) throw Error(o->out + ": write failed");
    std::fprintf(stderr, "%lld tokens (%s) in %.3f s: %.1f tokens/s\n", (long long)n, o->decode ? "decode" : "prefill",
                 s, double(n) / s);
  });
}

}  // namespace m3::cli
