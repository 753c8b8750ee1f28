// UTF-8 validity and printable escapes (framework/core/utf8.h).
#include "framework/core/utf8.h"

#include <cstdio>

namespace qforge {

namespace {

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Valid range of the second byte after lead byte `lead` (Unicode Table 3-7), so overlong forms,
// surrogates and code points above U+10FFFF are rejected at the second byte.
void second_byte_range(unsigned char lead, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (lead == 0xE0) lo = 0xA0;
  if (lead == 0xED) hi = 0x9F;
  if (lead == 0xF0) lo = 0x90;
  if (lead == 0xF4) hi = 0x8F;
}

size_t expected_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// How many bytes of the sequence at s[i] are a valid prefix (at least 1: the maximal subpart).
size_t valid_prefix_length(const std::string& s, size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const size_t want = expected_length(lead);
  if (want <= 1) return 1;
  size_t n = 1;
  unsigned char lo = 0, hi = 0;
  second_byte_range(lead, lo, hi);
  while (n < want && i + n < s.size()) {
    const auto c = static_cast<unsigned char>(s[i + n]);
    const bool ok = n == 1 ? (c >= lo && c <= hi) : is_continuation(c);
    if (!ok) break;
    ++n;
  }
  return n;
}

}  // namespace

size_t utf8_valid_prefix_length(const std::string& s, size_t i) { return valid_prefix_length(s, i); }

size_t utf8_sequence_length(const std::string& s, size_t i) {
  const size_t want = expected_length(static_cast<unsigned char>(s[i]));
  if (want == 0) return 0;
  return valid_prefix_length(s, i) == want || want == 1 ? want : 0;
}

size_t utf8_cut_before(const std::string& s, size_t i) {
  while (i > 0 && i < s.size() && is_continuation(static_cast<unsigned char>(s[i]))) --i;
  return i;
}

size_t utf8_columns(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += is_continuation(static_cast<unsigned char>(c)) ? 0 : 1;
  return n;
}

size_t find_invalid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string::npos;
}

std::string printable(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  char hex[5];
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    const size_t len = utf8_sequence_length(bytes, i);
    // C0 controls, DEL and C1 controls (U+0080..U+009F, 0xC2 0x80..0x9F) steer terminals.
    const bool c1 = len == 2 && c == 0xC2 && static_cast<unsigned char>(bytes[i + 1]) < 0xA0;
    if (len == 0 || c < 0x20 || c == 0x7F || c1 || c == '\\') {
      const size_t n = len == 0 ? 1 : len;
      for (size_t k = 0; k < n; ++k) {
        std::snprintf(hex, sizeof hex, "\\x%02X", static_cast<unsigned>(static_cast<unsigned char>(bytes[i + k])));
        out += hex;
      }
      i += n;
    } else {
      out.append(bytes, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace qforge
