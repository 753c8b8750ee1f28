// qtrain's stages over the reference models and datasets.
#include "framework/recipe/pipeline.h"
#include "framework/recipe/report.h"
#include "framework/recipe/tasks.h"
#include "framework/search/search.h"
#include "framework/ptq/numeric_suite.h"
#include "framework/ptq/ptq.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "framework/dist/sync.h"
#include "framework/io/atomic_file.h"
#include "framework/io/calibration_io.h"
#include "framework/io/checkpoint.h"
#include "framework/io/model_io.h"
#include "framework/models/state_dict.h"
#include "framework/nn/batch_norm.h"
#include "framework/onnx/export.h"
#include "framework/quantize.h"
#include "framework/recipe/sha256.h"
#include "framework/train/batches.h"
#include "framework/train/trainer.h"

namespace qforge {

namespace fs = std::filesystem;

const std::vector<std::string>& pipeline_stages() {
  static const std::vector<std::string> kStages{"float", "search", "calibrate", "solve", "ptq", "qat", "freeze", "export"};
  return kStages;
}

bool solves(const Recipe& r) {
  if (!r.quantize || !r.ptq.enabled) return false;
  bool any = r.ptq.method != "rtn" || r.ptq.bias_correction;
  for (const auto& [pattern, m] : r.ptq.rules) any |= m != "rtn";
  return any;
}

void check_stages(const Recipe& r, const std::vector<std::string>& stages) {
  if (stages.empty() || !r.quantize) return;
  auto has = [&](const char* s) { return std::find(stages.begin(), stages.end(), s) != stages.end(); };
  const bool quantizes = has("calibrate") || has("ptq");
  for (const char* s : {"solve", "qat", "freeze"}) {
    const bool applies = std::string(s) == "qat" ? r.qat.epochs > 0 : std::string(s) == "solve" ? solves(r) : r.freeze.enabled;
    if (applies && has(s) && !quantizes)
      throw Error(std::string("--stages: '") + s + "' needs the model quantized and calibrated, which 'calibrate' does; "
                  "add calibrate (and ptq to evaluate it), or leave --stages out");
  }
}

std::vector<std::string> metric_stages_in_order(const std::map<std::string, std::map<std::string, double>>& metrics) {
  std::vector<std::string> out;
  for (const char* s : {"float", "ptq", "qat", "frozen"})
    if (metrics.count(s)) out.push_back(s);
  for (const auto& [s, m] : metrics)
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

namespace {

std::map<std::string, double> metric_map(const train::Metrics& m, const std::string& metric) {
  std::map<std::string, double> out{{"loss", m.loss}};
  if (metric == "accuracy") out["accuracy"] = m.accuracy;
  else out["perplexity"] = m.perplexity;
  return out;
}

// Everything that decides the float weights: architecture and config, data, training, seed
// (effective values, defaults included). A float checkpoint records it on its first line.
constexpr const char* kProvenancePrefix = "# qforge float provenance: ";

nlohmann::json float_provenance(const Recipe& r) {
  return {{"model.arch", r.model.arch},
          {"model.config", r.model.config},
          {"data.dataset", r.data.dataset},
          {"data.batch_size", r.data.batch_size},
          {"data.validation_size", r.data.validation_size},
          {"data.max_train_examples", r.data.max_train_examples},
          {"data.seq_len", r.data.seq_len},
          {"data.examples_per_language", r.data.examples_per_language},
          {"data.tokens", r.data.tokens},
          {"train.epochs", r.train.epochs},
          {"train.lr", r.train.lr},
          {"train.weight_decay", r.train.weight_decay},
          {"train.warmup_steps", r.train.warmup_steps},
          {"train.grad_clip", r.train.grad_clip},
          {"train.max_steps", r.train.max_steps},
          {"seed", r.seed}};
}

void save_float_checkpoint(torch::nn::Module& model, const std::string& path, const Recipe& r) {
  io::CheckpointData data;
  for (const auto& [k, v] : models::model_state(model)) data.parameters[k] = v;
  data.recipe = kProvenancePrefix + float_provenance(r).dump() + "\n" + r.resolved_yaml;
  fs::create_directories(fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path());
  io::save_checkpoint(path, data);
}

// Loads the float weights after checking the checkpoint was trained as this recipe would train
// them. Returns the report note; throws naming every setting that differs.
std::string load_float_checkpoint(torch::nn::Module& model, const std::string& path, const Recipe& r) {
  const io::CheckpointReader reader(path);
  std::string note = "float weights loaded from " + path;
  const std::string& text = reader.recipe();
  if (text.rfind(kProvenancePrefix, 0) != 0) {
    note += " (written without a provenance record: not checked against this recipe's model, data and training)";
  } else {
    const size_t eol = text.find('\n');
    nlohmann::json saved;
    try {
      saved = nlohmann::json::parse(text.substr(std::strlen(kProvenancePrefix), eol - std::strlen(kProvenancePrefix)));
    } catch (const std::exception& e) {
      throw Error("model.checkpoint " + path + ": unreadable provenance record (" + e.what() + ")");
    }
    const nlohmann::json want = float_provenance(r);
    std::string diffs;
    // Settings added after a checkpoint was written count as their value at the time.
    const std::map<std::string, nlohmann::json> added_later = {{"data.tokens", "chars"}};
    for (const auto& [k, v] : want.items()) {
      if (!saved.contains(k) && added_later.count(k)) saved[k] = added_later.at(k);
    }
    for (const auto& [k, v] : want.items())
      if (!saved.contains(k) || saved[k] != v)
        diffs += "\n  " + k + ": checkpoint " + (saved.contains(k) ? saved[k].dump() : std::string("(absent)")) +
                 ", this recipe " + v.dump();
    if (!diffs.empty())
      throw Error("model.checkpoint " + path + " holds float weights trained differently from what this recipe "
                  "would train:" + diffs + "\ndelete it to retrain, or point model.checkpoint at another file");
    note += " (model, data and training settings match)";
  }
  const io::CheckpointData data = reader.read(io::ReadOptions::parameters_only());
  models::LoadStateOptions o;
  o.source = path;
  models::load_model_state(model, data.parameters, o);
  return note;
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
  o.sample_rows = r.ptq.sample_rows;
  o.seed = r.seed;
  return o;
}

// An error about the recipe entry `index` of `sites` (a search candidate, a ptq rule) as a recipe
// error at that entry's file:line:column; rethrows the current exception when there is none.
[[noreturn]] void throw_at_site(const std::vector<RecipeIssue>& sites, int index, const char* what) {
  if (index < 0 || index >= static_cast<int>(sites.size())) throw;
  RecipeIssue issue = sites[static_cast<size_t>(index)];
  issue.message = what;
  throw RecipeError({issue});
}

// The solver plan's checks; a rule naming a method no matching layer can take is a recipe error
// at the rule's line.
std::vector<ptq::LayerSolve> check_solve_recipe(const torch::nn::Module& model, const Recipe& r) {
  try {
    return ptq::plan_solve(model, solve_options(r));
  } catch (const ptq::SolveError& e) {
    throw_at_site(r.ptq.rule_sites, e.rule(), e.what());
  }
}

// The static activation points as report.html draws them: the observer's range, its histogram
// (merged down to at most kHistogramPlotBins bins) when it keeps one, the clip range the qparams
// cover and the grid step.
constexpr int64_t kHistogramPlotBins = 128;
nlohmann::json activation_ranges_json(const io::CalibrationDump& dump) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [module, points] : dump)
    for (const auto& [point, e] : points) {
      if (point == "weight" || !e.qparams.scale.defined() || e.qparams.scale.numel() != 1) continue;
      const double s = e.qparams.scale.item<double>(), z = e.qparams.zero_point.item<double>();
      const QType& qt = e.spec.qtype;
      nlohmann::json j = {{"path", module}, {"point", point}, {"observer", e.observer_kind}, {"qtype", qt.name},
                          {"scale", s}, {"zero_point", z},
                          {"clip_min", qt.is_float() ? -qt.max_finite * s : (e.spec.quant_min() - z) * s},
                          {"clip_max", qt.is_float() ? qt.max_finite * s : (e.spec.quant_max() - z) * s}};
      const auto mn = e.state.find("min"), mx = e.state.find("max"), h = e.state.find("histogram");
      if (mn != e.state.end() && mx != e.state.end() && mn->second.numel() == 1) {
        j["min"] = mn->second.item<double>();
        j["max"] = mx->second.item<double>();
      }
      if (h != e.state.end() && h->second.dim() == 1 && j.contains("min")) {
        const int64_t bins = h->second.size(0), merge = std::max<int64_t>(1, (bins + kHistogramPlotBins - 1) / kHistogramPlotBins);
        const at::Tensor counts = h->second.to(at::kDouble);
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

// Calibration batches the numeric suite runs (twice: float, then quantized).
constexpr int64_t kLayerErrorBatches = 4;

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

io::LayerErrorTable layer_error_table(const std::vector<ptq::LayerError>& errors, int64_t batches) {
  io::LayerErrorTable t;
  t.batches = batches;
  for (const ptq::LayerError& e : errors)
    t.layers.push_back({e.path, e.type, e.note,
                        {{"weight_sqnr_db", e.weight_sqnr_db}, {"own_sqnr_db", e.own_sqnr_db},
                         {"own_relative_mse", e.own_relative_mse}, {"accumulated_sqnr_db", e.accumulated_sqnr_db},
                         {"accumulated_relative_mse", e.accumulated_relative_mse}, {"clipped_fraction", e.clipped_fraction},
                         {"nonfinite_inputs", static_cast<double>(e.nonfinite_inputs)}, {"rows", static_cast<double>(e.rows)}}});
  return t;
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
  return {{"method", search::to_string(sr.method)}, {"budget", sr.budget.to_string()}, {"bytes", sr.bytes},
          {"float_bytes", sr.float_bytes}, {"latency_ms", sr.latency_ms}, {"float_latency_ms", sr.float_latency_ms},
          {"latency_regime", "frozen layer forward, last-level cache evicted before each call, median of 7"},
          {"cpu", sr.cpu}, {"threads", at::get_num_threads()}, {"latency_measured", sr.latency_measured},
          {"latency_cached", sr.latency_cached}, {"predicted", sr.predicted}, {"seconds", sr.seconds},
          {"hutchinson_probes", sr.hutchinson_probes}, {"layers", layers}, {"pareto_axis", sr.pareto_axis},
          {"pareto", pareto}, {"skipped", sr.skipped}};
}

// The search's own checks, before anything is measured; a candidate no layer can take is a
// recipe error at the candidate's line.
void check_search_recipe(torch::nn::Module& model, const Recipe& r, const search::SearchOptions& so) {
  try {
    search::check_search(model, r.scheme, so);
  } catch (const search::SearchError& e) {
    throw_at_site(r.search.candidate_sites, e.candidate(), e.what());
  }
}

// Removes every quantizer: the float model again (not for frozen models).
void detach_all(torch::nn::Module& model) {
  for_each_quantizable(model, [](const std::string&, QuantizableLayer& l) {
    if (l.quantized()) l.detach();
  });
}

constexpr const char* kModelLatencyRegime =
    "whole-model forward on 1 test example, last-level cache evicted before each call, median of 21";

// The model's forward latency as kModelLatencyRegime says (no autograd, eval mode).
double model_latency_ms(const Task& t) {
  at::NoGradGuard no_grad;
  t.model->eval();
  const train::Batch one = t.test->get(at::zeros({1}, at::kLong));
  search::LatencyOptions o;
  o.repeats = 21;
  return search::time_ms([&] { t.forward(one); }, o);
}

// Up to `k` indices into a front of `n` points, spread evenly over it (both ends included).
std::vector<size_t> spread(size_t n, int64_t k) {
  std::vector<size_t> out;
  if (n == 0 || k <= 0) return out;
  if (static_cast<size_t>(k) >= n) {
    for (size_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (int64_t j = 0; j < k; ++j) {
    const size_t i = k == 1 ? n - 1 : static_cast<size_t>(std::llround(static_cast<double>(j) * (n - 1) / (k - 1)));
    if (out.empty() || out.back() != i) out.push_back(i);
  }
  return out;
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

}  // namespace

namespace {

// export.onnx's requirements, checked before the stages that take time: libonnx in the build, a
// frozen model, and (given a quantized model) a QDQ form for every layer's scheme.
void check_onnx_recipe(const Recipe& r, const torch::nn::Module* model) {
  onnx_export::require_available();
  QF_REQUIRE(!r.quantize || r.freeze.enabled, r.path, ": export.onnx writes the frozen model; set freeze.enabled: true (or export.onnx: false)");
  if (model) onnx_export::check_exportable(*model);
}

}  // namespace

PipelineResult run_pipeline(const Recipe& r, const PipelineOptions& opt) {
  const auto run_start = std::chrono::steady_clock::now();
  auto wanted = [&](const std::string& stage) {
    return opt.stages.empty() || std::find(opt.stages.begin(), opt.stages.end(), stage) != opt.stages.end();
  };
  auto interrupted = [&] { return opt.interrupted && opt.interrupted->load(); };
  at::manual_seed(r.seed);

  if (opt.dry_run) {
    Task t = make_task(r, /*with_data=*/false);
    std::printf("recipe %s (sha256 %s)\n", r.path.c_str(), r.sha256.c_str());
    std::printf("model %s, dataset %s, stages:", r.model.arch.c_str(), r.data.dataset.c_str());
    for (const auto& s : pipeline_stages()) {
      const bool applies = s == "float" || s == "export" || (r.quantize && (s == "calibrate" || s == "ptq")) ||
                           (s == "search" && r.search.enabled) || (s == "solve" && solves(r)) ||
                           (s == "qat" && r.qat.epochs > 0) || (s == "freeze" && r.quantize && r.freeze.enabled);
      if (applies && wanted(s)) std::printf(" %s", s.c_str());
    }
    std::printf("\n");
    if (!r.quantize) return {};
    if (t.before_quantize) t.before_quantize();
    if (r.search.enabled) {
      const search::SearchOptions so = search_options(r);
      std::string cands;
      for (const auto& c : so.candidates) cands += (cands.empty() ? "" : ", ") + c.name();
      std::printf("search: %s sensitivities on %lld calibration batches, budget %s, candidates %s;\n"
                  "the plan below is the scheme before the search assigns per-layer widths\n",
                  search::to_string(so.method), static_cast<long long>(r.search.batches), so.budget.to_string().c_str(),
                  cands.c_str());
      check_search_recipe(*t.model, r, so);
    }
    const QuantizeReport rep = quantize(*t.model, r.scheme);
    // Each layer's kernel plan: what freeze() will run on this machine (nothing is calibrated).
    const bool freezes = r.freeze.enabled && wanted("freeze");
    std::printf("\nplan (%zu quantized layers, %zu kept float; %s):\n%s", rep.quantized.size(), rep.kept_float.size(),
                freezes ? "kernels as freeze will choose them on this machine" : "fake-quant, not frozen",
                describe(*t.model, /*planned=*/freezes).c_str());
    for (const auto& w : rep.warnings) std::printf("warning: %s\n", w.c_str());
    if (r.export_.onnx) {
      check_onnx_recipe(r, t.model.get());
      std::printf("onnx: the frozen model is exportable as QDQ (opset 17)\n");
    }
    if (r.ptq.enabled) {
      std::printf("\nptq:%s%s\n", r.ptq.equalize ? " cross-layer equalisation before quantize;" : "",
                  r.ptq.smoothquant ? (" SmoothQuant (alpha " + std::to_string(r.ptq.alpha) + ") before calibration;").c_str() : "");
      for (const ptq::LayerSolve& l : check_solve_recipe(*t.model, r))
        std::printf("  %-40s %-10s %s%s\n", l.path.c_str(), l.type.c_str(), l.method.c_str(),
                    l.note.empty() ? "" : ("  (" + l.note + ")").c_str());
    }
    return {};
  }

  check_stages(r, opt.stages);
  const dist::World one_process;
  const dist::World& world = opt.world != nullptr ? *opt.world : one_process;
  QF_REQUIRE(world.single() || r.data.batch_size % world.size() == 0, r.path, ": data.batch_size ",
             r.data.batch_size, " does not split over ", world.size(),
             " ranks (each rank takes batch_size / world_size examples of every step)");
  // Float training and QAT on every rank: each rank's slice of the recipe's batch, gradients
  // averaged in buckets overlapping backward (dist::GradientAverager), replicas compared before
  // training and after every epoch, where rank 0's buffers (BatchNorm statistics, activation
  // scales) are broadcast first.
  auto settle_replicas = [&](torch::nn::Module& m, const std::string& when) {
    if (world.single()) return;
    dist::broadcast_buffers(m, world);
    dist::check_replicas(m, world, when);
  };
  auto data_parallel = [&](train::TrainOptions& o, torch::nn::Module& model) {
    if (world.single()) return;
    o.batch_size = r.data.batch_size / world.size();
    o.rank = world.rank();
    o.world_size = world.size();
    dist::check_replicas(model, world, "before " + o.label + " training");
    auto averager = std::make_shared<dist::GradientAverager>(model, world);
    o.after_backward = [averager](torch::nn::Module&) { averager->finish(); };
    o.after_epoch = [&settle_replicas, label = o.label](torch::nn::Module& m, int64_t epoch) {
      settle_replicas(m, "after " + label + " epoch " + std::to_string(epoch));
    };
  };
  if (!world.single()) {
    // Every rank must run the same recipe (overrides included), the same stages and, when the float
    // stage loads one, the same checkpoint bytes: a mismatch is refused here, on every rank.
    dist::check_agreement(world, "the resolved recipe (with its --set overrides)", r.resolved_yaml);
    std::string stages;
    for (const std::string& s : opt.stages) stages += (stages.empty() ? "" : ",") + s;
    dist::check_agreement(world, "--stages", stages.empty() ? "(all)" : stages);
    std::string ckpt = "(none)";
    if (!r.model.checkpoint.empty() && fs::exists(r.model.checkpoint)) {
      std::ifstream in(r.model.checkpoint, std::ios::binary);
      ckpt = "sha256 " + sha256_hex(std::string(std::istreambuf_iterator<char>(in), {}));
    }
    dist::check_agreement(world, "the float checkpoint " + r.model.checkpoint, ckpt);
  }
  // Evaluation batches dealt over the ranks, the metrics added up (train::EvalSplit).
  train::EvalSplit eval_split;
  if (!world.single()) {
    eval_split.rank = world.rank();
    eval_split.world_size = world.size();
    eval_split.all_reduce_sum = [&world](at::Tensor& t) { world.all_reduce(t, dist::Reduce::kSum); };
  }
  auto evaluate = [&](Task& t, const std::string& label) {
    return train::evaluate(*t.model, *t.test, t.forward, r.data.eval_batch_size, label, true, eval_split);
  };
  if (r.export_.onnx && wanted("export")) {
    // The recipe's scheme on a model built without data (as the dry run does): a layer with no QDQ
    // form fails here, before the float stage trains anything. The search may still change
    // per-layer widths; the check after quantize() covers those.
    check_onnx_recipe(r, nullptr);
    if (r.quantize) {
      // The probe's construction draws from the default generator; the run's float model must
      // start from the same weights with or without export.onnx.
      RngStateGuard rng;
      Task probe = make_task(r, /*with_data=*/false);
      if (probe.before_quantize) probe.before_quantize();
      quantize(*probe.model, r.scheme);
      check_onnx_recipe(r, probe.model.get());
    }
  }
  // Every file this run will write is checked before the first stage: a path that cannot be
  // written is found now, not after the float epochs.
  auto probe_writable = [](const fs::path& dir, const std::string& what) {
    std::error_code ec;
    fs::create_directories(dir.empty() ? fs::path(".") : dir, ec);
    const fs::path probe = (dir.empty() ? fs::path(".") : dir) / (".qtrain-write-probe-" + std::to_string(::getpid()));
    try {
      io::write_text_atomically(probe.string(), "");
    } catch (const std::exception& e) {
      throw Error(what + ": cannot write into " + (dir.empty() ? std::string(".") : dir.string()) + " (" +
                  (ec ? ec.message() : std::string(e.what())) + ")");
    }
    fs::remove(probe, ec);
  };
  probe_writable(fs::path(opt.out_dir), "--out");
  const bool trains_float = (opt.stages.empty() || std::find(opt.stages.begin(), opt.stages.end(), "float") != opt.stages.end()) &&
                            r.model.safetensors.empty() && !r.model.checkpoint.empty() && !fs::exists(r.model.checkpoint);
  if (trains_float) probe_writable(fs::path(r.model.checkpoint).parent_path(), "model.checkpoint " + r.model.checkpoint);
  PipelineResult result;
  fs::create_directories(opt.out_dir);
  // No reader may pair files of two runs: the previous run's outputs go before this run writes
  // anything (a run stopped midway leaves only its own files), and so do temporaries of killed
  // writers.
  std::vector<std::string> cleared;
  for (const char* name : {"report.json", "report.md", "recipe.resolved.yaml", "recipe.searched.yaml", "model.h5",
                           "calibration.h5", "model.safetensors", "model.onnx"}) {
    const fs::path p = fs::path(opt.out_dir) / name;
    std::error_code ec;
    if (!fs::exists(p) || fs::equivalent(p, r.model.checkpoint, ec) ||
        (!r.search.sensitivities_from.empty() && fs::equivalent(p, r.search.sensitivities_from, ec)))
      continue;
    if (fs::remove(p, ec)) cleared.push_back(name);
  }
  for (const std::string& t : io::remove_stale_temporaries(opt.out_dir)) cleared.push_back(t);
  io::write_text_atomically((fs::path(opt.out_dir) / "recipe.resolved.yaml").string(),
                            "# sha256: " + r.sha256 + "\n" + r.resolved_yaml);
  nlohmann::json report = {{"recipe", r.path}, {"recipe_sha256", r.sha256}, {"metrics", nlohmann::json::object()},
                           {"timings_s", nlohmann::json::object()}, {"size_bytes", nlohmann::json::object()},
                           {"latency_ms", {{"regime", kModelLatencyRegime}}},
                           {"exported", nlohmann::json::object()}, {"notes", nlohmann::json::array()}};
  if (!cleared.empty()) {
    std::string list;
    for (const std::string& c : cleared) list += (list.empty() ? "" : ", ") + c;
    report["notes"].push_back("removed from " + opt.out_dir + " before this run: " + list);
  }
  // A write that fails after the start-up checks (a full disk, a directory made read-only) goes to
  // a fallback path instead of losing the run's work; stderr and the report's notes say where.
  auto save = [&](const std::string& path, const std::function<void(const std::string&)>& write) {
    std::string reason;
    const std::string written = io::write_with_fallback(path, write, &reason);
    if (written != path) {
      const std::string note = "could not write " + path + " (" + reason + "); saved to " + written + " instead";
      auto& notes = report["notes"];
      if (std::find(notes.begin(), notes.end(), note) == notes.end()) {
        std::fprintf(stderr, "qtrain: %s\n", note.c_str());
        notes.push_back(note);
      }
    }
    return written;
  };
  auto write_report = [&]() {
    report["completed_stages"] = result.completed;
    report["interrupted"] = result.interrupted;
    report["timings_s"]["total"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    result.headline = headline_text(report);
    save(opt.out_dir, [&](const std::string& dir) {
      fs::create_directories(dir);
      result.report_path = write_report_files(report, r, dir);
    });
  };
  auto run_stage = [&](const std::string& name, const std::function<void()>& body) {
    if (interrupted()) {
      result.interrupted = true;
      return false;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::fprintf(stderr, "qtrain: stage %s\n", name.c_str());
    try {
      body();
    } catch (const StageError&) {
      throw;
    } catch (const std::exception& e) {
      write_report();
      throw StageError(name, e.what());
    }
    report["timings_s"][name] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (interrupted()) {
      result.interrupted = true;
      write_report();
      return false;
    }
    result.completed.push_back(name);
    write_report();
    return true;
  };
  auto record = [&](const std::string& stage, const train::Metrics& m, const Task& t) {
    result.metrics[stage] = metric_map(m, t.metric);
    report["metrics"][stage] = result.metrics[stage];
    std::fprintf(stderr, "qtrain: %s %s %.4f (loss %.4f)\n", stage.c_str(), t.metric.c_str(),
                 result.metrics[stage][t.metric], m.loss);
  };

  Task t;
  if (!run_stage("data", [&] { t = make_task(r, /*with_data=*/true); })) return result;
  report["metric"] = t.metric;
  report["distributed"] = {{"world_size", world.size()},
                           {"backend", world.single() ? "none" : r.distributed.backend},
                           {"sync_batchnorm", !world.single() && r.distributed.sync_batchnorm}};
  report["eval_examples"] = t.test->size();
  report["baselines"] = t.baselines;

  run_stage("float", [&] {
    const std::string ckpt = r.model.checkpoint;
    if (!ckpt.empty() && fs::exists(ckpt)) {
      report["notes"].push_back(load_float_checkpoint(*t.model, ckpt, r));
    } else if (!r.model.safetensors.empty()) {
      t.import_safetensors(r.model.safetensors);
      report["notes"].push_back("float weights imported from " + r.model.safetensors);
    } else {
      auto o = train_options(r, *t.train, r.train.epochs, r.train.lr, r.train.max_steps, "float", opt.interrupted);
      data_parallel(o, *t.model);
      // SyncBatchNorm when the recipe asks: BatchNorm statistics over every rank's batch.
      std::optional<nn::SyncBatchNormScope> sync_bn;
      if (!world.single() && r.distributed.sync_batchnorm)
        sync_bn.emplace([&world](at::Tensor& x) { world.all_reduce(x, dist::Reduce::kSum); });
      report["loss_curves"]["float"] = loss_curve(train::fit(*t.model, *t.train, t.forward, o));
      sync_bn.reset();
      if (interrupted()) return;  // a half-trained model is neither saved nor evaluated
      settle_replicas(*t.model, "after float training");
      if (!ckpt.empty() && world.rank() == 0) {
        const std::string written = save(ckpt, [&](const std::string& p) { save_float_checkpoint(*t.model, p, r); });
        report["notes"].push_back("float weights trained and saved to " + written);
      }
      world.barrier();  // the other ranks wait until rank 0's checkpoint is complete
    }
    const train::Metrics m = evaluate(t, "float eval");
    record("float", m, t);
    if (m.confusion.defined() && !t.class_names.empty())
      report["float_confusion"] = train::format_confusion(m.confusion, t.class_names);
    report["size_bytes"]["float"] = model_size(*t.model).total_bytes;
    report["latency_ms"]["float"] = model_latency_ms(t);
  });
  if (!r.quantize) {
    write_report();
    return result;
  }

  Scheme scheme = r.scheme;  // with the search's per-layer rules once it has run
  bool folded = false;
  auto before_quantize = [&] {
    if (t.before_quantize && !folded) t.before_quantize();
    folded = true;
  };
  std::optional<io::SearchSensitivities> search_record;  // kept in the calibration dump
  std::optional<io::LayerErrorTable> error_record;       // likewise
  std::string recipe_text = r.resolved_yaml;  // what the checkpoint records (the searched recipe once it ran)
  if (r.search.enabled && !wanted("search") && (wanted("calibrate") || wanted("ptq")))
    report["notes"].push_back("search skipped by --stages: the recipe's scheme without per-layer widths was used");
  // Calibrates the quantized model on the recipe's calibration batches (static activations only).
  // The calibration examples: the first n training examples, in batches of data.batch_size.
  const int64_t calib_n = std::min(t.train->size(), r.calibrate.samples > 0 ? r.calibrate.samples
                                                                           : r.calibrate.batches * r.data.batch_size);
  const int64_t calib_batches = (calib_n + r.data.batch_size - 1) / r.data.batch_size;
  auto calibration_batch = [&](int64_t b) {
    const at::Tensor idx = at::arange(b * r.data.batch_size, std::min(calib_n, (b + 1) * r.data.batch_size), at::kLong);
    return t.forward(t.train->get(idx));
  };
  auto calibrate = [&](const Scheme& sc) {
    if (sc.activations != ActivationMode::kStatic) return;
    t.model->eval();
    Calibration calib(*t.model);
    report["calibration_examples"] = calib_n;
    // Several ranks: batch b on rank b % world_size, then every observer merged over the ranks.
    for (int64_t b = world.rank(); b < calib_batches; b += world.size()) calibration_batch(b);
    dist::sync_observers(*t.model, world);
    calib.finish();
  };
  const int64_t solve_batches = r.ptq.batches > 0 ? std::min(r.ptq.batches, calib_batches) : calib_batches;
  if (r.search.enabled && wanted("search")) {
    run_stage("search", [&] {
      before_quantize();  // the search prices the layers freeze will see (BatchNorm folded)
      t.model->eval();
      const search::SearchOptions so = search_options(r);
      check_search_recipe(*t.model, r, so);
      const int64_t bs = r.data.batch_size;
      const int64_t batches = std::max<int64_t>(1, std::min(r.search.batches, t.train->size() / bs));
      auto loss_of_batch = [&](int64_t b) {
        const at::Tensor idx = at::arange(b * bs, std::min(t.train->size(), (b + 1) * bs), at::kLong);
        const train::Batch batch = t.train->get(idx);
        return train::cross_entropy(t.forward(batch), batch.target);
      };
      // The histogram method reads the base scheme's calibration histograms: one calibration
      // pass, then the model is float again for the search.
      io::CalibrationDump base_calibration;
      if (so.method == search::Method::kHistogram) {
        quantize(*t.model, r.scheme);
        calibrate(r.scheme);
        base_calibration = io::calibration_dump(*t.model);
        detach_all(*t.model);
      }
      std::optional<io::SearchSensitivities> stored;
      search::SearchOptions with_reuse = so;
      if (so.method == search::Method::kHistogram) with_reuse.calibration = &base_calibration;
      if (!r.search.sensitivities_from.empty()) {
        if (fs::exists(r.search.sensitivities_from)) {
          stored = io::load_search_sensitivities(r.search.sensitivities_from);
          if (!stored) report["notes"].push_back("search: " + r.search.sensitivities_from + " holds no sensitivities; measured");
        } else {
          report["notes"].push_back("search: " + r.search.sensitivities_from + " does not exist (yet); measured");
        }
        if (stored) with_reuse.reuse = &*stored;
      }
      search::SearchResult sr = search::search(*t.model, r.scheme, batches, loss_of_batch, with_reuse);
      search_record = sr.sensitivities;
      if (stored && !sr.reused) report["notes"].push_back("search: " + sr.reuse_note + "; measured");
      std::fprintf(stderr, "qtrain: search sensitivities %s\n",
                   sr.reused ? ("reused from " + r.search.sensitivities_from).c_str() : "measured");
      scheme = search::apply(r.scheme, sr);
      std::fprintf(stderr,
                   "qtrain: search chose %s for %zu layers: predicted %lld bytes (float %lld), %.3f ms of "
                   "layer kernels (float %.3f; %lld timed, %lld from the cache) in %.1fs\n",
                   search::to_string(sr.method), sr.layers.size(), static_cast<long long>(sr.bytes),
                   static_cast<long long>(sr.float_bytes), sr.latency_ms, sr.float_latency_ms,
                   static_cast<long long>(sr.latency_measured), static_cast<long long>(sr.latency_cached), sr.seconds);
      // Measured accuracy along the front: each point PTQ-calibrated and evaluated fake-quantized
      // on the test split, then the model is float again.
      std::vector<size_t> points = spread(sr.pareto.size(), r.search.evaluate_front);
      if (!points.empty())
        for (size_t i = 0; i < sr.pareto.size(); ++i)
          if (sr.pareto[i].chosen && std::find(points.begin(), points.end(), i) == points.end()) {
            points.push_back(i);  // the chosen point too, when the front holds it
            std::sort(points.begin(), points.end());
          }
      for (size_t i : points) {
        if (interrupted()) break;
        search::ParetoPoint& p = sr.pareto[i];
        const Scheme ps = search::apply(r.scheme, p.rules);
        quantize(*t.model, ps);
        calibrate(ps);
        const train::Metrics m = evaluate(t, "front eval");
        detach_all(*t.model);
        p.accuracy = t.metric == "accuracy" ? m.accuracy : m.perplexity;
        std::fprintf(stderr, "qtrain: front point %zu/%zu: %lld bytes, predicted %.4g, %s %.4f\n", i + 1,
                     sr.pareto.size(), static_cast<long long>(p.bytes), p.predicted, t.metric.c_str(), *p.accuracy);
      }
      report["search"] = search_json(sr, t.metric);
      report["search"]["sensitivities"] = sr.reused ? "reused from " + r.search.sensitivities_from : "measured";
      if (r.search.evaluate_front > 0)
        report["search"]["pareto_metric"] = t.metric + " of PTQ fake-quant on the test split";
      const fs::path searched = fs::path(opt.out_dir) / "recipe.searched.yaml";
      recipe_text = resolved_with_rules(r, sr.rules);
      report["exported"]["searched_recipe"] = save(searched.string(), [&](const std::string& p) {
        io::write_text_atomically(
            p, "# " + r.path + " with the search's choice as explicit rules (no search section)\n" + recipe_text);
      });
    });
  }
  if (wanted("calibrate") || wanted("ptq")) {
    run_stage("calibrate", [&] {
      before_quantize();
      t.model->eval();
      if (r.ptq.enabled && r.ptq.equalize) {
        const ptq::EqualizeReport er = ptq::equalize(*t.model, calibration_batch);
        nlohmann::json pairs = nlohmann::json::array();
        int applied = 0;
        for (const ptq::EqualizedPair& p : er.pairs) {
          applied += p.applied;
          pairs.push_back({{"first", p.first}, {"second", p.second}, {"applied", p.applied}, {"reason", p.reason},
                           {"range_spread_before", p.range_spread_before}, {"range_spread_after", p.range_spread_after}});
        }
        report["ptq"]["equalize"] = {{"pairs", pairs}, {"seconds", er.seconds}};
        report["timings_s"]["equalize"] = er.seconds;
        std::fprintf(stderr, "qtrain: cross-layer equalisation: %d of %zu layer pairs equalised in %.1fs\n", applied,
                     er.pairs.size(), er.seconds);
      }
      const QuantizeReport q = quantize(*t.model, scheme);
      for (const auto& w : q.warnings) report["notes"].push_back("quantize: " + w);
      // A scheme (or searched width) with no QDQ form fails here, not after training.
      if (r.export_.onnx && wanted("export")) check_onnx_recipe(r, t.model.get());
      if (solves(r)) check_solve_recipe(*t.model, r);  // before the calibration pass, not after it
      if (r.ptq.enabled && r.ptq.smoothquant) {
        const ptq::SmoothReport sr = ptq::smooth_quant(*t.model, solve_batches, calibration_batch, {r.ptq.alpha});
        nlohmann::json layers = nlohmann::json::array();
        for (const ptq::SmoothLayer& l : sr.layers)
          layers.push_back({{"path", l.path}, {"max_factor", l.max_factor}, {"min_factor", l.min_factor},
                            {"act_range_before", l.act_range_before}, {"act_range_after", l.act_range_after}});
        report["ptq"]["smoothquant"] = {{"alpha", r.ptq.alpha}, {"layers", layers}, {"skipped", sr.skipped},
                                        {"float_output_change", sr.output_change}, {"seconds", sr.seconds}};
        report["timings_s"]["smoothquant"] = sr.seconds;
        std::fprintf(stderr, "qtrain: SmoothQuant (alpha %.2f): %zu layers smoothed, float output moved %.2g, %.1fs\n",
                     r.ptq.alpha, sr.layers.size(), sr.output_change, sr.seconds);
      }
      calibrate(scheme);
    });
    if (solves(r) && wanted("solve")) {
      run_stage("solve", [&] {
        const ptq::SolveReport sr = ptq::solve(*t.model, solve_batches, calibration_batch, solve_options(r));
        report["ptq"]["solve"] = solve_json(sr);
        report["ptq"]["solve"]["method"] = r.ptq.method;
        report["ptq"]["solve"]["bias_correction"] = r.ptq.bias_correction;
        report["ptq"]["solve"]["batches"] = solve_batches;
        int64_t solved = 0;
        for (const ptq::LayerSolve& l : sr.layers) solved += l.rows > 0;
        std::fprintf(stderr, "qtrain: solve: %lld layers (%s%s) in %lld passes, %.1fs\n", static_cast<long long>(solved),
                     r.ptq.method.c_str(), r.ptq.bias_correction ? " + bias correction" : "",
                     static_cast<long long>(sr.passes), sr.seconds);
      });
    } else if (solves(r)) {
      report["notes"].push_back("ptq solve skipped by --stages: weights are round-to-nearest");
    }
    run_stage("ptq", [&] { record("ptq", evaluate(t, "ptq eval"), t); });
  }
  if (r.qat.epochs > 0 && wanted("qat")) {
    run_stage("qat", [&] {
      QatController qat(*t.model, QatOptions{r.qat.freeze_observers_after, r.qat.freeze_bn_after});
      qat.begin_epoch();
      auto o = train_options(r, *t.train, r.qat.epochs, r.qat.lr, r.qat.max_steps, "qat", opt.interrupted);
      o.on_step = [&qat](int64_t) { qat.step(); };
      data_parallel(o, *t.model);
      report["loss_curves"]["qat"] = loss_curve(train::fit(*t.model, *t.train, t.forward, o));
      if (interrupted()) return;
      settle_replicas(*t.model, "after QAT");
      record("qat", evaluate(t, "qat eval"), t);
    });
  }
  // The numeric suite on the fake-quant model as freeze will pack it (after QAT when it ran).
  auto completed = [&](const char* stage) {
    return std::find(result.completed.begin(), result.completed.end(), stage) != result.completed.end();
  };
  if (completed("ptq") || completed("qat")) {
    run_stage("layer_errors", [&] {
      bool any = false;
      for_each_quantizable(*t.model, [&](const std::string&, QuantizableLayer& l) { any = any || (l.quantized() && !l.frozen()); });
      if (!any) return;
      const int64_t batches = std::min<int64_t>(calib_batches, kLayerErrorBatches);
      const std::vector<ptq::LayerError> errors = ptq::worst_first(ptq::layer_errors(*t.model, batches, calibration_batch));
      report["layer_errors"] = layer_errors_json(errors, batches);
      error_record = layer_error_table(errors, batches);
      report["activations"] = activation_ranges_json(io::calibration_dump(*t.model));
    });
  }
  if (r.freeze.enabled && wanted("freeze")) {
    run_stage("freeze", [&] {
      const auto f0 = std::chrono::steady_clock::now();
      freeze(*t.model);
      // The stage's time includes the frozen evaluation; packing alone is reported beside it.
      report["timings_s"]["freeze_pack"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count();
      record("frozen", evaluate(t, "frozen eval"), t);
      report["size_bytes"]["frozen"] = model_size(*t.model).total_bytes;
      report["latency_ms"]["frozen"] = model_latency_ms(t);
    });
  }
  report["layers"] = layers_json(*t.model);
  if (wanted("export")) {
    run_stage("export", [&] {
      const fs::path dir(opt.out_dir);
      if (r.export_.calibration_dump && (r.scheme.activations == ActivationMode::kStatic || search_record || error_record)) {
        // Written from the model's quantizers (observer state and qparams); after QAT/freeze the
        // observers still hold their calibration statistics. The search's sensitivities go in
        // the same file (search.sensitivities_from reads them back).
        report["exported"]["calibration_dump"] = save((dir / "calibration.h5").string(), [&](const std::string& p) {
          io::save_calibration(*t.model, p, search_record ? &*search_record : nullptr, error_record ? &*error_record : nullptr);
        });
      }
      nlohmann::json not_exported = nlohmann::json::object();
      if (!report["exported"].contains("calibration_dump"))
        not_exported["calibration.h5"] = r.export_.calibration_dump
                                             ? "no static activations were calibrated, no search and no numeric suite ran (nothing to dump)"
                                             : "export.calibration_dump is false";
      if (!r.export_.checkpoint) not_exported["model.h5"] = "export.checkpoint is false";
      if (!r.export_.safetensors) not_exported["model.safetensors"] = "export.safetensors is false";
      if (!r.export_.onnx) not_exported["model.onnx"] = "export.onnx is false";
      report["not_exported"] = not_exported;
      if (r.export_.checkpoint) {
        io::SaveOptions so;
        so.recipe = recipe_text;
        report["exported"]["checkpoint"] =
            save((dir / "model.h5").string(), [&](const std::string& p) { io::save_model(*t.model, p, so); });
      }
      if (r.export_.safetensors)
        report["exported"]["safetensors"] = save((dir / "model.safetensors").string(), [&](const std::string& p) {
          io::export_safetensors(*t.model, p);
        });
      if (r.export_.onnx) {
        onnx_export::ExportInfo info;
        report["exported"]["onnx"] = save((dir / "model.onnx").string(), [&](const std::string& p) {
          info = onnx_export::export_onnx(*t.model, p);
        });
        nlohmann::json layers = nlohmann::json::array();
        for (const auto& l : info.layers) layers.push_back({{"name", l.name}, {"type", l.type}, {"form", l.form}});
        report["onnx"] = {{"model_type", info.model_type}, {"opset", info.opset}, {"inputs", info.inputs},
                          {"outputs", info.outputs}, {"nodes", info.nodes}, {"quantize_linear", info.quantize_linear},
                          {"dequantize_linear", info.dequantize_linear}, {"file_bytes", info.file_bytes}, {"layers", layers}};
        std::fprintf(stderr, "qtrain: model.onnx: %s, opset %lld, %lld nodes (%lld QuantizeLinear, %lld DequantizeLinear), %.2f MB\n",
                     info.model_type.c_str(), static_cast<long long>(info.opset), static_cast<long long>(info.nodes),
                     static_cast<long long>(info.quantize_linear), static_cast<long long>(info.dequantize_linear),
                     info.file_bytes / 1e6);
      }
    });
  }
  write_report();
  return result;
}

}  // namespace qforge
