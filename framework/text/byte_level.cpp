#include "framework/text/byte_level.h"

#include "framework/text/utf8.h"

#include <unordered_map>

namespace qforge::text {

namespace {

// Bytes GPT-2 keeps as themselves: '!'..'~', '¡'..'¬', '®'..'ÿ'.
bool is_kept_byte(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

const std::array<char32_t, 256>& code_points() {
  static const std::array<char32_t, 256> kTable = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;  // the other bytes take U+0100, U+0101, ... in byte order
    for (int b = 0; b < 256; ++b) t[b] = is_kept_byte(b) ? static_cast<char32_t>(b) : next++;
    return t;
  }();
  return kTable;
}

const std::unordered_map<char32_t, unsigned char>& inverse() {
  static const std::unordered_map<char32_t, unsigned char> kInverse = [] {
    std::unordered_map<char32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[code_points()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  return kInverse;
}

}  // namespace

char32_t byte_to_unicode(unsigned char b) { return code_points()[b]; }

const std::array<std::string, 256>& byte_level_alphabet() {
  static const std::array<std::string, 256> kAlphabet = [] {
    std::array<std::string, 256> a;
    for (int b = 0; b < 256; ++b) append_utf8(a[b], code_points()[b]);
    return a;
  }();
  return kAlphabet;
}

std::string byte_level_encode(const std::string& bytes) {
  const auto& alphabet = byte_level_alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out += alphabet[static_cast<unsigned char>(c)];
  return out;
}

std::string byte_level_decode_token(const std::string& token) {
  std::string out;
  for (size_t i = 0; i < token.size();) {
    const size_t len = utf8_sequence_length(token, i);
    if (len == 0) return token;
    const auto it = inverse().find(decode_code_point(token, i, len));
    if (it == inverse().end()) return token;
    out += static_cast<char>(it->second);
    i += len;
  }
  return out;
}

}  // namespace qforge::text
