// Llama-family decoders of qforge layers with Hugging Face's parameter names, for the model types
// llama (Llama 1/2/3), mistral and qwen2:
//   model.embed_tokens, model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.{gate,up,down}_proj,
//   model.layers.N.input_layernorm, model.layers.N.post_attention_layernorm, model.norm, lm_head.
// RMSNorm (nn::RMSNorm), rotary position embeddings (RoPE, rotate-half form, rope_scaling
// "linear" and "llama3"), SwiGLU MLP down(silu(gate(x)) * up(x)), grouped-query attention
// (num_key_value_heads < num_attention_heads: each key/value head serves
// num_attention_heads / num_key_value_heads consecutive query heads), tied or untied head.
// Qwen2 has q/k/v biases; Llama's attention_bias puts biases on q/k/v/o and mlp_bias on the MLP
// (Mistral's and Qwen2's config classes ignore both).
// Sliding-window attention, per HF's layer rules: Mistral on every layer when sliding_window is
// set (layer_types ignored); Qwen2 only with use_sliding_window, on the layers layer_types marks
// "sliding_attention" (without layer_types: from max_window_layers on); Llama never. Position q
// sees keys k with q - sliding_window < k <= q, as transformers' masking_utils.
// Attention products go through qforge::nn::MatMul, so every quantization path applies.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <nlohmann/json_fwd.hpp>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "framework/models/field_rule.h"
#include "framework/models/kv_cache.h"
#include "framework/models/state_dict.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"
#include "framework/nn/matmul.h"
#include "framework/nn/rms_norm.h"

namespace qforge::models {

// HF's rope_scaling object. "default" (JSON null) leaves RoPE's frequencies as they are;
// "linear" divides every frequency by factor; "llama3" (Llama 3.1+) divides the low frequencies
// (wavelength > original_max_position_embeddings / low_freq_factor) by factor, keeps the high
// ones (wavelength < original_max_position_embeddings / high_freq_factor) and interpolates
// between, as docs/llm.md writes out.
// The keys each kind needs are required, as HF's rope validation requires them. transformers 5
// writes the same object as `rope_parameters` (with rope_theta inside), read by from_json(j, key).
struct LlamaRopeScaling {
  std::string rope_type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // null or an object; `key` ("rope_scaling" or "rope_parameters") names the field in errors.
  static LlamaRopeScaling from_json(const nlohmann::json& j, const char* key = "rope_scaling");
  nlohmann::json to_json() const;  // null for "default"
  void validate(const char* key) const;
};

struct LlamaConfig {
  std::string model_type = "llama";  // llama, mistral or qwen2
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // 0 (JSON null) = num_attention_heads
  int64_t head_dim = 0;             // 0 (JSON null) = hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double initializer_range = 0.02;
  double attention_dropout = 0.0;
  bool attention_bias = false, mlp_bias = false;
  bool tie_word_embeddings = false;
  int64_t sliding_window = 0;       // 0 (JSON null): none
  bool use_sliding_window = false;  // Qwen2 applies sliding_window only when this is true,
  int64_t max_window_layers = 28;   // and then to layers max_window_layers and up
  // HF's per-layer "full_attention" / "sliding_attention" list (newer configs); empty: derived as above.
  std::vector<std::string> layer_types;
  LlamaRopeScaling rope_scaling;
  // A Hadamard-rotated model (framework/ptq/rotate.h): down_proj holds W·Hᵀ and its input is
  // rotated at run time (kernels/cpu/hadamard_tensor.h). config.json key
  // "qforge_down_proj_hadamard", written only when true (HF's loaders do not know it).
  bool down_proj_hadamard = false;
  // QuaRot's rotation of the KV cache (framework/ptq/rotate.h): queries and keys turn by the
  // Hadamard transform of head_dim after RoPE (scores unchanged: (q·Hᵀ)(k·Hᵀ)ᵀ = q·kᵀ), so the
  // cache holds rotated keys; values are rotated offline (v_proj / o_proj). config.json key
  // "qforge_qk_hadamard", written only when true.
  bool qk_hadamard = false;
  // The KV cache's keys and values (docs/kv_cache.md): float, or int8 / int4 codes; a cacheless
  // forward attends to their fake-quantized values. config.json key "qforge_kv_cache", written
  // only when quantized (a file without it keeps the float cache).
  KvCacheScheme kv_cache;

  int64_t kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  bool qkv_bias() const { return model_type == "qwen2" || (model_type == "llama" && attention_bias); }
  bool o_bias() const { return model_type == "llama" && attention_bias; }
  bool mlp_biases() const { return model_type == "llama" && mlp_bias; }
  // The sliding window of layer `layer` (0: full causal attention), by the rules above.
  int64_t attention_window(int64_t layer) const;
  const char* architecture() const;  // "LlamaForCausalLM", ...
  // HF's config-class defaults for model_type (MistralConfig: num_key_value_heads 8, sliding_window
  // 4096; Qwen2Config: num_key_value_heads 32, sliding_window 4096, ...); from_json reads over them.
  static LlamaConfig defaults(const std::string& model_type);
  // Every check from_json makes on the fields; the model constructors call it.
  void validate() const;
  // rope_theta / rope_scaling, or transformers 5's rope_parameters object (the per-layer-type
  // nested form is refused); a config giving both forms must agree.
  static LlamaConfig from_json(const nlohmann::json& j);
  static LlamaConfig from_file(const std::string& path);
  nlohmann::json to_json() const;
  // Parameters of the model this config builds, counted from its fields before anything is
  // allocated (a double: configs far past any machine's memory must not overflow).
  double parameter_count() const;

  // The fields read and written (config_field.h), in reading order; rope_scaling apart.
  template <typename Self, typename Visit>
  static void fields(Self& c, Visit&& visit) {
    visit("model_type", c.model_type, FieldRule::kAny);
    visit("vocab_size", c.vocab_size, FieldRule::kPositive);
    visit("hidden_size", c.hidden_size, FieldRule::kPositive);
    visit("intermediate_size", c.intermediate_size, FieldRule::kPositive);
    visit("num_hidden_layers", c.num_hidden_layers, FieldRule::kPositive);
    visit("num_attention_heads", c.num_attention_heads, FieldRule::kPositive);
    visit("num_key_value_heads", c.num_key_value_heads, FieldRule::kNonPositiveIsNull);
    visit("head_dim", c.head_dim, FieldRule::kNonPositiveIsNull);
    visit("max_position_embeddings", c.max_position_embeddings, FieldRule::kPositive);
    visit("hidden_act", c.hidden_act, FieldRule::kAny);
    visit("rms_norm_eps", c.rms_norm_eps, FieldRule::kAny);
    visit("rope_theta", c.rope_theta, FieldRule::kPositive);
    visit("initializer_range", c.initializer_range, FieldRule::kAny);
    visit("attention_dropout", c.attention_dropout, FieldRule::kAny);
    visit("attention_bias", c.attention_bias, FieldRule::kAny);
    visit("mlp_bias", c.mlp_bias, FieldRule::kAny);
    visit("tie_word_embeddings", c.tie_word_embeddings, FieldRule::kAny);
    visit("sliding_window", c.sliding_window, FieldRule::kNonPositiveIsNull);
    visit("use_sliding_window", c.use_sliding_window, FieldRule::kAny);
    visit("max_window_layers", c.max_window_layers, FieldRule::kAny);
  }
};

// Rotary embedding tables for positions [past, past + T): cos and sin [T, head_dim].
struct RopeTables {
  at::Tensor cos, sin;
};

class LlamaAttentionImpl : public torch::nn::Cloneable<LlamaAttentionImpl> {
 public:
  LlamaAttentionImpl(const LlamaConfig& c, int64_t layer);
  void reset() override;
  // Causal; x [B, T, hidden_size]. With a cache: x holds the positions after the cached ones; the
  // cache's entry `layer` then holds all of them (keys after RoPE, [B, kv_heads, S, D]), appended
  // in place (KvCache::append).
  at::Tensor forward(const at::Tensor& x, const RopeTables& rope, KvCache* cache = nullptr);
  // forward(x) as its last two terms {h, mlp(post_attention_layernorm(h))} (forward = their sum),
  // given normed_x = input_layernorm(x): the model adds them inside the next RMSNorm's kernel.
  std::pair<at::Tensor, at::Tensor> forward_terms(const at::Tensor& x, const at::Tensor& normed_x,
                                                  const RopeTables& rope, KvCache* cache = nullptr);
  LlamaConfig config;
  int64_t layer = 0;
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  nn::MatMul qk_matmul{nullptr}, av_matmul{nullptr};
};
TORCH_MODULE(LlamaAttention);

class LlamaMlpImpl : public torch::nn::Cloneable<LlamaMlpImpl> {
 public:
  explicit LlamaMlpImpl(const LlamaConfig& c);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  LlamaConfig config;
  nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMlp);

class LlamaDecoderLayerImpl : public torch::nn::Cloneable<LlamaDecoderLayerImpl> {
 public:
  LlamaDecoderLayerImpl(const LlamaConfig& c, int64_t layer);
  void reset() override;
  at::Tensor forward(const at::Tensor& x, const RopeTables& rope, KvCache* cache = nullptr);
  // forward(x) as its last two terms {h, mlp(post_attention_layernorm(h))} (forward = their sum),
  // given normed_x = input_layernorm(x): the model adds them inside the next RMSNorm's kernel.
  std::pair<at::Tensor, at::Tensor> forward_terms(const at::Tensor& x, const at::Tensor& normed_x,
                                                  const RopeTables& rope, KvCache* cache = nullptr);
  LlamaConfig config;
  int64_t layer = 0;
  LlamaAttention self_attn{nullptr};
  LlamaMlp mlp{nullptr};
  nn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

class LlamaModelImpl : public torch::nn::Cloneable<LlamaModelImpl> {
 public:
  explicit LlamaModelImpl(const LlamaConfig& c);
  void reset() override;
  // Last hidden state [B, T, hidden_size]. With a cache: input_ids are the positions after the
  // cache's, and the cache grows by T.
  at::Tensor forward(const at::Tensor& input_ids, KvCache* cache = nullptr);
  // cos / sin of positions [past, past + T) (float32, as HF computes them).
  RopeTables rope(int64_t past, int64_t T, const at::Device& device) const;
  LlamaConfig config;
  nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  nn::RMSNorm norm{nullptr};
  at::Tensor inv_freq;  // [head_dim / 2], after rope_scaling; derived from config, not a checkpoint entry
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Cloneable<LlamaForCausalLMImpl>, public KvCacheModel {
 public:
  explicit LlamaForCausalLMImpl(const LlamaConfig& c);
  void reset() override;
  // Logits [B, T, vocab_size]. Incremental decoding: forward(prompt, &cache), then
  // forward(next [B, 1], &cache) per token; each step's logits equal the full forward's at that
  // position up to float rounding.
  at::Tensor forward(const at::Tensor& input_ids, KvCache* cache = nullptr);
  // HF's init: N(0, initializer_range) for Linear and Embedding weights, zero biases, unit RMSNorm.
  void init_weights();
  // Gives a tied model its own `lm_head` (a copy of the embedding's table; logits unchanged), so
  // the head can be quantized apart from the embedding. Before quantize() only.
  void untie_lm_head();
  // Turns the online Hadamard on down_proj's input on or off in every layer (and the configs
  // saved with the model); the rotation that needs it is framework/ptq/rotate.h's.
  void set_down_proj_hadamard(bool on);
  // Turns the online Hadamard on queries and keys (after RoPE) on or off in every layer.
  void set_qk_hadamard(bool on);
  // The KV-cache scheme of every attention layer (and the configs saved with the model).
  const KvCacheScheme& kv_cache_scheme() const override { return config.kv_cache; }
  int64_t kv_cache_head_dim() const override { return config.head_size(); }
  int64_t kv_cache_heads() const override { return config.kv_heads(); }
  int64_t kv_cache_layers() const override { return config.num_hidden_layers; }
  void set_kv_cache_scheme(const KvCacheScheme& scheme) override;
  int64_t kv_cache_bytes_per_token(const KvCacheScheme& scheme) const override;
  LlamaConfig config;
  LlamaModel model{nullptr};
  nn::Linear lm_head{nullptr};  // untied models only

 private:
  // Applies `set` to the model's config and every copy its modules hold.
  void set_configs(const std::function<void(LlamaConfig&)>& set);
};
TORCH_MODULE(LlamaForCausalLM);

// HF import: `state` by HF names (float tensors of any dtype). Ignores old checkpoints'
// "rotary_emb.inv_freq" buffers and a tied model's lm_head.weight (checked equal to the
// embedding); every missing, unknown or mis-shaped tensor is named before the model changes.
void load_hf_llama(LlamaForCausalLM& model, StateDict state, const std::string& source = "checkpoint");
// An HF folder: config.json and model.safetensors or a sharded model.safetensors.index.json.
LlamaForCausalLM load_llama_for_causal_lm(const std::string& dir);
// config.json + model.safetensors (float32), which load_llama_for_causal_lm reads back.
void save_hf_llama(const LlamaForCausalLM& model, const std::string& dir);

}  // namespace qforge::models
