// calibrate: quantizes the model with the (searched) scheme and calibrates its static
// activations; cross-layer equalisation before quantize, SmoothQuant and AWQ before calibration
// when the recipe asks.
#include <chrono>
#include <cstdio>

#include "framework/pipeline/recipe_checks.h"
#include "framework/pipeline/recipe_options.h"
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/api/kv_cache_scheme.h"
#include "framework/api/kv_static_scales.h"
#include "framework/api/quantize.h"
#include "framework/models/gpt2.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/imatrix.h"
#include "framework/ptq/rotate.h"
#include "framework/ptq/spinquant.h"
#include "framework/recipe/tasks/task_data.h"
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

// ptq.rotate's options: the recipe's seed and rotate_online switches.
ptq::RotateOptions rotate_options(const Recipe& r) {
  ptq::RotateOptions o;
  o.seed = r.ptq.rotate_seed >= 0 ? static_cast<uint64_t>(r.ptq.rotate_seed) : r.seed;
  o.online_down_proj = r.ptq.rotate_down_proj;
  o.online_qk = r.ptq.rotate_qk;
  return o;
}

void rotate_hadamard(RunContext& ctx) {
  const ptq::RotateOptions o = rotate_options(ctx.recipe);
  const ptq::RotateReport rr = ptq::rotate_measured(*ctx.task.model, ctx.solve_batches(),
                                                    [&ctx](int64_t b) { return ctx.calibration_batch(b); }, o);
  ctx.report["ptq"]["rotate"] = report::rotate_json(rr);
  ctx.report["timings_s"]["rotate"] = rr.seconds;
  std::fprintf(stderr, "qtrain: Hadamard rotation (seed %llu): %zu Linear inputs measured, float output moved %.2g, %.1fs\n",
               static_cast<unsigned long long>(rr.seed), rr.after.size(), rr.output_change, rr.seconds);
  for (const std::string& n : rr.notes) ctx.note("rotate: " + n);
}

// ptq.rotate: spinquant: the Hadamard rotation's residual-stream and value rotations learned on the
// quantized model's next-token loss (after quantize and a dynamic KV cache, before calibration and
// the solvers, which see the learned model).
void learn_rotations(RunContext& ctx) {
  const Recipe::Ptq& p = ctx.recipe.ptq;
  ptq::SpinQuantOptions o;
  o.steps = p.spinquant_steps;
  o.lr = p.spinquant_lr;
  // auto: float weights before a solver, unless nothing else would be quantized while learning
  // (weight-only or static activations, which pass through while learning, and a float cache: the
  // loss would be the float one, which no rotation changes).
  const bool others_quantized = ctx.recipe.dynamic_activations() || ctx.recipe.kv_cache.quantized();
  o.quantized_weights = p.spinquant_weights == "quantized" ||
                        (p.spinquant_weights == "auto" && (!p.rounds_beyond_rtn() || !others_quantized));
  const int64_t batches =
      p.spinquant_batches > 0 ? std::min(p.spinquant_batches, ctx.calibration_batches()) : ctx.solve_batches();
  const bool kl = p.spinquant_objective == "kl";
  const ptq::SpinQuantReport sr =
      kl ? ptq::learn_rotations_distilled(*ctx.task.model, batches,
                                          [&ctx](int64_t b) { return ctx.calibration_batch(b); }, o)
         : ptq::learn_rotations(*ctx.task.model, batches, [&ctx](int64_t b) { return ctx.calibration_loss(b); }, o);
  ctx.report["ptq"]["rotate"]["kind"] = "spinquant";
  ctx.report["ptq"]["rotate"]["spinquant"] = report::spinquant_json(sr);
  ctx.report["ptq"]["rotate"]["spinquant"]["objective"] = p.spinquant_objective;
  ctx.report["timings_s"]["spinquant"] = sr.seconds;
  std::fprintf(stderr,
               "qtrain: SpinQuant: %lld Cayley steps over %lld calibration batches (weights %s while learning): "
               "quantized %s %.4f -> %.4f, float %s %.6g, R1 moved %.3f from the Hadamard one, %.1fs\n",
               static_cast<long long>(sr.steps), static_cast<long long>(sr.batches),
               sr.quantized_weights ? "fake-quantized" : "float", kl ? "KL to the float model" : "loss",
               sr.loss_before, sr.loss_after, kl ? "outputs moved" : "loss moved",
               kl ? sr.float_output_change : sr.float_loss_after - sr.float_loss_before, sr.rotation_change, sr.seconds);
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

void awq(RunContext& ctx) {
  const ptq::AwqReport ar = ptq::awq(*ctx.task.model, ctx.solve_batches(),
                                     [&ctx](int64_t b) { return ctx.calibration_batch(b); }, awq_options(ctx.recipe));
  ctx.report["ptq"]["awq"] = report::awq_json(ar);
  ctx.awq_clipped = ptq::awq_clipped_layers(ar);
  ctx.report["timings_s"]["awq"] = ar.seconds;
  int folded = 0, identity = 0, duo = 0, block = 0;
  for (const ptq::AwqGroup& g : ar.groups) {
    const bool scaled = g.scaled();
    identity += !scaled;
    folded += scaled && g.scale_home != "pre_quant_scale";
    duo += g.duo;
    block += g.objective != "layer";
  }
  std::fprintf(stderr,
               "qtrain: AWQ: %zu layer groups searched (%d on their block's output), %d kept unscaled, %d on duo "
               "scales, %d folded into the layer before, %zu skipped, %.1fs\n",
               ar.groups.size(), block, identity, duo, folded, ar.skipped.size(), ar.seconds);
}

// E[x²] of every Linear's input over the calibration batches, on the float model (as llama-imatrix
// runs the float model): a pass of its own, since weight-only schemes calibrate nothing.
void collect_imatrix(RunContext& ctx) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    at::NoGradGuard no_grad;
    ptq::FloatView float_view(*ctx.task.model);
    ptq::ImatrixCollector collector(*ctx.task.model);
    for (int64_t b = 0; b < ctx.calibration_batches(); ++b) ctx.calibration_batch(b);
    ctx.imatrix = collector.take();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ctx.report["timings_s"]["imatrix"] = seconds;
  ctx.report["imatrix"] = {{"layers", ctx.imatrix->size()}, {"batches", ctx.calibration_batches()}};
  std::fprintf(stderr, "qtrain: imatrix: %zu Linear inputs over %lld batches, %.1fs\n", ctx.imatrix->size(),
               static_cast<long long>(ctx.calibration_batches()), seconds);
}

// quantize.kv_cache: the attention layers cache int8 / int4 codes from now on (their cacheless
// forward, which evaluation runs, attends to the fake-quantized keys and values).
void quantize_kv_cache(RunContext& ctx) {
  const KvCacheScheme& s = ctx.recipe.kv_cache;
  QF_REQUIRE(set_kv_cache_scheme(*ctx.task.model, s) > 0, "quantize.kv_cache: the ", ctx.recipe.model.arch,
             " model keeps no KV cache");
  const KvCacheModel* m = kv_cache_models(*ctx.task.model).front().second;
  const int64_t bytes = m->kv_cache_bytes_per_token(s), float_bytes = m->kv_cache_bytes_per_token(KvCacheScheme{});
  ctx.report["kv_cache"] = {{"scheme", s.to_string()},       {"qtype", s.qtype->name},
                            {"symmetric", s.symmetric},      {"group_size", s.group_size},
                            {"bytes_per_token", bytes},      {"float_bytes_per_token", float_bytes}};
  if (s.is_static()) ctx.report["kv_cache"]["scales"] = kv_scales_name(s.scales);
  std::fprintf(stderr, "qtrain: KV cache %s: %lld bytes per cached token (float32: %lld)\n", s.to_string().c_str(),
               static_cast<long long>(bytes), static_cast<long long>(float_bytes));
}

// report.json's kv_cache.static_scales: per layer, the largest calibrated key and value scale (a
// layer whose keys need a large step shows here first); the values themselves are in the checkpoint.
void report_kv_static_scales(RunContext& ctx) {
  const KvCacheScheme& s = kv_cache_models(*ctx.task.model).front().second->kv_cache_scheme();
  QF_CHECK(s.calibrated != nullptr);
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < s.calibrated->layers.size(); ++l) {
    const auto& side = s.calibrated->layers[l];
    layers.push_back({{"layer", l},
                      {"key_scale_max", side[0].scale.max().item<double>()},
                      {"value_scale_max", side[1].scale.max().item<double>()}});
    // A head or group that saw only zeros got the smallest scale: anything it caches later saturates near 0.
    for (int v = 0; v < 2; ++v) {
      const int64_t degenerate = side[v].scale.le(kScaleEps).sum().item<int64_t>();
      if (degenerate == 0) continue;
      const std::string what = detail::str_cat("kv_cache: layer ", l, " ", v ? "values" : "keys", ": ", degenerate,
                                               " head(s) / group(s) saw only zeros during calibration; their static "
                                               "scale is float32 epsilon and later values there saturate near 0");
      ctx.note(what);
      std::fprintf(stderr, "qtrain: warning: %s\n", what.c_str());
    }
  }
  ctx.report["kv_cache"]["scheme"] = s.to_string();
  ctx.report["kv_cache"]["static_scales"] = std::move(layers);
  std::fprintf(stderr, "qtrain: KV cache %s over %lld calibration examples\n", s.to_string().c_str(),
               static_cast<long long>(ctx.calibration_examples()));
}

// The cache's group size must divide the model's head_dim: checked before the float stage trains.
void check_kv_cache(const Recipe& r) {
  if (!r.kv_cache.quantized()) return;
  int64_t head_dim = 0;
  if (r.model.arch == "llama") {
    head_dim = tasks::model_config<models::LlamaConfig>(r).head_size();
  } else {
    const auto c = tasks::model_config<models::Gpt2Config>(r);
    head_dim = c.n_embd / c.n_head;
  }
  r.kv_cache.validate(head_dim, "quantize.kv_cache");
}

class CalibrateStage : public Stage {
 public:
  const char* name() const override { return "calibrate"; }
  bool applies(const Recipe& r) const override { return r.quantize; }
  // The ptq stage evaluates what calibrate makes: naming either runs both.
  bool requested(const std::vector<std::string>& stages) const override {
    return named(stages) || ptq_stage().named(stages);
  }

  // A Llama with no Hadamard size for its hidden or intermediate size stops before the float
  // stage trains, not inside calibrate (the recipe loader allows ptq.rotate on llama only).
  void check(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    if (r.ptq.enabled && r.ptq.rotates())
      ptq::check_rotation_sizes(tasks::model_config<models::LlamaConfig>(r), rotate_options(r));
    check_kv_cache(r);
  }

  void run(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    ctx.before_quantize();
    ctx.task.model->eval();
    if (r.ptq.enabled && r.ptq.rotates()) rotate_hadamard(ctx);
    if (r.ptq.enabled && r.ptq.equalize) equalize(ctx);
    const QuantizeReport q = quantize(*ctx.task.model, ctx.scheme);
    for (const auto& w : q.warnings) ctx.note("quantize: " + w);
    if (r.kv_cache.quantized() && !r.kv_cache.is_static()) quantize_kv_cache(ctx);
    // A scheme (or searched width) with no QDQ form fails here, not after training.
    if (r.export_.onnx && export_stage().requested(ctx.options.stages)) check_onnx_recipe(r, ctx.task.model.get());
    if (solve_stage().applies(r)) check_solve_recipe(*ctx.task.model, r);  // before the calibration pass, not after it
    if (r.ptq.enabled && r.ptq.rotate == "spinquant") learn_rotations(ctx);
    if (r.ptq.enabled && r.ptq.smoothquant) smooth(ctx);
    if (r.ptq.enabled && r.ptq.awq) awq(ctx);  // scales the float weights the observers then calibrate
    // A static cache is calibrated by the activations' pass, after the solvers that run forwards
    // of their own (an uncalibrated static cache refuses to attend).
    if (r.kv_cache.is_static()) quantize_kv_cache(ctx);
    ctx.calibrate(ctx.scheme);
    if (r.kv_cache.is_static()) report_kv_static_scales(ctx);
    if (r.calibrate.imatrix) collect_imatrix(ctx);
  }
};

}  // namespace

const Stage& calibrate_stage() {
  static const CalibrateStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
