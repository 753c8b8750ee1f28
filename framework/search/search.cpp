// Mixed-precision search: the public entry points and the order of the phases (candidates.cpp,
// costs.cpp, sensitivity.cpp), then the knapsack over the measured costs and the rules written back.
#include "framework/search/search.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "framework/api/progress.h"
#include "framework/core/enum_names.h"
#include "framework/core/error.h"
#include "framework/api/quantize.h"
#include "framework/search/candidates.h"
#include "framework/search/costs.h"
#include "framework/search/knapsack.h"
#include "framework/search/sensitivity.h"

namespace qforge::search {

namespace {

constexpr NamedValue<Method> kMethodNames[] = {
    {Method::kHessian, "hessian"}, {Method::kLoss, "loss"}, {Method::kHistogram, "histogram"}};

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
  const SensitivityMethod& method = sensitivity_method(o.method);
  for (const Candidate& c : o.candidates)
    if (c.activations && !method.searches_activations())
      throw SearchError("search: activations are searched by the histogram method only (candidate '" + c.name() +
                        "'); hessian and loss price the weights");
  method.check(o, measuring);
  if (batches <= 0) throw SearchError("search: sensitivities need at least one calibration batch");
  if (!o.latency.time_kernels && !o.from_rank0)
    throw SearchError("search: latency.time_kernels = false needs from_rank0 (the latencies of the rank that times)");
}

// The KV cache's bytes at SearchOptions::kv_cache_context positions into res (nothing when 0).
void price_kv_cache(const torch::nn::Module& model, const SearchOptions& o, SearchResult& res) {
  if (o.kv_cache_context == 0) return;
  if (o.kv_cache_context < 0)
    throw SearchError("search: the KV cache's context length must be >= 0, got " + std::to_string(o.kv_cache_context));
  if (!o.budget.size_mb && !o.budget.size_ratio)
    throw SearchError("search: a context length prices the KV cache into size_mb or size_ratio; the budget (" +
                      o.budget.to_string() + ") has neither");
  const auto caches = kv_cache_models(model);
  if (caches.empty())
    throw SearchError("search: a context length prices a KV cache, and this model keeps none (GPT-2 and Llama do)");
  res.kv_cache_context = o.kv_cache_context;
  res.kv_cache_scheme = o.kv_cache.to_string();
  for (const auto& [path, m] : caches) {
    o.kv_cache.validate(m->kv_cache_head_dim(), "search: the priced KV cache of " + (path.empty() ? "the model" : path));
    res.kv_cache_bytes += m->kv_cache_bytes_per_token(o.kv_cache) * o.kv_cache_context;
    res.float_kv_cache_bytes += m->kv_cache_bytes_per_token(KvCacheScheme{}) * o.kv_cache_context;
  }
}

// Phase 2: the sensitivities, from an earlier search when its key matches, else measured.
Sensitivities sensitivities(const SensitivityContext& ctx, const Scheme& base, double loss0, SearchResult& res) {
  res.sensitivities.key = sensitivity_key(ctx.layers, base, ctx.batches, loss0, ctx.options);
  if (std::optional<Sensitivities> stored =
          reused_sensitivities(ctx.layers, ctx.options, res.sensitivities.key, &res.reuse_note)) {
    res.reused = true;
    return std::move(*stored);
  }
  const SensitivityMethod& method = sensitivity_method(ctx.options.method);
  std::optional<Progress> bar;
  SensitivityContext measuring = ctx;
  if (ctx.options.progress) measuring.progress = &bar.emplace("search: sensitivities", method.steps(ctx));
  Sensitivities measured = method.measure(measuring);
  res.hutchinson_probes = measured.hutchinson_probes;
  return measured;
}

// Phase 3: each searched layer's candidates with their exact bytes, bits, latency and
// sensitivity, into res.layers (and what was measured, into res.sensitivities).
void price_layers(const SensitivityContext& ctx, const Sensitivities& sens, const CalibrationInputs& inputs,
                  Pricer& pricer, SearchResult& res, const std::function<void()>& priced) {
  const SensitivityMethod& method = sensitivity_method(ctx.options.method);
  for (size_t i = 0; i < ctx.layers.size(); ++i) {
    const Searched& s = ctx.layers[i];
    LayerChoice lc;
    lc.path = s.path;
    lc.type = s.layer->layer_type();
    lc.weight_elements = float_weight_of(*s.layer).numel();
    lc.hessian_trace = sens.traces[i];
    const at::Tensor x = inputs.of(s.layer);
    if (x.defined()) lc.input_shape = x.sizes().vec();
    method.describe(lc, ctx);
    const Priced as_float = pricer.price(*s.layer, s.path, std::nullopt, "float", x);
    res.float_latency_ms += as_float.latency_ms;
    for (size_t c = 0; c < s.cands.size(); ++c) {
      CandidateCost cc;
      cc.candidate = s.cands[c].name();
      const Priced p = s.schemes[c] ? pricer.price(*s.layer, s.path, s.schemes[c], cc.candidate, x) : as_float;
      cc.bytes = p.bytes;
      cc.latency_ms = p.latency_ms;
      cc.kernel = p.kernel;
      cc.bits = static_cast<double>(s.cands[c].bits()) * static_cast<double>(lc.weight_elements);
      cc.sensitivity = sens.values[i][c];
      lc.candidates.push_back(cc);
    }
    res.sensitivities.traces[lc.path] = lc.hessian_trace;
    for (const CandidateCost& cc : lc.candidates) res.sensitivities.values[lc.path][cc.candidate] = cc.sensitivity;
    res.layers.push_back(std::move(lc));
    if (priced) priced();
  }
}

// Doubles travel as their bit patterns: exact, NaN and infinity included.
uint64_t bits_of(double v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
double double_of(const nlohmann::json& j) {
  const uint64_t b = j.get<uint64_t>();
  double v = 0;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

nlohmann::json table_of(const FixedCosts& fixed, const SearchResult& res) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerChoice& lc : res.layers) {
    nlohmann::json cands = nlohmann::json::array();
    for (const CandidateCost& cc : lc.candidates)
      cands.push_back({cc.candidate, cc.bytes, bits_of(cc.bits), bits_of(cc.sensitivity), bits_of(cc.latency_ms),
                       cc.kernel});
    layers.push_back({lc.path, bits_of(lc.hessian_trace), cands});
  }
  return {{"cpu", res.cpu},
          {"timed", res.latency_measured},
          {"cached", res.latency_cached},
          {"float_latency_ms", bits_of(res.float_latency_ms)},
          {"fixed", {fixed.quantizer_bytes, bits_of(fixed.latency_ms), bits_of(fixed.float_latency_ms)}},
          {"layers", layers}};
}

// Several processes: everything measured that shapes the choice becomes rank 0's (see
// SearchOptions::from_rank0), so every rank's knapsack solves the same problem.
void take_rank0_table(const SearchOptions& o, FixedCosts& fixed, SearchResult& res) {
  // Invalid UTF-8 (the CPU's name comes from /proc/cpuinfo) is replaced, never a throw on rank 0 alone.
  const nlohmann::json t = nlohmann::json::parse(o.from_rank0(
      [&] { return table_of(fixed, res).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }));
  const nlohmann::json& layers = t.at("layers");
  auto differ = [](const std::string& here, const std::string& there) {
    return SearchError("search: this rank searched " + here + " where rank 0 searched " + there +
                       " (every rank must run the same model, recipe and scheme)");
  };
  if (layers.size() != res.layers.size())
    throw differ(std::to_string(res.layers.size()) + " layers", std::to_string(layers.size()));
  for (size_t i = 0; i < res.layers.size(); ++i) {
    LayerChoice& lc = res.layers[i];
    const nlohmann::json& l = layers[i];
    if (l.at(0).get<std::string>() != lc.path) throw differ("layer " + lc.path, l.at(0).get<std::string>());
    const nlohmann::json& cands = l.at(2);
    if (cands.size() != lc.candidates.size())
      throw differ(std::to_string(lc.candidates.size()) + " candidates for " + lc.path, std::to_string(cands.size()));
    lc.hessian_trace = double_of(l.at(1));
    res.sensitivities.traces[lc.path] = lc.hessian_trace;
    for (size_t c = 0; c < lc.candidates.size(); ++c) {
      CandidateCost& cc = lc.candidates[c];
      const nlohmann::json& x = cands[c];
      if (x.at(0).get<std::string>() != cc.candidate)
        throw differ("'" + cc.candidate + "' on " + lc.path, "'" + x.at(0).get<std::string>() + "'");
      cc.bytes = x.at(1).get<int64_t>();
      cc.bits = double_of(x.at(2));
      cc.sensitivity = double_of(x.at(3));
      cc.latency_ms = double_of(x.at(4));
      cc.kernel = x.at(5).get<std::string>();
      res.sensitivities.values[lc.path][cc.candidate] = cc.sensitivity;
    }
  }
  res.cpu = t.at("cpu").get<std::string>();
  res.latency_measured = t.at("timed").get<int64_t>();
  res.latency_cached = t.at("cached").get<int64_t>();
  res.float_latency_ms = double_of(t.at("float_latency_ms"));
  fixed.quantizer_bytes = t.at("fixed").at(0).get<int64_t>();
  fixed.latency_ms = double_of(t.at("fixed").at(1));
  fixed.float_latency_ms = double_of(t.at("fixed").at(2));
}

// The knapsack's cost axes.
enum Axis : size_t { kBytes = 0, kBits = 1, kLatency = 2 };

// The knapsack's groups: one per layer, layers of one tie merged into the group of its first.
struct Groups {
  std::vector<Group> groups;
  std::vector<std::vector<size_t>> members;  // group -> layer indices
};

// The first tie with a pattern matching `path`, or -1.
int tie_of(const std::vector<std::vector<std::string>>& ties, const std::string& path) {
  for (size_t t = 0; t < ties.size(); ++t)
    for (const std::string& p : ties[t])
      if (pattern_matches(p, path)) return static_cast<int>(t);
  return -1;
}

// A tie group's choices: the candidates every member may take, costs and values summed.
std::vector<Choice> shared_choices(const std::vector<LayerChoice>& layers, const std::vector<size_t>& members) {
  std::vector<Choice> out;
  for (const CandidateCost& cc : layers[members[0]].candidates) {
    Choice ch{cc.candidate, {0.0, 0.0, 0.0}, 0.0};
    bool everywhere = true;
    for (size_t i : members) {
      const auto& cs = layers[i].candidates;
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
    if (everywhere) out.push_back(ch);
  }
  return out;
}

Groups group_layers(const std::vector<LayerChoice>& layers, const std::vector<std::vector<std::string>>& ties) {
  Groups out;
  std::map<int, size_t> group_of_tie;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int t = tie_of(ties, layers[i].path);
    if (t >= 0 && group_of_tie.count(t)) {
      out.members[group_of_tie[t]].push_back(i);
      continue;
    }
    if (t >= 0) group_of_tie[t] = out.groups.size();
    out.groups.push_back(Group{layers[i].path, {}});
    out.members.push_back({i});
  }
  for (size_t g = 0; g < out.groups.size(); ++g) {
    out.groups[g].choices = shared_choices(layers, out.members[g]);
    for (size_t k = 1; k < out.members[g].size(); ++k) out.groups[g].name += "+" + layers[out.members[g][k]].path;
  }
  return out;
}

// The budgets given, each as (axis, limit on the searched layers' sum, name for messages).
struct Limits {
  std::vector<size_t> axes;
  std::vector<double> limits;
  std::vector<std::string> names;
};

// What the searched layers may spend: the budgets less what the rest of the model costs.
struct Rest {
  int64_t bytes = 0;
  double latency_ms = 0;
  double weight_elements = 0;  // of the searched layers
};

Limits budget_limits(const Budget& b, const Rest& rest, const SearchResult& res) {
  Limits l;
  // A priced KV cache comes off the size budgets beside the unsearched layers.
  const double cache = static_cast<double>(res.kv_cache_bytes);
  const std::string less_cache =
      res.kv_cache_context > 0 ? " and the KV cache's " + format_bytes(cache) + " (" + res.kv_cache_scheme + " at " +
                                     std::to_string(res.kv_cache_context) + " positions)"
                               : "";
  if (b.size_mb) {
    l.axes.push_back(kBytes);
    l.limits.push_back(*b.size_mb * 1e6 - static_cast<double>(rest.bytes) - cache);
    l.names.push_back("size budget " + format_bytes(*b.size_mb * 1e6) + " less the unsearched layers' " +
                      format_bytes(static_cast<double>(rest.bytes)) + less_cache + " leaves bytes");
  } else if (b.size_ratio) {
    l.axes.push_back(kBytes);
    const double whole = *b.size_ratio * static_cast<double>(res.float_bytes + res.float_kv_cache_bytes);
    l.limits.push_back(whole - static_cast<double>(rest.bytes) - cache);
    std::ostringstream os;
    os << "size_ratio budget " << *b.size_ratio << " (" << format_bytes(whole)
       << (res.kv_cache_context > 0 ? " of the float model and a float32 cache" : "") << ") less the unsearched layers' "
       << format_bytes(static_cast<double>(rest.bytes)) << less_cache << " leaves bytes";
    l.names.push_back(os.str());
  }
  if (b.avg_bits) {
    l.axes.push_back(kBits);
    l.limits.push_back(*b.avg_bits * rest.weight_elements);
    std::ostringstream os;
    os << "avg_bits budget " << *b.avg_bits << " over " << static_cast<int64_t>(rest.weight_elements)
       << " weights leaves bits";
    l.names.push_back(os.str());
  }
  if (b.latency_ms) {
    l.axes.push_back(kLatency);
    l.limits.push_back(*b.latency_ms - rest.latency_ms);
    std::ostringstream os;
    os << "latency budget " << *b.latency_ms << " ms less the unsearched layers' " << rest.latency_ms
       << " ms (measured on " << res.cpu << ") leaves ms";
    l.names.push_back(os.str());
  }
  return l;
}

// The groups with only the cost axes in `keep`.
std::vector<Group> project(const std::vector<Group>& groups, const std::vector<size_t>& keep) {
  std::vector<Group> out = groups;
  for (Group& g : out)
    for (Choice& c : g.choices) {
      std::vector<double> costs;
      for (size_t a : keep) costs.push_back(c.costs[a]);
      c.costs = costs;
    }
  return out;
}

// One rule per searched layer for the picks, in model order.
std::vector<LayerRule> rules_of(const std::vector<int>& picks, const Groups& g, const std::vector<Searched>& layers,
                                const Scheme& base) {
  std::vector<LayerRule> rules(layers.size());
  for (size_t k = 0; k < g.groups.size(); ++k)
    for (size_t i : g.members[k]) {
      const std::string& name = g.groups[k].choices[picks[k]].name;
      for (const Candidate& c : layers[i].cands)
        if (c.name() == name) rules[i] = rule_for(base, layers[i].path, c);
    }
  return rules;
}

// Phase 4: the knapsack under every budget; the choice, its totals and rules into `res`.
Assignment choose(const Groups& g, const Limits& limits, const Rest& rest, const std::vector<Searched>& layers,
                  const Scheme& base, SearchResult& res) {
  Assignment a;
  try {
    a = solve_knapsack(project(g.groups, limits.axes), limits.limits, limits.names);
  } catch (const Error& e) {
    throw SearchError(e.what());
  }
  for (size_t k = 0; k < g.groups.size(); ++k) {
    const std::string& name = g.groups[k].choices[a.picks[k]].name;
    for (size_t i : g.members[k]) {
      auto& cs = res.layers[i].candidates;
      res.layers[i].chosen = static_cast<int>(
          std::find_if(cs.begin(), cs.end(), [&](const CandidateCost& x) { return x.candidate == name; }) - cs.begin());
    }
  }
  res.predicted = a.value;
  res.bytes = rest.bytes;
  res.latency_ms = rest.latency_ms;
  for (const LayerChoice& lc : res.layers) {
    res.bytes += lc.candidates[lc.chosen].bytes;
    res.latency_ms += lc.candidates[lc.chosen].latency_ms;
  }
  res.rules = rules_of(a.picks, g, layers, base);
  return a;
}

// Phase 5: the front over the first budget's axis (bytes unless only bits or latency are
// budgeted) against predicted sensitivity, over every budget on that axis.
void pareto_front_of(const Groups& g, const Limits& limits, const Assignment& chosen, const Rest& rest,
                     const std::vector<Searched>& layers, const Scheme& base, SearchResult& res) {
  const size_t front_axis = limits.axes.front() == kBits && limits.axes.size() == 1 ? kBytes : limits.axes.front();
  res.pareto_axis = front_axis == kLatency ? "latency_ms" : "bytes";
  for (const Assignment& p : pareto_front(project(g.groups, {front_axis}), {std::numeric_limits<double>::infinity()})) {
    ParetoPoint point{rest.bytes, rest.latency_ms, p.value, rules_of(p.picks, g, layers, base), std::nullopt,
                      p.picks == chosen.picks};
    for (size_t k = 0; k < g.groups.size(); ++k) {
      const Choice& c = g.groups[k].choices[p.picks[k]];
      point.bytes += static_cast<int64_t>(std::llround(c.costs[kBytes]));
      point.latency_ms += c.costs[kLatency];
    }
    res.pareto.push_back(std::move(point));
  }
}

// Everything outside the searched layers: float tensors, plus the quantizers the scheme gives
// the unsearched layers (e.g. LayerNorm outputs, MatMul operands), and their latency.
Rest rest_of(const std::vector<Searched>& layers, const FixedCosts& fixed, const SearchResult& res) {
  Rest rest;
  int64_t searched_float_bytes = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    rest.weight_elements += static_cast<double>(res.layers[i].weight_elements);
    searched_float_bytes += layers[i].float_bytes;
  }
  rest.bytes = res.float_bytes - searched_float_bytes + fixed.quantizer_bytes;
  rest.latency_ms = fixed.latency_ms;
  return rest;
}

}  // namespace

void check_search(torch::nn::Module& model, const Scheme& base, const SearchOptions& o) {
  check_options(o, 1, /*measuring=*/false);
  SearchResult priced;
  price_kv_cache(model, o, priced);
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
  price_kv_cache(model, o, res);

  Collected col = collect(model, base, o);
  res.skipped = col.skipped;
  const CalibrationInputs inputs = record_inputs(model, loss_of_batch);
  Pricer pricer(o.latency, &res.latency_measured);

  HistogramObservers observers;  // histogram method: input observers restored from the calibration once
  const SensitivityContext ctx{col.layers, batches, loss_of_batch, o, observers};
  const Sensitivities sens = sensitivities(ctx, base, inputs.loss0, res);
  std::optional<Progress> bar;
  if (o.progress) bar.emplace("search: pricing layers", static_cast<int64_t>(col.fixed.size() + col.layers.size()));
  const std::function<void()> priced = [&] {
    if (bar)
      bar->update(1, std::to_string(res.latency_measured) + " kernels timed, " +
                         std::to_string(pricer.cache().hits()) + " from the cache");
  };
  FixedCosts fixed = price_fixed(col.fixed, base, inputs, pricer, priced);
  price_layers(ctx, sens, inputs, pricer, res, priced);
  if (bar) bar->finish(std::to_string(res.latency_measured) + " kernels timed");
  res.latency_cached = pricer.cache().hits();
  res.latency_cache_warning = pricer.cache().save();
  if (o.from_rank0) take_rank0_table(o, fixed, res);

  const Rest rest = rest_of(col.layers, fixed, res);
  const Groups groups = group_layers(res.layers, o.ties);
  const Limits limits = budget_limits(o.budget, rest, res);
  const Assignment chosen = choose(groups, limits, rest, col.layers, base, res);
  res.float_latency_ms += fixed.float_latency_ms;
  pareto_front_of(groups, limits, chosen, rest, col.layers, base, res);
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
