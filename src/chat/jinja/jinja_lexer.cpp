// Jinja lexer. Whitespace control follows Jinja2: `-` strips all whitespace on that side of a tag,
// trim_blocks drops the first newline after a block/comment tag, lstrip_blocks drops spaces/tabs
// between a line start and a block/comment tag, `+` opts a tag out of lstrip.
#include "chat/jinja/jinja_lexer.h"

#include <cctype>

#include "base/error.h"
#include "tokenizer/utf8.h"

namespace m3::jinja {
namespace {

[[noreturn]] void fail(int line, const std::string& msg) {
  throw Error("template line " + std::to_string(line) + ": " + msg);
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int count_lines(const std::string& s, size_t a, size_t b) {
  int n = 0;
  for (size_t i = a; i < b && i < s.size(); ++i) n += s[i] == '\n';
  return n;
}

struct Lexer {
  const std::string& src;
  const LexOptions& opt;
  size_t pos = 0;
  int line = 1;
  std::vector<Token> out;

  void emit(Tok t, std::string s, int ln) { out.push_back(Token{t, std::move(s), ln}); }

  // Reads one string literal starting at the quote; Python-style escapes.
  std::string read_string() {
    char q = src[pos++];
    std::string s;
    while (true) {
      if (pos >= src.size()) fail(line, "unterminated string literal");
      char c = src[pos++];
      if (c == q) break;
      if (c == '\n') ++line;
      if (c != '\\') {
        s += c;
        continue;
      }
      if (pos >= src.size()) fail(line, "unterminated string literal");
      char e = src[pos++];
      switch (e) {
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        case 'r': s += '\r'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case '0': s += '\0'; break;
        case '\\': s += '\\'; break;
        case '\'': s += '\''; break;
        case '"': s += '"'; break;
        case '\n': ++line; break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos + n > src.size()) fail(line, "bad escape in string literal");
          uint32_t cp = uint32_t(std::stoul(src.substr(pos, n), nullptr, 16));
          pos += n;
          tok::append_utf8(s, cp);
          break;
        }
        default: s += '\\'; s += e; break;  // Python keeps unknown escapes verbatim
      }
    }
    return s;
  }

  // Lexes expression tokens up to the closing delimiter; returns true if it had a '-' strip mark.
  bool lex_tag(char close) {
    int depth = 0;  // '{' nesting, so `}}` inside a dict literal is not the tag end
    while (true) {
      while (pos < src.size() && is_ws(src[pos])) {
        if (src[pos] == '\n') ++line;
        ++pos;
      }
      if (pos >= src.size()) fail(line, "unclosed tag");
      auto at = [&](const char* s) { return src.compare(pos, std::char_traits<char>::length(s), s) == 0; };
      std::string end1 = std::string(1, close) + "}";
      if (depth == 0) {
        if (src[pos] == '-' && src.compare(pos + 1, 2, end1) == 0) {
          pos += 3;
          return true;
        }
        if (src.compare(pos, 2, end1) == 0 && !(close == '}' && false)) {
          pos += 2;
          return false;
        }
      }
      char c = src[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t b = pos;
        while (pos < src.size() && (std::isalnum(static_cast<unsigned char>(src[pos])) || src[pos] == '_')) ++pos;
        emit(Tok::Name, src.substr(b, pos - b), line);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t b = pos;
        bool is_float = false;
        while (pos < src.size() && (std::isdigit(static_cast<unsigned char>(src[pos])) || src[pos] == '_')) ++pos;
        if (pos + 1 < src.size() && src[pos] == '.' && std::isdigit(static_cast<unsigned char>(src[pos + 1]))) {
          is_float = true;
          ++pos;
          while (pos < src.size() && (std::isdigit(static_cast<unsigned char>(src[pos])) || src[pos] == '_')) ++pos;
        }
        if (pos < src.size() && (src[pos] == 'e' || src[pos] == 'E')) {
          size_t p = pos + 1;
          if (p < src.size() && (src[p] == '+' || src[p] == '-')) ++p;
          if (p < src.size() && std::isdigit(static_cast<unsigned char>(src[p]))) {
            is_float = true;
            pos = p;
            while (pos < src.size() && std::isdigit(static_cast<unsigned char>(src[pos]))) ++pos;
          }
        }
        std::string num;
        for (size_t i = b; i < pos; ++i)
          if (src[i] != '_') num += src[i];
        emit(is_float ? Tok::Float : Tok::Int, num, line);
      } else if (c == '\'' || c == '"') {
        int ln = line;
        emit(Tok::String, read_string(), ln);
      } else {
        static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
        bool done = false;
        for (const char* t : two)
          if (at(t)) {
            emit(Tok::Op, t, line);
            pos += 2;
            done = true;
            break;
          }
        if (done) continue;
        if (std::string("+-*/%~<>=()[]{},.:|!").find(c) == std::string::npos)
          fail(line, std::string("unexpected character '") + c + "'");
        if (c == '{') ++depth;
        if (c == '}') --depth;
        emit(Tok::Op, std::string(1, c), line);
        ++pos;
      }
    }
  }

  void run() {
    bool strip_lead = false, trim_newline = false;
    while (true) {
      size_t start = pos;
      while (true) {
        start = src.find('{', start);
        if (start == std::string::npos || start + 1 >= src.size()) {
          start = std::string::npos;
          break;
        }
        char n = src[start + 1];
        if (n == '{' || n == '%' || n == '#') break;
        ++start;
      }
      size_t text_end = start == std::string::npos ? src.size() : start;
      std::string raw = src.substr(pos, text_end - pos);
      std::string text = raw;
      if (strip_lead) {
        size_t k = 0;
        while (k < text.size() && is_ws(text[k])) ++k;
        text.erase(0, k);
      } else if (trim_newline) {
        if (text.rfind("\r\n", 0) == 0) text.erase(0, 2);
        else if (!text.empty() && text[0] == '\n') text.erase(0, 1);
      }
      strip_lead = trim_newline = false;
      int text_line = line;
      line += count_lines(src, pos, text_end);
      if (start == std::string::npos) {
        if (!text.empty()) emit(Tok::Text, text, text_line);
        break;
      }
      char kind = src[start + 1];
      char mod = start + 2 < src.size() ? src[start + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && is_ws(text.back())) text.pop_back();
      } else if (opt.lstrip_blocks && (kind == '%' || kind == '#') && mod != '+') {
        size_t nl = raw.rfind('\n');
        bool at_line_start = nl != std::string::npos || pos == 0 || (pos > 0 && src[pos - 1] == '\n');
        std::string seg = nl == std::string::npos ? raw : raw.substr(nl + 1);
        bool blank = true;
        for (char c : seg) blank = blank && (c == ' ' || c == '\t');
        if (at_line_start && blank)
          while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.pop_back();
      }
      if (!text.empty()) emit(Tok::Text, text, text_line);
      pos = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      int tag_line = line;
      if (kind == '#') {
        size_t e = src.find("#}", pos);
        if (e == std::string::npos) fail(tag_line, "unclosed comment");
        line += count_lines(src, pos, e);
        strip_lead = e > pos && src[e - 1] == '-';
        trim_newline = !strip_lead && opt.trim_blocks;
        pos = e + 2;
        continue;
      }
      size_t first_tok = out.size() + 1;
      emit(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", tag_line);
      bool strip = lex_tag(kind == '{' ? '}' : '%');
      emit(kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", line);
      strip_lead = strip;
      trim_newline = !strip && kind == '%' && opt.trim_blocks;
      if (kind == '%' && out.size() == first_tok + 2 && out[first_tok].type == Tok::Name &&
          out[first_tok].text == "raw")
        lex_raw(first_tok - 1, strip_lead, trim_newline);
    }
  }

  // `{% raw %}...{% endraw %}`: the body is emitted as text, untouched.
  void lex_raw(size_t begin_index, bool& strip_lead, bool& trim_newline) {
    out.resize(begin_index);
    size_t search = pos;
    while (true) {
      size_t b = src.find("{%", search);
      if (b == std::string::npos) fail(line, "missing endraw");
      size_t p = b + 2;
      bool lstrip = p < src.size() && src[p] == '-';
      if (p < src.size() && (src[p] == '-' || src[p] == '+')) ++p;
      while (p < src.size() && is_ws(src[p])) ++p;
      if (src.compare(p, 6, "endraw") != 0) {
        search = b + 2;
        continue;
      }
      p += 6;
      while (p < src.size() && is_ws(src[p])) ++p;
      bool rstrip = p < src.size() && src[p] == '-';
      if (rstrip) ++p;
      if (src.compare(p, 2, "%}") != 0) fail(line, "bad endraw tag");
      std::string body = src.substr(pos, b - pos);
      if (strip_lead) {
        size_t k = 0;
        while (k < body.size() && is_ws(body[k])) ++k;
        body.erase(0, k);
      } else if (trim_newline && !body.empty() && body[0] == '\n') {
        body.erase(0, 1);
      }
      if (lstrip)
        while (!body.empty() && is_ws(body.back())) body.pop_back();
      if (!body.empty()) emit(Tok::Text, body, line);
      line += count_lines(src, pos, p + 2);
      pos = p + 2;
      strip_lead = rstrip;
      trim_newline = !rstrip && opt.trim_blocks;
      return;
    }
  }
};

}  // namespace

std::vector<Token> lex(const std::string& source, const LexOptions& opt) {
  std::string src = source;
  if (!opt.keep_trailing_newline) {
    if (src.size() >= 2 && src.compare(src.size() - 2, 2, "\r\n") == 0) src.resize(src.size() - 2);
    else if (!src.empty() && src.back() == '\n') src.pop_back();
  }
  Lexer lx{src, opt, 0, 1, {}};
  lx.run();
  lx.emit(Tok::Eof, "", lx.line);
  return std::move(lx.out);
}

}  // namespace m3::jinja
