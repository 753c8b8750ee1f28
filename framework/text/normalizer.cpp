#include "framework/text/normalizer.h"

#include "framework/core/error.h"

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

namespace qforge::text {

Normalizer Normalizer::parse(const nlohmann::json& normalizer, const std::string& where) {
  Normalizer n;
  if (normalizer.is_null()) return n;
  const std::string type =
      normalizer.is_object() && normalizer.contains("type") && normalizer["type"].is_string() ? normalizer["type"].get<std::string>() : "";
  if (type == "NFC") n.form_ = Form::kNfc;
  else if (type == "NFD") n.form_ = Form::kNfd;
  else if (type == "NFKC") n.form_ = Form::kNfkc;
  else if (type == "NFKD") n.form_ = Form::kNfkd;
  QF_REQUIRE(n.form_ != Form::kNone, where, ": normalizer.type ",
             normalizer.contains("type") ? normalizer["type"].dump() : "(none)",
             " is not supported (qforge reads NFC, NFD, NFKC, NFKD and null)");
  QF_REQUIRE(normalizer.size() == 1, where, ": normalizer has fields besides \"type\"; ", type, " takes none");
  return n;
}

std::string Normalizer::normalize(const std::string& text) const {
  if (form_ == Form::kNone) return text;
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = form_ == Form::kNfc    ? icu::Normalizer2::getNFCInstance(status)
                              : form_ == Form::kNfd  ? icu::Normalizer2::getNFDInstance(status)
                              : form_ == Form::kNfkc ? icu::Normalizer2::getNFKCInstance(status)
                                                     : icu::Normalizer2::getNFKDInstance(status);
  QF_REQUIRE(U_SUCCESS(status), "framework/text: ICU normalizer unavailable: ", u_errorName(status));
  const icu::UnicodeString out = n->normalize(icu::UnicodeString::fromUTF8(text), status);
  QF_REQUIRE(U_SUCCESS(status), "framework/text: ICU normalization failed: ", u_errorName(status));
  std::string result;
  out.toUTF8String(result);
  return result;
}

}  // namespace qforge::text
