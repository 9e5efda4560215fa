// m3::Tokenizer: byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json` (model type
// BPE, pre-tokenizer Split(regex, Isolated) and/or ByteLevel, ByteLevel decoder). Encoding follows
// Hugging Face: added tokens are matched first (leftmost, longest), the rest is split by the
// pre-tokenizer regex and BPE-merged by rank. Thread-safe for concurrent encode/decode.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace m3 {

class Tokenizer {
 public:
  // Loads a tokenizer.json. Throws m3::Error naming the file and what was expected.
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  // Loads DIR/tokenizer.json, plus DIR/tokenizer_config.json (bos_token / eos_token) when present.
  static Tokenizer from_dir(const std::string& model_dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text (UTF-8; throws m3::Error on invalid UTF-8) -> ids. With parse_special false, special added
  // tokens written in the text are encoded as ordinary text (non-special added tokens still match).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // Ids -> text. Invalid UTF-8 in the joined bytes becomes U+FFFD. Unknown ids throw m3::Error.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // Raw bytes of one token (an added token gives its content). Unknown ids throw m3::Error.
  const std::string& token_bytes(int32_t id) const;

  // One more than the largest id in the vocabulary or added tokens (ids below may be unused).
  int32_t vocab_size() const;
  // Id of a token given in its tokenizer.json form (byte-level string such as "Ġthe", or an added
  // token's content).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token as tokenizer.json writes it (byte-level, such as "Ġthe"; an added token's content), as
  // transformers' convert_ids_to_tokens gives it. Unknown ids throw m3::Error.
  std::string token_string(int32_t id) const;
  // True for added tokens marked "special".
  bool is_special(int32_t id) const;
  // True when `id` names a token (vocabulary or added).
  bool is_valid(int32_t id) const;
  // From tokenizer_config.json (bos_token / eos_token); -1 when absent.
  int32_t bos_id() const;
  int32_t eos_id() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3
