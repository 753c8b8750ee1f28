// run_pipeline: the dry run, or the checks and then every stage of the registry in order over
// one RunContext.
#include "framework/pipeline/pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "framework/pipeline/float_checkpoint.h"
#include "framework/pipeline/recipe_checks.h"
#include "framework/pipeline/recipe_options.h"
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/api/kv_cache_scheme.h"
#include "framework/api/quantize.h"

namespace qforge {

std::vector<std::string> metric_stages_in_order(const std::map<std::string, std::map<std::string, double>>& metrics) {
  std::vector<std::string> out;
  for (const char* s : {"float", "ptq", "qat", "frozen"})
    if (metrics.count(s)) out.push_back(s);
  for (const auto& [s, m] : metrics)
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

namespace {

using pipeline::Stage;

bool scheduled(const Stage& s, const Recipe& r, const std::vector<std::string>& stages) {
  return s.applies(r) && s.requested(stages);
}

// What the search would do, and its checks against the model (no data is read).
void print_search_plan(const Recipe& r, torch::nn::Module& model) {
  const search::SearchOptions so = pipeline::search_options(r);
  std::string cands;
  for (const auto& c : so.candidates) cands += (cands.empty() ? "" : ", ") + c.name();
  const std::string cache = so.kv_cache_context > 0 ? " (with the KV cache at " + std::to_string(so.kv_cache_context) +
                                                          " positions, " + so.kv_cache.to_string() + ")"
                                                    : "";
  std::printf("search: %s sensitivities on %lld calibration batches, budget %s%s, candidates %s;\n"
              "the plan below is the scheme before the search assigns per-layer widths\n",
              search::to_string(so.method), static_cast<long long>(r.search.batches), so.budget.to_string().c_str(),
              cache.c_str(), cands.c_str());
  pipeline::check_search_recipe(model, r, so);
}

void print_ptq_plan(const Recipe& r, const torch::nn::Module& model) {
  const std::string online = r.ptq.online_rotations();
  std::string rotate = " Hadamard rotation (QuaRot) before quantize, online: " + (online.empty() ? "none" : online) + ";";
  if (r.ptq.rotate == "spinquant")
    rotate += " its residual-stream and value rotations learned after quantize (SpinQuant, " +
              std::to_string(r.ptq.spinquant_steps) + " Cayley steps);";
  std::printf("\nptq:%s%s%s%s\n", r.ptq.rotates() ? rotate.c_str() : "",
              r.ptq.equalize ? " cross-layer equalisation before quantize;" : "",
              r.ptq.smoothquant ? (" SmoothQuant (alpha " + std::to_string(r.ptq.alpha) + ") before calibration;").c_str() : "",
              r.ptq.awq ? " AWQ scales and clipping before calibration;" : "");
  // The imatrix outranks ptq.act_order (false by default, so an explicit false cannot be told apart).
  if (r.calibrate.imatrix)
    std::printf("  calibrate.imatrix: imatrix-weighted grid search before rounding (GPTQ's layers: as GPTQ rounds); "
                "GPTQ orders columns by the imatrix%s\n", r.ptq.act_order ? "" : " (ptq.act_order: false is not followed)");
  for (const ptq::LayerSolve& l : pipeline::check_solve_recipe(model, r))
    std::printf("  %-40s %-10s %s%s\n", l.path.c_str(), l.type.c_str(), l.method.c_str(),
                l.note.empty() ? "" : ("  (" + l.note + ")").c_str());
}

// Where the float weights come from, in the float stage's order; a checkpoint trained differently
// fails here as it would fail the run.
void print_float_plan(const Recipe& r) {
  const std::string& ckpt = r.model.checkpoint;
  if (!ckpt.empty() && std::filesystem::exists(ckpt)) {
    std::printf("float: %s\n", pipeline::check_float_checkpoint(ckpt, r).c_str());
  } else if (!r.model.safetensors.empty()) {
    std::printf("float: weights imported from %s\n", r.model.safetensors.c_str());
  } else if (!r.model.torchscript.empty()) {
    std::printf("float: the weights of the TorchScript file %s (model.task %s)\n", r.model.torchscript.c_str(),
                r.model.task.c_str());
  } else {
    std::printf("float: trained (%lld epochs), %s\n", static_cast<long long>(r.train.epochs),
                ckpt.empty() ? "not saved (no model.checkpoint)"
                             : ("saved to " + std::filesystem::absolute(ckpt).string()).c_str());
  }
}

// Validates, builds the model without data and prints the stages and each layer's kernel plan.
void dry_run(const Recipe& r, const std::vector<std::string>& stages) {
  Task t = make_task(r, /*with_data=*/false);
  std::printf("recipe %s (sha256 %s)\n", r.path.c_str(), r.sha256.c_str());
  std::printf("model %s, dataset %s, stages:", r.model.arch.c_str(), r.data.dataset.c_str());
  for (const Stage* s : pipeline::stages())
    if (s->selectable() && s->applies(r) && s->named(stages)) std::printf(" %s", s->name());
  std::printf("\n");
  print_float_plan(r);
  if (!r.quantize) return;
  if (t.before_quantize) t.before_quantize();
  if (pipeline::search_stage().applies(r)) print_search_plan(r, *t.model);
  const QuantizeReport rep = quantize(*t.model, r.scheme);
  // Before the cache's scheme is set: a static one is calibrated only by the run (the recipe
  // check has already said whether the cache has a QDQ form).
  if (r.export_.onnx) pipeline::check_onnx_recipe(r, t.model.get());
  if (r.kv_cache.quantized()) set_kv_cache_scheme(*t.model, r.kv_cache);  // describe() names it
  // Each layer's kernel plan: what freeze() will run on this machine (nothing is calibrated).
  const bool freezes = scheduled(pipeline::freeze_stage(), r, stages);
  std::printf("\nplan (%zu quantized layers, %zu kept float; %s):\n%s", rep.quantized.size(), rep.kept_float.size(),
              freezes ? "kernels as freeze will choose them on this machine" : "fake-quant, not frozen",
              describe(*t.model, /*planned=*/freezes).c_str());
  if (t.graph_notes) std::printf("%s", t.graph_notes().c_str());
  for (const auto& w : rep.warnings) std::printf("warning: %s\n", w.c_str());
  if (r.export_.onnx) std::printf("onnx: the frozen model is exportable as QDQ (opset 17)\n");
  if (r.ptq.enabled) print_ptq_plan(r, *t.model);
}

}  // namespace

PipelineResult run_pipeline(const Recipe& r, const PipelineOptions& opt) {
  at::manual_seed(r.seed);
  if (opt.dry_run) {
    dry_run(r, opt.stages);
    return {};
  }
  check_stages(r, opt.stages);
  pipeline::RunContext ctx(r, opt);
  ctx.check_world();
  ctx.check_out_dir();
  for (const Stage* s : pipeline::stages())
    if (scheduled(*s, r, opt.stages)) s->check(ctx);
  ctx.open_outputs();
  for (const Stage* s : pipeline::stages()) {
    if (!s->applies(r)) continue;
    s->pass(ctx);
    if (!s->requested(opt.stages) || !s->ready(ctx)) continue;
    // Nothing runs without a required stage (data); the report stays as that stage left it.
    const bool completed = ctx.run_stage(*s);
    if (!completed && s->required()) return ctx.result;
    if (completed) s->after_report(ctx);
  }
  ctx.write_report();
  return ctx.result;
}

}  // namespace qforge
