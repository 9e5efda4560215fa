// request_fuzz: a structure-aware fuzzer over the server's request path, run for a bounded time by ctest
// (fuzz.requests) over the corpus kept in tests/data/fuzz/requests.
//
// Each input is a request body: it goes through what the server does with one (the limited JSON parse,
// parse_chat_request, parse_completion_request, the per-request limits, render_messages for /tokenize,
// the Responses and Messages translators feeding parse_chat_request, which all run the chat template's
// JSON->jinja conversion) and through jinja::Value::from_json. The only
// outcomes allowed are a result or a client error (ApiError 400/404/413, m3::Error, nlohmann's
// parse_error); anything else, a crash (SIGSEGV, stack overflow, abort) or an input that takes more than
// a few seconds fails the run and leaves the input in the output directory.
//
// Why not libFuzzer: the project's libraries are built with GCC 12, and libFuzzer's coverage needs the
// code under test compiled by clang with -fsanitize=fuzzer, i.e. a second build of every layer. This
// harness is the GCC equivalent: mutations over a kept corpus, structure-aware (JSON trees edited with
// OpenAI field names, boundary numbers, deep nesting, crossover between corpus entries, plus byte-level
// edits of the text), with the outcome (status, field, message shape) standing in for coverage: an input
// with an outcome not seen before joins the corpus. `--save DIR` writes those inputs, for refreshing the
// kept corpus.
//
// Usage: request_fuzz [--seconds S] [--seed N] [--out DIR] [--save DIR] CORPUS_DIR
#include <signal.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/jinja/jinja.h"
#include "chat/json_depth.h"
#include "base/error.h"
#include "server/errors.h"
#include "server/messages_api.h"
#include "server/openai_protocol.h"
#include "server/request_limits.h"
#include "server/responses_api.h"
#include "tokenizer/tokenizer.h"

using namespace m3;
using namespace m3::server;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The input being run, for the crash handler (written with async-signal-safe calls only).
std::string g_current;
char g_crash_path[4096] = "request_fuzz_crash.json";

void on_crash(int sig) {
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ssize_t w = ::write(fd, g_current.data(), g_current.size());
    (void)w;
    ::close(fd);
  }
  const char msg[] = "request_fuzz: crashed on an input; it is saved in ";
  ssize_t w = ::write(2, msg, sizeof msg - 1);
  w = ::write(2, g_crash_path, std::strlen(g_crash_path));
  w = ::write(2, "\n", 1);
  (void)w;
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_crash_handler() {
  // An alternate stack, so that a stack overflow can still be reported.
  static std::vector<char> alt(1 << 16);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_crash;
  sa.sa_flags = SA_ONSTACK;
  for (int s : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) sigaction(s, &sa, nullptr);
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---- mutations ----

const std::vector<std::string>& field_names() {
  static const std::vector<std::string> v = {
      "model", "messages", "prompt", "n", "max_tokens", "max_completion_tokens", "stop", "stop_token_ids",
      "logprobs", "top_logprobs", "temperature", "top_p", "top_k", "min_p", "seed", "stream", "stream_options",
      "include_usage", "continuous_usage_stats", "tools", "tool_choice", "response_format", "echo",
      "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "ignore_eos",
      "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens", "logit_bias", "user",
      "parallel_tool_calls", "reasoning_effort", "separate_reasoning", "repetition_penalty", "presence_penalty",
      "frequency_penalty", "min_tokens", "prompt_logprobs", "guided_json", "role", "content", "name",
      "tool_calls", "tool_call_id", "reasoning_content", "function", "arguments", "type", "text", "image_url",
      "input_audio", "parameters", "properties", "thinking_mode", "tokens", "add_special_tokens", "id"};
  return v;
}

std::string rand_text(std::mt19937_64& rng, size_t max_len) {
  static const std::string pool = "abc xyz 0123456789 \n\t\"'<>/={}[]\\&;:,.-_~!%|";
  static const std::vector<std::string> marks = {"]<]minimax[>[", "<tool_call>", "</tool_call>", "<invoke name=\"",
                                                 "<mm:think>", "</mm:think>", "[e~[", "]~b]", "{{", "{%", "\xc3\xa9",
                                                 "\xe2\x82", "\xff", std::string(1, '\0'), "\xf0\x9f\x98\x80"};
  std::string s;
  const size_t n = rng() % (max_len + 1);
  while (s.size() < n) s += rng() % 4 ? std::string(1, pool[rng() % pool.size()]) : marks[rng() % marks.size()];
  return s;
}

ojson interesting_scalar(std::mt19937_64& rng) {
  switch (rng() % 24) {
    case 0: return nullptr;
    case 1: return bool(rng() & 1);
    case 2: return 0;
    case 3: return -1;
    case 4: return 1;
    case 5: return int64_t(INT32_MAX);
    case 6: return int64_t(INT32_MAX) + 1;
    case 7: return (int64_t(1) << 32) + 104;
    case 8: return std::numeric_limits<int64_t>::max();
    case 9: return std::numeric_limits<int64_t>::min();
    case 10: return std::numeric_limits<uint64_t>::max();
    case 11: return 1e308;
    case 12: return -0.0;
    case 13: return 0.5;
    case 14: return 2.0;
    case 15: return 1e-320;
    case 16: return "";
    case 17: return std::string(size_t(1 + rng() % 20000), 'a');
    case 18: return rand_text(rng, 40);
    case 19: return int64_t(rng() % 300) - 20;
    case 20: return ojson::array();
    case 21: return ojson::object();
    case 22: return field_names()[rng() % field_names().size()];
    default: return rand_text(rng, 8);
  }
}

// A small value of a shape the parsers look for.
ojson shaped_value(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0: return ojson::array({{{"role", "user"}, {"content", rand_text(rng, 20)}}});
    case 1: return ojson::array({{{"type", "text"}, {"text", rand_text(rng, 10)}}});
    case 2: return ojson::array({{{"type", "image_url"}, {"image_url", {{"url", "data:x"}}}}});
    case 3: return ojson::array({1, 2, 3});
    case 4: {
      ojson a = ojson::array();
      for (int i = 0, n = int(rng() % 200); i < n; ++i) a.push_back(rand_text(rng, 6));
      return a;
    }
    case 5: return {{"type", "function"}, {"function", {{"name", "f"}, {"arguments", rand_text(rng, 30)}}}};
    case 6: return {{"include_usage", bool(rng() & 1)}};
    case 7: {
      ojson a = ojson::array();
      for (int i = 0, n = int(rng() % 100); i < n; ++i) a.push_back(int64_t(rng() % 70000) - 10);
      return a;
    }
    case 8: return {{"type", "json_schema"}};
    default: return interesting_scalar(rng);
  }
}

// Nested by moves only (a copy would recurse once per level).
ojson nest(ojson v, int depth, bool arrays) {
  for (int i = 0; i < depth; ++i) {
    ojson w = arrays ? ojson::array() : ojson::object();
    if (arrays) w.push_back(std::move(v));
    else w["a"] = std::move(v);
    v = std::move(w);
  }
  return v;
}

void pointers(const ojson& j, const ojson::json_pointer& at, std::vector<ojson::json_pointer>& out, int depth) {
  out.push_back(at);
  if (depth > 40) return;  // inputs can be deep; edits stay near the top
  if (j.is_object())
    for (auto& [k, v] : j.items()) pointers(v, at / k, out, depth + 1);
  else if (j.is_array())
    for (size_t i = 0; i < j.size() && i < 64; ++i) pointers(j[i], at / i, out, depth + 1);
}

ojson mutate_tree(ojson body, const std::vector<ojson>& corpus, std::mt19937_64& rng) {
  for (int e = 0, edits = 1 + int(rng() % 4); e < edits; ++e) {
    std::vector<ojson::json_pointer> ps;
    pointers(body, ojson::json_pointer(), ps, 0);
    const auto p = ps[rng() % ps.size()];
    ojson& v = body[p];
    switch (rng() % 10) {
      case 0: v = interesting_scalar(rng); break;
      case 1: v = shaped_value(rng); break;
      case 2:
        if (!p.empty() && body[p.parent_pointer()].is_object()) body[p.parent_pointer()].erase(p.back());
        break;
      case 3: {
        const int d = rng() % 4 == 0 ? 100 + int(rng() % 300) : 1 + int(rng() % 3);
        v = nest(std::move(v), d, rng() & 1);
        break;
      }
      case 4:
        if (v.is_object()) v[field_names()[rng() % field_names().size()]] = shaped_value(rng);
        else if (v.is_array() && !v.empty()) v.push_back(v[rng() % v.size()]);
        break;
      case 5:
        if (v.is_array() && !v.empty() && v.size() < 4096) {  // grow: fan-out limits
          const ojson x = v[rng() % v.size()];
          for (int i = 0, n = 1 + int(rng() % 64); i < n; ++i) v.push_back(x);
        }
        break;
      case 6: {  // crossover: a subtree of another corpus entry
        const ojson& other = corpus[rng() % corpus.size()];
        std::vector<ojson::json_pointer> qs;
        pointers(other, ojson::json_pointer(), qs, 0);
        v = other[qs[rng() % qs.size()]];
        break;
      }
      case 7:
        if (v.is_object() || body.is_object()) {
          ojson& o = v.is_object() ? v : body;
          o[field_names()[rng() % field_names().size()]] = interesting_scalar(rng);
        }
        break;
      case 8:
        if (v.is_string()) v = v.get<std::string>() + rand_text(rng, 12);
        else v = rand_text(rng, 12);
        break;
      default:
        if (v.is_number_integer()) v = int64_t(uint64_t(v.get<int64_t>()) + rng() % 5 - 2);  // wraps, no UB
        else v = interesting_scalar(rng);
    }
  }
  return body;
}

std::string mutate_bytes(std::string s, std::mt19937_64& rng) {
  static const std::vector<std::string> toks = {"[", "]", "{", "}", ",", ":", "\"", "\\u0000", "\\ud800", "1e999",
                                                "-", "null", "[[[[[[[[", "\"n\":", "\"n\":1,", "\xff"};
  for (int e = 0, n = 1 + int(rng() % 4); e < n && !s.empty(); ++e) {
    const size_t pos = rng() % s.size();
    switch (rng() % 5) {
      case 0: s[pos] = char(rng() & 0xff); break;
      case 1: s.erase(pos, 1 + rng() % 8); break;
      case 2: s.insert(pos, toks[rng() % toks.size()]); break;
      case 3: s.insert(pos, std::string(size_t(1 + rng() % 100000), rng() & 1 ? '[' : '{')); break;
      default: s.resize(pos);
    }
  }
  return s;
}

// ---- the target ----

struct Target {
  Tokenizer tok;
  ServerContext ctx;
  RequestLimits limits;
  explicit Target(const std::string& data)
      : tok(Tokenizer::from_dir(data + "/tokenizer/m3-tiny")) {
    ctx.served_names = {"m", "tiny"};
    ctx.tok = &tok;
    ctx.max_model_len = 4096;
    ctx.vocab = tok.vocab_size();
    ctx.chat_template = std::make_shared<chat::ChatTemplate>(read_file(data + "/chat/MiniMax-M3.jinja"));
    ctx.bos_token = "]~b]";
    ctx.eos_token = "[e~[";
    ctx.reasoning = chat::ReasoningFormat::MiniMaxM3;
    ctx.tool = chat::ToolFormat::MiniMaxM3;
    ctx.enable_auto_tool_choice = true;
  }
};

// The outcome's shape, not its data: the words before anything quoted (messages quote the client's
// values, in quotes; the field is in the param), digits out, at most 40 characters.
std::string shape(const std::string& msg) {
  std::string s;
  bool quoted = false;
  for (char c : msg) {
    if (c == '`' || c == '"' || c == '\n' || s.size() >= 40) break;
    if (c == '\'') {
      quoted = !quoted;
      s += c;
    } else if (!quoted && !std::isdigit(static_cast<unsigned char>(c))) {
      s += c;
    }
  }
  return s;
}

struct Bug : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs one parser; returns the outcome's signature, throws Bug for a disallowed outcome.
template <class Fn>
std::string outcome(const char* what, Fn fn) {
  try {
    return std::string(what) + ":ok:" + fn();
  } catch (const ApiError& e) {
    if (e.status != 400 && e.status != 404 && e.status != 413)
      throw Bug(std::string(what) + ": status " + std::to_string(e.status) + ": " + e.what());
    return std::string(what) + ":" + std::to_string(e.status) + ":" + e.param + ":" + shape(e.what());
  } catch (const Error& e) {
    return std::string(what) + ":error:" + shape(e.what());
  } catch (const nlohmann::json::parse_error&) {
    return std::string(what) + ":syntax";
  } catch (const std::exception& e) {
    throw Bug(std::string(what) + ": unexpected " + typeid(e).name() + ": " + e.what());
  }
}

// The outcome of each parser (a feature each, as coverage counts edges: an input is kept when any is new).
std::vector<std::string> run_one(Target& t, const std::string& text) {
  std::vector<std::string> sig;
  ojson body;
  try {
    body = chat::parse_json_limited(text);
  } catch (const chat::JsonTooDeep&) {
    return {"deep"};
  } catch (const nlohmann::json::exception&) {  // syntax, or a number out of range (1e999)
    return {"syntax"};
  }
  sig.push_back(outcome("chat", [&] {
    const ParsedRequest r = parse_chat_request(body, t.ctx);
    if (r.prompts.empty() || r.prompts[0].empty()) throw Bug("chat: empty prompt accepted");
    if (r.params.max_tokens < 1) throw Bug("chat: max_tokens < 1 accepted");
    r.params.validate();
    check_request_limits(r, t.limits);
    return std::to_string(r.n > 1) + std::to_string(r.stream) + std::to_string(r.logprobs);
  }));
  sig.push_back(outcome("completion", [&] {
    const ParsedRequest r = parse_completion_request(body, t.ctx);
    if (r.prompts.empty()) throw Bug("completion: no prompts accepted");
    for (auto& p : r.prompts)
      if (p.empty()) throw Bug("completion: an empty prompt accepted");
    if (r.params.max_tokens < 1) throw Bug("completion: max_tokens < 1 accepted");
    r.params.validate();
    check_request_limits(r, t.limits);
    return std::to_string(r.prompts.size() > 1) + std::to_string(r.n > 1) + std::to_string(r.echo);
  }));
  // The Responses and Messages translators, then the chat path they feed.
  sig.push_back(outcome("responses", [&] {
    const ParsedRequest r = parse_chat_request(responses_to_chat(body).chat, t.ctx);
    check_request_limits(r, t.limits);
    return std::to_string(r.stream);
  }));
  sig.push_back(outcome("messages", [&] {
    const ParsedRequest r = parse_chat_request(messages_to_chat(body), t.ctx);
    check_request_limits(r, t.limits);
    return std::to_string(r.stream);
  }));
  if (body.is_object() && body.contains("messages"))
    sig.push_back(outcome("tokenize", [&] { return std::to_string(render_messages(body, t.ctx, true).empty()); }));
  sig.push_back(outcome("from_json", [&] {
    const jinja::Value v = jinja::Value::from_json(body);
    return std::string(v.is_object() ? "o" : "x");
  }));
  return sig;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 30;
  uint64_t seed = 1;
  std::string corpus_dir, out_dir = ".", save_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "request_fuzz: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seconds") seconds = std::stod(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--out") out_dir = next();
    else if (a == "--save") save_dir = next();
    else if (!a.empty() && a[0] != '-') corpus_dir = a;
    else {
      std::fprintf(stderr, "usage: request_fuzz [--seconds S] [--seed N] [--out DIR] [--save DIR] CORPUS_DIR\n");
      return 2;
    }
  }
  if (corpus_dir.empty() || !fs::is_directory(corpus_dir)) {
    std::fprintf(stderr, "request_fuzz: no corpus directory given (or %s is not one)\n", corpus_dir.c_str());
    return 2;
  }
  fs::create_directories(out_dir);
  std::snprintf(g_crash_path, sizeof g_crash_path, "%s/request_fuzz_crash.json", out_dir.c_str());
  install_crash_handler();

  Target t(M3_TEST_DATA);
  std::vector<std::string> texts;
  for (auto& e : fs::directory_iterator(corpus_dir))
    if (e.is_regular_file()) texts.push_back(read_file(e.path()));
  std::sort(texts.begin(), texts.end());
  std::vector<ojson> trees;
  for (auto& s : texts) {
    ojson j = ojson::parse(s, nullptr, false);
    if (!j.is_discarded()) trees.push_back(std::move(j));
  }
  if (trees.empty()) {
    std::fprintf(stderr, "request_fuzz: %s holds no JSON inputs\n", corpus_dir.c_str());
    return 2;
  }

  std::mt19937_64 rng(seed);
  std::set<std::string> seen;
  size_t runs = 0, added = 0;
  double slowest = 0;
  auto run = [&](const std::string& text) -> bool {  // true: a new outcome
    g_current = text;
    const auto t0 = Clock::now();
    std::vector<std::string> sig;
    try {
      sig = run_one(t, text);
    } catch (const Bug& b) {
      const std::string path = out_dir + "/request_fuzz_failure.json";
      std::ofstream(path, std::ios::binary) << text;
      std::fprintf(stderr, "request_fuzz: FAILED after %zu runs: %s\n  the input is in %s\n", runs, b.what(), path.c_str());
      std::exit(1);
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    slowest = std::max(slowest, dt);
    if (dt > 5.0) {
      const std::string path = out_dir + "/request_fuzz_slow.json";
      std::ofstream(path, std::ios::binary) << text;
      std::fprintf(stderr, "request_fuzz: FAILED: one input took %.1f s (input in %s)\n", dt, path.c_str());
      std::exit(1);
    }
    ++runs;
    bool fresh = false;
    for (auto& x : sig) fresh |= seen.insert(x).second;
    return fresh;
  };
  for (auto& s : texts) run(s);  // the kept corpus first: a regression shows on its own input
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    const ojson& base = trees[rng() % trees.size()];
    std::string text;
    const int kind = int(rng() % 10);
    ojson tree = mutate_tree(base, trees, rng);
    text = kind < 8 ? tree.dump(-1, ' ', false, ojson::error_handler_t::replace)
                    : mutate_bytes(base.dump(-1, ' ', false, ojson::error_handler_t::replace), rng);
    if (run(text) && kind < 8 && trees.size() < 4000) {
      trees.push_back(std::move(tree));
      ++added;
      if (!save_dir.empty()) {
        fs::create_directories(save_dir);
        std::ofstream(save_dir + "/new_" + std::to_string(added) + ".json", std::ios::binary) << text;
      }
    }
  }
  if (std::getenv("REQUEST_FUZZ_SIGNATURES"))
    for (auto& x : seen) std::printf("%s\n", x.c_str());
  std::printf("request_fuzz: %zu inputs in %.0f s, %zu distinct outcomes, %zu inputs added to the corpus, slowest %.3f s\n",
              runs, seconds, seen.size(), added, slowest);
  return 0;
}
