// Internal to framework/recipe: where the resolved recipe's keys were written (Where), so checks
// that run after validation report at the key's file:line:column, and the checks split out of
// recipe.cpp by what they read (recipe_ptq.cpp: the ptq section).
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "framework/recipe/recipe.h"
#include "framework/recipe/recipe_tree.h"

namespace qforge::recipe_detail {

// Where the keys of the resolved tree were written: problems found after validation point there.
struct Where {
  const std::string& path;
  const recipe_tree::Origins& origins;
  recipe_tree::Ctx& ctx;

  // A list element set by --set as a whole list: the list's origin.
  recipe_tree::Origin at(const std::string& key) const {
    for (std::string k = key;;) {
      if (auto it = origins.find(k); it != origins.end()) return it->second;
      const size_t bracket = k.rfind('[');
      if (bracket == std::string::npos || k.back() != ']') break;
      k.erase(bracket);
    }
    return recipe_tree::Origin{path, YAML::Mark::null_mark()};
  }
  void problem(const std::string& key, const std::string& msg) const {
    const recipe_tree::Origin o = at(key);
    ctx.add(o.file, o.mark, key, msg);
  }
  // Where a key is written, for errors found later (by the search or the solvers).
  RecipeIssue site(const std::string& key) const {
    const recipe_tree::Origin o = at(key);
    return RecipeIssue{o.file, o.mark.is_null() ? 0 : o.mark.line + 1, o.mark.is_null() ? 0 : o.mark.column + 1, key, ""};
  }
};

// The scheme or one of its rules quantizes weights.
inline bool any_weights_quantized(const Scheme& s) {
  bool any = s.weights.has_value();
  for (const LayerRule& rule : s.rules) any |= rule.weights.has_value() && !rule.keep_float;
  return any;
}

// Reads the ptq section's derived fields (AWQ methods, rules) and checks it against the rest of the
// recipe (recipe_ptq.cpp).
void read_ptq(Recipe& r, const YAML::Node& pn, const Where& w);

}  // namespace qforge::recipe_detail
