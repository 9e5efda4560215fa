// PCRE2-backed regex splitter for the pre-tokenizer (see pretokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include "base/error.h"

namespace m3::tok {

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::RegexSplitter(const std::string& pattern, bool literal, const std::string& where)
    : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP;
  if (literal) opts |= PCRE2_LITERAL;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err,
                              &err_off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    throw Error(where + ": pre-tokenizer regex does not compile at offset " + std::to_string(err_off) + ": " +
                reinterpret_cast<const char*>(buf));
  }
  // JIT is an optimisation only; fall back to the interpreter when it is unavailable.
  (void)pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

RegexSplitter::~RegexSplitter() = default;
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  struct MatchData {
    pcre2_match_data* md;
    ~MatchData() { pcre2_match_data_free(md); }
  } md{pcre2_match_data_create(1, nullptr)};
  if (!md.md) throw std::bad_alloc();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;   // where the next search starts
  size_t emitted = 0;  // end of the last piece handed out
  while (pos < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof buf);
      throw Error(std::string("tokenizer: pre-tokenizer regex match failed: ") + reinterpret_cast<const char*>(buf));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.md);
    const size_t s = ov[0], e = ov[1];
    if (e == s) {
      // Empty match: it produces no piece; step over one character.
      pos = s + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (s > emitted) out.push_back(text.substr(emitted, s - emitted));
    out.push_back(text.substr(s, e - s));
    emitted = pos = e;
  }
  if (emitted < text.size()) out.push_back(text.substr(emitted));
}

}  // namespace m3::tok
