// float: the float model's weights (loaded from the checkpoint, imported from safetensors, or
// trained and saved), then its metric, size and latency.
#include <cstdio>
#include <filesystem>
#include <optional>

#include "framework/nn/batch_norm.h"
#include "framework/pipeline/float_checkpoint.h"
#include "framework/pipeline/recipe_options.h"
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/api/quantize.h"
#include "framework/report/report_json.h"

namespace qforge::pipeline {

namespace fs = std::filesystem;

namespace {

// Trains the float model (data-parallel over the ranks) and saves it to model.checkpoint; false
// when interrupted during training.
bool train_float(RunContext& ctx) {
  const Recipe& r = ctx.recipe;
  Task& t = ctx.task;
  auto o = train_options(r, *t.train, r.train.epochs, r.train.lr, r.train.max_steps, "float", ctx.options.interrupted);
  ctx.data_parallel(o, *t.model);
  // SyncBatchNorm when the recipe asks: BatchNorm statistics over every rank's batch.
  std::optional<nn::SyncBatchNormScope> sync_bn;
  if (!ctx.world.single() && r.distributed.sync_batchnorm)
    sync_bn.emplace([w = &ctx.world](at::Tensor& x) { w->all_reduce(x, dist::Reduce::kSum); });
  ctx.report["loss_curves"]["float"] = report::loss_curve(train::fit(*t.model, *t.train, t.forward, o));
  sync_bn.reset();
  if (ctx.interrupted()) return false;  // a half-trained model is neither saved nor evaluated
  ctx.settle_replicas(*t.model, "after float training");
  const std::string& ckpt = r.model.checkpoint;
  if (!ckpt.empty() && ctx.world.rank() == 0) {
    const std::string written = ctx.save(ckpt, [&](const std::string& p) { save_float_checkpoint(*t.model, p, r); });
    ctx.note("float weights trained and saved to " + written);
  }
  ctx.world.barrier();  // the other ranks wait until rank 0's checkpoint is complete
  return true;
}

class FloatStage : public Stage {
 public:
  const char* name() const override { return "float"; }
  bool applies(const Recipe&) const override { return true; }
  // Every run needs the float weights: loaded, imported or trained whatever --stages names.
  bool requested(const std::vector<std::string>&) const override { return true; }

  // A checkpoint path that cannot be written is found now, not after the float epochs; a run
  // whose --stages leaves float out is not probed.
  void check(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    if (ctx.wanted(*this) && r.model.safetensors.empty() && !r.model.checkpoint.empty() && !fs::exists(r.model.checkpoint))
      probe_writable(fs::path(r.model.checkpoint).parent_path().string(), "model.checkpoint " + r.model.checkpoint);
  }

  void run(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    Task& t = ctx.task;
    const std::string& ckpt = r.model.checkpoint;
    if (!ckpt.empty() && fs::exists(ckpt)) {
      ctx.note(load_float_checkpoint(*t.model, ckpt, r));
    } else if (!t.float_weights_from.empty()) {
      ctx.note("float weights from " + t.float_weights_from);
    } else if (!r.model.safetensors.empty()) {
      t.import_safetensors(r.model.safetensors);
      ctx.note("float weights imported from " + r.model.safetensors);
    } else if (!train_float(ctx)) {
      return;
    }
    const train::Metrics m = ctx.evaluate("float eval");
    ctx.record("float", m);
    // Weights that came with the model (a TorchScript file) and score no better than always
    // answering the commonest class were most likely trained on other data (another vocabulary,
    // class order or preprocessing): said, since every later stage would look as it should.
    const auto majority = t.baselines.find("majority_class_accuracy");
    if (!t.float_weights_from.empty() && t.metric == "accuracy" && majority != t.baselines.end() &&
        m.accuracy < majority->second + 0.02) {
      const std::string w = detail::str_cat("the float model's accuracy (", m.accuracy, ") is no better than always "
                                            "answering the commonest class (", majority->second,
                                            "): does the data match what it was trained on (classes in the same "
                                            "order, the same token ids or preprocessing)?");
      ctx.note(w);
      std::fprintf(stderr, "qtrain: warning: %s\n", w.c_str());
    }
    if (m.confusion.defined() && !t.class_names.empty())
      ctx.report["float_confusion"] = train::format_confusion(m.confusion, t.class_names);
    ctx.report["size_bytes"]["float"] = model_size(*t.model).total_bytes;
    ctx.record_latency("float");
  }
};

}  // namespace

const Stage& float_stage() {
  static const FloatStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
