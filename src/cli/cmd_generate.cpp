// `m3serve generate`: either one prompt through the engine, streamed to stdout (with prefill / decode
// speed and achieved GB/s on stderr), or an offline batch: every request line of --input runs concurrently through
// the engine and the results are written to --output in the same order.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cli/generation_defaults.h"
#include "cli/engine_flags.h"
#include "cli/request_json.h"
#include "engine/engine.h"
#include "base/error.h"
#include "kernels/cpu/dispatch.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace m3::cli {

namespace {

using clock_type = std::chrono::steady_clock;

struct Opts {
  std::string model, prompt, input, output;
  ModelDirs dirs;  // model and tokenizer directories (MODEL resolved: directory or Hub id)
  int max_tokens = 64;
  SamplingParams sp = [] {
    SamplingParams p;
    p.temperature = 0.0f;  // a single prompt defaults to greedy
    return p;
  }();
  bool ignore_eos_flag = false, no_special = false;
  EngineFlags engine;
};

void run_single(Opts& o) {
  o.sp.max_tokens = o.max_tokens;
  o.sp.ignore_eos = o.ignore_eos_flag;
  try {
    o.sp.validate();
  } catch (const Error& e) {  // "top_p: must be in (0, 1]" -> "--top-p: ...": the flag it came from
    std::string m = e.what();
    for (size_t i = 0; i < m.size() && m[i] != ':'; ++i)
      if (m[i] == '_') m[i] = '-';
    throw Error("--" + m);
  }
  std::vector<std::string> ignored;
  EngineConfig ec = o.engine.resolve(&ignored);
  print_not_applicable(ignored);
  Model model(o.dirs.model, o.engine.model.options());
  if (const std::string d = describe_model_flags(o.engine.model, model); !d.empty())
    std::fprintf(stderr, "[m3serve] %s\n", d.c_str());
  const ModelConfig& c = model.config();
  Tokenizer tok = Tokenizer::from_dir(o.dirs.tokenizer);
  std::vector<int32_t> ids = tok.encode(o.prompt, !o.no_special);
  if (ids.empty()) throw Error("--prompt: encodes to no tokens");
  for (int32_t id : ids)
    if (id >= c.vocab)
      throw Error("--prompt: token id " + std::to_string(id) + " is outside the model's vocabulary (" +
                  std::to_string(c.vocab) + ")");
  // One request through the engine (paged KV, every engine flag applies), streamed step by step. Without
  // --kv-cache-memory the pool holds what the request needs (its memory is committed at start).
  ec.kv_tokens_needed = int64_t(ids.size()) + o.max_tokens;
  Engine engine(model, &tok, ec);
  if (engine.speculative()) std::fprintf(stderr, "[m3serve] %s\n", engine.describe().c_str());
  SamplingParams sp = o.sp;
  TextOptions shown;  // special tokens printed (--prompt has no stop strings)
  shown.skip_special = false;
  engine.add_request("0", ids, sp, shown);
  size_t generated = 0;
  std::string finish = "length";
  const auto t0 = clock_type::now();
  auto t1 = t0;
  while (engine.has_work()) {
    for (const RequestOutput& r : engine.step()) {
      if (generated == 0 && !r.new_tokens.empty()) t1 = clock_type::now();
      std::fwrite(r.new_text.data(), 1, r.new_text.size(), stdout);
      std::fflush(stdout);
      generated += r.new_tokens.size();
      if (r.finished) finish = finish_reason_name(r.finish_reason);
    }
  }
  std::fputc('\n', stdout);
  const auto t2 = clock_type::now();
  const double pre_s = std::chrono::duration<double>(t1 - t0).count();
  const double dec_s = std::chrono::duration<double>(t2 - t1).count();
  // Decode tokens = tokens after the first (the first comes from the prefill's logits).
  const double steps = generated > 1 ? double(generated - 1) : 0.0;
  const double tps = steps > 0 && dec_s > 0 ? steps / dec_s : 0.0;
  const double gbs = tps * model.weights().active_bytes_per_token() / 1e9;
  std::fprintf(stderr,
               "\n[m3serve] prompt %zu tokens, prefill %.3f s (%.1f tokens/s); generated %zu tokens (%s); decode "
               "%.2f tokens/s, %.2f GB/s achieved (%.1f MB of weights read per token); %d threads, kernels %s\n",
               ids.size(), pre_s, double(ids.size()) / pre_s, generated, finish.c_str(), tps, gbs,
               model.weights().active_bytes_per_token() / 1e6, omp_get_max_threads(), cpu_ops().name);
  if (engine.speculative()) std::fprintf(stderr, "[m3serve] %s\n", engine.spec_summary().c_str());
}

void run_batch(Opts& o) {
  if (o.output.empty()) throw Error("--input needs --output FILE.jsonl");
  std::vector<std::string> ignored;
  EngineConfig ec = o.engine.resolve(&ignored);
  print_not_applicable(ignored);
  Model model(o.dirs.model, o.engine.model.options());
  if (const std::string d = describe_model_flags(o.engine.model, model); !d.empty())
    std::fprintf(stderr, "[m3serve] %s\n", d.c_str());
  Tokenizer tok = Tokenizer::from_dir(o.dirs.tokenizer);
  std::ifstream in(o.input);
  if (!in) throw Error(o.input + ": cannot open");
  // A line that cannot run (bad JSON, a bad or unsupported field, more tokens than --max-model-len)
  // gets an {"error": ...} line in its place; the others go on.
  std::vector<OfflineRequest> reqs;
  std::vector<std::string> errors;
  const SamplingParams defaults = generation_defaults(o.dirs.model);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = o.input + " line " + std::to_string(n);
    reqs.emplace_back();
    errors.emplace_back();
    try {
      nlohmann::ordered_json j;
      try {
        j = nlohmann::ordered_json::parse(line);
      } catch (const std::exception& e) {
        throw Error(where + ": not valid JSON (" + e.what() + ")");
      }
      reqs.back() = parse_offline_request(j, tok, model.config().vocab, where, defaults);
    } catch (const Error& e) {
      errors.back() = e.what();
    }
  }
  // Without --kv-cache-memory the pool holds every request at once (prompt + max_tokens each).
  size_t valid = 0;
  for (size_t i = 0; i < reqs.size(); ++i)
    if (errors[i].empty()) {
      ec.kv_tokens_needed += int64_t(reqs[i].prompt_ids.size()) + reqs[i].params.max_tokens;
      ++valid;
    }
  ec.kv_sequences = int(std::max<size_t>(valid, 1));
  Engine engine(model, &tok, ec);
  std::fprintf(stderr, "[m3serve] %s\n", engine.describe().c_str());
  struct Result {
    std::vector<int32_t> ids;
    std::string text;
    std::string finish;
    int64_t cached = 0;
    std::vector<TokenLogprob> lps;
  };
  std::vector<Result> results(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (!errors[i].empty()) continue;
    try {
      engine.add_request(std::to_string(i), reqs[i].prompt_ids, reqs[i].params);
    } catch (const Error& e) {
      errors[i] = o.input + " request " + std::to_string(i + 1) + ": " + e.what();
    }
  }
  const auto t0 = clock_type::now();
  int64_t generated = 0;
  while (engine.has_work()) {
    for (auto& out : engine.step()) {
      Result& r = results[std::stoul(out.request_id)];
      r.ids.insert(r.ids.end(), out.new_tokens.begin(), out.new_tokens.end());
      r.lps.insert(r.lps.end(), out.new_logprobs.begin(), out.new_logprobs.end());
      r.text += out.new_text;
      r.cached = out.num_cached_tokens;
      generated += int64_t(out.new_tokens.size());
      if (out.finished) r.finish = finish_reason_name(out.finish_reason);
    }
  }
  const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  std::ofstream out(o.output);
  if (!out) throw Error(o.output + ": cannot open for writing");
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    nlohmann::json j;
    if (!errors[i].empty()) {
      j["error"] = errors[i];
      out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      std::fprintf(stderr, "[m3serve] error: %s\n", errors[i].c_str());
      continue;
    }
    j["text"] = r.text;
    j["token_ids"] = r.ids;
    j["finish_reason"] = r.finish;
    j["num_cached_tokens"] = r.cached;
    if (!r.lps.empty()) {
      nlohmann::json lj = nlohmann::json::array();
      for (const auto& lp : r.lps) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& [id, v] : lp.top) top.push_back({{"token_id", id}, {"logprob", v}});
        lj.push_back({{"token_id", lp.token}, {"logprob", lp.logprob}, {"top_logprobs", top}});
      }
      j["logprobs"] = lj;
    }
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  const EngineStats st = engine.stats();
  std::fprintf(stderr,
               "[m3serve] %zu requests, %lld output tokens in %.2f s: %.2f output tokens/s; %lld steps, prefix cache "
               "%lld/%lld tokens hit, %lld preemptions\n",
               reqs.size(), (long long)generated, secs, double(generated) / secs, (long long)st.steps,
               (long long)st.prefix_hits, (long long)st.prefix_queries, (long long)st.preemptions);
  if (st.tail_steps)
    std::fprintf(stderr, "[m3serve] %lld steps read prompts past --step-latency-factor, holding up %lld inter-token "
                 "latencies (--step-latency-tail-share)\n", (long long)st.tail_steps, (long long)st.tail_held);
  if (engine.speculative()) std::fprintf(stderr, "[m3serve] %s\n", engine.spec_summary().c_str());
  const size_t failed = reqs.size() - size_t(std::count(errors.begin(), errors.end(), std::string()));
  if (failed)
    std::fprintf(stderr, "[m3serve] %zu of %zu requests failed: their lines in %s hold {\"error\": ...}\n", failed,
                 reqs.size(), o.output.c_str());
}

}  // namespace

void register_generate(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Complete one prompt (streamed), or a JSONL file of requests in a batch");
  auto o = std::make_shared<Opts>();
  sub->add_option("--model", o->model, "Checkpoint directory or Hugging Face Hub id (ORG/NAME)")->required();
  auto* prompt = sub->add_option("--prompt", o->prompt, "Prompt text (special tokens written in it are recognised)");
  auto* input = sub->add_option("--input", o->input, "JSONL requests: {\"prompt\"|\"prompt_token_ids\", sampling fields}");
  prompt->excludes(input);
  sub->add_option("--output", o->output, "JSONL results, in input order (with --input)")->excludes(prompt);
  // The sampling flags are --prompt's: an --input line carries its own fields, so with --input they are
  // refused by name (CLI11's "excludes") instead of being ignored.
  std::vector<CLI::Option*> single = {
      sub->add_option("--max-tokens", o->max_tokens, "Tokens to generate (--prompt)")->check(CLI::Range(1, 1 << 24)),
      sub->add_option("--temperature", o->sp.temperature, "0 = greedy (--prompt)"),
      sub->add_option("--top-p", o->sp.top_p, "Nucleus sampling mass (--prompt)"),
      sub->add_option("--top-k", o->sp.top_k, "Keep the k most likely tokens, 0 = all (--prompt)"),
      sub->add_option("--seed", o->sp.seed, "Sampling seed (--prompt)")->check(non_negative_number()),
      sub->add_flag("--ignore-eos", o->ignore_eos_flag, "Keep generating past the end-of-sequence token (--prompt)"),
      sub->add_flag("--no-special", o->no_special, "Treat special-token text in the prompt as plain text (--prompt)")};
  for (CLI::Option* opt : single) opt->excludes(input);
  add_engine_flags(sub, o->engine);
  add_tokenizer_ref_flags(sub, o->engine.model.ref);
  sub->callback([o, sub] {
    if (o->input.empty() && o->prompt.empty()) throw Error("generate needs --prompt TEXT or --input FILE.jsonl");
    o->sp.has_seed = sub->count("--seed") > 0;  // else the engine draws a seed of its own
    o->engine.resolve();  // flag errors before a download
    o->engine.model.options();
    o->dirs = resolve_model_dirs(o->engine.model.ref, o->model);
    if (!o->input.empty()) {
      run_batch(*o);
    } else if (!o->prompt.empty()) {
      run_single(*o);
    } else {
      throw Error("generate needs --prompt TEXT or --input FILE.jsonl");
    }
  });
}

}  // namespace m3::cli
