// m3::Tokenizer: loading tokenizer.json, added-token matching, the encode pipeline and decoding.
#include "tokenizer/tokenizer.h"

#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace m3 {

using json = nlohmann::json;

namespace {

// The regex a ByteLevel pre-tokenizer applies itself when `use_regex` is true (GPT-2's).
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// One pre-tokenizer step.
struct PreStep {
  bool byte_level = false;         // ByteLevel step (else Split)
  bool add_prefix_space = false;   // ByteLevel only
  std::optional<tok::RegexSplitter> splitter;  // Split, or ByteLevel with use_regex
};

struct AddedToken {
  int32_t id;
  std::string content;
  bool special, lstrip, rstrip;
};

// Byte trie over the added tokens' contents, for leftmost-longest matching.
struct Trie {
  struct Node {
    std::unordered_map<uint8_t, int32_t> next;
    int32_t token = -1;  // index into added tokens
  };
  std::vector<Node> nodes{Node{}};
  void insert(std::string_view s, int32_t token) {
    int32_t n = 0;
    for (char c : s) {
      auto it = nodes[n].next.find(static_cast<uint8_t>(c));
      if (it == nodes[n].next.end()) {
        nodes.push_back(Node{});
        const auto fresh = static_cast<int32_t>(nodes.size() - 1);
        nodes[n].next.emplace(static_cast<uint8_t>(c), fresh);
        n = fresh;
      } else {
        n = it->second;
      }
    }
    if (nodes[n].token < 0) nodes[n].token = token;
  }
};

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open file");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

struct Tokenizer::Impl {
  std::string path;
  std::unordered_map<std::string, int32_t> vocab;  // tokenizer.json form -> id
  std::vector<std::string> bytes;                  // id -> raw bytes (decode form)
  std::vector<uint8_t> flags;                      // id -> kValid | kSpecial | kAdded
  static constexpr uint8_t kValid = 1, kSpecial = 2, kAdded = 4;
  tok::Bpe bpe;
  std::vector<PreStep> pre;
  std::vector<AddedToken> added;
  Trie trie;
  std::array<bool, 256> trie_first{};
  int32_t bos = -1, eos = -1;

  // Cache of piece -> ids for short pieces.
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;
  static constexpr size_t kCacheMaxEntries = 1 << 16;
  static constexpr size_t kCacheMaxPiece = 64;

  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // Leftmost-longest added-token match starting exactly at `pos`; index into `added` or -1.
  int32_t match_at(std::string_view text, size_t pos, bool parse_special, size_t& len) const;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  auto im = std::make_unique<Impl>();
  im->path = path;
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  }
  auto fail = [&](const std::string& what) { return Error(path + ": " + what); };
  try {
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
      throw fail("expected a Hugging Face tokenizer.json with a \"model\" object");
    const json& m = j["model"];
    if (m.value("type", std::string("BPE")) != "BPE")
      throw fail("model.type is \"" + m["type"].get<std::string>() + "\"; only BPE is supported");
    if (m.contains("byte_fallback") && m["byte_fallback"].is_boolean() && m["byte_fallback"].get<bool>())
      throw fail("model.byte_fallback = true is not supported (expected a byte-level BPE)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() && !m[k].get<std::string>().empty())
        throw fail(std::string("model.") + k + " is not supported");
    if (m.contains("ignore_merges") && m["ignore_merges"].is_boolean() && m["ignore_merges"].get<bool>())
      throw fail("model.ignore_merges = true is not supported");
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      throw fail("a normalizer is not supported (expected \"normalizer\": null)");
    if (!m.contains("vocab") || !m["vocab"].is_object()) throw fail("expected model.vocab to be an object");
    if (!m.contains("merges") || !m["merges"].is_array()) throw fail("expected model.merges to be an array");

    // Vocabulary.
    const json& vocab = m["vocab"];
    im->vocab.reserve(vocab.size() * 2);
    int32_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer()) throw fail("model.vocab[\"" + it.key() + "\"] is not an integer id");
      const auto id = it.value().get<int64_t>();
      if (id < 0 || id > (1 << 30)) throw fail("model.vocab[\"" + it.key() + "\"] has out-of-range id");
      im->vocab.emplace(it.key(), static_cast<int32_t>(id));
      max_id = std::max(max_id, static_cast<int32_t>(id));
    }
    // Added tokens.
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      if (!j["added_tokens"].is_array()) throw fail("expected added_tokens to be an array");
      for (const json& a : j["added_tokens"]) {
        if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["id"].is_number_integer() ||
            !a["content"].is_string())
          throw fail("each added_tokens entry needs an integer \"id\" and a string \"content\"");
        AddedToken t{a["id"].get<int32_t>(), a["content"].get<std::string>(), a.value("special", false),
                     a.value("lstrip", false), a.value("rstrip", false)};
        if (t.id < 0 || t.id > (1 << 30)) throw fail("added token \"" + t.content + "\" has out-of-range id");
        if (t.content.empty()) throw fail("added token " + std::to_string(t.id) + " has empty content");
        max_id = std::max(max_id, t.id);
        im->added.push_back(std::move(t));
      }
    }
    im->bytes.resize(static_cast<size_t>(max_id + 1));
    im->flags.assign(static_cast<size_t>(max_id + 1), 0);
    for (const auto& [s, id] : im->vocab) {
      im->bytes[id] = tok::byte_level_decode(s);
      im->flags[id] = Impl::kValid;
    }
    for (size_t i = 0; i < im->added.size(); ++i) {
      const AddedToken& t = im->added[i];
      // HF decodes added tokens through the ByteLevel decoder as well; for printable-ASCII or
      // space-containing contents this is the content itself.
      im->bytes[t.id] = tok::byte_level_decode(t.content);
      im->flags[t.id] = Impl::kValid | Impl::kAdded | (t.special ? Impl::kSpecial : 0);
      im->trie.insert(t.content, static_cast<int32_t>(i));
      im->trie_first[static_cast<uint8_t>(t.content[0])] = true;
    }

    // Single-byte tokens.
    for (int b = 0; b < 256; ++b) {
      std::string s;
      tok::append_utf8(s, tok::byte_to_codepoint(static_cast<uint8_t>(b)));
      auto it = im->vocab.find(s);
      if (it != im->vocab.end()) im->bpe.set_byte_id(static_cast<uint8_t>(b), it->second);
    }

    // Merges: ["a", "b"] pairs or "a b" strings.
    const json& merges = m["merges"];
    im->bpe.reserve(merges.size());
    std::string left, right, joined;
    int32_t rank = 0;
    for (const json& mg : merges) {
      if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
        left = mg[0].get_ref<const std::string&>();
        right = mg[1].get_ref<const std::string&>();
      } else if (mg.is_string()) {
        const auto& s = mg.get_ref<const std::string&>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) throw fail("merge " + std::to_string(rank) + " (\"" + s + "\") is not \"a b\"");
        left = s.substr(0, sp);
        right = s.substr(sp + 1);
      } else {
        throw fail("merge " + std::to_string(rank) + " is neither [\"a\", \"b\"] nor \"a b\"");
      }
      joined = left + right;
      auto il = im->vocab.find(left), ir = im->vocab.find(right), ij = im->vocab.find(joined);
      if (il == im->vocab.end() || ir == im->vocab.end() || ij == im->vocab.end())
        throw fail("merge " + std::to_string(rank) + " (\"" + left + "\", \"" + right +
                   "\") refers to a token missing from model.vocab");
      im->bpe.add_merge(il->second, ir->second, ij->second, rank);
      ++rank;
    }

    // Pre-tokenizer: Split / ByteLevel, alone or in a Sequence.
    if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
      throw fail("expected a pre_tokenizer (ByteLevel, or a Sequence with Split and ByteLevel)");
    std::vector<const json*> steps;
    const json& pt = j["pre_tokenizer"];
    if (pt.value("type", std::string()) == "Sequence") {
      if (!pt.contains("pretokenizers") || !pt["pretokenizers"].is_array())
        throw fail("pre_tokenizer Sequence without a \"pretokenizers\" array");
      for (const json& s : pt["pretokenizers"]) steps.push_back(&s);
    } else {
      steps.push_back(&pt);
    }
    bool has_byte_level = false;
    for (const json* s : steps) {
      const std::string type = s->value("type", std::string());
      PreStep step;
      if (type == "Split") {
        if (s->value("behavior", std::string()) != "Isolated")
          throw fail("pre_tokenizer Split behavior \"" + s->value("behavior", std::string()) +
                     "\" is not supported (expected \"Isolated\")");
        if (s->value("invert", false)) throw fail("pre_tokenizer Split with invert = true is not supported");
        const json& pat = s->contains("pattern") ? (*s)["pattern"] : json();
        if (pat.contains("Regex") && pat["Regex"].is_string())
          step.splitter.emplace(pat["Regex"].get<std::string>(), false, path);
        else if (pat.contains("String") && pat["String"].is_string())
          step.splitter.emplace(pat["String"].get<std::string>(), true, path);
        else
          throw fail("pre_tokenizer Split needs pattern.Regex or pattern.String");
      } else if (type == "ByteLevel") {
        if (has_byte_level) throw fail("pre_tokenizer has two ByteLevel steps");
        has_byte_level = true;
        step.byte_level = true;
        step.add_prefix_space = s->value("add_prefix_space", false);
        if (s->value("use_regex", true)) step.splitter.emplace(kGpt2Regex, false, path);
      } else {
        throw fail("pre_tokenizer type \"" + type + "\" is not supported (expected Split or ByteLevel)");
      }
      im->pre.push_back(std::move(step));
    }
    if (!has_byte_level) throw fail("pre_tokenizer has no ByteLevel step (expected a byte-level BPE)");
    if (j.contains("decoder") && j["decoder"].is_object() && j["decoder"].value("type", std::string()) != "ByteLevel")
      throw fail("decoder type \"" + j["decoder"].value("type", std::string()) + "\" is not supported (expected ByteLevel)");
  } catch (const json::exception& e) {
    throw fail(std::string("unexpected structure (") + e.what() + ")");
  }
  return Tokenizer(std::move(im));
}

Tokenizer Tokenizer::from_dir(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path tj = dir / "tokenizer.json";
  if (!fs::exists(tj)) throw Error(tj.string() + ": not found (expected a Hugging Face tokenizer.json in " + model_dir + ")");
  Tokenizer t = from_file(tj.string());
  const fs::path cfg = dir / "tokenizer_config.json";
  if (fs::exists(cfg)) {
    json c;
    try {
      c = json::parse(read_file(cfg.string()));
    } catch (const json::exception& e) {
      throw Error(cfg.string() + ": not valid JSON (" + e.what() + ")");
    }
    auto resolve = [&](const char* key) -> int32_t {
      if (!c.is_object() || !c.contains(key) || c[key].is_null()) return -1;
      const json& v = c[key];
      std::string s;
      if (v.is_string()) s = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string()) s = v["content"].get<std::string>();
      else throw Error(cfg.string() + ": " + key + " should be a string or an object with \"content\"");
      auto id = t.token_to_id(s);
      if (!id) throw Error(cfg.string() + ": " + key + " \"" + s + "\" is not a token of " + tj.string());
      return *id;
    };
    t.impl_->bos = resolve("bos_token");
    t.impl_->eos = resolve("eos_token");
  }
  return t;
}

int32_t Tokenizer::Impl::match_at(std::string_view text, size_t pos, bool parse_special, size_t& len) const {
  int32_t best = -1;
  int32_t n = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& nx = trie.nodes[n].next;
    auto it = nx.find(static_cast<uint8_t>(text[i]));
    if (it == nx.end()) break;
    n = it->second;
    const int32_t t = trie.nodes[n].token;
    if (t >= 0 && (parse_special || !added[t].special)) {
      best = t;
      len = i + 1 - pos;
    }
  }
  return best;
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > kCacheMaxPiece) {
    bpe.encode(piece, out);
    return;
  }
  const std::string key(piece);
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  bpe.encode(piece, out);
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= kCacheMaxEntries) cache.clear();
  cache.emplace(key, std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<std::string_view> pieces{text}, next;
  std::deque<std::string> storage;  // pieces that got a prefix space
  for (const PreStep& step : pre) {
    next.clear();
    for (std::string_view p : pieces) {
      if (step.byte_level && step.add_prefix_space && !p.empty() && p[0] != ' ') {
        storage.push_back(" " + std::string(p));
        p = storage.back();
      }
      if (step.splitter) step.splitter->split(p, next);
      else next.push_back(p);
    }
    pieces.swap(next);
  }
  for (std::string_view p : pieces) encode_piece(p, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const size_t bad = tok::find_invalid_utf8(text);
  if (bad != std::string_view::npos)
    throw Error("tokenizer: input text is not valid UTF-8 (bad byte at offset " + std::to_string(bad) + ")");
  const Impl& im = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  size_t seg = 0;  // start of the pending plain-text segment
  size_t i = 0;
  while (i < text.size()) {
    if (!im.trie_first[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    size_t len = 0;
    const int32_t t = im.match_at(text, i, parse_special, len);
    if (t < 0) {
      ++i;
      continue;
    }
    const AddedToken& at = im.added[t];
    size_t s = i, e = i + len;
    if (at.lstrip)
      while (s > seg && is_ascii_space(text[s - 1])) --s;
    if (at.rstrip)
      while (e < text.size() && is_ascii_space(text[e])) ++e;
    im.encode_plain(text.substr(seg, s - seg), out);
    out.push_back(at.id);
    seg = i = e;
  }
  im.encode_plain(text.substr(seg), out);
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (!is_valid(id))
    throw Error("tokenizer: unknown token id " + std::to_string(id) + " (vocabulary of " +
                std::to_string(vocab_size()) + ")");
  return impl_->bytes[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) {
    const std::string& b = token_bytes(id);
    if (skip_special && is_special(id)) continue;
    raw += b;
  }
  if (tok::is_valid_utf8(raw)) return raw;
  return tok::utf8_lossy(raw);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->bytes.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& t : impl_->added)
    if (t.content == token) return t.id;
  auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_valid(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->flags.size() && (impl_->flags[id] & Impl::kValid);
}

bool Tokenizer::is_special(int32_t id) const { return is_valid(id) && (impl_->flags[id] & Impl::kSpecial); }

std::string Tokenizer::token_string(int32_t id) const {
  if (!is_valid(id)) throw Error("token id " + std::to_string(id) + " is not in the vocabulary");
  if (impl_->flags[id] & Impl::kAdded)
    for (const AddedToken& t : impl_->added)
      if (t.id == id) return t.content;
  return tok::byte_level_encode(impl_->bytes[id]);
}

int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }

}  // namespace m3
