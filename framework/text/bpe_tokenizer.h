// A Hugging Face tokenizer.json with a BPE model, read by qforge's own code: GPT-2, Llama-3 and
// Qwen2 style byte-level BPE (docs/tokenizers.md lists the sections and values accepted). encode()
// and decode() give the ids and text HF tokenizers gives; a section or value qforge does not
// implement is refused at load, naming its JSON key, rather than tokenized differently.
#pragma once

#include "framework/text/added_tokens.h"
#include "framework/text/bpe_model.h"
#include "framework/text/decoder.h"
#include "framework/text/normalizer.h"
#include "framework/text/pre_tokenizer.h"
#include "framework/text/tokenizer.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace qforge::text {

class BpeTokenizer : public Tokenizer {
 public:
  // Reads a tokenizer.json file; errors name the path and the JSON key.
  static BpeTokenizer load(const std::string& path);
  // Parses tokenizer.json text; `source` names it in errors.
  static BpeTokenizer parse(const std::string& json_text, const std::string& source);
  // A byte-level tokenizer from its parts (the trainer's result).
  BpeTokenizer(BpeModel model, PreTokenizer pre_tokenizer, AddedTokens added);

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> token_to_id(const std::string& token) const override;
  std::string id_to_token(int64_t id) const override;
  std::optional<int64_t> bos_id() const override;

  const AddedTokens& added_tokens() const { return added_; }

 private:
  BpeTokenizer() = default;
  // Added-token content first (HF's AddedVocabulary shadows the model), then the model's token.
  const std::string* token_of(int64_t id) const;

  BpeModel model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  AddedTokens added_;
  Decoder decoder_;
  std::vector<int64_t> prefix_ids_, suffix_ids_;  // TemplateProcessing's "single" around the text
};

}  // namespace qforge::text
