// UTF-8 as the tokenizers see it: strict validation of input text (Rust strings, which HF
// tokenizers operate on, are always valid UTF-8), code point iteration, and the lossy decoding
// (U+FFFD per maximal invalid subpart) that turns decoded token bytes back into text.
#pragma once

#include <cstddef>
#include <string>

#include "framework/core/utf8.h"

namespace qforge::text {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Byte offset of the first invalid sequence of `s`, or std::string::npos when `s` is valid UTF-8
// (no overlong forms, no surrogates, nothing above U+10FFFF); the length of the valid sequence at
// s[i] (0 when none starts there). framework/core/utf8.h holds them.
using ::qforge::find_invalid_utf8;
using ::qforge::utf8_sequence_length;

// Throws qforge::Error naming `what` and the byte offset when `s` is not valid UTF-8.
void require_utf8(const std::string& s, const std::string& what);

// The code point of the valid sequence of `len` bytes at s[i].
char32_t decode_code_point(const std::string& s, size_t i, size_t len);

void append_utf8(std::string& out, char32_t cp);

// Bytes to text, each maximal invalid subpart replaced by U+FFFD (the policy of Rust's
// String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace")).
std::string utf8_lossy(const std::string& bytes);

// Unicode White_Space (Rust's char::is_whitespace), for added tokens' lstrip / rstrip.
bool is_unicode_whitespace(char32_t cp);

}  // namespace qforge::text
