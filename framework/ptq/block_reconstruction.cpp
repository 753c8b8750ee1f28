// solve_block_reconstruction(): the block-wise methods, AutoRound and BRECQ, over a Llama-family or
// GPT-2 model, one transformer block at a time. As auto-round's default (enable_quanted_input) and
// BRECQ: the float block's output on the float model's inputs is the target, the quantized block
// reads the output of the blocks quantized before it.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "fake_quant/fake_quantize.h"
#include "framework/api/progress.h"
#include "framework/core/error.h"
#include "framework/nn/linear.h"
#include "framework/ptq/autoround.h"
#include "framework/ptq/block_capture.h"
#include "framework/ptq/brecq.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/layer_access.h"

namespace qforge::ptq {

namespace {

// The layers of one block a block-wise method rounds, in forward (module) order.
struct BlockWork {
  std::vector<QuantizableLayer*> layers;
  std::vector<LayerSolve> solves;
};

// What a block-wise method wrote: per layer its grid and rounded weight, a note for the block and
// one per layer.
struct BlockRounding {
  std::vector<QParams> grids;
  std::vector<at::Tensor> weights;
  std::string block_note;
  std::vector<std::string> layer_notes;
};

// Sampled input rows of a layer as its weight multiplies them: xf before, xq after its input quantizer.
struct LayerRows {
  std::vector<at::Tensor> xf, xq;
};

at::Tensor run_block(const TransformerBlock& blk, const std::vector<at::Tensor>& xs) {
  std::vector<at::Tensor> ys;
  for (const at::Tensor& x : xs) ys.push_back(blk.forward(x).detach());
  return at::cat(ys, 0);
}

// One forward of the block over every sequence, recording its layers' inputs (the per-layer report).
std::map<QuantizableLayer*, LayerRows> capture_rows(const TransformerBlock& blk, const std::vector<QuantizableLayer*>& layers,
                                                    const std::vector<at::Tensor>& xq, int64_t rows_per_batch,
                                                    at::Generator& gen) {
  std::map<QuantizableLayer*, LayerRows> rows;
  const ScopedInputTaps taps(layers, [&](QuantizableLayer& layer, const at::Tensor& x) {
    const LayerAccess acc = access(layer);
    const at::Tensor xf = acc.rows(x.detach()).to(at::kFloat);
    Quantizer iq = layer.input_quantizer();
    const at::Tensor xqr = iq ? acc.rows(iq->forward(x.detach())).to(at::kFloat) : xf;
    const int64_t keep = std::min<int64_t>(rows_per_batch, xf.size(0));
    const at::Tensor idx = at::randperm(xf.size(0), gen, at::TensorOptions().dtype(at::kLong)).slice(0, 0, keep);
    rows[&layer].xf.push_back(xf.index_select(0, idx));
    rows[&layer].xq.push_back(xqr.index_select(0, idx));
  });
  run_block(blk, xq);
  return rows;
}

// The layer's relative output error with round-to-nearest (its weight as it is) and with w_new.
void block_layer_errors(QuantizableLayer& layer, const LayerRows& r, const at::Tensor& w_new, LayerSolve& ls) {
  const LayerAccess acc = access(layer);
  const at::Tensor W = acc.w2d().detach().to(at::kFloat);
  const at::Tensor xf = at::cat(r.xf, 0), xq = at::cat(r.xq, 0);
  const at::Tensor b = acc.bias.defined() ? acc.bias.detach().to(at::kFloat) : at::zeros({W.size(0)});
  const at::Tensor yf = at::matmul(xf, W.t()) + b;
  const at::Tensor w_rtn = fake_quantize(acc.weight.detach(), layer.weight_quantizer()->qparams(acc.weight)).reshape(W.sizes());
  ls.rows = xf.size(0);
  ls.error_before = relative_mse(at::matmul(xq, w_rtn.to(at::kFloat).t()) + b, yf);
  ls.error_after = relative_mse(at::matmul(xq, w_new.t()) + b, yf);
}

BlockRounding train_autoround(const TransformerBlock& blk, const std::vector<nn::LinearImpl*>& lins, const at::Tensor& X,
                              const at::Tensor& Y, const SolveOptions& o, Progress& progress) {
  const AutoRoundBlockResult r = autoround_block(blk.forward, lins, X, Y, o.autoround, [&] { progress.update(1, blk.path); });
  BlockRounding out{r.grids, r.weights, "", {}};
  char buf[96];
  std::snprintf(buf, sizeof buf, "best step %lld of %lld", static_cast<long long>(r.best_iteration),
                static_cast<long long>(o.autoround.iterations));
  out.block_note = buf;
  for (const AutoRoundVars& v : r.vars) {
    std::snprintf(buf, sizeof buf, "; mean clip max %.3f min %.3f", v.alpha.mean().item<double>(), v.beta.mean().item<double>());
    out.layer_notes.push_back(buf);
  }
  return out;
}

BlockRounding train_brecq(const TransformerBlock& blk, const std::vector<nn::LinearImpl*>& lins, const at::Tensor& X,
                          const at::Tensor& Y, const at::Tensor& F, const SolveOptions& o, Progress& progress) {
  const BrecqBlockResult r = brecq_block(blk.forward, lins, X, Y, F, o.brecq, [&] { progress.update(1, blk.path); });
  BlockRounding out{r.grids, r.weights, "", {}};
  char buf[160];
  std::snprintf(buf, sizeof buf, "%lld Adam steps, %s loss %.4g -> %.4g (soft rounding)",
                static_cast<long long>(o.brecq.iterations), F.defined() ? "Fisher-weighted" : "unweighted", r.first_loss,
                r.last_loss);
  out.block_note = buf;
  for (size_t i = 0; i < r.weights.size(); ++i) {
    std::snprintf(buf, sizeof buf, "; %.1f %% of h(V) binary, %.1f %% rounded up", 100 * r.binary_fraction[i],
                  100 * r.rounded_up[i]);
    out.layer_notes.push_back(buf);
  }
  return out;
}

// Trains, writes and reports one block's layers of one method ("autoround" or "brecq").
// X and Y: the block's inputs and targets over every sequence; xq: X per calibration batch (views);
// F: BRECQ's Fisher weights (undefined: none).
void solve_block(const TransformerBlock& blk, const std::string& method, BlockWork& work, const at::Tensor& X,
                 const std::vector<at::Tensor>& xq, const at::Tensor& Y, const at::Tensor& F, const SolveOptions& o,
                 SolveReport& report, Progress& progress, at::Generator& gen) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t rows_per_batch = (o.sample_rows + static_cast<int64_t>(xq.size()) - 1) / static_cast<int64_t>(xq.size());
  const std::map<QuantizableLayer*, LayerRows> rows = capture_rows(blk, work.layers, xq, rows_per_batch, gen);
  const double block_rtn = relative_mse(run_block(blk, xq), Y);
  std::vector<nn::LinearImpl*> lins;
  for (QuantizableLayer* l : work.layers) lins.push_back(l->module().as<nn::LinearImpl>());
  const BlockRounding r =
      method == "brecq" ? train_brecq(blk, lins, X, Y, F, o, progress) : train_autoround(blk, lins, X, Y, o, progress);
  for (size_t i = 0; i < work.layers.size(); ++i) {
    QuantizableLayer& layer = *work.layers[i];
    block_layer_errors(layer, rows.at(&layer), r.weights[i], work.solves[i]);
    const LayerAccess acc = access(layer);
    report.replaced.emplace(work.solves[i].path, FloatWeights{acc.weight.detach().clone(), at::Tensor()});
    acc.set_w2d(r.weights[i]);
    layer.weight_quantizer()->set_qparams(r.grids[i]);
  }
  const double block_after = relative_mse(run_block(blk, xq), Y);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char buf[200];
  std::snprintf(buf, sizeof buf, "block %s output error %.4g -> %.4g (round-to-nearest -> %s), ", blk.path.c_str(),
                block_rtn, block_after, method == "brecq" ? "BRECQ" : "AutoRound");
  for (size_t i = 0; i < work.solves.size(); ++i) {
    LayerSolve& ls = work.solves[i];
    ls.note = std::string(buf) + r.block_note + r.layer_notes[i];
    ls.seconds = seconds / static_cast<double>(work.solves.size());  // the block's time, shared
    report.layers.push_back(ls);
  }
}

// BRECQ's F for one block: the squared gradient of the float model's next-token cross-entropy
// (summed over the batch's tokens) with respect to the block's float output yf, per calibration
// batch, through the float blocks after it and the head; normalised to mean 1 over the block.
at::Tensor fisher_weights(torch::nn::Module& model, const BlockModel& bm, size_t block, const std::vector<at::Tensor>& yf,
                          const std::vector<at::Tensor>& ids) {
  const FloatView fv(model);
  at::AutoGradMode grad_on(true);
  std::vector<at::Tensor> g2;
  for (size_t b = 0; b < yf.size(); ++b) {
    const at::Tensor y = yf[b].detach().clone().requires_grad_(true);
    at::Tensor h = y;
    for (size_t j = block + 1; j < bm.blocks.size(); ++j) h = bm.blocks[j].forward(h);
    const at::Tensor logits = bm.head(h);
    const int64_t T = logits.size(1);
    QF_REQUIRE(T > 1, "brecq: the Fisher weights need sequences of at least 2 tokens (a next token to predict)");
    const at::Tensor loss = at::cross_entropy_loss(logits.slice(1, 0, T - 1).reshape({-1, logits.size(2)}).to(at::kFloat),
                                                   ids[b].slice(1, 1, T).reshape({-1}), {}, at::Reduction::Sum);
    const at::Tensor g = torch::autograd::grad({loss}, {y})[0];
    g2.push_back(g.detach().pow(2));
  }
  at::Tensor f = at::cat(g2, 0);
  const double mean = f.mean().item<double>();
  QF_REQUIRE(std::isfinite(mean) && mean > 0, "brecq: the Fisher weights of ", bm.blocks[block].path,
             " are all zero or not finite (mean ", mean, "); set ptq.brecq.fisher: false");
  return f.div_(mean);
}

// One tensor of the batches along dim 0; `batches` become views of it, so no second copy stays.
at::Tensor join_batches(std::vector<at::Tensor>& batches) {
  std::vector<int64_t> sizes;
  for (const at::Tensor& b : batches) sizes.push_back(b.size(0));
  const at::Tensor all = at::cat(batches, 0);
  batches = all.split_with_sizes(sizes, 0);
  return all;
}

}  // namespace

namespace {
// The block-wise methods, in the order they run within a block.
constexpr const char* kBlockMethods[] = {"autoround", "brecq"};

std::string block_method_of(const std::string& method) {
  for (const char* m : kBlockMethods)
    if (method.rfind(m, 0) == 0) return m;
  return "";
}
}  // namespace

void solve_block_reconstruction(torch::nn::Module& model, int64_t batches, const RunBatch& run, const SolveOptions& o,
                                std::map<QuantizableLayer*, LayerSolve>& pending, SolveReport& report) {
  const std::vector<std::string> paths = transformer_block_paths(model);
  std::map<int, std::map<std::string, BlockWork>> work;  // block -> method -> its layers
  int64_t steps = 0;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    const auto it = pending.find(layer);
    if (it == pending.end()) continue;
    const std::string method = block_method_of(it->second.method);
    if (method.empty()) continue;
    const int b = block_index(paths, path);
    QF_REQUIRE(b >= 0, path, ": ", method, " needs the layer inside a transformer block");
    BlockWork& w = work[b][method];
    if (w.layers.empty()) steps += method == "brecq" ? o.brecq.iterations : o.autoround.iterations;
    w.layers.push_back(layer);
    w.solves.push_back(it->second);
  }
  if (work.empty()) return;
  const BlockModel bm = transformer_blocks(model);
  const std::vector<at::Tensor> ids = capture_token_ids(bm, batches, run);
  for (const at::Tensor& t : ids)
    QF_REQUIRE(t.dim() == 2 && t.size(1) == ids[0].size(1), "block reconstruction: calibration batches of token ids [B, T] "
               "with one T; got ", t.sizes(), " and ", ids[0].sizes());
  std::vector<at::Tensor> xf, xq;
  {
    const FloatView fv(model);
    for (const at::Tensor& t : ids) xf.push_back(bm.embed(t).detach());
  }
  for (const at::Tensor& t : ids) xq.push_back(bm.embed(t).detach());
  Progress progress("ptq block reconstruction", steps);
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  for (int i = 0; i <= work.rbegin()->first; ++i) {
    const TransformerBlock& blk = bm.blocks[static_cast<size_t>(i)];
    std::vector<at::Tensor> yf;
    {
      const FloatView fv(model);
      for (const at::Tensor& x : xf) yf.push_back(blk.forward(x).detach());
    }
    const auto w = work.find(i);
    if (w != work.end()) {
      for (const char* method : kBlockMethods) {
        const auto m = w->second.find(method);
        if (m == w->second.end()) continue;
        try {
          const at::Tensor F = method == std::string("brecq") && o.brecq.fisher
                                   ? fisher_weights(model, bm, static_cast<size_t>(i), yf, ids) : at::Tensor();
          const at::Tensor Y = join_batches(yf), X = join_batches(xq);
          solve_block(blk, method, m->second, X, xq, Y, F, o, report, progress, gen);
        } catch (const Error& e) {
          throw Error("ptq " + std::string(method) + ": " + blk.path + ": " + e.what());
        }
        for (QuantizableLayer* l : m->second.layers) pending.erase(l);
      }
    }
    for (at::Tensor& x : xq) x = blk.forward(x).detach();
    xf = std::move(yf);
  }
  progress.finish();
}

}  // namespace qforge::ptq
