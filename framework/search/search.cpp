// Mixed-precision search: candidates, exact costs from frozen float copies, Hessian-trace or
// loss sensitivities, the knapsack, rules written back.
#include "framework/search/search.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "framework/core/enum_names.h"
#include "framework/core/error.h"
#include "framework/quantize.h"
#include "framework/search/knapsack.h"
#include "observers/histogram_observer.h"
#include "observers/histogram_search.h"

namespace qforge::search {

namespace {

constexpr NamedValue<Method> kMethodNames[] = {
    {Method::kHessian, "hessian"}, {Method::kLoss, "loss"}, {Method::kHistogram, "histogram"}};

// The rule that gives `path` candidate `c`: the recipe's own first rule for the path (so its
// other settings, e.g. activations, still apply) with the exact path as pattern and the
// candidate's weights.
LayerRule rule_for(const Scheme& base, const std::string& path, const Candidate& c) {
  LayerRule r;
  for (const LayerRule& b : base.rules)
    if (pattern_matches(b.pattern, path)) {
      r = b;
      break;
    }
  r.pattern = path;
  r.keep_float = false;
  r.weights.reset();
  r.weight_granularity.reset();
  r.group_size.reset();
  if (!c.qtype) {
    r.keep_float = true;
    return r;
  }
  r.weights = *c.qtype;
  r.weight_granularity = c.granularity;
  if (c.granularity == Granularity::kPerGroup) r.group_size = c.group_size;
  if (c.activations) r.activations = *c.activations;
  return r;
}

// Quantizers attached for a measurement, removed again on scope exit (also when it throws), so
// the model stays float.
class ScopedAttach {
 public:
  ScopedAttach(QuantizableLayer& layer, const std::string& path, const LayerScheme& scheme) : layer_(layer) {
    layer_.attach(path, scheme);
  }
  ~ScopedAttach() { layer_.detach(); }
  ScopedAttach(const ScopedAttach&) = delete;
  ScopedAttach& operator=(const ScopedAttach&) = delete;

 private:
  QuantizableLayer& layer_;
};

// What the layer is asked to do under `base` with candidate `c` in force for it.
std::optional<LayerScheme> scheme_with(const Scheme& base, const std::string& path, const QuantizableLayer& layer,
                                       const Candidate& c, std::string* note) {
  Scheme s = base;
  s.rules.insert(s.rules.begin(), rule_for(base, path, c));
  int rule = -1;
  return s.resolve(path, layer, &rule, note);
}

at::Tensor float_weight_of(const QuantizableLayer& layer) {
  const auto params = layer.module().named_parameters(/*recurse=*/false);
  QF_CHECK(params.contains("weight"));
  return params["weight"];
}

// What one candidate costs a layer: its bytes after freeze() and its frozen forward's latency,
// both measured on a quantized and frozen float copy (the code freeze() and model_size() run).
// Static activation quantizers of the copy get scale 1 (bytes and kernels do not depend on it).
struct Priced {
  int64_t bytes = 0;
  double latency_ms = 0;
  std::string kernel;
};

Priced price(const QuantizableLayer& layer, const std::string& path, const std::optional<LayerScheme>& ls,
             const std::string& candidate, const at::Tensor& input, LatencyCache& cache, const LatencyOptions& lo,
             int64_t* measured) {
  std::shared_ptr<QuantizableLayer> copy = layer.float_copy();
  QF_CHECK(copy != nullptr);
  const std::vector<int64_t> weight_shape = float_weight_of(*copy).sizes().vec();
  if (ls) {
    copy->attach(path, *ls);
    if (ls->weights && ls->weights->lsq) {
      // LSQ creates its learnable per-channel (per-group) step on the first training forward;
      // after QAT those parameters are part of the frozen layer's bytes.
      Quantizer wq = copy->weight_quantizer();
      wq->train();
      at::NoGradGuard no_grad;
      wq->forward(float_weight_of(*copy));
      wq->eval();
    }
    for (Quantizer q : copy->quantizers()) {
      if (q->role() == QuantizerImpl::Role::kActivation && q->mode() == ActivationMode::kStatic)
        q->set_qparams(QParams{q->config().spec, at::ones({}, at::kFloat), at::zeros({}, at::kInt)});
    }
    copy->freeze();
  }
  Priced p;
  p.bytes = copy->storage_bytes();
  p.kernel = copy->report().kernel;
  if (!input.defined()) return p;  // the model's forward never reached the layer
  const QuantizableLayer::InputRecord rec{input.sizes().vec(), input.scalar_type()};
  const std::string key = latency_key(*copy, weight_shape, rec, candidate);
  if (const auto hit = cache.find(key)) {
    p.latency_ms = *hit;
    return p;
  }
  p.latency_ms = time_forward_ms(*copy, input, lo);
  cache.put(key, p.latency_ms);
  ++*measured;
  return p;
}

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

using HistogramObservers = std::map<std::string, std::unique_ptr<Observer>>;

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

std::string format_bytes(double b) {
  std::ostringstream os;
  os.precision(6);
  os << b / 1e6 << " MB (" << static_cast<int64_t>(std::llround(b)) << " bytes)";
  return os.str();
}

}  // namespace

std::string Candidate::name() const {
  if (!qtype) return "float";
  std::string n = std::string(qtype->name) + " " + qforge::to_string(granularity);
  if (granularity == Granularity::kPerGroup) n += "(" + std::to_string(group_size) + ")";
  if (activations) n += *activations == ActivationMode::kNone ? " / a:float" : " / a:static";
  return n;
}

const char* to_string(Method m) { return name_of(kMethodNames, m); }
Method method_from_name(const std::string& name) { return value_of(kMethodNames, name, "search method"); }
std::vector<std::string> method_names() { return names_of(kMethodNames); }

std::string Budget::to_string() const {
  std::ostringstream os;
  auto add = [&](const char* name, const std::optional<double>& v) {
    if (!v) return;
    if (os.tellp() > 0) os << ", ";
    os << name << ": " << *v;
  };
  add("size_mb", size_mb);
  add("size_ratio", size_ratio);
  add("avg_bits", avg_bits);
  add("latency_ms", latency_ms);
  return os.str();
}

namespace {

struct Searched {
  std::string path;
  QuantizableLayer* layer;
  std::vector<Candidate> cands;
  std::vector<std::optional<LayerScheme>> schemes;
  int64_t float_bytes;
};

struct Collected {
  std::vector<Searched> layers;
  std::vector<std::pair<std::string, QuantizableLayer*>> fixed;  // quantizable, not searched
  std::vector<std::string> skipped;  // "<candidate> on <path>: why"
};

// `measuring`: the options search() measures with (the histogram method then needs the
// calibration); check_search() checks the rest before any calibration exists.
void check_options(const SearchOptions& o, int64_t batches, bool measuring = true) {
  const Budget& b = o.budget;
  if (!b.size_mb && !b.size_ratio && !b.avg_bits && !b.latency_ms)
    throw SearchError("search: give a budget: size_mb or size_ratio, avg_bits, latency_ms (one or more)");
  if (b.size_mb && b.size_ratio) throw SearchError("search: give size_mb or size_ratio, not both");
  for (const auto& v : {b.size_mb, b.size_ratio, b.avg_bits, b.latency_ms})
    if (v && !(std::isfinite(*v) && *v > 0))
      throw SearchError("search: budgets must be positive and finite, got " + std::to_string(*v));
  if (o.candidates.empty()) throw SearchError("search: no candidates");
  for (const Candidate& c : o.candidates)
    if (c.activations && o.method != Method::kHistogram)
      throw SearchError("search: activations are searched by the histogram method only (candidate '" + c.name() +
                        "'); hessian and loss price the weights");
  if (measuring && o.method == Method::kHistogram && !o.calibration)
    throw SearchError("search: the histogram method reads the calibration histograms: calibrate the base scheme first");
  if (batches <= 0) throw SearchError("search: sensitivities need at least one calibration batch");
}

// Step 1: the searched layers and the candidates each may take.
Collected collect(torch::nn::Module& model, const Scheme& base, const SearchOptions& o) {
  Collected out;
  std::vector<bool> candidate_used(o.candidates.size(), false);
  std::vector<std::string> refusals;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    if (layer->quantized())
      throw SearchError("search: '" + path + "' is quantized already; the search starts from the float model");
    int rule = -1;
    std::string note;
    const std::optional<LayerScheme> ls = base.resolve(path, *layer, &rule, &note);
    // Layers whose weights the scheme leaves float are not searched.
    if (!ls || !ls->weights || !layer->module().named_parameters(false).contains("weight")) {
      out.fixed.emplace_back(path, layer);
      continue;
    }
    Searched s{path, layer, {}, {}, layer->storage_bytes()};
    for (size_t c = 0; c < o.candidates.size(); ++c) {
      const Candidate& cand = o.candidates[c];
      bool allowed = true;
      for (const MinBits& m : o.min_bits)
        if (pattern_matches(m.pattern, path) && cand.bits() < m.bits) allowed = false;
      if (!allowed) continue;
      std::string cnote;
      const std::optional<LayerScheme> cls = scheme_with(base, path, *layer, cand, &cnote);
      if (cls && cand.qtype && cls->weights && cls->weights->spec.granularity != cand.granularity) {
        // The scheme would quietly give this layer another grid (e.g. per_channel for a group
        // size that does not divide it): the candidate is not what it says here.
        refusals.push_back(cand.name() + " on " + path + ": " + cnote);
        out.skipped.push_back(refusals.back());
        continue;
      }
      if (cls && cand.activations && cls->activations != *cand.activations) {
        // e.g. static inputs for an Embedding (its input is indices): not what the name says.
        refusals.push_back(cand.name() + " on " + path + ": the layer takes " + qforge::to_string(cls->activations) +
                           " activations here");
        out.skipped.push_back(refusals.back());
        continue;
      }
      if (cls) {
        try {
          layer->check_scheme(*cls);
        } catch (const Error& e) {
          refusals.push_back(cand.name() + " on " + path + ": " + e.what());
          out.skipped.push_back(refusals.back());
          continue;
        }
      }
      candidate_used[c] = true;
      s.cands.push_back(cand);
      s.schemes.push_back(cls);
    }
    if (s.cands.empty())
      throw SearchError("search: '" + path + "' can take none of the candidates (min_bits or its shape)");
    out.layers.push_back(std::move(s));
  }
  if (out.layers.empty()) throw SearchError("search: the scheme quantizes no layer's weights; nothing to search");
  for (size_t c = 0; c < o.candidates.size(); ++c) {
    if (candidate_used[c]) continue;
    std::string why;
    for (const std::string& r : refusals)
      if (r.rfind(o.candidates[c].name() + " on ", 0) == 0) why = r;
    throw SearchError("candidate '" + o.candidates[c].name() + "' fits no searched layer" +
                          (why.empty() ? std::string(" (min_bits excludes it everywhere)") : " (e.g. " + why + ")"),
                      static_cast<int>(c));
  }
  return out;
}

// What the sensitivities depend on: method and its settings, the base scheme (symmetry, grids),
// the searched weights (FNV-1a of their bytes) and the calibration data (batch 0's float loss).
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
  if (o.method == Method::kHistogram && o.calibration) {
    // The histograms: each input point's count and range.
    double total = 0, lo = 0, hi = 0;
    for (const auto& [path, points] : *o.calibration)
      for (const auto& [point, e] : points)
        for (const auto& [name, t] : e.state) {
          if (name == "count" || name == "histogram") total += t.to(at::kDouble).sum().item<double>();
          if (name == "min") lo += t.to(at::kDouble).sum().item<double>();
          if (name == "max") hi += t.to(at::kDouble).sum().item<double>();
        }
    os << "|calibration=" << total << "," << lo << "," << hi;
  }
  if (o.method == Method::kHessian)
    os << "|probes=" << o.hutchinson.min_probes << ".." << o.hutchinson.max_probes << "|tol=" << o.hutchinson.rel_tol
       << "|seed=" << o.hutchinson.seed;
  return os.str();
}

// The knapsack's cost axes.
enum Axis : size_t { kBytes = 0, kBits = 1, kLatency = 2 };

}  // namespace

void check_search(torch::nn::Module& model, const Scheme& base, const SearchOptions& o) {
  check_options(o, 1, /*measuring=*/false);
  collect(model, base, o);
}

SearchResult search(torch::nn::Module& model, const Scheme& base, int64_t batches,
                    const std::function<at::Tensor(int64_t)>& loss_of_batch, const SearchOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  check_options(o, batches);

  SearchResult res;
  res.method = o.method;
  res.budget = o.budget;
  res.float_bytes = model_size(model).total_bytes;
  res.cpu = cpu_model_name();

  // 1. Layers and their allowed candidates.
  Collected col = collect(model, base, o);
  std::vector<Searched>& layers = col.layers;
  res.skipped = col.skipped;

  // The input each layer with weights sees on calibration batch 0 (shapes for the latencies).
  std::map<const QuantizableLayer*, at::Tensor> inputs;
  double loss0 = 0;
  {
    at::NoGradGuard no_grad;
    for (const auto& [path, layer] : quantizable_layers(model)) layer->record_inputs(true);
    try {
      loss0 = loss_of_batch(0).item<double>();
    } catch (...) {
      for (const auto& [path, layer] : quantizable_layers(model)) layer->record_inputs(false);
      throw;
    }
    for (const auto& [path, layer] : quantizable_layers(model)) {
      layer->record_inputs(false);
      const auto& rec = layer->recorded_input();
      if (rec.shape.empty() || !layer->module().named_parameters(false).contains("weight")) continue;
      inputs[layer] = synthetic_input(rec, float_weight_of(*layer).size(0));
    }
  }
  auto input_of = [&](const QuantizableLayer* l) {
    const auto it = inputs.find(l);
    return it == inputs.end() ? at::Tensor() : it->second;
  };
  LatencyCache cache(o.latency.cache_path);

  // Layers not searched: their fixed quantizers count in bytes (measured attached, then
  // detached), their frozen kernels in latency.
  int64_t unsearched_quantizer_bytes = 0;
  double rest_latency_ms = 0, rest_float_latency_ms = 0;
  for (const auto& [path, layer] : col.fixed) {
    int rule = -1;
    std::string note;
    const std::optional<LayerScheme> ls = base.resolve(path, *layer, &rule, &note);
    if (ls) {
      const int64_t float_bytes = layer->storage_bytes();
      const ScopedAttach attached(*layer, path, *ls);
      unsearched_quantizer_bytes += layer->storage_bytes() - float_bytes;
    }
    const at::Tensor x = input_of(layer);
    if (!x.defined() || !timeable(*layer)) continue;
    const Priced fixed = price(*layer, path, ls, ls ? "fixed" : "float", x, cache, o.latency, &res.latency_measured);
    rest_latency_ms += fixed.latency_ms;
    rest_float_latency_ms +=
        ls ? price(*layer, path, std::nullopt, "float", x, cache, o.latency, &res.latency_measured).latency_ms
           : fixed.latency_ms;
  }

  HistogramObservers observers;  // histogram method: input observers restored from the calibration once
  // 2. Sensitivities, unless an earlier search's match.
  std::vector<std::vector<double>> sens(layers.size());
  std::vector<double> avg_trace(layers.size(), 0.0);
  res.sensitivities.key = sensitivity_key(layers, base, batches, loss0, o);
  if (o.reuse) {
    if (o.reuse->key != res.sensitivities.key) {
      res.reuse_note = "the stored sensitivities are for other settings, weights or data (key " + o.reuse->key + ")";
    } else {
      res.reused = true;
      for (size_t i = 0; i < layers.size() && res.reused; ++i) {
        const auto lv = o.reuse->values.find(layers[i].path);
        const auto lt = o.reuse->traces.find(layers[i].path);
        if (lv == o.reuse->values.end() || lt == o.reuse->traces.end()) {
          res.reuse_note = "the stored sensitivities have no entry for " + layers[i].path;
          res.reused = false;
          break;
        }
        avg_trace[i] = lt->second;
        for (const Candidate& c : layers[i].cands) {
          const auto v = lv->second.find(c.name());
          if (v == lv->second.end()) {
            res.reuse_note = "the stored sensitivities have no entry for " + c.name() + " on " + layers[i].path;
            res.reused = false;
            break;
          }
          sens[i].push_back(v->second);
        }
      }
      if (!res.reused) {
        for (auto& v : sens) v.clear();
        std::fill(avg_trace.begin(), avg_trace.end(), 0.0);
      }
    }
  }
  if (res.reused) {
    // measured earlier: nothing to do
  } else if (o.method == Method::kHessian) {
    at::AutoGradMode grad_on(true);  // double backward, whatever the caller's mode
    std::vector<at::Tensor> params;
    for (const Searched& s : layers) params.push_back(float_weight_of(*s.layer));
    std::vector<double> trace(layers.size(), 0.0);
    for (int64_t b = 0; b < batches; ++b) {
      HutchinsonOptions ho = o.hutchinson;
      ho.seed = o.hutchinson.seed + static_cast<uint64_t>(b);
      const TraceEstimate e = hutchinson_trace(loss_of_batch(b), params, ho);
      res.hutchinson_probes = std::max(res.hutchinson_probes, e.probes);
      for (size_t i = 0; i < layers.size(); ++i) trace[i] += e.trace[i] / batches;
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      // A negative estimate is noise around zero curvature: it counts as 0, never as a reward
      // for more perturbation.
      avg_trace[i] = std::max(0.0, trace[i]) / params[i].numel();
      for (size_t c = 0; c < layers[i].cands.size(); ++c) {
        const auto& ls = layers[i].schemes[c];
        sens[i].push_back(ls ? avg_trace[i] * perturbation(params[i], layers[i].path, *ls) : 0.0);
      }
    }
  } else if (o.method == Method::kHistogram) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < layers.size(); ++i) {
      const at::Tensor w = float_weight_of(*layers[i].layer).detach().to(at::kFloat);
      const double w_energy = std::max(w.pow(2).sum().item<double>(), std::numeric_limits<double>::min());
      for (size_t c = 0; c < layers[i].cands.size(); ++c) {
        const auto& ls = layers[i].schemes[c];
        double v = 0.0;
        if (ls && ls->weights) v += perturbation(w, layers[i].path, *ls) / w_energy;
        if (ls && ls->activations == ActivationMode::kStatic) {
          const HistogramObserver& obs = required_input_observer(*o.calibration, layers[i].path, observers);
          v += activation_nsr(obs, obs.histogram(), ls->activation.spec);
        }
        sens[i].push_back(v);
      }
    }
  } else {
    at::NoGradGuard no_grad;
    auto mean_loss = [&] {
      double l = 0;
      for (int64_t b = 0; b < batches; ++b) l += loss_of_batch(b).item<double>() / batches;
      return l;
    };
    const double base_loss = mean_loss();
    for (size_t i = 0; i < layers.size(); ++i) {
      for (size_t c = 0; c < layers[i].cands.size(); ++c) {
        const auto& ls = layers[i].schemes[c];
        if (!ls) {
          sens[i].push_back(0.0);
          continue;
        }
        LayerScheme weight_only;
        weight_only.weights = ls->weights;
        weight_only.weights->lsq = false;
        const ScopedAttach attached(*layers[i].layer, layers[i].path, weight_only);
        sens[i].push_back(mean_loss() - base_loss);
      }
    }
  }

  // 3. Costs (bytes, bits, latency), the knapsack groups (ties merged) and the budgets.
  double weight_elements = 0;
  std::map<std::string, int> tie_of;  // layer path -> tie index
  for (size_t t = 0; t < o.ties.size(); ++t)
    for (const Searched& s : layers)
      for (const std::string& p : o.ties[t])
        if (pattern_matches(p, s.path) && !tie_of.count(s.path)) tie_of[s.path] = static_cast<int>(t);
  int64_t searched_float_bytes = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerChoice lc;
    lc.path = layers[i].path;
    lc.type = layers[i].layer->layer_type();
    lc.weight_elements = float_weight_of(*layers[i].layer).numel();
    lc.hessian_trace = avg_trace[i];
    const at::Tensor x = input_of(layers[i].layer);
    if (x.defined()) lc.input_shape = x.sizes().vec();
    if (o.method == Method::kHistogram && o.calibration) {
      // The input's error at every integer width, from the one histogram.
      const HistogramObserver* obs = input_observer(*o.calibration, lc.path, observers);
      if (obs && !obs->histogram().empty())
        for (const QType& q : {qint8, qint4, qint2}) {
          QSpec spec = o.calibration->at(lc.path).at("input").spec;
          spec.qtype = q;
          spec.narrow_range = spec.narrow_range && q == qint8;
          lc.activation_error[q.name] = activation_nsr(*obs, obs->histogram(), spec);
        }
    }
    weight_elements += static_cast<double>(lc.weight_elements);
    searched_float_bytes += layers[i].float_bytes;
    const Priced as_float =
        price(*layers[i].layer, layers[i].path, std::nullopt, "float", x, cache, o.latency, &res.latency_measured);
    res.float_latency_ms += as_float.latency_ms;
    for (size_t c = 0; c < layers[i].cands.size(); ++c) {
      CandidateCost cc;
      cc.candidate = layers[i].cands[c].name();
      const Priced p = layers[i].schemes[c] ? price(*layers[i].layer, layers[i].path, layers[i].schemes[c],
                                                    cc.candidate, x, cache, o.latency, &res.latency_measured)
                                              : as_float;
      cc.bytes = p.bytes;
      cc.latency_ms = p.latency_ms;
      cc.kernel = p.kernel;
      cc.bits = static_cast<double>(layers[i].cands[c].bits()) * static_cast<double>(lc.weight_elements);
      cc.sensitivity = sens[i][c];
      lc.candidates.push_back(cc);
    }
    res.sensitivities.traces[lc.path] = lc.hessian_trace;
    for (const CandidateCost& cc : lc.candidates) res.sensitivities.values[lc.path][cc.candidate] = cc.sensitivity;
    res.layers.push_back(std::move(lc));
  }
  res.latency_cached = cache.hits();
  cache.save();
  // Everything outside the searched layers: float tensors, plus the quantizers the scheme gives
  // the unsearched layers (e.g. LayerNorm outputs, MatMul operands).
  const int64_t rest_bytes = res.float_bytes - searched_float_bytes + unsearched_quantizer_bytes;
  std::vector<Group> groups;
  std::vector<std::vector<size_t>> members;  // group -> layer indices
  std::map<int, size_t> group_of_tie;
  for (size_t i = 0; i < res.layers.size(); ++i) {
    const auto t = tie_of.find(res.layers[i].path);
    if (t != tie_of.end() && group_of_tie.count(t->second)) {
      members[group_of_tie[t->second]].push_back(i);
      continue;
    }
    if (t != tie_of.end()) group_of_tie[t->second] = groups.size();
    groups.push_back(Group{res.layers[i].path, {}});
    members.push_back({i});
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    // A tie group's choices: the candidates every member may take, costs and values summed.
    const LayerChoice& first = res.layers[members[g][0]];
    for (const CandidateCost& cc : first.candidates) {
      Choice ch{cc.candidate, {0.0, 0.0, 0.0}, 0.0};
      bool everywhere = true;
      for (size_t i : members[g]) {
        const auto& cs = res.layers[i].candidates;
        const auto it = std::find_if(cs.begin(), cs.end(), [&](const CandidateCost& x) { return x.candidate == cc.candidate; });
        if (it == cs.end()) {
          everywhere = false;
          break;
        }
        ch.costs[kBytes] += static_cast<double>(it->bytes);
        ch.costs[kBits] += it->bits;
        ch.costs[kLatency] += it->latency_ms;
        ch.value += it->sensitivity;
      }
      if (everywhere) groups[g].choices.push_back(ch);
    }
    if (members[g].size() > 1) {
      for (size_t k = 1; k < members[g].size(); ++k) groups[g].name += "+" + res.layers[members[g][k]].path;
    }
  }
  // The budgets given, each as (axis, limit on the searched layers' sum, name for messages).
  std::vector<size_t> axes;
  std::vector<double> limits;
  std::vector<std::string> names;
  if (o.budget.size_mb) {
    axes.push_back(kBytes);
    limits.push_back(*o.budget.size_mb * 1e6 - static_cast<double>(rest_bytes));
    names.push_back("size budget " + format_bytes(*o.budget.size_mb * 1e6) + " less the unsearched layers' " +
                    format_bytes(static_cast<double>(rest_bytes)) + " leaves bytes");
  } else if (o.budget.size_ratio) {
    axes.push_back(kBytes);
    limits.push_back(*o.budget.size_ratio * static_cast<double>(res.float_bytes) - static_cast<double>(rest_bytes));
    std::ostringstream os;
    os << "size_ratio budget " << *o.budget.size_ratio << " (" << format_bytes(*o.budget.size_ratio * res.float_bytes)
       << ") less the unsearched layers' " << format_bytes(static_cast<double>(rest_bytes)) << " leaves bytes";
    names.push_back(os.str());
  }
  if (o.budget.avg_bits) {
    axes.push_back(kBits);
    limits.push_back(*o.budget.avg_bits * weight_elements);
    std::ostringstream os;
    os << "avg_bits budget " << *o.budget.avg_bits << " over " << static_cast<int64_t>(weight_elements)
       << " weights leaves bits";
    names.push_back(os.str());
  }
  if (o.budget.latency_ms) {
    axes.push_back(kLatency);
    limits.push_back(*o.budget.latency_ms - rest_latency_ms);
    std::ostringstream os;
    os << "latency budget " << *o.budget.latency_ms << " ms less the unsearched layers' " << rest_latency_ms
       << " ms (measured on " << res.cpu << ") leaves ms";
    names.push_back(os.str());
  }
  auto project = [&](const std::vector<size_t>& keep) {
    std::vector<Group> out = groups;
    for (Group& g : out)
      for (Choice& c : g.choices) {
        std::vector<double> costs;
        for (size_t a : keep) costs.push_back(c.costs[a]);
        c.costs = costs;
      }
    return out;
  };
  Assignment a;
  try {
    a = solve_knapsack(project(axes), limits, names);
  } catch (const Error& e) {
    throw SearchError(e.what());
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string& name = groups[g].choices[a.picks[g]].name;
    for (size_t i : members[g]) {
      auto& cs = res.layers[i].candidates;
      res.layers[i].chosen = static_cast<int>(
          std::find_if(cs.begin(), cs.end(), [&](const CandidateCost& x) { return x.candidate == name; }) - cs.begin());
    }
  }
  res.predicted = a.value;
  res.bytes = rest_bytes;
  res.latency_ms = rest_latency_ms;
  res.float_latency_ms += rest_float_latency_ms;
  for (const LayerChoice& lc : res.layers) {
    res.bytes += lc.candidates[lc.chosen].bytes;
    res.latency_ms += lc.candidates[lc.chosen].latency_ms;
  }
  auto rules_of = [&](const std::vector<int>& picks) {
    std::vector<LayerRule> rules(layers.size());
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t i : members[g]) {
        const std::string& name = groups[g].choices[picks[g]].name;
        for (const Candidate& c : layers[i].cands)
          if (c.name() == name) rules[i] = rule_for(base, layers[i].path, c);
      }
    return rules;
  };
  res.rules = rules_of(a.picks);
  // The front: the first budget's axis (bytes unless only bits or latency are budgeted) against
  // predicted sensitivity, over every budget on that axis.
  const size_t front_axis = axes.front() == kBits && axes.size() == 1 ? kBytes : axes.front();
  res.pareto_axis = front_axis == kLatency ? "latency_ms" : "bytes";
  for (const Assignment& p : pareto_front(project({front_axis}), {std::numeric_limits<double>::infinity()})) {
    ParetoPoint point{rest_bytes, rest_latency_ms, p.value, rules_of(p.picks), std::nullopt, p.picks == a.picks};
    for (size_t g = 0; g < groups.size(); ++g) {
      const Choice& c = groups[g].choices[p.picks[g]];
      point.bytes += static_cast<int64_t>(std::llround(c.costs[kBytes]));
      point.latency_ms += c.costs[kLatency];
    }
    res.pareto.push_back(std::move(point));
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

Scheme apply(const Scheme& base, const SearchResult& result) { return apply(base, result.rules); }

Scheme apply(const Scheme& base, const std::vector<LayerRule>& rules) {
  Scheme s = base;
  s.rules.insert(s.rules.begin(), rules.begin(), rules.end());
  return s;
}

}  // namespace qforge::search
