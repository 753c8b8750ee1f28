// freeze: packs the quantized model into integer kernels, then its metric, size and latency.
#include <chrono>

#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/api/quantize.h"
#include "framework/nn/linear.h"

namespace qforge::pipeline {

namespace {

class FreezeStage : public Stage {
 public:
  const char* name() const override { return "freeze"; }
  bool applies(const Recipe& r) const override { return r.quantize && r.freeze.enabled; }
  bool needs_calibrated_model() const override { return true; }

  void run(RunContext& ctx) const override {
    const auto f0 = std::chrono::steady_clock::now();
    freeze(*ctx.task.model);
    if (ctx.recipe.freeze.decode_activations == "q8_block32")
      ctx.report["decode_q8_layers"] = nn::set_decode_activations(*ctx.task.model, DecodeActivations::kQ8Block32);
    // The stage's time includes the frozen evaluation; packing alone is reported beside it.
    ctx.report["timings_s"]["freeze_pack"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count();
    ctx.record("frozen", ctx.evaluate("frozen eval"));
    ctx.report["size_bytes"]["frozen"] = model_size(*ctx.task.model).total_bytes;
    ctx.record_latency("frozen");
  }
};

}  // namespace

const Stage& freeze_stage() {
  static const FreezeStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
