// calibrate: quantizes the model with the (searched) scheme and calibrates its static
// activations; cross-layer equalisation before quantize and SmoothQuant before calibration when
// the recipe asks.
#include <cstdio>

#include "framework/pipeline/recipe_checks.h"
#include "framework/pipeline/recipe_options.h"
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/api/quantize.h"
#include "framework/report/report_json.h"

namespace qforge::pipeline {

namespace {

void equalize(RunContext& ctx) {
  const ptq::EqualizeReport er = ptq::equalize(*ctx.task.model, [&ctx](int64_t b) { return ctx.calibration_batch(b); });
  int applied = 0;
  for (const ptq::EqualizedPair& p : er.pairs) applied += p.applied;
  ctx.report["ptq"]["equalize"] = report::equalize_json(er);
  ctx.report["timings_s"]["equalize"] = er.seconds;
  std::fprintf(stderr, "qtrain: cross-layer equalisation: %d of %zu layer pairs equalised in %.1fs\n", applied,
               er.pairs.size(), er.seconds);
}

void smooth(RunContext& ctx) {
  const double alpha = ctx.recipe.ptq.alpha;
  const ptq::SmoothReport sr = ptq::smooth_quant(*ctx.task.model, ctx.solve_batches(),
                                                 [&ctx](int64_t b) { return ctx.calibration_batch(b); }, {alpha});
  ctx.report["ptq"]["smoothquant"] = report::smoothquant_json(sr, alpha);
  ctx.report["timings_s"]["smoothquant"] = sr.seconds;
  std::fprintf(stderr, "qtrain: SmoothQuant (alpha %.2f): %zu layers smoothed, float output moved %.2g, %.1fs\n",
               alpha, sr.layers.size(), sr.output_change, sr.seconds);
  for (const std::string& w : sr.warnings) {
    std::fprintf(stderr, "qtrain: warning: %s\n", w.c_str());
    ctx.note(w);
  }
}

class CalibrateStage : public Stage {
 public:
  const char* name() const override { return "calibrate"; }
  bool applies(const Recipe& r) const override { return r.quantize; }
  // The ptq stage evaluates what calibrate makes: naming either runs both.
  bool requested(const std::vector<std::string>& stages) const override {
    return named(stages) || ptq_stage().named(stages);
  }

  void run(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    ctx.before_quantize();
    ctx.task.model->eval();
    if (r.ptq.enabled && r.ptq.equalize) equalize(ctx);
    const QuantizeReport q = quantize(*ctx.task.model, ctx.scheme);
    for (const auto& w : q.warnings) ctx.note("quantize: " + w);
    // A scheme (or searched width) with no QDQ form fails here, not after training.
    if (r.export_.onnx && export_stage().requested(ctx.options.stages)) check_onnx_recipe(r, ctx.task.model.get());
    if (solve_stage().applies(r)) check_solve_recipe(*ctx.task.model, r);  // before the calibration pass, not after it
    if (r.ptq.enabled && r.ptq.smoothquant) smooth(ctx);
    ctx.calibrate(ctx.scheme);
  }
};

}  // namespace

const Stage& calibrate_stage() {
  static const CalibrateStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
