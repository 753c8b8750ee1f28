// GPT-2 decoder with HF names (see gpt2.h).
#include "framework/models/gpt2.h"

#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <tuple>
#include <vector>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "framework/models/activation.h"
#include "framework/models/config_field.h"
#include "framework/models/hf_folder.h"
#include "framework/models/hf_lm_head.h"
#include "framework/models/kv_quant.h"
#include "framework/format/safetensors.h"

namespace qforge::models {
namespace {

// HF Conv1D projections: stored [in, out] in checkpoints.
bool is_conv1d_weight(const std::string& key) {
  for (const char* s : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const std::string suffix(s);
    if (key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
  }
  return false;
}

}  // namespace

Gpt2Config Gpt2Config::from_json(const nlohmann::json& j) {
  constexpr const char* kWho = "models/gpt2";
  Gpt2Config c = read_config<Gpt2Config>(j, kWho);
  for (const char* unsupported : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"})
    QF_REQUIRE(!j.contains(unsupported) || !j[unsupported].is_boolean() || !j[unsupported].get<bool>(),
               "models/gpt2: config option '", unsupported, "' is not supported");
  QF_REQUIRE(!j.contains("scale_attn_weights") || j["scale_attn_weights"] == true,
             "models/gpt2: scale_attn_weights=false is not supported");
  require_positive_fields(c, kWho);
  require_heads_divide(kWho, "n_embd", c.n_embd, "n_head", c.n_head);
  apply_activation(c.activation_function, at::zeros({1}));
  if (j.contains("qforge_kv_cache")) c.kv_cache = kv_cache_scheme_from_json(j["qforge_kv_cache"], kWho);
  c.kv_cache.validate(c.n_layer, c.n_head, c.n_embd / c.n_head, kWho);
  return c;
}

Gpt2Config Gpt2Config::from_file(const std::string& path) { return from_json(read_config_json(path, "models/gpt2")); }

double Gpt2Config::parameter_count() const {
  const double e = static_cast<double>(n_embd), i = static_cast<double>(inner()), v = static_cast<double>(vocab_size);
  // c_attn (e -> 3e), c_proj, c_fc, the MLP's c_proj, each with a bias, and two LayerNorms.
  const double layer = (e * 3 * e + 3 * e) + (e * e + e) + (e * i + i) + (i * e + e) + 2 * 2 * e;
  return (v + static_cast<double>(n_positions)) * e + static_cast<double>(n_layer) * layer + 2 * e +
         (tie_word_embeddings ? 0.0 : v * e);
}

nlohmann::json Gpt2Config::to_json() const {
  nlohmann::json j = config_json(*this, "gpt2", "GPT2LMHeadModel");
  j["n_ctx"] = n_positions;
  if (kv_cache.quantized()) j["qforge_kv_cache"] = kv_cache_scheme_json(kv_cache);
  return j;
}

Gpt2AttentionImpl::Gpt2AttentionImpl(const Gpt2Config& c) : config(c) { reset(); }

void Gpt2AttentionImpl::reset() {
  c_attn = register_module("c_attn", nn::Linear(config.n_embd, 3 * config.n_embd));
  c_proj = register_module("c_proj", nn::Linear(config.n_embd, config.n_embd));
  qk_matmul = register_module("qk_matmul", nn::MatMul());
  av_matmul = register_module("av_matmul", nn::MatMul());
  attn_dropout = register_module("attn_dropout", torch::nn::Dropout(config.attn_pdrop));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(config.resid_pdrop));
}

namespace {

// d(x), skipped outside training: Dropout is then the identity, and the skipped call is one
// dispatched op less per use in a decode step.
at::Tensor dropped(torch::nn::Dropout& d, const at::Tensor& x) { return d->is_training() ? d->forward(x) : x; }

}  // namespace

at::Tensor Gpt2AttentionImpl::forward(const at::Tensor& x, KvCache* cache, int64_t layer) {
  const int64_t B = x.size(0), T = x.size(1), H = config.n_head, C = config.n_embd, D = C / H;
  const at::Tensor qkv = c_attn->forward(x);
  // q, k, v [B, H, T, D]: views of qkv [B, T, 3 · C]. Outside autograd each is one strided view
  // (split, view and permute would take seven ops a layer, the costliest part of a decode step's
  // glue); under autograd the ops whose backward is the plain one.
  std::array<at::Tensor, 3> parts;
  if (at::GradMode::is_enabled() && qkv.requires_grad()) {
    const auto qkv_split = qkv.split(C, -1);
    for (size_t i = 0; i < 3; ++i) parts[i] = qkv_split[i].view({B, T, H, D}).permute({0, 2, 1, 3});
  } else {
    const at::Tensor packed = qkv.contiguous();
    for (int64_t i = 0; i < 3; ++i)
      parts[i] = packed.as_strided({B, H, T, D}, {T * 3 * C, D, 3 * C, 1}, packed.storage_offset() + i * C);
  }
  const at::Tensor q = parts[0];
  at::Tensor k = parts[1], v = parts[2];
  const double root = std::sqrt(static_cast<double>(D));
  const bool fusable = !qk_matmul->quantized() && !av_matmul->quantized() && !attn_dropout->is_training();
  auto output = [&](const at::Tensor& ctx) {
    return dropped(resid_dropout, c_proj->forward(ctx.permute({0, 2, 1, 3}).reshape({B, T, H * D})));
  };
  // A quantized cache at decode sizes: attention reads its codes (nothing dequantized up front).
  if (cache != nullptr && fusable) {
    const at::Tensor ctx = fused_decode_attention_on_codes(q, *cache, static_cast<size_t>(layer), k, v, T, 0, 1.0 / root);
    if (ctx.defined()) return output(ctx);
  }
  int64_t past = 0;
  if (cache != nullptr) {
    std::tie(k, v) = cache->append(static_cast<size_t>(layer), k, v);
    past = k.size(2) - T;
  } else {
    cacheless_kv(k, v, config.kv_cache, layer, "models/gpt2");
  }
  // Float products: the whole attention in one kernel (activation.h), decode- or prefill-size, the
  // scores times 1/√D as the fused softmax below takes them; decode sizes write the context as
  // [B, T, C], c_proj's input (no permute or copy).
  if (fusable) {
    const at::Tensor tokens = fused_decode_attention_tokens(q, k, v, T, 0, 1.0 / root);
    if (tokens.defined()) return dropped(resid_dropout, c_proj->forward(tokens));
    const at::Tensor ctx = fused_prefill_attention(q, k, v, T, 0, 1.0 / root);
    if (ctx.defined()) return output(ctx);
  }
  const at::Tensor scores = qk_matmul->forward(q, k.transpose(-1, -2));
  // Decode-size calls: one fused kernel (scores · 1/√D: bit for bit HF's scores / √D where √D is a
  // power of 2, D = 64 in GPT-2's sizes). Else HF's ops: future positions masked with
  // finfo(dtype).min (not -inf, so fully masked rows stay finite); query i sits at position
  // past + i and sees keys 0 .. past + i.
  at::Tensor p = fused_causal_softmax(scores, past, 0, 1.0 / root);
  if (!p.defined()) {
    const at::Tensor w = scores / root;
    const at::Tensor causal = at::ones({T, past + T}, x.options().dtype(at::kBool)).tril(past);
    p = at::softmax(at::where(causal, w, masked_score(w)), -1);
  }
  p = attn_dropout->forward(p);
  return output(av_matmul->forward(p, v));
}

Gpt2MlpImpl::Gpt2MlpImpl(const Gpt2Config& c) : config(c) { reset(); }

void Gpt2MlpImpl::reset() {
  c_fc = register_module("c_fc", nn::Linear(config.n_embd, config.inner()));
  c_proj = register_module("c_proj", nn::Linear(config.inner(), config.n_embd));
  dropout = register_module("dropout", torch::nn::Dropout(config.resid_pdrop));
}

at::Tensor Gpt2MlpImpl::forward(const at::Tensor& x) {
  return dropped(dropout, c_proj->forward(apply_activation(config.activation_function, c_fc->forward(x))));
}

Gpt2BlockImpl::Gpt2BlockImpl(const Gpt2Config& c) : config(c) { reset(); }

void Gpt2BlockImpl::reset() {
  auto ln = [&] { return nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_epsilon)); };
  ln_1 = register_module("ln_1", ln());
  attn = register_module("attn", Gpt2Attention(config));
  ln_2 = register_module("ln_2", ln());
  mlp = register_module("mlp", Gpt2Mlp(config));
}

// The LayerNorms through their fused kernel where it applies (LayerNormImpl::forward_fused), the
// attention's residual add inside ln_2's (h = attention output + x: the same sum as x + output).
at::Tensor Gpt2BlockImpl::forward(const at::Tensor& x, KvCache* cache, int64_t layer) {
  const auto [h, m] = forward_terms(x, ln_1->forward_fused(x), cache, layer);
  return h + m;
}

std::pair<at::Tensor, at::Tensor> Gpt2BlockImpl::forward_terms(const at::Tensor& x, const at::Tensor& normed_x,
                                                               KvCache* cache, int64_t layer) {
  const auto [h, normed] = ln_2->forward_residual(attn->forward(normed_x, cache, layer), x);
  return {h, mlp->forward(normed)};
}

Gpt2ModelImpl::Gpt2ModelImpl(const Gpt2Config& c) : config(c) { reset(); }

void Gpt2ModelImpl::reset() {
  wte = register_module("wte", nn::Embedding(config.vocab_size, config.n_embd));
  wpe = register_module("wpe", nn::Embedding(config.n_positions, config.n_embd));
  drop = register_module("drop", torch::nn::Dropout(config.embd_pdrop));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) h->push_back(Gpt2Block(config));
  ln_f = register_module("ln_f", nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_epsilon)));
}

at::Tensor Gpt2ModelImpl::forward(const at::Tensor& ids, Gpt2KvCache* cache) {
  QF_REQUIRE(ids.dim() == 2, "models/gpt2: input_ids must be [batch, seq], got ", ids.sizes());
  const int64_t T = ids.size(1);
  const int64_t past = cache ? cache->length() : 0;
  QF_REQUIRE(past + T <= config.n_positions, "models/gpt2: sequence length ", past + T,
             past ? " (cached positions included)" : "", " exceeds n_positions ", config.n_positions);
  if (cache) {
    QF_REQUIRE(cache->keys.empty() || static_cast<int64_t>(cache->keys.size()) == config.n_layer,
               "models/gpt2: the cache holds ", cache->keys.size(), " layers, the model has ", config.n_layer);
    cache->set_scheme(config.kv_cache);
    cache->resize(static_cast<size_t>(config.n_layer));
  }
  const at::Tensor pos = at::arange(past, past + T, ids.options().dtype(at::kLong)).unsqueeze(0);
  at::Tensor x = dropped(drop, wte->forward(ids) + wpe->forward(pos));
  // Each block's last residual add happens inside the next LayerNorm's kernel (the next block's
  // ln_1, or ln_f): mlp + h there, bit for bit the block's own h + mlp.
  std::vector<Gpt2BlockImpl*> blocks;
  for (const auto& b : *h) blocks.push_back(b->as<Gpt2BlockImpl>());
  if (blocks.empty()) return ln_f->forward_fused(x);
  at::Tensor normed = blocks.front()->ln_1->forward_fused(x);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto [hs, m] = blocks[i]->forward_terms(x, normed, cache, static_cast<int64_t>(i));
    std::tie(x, normed) = (i + 1 < blocks.size() ? blocks[i + 1]->ln_1 : ln_f)->forward_residual(m, hs);
  }
  return normed;
}

Gpt2LMHeadModelImpl::Gpt2LMHeadModelImpl(const Gpt2Config& c) : config(c) { reset(); }

void Gpt2LMHeadModelImpl::reset() {
  transformer = register_module("transformer", Gpt2Model(config));
  if (!config.tie_word_embeddings)
    lm_head = register_module("lm_head", nn::Linear(torch::nn::LinearOptions(config.n_embd, config.vocab_size).bias(false)));
  init_weights();
}

void Gpt2LMHeadModelImpl::untie_lm_head() {
  QF_REQUIRE(config.tie_word_embeddings && !lm_head, "models/gpt2: the LM head is already untied");
  lm_head = register_module("lm_head", untied_lm_head(*transformer->wte, "models/gpt2"));
  config.tie_word_embeddings = false;
}

void Gpt2LMHeadModelImpl::init_weights() {
  at::NoGradGuard no_grad;
  for (auto& item : named_modules("", /*include_self=*/false)) {
    auto& m = item.value();
    if (auto* lin = m->as<nn::LinearImpl>()) {
      const bool c_proj = item.key().size() >= 6 && item.key().compare(item.key().size() - 6, 6, "c_proj") == 0;
      lin->weight.normal_(0.0, c_proj ? config.initializer_range / std::sqrt(2.0 * config.n_layer)
                                       : config.initializer_range);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* emb = m->as<nn::EmbeddingImpl>()) {
      emb->weight.normal_(0.0, config.initializer_range);
    } else if (auto* ln = m->as<nn::LayerNormImpl>()) {
      ln->weight.fill_(1.0);
      ln->bias.zero_();
    }
  }
}

void Gpt2LMHeadModelImpl::set_kv_cache_scheme(const KvCacheScheme& scheme) {
  check_kv_cache_scheme(scheme, "models/gpt2");
  config.kv_cache = scheme;
  transformer->config.kv_cache = scheme;
  for (const auto& b : *transformer->h) {
    auto* block = b->as<Gpt2BlockImpl>();
    block->config.kv_cache = scheme;
    block->attn->config.kv_cache = scheme;
    block->mlp->config.kv_cache = scheme;
  }
}

int64_t Gpt2LMHeadModelImpl::kv_cache_bytes_per_token(const KvCacheScheme& scheme) const {
  return 2 * config.n_layer * config.n_head * scheme.bytes_per_head(config.n_embd / config.n_head, 4);
}

at::Tensor Gpt2LMHeadModelImpl::forward(const at::Tensor& ids, Gpt2KvCache* cache) {
  return lm_head_logits(transformer->forward(ids, cache), lm_head, *transformer->wte, "models/gpt2", "transformer.wte");
}

void load_hf_gpt2(Gpt2LMHeadModel& model, StateDict state, const std::string& source) {
  StateDict converted;
  for (auto& [k, v] : state) {
    // Checkpoints saved from GPT2Model (no LM head) lack the "transformer." prefix.
    const std::string key = k.rfind("transformer.", 0) == 0 || k.rfind("lm_head.", 0) == 0 ? k : "transformer." + k;
    converted[key] = is_conv1d_weight(key) && v.dim() == 2 ? v.t().contiguous() : v;
  }
  if (model->config.tie_word_embeddings) drop_tied_lm_head(converted, "transformer.wte.weight", "models/gpt2", source);
  LoadStateOptions opts;
  opts.ignore_suffixes = {".attn.bias", ".attn.masked_bias"};
  opts.source = "models/gpt2: " + source;
  load_model_state(*model, converted, opts);
}

StateDict hf_gpt2_state(const Gpt2LMHeadModel& model) {
  StateDict out;
  for (const auto& [k, v] : model_state(*model))
    out[k] = is_conv1d_weight(k) ? v.detach().t().contiguous() : v.detach().contiguous();
  return out;
}

Gpt2LMHeadModel load_gpt2_lm_head_model(const std::string& dir) {
  Gpt2LMHeadModel model(Gpt2Config::from_file(dir + "/config.json"));
  HfWeights weights = read_hf_weights(dir);
  load_hf_gpt2(model, std::move(weights.tensors), weights.source);
  return model;
}

void save_hf_gpt2(const Gpt2LMHeadModel& model, const std::string& dir) {
  write_hf_folder(dir, model->config.to_json(), hf_gpt2_state(model));
}

}  // namespace qforge::models
