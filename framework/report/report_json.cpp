// report.json's sections, each built from the result of the step that measured it: activation
// ranges, loss curves, the numeric suite, the solvers, the search, the frozen layers, the ONNX file.
#include "framework/report/report_json.h"

#include <ATen/ATen.h>

#include "framework/api/quantize.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace qforge::report {

// The static activation points as report.html draws them: the observer's range, its histogram
// (merged down to at most kHistogramPlotBins bins) when it keeps one, the clip range the qparams
// cover and the grid step. A point with a scale per channel (per-head attention operands) gives
// one entry per channel, its point named "<point> (head c)", with "channel" and "axis".
constexpr int64_t kHistogramPlotBins = 128;
nlohmann::json activation_ranges_json(const io::CalibrationDump& dump) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [module, points] : dump)
    for (const auto& [point, e] : points) {
      if (point == "weight" || !e.qparams.scale.defined()) continue;
      const int64_t channels = e.qparams.scale.numel();
      const bool per_channel = e.spec.granularity == Granularity::kPerChannel;
      if (channels != 1 && !per_channel) continue;  // per-group activations: none are made
      const at::Tensor scales = e.qparams.scale.to(at::kDouble).reshape({-1});
      const at::Tensor zeros = e.qparams.zero_point.to(at::kDouble).reshape({-1});
      const auto mn = e.state.find("min"), mx = e.state.find("max"), h = e.state.find("histogram");
      for (int64_t c = 0; c < channels; ++c) {
        const double s = scales[c].item<double>(), z = zeros[c].item<double>();
        const QType& qt = e.spec.qtype;
        nlohmann::json j = {{"path", module},
                            {"point", per_channel ? point + " (head " + std::to_string(c) + ")" : point},
                            {"observer", e.observer_kind}, {"qtype", qt.name}, {"scale", s}, {"zero_point", z},
                            {"clip_min", qt.is_float() ? -qt.max_finite * s : (e.spec.quant_min() - z) * s},
                            {"clip_max", qt.is_float() ? qt.max_finite * s : (e.spec.quant_max() - z) * s}};
        if (per_channel) {
          j["channel"] = c;
          j["axis"] = e.spec.axis;
        }
        if (mn != e.state.end() && mx != e.state.end() && mn->second.numel() == channels) {
          j["min"] = mn->second.reshape({-1})[c].item<double>();
          j["max"] = mx->second.reshape({-1})[c].item<double>();
        }
        // One histogram (per tensor), or one row per channel.
        const at::Tensor hist_row = h == e.state.end()                                ? at::Tensor()
                                    : h->second.dim() == 1 && channels == 1            ? h->second
                                    : h->second.dim() == 2 && h->second.size(0) == channels ? h->second[c]
                                                                                        : at::Tensor();
        if (hist_row.defined() && j.contains("min")) {
          const int64_t bins = hist_row.size(0), merge = std::max<int64_t>(1, (bins + kHistogramPlotBins - 1) / kHistogramPlotBins);
          const at::Tensor counts = hist_row.to(at::kDouble);
          const double lo = j["min"].get<double>(), width = (j["max"].get<double>() - lo) / static_cast<double>(bins);
          nlohmann::json hist = nlohmann::json::array();
          for (int64_t b = 0; b < bins; b += merge) {
            const int64_t end = std::min(bins, b + merge);
            hist.push_back({{"x0", lo + width * static_cast<double>(b)}, {"x1", lo + width * static_cast<double>(end)},
                            {"count", counts.slice(0, b, end).sum().item<double>()}});
          }
          j["histogram"] = hist;
        }
        out.push_back(j);
      }
    }
  return out;
}

// A training run's loss per step for the report's curves: at most kCurvePoints points, each the
// mean of its span of steps ({"step": last step of the span, "loss": mean}).
constexpr int64_t kCurvePoints = 400;
nlohmann::json loss_curve(const train::TrainResult& tr) {
  nlohmann::json pts = nlohmann::json::array();
  const auto n = static_cast<int64_t>(tr.step_loss.size());
  const int64_t span = std::max<int64_t>(1, (n + kCurvePoints - 1) / kCurvePoints);
  for (int64_t i = 0; i < n; i += span) {
    const int64_t end = std::min(n, i + span);
    double sum = 0;
    for (int64_t j = i; j < end; ++j) sum += tr.step_loss[static_cast<size_t>(j)];
    pts.push_back({{"step", end}, {"loss", sum / static_cast<double>(end - i)}});
  }
  return pts;
}

// SQNR values: a number, "inf" when exact, null when not measured (the note says why).
nlohmann::json layer_errors_json(const std::vector<ptq::LayerError>& errors, int64_t batches) {
  auto num = [](double v) -> nlohmann::json {
    if (std::isnan(v)) return nullptr;
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return v;
  };
  nlohmann::json layers = nlohmann::json::array();
  for (const ptq::LayerError& e : errors)
    layers.push_back({{"path", e.path}, {"type", e.type}, {"weight_sqnr_db", num(e.weight_sqnr_db)},
                      {"own_sqnr_db", num(e.own_sqnr_db)}, {"own_relative_mse", num(e.own_relative_mse)},
                      {"accumulated_sqnr_db", num(e.accumulated_sqnr_db)},
                      {"accumulated_relative_mse", num(e.accumulated_relative_mse)},
                      {"clipped_fraction", num(e.clipped_fraction)}, {"nonfinite_inputs", e.nonfinite_inputs},
                      {"rows", e.rows}, {"note", e.note}});
  return {{"batches", batches}, {"order", "worst first"}, {"layers", layers}};
}

nlohmann::json solve_json(const ptq::SolveReport& sr) {
  nlohmann::json layers = nlohmann::json::array();
  for (const ptq::LayerSolve& l : sr.layers) {
    nlohmann::json j = {{"path", l.path}, {"type", l.type}, {"method", l.method}, {"note", l.note}};
    if (l.rows > 0) {
      j["error_before"] = l.error_before;
      j["error_after"] = l.error_after;
      j["rows"] = l.rows;
      j["seconds"] = l.seconds;
    }
    layers.push_back(j);
  }
  return {{"layers", layers}, {"passes", sr.passes}, {"seconds", sr.seconds},
          {"error", "relative output MSE of the layer on its calibration inputs, ||y_q - y_f||^2 / ||y_f||^2; "
                    "before: round-to-nearest weights, after: the method's"}};
}

// `metric`: the name of ParetoPoint::accuracy in the report (accuracy or perplexity).
nlohmann::json search_json(const search::SearchResult& sr, const std::string& metric) {
  nlohmann::json layers = nlohmann::json::array();
  for (const search::LayerChoice& l : sr.layers) {
    const search::CandidateCost& c = l.candidates[l.chosen];
    nlohmann::json options = nlohmann::json::array();
    for (const search::CandidateCost& o : l.candidates)
      options.push_back({{"qtype", o.candidate}, {"bytes", o.bytes}, {"sensitivity", o.sensitivity},
                         {"latency_ms", o.latency_ms}, {"kernel", o.kernel}});
    layers.push_back({{"path", l.path}, {"type", l.type}, {"qtype", c.candidate}, {"bytes", c.bytes},
                      {"sensitivity", c.sensitivity}, {"latency_ms", c.latency_ms}, {"kernel", c.kernel},
                      {"input_shape", l.input_shape}, {"hessian_trace", l.hessian_trace},
                      {"activation_error", l.activation_error}, {"candidates", options}});
  }
  nlohmann::json pareto = nlohmann::json::array();
  for (const search::ParetoPoint& p : sr.pareto) {
    nlohmann::json j = {{"bytes", p.bytes}, {"latency_ms", p.latency_ms}, {"predicted", p.predicted}};
    if (p.chosen) j["chosen"] = true;
    if (p.accuracy) j[metric] = *p.accuracy;
    pareto.push_back(j);
  }
  // The budget on the front's axes, as numbers (report.html draws it beside the front), for the
  // model alone: a priced KV cache's bytes come off it, as the search took them.
  nlohmann::json budget_bytes, budget_latency_ms;
  const double cache = static_cast<double>(sr.kv_cache_bytes);
  if (sr.budget.size_mb) budget_bytes = *sr.budget.size_mb * 1e6 - cache;
  else if (sr.budget.size_ratio)
    budget_bytes = *sr.budget.size_ratio * static_cast<double>(sr.float_bytes + sr.float_kv_cache_bytes) - cache;
  if (sr.budget.latency_ms) budget_latency_ms = *sr.budget.latency_ms;
  nlohmann::json kv_cache;  // null when the budget holds the model alone
  if (sr.kv_cache_context > 0)
    kv_cache = {{"context_length", sr.kv_cache_context}, {"scheme", sr.kv_cache_scheme}, {"bytes", sr.kv_cache_bytes},
                {"float_bytes", sr.float_kv_cache_bytes}};
  return {{"method", search::to_string(sr.method)}, {"budget", sr.budget.to_string()}, {"budget_bytes", budget_bytes},
          {"kv_cache", kv_cache},
          {"budget_latency_ms", budget_latency_ms}, {"bytes", sr.bytes},
          {"float_bytes", sr.float_bytes}, {"latency_ms", sr.latency_ms}, {"float_latency_ms", sr.float_latency_ms},
          {"latency_regime", "frozen layer forward, last-level cache evicted before each call, median of 7"},
          {"cpu", sr.cpu}, {"threads", at::get_num_threads()}, {"latency_measured", sr.latency_measured},
          {"latency_cached", sr.latency_cached}, {"predicted", sr.predicted}, {"seconds", sr.seconds},
          {"hutchinson_probes", sr.hutchinson_probes}, {"layers", layers}, {"pareto_axis", sr.pareto_axis},
          {"pareto", pareto}, {"skipped", sr.skipped}};
}

nlohmann::json layers_json(const torch::nn::Module& model) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerReport& l : layer_reports(model)) {
    if (l.weights == "float" && l.activations == "float") continue;
    layers.push_back({{"name", l.name}, {"type", l.type}, {"weights", l.weights}, {"activations", l.activations},
                      {"kernel", l.kernel}, {"fallback_reason", l.fallback_reason}, {"bytes", l.bytes}});
  }
  return layers;
}

nlohmann::json equalize_json(const ptq::EqualizeReport& er) {
  nlohmann::json pairs = nlohmann::json::array();
  for (const ptq::EqualizedPair& p : er.pairs)
    pairs.push_back({{"first", p.first}, {"second", p.second}, {"applied", p.applied}, {"reason", p.reason},
                     {"range_spread_before", p.range_spread_before}, {"range_spread_after", p.range_spread_after}});
  return {{"pairs", pairs}, {"seconds", er.seconds}};
}

nlohmann::json smoothquant_json(const ptq::SmoothReport& sr, double alpha) {
  nlohmann::json layers = nlohmann::json::array();
  for (const ptq::SmoothLayer& l : sr.layers)
    layers.push_back({{"path", l.path}, {"max_factor", l.max_factor}, {"min_factor", l.min_factor},
                      {"act_range_before", l.act_range_before}, {"act_range_after", l.act_range_after},
                      {"floored_channels", l.floored_channels}});
  return {{"alpha", alpha}, {"layers", layers}, {"skipped", sr.skipped}, {"warnings", sr.warnings},
          {"float_output_change", sr.output_change}, {"seconds", sr.seconds}};
}

// Paired by path, not index: a layer measured on one side only (the head rotate() unties) gets null
// on the other; the order is the model's after the rotation.
nlohmann::json rotate_json(const ptq::RotateReport& rr) {
  using Stats = ptq::ActivationStats;
  std::vector<std::string> paths;
  std::map<std::string, std::pair<const Stats*, const Stats*>> sides;  // before, after
  const auto add = [&](const std::vector<Stats>& side, bool is_after) {
    for (const Stats& s : side) {
      auto [it, fresh] = sides.try_emplace(s.path, nullptr, nullptr);
      if (fresh) paths.push_back(s.path);
      (is_after ? it->second.second : it->second.first) = &s;
    }
  };
  add(rr.after, true);
  add(rr.before, false);
  const auto field = [](const Stats* s, double Stats::*f) { return s ? nlohmann::json(s->*f) : nlohmann::json(); };
  nlohmann::json layers = nlohmann::json::array();
  for (const std::string& p : paths) {
    const auto [b, a] = sides.at(p);
    layers.push_back({{"path", p}, {"kurtosis_before", field(b, &Stats::kurtosis)},
                      {"kurtosis_after", field(a, &Stats::kurtosis)}, {"max_over_rms_before", field(b, &Stats::max_over_rms)},
                      {"max_over_rms_after", field(a, &Stats::max_over_rms)},
                      {"elements", (a ? a : b)->count}});
  }
  return {{"kind", rr.kind}, {"seed", rr.seed}, {"hidden_size", rr.hidden_size},
          {"residual_hadamard", {{"size", rr.hidden_size}, {"paley_order", rr.residual_base}}},
          {"online_down_proj", rr.online_down_proj},
          {"down_proj_hadamard", {{"size", rr.intermediate_size}, {"paley_order", rr.down_proj_base}}},
          {"online_qk", rr.online_qk}, {"qk_hadamard", {{"size", rr.head_dim}, {"paley_order", rr.head_base}}},
          {"notes", rr.notes}, {"layers", layers}, {"float_output_change", rr.output_change}, {"seconds", rr.seconds}};
}

nlohmann::json spinquant_json(const ptq::SpinQuantReport& sr) {
  return {{"steps", sr.steps},
          {"batches", sr.batches},
          {"values", sr.values},
          {"weights", sr.quantized_weights ? "quantized" : "float"},
          {"loss_before", sr.loss_before},
          {"loss_after", sr.loss_after},
          {"losses", sr.losses},
          {"r1_steps", sr.r1_steps},
          {"bounded_steps", sr.bounded_steps},
          {"float_loss_before", sr.float_loss_before},
          {"float_loss_after", sr.float_loss_after},
          {"orthogonality_error", sr.orthogonality_error},
          {"rotation_change", sr.rotation_change},
          {"value_rotation_change", sr.value_rotation_change},
          {"float_output_change", sr.float_output_change >= 0 ? nlohmann::json(sr.float_output_change) : nlohmann::json()},
          {"seconds", sr.seconds}};
}

nlohmann::json awq_json(const ptq::AwqReport& ar) {
  nlohmann::json groups = nlohmann::json::array();
  for (const ptq::AwqGroup& g : ar.groups)
    groups.push_back({{"layers", g.layers}, {"scale_home", g.scale_home}, {"objective", g.objective},
                      {"alpha", g.alpha}, {"duo", g.duo}, {"error_rtn", g.error_rtn}, {"error_scaled", g.error_scaled},
                      {"layer_error_scaled", g.layer_error_scaled}, {"error_clipped", g.error_clipped},
                      {"mean_clip", g.mean_clip}, {"rows", g.rows}, {"seconds", g.seconds}});
  return {{"groups", groups}, {"skipped", ar.skipped}, {"float_output_change", ar.output_change}, {"seconds", ar.seconds}};
}

nlohmann::json imatrix_round_json(const ptq::ImatrixRoundReport& ir) {
  nlohmann::json layers = nlohmann::json::array();
  for (const ptq::ImatrixRoundLayer& l : ir.layers)
    layers.push_back({{"path", l.path}, {"error_before", l.error_before}, {"error_after", l.error_after},
                      {"mean_clip", l.mean_clip}});
  return {{"layers", layers}, {"skipped", ir.skipped}, {"seconds", ir.seconds}};
}

nlohmann::json onnx_json(const onnx_export::ExportInfo& info) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : info.layers) layers.push_back({{"name", l.name}, {"type", l.type}, {"form", l.form}});
  return {{"model_type", info.model_type}, {"opset", info.opset}, {"inputs", info.inputs},
          {"outputs", info.outputs}, {"nodes", info.nodes}, {"quantize_linear", info.quantize_linear},
          {"dequantize_linear", info.dequantize_linear}, {"file_bytes", info.file_bytes}, {"layers", layers}};
}

}  // namespace qforge::report
