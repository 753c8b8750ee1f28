// The options of qforge's training, search and solver APIs as a recipe sets them.
#include "framework/pipeline/recipe_options.h"

#include <algorithm>

namespace qforge::pipeline {

bool solves(const Recipe& r) {
  if (r.quantize && r.calibrate.imatrix) return true;  // the imatrix-weighted grid search
  if (!r.quantize || !r.ptq.enabled) return false;
  bool any = r.ptq.method != "rtn" || r.ptq.bias_correction;
  for (const auto& [pattern, m] : r.ptq.rules) any |= m != "rtn";
  return any;
}

train::TrainOptions train_options(const Recipe& r, const train::BatchSource& data, int64_t epochs, double lr,
                                  int64_t max_steps, const std::string& label, const std::atomic<bool>* cancel) {
  train::TrainOptions o;
  o.epochs = epochs;
  o.batch_size = r.data.batch_size;
  o.lr = lr;
  o.weight_decay = r.train.weight_decay;
  o.grad_clip = r.train.grad_clip;
  o.seed = r.seed;
  o.max_steps = max_steps;
  o.label = label;
  o.cancel = cancel;
  const int64_t per_epoch = (data.size() + o.batch_size - 1) / o.batch_size;
  const int64_t total = max_steps > 0 ? std::min(max_steps, per_epoch * epochs) : per_epoch * epochs;
  o.warmup_fraction = total > 0 ? std::min(0.5, static_cast<double>(r.train.warmup_steps) / total) : 0.0;
  return o;
}

search::SearchOptions search_options(const Recipe& r) {
  search::SearchOptions o;
  o.method = search::method_from_name(r.search.method);
  for (const std::string& name : r.search.candidates) {
    search::Candidate c;
    if (name != "float") {
      c.qtype = qtype_from_name(name);
      // 8-bit grids per output channel; 4- and 2-bit grids per group (per output channel when
      // group_size is 0), as the integer kernels take them.
      if (c.qtype->bits < 8 && c.qtype->is_integer() && r.search.group_size > 0) {
        c.granularity = Granularity::kPerGroup;
        c.group_size = r.search.group_size;
      }
      // mxfp4 / nvfp4 take their format's block whatever search.group_size says.
      if (c.qtype->is_microscaling()) {
        c.granularity = Granularity::kPerGroup;
        c.group_size = c.qtype->block_size;
      }
    }
    if (!c.qtype || r.search.activations.empty()) {
      o.candidates.push_back(c);
      continue;
    }
    // Each weight grid with each activation choice (float weights keep the layer float).
    for (const std::string& a : r.search.activations) {
      c.activations = a == "float" ? ActivationMode::kNone : ActivationMode::kStatic;
      o.candidates.push_back(c);
    }
  }
  if (r.search.size_mb > 0) o.budget.size_mb = r.search.size_mb;
  if (r.search.size_ratio > 0) o.budget.size_ratio = r.search.size_ratio;
  if (r.search.avg_bits > 0) o.budget.avg_bits = r.search.avg_bits;
  if (r.search.latency_ms > 0) o.budget.latency_ms = r.search.latency_ms;
  o.kv_cache_context = r.search.context_length;
  o.kv_cache = r.kv_cache;
  o.latency.cache_path = r.search.latency_cache == "off"  ? std::string()
                         : r.search.latency_cache.empty() ? search::default_latency_cache_path()
                                                          : r.search.latency_cache;
  for (const auto& [pattern, bits] : r.search.min_bits) o.min_bits.push_back({pattern, static_cast<int>(bits)});
  o.ties = r.search.ties;
  o.hutchinson.max_probes = r.search.probes;
  o.hutchinson.min_probes = std::min<int64_t>(8, r.search.probes);
  o.hutchinson.rel_tol = r.search.tolerance;
  o.hutchinson.seed = r.seed;
  return o;
}

ptq::SolveOptions solve_options(const Recipe& r) {
  ptq::SolveOptions o;
  o.rounding = ptq::rounding_from_name(r.ptq.method);
  for (const auto& [pattern, m] : r.ptq.rules) o.rules.push_back({pattern, ptq::rounding_from_name(m)});
  o.bias_correction = r.ptq.bias_correction;
  o.gptq.damp = r.ptq.damp;
  o.gptq.block_size = r.ptq.block_size;
  o.gptq.act_order = r.ptq.act_order;
  o.adaround.iterations = r.ptq.iterations;
  o.adaround.lr = r.ptq.lr;
  o.adaround.reg_weight = r.ptq.reg_weight;
  o.adaround.batch_rows = r.ptq.batch_rows;
  o.adaround.seed = r.seed;
  o.autoround.iterations = r.ptq.autoround_iterations;
  o.autoround.lr = r.ptq.autoround_lr;
  o.autoround.batch_size = r.ptq.autoround_batch_size;
  o.autoround.seed = r.seed;
  o.brecq.iterations = r.ptq.brecq_iterations;
  o.brecq.lr = r.ptq.brecq_lr;
  o.brecq.reg_weight = r.ptq.brecq_reg_weight;
  o.brecq.batch_size = r.ptq.brecq_batch_size;
  o.brecq.fisher = r.ptq.brecq_fisher;
  o.brecq.seed = r.seed;
  o.sample_rows = r.ptq.sample_rows;
  o.seed = r.seed;
  return o;
}

ptq::AwqOptions awq_options(const Recipe& r) {
  ptq::AwqOptions o;
  o.grid = r.ptq.awq_grid;
  o.clip = r.ptq.awq_clip;
  o.scales = ptq::parse_awq_scales(r.ptq.awq_scales);
  o.objective = ptq::parse_awq_objective(r.ptq.awq_objective);
  o.sample_rows = r.ptq.sample_rows;
  o.seed = r.seed;
  return o;
}

}  // namespace qforge::pipeline
