// Includes, overrides and schema validation of a recipe's YAML tree (recipe_tree.h).
#include "framework/recipe/recipe_tree.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "framework/recipe/recipe_schema.h"

namespace qforge::recipe_tree {

using recipe_schema::dotted;
using recipe_schema::Field;
using recipe_schema::schema;
using recipe_schema::T;

namespace {

std::string hint(const std::string& key, const std::vector<std::string>& candidates) {
  const std::string c = closest_match(key, candidates);
  return c.empty() ? "" : " (did you mean '" + c + "'?)";
}

const char* type_name(T t) {
  switch (t) {
    case T::kMap: case T::kFreeMap: return "a mapping";
    case T::kList: return "a list";
    case T::kString: return "a string";
    case T::kInt: return "an integer";
    case T::kFloat: return "a number";
    case T::kBool: return "true or false";
    case T::kEnum: return "one of the listed values";
  }
  return "?";
}

// Checks `node` against `field`, recursively; reports into ctx.
void validate(const YAML::Node& node, const Field& field, const std::string& path, const std::string& file, Ctx& ctx) {
  const YAML::Mark mark = node.Mark();
  switch (field.type) {
    case T::kFreeMap:
      if (!node.IsNull() && !node.IsMap()) ctx.add(file, mark, path, std::string("must be ") + type_name(field.type));
      return;
    case T::kMap: {
      if (node.IsNull()) return;
      if (!node.IsMap()) {
        ctx.add(file, mark, path, "must be a mapping of keys");
        return;
      }
      std::vector<std::string> names;
      for (const Field& c : field.children) names.push_back(c.name);
      std::map<std::string, YAML::Mark> seen;
      for (const auto& kv : node) {
        const std::string key = kv.first.Scalar();
        if (const auto [first, fresh] = seen.emplace(key, kv.first.Mark()); !fresh) {
          // yaml-cpp would keep the first, PyYAML the last: neither is what the author meant.
          ctx.add(file, kv.first.Mark(), dotted(path, key),
                  "duplicate key (first at line " + std::to_string(first->second.line + 1) + ")");
          continue;
        }
        const auto it = std::find_if(field.children.begin(), field.children.end(),
                                     [&](const Field& c) { return c.name == key; });
        if (it == field.children.end()) {
          ctx.add(file, kv.first.Mark(), dotted(path, key), "unknown key" + hint(key, names));
          continue;
        }
        validate(kv.second, *it, dotted(path, key), file, ctx);
      }
      return;
    }
    case T::kList:
      if (!node.IsSequence()) {
        ctx.add(file, mark, path, "must be a list");
        return;
      }
      for (size_t i = 0; i < node.size(); ++i)
        validate(node[i], field.children[0], path + "[" + std::to_string(i) + "]", file, ctx);
      return;
    default: break;
  }
  if (!node.IsScalar()) {
    ctx.add(file, mark, path, std::string("must be ") + type_name(field.type));
    return;
  }
  const std::string v = node.Scalar();
  try {
    if (field.type == T::kInt) {
      const auto x = node.as<int64_t>();
      if (x < field.min || x > field.max)
        ctx.add(file, mark, path, "value " + v + " is out of range [" + std::to_string(static_cast<int64_t>(field.min)) +
                                      ", " + std::to_string(static_cast<int64_t>(field.max)) + "]");
    } else if (field.type == T::kFloat) {
      const auto x = node.as<double>();
      if (!std::isfinite(x) || x < field.min || x > field.max) {
        std::ostringstream os;
        os << "value " << v << " is out of range [" << field.min << ", " << field.max << "]";
        ctx.add(file, mark, path, os.str());
      }
    } else if (field.type == T::kBool) {
      node.as<bool>();
    } else if (field.type == T::kEnum) {
      if (std::find(field.choices.begin(), field.choices.end(), v) == field.choices.end()) {
        std::string all;
        for (const auto& c : field.choices) all += (all.empty() ? "" : ", ") + c;
        ctx.add(file, mark, path, "'" + v + "' is not valid" + hint(v, field.choices) + "; valid: " + all);
      }
    }
  } catch (const YAML::Exception&) {
    ctx.add(file, mark, path, "'" + v + "' is not " + type_name(field.type));
  }
}

void record_origins(const YAML::Node& node, const std::string& path, const std::string& file, Origins& origins) {
  origins[path] = Origin{file, node.Mark()};
  if (node.IsMap())
    for (const auto& kv : node) record_origins(kv.second, dotted(path, kv.first.Scalar()), file, origins);
  if (node.IsSequence())
    for (size_t i = 0; i < node.size(); ++i)
      record_origins(node[i], path + "[" + std::to_string(i) + "]", file, origins);
}

// base <- overlay, maps merged key by key, everything else replaced.
void deep_merge(YAML::Node base, const YAML::Node& overlay) {
  for (const auto& kv : overlay) {
    const std::string key = kv.first.Scalar();
    if (base[key] && base[key].IsMap() && kv.second.IsMap()) {
      deep_merge(base[key], kv.second);
    } else {
      base[key] = YAML::Clone(kv.second);
    }
  }
}

// Limits that keep a hostile recipe from taking minutes or gigabytes: a recipe file is text of
// a few kilobytes, its tree (aliases expanded) a few hundred nodes, its includes a handful.
constexpr std::uintmax_t kMaxRecipeBytes = 1 << 20;
constexpr int64_t kMaxRecipeNodes = 100000;
constexpr size_t kMaxIncludeDepth = 16;
constexpr int kMaxIncludes = 256;

constexpr int kMaxRecipeDepth = 64;

// Why `n` is not a recipe tree, or "": more than kMaxRecipeNodes nodes with aliases expanded (as
// every later walk sees them), or nesting deeper than kMaxRecipeDepth. The depth bound also stops
// an alias inside its own anchor (`a: &x {<<: *x}`), which yaml-cpp loads as a node containing
// itself: every later walk would recurse until the stack ends.
std::string tree_bounds_problem(const YAML::Node& root) {
  int64_t budget = kMaxRecipeNodes;
  bool too_deep = false;
  const auto walk = [&](const auto& self, const YAML::Node& n, int depth) -> bool {
    if (--budget < 0) return false;
    if (depth > kMaxRecipeDepth) return !(too_deep = true);
    if (n.IsMap()) {
      for (const auto& kv : n)
        if (!self(self, kv.first, depth + 1) || !self(self, kv.second, depth + 1)) return false;
    } else if (n.IsSequence()) {
      for (const auto& c : n)
        if (!self(self, c, depth + 1)) return false;
    }
    return true;
  };
  if (walk(walk, root, 0)) return "";
  if (too_deep)
    return "nested deeper than " + std::to_string(kMaxRecipeDepth) +
           " levels (an alias inside its own anchor?); not a recipe";
  return "more than " + std::to_string(kMaxRecipeNodes) + " YAML nodes once aliases are expanded; not a recipe";
}

struct IncludeState {
  std::map<std::string, YAML::Node> resolved;  // canonical path -> merged tree: each file resolved once
  int includes = 0;
};

// The YAML of one recipe file, or an empty map after reporting why it is not a recipe.
YAML::Node read_file(const std::filesystem::path& path, Ctx& ctx) {
  const std::string file = path.string();
  const YAML::Node empty(YAML::NodeType::Map);
  if (!std::filesystem::exists(path)) {
    ctx.add(file, YAML::Mark::null_mark(), "", "file not found");
    return empty;
  }
  // Directories and devices (/dev/zero) are not recipes.
  if (!std::filesystem::is_regular_file(path)) {
    ctx.add(file, YAML::Mark::null_mark(), "", "not a regular file");
    return empty;
  }
  std::error_code ec;
  const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (!ec && bytes > kMaxRecipeBytes) {
    ctx.add(file, YAML::Mark::null_mark(), "",
            "file of " + std::to_string(bytes) + " bytes; recipes are at most " + std::to_string(kMaxRecipeBytes) + " bytes");
    return empty;
  }
  YAML::Node node;
  try {
    node = YAML::LoadFile(file);
  } catch (const YAML::ParserException& e) {
    ctx.add(file, e.mark, "", "YAML syntax error: " + e.msg);
    return empty;
  }
  if (const std::string why = tree_bounds_problem(node); !why.empty()) {
    ctx.add(file, YAML::Mark::null_mark(), "", why);
    return empty;
  }
  if (node.IsNull()) return empty;
  if (!node.IsMap()) {
    ctx.add(file, node.Mark(), "", "a recipe must be a mapping of sections");
    return empty;
  }
  return node;
}

YAML::Node resolve_file(const std::filesystem::path& path, std::vector<std::string>& stack, Origins& origins, Ctx& ctx,
                        IncludeState& state);

// Merges the files `node` includes into `merged`, each resolved once, refusing cycles and
// includes nested or numbered beyond the limits.
void merge_includes(const std::filesystem::path& path, const YAML::Node& node, YAML::Node merged,
                    std::vector<std::string>& stack, Origins& origins, Ctx& ctx, IncludeState& state) {
  const std::string file = path.string();
  stack.push_back(std::filesystem::weakly_canonical(path).string());
  for (const auto& inc : node["include"]) {
    if (!inc.IsScalar()) continue;
    const std::filesystem::path inc_path = path.parent_path() / inc.Scalar();
    const std::string canon = std::filesystem::weakly_canonical(inc_path).string();
    if (std::find(stack.begin(), stack.end(), canon) != stack.end()) {
      ctx.add(file, inc.Mark(), "include", "include cycle through '" + inc.Scalar() + "'");
      continue;
    }
    if (stack.size() >= kMaxIncludeDepth || ++state.includes > kMaxIncludes) {
      ctx.add(file, inc.Mark(), "include",
              "includes nest deeper than " + std::to_string(kMaxIncludeDepth) + " or number more than " +
                  std::to_string(kMaxIncludes));
      break;
    }
    if (const auto done = state.resolved.find(canon); done != state.resolved.end()) {
      deep_merge(merged, done->second);  // resolved once, merged wherever it is included
      continue;
    }
    if (!std::filesystem::exists(inc_path)) {
      ctx.add(file, inc.Mark(), "include", "included file '" + inc_path.string() + "' not found");
      continue;
    }
    if (!std::filesystem::is_regular_file(inc_path)) {
      ctx.add(file, inc.Mark(), "include", "included path '" + inc_path.string() + "' is not a regular file");
      continue;
    }
    const YAML::Node resolved = resolve_file(inc_path, stack, origins, ctx, state);
    state.resolved[canon] = resolved;
    deep_merge(merged, resolved);
  }
  stack.pop_back();
}

YAML::Node resolve_file(const std::filesystem::path& path, std::vector<std::string>& stack, Origins& origins, Ctx& ctx,
                        IncludeState& state) {
  const std::string file = path.string();
  const YAML::Node node = read_file(path, ctx);
  if (node.size() == 0) return YAML::Node(YAML::NodeType::Map);
  validate(node, schema(), "", file, ctx);
  YAML::Node merged(YAML::NodeType::Map);
  if (node["include"] && node["include"].IsSequence()) merge_includes(path, node, merged, stack, origins, ctx, state);
  YAML::Node own(YAML::NodeType::Map);
  for (const auto& kv : node)
    if (kv.first.Scalar() != "include") own[kv.first.Scalar()] = kv.second;
  for (const auto& kv : own) record_origins(kv.second, kv.first.Scalar(), file, origins);
  deep_merge(merged, own);
  return merged;
}

// The field at `parts`; a path below a free-form map (model.config.hidden_size) gives that map
// with *below_free set, since anything may sit below it.
const Field* find_field(const std::vector<std::string>& parts, std::string* bad, std::vector<std::string>* siblings,
                        bool* below_free) {
  const Field* f = &schema();
  *below_free = false;
  for (const std::string& p : parts) {
    if (f->type == T::kFreeMap) {
      *below_free = true;
      return f;
    }
    const Field* next = nullptr;
    siblings->clear();
    for (const Field& c : f->children) {
      siblings->push_back(c.name);
      if (c.name == p) next = &c;
    }
    if (!next || f->type != T::kMap) {
      *bad = p;
      return nullptr;
    }
    f = next;
  }
  return f;
}

}  // namespace

YAML::Node resolve(const std::string& path, Origins& origins, Ctx& ctx) {
  std::vector<std::string> stack;
  IncludeState state;
  return resolve_file(path, stack, origins, ctx, state);
}

void apply_override(YAML::Node root, const std::string& text, Origins& origins, Ctx& ctx) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    ctx.add("--set", YAML::Mark::null_mark(), text, "expected key.path=value");
    return;
  }
  const std::string key = text.substr(0, eq), value = text.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  std::string bad;
  std::vector<std::string> siblings;
  bool below_free = false;
  if (!parts.empty() && parts[0] == "include") {
    // Includes are resolved from the files before overrides apply: a --set include would be
    // written into the resolved recipe without having been merged.
    ctx.add("--set " + text, YAML::Mark::null_mark(), key, "include cannot be set from the command line; "
                                                           "add it to the recipe file");
    return;
  }
  const Field* f = find_field(parts, &bad, &siblings, &below_free);
  if (!f) {
    ctx.add("--set", YAML::Mark::null_mark(), key, "unknown key '" + bad + "'" + hint(bad, siblings));
    return;
  }
  YAML::Node v;
  try {
    v = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    ctx.add("--set", YAML::Mark::null_mark(), key, "value is not valid YAML: " + e.msg);
    return;
  }
  if (const std::string why = tree_bounds_problem(v); !why.empty()) {
    ctx.add("--set", YAML::Mark::null_mark(), key, "value " + why);
    return;
  }
  const size_t before = ctx.issues.size();
  if (!below_free) validate(v, *f, key, "--set", ctx);
  for (size_t i = before; i < ctx.issues.size(); ++i) ctx.issues[i].line = ctx.issues[i].column = 0;
  YAML::Node cur = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!cur[parts[i]] || !cur[parts[i]].IsMap()) cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
    cur.reset(cur[parts[i]]);
  }
  cur[parts.back()] = v;
  // Problems found later in this value (or below it) blame the argument itself.
  Origins inside;
  record_origins(v, key, "--set " + text, inside);
  for (auto& [k, o] : inside) origins[k] = Origin{o.file, YAML::Mark::null_mark()};
}

nlohmann::json to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& kv : n) j[kv.first.Scalar()] = to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& e : n) j.push_back(to_json(e));
    return j;
  }
  if (n.IsNull()) return nullptr;
  const std::string s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted
  try {
    size_t used = 0;
    const long long i = std::stoll(s, &used);
    if (used == s.size()) return i;
  } catch (...) {
  }
  try {
    size_t used = 0;
    const double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (...) {
  }
  if (s == "true") return true;
  if (s == "false") return false;
  return s;
}

}  // namespace qforge::recipe_tree
