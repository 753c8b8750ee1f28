// Character-level tokenizer for the text datasets: one token per Unicode code point seen in the
// training split, plus [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3 (BERT's special tokens, in that order).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qforge::data {

// UTF-8 to code points; an invalid sequence decodes the whole string as Latin-1 (ISO-8859-1),
// the encoding of some Debian word lists (wswedish).
std::u32string decode_utf8_or_latin1(const std::string& s);
std::string encode_utf8(const std::u32string& s);

struct TokenBatch {
  at::Tensor input_ids;       // int64 [N, L], padded with kPad
  at::Tensor attention_mask;  // int64 [N, L], 1 for real tokens
};

class CharTokenizer {
 public:
  static constexpr int64_t kPad = 0, kUnk = 1, kCls = 2, kSep = 3, kNumSpecial = 4;

  CharTokenizer() = default;
  // Vocabulary: every code point of `texts`, in code-point order after the special tokens.
  static CharTokenizer build(const std::vector<std::string>& texts);

  int64_t vocab_size() const { return kNumSpecial + static_cast<int64_t>(chars_.size()); }
  // [CLS] c1 c2 ... (truncated to max_len tokens in total); unseen characters map to [UNK].
  std::vector<int64_t> encode(const std::string& text, int64_t max_len) const;
  // Encodes and pads to the longest example (at most max_len).
  TokenBatch encode_batch(const std::vector<std::string>& texts, int64_t max_len) const;
  std::string decode(const std::vector<int64_t>& ids) const;  // special tokens skipped

 private:
  std::u32string chars_;                // id - kNumSpecial -> code point
  std::map<char32_t, int64_t> ids_;
};

}  // namespace qforge::data
