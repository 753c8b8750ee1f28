#include "framework/text/pre_tokenizer.h"

#include "framework/core/error.h"
#include "framework/text/byte_level.h"

#include <nlohmann/json.hpp>

#include <set>

namespace qforge::text {

namespace {

using nlohmann::json;

void require_keys(const json& step, const std::set<std::string>& known, const std::string& key,
                  const std::string& where) {
  for (const auto& [k, v] : step.items())
    QF_REQUIRE(known.count(k), where, ": ", key, ".", k, " is not a field qforge reads for ", key, ".type ",
               step["type"].dump());
}

bool bool_field(const json& step, const char* name, bool fallback, const std::string& key, const std::string& where) {
  if (!step.contains(name)) return fallback;
  QF_REQUIRE(step[name].is_boolean(), where, ": ", key, ".", name, " must be true or false");
  return step[name].get<bool>();
}

}  // namespace

PreTokenizer PreTokenizer::byte_level(const std::string& pattern) {
  PreTokenizer p;
  Step s;
  s.byte_level = true;
  s.regex.emplace(pattern, false, "framework/text: byte-level pre-tokenizer");
  p.steps_.push_back(std::move(s));
  return p;
}

void PreTokenizer::add_step(const json& step, const std::string& key, const std::string& where) {
  QF_REQUIRE(step.is_object() && step.contains("type") && step["type"].is_string(), where, ": ", key,
             " must be an object with a \"type\"");
  const std::string type = step["type"].get<std::string>();
  if (type == "Sequence") {
    require_keys(step, {"type", "pretokenizers"}, key, where);
    QF_REQUIRE(step.contains("pretokenizers") && step["pretokenizers"].is_array(), where, ": ", key,
               ".pretokenizers must be an array");
    for (size_t i = 0; i < step["pretokenizers"].size(); ++i)
      add_step(step["pretokenizers"][i], key + ".pretokenizers[" + std::to_string(i) + "]", where);
    return;
  }
  Step s;
  if (type == "ByteLevel") {
    require_keys(step, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, key, where);
    s.byte_level = true;
    s.add_prefix_space = bool_field(step, "add_prefix_space", true, key, where);
    if (bool_field(step, "use_regex", true, key, where)) s.regex.emplace(kGpt2Pattern, false, where + ": " + key);
  } else if (type == "Split") {
    require_keys(step, {"type", "pattern", "behavior", "invert"}, key, where);
    QF_REQUIRE(step.contains("behavior") && step["behavior"] == "Isolated", where, ": ", key,
               ".behavior must be \"Isolated\" (found ", step.contains("behavior") ? step["behavior"].dump() : "nothing",
               "); Removed, MergedWithPrevious, MergedWithNext and Contiguous are not supported");
    QF_REQUIRE(!bool_field(step, "invert", false, key, where), where, ": ", key, ".invert = true is not supported");
    const json& pattern = step.contains("pattern") ? step["pattern"] : json();
    const bool regex = pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string();
    const bool literal = pattern.is_object() && pattern.contains("String") && pattern["String"].is_string();
    QF_REQUIRE(pattern.size() == 1 && (regex || literal), where, ": ", key,
               ".pattern must be {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    s.regex.emplace(pattern[regex ? "Regex" : "String"].get<std::string>(), literal, where + ": " + key + ".pattern");
  } else if (type == "Metaspace") {
    s = metaspace_step(step, key, where);
  } else {
    throw Error(detail::str_cat(where, ": ", key, ".type ", step["type"].dump(),
                                " is not supported (qforge reads ByteLevel, Split, Metaspace and Sequence pre-tokenizers)"));
  }
  steps_.push_back(std::move(s));
}

PreTokenizer::Step PreTokenizer::metaspace_step(const json& step, const std::string& key, const std::string& where) {
  require_keys(step, {"type", "replacement", "str_rep", "add_prefix_space", "prepend_scheme", "split"}, key, where);
  Step s;
  QF_REQUIRE(step.contains("replacement") && step["replacement"].is_string() &&
                 !step["replacement"].get<std::string>().empty(),
             where, ": ", key, ".replacement must be a character");
  s.replacement = step["replacement"].get<std::string>();
  s.split = bool_field(step, "split", true, key, where);
  // tokenizers < 0.19 wrote add_prefix_space; later files prepend_scheme.
  s.prepend = bool_field(step, "add_prefix_space", true, key, where) ? Prepend::kAlways : Prepend::kNever;
  if (step.contains("prepend_scheme")) {
    const json& scheme = step["prepend_scheme"];
    QF_REQUIRE(scheme == "always" || scheme == "first" || scheme == "never", where, ": ", key,
               ".prepend_scheme must be \"always\", \"first\" or \"never\" (found ", scheme.dump(), ")");
    s.prepend = scheme == "always" ? Prepend::kAlways : scheme == "first" ? Prepend::kFirst : Prepend::kNever;
  }
  return s;
}

// Spaces become the replacement, the prefix is added where the scheme says, and with `split` the
// piece is cut before every replacement (HF's MergedWithNext).
void PreTokenizer::metaspace(const Step& step, std::string piece, bool first, std::vector<std::string>& out) {
  const std::string& r = step.replacement;
  std::string text;
  for (const char c : piece) text += c == ' ' ? r : std::string(1, c);
  const bool prepend = step.prepend == Prepend::kAlways || (step.prepend == Prepend::kFirst && first);
  if (prepend && text.compare(0, r.size(), r) != 0) text = r + text;
  if (!step.split) {
    if (!text.empty()) out.push_back(std::move(text));
    return;
  }
  size_t begin = 0;
  for (size_t at = text.find(r, 1); at != std::string::npos; at = text.find(r, at + r.size())) {
    if (at > begin) out.push_back(text.substr(begin, at - begin));
    begin = at;
  }
  if (begin < text.size()) out.push_back(text.substr(begin));
}

PreTokenizer PreTokenizer::parse(const json& pre_tokenizer, const std::string& where) {
  PreTokenizer p;
  if (!pre_tokenizer.is_null()) p.add_step(pre_tokenizer, "pre_tokenizer", where);
  return p;
}

bool PreTokenizer::is_byte_level() const {
  for (const Step& s : steps_)
    if (s.byte_level) return true;
  return false;
}

std::vector<std::string> PreTokenizer::pre_tokenize(const std::string& segment, bool at_start) const {
  std::vector<std::string> pieces{segment};
  for (const Step& step : steps_) {
    std::vector<std::string> out;
    for (size_t i = 0; i < pieces.size(); ++i) {
      std::string& piece = pieces[i];
      if (!step.replacement.empty()) {
        metaspace(step, std::move(piece), at_start && i == 0, out);
        continue;
      }
      // HF prepends the space to every segment between added tokens, not only the first.
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(piece.begin(), ' ');
      if (step.regex) {
        for (const auto& [b, e] : step.regex->split_isolated(piece)) out.push_back(piece.substr(b, e - b));
      } else if (!piece.empty()) {
        out.push_back(std::move(piece));
      }
    }
    if (step.byte_level)
      for (std::string& piece : out) piece = byte_level_encode(piece);
    pieces = std::move(out);
  }
  return pieces;
}

}  // namespace qforge::text
