// Calibration dumps from and into the quantizers of a model.
#include "framework/io/calibration_io.h"
#include "framework/io/quantizer_attrs.h"

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "framework/core/error.h"
#include "framework/nn/quantizable.h"

namespace qforge::io {

namespace {

using detail::str_cat;

std::string dump_name(const std::string& path) { return path.empty() ? kRootModuleName : path; }
std::string model_path(const std::string& name) { return name == kRootModuleName ? "" : name; }

std::map<std::string, QuantizableLayer*> layers_of(const torch::nn::Module& model) {
  std::map<std::string, QuantizableLayer*> out;
  for (const auto& [path, layer] : quantizable_layers(model)) out.emplace(path, layer);
  return out;
}

// The min/max observer that matches a weight spec's granularity.
CalibrationEntry weight_entry(const at::Tensor& w, const Quantizer& q) {
  const QSpec& spec = q->config().spec;
  ObserverOptions o;
  std::string kind = "minmax";
  if (spec.granularity == Granularity::kPerChannel) {
    kind = "per_channel_minmax";
    o.ch_axis = spec.axis;
  } else if (spec.granularity == Granularity::kPerGroup) {
    kind = "per_channel_minmax";
    o.group_size = spec.group_size;
  }
  std::unique_ptr<Observer> obs = make_observer(kind, o);
  obs->update(w.detach().to(at::kFloat));
  CalibrationEntry e;
  e.observer_kind = obs->kind();
  e.options = o;
  e.spec = spec;
  for (const auto& [name, t] : obs->state()) e.state[name] = t.detach().cpu().clone();
  // The qparams the weight is fake-quantized with (min/max, or learned under LSQ).
  e.qparams = q->qparams(w);
  return e;
}

}  // namespace

CalibrationDump calibration_dump(const torch::nn::Module& model) {
  at::NoGradGuard no_grad;
  CalibrationDump dump;
  for (const auto& [path, layer] : layers_of(model)) {
    if (!layer->quantized()) continue;
    for (const Quantizer& q : layer->quantizers()) {
      const std::string point = quantization_point(path, q);
      const std::string who = "framework/io: save_calibration: '" + q->path() + "'";
      if (q->role() == QuantizerImpl::Role::kWeight) {
        // MXFP4 / NVFP4 block scales are a function of the weight itself: nothing to calibrate or merge.
        if (q->config().spec.qtype.is_microscaling()) continue;
        at::Tensor w;
        if (layer->frozen()) {
          const QuantizedTensor fw = layer->frozen_weight();
          if (fw.defined()) w = fw.dequantize();
        } else {
          const auto params = layer->module().named_parameters(false);
          if (params.contains("weight")) w = params["weight"];
        }
        if (!w.defined()) continue;
        try {
          dump[dump_name(path)][point] = weight_entry(w, q);
        } catch (const Error& err) {
          throw Error(who + ": " + err.what());
        }
        continue;
      }
      const Observer* obs = q->observer();
      if (!obs || q->mode() != ActivationMode::kStatic) continue;  // dynamic / LSQ: nothing observed
      CalibrationEntry e = make_calibration_entry(*obs, q->config().observer_options, q->config().spec);
      if (q->calibrated()) e.qparams = q->qparams();  // the qparams in force (maybe set directly)
      dump[dump_name(path)][point] = std::move(e);
    }
  }
  return dump;
}

void save_calibration(const torch::nn::Module& model, const std::string& path, const SearchSensitivities* search,
                      const LayerErrorTable* errors, const Imatrix* imatrix) {
  save_calibration_dump(path, calibration_dump(model), search, errors, imatrix);
}

void apply_calibration(torch::nn::Module& model, const CalibrationDump& dump, const std::string& source) {
  const auto layers = layers_of(model);
  std::vector<std::function<void()>> changes;
  for (const auto& [module, points] : dump) {
    const std::string path = model_path(module);
    const std::string where = "framework/io: " + source + ": module '" + module + "'";
    auto lit = layers.find(path);
    QF_REQUIRE(lit != layers.end(), where, ": the model has no qforge layer at that path");
    QuantizableLayer& layer = *lit->second;
    QF_REQUIRE(layer.quantized(), where, ": the model's ", layer.layer_type(),
               " is not quantized (quantize() it with the scheme the dump was made for first)");
    QF_REQUIRE(!layer.frozen(), where, ": the model's layer is frozen; calibration cannot change it");
    std::map<std::string, Quantizer> quantizers;
    for (const Quantizer& q : layer.quantizers()) quantizers.emplace(quantization_point(path, q), q);
    for (const auto& [point, e] : points) {
      const std::string pw = where + ", point '" + point + "'";
      auto qit = quantizers.find(point);
      QF_REQUIRE(qit != quantizers.end(), pw, ": the model's layer has no such quantizer");
      Quantizer q = qit->second;
      QF_REQUIRE(same_spec(e.spec, q->config().spec), pw, ": dump is for ", e.spec.to_string(),
                 ", the model quantizes it as ", q->config().spec.to_string());
      if (q->role() == QuantizerImpl::Role::kWeight) continue;  // weight qparams follow the weight
      QF_REQUIRE(q->mode() == ActivationMode::kStatic, pw, ": the model's activations are ", to_string(q->mode()),
                 "; only static activations take calibrated qparams");
      QF_REQUIRE(!q->config().lsq || !q->named_parameters(false).contains("scale"), pw,
                 ": the model's LSQ quantizer already trains its qparams");
      Observer* obs = q->observer();
      if (obs) {
        QF_REQUIRE(obs->kind() == e.observer_kind && same_options(q->config().observer_options, e.options, e.observer_kind), pw,
                   ": dump has observer '", e.observer_kind, "', the model's quantizer uses '", obs->kind(),
                   "' (or other options)");
        try {
          (void)e.make_observer();  // validates the state against the kind
        } catch (const Error& err) {
          throw Error(pw + ": " + err.what());
        }
        changes.push_back([obs, state = e.state] { obs->load_state(state); });
      }
      if (e.qparams.defined()) {
        changes.push_back([q, qp = e.qparams]() mutable { q->set_qparams(qp); });
      }
    }
  }
  for (auto& change : changes) change();
}

void load_calibration(torch::nn::Module& model, const std::string& path) {
  apply_calibration(model, load_calibration_dump(path), path);
}

}  // namespace qforge::io
