#define PCRE2_CODE_UNIT_WIDTH 8
#include "framework/text/regex_split.h"

#include "framework/core/error.h"

#include <pcre2.h>

namespace qforge::text {

namespace {

// Big enough for any PCRE2 error text.
constexpr size_t kErrorBufferBytes = 256;

struct MatchData {
  pcre2_match_data* data;
  explicit MatchData(const pcre2_code* code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {
    QF_REQUIRE(data != nullptr, "framework/text: out of memory for a PCRE2 match block");
  }
  ~MatchData() { pcre2_match_data_free(data); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

// Oniguruma's (HF's) and Python regex's \s: PCRE2's UCP \s also takes U+180E, which they do not.
constexpr const char* kSpaceSet = "\\t-\\r\\x{85}\\p{Z}";

// `pattern` with \s and \S spelled as kSpaceSet classes; escapes, \Q..\E and classes are respected.
std::string rewrite_space_classes(const std::string& pattern, const std::string& where) {
  std::string out;
  bool in_class = false, quoted = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    const char next = i + 1 < pattern.size() ? pattern[i + 1] : '\0';
    if (quoted) {
      if (c == '\\' && next == 'E') quoted = false;
      out += c;
      continue;
    }
    if (c == '\\' && next == 'Q') quoted = true;
    if (c == '\\' && (next == 's' || next == 'S')) {
      QF_REQUIRE(!(in_class && next == 'S'), where, ": \\S inside a character class is not supported (pattern ",
                 pattern, ")");
      out += in_class ? kSpaceSet : next == 's' ? std::string("[") + kSpaceSet + "]" : std::string("[^") + kSpaceSet + "]";
      ++i;
      continue;
    }
    out += c;
    if (c == '\\' && next != '\0') {
      out += next;  // an escaped character is never a class bracket
      ++i;
    } else if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (in_class && c == '[' && next == ':') {
      const size_t close = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (close != std::string::npos) {
        out.append(pattern, i + 1, close + 2 - (i + 1));
        i = close + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[kErrorBufferBytes];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(const std::string& pattern, bool literal, const std::string& where)
    : pattern_(pattern) {
  auto code = std::make_shared<Code>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options =
      PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C | (literal ? PCRE2_LITERAL : 0u);
  const std::string compiled = literal ? pattern : rewrite_space_classes(pattern, where);
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), options, &error,
                             &offset, nullptr);
  QF_REQUIRE(code->code != nullptr, where, ": regex does not compile at offset ", offset, ": ",
             pcre2_message(error), " (pattern ", pattern, ")");
  // JIT is an optimisation only: where it is unavailable the interpreter gives the same matches.
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);
  code_ = std::move(code);
}

std::vector<ByteRange> RegexSplitter::split_isolated(const std::string& text) const {
  std::vector<ByteRange> pieces;
  MatchData match(code_->code);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_begin = 0, start = 0;
  while (start <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, match.data, nullptr);
    // The JIT's fixed stack can overflow on very long runs; the interpreter's heap frames do not.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, match.data,
                       nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    QF_REQUIRE(rc >= 0, "framework/text: regex match failed: ", pcre2_message(rc), " (pattern ", pattern_, ")");
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end == begin) {
      // An empty match splits nothing; step over one whole character and search again.
      size_t next = begin + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      start = next;
      continue;
    }
    if (begin > gap_begin) pieces.emplace_back(gap_begin, begin);
    pieces.emplace_back(begin, end);
    gap_begin = start = end;
  }
  if (gap_begin < text.size()) pieces.emplace_back(gap_begin, text.size());
  return pieces;
}

}  // namespace qforge::text
