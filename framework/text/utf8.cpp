#include "framework/text/utf8.h"

#include "framework/core/error.h"

namespace qforge::text {

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

size_t utf8_sequence_length(const std::string& s, size_t i) {
  const size_t want = expected_length(static_cast<unsigned char>(s[i]));
  if (want == 0) return 0;
  return valid_prefix_length(s, i) == want || want == 1 ? want : 0;
}

char32_t decode_code_point(const std::string& s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

size_t find_invalid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string::npos;
}

void require_utf8(const std::string& s, const std::string& what) {
  const size_t bad = find_invalid_utf8(s);
  QF_REQUIRE(bad == std::string::npos, what, ": invalid UTF-8 at byte ", bad, " (byte 0x", std::hex,
             static_cast<int>(static_cast<unsigned char>(s[bad == std::string::npos ? 0 : bad])),
             "); tokenizers take UTF-8 text");
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const size_t len = utf8_sequence_length(bytes, i);
    if (len > 0) {
      out.append(bytes, i, len);
      i += len;
    } else {
      append_utf8(out, kReplacementChar);
      i += valid_prefix_length(bytes, i);
    }
  }
  return out;
}

bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

}  // namespace qforge::text
