// A SentencePiece tokenizer.model (Llama-2, Mistral), run by Debian's libsentencepiece (through
// the plugin of sentencepiece_plugin.h): the model's own normalization, pieces, byte fallback and
// unknown handling. encode() adds BOS (and EOS when asked) as Hugging Face's Llama tokenizer does
// by default. Without libsentencepiece-dev at build time, load() is an error naming the package.
#pragma once

#include "framework/text/tokenizer.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace qforge::text {

struct SentencePieceOptions {
  bool add_bos = true;   // Llama / Mistral defaults (tokenizer_config.json add_bos_token)
  bool add_eos = false;  // add_eos_token
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Reads a serialized SentencePiece ModelProto; a missing, truncated or foreign file is an error
  // naming the path and SentencePiece's reason.
  static SentencePieceTokenizer load(const std::string& path, const SentencePieceOptions& options = {});
  // Whether this build can read SentencePiece models.
  static bool available();
  // Why available() is false (the plugin path and dlopen's reason, or a build without it); else "".
  static std::string unavailable_reason();

  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const override;
  // Control pieces (BOS, EOS, padding) decode to nothing, as SentencePiece decodes them, whatever
  // skip_special_tokens says; unknown pieces decode to " ⁇ ".
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> token_to_id(const std::string& token) const override;
  std::string id_to_token(int64_t id) const override;
  std::optional<int64_t> bos_id() const override;
  std::optional<int64_t> eos_id() const;

 private:
  struct Impl;
  explicit SentencePieceTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace qforge::text
