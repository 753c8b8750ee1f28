// Scheme: what quantize() applies to a model: weight and activation grids, granularity,
// observer, LSQ, and ordered per-layer rules (shell-style patterns on module paths, first match
// wins, with an explicit keep-float rule).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "framework/nn/quantizable.h"

namespace qforge {

// Static scales of the attention products' operands (MatMul layers: Q·Kᵀ and P·V): one per tensor,
// or one per head (per key/value head under grouped-query attention, whose query heads stack
// their rows on it), along the heads axis of [batch, heads, tokens, features] operands (axis -3).
// Per head is llm-compressor's "attn_head" strategy: heads whose queries, keys or probabilities
// span different ranges each get their own step instead of the widest head's.
enum class AttentionScales : uint8_t { kPerTensor, kPerHead };
inline constexpr int64_t kAttentionHeadAxis = -3;
const char* to_string(AttentionScales s);
AttentionScales attention_scales_from_name(const std::string& name);
std::vector<std::string> attention_scales_names();  // "per_tensor", "per_head"

struct LayerRule {
  std::string pattern;  // fnmatch-style on the module path: "encoder.layer.*.attention.*"
  bool keep_float = false;
  std::optional<QType> weights{};
  std::optional<Granularity> weight_granularity{};
  std::optional<int64_t> group_size{};
  std::optional<ActivationMode> activations{};
  // Attention products (MatMul) of matching paths: per tensor or per head, over the scheme's.
  std::optional<AttentionScales> attention_scales{};
};

// Scheme's own (implicit) members use the deprecated `strict` without warning; user code still does.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct Scheme {
  // Weights: nullopt keeps them float.
  std::optional<QType> weights = qint8;
  Granularity weight_granularity = Granularity::kPerChannel;
  int64_t group_size = 0;
  bool weight_symmetric = true;
  bool weight_lsq = false;
  // Activations (inputs of Linear/Conv/MatMul, output of LayerNorm / RMSNorm).
  ActivationMode activations = ActivationMode::kNone;
  QType activation_qtype = qint8;
  // Symmetric int8 activations use the narrow grid [-127, 127], which the int8 kernels need.
  bool activation_symmetric = true;
  std::string observer = "histogram";
  ObserverOptions observer_options;
  bool activation_lsq = false;
  // Dynamic per-token activations: each row's scale covers amax times this (QuantizerConfig::clip_ratio),
  // in (0, 1]. quantize() refuses another value when no layer's activations are dynamic per token.
  float activation_clip_ratio = 1.0f;
  // Static activations of MatMul layers (attention products): per tensor, or per head (the
  // operands' axis -3; the observer's per-channel twin, e.g. histogram → per_channel_histogram).
  // Per head needs rank-4 operands (qforge's BERT, GPT-2 and Llama attention) and calibrated, not
  // learned, scales: quantize() refuses it without static activations or with activation LSQ.
  AttentionScales attention_scales = AttentionScales::kPerTensor;
  std::vector<LayerRule> rules;
  // quantize() refuses a model holding LibTorch layers that have a qforge twin (plain
  // torch::nn::Linear, Conv1d/2d, Embedding, LayerNorm), listing every one: they would stay
  // float while the model looks quantized. true keeps them float with a warning each instead.
  bool allow_float_layers = false;
  // Ignored, kept so code written for earlier releases compiles: refusing plain layers, which
  // strict = true asked for, is the default now (allow_float_layers opts out).
  [[deprecated("refusal is now the default; see allow_float_layers")]] bool strict = false;

  Scheme() = default;
  // quantize(model, qint8): int8 per-channel symmetric weights, float activations. 4-bit and
  // 2-bit weights default to groups of 128 along the input dimension.
  Scheme(QType weight_qtype);  // NOLINT: implicit on purpose, as quanto's quantize(model, qint8)

  // The scheme for the layer at `path` (nullopt: keep float), or the first rule that matched it.
  std::optional<LayerScheme> resolve(const std::string& path, const QuantizableLayer& layer,
                                     int* matched_rule, std::string* note) const;
  std::string to_string() const;
  // Whether the scheme's own activations, or any rule's, are `mode` (what a mode-only option such
  // as activation_clip_ratio or per-head attention scales needs somewhere to mean anything).
  bool asks_activations(ActivationMode mode) const;
  // Whether the scheme's attention scales, or any rule's, are `scales`.
  bool asks_attention_scales(AttentionScales scales) const;
};
#pragma GCC diagnostic pop

// Shell-style match: '*' any run (including '.'), '?' one character, [abc] a class.
bool pattern_matches(const std::string& pattern, const std::string& path);

}  // namespace qforge
