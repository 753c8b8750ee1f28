// Costs of the mixed-precision search: recorded input shapes, exact bytes and measured latency of
// frozen float copies.
#include "framework/search/costs.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "framework/api/quantize.h"

namespace qforge::search {

at::Tensor CalibrationInputs::of(const QuantizableLayer* layer) const {
  const auto it = inputs.find(layer);
  return it == inputs.end() ? at::Tensor() : it->second;
}

CalibrationInputs record_inputs(torch::nn::Module& model, const std::function<at::Tensor(int64_t)>& loss_of_batch) {
  CalibrationInputs out;
  at::NoGradGuard no_grad;
  for (const auto& [path, layer] : quantizable_layers(model)) layer->record_inputs(true);
  try {
    out.loss0 = loss_of_batch(0).item<double>();
  } catch (...) {
    for (const auto& [path, layer] : quantizable_layers(model)) layer->record_inputs(false);
    throw;
  }
  for (const auto& [path, layer] : quantizable_layers(model)) {
    layer->record_inputs(false);
    const auto& rec = layer->recorded_input();
    if (rec.shape.empty() || !layer->module().named_parameters(false).contains("weight")) continue;
    out.inputs[layer] = synthetic_input(rec, float_weight_of(*layer).size(0));
  }
  return out;
}

Priced Pricer::price(const QuantizableLayer& layer, const std::string& path, const std::optional<LayerScheme>& ls,
                     const std::string& candidate, const at::Tensor& input) {
  std::shared_ptr<QuantizableLayer> copy = ls ? frozen_copy(layer, path, *ls) : layer.float_copy();
  QF_CHECK(copy != nullptr);
  const std::vector<int64_t> weight_shape = float_weight_of(layer).sizes().vec();
  Priced p;
  p.bytes = copy->storage_bytes();
  p.kernel = copy->report().kernel;
  // Not reached by the model's forward, or timed by another process (rank 0).
  if (!input.defined() || !options_.time_kernels) return p;
  const QuantizableLayer::InputRecord rec{input.sizes().vec(), input.scalar_type()};
  const std::string key = latency_key(*copy, weight_shape, rec, candidate);
  if (const auto hit = cache_.find(key)) {
    p.latency_ms = *hit;
    return p;
  }
  p.latency_ms = time_forward_ms(*copy, input, options_);
  cache_.put(key, p.latency_ms);
  ++*measured_;
  return p;
}

FixedCosts price_fixed(const std::vector<std::pair<std::string, QuantizableLayer*>>& fixed, const Scheme& base,
                       const CalibrationInputs& inputs, Pricer& pricer, const std::function<void()>& priced_one) {
  FixedCosts out;
  for (const auto& [path, layer] : fixed) {
    int rule = -1;
    std::string note;
    const std::optional<LayerScheme> ls = base.resolve(path, *layer, &rule, &note);
    if (ls) {
      const int64_t float_bytes = layer->storage_bytes();
      const ScopedAttach attached(*layer, path, *ls);
      out.quantizer_bytes += layer->storage_bytes() - float_bytes;
    }
    const at::Tensor x = inputs.of(layer);
    if (x.defined() && timeable(*layer)) {
      const Priced priced = pricer.price(*layer, path, ls, ls ? "fixed" : "float", x);
      out.latency_ms += priced.latency_ms;
      out.float_latency_ms += ls ? pricer.price(*layer, path, std::nullopt, "float", x).latency_ms : priced.latency_ms;
    }
    if (priced_one) priced_one();
  }
  return out;
}

}  // namespace qforge::search
