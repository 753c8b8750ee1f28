// solve: GPTQ / AdaRound rounding and bias correction of the calibrated model (ptq section).
#include <cstdio>

#include "framework/pipeline/recipe_options.h"
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/report/report_json.h"

namespace qforge::pipeline {

namespace {

class SolveStage : public Stage {
 public:
  const char* name() const override { return "solve"; }
  bool applies(const Recipe& r) const override { return solves(r); }
  bool needs_calibrated_model() const override { return true; }

  void pass(RunContext& ctx) const override {
    if (!requested(ctx.options.stages) && calibrate_stage().requested(ctx.options.stages))
      ctx.note("ptq solve skipped by --stages: weights are round-to-nearest");
  }

  void run(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    const int64_t batches = ctx.solve_batches();
    ptq::SolveReport sr =
        ptq::solve(*ctx.task.model, batches, [&ctx](int64_t b) { return ctx.calibration_batch(b); }, solve_options(r));
    nlohmann::json& j = ctx.report["ptq"]["solve"];
    j = report::solve_json(sr);
    j["method"] = r.ptq.method;
    j["bias_correction"] = r.ptq.bias_correction;
    j["batches"] = batches;
    ctx.solved_from = std::move(sr.replaced);
    int64_t solved = 0;
    for (const ptq::LayerSolve& l : sr.layers) solved += l.rows > 0;
    std::fprintf(stderr, "qtrain: solve: %lld layers (%s%s) in %lld passes, %.1fs\n", static_cast<long long>(solved),
                 r.ptq.method.c_str(), r.ptq.bias_correction ? " + bias correction" : "",
                 static_cast<long long>(sr.passes), sr.seconds);
  }
};

}  // namespace

const Stage& solve_stage() {
  static const SolveStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
