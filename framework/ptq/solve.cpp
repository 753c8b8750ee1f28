// solve(): the layer-by-layer driver of GPTQ, AdaRound and bias correction over a model's
// Linear / Conv1d / Conv2d layers, with inputs captured through the layers' input taps.
#include "framework/ptq/ptq.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "fake_quant/fake_quantize.h"
#include "framework/core/enum_names.h"
#include "framework/api/progress.h"
#include "framework/ptq/block_capture.h"
#include "framework/ptq/imatrix.h"
#include "framework/ptq/layer_access.h"
#include "framework/api/scheme.h"
#include "framework/nn/linear.h"

namespace qforge::ptq {

namespace {

constexpr NamedValue<Rounding> kRoundingNames[] = {
    {Rounding::kNearest, "rtn"}, {Rounding::kGptq, "gptq"}, {Rounding::kAdaRound, "adaround"},
    {Rounding::kKMeans, "kmeans"}, {Rounding::kAutoRound, "autoround"}, {Rounding::kBrecq, "brecq"},
    {Rounding::kNearest, "nearest", true}};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What one capture pass gathers for one layer.
struct Capture {
  std::optional<LayerAccess> access;  // the layer's [N, K] view, taken at its first capture
  at::Tensor h;  // Σ x xᵀ over every row (GPTQ)
  int64_t n = 0;
  std::vector<at::Tensor> xf, xq;  // sampled rows: float input, input as the weight multiplies it
};

// Solves one layer from its captured inputs: rounding, bias correction, errors before / after.
// Returns the weight and bias it replaced (both undefined when it replaced neither).
FloatWeights solve_layer(QuantizableLayer& layer, const Capture& c, const SolveOptions& o, LayerSolve& ls) {
  const LayerAccess& acc = *c.access;
  FloatWeights replaced;
  Quantizer wq = layer.weight_quantizer();
  const QSpec spec = wq->config().spec;
  const at::Tensor W = acc.w2d().detach().to(at::kFloat).clone();
  const at::Tensor xf = at::cat(c.xf, 0), xq = at::cat(c.xq, 0);
  ls.rows = xf.size(0);
  const at::Tensor b0 = acc.bias.defined() ? acc.bias.detach().to(at::kFloat).clone() : at::zeros({W.size(0)});
  const at::Tensor yf = at::matmul(xf, W.t()) + b0;
  // Round-to-nearest as the weight quantizer computes it (a grid fixed earlier stays).
  const QParams rtn = wq->qparams(acc.weight);
  const at::Tensor w_rtn = fake_quantize(W.reshape(acc.weight.sizes()), rtn).reshape(W.sizes());
  ls.error_before = relative_mse(at::matmul(xq, w_rtn.t()) + b0, yf);

  at::Tensor w_new = w_rtn;
  QParams grid = rtn;
  std::string note;
  if (ls.method.rfind("gptq", 0) == 0) {
    QF_REQUIRE(c.n > 0, "no input rows were captured");
    GptqOptions go = o.gptq;
    const auto im = o.imatrix ? o.imatrix->find(ls.path) : Imatrix::const_iterator();
    if (o.imatrix && im != o.imatrix->end() && im->second.sum_sq.numel() == W.size(1)) {
      go.act_order = true;
      go.column_importance = imatrix_importance(im->second);
      note = "columns in imatrix order";
      const bool awq_clipped =
          std::find(o.clipped_by_awq.begin(), o.clipped_by_awq.end(), ls.path) != o.clipped_by_awq.end();
      if (spec.qtype.is_integer() && spec.granularity != Granularity::kPerTensor && !awq_clipped && !wq->calibrated())
        go.clip_importance = go.column_importance;
    }
    const GptqResult r = gptq(W, (c.h / static_cast<double>(c.n)).to(at::kFloat), spec, go);
    if (go.clip_importance.defined()) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "; %s (output error on H %.4g, %s %.4g)",
                    r.grids_searched ? "imatrix-searched grids" : "min/max grids kept", r.error,
                    r.grids_searched ? "min/max grids" : "imatrix-searched grids", r.error_other);
      note += buf;
    }
    w_new = r.weight;
    grid = QParams{spec, r.qparams.scale.reshape(rtn.scale.sizes()), r.qparams.zero_point.reshape(rtn.scale.sizes())};
    if (r.damp != o.gptq.damp) note += std::string(note.empty() ? "" : "; ") + "damping raised to " + std::to_string(r.damp) + " (H not positive definite)";
  } else if (ls.method.rfind("kmeans", 0) == 0) {
    // Refit the levels with each weight column weighted by its input's energy (diag H).
    QF_REQUIRE(c.n > 0, "no input rows were captured");
    const at::Tensor energy = (c.h.diagonal() / static_cast<double>(c.n)).to(at::kFloat);
    wq->fit_codebook(acc.weight, energy);
    grid = wq->qparams(acc.weight);
    w_new = fake_quantize(W.reshape(acc.weight.sizes()), grid).reshape(W.sizes());
  } else if (ls.method.rfind("adaround", 0) == 0) {
    const AdaRoundResult r = adaround(W, rtn, xq, at::matmul(xf, W.t()), o.adaround);
    w_new = r.weight;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.1f%% of rounding variables binary, %.1f%% rounded up", 100 * r.binary_fraction,
                  100 * r.rounded_up);
    note = buf;
  }
  at::Tensor b_new = b0;
  if (ls.method.find("bias_correction") != std::string::npos) {
    // E[y_q − y_f] over the rows, folded into the bias.
    const at::Tensor shift = (at::matmul(xq, w_new.t()) + b0 - yf).mean(0);
    b_new = b0 - shift;
    at::NoGradGuard g;
    replaced.bias = acc.bias.detach().clone();
    acc.bias.copy_(b_new.to(acc.bias.scalar_type()));
  }
  if (ls.method.rfind("rtn", 0) != 0 && ls.method.rfind("kmeans", 0) != 0) {
    // The solved codes become the weight, on a fixed grid (fake-quant and freeze reproduce them).
    // (k-means keeps the float weight: its fitted codebook is the grid, nearest-level rounding.)
    replaced.weight = acc.weight.detach().clone();
    acc.set_w2d(w_new);
    wq->set_qparams(grid);
  }
  ls.error_after = relative_mse(at::matmul(xq, w_new.t()) + b_new, yf);
  if (!note.empty()) ls.note = ls.note.empty() ? note : ls.note + "; " + note;
  if (replaced.bias.defined() && !replaced.weight.defined()) replaced.weight = acc.weight.detach().clone();
  return replaced;
}

// The rule (or -1: the default) that decides a layer's rounding.
int matching_rule(const SolveOptions& o, const std::string& path) {
  for (size_t i = 0; i < o.rules.size(); ++i)
    if (pattern_matches(o.rules[i].pattern, path)) return static_cast<int>(i);
  return -1;
}

}  // namespace

const char* to_string(Rounding r) { return name_of(kRoundingNames, r); }
Rounding rounding_from_name(const std::string& name) { return value_of(kRoundingNames, name, "PTQ rounding method"); }
std::vector<std::string> rounding_names() { return names_of(kRoundingNames); }

double relative_mse(const at::Tensor& yq, const at::Tensor& yf) {
  const double num = (yq.to(at::kDouble) - yf.to(at::kDouble)).pow(2).sum().item<double>();
  const double den = yf.to(at::kDouble).pow(2).sum().item<double>();
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return num / den;
}

double relative_change(const at::Tensor& y, const at::Tensor& y0) {
  const double den = y0.to(at::kDouble).norm().item<double>();
  const double num = (y.to(at::kDouble) - y0.to(at::kDouble)).norm().item<double>();
  return den == 0 ? num : num / den;
}

namespace {
// Why a block-wise method (AutoRound, BRECQ; `name` as the messages spell it) cannot round this
// layer (empty: it can).
std::string block_method_unfit(const char* name, const std::vector<std::string>& block_paths, const std::string& path,
                               const QuantizableLayer& layer, bool needs_group_grid) {
  const std::string n = name;
  if (block_index(block_paths, path) < 0)
    return n + " reconstructs the transformer blocks of Llama-family and GPT-2 models; this layer is outside them";
  if (!layer.module().as<nn::LinearImpl>()) return n + " rounds Linear layers";
  const QSpec& spec = layer.scheme().weights->spec;
  if (!spec.qtype.is_integer()) return n + " rounds onto integer grids, the weights are " + std::string(spec.qtype.name);
  if (needs_group_grid && spec.granularity == Granularity::kPerTensor)
    return n + " clips per output channel or group, not per tensor";
  if (layer.weight_quantizer()->calibrated()) return "its weight grid is already fixed (loaded or solved)";
  return "";
}
}  // namespace

std::vector<LayerSolve> plan_solve(const torch::nn::Module& model, const SolveOptions& o) {
  std::vector<LayerSolve> out;
  const std::vector<std::string> block_paths = transformer_block_paths(model);
  std::map<int, std::string> unfit_reason;
  std::set<int> rules_fit;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    if (!layer->quantized() || !layer->scheme().weights) continue;
    LayerSolve ls;
    ls.path = path;
    ls.type = layer->layer_type();
    const int rule = matching_rule(o, path);
    Rounding r = rule >= 0 ? o.rules[static_cast<size_t>(rule)].rounding : o.rounding;
    // The default AutoRound / BRECQ leaves the Linears outside the blocks (the head) to GPTQ, the
    // layer-wise solver (auto-round tunes such layers layer by layer); a rule asking for them is an error.
    std::string fallback;  // "AutoRound reconstructs the transformer blocks" when GPTQ stands in for it
    if (rule < 0 && (r == Rounding::kAutoRound || r == Rounding::kBrecq) && !block_paths.empty() &&
        block_index(block_paths, path) < 0 && layer->module().as<nn::LinearImpl>()) {
      fallback = std::string(r == Rounding::kBrecq ? "BRECQ" : "AutoRound") + " reconstructs the transformer blocks";
      r = Rounding::kGptq;
    }
    std::string why = solvable(path, *layer);
    const QType wqt = layer->scheme().weights->spec.qtype;
    if (why.empty() && r == Rounding::kAdaRound && !wqt.is_integer())
      why = "AdaRound rounds onto integer grids, the weights are " + std::string(wqt.name);
    if (why.empty() && r == Rounding::kGptq && wqt.is_codebook())
      why = "GPTQ rounds onto uniform grids; codebook weights take kmeans";
    if (why.empty() && r == Rounding::kGptq && wqt.is_microscaling())
      why = "GPTQ fixes each group's grid as it goes; " + std::string(wqt.name) + " block scales follow the values";
    if (why.empty() && r == Rounding::kKMeans && !wqt.is_codebook())
      why = "kmeans refits codebooks; the weights are " + std::string(wqt.name) + " (a uniform grid)";
    if (why.empty() && r == Rounding::kAutoRound) why = block_method_unfit("AutoRound", block_paths, path, *layer, true);
    if (why.empty() && r == Rounding::kBrecq) why = block_method_unfit("BRECQ", block_paths, path, *layer, false);
    if (why.empty() && layer->frozen()) why = "frozen";
    if (why.empty() && layer->scheme().weights->lsq && layer->weight_quantizer()->lsq_initialised())
      why = "its LSQ weight scale already trains";
    if (r == Rounding::kNearest || !why.empty()) {
      ls.method = "rtn";
      if (!fallback.empty()) {
        ls.note = fallback + "; GPTQ, for the layers outside them, does not apply: " + why;
      } else if (r != Rounding::kNearest) {
        ls.note = std::string(to_string(r)) + " does not apply: " + why;
        if (rule >= 0) unfit_reason.emplace(rule, path + " (" + ls.type + "): " + ls.note);
      }
    } else {
      ls.method = to_string(r);
      if (!fallback.empty()) ls.note = fallback + "; outside them GPTQ rounds this layer";
      if (rule >= 0) rules_fit.insert(rule);
    }
    if (o.bias_correction && why.empty() && (r == Rounding::kAutoRound || r == Rounding::kBrecq)) {
      ls.note = "no bias correction after " + std::string(r == Rounding::kBrecq ? "BRECQ" : "AutoRound") +
                " (it reconstructs the block's output)";
    } else if (o.bias_correction && why.empty()) {
      const auto params = layer->module().named_parameters(false);
      if (params.contains("bias") && params["bias"].defined()) ls.method += "+bias_correction";
      else if (ls.note.empty()) ls.note = "no bias to correct";
    }
    out.push_back(std::move(ls));
  }
  // A rule naming a method for layers none of which can take it is a mistake in the recipe.
  for (const auto& [rule, reason] : unfit_reason)
    if (!rules_fit.count(rule))
      throw SolveError(rule, "ptq rule '" + o.rules[static_cast<size_t>(rule)].pattern + "' asks for " +
                                 to_string(o.rules[static_cast<size_t>(rule)].rounding) +
                                 " on layers that cannot take it: " + reason);
  return out;
}

namespace {

// One forward sweep over the calibration batches that captures the inputs of the first pending
// layer the forward reaches (the target) and of the pending layers reading the same tensor.
class CapturePass {
 public:
  CapturePass(const std::map<QuantizableLayer*, LayerSolve>& pending, int64_t rows_per_batch, at::Generator& gen)
      : pending_(pending), rows_per_batch_(rows_per_batch), gen_(gen) {}

  void run(const std::vector<QuantizableLayer*>& all_layers, int64_t batches, const RunBatch& run_batch) {
    const ScopedInputTaps taps(all_layers, [this](QuantizableLayer& layer, const at::Tensor& x) { tap(layer, x); });
    for (batch_ = 0; batch_ < batches; ++batch_) {
      seen_ = false;
      try {
        run_batch(batch_);
      } catch (const StopForward&) {
      }
    }
  }

  bool reached() const { return target_ != nullptr; }
  const std::vector<QuantizableLayer*>& group() const { return group_; }
  const Capture& capture_of(QuantizableLayer* layer) const { return captures_.at(layer); }

 private:
  void capture(QuantizableLayer& layer, const at::Tensor& x) {
    Capture& c = captures_[&layer];
    if (!c.access) c.access = access(layer);
    const LayerAccess& acc = *c.access;
    const at::Tensor xf = acc.rows(x.detach());
    Quantizer iq = layer.input_quantizer();
    const at::Tensor xq = iq ? acc.rows(iq->forward(x.detach())) : xf;
    const std::string& m = pending_.at(&layer).method;
    if (m.rfind("gptq", 0) == 0 || m.rfind("kmeans", 0) == 0) {
      const at::Tensor x64 = xq.to(at::kDouble);
      const at::Tensor h = at::matmul(x64.t(), x64);
      c.h = c.h.defined() ? c.h + h : h;
    }
    c.n += xq.size(0);
    const int64_t keep = std::min<int64_t>(rows_per_batch_, xf.size(0));
    const at::Tensor idx = at::randperm(xf.size(0), gen_, at::TensorOptions().dtype(at::kLong)).slice(0, 0, keep);
    c.xf.push_back(xf.index_select(0, idx).to(at::kFloat));
    c.xq.push_back(xq.index_select(0, idx).to(at::kFloat));
  }

  void tap(QuantizableLayer& layer, const at::Tensor& x) {
    const bool is_pending = pending_.count(&layer) > 0;
    if (!target_ && is_pending) target_ = &layer;
    if (&layer == target_) {
      seen_ = true;
      target_input_ = x.unsafeGetTensorImpl();
      if (batch_ == 0) group_.push_back(&layer);
      capture(layer, x);
      return;
    }
    if (!seen_) return;
    const bool sibling = x.unsafeGetTensorImpl() == target_input_;
    const bool in_group = std::find(group_.begin(), group_.end(), &layer) != group_.end();
    if (sibling && (in_group || (batch_ == 0 && is_pending))) {
      if (!in_group) group_.push_back(&layer);
      capture(layer, x);
      return;
    }
    throw StopForward{};
  }

  const std::map<QuantizableLayer*, LayerSolve>& pending_;
  const int64_t rows_per_batch_;
  at::Generator& gen_;
  QuantizableLayer* target_ = nullptr;
  const c10::TensorImpl* target_input_ = nullptr;
  bool seen_ = false;
  int64_t batch_ = 0;
  std::vector<QuantizableLayer*> group_;  // the target and the layers reading the same tensor
  std::map<QuantizableLayer*, Capture> captures_;
};

// The layers with work to do, and what each gets; round-to-nearest ones go straight to the report.
std::map<QuantizableLayer*, LayerSolve> pending_layers(const std::vector<LayerSolve>& plan,
                                                       const std::map<std::string, QuantizableLayer*>& by_path,
                                                       SolveReport& report) {
  std::map<QuantizableLayer*, LayerSolve> pending;
  for (const LayerSolve& ls : plan) {
    if (ls.method == "rtn") {
      report.layers.push_back(ls);  // round-to-nearest, nothing to solve
      continue;
    }
    pending.emplace(by_path.at(ls.path), ls);
  }
  return pending;
}

// Solves the layers one capture pass gathered, each leaving the pending set.
void solve_group(const CapturePass& pass, std::map<QuantizableLayer*, LayerSolve>& pending, const SolveOptions& o,
                 SolveReport& report, Progress& progress) {
  for (QuantizableLayer* layer : pass.group()) {
    LayerSolve ls = pending.at(layer);
    pending.erase(layer);
    const auto l0 = std::chrono::steady_clock::now();
    try {
      FloatWeights replaced = solve_layer(*layer, pass.capture_of(layer), o, ls);
      if (replaced.weight.defined()) report.replaced.emplace(ls.path, std::move(replaced));
    } catch (const Error& e) {
      throw Error("ptq solve: " + ls.path + " (" + ls.type + "): " + e.what());
    }
    ls.seconds = seconds_since(l0);
    report.layers.push_back(ls);
    progress.update(1, ls.path);
  }
}

// The calibration forward never reaches them.
void keep_unreached(std::map<QuantizableLayer*, LayerSolve>& pending, SolveReport& report) {
  for (auto& [layer, ls] : pending) {
    ls.method = "rtn";
    ls.note = "not reached by the model's forward on the calibration batches; kept round-to-nearest";
    report.layers.push_back(ls);
  }
}

}  // namespace

SolveReport solve(torch::nn::Module& model, int64_t batches, const RunBatch& run, const SolveOptions& o) {
  QF_REQUIRE(batches > 0, "ptq::solve: needs at least one calibration batch");
  QF_REQUIRE(o.sample_rows > 0, "ptq::solve: sample_rows must be > 0, got ", o.sample_rows);
  const auto t0 = std::chrono::steady_clock::now();
  SolveReport report;
  const std::vector<LayerSolve> plan = plan_solve(model, o);
  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();

  std::map<std::string, QuantizableLayer*> by_path;
  std::vector<QuantizableLayer*> all_layers;  // every layer's tap can end a capture pass
  for (const auto& [path, layer] : quantizable_layers(model)) {
    by_path[path] = layer;
    all_layers.push_back(layer);
  }
  std::map<QuantizableLayer*, LayerSolve> pending = pending_layers(plan, by_path, report);
  const size_t rtn_layers = report.layers.size();
  solve_block_reconstruction(model, batches, run, o, pending, report);
  Progress progress("ptq solve", static_cast<int64_t>(pending.size()));
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  const int64_t rows_per_batch = (o.sample_rows + batches - 1) / batches;

  while (!pending.empty()) {
    CapturePass pass(pending, rows_per_batch, gen);
    pass.run(all_layers, batches, run);
    ++report.passes;
    if (!pass.reached()) {
      keep_unreached(pending, report);
      break;
    }
    solve_group(pass, pending, o, report, progress);
  }
  progress.finish();
  // Solved layers in forward order after the round-to-nearest ones.
  std::rotate(report.layers.begin(), report.layers.begin() + static_cast<std::ptrdiff_t>(rtn_layers),
              report.layers.end());
  model.train(was_training);
  report.seconds = seconds_since(t0);
  return report;
}

}  // namespace qforge::ptq
