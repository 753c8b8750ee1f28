// Character-level tokenizer and UTF-8 helpers.
#include "framework/data/char_tokenizer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

#include "framework/core/error.h"

namespace qforge::data {

std::u32string decode_utf8_or_latin1(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    int len = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      len = 1, cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    }
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      ok = (p[i + k] & 0xC0) == 0x80;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms would also be invalid UTF-8.
    ok = ok && !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) && !(len == 4 && cp < 0x10000) && cp <= 0x10FFFF;
    if (!ok) return std::u32string(p, p + n);  // Latin-1: byte value == code point
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string encode_utf8(const std::u32string& s) {
  std::string out;
  for (char32_t cp : s) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

CharTokenizer CharTokenizer::build(const std::vector<std::string>& texts, int64_t ngram) {
  QF_REQUIRE(ngram >= 1 && ngram <= 3, "data: character n-grams of 1, 2 or 3 characters, got ", ngram);
  CharTokenizer tok;
  tok.ngram_ = ngram;
  std::set<std::u32string> seen;
  for (const auto& t : texts) {
    const std::u32string s = tok.padded(t);
    for (size_t i = 0; i + static_cast<size_t>(ngram) <= s.size(); ++i) seen.insert(s.substr(i, static_cast<size_t>(ngram)));
  }
  for (const std::u32string& g : seen) {
    tok.ids_[g] = kNumSpecial + static_cast<int64_t>(tok.grams_.size());
    tok.grams_.push_back(g);
  }
  return tok;
}

std::u32string CharTokenizer::padded(const std::string& text) const {
  std::u32string s = decode_utf8_or_latin1(text);
  if (ngram_ > 1) s = U" " + s + U" ";
  return s;
}

std::vector<int64_t> CharTokenizer::encode(const std::string& text, int64_t max_len) const {
  QF_REQUIRE(max_len >= 1, "data: max_len must be >= 1, got ", max_len);
  std::vector<int64_t> ids{kCls};
  const std::u32string s = padded(text);
  const auto n = static_cast<size_t>(ngram_);
  for (size_t i = 0; i + n <= s.size(); ++i) {
    if (static_cast<int64_t>(ids.size()) >= max_len) break;
    auto it = ids_.find(s.substr(i, n));
    ids.push_back(it == ids_.end() ? kUnk : it->second);
  }
  return ids;
}

TokenBatch CharTokenizer::encode_batch(const std::vector<std::string>& texts, int64_t max_len) const {
  std::vector<std::vector<int64_t>> all;
  all.reserve(texts.size());
  int64_t longest = 1;
  for (const auto& t : texts) {
    all.push_back(encode(t, max_len));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(all.back().size()));
  }
  const auto n = static_cast<int64_t>(texts.size());
  at::Tensor ids = at::full({n, longest}, kPad, at::kLong), mask = at::zeros({n, longest}, at::kLong);
  auto ia = ids.accessor<int64_t, 2>();
  auto ma = mask.accessor<int64_t, 2>();
  for (int64_t i = 0; i < n; ++i)
    for (size_t j = 0; j < all[i].size(); ++j) ia[i][j] = all[i][j], ma[i][j] = 1;
  return {ids, mask};
}

std::string CharTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::u32string s;
  bool first = true;
  for (int64_t id : ids) {
    if (id < kNumSpecial || id >= vocab_size()) continue;
    const std::u32string& g = grams_[static_cast<size_t>(id - kNumSpecial)];
    s += first ? g : g.substr(g.size() - 1);  // consecutive n-grams overlap by n - 1 characters
    first = false;
  }
  if (ngram_ > 1) {
    if (!s.empty() && s.front() == U' ') s.erase(0, 1);
    if (!s.empty() && s.back() == U' ') s.pop_back();
  }
  return encode_utf8(s);
}

}  // namespace qforge::data
