// The recipe schema: every key of a recipe as a tree of Fields (type, documentation, choices,
// range), the leaves bound to the Recipe members they set. Validation, --set, defaults in the
// resolved recipe and docs/recipes.md all walk this one tree. Internal to framework/recipe.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "framework/recipe/recipe.h"

namespace qforge::recipe_schema {

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class T { kMap, kFreeMap, kList, kString, kInt, kFloat, kBool, kEnum };

struct Field {
  std::string name;
  T type;
  std::string doc;
  std::vector<std::string> choices;
  double min = -kInf, max = kInf;
  std::vector<Field> children;
  // Bound fields write their value into the Recipe (load_recipe) and read it back (the resolved
  // recipe writes every effective value, defaults included; a null node: nothing to write).
  struct Binding {
    std::function<void(const YAML::Node&, Recipe&)> set;
    std::function<YAML::Node(const Recipe&)> get;
  } bound;
};

Field leaf(std::string name, T type, std::string doc, double min = -kInf, double max = kInf);
Field choice(std::string name, std::vector<std::string> choices, std::string doc);
Field map(std::string name, std::string doc, std::vector<Field> children);
Field list(std::string name, std::string doc, Field element);

// A value as the resolved recipe writes it; doubles with 15 significant digits, so defaults read
// as written in recipe.h (99.99, not 99.989999999999995) and parse back to the same double.
template <class V>
YAML::Node to_node(const V& v) {
  if constexpr (std::is_floating_point_v<V>) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.15g", static_cast<double>(v));
    return YAML::Node(std::string(buf));
  } else {
    return YAML::Node(v);
  }
}

// A field bound to a Recipe member: its key is written once, here; its default is the member's
// initializer in recipe.h; load_recipe sets every bound field the resolved tree holds.
template <class Section, class V>
Field bind(Field f, Section Recipe::*section, V Section::*member) {
  f.bound.set = [section, member](const YAML::Node& n, Recipe& r) { (r.*section).*member = n.as<V>(); };
  f.bound.get = [section, member](const Recipe& r) { return to_node((r.*section).*member); };
  return f;
}
template <class V>
Field bind(Field f, V Recipe::*member) {
  f.bound.set = [member](const YAML::Node& n, Recipe& r) { r.*member = n.as<V>(); };
  f.bound.get = [member](const Recipe& r) { return to_node(r.*member); };
  return f;
}
// A field bound through a conversion (an enum by name, an optional grid).
Field bind(Field f, std::function<void(const YAML::Node&, Recipe&)> set, std::function<YAML::Node(const Recipe&)> get);

const Field& schema();

// Sets every bound field of `f` that `n` holds (the tree is validated already).
void apply_bound(const Field& f, const YAML::Node& n, Recipe& r);

// Writes the effective value of every bound field of `f` that `n` lacks, so the resolved recipe
// does not depend on this version's defaults. Skipped: empty strings (an unset path), values a
// field's range refuses (0 for "not given" budgets), which mean "absent" rather than a value, and
// values the getter leaves null (group_size without per_group).
void fill_defaults(const Field& f, YAML::Node n, const Recipe& r);

std::string dotted(const std::string& prefix, const std::string& key);

}  // namespace qforge::recipe_schema
