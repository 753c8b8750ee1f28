// The "normalizer" section of a Hugging Face tokenizer.json: Unicode normalization forms (NFC,
// NFD, NFKC, NFKD; Qwen2 uses NFC) through ICU, or none. Other normalizers are refused naming the key.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace qforge::text {

class Normalizer {
 public:
  enum class Form { kNone, kNfc, kNfd, kNfkc, kNfkd };

  // `normalizer`: the JSON value (null: none); `where` names the file in errors.
  static Normalizer parse(const nlohmann::json& normalizer, const std::string& where);

  bool is_identity() const { return form_ == Form::kNone; }
  // The normalized form of valid UTF-8 `text`.
  std::string normalize(const std::string& text) const;

 private:
  Form form_ = Form::kNone;
};

}  // namespace qforge::text
