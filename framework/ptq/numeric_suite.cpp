// The numeric suite (framework/ptq/numeric_suite.h): per-layer quantization error from two passes.
#include "framework/ptq/numeric_suite.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "framework/ptq/float_view.h"
#include "framework/ptq/layer_access.h"

namespace qforge::ptq {

namespace {

// While alive, no observer of the model updates (QAT may leave observing on; the suite's
// quantized pass must not move a calibrated range).
class ObserversOff {
 public:
  explicit ObserversOff(const torch::nn::Module& model) {
    for (const auto& [path, layer] : quantizable_layers(model))
      for (Quantizer q : layer->quantizers()) {
        saved_.emplace_back(q, q->observing());
        q->set_observing(false);
      }
  }
  ~ObserversOff() {
    for (auto& [q, on] : saved_) q->set_observing(on);
  }
  ObserversOff(const ObserversOff&) = delete;
  ObserversOff& operator=(const ObserversOff&) = delete;

 private:
  std::vector<std::pair<Quantizer, bool>> saved_;
};

struct LayerSample {
  LayerAccess access;
  std::vector<at::Tensor> float_rows, quant_rows;  // per batch, the kept rows
  int64_t clipped = 0, seen = 0, nonfinite = 0;
  double lo = 0, hi = 0;
  bool clip_range = false;
};

// Evenly spaced rows of r (all of them when r has at most `keep`).
at::Tensor evenly_kept_rows(const at::Tensor& r, int64_t keep) {
  if (r.size(0) <= keep) return r.detach().clone();
  const at::Tensor idx = at::linspace(0, static_cast<double>(r.size(0) - 1), keep, at::kDouble).round().to(at::kLong);
  return r.detach().index_select(0, idx);
}

at::Tensor own_weight_parameter(QuantizableLayer& layer) {
  for (const auto& p : layer.module().named_parameters(/*recurse=*/false))
    if (p.key() == "weight") return p.value();
  return {};
}

// Eval mode for the passes and the comparisons (a quantizer in training mode could initialise
// LSQ parameters or follow a moving range); the caller's mode comes back on every exit.
class EvalMode {
 public:
  explicit EvalMode(torch::nn::Module& model) : m_(model), was_training_(model.is_training()) { m_.eval(); }
  ~EvalMode() { m_.train(was_training_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  torch::nn::Module& m_;
  bool was_training_;
};

// The suite's entries in module order and the layers whose outputs it measures.
struct SuitePlan {
  std::vector<LayerError> out;
  std::map<QuantizableLayer*, size_t> index;  // layer -> its entry and capture
  std::vector<LayerSample> captures;
  std::vector<QuantizableLayer*> tapped;
};

// A layer's capture, with the range its static input quantizer clips to.
LayerSample new_sample(QuantizableLayer& layer) {
  LayerSample c;
  c.access = access(layer);
  const Quantizer in = layer.input_quantizer();
  if (in && in->mode() == ActivationMode::kStatic) {
    const QParams qp = in->qparams();
    const double s = qp.scale.item<double>(), z = qp.zero_point.item<double>();
    const QType& qt = qp.spec.qtype;
    c.lo = qt.is_float() ? -qt.max_finite * s : (qp.spec.quant_min() - z) * s;
    c.hi = qt.is_float() ? qt.max_finite * s : (qp.spec.quant_max() - z) * s;
    c.clip_range = true;
  }
  return c;
}

// An entry per quantized layer with its weight SQNR; a capture for each layer whose outputs can be measured.
SuitePlan plan_suite(const torch::nn::Module& model, const std::map<std::string, FloatWeights>& start) {
  SuitePlan plan;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    if (!layer->quantized()) continue;
    QF_REQUIRE(!layer->frozen(), "numeric suite: ", path, " is frozen (run it before freeze, on the fake-quant model)");
    LayerError e;
    e.path = path;
    e.type = layer->layer_type();
    if (layer->weight_quantizer()) {
      const at::Tensor w = own_weight_parameter(*layer);
      if (w.defined()) {
        at::NoGradGuard ng;
        const auto it = start.find(path);
        e.weight_sqnr_db = sqnr_db(it != start.end() ? it->second.weight : w, layer->weight_quantizer()->forward(w));
      }
    }
    const std::string why = solvable(path, *layer);
    if (!why.empty() || !layer->weight_quantizer()) {
      e.note = !why.empty() ? why : "weights not quantized";
      e.note += ": output errors not measured";
    } else {
      plan.index[layer] = plan.captures.size();
      plan.captures.push_back(new_sample(*layer));
      plan.tapped.push_back(layer);
    }
    plan.out.push_back(std::move(e));
  }
  return plan;
}

// While alive, the layers a solver replaced hold the float weight and bias it started from, so the
// float pass computes the model the solver was given; the solved values come back on every exit.
class StartingWeights {
 public:
  StartingWeights(const SuitePlan& plan, const std::map<std::string, FloatWeights>& start) {
    at::NoGradGuard ng;
    for (QuantizableLayer* l : plan.tapped) {
      const auto it = start.find(l->path());
      if (it == start.end()) continue;
      const LayerAccess& acc = plan.captures[plan.index.at(l)].access;
      swap_in(acc.weight, it->second.weight);
      if (it->second.bias.defined() && acc.bias.defined()) swap_in(acc.bias, it->second.bias);
    }
  }
  ~StartingWeights() {
    at::NoGradGuard ng;
    for (auto& [param, solved] : saved_) param.detach().copy_(solved);
  }
  StartingWeights(const StartingWeights&) = delete;
  StartingWeights& operator=(const StartingWeights&) = delete;

 private:
  void swap_in(const at::Tensor& param, const at::Tensor& value) {
    QF_REQUIRE(param.sizes() == value.sizes(), "numeric suite: the float weight given for a solved layer has shape ",
               value.sizes(), ", the layer holds ", param.sizes());
    saved_.emplace_back(param, param.detach().clone());
    param.detach().copy_(value);
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;
};

// The float pass then the quantized pass, each keeping per_batch rows of every tapped layer's input.
void capture_passes(torch::nn::Module& model, int64_t batches, const RunBatch& run, int64_t per_batch,
                    SuitePlan& plan, const std::map<std::string, FloatWeights>& start) {
  bool quantized_pass = false;
  const QuantizableLayer::InputTap tap = [&](QuantizableLayer& l, const at::Tensor& x) {
    LayerSample& c = plan.captures[plan.index.at(&l)];
    const at::Tensor kept = evenly_kept_rows(c.access.rows(x.detach()), per_batch);
    if (!quantized_pass) {
      c.float_rows.push_back(kept);
      return;
    }
    c.quant_rows.push_back(kept);
    const at::Tensor xf = x.detach().to(at::kFloat);
    c.nonfinite += xf.numel() - at::isfinite(xf).sum().item<int64_t>();
    if (c.clip_range) {
      c.clipped += at::logical_or(xf < c.lo, xf > c.hi).sum().item<int64_t>();
      c.seen += xf.numel();
    }
  };
  ScopedInputTaps taps(plan.tapped, tap);
  {
    FloatView fv(model);
    StartingWeights float_model(plan, start);
    for (int64_t b = 0; b < batches; ++b) run(b);
  }
  quantized_pass = true;
  ObserversOff no_observing(model);
  for (int64_t b = 0; b < batches; ++b) run(b);
}

// The layer's own and accumulated output errors from the captured float and quantized inputs.
void measure_outputs(QuantizableLayer& layer, LayerSample& c, const FloatWeights* start, LayerError& e) {
  if (c.float_rows.empty() || c.quant_rows.size() != c.float_rows.size()) {
    e.note = "the batches never reached this layer: output errors not measured";
    return;
  }
  const at::Tensor xf = at::cat(c.float_rows), xq = at::cat(c.quant_rows);
  const at::Tensor w = start ? start->weight.reshape({start->weight.size(0), -1}) : c.access.w2d().detach();
  const at::Tensor wq = layer.weight_quantizer()->forward(c.access.weight).detach().reshape({w.size(0), -1});
  const at::Tensor b = c.access.bias.defined() ? c.access.bias.detach() : at::Tensor();
  const at::Tensor b_float = start && start->bias.defined() ? start->bias : b;
  Quantizer in = layer.input_quantizer();
  auto qin = [&](const at::Tensor& x) { return in ? in->forward(x) : x; };
  auto affine = [&](const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    return bias.defined() ? at::addmm(bias, x, weight.t()) : at::mm(x, weight.t());
  };
  const at::Tensor y_f = affine(xf, w, b_float), y_own = affine(qin(xf), wq, b), y_acc = affine(qin(xq), wq, b);
  e.rows = xf.size(0);
  e.own_sqnr_db = sqnr_db(y_f, y_own);
  e.own_relative_mse = relative_mse(y_own, y_f);
  e.accumulated_sqnr_db = sqnr_db(y_f, y_acc);
  e.accumulated_relative_mse = relative_mse(y_acc, y_f);
  if (c.clip_range && c.seen > 0) e.clipped_fraction = static_cast<double>(c.clipped) / static_cast<double>(c.seen);
  e.nonfinite_inputs = c.nonfinite;
}

}  // namespace

double sqnr_db(const at::Tensor& reference, const at::Tensor& y) {
  const at::Tensor r = reference.to(at::kDouble), d = y.to(at::kDouble) - r;
  const double signal = r.pow(2).sum().item<double>(), noise = d.pow(2).sum().item<double>();
  if (noise == 0) return std::numeric_limits<double>::infinity();
  if (signal == 0) return -std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(signal / noise);
}

std::vector<LayerError> layer_errors(torch::nn::Module& model, int64_t batches, const RunBatch& run,
                                     const NumericSuiteOptions& options) {
  QF_REQUIRE(batches >= 1, "numeric suite: batches must be >= 1, got ", batches);
  QF_REQUIRE(options.sample_rows >= 1, "numeric suite: sample_rows must be >= 1, got ", options.sample_rows);
  SuitePlan plan = plan_suite(model, options.float_weights);
  if (plan.captures.empty()) return std::move(plan.out);

  const int64_t per_batch = std::max<int64_t>(1, options.sample_rows / batches);
  const EvalMode eval_mode(model);
  at::NoGradGuard no_grad;
  capture_passes(model, batches, run, per_batch, plan, options.float_weights);

  ObserversOff no_observing(model);
  for (LayerError& e : plan.out) {
    auto it = std::find_if(plan.index.begin(), plan.index.end(),
                           [&](const auto& kv) { return kv.first->path() == e.path; });
    if (it == plan.index.end()) continue;
    const auto start = options.float_weights.find(e.path);
    measure_outputs(*it->first, plan.captures[it->second],
                    start == options.float_weights.end() ? nullptr : &start->second, e);
  }
  return std::move(plan.out);
}

std::vector<LayerError> worst_first(std::vector<LayerError> errors) {
  auto key = [](const LayerError& e) {
    auto v = [](double x) { return std::isnan(x) ? std::numeric_limits<double>::infinity() : x; };
    const bool none = std::isnan(e.accumulated_sqnr_db) && std::isnan(e.own_sqnr_db) && std::isnan(e.weight_sqnr_db);
    return std::make_tuple(none, v(e.accumulated_sqnr_db), v(e.own_sqnr_db), v(e.weight_sqnr_db));
  };
  std::stable_sort(errors.begin(), errors.end(), [&](const LayerError& a, const LayerError& b) { return key(a) < key(b); });
  return errors;
}

}  // namespace qforge::ptq
