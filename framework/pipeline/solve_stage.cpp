// solve: the imatrix-weighted grid search (calibrate.imatrix), GPTQ / AdaRound rounding and bias
// correction of the calibrated model (ptq section).
#include <cstdio>
#include <map>
#include <string>

#include "framework/pipeline/recipe_options.h"
#include "framework/ptq/imatrix.h"
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/report/report_json.h"

namespace qforge::pipeline {

namespace {

// The imatrix-weighted grid search of the layers whose rounding does not search its grid itself
// (ptq::imatrix_round_leaves: AWQ's, GPTQ's and AutoRound's layers keep their own).
void imatrix_round(RunContext& ctx, const ptq::SolveOptions& o) {
  const std::map<std::string, std::string> leave =
      ptq::imatrix_round_leaves(ptq::plan_solve(*ctx.task.model, o), ctx.awq_clipped);
  const ptq::ImatrixRoundReport ir = ptq::imatrix_round(*ctx.task.model, *ctx.imatrix, leave);
  ctx.report["ptq"]["imatrix_round"] = report::imatrix_round_json(ir);
  ctx.report["timings_s"]["imatrix_round"] = ir.seconds;
  size_t to_gptq = 0;
  for (const std::string& k : ir.skipped) {
    const auto it = leave.find(k.substr(0, k.find(": ")));
    to_gptq += it != leave.end() && it->second == ptq::kLeftToGptq;
  }
  std::fprintf(stderr,
               "qtrain: imatrix grid search: %zu layers clamped to it, %zu searched by GPTQ as it rounds, %zu left "
               "(report.json ptq.imatrix_round.skipped says why), %.1fs\n",
               ir.layers.size(), to_gptq, ir.skipped.size() - to_gptq, ir.seconds);
}

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
    ptq::SolveOptions o = solve_options(r);
    if (ctx.imatrix) {
      imatrix_round(ctx, o);
      o.imatrix = &*ctx.imatrix;
      o.clipped_by_awq = ctx.awq_clipped;
    } else if (r.calibrate.imatrix) {
      ctx.note("no imatrix (calibrate stage skipped by --stages): weights keep their plain min/max grids");
    }
    ptq::SolveReport sr =
        ptq::solve(*ctx.task.model, batches, [&ctx](int64_t b) { return ctx.calibration_batch(b); }, o);
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
