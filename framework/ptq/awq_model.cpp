// awq(): AWQ over a model's Linear layers, grouped by the input they read, with each group's
// inverse scale folded into the module before it where that is exact.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "framework/api/kv_cache_scheme.h"
#include "framework/core/error.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "framework/nn/rms_norm.h"
#include "framework/ptq/awq.h"
#include "framework/ptq/block_capture.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/layer_access.h"

namespace qforge::ptq {

namespace {

// Largest relative change of the float model's output the scales may cause (float rounding).
constexpr double kAwqTolerance = 1e-4;

// The Linear layers reading one input, and what the calibration batches showed of it.
struct InputGroup {
  std::vector<nn::LinearImpl*> layers;
  std::vector<std::string> paths;
  std::vector<at::Tensor> rows;  // sampled input rows, float
  at::Tensor abs_sum;            // Σ |x| per input channel over every row (float64)
  int64_t n = 0;
  int64_t last_batch = -1;
};

// One float pass over the calibration batches: layers called one after the other on one tensor
// (q/k/v, gate/up) form a group. The previous input stays referenced, so its address is not reused.
class GroupCapture {
 public:
  GroupCapture(const torch::nn::Module& model, int64_t rows_per_batch, uint64_t seed)
      : rows_per_batch_(rows_per_batch), gen_(at::detail::createCPUGenerator(seed)) {
    for (const auto& [path, layer] : quantizable_layers(model))
      if (auto* lin = layer->module().as<nn::LinearImpl>()) {
        linears_.push_back(layer);
        path_of_[layer] = path;
        linear_of_[layer] = lin;
      }
  }

  void run(int64_t batches, const RunBatch& run_batch) {
    const ScopedInputTaps taps(linears_, [this](QuantizableLayer& l, const at::Tensor& x) { tap(l, x); });
    for (batch_ = 0; batch_ < batches; ++batch_) {
      last_x_ = at::Tensor();
      run_batch(batch_);
    }
    last_x_ = at::Tensor();
  }

  std::vector<InputGroup>& groups() { return groups_; }

 private:
  void tap(QuantizableLayer& layer, const at::Tensor& x_in) {
    const at::Tensor x = x_in.detach();  // a new TensorImpl: identity is x_in's
    auto it = group_of_.find(&layer);
    if (it == group_of_.end()) {
      const bool sibling = last_x_.defined() && x_in.unsafeGetTensorImpl() == last_x_.unsafeGetTensorImpl();
      if (!sibling) groups_.emplace_back();
      it = group_of_.emplace(&layer, groups_.size() - 1).first;
      groups_.back().layers.push_back(linear_of_.at(&layer));
      groups_.back().paths.push_back(path_of_.at(&layer));
    }
    last_x_ = x_in;
    InputGroup& g = groups_[it->second];
    if (g.last_batch == batch_) return;  // a sibling recorded this input already
    g.last_batch = batch_;
    const at::Tensor rows = x.reshape({-1, x.size(-1)}).to(at::kFloat);
    const at::Tensor a = rows.abs().sum(0).to(at::kDouble);
    g.abs_sum = g.abs_sum.defined() ? g.abs_sum + a : a;
    g.n += rows.size(0);
    const int64_t keep = std::min<int64_t>(rows_per_batch_, rows.size(0));
    const at::Tensor idx = at::randperm(rows.size(0), gen_, at::TensorOptions().dtype(at::kLong)).slice(0, 0, keep);
    g.rows.push_back(rows.index_select(0, idx));
  }

  const int64_t rows_per_batch_;
  at::Generator gen_;
  std::vector<QuantizableLayer*> linears_;
  std::map<QuantizableLayer*, std::string> path_of_;
  std::map<QuantizableLayer*, nn::LinearImpl*> linear_of_;
  std::map<QuantizableLayer*, size_t> group_of_;
  std::vector<InputGroup> groups_;
  at::Tensor last_x_;
  int64_t batch_ = 0;
};

// The block objective's data: the hidden states entering each transformer block on the first
// calibration batches holding `rows` tokens, and the float block's outputs on them, walked in
// forward order. The scales leave each block's float function as it was, so the outputs computed
// before a block's groups are scaled stay its float outputs and the next block's inputs.
class BlockStates {
 public:
  BlockStates(torch::nn::Module& model, int64_t batches, const RunBatch& run, int64_t rows)
      : model_(model), bm_(transformer_blocks(model)), paths_(transformer_block_paths(model)) {
    if (bm_.blocks.empty()) return;
    const std::vector<at::Tensor> ids = capture_token_ids(bm_, batches, run);
    const FloatView fv(model);
    int64_t n = 0;
    for (const at::Tensor& t : ids) {
      if (n >= rows) break;
      x_.push_back(bm_.embed(t).detach());
      n += t.numel();
    }
  }

  // The block holding every one of `paths`, or -1 (the head; a model without blocks).
  int block_of(const std::vector<std::string>& paths) const {
    if (bm_.blocks.empty()) return -1;
    const int b = block_index(paths_, paths[0]);
    for (const std::string& p : paths)
      if (block_index(paths_, p) != b) return -1;
    return b;
  }
  const std::string& path(int b) const { return paths_[static_cast<size_t>(b)]; }

  // E of the block objective for `layers` computing with `weights` (the rest of the block float).
  double error(int b, const std::vector<nn::LinearImpl*>& layers, const std::vector<at::Tensor>& weights) {
    move_to(b);
    outputs();
    const FloatView fv(model_);
    std::vector<std::unique_ptr<ScopedTensorSwap>> swaps;
    for (size_t i = 0; i < layers.size(); ++i)
      swaps.push_back(std::make_unique<ScopedTensorSwap>(layers[i]->weight, weights[i].to(layers[i]->weight.scalar_type())));
    double num = 0;
    for (size_t i = 0; i < x_.size(); ++i)
      num += (block(b).forward(x_[i]).to(at::kDouble) - y64_[i]).pow(2).sum().item<double>();
    return den_ == 0 ? (num == 0 ? 0.0 : std::numeric_limits<double>::infinity()) : num / den_;
  }

 private:
  const TransformerBlock& block(int b) const { return bm_.blocks[static_cast<size_t>(b)]; }
  void move_to(int b) {
    QF_CHECK(b >= at_, "awq: blocks are visited in forward order");
    for (; at_ < b; ++at_) {
      x_ = outputs();
      y_.clear();
      y64_.clear();
    }
  }
  // The float block's outputs on x_ (computed once per block), with their float64 copies and
  // Σ‖y‖², E's denominator, for the candidates' errors.
  const std::vector<at::Tensor>& outputs() {
    if (y_.empty()) {
      const FloatView fv(model_);
      den_ = 0;
      for (const at::Tensor& x : x_) {
        y_.push_back(block(at_).forward(x).detach());
        y64_.push_back(y_.back().to(at::kDouble));
        den_ += y64_.back().pow(2).sum().item<double>();
      }
    }
    return y_;
  }

  torch::nn::Module& model_;
  const BlockModel bm_;
  const std::vector<std::string> paths_;
  std::vector<at::Tensor> x_, y_, y64_;
  double den_ = 0;
  int at_ = 0;
};

std::string leaf(const std::string& p) { return p.substr(p.rfind('.') + 1); }
std::string parent(const std::string& p) {
  const size_t i = p.rfind('.');
  return i == std::string::npos ? std::string() : p.substr(0, i);
}

// Where a group's inverse scale goes exactly: members (leaf names, all of them) under a parent
// named `parent_leaf`, folded into `home`, a sibling of the members or of their parent.
struct FoldRule {
  std::vector<std::string> members;
  const char* parent_leaf;
  const char* home;
  bool home_beside_members;
};
const std::vector<FoldRule>& fold_rules() {
  static const std::vector<FoldRule> kRules = {
      {{"k_proj", "q_proj", "v_proj"}, "self_attn", "input_layernorm", false},  // Llama / Mistral / Qwen2
      {{"gate_proj", "up_proj"}, "mlp", "post_attention_layernorm", false},
      {{"o_proj"}, "self_attn", "v_proj", true},  // attention is linear in V
      {{"down_proj"}, "mlp", "up_proj", true},    // act(gate) ⊙ up is linear in up
      {{"lm_head"}, "", "model.norm", false},     // the final norm feeds only the untied head
      {{"c_attn"}, "attn", "ln_1", false},        // GPT-2
      {{"c_fc"}, "mlp", "ln_2", false},
  };
  return kRules;
}

// The module s⁻¹ folds into, or nullptr (then each Linear keeps it as its pre_quant_scale).
torch::nn::Module* fold_home(const torch::nn::Module& model, const std::vector<std::string>& paths, int64_t K,
                             std::string& home_path) {
  std::vector<std::string> leaves;
  for (const std::string& p : paths) {
    if (parent(p) != parent(paths[0])) return nullptr;
    leaves.push_back(leaf(p));
  }
  std::sort(leaves.begin(), leaves.end());
  const std::string par = parent(paths[0]);
  for (const FoldRule& r : fold_rules()) {
    if (leaves != r.members || leaf(par) != r.parent_leaf) continue;
    const std::string base = r.home_beside_members ? par : parent(par);
    home_path = base.empty() ? r.home : base + "." + r.home;
    for (const auto& item : model.named_modules()) {
      if (item.key() != home_path) continue;
      torch::nn::Module* m = item.value().get();
      if (auto* n = m->as<nn::RMSNormImpl>()) return n->weight.numel() == K ? m : nullptr;
      if (auto* n = m->as<nn::LayerNormImpl>())
        return n->options.elementwise_affine() && n->weight.numel() == K ? m : nullptr;
      // A home whose weight grid is already fixed would no longer round onto it after the division.
      if (auto* l = m->as<nn::LinearImpl>())
        return l->weight.defined() && !l->frozen() && !(l->weight_quantizer() && l->weight_quantizer()->calibrated()) &&
                       l->options.out_features() == K
                   ? m
                   : nullptr;
    }
    return nullptr;
  }
  return nullptr;
}

// Every tensor AWQ changes, as it was, to put back when the float output moved.
class Undo {
 public:
  void save(const at::Tensor& t) {
    if (t.defined() && seen_.insert(t.unsafeGetTensorImpl()).second) saved_.emplace_back(t, t.detach().clone());
  }
  void save_pre_quant_scale(nn::LinearImpl* l) {
    if (!pqs_.count(l)) pqs_[l] = l->pre_quant_scale().defined() ? l->pre_quant_scale().clone() : at::Tensor();
  }
  void restore() {
    at::NoGradGuard g;
    for (auto& [t, v] : saved_) t.detach().copy_(v);
    for (auto& [l, v] : pqs_)
      if (l->pre_quant_scale().defined()) l->set_pre_quant_scale(v.defined() ? v : at::ones_like(l->pre_quant_scale()));
  }

 private:
  std::set<const c10::TensorImpl*> seen_;
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;
  std::map<nn::LinearImpl*, at::Tensor> pqs_;
};

// x·s⁻¹ before the group: into the home's output, or the members' pre_quant_scale.
void place_inverse_scale(torch::nn::Module* home, const at::Tensor& s, const std::vector<nn::LinearImpl*>& members,
                         Undo& undo) {
  at::NoGradGuard g;
  auto div = [&](const at::Tensor& t, bool rows) {
    if (!t.defined()) return;
    undo.save(t);
    t.detach().div_(rows ? s.unsqueeze(1).to(t.scalar_type()) : s.to(t.scalar_type()));
  };
  if (!home) {
    for (nn::LinearImpl* l : members) {
      undo.save_pre_quant_scale(l);
      const at::Tensor old = l->pre_quant_scale().defined() ? l->pre_quant_scale() : at::ones_like(s);
      l->set_pre_quant_scale(old / s);
    }
  } else if (auto* n = home->as<nn::RMSNormImpl>()) {
    div(n->weight, false);
  } else if (auto* n = home->as<nn::LayerNormImpl>()) {
    div(n->weight, false);
    div(n->bias, false);
  } else if (auto* l = home->as<nn::LinearImpl>()) {
    div(l->weight, true);
    if (l->options.bias()) div(l->bias, false);
  }
}

// Why AWQ does not round this layer (empty: it does).
std::string unfit(nn::LinearImpl* l) {
  if (!l->quantized() || !l->scheme().weights) return "float weights";
  const QType qt = l->scheme().weights->spec.qtype;
  if (!qt.is_integer()) return "AWQ scales integer grids, the weights are " + std::string(qt.name);
  if (l->weight_quantizer()->calibrated()) return "its weight grid is already fixed (loaded or learned)";
  return "";
}

// A clipping decision, applied once the scales are checked against the float model.
struct PendingClip {
  nn::LinearImpl* layer;
  at::Tensor ratio;
  QSpec spec;
};

// Searches, scales and folds one group; the clipping ratios wait in `clips`.
void scale_group(const torch::nn::Module& model, InputGroup& g, const AwqOptions& o, BlockStates* blocks, AwqGroup& ag,
                 Undo& undo, std::vector<PendingClip>& clips) {
  const at::Tensor x = at::cat(g.rows, 0);
  const at::Tensor mean_abs = (g.abs_sum / static_cast<double>(g.n)).to(at::kFloat);
  std::vector<nn::LinearImpl*> rounded;
  std::vector<at::Tensor> w;
  std::vector<QSpec> specs;
  for (nn::LinearImpl* l : g.layers)
    if (unfit(l).empty()) {
      rounded.push_back(l);
      w.push_back(l->weight.detach().to(at::kFloat));
      specs.push_back(l->scheme().weights->spec);
    }
  const int block = blocks ? blocks->block_of(g.paths) : -1;
  const AwqScaleSearch found =
      block < 0 ? awq_search_scale(x, mean_abs, w, specs, o)
                : awq_search_scale(mean_abs, w, specs, o, [&](const std::vector<at::Tensor>& wq) {
                    return blocks->error(block, rounded, wq);
                  });
  ag.objective = block < 0 ? "layer" : "block " + blocks->path(block);
  ag.alpha = found.alpha;
  ag.duo = found.duo;
  ag.error_rtn = found.error_rtn;
  ag.error_scaled = found.error_scaled;
  ag.rows = x.size(0);
  const at::Tensor& s = found.scale;
  std::string home_path;
  const bool scaled = ag.scaled();
  torch::nn::Module* home = scaled ? fold_home(model, g.paths, s.numel(), home_path) : nullptr;
  ag.scale_home = !scaled ? "none (identity)" : home ? home_path : "pre_quant_scale";
  if (scaled) {
    at::NoGradGuard guard;
    for (nn::LinearImpl* l : g.layers) {
      undo.save(l->weight);
      l->weight.detach().mul_(s.unsqueeze(0).to(l->weight.scalar_type()));
    }
    place_inverse_scale(home, s, g.layers, undo);
  }
  const at::Tensor xs = x / s.unsqueeze(0);
  std::vector<at::Tensor> ws, wq;
  for (size_t i = 0; i < rounded.size(); ++i) {
    ws.push_back(rounded[i]->weight.detach().to(at::kFloat));
    wq.push_back(awq_round(ws.back(), specs[i]));
  }
  ag.layer_error_scaled = ag.error_clipped = awq_group_error(xs, ws, wq);
  if (!o.clip) return;
  double ratio_sum = 0;
  int64_t clip_blocks = 0;
  for (size_t i = 0; i < rounded.size(); ++i) {
    const std::string& path = g.paths[static_cast<size_t>(
        std::find(g.layers.begin(), g.layers.end(), rounded[i]) - g.layers.begin())];
    const std::string name = leaf(path);
    // AutoAWQ leaves q/k unclipped: their error is amplified by the attention scores, not seen here.
    const bool skip = name == "q_proj" || name == "k_proj" || specs[i].granularity == Granularity::kPerTensor;
    if (skip) continue;
    const at::Tensor ratio = awq_search_clip(xs, ws[i], specs[i], o);
    ratio_sum += ratio.sum().item<double>();
    clip_blocks += ratio.numel();
    wq[i] = awq_round(awq_apply_clip(ws[i], ratio, specs[i]), specs[i]);
    clips.push_back({rounded[i], ratio, specs[i]});
    ag.clipped.push_back(path);
  }
  ag.mean_clip = clip_blocks > 0 ? ratio_sum / static_cast<double>(clip_blocks) : 1.0;
  ag.error_clipped = awq_group_error(xs, ws, wq);
}

// A group AWQ cannot scale: why, or empty.
std::string group_unfit(const InputGroup& g) {
  bool any = false;
  for (nn::LinearImpl* l : g.layers) {
    if (l->frozen() || !l->weight.defined()) return "a Linear reading the same input is frozen";
    any = any || unfit(l).empty();
  }
  return any ? "" : unfit(g.layers[0]);
}

}  // namespace

std::vector<std::string> awq_clipped_layers(const AwqReport& report) {
  std::vector<std::string> out;
  for (const AwqGroup& g : report.groups) out.insert(out.end(), g.clipped.begin(), g.clipped.end());
  return out;
}

AwqReport awq(torch::nn::Module& model, int64_t batches, const RunBatch& run, const AwqOptions& o) {
  QF_REQUIRE(batches > 0, "awq: needs at least one calibration batch");
  QF_REQUIRE(o.sample_rows > 0, "awq: sample_rows must be > 0, got ", o.sample_rows);
  require_no_calibrated_kv_scales(model, "awq");  // v_proj's scales change the values a cache keeps
  const auto t0 = std::chrono::steady_clock::now();
  AwqReport rep;
  at::NoGradGuard no_grad;
  // The model's mode comes back on every exit, a thrown error included.
  struct ModeGuard {
    torch::nn::Module& m;
    bool was_training;
    ~ModeGuard() { m.train(was_training); }
  } mode{model, model.is_training()};
  model.eval();
  FloatView float_view(model);
  const at::Tensor y0 = run(0).detach().clone();
  GroupCapture capture(model, (o.sample_rows + batches - 1) / batches, o.seed);
  capture.run(batches, run);
  std::unique_ptr<BlockStates> blocks;
  if (o.objective == AwqObjective::kBlock) blocks = std::make_unique<BlockStates>(model, batches, run, o.sample_rows);
  Undo undo;
  std::vector<PendingClip> clips;
  for (InputGroup& g : capture.groups()) {
    std::string why = group_unfit(g);
    if (!why.empty()) {
      for (const std::string& p : g.paths) rep.skipped.push_back(p + ": " + why);
      continue;
    }
    const auto g0 = std::chrono::steady_clock::now();
    AwqGroup ag;
    ag.layers = g.paths;
    try {
      scale_group(model, g, o, blocks.get(), ag, undo, clips);
    } catch (const Error& e) {
      undo.restore();
      throw Error("awq: " + g.paths[0] + ": " + e.what());
    }
    g.rows.clear();
    ag.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count();
    rep.groups.push_back(std::move(ag));
  }
  rep.output_change = relative_change(run(0), y0);
  if (!(rep.output_change <= kAwqTolerance)) {
    undo.restore();
    throw Error("awq: the float model's output changed by " + std::to_string(rep.output_change) +
                " (relative) after scaling; undone (does a layer use its weight outside forward()?)");
  }
  for (const PendingClip& c : clips) {
    at::NoGradGuard g;
    c.layer->weight.detach().copy_(awq_apply_clip(c.layer->weight.detach(), c.ratio, c.spec));
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace qforge::ptq
