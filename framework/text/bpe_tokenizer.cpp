#include "framework/text/bpe_tokenizer.h"

#include "framework/core/error.h"
#include "framework/text/utf8.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

namespace qforge::text {

namespace {

using nlohmann::json;

const std::set<std::string> kTopLevelKeys{"version",      "truncation",     "padding", "added_tokens", "normalizer",
                                          "pre_tokenizer", "post_processor", "decoder", "model"};

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  QF_REQUIRE(f.good(), "framework/text: cannot open tokenizer file '", path, "'");
  std::ostringstream s;
  s << f.rdbuf();
  QF_REQUIRE(!f.bad(), "framework/text: cannot read tokenizer file '", path, "'");
  return s.str();
}

// TemplateProcessing's ids for one special-token name, from its "special_tokens" table.
using KnownId = std::function<bool(int64_t)>;

std::vector<int64_t> template_token_ids(const json& processor, const std::string& name, const std::string& key,
                                        const std::string& where, const KnownId& known) {
  const json& table = processor.contains("special_tokens") ? processor["special_tokens"] : json::object();
  QF_REQUIRE(table.is_object() && table.contains(name) && table[name].contains("ids") && table[name]["ids"].is_array(),
             where, ": ", key, ".special_tokens has no ids for \"", name, "\"");
  std::vector<int64_t> ids;
  for (const json& id : table[name]["ids"]) {
    QF_REQUIRE(id.is_number_integer() && id.get<int64_t>() >= 0, where, ": ", key, ".special_tokens[\"", name,
               "\"].ids must be non-negative integers");
    QF_REQUIRE(known(id.get<int64_t>()), where, ": ", key, ".special_tokens[\"", name, "\"].ids holds ",
               id.get<int64_t>(), ", which names no token of model.vocab or added_tokens");
    ids.push_back(id.get<int64_t>());
  }
  return ids;
}

// The "single" template: special tokens before and after the one sequence "A".
void parse_template(const json& processor, const std::string& key, const std::string& where, const KnownId& known,
                    std::vector<int64_t>& prefix, std::vector<int64_t>& suffix) {
  QF_REQUIRE(processor.contains("single") && processor["single"].is_array(), where, ": ", key,
             ".single must be an array");
  bool seen_sequence = false;
  for (const json& item : processor["single"]) {
    if (item.contains("Sequence")) {
      QF_REQUIRE(!seen_sequence, where, ": ", key, ".single holds more than one Sequence");
      seen_sequence = true;
      continue;
    }
    QF_REQUIRE(item.contains("SpecialToken") && item["SpecialToken"].contains("id") &&
                   item["SpecialToken"]["id"].is_string(),
               where, ": ", key, ".single items must be {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    const auto ids = template_token_ids(processor, item["SpecialToken"]["id"].get<std::string>(), key, where, known);
    auto& target = seen_sequence ? suffix : prefix;
    target.insert(target.end(), ids.begin(), ids.end());
  }
  QF_REQUIRE(seen_sequence, where, ": ", key, ".single has no Sequence");
}

void parse_post_processor(const json& p, const std::string& key, const std::string& where, const KnownId& known,
                          std::vector<int64_t>& prefix, std::vector<int64_t>& suffix) {
  if (p.is_null()) return;
  const std::string type = p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>() : "";
  if (type == "ByteLevel") return;  // it only trims offsets; ids are unchanged
  if (type == "TemplateProcessing") return parse_template(p, key, where, known, prefix, suffix);
  if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (size_t i = 0; i < p["processors"].size(); ++i)
      parse_post_processor(p["processors"][i], key + ".processors[" + std::to_string(i) + "]", where, known, prefix,
                           suffix);
    return;
  }
  throw Error(detail::str_cat(where, ": ", key, ".type ", p.contains("type") ? p["type"].dump() : "(none)",
                              " is not supported (qforge reads ByteLevel, TemplateProcessing and Sequence)"));
}

void refuse_unsupported_sections(const json& j, const std::string& where) {
  QF_REQUIRE(j.is_object(), where, ": a tokenizer.json must hold a JSON object");
  for (const auto& [key, value] : j.items())
    QF_REQUIRE(kTopLevelKeys.count(key), where, ": top-level key \"", key, "\" is not a tokenizer.json section");
  for (const char* key : {"truncation", "padding"})
    QF_REQUIRE(!j.contains(key) || j[key].is_null(), where, ": ", key,
               " must be null (qforge's tokenizers neither truncate nor pad; the caller does)");
  QF_REQUIRE(j.contains("model"), where, ": no \"model\" section");
}

// HF takes an added token's id from the model when the model has its content; qforge refuses a
// file whose added ids disagree with model.vocab instead of silently renumbering.
void check_added_against_model(const AddedTokens& added, const BpeModel& model, const std::string& where) {
  const auto& tokens = added.tokens();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const AddedToken& a = tokens[i];
    const std::string key = "added_tokens[" + std::to_string(i) + "]";
    const auto model_id = model.token_to_id(a.content);
    QF_REQUIRE(!model_id || *model_id == a.id, where, ": ", key, ".content \"", a.content, "\" is model.vocab's id ",
               model_id.value_or(-1), ", not ", key, ".id = ", a.id);
    const std::string* owner = model.id_to_token(a.id);
    QF_REQUIRE(!owner || *owner == a.content, where, ": ", key, ".id = ", a.id, " belongs to model.vocab[\"",
               owner ? *owner : "", "\"], not to \"", a.content, "\"");
  }
}

}  // namespace

BpeTokenizer::BpeTokenizer(BpeModel model, PreTokenizer pre_tokenizer, AddedTokens added)
    : model_(std::move(model)), pre_tokenizer_(std::move(pre_tokenizer)), added_(std::move(added)) {
  if (pre_tokenizer_.is_byte_level()) decoder_ = Decoder::byte_level();
}

BpeTokenizer BpeTokenizer::load(const std::string& path) { return parse(read_text_file(path), path); }

BpeTokenizer BpeTokenizer::parse(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(detail::str_cat(source, ": not a JSON tokenizer file (", e.what(), ")"));
  }
  refuse_unsupported_sections(j, source);
  BpeTokenizer t;
  t.model_ = BpeModel::parse(j["model"], source);
  t.normalizer_ = Normalizer::parse(j.contains("normalizer") ? j["normalizer"] : json(), source);
  t.pre_tokenizer_ = PreTokenizer::parse(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), source);
  t.added_ = AddedTokens::parse(j.contains("added_tokens") ? j["added_tokens"] : json(), source);
  check_added_against_model(t.added_, t.model_, source);
  t.decoder_ = Decoder::parse(j.contains("decoder") ? j["decoder"] : json(), source);
  const KnownId known = [&t](int64_t id) { return t.token_of(id) != nullptr; };
  parse_post_processor(j.contains("post_processor") ? j["post_processor"] : json(), "post_processor", source, known,
                       t.prefix_ids_, t.suffix_ids_);
  return t;
}

std::vector<int64_t> BpeTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  require_utf8(text, "framework/text: encode");
  // HF's order: raw-text added tokens, then the normalizer on what is left, then normalized ones.
  std::vector<Segment> segments = added_.split({{std::nullopt, text}}, false);
  if (!normalizer_.is_identity())
    for (Segment& s : segments)
      if (!s.id) s.text = normalizer_.normalize(s.text);
  segments = added_.split(std::move(segments), true);
  std::vector<int64_t> ids;
  if (add_special_tokens) ids = prefix_ids_;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.id) {
      ids.push_back(*s.id);
      continue;
    }
    if (s.text.empty()) continue;
    for (const std::string& piece : pre_tokenizer_.pre_tokenize(s.text, i == 0)) model_.tokenize(piece, ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

const std::string* BpeTokenizer::token_of(int64_t id) const {
  if (const AddedToken* a = added_.find(id)) return &a->content;
  return model_.id_to_token(id);
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string* token = token_of(ids[i]);
    QF_REQUIRE(token != nullptr, "framework/text: decode: ids[", i, "] = ", ids[i], " is not in the vocabulary (",
               vocab_size(), " ids)");
    const AddedToken* added = added_.find(ids[i]);
    if (skip_special_tokens && added && added->special) continue;
    tokens.push_back(*token);
  }
  return decoder_.decode(std::move(tokens));
}

int64_t BpeTokenizer::vocab_size() const {
  int64_t max_id = model_.max_id();
  for (const AddedToken& a : added_.tokens()) max_id = std::max(max_id, a.id);
  return max_id + 1;
}

std::optional<int64_t> BpeTokenizer::token_to_id(const std::string& token) const {
  if (const auto id = added_.find(token)) return id;
  return model_.token_to_id(token);
}

std::string BpeTokenizer::id_to_token(int64_t id) const {
  const std::string* token = token_of(id);
  QF_REQUIRE(token != nullptr, "framework/text: id ", id, " is not in the vocabulary (", vocab_size(), " ids)");
  return *token;
}

std::optional<int64_t> BpeTokenizer::bos_id() const {
  if (prefix_ids_.empty()) return std::nullopt;
  return prefix_ids_.front();
}

}  // namespace qforge::text
