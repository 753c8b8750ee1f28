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
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error,
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
