#include "framework/text/bpe_model.h"

#include "framework/core/error.h"
#include "framework/text/utf8.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>
#include <set>
#include <tuple>

namespace qforge::text {

namespace {

using nlohmann::json;


const std::set<std::string> kModelKeys{"type", "dropout", "unk_token", "continuing_subword_prefix",
                                       "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
                                       "vocab", "merges"};

// A string-or-null field; anything else is an error naming the key.
std::string optional_string(const json& model, const char* key, const std::string& where) {
  if (!model.contains(key) || model[key].is_null()) return "";
  QF_REQUIRE(model[key].is_string(), where, ": model.", key, " must be a string or null");
  return model[key].get<std::string>();
}

bool optional_bool(const json& model, const char* key, const std::string& where) {
  if (!model.contains(key) || model[key].is_null()) return false;
  QF_REQUIRE(model[key].is_boolean(), where, ": model.", key, " must be true or false");
  return model[key].get<bool>();
}

// One merge in either form tokenizer.json uses: "a b" (split at the single space) or ["a", "b"].
std::pair<std::string, std::string> parse_merge(const json& m, size_t i, const std::string& where) {
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    QF_REQUIRE(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, where, ": model.merges[",
               i, "] = \"", s, "\" is not two tokens separated by one space");
    return {s.substr(0, space), s.substr(space + 1)};
  }
  QF_REQUIRE(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), where, ": model.merges[", i,
             "] must be \"a b\" or [\"a\", \"b\"]");
  return {m[0].get<std::string>(), m[1].get<std::string>()};
}

// Byte-fallback token of byte b: "<0x41>", the spelling of HF and SentencePiece.
std::string byte_token(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
  return buf;
}

}  // namespace

BpeModel BpeModel::build(std::unordered_map<std::string, int64_t> vocab,
                         const std::vector<std::pair<std::string, std::string>>& merges, const std::string& where) {
  BpeModel m;
  for (const auto& [token, id] : vocab) {
    QF_REQUIRE(id >= 0 && id <= kMaxTokenId, where, ": model.vocab[\"", token, "\"] = ", id, " is not an id in [0, ",
               kMaxTokenId, "]");
    const auto [at, fresh] = m.vocab_r_.emplace(id, token);
    QF_REQUIRE(fresh, where, ": model.vocab[\"", token, "\"] and model.vocab[\"", at->second, "\"] share id ", id);
    m.max_id_ = std::max(m.max_id_, id);
  }
  m.vocab_ = std::move(vocab);
  m.add_merges(merges, where);
  return m;
}

void BpeModel::add_merges(const std::vector<std::pair<std::string, std::string>>& merges, const std::string& where) {
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    // HF's merged token drops b's continuing_subword_prefix ("a" + "##b" -> "ab").
    const std::string& prefix = continuing_subword_prefix_;
    QF_REQUIRE(b.compare(0, prefix.size(), prefix) == 0, where, ": model.merges[", i, "] (\"", a, "\", \"", b,
               "\"): the second token does not start with model.continuing_subword_prefix \"", prefix, "\"");
    const std::string ab = a + b.substr(prefix.size());
    const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(ab);
    QF_REQUIRE(ia != vocab_.end() && ib != vocab_.end() && iab != vocab_.end(), where, ": model.merges[", i,
               "] (\"", a, "\", \"", b, "\") names a token missing from model.vocab (\"",
               ia == vocab_.end() ? a : ib == vocab_.end() ? b : ab, "\")");
    // A repeated pair takes its last rank, as HF's merge map does.
    merges_[pair_key(ia->second, ib->second)] = {static_cast<int64_t>(i), iab->second};
  }
}

BpeModel BpeModel::parse(const json& model, const std::string& where) {
  QF_REQUIRE(model.is_object(), where, ": model must be an object");
  for (const auto& [key, value] : model.items())
    QF_REQUIRE(kModelKeys.count(key), where, ": model.", key, " is not a BPE model field qforge reads");
  // HF reads a model without "type" as BPE when it has merges (its untagged fallback).
  QF_REQUIRE(!model.contains("type") || model["type"] == "BPE", where, ": model.type must be \"BPE\" (found ",
             model["type"].dump(),
             "); WordPiece, Unigram and WordLevel models are not supported");
  if (model.contains("dropout") && !model["dropout"].is_null())
    QF_REQUIRE(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0, where,
               ": model.dropout must be null or 0 (BPE dropout is random; qforge encodes deterministically)");
  QF_REQUIRE(model.contains("vocab") && model["vocab"].is_object(), where, ": model.vocab must be an object");
  QF_REQUIRE(model.contains("merges") && model["merges"].is_array(), where, ": model.merges must be an array");
  std::unordered_map<std::string, int64_t> vocab;
  for (const auto& [token, id] : model["vocab"].items()) {
    QF_REQUIRE(id.is_number_integer(), where, ": model.vocab[\"", token, "\"] must be an integer id");
    vocab[token] = id.get<int64_t>();
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(model["merges"].size());
  for (size_t i = 0; i < model["merges"].size(); ++i) merges.push_back(parse_merge(model["merges"][i], i, where));
  BpeModel m = build(std::move(vocab), {}, where);
  // The prefix shapes the merged tokens, so it is read before the merges.
  m.continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix", where);
  m.add_merges(merges, where);
  const std::string unk = optional_string(model, "unk_token", where);
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    QF_REQUIRE(m.vocab_.count(unk), where, ": model.unk_token \"", unk, "\" is not in model.vocab");
    m.unk_token_ = unk;
  }
  m.end_of_word_suffix_ = optional_string(model, "end_of_word_suffix", where);
  m.fuse_unk_ = optional_bool(model, "fuse_unk", where);
  m.byte_fallback_ = optional_bool(model, "byte_fallback", where);
  m.ignore_merges_ = optional_bool(model, "ignore_merges", where);
  return m;
}

std::optional<int64_t> BpeModel::token_to_id(const std::string& token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int64_t id) const {
  const auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : &it->second;
}

// One symbol per character; a character outside the vocabulary becomes its byte tokens (byte
// fallback), else the unknown token (fused over a run when fuse_unk), else nothing, as in HF.
void BpeModel::symbol_ids(const std::string& piece, std::vector<int64_t>& symbols) const {
  std::optional<int64_t> pending_unk;
  for (size_t i = 0; i < piece.size();) {
    const size_t len = std::max<size_t>(1, utf8_sequence_length(piece, i));
    std::string s = piece.substr(i, len);
    if (i > 0) s = continuing_subword_prefix_ + s;
    if (i + len == piece.size()) s += end_of_word_suffix_;
    const auto it = vocab_.find(s);
    i += len;
    if (it != vocab_.end()) {
      if (pending_unk) symbols.push_back(*pending_unk);
      pending_unk.reset();
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int64_t> bytes;
      for (const char c : s) {
        const auto b = vocab_.find(byte_token(static_cast<unsigned char>(c)));
        if (b == vocab_.end()) break;
        bytes.push_back(b->second);
      }
      if (bytes.size() == s.size()) {
        symbols.insert(symbols.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (!unk_token_) continue;
    if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
    pending_unk = vocab_.at(*unk_token_);
  }
  if (pending_unk) symbols.push_back(*pending_unk);
}

void BpeModel::merge_all(std::vector<int64_t>& symbols) const {
  const size_t n = symbols.size();
  std::vector<int64_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    next[i] = static_cast<int64_t>(i) + 1 < static_cast<int64_t>(n) ? static_cast<int64_t>(i) + 1 : -1;
    prev[i] = static_cast<int64_t>(i) - 1;
  }
  // (rank, position, new id): the smallest rank first, the leftmost among equal ranks.
  using Candidate = std::tuple<int64_t, int64_t, int64_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int64_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    const auto it = merges_.find(pair_key(symbols[pos], symbols[next[pos]]));
    if (it != merges_.end()) queue.emplace(it->second.rank, pos, it->second.new_id);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
  while (!queue.empty()) {
    const auto [rank, pos, new_id] = queue.top();
    queue.pop();
    if (!alive[pos] || next[pos] < 0) continue;
    // Stale entry: the pair at pos changed since it was queued.
    const auto it = merges_.find(pair_key(symbols[pos], symbols[next[pos]]));
    if (it == merges_.end() || it->second.new_id != new_id) continue;
    const int64_t right = next[pos];
    symbols[pos] = new_id;
    alive[right] = false;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[next[pos]] = pos;
    push(prev[pos]);
    push(pos);
  }
  size_t out = 0;
  for (size_t i = 0; i < n; ++i)
    if (alive[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

void BpeModel::tokenize(const std::string& piece, std::vector<int64_t>& ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  std::vector<int64_t> symbols;
  symbol_ids(piece, symbols);
  merge_all(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

}  // namespace qforge::text
