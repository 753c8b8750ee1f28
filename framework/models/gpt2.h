// GPT-2 decoder of qforge layers with Hugging Face GPT2LMHeadModel's parameter names:
//   transformer.wte, transformer.wpe, transformer.h.N.ln_1, transformer.h.N.attn.c_attn,
//   transformer.h.N.attn.c_proj, transformer.h.N.ln_2, transformer.h.N.mlp.c_fc,
//   transformer.h.N.mlp.c_proj, transformer.ln_f; lm_head is tied to wte (no parameter of its own).
// HF keeps these projections in its Conv1D with weight [in, out]; qforge Linear holds [out, in], so
// load_hf_gpt2 / save_hf_gpt2 transpose them. Causal self-attention goes through qforge::nn::MatMul.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/pimpl.h>

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "framework/models/field_rule.h"
#include "framework/models/kv_cache.h"
#include "framework/models/state_dict.h"
#include "framework/nn/embedding.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "framework/nn/matmul.h"

namespace qforge::models {

struct Gpt2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // 0 (JSON null) = 4 * n_embd
  std::string activation_function = "gelu_new";
  double resid_pdrop = 0.1, embd_pdrop = 0.1, attn_pdrop = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  // HF's tie_word_embeddings: true (GPT-2's own) computes the logits with the token embedding's
  // table; false gives the model its own `lm_head` Linear, which quantize() treats like any other.
  bool tie_word_embeddings = true;
  // The KV cache's keys and values, as LlamaConfig::kv_cache (config.json "qforge_kv_cache").
  KvCacheScheme kv_cache;

  int64_t inner() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  static Gpt2Config from_json(const nlohmann::json& j);
  static Gpt2Config from_file(const std::string& path);
  nlohmann::json to_json() const;  // with n_ctx = n_positions, as HF writes it
  // Parameters of the model this config builds, counted from its fields before anything is
  // allocated (a double: configs far past any machine's memory must not overflow).
  double parameter_count() const;

  // The fields read and written (config_field.h), in reading order.
  template <typename Self, typename Visit>
  static void fields(Self& c, Visit&& visit) {
    visit("vocab_size", c.vocab_size, FieldRule::kPositive);
    visit("n_positions", c.n_positions, FieldRule::kPositive);
    visit("n_embd", c.n_embd, FieldRule::kPositive);
    visit("n_layer", c.n_layer, FieldRule::kPositive);
    visit("n_head", c.n_head, FieldRule::kPositive);
    visit("n_inner", c.n_inner, FieldRule::kNonPositiveIsNull);
    visit("activation_function", c.activation_function, FieldRule::kAny);
    visit("resid_pdrop", c.resid_pdrop, FieldRule::kAny);
    visit("embd_pdrop", c.embd_pdrop, FieldRule::kAny);
    visit("attn_pdrop", c.attn_pdrop, FieldRule::kAny);
    visit("layer_norm_epsilon", c.layer_norm_epsilon, FieldRule::kAny);
    visit("initializer_range", c.initializer_range, FieldRule::kAny);
    visit("tie_word_embeddings", c.tie_word_embeddings, FieldRule::kAny);
  }
};

// The GPT-2 cache's tensors are [B, n_head, T_past, head_dim].
using Gpt2KvCache = KvCache;

class Gpt2AttentionImpl : public torch::nn::Cloneable<Gpt2AttentionImpl> {
 public:
  explicit Gpt2AttentionImpl(const Gpt2Config& c);
  void reset() override;
  // Causal; x [B, T, n_embd]. With a cache: x holds the positions after the T_past cached ones of
  // the cache's entry `layer`, which every query sees besides its own causal prefix; the entry then
  // holds all T_past + T positions.
  at::Tensor forward(const at::Tensor& x, KvCache* cache = nullptr, int64_t layer = 0);
  Gpt2Config config;
  nn::Linear c_attn{nullptr}, c_proj{nullptr};
  nn::MatMul qk_matmul{nullptr}, av_matmul{nullptr};
  torch::nn::Dropout attn_dropout{nullptr}, resid_dropout{nullptr};
};
TORCH_MODULE(Gpt2Attention);

class Gpt2MlpImpl : public torch::nn::Cloneable<Gpt2MlpImpl> {
 public:
  explicit Gpt2MlpImpl(const Gpt2Config& c);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  Gpt2Config config;
  nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(Gpt2Mlp);

class Gpt2BlockImpl : public torch::nn::Cloneable<Gpt2BlockImpl> {
 public:
  explicit Gpt2BlockImpl(const Gpt2Config& c);
  void reset() override;
  at::Tensor forward(const at::Tensor& x, KvCache* cache = nullptr, int64_t layer = 0);
  // forward(x) as its last two terms {h, mlp(ln_2(h))} (forward = h + mlp(...)), given
  // normed_x = ln_1(x): the model adds them inside the next LayerNorm's kernel.
  std::pair<at::Tensor, at::Tensor> forward_terms(const at::Tensor& x, const at::Tensor& normed_x,
                                                  KvCache* cache = nullptr, int64_t layer = 0);
  Gpt2Config config;
  nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Gpt2Attention attn{nullptr};
  Gpt2Mlp mlp{nullptr};
};
TORCH_MODULE(Gpt2Block);

class Gpt2ModelImpl : public torch::nn::Cloneable<Gpt2ModelImpl> {
 public:
  explicit Gpt2ModelImpl(const Gpt2Config& c);
  void reset() override;
  // Last hidden state [B, T, n_embd]. With a cache: input_ids are the positions after the
  // cache's (T_past + T <= n_positions) and the cache grows by T.
  at::Tensor forward(const at::Tensor& input_ids, Gpt2KvCache* cache = nullptr);
  Gpt2Config config;
  nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Gpt2Model);

class Gpt2LMHeadModelImpl : public torch::nn::Cloneable<Gpt2LMHeadModelImpl>, public KvCacheModel {
 public:
  explicit Gpt2LMHeadModelImpl(const Gpt2Config& c);
  void reset() override;
  // Logits [B, T, vocab_size]; the head is the tied token embedding's table (float: not a layer of
  // its own), or `lm_head` once untied.
  // Incremental decoding: forward(prompt, &cache), then forward(next_token [B, 1], &cache) per
  // token; each step's logits equal those of the full sequence's forward at that position (up to
  // float rounding: the products run at other shapes).
  at::Tensor forward(const at::Tensor& input_ids, Gpt2KvCache* cache = nullptr);
  // HF's init: N(0, 0.02) weights, zero biases, c_proj weights N(0, 0.02 / sqrt(2 * n_layer)).
  void init_weights();
  // Gives a tied model its own LM head: `lm_head`, a bias-free Linear holding a copy of the token
  // embedding's table (config.tie_word_embeddings becomes false). The logits stay bit for bit the
  // same; the head can then be quantized (and frozen) apart from the embedding, which a decoder
  // reading the whole [vocab, n_embd] table for every token wants. Before quantize() only.
  void untie_lm_head();
  // The KV-cache scheme of every attention layer (and the configs saved with the model).
  const KvCacheScheme& kv_cache_scheme() const override { return config.kv_cache; }
  int64_t kv_cache_head_dim() const override { return config.n_embd / config.n_head; }
  int64_t kv_cache_heads() const override { return config.n_head; }
  int64_t kv_cache_layers() const override { return config.n_layer; }
  void set_kv_cache_scheme(const KvCacheScheme& scheme) override;
  int64_t kv_cache_bytes_per_token(const KvCacheScheme& scheme) const override;
  Gpt2Config config;
  Gpt2Model transformer{nullptr};
  nn::Linear lm_head{nullptr};  // untied models only
};
TORCH_MODULE(Gpt2LMHeadModel);

// HF import: transposes Conv1D weights ([in, out] -> [out, in]); ignores "attn.bias"/"attn.masked_bias"
// buffers and a tied "lm_head.weight" (checked equal to wte); other mismatches are errors.
void load_hf_gpt2(Gpt2LMHeadModel& model, StateDict state, const std::string& source = "checkpoint");
// HF names and layouts (Conv1D weights transposed back to [in, out]).
StateDict hf_gpt2_state(const Gpt2LMHeadModel& model);
Gpt2LMHeadModel load_gpt2_lm_head_model(const std::string& dir);  // config.json + weights (hf_folder.h)
void save_hf_gpt2(const Gpt2LMHeadModel& model, const std::string& dir);

}  // namespace qforge::models
