// Sensitivity strategies of the mixed-precision search (hessian, loss, histogram), their table,
// the key that says when stored sensitivities still hold, and their reuse.
#include "framework/search/sensitivity.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <sstream>

#include "framework/api/progress.h"
#include "framework/core/error.h"
#include "framework/search/hessian.h"
#include "observers/histogram_search.h"

namespace qforge::search {

namespace {

// ‖Q_c(W) − W‖² with the fake-quantization freeze() packs (min/max qparams of the candidate).
double perturbation(const at::Tensor& w, const std::string& path, const LayerScheme& ls) {
  at::NoGradGuard no_grad;
  QuantizerConfig cfg = *ls.weights;
  cfg.lsq = false;  // the search prices the min/max grid; LSQ learns from it during QAT
  Quantizer q(QuantizerImpl::Role::kWeight, cfg, ActivationMode::kNone, path + ".weight");
  q->eval();
  const at::Tensor wf = w.detach().to(at::kFloat);
  return (q->forward(wf) - wf).pow(2).sum().item<double>();
}

void advance(const SensitivityContext& ctx) {
  if (ctx.progress) ctx.progress->update(1);
}

Sensitivities empty_for(size_t layers) {
  Sensitivities s;
  s.values.resize(layers);
  s.traces.assign(layers, 0.0);
  return s;
}

// HAWQ-V2: Ω = (Tr(H_W) / n) · ‖Q_c(W) − W‖², Tr(H_W) by Hutchinson's estimator per batch.
class HessianSensitivity final : public SensitivityMethod {
 public:
  Method method() const override { return Method::kHessian; }
  std::string key_suffix(const SearchOptions& o) const override {
    std::ostringstream os;
    os.precision(17);
    os << "|probes=" << o.hutchinson.min_probes << ".." << o.hutchinson.max_probes << "|tol=" << o.hutchinson.rel_tol
       << "|seed=" << o.hutchinson.seed;
    return os.str();
  }
  int64_t steps(const SensitivityContext& ctx) const override { return ctx.batches; }
  Sensitivities measure(const SensitivityContext& ctx) const override {
    const auto& layers = ctx.layers;
    Sensitivities out = empty_for(layers.size());
    at::AutoGradMode grad_on(true);  // double backward, whatever the caller's mode
    std::vector<at::Tensor> params;
    for (const Searched& s : layers) params.push_back(float_weight_of(*s.layer));
    std::vector<double> trace(layers.size(), 0.0);
    for (int64_t b = 0; b < ctx.batches; ++b) {
      HutchinsonOptions ho = ctx.options.hutchinson;
      ho.seed = ctx.options.hutchinson.seed + static_cast<uint64_t>(b);
      const TraceEstimate e = hutchinson_trace(ctx.loss_of_batch(b), params, ho);
      out.hutchinson_probes = std::max(out.hutchinson_probes, e.probes);
      for (size_t i = 0; i < layers.size(); ++i) trace[i] += e.trace[i] / ctx.batches;
      advance(ctx);
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      // A negative estimate is noise around zero curvature: it counts as 0, never as a reward
      // for more perturbation.
      out.traces[i] = std::max(0.0, trace[i]) / params[i].numel();
      for (const auto& ls : layers[i].schemes)
        out.values[i].push_back(ls ? out.traces[i] * perturbation(params[i], layers[i].path, *ls) : 0.0);
    }
    return out;
  }
};

// L(model with only this layer's weights quantized by c) − L(float model), over the batches.
class LossSensitivity final : public SensitivityMethod {
 public:
  Method method() const override { return Method::kLoss; }
  std::string key_suffix(const SearchOptions& /*options*/) const override { return {}; }
  int64_t steps(const SensitivityContext& ctx) const override { return static_cast<int64_t>(ctx.layers.size()) + 1; }
  Sensitivities measure(const SensitivityContext& ctx) const override {
    Sensitivities out = empty_for(ctx.layers.size());
    at::NoGradGuard no_grad;
    auto mean_loss = [&] {
      double l = 0;
      for (int64_t b = 0; b < ctx.batches; ++b) l += ctx.loss_of_batch(b).item<double>() / ctx.batches;
      return l;
    };
    const double base_loss = mean_loss();
    advance(ctx);
    for (size_t i = 0; i < ctx.layers.size(); ++i) {
      const Searched& s = ctx.layers[i];
      for (const auto& ls : s.schemes) {
        if (!ls) {
          out.values[i].push_back(0.0);
          continue;
        }
        LayerScheme weight_only;
        weight_only.weights = ls->weights;
        weight_only.weights->lsq = false;
        const ScopedAttach attached(*s.layer, s.path, weight_only);
        out.values[i].push_back(mean_loss() - base_loss);
      }
      advance(ctx);
    }
    return out;
  }
};

// The histogram observer of `path`'s input in the base scheme's calibration, restored once and
// kept in `observers`; nullptr when the dump has no histogram input point for it.
const HistogramObserver* input_observer(const io::CalibrationDump& calibration, const std::string& path,
                                        HistogramObservers& observers) {
  auto& slot = observers[path];
  if (!slot) {
    const auto m = calibration.find(path);
    if (m == calibration.end() || !m->second.count("input") || m->second.at("input").observer_kind != "histogram")
      return nullptr;
    slot = m->second.at("input").make_observer();
  }
  return dynamic_cast<const HistogramObserver*>(slot.get());
}

// The same, for a layer whose input the method must price: every way it can be missing is an error.
const HistogramObserver& required_input_observer(const io::CalibrationDump& calibration, const std::string& path,
                                                 HistogramObservers& observers) {
  if (const HistogramObserver* h = input_observer(calibration, path, observers)) {
    if (h->histogram().empty()) throw SearchError("search: the input histogram of '" + path + "' saw no finite value");
    return *h;
  }
  const auto m = calibration.find(path);
  if (m == calibration.end() || !m->second.count("input"))
    throw SearchError("search: the histogram method found no calibrated input of '" + path +
                      "' (the base scheme must quantize its activations statically)");
  throw SearchError("search: the histogram method needs histogram observers; '" + path + "' input has '" +
                    m->second.at("input").observer_kind + "' (quantize.activations.observer: histogram)");
}

// E[(Q(x) − x)²] / E[x²] of the input for `spec`, with the range the observer picks for it.
double activation_nsr(const Observer& observer, const Histogram& h, const QSpec& spec) {
  const double energy = histogram_second_moment(h);
  if (!(energy > 0)) return 0.0;
  const auto [lo, hi] = observer.range(spec);
  return histogram_expected_sq_error(h, lo.item<float>(), hi.item<float>(), spec) / energy;
}

// ‖Q_c(W) − W‖² / ‖W‖² + E[(Q_a(x) − x)²] / E[x²], the input's error read off the calibration
// histogram: no forward or backward pass beyond calibration.
class HistogramSensitivity final : public SensitivityMethod {
 public:
  Method method() const override { return Method::kHistogram; }
  bool searches_activations() const override { return true; }
  void check(const SearchOptions& o, bool measuring) const override {
    if (measuring && !o.calibration)
      throw SearchError("search: the histogram method reads the calibration histograms: calibrate the base scheme first");
  }
  std::string key_suffix(const SearchOptions& o) const override;
  Sensitivities measure(const SensitivityContext& ctx) const override;
  void describe(LayerChoice& lc, const SensitivityContext& ctx) const override;
};

std::string HistogramSensitivity::key_suffix(const SearchOptions& o) const {
  if (!o.calibration) return {};
  // The histograms: each input point's count and range.
  double total = 0, lo = 0, hi = 0;
  for (const auto& [path, points] : *o.calibration)
    for (const auto& [point, e] : points)
      for (const auto& [name, t] : e.state) {
        if (name == "count" || name == "histogram") total += t.to(at::kDouble).sum().item<double>();
        if (name == "min") lo += t.to(at::kDouble).sum().item<double>();
        if (name == "max") hi += t.to(at::kDouble).sum().item<double>();
      }
  std::ostringstream os;
  os.precision(17);
  os << "|calibration=" << total << "," << lo << "," << hi;
  return os.str();
}

Sensitivities HistogramSensitivity::measure(const SensitivityContext& ctx) const {
  Sensitivities out = empty_for(ctx.layers.size());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < ctx.layers.size(); ++i) {
    const Searched& s = ctx.layers[i];
    const at::Tensor w = float_weight_of(*s.layer).detach().to(at::kFloat);
    const double w_energy = std::max(w.pow(2).sum().item<double>(), std::numeric_limits<double>::min());
    for (const auto& ls : s.schemes) {
      double v = 0.0;
      if (ls && ls->weights) v += perturbation(w, s.path, *ls) / w_energy;
      if (ls && ls->activations == ActivationMode::kStatic) {
        const HistogramObserver& obs = required_input_observer(*ctx.options.calibration, s.path, ctx.observers);
        v += activation_nsr(obs, obs.histogram(), ls->activation.spec);
      }
      out.values[i].push_back(v);
    }
    advance(ctx);
  }
  return out;
}

void HistogramSensitivity::describe(LayerChoice& lc, const SensitivityContext& ctx) const {
  const io::CalibrationDump* calibration = ctx.options.calibration;
  if (!calibration) return;
  // The input's error at every integer width, from the one histogram.
  const HistogramObserver* obs = input_observer(*calibration, lc.path, ctx.observers);
  if (!obs || obs->histogram().empty()) return;
  for (const QType& q : {qint8, qint4, qint2}) {
    QSpec spec = calibration->at(lc.path).at("input").spec;
    spec.qtype = q;
    spec.narrow_range = spec.narrow_range && q == qint8;
    lc.activation_error[q.name] = activation_nsr(*obs, obs->histogram(), spec);
  }
}

const HessianSensitivity kHessian;
const LossSensitivity kLoss;
const HistogramSensitivity kHistogram;
const SensitivityMethod* const kMethods[] = {&kHessian, &kLoss, &kHistogram};

}  // namespace

const SensitivityMethod& sensitivity_method(Method method) {
  for (const SensitivityMethod* m : kMethods)
    if (m->method() == method) return *m;
  throw SearchError(std::string("search: no sensitivity method '") + to_string(method) + "'");
}

std::string sensitivity_key(const std::vector<Searched>& layers, const Scheme& base, int64_t batches, double loss0,
                            const SearchOptions& o) {
  uint64_t h = 1469598103934665603ull;
  for (const Searched& s : layers) {
    const at::Tensor w = float_weight_of(*s.layer).detach().to(at::kFloat).contiguous();
    const auto* p = static_cast<const unsigned char*>(w.data_ptr());
    for (int64_t i = 0; i < w.numel() * 4; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  std::ostringstream os;
  os.precision(17);
  os << to_string(o.method) << "|batches=" << batches << "|loss0=" << loss0 << "|scheme=" << base.to_string()
     << "|weights=" << std::hex << h << std::dec;
  return os.str() + sensitivity_method(o.method).key_suffix(o);
}

std::optional<Sensitivities> reused_sensitivities(const std::vector<Searched>& layers, const SearchOptions& o,
                                                  const std::string& key, std::string* note) {
  if (!o.reuse) return std::nullopt;
  if (o.reuse->key != key) {
    *note = "the stored sensitivities are for other settings, weights or data (key " + o.reuse->key + ")";
    return std::nullopt;
  }
  Sensitivities out = empty_for(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto lv = o.reuse->values.find(layers[i].path);
    const auto lt = o.reuse->traces.find(layers[i].path);
    if (lv == o.reuse->values.end() || lt == o.reuse->traces.end()) {
      *note = "the stored sensitivities have no entry for " + layers[i].path;
      return std::nullopt;
    }
    out.traces[i] = lt->second;
    for (const Candidate& c : layers[i].cands) {
      const auto v = lv->second.find(c.name());
      if (v == lv->second.end()) {
        *note = "the stored sensitivities have no entry for " + c.name() + " on " + layers[i].path;
        return std::nullopt;
      }
      out.values[i].push_back(v->second);
    }
  }
  return out;
}

}  // namespace qforge::search
