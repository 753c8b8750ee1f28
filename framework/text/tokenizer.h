// A text tokenizer as a language model sees it: text to token ids and back. Implemented by
// BpeTokenizer (Hugging Face tokenizer.json) and SentencePieceTokenizer (tokenizer.model);
// load_tokenizer() picks the one a Hugging Face model folder holds.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace qforge::text {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of UTF-8 `text` (invalid UTF-8 is an error naming the byte offset).
  // add_special_tokens: the tokens the format adds around a sequence (BOS, a template).
  virtual std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const = 0;
  // Text of `ids`; an id outside the vocabulary is an error naming it.
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const = 0;
  // One more than the largest id (the rows an embedding needs).
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int64_t> token_to_id(const std::string& token) const = 0;
  // The token string of `id` (its vocabulary form, e.g. "Ġthe" or "▁the"); errors outside the vocabulary.
  virtual std::string id_to_token(int64_t id) const = 0;
  // The beginning-of-sequence id encode() adds, if the format defines one.
  virtual std::optional<int64_t> bos_id() const = 0;
};

// `path`: a tokenizer.json, a SentencePiece .model, or a folder holding either: its tokenizer.json
// (preferred, as transformers' fast tokenizers do), or its tokenizer.model when there is no
// tokenizer.json or qforge refuses it. Errors name the path and what was expected.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace qforge::text
