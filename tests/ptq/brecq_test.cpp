// BRECQ: on a toy block (a Llama SwiGLU MLP, written out again here as the reference), block
// reconstruction lowers the block's output error below round-to-nearest and below layer-wise
// AdaRound; the Fisher-weighted loss at step 0 is the formula's; the rounding ends hard, each weight
// one grid step below or above its float value; on a small Llama with planted outlier channels the
// blocks' output error falls below round-to-nearest and layer-wise AdaRound, and the solved codes
// stay on fixed grids and freeze to the same outputs.
#include "framework/ptq/brecq.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "fake_quant/fake_quantize.h"
#include "framework/api/quantize.h"
#include "framework/api/quantizer.h"
#include "framework/models/llama.h"
#include "framework/nn/linear.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/ptq.h"
#include "tests/ptq/fixtures.h"

namespace qforge::ptq {
namespace {

using testing::blocks_error;
using testing::blocks_only;

// The reference block: LlamaMLP's forward written out, down(silu(gate(x)) · up(x)), on given weights.
at::Tensor reference_mlp(const at::Tensor& x, const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& wd) {
  return at::matmul(at::silu(at::matmul(x, wg.t())) * at::matmul(x, wu.t()), wd.t());
}

// Block 0's MLP of the outlier Llama, W3 groups of 32, its three Linears and their float weights.
struct ToyBlock {
  models::LlamaForCausalLM m = testing::outlier_llama(2);
  models::LlamaMlpImpl* mlp = nullptr;
  std::vector<nn::LinearImpl*> layers;
  std::vector<at::Tensor> w;  // float gate, up, down
  ToyBlock() {
    quantize(*m, blocks_only(qint3, {"model.embed_tokens", "lm_head"}));
    mlp = m->model->layers->ptr(0)->as<models::LlamaDecoderLayerImpl>()->mlp.get();
    layers = {mlp->gate_proj.get(), mlp->up_proj.get(), mlp->down_proj.get()};
    for (nn::LinearImpl* l : layers) w.push_back(l->weight.detach().clone());
  }
  at::Tensor forward(const at::Tensor& x) const { return mlp->forward(x); }
  QParams grid(size_t i) const { return layers[i]->weight_quantizer()->qparams(w[i]); }
};

// Hidden states with a few large channels, as a block's input has.
at::Tensor block_inputs(int64_t sequences, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({sequences, 32, 64});
  x.select(2, 3).mul_(8);
  x.select(2, 40).mul_(5);
  return x;
}

double relative_error(const at::Tensor& y, const at::Tensor& y_float) { return relative_mse(y, y_float); }

// Layer-wise AdaRound on the same block: gate and up on the block's input, down on its quantized
// upstream's output, each against its float layer's output.
std::vector<at::Tensor> layerwise_adaround(const ToyBlock& b, const at::Tensor& x, const AdaRoundOptions& o) {
  const at::Tensor rows = x.reshape({-1, 64});
  const at::Tensor wg = adaround(b.w[0], b.grid(0), rows, at::matmul(rows, b.w[0].t()), o).weight;
  const at::Tensor wu = adaround(b.w[1], b.grid(1), rows, at::matmul(rows, b.w[1].t()), o).weight;
  const at::Tensor hq = at::silu(at::matmul(rows, wg.t())) * at::matmul(rows, wu.t());
  const at::Tensor hf = at::silu(at::matmul(rows, b.w[0].t())) * at::matmul(rows, b.w[1].t());
  const at::Tensor wd = adaround(b.w[2], b.grid(2), hq, at::matmul(hf, b.w[2].t()), o).weight;
  return {wg, wu, wd};
}

TEST(Brecq, ToyBlockOutputErrorBelowRoundToNearestAndLayerwiseAdaRound) {
  ToyBlock b;
  at::NoGradGuard g;
  const at::Tensor x = block_inputs(16, 1), held_out = block_inputs(8, 2);
  at::Tensor target, y_float;
  {
    const FloatView fv(*b.m);
    target = b.forward(x).detach();
    y_float = b.forward(held_out).detach();
  }
  // The reference twin computes the float block.
  ASSERT_LT(relative_error(reference_mlp(held_out, b.w[0], b.w[1], b.w[2]), y_float), 1e-10);
  std::vector<at::Tensor> rtn;
  for (size_t i = 0; i < 3; ++i) rtn.push_back(fake_quantize(b.w[i], b.grid(i)));
  const double e_rtn = relative_error(reference_mlp(held_out, rtn[0], rtn[1], rtn[2]), y_float);
  EXPECT_LT(std::abs(relative_error(b.forward(held_out), y_float) - e_rtn), 1e-6 * e_rtn)
      << "the fake-quant block is not round-to-nearest on the quantizers' grids";

  AdaRoundOptions ao;
  ao.iterations = 1000;
  ao.batch_rows = 256;
  const std::vector<at::Tensor> ada = layerwise_adaround(b, x, ao);
  const double e_ada = relative_error(reference_mlp(held_out, ada[0], ada[1], ada[2]), y_float);

  BrecqOptions bo;
  bo.iterations = 1000;
  bo.batch_size = 8;
  const BrecqBlockResult r = brecq_block([&](const at::Tensor& in) { return b.forward(in); }, b.layers, x, target,
                                         at::Tensor(), bo);
  ASSERT_EQ(r.weights.size(), 3u);
  const double e_brecq = relative_error(reference_mlp(held_out, r.weights[0], r.weights[1], r.weights[2]), y_float);
  std::printf("toy block W3 g32 held-out relative MSE: rtn %.5f layer-wise adaround %.5f brecq %.5f\n", e_rtn, e_ada,
              e_brecq);
  EXPECT_LT(e_brecq, e_rtn);
  EXPECT_LT(e_brecq, e_ada);
  // The layers' own weights and quantizers are as they were (the caller writes the result).
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::equal(b.layers[i]->weight.detach(), b.w[i]));
    EXPECT_TRUE(b.layers[i]->weight_quantizer()->fake_quant());
  }
}

TEST(Brecq, TheRoundingEndsHardOneGridStepBelowOrAboveEachWeight) {
  ToyBlock b;
  at::NoGradGuard g;
  const at::Tensor x = block_inputs(16, 3);
  at::Tensor target;
  {
    const FloatView fv(*b.m);
    target = b.forward(x).detach();
  }
  BrecqOptions o;
  o.iterations = 1000;
  const BrecqBlockResult r = brecq_block([&](const at::Tensor& in) { return b.forward(in); }, b.layers, x, target,
                                         at::Tensor(), o);
  for (size_t i = 0; i < 3; ++i) {
    // h(V) ends within 0.01 of 0 or 1 for (almost) every weight: the annealed regulariser's work.
    EXPECT_GE(r.binary_fraction[i], 0.97) << i;
    const QParams& qp = r.grids[i];
    const int64_t n = b.w[i].size(0);
    const at::Tensor s = qp.scale.to(at::kFloat).reshape({n, -1}).repeat_interleave(32, 1);
    const at::Tensor z = qp.zero_point.to(at::kFloat).reshape({n, -1}).repeat_interleave(32, 1);
    const at::Tensor scaled = b.w[i] / s;
    const at::Tensor codes = r.weights[i] / s + z;
    // Integer codes in range, each the floor or the floor + 1 of w / s + z (clamped to the range).
    EXPECT_LT((codes - codes.round()).abs().max().item<double>(), 1e-3) << i;
    const at::Tensor lo = (at::floor(scaled) + z).clamp(qp.spec.quant_min(), qp.spec.quant_max());
    const at::Tensor hi = (at::floor(scaled) + 1 + z).clamp(qp.spec.quant_min(), qp.spec.quant_max());
    EXPECT_TRUE(at::logical_or((codes - lo).abs() < 1e-3, (codes - hi).abs() < 1e-3).all().item<bool>()) << i;
    // On the grid: fake-quantizing the written weight gives it back.
    EXPECT_TRUE(at::allclose(fake_quantize(r.weights[i], qp), r.weights[i], 0, 1e-6)) << i;
  }
}

TEST(Brecq, TheFisherWeightedLossAtStepZeroIsTheFormulasWithTheFloatWeights) {
  ToyBlock b;
  at::NoGradGuard g;
  const at::Tensor x = block_inputs(4, 5);
  at::manual_seed(6);
  const at::Tensor target = at::randn({4, 32, 64});
  const at::Tensor fisher = at::rand({4, 32, 64}) * 2;
  BrecqOptions o;
  o.iterations = 1;
  o.batch_size = 4;  // every sequence: step 0's loss is over all of them
  const BrecqBlockResult r =
      brecq_block([&](const at::Tensor& in) { return b.forward(in); }, b.layers, x, target, fisher, o);
  // mean over tokens of Σ_h F (block(x) − target)², the soft weights starting at the float weights.
  const at::Tensor d = reference_mlp(x, b.w[0], b.w[1], b.w[2]) - target;
  const double expected = (fisher * d * d).sum(-1).mean().item<double>();
  EXPECT_NEAR(r.first_loss, expected, 1e-4 * expected);
  const BrecqBlockResult plain =
      brecq_block([&](const at::Tensor& in) { return b.forward(in); }, b.layers, x, target, at::Tensor(), o);
  EXPECT_NEAR(plain.first_loss, (d * d).sum(-1).mean().item<double>(), 1e-4 * expected);
  // Bad inputs name what is wrong.
  EXPECT_THROW(brecq_block([&](const at::Tensor& in) { return b.forward(in); }, b.layers, x, target,
                           fisher.slice(0, 0, 2), o),
               Error);
  o.iterations = 0;
  EXPECT_THROW(brecq_block([&](const at::Tensor& in) { return b.forward(in); }, b.layers, x, target, fisher, o), Error);
}

TEST(Brecq, LlamaBlocksOutputErrorBelowRoundToNearestAndLayerwiseAdaRoundAndTheCodesFreeze) {
  auto hidden = [](models::LlamaForCausalLM& m, const at::Tensor& ids) { return m->model->forward(ids); };
  const std::vector<std::string> keep = {"model.embed_tokens", "lm_head"};
  auto make = [] { return testing::outlier_llama(2); };
  const double rtn = blocks_error(make, hidden, qint3, keep, Rounding::kNearest);
  const double ada = blocks_error(make, hidden, qint3, keep, Rounding::kAdaRound);
  SolveReport rep;
  int solved = 0;
  auto on_grid_and_frozen = [&](models::LlamaForCausalLM& m, const at::Tensor& held_out) {
    solved = testing::expect_on_grid_and_frozen(m, hidden, held_out);  // packs the solved codes onto the int3 kernels
  };
  SolveOptions so;
  so.brecq.iterations = 500;
  const double brecq = blocks_error(make, hidden, qint3, keep, Rounding::kBrecq, &rep,
                                    std::function<void(models::LlamaForCausalLM&, const at::Tensor&)>(on_grid_and_frozen), so);
  std::printf("Llama qint3 g32 blocks' output relative MSE: rtn %.5f adaround %.5f brecq %.5f\n", rtn, ada, brecq);
  EXPECT_LT(brecq, rtn);
  EXPECT_LT(brecq, ada);
  EXPECT_EQ(solved, 14);
  ASSERT_EQ(rep.layers.size(), 14u);  // 7 Linears per block; the embedding and head stay float
  for (const LayerSolve& ls : rep.layers) {
    EXPECT_EQ(ls.method, "brecq") << ls.path;
    EXPECT_NE(ls.note.find("Fisher-weighted"), std::string::npos) << ls.note;
    EXPECT_NE(ls.note.find("-> BRECQ"), std::string::npos) << ls.note;
    EXPECT_GT(ls.rows, 0) << ls.path;
    // Reported, not promised per layer: the block's output is what BRECQ reconstructs (a layer's own
    // error may rise, here o_proj's and down_proj's of block 1).
    EXPECT_TRUE(std::isfinite(ls.error_after) && ls.error_after >= 0) << ls.path;
    EXPECT_TRUE(rep.replaced.count(ls.path)) << ls.path;
  }
}

TEST(Brecq, LayersOutsideTheBlocksAreRefusedByARuleAndRoundedByGptqByDefault) {
  models::LlamaForCausalLM m = testing::outlier_llama(2);
  quantize(*m, blocks_only(qint4, {"model.embed_tokens"}));
  SolveOptions o;
  o.rounding = Rounding::kBrecq;
  o.bias_correction = true;
  for (const LayerSolve& ls : plan_solve(*m, o)) {
    if (ls.path == "lm_head") {
      EXPECT_EQ(ls.method, "gptq");  // no bias: no bias correction
      EXPECT_EQ(ls.note, "BRECQ reconstructs the transformer blocks; outside them GPTQ rounds this layer");
    } else {
      EXPECT_EQ(ls.method, "brecq") << ls.path;
      EXPECT_NE(ls.note.find("no bias correction after BRECQ"), std::string::npos) << ls.note;
    }
  }
  EXPECT_EQ(rounding_from_name("brecq"), Rounding::kBrecq);
  o.rules.push_back({"lm_head", Rounding::kBrecq});
  try {
    plan_solve(*m, o);
    ADD_FAILURE() << "a rule asking BRECQ for the head alone was accepted";
  } catch (const SolveError& e) {
    EXPECT_EQ(e.rule(), 0);
    EXPECT_NE(std::string(e.what()).find("brecq"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qforge::ptq
