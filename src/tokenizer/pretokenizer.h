// Regex splitting for the pre-tokenizer (the Hugging Face `Split` step with behaviour `Isolated`):
// every regex match becomes a piece, and so does every stretch of text between matches.
// Backed by PCRE2 with UTF + UCP (so \p{..} and \s follow Unicode), JIT-compiled when available.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace m3::tok {

class RegexSplitter {
 public:
  // `literal`: treat `pattern` as a plain string (the `String` form of a Split pattern).
  // Throws m3::Error (prefixed with `where`) when the pattern does not compile.
  RegexSplitter(const std::string& pattern, bool literal, const std::string& where);
  ~RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;

  // Appends the pieces of `text` (valid UTF-8; callers check) to `out`, in order. Their
  // concatenation is `text`.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3::tok
