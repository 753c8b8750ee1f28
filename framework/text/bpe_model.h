// The "model" section of a Hugging Face tokenizer.json of type BPE: vocabulary, ranked merges and
// the rules for characters outside the vocabulary (byte fallback, unknown token). tokenize() turns
// one pre-tokenized piece into ids exactly as HF's BPE model: lowest-rank merge first, leftmost
// among equal ranks.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace qforge::text {

// Ids are 32-bit in every tokenizer format (HF uses u32); merge keys pack two of them.
inline constexpr int64_t kMaxTokenId = 0x7FFFFFFF;

class BpeModel {
 public:
  BpeModel() = default;
  // `model`: the JSON object; `where` names the file in errors (keys are appended).
  static BpeModel parse(const nlohmann::json& model, const std::string& where);
  // Builds from a vocabulary and merges given as token pairs (the trainer's output).
  static BpeModel build(std::unordered_map<std::string, int64_t> vocab,
                        const std::vector<std::pair<std::string, std::string>>& merges, const std::string& where);

  void tokenize(const std::string& piece, std::vector<int64_t>& ids) const;

  std::optional<int64_t> token_to_id(const std::string& token) const;
  const std::string* id_to_token(int64_t id) const;  // nullptr outside the vocabulary
  int64_t max_id() const { return max_id_; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct MergeTarget {
    int64_t rank;
    int64_t new_id;
  };
  static uint64_t pair_key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b); }
  void symbol_ids(const std::string& piece, std::vector<int64_t>& symbols) const;
  void merge_all(std::vector<int64_t>& symbols) const;
  void add_merges(const std::vector<std::pair<std::string, std::string>>& merges, const std::string& where);

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, std::string> vocab_r_;
  std::unordered_map<uint64_t, MergeTarget> merges_;
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int64_t max_id_ = -1;
};

}  // namespace qforge::text
