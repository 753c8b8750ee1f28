// ptq: evaluates the calibrated (and solved) fake-quant model.
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"

namespace qforge::pipeline {

namespace {

class PtqStage : public Stage {
 public:
  const char* name() const override { return "ptq"; }
  bool applies(const Recipe& r) const override { return r.quantize; }
  // Evaluates what calibrate makes: naming either runs both.
  bool requested(const std::vector<std::string>& stages) const override {
    return named(stages) || calibrate_stage().named(stages);
  }
  void run(RunContext& ctx) const override { ctx.record("ptq", ctx.evaluate("ptq eval")); }
};

}  // namespace

const Stage& ptq_stage() {
  static const PtqStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
