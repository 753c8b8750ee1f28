#include "framework/text/added_tokens.h"

#include "framework/core/error.h"
#include "framework/text/bpe_model.h"
#include "framework/text/utf8.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

namespace qforge::text {

namespace {

using nlohmann::json;

const std::set<std::string> kAddedTokenKeys{"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"};

bool flag(const json& t, const char* name, bool fallback, const std::string& key, const std::string& where) {
  if (!t.contains(name)) return fallback;
  QF_REQUIRE(t[name].is_boolean(), where, ": ", key, ".", name, " must be true or false");
  return t[name].get<bool>();
}

// Byte length of the whitespace run ending at `end` (lstrip) or starting at `begin` (rstrip).
size_t whitespace_before(const std::string& s, size_t end, size_t floor) {
  size_t b = end;
  while (b > floor) {
    size_t start = b - 1;
    while (start > floor && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    const size_t len = utf8_sequence_length(s, start);
    if (len == 0 || !is_unicode_whitespace(decode_code_point(s, start, len))) break;
    b = start;
  }
  return end - b;
}

size_t whitespace_after(const std::string& s, size_t begin) {
  size_t e = begin;
  while (e < s.size()) {
    const size_t len = utf8_sequence_length(s, e);
    if (len == 0 || !is_unicode_whitespace(decode_code_point(s, e, len))) break;
    e += len;
  }
  return e - begin;
}

}  // namespace

AddedTokens::AddedTokens(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_id_[tokens_[i].id] = i;
    by_content_[tokens_[i].content] = i;
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& bucket : by_first_byte_)
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](size_t a, size_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
}

AddedTokens AddedTokens::parse(const json& added_tokens, const std::string& where) {
  if (added_tokens.is_null()) return AddedTokens();
  QF_REQUIRE(added_tokens.is_array(), where, ": added_tokens must be an array");
  std::vector<AddedToken> tokens;
  std::unordered_map<int64_t, size_t> seen_id;
  std::unordered_map<std::string, size_t> seen_content;
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const json& t = added_tokens[i];
    const std::string key = "added_tokens[" + std::to_string(i) + "]";
    QF_REQUIRE(t.is_object(), where, ": ", key, " must be an object");
    for (const auto& [k, v] : t.items())
      QF_REQUIRE(kAddedTokenKeys.count(k), where, ": ", key, ".", k, " is not an added-token field qforge reads");
    QF_REQUIRE(t.contains("id") && t["id"].is_number_integer() && t["id"].get<int64_t>() >= 0, where, ": ", key,
               ".id must be a non-negative integer");
    QF_REQUIRE(t.contains("content") && t["content"].is_string() && !t["content"].get<std::string>().empty(), where,
               ": ", key, ".content must be a non-empty string");
    QF_REQUIRE(!flag(t, "single_word", false, key, where), where, ": ", key,
               ".single_word = true is not supported (qforge matches added tokens anywhere)");
    AddedToken a;
    a.id = t["id"].get<int64_t>();
    a.content = t["content"].get<std::string>();
    require_utf8(a.content, where + ": " + key + ".content");
    a.special = flag(t, "special", false, key, where);
    a.lstrip = flag(t, "lstrip", false, key, where);
    a.rstrip = flag(t, "rstrip", false, key, where);
    a.normalized = flag(t, "normalized", !a.special, key, where);
    QF_REQUIRE(a.id <= kMaxTokenId, where, ": ", key, ".id = ", a.id, " is above the largest id ", kMaxTokenId);
    const auto [id_at, new_id] = seen_id.emplace(a.id, i);
    QF_REQUIRE(new_id, where, ": ", key, ".id = ", a.id, " is also added_tokens[", id_at->second, "].id");
    const auto [content_at, new_content] = seen_content.emplace(a.content, i);
    QF_REQUIRE(new_content, where, ": ", key, ".content \"", a.content, "\" is also added_tokens[",
               content_at->second, "].content");
    tokens.push_back(std::move(a));
  }
  return AddedTokens(std::move(tokens));
}

const AddedToken* AddedTokens::find(int64_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int64_t> AddedTokens::find(const std::string& content) const {
  const auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

std::optional<std::pair<size_t, size_t>> AddedTokens::next_match(const std::string& text, size_t from,
                                                                  bool normalized) const {
  for (size_t i = from; i < text.size(); ++i) {
    for (const size_t t : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const AddedToken& tok = tokens_[t];
      if (tok.normalized == normalized && text.compare(i, tok.content.size(), tok.content) == 0)
        return std::make_pair(t, i);
    }
  }
  return std::nullopt;
}

void AddedTokens::split_text(const std::string& text, bool normalized, std::vector<Segment>& out) const {
  size_t emitted = 0, search = 0;
  while (const auto match = next_match(text, search, normalized)) {
    const AddedToken& tok = tokens_[match->first];
    size_t begin = match->second, end = begin + tok.content.size();
    search = end;
    if (tok.lstrip) begin -= whitespace_before(text, begin, emitted);
    if (tok.rstrip) end += whitespace_after(text, end);
    if (begin > emitted) out.push_back({std::nullopt, text.substr(emitted, begin - emitted)});
    out.push_back({tok.id, text.substr(begin, end - begin)});
    emitted = std::max(emitted, end);
    search = std::max(search, emitted);
  }
  if (emitted < text.size()) out.push_back({std::nullopt, text.substr(emitted)});
}

std::vector<Segment> AddedTokens::split(std::vector<Segment> segments, bool normalized) const {
  if (tokens_.empty()) return segments;
  std::vector<Segment> out;
  for (Segment& s : segments) {
    if (s.id) {
      out.push_back(std::move(s));
    } else {
      split_text(s.text, normalized, out);
    }
  }
  return out;
}

}  // namespace qforge::text
