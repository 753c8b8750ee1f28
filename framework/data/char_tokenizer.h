// Character-level tokenizer for the text datasets: one token per Unicode code point (ngram 1) or
// per overlapping character n-gram (ngram 2 or 3) seen in the training split, plus [PAD]=0,
// [UNK]=1, [CLS]=2, [SEP]=3 (BERT's special tokens, in that order). With n-grams the text is
// padded with one space on each side, so " hello" yields " h", "he", ..., "o " (bigrams): word
// boundaries become tokens, and a text of c characters gives c + 3 - n tokens after [CLS].
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
  // Vocabulary: every n-gram of `texts` (code points for ngram 1), in code-point order after the
  // special tokens. ngram must be 1, 2 or 3.
  static CharTokenizer build(const std::vector<std::string>& texts, int64_t ngram = 1);

  int64_t ngram() const { return ngram_; }
  int64_t vocab_size() const { return kNumSpecial + static_cast<int64_t>(grams_.size()); }
  // [CLS] g1 g2 ... (truncated to max_len tokens in total); unseen n-grams map to [UNK].
  std::vector<int64_t> encode(const std::string& text, int64_t max_len) const;
  // Encodes and pads to the longest example (at most max_len).
  TokenBatch encode_batch(const std::vector<std::string>& texts, int64_t max_len) const;
  // Special tokens skipped; n-grams are joined by their overlap (the boundary spaces dropped).
  std::string decode(const std::vector<int64_t>& ids) const;

 private:
  std::u32string padded(const std::string& text) const;

  int64_t ngram_ = 1;
  std::vector<std::u32string> grams_;          // id - kNumSpecial -> n-gram
  std::map<std::u32string, int64_t> ids_;
};

}  // namespace qforge::data
