// Recipe loading: the resolved and validated tree (recipe_tree.h) read into a Recipe through the
// schema's bindings (recipe_schema.h), the checks across sections, and the resolved recipe.
#include "framework/recipe/recipe.h"

#include <yaml-cpp/yaml.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <utility>

#include "framework/api/quantizer.h"
#include "framework/core/error.h"
#include "framework/core/utf8.h"
#include "framework/recipe/recipe_schema.h"
#include "framework/recipe/recipe_tree.h"
#include "framework/recipe/recipe_where.h"
#include "framework/recipe/sha256.h"
#include "framework/recipe/task.h"

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

using recipe_schema::dotted;
using recipe_schema::Field;
using recipe_schema::schema;
using recipe_schema::T;
using recipe_tree::Ctx;
using recipe_tree::Origin;
using recipe_tree::Origins;
using recipe_detail::any_weights_quantized;
using recipe_detail::read_ptq;
using recipe_detail::Where;

// "a, b or c"
std::string or_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

// model.torchscript and its data file (framework/recipe/tasks/torchscript_task.cpp).
void check_torchscript(const Recipe& r, const Where& w) {
  const std::string& ts = r.model.torchscript;
  if (r.model.arch == "torchscript" && ts.empty())
    w.problem("model.arch", "torchscript needs model.torchscript: the TorchScript file to quantize");
  if (!ts.empty() && r.model.arch != "torchscript")
    w.problem("model.torchscript", "is the model of model.arch torchscript, not '" + r.model.arch + "'");
  if (!r.model.input_shape.empty() && ts.empty()) w.problem("model.input_shape", "applies to model.torchscript only");
  const std::string& task = r.model.task;
  if (!task.empty() && ts.empty())
    w.problem("model.task", "applies to model.torchscript only (the other architectures know their task)");
  if (task == "causal_lm" && (r.data.dataset == "fashion_mnist" || r.data.dataset == "langid"))
    w.problem("model.task", "causal_lm reads token ids (data.dataset fortunes or tensors), not " + r.data.dataset +
                                " examples with class labels");
  if (!ts.empty() && r.data.dataset == "langid" && !r.model.input_shape.empty())
    w.problem("model.input_shape", "langid phrases are padded to each batch's longest (at most data.seq_len): they "
                                   "have no fixed shape to check");
  if (task == "classification" && r.data.dataset == "fortunes")
    w.problem("model.task", "fortunes is text for a language model: model.task causal_lm, not classification");
  if (task == "causal_lm" && r.data.dataset == "fortunes" && !r.model.input_shape.empty() &&
      r.model.input_shape != std::vector<int64_t>{r.data.seq_len})
    w.problem("model.input_shape", "a causal LM on fortunes reads [data.seq_len] = [" + std::to_string(r.data.seq_len) +
                                       "] token ids an example");
  if (r.data.dataset == "tensors" && r.data.file.empty())
    w.problem("data.dataset", "tensors needs data.file: a safetensors or HDF5 file of `inputs` [N, ...] and `labels` [N] "
                              "(causal_lm: [N, T] each)");
  if (!r.data.file.empty() && r.data.dataset != "tensors") w.problem("data.file", "is read by data.dataset tensors only");
  if (r.data.dataset == "images") {
    if (r.data.folder.empty())
      w.problem("data.dataset", "images needs data.folder: a folder of class folders of PNG / JPEG images");
    const auto& s = r.model.input_shape;
    if (s.size() != 3 || (s[0] != 1 && s[0] != 3))
      w.problem("model.input_shape", "data.dataset images needs it as [C, H, W] with C 1 (grey) or 3 (RGB): the size "
                                     "every image must have, and the channels they are converted to");
    else if (s[1] * s[2] > (int64_t{1} << 26))
      w.problem("model.input_shape", "images of more than 2^26 pixels are not read");
    if (task == "causal_lm") w.problem("model.task", "causal_lm reads token ids, not data.dataset images");
    for (const auto* v : {&r.data.mean, &r.data.std})
      if (!v->empty() && s.size() == 3 && static_cast<int64_t>(v->size()) != s[0])
        w.problem(v == &r.data.mean ? "data.mean" : "data.std",
                  "needs one value per channel (" + std::to_string(s[0]) + ", model.input_shape's C)");
    if (r.data.mean.empty() != r.data.std.empty())
      w.problem(r.data.mean.empty() ? "data.std" : "data.mean", "is given without data." +
                                                                    std::string(r.data.mean.empty() ? "mean" : "std"));
  } else {
    if (!r.data.folder.empty()) w.problem("data.folder", "is read by data.dataset images only");
    if (!r.data.mean.empty()) w.problem("data.mean", "applies to data.dataset images only");
    if (!r.data.std.empty()) w.problem("data.std", "applies to data.dataset images only");
  }
  if (!ts.empty() && r.export_.onnx)
    w.problem("export.onnx", "a TorchScript model has no ONNX export: qforge writes ONNX from its own model types, "
                             "and the rewritten graph calls qforge ops ONNX has no node for (export.torchscript writes model.pt)");
}

// The architecture and its dataset, from the task registry.
void check_model_data(const Recipe& r, const Where& w) {
  if (r.model.arch.empty()) w.problem("model.arch", "is required (" + or_list(task_architectures()) + ")");
  if (r.data.dataset.empty()) w.problem("data.dataset", "is required (" + or_list(task_datasets()) + ")");
  const TaskKind* task = find_task_kind(r.model.arch);
  if (task && !r.data.dataset.empty() && !task->reads(r.data.dataset)) {
    std::vector<std::string> reads{task->dataset};
    reads.insert(reads.end(), task->other_datasets.begin(), task->other_datasets.end());
    for (std::string& d : reads) d = "'" + d + "'";
    w.problem("data.dataset", "model.arch '" + r.model.arch + "' is trained on " + or_list(reads) + ", not '" +
                                  r.data.dataset + "'");
  }
  check_torchscript(r, w);
  if (r.data.tokens != "chars" && r.data.dataset != "langid")
    w.problem("data.tokens", "applies to the langid dataset only (this recipe's dataset is '" + r.data.dataset + "')");
  const Recipe::Data& d = r.data;
  if (d.tokenizer_vocab_size > 0 && !d.tokenizer_file.empty())
    w.problem("data.tokenizer", "give train or file, not both");
  if ((d.tokenizer_vocab_size > 0 || !d.tokenizer_file.empty()) && d.dataset != "fortunes")
    w.problem("data.tokenizer", "applies to the fortunes language models only (this recipe's dataset is '" + d.dataset + "')");
  if (!d.tokenizer_file.empty() && !std::filesystem::exists(d.tokenizer_file))
    w.problem("data.tokenizer.file", "'" + d.tokenizer_file + "' does not exist");
}

void check_kv_cache(const Recipe& r, const Where& w) {
  if (!r.kv_cache.quantized()) {
    // symmetric / group_size alone would leave the cache float without a word.
    for (const char* key : {"quantize.kv_cache.symmetric", "quantize.kv_cache.group_size", "quantize.kv_cache.scales",
                            "quantize.kv_cache.clip_ratio"})
      if (w.origins.count(key))
        w.problem(key, "has no effect without quantize.kv_cache.qtype (int8 or int4); the cache stays float");
    return;
  }
  if (r.model.arch != "gpt2" && r.model.arch != "llama")
    w.problem("quantize.kv_cache.qtype", "a KV cache belongs to the causal LMs (arch gpt2 or llama), not " + r.model.arch);
  // The graph writes a static int8 cache with one scale per head or layer as QDQ pairs (docs/onnx.md).
  if (r.export_.onnx && (!r.kv_cache.is_static() || r.kv_cache.qtype->bits != 8 || r.kv_cache.group_size != 0))
    w.problem("quantize.kv_cache.qtype", "export.onnx writes a quantized KV cache only as int8 with static scales per "
                                         "head or layer (scales: static_head or static_tensor, group_size 0); this "
                                         "one has no QDQ form. Set export.onnx: false, or change kv_cache");
}

void check_quantize(const Recipe& r, const YAML::Node& tree, const Where& w) {
  const Scheme& s = r.scheme;
  if (s.weight_granularity == Granularity::kPerGroup && s.group_size <= 0)
    // Blame where group_size was written, else where per_group was asked for (maybe a --set).
    w.problem(w.origins.count("quantize.weights.group_size") ? "quantize.weights.group_size" : "quantize.weights.granularity",
              "per_group granularity needs quantize.weights.group_size > 0");
  if (s.weights && s.weights->is_microscaling() &&
      (s.weight_granularity != Granularity::kPerGroup || s.group_size != s.weights->block_size))
    w.problem(w.origins.count("quantize.weights.group_size") ? "quantize.weights.group_size" : "quantize.weights.granularity",
              std::string(s.weights->name) + " scales blocks of " + std::to_string(s.weights->block_size) +
                  " elements, fixed by the format (per_group, group_size " + std::to_string(s.weights->block_size) + ")");
  const std::string aq = s.activation_qtype.name;
  if (s.activation_qtype.is_microscaling() && s.activations != ActivationMode::kNone)
    w.problem("quantize.activations.qtype", aq + " is a weight-only format in qforge; choose qint8, quint8 or an fp8 "
                                             "qtype for activations");
  if (s.activations == ActivationMode::kDynamicPerToken && !QuantizerImpl::dynamic_qtype_supported(s.activation_qtype))
    w.problem("quantize.activations.qtype", "dynamic per-token activations are symmetric signed integers (qint8, or "
                                            "qint4 / qint3 / qint2 for W4A4-style runs), not " + aq);
  if (s.activation_clip_ratio != 1.0f && s.activations != ActivationMode::kDynamicPerToken)
    w.problem("quantize.activations.clip_ratio", "clips dynamic per-token rows only; set quantize.activations.mode: "
                                                 "dynamic (static scales come from the observer)");
  // The check quantize() makes: per head needs static activations somewhere (the scheme's, or a rule's).
  if (s.attention_scales == AttentionScales::kPerHead && !s.asks_activations(ActivationMode::kStatic))
    w.problem("quantize.activations.attention", std::string("per_head sets static scales of the attention products, and "
                                                "the activations are ") + to_string(s.activations) +
                                                "; set quantize.activations.mode: static (or a rule's activations: static)");
  if (s.attention_scales == AttentionScales::kPerHead && s.activation_lsq)
    w.problem("quantize.activations.attention", "per_head scales are calibrated, and LSQ learns one activation step "
                                                "per tensor; drop quantize.activations.lsq (and qat.lsq) or keep attention: per_tensor");
  // Dynamic rows below 8 bits freeze onto the int8 kernels as codes of their own grid; static
  // scales below 8 bits have no kernel.
  if (s.activation_qtype.is_integer() && s.activation_qtype.bits < 8 && s.activations == ActivationMode::kStatic &&
      r.freeze.enabled)
    w.problem("quantize.activations.qtype", aq + " static activations have no integer kernel to freeze into; use "
                                            "qint8, mode: dynamic, or set freeze.enabled: false to evaluate them "
                                            "fake-quantized");
  check_kv_cache(r, w);
  const YAML::Node rules = tree["quantize"]["rules"];
  for (size_t i = 0; rules && rules.IsSequence() && i < rules.size(); ++i)
    if (s.rules[i].pattern.empty())
      w.ctx.add(w.at("quantize").file, rules[i].Mark(), "quantize.rules[" + std::to_string(i) + "].pattern",
                "every rule needs a pattern");
}

void check_training(const Recipe& r, const Where& w) {
  if (r.qat.epochs > 0 && !r.quantize) w.problem("qat.epochs", "QAT needs a quantize section");
  if (r.train.epochs == 0 && r.model.safetensors.empty() && r.model.torchscript.empty() &&
      (r.model.checkpoint.empty() || !std::filesystem::exists(r.model.checkpoint)))
    w.problem("train.epochs", "0 epochs and no float weights to load (model.checkpoint " +
                                  (r.model.checkpoint.empty() ? std::string("is not set") : "'" + r.model.checkpoint + "' does not exist") +
                                  ", no model.safetensors): nothing would train the model");
}

// The search's lists (candidates with where each is written, activation choices, constraints).
void read_search(Recipe& r, const YAML::Node& sn, const Where& w) {
  Recipe::Search& se = r.search;
  if (sn["candidates"])
    for (size_t i = 0; i < sn["candidates"].size(); ++i) {
      se.candidates.push_back(sn["candidates"][i].as<std::string>());
      se.candidate_sites.push_back(w.site("search.candidates[" + std::to_string(i) + "]"));
    }
  if (sn["activations"])
    for (const auto& a : sn["activations"]) se.activations.push_back(a.as<std::string>());
  if (sn["min_bits"])
    for (size_t i = 0; i < sn["min_bits"].size(); ++i) {
      const YAML::Node m = sn["min_bits"][i];
      if (!m["pattern"] || !m["bits"]) continue;  // check_search reports it
      se.min_bits.emplace_back(m["pattern"].as<std::string>(), m["bits"].as<int64_t>());
    }
  if (sn["ties"])
    for (const auto& t : sn["ties"]) {
      std::vector<std::string> patterns;
      for (const auto& p : t) patterns.push_back(p.as<std::string>());
      se.ties.push_back(patterns);
    }
}

void check_search(const Recipe& r, const YAML::Node& sn, const Where& w) {
  const Recipe::Search& se = r.search;
  if (se.candidates.size() < 2) w.problem("search.candidates", "needs at least two candidates to choose between");
  if (!se.activations.empty()) {
    if (se.method != "histogram")
      w.problem("search.activations", "activation widths are searched by the histogram method only (search.method: histogram)");
    if (r.scheme.activations != ActivationMode::kStatic)
      w.problem("search.activations", "activation choices need static activations in the scheme (quantize.activations.mode: static)");
    for (size_t i = 0; i < se.activations.size(); ++i)
      if (se.activations[i] != "float" && se.activations[i] != r.scheme.activation_qtype.name)
        w.problem("search.activations[" + std::to_string(i) + "]",
                  "'" + se.activations[i] + "' is not the scheme's activation grid (" + r.scheme.activation_qtype.name +
                      "); the choices are that grid and float");
  }
  if (se.method == "histogram" && r.quantize && r.scheme.activations == ActivationMode::kStatic &&
      r.scheme.observer != "histogram")
    w.problem("search.method", "the histogram method reads histogram observers; quantize.activations.observer is " +
                                   r.scheme.observer);
  const int budgets = (se.size_mb > 0) + (se.size_ratio > 0) + (se.avg_bits > 0) + (se.latency_ms > 0);
  if (budgets == 0) w.problem("search.budget", "give one or more of size_mb, size_ratio, avg_bits, latency_ms");
  if (se.size_mb > 0 && se.size_ratio > 0) w.problem("search.budget", "give size_mb or size_ratio, not both");
  if (se.context_length > 0) {
    if (r.model.arch != "gpt2" && r.model.arch != "llama")
      w.problem("search.context_length", "prices a KV cache, which the causal LMs keep (arch gpt2 or llama), not " +
                                             r.model.arch);
    else if (se.size_mb <= 0 && se.size_ratio <= 0)
      w.problem("search.context_length", "prices the KV cache into search.budget.size_mb or size_ratio; give one");
  }
  if (sn["min_bits"])
    for (size_t i = 0; i < sn["min_bits"].size(); ++i)
      if (!sn["min_bits"][i]["pattern"] || !sn["min_bits"][i]["bits"])
        w.ctx.add(w.at("search").file, sn["min_bits"][i].Mark(), "search.min_bits[" + std::to_string(i) + "]",
                  "needs a pattern and bits");
  if (!r.quantize) w.problem("search", "the search chooses weight widths for a quantize section; add one");
  else if (!r.scheme.weights) w.problem("search", "quantize.weights.qtype is none: there are no weights to search");
}

// freeze.decode_activations: q8_block32 switches frozen weight-only Linears at freeze; refused where
// no layer could take it (nothing frozen, or every layer's activations quantized by the scheme).
void check_decode_activations(const Recipe& r, const Where& w) {
  if (r.freeze.decode_activations != "q8_block32") return;
  bool weight_only = r.scheme.activations == ActivationMode::kNone;
  for (const LayerRule& rule : r.scheme.rules) weight_only |= rule.activations == ActivationMode::kNone;
  if (!r.freeze.enabled)
    w.problem("freeze.decode_activations", "q8_block32 is applied when freezing, and freeze.enabled is false: set "
                                           "freeze.enabled: true or decode_activations: exact");
  else if (r.quantize && !weight_only)
    w.problem("freeze.decode_activations",
              "q8_block32 applies to weight-only Linear layers, and quantize.activations.mode is " +
                  std::string(to_string(r.scheme.activations)) +
                  " with no rule setting activations: none, so no layer would use it");
}

void check_freeze(const Recipe& r, const YAML::Node& tree, const Where& w) {
  if (r.freeze.enabled && !r.quantize && tree["freeze"]) w.problem("freeze.enabled", "freezing needs a quantize section");
  // freeze() packs weights; a scheme without quantized weights fails there, after training.
  const bool any_weights = r.quantize && any_weights_quantized(r.scheme);
  if (r.freeze.enabled && r.quantize && !any_weights)
    w.problem(w.origins.count("quantize.weights.qtype") ? "quantize.weights.qtype" : "freeze.enabled",
              "freezing packs quantized weights, and quantize.weights.qtype is none (no rule quantizes any): set a "
              "weight qtype or freeze.enabled: false to evaluate activation-only quantization fake-quantized");
  check_decode_activations(r, w);
}

// export.gguf: what the GGUF export (framework/models/gguf_export.h) cannot write is refused before any stage runs.
void check_export_gguf(const Recipe& r, const Where& w) {
  if (!r.export_.gguf.enabled) return;
  if (r.model.arch != "gpt2" && r.model.arch != "llama")
    w.problem("export.gguf", "writes GPT-2 and Llama models (llama.cpp's gpt2 and llama architectures), not model.arch '" +
                                 r.model.arch + "'");
  if (!r.quantize)
    w.problem("export.gguf", "the export stage runs for recipes with a quantize section; add one (float matrices "
                             "then go to export.gguf.float_type)");
  else if (any_weights_quantized(r.scheme) && !r.freeze.enabled)
    w.problem("export.gguf", "GGUF holds frozen integer codes, and freeze.enabled is false: set freeze.enabled: true");
  if (r.data.tokenizer_vocab_size > 0 || !r.data.tokenizer_file.empty())
    w.problem("export.gguf", "writes the 256-byte vocabulary only; a data.tokenizer vocabulary is not exported to GGUF");
  if (r.ptq.enabled && r.ptq.smoothquant)
    w.problem("export.gguf", "SmoothQuant leaves a pre_quant_scale on each smoothed Linear, which llama.cpp's graph "
                             "has no place for; drop ptq.smoothquant or export.gguf");
}

// `weights:` or `activations:` written empty is filled like a missing one (the scheme's effective
// values), unlike other empty sections (search.budget, ptq.gptq), which stay empty.
void fill_null_scheme_parts(YAML::Node quantize) {
  if (!quantize.IsMap()) return;
  for (const char* part : {"weights", "activations"})
    if (quantize[part] && quantize[part].IsNull()) quantize[part] = YAML::Node(YAML::NodeType::Map);
}

// The resolved recipe: every effective value written. Sections whose presence means something
// (search, ptq: "run it"; quantize, freeze and qat without quantize: an error or nothing) are
// filled only where the recipe has them.
std::string resolved_yaml(const Recipe& r, YAML::Node tree) {
  for (const Field& section : schema().children) {
    const bool conditional = section.name == "search" || section.name == "ptq" ||
                             (!r.quantize && (section.name == "freeze" || section.name == "qat"));
    if (section.name == "include" || (section.name == "quantize" && !r.quantize) || (conditional && !tree[section.name]))
      continue;
    if (section.type != T::kMap) {
      if (section.bound.get && !tree[section.name]) tree[section.name] = section.bound.get(r);
      continue;
    }
    if (!tree[section.name]) tree[section.name] = YAML::Node(YAML::NodeType::Map);
    if (section.name == "quantize") fill_null_scheme_parts(tree[section.name]);
    recipe_schema::fill_defaults(section, tree[section.name], r);
  }
  YAML::Emitter out;
  out << tree;
  return std::string(out.c_str()) + "\n";
}

// Every bound key, then what the schema cannot bind: the free-form config, the section switches
// and the search and ptq lists with where they are written.
Recipe read_recipe(const std::string& path, const YAML::Node& tree, const Where& w) {
  Recipe r;
  r.path = path;
  recipe_schema::apply_bound(schema(), tree, r);
  // model.torchscript is the model of one architecture.
  if (r.model.arch.empty() && !r.model.torchscript.empty()) r.model.arch = "torchscript";
  // Its task follows the data unless the file names it: text is for a causal LM.
  if (!r.model.torchscript.empty() && r.model.task.empty())
    r.model.task = r.data.dataset == "fortunes" ? "causal_lm" : "classification";
  if (tree["model"] && tree["model"]["config"]) r.model.config = recipe_tree::to_json(tree["model"]["config"]);
  r.quantize = tree["quantize"] && tree["quantize"].IsMap();
  // qat.lsq turns on the learnable steps of the whole scheme.
  if (r.qat.lsq) {
    r.scheme.weight_lsq = true;
    r.scheme.activation_lsq = true;
  }
  r.export_.gguf.enabled = tree["export"] && tree["export"]["gguf"] && tree["export"]["gguf"].IsMap();
  const YAML::Node sn = tree["search"];
  r.search.enabled = sn && sn.IsMap() && sn.size() > 0;
  if (r.search.enabled) read_search(r, sn, w);
  return r;
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
    if (r.attention_scales) n["attention"] = std::string(to_string(*r.attention_scales));
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

nlohmann::json float_provenance(const Recipe& r) {
  nlohmann::json p = {{"model.arch", r.model.arch},
                      {"model.config", r.model.config},
                      {"data.dataset", r.data.dataset},
                      {"data.batch_size", r.data.batch_size},
                      {"data.validation_size", r.data.validation_size},
                      {"data.max_train_examples", r.data.max_train_examples},
                      {"data.seq_len", r.data.seq_len},
                      {"data.examples_per_language", r.data.examples_per_language},
                      {"data.tokens", r.data.tokens},
                      {"train.epochs", r.train.epochs},
                      {"train.lr", r.train.lr},
                      {"train.weight_decay", r.train.weight_decay},
                      {"train.warmup_steps", r.train.warmup_steps},
                      {"train.grad_clip", r.train.grad_clip},
                      {"train.max_steps", r.train.max_steps},
                      {"seed", r.seed}};
  // The config file's contents, not its name: an edited config.json trains a different model.
  if (!r.model.config_file.empty()) {
    std::ifstream in(r.model.config_file, std::ios::binary);
    QF_REQUIRE(in, "model.config_file ", printable(r.model.config_file), " cannot be read");
    p["model.config_file.sha256"] = sha256_hex(std::string(std::istreambuf_iterator<char>(in), {}));
  }
  return p;
}

std::string float_key(const Recipe& r) { return sha256_hex(float_provenance(r).dump()).substr(0, 12); }

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  Ctx ctx;
  Origins origins;
  YAML::Node tree = recipe_tree::resolve(path, origins, ctx);
  for (const std::string& o : overrides) recipe_tree::apply_override(tree, o, origins, ctx);
  if (!ctx.issues.empty()) throw RecipeError(ctx.issues);
  // `gguf:` with nothing after it (YAML null) asks for the export as `gguf: {}` does.
  // (Read through a const node: a non-const operator[] would insert a missing `export` key.)
  const YAML::Node& read = tree;
  if (read["export"] && read["export"].IsMap() && read["export"]["gguf"] && read["export"]["gguf"].IsNull())
    tree["export"]["gguf"] = YAML::Node(YAML::NodeType::Map);
  const Where where{path, origins, ctx};
  Recipe r = read_recipe(path, tree, where);
  // The resolved recipe keeps the {float_key} token (tree untouched): it expands the same way again.
  for (size_t at = r.model.checkpoint.find(kFloatKeyToken); at != std::string::npos;
       at = r.model.checkpoint.find(kFloatKeyToken))
    r.model.checkpoint.replace(at, std::strlen(kFloatKeyToken), float_key(r));
  check_model_data(r, where);
  if (r.quantize) check_quantize(r, tree, where);
  check_training(r, where);
  if (r.search.enabled) check_search(r, tree["search"], where);
  const YAML::Node pn = tree["ptq"];
  r.ptq.enabled = pn && pn.IsMap() && pn.size() > 0;
  if (r.ptq.enabled) read_ptq(r, pn, where);
  check_freeze(r, tree, where);
  check_export_gguf(r, where);
  if (!ctx.issues.empty()) throw RecipeError(ctx.issues);
  r.resolved_yaml = resolved_yaml(r, tree);
  r.sha256 = sha256_hex(r.resolved_yaml);
  return r;
}

std::string Recipe::Ptq::online_rotations() const {
  return std::string(rotate_down_proj ? "down_proj's input" : "") + (rotate_down_proj && rotate_qk ? ", " : "") +
         (rotate_qk ? "queries and keys after RoPE" : "");
}

}  // namespace qforge
