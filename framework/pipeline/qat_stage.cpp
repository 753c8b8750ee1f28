// qat: quantization-aware training of the calibrated model (data-parallel over the ranks), then
// its metric.
#include "framework/pipeline/recipe_options.h"
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/api/quantize.h"
#include "framework/report/report_json.h"

namespace qforge::pipeline {

namespace {

class QatStage : public Stage {
 public:
  const char* name() const override { return "qat"; }
  bool applies(const Recipe& r) const override { return r.quantize && r.qat.epochs > 0; }
  bool needs_calibrated_model() const override { return true; }

  void run(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    Task& t = ctx.task;
    QatController qat(*t.model, QatOptions{r.qat.freeze_observers_after, r.qat.freeze_bn_after});
    qat.begin_epoch();
    auto o = train_options(r, *t.train, r.qat.epochs, r.qat.lr, r.qat.max_steps, "qat", ctx.options.interrupted);
    o.on_step = [&qat](int64_t) { qat.step(); };
    ctx.data_parallel(o, *t.model);
    ctx.report["loss_curves"]["qat"] = report::loss_curve(train::fit(*t.model, *t.train, t.forward, o));
    if (ctx.interrupted()) return;
    ctx.settle_replicas(*t.model, "after QAT");
    ctx.record("qat", ctx.evaluate("qat eval"));
    // QAT's observers are still live in that evaluation, each rank's on its own shard of the test split.
    ctx.settle_replicas(*t.model, "after the QAT evaluation");
  }
};

}  // namespace

const Stage& qat_stage() {
  static const QatStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
