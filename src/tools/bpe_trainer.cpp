// Deterministic byte-level BPE trainer and HF tokenizer-file writer (see bpe_trainer.h).
// Written for make-model: the goal is a small, valid, reproducible tokenizer, not a good one,
// so training is the plain quadratic algorithm over a few kilobytes of built-in text.
#include "tools/bpe_trainer.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"

namespace m3 {

namespace {

using ojson = nlohmann::ordered_json;

// The pre-tokenizer regex of the M3 tokenizer.json (docs/model.md section 7).
const char* kSplitRegex =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

void put_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

ojson added_token_json(int64_t id, const std::string& content) {
  ojson t;
  t["id"] = id;
  t["content"] = content;
  t["single_word"] = false;
  t["lstrip"] = false;
  t["rstrip"] = false;
  t["normalized"] = false;
  t["special"] = true;
  return t;
}

}  // namespace

const std::vector<std::string>& m3_special_tokens() {
  static const std::vector<std::string> k = {
      "]~!b[", "[e~[", "]~b]", "]!p~[", "]!d~[", "<think>", "</think>",
      "<tool_call>", "</tool_call>", "]<]minimax[>[", "<mm:think>", "</mm:think>"};
  return k;
}

std::string gpt2_byte_symbol(uint8_t b) {
  // Printable bytes map to themselves; the other 68 bytes map, in byte order, to 256, 257, ...
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  uint32_t cp = b;
  if (!printable(b)) {
    uint32_t n = 0;
    for (int c = 0; c < b; ++c)
      if (!printable(c)) ++n;
    cp = 256 + n;
  }
  std::string s;
  put_utf8(s, cp);
  return s;
}

const std::string& bpe_builtin_text() {
  static const std::string k = R"(The river town woke slowly on the first cold morning of the year. Smoke rose from the chimneys, the baker opened his shutters, and the ferry sounded its horn twice before it left the landing. Children ran along the bank with their dogs, and the old men who sat on the bench by the bridge argued, as they always did, about the weather and the price of bread.
In the library at the end of the main street, a young woman was reading about the history of the town. She learned that the first settlers had arrived in 1843, that the bridge was built in 1901, and that the great flood of 1927 had carried away the mill, the school and forty-two houses. She wrote the numbers in her notebook: 1843, 1901, 1927, 42. Then she added a question mark, because the records did not agree with each other.
"Why do you want to know all this?" the librarian asked her. "Because nobody remembers it any more," she answered, "and because I think the past explains the present better than we like to admit."
Machines learn from examples in a similar way. A language model reads a very large amount of text and tries to predict the next word, again and again, until the patterns of the language are stored in its weights. The model does not understand the words the way we do; it counts, compares and adjusts. Yet the results can be surprisingly useful: it can translate, summarize, answer questions and write programs.
def train(model, data, steps=1000, learning_rate=0.001):
    for step in range(steps):
        batch = data.sample(batch_size=32)
        loss = model.loss(batch)
        loss.backward()
        model.update(learning_rate)
        if step % 100 == 0:
            print(f"step {step}: loss = {loss:.4f}")
    return model
The weather changed in the afternoon. Clouds came in from the west, the wind turned, and the first drops of rain fell on the square. The market traders covered their tables with sheets of plastic, and the people who had been walking in the park hurried home. By the evening the streets were empty, the lamps were lit, and the only sound was the rain on the roofs and the water running in the gutters.
Good software is written for people first and for computers second. Names should say what things are for, functions should do one thing, and every error message should tell the reader what went wrong and what to do about it. Tests are not a luxury: they are the only way to know that a change did not break something that used to work. When in doubt, make it simple, make it correct, and only then make it fast.
She closed the notebook, thanked the librarian and walked out into the rain. On the bridge she stopped for a moment and looked at the river, which was higher and faster than it had been in the morning. It would be a long winter, she thought, but the town had seen worse, and it was still here.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 42 365 24 60 7 12 31.
Questions? Answers! Lists: apples, oranges, pears; bread, milk, cheese. Paths: /usr/local/bin, C:\Users\test. Email: someone@example.com. Math: x = (a + b) * c / d - e; if (x > 0 && y < 10) { return x; } else { return -1; }
)";
  return k;
}

TrainedTokenizer train_byte_bpe(int64_t num_merges, int64_t vocab_size, const std::string& text) {
  const auto& specials = m3_special_tokens();
  const int64_t nspec = int64_t(specials.size());
  if (num_merges < 0) num_merges = 0;
  if (vocab_size > 0) {
    if (vocab_size < 256 + nspec)
      throw Error("tokenizer: vocab size " + std::to_string(vocab_size) + " cannot hold the 256 byte symbols and " +
                  std::to_string(nspec) + " special tokens");
    num_merges = std::min<int64_t>(num_merges, vocab_size - 256 - nspec);
  }

  // Word frequencies. A word is a run of non-space bytes with the single space before it (so
  // " the" and "the" are different words, as with the real pre-tokenizer); a newline is a word.
  std::map<std::string, int64_t> freq;
  {
    std::string cur;
    for (size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (c == ' ' || c == '\n') {
        if (!cur.empty() && cur != " ") ++freq[cur];
        cur.clear();
        if (c == '\n') ++freq["\n"];
        else cur = " ";
      } else {
        cur += c;
      }
    }
    if (!cur.empty() && cur != " ") ++freq[cur];
  }
  std::vector<std::string> sym(256);
  for (int b = 0; b < 256; ++b) sym[b] = gpt2_byte_symbol(uint8_t(b));
  struct Word {
    std::vector<std::string> parts;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [w, n] : freq) {
    Word wd{{}, n};
    for (unsigned char c : w) wd.parts.push_back(sym[c]);
    words.push_back(std::move(wd));
  }

  TrainedTokenizer out;
  std::set<std::string> vocab_set(sym.begin(), sym.end());
  while (int64_t(out.merges.size()) < num_merges) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& w : words)
      for (size_t i = 0; i + 1 < w.parts.size(); ++i) pairs[{w.parts[i], w.parts[i + 1]}] += w.count;
    // Highest count wins; std::map iteration order makes the smallest pair win ties.
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_n = 0;
    for (const auto& [p, n] : pairs) {
      if (n > best_n && !vocab_set.count(p.first + p.second)) {
        best = &p;
        best_n = n;
      }
    }
    if (!best) break;
    const auto merge = *best;
    const std::string joined = merge.first + merge.second;
    out.merges.push_back(merge);
    vocab_set.insert(joined);
    for (auto& w : words) {
      std::vector<std::string> np;
      for (size_t i = 0; i < w.parts.size(); ++i) {
        if (i + 1 < w.parts.size() && w.parts[i] == merge.first && w.parts[i + 1] == merge.second) {
          np.push_back(joined);
          ++i;
        } else {
          np.push_back(w.parts[i]);
        }
      }
      w.parts = std::move(np);
    }
  }

  const int64_t nordinary = 256 + int64_t(out.merges.size());
  out.num_fillers = vocab_size > 0 ? vocab_size - nspec - nordinary : 0;
  out.vocab_size = nordinary + out.num_fillers + nspec;
  out.bos_id = nordinary + out.num_fillers;
  out.eos_id = out.bos_id + 1;

  ojson vocab = ojson::object();
  int64_t id = 0;
  for (int b = 0; b < 256; ++b) vocab[sym[b]] = id++;
  for (const auto& m : out.merges) vocab[m.first + m.second] = id++;
  for (int64_t i = 0; i < out.num_fillers; ++i) vocab["<|filler_" + std::to_string(i) + "|>"] = id++;
  ojson merges = ojson::array();
  for (const auto& m : out.merges) merges.push_back({m.first, m.second});

  ojson added = ojson::array();
  for (int64_t i = 0; i < nspec; ++i) added.push_back(added_token_json(out.bos_id + i, specials[size_t(i)]));

  ojson tj;
  tj["version"] = "1.0";
  tj["truncation"] = nullptr;
  tj["padding"] = nullptr;
  tj["added_tokens"] = added;
  tj["normalizer"] = nullptr;
  tj["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kSplitRegex}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  tj["post_processor"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", false}};
  tj["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  ojson model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  model["vocab"] = vocab;
  model["merges"] = merges;
  tj["model"] = model;
  out.tokenizer_json = tj.dump(-1, ' ', false) + "\n";

  ojson cfg;
  cfg["add_bos_token"] = false;
  cfg["add_eos_token"] = false;
  cfg["add_prefix_space"] = false;
  cfg["bos_token"] = specials[0];
  cfg["eos_token"] = specials[1];
  cfg["pad_token"] = "]!p~[";
  cfg["unk_token"] = nullptr;
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["model_max_length"] = 1048576;
  cfg["tokenizer_class"] = "GPT2Tokenizer";
  ojson dec = ojson::object();
  for (int64_t i = 0; i < nspec; ++i) {
    ojson t = added_token_json(out.bos_id + i, specials[size_t(i)]);
    t.erase("id");
    dec[std::to_string(out.bos_id + i)] = t;
  }
  cfg["added_tokens_decoder"] = dec;
  out.tokenizer_config_json = cfg.dump(1) + "\n";

  ojson stm;
  stm["bos_token"] = specials[0];
  stm["eos_token"] = specials[1];
  stm["pad_token"] = "]!p~[";
  out.special_tokens_map_json = stm.dump() + "\n";
  return out;
}

}  // namespace m3
