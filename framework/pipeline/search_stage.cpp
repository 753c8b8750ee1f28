// search: per-layer weight widths under the recipe's budget, before calibration; the front's
// points evaluated when asked, and recipe.searched.yaml written with the choice as rules.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "framework/dist/sync.h"
#include "framework/format/atomic_file.h"
#include "framework/io/calibration_io.h"
#include "framework/pipeline/recipe_checks.h"
#include "framework/pipeline/recipe_options.h"
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/api/quantize.h"
#include "framework/report/report_json.h"

namespace qforge::pipeline {

namespace fs = std::filesystem;

namespace {

// Removes every quantizer: the float model again (not for frozen models).
void detach_all(torch::nn::Module& model) {
  for_each_quantizable(model, [](const std::string&, QuantizableLayer& l) {
    if (l.quantized()) l.detach();
  });
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

// The sensitivities stored by an earlier search (search.sensitivities_from), when there are any.
std::optional<io::SearchSensitivities> stored_sensitivities(RunContext& ctx) {
  const std::string& from = ctx.recipe.search.sensitivities_from;
  std::optional<io::SearchSensitivities> stored;
  if (from.empty()) return stored;
  if (fs::exists(from)) {
    stored = io::load_search_sensitivities(from);
    if (!stored) ctx.note("search: " + from + " holds no sensitivities; measured");
  } else {
    ctx.note("search: " + from + " does not exist (yet); measured");
  }
  return stored;
}

// Measures (or reuses) the sensitivities and chooses the widths.
search::SearchResult measure(RunContext& ctx, const search::SearchOptions& so) {
  const Recipe& r = ctx.recipe;
  Task& t = ctx.task;
  const int64_t bs = r.data.batch_size;
  const int64_t batches = std::max<int64_t>(1, std::min(r.search.batches, t.train->size() / bs));
  auto loss_of_batch = [&](int64_t b) {
    const at::Tensor idx = at::arange(b * bs, std::min(t.train->size(), (b + 1) * bs), at::kLong);
    const train::Batch batch = t.train->get(idx);
    return train::cross_entropy(t.forward(batch), batch.target);
  };
  // The histogram method reads the base scheme's calibration histograms: one calibration pass,
  // then the model is float again for the search.
  io::CalibrationDump base_calibration;
  search::SearchOptions with_reuse = so;
  with_reuse.progress = true;  // bars on stderr: rank 0's reaches the terminal, the others' /dev/null
  if (so.method == search::Method::kHistogram) {
    quantize(*t.model, r.scheme);
    ctx.calibrate(r.scheme);
    base_calibration = io::calibration_dump(*t.model);
    detach_all(*t.model);
    with_reuse.calibration = &base_calibration;
  }
  const std::optional<io::SearchSensitivities> stored = stored_sensitivities(ctx);
  if (stored) with_reuse.reuse = &*stored;
  search::SearchResult sr = search::search(*t.model, r.scheme, batches, loss_of_batch, with_reuse);
  if (stored && !sr.reused) ctx.note("search: " + sr.reuse_note + "; measured");
  std::fprintf(stderr, "qtrain: search sensitivities %s\n",
               sr.reused ? ("reused from " + r.search.sensitivities_from).c_str() : "measured");
  return sr;
}

// Measured accuracy along the front: each point PTQ-calibrated and evaluated fake-quantized on
// the test split, then the model is float again.
void evaluate_front(RunContext& ctx, search::SearchResult& sr) {
  std::vector<size_t> points = spread(sr.pareto.size(), ctx.recipe.search.evaluate_front);
  if (!points.empty())
    for (size_t i = 0; i < sr.pareto.size(); ++i)
      if (sr.pareto[i].chosen && std::find(points.begin(), points.end(), i) == points.end()) {
        points.push_back(i);  // the chosen point too, when the front holds it
        std::sort(points.begin(), points.end());
      }
  Task& t = ctx.task;
  for (size_t i : points) {
    if (ctx.interrupted()) break;
    search::ParetoPoint& p = sr.pareto[i];
    const Scheme ps = search::apply(ctx.recipe.scheme, p.rules);
    quantize(*t.model, ps);
    ctx.calibrate(ps);
    const train::Metrics m = ctx.evaluate("front eval");
    detach_all(*t.model);
    p.accuracy = t.metric == "accuracy" ? m.accuracy : m.perplexity;
    std::fprintf(stderr, "qtrain: front point %zu/%zu: %lld bytes, predicted %.4g, %s %.4f\n", i + 1,
                 sr.pareto.size(), static_cast<long long>(p.bytes), p.predicted, t.metric.c_str(), *p.accuracy);
  }
}

class SearchStage : public Stage {
 public:
  const char* name() const override { return "search"; }
  bool applies(const Recipe& r) const override { return r.quantize && r.search.enabled; }

  void pass(RunContext& ctx) const override {
    if (!requested(ctx.options.stages) && calibrate_stage().requested(ctx.options.stages))
      ctx.note("search skipped by --stages: the recipe's scheme without per-layer widths was used");
  }

  void run(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    ctx.before_quantize();  // the search prices the layers freeze will see (BatchNorm folded)
    ctx.task.model->eval();
    search::SearchOptions so = search_options(r);
    check_search_recipe(*ctx.task.model, r, so);
    if (!ctx.world.single()) {
      // One decision for all ranks: rank 0 times the kernels, and its measured table is the one
      // every rank's knapsack solves; the others time nothing and leave the latency cache alone.
      so.from_rank0 = [w = &ctx.world](const std::function<std::string()>& table) {
        const std::string text = w->rank() == 0 ? table() : std::string();  // the others' tables are unused
        const std::vector<uint8_t> b = w->broadcast_bytes(std::vector<uint8_t>(text.begin(), text.end()), 0);
        return std::string(b.begin(), b.end());
      };
      if (ctx.world.rank() != 0) {
        so.latency.time_kernels = false;
        so.latency.cache_path.clear();
      }
    }
    search::SearchResult sr = measure(ctx, so);
    ctx.search_record = sr.sensitivities;
    ctx.scheme = search::apply(r.scheme, sr);
    ctx.recipe_text = resolved_with_rules(r, sr.rules);
    // Equal by construction (one table, one deterministic solve); checked, as a drifted rank
    // would otherwise calibrate another model and wait in a collective the others never issue.
    dist::check_agreement(ctx.world, "the search's choice (recipe.searched.yaml)", ctx.recipe_text);
    std::fprintf(stderr,
                 "qtrain: search chose %s for %zu layers: predicted %lld bytes (float %lld), %.3f ms of "
                 "layer kernels (float %.3f; %lld timed, %lld from the cache) in %.1fs\n",
                 search::to_string(sr.method), sr.layers.size(), static_cast<long long>(sr.bytes),
                 static_cast<long long>(sr.float_bytes), sr.latency_ms, sr.float_latency_ms,
                 static_cast<long long>(sr.latency_measured), static_cast<long long>(sr.latency_cached), sr.seconds);
    if (sr.kv_cache_context > 0)
      std::fprintf(stderr, "qtrain: search: the size budget included the KV cache at %lld positions (%s): %lld bytes "
                   "(float32 %lld)\n", static_cast<long long>(sr.kv_cache_context), sr.kv_cache_scheme.c_str(),
                   static_cast<long long>(sr.kv_cache_bytes), static_cast<long long>(sr.float_kv_cache_bytes));
    if (!sr.latency_cache_warning.empty()) {
      std::fprintf(stderr, "qtrain: warning: %s\n", sr.latency_cache_warning.c_str());
      ctx.note(sr.latency_cache_warning);
    }
    evaluate_front(ctx, sr);
    const std::string& metric = ctx.task.metric;
    ctx.report["search"] = report::search_json(sr, metric);
    ctx.report["search"]["sensitivities"] = sr.reused ? "reused from " + r.search.sensitivities_from : "measured";
    if (r.search.evaluate_front > 0) ctx.report["search"]["pareto_metric"] = metric + " of PTQ fake-quant on the test split";
    const fs::path searched = fs::path(ctx.options.out_dir) / "recipe.searched.yaml";
    ctx.report["exported"]["searched_recipe"] = ctx.save(searched.string(), [&](const std::string& p) {
      io::write_text_atomically(p, "# " + r.path + " with the search's choice as explicit rules (no search section)\n" +
                                       ctx.recipe_text);
    });
  }
};

}  // namespace

const Stage& search_stage() {
  static const SearchStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
