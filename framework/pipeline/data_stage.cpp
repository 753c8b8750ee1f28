// data: builds the task (model, data splits, metric) the other stages work on.
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"

namespace qforge::pipeline {

namespace {

class DataStage : public Stage {
 public:
  const char* name() const override { return "data"; }
  bool applies(const Recipe&) const override { return true; }
  bool selectable() const override { return false; }
  bool required() const override { return true; }
  bool requested(const std::vector<std::string>&) const override { return true; }

  void run(RunContext& ctx) const override { ctx.task = make_task(ctx.recipe, /*with_data=*/true); }

  void after_report(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    ctx.report["metric"] = ctx.task.metric;
    ctx.report["distributed"] = {{"world_size", ctx.world.size()},
                                 {"backend", ctx.world.single() ? "none" : r.distributed.backend},
                                 {"sync_batchnorm", !ctx.world.single() && r.distributed.sync_batchnorm}};
    ctx.report["eval_examples"] = ctx.task.test->size();
    ctx.report["baselines"] = ctx.task.baselines;
  }
};

}  // namespace

const Stage& data_stage() {
  static const DataStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
