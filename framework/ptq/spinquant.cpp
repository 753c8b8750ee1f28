// Learned rotations (SpinQuant, spinquant.h): checks first, then Cayley steps on U1 / U2 with the
// model's weights swapped for their folded, differentiable values, then the fold in double.
#include "framework/ptq/spinquant.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cstdio>
#include <cmath>
#include <memory>
#include <string>

#include "framework/api/kv_cache_scheme.h"
#include "framework/api/progress.h"
#include "framework/core/error.h"
#include "framework/models/llama.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "framework/nn/quantizable.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/ptq.h"

namespace qforge::ptq {
namespace {

constexpr const char* kSpinQuant = "framework/ptq/spinquant";

// How one tensor of the model follows U1 and U2 (spinquant.h's table).
enum class Fold : uint8_t {
  kReader,      // W·U1 (a Linear reading the stream, the embedding's rows)
  kWriter,      // U1ᵀ·W (a Linear writing the stream)
  kWriterBias,  // b·U1
  kValueRows,   // v_proj: (W·U1) with the rows of each key/value head h turned to U2ᵀ·(W·U1)_h
  kValueBias,   // v_proj's bias: b_h·U2 per key/value head
  kOutColumns,  // o_proj: U1ᵀ·W with the columns of each head h turned to (U1ᵀ·W)_h·U2
};

struct Term {
  std::string path;
  at::Tensor* slot = nullptr;  // the module's tensor member (swapped while learning, assigned at the end)
  at::Tensor base;             // its value on entry
  Fold fold = Fold::kReader;
  int64_t layer = 0, heads = 0;
};

at::Tensor folded(const Term& t, const at::Tensor& base, const at::Tensor& U1, const std::vector<at::Tensor>& U2) {
  const bool values = !U2.empty();
  switch (t.fold) {
    case Fold::kReader:
    case Fold::kWriterBias:
      return at::matmul(base, U1);
    case Fold::kWriter:
      return at::matmul(U1.t(), base);
    case Fold::kValueRows: {
      const at::Tensor m = at::matmul(base, U1);
      if (!values) return m;
      const at::Tensor& u = U2[static_cast<size_t>(t.layer)];
      return at::matmul(u.t(), m.view({t.heads, u.size(0), m.size(1)})).reshape(base.sizes());
    }
    case Fold::kValueBias: {
      if (!values) return base;
      const at::Tensor& u = U2[static_cast<size_t>(t.layer)];
      return at::matmul(base.view({t.heads, u.size(0)}), u).reshape(base.sizes());
    }
    case Fold::kOutColumns: {
      const at::Tensor m = at::matmul(U1.t(), base);
      if (!values) return m;
      const at::Tensor& u = U2[static_cast<size_t>(t.layer)];
      return at::matmul(m.view({m.size(0), t.heads, u.size(0)}), u).reshape(base.sizes());
    }
  }
  return base;
}

void add(std::vector<Term>& terms, const std::string& path, at::Tensor& slot, Fold fold, int64_t layer = 0,
         int64_t heads = 0) {
  if (!slot.defined()) return;
  terms.push_back(Term{path, &slot, slot.detach().to(at::kFloat).clone(), fold, layer, heads});
}

bool all_ones(const at::Tensor& w) { return at::equal(w.detach(), at::ones_like(w)); }

// Every reason the model cannot learn its rotations, before anything changes.
models::LlamaForCausalLMImpl& check_learnable(torch::nn::Module& model, int64_t batches, const SpinQuantOptions& o) {
  auto* llama = model.as<models::LlamaForCausalLMImpl>();
  QF_REQUIRE(llama != nullptr, kSpinQuant, ": learned rotations need a Llama-family model (LlamaForCausalLM); got ",
             model.name());
  QF_REQUIRE(o.steps >= 1, kSpinQuant, ": steps must be at least 1, got ", o.steps);
  QF_REQUIRE(batches >= 1, kSpinQuant, ": batches must be at least 1, got ", batches);
  QF_REQUIRE(o.lr > 0 && std::isfinite(o.lr), kSpinQuant, ": lr must be positive and finite, got ", o.lr);
  const models::LlamaConfig& c = llama->config;
  QF_REQUIRE(!c.tie_word_embeddings && llama->lm_head, kSpinQuant,
             ": the head is tied to the embedding; rotate() the model first (it unties them)");
  for (const auto& item : model.named_modules()) {
    if (const auto* norm = item.value()->as<nn::RMSNormImpl>()) {
      QF_REQUIRE(all_ones(norm->weight), kSpinQuant, ": RMSNorm '", item.key(), "' has weights other than ones; learned ",
                 "rotations start from a rotated model whose norms are folded into their Linears (rotate() first)");
    }
  }
  for (const auto& [path, layer] : quantizable_layers(model)) {
    QF_REQUIRE(!layer->frozen(), kSpinQuant, ": layer '", path, "' is frozen; learn the rotations before freeze()");
    const auto* linear = dynamic_cast<const nn::LinearImpl*>(layer);
    QF_REQUIRE(linear == nullptr || !linear->pre_quant_scale().defined(), kSpinQuant, ": layer '", path,
               "' has a pre_quant_scale (SmoothQuant / AWQ), which a rotation of its input would not commute with; ",
               "learn the rotations first");
    const Quantizer w = layer->weight_quantizer();
    for (const Quantizer& q : layer->quantizers()) {
      const bool weight = w && q.get() == w.get();
      QF_REQUIRE(!weight || !q->calibrated(), kSpinQuant, ": layer '", path, "' has a fixed weight grid (solved or loaded), ",
                 "which a rotation would leave stale; learn the rotations before the solvers");
      QF_REQUIRE(!weight || !o.quantized_weights || !q->config().spec.qtype.is_codebook(), kSpinQuant, ": layer '",
                 path, "' has codebook weights (", q->config().spec.qtype.name, "), whose levels are fitted once, on ",
                 "the first quantized forward, so learning would run against levels of the unlearned weights; learn ",
                 "with float weights (quantized_weights off)");
      QF_REQUIRE(weight || !(q->mode() == ActivationMode::kStatic && q->calibrated()), kSpinQuant, ": layer '", path,
                 "' has calibrated static activations, which a rotation would leave stale; learn the rotations ",
                 "before calibration");
    }
  }
  for (const auto& [path, m] : kv_cache_models(model)) {
    QF_REQUIRE(!m->kv_cache_scheme().is_static(), kSpinQuant, ": '", path.empty() ? std::string("model") : path,
               "' has a static KV cache (", m->kv_cache_scheme().to_string(), "); set it after learning the rotations, ",
               "whose keys and values it is calibrated on");
  }
  for (const auto& p : model.named_parameters()) {
    QF_REQUIRE(p.value().device().is_cpu() && p.value().scalar_type() == at::kFloat, kSpinQuant, ": parameter '", p.key(),
               "' is ", p.value().scalar_type(), " on ", p.value().device(), "; learning runs on float32 CPU models");
  }
  return *llama;
}

std::vector<Term> terms_of(models::LlamaForCausalLMImpl& m) {
  const models::LlamaConfig& c = m.config;
  std::vector<Term> terms;
  add(terms, "model.embed_tokens.weight", m.model->embed_tokens->weight, Fold::kReader);
  int64_t l = 0;
  for (const auto& item : *m.model->layers) {
    auto& layer = *item->as<models::LlamaDecoderLayerImpl>();
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto& a = *layer.self_attn;
    auto& mlp = *layer.mlp;
    add(terms, p + "self_attn.q_proj.weight", a.q_proj->weight, Fold::kReader);
    add(terms, p + "self_attn.k_proj.weight", a.k_proj->weight, Fold::kReader);
    add(terms, p + "self_attn.v_proj.weight", a.v_proj->weight, Fold::kValueRows, l, c.kv_heads());
    add(terms, p + "self_attn.v_proj.bias", a.v_proj->bias, Fold::kValueBias, l, c.kv_heads());
    add(terms, p + "self_attn.o_proj.weight", a.o_proj->weight, Fold::kOutColumns, l, c.num_attention_heads);
    add(terms, p + "self_attn.o_proj.bias", a.o_proj->bias, Fold::kWriterBias);
    add(terms, p + "mlp.gate_proj.weight", mlp.gate_proj->weight, Fold::kReader);
    add(terms, p + "mlp.up_proj.weight", mlp.up_proj->weight, Fold::kReader);
    add(terms, p + "mlp.down_proj.weight", mlp.down_proj->weight, Fold::kWriter);
    add(terms, p + "mlp.down_proj.bias", mlp.down_proj->bias, Fold::kWriterBias);
    ++l;
  }
  add(terms, "lm_head.weight", m.lm_head->weight, Fold::kReader);
  return terms;
}

// What passes through while learning: every static activation quantizer (calibrated afterwards)
// and, for W16, every weight quantizer.
std::vector<Quantizer> bypassed(const torch::nn::Module& model, bool quantized_weights) {
  std::vector<Quantizer> out;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    const Quantizer w = layer->weight_quantizer();
    for (const Quantizer& q : layer->quantizers()) {
      const bool weight = w && q.get() == w.get();
      if ((weight && !quantized_weights) || (!weight && q->mode() == ActivationMode::kStatic)) out.push_back(q);
    }
  }
  return out;
}

// The weight quantizers' eval-mode caches stay paused while learning (each step's weights are new tensors).
class PausedWeightCaches {
 public:
  explicit PausedWeightCaches(const torch::nn::Module& model) {
    for (const auto& [path, layer] : quantizable_layers(model))
      if (Quantizer w = layer->weight_quantizer()) w->pause_weight_cache(), paused_.push_back(w);
  }
  ~PausedWeightCaches() {
    for (Quantizer& w : paused_) w->resume_weight_cache();
  }
  PausedWeightCaches(const PausedWeightCaches&) = delete;
  PausedWeightCaches& operator=(const PausedWeightCaches&) = delete;

 private:
  std::vector<Quantizer> paused_;
};

// The float function: every quantizer passed through and the KV caches float, restored on exit.
class FloatFunction {
 public:
  explicit FloatFunction(torch::nn::Module& model) : view_(model) {
    for (const auto& [path, m] : kv_cache_models(model)) {
      saved_.emplace_back(m, m->kv_cache_scheme());
      m->set_kv_cache_scheme(KvCacheScheme{});
    }
  }
  ~FloatFunction() {
    for (auto& [m, scheme] : saved_) m->set_kv_cache_scheme(scheme);
  }
  FloatFunction(const FloatFunction&) = delete;
  FloatFunction& operator=(const FloatFunction&) = delete;

 private:
  FloatView view_;
  std::vector<std::pair<KvCacheModel*, KvCacheScheme>> saved_;
};

double orthogonality_error(const at::Tensor& U) {
  return (at::matmul(U.t(), U) - at::eye(U.size(0), U.options())).abs().max().item<double>();
}

double mean_loss(int64_t batches, const LossBatch& loss) {
  at::NoGradGuard no_grad;
  double sum = 0;
  for (int64_t b = 0; b < batches; ++b) sum += loss(b).item<double>();
  return sum / static_cast<double>(batches);
}

}  // namespace

SpinQuantReport learn_rotations_distilled(torch::nn::Module& model, int64_t batches, const OutputBatch& output,
                                          const SpinQuantOptions& o) {
  const LossBatch kl = [&model, &output](int64_t b) {
    at::Tensor reference;
    {
      const FloatFunction float_function(model);
      at::NoGradGuard no_grad;
      reference = at::log_softmax(output(b).to(at::kFloat), -1);
    }
    const at::Tensor logp = at::log_softmax(output(b).to(at::kFloat), -1);
    return (reference.exp() * (reference - logp)).sum(-1).mean();
  };
  // The float function's own check: the outputs on batch 0 before and after (the KL of the float
  // model from itself, the float loss fields, is 0 either way).
  auto float_output = [&] {
    const FloatFunction float_function(model);
    at::NoGradGuard no_grad;
    return output(0).detach().to(at::kFloat).clone();
  };
  const at::Tensor y0 = float_output();
  SpinQuantReport r = learn_rotations(model, batches, kl, o);
  r.float_output_change = relative_change(float_output(), y0);
  return r;
}

at::Tensor cayley_step(const at::Tensor& U, const at::Tensor& G, double lr, double* step) {
  QF_REQUIRE(U.dim() == 2 && U.size(0) == U.size(1) && G.sizes() == U.sizes(), kSpinQuant,
             ": cayley_step needs a square U and a gradient of its shape, got ", U.sizes(), " and ", G.sizes());
  const at::Tensor u = U.to(at::kDouble), g = G.to(at::kDouble);
  const at::Tensor ug = at::matmul(u.t(), g);
  const at::Tensor W = 0.5 * (ug - ug.t());
  const double norm1 = W.abs().sum(0).max().item<double>();  // the largest column sum
  const double alpha = std::min(lr, 1.0 / (norm1 + 1e-8));
  if (step != nullptr) *step = alpha;
  const at::Tensor I = at::eye(u.size(0), u.options());
  // U·(I − α/2·W)·(I + α/2·W)⁻¹ = ((I + α/2·W)⁻ᵀ·(I − α/2·W)ᵀ·Uᵀ)ᵀ = ((I − α/2·W)⁻¹·(I + α/2·W)·Uᵀ)ᵀ
  const at::Tensor rhs = at::matmul(I + 0.5 * alpha * W, u.t());
  return at::linalg_solve(I - 0.5 * alpha * W, rhs).t().contiguous();
}

SpinQuantReport learn_rotations(torch::nn::Module& model, int64_t batches, const LossBatch& loss,
                                const SpinQuantOptions& o) {
  models::LlamaForCausalLMImpl& m = check_learnable(model, batches, o);
  const auto t0 = std::chrono::steady_clock::now();
  const models::LlamaConfig& c = m.config;
  const int64_t hidden = c.hidden_size, D = c.head_size(), L = c.num_hidden_layers;
  SpinQuantReport r;
  r.steps = o.steps, r.batches = batches, r.hidden_size = hidden, r.head_dim = D, r.layers = L;
  r.values = o.values, r.quantized_weights = o.quantized_weights;

  std::vector<Term> terms = terms_of(m);
  {
    const FloatFunction float_function(model);
    at::NoGradGuard no_grad;
    r.float_loss_before = loss(0).item<double>();
  }
  at::Tensor U1 = at::eye(hidden, at::kDouble);
  std::vector<at::Tensor> U2;
  if (o.values) U2.assign(static_cast<size_t>(L), at::Tensor());
  for (auto& u : U2) u = at::eye(D, at::kDouble);

  // The fold in double into every term's tensor; restore() puts the entry values back.
  auto assign = [&](const at::Tensor& u1, const std::vector<at::Tensor>& u2) {
    at::NoGradGuard no_grad;
    for (const Term& t : terms) t.slot->detach().copy_(folded(t, t.base.to(at::kDouble), u1, u2).to(at::kFloat));
  };
  auto restore = [&] {
    at::NoGradGuard no_grad;
    for (const Term& t : terms) t.slot->detach().copy_(t.base);
  };
  auto loss_text = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "loss %.4f", v);
    return std::string(buf);
  };

  try {
    const FloatView bypass(bypassed(model, o.quantized_weights));
    const PausedWeightCaches paused(model);
    r.loss_before = mean_loss(batches, loss);
    QF_REQUIRE(std::isfinite(r.loss_before), kSpinQuant, ": the quantized model's loss is not finite (", r.loss_before,
               ") before learning");
    std::unique_ptr<Progress> progress = o.progress ? std::make_unique<Progress>("spinquant", o.steps) : nullptr;
    const double pi = std::acos(-1.0);
    for (int64_t step = 0; step < o.steps; ++step) {
      at::AutoGradMode grad_on(true);
      std::vector<at::Tensor> leaves{U1.to(at::kFloat).requires_grad_(true)};
      for (const at::Tensor& u : U2) leaves.push_back(u.to(at::kFloat).requires_grad_(true));
      const std::vector<at::Tensor> u2(leaves.begin() + 1, leaves.end());
      at::Tensor l;
      {
        std::vector<std::unique_ptr<ScopedTensorSwap>> swaps;
        for (const Term& t : terms) swaps.push_back(std::make_unique<ScopedTensorSwap>(*t.slot, folded(t, t.base, leaves[0], u2)));
        l = loss(step % batches);
      }
      const double lv = l.item<double>();
      QF_REQUIRE(std::isfinite(lv), kSpinQuant, ": the loss is not finite (", lv, ") at step ", step);
      r.losses.push_back(lv);
      const std::vector<at::Tensor> grads = torch::autograd::grad({l}, leaves, {}, false, false, /*allow_unused=*/true);
      const double lr_t = o.lr * 0.5 * (1.0 + std::cos(pi * static_cast<double>(step) / static_cast<double>(o.steps)));
      at::NoGradGuard no_grad;
      double alpha = 0;
      if (grads[0].defined()) {
        U1 = cayley_step(U1, grads[0], lr_t, &alpha);
        r.bounded_steps += alpha < lr_t;
      }
      r.r1_steps.push_back(alpha);
      for (size_t i = 0; i < U2.size(); ++i)
        if (grads[i + 1].defined()) U2[i] = cayley_step(U2[i], grads[i + 1], lr_t);
      if (progress) progress->update(1, loss_text(lv));
    }
    if (progress) progress->finish(loss_text(r.losses.back()));
    assign(U1, U2);
    r.loss_after = mean_loss(batches, loss);
    QF_REQUIRE(std::isfinite(r.loss_after), kSpinQuant, ": the loss is not finite (", r.loss_after,
               ") with the learned rotations folded in");
  } catch (...) {
    restore();
    throw;
  }
  try {
    const FloatFunction float_function(model);
    at::NoGradGuard no_grad;
    r.float_loss_after = loss(0).item<double>();
  } catch (...) {
    restore();
    throw;
  }
  r.orthogonality_error = orthogonality_error(U1);
  for (const at::Tensor& u : U2) r.orthogonality_error = std::max(r.orthogonality_error, orthogonality_error(u));
  r.rotation_change = (U1 - at::eye(hidden, at::kDouble)).norm().item<double>() / std::sqrt(static_cast<double>(hidden));
  for (const at::Tensor& u : U2)
    r.value_rotation_change = std::max(r.value_rotation_change, (u - at::eye(D, at::kDouble)).norm().item<double>() /
                                                                    std::sqrt(static_cast<double>(D)));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace qforge::ptq
