// `m3serve generate`: tokenize a prompt, prefill, decode with sampling, stream the text to stdout,
// and report prefill / decode speed with the achieved weight bandwidth to stderr.
#include <chrono>
#include <cstdio>
#include <vector>

#include "cli/commands.h"
#include "engine/sampler.h"
#include "formats/error.h"
#include "kernels/cpu/dispatch.h"
#include "model/model.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

#include <omp.h>

namespace m3::cli {

void register_generate(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Complete a prompt and stream the text to stdout");
  struct Opts {
    std::string model, prompt;
    int max_tokens = 64;
    SamplingParams sp;
    bool ignore_eos = false, no_special = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--model", o->model, "Checkpoint directory")->required();
  sub->add_option("--prompt", o->prompt, "Prompt text (special tokens written in it are recognised)")->required();
  sub->add_option("--max-tokens", o->max_tokens, "Tokens to generate")->check(CLI::Range(1, 1 << 24));
  sub->add_option("--temperature", o->sp.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  sub->add_option("--top-p", o->sp.top_p, "Nucleus sampling mass")->check(CLI::Range(1e-6, 1.0));
  sub->add_option("--top-k", o->sp.top_k, "Keep the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", o->sp.seed, "Sampling seed");
  sub->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past the end-of-sequence token");
  sub->add_flag("--no-special", o->no_special, "Treat special-token text in the prompt as plain text");
  sub->callback([o] {
    Model model(o->model);
    const ModelConfig& c = model.config();
    Tokenizer tok = Tokenizer::from_dir(o->model);
    std::vector<int32_t> ids = tok.encode(o->prompt, !o->no_special);
    if (ids.empty()) throw Error("--prompt: encodes to no tokens");
    for (int32_t id : ids)
      if (id >= c.vocab)
        throw Error("--prompt: token id " + std::to_string(id) + " is outside the model's vocabulary (" +
                    std::to_string(c.vocab) + ")");
    const int32_t eos = c.eos_id >= 0 ? c.eos_id : tok.eos_id();
    const int64_t V = c.vocab;
    std::vector<float> logits(static_cast<size_t>(V));
    SeqCache cache = model.new_cache(int64_t(ids.size()) + o->max_tokens);
    Sampler sampler(o->sp);
    IncrementalDetokenizer detok(tok, /*skip_special=*/false);

    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    model.forward(ids.data(), int64_t(ids.size()), cache, logits.data());
    const auto t1 = clock::now();
    int generated = 0;
    const char* finish = "length";
    for (;;) {
      const int32_t next = sampler.sample(logits.data(), V);
      ++generated;
      if (next == eos && !o->ignore_eos) {
        finish = "stop";
        break;
      }
      const std::string piece = detok.push(next);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      if (generated >= o->max_tokens) break;
      model.forward(&next, 1, cache, logits.data());
    }
    const std::string rest = detok.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    const auto t2 = clock::now();
    const double pre_s = std::chrono::duration<double>(t1 - t0).count();
    const double dec_s = std::chrono::duration<double>(t2 - t1).count();
    // Decode steps = tokens after the first (the first comes from the prefill's logits).
    const int steps = generated - 1;
    const double tps = steps > 0 ? steps / dec_s : 0.0;
    const double gbs = tps * model.weights().active_bytes_per_token() / 1e9;
    std::fprintf(stderr,
                 "\n[m3serve] prompt %zu tokens, prefill %.3f s (%.1f tokens/s); generated %d tokens (%s); decode "
                 "%.2f tokens/s, %.2f GB/s achieved (%.1f MB of weights read per token); %d threads, kernels %s\n",
                 ids.size(), pre_s, double(ids.size()) / pre_s, generated, finish, tps, gbs,
                 model.weights().active_bytes_per_token() / 1e6, omp_get_max_threads(), cpu_ops().name);
  });
}

}  // namespace m3::cli
