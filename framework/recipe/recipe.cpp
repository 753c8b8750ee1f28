// Recipe loading: includes, overrides, schema validation, typed extraction.
#include "framework/recipe/recipe.h"
#include "framework/search/search.h"
#include "framework/ptq/ptq.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "framework/recipe/sha256.h"
#include "framework/recipe/task.h"
#include "observers/observer.h"

namespace qforge {

std::string RecipeIssue::to_string() const {
  std::ostringstream os;
  os << file;
  if (line > 0) os << ":" << line << ":" << column;
  os << ": ";
  if (!key.empty()) os << key << ": ";
  os << message;
  return os.str();
}

namespace {

std::string join_issues(const std::vector<RecipeIssue>& issues) {
  std::ostringstream os;
  os << "invalid recipe (" << issues.size() << (issues.size() == 1 ? " problem" : " problems") << "):";
  for (const auto& i : issues) os << "\n  " << i.to_string();
  return os.str();
}

}  // namespace

RecipeError::RecipeError(std::vector<RecipeIssue> issues) : Error(join_issues(issues)), issues_(std::move(issues)) {}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class T { kMap, kFreeMap, kList, kString, kInt, kFloat, kBool, kEnum };

struct Field {
  std::string name;
  T type;
  std::string doc;
  std::vector<std::string> choices;
  double min = -kInf, max = kInf;
  std::vector<Field> children;
  // Bound leaves write their value into the Recipe (bind()) and read it back (the resolved recipe
  // writes every effective value, defaults included); others are read by load_recipe.
  struct Binding {
    std::function<void(const YAML::Node&, Recipe&)> set;
    std::function<YAML::Node(const Recipe&)> get;
  } bound;
};

Field leaf(std::string name, T type, std::string doc, double min = -kInf, double max = kInf) {
  return Field{std::move(name), type, std::move(doc), {}, min, max, {}, {}};
}
Field choice(std::string name, std::vector<std::string> choices, std::string doc) {
  return Field{std::move(name), T::kEnum, std::move(doc), std::move(choices), -kInf, kInf, {}, {}};
}
Field map(std::string name, std::string doc, std::vector<Field> children) {
  return Field{std::move(name), T::kMap, std::move(doc), {}, -kInf, kInf, std::move(children), {}};
}

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

// A leaf bound to a Recipe member: its key is written once, here; its default is the member's
// initializer in recipe.h; load_recipe sets every bound leaf the resolved tree holds.
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

// Choices come from each enum's one name table (framework/core, observers).
std::vector<std::string> qtype_names() {
  std::vector<std::string> out;
  for (const QType& q : all_qtypes()) out.emplace_back(q.name);
  return out;
}
// Per-tensor observers for static activations (the per-channel kinds serve weights).
std::vector<std::string> activation_observer_kinds() {
  std::vector<std::string> out;
  for (const std::string& k : observer_kinds())
    if (k.find("per_channel") == std::string::npos) out.push_back(k);
  return out;
}

// "a, b or c"
std::string or_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

// The scheme or one of its rules quantizes weights.
bool any_weights_quantized(const Scheme& s) {
  bool any = s.weights.has_value();
  for (const LayerRule& rule : s.rules) any |= rule.weights.has_value() && !rule.keep_float;
  return any;
}

const Field& schema() {
  static const Field root = map("", "recipe", {
      Field{"include", T::kList, "preset files merged first, in order (paths relative to this file)", {}, -kInf, kInf,
            {leaf("*", T::kString, "path")}, {}},
      bind(leaf("seed", T::kInt, "random seed for data splits, initialisation and shuffling", 0, 1e18), &Recipe::seed),
      map("model", "the network", {
          bind(choice("arch", task_architectures(), "architecture"), &Recipe::model, &Recipe::Model::arch),
          Field{"config", T::kFreeMap, "architecture config (HF config.json keys for bert and gpt2)", {}, -kInf, kInf, {}, {}},
          bind(leaf("config_file", T::kString, "HF-style config.json to read the config from"), &Recipe::model, &Recipe::Model::config_file),
          bind(leaf("checkpoint", T::kString, "float checkpoint: loaded when it exists, written after float training"), &Recipe::model, &Recipe::Model::checkpoint),
          bind(leaf("safetensors", T::kString, "float weights to import instead of training (HF names for bert/gpt2)"), &Recipe::model, &Recipe::Model::safetensors),
      }),
      map("data", "dataset and batching", {
          bind(choice("dataset", task_datasets(), "dataset (from Debian packages)"), &Recipe::data, &Recipe::Data::dataset),
          bind(leaf("batch_size", T::kInt, "training batch size", 1, 65536), &Recipe::data, &Recipe::Data::batch_size),
          bind(leaf("eval_batch_size", T::kInt, "evaluation batch size", 1, 65536), &Recipe::data, &Recipe::Data::eval_batch_size),
          bind(leaf("validation_size", T::kInt, "examples held out from training for validation", 0, 1e9), &Recipe::data, &Recipe::Data::validation_size),
          bind(leaf("max_train_examples", T::kInt, "cap on training examples (0: all)", 0, 1e12), &Recipe::data, &Recipe::Data::max_train_examples),
          bind(leaf("max_eval_examples", T::kInt, "cap on evaluation examples (0: all)", 0, 1e12), &Recipe::data, &Recipe::Data::max_eval_examples),
          bind(leaf("seq_len", T::kInt, "sequence length of language-model examples", 2, 65536), &Recipe::data, &Recipe::Data::seq_len),
          bind(leaf("examples_per_language", T::kInt, "langid phrases per language (0: dataset default)", 0, 1e9), &Recipe::data, &Recipe::Data::examples_per_language),
          bind(choice("tokens", {"chars", "bigrams", "trigrams"}, "langid tokens: characters, or overlapping character n-grams with a word-boundary space at each end"), &Recipe::data, &Recipe::Data::tokens),
      }),
      map("train", "float training (when no checkpoint is given)", {
          bind(leaf("epochs", T::kInt, "epochs", 0, 10000), &Recipe::train, &Recipe::Train::epochs),
          bind(leaf("lr", T::kFloat, "peak learning rate (AdamW)", 1e-12, 10), &Recipe::train, &Recipe::Train::lr),
          bind(leaf("weight_decay", T::kFloat, "AdamW weight decay", 0, 10), &Recipe::train, &Recipe::Train::weight_decay),
          bind(leaf("warmup_steps", T::kInt, "linear warm-up steps before the cosine schedule", 0, 1e9), &Recipe::train, &Recipe::Train::warmup_steps),
          bind(leaf("grad_clip", T::kFloat, "gradient norm clip (0: off)", 0, 1e9), &Recipe::train, &Recipe::Train::grad_clip),
          bind(leaf("max_steps", T::kInt, "stop after this many steps (0: no limit)", 0, 1e12), &Recipe::train, &Recipe::Train::max_steps),
      }),
      map("quantize", "what to quantize and how", {
          map("weights", "weight quantization", {
              choice("qtype", [] { auto v = qtype_names(); v.push_back("none"); return v; }(), "weight grid (none: float)"),
              choice("granularity", granularity_names(), "scale granularity"),
              leaf("group_size", T::kInt, "elements per group along the input dimension (per_group)", 1, 1e9),
              leaf("symmetric", T::kBool, "zero point 0"),
              leaf("lsq", T::kBool, "learnable step size (LSQ) during QAT"),
          }),
          map("activations", "input activation quantization", {
              choice("mode", activation_mode_names(), "none, static (calibrated) or dynamic per token"),
              choice("qtype", qtype_names(), "activation grid"),
              leaf("symmetric", T::kBool, "symmetric activations (int8: narrow range [-127, 127])"),
              choice("observer", activation_observer_kinds(), "static activation observer"),
              choice("method", histogram_method_names(), "histogram range search"),
              leaf("percentile", T::kFloat, "percentile of the percentile method (> 0)", 1e-9, 100),
              leaf("averaging_constant", T::kFloat, "moving-average constant (> 0)", 1e-9, 1),
              leaf("lsq", T::kBool, "learnable activation step (LSQ) during QAT"),
          }),
          Field{"rules", T::kList, "ordered per-layer rules; the first whose pattern matches wins", {}, -kInf, kInf,
                {map("*", "rule", {
                    leaf("pattern", T::kString, "shell-style pattern on module paths"),
                    leaf("keep_float", T::kBool, "leave matching layers in float"),
                    choice("weights", qtype_names(), "weight grid for matching layers"),
                    choice("granularity", granularity_names(), "weight granularity for matching layers"),
                    leaf("group_size", T::kInt, "group size for matching layers", 1, 1e9),
                    choice("activations", activation_mode_names(), "activation mode for matching layers"),
                })}, {}},
      }),
      map("calibrate", "calibration of static activations", {
          bind(leaf("batches", T::kInt, "training batches fed through the model under Calibration", 1, 1e9), &Recipe::calibrate, &Recipe::Calibrate::batches),
          bind(leaf("samples", T::kInt, "training examples to calibrate on (0: use batches); as INC's calibration_sampling_size, NNCF's subset_size", 0, 1e12),
               &Recipe::calibrate, &Recipe::Calibrate::samples),
      }),
      map("qat", "quantization-aware training after calibration", {
          bind(leaf("epochs", T::kInt, "QAT epochs (0: skip)", 0, 10000), &Recipe::qat, &Recipe::Qat::epochs),
          bind(leaf("lr", T::kFloat, "QAT learning rate", 1e-12, 10), &Recipe::qat, &Recipe::Qat::lr),
          bind(leaf("lsq", T::kBool, "learnable step sizes for weights and activations"), &Recipe::qat, &Recipe::Qat::lsq),
          bind(leaf("freeze_observers_after", T::kInt, "stop observer updates after this many steps (-1: never)", -1, 1e12), &Recipe::qat, &Recipe::Qat::freeze_observers_after),
          bind(leaf("freeze_bn_after", T::kInt, "fix BatchNorm statistics after this many steps (-1: never)", -1, 1e12), &Recipe::qat, &Recipe::Qat::freeze_bn_after),
          bind(leaf("max_steps", T::kInt, "stop after this many steps (0: no limit)", 0, 1e12), &Recipe::qat, &Recipe::Qat::max_steps),
      }),
      map("search", "mixed-precision search: per-layer weight widths under a budget (before calibration)", {
          bind(choice("method", search::method_names(),
                      "sensitivity: Hessian trace x weight perturbation, measured loss increase, or relative weight + "
                      "input error from the calibration histograms"),
               &Recipe::search, &Recipe::Search::method),
          Field{"activations", T::kList, "histogram method: activation choices each layer may take (the scheme's static qtype, float)",
                {}, -kInf, kInf, {choice("*", [] { auto v = qtype_names(); v.push_back("float"); return v; }(), "qtype or float")}, {}},
          Field{"candidates", T::kList, "weight grids each layer may take", {}, -kInf, kInf,
                {choice("*", [] { auto v = qtype_names(); v.push_back("float"); return v; }(), "qtype or float")}, {}},
          bind(leaf("group_size", T::kInt, "group size of the 4- and 2-bit candidates (per_group; 0: per_channel)", 0, 1e9),
               &Recipe::search, &Recipe::Search::group_size),
          map("budget", "one or more of (all hold at once; not both size_mb and size_ratio)", {
              bind(leaf("size_mb", T::kFloat, "model size after freeze, MB (1e6 bytes)", 1e-9, 1e9), &Recipe::search, &Recipe::Search::size_mb),
              bind(leaf("size_ratio", T::kFloat, "model size after freeze / float model size", 1e-9, 1e3), &Recipe::search, &Recipe::Search::size_ratio),
              bind(leaf("avg_bits", T::kFloat, "mean weight bits over the searched layers", 1e-9, 32), &Recipe::search, &Recipe::Search::avg_bits),
              bind(leaf("latency_ms", T::kFloat, "summed frozen latency of the Linear/Conv/Embedding layers, ms, measured on this machine", 1e-9, 1e9), &Recipe::search, &Recipe::Search::latency_ms),
          }),
          bind(leaf("latency_cache", T::kString, "file of measured latencies (default: ~/.cache/qforge/latency.json; off: none)"),
               &Recipe::search, &Recipe::Search::latency_cache),
          bind(leaf("sensitivities_from", T::kString, "calibration dump of an earlier search: reuse its sensitivities when they match"),
               &Recipe::search, &Recipe::Search::sensitivities_from),
          bind(leaf("evaluate_front", T::kInt, "measure the accuracy of this many Pareto points (PTQ, fake-quant)", 0, 100),
               &Recipe::search, &Recipe::Search::evaluate_front),
          bind(leaf("batches", T::kInt, "calibration batches the sensitivities are measured on", 1, 1e6), &Recipe::search, &Recipe::Search::batches),
          bind(leaf("probes", T::kInt, "hessian: Hutchinson probe limit per batch", 2, 1e6), &Recipe::search, &Recipe::Search::probes),
          bind(leaf("tolerance", T::kFloat, "hessian: relative standard error to stop probing at", 1e-6, 1), &Recipe::search, &Recipe::Search::tolerance),
          Field{"min_bits", T::kList, "layers matching pattern keep at least bits (float counts as 32)", {}, -kInf, kInf,
                {map("*", "constraint", {leaf("pattern", T::kString, "shell-style pattern on module paths"),
                                         leaf("bits", T::kInt, "least bits", 1, 32)})}, {}},
          Field{"ties", T::kList, "groups of patterns whose layers share one width (e.g. q/k/v)", {}, -kInf, kInf,
                {Field{"*", T::kList, "patterns", {}, -kInf, kInf, {leaf("*", T::kString, "pattern")}, {}}}, {}},
      }),
      map("ptq", "PTQ solvers: better than round-to-nearest without training (after calibration, before QAT)", {
          bind(choice("method", ptq::rounding_names(), "weight rounding: round-to-nearest, GPTQ or AdaRound"),
               &Recipe::ptq, &Recipe::Ptq::method),
          bind(leaf("bias_correction", T::kBool, "fold each layer's mean output error into its bias"),
               &Recipe::ptq, &Recipe::Ptq::bias_correction),
          bind(leaf("equalize", T::kBool, "cross-layer equalisation of consecutive layers around ReLU (float model, before quantize)"),
               &Recipe::ptq, &Recipe::Ptq::equalize),
          bind(leaf("smoothquant", T::kBool, "SmoothQuant: move activation outliers into the weights of Linear layers with quantized inputs"),
               &Recipe::ptq, &Recipe::Ptq::smoothquant),
          bind(leaf("alpha", T::kFloat, "SmoothQuant migration strength s = max|X|^alpha / max|W|^(1-alpha), in [0, 1]", 0, 1),
               &Recipe::ptq, &Recipe::Ptq::alpha),
          bind(leaf("batches", T::kInt, "calibration batches the solvers run on (0: calibrate.batches)", 0, 1e9),
               &Recipe::ptq, &Recipe::Ptq::batches),
          bind(leaf("sample_rows", T::kInt, "input rows kept per layer for AdaRound, bias correction and the error report", 1, 1e9),
               &Recipe::ptq, &Recipe::Ptq::sample_rows),
          map("gptq", "GPTQ options", {
              bind(leaf("damp", T::kFloat, "damping: damp x mean(diag H) added to H's diagonal (> 0)", 1e-12, 1e6), &Recipe::ptq, &Recipe::Ptq::damp),
              bind(leaf("block_size", T::kInt, "columns updated together", 1, 1e9), &Recipe::ptq, &Recipe::Ptq::block_size),
              bind(leaf("act_order", T::kBool, "quantize columns in order of decreasing Hessian diagonal"), &Recipe::ptq, &Recipe::Ptq::act_order),
          }),
          map("adaround", "AdaRound options", {
              bind(leaf("iterations", T::kInt, "Adam steps per layer", 1, 1e9), &Recipe::ptq, &Recipe::Ptq::iterations),
              bind(leaf("lr", T::kFloat, "Adam step size", 1e-12, 10), &Recipe::ptq, &Recipe::Ptq::lr),
              bind(leaf("reg_weight", T::kFloat, "weight of the rounding regulariser", 0, 1e6), &Recipe::ptq, &Recipe::Ptq::reg_weight),
              bind(leaf("batch_rows", T::kInt, "input rows per step", 1, 1e9), &Recipe::ptq, &Recipe::Ptq::batch_rows),
          }),
          Field{"rules", T::kList, "per-layer rounding; the first whose pattern matches wins", {}, -kInf, kInf,
                {map("*", "rule", {leaf("pattern", T::kString, "shell-style pattern on module paths"),
                                   choice("method", ptq::rounding_names(), "rounding of matching layers")})}, {}},
      }),
      map("freeze", "packing into integer kernels", {
          bind(leaf("enabled", T::kBool, "freeze after PTQ/QAT and evaluate the integer model"), &Recipe::freeze, &Recipe::Freeze::enabled),
          bind(choice("backend", {"cpu"}, "kernel backend"), &Recipe::freeze, &Recipe::Freeze::backend),
      }),
      map("distributed", "data-parallel runs under torchrun (one process: ignored)", {
          bind(choice("backend", {"gloo"}, "c10d backend (Gloo on the CPU; NCCL needs a CUDA LibTorch)"),
               &Recipe::distributed, &Recipe::Distributed::backend),
          bind(leaf("timeout_s", T::kInt, "seconds a rank waits for the others before failing", 1, 86400),
               &Recipe::distributed, &Recipe::Distributed::timeout_s),
          bind(leaf("sync_batchnorm", T::kBool, "BatchNorm statistics over all ranks' batches in float training (SyncBatchNorm)"),
               &Recipe::distributed, &Recipe::Distributed::sync_batchnorm),
      }),
      map("export", "files written to the output directory", {
          bind(leaf("checkpoint", T::kBool, "quantized model checkpoint (HDF5)"), &Recipe::export_, &Recipe::Export::checkpoint),
          bind(leaf("calibration_dump", T::kBool, "calibration dump (HDF5)"), &Recipe::export_, &Recipe::Export::calibration_dump),
          bind(leaf("report", T::kBool, "report.json and report.md"), &Recipe::export_, &Recipe::Export::report),
          bind(leaf("safetensors", T::kBool, "frozen model as safetensors"), &Recipe::export_, &Recipe::Export::safetensors),
          bind(leaf("onnx", T::kBool, "frozen model as ONNX with QuantizeLinear/DequantizeLinear (model.onnx)"), &Recipe::export_, &Recipe::Export::onnx),
      }),
  });
  return root;
}

std::string dotted(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }

struct Ctx {
  std::vector<RecipeIssue> issues;
  void add(const std::string& file, const YAML::Mark& m, const std::string& key, const std::string& msg) {
    issues.push_back(RecipeIssue{file, m.is_null() ? 0 : m.line + 1, m.is_null() ? 0 : m.column + 1, key, msg});
  }
};

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

// Where each leaf of the merged tree came from, for semantic errors.
struct Origin {
  std::string file;
  YAML::Mark mark;
};
using Origins = std::map<std::string, Origin>;

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

// Counts nodes with aliases expanded (as every later walk sees them), stopping at the budget:
// false once it is spent, after at most `budget` visits however deep the alias nesting.
bool within_node_budget(const YAML::Node& n, int64_t& budget) {
  if (--budget < 0) return false;
  if (n.IsMap()) {
    for (const auto& kv : n)
      if (!within_node_budget(kv.first, budget) || !within_node_budget(kv.second, budget)) return false;
  } else if (n.IsSequence()) {
    for (const auto& c : n)
      if (!within_node_budget(c, budget)) return false;
  }
  return true;
}

struct IncludeState {
  std::map<std::string, YAML::Node> resolved;  // canonical path -> merged tree: each file resolved once
  int includes = 0;
};

YAML::Node resolve_file(const std::filesystem::path& path, std::vector<std::string>& stack, Origins& origins, Ctx& ctx,
                        IncludeState& state) {
  const std::string file = path.string();
  YAML::Node node;
  if (!std::filesystem::exists(path)) {
    ctx.add(file, YAML::Mark::null_mark(), "", "file not found");
    return YAML::Node(YAML::NodeType::Map);
  }
  // Directories and devices (/dev/zero) are not recipes.
  if (!std::filesystem::is_regular_file(path)) {
    ctx.add(file, YAML::Mark::null_mark(), "", "not a regular file");
    return YAML::Node(YAML::NodeType::Map);
  }
  {
    std::error_code ec;
    const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
    if (!ec && bytes > kMaxRecipeBytes) {
      ctx.add(file, YAML::Mark::null_mark(), "",
              "file of " + std::to_string(bytes) + " bytes; recipes are at most " + std::to_string(kMaxRecipeBytes) + " bytes");
      return YAML::Node(YAML::NodeType::Map);
    }
  }
  try {
    node = YAML::LoadFile(file);
  } catch (const YAML::ParserException& e) {
    ctx.add(file, e.mark, "", "YAML syntax error: " + e.msg);
    return YAML::Node(YAML::NodeType::Map);
  }
  if (int64_t budget = kMaxRecipeNodes; !within_node_budget(node, budget)) {
    ctx.add(file, YAML::Mark::null_mark(), "",
            "more than " + std::to_string(kMaxRecipeNodes) + " YAML nodes once aliases are expanded; not a recipe");
    return YAML::Node(YAML::NodeType::Map);
  }
  if (node.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!node.IsMap()) {
    ctx.add(file, node.Mark(), "", "a recipe must be a mapping of sections");
    return YAML::Node(YAML::NodeType::Map);
  }
  validate(node, schema(), "", file, ctx);
  YAML::Node merged(YAML::NodeType::Map);
  if (node["include"] && node["include"].IsSequence()) {
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

template <class V>
void get(const YAML::Node& n, const char* key, V& out) {
  if (n && n[key] && !n[key].IsNull()) out = n[key].as<V>();
}

// Sets every bound leaf of `f` that `n` holds (the tree is validated already).
void apply_bound(const Field& f, const YAML::Node& n, Recipe& r) {
  if (!n || !n.IsMap()) return;
  for (const Field& c : f.children) {
    if (c.name == "*") continue;
    const YAML::Node v = n[c.name];
    if (!v || v.IsNull()) continue;
    if (c.bound.set) c.bound.set(v, r);
    else if (c.type == T::kMap) apply_bound(c, v, r);
  }
}

// Writes the effective value of every bound leaf of `f` that `n` lacks, so the resolved recipe does
// not depend on this version's defaults. Skipped: empty strings (an unset path) and values a
// leaf's range refuses (0 for "not given" budgets), which mean "absent" rather than a value.
void fill_defaults(const Field& f, YAML::Node n, const Recipe& r) {
  for (const Field& c : f.children) {
    if (c.name == "*") continue;
    if (c.type == T::kMap) {
      YAML::Node child = n[c.name];
      if (!child) {
        YAML::Node fresh(YAML::NodeType::Map);
        fill_defaults(c, fresh, r);
        if (fresh.size() > 0) n[c.name] = fresh;
      } else if (child.IsMap()) {
        fill_defaults(c, child, r);
      }
      continue;
    }
    if (!c.bound.get || (n[c.name] && !n[c.name].IsNull())) continue;
    const YAML::Node v = c.bound.get(r);
    if (c.type == T::kString && v.as<std::string>().empty()) continue;
    if (c.type == T::kInt || c.type == T::kFloat) {
      const double d = v.as<double>();
      if (d < c.min || d > c.max) continue;
    }
    if (c.type == T::kEnum && std::find(c.choices.begin(), c.choices.end(), v.as<std::string>()) == c.choices.end())
      continue;
    n[c.name] = v;
  }
}

}  // namespace

std::string resolved_with_rules(const Recipe& recipe, const std::vector<LayerRule>& rules) {
  YAML::Node tree = YAML::Load(recipe.resolved_yaml);
  tree.remove("search");
  YAML::Node q = tree["quantize"];
  YAML::Node all(YAML::NodeType::Sequence);
  for (const LayerRule& r : rules) {
    YAML::Node n(YAML::NodeType::Map);
    n["pattern"] = r.pattern;
    if (r.keep_float) n["keep_float"] = true;
    if (r.weights) n["weights"] = std::string(r.weights->name);
    if (r.weight_granularity) n["granularity"] = std::string(to_string(*r.weight_granularity));
    if (r.group_size) n["group_size"] = *r.group_size;
    if (r.activations) n["activations"] = std::string(to_string(*r.activations));
    all.push_back(n);
  }
  if (q["rules"])
    for (const auto& n : q["rules"]) all.push_back(n);
  q["rules"] = all;
  YAML::Emitter out;
  out << tree;
  return std::string(out.c_str()) + "\n";
}

std::vector<std::pair<std::string, std::string>> recipe_keys() {
  std::vector<std::pair<std::string, std::string>> out;
  std::function<void(const Field&, const std::string&)> walk = [&](const Field& f, const std::string& path) {
    for (const Field& c : f.children) {
      const std::string p = c.name == "*" ? path + "[]" : dotted(path, c.name);
      out.emplace_back(p, c.doc);
      if (c.type == T::kMap || c.type == T::kList) walk(c, p);
    }
  };
  walk(schema(), "");
  return out;
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  Ctx ctx;
  Origins origins;
  std::vector<std::string> stack;
  IncludeState include_state;
  YAML::Node tree = resolve_file(path, stack, origins, ctx, include_state);
  for (const std::string& o : overrides) apply_override(tree, o, origins, ctx);
  if (!ctx.issues.empty()) throw RecipeError(ctx.issues);

  auto at = [&](const std::string& key) {
    // A list element set by --set as a whole list: the list's origin.
    for (std::string k = key;;) {
      if (auto it = origins.find(k); it != origins.end()) return it->second;
      const size_t bracket = k.rfind('[');
      if (bracket == std::string::npos || k.back() != ']') break;
      k.erase(bracket);
    }
    return Origin{path, YAML::Mark::null_mark()};
  };
  auto problem = [&](const std::string& key, const std::string& msg) {
    const Origin o = at(key);
    ctx.add(o.file, o.mark, key, msg);
  };

  Recipe r;
  r.path = path;
  apply_bound(schema(), tree, r);
  const YAML::Node model_node = tree["model"];
  if (model_node && model_node["config"]) r.model.config = to_json(model_node["config"]);

  if (r.model.arch.empty()) problem("model.arch", "is required (" + or_list(task_architectures()) + ")");
  if (r.data.dataset.empty()) problem("data.dataset", "is required (" + or_list(task_datasets()) + ")");
  const TaskKind* task = find_task_kind(r.model.arch);
  if (task && !r.data.dataset.empty() && task->dataset != r.data.dataset)
    problem("data.dataset", "model.arch '" + r.model.arch + "' is trained on '" + task->dataset + "', not '" +
                                r.data.dataset + "'");
  if (r.data.tokens != "chars" && r.data.dataset != "langid")
    problem("data.tokens", "applies to the langid dataset only (this recipe's dataset is '" + r.data.dataset + "')");

  const YAML::Node q = tree["quantize"];
  r.quantize = q && q.IsMap();
  if (r.quantize) {
    Scheme& s = r.scheme;
    s = Scheme{};
    const YAML::Node w = q["weights"];
    std::string wq = "qint8", wg, aq = "qint8", mode = "none", observer = "histogram", method = "l2";
    get(w, "qtype", wq);
    if (wq == "none") {
      s.weights = std::nullopt;
    } else {
      s = Scheme(qtype_from_name(wq));
    }
    get(w, "granularity", wg);
    if (!wg.empty()) s.weight_granularity = granularity_from_name(wg);
    get(w, "group_size", s.group_size);
    get(w, "symmetric", s.weight_symmetric);
    get(w, "lsq", s.weight_lsq);
    if (s.weight_granularity == Granularity::kPerGroup && s.group_size <= 0)
      // Blame where group_size was written, else where per_group was asked for (maybe a --set).
      problem(origins.count("quantize.weights.group_size") ? "quantize.weights.group_size" : "quantize.weights.granularity",
              "per_group granularity needs quantize.weights.group_size > 0");
    const YAML::Node a = q["activations"];
    get(a, "mode", mode);
    get(a, "qtype", aq);
    get(a, "symmetric", s.activation_symmetric);
    get(a, "observer", observer);
    get(a, "method", method);
    get(a, "percentile", s.observer_options.percentile);
    get(a, "averaging_constant", s.observer_options.averaging_constant);
    get(a, "lsq", s.activation_lsq);
    s.activations = activation_mode_from_name(mode);
    s.activation_qtype = qtype_from_name(aq);
    s.observer = observer;
    s.observer_options.method = histogram_method_from_name(method);
    if (s.activations == ActivationMode::kDynamicPerToken && s.activation_qtype != qint8)
      problem("quantize.activations.qtype", "dynamic per-token activations are qint8, not " + aq);
    if (s.activation_qtype.is_integer() && s.activation_qtype.bits < 8 && s.activations != ActivationMode::kNone) {
      bool freeze_on = true;
      get(tree["freeze"], "enabled", freeze_on);
      if (freeze_on)
        problem("quantize.activations.qtype", aq + " activations have no integer kernel to freeze into; use qint8 "
                                              "or set freeze.enabled: false to evaluate them fake-quantized");
    }
    if (q["rules"] && q["rules"].IsSequence()) {
      for (size_t i = 0; i < q["rules"].size(); ++i) {
        const YAML::Node rn = q["rules"][i];
        LayerRule rule;
        get(rn, "pattern", rule.pattern);
        if (rule.pattern.empty()) {
          const std::string key = "quantize.rules[" + std::to_string(i) + "].pattern";
          ctx.add(at("quantize").file, rn.Mark(), key, "every rule needs a pattern");
        }
        get(rn, "keep_float", rule.keep_float);
        std::string v;
        if (rn["weights"]) rule.weights = qtype_from_name(rn["weights"].as<std::string>());
        if (rn["granularity"]) rule.weight_granularity = granularity_from_name(rn["granularity"].as<std::string>());
        if (rn["group_size"]) rule.group_size = rn["group_size"].as<int64_t>();
        if (rn["activations"]) rule.activations = activation_mode_from_name(rn["activations"].as<std::string>());
        s.rules.push_back(rule);
      }
    }
  }
  if (r.qat.lsq) {
    r.scheme.weight_lsq = true;
    r.scheme.activation_lsq = true;
  }
  if (r.qat.epochs > 0 && !r.quantize) problem("qat.epochs", "QAT needs a quantize section");
  if (r.train.epochs == 0 && r.model.safetensors.empty() &&
      (r.model.checkpoint.empty() || !std::filesystem::exists(r.model.checkpoint)))
    problem("train.epochs", "0 epochs and no float weights to load (model.checkpoint " +
                                (r.model.checkpoint.empty() ? std::string("is not set") : "'" + r.model.checkpoint + "' does not exist") +
                                ", no model.safetensors): nothing would train the model");
  // Where a key is written, for errors found after validation (by the search or the solvers).
  auto site = [&](const std::string& key) {
    const Origin o = at(key);
    return RecipeIssue{o.file, o.mark.is_null() ? 0 : o.mark.line + 1, o.mark.is_null() ? 0 : o.mark.column + 1, key, ""};
  };
  const YAML::Node sn = tree["search"];
  r.search.enabled = sn && sn.IsMap() && sn.size() > 0;
  if (r.search.enabled) {
    Recipe::Search& se = r.search;
    if (sn["candidates"])
      for (size_t i = 0; i < sn["candidates"].size(); ++i) {
        const YAML::Node c = sn["candidates"][i];
        se.candidates.push_back(c.as<std::string>());
        se.candidate_sites.push_back(site("search.candidates[" + std::to_string(i) + "]"));
      }
    if (se.candidates.size() < 2) problem("search.candidates", "needs at least two candidates to choose between");
    if (sn["activations"])
      for (const auto& a : sn["activations"]) se.activations.push_back(a.as<std::string>());
    if (!se.activations.empty()) {
      if (se.method != "histogram")
        problem("search.activations", "activation widths are searched by the histogram method only (search.method: histogram)");
      if (r.scheme.activations != ActivationMode::kStatic)
        problem("search.activations", "activation choices need static activations in the scheme (quantize.activations.mode: static)");
      for (size_t i = 0; i < se.activations.size(); ++i)
        if (se.activations[i] != "float" && se.activations[i] != r.scheme.activation_qtype.name)
          problem("search.activations[" + std::to_string(i) + "]",
                  "'" + se.activations[i] + "' is not the scheme's activation grid (" + r.scheme.activation_qtype.name +
                      "); the choices are that grid and float");
    }
    if (se.method == "histogram" && r.quantize && r.scheme.activations == ActivationMode::kStatic &&
        r.scheme.observer != "histogram")
      problem("search.method", "the histogram method reads histogram observers; quantize.activations.observer is " +
                                   r.scheme.observer);
    const int budgets = (se.size_mb > 0) + (se.size_ratio > 0) + (se.avg_bits > 0) + (se.latency_ms > 0);
    if (budgets == 0) problem("search.budget", "give one or more of size_mb, size_ratio, avg_bits, latency_ms");
    if (se.size_mb > 0 && se.size_ratio > 0) problem("search.budget", "give size_mb or size_ratio, not both");
    if (sn["min_bits"])
      for (size_t i = 0; i < sn["min_bits"].size(); ++i) {
        const YAML::Node m = sn["min_bits"][i];
        if (!m["pattern"] || !m["bits"]) {
          ctx.add(at("search").file, m.Mark(), "search.min_bits[" + std::to_string(i) + "]", "needs a pattern and bits");
          continue;
        }
        se.min_bits.emplace_back(m["pattern"].as<std::string>(), m["bits"].as<int64_t>());
      }
    if (sn["ties"])
      for (const auto& t : sn["ties"]) {
        std::vector<std::string> patterns;
        for (const auto& p : t) patterns.push_back(p.as<std::string>());
        se.ties.push_back(patterns);
      }
    if (!r.quantize) problem("search", "the search chooses weight widths for a quantize section; add one");
    else if (!r.scheme.weights) problem("search", "quantize.weights.qtype is none: there are no weights to search");
  }
  const YAML::Node pn = tree["ptq"];
  r.ptq.enabled = pn && pn.IsMap() && pn.size() > 0;
  if (r.ptq.enabled) {
    Recipe::Ptq& p = r.ptq;
    if (pn["rules"])
      for (size_t i = 0; i < pn["rules"].size(); ++i) {
        const YAML::Node rn = pn["rules"][i];
        const std::string key = "ptq.rules[" + std::to_string(i) + "]";
        if (!rn["pattern"] || !rn["method"]) {
          ctx.add(at("ptq").file, rn.Mark(), key, "every rule needs a pattern and a method");
          continue;
        }
        p.rules.emplace_back(rn["pattern"].as<std::string>(), rn["method"].as<std::string>());
        p.rule_sites.push_back(site(key));
      }
    if (!r.quantize) {
      problem("ptq", "the PTQ solvers work on a quantized model; add a quantize section");
    } else {
      bool rounds = p.method != "rtn";
      for (const auto& [pattern, m] : p.rules) rounds |= m != "rtn";
      if (rounds && !any_weights_quantized(r.scheme))
        problem("ptq.method", "GPTQ and AdaRound round quantized weights, and quantize.weights.qtype is none");
      bool any_acts = r.scheme.activations != ActivationMode::kNone;
      for (const LayerRule& rule : r.scheme.rules) any_acts |= rule.activations && *rule.activations != ActivationMode::kNone;
      if (p.smoothquant && !any_acts)
        problem("ptq.smoothquant", "SmoothQuant eases the quantization of input activations, and the scheme keeps them "
                                   "float (quantize.activations.mode: none)");
    }
  }
  if (r.freeze.enabled && !r.quantize && tree["freeze"]) problem("freeze.enabled", "freezing needs a quantize section");
  // freeze() packs weights; a scheme without quantized weights fails there, after training.
  const bool any_weights = r.quantize && any_weights_quantized(r.scheme);
  if (r.freeze.enabled && r.quantize && !any_weights)
    problem(origins.count("quantize.weights.qtype") ? "quantize.weights.qtype" : "freeze.enabled",
            "freezing packs quantized weights, and quantize.weights.qtype is none (no rule quantizes any): set a "
            "weight qtype or freeze.enabled: false to evaluate activation-only quantization fake-quantized");

  if (!ctx.issues.empty()) throw RecipeError(ctx.issues);
  // Every effective value in the resolved recipe. Sections whose presence means something (search,
  // ptq: "run it"; freeze without quantize: an error) are filled only where the recipe has them.
  for (const Field& section : schema().children) {
    const bool conditional = section.name == "search" || section.name == "ptq" ||
                             (!r.quantize && (section.name == "freeze" || section.name == "qat"));
    if (section.name == "include" || section.name == "quantize" || (conditional && !tree[section.name])) continue;
    if (section.type != T::kMap) {
      if (section.bound.get && !tree[section.name]) tree[section.name] = section.bound.get(r);
      continue;
    }
    if (!tree[section.name]) tree[section.name] = YAML::Node(YAML::NodeType::Map);
    fill_defaults(section, tree[section.name], r);
  }
  if (r.quantize) {
    // The scheme's effective grids and observer (quantize's leaves are read into the Scheme).
    const Scheme& s = r.scheme;
    YAML::Node qn = tree["quantize"];
    auto put = [](YAML::Node m, const char* key, const YAML::Node& v) {
      if (!m[key] || m[key].IsNull()) m[key] = v;
    };
    for (const char* part : {"weights", "activations"})
      if (!qn[part]) qn[part] = YAML::Node(YAML::NodeType::Map);
    YAML::Node wn = qn["weights"], an = qn["activations"];
    put(wn, "qtype", YAML::Node(std::string(s.weights ? s.weights->name : "none")));
    put(wn, "granularity", YAML::Node(std::string(to_string(s.weight_granularity))));
    if (s.weight_granularity == Granularity::kPerGroup) put(wn, "group_size", YAML::Node(s.group_size));
    put(wn, "symmetric", YAML::Node(s.weight_symmetric));
    put(wn, "lsq", YAML::Node(s.weight_lsq));
    put(an, "mode", YAML::Node(std::string(to_string(s.activations))));
    put(an, "qtype", YAML::Node(std::string(s.activation_qtype.name)));
    put(an, "symmetric", YAML::Node(s.activation_symmetric));
    put(an, "observer", YAML::Node(s.observer));
    put(an, "method", YAML::Node(std::string(to_string(s.observer_options.method))));
    put(an, "percentile", to_node(s.observer_options.percentile));
    put(an, "averaging_constant", to_node(s.observer_options.averaging_constant));
    put(an, "lsq", YAML::Node(s.activation_lsq));
  }
  YAML::Emitter out;
  out << tree;
  r.resolved_yaml = std::string(out.c_str()) + "\n";
  r.sha256 = sha256_hex(r.resolved_yaml);
  return r;
}

}  // namespace qforge
