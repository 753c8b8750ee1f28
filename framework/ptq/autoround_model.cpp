// solve_autoround(): AutoRound over a Llama-family or GPT-2 model, one transformer block at a time.
// As auto-round's default (enable_quanted_input): the float block's output on the float model's
// inputs is the target, the quantized block reads the output of the blocks quantized before it.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "fake_quant/fake_quantize.h"
#include "framework/api/progress.h"
#include "framework/core/error.h"
#include "framework/nn/linear.h"
#include "framework/ptq/autoround.h"
#include "framework/ptq/block_capture.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/layer_access.h"

namespace qforge::ptq {

namespace {

// The AutoRound layers of one block, in forward (module) order.
struct BlockWork {
  std::vector<QuantizableLayer*> layers;
  std::vector<LayerSolve> solves;
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
void autoround_layer_errors(QuantizableLayer& layer, const LayerRows& r, const at::Tensor& w_new, LayerSolve& ls) {
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

// Trains, writes and reports one block's AutoRound layers.
// X and Y: the block's inputs and targets over every sequence; xq: X per calibration batch (views).
void solve_block(const TransformerBlock& blk, BlockWork& work, const at::Tensor& X, const std::vector<at::Tensor>& xq,
                 const at::Tensor& Y, const SolveOptions& o, SolveReport& report, Progress& progress,
                 at::Generator& gen) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t rows_per_batch = (o.sample_rows + static_cast<int64_t>(xq.size()) - 1) / static_cast<int64_t>(xq.size());
  const std::map<QuantizableLayer*, LayerRows> rows = capture_rows(blk, work.layers, xq, rows_per_batch, gen);
  const double block_rtn = relative_mse(run_block(blk, xq), Y);
  std::vector<nn::LinearImpl*> lins;
  for (QuantizableLayer* l : work.layers) lins.push_back(l->module().as<nn::LinearImpl>());
  const AutoRoundBlockResult r = autoround_block(blk.forward, lins, X, Y, o.autoround, [&] { progress.update(1, blk.path); });
  for (size_t i = 0; i < work.layers.size(); ++i) {
    QuantizableLayer& layer = *work.layers[i];
    LayerSolve& ls = work.solves[i];
    autoround_layer_errors(layer, rows.at(&layer), r.weights[i], ls);
    const LayerAccess acc = access(layer);
    report.replaced.emplace(ls.path, FloatWeights{acc.weight.detach().clone(), at::Tensor()});
    acc.set_w2d(r.weights[i]);
    layer.weight_quantizer()->set_qparams(r.grids[i]);
  }
  const double block_after = relative_mse(run_block(blk, xq), Y);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char buf[200];
  std::snprintf(buf, sizeof buf, "block %s output error %.4g -> %.4g (round-to-nearest -> AutoRound), best step %lld of %lld",
                blk.path.c_str(), block_rtn, block_after, static_cast<long long>(r.best_iteration),
                static_cast<long long>(o.autoround.iterations));
  for (size_t i = 0; i < work.solves.size(); ++i) {
    LayerSolve& ls = work.solves[i];
    char clip[96];
    std::snprintf(clip, sizeof clip, "; mean clip max %.3f min %.3f", r.vars[i].alpha.mean().item<double>(),
                  r.vars[i].beta.mean().item<double>());
    ls.note = std::string(buf) + clip;
    ls.seconds = seconds / static_cast<double>(work.solves.size());  // the block's time, shared
    report.layers.push_back(ls);
  }
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

void solve_autoround(torch::nn::Module& model, int64_t batches, const RunBatch& run, const SolveOptions& o,
                     std::map<QuantizableLayer*, LayerSolve>& pending, SolveReport& report) {
  const std::vector<std::string> paths = transformer_block_paths(model);
  std::map<int, BlockWork> work;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    const auto it = pending.find(layer);
    if (it == pending.end() || it->second.method.rfind("autoround", 0) != 0) continue;
    const int b = block_index(paths, path);
    QF_REQUIRE(b >= 0, path, ": AutoRound needs the layer inside a transformer block");
    work[b].layers.push_back(layer);
    work[b].solves.push_back(it->second);
  }
  if (work.empty()) return;
  const BlockModel bm = transformer_blocks(model);
  const std::vector<at::Tensor> ids = capture_token_ids(bm, batches, run);
  for (const at::Tensor& t : ids)
    QF_REQUIRE(t.dim() == 2 && t.size(1) == ids[0].size(1), "autoround: calibration batches of token ids [B, T] with one T; got ",
               t.sizes(), " and ", ids[0].sizes());
  std::vector<at::Tensor> xf, xq;
  {
    const FloatView fv(model);
    for (const at::Tensor& t : ids) xf.push_back(bm.embed(t).detach());
  }
  for (const at::Tensor& t : ids) xq.push_back(bm.embed(t).detach());
  Progress progress("ptq autoround", static_cast<int64_t>(work.size()) * o.autoround.iterations);
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
      try {
        const at::Tensor Y = join_batches(yf), X = join_batches(xq);
        solve_block(blk, w->second, X, xq, Y, o, report, progress, gen);
      } catch (const Error& e) {
        throw Error("ptq autoround: " + blk.path + ": " + e.what());
      }
      for (QuantizableLayer* l : w->second.layers) pending.erase(l);
    }
    for (at::Tensor& x : xq) x = blk.forward(x).detach();
    xf = std::move(yf);
  }
  progress.finish();
}

}  // namespace qforge::ptq
