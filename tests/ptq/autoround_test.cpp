// AutoRound: the rounding-with-offset formula against a scalar reference written here, gradients
// reaching every trainable variable, offsets and clipping factors kept in bounds, and on small
// Llama and GPT-2 models with planted outlier channels the final hidden state's error (after the
// final norm) below round-to-nearest's and GPTQ's at W3 and W2 groups of 32, the solved codes on a
// fixed grid, and the trained weight equal to the written one where the float16 scale moves z.
#include "framework/ptq/autoround.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <utility>

#include "fake_quant/fake_quantize.h"
#include "framework/api/quantize.h"
#include "framework/api/quantizer.h"
#include "framework/models/gpt2.h"
#include "framework/models/llama.h"
#include "framework/nn/linear.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/ptq.h"
#include "tests/ptq/fixtures.h"

namespace qforge::ptq {
namespace {

using testing::int_group_spec;

// The formula of autoround.h written out one weight at a time, in float as the library computes.
at::Tensor scalar_reference(const at::Tensor& w, const AutoRoundVars& p, const QSpec& spec) {
  const int64_t N = w.size(0), K = w.size(1), g = spec.granularity == Granularity::kPerGroup ? spec.group_size : K;
  const float qmin = static_cast<float>(spec.quant_min()), qmax = static_cast<float>(spec.quant_max());
  at::Tensor out = at::empty_like(w);
  auto W = w.accessor<float, 2>();
  auto V = p.v.accessor<float, 2>();
  auto O = out.accessor<float, 2>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K / g; ++j) {
      float lo = 0, hi = 0;
      for (int64_t k = j * g; k < (j + 1) * g; ++k) lo = std::min(lo, W[n][k]), hi = std::max(hi, W[n][k]);
      hi *= p.alpha[n][j].item<float>();
      lo *= p.beta[n][j].item<float>();
      float s = spec.symmetric ? std::max(hi, -lo) / ((qmax - qmin) / 2) : (hi - lo) / (qmax - qmin);
      s = std::max(s, kScaleEps);
      // z from the scale before its float16 rounding (calculate_qparams, then the weight quantizer).
      const float z = spec.symmetric ? 0.0f : std::clamp(qmin - std::nearbyint(lo / s), qmin, qmax);
      if (nibble_packed(spec.qtype)) s = round_scale_up_to_half(at::full({1}, s)).item<float>();
      for (int64_t k = j * g; k < (j + 1) * g; ++k) {
        const float q = std::clamp(std::nearbyint(W[n][k] * (1.0f / s) + V[n][k]) + z, qmin, qmax);
        O[n][k] = s * (q - z);
      }
    }
  return out;
}

AutoRoundVars random_vars(const at::Tensor& w, const QSpec& spec, uint64_t seed) {
  AutoRoundVars p = autoround_init(w, spec);
  at::manual_seed(seed);
  p.v = at::rand(p.v.sizes()) - 0.5;
  p.alpha = 0.5 + 0.5 * at::rand(p.alpha.sizes());
  p.beta = 0.5 + 0.5 * at::rand(p.beta.sizes());
  return p;
}

TEST(AutoRound, RoundingWithOffsetsAndClippingMatchesAScalarReference) {
  at::manual_seed(1);
  const at::Tensor w = at::randn({6, 64});
  for (const QSpec& spec : {int_group_spec(qint3, 32, false), int_group_spec(qint4, 32, true), int_group_spec(qint2, 0, false),
                            int_group_spec(qint4, 16, false), int_group_spec(qint8, 0, true)}) {
    const AutoRoundVars p = random_vars(w, spec, 2);
    const at::Tensor ref = scalar_reference(w, p, spec);
    const at::Tensor trained = autoround_weight(w, p, spec);
    const QParams grid = autoround_grid(w, p, spec);
    const at::Tensor written = round_with_offset(w, p.v, grid);
    const double step = grid.scale.max().item<double>();
    EXPECT_LT((trained - ref).abs().max().item<double>(), 1e-5 * step) << spec.to_string();
    EXPECT_LT((written - ref).abs().max().item<double>(), 1e-5 * step) << spec.to_string();
    // The written weight lies on its grid: fake-quant and freeze reproduce it.
    EXPECT_TRUE(at::allclose(fake_quantize(written, grid), written, 0, 1e-6)) << spec.to_string();
    // No offset and no clipping is round-to-nearest on the weight's own min/max grid.
    const AutoRoundVars none = autoround_init(w, spec);
    const at::Tensor rtn = fake_quantize(w, weight_minmax_qparams(w, spec, "test"));
    EXPECT_TRUE(at::allclose(autoround_weight(w, none, spec), rtn, 0, 1e-6)) << spec.to_string();
  }
  EXPECT_THROW(autoround_weight(w, autoround_init(w, int_group_spec(qint4, 0, true)), [] {
                 QSpec s = int_group_spec(qint4, 0, true);
                 s.granularity = Granularity::kPerTensor;
                 return s;
               }()),
               Error);
  EXPECT_THROW(autoround_init(w, int_group_spec(qint4, 24, true)), Error);
}

// A qint4 group whose mn / s is -7.502 before the scale's float16 rounding (up by 2^-10 from just
// above 1) and about -7.4965 after it: the two orders give zero points one apart.
TEST(AutoRound, TheTrainedWeightIsTheWrittenOneWhereTheFloat16ScaleMovesTheZeroPoint) {
  const QSpec spec = int_group_spec(qint4, 32, false);
  const double st = 1.0 + std::ldexp(1.0, -12);
  at::manual_seed(5);
  const at::Tensor w = at::cat({at::linspace(-7.502 * st, 7.498 * st, 32).reshape({1, 32}), at::randn({1, 32})}, 0);
  const QParams qp = weight_minmax_qparams(w, spec, "test");
  const float s16 = qp.scale[0][0].item<float>(), mn = w[0].min().item<float>();
  const float z_after = std::clamp(-8.0f - std::nearbyint(mn / s16), -8.0f, 7.0f);
  ASSERT_NE(qp.zero_point[0][0].item<int>(), static_cast<int>(z_after)) << "the group does not sit on the boundary";
  const AutoRoundVars none = autoround_init(w, spec);
  EXPECT_TRUE(at::allclose(autoround_weight(w, none, spec), fake_quantize(w, qp), 0, 1e-6));
  for (uint64_t seed : {6, 7, 8}) {
    AutoRoundVars p = autoround_init(w, spec);
    at::manual_seed(seed);
    p.v = (at::rand(p.v.sizes()) - 0.5) * (seed == 8 ? 0.0 : 1.0) + (seed == 8 ? 0.49 : 0.0);  // 8: every code up
    const at::Tensor trained = autoround_weight(w, p, spec);
    const at::Tensor written = round_with_offset(w, p.v, autoround_grid(w, p, spec));
    EXPECT_TRUE(at::allclose(trained, written, 0, 1e-6)) << "seed " << seed << ": " << (trained - written).abs().max().item<double>();
  }
}

TEST(AutoRound, GradientsReachTheOffsetsAndBothClippingFactors) {
  at::manual_seed(3);
  const at::Tensor w = at::randn({4, 64});
  for (bool symmetric : {false, true}) {
    const QSpec spec = int_group_spec(qint3, 32, symmetric);
    AutoRoundVars p = autoround_init(w, spec);
    for (at::Tensor* t : {&p.v, &p.alpha, &p.beta}) t->requires_grad_(true);
    const at::Tensor r = at::randn(w.sizes());
    (autoround_weight(w, p, spec) * r).sum().backward();
    EXPECT_GT(p.v.grad().abs().sum().item<double>(), 0) << symmetric;
    EXPECT_GT(p.alpha.grad().abs().sum().item<double>(), 0) << symmetric;
    EXPECT_GT(p.beta.grad().abs().sum().item<double>(), 0) << symmetric;
  }
}

using testing::token_batches;
models::LlamaForCausalLM outlier_llama() { return testing::outlier_llama(2); }

using testing::blocks_error;
using testing::blocks_only;

TEST(AutoRound, LlamaBlocksOutputErrorBelowRoundToNearestAndGptqAtW3AndW2) {
  auto hidden = [](models::LlamaForCausalLM& m, const at::Tensor& ids) { return m->model->forward(ids); };
  const std::vector<std::string> keep = {"model.embed_tokens", "lm_head"};
  for (QType q : {qint3, qint2}) {
    const double rtn = blocks_error(outlier_llama, hidden, q, keep, Rounding::kNearest);
    const double gptq = blocks_error(outlier_llama, hidden, q, keep, Rounding::kGptq);
    SolveReport rep;
    const double ar = blocks_error(outlier_llama, hidden, q, keep, Rounding::kAutoRound, &rep);
    std::printf("%s g32 blocks' output relative MSE: rtn %.5f gptq %.5f autoround %.5f\n", q.name, rtn, gptq, ar);
    EXPECT_LT(ar, rtn) << q.name;
    // At W2 GPTQ is worse than RTN here (it overfits 256 calibration rows): the margin below is over
    // an overfitting GPTQ, not a strong one.
    EXPECT_LT(ar, gptq) << q.name;
    ASSERT_EQ(rep.layers.size(), 14u);  // 7 Linears per block; the embedding and head stay float
    for (const LayerSolve& ls : rep.layers) {
      EXPECT_EQ(ls.method, "autoround") << ls.path;
      EXPECT_NE(ls.note.find("output error"), std::string::npos) << ls.path;
      EXPECT_GT(ls.rows, 0) << ls.path;
      EXPECT_TRUE(std::isfinite(ls.error_after)) << ls.path;
      EXPECT_TRUE(rep.replaced.count(ls.path)) << ls.path;
    }
  }
}

TEST(AutoRound, Gpt2BlocksOutputErrorBelowRoundToNearestAndTheCodesStayOnAFixedGrid) {
  auto make = [] {
    models::Gpt2Config c;
    c.vocab_size = 128, c.n_positions = 64, c.n_embd = 64, c.n_layer = 2, c.n_head = 4;
    at::manual_seed(9);
    models::Gpt2LMHeadModel m(c);
    m->init_weights();
    at::NoGradGuard g;
    for (const auto& item : m->named_parameters()) {
      at::Tensor p = item.value();
      if (item.key().find("ln_") != std::string::npos && item.key().rfind("weight") == item.key().size() - 6)
        p.index_put_({5}, 30.0);
    }
    m->eval();
    return m;
  };
  auto hidden = [](models::Gpt2LMHeadModel& m, const at::Tensor& ids) { return m->transformer->forward(ids); };
  const std::vector<std::string> keep = {"transformer.wte", "transformer.wpe"};  // the head is tied
  const double rtn = blocks_error(make, hidden, qint3, keep, Rounding::kNearest);
  int solved = 0;
  auto on_grid_and_frozen = [&](models::Gpt2LMHeadModel& m, const at::Tensor& held_out) {
    solved = testing::expect_on_grid_and_frozen(m, hidden, held_out);  // packs the solved codes onto the int3 kernels
  };
  const double ar = blocks_error(make, hidden, qint3, keep, Rounding::kAutoRound, nullptr,
                                 std::function<void(models::Gpt2LMHeadModel&, const at::Tensor&)>(on_grid_and_frozen));
  EXPECT_EQ(solved, 8);  // c_attn, attn.c_proj, c_fc, mlp.c_proj per block
  std::printf("GPT-2 qint3 g32 blocks' output relative MSE: rtn %.5f autoround %.5f\n", rtn, ar);
  EXPECT_LT(ar, rtn);
}

// The mean squared error of the MLP with the result's weights written in (quantizers bypassed).
double written_loss(models::LlamaDecoderLayerImpl* block, const std::vector<nn::LinearImpl*>& layers,
                    const AutoRoundBlockResult& r, const at::Tensor& x, const at::Tensor& target) {
  at::NoGradGuard g;
  std::vector<Quantizer> qs;
  for (nn::LinearImpl* l : layers) qs.push_back(l->weight_quantizer());
  const FloatView bypass(qs);
  std::vector<std::unique_ptr<ScopedTensorSwap>> swaps;
  for (size_t i = 0; i < layers.size(); ++i) swaps.push_back(std::make_unique<ScopedTensorSwap>(layers[i]->weight, r.weights[i]));
  return (block->mlp->forward(x) - target).pow(2).mean().item<double>();
}

TEST(AutoRound, OffsetsAndClippingFactorsStayInBounds) {
  models::LlamaForCausalLM m = outlier_llama();
  quantize(*m, blocks_only(qint2, {"model.embed_tokens", "lm_head"}));
  auto* block = m->model->layers->ptr(0)->as<models::LlamaDecoderLayerImpl>();
  std::vector<nn::LinearImpl*> layers = {block->mlp->gate_proj.get(), block->mlp->up_proj.get(),
                                         block->mlp->down_proj.get()};
  at::manual_seed(4);
  const at::Tensor x = at::randn({6, 16, 64});
  at::Tensor target;
  {
    at::NoGradGuard g;
    target = block->mlp->forward(x).detach() * 0.3;  // pulls every rounding down and every range in
  }
  AutoRoundOptions o;
  o.iterations = 40;
  o.lr = 0.2;  // large steps: the clamps must hold them
  o.batch_size = 6;  // every sequence each step: the written weights' loss is the kept step's
  int steps = 0;
  const AutoRoundBlockResult r =
      autoround_block([&](const at::Tensor& in) { return block->mlp->forward(in); }, layers, x, target, o, [&] { ++steps; });
  EXPECT_EQ(steps, 40);
  ASSERT_EQ(r.vars.size(), 3u);
  bool at_bound = false;
  for (const AutoRoundVars& v : r.vars) {
    EXPECT_LE(v.v.abs().max().item<double>(), 0.5);
    EXPECT_GE(v.alpha.min().item<double>(), 0.5);
    EXPECT_LE(v.alpha.max().item<double>(), 1.0);
    EXPECT_GE(v.beta.min().item<double>(), 0.5);
    EXPECT_LE(v.beta.max().item<double>(), 1.0);
    at_bound |= v.v.abs().max().item<double>() == 0.5 || v.alpha.min().item<double>() == 0.5;
  }
  EXPECT_TRUE(at_bound) << "the kept step " << r.best_iteration << " never met a bound: the clamps were not exercised";
  std::printf("best step %lld, first loss %.6g, best %.6g\n", static_cast<long long>(r.best_iteration), r.first_loss, r.best_loss);
  EXPECT_LE(r.best_loss, r.first_loss);
  EXPECT_NEAR(written_loss(block, layers, r, x, target), r.best_loss, 1e-5 * r.best_loss);  // here the last step's
  // The layers' weights and quantizers are as they were (the caller writes the result).
  for (nn::LinearImpl* l : layers) EXPECT_TRUE(l->weight_quantizer()->fake_quant());
  o.iterations = 0;
  EXPECT_THROW(autoround_block([&](const at::Tensor& in) { return block->mlp->forward(in); }, layers, x, target, o), Error);
}

// The target is the round-to-nearest block's own output plus a little noise, so step 0 is near the
// optimum and steps of 1.0 overshoot it: the best step is not the last, and the written weights must
// give the kept step's loss (every sequence each step, so the step losses compare), not the last's.
// (OffsetsAndClippingFactorsStayInBounds checks the other end: there the last step is the best.)
TEST(AutoRound, TheWrittenWeightsAreTheBestStepsNotTheLasts) {
  models::LlamaForCausalLM m = outlier_llama();
  quantize(*m, blocks_only(qint2, {"model.embed_tokens", "lm_head"}));
  auto* block = m->model->layers->ptr(0)->as<models::LlamaDecoderLayerImpl>();
  const std::vector<nn::LinearImpl*> layers = {block->mlp->gate_proj.get(), block->mlp->up_proj.get(),
                                               block->mlp->down_proj.get()};
  at::manual_seed(4);
  const at::Tensor x = at::randn({6, 16, 64});
  at::Tensor target;
  {
    at::NoGradGuard g;
    const at::Tensor y = block->mlp->forward(x).detach();  // the weights' round-to-nearest grids
    target = y + 0.01 * y.std() * at::randn(y.sizes());
  }
  AutoRoundOptions o;
  o.iterations = 40;
  o.lr = 1.0;
  o.batch_size = 6;
  const auto run = [&](const at::Tensor& in) { return block->mlp->forward(in); };
  const AutoRoundBlockResult r = autoround_block(run, layers, x, target, o);
  std::printf("best step %lld, losses first %.6g best %.6g last %.6g\n", static_cast<long long>(r.best_iteration),
              r.first_loss, r.best_loss, r.last_loss);
  ASSERT_LT(r.best_iteration, o.iterations - 1) << "the last step is the best: the check below cannot tell them apart";
  EXPECT_LT(r.best_loss, r.last_loss);
  EXPECT_NEAR(written_loss(block, layers, r, x, target), r.best_loss, 1e-5 * r.best_loss);
}

TEST(AutoRound, LayersOutsideTheBlocksAreRefusedByARuleAndRoundedByGptqByDefault) {
  models::LlamaForCausalLM m = outlier_llama();
  quantize(*m, blocks_only(qint4, {"model.embed_tokens"}));
  SolveOptions o;
  o.rounding = Rounding::kAutoRound;
  for (const LayerSolve& ls : plan_solve(*m, o)) {
    if (ls.path == "lm_head") {
      EXPECT_EQ(ls.method, "gptq");
      EXPECT_EQ(ls.note, "AutoRound reconstructs the transformer blocks; outside them GPTQ rounds this layer");
    } else {
      EXPECT_EQ(ls.method, "autoround") << ls.path;
    }
  }
  // A head GPTQ cannot round (a codebook) keeps round-to-nearest and says why.
  models::LlamaForCausalLM k = outlier_llama();
  Scheme s = blocks_only(qint4, {"model.embed_tokens"});
  LayerRule head;
  head.pattern = "lm_head";
  head.weights = qkmeans4;
  s.rules.push_back(head);
  quantize(*k, s);
  int heads = 0;
  for (const LayerSolve& ls : plan_solve(*k, o))
    if (ls.path == "lm_head") {
      ++heads;
      EXPECT_EQ(ls.method, "rtn");
      EXPECT_EQ(ls.note, "AutoRound reconstructs the transformer blocks; GPTQ, for the layers outside them, does not "
                         "apply: GPTQ rounds onto uniform grids; codebook weights take kmeans");
    }
  EXPECT_EQ(heads, 1);
  o.rules.push_back({"lm_head", Rounding::kAutoRound});
  try {
    plan_solve(*m, o);
    ADD_FAILURE() << "a rule asking AutoRound for the head alone was accepted";
  } catch (const SolveError& e) {
    EXPECT_EQ(e.rule(), 0);
  }
}

}  // namespace
}  // namespace qforge::ptq
