// Offline Hadamard rotation of Llama-family models (rotate.h): checks first, then the folds in double.
#include "framework/ptq/rotate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>

#include "framework/api/kv_cache_scheme.h"
#include "framework/core/error.h"
#include "framework/nn/layer_norm.h"
#include "framework/ptq/layer_access.h"
#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/hadamard_tensor.h"

namespace qforge::ptq {
namespace {

constexpr const char* kWho = "framework/ptq/rotate";

void require_hadamard_size(int64_t n, const char* field) {
  try {
    kernels::hadamard_size(n);
  } catch (const Error& e) {
    throw Error(qforge::detail::str_cat(kWho, ": ", field, " ", n, " cannot be rotated: ", e.what()));
  }
}

// Every reason the model cannot be rotated, checked before anything changes.
void check_rotatable(const models::LlamaForCausalLMImpl& model, const RotateOptions& o) {
  const models::LlamaConfig& c = model.config;
  QF_REQUIRE(!c.down_proj_hadamard && !c.qk_hadamard, kWho, ": the model is already rotated (its config has ",
             c.down_proj_hadamard ? "qforge_down_proj_hadamard" : "qforge_qk_hadamard", ")");
  check_rotation_sizes(c, o);
  require_no_calibrated_kv_scales(model, kWho);  // the online query / key and value turns change what is cached
  for (const auto& [path, layer] : quantizable_layers(model)) {
    QF_REQUIRE(!layer->quantized() && !layer->frozen(), kWho, ": layer '", path, "' is ",
               layer->frozen() ? "frozen" : "quantized", "; rotate the float model, before quantize()");
  }
  for (const auto& p : model.named_parameters()) {
    QF_REQUIRE(p.value().device().is_cpu() && at::isFloatingType(p.value().scalar_type()), kWho, ": parameter '",
               p.key(), "' is ", p.value().scalar_type(), " on ", p.value().device(), "; rotation runs on float CPU models");
  }
}

at::Tensor as_double(const at::Tensor& t) { return t.detach().to(at::kDouble); }
void assign(at::Tensor& param, const at::Tensor& v) { param.detach().copy_(v.to(param.scalar_type())); }

// A Linear reading the (normalised) stream: W <- (W·diag(w))·Q.
void rotate_input(nn::LinearImpl& l, const at::Tensor& w, const at::Tensor& Q) {
  assign(l.weight, at::matmul(as_double(l.weight) * w.unsqueeze(0), Q));
}

// A Linear writing the stream: W <- Qᵀ·W, b <- Qᵀ·b.
void rotate_output(nn::LinearImpl& l, const at::Tensor& Q) {
  assign(l.weight, at::matmul(Q.t(), as_double(l.weight)));
  if (l.bias.defined()) assign(l.bias, at::matmul(as_double(l.bias), Q));
}

// Folds the norm's weight into `readers` (each rotated on its input) and sets it to ones.
void fold_norm(nn::RMSNormImpl& norm, const std::vector<nn::LinearImpl*>& readers, const at::Tensor& Q) {
  const at::Tensor w = as_double(norm.weight);
  for (nn::LinearImpl* l : readers) rotate_input(*l, w, Q);
  norm.weight.detach().fill_(1.0);
}

// The values of each head turn by H_D (R(a) = a·H_Dᵀ, hadamard_rotate): v_proj's rows of head h
// become H_D·W_h = R(W_hᵀ)ᵀ and its bias R(b_h), so v_h becomes R(v_h); o_proj's columns of head h
// become R(W_h), which undoes it (R(v)·R(W)ᵀ = v·H_DᵀH_D·Wᵀ = v·Wᵀ, H_D orthogonal).
void rotate_values(models::LlamaAttentionImpl& attn) {
  const int64_t D = attn.config.head_size(), KV = attn.config.kv_heads(), H = attn.config.num_attention_heads;
  nn::LinearImpl& v = *attn.v_proj;
  nn::LinearImpl& o = *attn.o_proj;
  const int64_t hidden = v.weight.size(1), out = o.weight.size(0);
  const at::Tensor wv = v.weight.detach().to(at::kFloat).view({KV, D, hidden}).transpose(1, 2);
  assign(v.weight, kernels::hadamard_rotate(wv).transpose(1, 2).reshape({KV * D, hidden}));
  if (v.bias.defined()) assign(v.bias, kernels::hadamard_rotate(v.bias.detach().to(at::kFloat).view({KV, D})).reshape(-1));
  assign(o.weight, kernels::hadamard_rotate(o.weight.detach().to(at::kFloat).view({out, H, D})).reshape({out, H * D}));
}

void rotate_layer(models::LlamaDecoderLayerImpl& layer, const at::Tensor& Q, const RotateOptions& o) {
  models::LlamaAttentionImpl& attn = *layer.self_attn;
  models::LlamaMlpImpl& mlp = *layer.mlp;
  const bool online = o.online_down_proj;
  fold_norm(*layer.input_layernorm, {attn.q_proj.get(), attn.k_proj.get(), attn.v_proj.get()}, Q);
  if (o.online_qk) rotate_values(attn);
  rotate_output(*attn.o_proj, Q);
  fold_norm(*layer.post_attention_layernorm, {mlp.gate_proj.get(), mlp.up_proj.get()}, Q);
  // W·H_Iᵀ: each row of down_proj's weight through the transform (its input turns by H_I online).
  if (online) assign(mlp.down_proj->weight, kernels::hadamard_rotate(mlp.down_proj->weight.detach().to(at::kFloat)));
  rotate_output(*mlp.down_proj, Q);
}

// Power sums of one layer's inputs, in double.
struct Moments {
  int64_t n = 0;
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0, max_abs = 0;
  // One pass over the values in double (a tensor op per power took a minute per rotation of the
  // tiny Llama recipe's calibration batches).
  void add(const at::Tensor& x) {
    const at::Tensor d = x.detach().to(at::kCPU, at::kDouble).contiguous();
    const double* p = d.data_ptr<double>();
    const int64_t count = d.numel();
    double a1 = 0, a2 = 0, a3 = 0, a4 = 0, m = max_abs;
    for (int64_t i = 0; i < count; ++i) {
      const double v = p[i], v2 = v * v;
      a1 += v, a2 += v2, a3 += v2 * v, a4 += v2 * v2;
      m = std::max(m, std::fabs(v));
    }
    n += count, s1 += a1, s2 += a2, s3 += a3, s4 += a4, max_abs = m;
  }
  ActivationStats stats(const std::string& path) const {
    ActivationStats a;
    a.path = path;
    a.count = n;
    if (n == 0) return a;
    const double N = static_cast<double>(n), mu = s1 / N, e2 = s2 / N, e3 = s3 / N, e4 = s4 / N;
    const double var = e2 - mu * mu, m4 = e4 - 4 * mu * e3 + 6 * mu * mu * e2 - 3 * mu * mu * mu * mu;
    a.kurtosis = var > 0 ? m4 / (var * var) : 0.0;
    a.rms = std::sqrt(e2);
    a.max_abs = max_abs;
    a.max_over_rms = a.rms > 0 ? max_abs / a.rms : 0.0;
    return a;
  }
};

}  // namespace

std::vector<ActivationStats> activation_stats(torch::nn::Module& model, int64_t batches, const RunBatch& run) {
  std::vector<std::pair<std::string, QuantizableLayer*>> linears;
  std::vector<QuantizableLayer*> layers;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    if (dynamic_cast<nn::LinearImpl*>(layer) == nullptr) continue;
    linears.emplace_back(path, layer);
    layers.push_back(layer);
  }
  std::map<const QuantizableLayer*, Moments> moments;
  {
    at::NoGradGuard no_grad;
    ScopedInputTaps taps(layers, [&](QuantizableLayer& l, const at::Tensor& x) { moments[&l].add(x); });
    for (int64_t b = 0; b < batches; ++b) run(b);
  }
  std::vector<ActivationStats> out;
  for (const auto& [path, layer] : linears) out.push_back(moments[layer].stats(path));
  return out;
}

RotateReport rotate_measured(torch::nn::Module& model, int64_t batches, const RunBatch& run, const RotateOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<ActivationStats> before = activation_stats(model, batches, run);
  at::Tensor y0;
  {
    at::NoGradGuard no_grad;
    y0 = run(0).detach().clone();
  }
  RotateReport r = rotate(model, o);
  r.before = std::move(before);
  r.after = activation_stats(model, batches, run);
  {
    at::NoGradGuard no_grad;
    r.output_change = relative_change(run(0), y0);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

at::Tensor random_hadamard(int64_t n, uint64_t seed, at::Tensor* signs) {
  // The transform of the identity's rows is Hᵀ; its signs times 1/sqrt(n) in double are exact.
  at::Tensor ht = at::eye(n, at::kFloat);
  kernels::hadamard_transform(ht.data_ptr<float>(), n, n);
  const at::Tensor H = at::sign(ht).t().to(at::kDouble) / std::sqrt(static_cast<double>(n));
  std::mt19937_64 rng(seed);
  at::Tensor s = at::empty({n}, at::kDouble);
  for (int64_t i = 0; i < n; ++i) s[i] = (rng() & 1) ? 1.0 : -1.0;
  if (signs != nullptr) *signs = s.to(at::kFloat);
  return H * s.unsqueeze(0);
}

RotateReport rotate_llama(models::LlamaForCausalLMImpl& model, const RotateOptions& o) {
  check_rotatable(model, o);
  at::NoGradGuard no_grad;
  const models::LlamaConfig& c = model.config;
  RotateReport r;
  r.seed = o.seed;
  r.hidden_size = c.hidden_size;
  r.intermediate_size = c.intermediate_size;
  r.residual_base = kernels::hadamard_size(c.hidden_size).m;
  r.down_proj_base = o.online_down_proj ? kernels::hadamard_size(c.intermediate_size).m : 1;
  r.online_down_proj = o.online_down_proj;
  r.online_qk = o.online_qk;
  r.head_dim = c.head_size();
  r.head_base = o.online_qk ? kernels::hadamard_size(c.head_size()).m : 1;
  if (c.tie_word_embeddings) {
    model.untie_lm_head();
    r.notes.push_back("lm_head untied from model.embed_tokens (the embedding takes E·Q, the head W·diag(w)·Q)");
  }
  const at::Tensor Q = random_hadamard(c.hidden_size, o.seed, &r.signs);
  assign(model.model->embed_tokens->weight, at::matmul(as_double(model.model->embed_tokens->weight), Q));
  for (const auto& l : *model.model->layers) rotate_layer(*l->as<models::LlamaDecoderLayerImpl>(), Q, o);
  fold_norm(*model.model->norm, {model.lm_head.get()}, Q);
  if (o.online_down_proj) model.set_down_proj_hadamard(true);
  if (o.online_qk) model.set_qk_hadamard(true);
  return r;
}

void check_rotation_sizes(const models::LlamaConfig& c, const RotateOptions& o) {
  require_hadamard_size(c.hidden_size, "hidden_size");
  if (o.online_down_proj) require_hadamard_size(c.intermediate_size, "intermediate_size");
  if (o.online_qk) require_hadamard_size(c.head_size(), "head_dim");
}

void prepare_rotated_structure(models::LlamaForCausalLMImpl& model, const RotateOptions& o) {
  if (model.config.tie_word_embeddings) model.untie_lm_head();
  model.set_down_proj_hadamard(o.online_down_proj);
  model.set_qk_hadamard(o.online_qk);
}

RotateReport rotate(torch::nn::Module& model, const RotateOptions& o) {
  if (auto* llama = model.as<models::LlamaForCausalLMImpl>()) return rotate_llama(*llama, o);
  for (const auto& item : model.named_modules()) {
    QF_REQUIRE(!item.value()->as<nn::LayerNormImpl>(), kWho, ": '", item.key(), "' is a LayerNorm; its mean ",
               "subtraction does not commute with a rotation of the residual stream, so only RMSNorm models ",
               "(Llama, Mistral, Qwen2) are rotated");
  }
  throw Error(std::string(kWho) + ": rotation needs a Llama-family model (LlamaForCausalLM); got " + model.name());
}

}  // namespace qforge::ptq
