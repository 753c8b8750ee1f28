// Training a byte-level BPE vocabulary on a text corpus, written as a Hugging Face tokenizer.json
// that BpeTokenizer (and HF tokenizers) load. The corpus is cut by the pre-tokenizer regex (GPT-2's
// by default), each piece's bytes start as the 256 byte-level symbols, and the most frequent
// adjacent pair (counted over all pieces, weighted by how often each piece occurs) is merged until
// the vocabulary has vocab_size entries or no pair occurs min_frequency times. Ties go to the pair
// with the smallest (left id, right id), so a corpus always gives the same file.
#pragma once

#include "framework/text/regex_split.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace qforge::text {

struct BpeTrainerOptions {
  int64_t vocab_size = 1024;  // bytes + merges + special tokens
  int64_t min_frequency = 2;  // a pair seen fewer times is never merged
  std::string pattern = kGpt2Pattern;  // the pre-tokenizer regex written into the file
  std::string normalizer;  // "" (none), "NFC" (Qwen2's), "NFD", "NFKC" or "NFKD": applied to the corpus and written
  std::vector<std::string> special_tokens;  // ids after the merged tokens, in this order
  std::string bos_token;      // when set (one of special_tokens), encode() starts with it
  bool ignore_merges = false;  // Llama-3's: a piece that is a whole token maps to it directly
  bool merges_as_pairs = false;  // ["a", "b"] merges (tokenizers >= 0.20) instead of "a b"
};

struct TrainedBpe {
  std::vector<std::string> vocab;  // index = id: 256 byte symbols, merged tokens, special tokens
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  BpeTrainerOptions options;

  // The HF tokenizer.json text.
  std::string to_json() const;
  // Writes to_json() through a temporary file and a rename.
  void save(const std::string& path) const;
};

// Throws qforge::Error for an empty corpus, invalid UTF-8 (naming the text and byte), a
// vocab_size below 256 + special tokens, or a bos_token that is not a special token.
TrainedBpe train_bpe(const std::vector<std::string>& texts, const BpeTrainerOptions& options);

}  // namespace qforge::text
