// A recipe as a YAML tree: the file with its includes merged (later keys override), --set
// overrides applied, every key checked against the schema, and where each key was written, for
// errors found later. Internal to framework/recipe.
#pragma once

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <map>
#include <string>
#include <vector>

#include "framework/recipe/recipe.h"

namespace qforge::recipe_tree {

// The problems found so far; load_recipe throws them all at once.
struct Ctx {
  std::vector<RecipeIssue> issues;
  void add(const std::string& file, const YAML::Mark& m, const std::string& key, const std::string& msg) {
    issues.push_back(RecipeIssue{file, m.is_null() ? 0 : m.line + 1, m.is_null() ? 0 : m.column + 1, key, msg});
  }
};

// Where each key of the merged tree came from.
struct Origin {
  std::string file;
  YAML::Mark mark;
};
using Origins = std::map<std::string, Origin>;

// `path` with its includes merged and checked against the schema; problems go into ctx.
YAML::Node resolve(const std::string& path, Origins& origins, Ctx& ctx);

// Applies one --set key.path=value to `root`, checking key and value against the schema.
void apply_override(YAML::Node root, const std::string& text, Origins& origins, Ctx& ctx);

// A free-form map (model.config) as JSON: numbers, booleans and null typed, quoted scalars strings.
nlohmann::json to_json(const YAML::Node& n);

}  // namespace qforge::recipe_tree
