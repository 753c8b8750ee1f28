// Llama / Mistral / Qwen2 decoders with HF names (see llama.h).
#include "framework/models/llama.h"

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "framework/models/activation.h"
#include "framework/models/config_field.h"
#include "framework/models/hf_folder.h"
#include "framework/models/hf_lm_head.h"
#include "framework/models/kv_quant.h"
#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/hadamard_tensor.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/token_ops.h"

namespace qforge::models {
namespace {

constexpr const char* kLlama = "models/llama";

// HF's rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last dimension.
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& rope) { return x * rope.cos + rotate_half(x) * rope.sin; }

// A projection's output [B, T, n * D] as heads [B, n, T, D] with RoPE applied: in place on the
// projection's fresh output by one kernel where fusable (bit for bit apply_rope), else apply_rope.
at::Tensor rope_heads(const at::Tensor& proj, int64_t n, int64_t D, const RopeTables& rope) {
  const int64_t B = proj.size(0), T = proj.size(1);
  // The kernel writes B * T * n * D floats: a narrower projection must be refused before it runs.
  QF_REQUIRE(proj.dim() == 3 && proj.size(2) == n * D, kLlama, ": projection ", proj.sizes(), " is not [B, T, ", n * D, "]");
  if (!nn::token_ops_fusable({&proj}) || !proj.is_contiguous() || !nn::token_ops_fusable({&rope.cos}))
    return apply_rope(proj.view({B, T, n, D}).transpose(1, 2), rope);
  const at::Tensor cos = rope.cos.contiguous(), sin = rope.sin.contiguous();
  kernels::rope_f32({proj.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), B * T, n, D, T});
  return proj.view({B, T, n, D}).transpose(1, 2);
}

// Llama 3.1's frequency rescaling (llama.h), in float32 as HF computes it.
at::Tensor llama3_inv_freq(const at::Tensor& inv_freq, const LlamaRopeScaling& s) {
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_len / s.low_freq_factor, high_freq_wavelen = old_len / s.high_freq_factor;
  const at::Tensor wavelen = 2 * M_PI / inv_freq;
  const at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  const at::Tensor smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const at::Tensor medium = at::logical_not(wavelen < high_freq_wavelen).logical_and(
      at::logical_not(wavelen > low_freq_wavelen));
  return at::where(medium, smoothed, scaled);
}

at::Tensor rope_inv_freq(const LlamaConfig& c) {
  const int64_t d = c.head_size();
  const at::Tensor exponents = at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d);
  const at::Tensor inv_freq = 1.0 / at::pow(c.rope_theta, exponents);
  if (c.rope_scaling.rope_type == "linear") return inv_freq / c.rope_scaling.factor;
  if (c.rope_scaling.rope_type == "llama3") return llama3_inv_freq(inv_freq, c.rope_scaling);
  return inv_freq;
}

// A number `object`.`key` that the rope kind requires (HF's rope validation refuses it missing).
double rope_number(const nlohmann::json& j, const char* object, const char* key, const std::string& kind) {
  QF_REQUIRE(j.contains(key) && !j[key].is_null(), kLlama, ": config field '", object, ".", key,
             "' is missing; rope_type ", kind, " needs it");
  QF_REQUIRE(j[key].is_number(), kLlama, ": config field '", object, ".", key, "' must be a number, got ", j[key].dump());
  return j[key].get<double>();
}

// RoPE rotates the whole head: a partial_rotary_factor other than 1 is refused, naming where it sits.
void require_full_rotary(const nlohmann::json& j, const std::string& where) {
  if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null())
    QF_REQUIRE(j["partial_rotary_factor"] == 1 || j["partial_rotary_factor"] == 1.0, kLlama, ": config field '", where,
               "partial_rotary_factor' is not supported (RoPE rotates the whole head)");
}

// transformers 5's rope_parameters over the older rope_theta / rope_scaling already in `c`.
void read_rope_parameters(const nlohmann::json& j, LlamaConfig& c) {
  if (!j.contains("rope_parameters") || j["rope_parameters"].is_null()) return;
  const nlohmann::json& p = j["rope_parameters"];
  QF_REQUIRE(p.is_object(), kLlama, ": config field 'rope_parameters' must be an object or null, got ", p.dump());
  for (const auto& item : p.items())
    QF_REQUIRE(!item.value().is_object(), kLlama, ": config field 'rope_parameters.", item.key(),
               "' gives RoPE parameters per layer type; one rope_parameters object for every layer is supported");
  const LlamaRopeScaling s = LlamaRopeScaling::from_json(p, "rope_parameters");
  const bool has_scaling = j.contains("rope_scaling") && !j["rope_scaling"].is_null();
  QF_REQUIRE(!has_scaling || s.to_json() == c.rope_scaling.to_json(), kLlama,
             ": config fields 'rope_scaling' and 'rope_parameters' disagree: ", j["rope_scaling"].dump(), " vs ", p.dump());
  c.rope_scaling = s;
  if (p.contains("rope_theta") && !p["rope_theta"].is_null()) {
    QF_REQUIRE(p["rope_theta"].is_number(), kLlama, ": config field 'rope_parameters.rope_theta' must be a number, got ",
               p["rope_theta"].dump());
    const double theta = p["rope_theta"].get<double>();
    QF_REQUIRE(!j.contains("rope_theta") || j["rope_theta"].is_null() || j["rope_theta"] == theta, kLlama,
               ": config fields 'rope_theta' (", j.value("rope_theta", nlohmann::json()).dump(),
               ") and 'rope_parameters.rope_theta' (", theta, ") disagree");
    c.rope_theta = theta;
  }
  require_full_rotary(p, "rope_parameters.");
}

// Softmax over the visible keys of scores [B, H, T, S] · scale: query i sits at position past + i
// and sees keys 0 .. past + i (the last `window` of them with a sliding window).
at::Tensor attention_probs(const at::Tensor& scores, int64_t past, int64_t window, double scale) {
  const int64_t T = scores.size(2), S = scores.size(3);
  if (at::Tensor fused = fused_causal_softmax(scores, past, window, scale); fused.defined()) return fused;
  at::Tensor w = scores * scale;
  // Masked scores take the dtype's lowest value (finfo.min), as HF's mask does, so no row is all -inf.
  const at::Tensor ones = at::ones({T, S}, scores.options().dtype(at::kBool));
  at::Tensor visible = ones.tril(past);
  if (window > 0) visible = visible.logical_and(ones.triu(past - window + 1));
  w = at::where(visible, w, masked_score(w));
  return at::softmax(w, -1, at::kFloat);
}

}  // namespace

LlamaRopeScaling LlamaRopeScaling::from_json(const nlohmann::json& j, const char* key) {
  LlamaRopeScaling s;
  if (j.is_null()) return s;
  QF_REQUIRE(j.is_object(), kLlama, ": config field '", key, "' must be an object or null, got ", j.dump());
  // Older configs name the kind "type".
  const char* kind_key = j.contains("rope_type") ? "rope_type" : "type";
  QF_REQUIRE(j.contains(kind_key) && j[kind_key].is_string(), kLlama, ": config field '", key, "' has no rope_type");
  s.rope_type = j[kind_key].get<std::string>();
  QF_REQUIRE(s.rope_type == "default" || s.rope_type == "linear" || s.rope_type == "llama3", kLlama,
             ": config field '", key, ".", kind_key, "' is '", s.rope_type, "'; supported: default, linear, llama3");
  if (s.rope_type != "default") s.factor = rope_number(j, key, "factor", s.rope_type);
  if (s.rope_type == "llama3") {
    s.low_freq_factor = rope_number(j, key, "low_freq_factor", s.rope_type);
    s.high_freq_factor = rope_number(j, key, "high_freq_factor", s.rope_type);
    s.original_max_position_embeddings =
        static_cast<int64_t>(rope_number(j, key, "original_max_position_embeddings", s.rope_type));
  }
  s.validate(key);
  return s;
}

void LlamaRopeScaling::validate(const char* key) const {
  QF_REQUIRE(rope_type == "default" || rope_type == "linear" || rope_type == "llama3", kLlama, ": config field '", key,
             ".rope_type' is '", rope_type, "'; supported: default, linear, llama3");
  QF_REQUIRE(factor > 0, kLlama, ": config field '", key, ".factor' must be > 0, got ", factor);
  if (rope_type == "llama3")
    QF_REQUIRE(high_freq_factor > low_freq_factor && low_freq_factor > 0 && original_max_position_embeddings > 0, kLlama,
               ": config field '", key, "' (llama3) needs high_freq_factor > low_freq_factor > 0 and "
               "original_max_position_embeddings > 0, got ", to_json().dump());
}

nlohmann::json LlamaRopeScaling::to_json() const {
  if (rope_type == "default") return nullptr;
  nlohmann::json j = {{"rope_type", rope_type}, {"factor", factor}};
  if (rope_type == "llama3") {
    j["low_freq_factor"] = low_freq_factor;
    j["high_freq_factor"] = high_freq_factor;
    j["original_max_position_embeddings"] = original_max_position_embeddings;
  }
  return j;
}

int64_t LlamaConfig::attention_window(int64_t layer) const {
  if (model_type == "mistral") return sliding_window;
  if (model_type != "qwen2" || !use_sliding_window) return 0;
  if (!layer_types.empty()) return layer_types.at(static_cast<size_t>(layer)) == "sliding_attention" ? sliding_window : 0;
  return layer >= max_window_layers ? sliding_window : 0;
}

const char* LlamaConfig::architecture() const {
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  return "LlamaForCausalLM";
}

LlamaConfig LlamaConfig::defaults(const std::string& model_type) {
  LlamaConfig c;  // LlamaConfig's defaults
  c.model_type = model_type;
  if (model_type == "mistral") {
    c.intermediate_size = 14336, c.num_key_value_heads = 8, c.max_position_embeddings = 4096 * 32;
    c.sliding_window = 4096;
  } else if (model_type == "qwen2") {
    c.vocab_size = 151936, c.intermediate_size = 22016, c.num_key_value_heads = 32, c.max_position_embeddings = 32768;
    c.sliding_window = 4096, c.max_window_layers = 28;
  }
  return c;
}

void LlamaConfig::validate() const {
  const LlamaConfig& c = *this;
  QF_REQUIRE(c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2", kLlama,
             ": config field 'model_type' is '", c.model_type, "'; supported: llama, mistral, qwen2");
  require_positive_fields(c, kLlama);
  QF_REQUIRE(c.head_dim > 0 || c.hidden_size % c.num_attention_heads == 0, kLlama, ": hidden_size ", c.hidden_size,
             " is not a multiple of num_attention_heads ", c.num_attention_heads, " (and head_dim is not given)");
  QF_REQUIRE(c.num_attention_heads % c.kv_heads() == 0, kLlama, ": num_attention_heads ", c.num_attention_heads,
             " is not a multiple of num_key_value_heads ", c.kv_heads());
  QF_REQUIRE(c.head_size() % 2 == 0, kLlama, ": head_dim ", c.head_size(), " is odd; RoPE rotates pairs");
  QF_REQUIRE(c.rms_norm_eps >= 0, kLlama, ": config field 'rms_norm_eps' must be >= 0, got ", c.rms_norm_eps);
  QF_REQUIRE(c.layer_types.empty() || static_cast<int64_t>(c.layer_types.size()) == c.num_hidden_layers, kLlama,
             ": config field 'layer_types' lists ", c.layer_types.size(), " layers, the model has ", c.num_hidden_layers);
  for (const std::string& t : c.layer_types) {
    QF_REQUIRE(t == "full_attention" || t == "sliding_attention", kLlama, ": config field 'layer_types' holds '", t,
               "'; supported: full_attention, sliding_attention");
    QF_REQUIRE(t == "full_attention" || c.model_type != "llama", kLlama,
               ": config field 'layer_types' holds 'sliding_attention'; llama has no sliding-window attention");
  }
  QF_REQUIRE(c.attention_dropout == 0.0, kLlama, ": config field 'attention_dropout' is ", c.attention_dropout,
             "; only 0 is supported");
  QF_REQUIRE(is_activation(c.hidden_act), kLlama, ": config field 'hidden_act' is '", c.hidden_act,
             "'; supported: ", activation_names());
  c.rope_scaling.validate("rope_scaling");
  c.kv_cache.validate(c.num_hidden_layers, c.kv_heads(), c.head_size(), kLlama);
  QF_REQUIRE(!c.down_proj_hadamard || kernels::hadamard_supported(c.intermediate_size), kLlama,
             ": config field 'qforge_down_proj_hadamard' needs a Hadamard size; intermediate_size ",
             c.intermediate_size, " is not one (2^k * m, m = 1 or a Paley order: docs/rotations.md)");
  QF_REQUIRE(!c.qk_hadamard || kernels::hadamard_supported(c.head_size()), kLlama,
             ": config field 'qforge_qk_hadamard' needs a Hadamard size; head_dim ", c.head_size(), " is not one");
}

LlamaConfig LlamaConfig::from_json(const nlohmann::json& j) {
  QF_REQUIRE(j.is_object(), kLlama, ": config is not a JSON object");
  std::string model_type = "llama";
  get_config_field(j, kLlama, "model_type", model_type);
  LlamaConfig c = read_config(j, kLlama, defaults(model_type));
  if (j.contains("rope_scaling")) c.rope_scaling = LlamaRopeScaling::from_json(j["rope_scaling"]);
  read_rope_parameters(j, c);
  get_config_field(j, kLlama, "layer_types", c.layer_types);
  // Qwen2Config keeps sliding_window only with use_sliding_window.
  if (c.model_type == "qwen2" && !c.use_sliding_window) c.sliding_window = 0;
  get_config_field(j, kLlama, "qforge_down_proj_hadamard", c.down_proj_hadamard);
  get_config_field(j, kLlama, "qforge_qk_hadamard", c.qk_hadamard);
  if (j.contains("qforge_kv_cache")) c.kv_cache = kv_cache_scheme_from_json(j["qforge_kv_cache"], kLlama);
  require_full_rotary(j, "");
  c.validate();
  return c;
}

LlamaConfig LlamaConfig::from_file(const std::string& path) { return from_json(read_config_json(path, kLlama)); }

double LlamaConfig::parameter_count() const {
  const double h = static_cast<double>(hidden_size), i = static_cast<double>(intermediate_size),
               v = static_cast<double>(vocab_size), q = static_cast<double>(num_attention_heads * head_size()),
               kv = static_cast<double>(kv_heads() * head_size());
  // q, k, v, o projections, gate / up / down, two RMSNorms; biases where the family has them.
  double layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
  if (qkv_bias()) layer += q + 2 * kv;
  if (o_bias()) layer += h;
  if (mlp_biases()) layer += 2 * i + h;
  return v * h + static_cast<double>(num_hidden_layers) * layer + h + (tie_word_embeddings ? 0.0 : v * h);
}

nlohmann::json LlamaConfig::to_json() const {
  nlohmann::json j = config_json(*this, model_type.c_str(), architecture());
  j["rope_scaling"] = rope_scaling.to_json();
  if (!layer_types.empty()) j["layer_types"] = layer_types;
  if (down_proj_hadamard) j["qforge_down_proj_hadamard"] = true;
  if (qk_hadamard) j["qforge_qk_hadamard"] = true;
  if (kv_cache.quantized()) j["qforge_kv_cache"] = kv_cache_scheme_json(kv_cache);
  return j;
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, int64_t layer_) : config(c), layer(layer_) { reset(); }

void LlamaAttentionImpl::reset() {
  const int64_t h = config.hidden_size, q = config.num_attention_heads * config.head_size(),
                kv = config.kv_heads() * config.head_size();
  auto linear = [](int64_t in, int64_t out, bool bias) {
    return nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  };
  q_proj = register_module("q_proj", linear(h, q, config.qkv_bias()));
  k_proj = register_module("k_proj", linear(h, kv, config.qkv_bias()));
  v_proj = register_module("v_proj", linear(h, kv, config.qkv_bias()));
  o_proj = register_module("o_proj", linear(q, h, config.o_bias()));
  qk_matmul = register_module("qk_matmul", nn::MatMul());
  av_matmul = register_module("av_matmul", nn::MatMul());
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const RopeTables& rope, KvCache* cache) {
  const int64_t B = x.size(0), T = x.size(1), H = config.num_attention_heads, KV = config.kv_heads(),
                D = config.head_size(), rep = H / KV;
  auto heads = [&](const at::Tensor& t, int64_t n) { return t.view({B, T, n, D}).transpose(1, 2); };
  at::Tensor q = rope_heads(q_proj->forward(x), H, D, rope);
  at::Tensor k = rope_heads(k_proj->forward(x), KV, D, rope), v = heads(v_proj->forward(x), KV);
  // A rotated model's keys are cached (and quantized) turned by H; the queries turn alike.
  if (config.qk_hadamard) q = kernels::hadamard_rotate(q), k = kernels::hadamard_rotate(k);
  // Grouped-query attention without repeating keys and values: the `rep` query heads sharing a
  // key/value head stack their rows, so each product is the one HF's repeated heads compute.
  const at::Tensor qg = q.reshape({B, KV, rep * T, D});
  const int64_t window = config.attention_window(layer);
  const double scale = std::pow(static_cast<double>(D), -0.5);
  const bool float_products = !qk_matmul->quantized() && !av_matmul->quantized();
  auto output = [&](const at::Tensor& ctx) {
    return o_proj->forward(ctx.view({B, H, T, D}).transpose(1, 2).reshape({B, T, H * D}));
  };
  // A quantized cache at decode sizes: attention reads its codes (nothing dequantized up front).
  if (cache != nullptr && float_products) {
    const at::Tensor ctx = fused_decode_attention_on_codes(qg, *cache, static_cast<size_t>(layer), k, v, T, window, scale);
    if (ctx.defined()) return output(ctx);
  }
  if (cache != nullptr) {
    std::tie(k, v) = cache->append(static_cast<size_t>(layer), k, v);
  } else {
    cacheless_kv(k, v, config.kv_cache, layer, kLlama);
  }
  const int64_t S = k.size(2), past = S - T;
  // Float products: the whole attention in one kernel (activation.h), decode- or prefill-size; a
  // decode step's context written as [B, T, H · D], o_proj's input (one query position, or no
  // grouping: rows evenly spaced there).
  if (float_products) {
    const at::Tensor tokens = fused_decode_attention_tokens(qg, k, v, T, window, scale);
    if (tokens.defined()) return o_proj->forward(tokens);
    at::Tensor ctx = fused_decode_attention(qg, k, v, T, window, scale);
    if (!ctx.defined()) ctx = fused_prefill_attention(qg, k, v, T, window, scale);
    if (ctx.defined()) return output(ctx);
  }
  const at::Tensor scores = qk_matmul->forward(qg, k.transpose(-1, -2)).view({B, H, T, S});
  const at::Tensor p = attention_probs(scores, past, window, scale).to(v.scalar_type());
  const at::Tensor ctx = av_matmul->forward(p.view({B, KV, rep * T, S}), v).view({B, H, T, D});
  return o_proj->forward(ctx.transpose(1, 2).reshape({B, T, H * D}));
}

LlamaMlpImpl::LlamaMlpImpl(const LlamaConfig& c) : config(c) { reset(); }

void LlamaMlpImpl::reset() {
  auto linear = [&](int64_t in, int64_t out) {
    return nn::Linear(torch::nn::LinearOptions(in, out).bias(config.mlp_biases()));
  };
  gate_proj = register_module("gate_proj", linear(config.hidden_size, config.intermediate_size));
  up_proj = register_module("up_proj", linear(config.hidden_size, config.intermediate_size));
  down_proj = register_module("down_proj", linear(config.intermediate_size, config.hidden_size));
}

at::Tensor LlamaMlpImpl::forward(const at::Tensor& x) {
  at::Tensor a = apply_activation(config.hidden_act, gate_proj->forward(x)) * up_proj->forward(x);
  // A rotated down_proj holds W·Hᵀ: its input turns by H at run time, so the product is W·a.
  if (config.down_proj_hadamard) a = kernels::hadamard_rotate(a);
  return down_proj->forward(a);
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c, int64_t layer_) : config(c), layer(layer_) {
  reset();
}

void LlamaDecoderLayerImpl::reset() {
  self_attn = register_module("self_attn", LlamaAttention(config, layer));
  mlp = register_module("mlp", LlamaMlp(config));
  input_layernorm = register_module("input_layernorm", nn::RMSNorm(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", nn::RMSNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const RopeTables& rope, KvCache* cache) {
  const auto [h, m] = forward_terms(x, input_layernorm->forward(x), rope, cache);
  return h + m;
}

std::pair<at::Tensor, at::Tensor> LlamaDecoderLayerImpl::forward_terms(const at::Tensor& x, const at::Tensor& normed_x,
                                                                       const RopeTables& rope, KvCache* cache) {
  const auto [h, normed] = post_attention_layernorm->forward_residual(x, self_attn->forward(normed_x, rope, cache));
  return {h, mlp->forward(normed)};
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c) : config(c) {
  config.validate();
  reset();
}

void LlamaModelImpl::reset() {
  embed_tokens = register_module("embed_tokens", nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(config, i));
  norm = register_module("norm", nn::RMSNorm(config.hidden_size, config.rms_norm_eps));
  inv_freq = rope_inv_freq(config);
}

RopeTables LlamaModelImpl::rope(int64_t past, int64_t T, const at::Device& device) const {
  const at::Tensor pos = at::arange(past, past + T, at::TensorOptions().dtype(at::kLong)).to(at::kFloat);
  const at::Tensor freqs = pos.unsqueeze(1) * inv_freq.unsqueeze(0);  // [T, head_dim / 2]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(device), emb.sin().to(device)};
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& ids, KvCache* cache) {
  QF_REQUIRE(ids.dim() == 2, kLlama, ": input_ids must be [batch, seq], got ", ids.sizes());
  const int64_t T = ids.size(1), past = cache ? cache->length() : 0;
  if (cache) {
    QF_REQUIRE(cache->keys.empty() || static_cast<int64_t>(cache->keys.size()) == config.num_hidden_layers, kLlama,
               ": the cache holds ", cache->keys.size(), " layers, the model has ", config.num_hidden_layers);
    cache->set_scheme(config.kv_cache);
    cache->resize(static_cast<size_t>(config.num_hidden_layers));
  }
  const RopeTables tables = rope(past, T, ids.device());
  at::Tensor x = embed_tokens->forward(ids);
  // Each layer's last residual add happens inside the next RMSNorm's kernel (the next layer's
  // input_layernorm, or norm): mlp + h there, bit for bit the layer's own h + mlp.
  std::vector<LlamaDecoderLayerImpl*> decoders;
  for (const auto& l : *layers) decoders.push_back(l->as<LlamaDecoderLayerImpl>());
  if (decoders.empty()) return norm->forward(x);
  at::Tensor normed = decoders.front()->input_layernorm->forward(x);
  for (size_t i = 0; i < decoders.size(); ++i) {
    const auto [h, m] = decoders[i]->forward_terms(x, normed, tables, cache);
    std::tie(x, normed) = (i + 1 < decoders.size() ? decoders[i + 1]->input_layernorm : norm)->forward_residual(m, h);
  }
  return normed;
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c) : config(c) { reset(); }

void LlamaForCausalLMImpl::reset() {
  model = register_module("model", LlamaModel(config));
  if (!config.tie_word_embeddings)
    lm_head = register_module(
        "lm_head", nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
  init_weights();
}

void LlamaForCausalLMImpl::init_weights() {
  at::NoGradGuard no_grad;
  for (auto& item : named_modules("", /*include_self=*/false)) {
    auto& m = item.value();
    if (auto* lin = m->as<nn::LinearImpl>()) {
      lin->weight.normal_(0.0, config.initializer_range);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* emb = m->as<nn::EmbeddingImpl>()) {
      emb->weight.normal_(0.0, config.initializer_range);
    } else if (auto* norm = m->as<nn::RMSNormImpl>()) {
      norm->weight.fill_(1.0);
    }
  }
}

void LlamaForCausalLMImpl::untie_lm_head() {
  QF_REQUIRE(config.tie_word_embeddings && !lm_head, kLlama, ": the LM head is already untied");
  lm_head = register_module("lm_head", untied_lm_head(*model->embed_tokens, kLlama));
  config.tie_word_embeddings = false;
}

void LlamaForCausalLMImpl::set_configs(const std::function<void(LlamaConfig&)>& set) {
  set(config);
  set(model->config);
  for (const auto& l : *model->layers) {
    auto* layer = l->as<LlamaDecoderLayerImpl>();
    set(layer->config);
    set(layer->self_attn->config);
    set(layer->mlp->config);
  }
}

void LlamaForCausalLMImpl::set_down_proj_hadamard(bool on) {
  QF_REQUIRE(!on || kernels::hadamard_supported(config.intermediate_size), kLlama, ": no Hadamard transform of size ",
             config.intermediate_size, " (intermediate_size)");
  set_configs([on](LlamaConfig& c) { c.down_proj_hadamard = on; });
}

void LlamaForCausalLMImpl::set_qk_hadamard(bool on) {
  QF_REQUIRE(!on || kernels::hadamard_supported(config.head_size()), kLlama, ": no Hadamard transform of size ",
             config.head_size(), " (head_dim)");
  set_configs([on](LlamaConfig& c) { c.qk_hadamard = on; });
}

void LlamaForCausalLMImpl::set_kv_cache_scheme(const KvCacheScheme& scheme) {
  check_kv_cache_scheme(scheme, kLlama);
  set_configs([&scheme](LlamaConfig& c) { c.kv_cache = scheme; });
}

int64_t LlamaForCausalLMImpl::kv_cache_bytes_per_token(const KvCacheScheme& scheme) const {
  return 2 * config.num_hidden_layers * config.kv_heads() * scheme.bytes_per_head(config.head_size(), 4);
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& ids, KvCache* cache) {
  return lm_head_logits(model->forward(ids, cache), lm_head, *model->embed_tokens, kLlama, "model.embed_tokens");
}

void load_hf_llama(LlamaForCausalLM& model, StateDict state, const std::string& source) {
  if (model->config.tie_word_embeddings) drop_tied_lm_head(state, "model.embed_tokens.weight", kLlama, source);
  LoadStateOptions opts;
  opts.ignore_suffixes = {".rotary_emb.inv_freq"};
  opts.source = std::string(kLlama) + ": " + source;
  load_model_state(*model, state, opts);
}

LlamaForCausalLM load_llama_for_causal_lm(const std::string& dir) {
  LlamaForCausalLM model(LlamaConfig::from_file(dir + "/config.json"));
  HfWeights weights = read_hf_weights(dir);
  load_hf_llama(model, std::move(weights.tensors), weights.source);
  return model;
}

void save_hf_llama(const LlamaForCausalLM& model, const std::string& dir) {
  write_hf_folder(dir, model->config.to_json(), model_state(*model));
}

}  // namespace qforge::models
