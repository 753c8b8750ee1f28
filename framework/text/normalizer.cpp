#include "framework/text/normalizer.h"

#include "framework/core/error.h"

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <map>

namespace qforge::text {

namespace {

using nlohmann::json;

std::string unicode_form(const std::string& text, const icu::Normalizer2* (*instance)(UErrorCode&)) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = instance(status);
  QF_REQUIRE(U_SUCCESS(status), "framework/text: ICU normalizer unavailable: ", u_errorName(status));
  const icu::UnicodeString out = n->normalize(icu::UnicodeString::fromUTF8(text), status);
  QF_REQUIRE(U_SUCCESS(status), "framework/text: ICU normalization failed: ", u_errorName(status));
  std::string result;
  out.toUTF8String(result);
  return result;
}

std::string string_field(const json& step, const char* name, const std::string& key, const std::string& where) {
  QF_REQUIRE(step.contains(name) && step[name].is_string(), where, ": ", key, ".", name, " must be a string");
  return step[name].get<std::string>();
}

}  // namespace

std::string replace_all(const std::string& text, const std::string& pattern, const std::string& content) {
  std::string out;
  size_t from = 0;
  for (size_t at = text.find(pattern); at != std::string::npos; at = text.find(pattern, from)) {
    out.append(text, from, at - from);
    out += content;
    from = at + pattern.size();
  }
  out.append(text, from, std::string::npos);
  return out;
}

void Normalizer::add_step(const json& step, const std::string& key, const std::string& where) {
  static const std::map<std::string, Kind> kForms{
      {"NFC", Kind::kNfc}, {"NFD", Kind::kNfd}, {"NFKC", Kind::kNfkc}, {"NFKD", Kind::kNfkd}};
  const std::string type = step.is_object() && step.contains("type") && step["type"].is_string()
                               ? step["type"].get<std::string>() : "";
  if (type == "Sequence") {
    QF_REQUIRE(step.contains("normalizers") && step["normalizers"].is_array(), where, ": ", key,
               ".normalizers must be an array");
    for (size_t i = 0; i < step["normalizers"].size(); ++i)
      add_step(step["normalizers"][i], key + ".normalizers[" + std::to_string(i) + "]", where);
  } else if (const auto form = kForms.find(type); form != kForms.end()) {
    QF_REQUIRE(step.size() == 1, where, ": ", key, " has fields besides \"type\"; ", type, " takes none");
    steps_.push_back({form->second, "", ""});
  } else if (type == "Prepend") {
    steps_.push_back({Kind::kPrepend, "", string_field(step, "prepend", key, where)});
  } else if (type == "Replace") {
    const json& pattern = step.contains("pattern") ? step["pattern"] : json();
    QF_REQUIRE(pattern.is_object() && pattern.contains("String") && pattern["String"].is_string() &&
                   !pattern["String"].get<std::string>().empty(),
               where, ": ", key, ".pattern must be {\"String\": \"...\"} (regex replacement is not supported)");
    steps_.push_back({Kind::kReplace, pattern["String"].get<std::string>(), string_field(step, "content", key, where)});
  } else {
    throw Error(detail::str_cat(where, ": ", key, ".type ", step.is_object() && step.contains("type") ? step["type"].dump() : "(none)",
                                " is not supported (qforge reads NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence and null)"));
  }
}

Normalizer Normalizer::parse(const json& normalizer, const std::string& where) {
  Normalizer n;
  if (!normalizer.is_null()) n.add_step(normalizer, "normalizer", where);
  return n;
}

std::string Normalizer::normalize(const std::string& text) const {
  std::string s = text;
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kNfc: s = unicode_form(s, &icu::Normalizer2::getNFCInstance); break;
      case Kind::kNfd: s = unicode_form(s, &icu::Normalizer2::getNFDInstance); break;
      case Kind::kNfkc: s = unicode_form(s, &icu::Normalizer2::getNFKCInstance); break;
      case Kind::kNfkd: s = unicode_form(s, &icu::Normalizer2::getNFKDInstance); break;
      // HF prepends only to a non-empty text.
      case Kind::kPrepend: s = s.empty() ? s : step.content + s; break;
      case Kind::kReplace: s = replace_all(s, step.pattern, step.content); break;
    }
  }
  return s;
}

}  // namespace qforge::text
