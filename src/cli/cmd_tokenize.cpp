// The `tokenize` and `detokenize` subcommands: text <-> token ids with a model directory's
// tokenizer.json, for one string on the command line or a JSON-lines file.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "base/error.h"
#include "tokenizer/tokenizer.h"

namespace m3::cli {

namespace {

using json = nlohmann::json;

struct TokenizeOpts {
  std::string model, text, jsonl;
  bool no_special = false;
};

struct DetokenizeOpts {
  std::string model, ids, jsonl;
  bool skip_special = false;
};

void print_line(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
}

std::string ids_json(const std::vector<int32_t>& ids) { return json(ids).dump(); }

// Reads a JSON value of the expected shape; `where` names the source for error messages.
std::vector<int32_t> parse_ids(const std::string& s, const std::string& where) {
  json j;
  try {
    j = json::parse(s);
  } catch (const json::exception& e) {
    throw Error(where + ": expected a JSON array of token ids (" + e.what() + ")");
  }
  if (!j.is_array()) throw Error(where + ": expected a JSON array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (const json& v : j) {
    if (!v.is_number_integer()) throw Error(where + ": expected integer token ids, got " + v.dump());
    const auto x = v.get<int64_t>();
    if (x < INT32_MIN || x > INT32_MAX) throw Error(where + ": token id " + std::to_string(x) + " is out of range");
    ids.push_back(static_cast<int32_t>(x));
  }
  return ids;
}

// Calls fn(line, where) for each non-blank line of a JSON-lines file.
template <typename Fn>
void for_each_line(const std::string& path, Fn fn) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open file");
  std::string line;
  size_t n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    fn(line, path + ":" + std::to_string(n));
  }
}

void check_one_source(bool a, bool b, const char* cmd, const char* opt_a) {
  if (a == b)
    throw Error(std::string(cmd) + ": give exactly one of " + opt_a + " and --jsonl");
}

void run_tokenize(const TokenizeOpts& o, bool text_given) {
  check_one_source(text_given, !o.jsonl.empty(), "tokenize", "--text");
  const Tokenizer tok = Tokenizer::from_dir(o.model);
  const bool parse_special = !o.no_special;
  if (text_given) {
    print_line(ids_json(tok.encode(o.text, parse_special)));
    return;
  }
  for_each_line(o.jsonl, [&](const std::string& line, const std::string& where) {
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw Error(where + ": expected a JSON string (" + e.what() + ")");
    }
    if (!j.is_string()) throw Error(where + ": expected a JSON string");
    print_line(ids_json(tok.encode(j.get_ref<const std::string&>(), parse_special)));
  });
}

void run_detokenize(const DetokenizeOpts& o, bool ids_given) {
  check_one_source(ids_given, !o.jsonl.empty(), "detokenize", "--ids");
  const Tokenizer tok = Tokenizer::from_dir(o.model);
  if (ids_given) {
    print_line(tok.decode(parse_ids(o.ids, "--ids"), o.skip_special));
    return;
  }
  for_each_line(o.jsonl, [&](const std::string& line, const std::string& where) {
    const std::string text = tok.decode(parse_ids(line, where), o.skip_special);
    print_line(json(text).dump(-1, ' ', false, json::error_handler_t::replace));
  });
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto topts = std::make_shared<TokenizeOpts>();
  CLI::App* t = app.add_subcommand("tokenize", "Encode text to token ids (one JSON array per line)");
  t->add_option("--model", topts->model, "Model directory holding tokenizer.json")->required();
  CLI::Option* text = t->add_option("--text", topts->text, "Text to encode");
  t->add_option("--jsonl", topts->jsonl, "File with one JSON string per line")->excludes(text);
  t->add_flag("--no-special", topts->no_special, "Encode special-token text as ordinary text");
  t->callback([topts, text] { run_tokenize(*topts, text->count() > 0); });

  auto dopts = std::make_shared<DetokenizeOpts>();
  CLI::App* d = app.add_subcommand("detokenize", "Decode token ids to text (text plus a newline)");
  d->add_option("--model", dopts->model, "Model directory holding tokenizer.json")->required();
  CLI::Option* ids = d->add_option("--ids", dopts->ids, "Token ids as a JSON array, e.g. \"[1,2,3]\"");
  d->add_option("--jsonl", dopts->jsonl, "File with one JSON array of ids per line (prints JSON strings)")
      ->excludes(ids);
  d->add_flag("--skip-special", dopts->skip_special, "Leave special tokens out of the text");
  d->callback([dopts, ids] { run_detokenize(*dopts, ids->count() > 0); });
}

}  // namespace m3::cli
