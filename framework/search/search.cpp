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

namespace qforge::search {

namespace {

constexpr NamedValue<Method> kMethodNames[] = {{Method::kHessian, "hessian"}, {Method::kLoss, "loss"}};

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

// The layer's bytes after freeze(), measured on a quantized and frozen float copy. Static
// activation quantizers of the copy get scale 1 (bytes and kernels do not depend on the value).
int64_t frozen_bytes(const QuantizableLayer& layer, const std::string& path, const std::optional<LayerScheme>& ls) {
  std::shared_ptr<QuantizableLayer> copy = layer.float_copy();
  QF_CHECK(copy != nullptr);
  if (!ls) return copy->storage_bytes();
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
  return copy->storage_bytes();
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
  return n;
}

const char* to_string(Method m) { return name_of(kMethodNames, m); }
Method method_from_name(const std::string& name) { return value_of(kMethodNames, name, "search method"); }
std::vector<std::string> method_names() { return names_of(kMethodNames); }

std::string Budget::to_string() const {
  std::ostringstream os;
  if (size_mb) os << "size_mb: " << *size_mb;
  else if (size_ratio) os << "size_ratio: " << *size_ratio;
  else if (avg_bits) os << "avg_bits: " << *avg_bits;
  return os.str();
}

SearchResult search(torch::nn::Module& model, const Scheme& base, int64_t batches,
                    const std::function<at::Tensor(int64_t)>& loss_of_batch, const SearchOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n_budgets = o.budget.size_mb.has_value() + o.budget.size_ratio.has_value() + o.budget.avg_bits.has_value();
  QF_REQUIRE(n_budgets == 1, "search: give exactly one budget (size_mb, size_ratio or avg_bits), got ", n_budgets);
  for (double b : {o.budget.size_mb.value_or(1), o.budget.size_ratio.value_or(1), o.budget.avg_bits.value_or(1)})
    QF_REQUIRE(std::isfinite(b) && b > 0, "search: the budget must be positive, got ", b);
  QF_REQUIRE(!o.candidates.empty(), "search: no candidates");
  QF_REQUIRE(batches > 0, "search: sensitivities need at least one calibration batch");

  SearchResult res;
  res.method = o.method;
  res.budget = o.budget;
  res.float_bytes = model_size(model).total_bytes;

  // 1. Layers, their allowed candidates and exact costs.
  struct Searched {
    std::string path;
    QuantizableLayer* layer;
    std::vector<Candidate> cands;
    std::vector<std::optional<LayerScheme>> schemes;
    int64_t float_bytes;
  };
  std::vector<Searched> layers;
  int64_t unsearched_quantizer_bytes = 0;
  std::vector<bool> candidate_used(o.candidates.size(), false);
  std::vector<std::string> refusals;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    QF_REQUIRE(!layer->quantized(), "search: '", path, "' is quantized already; the search starts from the float model");
    int rule = -1;
    std::string note;
    const std::optional<LayerScheme> ls = base.resolve(path, *layer, &rule, &note);
    // Layers whose weights the scheme leaves float are not searched; the quantizers the scheme
    // gives them still count (measured attached, then detached).
    if (!ls || !ls->weights || !layer->module().named_parameters(false).contains("weight")) {
      if (ls) {
        const int64_t float_bytes = layer->storage_bytes();
        const ScopedAttach attached(*layer, path, *ls);
        unsearched_quantizer_bytes += layer->storage_bytes() - float_bytes;
      }
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
      if (cls) {
        try {
          layer->check_scheme(*cls);
        } catch (const Error& e) {
          refusals.push_back(cand.name() + " on " + path + ": " + e.what());
          continue;
        }
      }
      candidate_used[c] = true;
      s.cands.push_back(cand);
      s.schemes.push_back(cls);
    }
    QF_REQUIRE(!s.cands.empty(), "search: '", path, "' can take none of the candidates (min_bits or its shape)");
    layers.push_back(std::move(s));
  }
  QF_REQUIRE(!layers.empty(), "search: the scheme quantizes no layer's weights; nothing to search");
  for (size_t c = 0; c < o.candidates.size(); ++c) {
    if (candidate_used[c]) continue;
    std::string why;
    for (const std::string& r : refusals)
      if (r.rfind(o.candidates[c].name() + " on ", 0) == 0) why = r;
    QF_REQUIRE(false, "search: candidate '", o.candidates[c].name(), "' fits no searched layer",
               why.empty() ? std::string() : " (e.g. " + why + ")");
  }

  // 2. Sensitivities.
  std::vector<std::vector<double>> sens(layers.size());
  std::vector<double> avg_trace(layers.size(), 0.0);
  if (o.method == Method::kHessian) {
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

  // 3. Costs, the knapsack groups (ties merged) and the budget.
  double weight_elements = 0;
  std::map<std::string, int> tie_of;  // layer path -> tie index
  for (size_t t = 0; t < o.ties.size(); ++t)
    for (const Searched& s : layers)
      for (const std::string& p : o.ties[t])
        if (pattern_matches(p, s.path) && !tie_of.count(s.path)) tie_of[s.path] = static_cast<int>(t);
  const bool bits_budget = o.budget.avg_bits.has_value();
  int64_t searched_float_bytes = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerChoice lc;
    lc.path = layers[i].path;
    lc.type = layers[i].layer->layer_type();
    lc.weight_elements = float_weight_of(*layers[i].layer).numel();
    lc.hessian_trace = avg_trace[i];
    weight_elements += static_cast<double>(lc.weight_elements);
    searched_float_bytes += layers[i].float_bytes;
    for (size_t c = 0; c < layers[i].cands.size(); ++c) {
      CandidateCost cc;
      cc.candidate = layers[i].cands[c].name();
      cc.bytes = frozen_bytes(*layers[i].layer, layers[i].path, layers[i].schemes[c]);
      cc.bits = static_cast<double>(layers[i].cands[c].bits()) * static_cast<double>(lc.weight_elements);
      cc.sensitivity = sens[i][c];
      lc.candidates.push_back(cc);
    }
    res.layers.push_back(std::move(lc));
  }
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
      Choice ch{cc.candidate, {0.0, 0.0}, 0.0};
      bool everywhere = true;
      for (size_t i : members[g]) {
        const auto& cs = res.layers[i].candidates;
        const auto it = std::find_if(cs.begin(), cs.end(), [&](const CandidateCost& x) { return x.candidate == cc.candidate; });
        if (it == cs.end()) {
          everywhere = false;
          break;
        }
        ch.costs[0] += static_cast<double>(it->bytes);
        ch.costs[1] += it->bits;
        ch.value += it->sensitivity;
      }
      if (everywhere) groups[g].choices.push_back(ch);
    }
    if (members[g].size() > 1) {
      for (size_t k = 1; k < members[g].size(); ++k) groups[g].name += "+" + res.layers[members[g][k]].path;
    }
  }
  double budget_value = 0;
  std::string budget_name;
  if (o.budget.size_mb) {
    budget_value = *o.budget.size_mb * 1e6 - static_cast<double>(rest_bytes);
    budget_name = "size budget " + format_bytes(*o.budget.size_mb * 1e6) + " less the unsearched layers' " +
                  format_bytes(static_cast<double>(rest_bytes)) + " leaves bytes";
  } else if (o.budget.size_ratio) {
    budget_value = *o.budget.size_ratio * static_cast<double>(res.float_bytes) - static_cast<double>(rest_bytes);
    std::ostringstream os;
    os << "size_ratio budget " << *o.budget.size_ratio << " (" << format_bytes(*o.budget.size_ratio * res.float_bytes)
       << ") less the unsearched layers' " << format_bytes(static_cast<double>(rest_bytes)) << " leaves bytes";
    budget_name = os.str();
  } else {
    budget_value = *o.budget.avg_bits * weight_elements;
    std::ostringstream os;
    os << "avg_bits budget " << *o.budget.avg_bits << " over " << static_cast<int64_t>(weight_elements)
       << " weights leaves bits";
    budget_name = os.str();
  }
  // One cost dimension is priced: bytes for size budgets, weight bits for avg_bits.
  const size_t dim = bits_budget ? 1 : 0;
  std::vector<Group> priced = groups;
  for (Group& g : priced)
    for (Choice& c : g.choices) c.costs = {c.costs[dim]};
  const Assignment a = solve_knapsack(priced, {budget_value}, {budget_name});
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
  for (const LayerChoice& lc : res.layers) res.bytes += lc.candidates[lc.chosen].bytes;
  // Budget (bytes) vs predicted sensitivity over every budget.
  std::vector<Group> by_bytes = groups;
  for (Group& g : by_bytes)
    for (Choice& c : g.choices) c.costs = {c.costs[0]};
  for (const Assignment& p : pareto_front(by_bytes, {std::numeric_limits<double>::infinity()}))
    res.pareto.push_back(ParetoPoint{rest_bytes + static_cast<int64_t>(std::llround(p.costs[0])), p.value});
  for (size_t i = 0; i < res.layers.size(); ++i)
    res.rules.push_back(rule_for(base, layers[i].path, layers[i].cands[res.layers[i].chosen]));
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

Scheme apply(const Scheme& base, const SearchResult& result) {
  Scheme s = base;
  s.rules.insert(s.rules.begin(), result.rules.begin(), result.rules.end());
  return s;
}

}  // namespace qforge::search
