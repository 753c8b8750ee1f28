// Recipes: the YAML files `qtrain --recipe` runs. Loading resolves `include:` presets (later keys
// override), applies `--set key.path=value` overrides, validates everything against the schema
// before any work starts (all problems at once, each with file, line, column, key and the closest
// valid key), and yields a typed Recipe plus the resolved YAML and its SHA-256. docs/recipes.md
// documents every key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/api/kv_cache_scheme.h"
#include "framework/api/scheme.h"

namespace qforge {

struct RecipeIssue {
  std::string file;  // "--set" for command-line overrides
  int line = 0;      // 1-based; 0 when unknown
  int column = 0;
  std::string key;   // dotted path, e.g. "quantize.weights.group_size"
  std::string message;
  std::string to_string() const;  // "file:line:column: key: message"
};

// Every problem found in a recipe; what() lists them all, one per line.
class RecipeError : public Error {
 public:
  explicit RecipeError(std::vector<RecipeIssue> issues);
  const std::vector<RecipeIssue>& issues() const { return issues_; }

 private:
  std::vector<RecipeIssue> issues_;
};

struct Recipe {
  std::string path;
  std::string resolved_yaml;  // after includes and overrides, includes removed
  std::string sha256;         // of resolved_yaml
  uint64_t seed = 0;

  struct Model {
    std::string arch;            // a task of the registry (framework/recipe/task.h)
    nlohmann::json config;       // architecture config (HF config.json keys for bert/gpt2)
    std::string config_file;     // HF-style config.json, merged under `config`
    std::string checkpoint;      // float checkpoint: loaded when present, written after training ({float_key} expanded)
    std::string safetensors;     // HF safetensors file to import instead of training
    std::string torchscript;     // TorchScript file (framework/jit): arch "torchscript", its own float weights
    std::vector<int64_t> input_shape;  // TorchScript: one example's input shape, checked against the data
    // TorchScript: what the model computes. "classification": logits [B, C] of integer labels [B]
    // (accuracy); "causal_lm": logits [B, T, V] of the next token at every position (perplexity).
    // Unset in the file: causal_lm on data.dataset fortunes, else classification.
    std::string task;
  } model;

  struct Data {
    std::string dataset;         // the dataset of model.arch in the task registry
    std::string file;            // dataset "tensors": safetensors or HDF5 file of `inputs` and `labels`
    std::string folder;          // dataset "images": <folder>/<class>/<image> (PNG / JPEG), as torchvision's ImageFolder
    std::vector<double> mean, std;  // dataset "images": per-channel (x - mean) / std after scaling pixels to [0, 1]
    int64_t batch_size = 64;
    int64_t eval_batch_size = 256;
    int64_t validation_size = 5000;
    int64_t max_train_examples = 0;  // 0: all
    int64_t max_eval_examples = 0;   // 0: all
    int64_t seq_len = 128;           // language models
    int64_t examples_per_language = 0;  // langid: 0 = dataset default
    std::string tokens = "chars";       // langid: chars | bigrams | trigrams
    // fortunes language models: byte tokens (256) unless one of these is given.
    int64_t tokenizer_vocab_size = 0;   // data.tokenizer.train.vocab_size: a BPE tokenizer trained on the training text
    std::string tokenizer_file;         // data.tokenizer.file: a tokenizer.json, tokenizer.model or a folder holding one
  } data;

  struct Train {
    int64_t epochs = 1;
    double lr = 1e-3;
    double weight_decay = 0.01;
    int64_t warmup_steps = 0;
    double grad_clip = 1.0;
    int64_t max_steps = 0;  // 0: no limit
  } train;

  bool quantize = false;  // a `quantize` section is present
  // The scheme, or one of its rules that keeps the layer quantized, takes dynamic per-token
  // activations (recipe_ptq.cpp).
  bool dynamic_activations() const;
  Scheme scheme;
  KvCacheScheme kv_cache;  // quantize.kv_cache: the causal LMs' KV cache (float unless given)

  struct Calibrate {
    int64_t batches = 16;
    int64_t samples = 0;  // > 0: calibrate on this many training examples instead of `batches` batches
    bool imatrix = false;  // collect the importance matrix (framework/ptq/imatrix.h) and round with it
  } calibrate;

  struct Qat {
    int64_t epochs = 0;
    double lr = 1e-4;
    bool lsq = false;
    int64_t freeze_observers_after = -1;
    int64_t freeze_bn_after = -1;
    int64_t max_steps = 0;
  } qat;

  struct Search {
    bool enabled = false;             // a non-empty `search` section
    std::string method = "hessian";   // hessian | loss | histogram
    std::vector<std::string> activations;  // histogram: activation choices per layer (the scheme's qtype, "float")
    std::vector<std::string> candidates;  // qtype names and "float"
    int64_t group_size = 128;         // 4- and 2-bit candidates are per_group of this size (0: per_channel)
    // The budgets (0: not given): one or more, not both size_mb and size_ratio.
    double size_mb = 0, size_ratio = 0, avg_bits = 0, latency_ms = 0;
    int64_t context_length = 0;       // the KV cache at this many positions counts in size budgets (0: not)
    std::string latency_cache;        // measured-latency cache file; empty: the per-user default, "off": none
    int64_t evaluate_front = 0;       // Pareto points whose accuracy qtrain measures (PTQ, fake-quant)
    std::string sensitivities_from;   // calibration dump of an earlier search whose sensitivities to reuse
    int64_t batches = 4;              // calibration batches the sensitivities are measured on
    int64_t probes = 64;              // hessian: Hutchinson probe limit per batch
    double tolerance = 0.05;          // hessian: stop when standard error / trace is below it
    std::vector<std::pair<std::string, int64_t>> min_bits;  // pattern, bits
    std::vector<std::vector<std::string>> ties;             // patterns sharing one width
    std::vector<RecipeIssue> candidate_sites;               // where each candidate is written (no message)
  } search;

  // PTQ solvers (framework/ptq/ptq.h): equalisation and smoothing before calibration, GPTQ /
  // AdaRound rounding and bias correction after it (the solve stage).
  struct Ptq {
    bool enabled = false;             // a non-empty `ptq` section
    std::string method = "rtn";       // rtn | gptq | adaround | kmeans: weight rounding of layers no rule matches
    bool awq = false;                 // AWQ scales before calibration (recipe: method awq = awq + rtn, awq+gptq)
    int64_t awq_grid = 20;            // AWQ alpha grid points
    bool awq_clip = true;             // AWQ clipping search
    std::string awq_scales = "both";  // AWQ candidate scales: activation | duo | both (ptq/awq.h)
    std::string awq_objective = "block";  // AWQ search error: layer | block (ptq/awq.h)
    bool bias_correction = false;
    bool equalize = false;            // cross-layer equalisation of the float model
    bool smoothquant = false;
    std::string rotate = "none";      // none | hadamard | spinquant: QuaRot's rotation of a Llama model before quantize
                                      // (ptq/rotate.h); spinquant then learns it after quantize (ptq/spinquant.h)
    bool rotates() const { return rotate != "none"; }
    int64_t rotate_seed = -1;         // the Hadamard signs' seed (-1: the recipe's seed)
    // rotate: spinquant (ptq::SpinQuantOptions): Cayley steps, peak step, calibration batches (0: the
    // solvers' batches), and the weights while learning: auto (float before GPTQ / AdaRound /
    // k-means / AutoRound / BRECQ, fake-quantized before round-to-nearest), float or quantized.
    int64_t spinquant_steps = 100;
    double spinquant_lr = 1.5;
    int64_t spinquant_batches = 0;
    std::string spinquant_weights = "auto";
    std::string spinquant_objective = "cross_entropy";  // cross_entropy (SpinQuant's) | kl (to the float model)
    // With rotate: hadamard, the online Hadamards (ptq::RotateOptions): down_proj's input, and the
    // queries / keys after RoPE with the values folded (the KV-cache rotation).
    bool rotate_down_proj = true, rotate_qk = true;
    // The online transforms those switches leave on, for messages: "down_proj's input, queries and
    // keys after RoPE", one of them, or "" (with rotate: hadamard, the rotated model is then a plain one).
    std::string online_rotations() const;
    // Some layer's weights are rounded by other than round-to-nearest: the default method, a rule
    // or AWQ's scales (recipe_ptq.cpp).
    bool rounds_beyond_rtn() const;
    double alpha = 0.5;               // SmoothQuant migration strength
    int64_t batches = 0;              // calibration batches the solvers run on (0: calibrate's)
    int64_t sample_rows = 4096;       // input rows kept per layer
    double damp = 0.01;               // gptq
    int64_t block_size = 128;
    bool act_order = false;
    int64_t iterations = 1000;        // adaround
    double lr = 1e-2;
    double reg_weight = 0.01;
    int64_t batch_rows = 256;
    int64_t autoround_iterations = 200;  // autoround: SignSGD steps per block
    double autoround_lr = 0;             // 0: 1 / iterations
    int64_t autoround_batch_size = 8;    // sequences per step
    int64_t brecq_iterations = 500;      // brecq: Adam steps per block
    double brecq_lr = 1e-2;
    double brecq_reg_weight = 0.01;
    int64_t brecq_batch_size = 8;        // sequences per step
    bool brecq_fisher = true;            // weight the block's output error by the diagonal Fisher
    std::vector<std::pair<std::string, std::string>> rules;  // pattern, method
    std::vector<RecipeIssue> rule_sites;                      // where each rule is written (no message)
  } ptq;

  struct Freeze {
    bool enabled = true;
    std::string backend = "cpu";
    // Weight-only int8 / int4 Linear calls of few rows (decoding): "exact" float activations or
    // "q8_block32" (nn::set_decode_activations, docs/kernels.md "Decode activations").
    std::string decode_activations = "exact";
  } freeze;

  // Data-parallel runs under torchrun (docs/distributed.md); ignored in one process.
  struct Distributed {
    std::string backend = "gloo";
    int64_t timeout_s = 300;  // rendezvous and every collective
    // BatchNorm in float training: batch statistics over every rank's batch (nn::batch_norm's
    // SyncBatchNorm); false: each rank normalises by its own batch and rank 0's running
    // statistics are broadcast after training (DDP's default).
    bool sync_batchnorm = false;
  } distributed;

  struct Export {
    bool checkpoint = true;
    bool calibration_dump = true;
    bool report = true;
    bool safetensors = false;
    bool onnx = false;
    bool torchscript = true;  // model.pt of a TorchScript model (arch torchscript)
    // export.gguf: model.gguf for llama.cpp (gpt2 and llama tasks), written when the section is present.
    struct Gguf {
      bool enabled = false;
      std::string float_type = "f32";  // float matrices: f32, f16, q8_0, q4_0, q4_k or q6_k
      bool refuse_wider = false;       // a frozen grid with no GGUF form fails instead of going to F32
    } gguf;
  } export_;
};

// Loads, resolves and validates `path`. overrides are "key.path=value" (value parsed as YAML).
// Throws RecipeError listing every problem.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});

// The resolved recipe with the `search` section removed and `rules` placed before the recipe's
// own quantize.rules: running it reproduces the searched model without searching.
std::string resolved_with_rules(const Recipe& recipe, const std::vector<LayerRule>& rules);

// Every valid dotted key path of the schema with its one-line documentation (for docs/tests).
std::vector<std::pair<std::string, std::string>> recipe_keys();

// Everything that decides the float weights: architecture and config, data, training, seed
// (effective values, defaults included). A float checkpoint records it; a run loads one only if
// its record matches.
nlohmann::json float_provenance(const Recipe& r);

// Written in model.checkpoint, replaced on loading by float_key(r): recipes that would train
// different float weights get different files.
inline constexpr const char* kFloatKeyToken = "{float_key}";
// The first 12 hex digits of the SHA-256 of float_provenance(r) as compact JSON.
std::string float_key(const Recipe& r);

}  // namespace qforge
