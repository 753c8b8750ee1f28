// What a config field asks beyond its JSON type; configs name it in their field lists
// (BertConfig::fields), read by framework/models/config_field.h.
#pragma once

namespace qforge::models {

enum class FieldRule {
  kAny,
  kPositive,    // must be > 0
  kNonPositiveIsNull,  // <= 0 means "derived" and is written as JSON null (GPT-2's n_inner)
};

}  // namespace qforge::models
