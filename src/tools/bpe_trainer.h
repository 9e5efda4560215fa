// A tiny deterministic byte-level BPE trainer that emits Hugging Face tokenizer files
// (tokenizer.json, tokenizer_config.json, special_tokens_map.json) in the MiniMax-M3 layout:
// 256 GPT-2 byte symbols, learned merges, optional filler tokens, then the M3 special tokens.
// make-model uses it so random-weight checkpoints come with a loadable tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace m3 {

// The special tokens appended after the ordinary vocabulary, in id order (bos first, eos second).
const std::vector<std::string>& m3_special_tokens();

// The built-in training text (English prose with some digits, punctuation and code).
const std::string& bpe_builtin_text();

// GPT-2 byte -> unicode mapping as a UTF-8 string per byte.
std::string gpt2_byte_symbol(uint8_t b);

struct TrainedTokenizer {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string special_tokens_map_json;
  std::vector<std::pair<std::string, std::string>> merges;  // byte-level symbol strings
  int64_t vocab_size = 0;    // ordinary + filler + special
  int64_t num_fillers = 0;   // unreachable filler tokens padding the vocabulary
  int64_t bos_id = 0, eos_id = 0;
};

// Learns up to `num_merges` merges from `text` (split on spaces, a word keeps its leading space;
// ties between equally frequent pairs go to the lexicographically smallest pair). If
// `vocab_size` > 0 the vocabulary is padded with filler tokens "<|filler_N|>" (never produced by
// a merge) up to vocab_size - specials, and fewer merges are learned if needed to fit; it throws
// m3::Error when vocab_size cannot hold the 256 bytes and the specials.
TrainedTokenizer train_byte_bpe(int64_t num_merges, int64_t vocab_size = 0, const std::string& text = bpe_builtin_text());

}  // namespace m3
