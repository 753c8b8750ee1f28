// UTF-8 as qforge's own text sees it: whether bytes are valid UTF-8 (no overlong forms, no
// surrogates, nothing above U+10FFFF), and a printable form of any bytes for terminals, reports
// and error messages. The tokenizers (framework/text/utf8.h) build on the same functions.
#pragma once

#include <cstddef>
#include <string>

namespace qforge {

// Length in bytes of the valid UTF-8 sequence starting at s[i], 0 when none starts there.
size_t utf8_sequence_length(const std::string& s, size_t i);

// Length of the maximal valid prefix of the sequence at s[i] (at least 1): how many bytes one
// U+FFFD replaces in lossy decoding.
size_t utf8_valid_prefix_length(const std::string& s, size_t i);

// The largest i' <= i that is not a UTF-8 continuation byte of `s` (0 at most): where to cut `s` at
// byte i without splitting a character; i itself when i >= s.size().
size_t utf8_cut_before(const std::string& s, size_t i);

// Characters of `s` as a terminal counts them: the bytes that are not UTF-8 continuation bytes.
size_t utf8_columns(const std::string& s);

// Byte offset of the first invalid sequence of `s`, or std::string::npos when `s` is valid UTF-8.
size_t find_invalid_utf8(const std::string& s);

// `bytes` as valid UTF-8 that cannot steer a terminal: every byte of an invalid sequence, every C0
// and C1 control (newline and tab included), DEL and the backslash written as \xNN, the rest kept.
// Distinct inputs give distinct outputs.
std::string printable(const std::string& bytes);

}  // namespace qforge
