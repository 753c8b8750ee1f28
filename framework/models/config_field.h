// One reader, checker and writer for the fields of an HF-style config.json (BERT, GPT-2). A
// config lists its fields once, in reading order, in a static `fields(self, visit)` that calls
// visit(json name, member, rule) per field; read_config, require_positive_fields and
// config_json walk that list. Absent or null fields keep the default, a field of the wrong type
// is an error naming the model and the field.
#pragma once

#include <nlohmann/json.hpp>

#include <type_traits>

#include "framework/core/error.h"
#include "framework/models/field_rule.h"

namespace qforge::models {

template <typename T>
void get_config_field(const nlohmann::json& j, const char* who, const char* name, T& out) {
  if (!j.contains(name) || j[name].is_null()) return;
  try {
    out = j[name].get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(detail::str_cat(who, ": config field '", name, "' has the wrong type: ", j[name].dump()));
  }
}

// The listed fields of `j` over the defaults `c`; `who` ("models/bert") starts every message. A
// null kNonPositiveIsNull field reads as 0 ("derived"), whatever its default.
template <typename Config>
Config read_config(const nlohmann::json& j, const char* who, Config c = Config{}) {
  QF_REQUIRE(j.is_object(), who, ": config is not a JSON object");
  Config::fields(c, [&](const char* name, auto& member, FieldRule rule) {
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(member)>>) {
      if (rule == FieldRule::kNonPositiveIsNull && j.contains(name) && j[name].is_null()) {
        member = 0;
        return;
      }
    }
    get_config_field(j, who, name, member);
  });
  return c;
}

// Every kPositive field is > 0, checked in listing order.
template <typename Config>
void require_positive_fields(const Config& c, const char* who) {
  Config::fields(c, [&](const char* name, const auto& member, FieldRule rule) {
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(member)>>) {
      if (rule == FieldRule::kPositive)
        QF_REQUIRE(member > 0, who, ": config field '", name, "' must be > 0, got ", member);
    }
  });
}

// Attention splits the hidden width into heads of equal size.
inline void require_heads_divide(const char* who, const char* hidden_name, int64_t hidden, const char* heads_name,
                                 int64_t heads) {
  QF_REQUIRE(hidden % heads == 0, who, ": ", hidden_name, " ", hidden, " is not a multiple of ", heads_name, " ", heads);
}

// HF's config.json for `architecture`: model_type, architectures and every listed field.
template <typename Config>
nlohmann::json config_json(const Config& c, const char* model_type, const char* architecture) {
  nlohmann::json j = {{"model_type", model_type}, {"architectures", {architecture}}};
  Config::fields(c, [&](const char* name, const auto& member, FieldRule rule) {
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(member)>>) {
      if (rule == FieldRule::kNonPositiveIsNull && member <= 0) {
        j[name] = nullptr;
        return;
      }
    }
    j[name] = member;
  });
  return j;
}

}  // namespace qforge::models
