// The recipe schema, one function per section (recipe_schema.h).
#include "framework/recipe/recipe_schema.h"

#include "framework/ptq/awq.h"
#include "framework/ptq/ptq.h"
#include "framework/api/quantizer.h"
#include "framework/recipe/task.h"
#include "framework/search/search.h"
#include "observers/observer.h"

namespace qforge::recipe_schema {

Field leaf(std::string name, T type, std::string doc, double min, double max) {
  return Field{std::move(name), type, std::move(doc), {}, min, max, {}, {}};
}
Field choice(std::string name, std::vector<std::string> choices, std::string doc) {
  return Field{std::move(name), T::kEnum, std::move(doc), std::move(choices), -kInf, kInf, {}, {}};
}
Field map(std::string name, std::string doc, std::vector<Field> children) {
  return Field{std::move(name), T::kMap, std::move(doc), {}, -kInf, kInf, std::move(children), {}};
}
Field list(std::string name, std::string doc, Field element) {
  return Field{std::move(name), T::kList, std::move(doc), {}, -kInf, kInf, {std::move(element)}, {}};
}
Field bind(Field f, std::function<void(const YAML::Node&, Recipe&)> set, std::function<YAML::Node(const Recipe&)> get) {
  f.bound.set = std::move(set);
  f.bound.get = std::move(get);
  return f;
}

std::string dotted(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }

namespace {

// Choices come from each enum's one name table (framework/core, observers) and the task registry.
// ptq.method: a rounding, or AWQ scales before round-to-nearest / GPTQ rounding.
std::vector<std::string> ptq_method_names() {
  std::vector<std::string> n = ptq::rounding_names();
  n.insert(n.end(), {"awq", "awq+gptq"});
  return n;
}

std::vector<std::string> qtype_names() {
  std::vector<std::string> out;
  for (const QType& q : all_qtypes()) out.emplace_back(q.name);
  return out;
}
std::vector<std::string> qtype_names_and(const char* extra) {
  std::vector<std::string> v = qtype_names();
  v.push_back(extra);
  return v;
}
// Per-tensor observers for static activations (the per-channel kinds serve weights).
std::vector<std::string> activation_observer_kinds() {
  std::vector<std::string> out;
  for (const std::string& k : observer_kinds())
    if (k.find("per_channel") == std::string::npos) out.push_back(k);
  return out;
}

template <class V>
void get(const YAML::Node& n, const char* key, V& out) {
  if (n && n[key] && !n[key].IsNull()) out = n[key].as<V>();
}

Field model_section() {
  return map("model", "the network", {
      bind(choice("arch", task_architectures(), "architecture"), &Recipe::model, &Recipe::Model::arch),
      Field{"config", T::kFreeMap, "architecture config (HF config.json keys for bert and gpt2)", {}, -kInf, kInf, {}, {}},
      bind(leaf("config_file", T::kString, "HF-style config.json to read the config from"), &Recipe::model, &Recipe::Model::config_file),
      bind(leaf("checkpoint", T::kString, "float checkpoint: loaded when it exists, written after float training ({float_key}: a hash of the float settings)"), &Recipe::model, &Recipe::Model::checkpoint),
      bind(leaf("safetensors", T::kString, "float weights to import instead of training (HF names for bert/gpt2)"), &Recipe::model, &Recipe::Model::safetensors),
      bind(leaf("torchscript", T::kString, "TorchScript file (torch.jit.script / trace) to quantize; sets arch torchscript"), &Recipe::model, &Recipe::Model::torchscript),
      bind(list("input_shape", "TorchScript: one example's input shape, without the batch (checked against the data)",
                leaf("*", T::kInt, "size", 1, 1e9)),
           [](const YAML::Node& n, Recipe& r) { r.model.input_shape = n.as<std::vector<int64_t>>(); },
           [](const Recipe& r) { return r.model.input_shape.empty() ? YAML::Node() : YAML::Node(r.model.input_shape); }),
      bind(choice("task", {"classification", "causal_lm"},
                  "TorchScript: classification (logits [B, C] of labels [B]) or causal_lm (logits [B, T, V] of the next "
                  "tokens; default on data.dataset fortunes)"),
           [](const YAML::Node& n, Recipe& r) { r.model.task = n.as<std::string>(); },
           [](const Recipe& r) { return r.model.task.empty() ? YAML::Node() : YAML::Node(r.model.task); }),
  });
}

Field data_section() {
  return map("data", "dataset and batching", {
      bind(choice("dataset", task_datasets(), "dataset (from Debian packages; tensors: data.file)"), &Recipe::data, &Recipe::Data::dataset),
      bind(leaf("file", T::kString, "dataset tensors: safetensors or HDF5 file of `inputs` [N, ...] (float, or integer token ids) and `labels` [N] (model.task causal_lm: both [N, T])"), &Recipe::data, &Recipe::Data::file),
      bind(leaf("folder", T::kString, "dataset images: a folder of class folders of PNG / JPEG images (torchvision's ImageFolder layout)"), &Recipe::data, &Recipe::Data::folder),
      bind(list("mean", "dataset images: per-channel mean subtracted after scaling pixels to [0, 1] (torchvision's Normalize)",
                leaf("*", T::kFloat, "mean", -1e9, 1e9)),
           [](const YAML::Node& n, Recipe& r) { r.data.mean = n.as<std::vector<double>>(); },
           [](const Recipe& r) { return r.data.mean.empty() ? YAML::Node() : YAML::Node(r.data.mean); }),
      bind(list("std", "dataset images: per-channel standard deviation divided by after the mean (torchvision's Normalize)",
                leaf("*", T::kFloat, "std", 1e-12, 1e9)),
           [](const YAML::Node& n, Recipe& r) { r.data.std = n.as<std::vector<double>>(); },
           [](const Recipe& r) { return r.data.std.empty() ? YAML::Node() : YAML::Node(r.data.std); }),
      bind(leaf("batch_size", T::kInt, "training batch size", 1, 65536), &Recipe::data, &Recipe::Data::batch_size),
      bind(leaf("eval_batch_size", T::kInt, "evaluation batch size", 1, 65536), &Recipe::data, &Recipe::Data::eval_batch_size),
      bind(leaf("validation_size", T::kInt, "examples held out from training for validation", 0, 1e9), &Recipe::data, &Recipe::Data::validation_size),
      bind(leaf("max_train_examples", T::kInt, "cap on training examples (0: all)", 0, 1e12), &Recipe::data, &Recipe::Data::max_train_examples),
      bind(leaf("max_eval_examples", T::kInt, "cap on evaluation examples (0: all)", 0, 1e12), &Recipe::data, &Recipe::Data::max_eval_examples),
      bind(leaf("seq_len", T::kInt, "sequence length of language-model examples", 2, 65536), &Recipe::data, &Recipe::Data::seq_len),
      bind(leaf("examples_per_language", T::kInt, "langid phrases per language (0: dataset default)", 0, 1e9), &Recipe::data, &Recipe::Data::examples_per_language),
      bind(choice("tokens", {"chars", "bigrams", "trigrams"}, "langid tokens: characters, or overlapping character n-grams with a word-boundary space at each end"), &Recipe::data, &Recipe::Data::tokens),
      map("tokenizer", "fortunes language models: the tokenizer (default: bytes, vocabulary 256); train or file", {
          map("train", "train a byte-level BPE tokenizer on the training text (framework/text/bpe_trainer.h)", {
              bind(leaf("vocab_size", T::kInt, "tokens: 256 bytes plus merges (the model's vocabulary)", 257, 1e6),
                   &Recipe::data, &Recipe::Data::tokenizer_vocab_size),
          }),
          bind(leaf("file", T::kString, "a tokenizer.json, tokenizer.model or a folder holding one"), &Recipe::data,
               &Recipe::Data::tokenizer_file),
      }),
  });
}

Field train_section() {
  return map("train", "float training (when no checkpoint is given)", {
      bind(leaf("epochs", T::kInt, "epochs", 0, 10000), &Recipe::train, &Recipe::Train::epochs),
      bind(leaf("lr", T::kFloat, "peak learning rate (AdamW)", 1e-12, 10), &Recipe::train, &Recipe::Train::lr),
      bind(leaf("weight_decay", T::kFloat, "AdamW weight decay", 0, 10), &Recipe::train, &Recipe::Train::weight_decay),
      bind(leaf("warmup_steps", T::kInt, "linear warm-up steps before the cosine schedule", 0, 1e9), &Recipe::train, &Recipe::Train::warmup_steps),
      bind(leaf("grad_clip", T::kFloat, "gradient norm clip (0: off)", 0, 1e9), &Recipe::train, &Recipe::Train::grad_clip),
      bind(leaf("max_steps", T::kInt, "stop after this many steps (0: no limit)", 0, 1e12), &Recipe::train, &Recipe::Train::max_steps),
  });
}

// The weight grid resets granularity and group size to the grid's defaults (Scheme(qtype)): it is
// set first, the keys after it refine it.
Field weights_section() {
  return map("weights", "weight quantization", {
      bind(choice("qtype", qtype_names_and("none"), "weight grid (none: float)"),
           [](const YAML::Node& n, Recipe& r) {
             const std::string name = n.as<std::string>();
             const Scheme grid = name == "none" ? Scheme{} : Scheme(qtype_from_name(name));
             r.scheme.weights = name == "none" ? std::optional<QType>() : grid.weights;
             r.scheme.weight_granularity = grid.weight_granularity;
             r.scheme.group_size = grid.group_size;
           },
           [](const Recipe& r) { return YAML::Node(std::string(r.scheme.weights ? r.scheme.weights->name : "none")); }),
      bind(choice("granularity", granularity_names(), "scale granularity"),
           [](const YAML::Node& n, Recipe& r) { r.scheme.weight_granularity = granularity_from_name(n.as<std::string>()); },
           [](const Recipe& r) { return YAML::Node(std::string(to_string(r.scheme.weight_granularity))); }),
      // Written back only where it means something (per_group).
      bind(leaf("group_size", T::kInt, "elements per group along the input dimension (per_group)", 1, 1e9),
           [](const YAML::Node& n, Recipe& r) { r.scheme.group_size = n.as<int64_t>(); },
           [](const Recipe& r) {
             return r.scheme.weight_granularity == Granularity::kPerGroup ? YAML::Node(r.scheme.group_size) : YAML::Node();
           }),
      bind(leaf("symmetric", T::kBool, "zero point 0"), &Recipe::scheme, &Scheme::weight_symmetric),
      bind(leaf("lsq", T::kBool, "learnable step size (LSQ) during QAT"), &Recipe::scheme, &Scheme::weight_lsq),
  });
}

Field activations_section() {
  return map("activations", "input activation quantization", {
      bind(choice("mode", activation_mode_names(), "none, static (calibrated) or dynamic per token"),
           [](const YAML::Node& n, Recipe& r) { r.scheme.activations = activation_mode_from_name(n.as<std::string>()); },
           [](const Recipe& r) { return YAML::Node(std::string(to_string(r.scheme.activations))); }),
      bind(choice("qtype", qtype_names(), "activation grid"),
           [](const YAML::Node& n, Recipe& r) { r.scheme.activation_qtype = qtype_from_name(n.as<std::string>()); },
           [](const Recipe& r) { return YAML::Node(std::string(r.scheme.activation_qtype.name)); }),
      bind(leaf("symmetric", T::kBool, "symmetric activations (int8: narrow range [-127, 127])"), &Recipe::scheme,
           &Scheme::activation_symmetric),
      bind(choice("observer", activation_observer_kinds(), "static activation observer"), &Recipe::scheme, &Scheme::observer),
      bind(choice("method", histogram_method_names(), "histogram range search"),
           [](const YAML::Node& n, Recipe& r) { r.scheme.observer_options.method = histogram_method_from_name(n.as<std::string>()); },
           [](const Recipe& r) { return YAML::Node(std::string(to_string(r.scheme.observer_options.method))); }),
      bind(leaf("percentile", T::kFloat, "percentile of the percentile method (> 0)", 1e-9, 100),
           [](const YAML::Node& n, Recipe& r) { r.scheme.observer_options.percentile = n.as<double>(); },
           [](const Recipe& r) { return to_node(r.scheme.observer_options.percentile); }),
      bind(leaf("averaging_constant", T::kFloat, "moving-average constant (> 0)", 1e-9, 1),
           [](const YAML::Node& n, Recipe& r) { r.scheme.observer_options.averaging_constant = n.as<double>(); },
           [](const Recipe& r) { return to_node(r.scheme.observer_options.averaging_constant); }),
      bind(leaf("lsq", T::kBool, "learnable activation step (LSQ) during QAT"), &Recipe::scheme, &Scheme::activation_lsq),
      bind(leaf("clip_ratio", T::kFloat, "dynamic per-token rows: each scale covers amax times this (QuaRot: 0.9); "
                "1: no clipping; Linear and MatMul layers freeze with it (their kernels clip likewise)", 1e-6, 1),
           [](const YAML::Node& n, Recipe& r) { r.scheme.activation_clip_ratio = n.as<float>(); },
           // Written back only when it clips, so recipes without the key resolve (and hash) as before it.
           [](const Recipe& r) {
             return r.scheme.activation_clip_ratio != 1.0f ? YAML::Node(r.scheme.activation_clip_ratio) : YAML::Node();
           }),
      bind(choice("attention", attention_scales_names(), "static scales of the attention products' operands (MatMul "
                  "layers): per_tensor, or per_head (axis -3: per key/value head under grouped-query attention)"),
           [](const YAML::Node& n, Recipe& r) { r.scheme.attention_scales = attention_scales_from_name(n.as<std::string>()); },
           // Written back only per head, so recipes without the key resolve (and hash) as before it.
           [](const Recipe& r) {
             return r.scheme.attention_scales != AttentionScales::kPerTensor
                        ? YAML::Node(std::string(to_string(r.scheme.attention_scales)))
                        : YAML::Node();
           }),
  });
}

LayerRule layer_rule(const YAML::Node& n) {
  LayerRule rule;
  get(n, "pattern", rule.pattern);
  get(n, "keep_float", rule.keep_float);
  if (n["weights"]) rule.weights = qtype_from_name(n["weights"].as<std::string>());
  if (n["granularity"]) rule.weight_granularity = granularity_from_name(n["granularity"].as<std::string>());
  if (n["group_size"]) rule.group_size = n["group_size"].as<int64_t>();
  if (n["activations"]) rule.activations = activation_mode_from_name(n["activations"].as<std::string>());
  if (n["attention"]) rule.attention_scales = attention_scales_from_name(n["attention"].as<std::string>());
  return rule;
}

// Written back only when quantized, so recipes without the key resolve as before.
Field kv_cache_section() {
  auto when_quantized = [](auto value) {
    return [value](const Recipe& r) { return r.kv_cache.quantized() ? value(r) : YAML::Node(); };
  };
  return map("kv_cache", "KV-cache quantization of causal LMs (gpt2, llama): codes per token and key/value head, "
             "scales per token (dynamic) or calibrated (static) (docs/kv_cache.md)", {
      bind(choice("qtype", {"none", "int8", "int4"}, "cache grid (none: float)"),
           [](const YAML::Node& n, Recipe& r) {
             const std::string name = n.as<std::string>();
             r.kv_cache.qtype = name == "none" ? std::optional<QType>() : kv_cache_qtype_from_name(name, "quantize.kv_cache.qtype");
           },
           when_quantized([](const Recipe& r) {
             return YAML::Node(std::string(r.kv_cache.qtype->bits == 8 ? "int8" : "int4"));
           })),
      bind(leaf("symmetric", T::kBool, "zero point 0 (false: an int8 zero point per scale)"),
           [](const YAML::Node& n, Recipe& r) { r.kv_cache.symmetric = n.as<bool>(); },
           when_quantized([](const Recipe& r) { return YAML::Node(r.kv_cache.symmetric); })),
      bind(leaf("group_size", T::kInt, "head_dim elements per scale (0: the whole head)", 0, 65536),
           [](const YAML::Node& n, Recipe& r) { r.kv_cache.group_size = n.as<int64_t>(); },
           when_quantized([](const Recipe& r) { return YAML::Node(r.kv_cache.group_size); })),
      bind(choice("scales", {"dynamic", "static_head", "static_tensor"},
                  "dynamic: each token's own; static_head / static_tensor: calibrated per key/value head and "
                  "group / per layer, values beyond the range saturate"),
           [](const YAML::Node& n, Recipe& r) {
             r.kv_cache.scales = kv_scales_from_name(n.as<std::string>(), "quantize.kv_cache.scales");
           },
           // Written back only when static, so dynamic recipes resolve (and hash) as before the key.
           [](const Recipe& r) {
             return r.kv_cache.is_static() ? YAML::Node(std::string(kv_scales_name(r.kv_cache.scales))) : YAML::Node();
           }),
      bind(leaf("clip_ratio", T::kFloat, "each scale covers its range times this (QuaRot: 0.95); 1: no clipping",
                1e-6, 1),
           [](const YAML::Node& n, Recipe& r) { r.kv_cache.clip_ratio = n.as<float>(); },
           // Written back only when it clips, as scales.
           [](const Recipe& r) {
             return r.kv_cache.quantized() && r.kv_cache.clip_ratio != 1.0f ? YAML::Node(r.kv_cache.clip_ratio)
                                                                             : YAML::Node();
           }),
  });
}

Field quantize_section() {
  Field rules = list("rules", "ordered per-layer rules; the first whose pattern matches wins",
                     map("*", "rule", {
                         leaf("pattern", T::kString, "shell-style pattern on module paths"),
                         leaf("keep_float", T::kBool, "leave matching layers in float"),
                         choice("weights", qtype_names(), "weight grid for matching layers"),
                         choice("granularity", granularity_names(), "weight granularity for matching layers"),
                         leaf("group_size", T::kInt, "group size for matching layers", 1, 1e9),
                         choice("activations", activation_mode_names(), "activation mode for matching layers"),
                         choice("attention", attention_scales_names(),
                                "static scales of matching attention products: per_tensor or per_head"),
                     }));
  rules.bound.set = [](const YAML::Node& n, Recipe& r) {
    for (const auto& rn : n) r.scheme.rules.push_back(layer_rule(rn));
  };
  return map("quantize", "what to quantize and how", {weights_section(), activations_section(), rules,
                                                     kv_cache_section()});
}

Field calibrate_section() {
  return map("calibrate", "calibration of static activations", {
      bind(leaf("batches", T::kInt, "training batches fed through the model under Calibration", 1, 1e9), &Recipe::calibrate, &Recipe::Calibrate::batches),
      bind(leaf("samples", T::kInt, "training examples to calibrate on (0: use batches); as INC's calibration_sampling_size, NNCF's subset_size", 0, 1e12),
           &Recipe::calibrate, &Recipe::Calibrate::samples),
      bind(leaf("imatrix", T::kBool, "collect the importance matrix (E[x^2] per Linear input): weighs the RTN and GPTQ grid "
                                     "searches, orders GPTQ's columns, kept in calibration.h5 and written as imatrix.gguf"),
           &Recipe::calibrate, &Recipe::Calibrate::imatrix),
  });
}

Field qat_section() {
  return map("qat", "quantization-aware training after calibration", {
      bind(leaf("epochs", T::kInt, "QAT epochs (0: skip)", 0, 10000), &Recipe::qat, &Recipe::Qat::epochs),
      bind(leaf("lr", T::kFloat, "QAT learning rate", 1e-12, 10), &Recipe::qat, &Recipe::Qat::lr),
      bind(leaf("lsq", T::kBool, "learnable step sizes for weights and activations"), &Recipe::qat, &Recipe::Qat::lsq),
      bind(leaf("freeze_observers_after", T::kInt, "stop observer updates after this many steps (-1: never)", -1, 1e12), &Recipe::qat, &Recipe::Qat::freeze_observers_after),
      bind(leaf("freeze_bn_after", T::kInt, "fix BatchNorm statistics after this many steps (-1: never)", -1, 1e12), &Recipe::qat, &Recipe::Qat::freeze_bn_after),
      bind(leaf("max_steps", T::kInt, "stop after this many steps (0: no limit)", 0, 1e12), &Recipe::qat, &Recipe::Qat::max_steps),
  });
}

Field search_section() {
  return map("search", "mixed-precision search: per-layer weight widths under a budget (before calibration)", {
      bind(choice("method", search::method_names(),
                  "sensitivity: Hessian trace x weight perturbation, measured loss increase, or relative weight + "
                  "input error from the calibration histograms"),
           &Recipe::search, &Recipe::Search::method),
      list("activations", "histogram method: activation choices each layer may take (the scheme's static qtype, float)",
           choice("*", qtype_names_and("float"), "qtype or float")),
      list("candidates", "weight grids each layer may take", choice("*", qtype_names_and("float"), "qtype or float")),
      bind(leaf("group_size", T::kInt, "group size of the 4- and 2-bit candidates (per_group; 0: per_channel)", 0, 1e9),
           &Recipe::search, &Recipe::Search::group_size),
      map("budget", "one or more of (all hold at once; not both size_mb and size_ratio)", {
          bind(leaf("size_mb", T::kFloat, "model size after freeze, MB (1e6 bytes)", 1e-9, 1e9), &Recipe::search, &Recipe::Search::size_mb),
          bind(leaf("size_ratio", T::kFloat, "model size after freeze / float model size", 1e-9, 1e3), &Recipe::search, &Recipe::Search::size_ratio),
          bind(leaf("avg_bits", T::kFloat, "mean weight bits over the searched layers", 1e-9, 32), &Recipe::search, &Recipe::Search::avg_bits),
          bind(leaf("latency_ms", T::kFloat, "summed frozen latency of the Linear/Conv/Embedding layers, ms, measured on this machine", 1e-9, 1e9), &Recipe::search, &Recipe::Search::latency_ms),
      }),
      bind(leaf("context_length", T::kInt,
                "size budgets include the KV cache at this many cached positions (one sequence, quantize.kv_cache's "
                "scheme; 0: the model alone)", 0, 1e9),
           &Recipe::search, &Recipe::Search::context_length),
      bind(leaf("latency_cache", T::kString, "file of measured latencies (default: ~/.cache/qforge/latency.json; off: none)"),
           &Recipe::search, &Recipe::Search::latency_cache),
      bind(leaf("sensitivities_from", T::kString, "calibration dump of an earlier search: reuse its sensitivities when they match"),
           &Recipe::search, &Recipe::Search::sensitivities_from),
      bind(leaf("evaluate_front", T::kInt, "measure the accuracy of this many Pareto points (PTQ, fake-quant)", 0, 100),
           &Recipe::search, &Recipe::Search::evaluate_front),
      bind(leaf("batches", T::kInt, "calibration batches the sensitivities are measured on", 1, 1e6), &Recipe::search, &Recipe::Search::batches),
      bind(leaf("probes", T::kInt, "hessian: Hutchinson probe limit per batch", 2, 1e6), &Recipe::search, &Recipe::Search::probes),
      bind(leaf("tolerance", T::kFloat, "hessian: relative standard error to stop probing at", 1e-6, 1), &Recipe::search, &Recipe::Search::tolerance),
      list("min_bits", "layers matching pattern keep at least bits (float counts as 32)",
           map("*", "constraint", {leaf("pattern", T::kString, "shell-style pattern on module paths"),
                                   leaf("bits", T::kInt, "least bits", 1, 32)})),
      list("ties", "groups of patterns whose layers share one width (e.g. q/k/v)",
           list("*", "patterns", leaf("*", T::kString, "pattern"))),
  });
}

Field ptq_section() {
  return map("ptq", "PTQ solvers: better than round-to-nearest without training (after calibration, before QAT)", {
      bind(choice("method", ptq_method_names(),
                  "weight rounding: round-to-nearest, GPTQ, AdaRound, k-means, AutoRound and BRECQ (Llama / GPT-2 blocks); "
                  "awq: AWQ scales then round-to-nearest, awq+gptq: AWQ scales then GPTQ"),
           &Recipe::ptq, &Recipe::Ptq::method),
      bind(leaf("bias_correction", T::kBool, "fold each layer's mean output error into its bias"),
           &Recipe::ptq, &Recipe::Ptq::bias_correction),
      bind(leaf("equalize", T::kBool, "cross-layer equalisation of consecutive layers around ReLU (float model, before quantize)"),
           &Recipe::ptq, &Recipe::Ptq::equalize),
      bind(leaf("smoothquant", T::kBool, "SmoothQuant: move activation outliers into the weights of Linear layers with quantized inputs"),
           &Recipe::ptq, &Recipe::Ptq::smoothquant),
      bind(choice("rotate", {"none", "hadamard", "spinquant"},
                  "hadamard: randomised Hadamard rotation of a Llama model's residual stream and down_proj input, "
                  "queries and keys after RoPE and values per head (QuaRot; float model, before quantize; signs "
                  "from the recipe's seed); spinquant: that rotation, then the residual stream's and the values' "
                  "rotations learned on the calibration text against the quantized model's loss (SpinQuant)"),
           &Recipe::ptq, &Recipe::Ptq::rotate),
      bind(leaf("rotate_seed", T::kInt, "seed of the Hadamard rotation's random signs (-1: the recipe's seed, which "
                                        "also seeds the float training)", -1, 1e18),
           &Recipe::ptq, &Recipe::Ptq::rotate_seed),
      map("spinquant", "with rotate: spinquant, how the rotations are learned", {
          bind(leaf("steps", T::kInt, "Cayley steps on the orthogonal group (one calibration batch each)", 1, 1e6),
               &Recipe::ptq, &Recipe::Ptq::spinquant_steps),
          bind(leaf("lr", T::kFloat, "peak step length, cosine-decayed to 0 (each step also at most 1 / |W|_1)", 1e-12, 1e6),
               &Recipe::ptq, &Recipe::Ptq::spinquant_lr),
          bind(leaf("batches", T::kInt, "calibration batches the steps cycle through (0: ptq.batches)", 0, 1e9),
               &Recipe::ptq, &Recipe::Ptq::spinquant_batches),
          bind(choice("weights", {"auto", "float", "quantized"},
                      "weights while learning: float (before a solver rounds them, as SpinQuant learns for GPTQ), "
                      "quantized (round-to-nearest), auto: float when a solver follows and activations or the KV cache "
                      "are quantized, quantized otherwise"),
               &Recipe::ptq, &Recipe::Ptq::spinquant_weights),
          bind(choice("objective", {"cross_entropy", "kl"},
                      "what the steps lower: the task's next-token cross-entropy (SpinQuant's) or the KL divergence "
                      "of the quantized model's predictions from the float model's"),
               &Recipe::ptq, &Recipe::Ptq::spinquant_objective),
      }),
      map("rotate_online", "with rotate: hadamard or spinquant, which online Hadamard transforms run (both by default)", {
          bind(leaf("down_proj", T::kBool, "down_proj's input turned at run time (QuaRot's online Hadamard before it)"),
               &Recipe::ptq, &Recipe::Ptq::rotate_down_proj),
          bind(leaf("qk", T::kBool, "queries and keys turned per head after RoPE, values folded into v_proj / o_proj, "
                                    "so a quantized KV cache holds rotated keys and values"),
               &Recipe::ptq, &Recipe::Ptq::rotate_qk),
      }),
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
      map("awq", "AWQ options (method awq or awq+gptq)", {
          bind(leaf("grid", T::kInt, "alpha grid points in [0, 1) of the scale search s = mean|x|^alpha", 1, 1000), &Recipe::ptq, &Recipe::Ptq::awq_grid),
          bind(leaf("clip", T::kBool, "search a clipping ratio per weight group after the scales"), &Recipe::ptq, &Recipe::Ptq::awq_clip),
          bind(choice("scales", ptq::awq_scales_names(), "candidate scales: activation (mean|x|^alpha), duo "
                      "(AutoAWQ's duo_scaling, mean|x|^alpha / mean|w|^(1-alpha)) or both"), &Recipe::ptq, &Recipe::Ptq::awq_scales),
          bind(choice("objective", ptq::awq_objective_names(), "error the search minimises: the transformer block's "
                      "output (block) or each Linear's (layer)"), &Recipe::ptq, &Recipe::Ptq::awq_objective),
      }),
      map("adaround", "AdaRound options", {
          bind(leaf("iterations", T::kInt, "Adam steps per layer", 1, 1e9), &Recipe::ptq, &Recipe::Ptq::iterations),
          bind(leaf("lr", T::kFloat, "Adam step size", 1e-12, 10), &Recipe::ptq, &Recipe::Ptq::lr),
          bind(leaf("reg_weight", T::kFloat, "weight of the rounding regulariser", 0, 1e6), &Recipe::ptq, &Recipe::Ptq::reg_weight),
          bind(leaf("batch_rows", T::kInt, "input rows per step", 1, 1e9), &Recipe::ptq, &Recipe::Ptq::batch_rows),
      }),
      map("autoround", "AutoRound options (method autoround)", {
          bind(leaf("iterations", T::kInt, "SignSGD steps per transformer block", 1, 1e9), &Recipe::ptq, &Recipe::Ptq::autoround_iterations),
          bind(leaf("lr", T::kFloat, "first step size of the rounding offsets and clipping factors, decaying linearly to 0 (0: 1 / iterations)", 0, 10),
               &Recipe::ptq, &Recipe::Ptq::autoround_lr),
          bind(leaf("batch_size", T::kInt, "calibration sequences per step", 1, 1e9), &Recipe::ptq, &Recipe::Ptq::autoround_batch_size),
      }),
      map("brecq", "BRECQ options (method brecq): AdaRound's rounding trained per transformer block", {
          bind(leaf("iterations", T::kInt, "Adam steps per transformer block", 1, 1e9), &Recipe::ptq, &Recipe::Ptq::brecq_iterations),
          bind(leaf("lr", T::kFloat, "Adam step size on the rounding variables", 1e-12, 10), &Recipe::ptq, &Recipe::Ptq::brecq_lr),
          bind(leaf("reg_weight", T::kFloat, "weight of the rounding regulariser", 0, 1e6), &Recipe::ptq, &Recipe::Ptq::brecq_reg_weight),
          bind(leaf("batch_size", T::kInt, "calibration sequences per step", 1, 1e9), &Recipe::ptq, &Recipe::Ptq::brecq_batch_size),
          bind(leaf("fisher", T::kBool, "weight the block's output error by the diagonal Fisher of the next-token loss (false: plain MSE)"),
               &Recipe::ptq, &Recipe::Ptq::brecq_fisher),
      }),
      list("rules", "per-layer rounding; the first whose pattern matches wins",
           map("*", "rule", {leaf("pattern", T::kString, "shell-style pattern on module paths"),
                             choice("method", ptq::rounding_names(), "rounding of matching layers")})),
  });
}

Field freeze_section() {
  return map("freeze", "packing into integer kernels", {
      bind(leaf("enabled", T::kBool, "freeze after PTQ/QAT and evaluate the integer model"), &Recipe::freeze, &Recipe::Freeze::enabled),
      bind(choice("backend", {"cpu"}, "kernel backend"), &Recipe::freeze, &Recipe::Freeze::backend),
      bind(choice("decode_activations", {"exact", "q8_block32"},
                  "weight-only int8/int4 Linear calls: float activations, or int8 blocks of 32 as llama.cpp"),
           &Recipe::freeze, &Recipe::Freeze::decode_activations),
  });
}

Field distributed_section() {
  return map("distributed", "data-parallel runs under torchrun (one process: ignored)", {
      bind(choice("backend", {"gloo"}, "c10d backend (Gloo on the CPU; NCCL needs a CUDA LibTorch)"),
           &Recipe::distributed, &Recipe::Distributed::backend),
      bind(leaf("timeout_s", T::kInt, "seconds a rank waits for the others before failing", 1, 86400),
           &Recipe::distributed, &Recipe::Distributed::timeout_s),
      bind(leaf("sync_batchnorm", T::kBool, "BatchNorm statistics over all ranks' batches in float training (SyncBatchNorm)"),
           &Recipe::distributed, &Recipe::Distributed::sync_batchnorm),
  });
}

Field export_section() {
  return map("export", "files written to the output directory", {
      bind(leaf("checkpoint", T::kBool, "quantized model checkpoint (HDF5)"), &Recipe::export_, &Recipe::Export::checkpoint),
      bind(leaf("calibration_dump", T::kBool, "calibration dump (HDF5)"), &Recipe::export_, &Recipe::Export::calibration_dump),
      bind(leaf("report", T::kBool, "report.json and report.md"), &Recipe::export_, &Recipe::Export::report),
      bind(leaf("safetensors", T::kBool, "frozen model as safetensors"), &Recipe::export_, &Recipe::Export::safetensors),
      bind(leaf("onnx", T::kBool, "frozen model as ONNX with QuantizeLinear/DequantizeLinear (model.onnx)"), &Recipe::export_, &Recipe::Export::onnx),
      // Written back for TorchScript models only: other recipes resolve as before.
      bind(leaf("torchscript", T::kBool, "TorchScript models: the frozen model as TorchScript (model.pt)"),
           [](const YAML::Node& n, Recipe& r) { r.export_.torchscript = n.as<bool>(); },
           [](const Recipe& r) { return r.model.torchscript.empty() ? YAML::Node() : YAML::Node(r.export_.torchscript); }),
      // Present (even empty): written; its keys are written back only then.
      map("gguf", "gpt2 / llama: the frozen model as GGUF for llama.cpp (model.gguf), written when this section is present", {
          bind(choice("float_type", {"f32", "f16", "q8_0", "q4_0", "q4_k", "q6_k"}, "ggml type of the float matrices (frozen codes keep their grid)"),
               [](const YAML::Node& n, Recipe& r) { r.export_.gguf.float_type = n.as<std::string>(); },
               [](const Recipe& r) { return r.export_.gguf.enabled ? YAML::Node(r.export_.gguf.float_type) : YAML::Node(); }),
          bind(leaf("refuse_wider", T::kBool, "fail on a frozen grid with no GGUF form instead of storing it dequantized at F32"),
               [](const YAML::Node& n, Recipe& r) { r.export_.gguf.refuse_wider = n.as<bool>(); },
               [](const Recipe& r) { return r.export_.gguf.enabled ? YAML::Node(r.export_.gguf.refuse_wider) : YAML::Node(); }),
      }),
  });
}

}  // namespace

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
    if (v.IsNull()) continue;
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

const Field& schema() {
  static const Field root = map("", "recipe", {
      list("include", "preset files merged first, in order (paths relative to this file)", leaf("*", T::kString, "path")),
      bind(leaf("seed", T::kInt, "random seed for data splits, initialisation and shuffling", 0, 1e18), &Recipe::seed),
      model_section(), data_section(), train_section(), quantize_section(), calibrate_section(), qat_section(),
      search_section(), ptq_section(), freeze_section(), distributed_section(), export_section(),
  });
  return root;
}

}  // namespace qforge::recipe_schema
