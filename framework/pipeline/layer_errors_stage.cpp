// layer_errors: the numeric suite on the fake-quant model as freeze will pack it (after QAT when
// it ran): per-layer SQNR worst first, and the static activation ranges for report.html.
#include "framework/io/calibration_io.h"
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/ptq/numeric_suite.h"
#include "framework/api/quantize.h"
#include "framework/report/report_json.h"

namespace qforge::pipeline {

namespace {

// Calibration batches the numeric suite runs (twice: float, then quantized).
constexpr int64_t kLayerErrorBatches = 4;

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

class LayerErrorsStage : public Stage {
 public:
  const char* name() const override { return "layer_errors"; }
  bool applies(const Recipe& r) const override { return r.quantize; }
  bool selectable() const override { return false; }
  bool requested(const std::vector<std::string>&) const override { return true; }
  bool ready(const RunContext& ctx) const override { return ctx.completed("ptq") || ctx.completed("qat"); }

  void run(RunContext& ctx) const override {
    torch::nn::Module& model = *ctx.task.model;
    bool any = false;
    for_each_quantizable(model, [&](const std::string&, QuantizableLayer& l) { any = any || (l.quantized() && !l.frozen()); });
    if (!any) return;
    const int64_t batches = std::min<int64_t>(ctx.calibration_batches(), kLayerErrorBatches);
    ptq::NumericSuiteOptions suite;
    // After QAT the float weights are the trained ones: the solver's starting point is stale.
    if (!ctx.completed("qat")) suite.float_weights = std::move(ctx.solved_from);
    ctx.solved_from.clear();
    const std::vector<ptq::LayerError> errors = ptq::worst_first(
        ptq::layer_errors(model, batches, [&ctx](int64_t b) { return ctx.calibration_batch(b); }, suite));
    ctx.report["layer_errors"] = report::layer_errors_json(errors, batches);
    ctx.error_record = layer_error_table(errors, batches);
    ctx.report["activations"] = report::activation_ranges_json(io::calibration_dump(model));
  }
};

}  // namespace

const Stage& layer_errors_stage() {
  static const LayerErrorsStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
