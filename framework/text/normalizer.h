// The "normalizer" section of a Hugging Face tokenizer.json: Unicode normalization forms (NFC,
// NFD, NFKC, NFKD through ICU; Qwen2 uses NFC), Prepend and Replace with a string pattern (the
// Llama-2 / Mistral form: Prepend "▁", Replace " " by "▁"), a Sequence of these, or none. Other
// normalizers are refused naming the key.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace qforge::text {

class Normalizer {
 public:
  // `normalizer`: the JSON value (null: none); `where` names the file in errors.
  static Normalizer parse(const nlohmann::json& normalizer, const std::string& where);

  bool is_identity() const { return steps_.empty(); }
  // The normalized form of valid UTF-8 `text` (each step on the previous one's result).
  std::string normalize(const std::string& text) const;

 private:
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kPrepend, kReplace };
  struct Step {
    Kind kind;
    std::string pattern, content;  // Prepend: content; Replace: pattern -> content
  };
  void add_step(const nlohmann::json& step, const std::string& key, const std::string& where);
  std::vector<Step> steps_;
};

// Every non-overlapping occurrence of `pattern` (non-empty) in `text`, left to right, by `content`.
std::string replace_all(const std::string& text, const std::string& pattern, const std::string& content);

}  // namespace qforge::text
