// The "added_tokens" of a Hugging Face tokenizer.json: tokens matched in the text before any
// pre-tokenization (leftmost-longest, the non-normalized ones first, then the normalized ones in
// what is left), each becoming its own id. `special` ones can be skipped when decoding.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace qforge::text {

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false;  // the match also takes the whitespace on that side
  bool normalized = true;               // matched after the normalizer ran
};

// A stretch of text: an added token's id, or text the pre-tokenizer and model still handle.
struct Segment {
  std::optional<int64_t> id;
  std::string text;
};

class AddedTokens {
 public:
  AddedTokens() = default;
  explicit AddedTokens(std::vector<AddedToken> tokens);
  static AddedTokens parse(const nlohmann::json& added_tokens, const std::string& where);

  // Splits `segments` around the tokens whose `normalized` flag equals `normalized`.
  std::vector<Segment> split(std::vector<Segment> segments, bool normalized) const;

  const AddedToken* find(int64_t id) const;
  std::optional<int64_t> find(const std::string& content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  void split_text(const std::string& text, bool normalized, std::vector<Segment>& out) const;
  // Leftmost-longest match at or after `from`: (token index, begin) or nullopt.
  std::optional<std::pair<size_t, size_t>> next_match(const std::string& text, size_t from, bool normalized) const;

  std::vector<AddedToken> tokens_;
  std::array<std::vector<size_t>, 256> by_first_byte_;  // token indices, longest first
  std::unordered_map<int64_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
};

}  // namespace qforge::text
