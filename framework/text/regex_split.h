// Splitting text on a regular expression the way HF tokenizers' Split pre-tokenizer with behaviour
// "Isolated" does: every match and every gap between matches becomes a piece. Patterns are compiled
// by PCRE2 in UTF + UCP mode, so \p{L}, \p{N}, \s, lookahead and possessive forms mean what they
// mean in the Oniguruma patterns of GPT-2, Llama-3 and Qwen2 tokenizer files.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace qforge::text {

using ByteRange = std::pair<size_t, size_t>;  // [begin, end) in bytes

class RegexSplitter {
 public:
  // `literal`: the pattern is a plain string (Split's {"String": ...}). `where` names the pattern's
  // origin (file and JSON key) in compile errors.
  RegexSplitter(const std::string& pattern, bool literal, const std::string& where);

  // The pieces of valid UTF-8 `text`: matches and the gaps between them, in order, none empty.
  std::vector<ByteRange> split_isolated(const std::string& text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::shared_ptr<const Code> code_;  // immutable once compiled; shared by copies
};

// GPT-2's pre-tokenizer pattern (the ByteLevel pre-tokenizer's built-in regex).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama-3's (tiktoken cl100k-style) pattern: case-insensitive contractions, digits in groups of 3.
inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2's: Llama-3's with single digits.
inline constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace qforge::text
