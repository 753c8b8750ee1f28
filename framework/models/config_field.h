// One reader for the fields of an HF-style config.json (BERT, GPT-2): absent or null fields keep
// the default, a field of the wrong type is an error naming the model and the field.
#pragma once

#include <nlohmann/json.hpp>

#include "framework/core/error.h"

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

}  // namespace qforge::models
